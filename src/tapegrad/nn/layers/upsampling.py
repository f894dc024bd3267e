"""``Upsample``, ``UpsamplingNearest2d`` and ``UpsamplingBilinear2d`` (as in ``torch.nn``),
over ``F.interpolate``."""
from tapegrad.nn import functional as F
from tapegrad.nn.module import Module

__all__ = ["Upsample", "UpsamplingNearest2d", "UpsamplingBilinear2d"]


class Upsample(Module):
    """As ``torch.nn.Upsample(size=None, scale_factor=None, mode='nearest', align_corners=None,
    recompute_scale_factor=None)``: ``F.interpolate`` with these arguments.

    >>> nn.Upsample(scale_factor=2, mode="bilinear")(tapegrad.zeros(1, 1, 2, 3)).shape
    (1, 1, 4, 6)
    """

    def __init__(self, size=None, scale_factor=None, mode: str = "nearest", align_corners=None,
                 recompute_scale_factor=None):
        super().__init__()
        self.name = type(self).__name__
        self.size = size
        if isinstance(scale_factor, tuple):
            self.scale_factor = tuple(float(factor) for factor in scale_factor)
        else:
            self.scale_factor = float(scale_factor) if scale_factor else None
        self.mode = mode
        self.align_corners = align_corners
        self.recompute_scale_factor = recompute_scale_factor

    def forward(self, input):
        return F.interpolate(input, self.size, self.scale_factor, self.mode, self.align_corners,
                             recompute_scale_factor=self.recompute_scale_factor)

    def extra_repr(self) -> str:
        if self.scale_factor is not None:
            info = "scale_factor=" + repr(self.scale_factor)
        else:
            info = "size=" + repr(self.size)
        return info + ", mode=" + repr(self.mode)


class UpsamplingNearest2d(Upsample):
    """As ``torch.nn.UpsamplingNearest2d(size=None, scale_factor=None)``: nearest-neighbour
    upsampling of (N, C, H, W) input."""

    def __init__(self, size=None, scale_factor=None):
        super().__init__(size, scale_factor, mode="nearest")


class UpsamplingBilinear2d(Upsample):
    """As ``torch.nn.UpsamplingBilinear2d(size=None, scale_factor=None)``: bilinear
    upsampling with ``align_corners=True``."""

    def __init__(self, size=None, scale_factor=None):
        super().__init__(size, scale_factor, mode="bilinear", align_corners=True)
