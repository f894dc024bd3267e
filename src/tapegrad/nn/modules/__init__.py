"""``tapegrad.nn.modules`` as ``torch.nn.modules``: PyTorch's submodule paths
(``torch.nn.modules.loss._Loss``, ``torch.nn.modules.utils._pair`` ...) as aliases of the
files that hold tapegrad's layers; the classes are the same objects as ``tapegrad.nn.X``."""
from tapegrad._aliases import alias_module as _alias
from tapegrad.nn.module import Module  # noqa: F401
from tapegrad.nn.layers import *  # noqa: F401,F403

_L = "tapegrad.nn.layers."
# PyTorch's submodule -> the tapegrad files holding its classes
_LAYOUT = {
    "module": ("tapegrad.nn.module",),
    "activation": (_L + "activation", _L + "attention"),
    "batchnorm": (_L + "norm",),
    "instancenorm": (_L + "norm",),
    "normalization": (_L + "norm",),
    "container": (_L + "container",),
    "conv": (_L + "conv",),
    "dropout": (_L + "dropout",),
    "flatten": (_L + "flatten",),
    "linear": (_L + "linear",),
    "loss": (_L + "loss",),
    "padding": (_L + "padding",),
    "pixelshuffle": (_L + "pixel_shuffle",),
    "pooling": (_L + "pooling",),
    "rnn": (_L + "rnn",),
    "sparse": (_L + "embedding",),
    "transformer": (_L + "transformer",),
    "upsampling": (_L + "upsampling",),
    "utils": (_L + "_utils",),
}
for _name, _sources in _LAYOUT.items():
    _alias(f"{__name__}.{_name}", _sources)
