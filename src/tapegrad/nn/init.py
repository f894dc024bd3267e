"""``nn.init``: in-place initialisers with PyTorch's fan rules and distributions.

Every initialiser fills its tensor in place without recording (as under ``no_grad``) and
returns it. Random draws come from tapegrad's RNG (``tapegrad.random``): the same
distributions as PyTorch, not PyTorch's random stream.
"""
import math
import warnings

from tapegrad.autograd.grad_mode import no_grad
from tapegrad.backend import xp, on_device_of
from tapegrad.random import numpy_rng

__all__ = ["calculate_gain", "uniform_", "normal_", "trunc_normal_", "constant_", "ones_",
           "zeros_", "eye_", "dirac_", "xavier_uniform_", "xavier_normal_", "kaiming_uniform_",
           "kaiming_normal_", "orthogonal_"]


def _fill(tensor, values):
    """Write ``values`` into ``tensor``'s storage (cast to its dtype); bump its version. Values
    drawn on the host are copied to a device tensor's device first."""
    if isinstance(values, xp.ndarray) and type(tensor._data) is not xp.ndarray:
        values = on_device_of(tensor._data, values)
    tensor._data[...] = values
    tensor._version[0] += 1
    return tensor


def calculate_gain(nonlinearity, param=None):
    """As ``torch.nn.init.calculate_gain``: the recommended gain for a nonlinearity.

    >>> nn.init.calculate_gain("leaky_relu", 0.2)
    """
    linear_fns = ["linear", "conv1d", "conv2d", "conv3d", "conv_transpose1d",
                  "conv_transpose2d", "conv_transpose3d"]
    if nonlinearity in linear_fns or nonlinearity == "sigmoid":
        return 1
    if nonlinearity == "tanh":
        return 5.0 / 3
    if nonlinearity == "relu":
        return math.sqrt(2.0)
    if nonlinearity == "leaky_relu":
        if param is None:
            negative_slope = 0.01
        elif (not isinstance(param, bool) and isinstance(param, int)) or isinstance(param, float):
            negative_slope = param
        else:
            raise ValueError(f"negative_slope {param} not a valid number")
        return math.sqrt(2.0 / (1 + negative_slope**2))
    if nonlinearity == "selu":
        return 3.0 / 4
    raise ValueError(f"Unsupported nonlinearity {nonlinearity}")


def uniform_(tensor, a: float = 0.0, b: float = 1.0, generator=None):
    """As ``torch.nn.init.uniform_``: fill with draws from U(a, b)."""
    with no_grad():
        return tensor.uniform_(a, b, generator=generator)


def normal_(tensor, mean: float = 0.0, std: float = 1.0, generator=None):
    """As ``torch.nn.init.normal_``: fill with draws from N(mean, std^2)."""
    with no_grad():
        return tensor.normal_(mean, std, generator=generator)


def trunc_normal_(tensor, mean: float = 0.0, std: float = 1.0, a: float = -2.0, b: float = 2.0,
                  generator=None):
    """As ``torch.nn.init.trunc_normal_``: N(mean, std^2) restricted to [a, b].

    Rejection sampling as PyTorch: normal proposals when [a, b] holds most of the mass,
    uniform proposals on [a, b] accepted with the normal's relative density otherwise.
    """
    if mean < a - 2 * std or mean > b + 2 * std:
        warnings.warn("mean is more than 2 std from [a, b] in nn.init.trunc_normal_. The "
                      "distribution of values may be incorrect.", stacklevel=2)
    rng = numpy_rng(generator)
    shape = tensor.shape

    def norm_cdf(x):
        return (1.0 + math.erf(x / math.sqrt(2.0))) / 2.0

    if norm_cdf((b - mean) / std) - norm_cdf((a - mean) / std) > 0.3:
        out = rng.normal(mean, std, shape)
        bad = (out < a) | (out > b)
        while bad.any():
            out[bad] = rng.normal(mean, std, int(bad.sum()))
            bad = (out < a) | (out > b)
    else:
        mode = max(a, min(mean, b))
        log_peak = -0.5 * ((mode - mean) / std) ** 2

        def propose(n):
            x = rng.uniform(a, b, n)
            keep = xp.log(rng.uniform(0.0, 1.0, n)) <= -0.5 * ((x - mean) / std) ** 2 - log_peak
            return x, keep

        out, keep = propose(shape)
        while not keep.all():
            pending = ~keep
            x, k = propose(int(pending.sum()))
            out[pending] = x
            keep[pending] = k
    return _fill(tensor, out)


def constant_(tensor, val: float):
    """As ``torch.nn.init.constant_``: fill with ``val``."""
    return _fill(tensor, val)


def ones_(tensor):
    """As ``torch.nn.init.ones_``."""
    return _fill(tensor, 1.0)


def zeros_(tensor):
    """As ``torch.nn.init.zeros_``."""
    return _fill(tensor, 0.0)


def eye_(tensor):
    """As ``torch.nn.init.eye_``: the identity matrix (2-D tensors only)."""
    if tensor.ndim != 2:
        raise ValueError("Only tensors with 2 dimensions are supported")
    return _fill(tensor, xp.eye(*tensor.shape))


def dirac_(tensor, groups: int = 1):
    """As ``torch.nn.init.dirac_``: the identity convolution kernel (3-, 4- or 5-D)."""
    dimensions = tensor.ndim
    if dimensions not in (3, 4, 5):
        raise ValueError("Only tensors with 3, 4, or 5 dimensions are supported")
    sizes = tensor.shape
    if sizes[0] % groups != 0:
        raise ValueError("dim 0 must be divisible by groups")
    out_per_group = sizes[0] // groups
    values = xp.zeros(sizes)
    centre = tuple(s // 2 for s in sizes[2:])
    for g in range(groups):
        for d in range(min(out_per_group, sizes[1])):
            values[(g * out_per_group + d, d) + centre] = 1
    return _fill(tensor, values)


def _calculate_fan_in_and_fan_out(tensor):
    """PyTorch's fans: dim 1 and dim 0, each times the receptive field (dims 2 and on)."""
    if tensor.dim() < 2:
        raise ValueError("Fan in and fan out can not be computed for tensor with fewer than 2 "
                         "dimensions")
    receptive_field_size = 1
    for s in tensor.shape[2:]:
        receptive_field_size *= s
    return tensor.shape[1] * receptive_field_size, tensor.shape[0] * receptive_field_size


def _calculate_correct_fan(tensor, mode):
    mode = mode.lower()
    valid_modes = ["fan_in", "fan_out"]
    if mode not in valid_modes:
        raise ValueError(f"Mode {mode} not supported, please use one of {valid_modes}")
    fan_in, fan_out = _calculate_fan_in_and_fan_out(tensor)
    return fan_in if mode == "fan_in" else fan_out


def xavier_uniform_(tensor, gain: float = 1.0, generator=None):
    """As ``torch.nn.init.xavier_uniform_``: U(-a, a), a = gain * sqrt(6 / (fan_in + fan_out))."""
    fan_in, fan_out = _calculate_fan_in_and_fan_out(tensor)
    std = gain * math.sqrt(2.0 / float(fan_in + fan_out))
    a = math.sqrt(3.0) * std
    return uniform_(tensor, -a, a, generator)


def xavier_normal_(tensor, gain: float = 1.0, generator=None):
    """As ``torch.nn.init.xavier_normal_``: N(0, std^2), std = gain * sqrt(2 / (fan_in +
    fan_out))."""
    fan_in, fan_out = _calculate_fan_in_and_fan_out(tensor)
    std = gain * math.sqrt(2.0 / float(fan_in + fan_out))
    return normal_(tensor, 0.0, std, generator)


def kaiming_uniform_(tensor, a: float = 0, mode: str = "fan_in",
                     nonlinearity: str = "leaky_relu", generator=None):
    """As ``torch.nn.init.kaiming_uniform_``: U(-bound, bound), bound = gain * sqrt(3 / fan).

    >>> nn.init.kaiming_uniform_(w, a=math.sqrt(5))   # Linear's and Conv's default
    """
    if 0 in tensor.shape:
        warnings.warn("Initializing zero-element tensors is a no-op", stacklevel=2)
        return tensor
    fan = _calculate_correct_fan(tensor, mode)
    bound = math.sqrt(3.0) * calculate_gain(nonlinearity, a) / math.sqrt(fan)
    return uniform_(tensor, -bound, bound, generator)


def kaiming_normal_(tensor, a: float = 0, mode: str = "fan_in",
                    nonlinearity: str = "leaky_relu", generator=None):
    """As ``torch.nn.init.kaiming_normal_``: N(0, std^2), std = gain / sqrt(fan)."""
    if 0 in tensor.shape:
        warnings.warn("Initializing zero-element tensors is a no-op", stacklevel=2)
        return tensor
    fan = _calculate_correct_fan(tensor, mode)
    return normal_(tensor, 0.0, calculate_gain(nonlinearity, a) / math.sqrt(fan), generator)


def orthogonal_(tensor, gain: float = 1, generator=None):
    """As ``torch.nn.init.orthogonal_``: a (semi-)orthogonal matrix from the QR of a normal
    draw (trailing dims flattened), times ``gain``."""
    if tensor.ndim < 2:
        raise ValueError("Only tensors with 2 or more dimensions are supported")
    if tensor.numel() == 0:
        return tensor
    rows = tensor.shape[0]
    cols = tensor.numel() // rows
    flattened = numpy_rng(generator).normal(0.0, 1.0, (rows, cols))
    if rows < cols:
        flattened = flattened.T
    q, r = xp.linalg.qr(flattened)
    q = q * xp.sign(xp.diag(r))
    if rows < cols:
        q = q.T
    return _fill(tensor, (gain * q).reshape(tensor.shape))
