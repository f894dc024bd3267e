"""As ``torch.distributions.utils``: broadcasting parameters, probs <-> logits, lazy_property."""
import numbers
from functools import update_wrapper

import tapegrad
from tapegrad.backend import xp
from tapegrad.tensor import Tensor

__all__ = ["broadcast_all", "logits_to_probs", "clamp_probs", "probs_to_logits",
           "lazy_property", "tril_matrix_to_vec", "vec_to_tril_matrix"]


def broadcast_all(*values):
    """Numbers become tensors of the first tensor's dtype (else the default dtype); all are
    broadcast together, as ``torch.distributions.utils.broadcast_all``."""
    if not all(isinstance(v, (Tensor, numbers.Number)) for v in values):
        raise ValueError("Input arguments must all be instances of Number, "
                         "torch.Tensor or objects implementing __torch_function__.")
    dtype = next((v.dtype for v in values if isinstance(v, Tensor)),
                 tapegrad.get_default_dtype())
    tensors = [v if isinstance(v, Tensor) else tapegrad.tensor(v, dtype=dtype) for v in values]
    return tapegrad.broadcast_tensors(*tensors)


def eps_of(dtype):
    return float(xp.finfo(dtype.np).eps)


def tiny_of(dtype):
    return float(xp.finfo(dtype.np).tiny)


def clamp_probs(probs):
    """Clamp to ``[eps, 1 - eps]`` (eps of the dtype), as PyTorch."""
    eps = eps_of(probs.dtype)
    return probs.clamp(min=eps, max=1 - eps)


def probs_to_logits(probs, is_binary=False):
    """Log-odds (``is_binary``) or log-probabilities of clamped ``probs``."""
    ps_clamped = clamp_probs(probs)
    if is_binary:
        return tapegrad.log(ps_clamped) - tapegrad.log1p(-ps_clamped)
    return tapegrad.log(ps_clamped)


def logits_to_probs(logits, is_binary=False):
    """``sigmoid(logits)`` (binary) or ``softmax(logits, -1)``."""
    if is_binary:
        return tapegrad.sigmoid(logits)
    return tapegrad.softmax(logits, dim=-1)


class lazy_property:
    """A property computed once per instance on first access, then stored in its ``__dict__``
    (with grad mode on, as PyTorch's)."""

    def __init__(self, wrapped):
        self.wrapped = wrapped
        update_wrapper(self, wrapped)

    def __get__(self, instance, obj_type=None):
        if instance is None:
            return _lazy_property_and_property(self.wrapped)
        with tapegrad.enable_grad():
            value = self.wrapped(instance)
        setattr(instance, self.wrapped.__name__, value)
        return value


class _lazy_property_and_property(lazy_property, property):
    def __init__(self, wrapped):
        property.__init__(self, wrapped)


def tril_matrix_to_vec(mat, diag=0):
    """The lower triangle (offset ``diag``) of the last two dims, flattened row by row."""
    n = mat.shape[-1]
    if not -n <= diag < n:
        raise ValueError(f"diag ({diag}) provided is outside [{-n}, {n - 1}].")
    rows, cols = xp.tril_indices(n, diag)
    return mat[..., tapegrad.tensor(rows), tapegrad.tensor(cols)]


def vec_to_tril_matrix(vec, diag=0):
    """Inverse of ``tril_matrix_to_vec``."""
    size = vec.shape[-1]
    n = int(round(((-(1 + 2 * diag) + ((1 + 2 * diag) ** 2 + 8 * size + 4 * abs(diag)
                    * (diag + 1)) ** 0.5) / 2)))
    rows, cols = xp.tril_indices(n, diag)
    if rows.size != size:
        raise ValueError(f"vec_to_tril_matrix: last dim {size} is not a triangular number")
    mat = tapegrad.zeros(tuple(vec.shape[:-1]) + (n, n), dtype=vec.dtype)
    mat[..., tapegrad.tensor(rows), tapegrad.tensor(cols)] = vec
    return mat


def _standard_normal(shape, dtype):
    from tapegrad.random import numpy_rng, normal_array
    return Tensor._make(normal_array(numpy_rng(None), tuple(shape), dtype))


def _uniform(shape, dtype):
    """Uniform [0, 1) draws from tapegrad's default generator."""
    from tapegrad.random import numpy_rng, uniform_array
    return Tensor._make(uniform_array(numpy_rng(None), tuple(shape), dtype))


def _sum_rightmost(value, dim):
    """Sum out the ``dim`` rightmost dims (as PyTorch's ``_sum_rightmost``)."""
    if dim == 0:
        return value
    return value.reshape(tuple(value.shape[:value.ndim - dim]) + (-1,)).sum(-1)


def _expand_params(dist, cls, batch_shape, names, _instance=None):
    """``Distribution.expand`` for distributions whose parameters all have ``batch_shape``."""
    new = dist._get_checked_instance(cls, _instance)
    batch_shape = tuple(batch_shape)
    for name in names:
        if name in dist.__dict__:
            setattr(new, name, getattr(dist, name).expand(batch_shape))
    super(cls, new).__init__(batch_shape, validate_args=False)
    new._validate_args = dist._validate_args
    return new
