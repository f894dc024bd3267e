"""``tapegrad.nn``: modules, layers, init, functional (as ``torch.nn``)."""
from tapegrad.nn.parameter import Parameter, Buffer  # noqa: F401
from tapegrad.nn.module import Module  # noqa: F401
from tapegrad.nn import functional, init, utils  # noqa: F401
from tapegrad.nn.layers import *  # noqa: F401,F403
from tapegrad.nn import modules, parallel  # noqa: F401,E402
from tapegrad.nn.parallel import DataParallel  # noqa: F401,E402
