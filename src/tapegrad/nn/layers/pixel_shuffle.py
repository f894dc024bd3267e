"""``PixelShuffle`` and ``PixelUnshuffle`` (as in ``torch.nn``), over ``F.pixel_shuffle`` and
``F.pixel_unshuffle``."""
from tapegrad.nn import functional as F
from tapegrad.nn.module import Module

__all__ = ["PixelShuffle", "PixelUnshuffle"]


class PixelShuffle(Module):
    """As ``torch.nn.PixelShuffle(upscale_factor)``: (*, C*r*r, H, W) to (*, C, H*r, W*r).

    >>> nn.PixelShuffle(2)(tapegrad.zeros(1, 8, 3, 3)).shape   # (1, 2, 6, 6)
    """

    def __init__(self, upscale_factor: int):
        super().__init__()
        self.upscale_factor = upscale_factor

    def forward(self, input):
        return F.pixel_shuffle(input, self.upscale_factor)

    def extra_repr(self) -> str:
        return f"upscale_factor={self.upscale_factor}"


class PixelUnshuffle(Module):
    """As ``torch.nn.PixelUnshuffle(downscale_factor)``: (*, C, H*r, W*r) to (*, C*r*r, H, W).
    """

    def __init__(self, downscale_factor: int):
        super().__init__()
        self.downscale_factor = downscale_factor

    def forward(self, input):
        return F.pixel_unshuffle(input, self.downscale_factor)

    def extra_repr(self) -> str:
        return f"downscale_factor={self.downscale_factor}"
