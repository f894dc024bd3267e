"""What layers share: uninitialised parameter storage (``factory_kwargs``), ``_pair`` & co."""
import collections.abc
from itertools import repeat

from tapegrad import dtypes
from tapegrad.backend import DEVICE, xp
from tapegrad.nn.parameter import Parameter
from tapegrad.tensor import Tensor


def empty(shape, device=None, dtype=None):
    """An uninitialised tensor (``torch.empty(shape, device=, dtype=)``) for a layer to fill."""
    if device is not None and DEVICE != device:
        raise RuntimeError(f"tapegrad runs on 'cpu' only for now, got device {device!r}")
    dt = dtypes.get_default_dtype() if dtype is None else dtypes.to_dtype(dtype)
    return Tensor._make(xp.empty(tuple(shape), dtype=dt.np))


def empty_parameter(shape, device=None, dtype=None):
    """``Parameter(torch.empty(shape, device=, dtype=))``."""
    return Parameter(empty(shape, device, dtype))


def filled(shape, value, device=None, dtype=None):
    """``torch.full(shape, value, device=, dtype=)`` for buffers."""
    t = empty(shape, device, dtype)
    t._data[...] = value
    return t


def _ntuple(n, name):
    def parse(x):
        if isinstance(x, collections.abc.Iterable) and not isinstance(x, str):
            return tuple(x)
        return tuple(repeat(x, n))

    parse.__name__ = name
    return parse


_single = _ntuple(1, "_single")
_pair = _ntuple(2, "_pair")
