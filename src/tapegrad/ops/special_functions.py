"""Elementwise special functions behind ``tapegrad.special`` (erfc, logit, xlog1py, the
modified Bessel functions, the normal distribution's ndtr/ndtri/log_ndtr, sinc, entr, zeta,
bessel_j0/j1), each with PyTorch's gradient rule.

scipy is optional. ``erfc``, ``ndtr``, ``logit``, ``xlog1py``, ``sinc``, ``entr``, ``zeta``
and ``i0`` compute with numpy alone; ``i0e``, ``i1``, ``i1e``, ``ndtri``, ``log_ndtr``,
``bessel_j0`` and ``bessel_j1`` use scipy's Cephes kernels (PyTorch's own) and raise a
RuntimeError saying so when scipy is not installed. The gamma family (``gammaln``,
``digamma``, ``polygamma``, ``erfinv``) is tapegrad.distributions' numpy port of PyTorch's
algorithms, reused as is.
"""
import math

from tapegrad.ops.registry import op, xp
from tapegrad.ops.elementwise import _floating, exp, sign, where_op, log, sin, cos
from tapegrad.distributions._math import zeta_array

try:  # optional: PyTorch's Cephes kernels, as scipy ships them
    from scipy import special as _scipy
except ImportError:  # pragma: no cover - exercised where scipy is absent
    _scipy = None

_SQRT_2PI = math.sqrt(2 * math.pi)
_TWO_OVER_SQRT_PI = 2.0 / math.sqrt(math.pi)


def _scipy_function(name, op_name):
    if _scipy is None:
        raise RuntimeError(f"special.{op_name}: tapegrad computes {op_name} with scipy, which "
                           "is not installed (pip install 'tapegrad[special]')")
    return getattr(_scipy, name)


def _unary(fn, a):
    a = _floating(a)
    with xp.errstate(all="ignore"):
        return xp.asarray(fn(a)).astype(a.dtype, copy=False)


_math_erfc = xp.frompyfunc(math.erfc, 1, 1)


def _erfc_array(a):
    if _scipy is not None:
        return _scipy.erfc(a)
    return _math_erfc(a).astype(xp.float64)


@op(flops=20, float_only=True)
def erfc(a):
    """As ``torch.erfc``: ``1 - erf(a)`` without cancellation for large ``a``."""
    return _unary(_erfc_array, a)


@erfc.grad
def _(g, out, a):
    return g * (-_TWO_OVER_SQRT_PI * exp(-(a * a)))


@op(flops=20, float_only=True)
def ndtr(a):
    """As ``torch.special.ndtr``: the standard normal CDF, ``erfc(-a / sqrt(2)) / 2``."""
    return _unary(lambda x: 0.5 * _erfc_array(-x / math.sqrt(2)), a)


@ndtr.grad
def _(g, out, a):
    return g * exp(a * a * -0.5) * (1 / _SQRT_2PI)


@op(flops=40, saves="out", float_only=True)
def ndtri(a):
    """As ``torch.special.ndtri``: the inverse of ``ndtr`` (scipy)."""
    return _unary(_scipy_function("ndtri", "ndtri"), a)


@ndtri.grad
def _(g, out, a):
    return g * _SQRT_2PI * exp(out * out * 0.5)


@op(flops=40, saves="both", float_only=True)
def log_ndtr(a):
    """As ``torch.special.log_ndtr``: ``log(ndtr(a))``, accurate far in the left tail (scipy)."""
    return _unary(_scipy_function("log_ndtr", "log_ndtr"), a)


@log_ndtr.grad
def _(g, out, a):
    return g * exp(-(out + a * a * 0.5)) * (1 / _SQRT_2PI)


def _logit_array(a, eps):
    if eps is not None:
        a = xp.clip(a, eps, 1 - eps)
    with xp.errstate(divide="ignore", invalid="ignore"):
        return xp.log(a / (1 - a))


@op(flops=4, float_only=True, name="logit")
def logit_op(a, eps=None):
    return _unary(lambda x: _logit_array(x, eps), a)


@logit_op.grad
def _(g, out, a, eps=None):
    grad = g / (a * (1 - a))
    if eps is None:
        return where_op((a < 0) | (a > 1), math.nan, grad)
    return where_op((a < eps) | (a > 1 - eps), 0.0, grad)


@op(flops=12, elementwise=True, float_only=True, needs=True)
def xlog1py(a, b):
    """As ``torch.special.xlog1py``: ``a * log1p(b)``, 0 where ``a == 0`` (unless b is NaN)."""
    with xp.errstate(divide="ignore", invalid="ignore"):
        out = a * xp.log1p(b)
    return xp.where((a == 0) & ~xp.isnan(b), xp.zeros((), out.dtype), out)


@xlog1py.grad
def _(g, out, a, b, needs=(True, True)):
    ga = g * xlog1py(a != 0, b) if needs[0] else None
    return ga, (g * a / (b + 1) if needs[1] else None)


@op(flops=8, float_only=True)
def sinc(a):
    """As ``torch.sinc``: ``sin(pi a) / (pi a)``, 1 at 0."""
    return _unary(xp.sinc, a)


@sinc.grad
def _(g, out, a):
    at_zero = a == 0
    x = where_op(at_zero, 1.0, a) * math.pi
    return g * where_op(at_zero, 0.0, (x * cos(x) - sin(x)) / (x * x) * math.pi)


@op(flops=6, float_only=True)
def entr(a):
    """As ``torch.special.entr``: ``-a log(a)`` for a > 0, 0 at 0, -inf below."""
    def f(x):
        with xp.errstate(divide="ignore", invalid="ignore"):
            out = -x * xp.log(x)
        out = xp.where(x == 0, 0.0, out)
        return xp.where(x < 0, -xp.inf, out)
    return _unary(f, a)


@entr.grad
def _(g, out, a):
    return g * -(log(a) + 1)


@op(flops=100, elementwise=True, float_only=True, needs=True)
def zeta(a, q):
    """As ``torch.special.zeta``: the Hurwitz zeta function ``sum_k (q + k) ** -a``."""
    dt = (a if isinstance(a, xp.ndarray) else q).dtype  # one may be a Python number
    out = zeta_array(xp.asarray(a, xp.float64), xp.asarray(q, xp.float64))
    return xp.asarray(out).astype(dt, copy=False)


@zeta.grad
def _(g, out, a, q, needs=(True, True)):
    if needs[0]:
        raise NotImplementedError("the derivative for 'zeta' is not implemented.")
    return None, g * -a * zeta(a + 1, q)


def _i0_array(a):
    return _scipy.i0(a) if _scipy is not None else xp.i0(a)


@op(flops=40, float_only=True)
def i0(a):
    """As ``torch.i0``: the modified Bessel function of the first kind, order 0."""
    return _unary(_i0_array, a)


@i0.grad
def _(g, out, a):
    return g * i1(a)


@op(flops=40, saves="both", float_only=True)
def i0e(a):
    """As ``torch.special.i0e``: ``exp(-|a|) i0(a)`` (scipy)."""
    return _unary(_scipy_function("i0e", "i0e"), a)


@i0e.grad
def _(g, out, a):
    return g * (i1e(a) - sign(a) * out)


@op(flops=40, saves="both", float_only=True)
def i1(a):
    """As ``torch.special.i1``: the modified Bessel function of the first kind, order 1
    (scipy)."""
    return _unary(_scipy_function("i1", "i1"), a)


@i1.grad
def _(g, out, a):
    small = abs_lt_eps(a)
    safe = where_op(small, 1.0, a)
    return g * where_op(small, 0.5, i0(a) - out / safe)


@op(flops=40, saves="both", float_only=True)
def i1e(a):
    """As ``torch.special.i1e``: ``exp(-|a|) i1(a)`` (scipy)."""
    return _unary(_scipy_function("i1e", "i1e"), a)


@i1e.grad
def _(g, out, a):
    small = abs_lt_eps(a)
    safe = where_op(small, 1.0, a)
    return g * where_op(small, 0.5, i0e(a) - out * (sign(a) + 1 / safe))


def abs_lt_eps(a):
    """|a| below the dtype's epsilon: where PyTorch's i1/i1e rules use the limit 1/2."""
    from tapegrad.ops.elementwise import abs as abs_op, np_dtype
    return abs_op(a) < xp.finfo(np_dtype(a.dtype)).eps


def _bessel(name):
    def forward(a):
        return _unary(_scipy_function(name[7:], name), a)
    forward.__name__ = name
    forward.__doc__ = f"As ``torch.special.{name}`` (no gradient, as in PyTorch; scipy)."
    return op(flops=40, saves="none", float_only=True, differentiable=False)(forward)


bessel_j0 = _bessel("bessel_j0")
bessel_j1 = _bessel("bessel_j1")
