"""``tapegrad.nn``: modules, layers, init, functional (as ``torch.nn``)."""
from tapegrad.nn.parameter import Parameter  # noqa: F401
