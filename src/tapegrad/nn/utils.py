"""``nn.utils``: gradient clipping and parameter/vector conversion (as ``torch.nn.utils``)."""
import math
import types
import warnings

import tapegrad
from tapegrad import dtypes
from tapegrad.autograd.grad_mode import state as _grad_state
from tapegrad.backend import xp
from tapegrad.tensor import Tensor

__all__ = ["clip_grad_norm_", "clip_grad_value_", "get_total_norm", "clip_grads_with_norm_",
           "parameters_to_vector", "vector_to_parameters"]


def _as_list(parameters, name):
    if isinstance(parameters, Tensor):
        return [parameters]
    is_generator = isinstance(parameters, types.GeneratorType)
    parameters = list(parameters)
    if is_generator and not parameters:
        warnings.warn("`parameters` is an empty generator, no gradient clipping will occur.",
                      stacklevel=3)
    for p in parameters:
        if not isinstance(p, Tensor):
            raise TypeError(f"{name}: expected Tensors (parameters), got {type(p).__name__}")
    return parameters


def _vector_norm(a, norm_type):
    """``torch.linalg.vector_norm(a, norm_type)`` of one array (in its own dtype)."""
    a = xp.abs(a).ravel()
    if norm_type == math.inf:
        return a.max() if a.size else xp.zeros((), a.dtype)
    if norm_type == -math.inf:
        return a.min() if a.size else xp.asarray(math.inf, a.dtype)
    if norm_type == 0:
        return xp.asarray((a != 0).sum(), a.dtype)
    if norm_type == 1:
        return a.sum(dtype=a.dtype)
    if norm_type == 2:
        return xp.sqrt((a * a).sum(dtype=a.dtype))
    return ((a ** norm_type).sum(dtype=a.dtype)) ** (1.0 / norm_type)


def get_total_norm(tensors, norm_type: float = 2.0, error_if_nonfinite: bool = False,
                   foreach=None) -> Tensor:
    """As ``torch.nn.utils.get_total_norm``: the norm of the per-tensor norms."""
    tensors = [tensors] if isinstance(tensors, Tensor) else list(tensors)
    norm_type = float(norm_type)
    if not tensors:
        return Tensor._make(xp.asarray(0.0, dtype=dtypes.get_default_dtype().np))
    norms = [_vector_norm(t._data, norm_type) for t in tensors]
    dtype = xp.result_type(*[n.dtype for n in norms])
    total = _vector_norm(xp.stack([xp.asarray(n, dtype) for n in norms]), norm_type)
    if error_if_nonfinite and not xp.isfinite(total):
        raise RuntimeError(
            f"The total norm of order {norm_type} for gradients from `parameters` is "
            "non-finite, so it cannot be clipped. To disable this error and scale the gradients "
            "by the non-finite norm anyway, set `error_if_nonfinite=False`")
    return Tensor._make(xp.asarray(total, dtype))


def clip_grads_with_norm_(parameters, max_norm: float, total_norm, foreach=None) -> None:
    """As ``torch.nn.utils.clip_grads_with_norm_``: scale every ``.grad`` in place by
    ``min(1, max_norm / (total_norm + 1e-6))``."""
    parameters = _as_list(parameters, "clip_grads_with_norm_")
    grads = [p.grad for p in parameters if p.grad is not None]
    if grads:
        _scale_grads(grads, max_norm, total_norm)


def _scale_grads(grads, max_norm, total_norm):
    total = total_norm._data if isinstance(total_norm, Tensor) else xp.asarray(total_norm)
    coef = xp.asarray(float(max_norm), total.dtype) / (total + xp.asarray(1e-6, total.dtype))
    coef = xp.minimum(coef, xp.asarray(1.0, total.dtype))
    with xp.errstate(invalid="ignore", over="ignore"):  # a non-finite norm gives nan, quietly
        for g in grads:
            g._data *= coef.astype(g._data.dtype)
            g._version[0] += 1


def clip_grad_norm_(parameters, max_norm: float, norm_type: float = 2.0,
                    error_if_nonfinite: bool = False, foreach=None) -> Tensor:
    """As ``torch.nn.utils.clip_grad_norm_``: rescale gradients so their total norm is at most
    ``max_norm``; returns the total norm before clipping.

    >>> nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
    """
    parameters = _as_list(parameters, "clip_grad_norm_")
    grads = [p.grad for p in parameters if p.grad is not None]
    if grads and _grad_state.modes:
        from tapegrad.nn import functional as F

        rec = F._recorder()
        if rec is not None:  # the compiler's tracer: one node, written back
            out = F._array_fn("clip_grad_norm", _clip_arrays, grads, max_norm=float(max_norm),
                              norm_type=float(norm_type),
                              error_if_nonfinite=error_if_nonfinite)
            assign = rec.assign  # (F._assign's own lookup of the recorder, once)
            for g, new in zip(grads, out[1:]):
                assign(g, new)
            return out[0]
    total_norm = get_total_norm(grads, norm_type, error_if_nonfinite, foreach)
    clip_grads_with_norm_(parameters, max_norm, total_norm, foreach)
    return total_norm


def _clip_arrays(*grads, max_norm, norm_type, error_if_nonfinite):
    """clip_grad_norm_ on copies of gradient arrays: (total norm, clipped gradients)."""
    grads = [Tensor._make(g.copy()) for g in grads]
    total = get_total_norm(grads, norm_type, error_if_nonfinite)
    _scale_grads(grads, max_norm, total)
    return (total._data,) + tuple(g._data for g in grads)


def clip_grad_value_(parameters, clip_value: float, foreach=None) -> None:
    """As ``torch.nn.utils.clip_grad_value_``: clamp every ``.grad`` to
    [-clip_value, clip_value] in place."""
    parameters = _as_list(parameters, "clip_grad_value_")
    clip_value = float(clip_value)
    for p in parameters:
        if p.grad is not None:
            g = p.grad._data
            xp.clip(g, -clip_value, clip_value, out=g)
            p.grad._version[0] += 1


def parameters_to_vector(parameters) -> Tensor:
    """As ``torch.nn.utils.parameters_to_vector``: every parameter flattened and concatenated
    (differentiable)."""
    return tapegrad.cat([p.reshape(-1) for p in parameters])


def vector_to_parameters(vec, parameters) -> None:
    """As ``torch.nn.utils.vector_to_parameters``: point each parameter's data at its slice of
    ``vec`` (the inverse of ``parameters_to_vector``)."""
    if not isinstance(vec, Tensor):
        raise TypeError(f"expected tapegrad.Tensor, but got: {type(vec).__name__}")
    pointer = 0
    params = list(parameters)
    total = sum(p.numel() for p in params)
    if vec.dim() != 1 or vec.numel() < total:
        raise RuntimeError(f"vector_to_parameters: vec of shape {tuple(vec.shape)} does not hold "
                           f"the {total} elements of the parameters")
    for param in params:
        n = param.numel()
        param.data = Tensor._make(vec._data[pointer:pointer + n].reshape(param.shape))
        pointer += n
