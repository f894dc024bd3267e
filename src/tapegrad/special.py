"""``tapegrad.special``: PyTorch's ``torch.special`` namespace.

    import tapegrad as torch
    torch.special.gammaln(torch.tensor([0.5, 3.0]))     # tensor([0.5724, 0.6931])

Every function is differentiable where PyTorch's is (``zeta`` in ``q`` only, ``gammainc`` and
``gammaincc`` in ``x`` only; ``bessel_j0`` and ``bessel_j1`` not at all). Which functions need scipy: see
``tapegrad.ops.special_functions``.
"""
import math

from tapegrad.ops import registry as _registry
from tapegrad.ops import special_functions as _SF, elementwise as _E, reduce as _R
from tapegrad.ops.special_functions import (erfc, ndtr, ndtri, log_ndtr, xlog1py, sinc, entr,
                                            i0, i0e, i1, i1e, bessel_j0, bessel_j1, digamma,
                                            erfinv, lgamma as gammaln, polygamma, igamma,
                                            igammac)
from tapegrad.ops.elementwise import erf, expm1, log1p, round  # noqa: F401
from tapegrad.ops.pointwise_math import xlogy, exp2  # noqa: F401

__all__ = ["erf", "erfc", "erfinv", "expit", "logit", "xlogy", "xlog1py", "gammaln",
           "digamma", "psi", "polygamma", "multigammaln", "i0", "i0e", "i1", "i1e", "ndtr",
           "ndtri", "log_ndtr", "sinc", "entr", "logsumexp", "softmax", "log_softmax", "round",
           "zeta", "bessel_j0", "bessel_j1", "expm1", "exp2", "log1p", "gammainc", "gammaincc"]

psi = digamma
gammainc, gammaincc = igamma, igammac  # as torch.special: the regularized incomplete gammas


def expit(input):
    """As ``torch.special.expit``: the logistic sigmoid."""
    return _E.sigmoid(input)


def logit(input, eps=None):
    """As ``torch.special.logit``: ``log(p / (1 - p))``, with ``p`` clamped to
    ``[eps, 1 - eps]`` when ``eps`` is given (the gradient is 0 outside that range)."""
    return _SF.logit_op(input, eps=None if eps is None else float(eps))


def multigammaln(input, p):
    """As ``torch.special.multigammaln``: the log of the multivariate gamma function of
    dimension ``p``: ``sum_i lgamma(x - i/2) + p (p-1)/4 log(pi)``."""
    p = int(p)
    if p < 1:  # PyTorch 2.13 no longer checks x > (p-1)/2: lgamma's values (inf at poles)
        raise RuntimeError(f"multigammaln: p has to be greater than or equal to 1 (got {p})")
    data = input._data
    if data.dtype.kind in "iub":
        raise RuntimeError(f"multigammaln: expected a floating point input, got {input.dtype}")
    # PyTorch's order: x + (-(p-1)/2, ..., -1/2, 0), lgamma, summed over that new last dim
    offsets = _registry.Tensor._make(_registry.xp.arange(-(p - 1) / 2, 0.25, 0.5, dtype=data.dtype))
    terms = gammaln(_E.add(_unsqueeze_last(input), offsets))
    return _R.sum(terms, -1) + p * (p - 1) / 4 * math.log(math.pi)


def _unsqueeze_last(x):
    from tapegrad.ops.movement import unsqueeze
    return unsqueeze(x, -1)


def zeta(input, other):
    """As ``torch.special.zeta(x, q)``: the Hurwitz zeta function (gradient in ``q`` only, as
    in PyTorch). Either argument may be a number."""
    if not isinstance(input, _registry.Tensor) and not isinstance(other, _registry.Tensor):
        raise TypeError("special.zeta: expected at least one Tensor argument")
    return _SF.zeta(input, other)


def logsumexp(input, dim, keepdim=False):
    """As ``torch.special.logsumexp``: ``torch.logsumexp``."""
    return _R.logsumexp(input, dim, keepdim)


def softmax(input, dim, *, dtype=None):
    """As ``torch.special.softmax``: ``torch.softmax``."""
    from tapegrad.tensor import softmax as _softmax
    return _softmax(input, dim, dtype=dtype)


def log_softmax(input, dim, *, dtype=None):
    """As ``torch.special.log_softmax``: ``torch.log_softmax``."""
    from tapegrad.tensor import log_softmax as _log_softmax
    return _log_softmax(input, dim, dtype=dtype)


def mvlgamma(input, p):
    """As ``torch.mvlgamma``: ``torch.special.multigammaln``."""
    return multigammaln(input, p)


# the top-level names and Tensor methods PyTorch has for these (torch.lgamma, x.erfinv()...)
TOPLEVEL = {"erfc": erfc, "erfinv": erfinv, "lgamma": gammaln, "digamma": digamma,
            "polygamma": polygamma, "mvlgamma": mvlgamma, "i0": i0, "sinc": sinc,
            "logit": logit, "igamma": igamma, "igammac": igammac}
for _name, _fn in TOPLEVEL.items():
    if _name == "polygamma":  # x.polygamma(n) takes n second
        setattr(_registry.Tensor, _name, lambda self, n: polygamma(n, self))
    else:
        setattr(_registry.Tensor, _name, _fn)
for _name in ("igamma", "igammac"):  # x.igamma_(other): written in place, version bumped
    from tapegrad.tensor import _generic_inplace
    setattr(_registry.Tensor, _name + "_", _generic_inplace(_name))
