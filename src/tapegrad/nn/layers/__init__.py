"""The layer families of ``tapegrad.nn``, one file each; re-exported by ``tapegrad.nn``."""
from tapegrad.nn.layers.activation import *  # noqa: F401,F403
from tapegrad.nn.layers.container import *  # noqa: F401,F403
from tapegrad.nn.layers.conv import *  # noqa: F401,F403
from tapegrad.nn.layers.dropout import *  # noqa: F401,F403
from tapegrad.nn.layers.embedding import *  # noqa: F401,F403
from tapegrad.nn.layers.flatten import *  # noqa: F401,F403
from tapegrad.nn.layers.linear import *  # noqa: F401,F403
from tapegrad.nn.layers.loss import *  # noqa: F401,F403
from tapegrad.nn.layers.norm import *  # noqa: F401,F403
from tapegrad.nn.layers.pooling import *  # noqa: F401,F403
from tapegrad.nn.layers.attention import *  # noqa: F401,F403
from tapegrad.nn.layers.rnn import *  # noqa: F401,F403
from tapegrad.nn.layers.padding import *  # noqa: F401,F403
from tapegrad.nn.layers.pixel_shuffle import *  # noqa: F401,F403
from tapegrad.nn.layers.upsampling import *  # noqa: F401,F403
from tapegrad.nn.layers.transformer import *  # noqa: F401,F403
