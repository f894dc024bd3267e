"""As ``torch.distributions.MultivariateNormal``: by ``covariance_matrix``,
``precision_matrix`` or ``scale_tril`` (one of them)."""
import math

import tapegrad
from tapegrad.backend import xp
from tapegrad.distributions import constraints
from tapegrad.linalg import cholesky, solve_triangular
from tapegrad.distributions.distribution import Distribution
from tapegrad.distributions.utils import lazy_property, _standard_normal

__all__ = ["MultivariateNormal"]


def _batch_mv(bmat, bvec):
    return tapegrad.matmul(bmat, bvec.unsqueeze(-1)).squeeze(-1)


def _batch_mahalanobis(bL, bx):
    """``x^T (L L^T)^-1 x`` for lower ``bL`` (batch dims broadcast), by one triangular solve."""
    n = bx.shape[-1]
    batch = tuple(xp.broadcast_shapes(tuple(bL.shape[:-2]), tuple(bx.shape[:-1])))
    L = bL.expand(batch + (n, n))
    x = bx.expand(batch + (n,)).unsqueeze(-1)
    return solve_triangular(L, x, upper=False).squeeze(-1).pow(2).sum(-1)


def _batch_trace_XXT(bmat):
    n, m = bmat.shape[-2], bmat.shape[-1]
    flat = bmat.reshape(-1, m * n).pow(2).sum(-1)
    return flat.reshape(tuple(bmat.shape[:-2]))


def _eye_like(n, like):
    return tapegrad.eye(n, dtype=like.dtype)


def _precision_to_scale_tril(P):
    """The lower Cholesky factor of ``P^-1`` without inverting ``P`` (PyTorch's route)."""
    Lf = cholesky(tapegrad.flip(P, (-2, -1)))
    L_inv = tapegrad.transpose(tapegrad.flip(Lf, (-2, -1)), -2, -1)
    eye = _eye_like(P.shape[-1], P).expand(tuple(L_inv.shape))
    return solve_triangular(L_inv, eye, upper=False)


class MultivariateNormal(Distribution):
    """As ``torch.distributions.MultivariateNormal(loc, covariance_matrix=None,
    precision_matrix=None, scale_tril=None)``."""

    arg_constraints = {"loc": constraints.real_vector,
                       "covariance_matrix": constraints.positive_definite,
                       "precision_matrix": constraints.positive_definite,
                       "scale_tril": constraints.lower_cholesky}
    support = constraints.real_vector
    has_rsample = True

    def __init__(self, loc, covariance_matrix=None, precision_matrix=None, scale_tril=None,
                 validate_args=None):
        if loc.dim() < 1:
            raise ValueError("loc must be at least one-dimensional.")
        if (covariance_matrix is not None) + (scale_tril is not None) \
                + (precision_matrix is not None) != 1:
            raise ValueError("Exactly one of covariance_matrix or precision_matrix or "
                             "scale_tril may be specified.")
        for name, m in (("scale_tril", scale_tril), ("covariance_matrix", covariance_matrix),
                        ("precision_matrix", precision_matrix)):
            if m is not None:
                if m.dim() < 2:
                    raise ValueError(f"{name} matrix must be at least two-dimensional, with "
                                     "optional leading batch dimensions")
                batch_shape = tuple(xp.broadcast_shapes(tuple(m.shape[:-2]),
                                                        tuple(loc.shape[:-1])))
                setattr(self, name, m.expand(batch_shape + (-1, -1)))
        self.loc = loc.expand(batch_shape + (-1,))
        super().__init__(batch_shape, tuple(self.loc.shape[-1:]), validate_args=validate_args)
        if scale_tril is not None:
            self._unbroadcasted_scale_tril = scale_tril
        elif covariance_matrix is not None:
            self._unbroadcasted_scale_tril = cholesky(covariance_matrix)
        else:
            self._unbroadcasted_scale_tril = _precision_to_scale_tril(precision_matrix)

    def expand(self, batch_shape, _instance=None):
        new = self._get_checked_instance(MultivariateNormal, _instance)
        batch_shape = tuple(batch_shape)
        loc_shape = batch_shape + self.event_shape
        cov_shape = batch_shape + self.event_shape + self.event_shape
        new.loc = self.loc.expand(loc_shape)
        new._unbroadcasted_scale_tril = self._unbroadcasted_scale_tril
        for name in ("covariance_matrix", "scale_tril", "precision_matrix"):
            if name in self.__dict__:
                setattr(new, name, getattr(self, name).expand(cov_shape))
        Distribution.__init__(new, batch_shape, self.event_shape, validate_args=False)
        new._validate_args = self._validate_args
        return new

    def _full(self):
        return self._batch_shape + self._event_shape + self._event_shape

    @lazy_property
    def scale_tril(self):
        return self._unbroadcasted_scale_tril.expand(self._full())

    @lazy_property
    def covariance_matrix(self):
        L = self._unbroadcasted_scale_tril
        return tapegrad.matmul(L, L.mT).expand(self._full())

    @lazy_property
    def precision_matrix(self):
        # (L L^T)^-1 through a re-factorisation of L L^T: the gradient treats L as a full
        # matrix, as PyTorch's cholesky_inverse does
        L = self._unbroadcasted_scale_tril
        n = L.shape[-1]
        L = cholesky(tapegrad.matmul(L, L.mT))
        L_inv = solve_triangular(L, _eye_like(n, L).expand(tuple(L.shape)), upper=False)
        return tapegrad.matmul(L_inv.mT, L_inv).expand(self._full())

    @property
    def mean(self):
        return self.loc

    @property
    def mode(self):
        return self.loc

    @property
    def variance(self):
        return self._unbroadcasted_scale_tril.pow(2).sum(-1).expand(
            self._batch_shape + self._event_shape)

    def rsample(self, sample_shape=()):
        shape = self._extended_shape(sample_shape)
        eps = _standard_normal(shape, self.loc.dtype)
        return self.loc + _batch_mv(self._unbroadcasted_scale_tril, eps)

    def log_prob(self, value):
        if self._validate_args:
            self._validate_sample(value)
        diff = value - self.loc
        M = _batch_mahalanobis(self._unbroadcasted_scale_tril, diff)
        half_log_det = self._unbroadcasted_scale_tril.diagonal(dim1=-2, dim2=-1).log().sum(-1)
        return -0.5 * (self._event_shape[0] * math.log(2 * math.pi) + M) - half_log_det

    def entropy(self):
        half_log_det = self._unbroadcasted_scale_tril.diagonal(dim1=-2, dim2=-1).log().sum(-1)
        H = 0.5 * self._event_shape[0] * (1.0 + math.log(2 * math.pi)) + half_log_det
        if len(self._batch_shape) == 0:
            return H
        return H.expand(self._batch_shape)
