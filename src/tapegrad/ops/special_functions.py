"""Elementwise special functions behind ``tapegrad.special`` (erfc, logit, xlog1py, the
modified Bessel functions, the normal distribution's ndtr/ndtri/log_ndtr, sinc, entr, zeta,
bessel_j0/j1), each with PyTorch's gradient rule.

scipy is optional. ``erfc``, ``ndtr``, ``logit``, ``xlog1py``, ``sinc``, ``entr``, ``zeta``
and ``i0`` compute with numpy alone; ``i0e``, ``i1``, ``i1e``, ``ndtri``, ``log_ndtr``,
``bessel_j0`` and ``bessel_j1`` use scipy's Cephes kernels (PyTorch's own) and raise a
RuntimeError saying so when scipy is not installed. The gamma family (``lgamma``/``gammaln``,
``digamma``, ``polygamma``) and ``erfinv`` are numpy ports of PyTorch's CPU algorithms
(``lgamma`` is the C library's, as ``math.lgamma``; ``digamma``/``trigamma`` shift to x >= 10
(6) and sum the asymptotic series; higher polygammas go through the Hurwitz zeta function), so
float64 values agree with PyTorch to the last few bits; tapegrad.distributions uses them too.
"""
import math

from tapegrad.ops.registry import op, xp
from tapegrad.ops.elementwise import _floating, exp, sign, where_op, log, sin, cos

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


@op(flops=20, float_only=True, pointwise=True)
def erfc(a):
    """As ``torch.erfc``: ``1 - erf(a)`` without cancellation for large ``a``."""
    return _unary(_erfc_array, a)


@erfc.grad
def _(g, out, a):
    return g * (-_TWO_OVER_SQRT_PI * exp(-(a * a)))


@op(flops=20, float_only=True, pointwise=True)
def ndtr(a):
    """As ``torch.special.ndtr``: the standard normal CDF, ``erfc(-a / sqrt(2)) / 2``."""
    return _unary(lambda x: 0.5 * _erfc_array(-x / math.sqrt(2)), a)


@ndtr.grad
def _(g, out, a):
    return g * exp(a * a * -0.5) * (1 / _SQRT_2PI)


@op(flops=40, saves="out", float_only=True, pointwise=True)
def ndtri(a):
    """As ``torch.special.ndtri``: the inverse of ``ndtr`` (scipy)."""
    return _unary(_scipy_function("ndtri", "ndtri"), a)


@ndtri.grad
def _(g, out, a):
    return g * _SQRT_2PI * exp(out * out * 0.5)


@op(flops=40, saves="both", float_only=True, pointwise=True)
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


@op(flops=4, float_only=True, name="logit", pointwise=True)
def logit_op(a, eps=None):
    return _unary(lambda x: _logit_array(x, eps), a)


@logit_op.grad
def _(g, out, a, eps=None):
    grad = g / (a * (1 - a))
    if eps is None:
        return where_op((a < 0) | (a > 1), math.nan, grad)
    return where_op((a < eps) | (a > 1 - eps), 0.0, grad)


@op(flops=12, elementwise=True, float_only=True, needs=True, pointwise=True)
def xlog1py(a, b):
    """As ``torch.special.xlog1py``: ``a * log1p(b)``, 0 where ``a == 0`` (unless b is NaN)."""
    with xp.errstate(divide="ignore", invalid="ignore"):
        out = a * xp.log1p(b)
    return xp.where((a == 0) & ~xp.isnan(b), xp.zeros((), out.dtype), out)


@xlog1py.grad
def _(g, out, a, b, needs=(True, True)):
    ga = g * xlog1py(a != 0, b) if needs[0] else None
    return ga, (g * a / (b + 1) if needs[1] else None)


@op(flops=8, float_only=True, pointwise=True)
def sinc(a):
    """As ``torch.sinc``: ``sin(pi a) / (pi a)``, 1 at 0."""
    return _unary(xp.sinc, a)


@sinc.grad
def _(g, out, a):
    at_zero = a == 0
    x = where_op(at_zero, 1.0, a) * math.pi
    return g * where_op(at_zero, 0.0, (x * cos(x) - sin(x)) / (x * x) * math.pi)


@op(flops=6, float_only=True, pointwise=True)
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


@op(flops=100, elementwise=True, float_only=True, needs=True, pointwise=True)
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


@op(flops=40, float_only=True, pointwise=True)
def i0(a):
    """As ``torch.i0``: the modified Bessel function of the first kind, order 0."""
    return _unary(_i0_array, a)


@i0.grad
def _(g, out, a):
    return g * i1(a)


@op(flops=40, saves="both", float_only=True, pointwise=True)
def i0e(a):
    """As ``torch.special.i0e``: ``exp(-|a|) i0(a)`` (scipy)."""
    return _unary(_scipy_function("i0e", "i0e"), a)


@i0e.grad
def _(g, out, a):
    return g * (i1e(a) - sign(a) * out)


@op(flops=40, saves="both", float_only=True, pointwise=True)
def i1(a):
    """As ``torch.special.i1``: the modified Bessel function of the first kind, order 1
    (scipy)."""
    return _unary(_scipy_function("i1", "i1"), a)


@i1.grad
def _(g, out, a):
    small = abs_lt_eps(a)
    safe = where_op(small, 1.0, a)
    return g * where_op(small, 0.5, i0(a) - out / safe)


@op(flops=40, saves="both", float_only=True, pointwise=True)
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
    return op(flops=40, saves="none", float_only=True, differentiable=False,
              pointwise=True)(forward)


bessel_j0 = _bessel("bessel_j0")
bessel_j1 = _bessel("bessel_j1")


# --- the gamma family and erfinv (also used by tapegrad.distributions) ---------------------
def _lgamma_one(v):
    try:
        return math.lgamma(v)
    except ValueError:  # poles at 0, -1, -2, ...: +inf, as the C library
        return math.inf


_lgamma_vec = xp.frompyfunc(_lgamma_one, 1, 1)


def lgamma_array(x):
    """``math.lgamma`` (the C library's, as PyTorch's CPU kernel) over a float64 array."""
    return xp.asarray(_lgamma_vec(x), dtype=xp.float64)


@op(flops=40, float_only=True, pointwise=True)
def lgamma(a):
    """As ``torch.lgamma`` / ``torch.special.gammaln``: log |Gamma(a)| (``+inf`` at the
    poles)."""
    return _unary(lgamma_array, a)


@lgamma.grad
def _(g, out, a):
    return g * digamma(a)


_PSI_10 = 2.25175258906672110764
_DIGAMMA_A = (8.33333333333333333333E-2, -2.10927960927960927961E-2,
              7.57575757575757575758E-3, -4.16666666666666666667E-3,
              3.96825396825396825397E-3, -8.33333333333333333333E-3,
              8.33333333333333333333E-2)


def _polevl(z, coefficients):
    out = xp.zeros_like(z)
    for c in coefficients:
        out = out * z + c
    return out


def digamma_array(x):
    """PyTorch's ``calc_digamma`` on a float64 array: reflection below 0, shift to x >= 10."""
    x = xp.asarray(x, dtype=xp.float64)
    neg = x < 0
    y = xp.where(neg, 1 - x, x)
    result = xp.zeros_like(y)
    while True:
        small = y < 10
        if not small.any():
            break
        with xp.errstate(divide="ignore"):
            result = result - xp.where(small, 1 / xp.where(small, y, 1), 0)
        y = xp.where(small, y + 1, y)
    with xp.errstate(divide="ignore", invalid="ignore"):
        z = 1.0 / (y * y)
        tail = xp.where(y < 1e17, z * _polevl(z, _DIGAMMA_A), 0.0)
        asym = xp.where(y == 10, _PSI_10, xp.log(y) - 0.5 / y - tail)
        out = result + asym
        frac = x - xp.trunc(x)
        out = xp.where(neg, out - math.pi / xp.tan(math.pi * frac), out)
    out = xp.where(neg & (x == xp.trunc(x)), xp.nan, out)
    out = xp.where(x == 0, xp.copysign(xp.inf, -x), out)
    return out


def trigamma_array(x):
    """PyTorch's ``calc_trigamma``: reflection below 1/2, six shifts, asymptotic series."""
    x = xp.asarray(x, dtype=xp.float64)
    refl = x < 0.5
    sign_ = xp.where(refl, -1.0, 1.0)
    with xp.errstate(divide="ignore", invalid="ignore"):
        s = xp.sin(math.pi * x)
        result = xp.where(refl, -(math.pi * math.pi) / (s * s), 0.0)
        y = xp.where(refl, 1 - x, x)
        for _ in range(6):
            result = result + 1 / (y * y)
            y = y + 1
        ixx = 1 / (y * y)
        result = result + (1 + 1 / (2 * y) + ixx * (1. / 6 - ixx * (1. / 30 - ixx * (1. / 42)))) / y
    return sign_ * result


_ZETA_A = (12.0, -720.0, 30240.0, -1209600.0, 47900160.0, -1.8924375803183791606e9,
           7.47242496e10, -2.950130727918164224e12, 1.1646782814350067249e14,
           -4.5979787224074726105e15, 1.8152105401943546773e17, -7.1661652561756670113e18)


def zeta_array(s, q):
    """Hurwitz zeta ``sum_k (q + k)^-s`` (Cephes' Euler-Maclaurin sum, as PyTorch's zeta)."""
    q = xp.asarray(q, dtype=xp.float64)
    with xp.errstate(divide="ignore", invalid="ignore", over="ignore"):
        total = q ** -s
        a = q.copy()
        for _ in range(9):
            a = a + 1
            total = total + a ** -s
        w = a
        total = total + w ** (1 - s) / (s - 1) - 0.5 * w ** -s
        factor = 1.0
        k = 0.0
        for coefficient in _ZETA_A:
            factor = factor * (s + k)
            b = w ** -(s + k)
            total = total + factor * b / w / coefficient
            k += 1
            factor = factor * (s + k)
            k += 1
        total = xp.where(q <= 0, xp.where(q == xp.floor(q), xp.inf, xp.nan), total)
    return total


def polygamma_array(n, x):
    if n == 0:
        return digamma_array(x)
    if n == 1:
        return trigamma_array(x)
    return (-1) ** (n + 1) * math.factorial(n) * zeta_array(n + 1.0, x)


@op(flops=60, float_only=True, pointwise=True)
def digamma(a):
    """As ``torch.digamma`` / ``torch.special.digamma``: the logarithmic derivative of
    Gamma."""
    return _unary(digamma_array, a)


@digamma.grad
def _(g, out, a):
    return g * polygamma_op(a, n=1)


@op(flops=80, float_only=True, name="polygamma", pointwise=True)
def polygamma_op(a, n):
    return _unary(lambda x: polygamma_array(n, x), a)


@polygamma_op.grad
def _(g, out, a, n):
    return g * polygamma_op(a, n=n + 1)


def polygamma(n, input):
    """As ``torch.polygamma(n, x)`` / ``torch.special.polygamma``: the n-th derivative of
    digamma."""
    n = int(n)
    if n < 0:
        raise RuntimeError(f"polygamma: n must be non-negative, got {n}")
    return digamma(input) if n == 0 else polygamma_op(input, n=n)


def erfinv_array(y):
    """Inverse error function: Giles' single-precision guess, then Newton steps on erf."""
    from tapegrad.ops.elementwise import erf
    y = xp.asarray(y, dtype=xp.float64)
    with xp.errstate(divide="ignore", invalid="ignore"):
        w = -xp.log((1.0 - y) * (1.0 + y))
        p_small = _polevl(w - 2.5, (2.81022636e-08, 3.43273939e-07, -3.5233877e-06,
                                    -4.39150654e-06, 0.00021858087, -0.00125372503,
                                    -0.00417768164, 0.246640727, 1.50140941))
        ws = xp.sqrt(w) - 3.0
        p_large = _polevl(ws, (-0.000200214257, 0.000100950558, 0.00134934322,
                               -0.00367342844, 0.00573950773, -0.0076224613,
                               0.00943887047, 1.00167406, 2.83297682))
        x = xp.where(w < 5.0, p_small, p_large) * y
        inner = xp.isfinite(x) & (xp.abs(y) < 1)
        for _ in range(3):
            xs = xp.where(inner, x, 0.0)
            step = (erf(xs) - y) / (_TWO_OVER_SQRT_PI * xp.exp(-xs * xs))
            x = xp.where(inner, xs - step, x)
    x = xp.where(y == 1, xp.inf, xp.where(y == -1, -xp.inf, x))
    return xp.where(xp.abs(y) > 1, xp.nan, x)


@op(flops=60, saves="out", float_only=True, pointwise=True)
def erfinv(a):
    """As ``torch.erfinv`` / ``torch.special.erfinv``: the inverse of ``erf`` on (-1, 1)."""
    return _unary(erfinv_array, a)


@erfinv.grad
def _(g, out, a):
    return g * (math.sqrt(math.pi) / 2) * exp(out * out)
