"""What layers share: uninitialised parameter storage (``factory_kwargs``), ``_pair`` & co."""
import collections.abc
import math
from itertools import repeat

from tapegrad import dtypes
from tapegrad.backend import xp
from tapegrad.creation import check_device, finish
from tapegrad.nn import init
from tapegrad.nn.parameter import Parameter


def empty(shape, device=None, dtype=None):
    """An uninitialised tensor (``torch.empty(shape, device=, dtype=)``) for a layer to fill."""
    dev = check_device(device, "empty")  # cuda: the layer's storage on the device
    dt = dtypes.get_default_dtype() if dtype is None else dtypes.to_dtype(dtype)
    return finish(xp.empty(tuple(shape), dtype=dt.np), False, "empty", dev)


def empty_parameter(shape, device=None, dtype=None):
    """``Parameter(torch.empty(shape, device=, dtype=))``."""
    return Parameter(empty(shape, device, dtype))


def weight_and_bias(module, weight_shape, bias_shape, bias, device=None, dtype=None):
    """Register an uninitialised ``module.weight`` and, if ``bias``, ``module.bias`` (else a
    ``None`` bias entry), in that order, as the torch layers do."""
    module.weight = empty_parameter(weight_shape, device, dtype)
    if bias:
        module.bias = empty_parameter(bias_shape, device, dtype)
    else:
        module.register_parameter("bias", None)


def kaiming_reset_(weight, bias):
    """The default init of ``torch.nn.Linear`` and the convolutions: weight
    ``kaiming_uniform_(a=sqrt(5))``, bias U(-1/sqrt(fan_in), 1/sqrt(fan_in))."""
    init.kaiming_uniform_(weight, a=math.sqrt(5))
    if bias is not None:
        fan_in, _ = init._calculate_fan_in_and_fan_out(weight)
        bound = 1 / math.sqrt(fan_in) if fan_in > 0 else 0
        init.uniform_(bias, -bound, bound)


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
_triple = _ntuple(3, "_triple")
_quadruple = _ntuple(4, "_quadruple")
