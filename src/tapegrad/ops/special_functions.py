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
``igamma``/``igammac`` (the regularized incomplete gamma functions) port PyTorch's
``calc_igamma``/``calc_igammac`` element for element, bit for bit (see below).
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



def _logit_scalar(ctx, a, eps=None):
    """``log(a / (1 - a))``, ``a`` first clipped to [eps, 1 - eps] as numpy's clip does (NaN
    stays, a tie keeps ``a``)."""
    if eps is not None:
        lo, hi = ctx.const(eps), ctx.const(1 - eps)
        a = f"({a} if (({a} > {lo}) | ({a} != {a})) else {lo})"
        a = f"({a} if (({a} < {hi}) | ({a} != {a})) else {hi})"
    return ctx.libm("log", f"({a} / ({ctx.const(1.0)} - {a}))")


logit_op.lower(_logit_scalar, params=("eps",), accepts=lambda n: set(n.params) <= {"eps"} and (
    n.params.get("eps") is None or type(n.params["eps"]) in (int, float)))

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


xlog1py.lower("({dt}(0.0) if (({0} == 0) & ({1} == {1})) else {0} * np.log1p({1}))",
              libm=("log1p",))

@xlog1py.grad
def _(g, out, a, b, needs=(True, True)):
    ga = g * xlog1py(a != 0, b) if needs[0] else None
    return ga, (g * a / (b + 1) if needs[1] else None)


@op(flops=8, float_only=True, pointwise=True)
def sinc(a):
    """As ``torch.sinc``: ``sin(pi a) / (pi a)``, 1 at 0."""
    return _unary(xp.sinc, a)



def _sinc_scalar(ctx, a):
    """numpy's sinc for one element: ``y = pi * a``, the dtype's eps where y is 0, sin(y)/y."""
    y = f"({ctx.const(math.pi)} * {a})"
    y = f"({y} if {y} != 0 else {ctx.const(xp.finfo(ctx.dtype).eps)})"
    return f"({ctx.libm('sin', y)} / {y})"


sinc.lower(_sinc_scalar)

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


entr.lower("({dt}(-np.inf) if {0} < 0 else ({dt}(0.0) if {0} == 0 else (-{0}) * np.log({0})))",
           libm=("log",))

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


# --- the regularized incomplete gamma functions (igamma / igammac) -------------------------
# PyTorch's CPU kernels (ATen's calc_igamma / calc_igammac: SciPy's gammainc, from Cephes'
# igam/igamc and Boost's Lanczos sum) vectorised: each element takes the branch it takes in
# the C code, and each iteration stops per element where the C loop breaks, so float64 values
# agree with PyTorch to the last bits. float32 runs the same steps in float32 with the float
# constants (float16 / bfloat16 through float32, as PyTorch).
_IGAM_MACHEP = {xp.float64: 1.11022302462515654042E-16, xp.float32: 5.9604644775390625E-8}
_IGAM_MAXLOG = {xp.float64: 7.09782712893383996843E2, xp.float32: 88.72283905206835}
_IGAM_BIG = {xp.float64: 4.503599627370496e15, xp.float32: 16777216.}
_IGAM_BIGINV = {xp.float64: 2.22044604925031308085e-16, xp.float32: 5.9604644775390625E-8}
_IGAM_MAXITER = 2000
_LANCZOS_G = 6.024680040776729583740234375
_LANCZOS_NUM = (0.006061842346248906525783753964555936883222,
                0.5098416655656676188125178644804694509993,
                19.51992788247617482847860966235652136208,
                449.9445569063168119446858607650988409623,
                6955.999602515376140356310115515198987526,
                75999.29304014542649875303443598909137092,
                601859.6171681098786670226533699352302507,
                3481712.15498064590882071018964774556468,
                14605578.08768506808414169982791359218571,
                43338889.32467613834773723740590533316085,
                86363131.28813859145546927288977868422342,
                103794043.1163445451906271053616070238554,
                56906521.91347156388090791033559122686859)
_LANCZOS_DENOM = (1., 66., 1925., 32670., 357423., 2637558., 13339535., 45995730., 105258076.,
                  150917976., 120543840., 39916800., 0.)
_IGAM_ASYMPTOTIC_D = (
    (-3.3333333333333333e-1, 8.3333333333333333e-2, -1.4814814814814815e-2,
     1.1574074074074074e-3, 3.527336860670194e-4, -1.7875514403292181e-4, 3.9192631785224378e-5,
     -2.1854485106799922e-6, -1.85406221071516e-6, 8.296711340953086e-7, -1.7665952736826079e-7,
     6.7078535434014986e-9, 1.0261809784240308e-8, -4.3820360184533532e-9,
     9.1476995822367902e-10, -2.551419399494625e-11, -5.8307721325504251e-11,
     2.4361948020667416e-11, -5.0276692801141756e-12, 1.1004392031956135e-13,
     3.3717632624009854e-13, -1.3923887224181621e-13, 2.8534893807047443e-14,
     -5.1391118342425726e-16, -1.9752288294349443e-15),
    (-1.8518518518518519e-3, -3.4722222222222222e-3, 2.6455026455026455e-3,
     -9.9022633744855967e-4, 2.0576131687242798e-4, -4.0187757201646091e-7,
     -1.8098550334489978e-5, 7.6491609160811101e-6, -1.6120900894563446e-6,
     4.6471278028074343e-9, 1.378633446915721e-7, -5.752545603517705e-8, 1.1951628599778147e-8,
     -1.7543241719747648e-11, -1.0091543710600413e-9, 4.1627929918425826e-10,
     -8.5639070264929806e-11, 6.0672151016047586e-14, 7.1624989648114854e-12,
     -2.9331866437714371e-12, 5.9966963656836887e-13, -2.1671786527323314e-16,
     -4.9783399723692616e-14, 2.0291628823713425e-14, -4.13125571381061e-15),
    (4.1335978835978836e-3, -2.6813271604938272e-3, 7.7160493827160494e-4, 2.0093878600823045e-6,
     -1.0736653226365161e-4, 5.2923448829120125e-5, -1.2760635188618728e-5,
     3.4235787340961381e-8, 1.3721957309062933e-6, -6.298992138380055e-7, 1.4280614206064242e-7,
     -2.0477098421990866e-10, -1.4092529910867521e-8, 6.228974084922022e-9,
     -1.3670488396617113e-9, 9.4283561590146782e-13, 1.2872252400089318e-10,
     -5.5645956134363321e-11, 1.1975935546366981e-11, -4.1689782251838635e-15,
     -1.0940640427884594e-12, 4.6622399463901357e-13, -9.905105763906906e-14,
     1.8931876768373515e-17, 8.8592218725911273e-15),
    (6.4943415637860082e-4, 2.2947209362139918e-4, -4.6918949439525571e-4, 2.6772063206283885e-4,
     -7.5618016718839764e-5, -2.3965051138672967e-7, 1.1082654115347302e-5,
     -5.6749528269915966e-6, 1.4230900732435884e-6, -2.7861080291528142e-11,
     -1.6958404091930277e-7, 8.0994649053880824e-8, -1.9111168485973654e-8,
     2.3928620439808118e-12, 2.0620131815488798e-9, -9.4604966618551322e-10,
     2.1541049775774908e-10, -1.388823336813903e-14, -2.1894761681963939e-11,
     9.7909989511716851e-12, -2.1782191880180962e-12, 6.2088195734079014e-17,
     2.126978363279737e-13, -9.3446887915174333e-14, 2.0453671226782849e-14),
    (-8.618882909167117e-4, 7.8403922172006663e-4, -2.9907248030319018e-4,
     -1.4638452578843418e-6, 6.6414982154651222e-5, -3.9683650471794347e-5,
     1.1375726970678419e-5, 2.5074972262375328e-10, -1.6954149536558306e-6,
     8.9075075322053097e-7, -2.2929348340008049e-7, 2.956794137544049e-11, 2.8865829742708784e-8,
     -1.4189739437803219e-8, 3.4463580499464897e-9, -2.3024517174528067e-13,
     -3.9409233028046405e-10, 1.8602338968504502e-10, -4.356323005056618e-11,
     1.2786001016296231e-15, 4.6792750266579195e-12, -2.1492464706134829e-12,
     4.9088156148096522e-13, -6.3385914848915603e-18, -5.0453320690800944e-14),
    (-3.3679855336635815e-4, -6.9728137583658578e-5, 2.7727532449593921e-4,
     -1.9932570516188848e-4, 6.7977804779372078e-5, 1.419062920643967e-7, -1.3594048189768693e-5,
     8.0184702563342015e-6, -2.2914811765080952e-6, -3.252473551298454e-10,
     3.4652846491085265e-7, -1.8447187191171343e-7, 4.8240967037894181e-8,
     -1.7989466721743515e-14, -6.3061945000135234e-9, 3.1624176287745679e-9,
     -7.8409242536974293e-10, 5.1926791652540407e-15, 9.3589442423067836e-11,
     -4.5134262161632782e-11, 1.0799129993116827e-11, -3.661886712685252e-17,
     -1.210902069055155e-12, 5.6807435849905643e-13, -1.3249659916340829e-13),
    (5.3130793646399222e-4, -5.9216643735369388e-4, 2.7087820967180448e-4, 7.9023532326603279e-7,
     -8.1539693675619688e-5, 5.6116827531062497e-5, -1.8329116582843376e-5,
     -3.0796134506033048e-9, 3.4651553688036091e-6, -2.0291327396058604e-6,
     5.7887928631490037e-7, 2.338630673826657e-13, -8.8286007463304835e-8, 4.7435958880408128e-8,
     -1.2545415020710382e-8, 8.6496488580102925e-14, 1.6846058979264063e-9,
     -8.5754928235775947e-10, 2.1598224929232125e-10, -7.6132305204761539e-16,
     -2.6639822008536144e-11, 1.3065700536611057e-11, -3.1799163902367977e-12,
     4.7109761213674315e-18, 3.6902800842763467e-13),
    (3.4436760689237767e-4, 5.1717909082605922e-5, -3.3493161081142236e-4, 2.812695154763237e-4,
     -1.0976582244684731e-4, -1.2741009095484485e-7, 2.7744451511563644e-5,
     -1.8263488805711333e-5, 5.7876949497350524e-6, 4.9387589339362704e-10,
     -1.0595367014026043e-6, 6.1667143761104075e-7, -1.7562973359060462e-7,
     -1.2974473287015439e-12, 2.695423606288966e-8, -1.4578352908731271e-8, 3.887645959386175e-9,
     -3.8810022510194121e-17, -5.3279941738772867e-10, 2.7437977643314845e-10,
     -6.9957960920705679e-11, 2.5899863874868481e-17, 8.8566890996696381e-12,
     -4.403168815871311e-12, 1.0865561947091654e-12),
    (-6.5262391859530942e-4, 8.3949872067208728e-4, -4.3829709854172101e-4,
     -6.969091458420552e-7, 1.6644846642067548e-4, -1.2783517679769219e-4, 4.6299532636913043e-5,
     4.5579098679227077e-9, -1.0595271125805195e-5, 6.7833429048651666e-6,
     -2.1075476666258804e-6, -1.7213731432817145e-11, 3.7735877416110979e-7,
     -2.1867506700122867e-7, 6.2202288040189269e-8, 6.5977038267330006e-16,
     -9.5903864974256858e-9, 5.2132144922808078e-9, -1.3991589583935709e-9,
     5.382058999060575e-16, 1.9484714275467745e-10, -1.0127287556389682e-10,
     2.6077347197254926e-11, -5.0904186999932993e-18, -3.3721464474854592e-12),
    (-5.9676129019274625e-4, -7.2048954160200106e-5, 6.7823088376673284e-4,
     -6.4014752602627585e-4, 2.7750107634328704e-4, 1.8197008380465151e-7,
     -8.4795071170685032e-5, 6.105192082501531e-5, -2.1073920183404862e-5,
     -8.8585890141255994e-10, 4.5284535953805377e-6, -2.8427815022504408e-6,
     8.7082341778646412e-7, 3.6886101871706965e-12, -1.5344695190702061e-7, 8.862466778790695e-8,
     -2.5184812301826817e-8, -1.0225912098215092e-14, 3.8969470758154777e-9,
     -2.1267304792235635e-9, 5.7370135528051385e-10, -1.887749850169741e-19,
     -8.0931538694657866e-11, 4.2382723283449199e-11, -1.1002224534207726e-11),
    (1.3324454494800656e-3, -1.9144384985654775e-3, 1.1089369134596637e-3, 9.932404122642299e-7,
     -5.0874501293093199e-4, 4.2735056665392884e-4, -1.6858853767910799e-4,
     -8.1301893922784998e-9, 4.5284402370562147e-5, -3.127053674781734e-5, 1.044986828530338e-5,
     4.8435226265680926e-11, -2.1482565873456258e-6, 1.329369701097492e-6,
     -4.0295693092101029e-7, -1.7567877666323291e-13, 7.0145043163668257e-8,
     -4.040787734999483e-8, 1.1474026743371963e-8, 3.9642746853563325e-18,
     -1.7804938269892714e-9, 9.7480262548731646e-10, -2.6405338676507616e-10,
     5.794875163403742e-18, 3.7647749553543836e-11),
    (1.579727660730835e-3, 1.6251626278391582e-4, -2.0633421035543276e-3, 2.1389686185689098e-3,
     -1.0108559391263003e-3, -3.9912705529919201e-7, 3.6235025084764691e-4,
     -2.8143901463712154e-4, 1.0449513336495887e-4, 2.1211418491830297e-9,
     -2.5779417251947842e-5, 1.7281818956040463e-5, -5.6413773872904282e-6,
     -1.1024320105776174e-11, 1.1223224418895175e-6, -6.8693396379526735e-7,
     2.0653236975414887e-7, 4.6714772409838506e-14, -3.5609886164949055e-8,
     2.0470855345905963e-8, -5.8091738633283358e-9, -1.332821287582869e-16,
     9.0354604391335133e-10, -4.9598782517330834e-10, 1.3481607129399749e-10),
    (-4.0725121195140166e-3, 6.4033628338080698e-3, -4.0410161081676618e-3,
     -2.183732802866233e-6, 2.1740441801254639e-3, -1.9700440518418892e-3, 8.3595469747962458e-4,
     1.9445447567109655e-8, -2.5779387120421696e-4, 1.9009987368139304e-4,
     -6.7696499937438965e-5, -1.4440629666426572e-10, 1.5712512518742269e-5,
     -1.0304008744776893e-5, 3.304517767401387e-6, 7.9829760242325709e-13,
     -6.4097794149313004e-7, 3.8894624761300056e-7, -1.1618347644948869e-7,
     -2.816808630596451e-15, 1.9878012911297093e-8, -1.1407719956357511e-8,
     3.2355857064185555e-9, 4.1759468293455945e-20, -5.0423112718105824e-10),
    (-5.9475779383993003e-3, -5.4016476789260452e-4, 8.7910413550767898e-3,
     -9.8576315587856125e-3, 5.0134695031021538e-3, 1.2807521786221875e-6,
     -2.0626019342754683e-3, 1.7109128573523058e-3, -6.7695312714133799e-4,
     -6.9011545676562133e-9, 1.8855128143995902e-4, -1.3395215663491969e-4,
     4.6263183033528039e-5, 4.0034230613321351e-11, -1.0255652921494033e-5, 6.612086372797651e-6,
     -2.0913022027253008e-6, -2.0951775649603837e-13, 3.9756029041993247e-7,
     -2.3956211978815887e-7, 7.1182883382145864e-8, 8.925574873053455e-16,
     -1.2101547235064676e-8, 6.9350618248334386e-9, -1.9661464453856102e-9),
    (1.7402027787522711e-2, -2.9527880945699121e-2, 2.0045875571402799e-2, 7.0289515966903407e-6,
     -1.2375421071343148e-2, 1.1976293444235254e-2, -5.4156038466518525e-3,
     -6.3290893396418616e-8, 1.8855118129005065e-3, -1.473473274825001e-3, 5.5515810097708387e-4,
     5.2406834412550662e-10, -1.4357913535784836e-4, 9.9181293224943297e-5,
     -3.3460834749478311e-5, -3.5755837291098993e-12, 7.1560851960630076e-6,
     -4.5516802628155526e-6, 1.4236576649271475e-6, 1.8803149082089664e-14,
     -2.6623403898929211e-7, 1.5950642189595716e-7, -4.7187514673841102e-8,
     -6.5107872958755177e-17, 7.9795091026746235e-9),
    (3.0249124160905891e-2, 2.4817436002649977e-3, -4.9939134373457022e-2, 5.9915643009307869e-2,
     -3.2483207601623391e-2, -5.7212968652103441e-6, 1.5085251778569354e-2,
     -1.3261324005088445e-2, 5.5515262632426148e-3, 3.0263182257030016e-8,
     -1.7229548406756723e-3, 1.2893570099929637e-3, -4.6845138348319876e-4,
     -1.830259937893045e-10, 1.1449739014822654e-4, -7.7378565221244477e-5,
     2.5625836246985201e-5, 1.0766165333192814e-12, -5.3246809282422621e-6, 3.349634863064464e-6,
     -1.0381253128684018e-6, -5.608909920621128e-15, 1.9150821930676591e-7,
     -1.1418365800203486e-7, 3.3654425209171788e-8),
    (-9.9051020880159045e-2, 1.7954011706123486e-1, -1.2989606383463778e-1,
     -3.1478872752284357e-5, 9.0510635276848131e-2, -9.2828824411184397e-2,
     4.4412112839877808e-2, 2.7779236316835888e-7, -1.7229543805449697e-2, 1.4182925050891573e-2,
     -5.6214161633747336e-3, -2.39598509186381e-9, 1.6029634366079908e-3, -1.1606784674435773e-3,
     4.1001337768153873e-4, 1.8365800754090661e-11, -9.5844256563655903e-5,
     6.3643062337764708e-5, -2.076250624489065e-5, -1.1806020912804483e-13,
     4.2131808239120649e-6, -2.6262241337012467e-6, 8.0770620494930662e-7,
     6.0125912123632725e-16, -1.4729737374018841e-7),
    (-1.9994542198219728e-1, -1.5056113040026424e-2, 3.6470239469348489e-1,
     -4.6435192311733545e-1, 2.6640934719197893e-1, 3.4038266027147191e-5,
     -1.3784338709329624e-1, 1.276467178337056e-1, -5.6213828755200985e-2, -1.753150885483011e-7,
     1.9235592956768113e-2, -1.5088821281095315e-2, 5.7401854451350123e-3, 1.0622382710310225e-9,
     -1.5335082692563998e-3, 1.0819320643228214e-3, -3.7372510193945659e-4,
     -6.6170909729031985e-12, 8.4263617380909628e-5, -5.5150706827483479e-5,
     1.7769536448348069e-5, 3.8827923210205533e-14, -3.53513697488768e-6, 2.1865832130045269e-6,
     -6.6812849447625594e-7),
    (7.2438608504029431e-1, -1.3918010932653375, 1.0654143352413968, 1.876173868950258e-4,
     -8.2705501176152696e-1, 8.9352433347828414e-1, -4.4971003995291339e-1,
     -1.6107401567546652e-6, 1.9235590165271091e-1, -1.6597702160042609e-1,
     6.8882222681814333e-2, 1.3910091724608687e-8, -2.146911561508663e-2, 1.6228980898865892e-2,
     -5.9796016172584256e-3, -1.1287469112826745e-10, 1.5167451119784857e-3,
     -1.0478634293553899e-3, 3.5539072889126421e-4, 8.1704322111801517e-13,
     -7.7773013442452395e-5, 5.0291413897007722e-5, -1.6035083867000518e-5,
     1.2469354315487605e-14, 3.1369106244517615e-6),
    (1.6668949727276811, 1.165462765994632e-1, -3.3288393225018906, 4.4692325482864037,
     -2.6977693045875807, -2.600667859891061e-4, 1.5389017615694539, -1.4937962361134612,
     6.8881964633233148e-1, 1.3077482004552385e-6, -2.5762963325596288e-1, 2.1097676102125449e-1,
     -8.3714408359219882e-2, -7.7920428881354753e-9, 2.4267923064833599e-2,
     -1.7813678334552311e-2, 6.3970330388900056e-3, 4.9430807090480523e-11,
     -1.5554602758465635e-3, 1.0561196919903214e-3, -3.5277184460472902e-4,
     9.3002334645022459e-14, 7.5285855026557172e-5, -4.8186515569156351e-5,
     1.5227271505597605e-5),
    (-6.6188298861372935, 1.3397985455142589e+1, -1.0789350606845146e+1, -1.4352254537875018e-3,
     9.2333694596189809, -1.0456552819547769e+1, 5.5105526029033471, 1.2024439690716742e-5,
     -2.5762961164755816, 2.3207442745387179, -1.0045728797216284, -1.0207833290021914e-7,
     3.3975092171169466e-1, -2.6720517450757468e-1, 1.0235252851562706e-1,
     8.4329730484871625e-10, -2.7998284958442595e-2, 2.0066274144976813e-2,
     -7.0554368915086242e-3, 1.9402238183698188e-12, 1.6562888105449611e-3,
     -1.1082898580743683e-3, 3.654545161310169e-4, -5.1290032026971794e-11,
     -7.6340103696869031e-5),
    (-1.7112706061976095e+1, -1.1208044642899116, 3.7131966511885444e+1, -5.2298271025348962e+1,
     3.3058589696624618e+1, 2.4791298976200222e-3, -2.061089403411526e+1, 2.088672775145582e+1,
     -1.0045703956517752e+1, -1.2238783449063012e-5, 4.0770134274221141, -3.473667358470195,
     1.4329352617312006, 7.1359914411879712e-8, -4.4797257159115612e-1, 3.4112666080644461e-1,
     -1.2699786326594923e-1, -2.8953677269081528e-10, 3.3125776278259863e-2,
     -2.3274087021036101e-2, 8.0399993503648882e-3, -1.177805216235265e-9,
     -1.8321624891071668e-3, 1.2108282933588665e-3, -3.9479941246822517e-4),
    (7.389033153567425e+1, -1.5680141270402273e+2, 1.322177542759164e+2, 1.3692876877324546e-2,
     -1.2366496885920151e+2, 1.4620689391062729e+2, -8.0365587724865346e+1,
     -1.1259851148881298e-4, 4.0770132196179938e+1, -3.8210340013273034e+1, 1.719522294277362e+1,
     9.3519707955168356e-7, -6.2716159907747034, 5.1168999071852637, -2.0319658112299095,
     -4.9507215582761543e-9, 5.9626397294332597e-1, -4.4220765337238094e-1,
     1.6079998700166273e-1, -2.4733786203223402e-8, -4.0307574759979762e-2,
     2.7849050747097869e-2, -9.4751858992054221e-3, 6.419922235909132e-6, 2.1250180774699461e-3),
    (2.1216837098382522e+2, 1.3107863022633868e+1, -4.9698285932871748e+2, 7.3121595266969204e+2,
     -4.8213821720890847e+2, -2.8817248692894889e-2, 3.2616720302947102e+2,
     -3.4389340280087117e+2, 1.7195193870816232e+2, 1.4038077378096158e-4, -7.52594195897599e+1,
     6.651969984520934e+1, -2.8447519748152462e+1, -7.613702615875391e-7, 9.5402237105304373,
     -7.5175301113311376, 2.8943997568871961, -4.6612194999538201e-7, -8.0615149598794088e-1,
     5.8483006570631029e-1, -2.0845408972964956e-1, 1.4765818959305817e-4, 5.1000433863753019e-2,
     -3.3066252141883665e-2, 1.5109265210467774e-2),
    (-9.8959643098322368e+2, 2.1925555360905233e+3, -1.9283586782723356e+3,
     -1.5925738122215253e-1, 1.9569985945919857e+3, -2.4072514765081556e+3,
     1.3756149959336496e+3, 1.2920735237496668e-3, -7.525941715948055e+2, 7.3171668742208716e+2,
     -3.4137023466220065e+2, -9.9857390260608043e-6, 1.3356313181291573e+2,
     -1.1276295161252794e+2, 4.6310396098204458e+1, -7.9237387133614756e-6,
     -1.4510726927018646e+1, 1.1111771248100563e+1, -4.1690817945270892, 3.1008219800117808e-3,
     1.1220095449981468, -7.6052379926149916e-1, 3.6262236505085254e-1, 2.216867741940747e-1,
     4.8683443692930507e-1),
)


def _scalar(dt, value):
    return dt.type(value)


def _load_libm():
    """The C math library (ctypes), or None where it cannot be loaded."""
    import ctypes
    import ctypes.util
    for name in ("libm.so.6", "m"):
        try:
            return ctypes.CDLL(name if name != "m" else ctypes.util.find_library("m"))
        except (OSError, TypeError):
            continue
    return None


def _libm_functions():
    """PyTorch's scalar kernel calls the C library (std::lgamma, std::exp, in float: lgammaf,
    expf...), and exp(a log x - lgamma(a)) turns one ulp of a large lgamma into 1e-11 of the
    result (in float32, 1e-4): so these call the same functions. math's exp/log/log1p/expm1/erfc
    are the C library's double ones; math.lgamma and math.pow are not, so those and the float
    ones come through ctypes (numpy's own where the C library cannot be loaded)."""
    import ctypes
    lib = _load_libm()
    table = {}
    for name, nargs in (("exp", 1), ("log", 1), ("log1p", 1), ("expm1", 1), ("lgamma", 1),
                        ("pow", 2), ("erfc", 1)):
        if name not in ("lgamma", "pow"):
            table[name, xp.float64] = getattr(math, name)
        for suffix, ctype, dt in (("", ctypes.c_double, xp.float64),
                                  ("f", ctypes.c_float, xp.float32)):
            f = getattr(lib, name + suffix, None) if lib is not None else None
            if f is not None and (name, dt) not in table:
                f.restype, f.argtypes = ctype, [ctype] * nargs
                table[name, dt] = f
    return table


_LIBM = []  # filled on first use (loading the library costs an import nothing)
_NUMPY_MATH = {"exp": xp.exp, "log": xp.log, "log1p": xp.log1p, "expm1": xp.expm1,
               "pow": xp.power, "lgamma": lambda a: lgamma_array(a).astype(a.dtype),
               "erfc": lambda a: _math_erfc(a.astype(xp.float64)).astype(a.dtype)}


def _c_math(name, *arrays):
    """The C library's ``name`` element by element over float64/float32 arrays."""
    dt = arrays[0].dtype
    if not _LIBM:
        _LIBM.append(_libm_functions())
    fn = _LIBM[0].get((name, dt.type))
    if fn is not None:
        try:
            return xp.fromiter(map(fn, *(v.tolist() for v in arrays)), dt, count=arrays[0].size)
        except (ValueError, OverflowError):  # math's domain errors: the C values via numpy
            pass
    return _NUMPY_MATH[name](*arrays)


def _c_log(a):
    return _c_math("log", a)


def _c_exp(a):
    return _c_math("exp", a)


def _c_log1p(a):
    return _c_math("log1p", a)


def _c_expm1(a):
    return _c_math("expm1", a)


def _c_pow(a, b):
    return _c_math("pow", a, b)


def _fma(a, b, c, fused=True):
    """``a * b + c`` rounded once (``fused``), as the compiler contracts PyTorch's AVX-512
    kernel where it inlines it (the vectorised loop; igamma's call to igammac, the last < 16
    elements of a run, and the AVX2/default builds run unfused code): float32 through float64
    (the product is exact there); float64 by Dekker's exact product and a two-sum."""
    if not fused:
        return a * b + c
    if a.dtype != xp.float64:
        wide = a.astype(xp.float64) * b.astype(xp.float64) + c.astype(xp.float64)
        return wide.astype(a.dtype)
    p = a * b
    split = 134217729.0  # 2**27 + 1
    ta, tb = split * a, split * b
    ah, bh = ta - (ta - a), tb - (tb - b)
    al, bl = a - ah, b - bh
    e = ((ah * bh - p) + ah * bl + al * bh) + al * bl
    s = p + c
    bb = s - p
    t = (p - (s - bb)) + (c - bb)
    out = s + (t + e)
    exact = xp.isfinite(out) & xp.isfinite(ta) & xp.isfinite(tb)
    return xp.where(exact, out, p + c)


def _lgamma_in(a):
    return _c_math("lgamma", a)


def _erfc_c(a):
    """The C library's erfc (PyTorch's ``std::erfc``), whatever scipy is installed."""
    return _c_math("erfc", a)


def _lanczos_sum_expg_scaled(a, fused=True):
    """Boost's Lanczos sum (``ratevl``): a rational function, in 1/a above 1."""
    dt = a.dtype
    inverted = xp.abs(a) > 1
    y = xp.where(inverted, 1 / a, a)
    num = xp.where(inverted, _scalar(dt, _LANCZOS_NUM[-1]), _scalar(dt, _LANCZOS_NUM[0]))
    den = xp.where(inverted, _scalar(dt, _LANCZOS_DENOM[-1]), _scalar(dt, _LANCZOS_DENOM[0]))
    for i in range(1, len(_LANCZOS_NUM)):
        num = _fma(num, y, xp.where(inverted, _scalar(dt, _LANCZOS_NUM[-1 - i]),
                                    _scalar(dt, _LANCZOS_NUM[i])), fused)
        den = _fma(den, y, xp.where(inverted, _scalar(dt, _LANCZOS_DENOM[-1 - i]),
                                    _scalar(dt, _LANCZOS_DENOM[i])), fused)
    return num / den


def _igam_fac(a, x, fused=True):
    """``x^a exp(-x) / Gamma(a)`` (``_igam_helper_fac``), with the Lanczos form near a == x."""
    dt = a.dtype
    out = xp.empty_like(a)
    far = xp.abs(a - x) > 0.4 * xp.abs(a).astype(xp.float64)
    if far.any():
        af, xf = a[far], x[far]
        ax = _fma(af, _c_log(xf), -xf, fused) - _lgamma_in(af)
        out[far] = xp.where(ax < -_IGAM_MAXLOG[dt.type], _scalar(dt, 0), _c_exp(ax))
    near = ~far
    if near.any():
        an, xn = a[near], x[near]
        g = _scalar(dt, _LANCZOS_G)
        fac = an + g - _scalar(dt, 0.5)
        res = xp.sqrt(fac / _scalar(dt, 2.718281828459045)) / _lanczos_sum_expg_scaled(an, fused)
        small = (an < 200) & (xn < 200)
        s, b = small, ~small
        out_near = xp.empty_like(an)
        out_near[s] = res[s] * (_c_exp(an[s] - xn[s]) * _c_pow(xn[s] / fac[s], an[s]))
        # the C code's double literals (0.5) make this branch double even for float
        wide = xp.float64
        numfac = ((xn[b] - an[b] - g).astype(wide) + 0.5).astype(dt) / fac[b]
        tail = xn[b].astype(wide) * (0.5 - g.astype(wide)) / fac[b].astype(wide)
        log_term = _c_log1p(numfac) - numfac
        if dt == wide:
            exponent = _fma(an[b], log_term, tail, fused)
        else:  # a float product and a double sum: nothing to fuse
            exponent = (an[b] * log_term).astype(wide) + tail
        out_near[b] = (res[b].astype(wide) * _c_exp(exponent)).astype(dt)
        out[near] = out_near
    return out


def _igam_series(a, x, fused=True):
    """The lower function's power series (DLMF 8.11.4; ``_igam_helper_series``)."""
    dt = a.dtype
    machep = _scalar(dt, _IGAM_MACHEP[dt.type])
    ax = _igam_fac(a, x, fused)
    ans = xp.ones_like(a)
    live = xp.nonzero(ax != 0)[0]  # where the factor underflows the result is 0 (no loop)
    r, c, s, xs = a[live], xp.ones(live.size, dt), xp.ones(live.size, dt), x[live]
    for _ in range(_IGAM_MAXITER):
        if not live.size:
            break
        r = r + 1
        c = c * (xs / r)
        s = s + c
        stop = c <= machep * s
        if stop.any():
            ans[live[stop]] = s[stop]
            keep = ~stop
            live, r, c, s, xs = live[keep], r[keep], c[keep], s[keep], xs[keep]
    ans[live] = s
    return xp.where(ax == 0, _scalar(dt, 0), ans * ax / a)


def _igamc_series(a, x, fused=True):
    """The upper function's series without cancellation (DLMF 8.7.3; ``_igamc_helper_series``)."""
    dt = a.dtype
    machep = _scalar(dt, _IGAM_MACHEP[dt.type])
    total = xp.zeros_like(a)
    live = xp.arange(a.size)
    fac, s, al, xl = xp.ones_like(a), xp.zeros_like(a), a, x
    for n in range(1, _IGAM_MAXITER):
        if not live.size:
            break
        fac = fac * (-xl / _scalar(dt, n))
        term = fac / (al + _scalar(dt, n))
        s = s + term
        stop = xp.abs(term) <= machep * xp.abs(s)
        if stop.any():
            total[live[stop]] = s[stop]
            keep = ~stop
            live, fac, s, al, xl = live[keep], fac[keep], s[keep], al[keep], xl[keep]
    total[live] = s
    logx = _c_log(x)
    term = -_c_expm1(_fma(a, logx, -_lgamma_in(1 + a), fused))
    return _fma(-_c_exp(_fma(a, logx, -_lgamma_in(a), fused)), total, term, fused)


def _igamc_continued_fraction(a, x, fused=True):
    """The upper function's continued fraction (DLMF 8.9.2;
    ``_igamc_helper_continued_fraction``)."""
    dt = a.dtype
    machep = _scalar(dt, _IGAM_MACHEP[dt.type])
    big, biginv = _scalar(dt, _IGAM_BIG[dt.type]), _scalar(dt, _IGAM_BIGINV[dt.type])
    one = _scalar(dt, 1)
    ax = _igam_fac(a, x, fused)
    out = xp.zeros_like(a)
    live = xp.nonzero(ax != 0)[0]
    xs = x[live]
    y = one - a[live]
    z = xs + y + one
    c = xp.zeros_like(xs)
    pkm2, qkm2 = xp.ones_like(xs), xs
    pkm1, qkm1 = xs + one, z * xs
    ans = pkm1 / qkm1
    for _ in range(_IGAM_MAXITER):
        if not live.size:
            break
        c = c + one
        y = y + one
        z = z + 2
        yc = y * c
        pk = _fma(pkm1, z, -(pkm2 * yc), fused)
        qk = _fma(qkm1, z, -(qkm2 * yc), fused)
        nonzero = qk != 0
        with xp.errstate(divide="ignore", invalid="ignore"):
            r = pk / qk
            t = xp.where(nonzero, xp.abs((ans - r) / r), one)
        ans = xp.where(nonzero, r, ans)
        pkm2, pkm1, qkm2, qkm1 = pkm1, pk, qkm1, qk
        rescale = xp.abs(pk) > big
        if rescale.any():
            pkm2 = xp.where(rescale, pkm2 * biginv, pkm2)
            pkm1 = xp.where(rescale, pkm1 * biginv, pkm1)
            qkm2 = xp.where(rescale, qkm2 * biginv, qkm2)
            qkm1 = xp.where(rescale, qkm1 * biginv, qkm1)
        stop = t <= machep
        if stop.any():
            out[live[stop]] = ans[stop]
            keep = ~stop
            live, ans, c, y, z = live[keep], ans[keep], c[keep], y[keep], z[keep]
            pkm2, pkm1, qkm2, qkm1 = pkm2[keep], pkm1[keep], qkm2[keep], qkm1[keep]
    out[live] = ans
    return out * ax


def _igam_asymptotic(a, x, lower):
    """Temme's uniform expansion for large a near x (DLMF 8.12.3 / 8.12.4;
    ``_igam_helper_asymptotic_series``)."""
    dt = a.dtype
    machep = _scalar(dt, _IGAM_MACHEP[dt.type])
    d = xp.asarray(_IGAM_ASYMPTOTIC_D, dtype=dt)
    sgn = _scalar(dt, -1 if lower else 1)
    lam = x / a
    sigma = (x - a) / a
    root = xp.sqrt(-2 * (_c_log1p(sigma) - sigma))
    eta = xp.where(lam > 1, root, xp.where(lam < 1, -root, _scalar(dt, 0)))
    res = _scalar(dt, 0.5) * _erfc_c(sgn * eta * xp.sqrt(a / 2))
    etapow = [xp.ones_like(eta)]
    for _ in range(1, 25):
        etapow.append(eta * etapow[-1])
    total = xp.zeros_like(a)
    afac = xp.ones_like(a)
    absoldterm = xp.full_like(a, xp.inf)
    going = xp.ones(a.shape, bool)
    for k in range(25):
        ck = xp.full_like(a, d[k, 0])
        summing = going.copy()
        for n in range(1, 25):
            ckterm = d[k, n] * etapow[n]
            ck = xp.where(summing, ck + ckterm, ck)
            summing &= ~(xp.abs(ckterm) < machep * xp.abs(ck))
            if not summing.any():
                break
        term = ck * afac
        absterm = xp.abs(term)
        going &= ~(absterm > absoldterm)
        total = xp.where(going, total + term, total)
        going &= ~(absterm < machep * xp.abs(total))
        if not going.any():
            break
        absoldterm = xp.where(going, absterm, absoldterm)
        afac = xp.where(going, afac / a, afac)
    two_pi = _scalar(dt, 2 * float(xp.float32(math.pi)))  # PyTorch's 2 * c10::pi<float>
    wide = xp.float64  # the literal -0.5 makes the correction double even for float
    a_, eta_ = a.astype(wide), eta.astype(wide)
    correction = (float(sgn) * _c_exp(-0.5 * a_ * eta_ * eta_) * total.astype(wide)
                  / xp.sqrt(two_pi * a).astype(wide))
    return (res.astype(wide) + correction).astype(dt)


def _igam_asymptotic_regime(a, x):
    """Where both kernels use the uniform expansion: a large and x near a."""
    absxma_a = xp.abs(x - a) / a
    large = a > 200
    with xp.errstate(divide="ignore", invalid="ignore"):
        wide = absxma_a < 4.5 / xp.sqrt(xp.where(large, a, 1))
    return ((a > 20) & (a < 200) & (absxma_a < 0.3)) | (large & wide)


def _igam_boundary(a, x, lower):
    """The values PyTorch assigns at the edges of the domain, in its order, as
    ``(decided, values)``; NaN inputs the general branches would turn to NaN are decided
    NaN here (not 2000 iterations later)."""
    dt = a.dtype
    nan, zero, one = _scalar(dt, xp.nan), _scalar(dt, 0), _scalar(dt, 1)
    lo, hi = (zero, one) if lower else (one, zero)
    values = xp.full_like(a, nan)
    decided = (x < 0) | (a < 0)
    at = ~decided & (a == 0)
    values[at] = xp.where(x[at] > 0, hi, nan)
    decided |= at
    at = ~decided & (x == 0)
    values[at] = lo
    decided |= at
    at = ~decided & xp.isinf(a)
    values[at] = xp.where(xp.isinf(x[at]), nan, lo)
    decided |= at
    at = ~decided & xp.isinf(x)
    values[at] = hi
    decided |= at
    decided |= xp.isnan(a) | xp.isnan(x)  # still nan in values
    return decided, values


def _igammac_flat(a, x, fused=True):
    """``calc_igammac`` over 1-d arrays of one float dtype (``fused``: see ``_fma``)."""
    decided, out = _igam_boundary(a, x, lower=False)
    rest = ~decided
    asym = rest & _igam_asymptotic_regime(a, x)
    if asym.any():
        out[asym] = _igam_asymptotic(a[asym], x[asym], lower=False)
    rest &= ~asym
    x64, a64 = x.astype(xp.float64), a.astype(xp.float64)  # the C code's double literals
    with xp.errstate(divide="ignore"):
        small_x_lower = -0.4 / _c_log(x).astype(xp.float64) < a64
    lower_series = rest & xp.where(x64 > 1.1, x < a,
                                   xp.where(x64 <= 0.5, small_x_lower, x64 * 1.1 < a64))
    if lower_series.any():
        out[lower_series] = 1 - _igam_series(a[lower_series], x[lower_series], fused)
    fraction = rest & ~lower_series & (x64 > 1.1)
    if fraction.any():
        out[fraction] = _igamc_continued_fraction(a[fraction], x[fraction], fused)
    upper_series = rest & ~lower_series & ~fraction
    if upper_series.any():
        out[upper_series] = _igamc_series(a[upper_series], x[upper_series], fused)
    return out


def _igamma_flat(a, x):
    """``calc_igamma`` over 1-d arrays of one float dtype."""
    decided, out = _igam_boundary(a, x, lower=True)
    rest = ~decided
    asym = rest & _igam_asymptotic_regime(a, x)
    if asym.any():
        out[asym] = _igam_asymptotic(a[asym], x[asym], lower=True)
    rest &= ~asym
    upper = rest & (x > 1) & (x > a)
    if upper.any():  # PyTorch calls igammac's out-of-line (unfused) copy here
        out[upper] = 1 - _igammac_flat(a[upper], x[upper], fused=False)
    series = rest & ~upper
    if series.any():
        out[series] = _igam_series(a[series], x[series])
    return out


def _igam_apply(flat, a, x):
    a, x = xp.broadcast_arrays(xp.asarray(a), xp.asarray(x))
    dt = xp.result_type(a, x)
    work = xp.float64 if dt == xp.float64 else xp.float32  # float16/bfloat16: in float
    shape = a.shape
    with xp.errstate(all="ignore"):
        out = flat(a.astype(work).ravel(), x.astype(work).ravel())
    return out.reshape(shape).astype(dt, copy=False)


def igamma_array(a, x):
    """The regularized lower incomplete gamma function ``P(a, x)`` (PyTorch's CPU kernel)."""
    return _igam_apply(_igamma_flat, a, x)


def igammac_array(a, x):
    """The regularized upper incomplete gamma function ``Q(a, x) = 1 - P(a, x)``."""
    return _igam_apply(_igammac_flat, a, x)


def _igam_density(a, x):
    # d/dx P(a, x) = x^(a-1) e^-x / Gamma(a), as PyTorch's derivatives.yaml writes it
    return exp((a - 1) * log(x) - x - lgamma(a))


@op(flops=200, elementwise=True, float_only=True, needs=True, name="igamma", pointwise=True)
def igamma_op(a, x):
    return igamma_array(a, x)


@igamma_op.grad
def _(g, out, a, x, needs=(True, True)):
    if needs[0]:
        raise NotImplementedError("the derivative for 'igamma: input' is not implemented.")
    return None, g * _igam_density(a, x)


@op(flops=200, elementwise=True, float_only=True, needs=True, name="igammac", pointwise=True)
def igammac_op(a, x):
    return igammac_array(a, x)


@igammac_op.grad
def _(g, out, a, x, needs=(True, True)):
    if needs[0]:
        raise NotImplementedError("the derivative for 'igammac: input' is not implemented.")
    return None, -g * _igam_density(a, x)


def _igam_check(name, input, other):
    from tapegrad.ops.registry import Tensor
    for position, (arg, t) in enumerate((("input", input), ("other", other)), 1):
        if not isinstance(t, Tensor):
            raise TypeError(f"{name}(): argument '{arg}' (position {position}) must be Tensor, "
                            f"not {type(t).__name__}")
    if input._data.dtype.kind in "iub" and other._data.dtype.kind in "iub":
        raise RuntimeError(f"{name}: \"{name}_cpu\" not implemented for integer inputs "
                           f"({input.dtype} and {other.dtype}); PyTorch computes it in floating "
                           "point only")


def igamma(input, other):
    """As ``torch.igamma`` / ``torch.special.gammainc``: the regularized lower incomplete gamma
    function ``P(a, x) = gamma(a, x) / Gamma(a)``, differentiable in ``x`` only (as PyTorch).

    >>> tapegrad.igamma(tapegrad.tensor([1.0]), tapegrad.tensor([2.0]))  # 1 - e^-2: [0.8647]
    """
    _igam_check("igamma", input, other)
    return igamma_op(input, other)


def igammac(input, other):
    """As ``torch.igammac`` / ``torch.special.gammaincc``: ``Q(a, x) = 1 - P(a, x)``, computed
    without cancellation, differentiable in ``x`` only (as PyTorch).

    >>> tapegrad.igammac(tapegrad.tensor([1.0]), tapegrad.tensor([2.0]))  # e^-2: [0.1353]
    """
    _igam_check("igammac", input, other)
    return igammac_op(input, other)


# The rest compute in float64 with scipy's Cephes kernels, the C library, or numpy ports of
# PyTorch's algorithms over whole arrays (masks, series, continued fractions) and round once:
# no scalar form here, so each runs as its own node in a compiled graph (eager's forward).
for _o in (erfc, ndtr, ndtri, log_ndtr, i0, i0e, i1, i1e, bessel_j0, bessel_j1):
    _o.not_lowered("scipy's Cephes kernel (or the C library's erfc) in float64: no scalar form")
for _o in (zeta, lgamma, digamma, polygamma_op, erfinv, igamma_op, igammac_op):
    _o.not_lowered("a numpy port of PyTorch's algorithm over whole arrays (masks, series, "
                   "continued fractions): no scalar form")
