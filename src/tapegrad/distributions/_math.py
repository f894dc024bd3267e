"""Gamma(alpha, 1) samples with an implicit reparameterisation gradient, for Gamma, Beta and
Dirichlet's ``rsample``.

``standard_gamma`` draws samples whose gradient with respect to ``alpha`` is
``dx/dalpha = -(dP(alpha, x)/dalpha) / p(alpha, x)`` (P the regularised lower incomplete gamma).
The special functions and matrix ops the distributions use are tapegrad's own
(``tapegrad.special``, ``tapegrad.linalg``).
"""
import math

from tapegrad.backend import xp
from tapegrad.ops.registry import op
from tapegrad.ops.special_functions import digamma_array, lgamma_array
from tapegrad.tensor import Tensor


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
        log_pref = -x + alpha * xp.log(x) - lgamma_array(alpha + 1)
        pref = xp.exp(log_pref)
        dp = pref * (s * (xp.log(x) - digamma_array(alpha + 1)) + ds)
        log_density = -x + (alpha - 1) * xp.log(x) - lgamma_array(alpha)
        grad = -dp / xp.exp(log_density)
    return xp.where(xp.isfinite(grad), grad, 0.0)


@op(flops=1, saves="inputs", name="distributions_standard_gamma", pointwise=True)
def _gamma_reparam(alpha, sample):
    """Returns ``sample`` (drawn from Gamma(alpha, 1)); the rule is dx/dalpha."""
    return sample.copy()


_gamma_reparam.lower("({1})")  # the sample itself (a fresh copy in eager)


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
