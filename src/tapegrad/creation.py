"""Tensor creation: ``tensor``, ``zeros``, ``ones``, ``arange`` ... as in PyTorch."""
from tapegrad import dtypes
from tapegrad.backend import xp
from tapegrad.tensor import Tensor


def tensor(data, dtype=None, device=None, requires_grad=False) -> Tensor:
    """As ``torch.tensor``: copies ``data``; Python floats become the default dtype.

    >>> tapegrad.tensor([[1.0, 2.0]], requires_grad=True)
    """
    return Tensor(data, dtype=dtype, requires_grad=requires_grad)


__all__ = ["tensor"]
