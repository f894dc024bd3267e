"""Padding layers (as in ``torch.nn``): ``ConstantPad``, ``ZeroPad``, ``ReflectionPad``,
``ReplicationPad`` and ``CircularPad``, each in 1d/2d/3d, over ``F.pad``.

An int ``padding`` pads every side by it; a tuple gives ``(left, right, top, bottom, front,
back)``, last dim first, as ``F.pad`` reads it.
"""
from tapegrad.nn import functional as F
from tapegrad.nn.layers._utils import _ntuple
from tapegrad.nn.module import Module

__all__ = ["CircularPad1d", "CircularPad2d", "CircularPad3d", "ConstantPad1d", "ConstantPad2d",
           "ConstantPad3d", "ReflectionPad1d", "ReflectionPad2d", "ReflectionPad3d",
           "ReplicationPad1d", "ReplicationPad2d", "ReplicationPad3d", "ZeroPad1d", "ZeroPad2d",
           "ZeroPad3d"]

_WIDTHS = {1: _ntuple(2, "_pair"), 2: _ntuple(4, "_quadruple"), 3: _ntuple(6, "_sextuple")}


class _PadNd(Module):
    """``F.pad(input, self.padding, _mode)``; ``_dims`` is the number of padded dims."""

    _mode = None
    _dims = None

    def __init__(self, padding):
        super().__init__()
        self.padding = _WIDTHS[self._dims](padding)

    def forward(self, input):
        return F.pad(input, self.padding, self._mode)

    def extra_repr(self) -> str:
        return f"{self.padding}"


class _CircularPadNd(_PadNd):
    _mode = "circular"

    def forward(self, input):
        # PyTorch's module checks the rank itself (a ValueError, where F.pad raises another)
        d = self._dims
        if input.dim() not in (d + 1, d + 2):
            raise ValueError(f"expected {d + 1}D or {d + 2}D input (got {input.dim()}D input)")
        return F.pad(input, self.padding, "circular")


class _ReflectionPadNd(_PadNd):
    _mode = "reflect"


class _ReplicationPadNd(_PadNd):
    _mode = "replicate"


class _ConstantPadNd(_PadNd):
    def __init__(self, padding, value: float):
        super().__init__(padding)
        self.value = value

    def forward(self, input):
        return F.pad(input, self.padding, "constant", self.value)

    def extra_repr(self) -> str:
        return f"padding={self.padding}, value={self.value}"


class CircularPad1d(_CircularPadNd):
    """As ``torch.nn.CircularPad1d(padding)``: wrap-around padding (``F.pad(mode='circular')``) of
    the last dim of a 2-D or 3-D input."""

    _dims = 1


class CircularPad2d(_CircularPadNd):
    """As ``torch.nn.CircularPad2d(padding)``: wrap-around padding (``F.pad(mode='circular')``) of
    the last 2 dims of a 3-D or 4-D input."""

    _dims = 2


class CircularPad3d(_CircularPadNd):
    """As ``torch.nn.CircularPad3d(padding)``: wrap-around padding (``F.pad(mode='circular')``) of
    the last 3 dims of a 4-D or 5-D input."""

    _dims = 3


class ReflectionPad1d(_ReflectionPadNd):
    """As ``torch.nn.ReflectionPad1d(padding)``: mirror padding (``mode='reflect'``) of
    the last dim of a 2-D or 3-D input."""

    _dims = 1


class ReflectionPad2d(_ReflectionPadNd):
    """As ``torch.nn.ReflectionPad2d(padding)``: mirror padding (``mode='reflect'``) of
    the last 2 dims of a 3-D or 4-D input."""

    _dims = 2


class ReflectionPad3d(_ReflectionPadNd):
    """As ``torch.nn.ReflectionPad3d(padding)``: mirror padding (``mode='reflect'``) of
    the last 3 dims of a 4-D or 5-D input."""

    _dims = 3


class ReplicationPad1d(_ReplicationPadNd):
    """As ``torch.nn.ReplicationPad1d(padding)``: edge-repeating padding (``mode='replicate'``) of
    the last dim of a 2-D or 3-D input."""

    _dims = 1


class ReplicationPad2d(_ReplicationPadNd):
    """As ``torch.nn.ReplicationPad2d(padding)``: edge-repeating padding (``mode='replicate'``) of
    the last 2 dims of a 3-D or 4-D input."""

    _dims = 2


class ReplicationPad3d(_ReplicationPadNd):
    """As ``torch.nn.ReplicationPad3d(padding)``: edge-repeating padding (``mode='replicate'``) of
    the last 3 dims of a 4-D or 5-D input."""

    _dims = 3


class ConstantPad1d(_ConstantPadNd):
    """As ``torch.nn.ConstantPad1d(padding, value)``: pad the last dim with ``value``."""

    _dims = 1


class ConstantPad2d(_ConstantPadNd):
    """As ``torch.nn.ConstantPad2d(padding, value)``: pad the last 2 dims with ``value``."""

    _dims = 2


class ConstantPad3d(_ConstantPadNd):
    """As ``torch.nn.ConstantPad3d(padding, value)``: pad the last 3 dims with ``value``."""

    _dims = 3


class ZeroPad1d(ConstantPad1d):
    """As ``torch.nn.ZeroPad1d(padding)``: pad the last dim with zeros."""

    def __init__(self, padding):
        super().__init__(padding, 0.0)

    def extra_repr(self) -> str:
        return f"{self.padding}"


class ZeroPad2d(ConstantPad2d):
    """As ``torch.nn.ZeroPad2d(padding)``: pad the last 2 dims with zeros."""

    def __init__(self, padding):
        super().__init__(padding, 0.0)

    def extra_repr(self) -> str:
        return f"{self.padding}"


class ZeroPad3d(ConstantPad3d):
    """As ``torch.nn.ZeroPad3d(padding)``: pad the last 3 dims with zeros."""

    def __init__(self, padding):
        super().__init__(padding, 0.0)

    def extra_repr(self) -> str:
        return f"{self.padding}"
