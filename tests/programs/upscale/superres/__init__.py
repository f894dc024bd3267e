"""Single-image super-resolution: the network and the image pairs it learns from."""
from .images import LumaPairs
from .net import SubPixelNet

__all__ = ["LumaPairs", "SubPixelNet"]
