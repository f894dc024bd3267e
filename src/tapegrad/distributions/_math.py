"""The differentiable special functions and matrix ops the distributions need.

``lgamma``, ``digamma``, ``polygamma``, ``erfinv``, ``cholesky`` and ``solve_triangular`` are
``@op``s with gradient rules beside their forwards (tapegrad has no ``special`` or ``linalg``
module yet; when it has, these move there). The forwards follow PyTorch's CPU algorithms
(``lgamma`` is the C library's, as ``math.lgamma``; ``digamma``/``trigamma`` shift to x >= 10
(6) and sum the asymptotic series; higher polygammas go through the Hurwitz zeta function), so
float64 values agree with PyTorch to the last few bits. ``standard_gamma`` draws Gamma(alpha, 1)
samples whose gradient with respect to ``alpha`` is the implicit reparameterisation
``dx/dalpha = -(dP(alpha, x)/dalpha) / p(alpha, x)`` (P the regularised lower incomplete gamma).
"""
import math

from tapegrad.backend import xp
from tapegrad.ops.elementwise import exp, _floating, np_dtype
from tapegrad.ops.linalg import matmul
from tapegrad.ops.movement import tril_op, triu_op, broadcast_to
from tapegrad.ops.registry import op
from tapegrad.tensor import Tensor

def _lgamma_one(v):
    try:
        return math.lgamma(v)
    except ValueError:  # poles at 0, -1, -2, ...: +inf, as the C library
        return math.inf


_lgamma_vec = xp.frompyfunc(_lgamma_one, 1, 1)


@op(flops=40, float_only=True, name="distributions_lgamma")
def lgamma(a):
    """As ``torch.lgamma``: log |Gamma(a)| (``+inf`` at the poles)."""
    a = _floating(a)
    return xp.asarray(_lgamma_vec(a), dtype=xp.float64).astype(a.dtype, copy=False)


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
    sign = xp.where(refl, -1.0, 1.0)
    with xp.errstate(divide="ignore", invalid="ignore"):
        s = xp.sin(math.pi * x)
        result = xp.where(refl, -(math.pi * math.pi) / (s * s), 0.0)
        y = xp.where(refl, 1 - x, x)
        for _ in range(6):
            result = result + 1 / (y * y)
            y = y + 1
        ixx = 1 / (y * y)
        result = result + (1 + 1 / (2 * y) + ixx * (1. / 6 - ixx * (1. / 30 - ixx * (1. / 42)))) / y
    return sign * result


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


@op(flops=60, float_only=True, name="distributions_digamma")
def digamma(a):
    """As ``torch.digamma``: the logarithmic derivative of Gamma."""
    a = _floating(a)
    return digamma_array(a).astype(a.dtype, copy=False)


@digamma.grad
def _(g, out, a):
    return g * polygamma_op(a, n=1)


@op(flops=80, float_only=True, name="distributions_polygamma")
def polygamma_op(a, n):
    a = _floating(a)
    return polygamma_array(n, a).astype(a.dtype, copy=False)


@polygamma_op.grad
def _(g, out, a, n):
    return g * polygamma_op(a, n=n + 1)


def polygamma(n, input):
    """As ``torch.polygamma(n, x)``: the n-th derivative of digamma."""
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
        two_over_sqrt_pi = 2.0 / math.sqrt(math.pi)
        inner = xp.isfinite(x) & (xp.abs(y) < 1)
        for _ in range(3):
            xs = xp.where(inner, x, 0.0)
            step = (erf(xs) - y) / (two_over_sqrt_pi * xp.exp(-xs * xs))
            x = xp.where(inner, xs - step, x)
    x = xp.where(y == 1, xp.inf, xp.where(y == -1, -xp.inf, x))
    return xp.where(xp.abs(y) > 1, xp.nan, x)


@op(flops=60, saves="out", float_only=True, name="distributions_erfinv")
def erfinv(a):
    """As ``torch.erfinv``: the inverse of ``erf`` on (-1, 1)."""
    a = _floating(a)
    return erfinv_array(a).astype(a.dtype, copy=False)


@erfinv.grad
def _(g, out, a):
    return g * (math.sqrt(math.pi) / 2) * exp(out * out)


try:  # the shared op, where tapegrad has it
    from tapegrad.ops.extra_elementwise import xlogy
except ImportError:  # pragma: no cover - only before extra_elementwise exists
    @op(flops=12, elementwise=True, float_only=True, needs=True, name="distributions_xlogy")
    def xlogy(a, b):
        """As ``torch.xlogy(a, b)``: ``a * log(b)``, 0 where ``a == 0`` (unless b is NaN)."""
        with xp.errstate(divide="ignore", invalid="ignore"):
            out = a * xp.log(b)
        return xp.where((a == 0) & ~xp.isnan(b), 0, out).astype(out.dtype, copy=False)

    @xlogy.grad
    def _(g, out, a, b, needs=(True, True)):
        ga = g * xlogy(a != 0, b) if needs[0] else None
        return ga, (g * a / b if needs[1] else None)


# --- matrices ----------------------------------------------------------------------------
def _mask(n, dtype):
    """Lower triangle with a halved diagonal: the Phi() of the Cholesky gradient."""
    m = xp.tril(xp.ones((n, n)))
    m[xp.diag_indices(n)] = 0.5
    return m.astype(dtype)


@op(flops=1, saves="out", name="distributions_cholesky")
def cholesky(a):
    """As ``torch.linalg.cholesky``: the lower factor L with ``L @ L.mT == a`` (batched)."""
    if a.ndim < 2 or a.shape[-1] != a.shape[-2]:
        raise RuntimeError(f"linalg.cholesky: A must be batches of square matrices, but they "
                           f"are {tuple(a.shape)} matrices")
    try:
        return xp.linalg.cholesky(a)
    except xp.linalg.LinAlgError:
        raise RuntimeError("linalg.cholesky: The factorization could not be completed because "
                           "the input is not positive-definite") from None


@cholesky.grad
def _(g, out, a):
    # Murray (2016): A_bar = sym(L^-T Phi(L^T L_bar) L^-1), Phi: lower triangle, half diagonal
    phi = matmul(out.mT, tril_op(g)) * _mask(out.shape[-1], np_dtype(g.dtype))
    phi_l_inv = solve_triangular_op(out.mT, phi.mT, upper=True).mT  # phi L^-1
    s = solve_triangular_op(out.mT, phi_l_inv, upper=True)
    return (s + s.mT) * 0.5


@op(flops=1, saves="both", needs=True, name="distributions_solve_triangular")
def solve_triangular_op(a, b, upper):
    """``a^-1 b`` for triangular ``a`` (same batch dims), by substitution, row by row."""
    if a.shape[:-2] != b.shape[:-2] or a.shape[-1] != a.shape[-2] or \
            b.shape[-2] != a.shape[-1]:
        raise RuntimeError(f"linalg.solve_triangular: incompatible shapes A {tuple(a.shape)} "
                           f"and B {tuple(b.shape)}")
    dtype = xp.result_type(a.dtype, b.dtype)
    x = xp.zeros(b.shape, dtype)
    n = a.shape[-1]
    rows = range(n - 1, -1, -1) if upper else range(n)
    for i in rows:
        done = slice(i + 1, n) if upper else slice(0, i)
        acc = b[..., i, :] - xp.einsum("...j,...jk->...k", a[..., i, done], x[..., done, :])
        x[..., i, :] = acc / a[..., i, i, None]
    return x


@solve_triangular_op.grad
def _(g, out, a, b, upper, needs=(True, True)):
    gb = solve_triangular_op(a.mT, g, upper=not upper)
    ga = None
    if needs[0]:
        full = -matmul(gb, out.mT)
        ga = triu_op(full) if upper else tril_op(full)
    return ga, (gb if needs[1] else None)


def solve_triangular(A, B, *, upper, left=True):
    """As ``torch.linalg.solve_triangular(A, B, upper=...)`` (batch dims broadcast)."""
    if not left:
        return solve_triangular(A.mT, B.mT, upper=not upper).mT
    batch = tuple(xp.broadcast_shapes(tuple(A.shape[:-2]), tuple(B.shape[:-2])))
    if tuple(A.shape[:-2]) != batch:
        A = broadcast_to(A, shape=batch + tuple(A.shape[-2:]))
    if tuple(B.shape[:-2]) != batch:
        B = broadcast_to(B, shape=batch + tuple(B.shape[-2:]))
    return solve_triangular_op(A, B, upper=upper)


# --- Gamma samples with an implicit reparameterisation gradient ----------------------------
def _gamma_reparam_grad(x, alpha):
    """dx/dalpha for x ~ Gamma(alpha, 1): -(dP/dalpha) / p, P by its power series."""
    x = xp.asarray(x, dtype=xp.float64)
    alpha = xp.asarray(alpha, dtype=xp.float64)
    x, alpha = xp.broadcast_arrays(x, alpha)
    with xp.errstate(divide="ignore", invalid="ignore", over="ignore", under="ignore"):
        # P(a, x) = exp(-x + a log x - lgamma(a + 1)) * S, S = sum_n prod_k x / (a + k)
        top = float(x.max()) if x.size else 0.0
        terms = int(min(top + 12 * math.sqrt(top) + 40, 20000))
        t = xp.ones_like(x)
        s = xp.ones_like(x)
        ds = xp.zeros_like(x)  # dS/da
        harmonic = xp.zeros_like(x)  # sum_k 1 / (a + k)
        for k in range(1, terms + 1):
            t = t * x / (alpha + k)
            harmonic = harmonic + 1 / (alpha + k)
            s = s + t
            ds = ds - t * harmonic
        log_pref = -x + alpha * xp.log(x) - xp.asarray(_lgamma_vec(alpha + 1), xp.float64)
        pref = xp.exp(log_pref)
        dp = pref * (s * (xp.log(x) - digamma_array(alpha + 1)) + ds)
        log_density = -x + (alpha - 1) * xp.log(x) - xp.asarray(_lgamma_vec(alpha), xp.float64)
        grad = -dp / xp.exp(log_density)
    return xp.where(xp.isfinite(grad), grad, 0.0)


@op(flops=1, saves="inputs", name="distributions_standard_gamma")
def _gamma_reparam(alpha, sample):
    """Returns ``sample`` (drawn from Gamma(alpha, 1)); the rule is dx/dalpha."""
    return sample.copy()


@_gamma_reparam.grad
def _(g, out, alpha, sample):
    alpha_data = alpha._data if isinstance(alpha, Tensor) else alpha
    sample_data = sample._data if isinstance(sample, Tensor) else sample
    d = _gamma_reparam_grad(sample_data, alpha_data).astype(alpha_data.dtype)
    return g * d, None


def standard_gamma(alpha, rng):
    """Gamma(alpha, 1) samples of ``alpha``'s shape, differentiable in ``alpha``."""
    data = alpha._data
    sample = rng.standard_gamma(data.astype(xp.float64)).astype(data.dtype)
    tiny = xp.finfo(data.dtype).tiny
    sample = xp.maximum(sample, tiny)  # as PyTorch's clamp of zero draws to the smallest normal
    return _gamma_reparam(alpha, Tensor._make(sample))
