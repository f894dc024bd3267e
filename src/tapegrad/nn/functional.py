"""``tapegrad.nn.functional`` (as ``torch.nn.functional``): PyTorch's signatures and defaults.

Argument normalisation and error checks live here; the numerics live in ops (the fused ones
in ``tapegrad.ops.nn``, each with its own gradient rule).
"""
import math
import warnings

from tapegrad import dtypes
from tapegrad.autograd.grad_mode import state as grad_state
from tapegrad.backend import xp, on_device_of
from tapegrad.ops import nn as N
from tapegrad.ops.elementwise import relu as _relu, tanh as _tanh, sigmoid as _sigmoid
from tapegrad.ops.elementwise import where, sqrt, to_dtype, exp, log, expm1, log1p, gt, eq
from tapegrad.ops.elementwise import ne
from tapegrad.ops.elementwise import abs as _abs  # its gradient is sign(d): 0 at 0
from tapegrad.ops.linalg import matmul
from tapegrad.ops.movement import reshape_op, permute_op, broadcast_to, pad  # noqa: F401
from tapegrad.ops.movement import _dim  # the one dim normaliser (negative dims, range error)
from tapegrad.ops.indexing import check_index, range_checked  # the one index range check
from tapegrad.ops.indexing import value_checked  # value checks a compiled graph keeps
from tapegrad.ops.indexing import recorder as _recorder
from tapegrad.ops.reduce import sum_op, amax_op
from tapegrad.amp.autocast_mode import autocast_composite  # PyTorch's autocast lists
from tapegrad.tensor import Tensor


def _const(array):
    """A Tensor that needs no gradient (targets, masks, pooling matrices)."""
    return Tensor._make(array)


def _batched(x):
    """Whether ``x`` is batched by ``tapegrad.func.vmap``: its array is a placeholder of the
    logical shape, so its values must be read through ops (or ``_values``), not ``._data``."""
    return getattr(x._data, "value", None) is not None


def _values(x):
    """``x``'s values for a check: under vmap, every example's (the physical array)."""
    d = x._data
    while getattr(d, "value", None) is not None:
        d = d.value._data
    return d


def _traced(x):
    """Whether ``x`` must go through ops: it requires grad, carries a tangent at an open
    forward-mode level (``tapegrad.func.jvp``, ``autograd.forward_ad``) or is vmap-batched."""
    if x.requires_grad or _batched(x):
        return True
    for m in grad_state.modes:
        tangent = getattr(m, "tangent", None)
        if tangent is not None and tangent(x) is not None:
            return True
    return False


def _recording():
    """Whether the compiler's tracer records this call: a value computed from a tensor's
    array outside ops would be frozen into its graph, so such values come from ops."""
    return bool(grad_state.modes) and _recorder() is not None


def _array_fn(name, fn, tensors, random=False, **params):
    """``fn(*arrays, **params)`` on the tensors' arrays, outside ops (running statistics, a
    random mask, clipping coefficients): Tensors without grad (a tuple when ``fn`` returns
    one). Under the compiler's tracer it is one node that runs ``fn`` at run time, so no value
    is frozen; ``random=True``: ``fn`` draws from a generator, in program order."""
    rec = _recorder() if grad_state.modes else None
    if rec is not None:
        return rec.array_fn(name, fn, tensors, params, random)
    out = fn(*[t._data for t in tensors], **params)
    return tuple(map(_const, out)) if isinstance(out, tuple) else _const(out)


def _static(array):
    """A constant made from shapes and params only (a causal mask): the compiler's tracer
    keeps it in the graph as a constant instead of breaking the graph."""
    t = _const(array)
    rec = _recorder() if grad_state.modes else None
    if rec is not None:
        rec.constant(t)
    return t


def _assign(t, value):
    """``t``'s buffer takes ``value``'s values in place, without grad (a running statistic);
    the compiler's tracer records it as a write-back."""
    rec = _recorder() if grad_state.modes else None
    if rec is not None:
        return rec.assign(t, value)
    xp.copyto(t._data, value._data, casting="unsafe")
    t._version[0] += 1
    return t


def _reshape(x, shape):
    shape = tuple(shape)
    return x if tuple(x.shape) == shape else reshape_op(x, shape=shape)


def _shape(t):
    return list(t.shape)


def _tuple(value, n, name, what):
    if isinstance(value, int):
        return (value,) * n
    value = tuple(int(v) for v in value)
    if len(value) == 1:
        return value * n
    if len(value) != n:
        raise RuntimeError(f"{name}: expected {what} to be a single integer value or a list "
                           f"of {n} values, but got {list(value)}")
    return value


# --- linear and activations ------------------------------------------------------------
@autocast_composite
def linear(input, weight, bias=None):
    """As ``F.linear``: ``input @ weight.T + bias``; ``weight`` is (out_features, in_features).

    >>> F.linear(x, w, b)  # x (N, in), w (out, in), b (out,)
    """
    bias = _linear_check(input, weight, bias)
    return N.linear(input, weight, bias) if bias is not None else N.linear(input, weight)


@autocast_composite
def linear_relu(input, weight, bias=None):
    """``relu(linear(input, weight, bias))`` as one fused node (a tapegrad extension; in
    PyTorch ``F.relu(F.linear(input, weight, bias))``): one recorded op, one backward."""
    bias = _linear_check(input, weight, bias, "linear_relu")
    if bias is None:
        return N.linear_relu(input, weight)
    return N.linear_relu(input, weight, bias)


def _linear_check(input, weight, bias, name="linear"):
    """linear's argument checks; returns the bias (a 0-d bias broadcast to out_features)."""
    if weight.ndim != 2:
        raise RuntimeError(f"{name}: weight must be 2-D (out_features, in_features), got "
                           f"shape {tuple(weight.shape)}")
    if input.ndim == 0 or input.shape[-1] != weight.shape[1]:
        raise RuntimeError(
            f"{name}: mat1 and mat2 shapes cannot be multiplied (input {tuple(input.shape)} "
            f"and weight.T {tuple(weight.shape[::-1])}: {input.shape[-1] if input.ndim else 0}"
            f" != {weight.shape[1]})")
    for what, t in (("weight", weight), ("bias", bias)):
        if t is not None and t._data.dtype != input._data.dtype:
            raise RuntimeError(f"{name}: expected input and {what} to have the same dtype, but "
                               f"got {input.dtype} and {t.dtype}")
    if bias is not None and tuple(bias.shape) not in ((weight.shape[0],), ()):
        raise RuntimeError(f"{name}: bias of shape {tuple(bias.shape)} does not match "
                           f"out_features {weight.shape[0]}")
    if bias is not None and bias.ndim == 0:
        bias = broadcast_to(bias, shape=(weight.shape[0],))
    return bias


def _in_place(input, name, fn):
    """``inplace=True``: ``fn`` written back into ``input`` (history rebased, version bumped)."""
    from tapegrad.inplace import _inplace

    return _inplace(input, name, fn, (), {})


def relu(input, inplace=False):
    """As ``F.relu``: ``max(x, 0)``; ``inplace=True`` overwrites ``input``."""
    return input.relu_() if inplace else _relu(input)


def leaky_relu(input, negative_slope=0.01, inplace=False):
    """As ``F.leaky_relu``: ``x`` where ``x > 0``, else ``negative_slope * x``."""
    if inplace:
        return _in_place(input, "leaky_relu_", lambda t: leaky_relu(t, negative_slope))
    return N.leaky_relu(input, negative_slope=negative_slope)


def gelu(input, approximate="none"):
    """As ``F.gelu``: exact ``x * Phi(x)`` or ``approximate='tanh'``."""
    if approximate not in ("none", "tanh"):
        raise RuntimeError(f"gelu: approximate argument must be either none or tanh, got "
                           f"{approximate!r}")
    return N.gelu(input, approximate=approximate)


def silu(input, inplace=False):
    """As ``F.silu``: ``x * sigmoid(x)``."""
    if inplace:
        return _in_place(input, "silu_", silu)
    return N.silu(input)


def tanh(input):
    """As ``F.tanh``."""
    return _tanh(input)


def sigmoid(input):
    """As ``F.sigmoid``."""
    return _sigmoid(input)


def softplus(input, beta=1.0, threshold=20.0):
    """As ``F.softplus``: ``log(1 + exp(beta x)) / beta``, ``x`` where ``beta x > threshold``."""
    return N.softplus(input, beta=beta, threshold=threshold)


def elu(input, alpha=1.0, inplace=False):
    """As ``F.elu``: ``x`` for ``x > 0``, else ``alpha * (exp(x) - 1)``."""
    if inplace:
        return _in_place(input, "elu_", lambda t: N.elu(t, alpha=alpha))
    return N.elu(input, alpha=alpha)


def _softmax_dim(ndim):
    return 0 if ndim in (0, 1, 3) else 1


def _softmax_like(op, name, input, dim, dtype):
    if dtype is not None:
        input = to_dtype(input, dtype=dtypes.to_dtype(dtype))
    if dim is None:
        dim = _softmax_dim(input.ndim)
    dim = _dim(dim, input.ndim, name)
    if input.ndim == 0:
        return _reshape(op(_reshape(input, (1,)), dim=0), ())
    return op(input, dim=dim)


def softmax(input, dim=None, _stacklevel=3, dtype=None):
    """As ``F.softmax(input, dim)``: fused and numerically stable."""
    return _softmax_like(N.softmax, "softmax", input, dim, dtype)


def log_softmax(input, dim=None, _stacklevel=3, dtype=None):
    """As ``F.log_softmax(input, dim)``: fused; never the log of a softmax."""
    return _softmax_like(N.log_softmax, "log_softmax", input, dim, dtype)


def _keep_mask(shape, keep, dtype, generator=None):
    """Bernoulli(keep) mask divided by ``keep``, drawn from tapegrad's random stream."""
    from tapegrad.random import numpy_rng

    return ((numpy_rng(generator).random(shape) < keep) / keep).astype(dtype)


def dropout(input, p=0.5, training=True, inplace=False):
    """As ``F.dropout``: zero each element with probability ``p``, scale the rest by 1/(1-p)."""
    if p < 0.0 or p > 1.0:
        raise ValueError(f"dropout probability has to be between 0 and 1, but got {p}")
    if not training or p == 0.0:
        return input
    if inplace:
        return _in_place(input, "dropout_", lambda t: dropout(t, p, training))
    if p == 1.0:
        return input * _static(xp.zeros(input.shape, dtype=input._data.dtype))
    if grad_state.modes:  # under vmap the mask follows the level's randomness
        from tapegrad.random import _vmapped, numpy_rng

        # (PyTorch's 'same' takes a batched input here: one mask for every example)
        u = _vmapped("dropout", input.shape, lambda s: numpy_rng().random(s))
        if u is not None:
            return input * ((u < 1.0 - p).to(input.dtype) / (1.0 - p))
    return input * _array_fn("dropout_mask", _keep_mask, (), True, shape=input.shape,
                             keep=1.0 - p, dtype=input._data.dtype)


# --- further activations (beyond API.md; small composites, for porting) -----------------
def logsigmoid(input):
    """As ``F.logsigmoid``: ``log(sigmoid(x))`` computed stably."""
    return N.log_sigmoid(input)


def softmin(input, dim=None, _stacklevel=3, dtype=None):
    """As ``F.softmin``: ``softmax(-input, dim)``."""
    return softmax(-input if dtype is None else -to_dtype(input, dtype=dtypes.to_dtype(dtype)),
                   dim)


def hardtanh(input, min_val=-1.0, max_val=1.0, inplace=False):
    """As ``F.hardtanh``: clamp to [min_val, max_val]; gradient only strictly inside."""
    if min_val > max_val:
        raise ValueError(f"hardtanh: min_val ({min_val}) cannot be greater than max_val "
                         f"({max_val})")
    if inplace:
        return _in_place(input, "hardtanh_", lambda t: hardtanh(t, min_val, max_val))
    return N.hardtanh(input, min_val=min_val, max_val=max_val)


def relu6(input, inplace=False):
    """As ``F.relu6``: ``min(max(x, 0), 6)``."""
    return hardtanh(input, 0.0, 6.0, inplace)


def hardsigmoid(input, inplace=False):
    """As ``F.hardsigmoid``: ``relu6(x + 3) / 6``."""
    if inplace:
        return _in_place(input, "hardsigmoid_", hardsigmoid)
    return hardtanh(input + 3, 0.0, 6.0) / 6


def hardswish(input, inplace=False):
    """As ``F.hardswish``: ``x * relu6(x + 3) / 6``."""
    if inplace:
        return _in_place(input, "hardswish_", hardswish)
    return input * hardsigmoid(input)


_SELU_ALPHA = 1.6732632423543772848170429916717
_SELU_SCALE = 1.0507009873554804934193349852946


def selu(input, inplace=False):
    """As ``F.selu``: ``scale * elu(x, alpha)`` with the self-normalising constants."""
    if inplace:
        return _in_place(input, "selu_", selu)
    return N.elu(input, alpha=_SELU_ALPHA) * _SELU_SCALE


def celu(input, alpha=1.0, inplace=False):
    """As ``F.celu``: ``x`` for ``x > 0``, else ``alpha * (exp(x / alpha) - 1)``."""
    if alpha == 0:
        raise RuntimeError("celu: ZeroDivisionError: alpha cannot be 0 for CELU")
    if inplace:
        return _in_place(input, "celu_", lambda t: celu(t, alpha))
    return where(input > 0, input, alpha * expm1(input / alpha))


def mish(input, inplace=False):
    """As ``F.mish``: ``x * tanh(softplus(x))``."""
    if inplace:
        return _in_place(input, "mish_", mish)
    return input * _tanh(N.softplus(input))


def softsign(input):
    """As ``F.softsign``: ``x / (1 + |x|)``."""
    return input / (1 + _abs(input))


def glu(input, dim=-1):
    """As ``F.glu``: halves ``a, b`` along ``dim``; ``a * sigmoid(b)``."""
    if input.ndim == 0:
        raise RuntimeError("glu: glu does not support scalars because halving size must be even")
    dim = _dim(dim, input.ndim, "glu")
    if input.shape[dim] % 2:
        raise RuntimeError(f"glu: Halving dimension must be even, but dimension {dim} is size "
                           f"{input.shape[dim]}")
    a, b = input.chunk(2, dim)
    return a * _sigmoid(b)


def _feature_dropout(name, input, p, training, inplace, batched):
    if p < 0.0 or p > 1.0:
        raise ValueError(f"{name}: dropout probability has to be between 0 and 1, but got {p}")
    if not training or p == 0.0:
        return input
    if inplace:
        return _in_place(input, name + "_", lambda t: _feature_dropout(name, t, p, training,
                                                                       False, batched))
    lead = 2 if batched else 1
    shape = tuple(input.shape[:lead]) + (1,) * (input.ndim - lead)
    dt = input._data.dtype
    if p == 1.0:
        return input * _static(xp.zeros(shape, dt))
    return input * _array_fn("dropout_mask", _keep_mask, (), True, shape=shape, keep=1.0 - p,
                             dtype=dt)


def dropout1d(input, p=0.5, training=True, inplace=False):
    """As ``F.dropout1d``: zero whole channels of (N, C, L) or (C, L) with probability p."""
    if input.ndim not in (2, 3):
        raise RuntimeError(f"dropout1d: Expected 2D or 3D input, but received a {input.ndim}D "
                           "input.")
    return _feature_dropout("dropout1d", input, p, training, inplace, input.ndim == 3)


def dropout2d(input, p=0.5, training=True, inplace=False):
    """As ``F.dropout2d``: zero whole channels of (N, C, H, W) with probability p (a 3-D input
    is taken as (N, C, L), as PyTorch still does)."""
    if input.ndim not in (3, 4):
        warnings.warn(f"dropout2d: Received a {input.ndim}-D input to dropout2d, which is "
                      "deprecated and will result in an error in a future release.",
                      stacklevel=2)
    return _feature_dropout("dropout2d", input, p, training, inplace, input.ndim >= 2)


def dropout3d(input, p=0.5, training=True, inplace=False):
    """As ``F.dropout3d``: zero whole channels of (N, C, D, H, W) or (C, D, H, W)."""
    if input.ndim not in (4, 5):
        raise RuntimeError(f"dropout3d: Expected 4D or 5D input, but received a {input.ndim}D "
                           "input.")
    return _feature_dropout("dropout3d", input, p, training, inplace, input.ndim == 5)


# --- losses ------------------------------------------------------------------------------
def _reduction(size_average, reduce, reduction):
    if size_average is not None or reduce is not None:
        size_average = True if size_average is None else size_average
        reduce = True if reduce is None else reduce
        return "none" if not reduce else ("mean" if size_average else "sum")
    if reduction not in ("none", "mean", "sum"):
        raise ValueError(f"{reduction} is not a valid value for reduction")
    return reduction


def _reduce(loss, reduction, denominator=None):
    if reduction == "none":
        return loss
    if reduction == "mean" and isinstance(denominator, Tensor):  # known at run time only
        return _reduce_by_weight(loss, reduction, denominator)
    total = sum_op(loss, dims=tuple(range(loss.ndim)))
    if reduction == "sum":
        return total
    count = loss.numel() if denominator is None else denominator
    if not loss.numel() and not count:  # an empty batch: 0 / 0 = nan, as in PyTorch; as a
        return total * math.nan  # product, numpy stays quiet in the backward too
    if not count:  # nothing counted (all targets ignored): nan with a zero gradient, as
        with xp.errstate(invalid="ignore"):  # PyTorch's (dividing by 0: nan gradients)
            return total * 0.0 + math.nan
    return total / count


def _reduce_by_weight(loss, reduction, total):
    """``_reduce`` whose mean divides by ``total``, the counted targets' weights summed by ops
    (vmap-batched targets): nothing counted gives nan with a zero gradient, as PyTorch's
    ``nll_loss``, where a plain division would give nan gradients too."""
    if reduction != "mean":
        return _reduce(loss, reduction)
    some = gt(total, 0)
    summed = sum_op(loss, dims=tuple(range(loss.ndim)))
    return where(some, summed / where(some, total, 1.0), math.nan)


def _same_size(name, input, target):
    if tuple(target.shape) != tuple(input.shape):
        warnings.warn(f"{name}: Using a target size ({tuple(target.shape)}) that is different to "
                      f"the input size ({tuple(input.shape)}). This will likely lead to "
                      "incorrect results due to broadcasting. Please ensure they have the same "
                      "size.", stacklevel=3)
        try:
            xp.broadcast_shapes(input.shape, target.shape)
        except ValueError:
            raise RuntimeError(f"{name}: the size of input {tuple(input.shape)} and target "
                               f"{tuple(target.shape)} cannot be broadcast together") from None


def _same_dtype(name, input, target):
    if input._data.dtype != target._data.dtype:
        raise RuntimeError(f"{name}: expected target of the input's dtype {input.dtype}, got "
                           f"{target.dtype} (input {tuple(input.shape)}, target "
                           f"{tuple(target.shape)})")


def _target_message(name, n_classes):
    return f"{name}: Target {{}} is out of bounds ({n_classes} classes)"


def _class_targets(name, input, target, weight, ignore_index, smoothing=0.0):
    """The target distribution ``q`` (the one-hot at class dim ``cdim``, 1 or 0 for 1-D input,
    times the class weight, with ``smoothing``'s share spread over the classes) and the weight
    sum of the counted targets (the mean's denominator): ``(q, total, cdim)``. Arrays read from
    the indices; Tensors built by ops when the indices or the weight are vmap-batched."""
    if input.ndim == 0:
        raise RuntimeError(f"{name}: input must have at least 1 dimension (got a scalar)")
    cdim = 0 if input.ndim == 1 else 1
    n_classes = input.shape[cdim]
    expected = tuple(s for i, s in enumerate(input.shape) if i != cdim)
    if tuple(target.shape) != expected:
        raise ValueError(
            f"{name}: expected target of shape {expected} (class indices) for input of shape "
            f"{tuple(input.shape)}, got target of shape {tuple(target.shape)}")
    t = target._data
    if t.dtype != xp.int64 and t.dtype != xp.uint8:
        raise RuntimeError(f"{name}: expected target dtype to be Long (int64) or Byte (uint8) "
                           f"for class indices, but got {target.dtype}")
    if weight is not None and weight.requires_grad and grad_state.enabled:
        raise RuntimeError(f"{name}: the class weight is not differentiable; this input cannot "
                           "have requires_grad=True (pass weight.detach())")
    if weight is not None and tuple(weight.shape) != (n_classes,):
        raise RuntimeError(f"{name}: weight tensor should be defined either for all "
                           f"{n_classes} classes or no classes but got weight tensor of shape: "
                           f"{list(weight.shape)}")
    if _batched(target) or weight is not None and _batched(weight):
        return _class_targets_ops(name, input, target, weight, ignore_index, smoothing, cdim)
    check_index.forward(t, n_classes, _target_message(name, n_classes), "IndexError",
                        ignore_index)
    valid = t != ignore_index
    everything = bool(valid.all())
    dt = input._data.dtype
    safe = t if everything else xp.where(valid, t, 0)
    wvec = weight._data.astype(dt) if weight is not None else xp.ones(n_classes, dtype=dt)
    wy = wvec[safe] if everything else wvec[safe] * valid  # per-sample weight; 0 if ignored
    # one-hot with the class last (a flat scatter), then the class axis moved into place
    flat = xp.zeros(t.size * n_classes, dtype=dt)
    flat[xp.arange(t.size) * n_classes + safe.reshape(-1)] = wy.reshape(-1)
    q = flat.reshape(t.shape + (n_classes,))
    if cdim != q.ndim - 1:
        q = xp.moveaxis(q, -1, cdim)
    if smoothing > 0:
        wshape = [1] * input.ndim
        wshape[cdim] = n_classes
        spread = wvec.reshape(wshape) * xp.expand_dims(valid, cdim)
        q = (1 - smoothing) * q + (smoothing / n_classes) * spread
    return q, wy.sum(), cdim


def _class_targets_ops(name, input, target, weight, ignore_index, smoothing, cdim):
    """``_class_targets`` as ops on vmap-batched indices (or class weights), whose placeholders
    hold no values: the one-hot from ``_ce_target``, the weight picked per target by
    multiplying it in; the range check reads every example's indices (traced: a node)."""
    n_classes = input.shape[cdim]
    target = range_checked(target, _values(target), n_classes,
                           _target_message(name, n_classes), "IndexError", ignore_index)[0]
    dt = input._data.dtype
    probe = xp.broadcast_to(xp.zeros((), dt), (n_classes,))  # the class count and dtype
    q, keep, _ = N._ce_target(probe, target, ignore_index, False)  # class last, 0 if ignored
    spread = keep
    if weight is not None:
        w = weight if weight._data.dtype == dt else to_dtype(weight, dtype=dt)
        q = q * w
        spread = keep * w
    total = sum_op(q, dims=tuple(range(q.ndim)))
    if smoothing > 0:
        q = (1 - smoothing) * q + (smoothing / n_classes) * spread
    if cdim != q.ndim - 1:
        last = q.ndim - 1
        q = permute_op(q, dims=tuple(range(cdim)) + (last,) + tuple(range(cdim, last)))
    return q, total, cdim


def _class_target_arrays(t, w=None, *, loss, shape, dtype, ignore_index, smoothing=0.0):
    """What ``nll_loss``/``cross_entropy`` build from class indices, as arrays from the
    indices (and class weights) alone: the target distribution and the weight sum. Under the
    compiler's tracer it runs as one node (``_array_fn``), so new targets are read each call."""
    probe = _const(xp.broadcast_to(xp.zeros((), dtype), shape))  # the input's shape and dtype
    q, total, _ = _class_targets(loss, probe, _const(t), None if w is None else _const(w),
                                 ignore_index, smoothing)
    return q.astype(dtype, copy=False), xp.asarray(total)


def _traced_class_targets(name, input, target, weight, ignore_index, smoothing=0.0):
    """Under a recorder: (target distribution, weight sum) as graph values, else None."""
    if not grad_state.modes or _recorder() is None:
        return None
    tensors = (target,) if weight is None else (target, weight)  # (needs no grad: checked)
    return _array_fn(f"{name}_targets", _class_target_arrays, tensors, loss=name,
                     shape=tuple(input.shape), dtype=input._data.dtype,
                     ignore_index=ignore_index, smoothing=smoothing)


@autocast_composite
def nll_loss(input, target, weight=None, size_average=None, ignore_index=-100, reduce=None,
             reduction="mean"):
    """As ``F.nll_loss``: ``-weight[t] * input[n, t]``, averaged by the summed weights."""
    reduction = _reduction(size_average, reduce, reduction)
    q, total, cdim = _class_targets("nll_loss", input, target, weight, ignore_index)
    if isinstance(q, Tensor):  # built by ops (vmap-batched indices)
        return _reduce_by_weight(N.nll_loss(input, q, dim=cdim), reduction, total)
    traced = _traced_class_targets("nll_loss", input, target, weight, ignore_index)
    if traced is not None:  # the compiler's tracer: built from the targets at run time
        return _reduce(N.nll_loss(input, traced[0], dim=cdim), reduction, traced[1])
    loss = N.nll_loss(input, _const(q), dim=cdim)
    return _reduce(loss, reduction, float(total))


@autocast_composite
def cross_entropy(input, target, weight=None, size_average=None, ignore_index=-100,
                  reduce=None, reduction="mean", label_smoothing=0.0):
    """As ``F.cross_entropy``: logits (N, C) or (N, C, d1, ...) with class indices or class
    probabilities. Fused: the gradient is ``(softmax - target) / n``, never through a log of a
    softmax.

    >>> F.cross_entropy(logits, labels, label_smoothing=0.1)
    """
    reduction = _reduction(size_average, reduce, reduction)
    if (weight is None and not label_smoothing and reduction != "none" and input.ndim == 2
            and target.ndim == 1 and target._data.dtype == xp.int64
            and target.shape[0] == input.shape[0]):
        # the common case: one node, no one-hot target (under vmap: checks read every
        # example's indices)
        c = input.shape[1]
        target = range_checked(target, _values(target), c, _target_message("cross_entropy", c),
                               "IndexError", ignore_index)[0]
        return N.cross_entropy_index(input, target, ignore_index=ignore_index,
                                     mean=reduction == "mean")
    if not 0.0 <= label_smoothing <= 1.0:
        raise RuntimeError(f"cross_entropy: label_smoothing must be between 0.0 and 1.0. Got: "
                           f"{label_smoothing}")
    if input.ndim == 0:
        raise RuntimeError("cross_entropy: input must have at least 1 dimension (got a scalar)")
    cdim = 0 if input.ndim == 1 else 1
    n_classes = input.shape[cdim]
    if target.dtype.is_floating_point:  # class probabilities
        _same_dtype("cross_entropy", input, target)
        if tuple(target.shape) != tuple(input.shape):
            raise ValueError(
                f"cross_entropy: expected target of shape {tuple(input.shape)} (class "
                f"probabilities) or {tuple(s for i, s in enumerate(input.shape) if i != cdim)} "
                f"(class indices), got {tuple(target.shape)}")
        q = target
        if label_smoothing > 0:
            q = q * (1 - label_smoothing) + label_smoothing / n_classes
        if weight is not None:
            wshape = [1] * input.ndim
            wshape[cdim] = n_classes
            q = q * _reshape(weight, wshape)
        loss = N.softmax_cross_entropy(input, q, dim=cdim)
        return _reduce(loss, reduction, input.numel() / n_classes if input.numel() else 0)
    q, total, cdim = _class_targets("cross_entropy", input, target, weight, ignore_index,
                                    label_smoothing)
    if isinstance(q, Tensor):  # built by ops (vmap-batched indices)
        return _reduce_by_weight(N.softmax_cross_entropy(input, q, dim=cdim), reduction,
                                 total)
    traced = _traced_class_targets("cross_entropy", input, target, weight, ignore_index,
                                   label_smoothing)
    if traced is not None:  # the compiler's tracer: built from the targets at run time
        loss = N.softmax_cross_entropy(input, traced[0], dim=cdim)
        return _reduce(loss, reduction, traced[1])
    loss = N.softmax_cross_entropy(input, _const(q.astype(input._data.dtype)), dim=cdim)
    return _reduce(loss, reduction, float(total))


@autocast_composite
def mse_loss(input, target, size_average=None, reduce=None, reduction="mean", weight=None):
    """As ``F.mse_loss``: ``(input - target) ** 2`` reduced (mean by default)."""
    reduction = _reduction(size_average, reduce, reduction)
    _same_size("mse_loss", input, target)
    d = input - target
    return _weighted_reduce("mse_loss", d * d, input, reduction, weight)


def _weighted_reduce(name, loss, input, reduction, weight):
    if weight is None:
        return _reduce(loss, reduction)
    if tuple(weight.shape) != tuple(input.shape):
        raise ValueError(f"{name}: Weights and input must have the same size (weight "
                         f"{tuple(weight.shape)}, input {tuple(input.shape)})")
    loss = loss * weight
    if reduction == "mean" and loss.numel():  # (an empty batch: _reduce's nan)
        return sum_op(loss, dims=tuple(range(loss.ndim))) / sum_op(
            weight, dims=tuple(range(weight.ndim)))
    return _reduce(loss, reduction)


@autocast_composite
def l1_loss(input, target, size_average=None, reduce=None, reduction="mean", weight=None):
    """As ``F.l1_loss``: ``|input - target|`` reduced (mean by default)."""
    reduction = _reduction(size_average, reduce, reduction)
    _same_size("l1_loss", input, target)
    return _weighted_reduce("l1_loss", _abs(input - target), input, reduction, weight)


@autocast_composite
def smooth_l1_loss(input, target, size_average=None, reduce=None, reduction="mean", beta=1.0):
    """As ``F.smooth_l1_loss``: ``0.5 d**2 / beta`` where ``|d| < beta``, else ``|d| - beta/2``."""
    reduction = _reduction(size_average, reduce, reduction)
    if beta < 0:
        raise RuntimeError(f"smooth_l1_loss: smooth_l1_loss does not support negative values "
                           f"for beta (got {beta})")
    _same_size("smooth_l1_loss", input, target)
    d = input - target
    ad = _abs(d)
    if beta == 0:
        return _reduce(ad, reduction)
    return _reduce(where(ad < beta, 0.5 * d * d / beta, ad - 0.5 * beta), reduction)


@autocast_composite
def binary_cross_entropy(input, target, weight=None, size_average=None, reduce=None,
                         reduction="mean"):
    """As ``F.binary_cross_entropy``: probabilities in [0, 1]; each log clamped at -100."""
    reduction = _reduction(size_average, reduce, reduction)
    if tuple(target.shape) != tuple(input.shape):
        raise ValueError(
            f"binary_cross_entropy: Using a target size ({tuple(target.shape)}) that is "
            f"different to the input size ({tuple(input.shape)}) is deprecated. Please ensure "
            "they have the same size.")
    _same_dtype("binary_cross_entropy", input, target)
    # (nan passes both checks, as PyTorch's)
    input = value_checked(input, "unit_interval", "binary_cross_entropy: all elements of input "
                          "should be between 0 and 1", "RuntimeError", nan_ok=True)
    target = value_checked(target, "unit_interval", "binary_cross_entropy: all elements of "
                           "target should be between 0 and 1", "RuntimeError", nan_ok=True)
    loss = N.binary_cross_entropy(input, target)
    if weight is not None:
        if weight.requires_grad and grad_state.enabled:
            raise RuntimeError("binary_cross_entropy: the weight is not differentiable; this "
                               "input cannot have requires_grad=True (pass weight.detach())")
        loss = loss * weight
    return _reduce(loss, reduction)


@autocast_composite
def binary_cross_entropy_with_logits(input, target, weight=None, size_average=None,
                                     reduce=None, reduction="mean", pos_weight=None):
    """As ``F.binary_cross_entropy_with_logits``: ``(1 - t) x - w_p log sigmoid(x)``, stable."""
    reduction = _reduction(size_average, reduce, reduction)
    if tuple(target.shape) != tuple(input.shape):
        raise ValueError(
            f"binary_cross_entropy_with_logits: Target size ({tuple(target.shape)}) must be "
            f"the same as input size ({tuple(input.shape)})")
    for what, p in (("weight", weight), ("pos_weight", pos_weight)):
        if p is not None and p.requires_grad and grad_state.enabled:
            raise RuntimeError(f"binary_cross_entropy_with_logits: {what} is not "
                               "differentiable; this input cannot have requires_grad=True")
    log_sig = N.log_sigmoid(input)
    if pos_weight is not None:
        log_sig = log_sig * ((pos_weight - 1) * target + 1)
    loss = (1 - target) * input - log_sig
    if weight is not None:
        loss = loss * weight
    return _reduce(loss, reduction)


@autocast_composite
def huber_loss(input, target, reduction="mean", delta=1.0, weight=None):
    """As ``F.huber_loss``: ``0.5 d**2`` where ``|d| < delta``, else ``delta (|d| - delta/2)``."""
    reduction = _reduction(None, None, reduction)
    if delta <= 0:
        raise RuntimeError(f"huber_loss: huber_loss does not support non-positive values for "
                           f"delta (got {delta})")
    _same_size("huber_loss", input, target)
    d = input - target
    ad = _abs(d)
    loss = where(ad < delta, 0.5 * d * d, delta * (ad - 0.5 * delta))
    if weight is not None:
        if tuple(weight.shape) != tuple(input.shape):
            raise ValueError(f"huber_loss: Weights and input must have the same size (weight "
                             f"{tuple(weight.shape)}, input {tuple(input.shape)})")
        loss = loss * weight
    return _reduce(loss, reduction)


@autocast_composite
def kl_div(input, target, size_average=None, reduce=None, reduction="mean", log_target=False):
    """As ``F.kl_div``: ``target * (log(target) - input)`` (input in log space); ``reduction=
    'batchmean'`` divides by the batch size."""
    if size_average is not None or reduce is not None:
        reduction = _reduction(size_average, reduce, reduction)
    elif reduction == "mean":
        warnings.warn("kl_div: reduction: 'mean' divides the total loss by both the batch size "
                      "and the support size. 'batchmean' divides only by the batch size.",
                      stacklevel=2)
    elif reduction != "batchmean":
        reduction = _reduction(None, None, reduction)
    if log_target:
        loss = exp(target) * (target - input)
    else:
        t = target._data
        # xlogy(t, t), as PyTorch: 0 where t == 0, nan where t < 0 (no distribution)
        if _traced(target) or _recording():
            tlogt = where(target == 0, 0.0, target * log(where(target == 0, 1.0, target)))
        else:
            with xp.errstate(invalid="ignore"):
                tlogt = _const(xp.where(t == 0, 0, t * xp.log(xp.where(t == 0, 1, t))).astype(
                    t.dtype))
        loss = tlogt - target * input
    if reduction == "batchmean":
        return _reduce(loss, "mean", input.shape[0]) if input.ndim else _reduce(loss, "sum")
    return _reduce(loss, reduction)


# --- further losses (beyond API.md) ------------------------------------------------------
def _clamp_min0(x):
    from tapegrad.ops.elementwise import clamp

    return clamp(x, min=0)


@autocast_composite
def margin_ranking_loss(input1, input2, target, margin=0.0, size_average=None, reduce=None,
                        reduction="mean"):
    """As ``F.margin_ranking_loss``: ``max(0, -y (x1 - x2) + margin)``."""
    reduction = _reduction(size_average, reduce, reduction)
    if not (input1.ndim == input2.ndim == target.ndim):
        raise RuntimeError(f"margin_ranking_loss: All input tensors should have same dimension "
                           f"but got sizes: input1: {_shape(input1)}, input2: {_shape(input2)}, "
                           f"target: {_shape(target)} ")
    return _reduce(_clamp_min0(-target * (input1 - input2) + margin), reduction)


@autocast_composite
def hinge_embedding_loss(input, target, margin=1.0, size_average=None, reduce=None,
                         reduction="mean"):
    """As ``F.hinge_embedding_loss``: ``x`` where y == 1, ``max(0, margin - x)`` where y == -1."""
    reduction = _reduction(size_average, reduce, reduction)
    loss = where(target != 1, _clamp_min0(margin - input), 0.0) + where(target != -1, input, 0.0)
    return _reduce(loss, reduction)


@autocast_composite
def soft_margin_loss(input, target, size_average=None, reduce=None, reduction="mean"):
    """As ``F.soft_margin_loss``: ``log(1 + exp(-y x))``."""
    reduction = _reduction(size_average, reduce, reduction)
    return _reduce(log1p(exp(-input * target)), reduction)


def multilabel_soft_margin_loss(input, target, weight=None, size_average=None, reduce=None,
                                reduction="mean"):
    """As ``F.multilabel_soft_margin_loss``: per-class logistic loss averaged over classes."""
    reduction = _reduction(size_average, reduce, reduction)
    loss = -(target * N.log_sigmoid(input) + (1 - target) * N.log_sigmoid(-input))
    if weight is not None:
        loss = loss * weight
    c = input.shape[-1] if input.ndim else 1
    loss = sum_op(loss, dims=(input.ndim - 1,)) / c if input.ndim else loss
    return _reduce(loss, reduction)


@autocast_composite
def cosine_embedding_loss(input1, input2, target, margin=0.0, size_average=None, reduce=None,
                          reduction="mean"):
    """As ``F.cosine_embedding_loss``: ``1 - cos`` where y == 1, ``max(0, cos - margin)`` where
    y == -1 (PyTorch's formula, 1e-12 added to each squared norm)."""
    reduction = _reduction(size_average, reduce, reduction)
    if input1.ndim not in (1, 2) or tuple(input1.shape) != tuple(input2.shape):
        raise RuntimeError(f"cosine_embedding_loss: expected 1D or 2D inputs of one shape, got "
                           f"{_shape(input1)} and {_shape(input2)}")
    d = input1.ndim - 1
    prod = sum_op(input1 * input2, dims=(d,))
    mag1 = sum_op(input1 * input1, dims=(d,)) + 1e-12
    mag2 = sum_op(input2 * input2, dims=(d,)) + 1e-12
    cos = prod / sqrt(mag1 * mag2)
    loss = where(target == 1, 1 - cos, 0.0) + where(target == -1, _clamp_min0(cos - margin), 0.0)
    return _reduce(loss, reduction)


@autocast_composite
def triplet_margin_loss(anchor, positive, negative, margin=1.0, p=2, eps=1e-6, swap=False,
                        size_average=None, reduce=None, reduction="mean"):
    """As ``F.triplet_margin_loss``: ``max(d(a, p) - d(a, n) + margin, 0)``."""
    from tapegrad.ops.elementwise import minimum

    reduction = _reduction(size_average, reduce, reduction)
    dims = {anchor.ndim, positive.ndim, negative.ndim}
    if len(dims) != 1:  # any number, as PyTorch (distances along the last dimension)
        raise RuntimeError(f"triplet_margin_loss: The anchor, positive, and negative tensors are "
                           f"expected to have the same number of dimensions, but got: "
                           f"anchor {anchor.ndim}D, positive {positive.ndim}D, and negative "
                           f"{negative.ndim}D inputs")
    d_pos = pairwise_distance(anchor, positive, p, eps)
    d_neg = pairwise_distance(anchor, negative, p, eps)
    if swap:
        d_neg = minimum(d_neg, pairwise_distance(positive, negative, p, eps))
    return _reduce(_clamp_min0(margin + d_pos - d_neg), reduction)


@autocast_composite
def poisson_nll_loss(input, target, log_input=True, full=False, size_average=None, eps=1e-8,
                     reduce=None, reduction="mean"):
    """As ``F.poisson_nll_loss``: ``exp(x) - t x`` (or ``x - t log(x + eps)``), plus Stirling's
    term where t > 1 when ``full``."""
    reduction = _reduction(size_average, reduce, reduction)
    loss = exp(input) - target * input if log_input else input - target * log(input + eps)
    if full and (_traced(target) or _recording()):  # Stirling's term by ops
        big = target > 1
        safe = where(big, target, 2.0)
        loss = loss + where(big, safe * log(safe) - safe + 0.5 * log(2 * math.pi * safe), 0.0)
    elif full:
        t = target._data
        big = t > 1
        safe = xp.where(big, t, 2)
        stirling = xp.where(big, safe * xp.log(safe) - safe + 0.5 * xp.log(2 * math.pi * safe),
                            0).astype(t.dtype)
        loss = loss + _const(stirling)
    return _reduce(loss, reduction)


def gaussian_nll_loss(input, target, var, full=False, eps=1e-6, reduction="mean"):
    """As ``F.gaussian_nll_loss``: ``0.5 (log(var) + (x - t)**2 / var)``; var clamped at eps
    (outside the graph, as PyTorch)."""
    if isinstance(var, (int, float)):
        if var < 0:
            raise ValueError("gaussian_nll_loss: var has negative entry/entries")
        var = _static(xp.full(input.shape, var, dtype=input._data.dtype))
    else:  # (a nan variance passes, as PyTorch's check)
        var = value_checked(var, "nonnegative", "gaussian_nll_loss: var has negative "
                            "entry/entries", nan_ok=True)
    if tuple(var.shape) != tuple(input.shape):
        if tuple(input.shape[:-1]) == tuple(var.shape):
            var = _reshape(var, tuple(var.shape) + (1,))
        elif not (input.ndim == var.ndim and sum(
                v for i, v in zip(input.shape, var.shape) if i != v) == 1):
            raise ValueError(f"gaussian_nll_loss: var is of incorrect size {_shape(var)} for "
                             f"input {_shape(input)}")
    if reduction not in ("none", "mean", "sum"):
        raise ValueError(f"{reduction} is not valid")
    if _batched(var) or _recording():  # the clamp by ops, without a gradient through it
        var = var + (where(var < eps, eps, var) - var).detach()
    else:
        lift = xp.maximum(var._data, eps) - var._data  # the clamp, outside the graph
        var = var + _const(lift) if lift.any() else var
    d = input - target
    loss = 0.5 * (log(var) + d * d / var)
    if full:
        loss = loss + 0.5 * math.log(2 * math.pi)
    return _reduce(loss, reduction)


# --- embedding and normalisation ---------------------------------------------------------
def embedding(input, weight, padding_idx=None, max_norm=None, norm_type=2.0,
              scale_grad_by_freq=False, sparse=False):
    """As ``F.embedding``: rows of ``weight``; the ``padding_idx`` row receives no gradient."""
    if sparse:
        raise NotImplementedError("embedding: sparse gradients are not supported by tapegrad")
    idx = input._data if isinstance(input, Tensor) else xp.asarray(input)
    if idx.dtype != xp.int64 and idx.dtype != xp.int32:
        raise RuntimeError(f"embedding: expected indices of dtype int64 (Long) or int32 (Int), "
                           f"got {idx.dtype}")
    if weight.ndim != 2:
        raise RuntimeError(f"embedding: weight must be 2-D, got shape {tuple(weight.shape)}")
    num = weight.shape[0]
    if padding_idx is not None:  # negative padding_idx counts from the end; indices do not
        if not -num <= padding_idx < num:
            raise AssertionError(f"embedding: Padding_idx must be within num_embeddings (got "
                                 f"{padding_idx} for {num} rows)")
        padding_idx %= num
    checked = idx
    if idx.size:
        if num == 0:
            raise RuntimeError(f"embedding: index_select(): self indexing axis dim should be "
                               f"positive (weight {tuple(weight.shape)} has no rows)")
        # PyTorch's index_select: RuntimeError if weight is empty
        # (the lookup reads the checked indices: under the compiler, the check's result)
        checked = range_checked(input, idx, num, f"embedding: index out of range in self "
                                f"(index {{}}, weight has {num} rows)",
                                "RuntimeError" if weight.shape[1] == 0 else "IndexError")[1]
    if max_norm is not None:
        _embedding_renorm(weight, idx, max_norm, norm_type)
    scale = None
    if scale_grad_by_freq:
        counts = xp.bincount(idx.reshape(-1), minlength=num)
        scale = (1.0 / counts[idx]).astype(weight._data.dtype)
    return N.embedding(weight, _const(checked), padding_idx=padding_idx, scale=scale)


def _embedding_renorm(weight, idx, max_norm, norm_type):
    """In place, as PyTorch: rows used whose norm exceeds max_norm are scaled down to it."""
    w = weight._data
    rows = xp.unique(idx)
    norms = xp.linalg.norm(w[rows], ord=norm_type, axis=1)
    over = norms > max_norm
    w[rows[over]] *= (max_norm / (norms[over] + 1e-7))[:, None]
    weight._version[0] += 1


def _floating_input(name, input, kernel):
    """The normalisations are defined for floating inputs only: PyTorch raises
    NotImplementedError naming its kernel and the dtype (e.g. 'Long')."""
    if isinstance(input, Tensor) and not dtypes.is_floating(input.dtype):
        raise NotImplementedError(f"{name}: \"{kernel}\" not implemented for "
                                  f"'{_TORCH_TYPE_NAME.get(input.dtype.name, input.dtype.name)}'")


# the scalar type names PyTorch's kernel errors print
_TORCH_TYPE_NAME = {"int64": "Long", "int32": "Int", "int16": "Short", "int8": "Char",
                    "uint8": "Byte", "bool": "Bool"}


def layer_norm(input, normalized_shape, weight=None, bias=None, eps=1e-5):
    """As ``F.layer_norm``: standardise over the trailing ``normalized_shape`` dims (fused)."""
    _floating_input("layer_norm", input, "LayerNormKernelImpl")
    shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    k = len(shape)
    if k == 0 or tuple(input.shape[input.ndim - k:]) != shape or input.ndim < k:
        raise RuntimeError(
            f"layer_norm: Given normalized_shape={list(shape)}, expected input with shape "
            f"[*, {', '.join(map(str, shape))}], but got input of size {_shape(input)}")
    for name, p in (("weight", weight), ("bias", bias)):
        if p is not None and tuple(p.shape) != shape:
            raise RuntimeError(f"layer_norm: expected {name} of shape {list(shape)}, got "
                               f"{_shape(p)}")
    axes = tuple(range(input.ndim - k, input.ndim))
    return N.layer_norm(input, weight, bias, axes=axes, eps=eps, param_shape=shape)


def rms_norm(input, normalized_shape, weight=None, eps=None):
    """As ``F.rms_norm``: ``x / sqrt(mean(x**2) + eps) * weight``; eps defaults to the dtype's
    machine epsilon."""
    _floating_input("rms_norm", input, "rms_norm")
    shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    k = len(shape)
    if tuple(input.shape[input.ndim - k:]) != shape or input.ndim < k:
        raise RuntimeError(
            f"rms_norm: Given normalized_shape={list(shape)}, expected input with shape "
            f"[*, {', '.join(map(str, shape))}], but got input of size {_shape(input)}")
    if eps is None:
        low = input.dtype is dtypes.bfloat16  # numpy's finfo knows no bfloat16
        eps = float((dtypes._ml_dtypes.finfo if low else xp.finfo)(input._data.dtype).eps)
    axes = tuple(range(input.ndim - k, input.ndim))
    ms = sum_op(input * input, dims=axes, keepdim=True) / max(math.prod(shape), 1)
    out = input * (1 / sqrt(ms + eps))
    return out * weight if weight is not None else out


def _check_per_channel(name, c, running_mean, running_var, weight, bias):
    """The batch/instance norm check that every given per-channel tensor has shape (c,)."""
    for pname, p in (("running_mean", running_mean), ("running_var", running_var),
                     ("weight", weight), ("bias", bias)):
        if p is not None and tuple(p.shape) != (c,):
            raise RuntimeError(f"{name}: {pname} should contain {c} elements not "
                               f"{p.numel()}")


def _update_running_stats(running_mean, running_var, mean, var, momentum, batch_axis=None):
    """``stat = momentum * value + (1 - momentum) * stat`` in place for each given running
    stat (then averaged over ``batch_axis`` when given, as instance norm does)."""
    for stat, value in ((running_mean, mean), (running_var, var)):
        if stat is not None:
            d = stat._data
            new = momentum * value.astype(d.dtype) + (1 - momentum) * d
            if batch_axis is not None:  # (the mean of an empty batch: PyTorch's nan, quietly)
                with xp.errstate(invalid="ignore"):
                    new = xp.add.reduce(new, axis=batch_axis) / new.shape[batch_axis]
            d[...] = new
            stat._version[0] += 1


def _running_stats(x, running_mean, running_var, *factor, axes, pshape, n, momentum):
    """The new running statistics of batch_norm's update (the same arithmetic), as arrays;
    ``factor``: the momentum as a 0-d array, read at run time (a cumulative average's)."""
    if factor:
        momentum = float(factor[0])
    mean = x.mean(axis=axes)
    var = ((x - mean.reshape(pshape)) ** 2).sum(axis=axes) / (n - 1)
    return tuple(momentum * value.astype(d.dtype) + (1 - momentum) * d
                 for d, value in ((running_mean, mean), (running_var, var)))


def _eval_stats(running_mean, running_var, pshape, eps):
    """batch_norm in evaluation mode reads the running mean and 1 / sqrt(var + eps)."""
    return running_mean.reshape(pshape), (1 / xp.sqrt(running_var + eps)).reshape(pshape)


def _per_channel_affine(out, weight, bias, pshape):
    """``out * weight + bias`` with the (C,) weight and bias viewed as ``pshape``."""
    if weight is not None:
        out = out * _reshape(weight, pshape)
    if bias is not None:
        out = out + _reshape(bias, pshape)
    return out


def batch_norm(input, running_mean, running_var, weight=None, bias=None, training=False,
               momentum=0.1, eps=1e-5):
    """As ``F.batch_norm``: batch statistics when training (running stats updated in place
    with ``momentum`` and the unbiased variance), running statistics otherwise. (``momentum``
    may be a 0-d Tensor: ``BatchNorm``'s cumulative average, 1 / batches seen.)"""
    _floating_input("batch_norm", input, "batch_norm")
    if input.ndim < 2:
        raise ValueError(f"batch_norm: expected 2D or more input (N, C, ...), got "
                         f"{_shape(input)}")
    c = input.shape[1]
    _check_per_channel("batch_norm", c, running_mean, running_var, weight, bias)
    pshape = (1, c) + (1,) * (input.ndim - 2)
    axes = (0,) + tuple(range(2, input.ndim))
    if training:
        n = input.numel() // max(c, 1)
        if n == 1:
            raise ValueError(f"batch_norm: Expected more than 1 value per channel when training, "
                             f"got input size {_shape(input)}")
        factor = ()
        if isinstance(momentum, Tensor):
            factor, momentum = (momentum,), None
        if n and running_mean is not None and running_var is not None and _recorder():
            stats = _array_fn("batch_norm_stats", _running_stats, (input, running_mean,
                              running_var) + factor, axes=axes, pshape=pshape, n=n,
                              momentum=momentum)
            _assign(running_mean, stats[0])
            _assign(running_var, stats[1])
        elif n and (running_mean is not None or running_var is not None):  # (an empty batch
            x = input._data  # leaves them as they are, as in PyTorch)
            mean = x.mean(axis=axes)
            var = ((x - mean.reshape(pshape)) ** 2).sum(axis=axes) / (n - 1)
            if factor:
                momentum = float(factor[0]._data)
            _update_running_stats(running_mean, running_var, mean, var, momentum)
        return N.batch_norm(input, weight, bias, axes=axes, eps=eps, param_shape=pshape)
    if running_mean is None or running_var is None:
        raise RuntimeError("batch_norm: running_mean and running_var must be defined in "
                           "evaluation mode")
    rm, invstd = _array_fn("batch_norm_eval_stats", _eval_stats, (running_mean, running_var),
                           pshape=pshape, eps=eps)
    return _per_channel_affine((input - rm) * invstd, weight, bias, pshape)


def instance_norm(input, running_mean=None, running_var=None, weight=None, bias=None,
                  use_input_stats=True, momentum=0.1, eps=1e-5):
    """As ``F.instance_norm``: standardise each (sample, channel) over its spatial dims; the
    running stats (if given) move toward the batch average of the instance statistics."""
    _floating_input("instance_norm", input, "batch_norm")
    if input.ndim < 3:
        raise ValueError(f"instance_norm: expected at least 3D input (N, C, ...), got "
                         f"{_shape(input)}")
    if input.shape[0] == 0 and (weight is not None or bias is not None):
        raise IndexError(f"instance_norm: weight and bias are repeated per sample, and an empty "
                         f"batch has none (index 0 out of range), input of size {_shape(input)}")
    if not use_input_stats:
        return batch_norm(input, running_mean, running_var, weight, bias, False, momentum, eps)
    spatial = math.prod(input.shape[2:])
    if spatial == 1:
        raise ValueError(f"instance_norm: Expected more than 1 spatial element when training, "
                         f"got input size {_shape(input)}")
    c = input.shape[1]
    _check_per_channel("instance_norm", c, running_mean, running_var, weight, bias)
    axes = tuple(range(2, input.ndim))
    if running_mean is not None or running_var is not None:
        x = input._data
        mean = x.mean(axis=axes, keepdims=True)
        var = ((x - mean) ** 2).sum(axis=axes) / (spatial - 1)
        _update_running_stats(running_mean, running_var, mean.reshape(var.shape), var,
                              momentum, batch_axis=0)
    out = N.layer_norm(input, None, None, axes=axes, eps=eps, param_shape=())
    return _per_channel_affine(out, weight, bias, (1, c) + (1,) * (input.ndim - 2))


def group_norm(input, num_groups, weight=None, bias=None, eps=1e-5):
    """As ``F.group_norm``: standardise each group of channels per sample, then scale/shift."""
    _floating_input("group_norm", input, "GroupNormKernelImpl")
    if input.ndim < 2:
        raise RuntimeError(f"group_norm: expected at least 2 dims (N, C, ...), got "
                           f"{_shape(input)}")
    n, c = input.shape[:2]
    if num_groups <= 0 or c % num_groups:
        raise RuntimeError(f"group_norm: Expected number of channels in input to be divisible "
                           f"by num_groups, but got input of shape {_shape(input)} and "
                           f"num_groups={num_groups}")
    for name, p in (("weight", weight), ("bias", bias)):
        if p is not None and tuple(p.shape) != (c,):
            raise RuntimeError(f"group_norm: Expected {name} to be a vector of size equal to "
                               f"the number of channels in input, but got {name} of shape "
                               f"{_shape(p)} and input of shape {_shape(input)}")
    return N.group_norm(input, weight, bias, groups=num_groups, eps=eps)


# --- convolution -------------------------------------------------------------------------
def _conv_padding(name, padding, kernel, stride, dilation):
    n = len(kernel)
    if isinstance(padding, str):
        if padding == "valid":
            return ((0, 0),) * n
        if padding != "same":
            raise ValueError(f"{name}: Invalid padding string {padding!r}, should be one of "
                             "{'valid', 'same'}")
        if any(s != 1 for s in stride):
            raise ValueError(f"{name}: padding='same' is not supported for strided "
                             "convolutions")
        pads = []
        for k, d in zip(kernel, dilation):
            total = d * (k - 1)
            pads.append((total // 2, total - total // 2))
        return tuple(pads)
    p = _tuple(padding, n, name, "padding")
    if any(v < 0 for v in p):
        raise RuntimeError(f"{name}: negative padding is not supported (got {list(p)})")
    return tuple((v, v) for v in p)


def _conv_check(name, input, weight, bias, groups, stride, dilation, n):
    dims = n + 2
    if input.ndim not in (dims - 1, dims):
        raise RuntimeError(f"{name}: Expected {dims - 1}D (unbatched) or {dims}D (batched) "
                           f"input to {name}, but got input of size: {_shape(input)}")
    if weight.ndim != dims:
        raise RuntimeError(f"{name}: Expected {dims}-dimensional weight for {dims}-dimensional "
                           f"input {_shape(input)}, but got {weight.ndim}-dimensional weight of "
                           f"size {_shape(weight)}")
    if groups <= 0:
        raise RuntimeError(f"{name}: non-positive groups is not supported (got {groups})")
    if any(s <= 0 for s in stride) or any(d <= 0 for d in dilation):
        raise RuntimeError(f"{name}: stride and dilation must be positive (got stride "
                           f"{list(stride)}, dilation {list(dilation)})")
    if input.dtype != weight.dtype:
        raise RuntimeError(f"{name}: Input type ({input.dtype}) and weight type "
                           f"({weight.dtype}) should be the same")


def _convnd(name, input, weight, bias, stride, padding, dilation, groups, n):
    stride = _tuple(stride, n, name, "stride")
    dilation = _tuple(dilation, n, name, "dilation")
    _conv_check(name, input, weight, bias, groups, stride, dilation, n)
    batched = input.ndim == n + 2
    x = input if batched else _reshape(input, (1,) + tuple(input.shape))
    c = x.shape[1]
    o, cg = weight.shape[:2]
    kernel = tuple(weight.shape[2:])
    if o % groups:
        raise RuntimeError(f"{name}: Given groups={groups}, expected weight to be divisible by "
                           f"{groups} at dimension 0, but got weight of size {_shape(weight)} "
                           "instead")
    if cg * groups != c:
        raise RuntimeError(f"{name}: Given groups={groups}, weight of size {_shape(weight)}, "
                           f"expected input{_shape(x)} to have {cg * groups} channels, but got "
                           f"{c} channels instead")
    if bias is not None and tuple(bias.shape) != (o,):
        raise RuntimeError(f"{name}: Given weight of size {_shape(weight)}, expected bias to be "
                           f"1-dimensional with {o} elements, but got bias of size "
                           f"{_shape(bias)} instead")
    pads = _conv_padding(name, padding, kernel, stride, dilation)
    padded = [s + lo + hi for s, (lo, hi) in zip(x.shape[2:], pads)]
    eff = [d * (k - 1) + 1 for k, d in zip(kernel, dilation)]
    if any(p < e for p, e in zip(padded, eff)):
        raise RuntimeError(
            f"{name}: Calculated padded input size per channel: "
            f"({' x '.join(map(str, padded))}). Kernel size: ({' x '.join(map(str, eff))}). "
            f"Kernel size can't be greater than actual input size (input {_shape(input)}, "
            f"weight {_shape(weight)})")
    if n == 1:  # conv1d runs as a conv2d over a height-1 image
        out = N.conv2d(_reshape(x, x.shape[:2] + (1,) + x.shape[2:]),
                       _reshape(weight, (o, cg, 1) + kernel), stride=(1,) + stride,
                       padding=((0, 0),) + pads, dilation=(1,) + dilation, groups=groups)
        out = _reshape(out, out.shape[:2] + out.shape[3:])
    else:
        out = N.conv2d(x, weight, stride=stride, padding=pads, dilation=dilation, groups=groups)
    if bias is not None:
        out = out + _reshape(bias, (1, o) + (1,) * n)
    return out if batched else _reshape(out, out.shape[1:])


@autocast_composite
def conv1d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    """As ``F.conv1d``: (N, C, L) with (O, C/groups, K); padding int, 'same' or 'valid'."""
    return _convnd("conv1d", input, weight, bias, stride, padding, dilation, groups, 1)


@autocast_composite
def conv2d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    """As ``F.conv2d``: (N, C, H, W) with (O, C/groups, KH, KW); strided views and one matmul.

    >>> F.conv2d(x, w, b, stride=2, padding=1)
    """
    return _convnd("conv2d", input, weight, bias, stride, padding, dilation, groups, 2)


@autocast_composite
def conv_transpose2d(input, weight, bias=None, stride=1, padding=0, output_padding=0, groups=1,
                     dilation=1):
    """As ``F.conv_transpose2d``: the gradient of conv2d with respect to its input; weight is
    (C_in, C_out/groups, KH, KW)."""
    name = "conv_transpose2d"
    stride = _tuple(stride, 2, name, "stride")
    dilation = _tuple(dilation, 2, name, "dilation")
    padding = _tuple(padding, 2, name, "padding")
    output_padding = _tuple(output_padding, 2, name, "output_padding")
    _conv_check(name, input, weight, bias, groups, stride, dilation, 2)
    batched = input.ndim == 4
    x = input if batched else _reshape(input, (1,) + tuple(input.shape))
    cin, cog = weight.shape[:2]
    if cin != x.shape[1]:
        raise RuntimeError(f"{name}: Given transposed=1, weight of size {_shape(weight)}, "
                           f"expected input{_shape(x)} to have {cin} channels, but got "
                           f"{x.shape[1]} channels instead")
    if cin % groups:
        raise RuntimeError(f"{name}: Given groups={groups}, expected weight to be divisible by "
                           f"{groups} at dimension 0, but got weight of size {_shape(weight)}")
    for op_, s, d in zip(output_padding, stride, dilation):
        if op_ >= max(s, d) or op_ < 0:
            raise RuntimeError(f"{name}: output padding must be smaller than either stride or "
                               f"dilation, but got output_padding={list(output_padding)}, "
                               f"stride={list(stride)}, dilation={list(dilation)}")
    if bias is not None and tuple(bias.shape) != (cog * groups,):
        raise RuntimeError(f"{name}: expected bias of shape ({cog * groups},), got "
                           f"{_shape(bias)}")
    size = tuple((h - 1) * s - 2 * p + d * (k - 1) + op_ + 1 for h, s, p, d, k, op_ in zip(
        x.shape[2:], stride, padding, dilation, weight.shape[2:], output_padding))
    if any(s <= 0 for s in size):
        raise RuntimeError(f"{name}: computed output size {list(size)} is too small (input "
                           f"{_shape(input)}, weight {_shape(weight)})")
    out = N.conv2d_input(x, weight, size=size, stride=stride,
                         padding=tuple((p, p) for p in padding), dilation=dilation,
                         groups=groups)
    if bias is not None:
        out = out + _reshape(bias, (1, cog * groups, 1, 1))
    return out if batched else _reshape(out, out.shape[1:])


# --- pooling -----------------------------------------------------------------------------
def _pool_out(size, k, p, s, d, ceil_mode):
    """PyTorch's pooling_output_shape."""
    num = size + 2 * p - d * (k - 1) - 1 + (s - 1 if ceil_mode else 0)
    out = num // s + 1
    if ceil_mode and (out - 1) * s >= size + p:
        out -= 1
    return out


def _pool_args(name, input, kernel_size, stride, padding, dilation, ceil_mode):
    kernel = _tuple(kernel_size, 2, name, "kernel_size")
    stride = kernel if stride is None or (not isinstance(stride, int) and len(stride) == 0) \
        else _tuple(stride, 2, name, "stride")
    padding = _tuple(padding, 2, name, "padding")
    dilation = _tuple(dilation, 2, name, "dilation")
    if input.ndim not in (3, 4):
        raise RuntimeError(f"{name}: Expected 3D or 4D (batch mode) tensor for input, got "
                           f"{_shape(input)}")
    if any(v <= 0 for v in kernel + stride + dilation):
        raise RuntimeError(f"{name}: kernel_size, stride and dilation must be greater than "
                           f"zero, got kernel_size={list(kernel)}, stride={list(stride)}, "
                           f"dilation={list(dilation)}")
    for p, k, d in zip(padding, kernel, dilation):
        if p < 0 or p > (d * (k - 1) + 1) // 2:
            raise RuntimeError(f"{name}: pad should be at most half of effective kernel size, "
                               f"but got pad={p}, kernel_size={k} and dilation={d}")
    out = tuple(_pool_out(n, k, p, s, d, ceil_mode) for n, k, p, s, d in zip(
        input.shape[-2:], kernel, padding, stride, dilation))
    if any(o <= 0 for o in out):
        raise RuntimeError(f"{name}: Given input size {_shape(input)}, calculated output size "
                           f"{list(out)} is too small (kernel_size={list(kernel)})")
    return kernel, stride, padding, dilation, out


def max_pool2d(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False,
               return_indices=False):
    """As ``F.max_pool2d``: stride defaults to kernel_size; the gradient goes to each window's
    argmax. ``return_indices=True`` also returns the flat (h * W + w) indices."""
    name = "max_pool2d"
    kernel, stride, padding, dilation, out = _pool_args(name, input, kernel_size, stride,
                                                        padding, dilation, ceil_mode)
    batched = input.ndim == 4
    x = input if batched else _reshape(input, (1,) + tuple(input.shape))
    if _batched(x):  # under vmap: the indices as an op on the batch (its batching rule)
        idx = N.max_pool2d_indices(x, kernel=kernel, stride=stride, padding=padding,
                                   dilation=dilation, out_size=out)
        values = N.max_pool2d(x, idx)
        if not batched:
            values, idx = _reshape(values, values.shape[1:]), _reshape(idx, idx.shape[1:])
        return (values, idx) if return_indices else values
    idx = _array_fn("max_pool2d_indices", N.max_pool2d_indices.forward, (x,), kernel=kernel,
                    stride=stride, padding=padding, dilation=dilation, out_size=out)
    values = N.max_pool2d(x, idx)
    if not batched:
        values, idx = _reshape(values, values.shape[1:]), _reshape(idx, idx.shape[1:])
    return (values, idx) if return_indices else values


max_pool2d_with_indices = max_pool2d


def avg_pool2d(input, kernel_size, stride=None, padding=0, ceil_mode=False,
               count_include_pad=True, divisor_override=None):
    """As ``F.avg_pool2d``: window means; ``count_include_pad`` counts the zero padding."""
    name = "avg_pool2d"
    kernel, stride, padding, _, out = _pool_args(name, input, kernel_size, stride, padding, 1,
                                                 ceil_mode)
    if divisor_override is not None and divisor_override == 0:
        raise RuntimeError("avg_pool2d: divisor must be not zero")
    batched = input.ndim == 4
    x = input if batched else _reshape(input, (1,) + tuple(input.shape))
    y = N.avg_pool2d(x, kernel=kernel, stride=stride, padding=padding, out_size=out,
                     count_include_pad=count_include_pad, divisor_override=divisor_override)
    return y if batched else _reshape(y, y.shape[1:])


def _adaptive_matrix(n, o, dtype):
    """(o, n) averaging matrix of PyTorch's adaptive windows [floor(i n/o), ceil((i+1) n/o))."""
    i = xp.arange(o)
    start = (i * n) // o
    end = -((-(i + 1) * n) // o)
    cols = xp.arange(n)
    inside = (cols[None, :] >= start[:, None]) & (cols[None, :] < end[:, None])
    return (inside / (end - start)[:, None]).astype(dtype)


def adaptive_avg_pool2d(input, output_size):
    """As ``F.adaptive_avg_pool2d``: ``output_size`` int or pair (None keeps that size)."""
    if input.ndim not in (3, 4):
        raise RuntimeError(f"adaptive_avg_pool2d: Expected 3D or 4D tensor, but got "
                           f"{_shape(input)}")
    if isinstance(output_size, int):
        output_size = (output_size, output_size)
    h, w = input.shape[-2:]
    oh, ow = (h if output_size[0] is None else output_size[0],
              w if output_size[1] is None else output_size[1])
    if oh <= 0 or ow <= 0 or h == 0 or w == 0:
        raise RuntimeError(f"adaptive_avg_pool2d: invalid output size {[oh, ow]} for input "
                           f"{_shape(input)}")
    dt = input._data.dtype
    rows, cols = _adaptive_matrix(h, oh, dt), _adaptive_matrix(w, ow, dt).T
    return matmul(matmul(_static(rows), input), _static(xp.ascontiguousarray(cols)))


def _identity_kernel(c, kernel, dtype):
    """(C*KH*KW, 1, KH, KW): channel c, offset k picks exactly pixel k of channel c's patch."""
    k = kernel[0] * kernel[1]
    eye = xp.eye(k, dtype=dtype).reshape(k, 1, kernel[0], kernel[1])
    return xp.ascontiguousarray(xp.broadcast_to(eye, (c, k, 1) + tuple(kernel)).reshape(
        c * k, 1, *kernel))


@autocast_composite
def unfold(input, kernel_size, dilation=1, padding=0, stride=1):
    """As ``F.unfold`` (im2col): (N, C, H, W) to (N, C*KH*KW, L); a grouped conv2d with an
    identity kernel, so gradients of every order come from conv2d's rules."""
    name = "unfold"
    if input.ndim not in (3, 4):
        raise RuntimeError(f"{name}: Input Error: Only 3D or 4D input Tensors are supported "
                           f"(got {input.ndim}D)")
    kernel = _tuple(kernel_size, 2, name, "kernel_size")
    batched = input.ndim == 4
    x = input if batched else _reshape(input, (1,) + tuple(input.shape))
    n, c = x.shape[:2]
    w = _static(_identity_kernel(c, kernel, x._data.dtype))
    cols = conv2d(x, w, None, stride, _tuple(padding, 2, name, "padding"), dilation, groups=c)
    out = _reshape(cols, (n, cols.shape[1], cols.shape[2] * cols.shape[3]))  # (no -1: n may be 0)
    return out if batched else _reshape(out, out.shape[1:])


def fold(input, output_size, kernel_size, dilation=1, padding=0, stride=1):
    """As ``F.fold`` (col2im): (N, C*KH*KW, L) summed back onto (N, C, H, W); the adjoint of
    ``unfold`` (a conv_transpose2d with the identity kernel)."""
    name = "fold"
    if input.ndim not in (2, 3):
        raise RuntimeError(f"{name}: Input Error: Only unbatched (2D) or batched (3D) input "
                           f"Tensors are supported (got {input.ndim}D)")
    size = _tuple(output_size, 2, name, "output_size")
    kernel = _tuple(kernel_size, 2, name, "kernel_size")
    dilation = _tuple(dilation, 2, name, "dilation")
    padding = _tuple(padding, 2, name, "padding")
    stride = _tuple(stride, 2, name, "stride")
    batched = input.ndim == 3
    x = input if batched else _reshape(input, (1,) + tuple(input.shape))
    n, ck, length = x.shape
    k = kernel[0] * kernel[1]
    blocks = [(s + 2 * p - d * (kk - 1) - 1) // st + 1 for s, p, d, kk, st in zip(
        size, padding, dilation, kernel, stride)]
    if ck % k or blocks[0] * blocks[1] != length or min(blocks) < 1:
        raise RuntimeError(
            f"{name}: Given output_size={list(size)}, kernel_size={list(kernel)}, "
            f"dilation={list(dilation)}, padding={list(padding)}, stride={list(stride)}, "
            f"expected size of input's dimension 1 to be divisible by the product of "
            f"kernel_size ({k}) and dimension 2 to match the calculated number of sliding blocks "
            f"{blocks[0]} * {blocks[1]} = {blocks[0] * blocks[1]}, but got input of size "
            f"{_shape(input)}")
    c = ck // k
    w = _static(_identity_kernel(c, kernel, x._data.dtype))
    out = N.conv2d_input(_reshape(x, (n, ck) + tuple(blocks)), w, size=size, stride=stride,
                         padding=tuple((p, p) for p in padding), dilation=dilation, groups=c)
    return out if batched else _reshape(out, out.shape[1:])


def pixel_shuffle(input, upscale_factor):
    """As ``F.pixel_shuffle``: (*, C*r*r, H, W) to (*, C, H*r, W*r)."""
    r = int(upscale_factor)
    if input.ndim < 3 or r <= 0 or input.shape[-3] % (r * r):
        raise RuntimeError(f"pixel_shuffle: expects its input's 'channel' dimension to be "
                           f"divisible by the square of upscale_factor, but input.size(-3)="
                           f"{input.shape[-3] if input.ndim >= 3 else None} is not divisible by "
                           f"{r * r} (input {_shape(input)})")
    lead, (c, h, w) = tuple(input.shape[:-3]), input.shape[-3:]
    x = _reshape(input, lead + (c // (r * r), r, r, h, w))
    k = len(lead)
    x = permute_op(x, dims=tuple(range(k)) + tuple(k + i for i in (0, 3, 1, 4, 2)))
    return _reshape(x, lead + (c // (r * r), h * r, w * r))


def pixel_unshuffle(input, downscale_factor):
    """As ``F.pixel_unshuffle``: (*, C, H*r, W*r) to (*, C*r*r, H, W)."""
    r = int(downscale_factor)
    if input.ndim < 3 or r <= 0 or input.shape[-2] % r or input.shape[-1] % r:
        raise RuntimeError(f"pixel_unshuffle: expects height and width to be divisible by "
                           f"downscale_factor {r} (input {_shape(input)})")
    lead, (c, h, w) = tuple(input.shape[:-3]), input.shape[-3:]
    x = _reshape(input, lead + (c, h // r, r, w // r, r))
    k = len(lead)
    x = permute_op(x, dims=tuple(range(k)) + tuple(k + i for i in (0, 2, 4, 1, 3)))
    return _reshape(x, lead + (c * r * r, h // r, w // r))


def adaptive_avg_pool1d(input, output_size):
    """As ``F.adaptive_avg_pool1d``: (N, C, L) to (N, C, output_size)."""
    if input.ndim not in (2, 3) or input.shape[-1] == 0:
        raise RuntimeError(f"adaptive_avg_pool1d: Expected 2D or 3D tensor, but got "
                           f"{_shape(input)}")
    o = output_size if isinstance(output_size, int) else output_size[0]
    if o <= 0:
        raise RuntimeError(f"adaptive_avg_pool1d: invalid output size {o}")
    m = _adaptive_matrix(input.shape[-1], o, input._data.dtype)
    return matmul(input, _static(xp.ascontiguousarray(m.T)))


_LINEAR_MODES = {"linear": 1, "bilinear": 2, "trilinear": 3}


def _linear_matrix(n_in, n_out, align_corners, scale_factor, dtype):
    """(n_out, n_in) weights of PyTorch's linear resampling along one axis."""
    if align_corners:
        scale = (n_in - 1) / (n_out - 1) if n_out > 1 else 0.0
    else:
        scale = 1.0 / scale_factor if scale_factor else n_in / n_out
    dst = xp.arange(n_out, dtype=dtype)
    src = dst * scale if align_corners else xp.maximum((dst + 0.5) * scale - 0.5, 0)
    i0 = xp.floor(src).astype(xp.int64)
    i1 = i0 + (i0 < n_in - 1)
    l1 = (src - i0).astype(dtype)
    m = xp.zeros((n_out, n_in), dtype=dtype)
    rows = xp.arange(n_out)
    xp.add.at(m, (rows, i0), 1 - l1)
    xp.add.at(m, (rows, i1), l1)
    return m


def _nearest_index(n_in, n_out, scale_factor, exact):
    """PyTorch's nearest source index, computed in float32 as its kernels do."""
    dst = xp.arange(n_out)
    if not exact and n_out == n_in:
        return dst
    if not exact and n_out == 2 * n_in:
        return dst >> 1
    f32 = xp.float32
    scale = f32(1.0 / scale_factor) if scale_factor else f32(n_in) / f32(n_out)
    pos = (dst.astype(f32) + f32(0.5)) * scale if exact else dst.astype(f32) * scale
    return xp.minimum(xp.floor(pos).astype(xp.int64), n_in - 1)


def interpolate(input, size=None, scale_factor=None, mode="nearest", align_corners=None,
                recompute_scale_factor=None, antialias=False):
    """As ``F.interpolate``: modes nearest, nearest-exact, (bi/tri)linear and area, resampling
    each spatial axis in turn (linear: a matmul with the axis's weight matrix)."""
    name = "interpolate"
    if mode in ("nearest", "area", "nearest-exact"):
        if align_corners is not None:
            raise ValueError(f"{name}: align_corners option can only be set with the "
                             "interpolating modes: linear | bilinear | bicubic | trilinear")
    elif mode in _LINEAR_MODES:
        align_corners = bool(align_corners)
    else:
        raise NotImplementedError(f"{name}: mode {mode!r} is not supported by tapegrad (use "
                                  "nearest, nearest-exact, linear, bilinear, trilinear or area)")
    if antialias:
        raise NotImplementedError(f"{name}: antialias=True is not supported by tapegrad")
    dim = input.ndim - 2
    if dim < 1 or dim > 3:
        raise NotImplementedError(f"{name}: Input Error: Only 3D, 4D and 5D input Tensors "
                                  f"supported (got {input.ndim}D) for the modes: nearest | "
                                  "linear | bilinear | trilinear | area | nearest-exact")
    if mode in _LINEAR_MODES and _LINEAR_MODES[mode] != dim:
        raise NotImplementedError(f"{name}: Got {input.ndim}D input, but {mode} mode needs "
                                  f"{_LINEAR_MODES[mode] + 2}D input")
    if size is not None and scale_factor is not None:
        raise ValueError(f"{name}: only one of size or scale_factor should be defined")
    spatial = tuple(input.shape[2:])
    if size is not None:
        out = tuple(size) if isinstance(size, (tuple, list)) else (size,) * dim
        if len(out) != dim:
            raise ValueError(f"{name}: Input and output must have the same number of spatial "
                             f"dimensions, but got input with spatial dimensions of "
                             f"{list(spatial)} and output size of {size}.")
        scales = (None,) * dim
    elif scale_factor is not None:
        scales = tuple(scale_factor) if isinstance(scale_factor, (tuple, list)) else \
            (scale_factor,) * dim
        if len(scales) != dim:
            raise ValueError(f"{name}: Input and scale_factor must have the same number of "
                             f"spatial dimensions, but got input with spatial dimensions of "
                             f"{list(spatial)} and scale_factor of shape {scale_factor}.")
        out = tuple(int(n * f) for n, f in zip(spatial, scales))
        if recompute_scale_factor or mode == "area":
            scales = (None,) * dim
    else:
        raise ValueError(f"{name}: either size or scale_factor should be defined")
    if any(int(o) <= 0 for o in out):
        raise RuntimeError(f"{name}: output size {list(out)} must be positive (input "
                           f"{_shape(input)})")
    if mode == "area":
        if dim == 1:
            return adaptive_avg_pool1d(input, out[0])
        if dim == 2:
            return adaptive_avg_pool2d(input, out)
        raise NotImplementedError(f"{name}: area mode supports 3D and 4D input in tapegrad")
    from tapegrad.ops.indexing import index_select

    x = input
    dt = input._data.dtype
    for i, (n_in, n_out, sf) in enumerate(zip(spatial, out, scales)):
        axis = 2 + i
        if mode in _LINEAR_MODES:
            m = _static(xp.ascontiguousarray(_linear_matrix(n_in, int(n_out), align_corners, sf,
                                                           dt).T))
            last = x.ndim - 1
            if axis == last:
                x = matmul(x, m)
            else:
                order = list(range(x.ndim))
                order[axis], order[last] = last, axis
                x = permute_op(matmul(permute_op(x, dims=tuple(order)), m), dims=tuple(order))
        else:
            idx = _nearest_index(n_in, int(n_out), sf, mode == "nearest-exact")
            x = index_select(x, axis, _static(idx))
    return x


# --- attention ---------------------------------------------------------------------------
_CAUSAL_BIAS = {}


def _causal_bias(L, S, dt):
    """``is_causal``'s additive mask over host arrays: 0 on and below the diagonal, -inf above,
    of dtype ``dt``; one read-only array per (L, S, dtype), not six numpy calls a step."""
    key = (L, S, dt)
    b = _CAUSAL_BIAS.get(key)
    if b is None:
        b = xp.where(xp.tril(xp.ones((L, S), dtype=bool)), 0, -xp.inf).astype(dt)
        b.flags.writeable = False
        if len(_CAUSAL_BIAS) < 64:
            _CAUSAL_BIAS[key] = b
    return b


@autocast_composite
def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0,
                                 is_causal=False, scale=None, enable_gqa=False):
    """As ``F.scaled_dot_product_attention``: ``softmax(q k^T * scale + mask) @ v`` (fused).

    ``attn_mask``: bool (True = attend) or float (added); ``is_causal``: lower-triangular mask.
    Rows with every position masked give zeros, as PyTorch's math backend.
    """
    name = "scaled_dot_product_attention"
    if query.ndim < 2 or key.ndim < 2 or value.ndim < 2:
        raise RuntimeError(f"{name}: query, key and value must be at least 2-D, got "
                           f"{_shape(query)}, {_shape(key)}, {_shape(value)}")
    if query.shape[-1] != key.shape[-1] or key.shape[-2] != value.shape[-2]:
        raise RuntimeError(f"{name}: incompatible shapes query {_shape(query)}, key "
                           f"{_shape(key)}, value {_shape(value)} (need q[-1] == k[-1] and "
                           "k[-2] == v[-2])")
    if enable_gqa and key.ndim >= 3 and query.shape[-3] != key.shape[-3]:
        hq, hk = query.shape[-3], key.shape[-3]
        if hq % hk:
            raise RuntimeError(f"{name}: number of heads in key/value ({hk}) must divide the "
                               f"number of heads in query ({hq})")
        key, value = _repeat_heads(key, hq // hk), _repeat_heads(value, hq // hk)
    if is_causal and attn_mask is not None:
        raise RuntimeError(f"{name}: Explicit attn_mask should not be set when is_causal=True")
    if not 0.0 <= dropout_p <= 1.0:
        raise ValueError(f"{name}: dropout_p must be in [0, 1], got {dropout_p}")
    L, S = query.shape[-2], key.shape[-2]
    scale = 1.0 / math.sqrt(query.shape[-1]) if scale is None else float(scale)
    dt = query._data.dtype
    bias = None
    if is_causal and type(query._data) is xp.ndarray:
        bias = _static(_causal_bias(L, S, dt))  # (no row is fully masked: keep stays None)
    elif is_causal:
        attn_mask = _static(on_device_of(query._data, xp.tril(xp.ones((L, S), dtype=bool))))
    blocked = None
    bv = ()  # the mask's values as an array (None: fully masked rows are handled by ops)
    made = _const
    if attn_mask is not None:
        m = attn_mask._data
        if _batched(attn_mask):  # under vmap: the mask's values on the physical batch
            from tapegrad.func._vmap import physical_array, rebatch

            made, m = (lambda a, like=attn_mask: rebatch(a, like)), physical_array(attn_mask)
        try:
            xp.broadcast_shapes(tuple(attn_mask.shape), query.shape[:-1] + (S,))
        except ValueError:
            raise RuntimeError(f"{name}: attn_mask of shape {list(attn_mask.shape)} cannot be "
                               f"broadcast "
                               f"to the attention weights' shape "
                               f"{list(query.shape[:-1]) + [S]}") from None
        if m.dtype == bool:
            bv = xp.where(m, 0, -xp.inf).astype(dt)
            bias = (_static if is_causal else made)(bv)
            blocked = ~m
        elif made is _const and grad_state.modes and _recorder() is not None:
            # under the compiler the mask is an input whose values change per call (and may
            # not be computed yet): the fully-masked-row fix is ops, run every call, and
            # leaves keep unset so the compiled attention kernels still match
            top = amax_op(attn_mask, dims=(attn_mask.ndim - 1,), keepdim=True)
            live = ne(top, _static(xp.full((), -xp.inf, m.dtype)))  # (-inf: a graph constant)
            bias = where(live, attn_mask, 0.0)
            bv = None
        else:
            bias, bv = attn_mask, m
            blocked = m == -xp.inf
    keep = None
    if bv is None:  # (the compiler's ops form above: dead rows are zeroed at the end)
        pass
    elif blocked is not None:
        dead = xp.all(blocked, axis=-1, keepdims=True)
        if dead.any():  # a fully masked row: attend nowhere (zeros), as _safe_softmax
            keep = (~dead).astype(dt)
            if made is not _const:  # under vmap: a batched keep (an op's param, batched)
                keep = made(keep)
            # (a bias that requires grad: where, not bias + (fix - bias): -inf - -inf is nan)
            bias = where(made(dead), made(xp.zeros((), dt)), bias) if bias.requires_grad \
                else made(xp.where(dead, 0, bv).astype(dt))
    if dropout_p > 0.0:
        shape = xp.broadcast_shapes(query.shape[:-1] + (S,), key.shape[:-2] + (L, S))
        drop = _array_fn("dropout_mask", _keep_mask, (), True, shape=shape, keep=1.0 - dropout_p,
                         dtype=dt)._data if dropout_p < 1 else xp.zeros(shape, dt)  # (traced)
        keep = drop if keep is None else keep * drop
    if bias is not None:
        out = N.scaled_dot_product_attention(query, key, value, bias, scale=scale, keep=keep)
        # a dead row's bias is 0 (finite weights); its output and gradients are zeroed here,
        # as eager's keep zeroes them (a product by 1 or 0: cheaper than a where)
        return out * to_dtype(live, dtype=out.dtype) if bv is None else out
    return N.scaled_dot_product_attention(query, key, value, scale=scale, keep=keep)


def _repeat_heads(t, r):
    shape = tuple(t.shape)
    lead, h = shape[:-3], shape[-3]
    e = reshape_op(t, shape=lead + (h, 1) + shape[-2:])
    e = broadcast_to(e, shape=lead + (h, r) + shape[-2:])
    return reshape_op(e, shape=lead + (h * r,) + shape[-2:])


# --- utilities ---------------------------------------------------------------------------
def one_hot(tensor, num_classes=-1):
    """As ``F.one_hot``: int64 (..., num_classes); ``num_classes=-1`` infers max + 1."""
    t = tensor._data
    inferred = False
    if t.dtype != xp.int64:
        raise RuntimeError(f"one_hot: one_hot is only applicable to index tensor of type "
                           f"LongTensor (int64), got {tensor.dtype}")
    if t.size == 0:
        if num_classes <= 0:
            raise RuntimeError("one_hot: Can not infer total number of classes from empty "
                               f"tensor (shape {list(tensor.shape)}).")
    elif num_classes == -1:  # the result's shape depends on the values
        lo, hi = t.min(), t.max()
        if lo < 0:
            raise RuntimeError(f"one_hot: Class values must be non-negative. (got {int(lo)})")
        num_classes = int(hi) + 1
        inferred = True
    else:  # checks that a compiled graph makes on each call's values, negatives first
        tensor, t = range_checked(tensor, t, xp.iinfo(xp.int64).max,
                                  "one_hot: Class values must be non-negative. (got {})",
                                  "RuntimeError")
        tensor, t = range_checked(tensor, t, num_classes,
                                  "one_hot: Class values must be smaller than num_classes. "
                                  f"(got {{}} with num_classes={num_classes})", "RuntimeError")
    # (an inferred class count is read from the values: no graph constant, a graph break)
    classes = (_const if inferred else _static)(xp.arange(num_classes))
    return to_dtype(eq(_reshape(tensor, tuple(tensor.shape) + (1,)), classes), dtype=dtypes.int64)


def pairwise_distance(x1, x2, p=2.0, eps=1e-6, keepdim=False):
    """As ``F.pairwise_distance``: ``||x1 - x2 + eps||_p`` over the last dim."""
    d = x1 - x2 + eps
    if d.ndim == 0:
        d = _reshape(d, (1,))
    out = _p_norm(d, p, d.ndim - 1, "pairwise_distance")
    return out if keepdim else _reshape(out, out.shape[:-1])


def _p_norm(x, p, dim, name):
    if p == 2:
        return N.l2_norm(x, dim=dim)
    a = _abs(x)
    if p == 1:
        return sum_op(a, dims=(dim,), keepdim=True)
    if p == math.inf:  # ties share the gradient evenly, as PyTorch's
        return amax_op(a, dims=(dim,), keepdim=True)
    if p <= 0:
        raise RuntimeError(f"{name}: p must be positive, got {p}")
    return sum_op(a ** p, dims=(dim,), keepdim=True) ** (1.0 / p)


def normalize(input, p=2.0, dim=1, eps=1e-12, out=None):
    """As ``F.normalize``: ``x / max(||x||_p along dim, eps)``."""
    if out is not None:
        raise NotImplementedError("normalize: out= is not supported by tapegrad")
    dim = _dim(dim, input.ndim, "normalize")
    if input.ndim == 0:
        raise RuntimeError("normalize: input must have at least 1 dimension")
    norm = _p_norm(input, p, dim, "normalize")
    return input / where(norm >= eps, norm, eps)


def cosine_similarity(x1, x2, dim=1, eps=1e-8):
    """As ``F.cosine_similarity``: PyTorch's formula ``sum(x1/max(|x1|, eps) * x2/max(|x2|,
    eps))`` (each norm clamped without a gradient through the clamp)."""
    try:
        shape = xp.broadcast_shapes(x1.shape, x2.shape)
    except ValueError:
        raise RuntimeError(f"cosine_similarity: x1 {_shape(x1)} and x2 {_shape(x2)} cannot be "
                           "broadcast together") from None
    if tuple(x1.shape) != shape:
        x1 = broadcast_to(x1, shape=shape) if _traced(x1) or _recording() else _const(
            xp.broadcast_to(x1._data, shape))
    if tuple(x2.shape) != shape:
        x2 = broadcast_to(x2, shape=shape) if _traced(x2) or _recording() else _const(
            xp.broadcast_to(x2._data, shape))
    dim = _dim(dim, len(shape), "cosine_similarity")
    parts = []
    for x in (x1, x2):
        n = N.l2_norm(x, dim=dim)
        if _batched(n) or _recording():  # the clamp by ops (no gradient through it either)
            parts.append(x / (n + (where(n < eps, eps, n) - n).detach()))
            continue
        lift = xp.maximum(n._data, eps) - n._data  # the clamp, outside the graph
        parts.append(x / (n + _const(lift)) if lift.any() else x / n)
    return sum_op(parts[0] * parts[1], dims=(dim,))


__all__ = ["linear", "relu", "leaky_relu", "gelu", "silu", "tanh", "sigmoid", "softplus",
           "elu", "softmax", "log_softmax", "dropout", "cross_entropy", "nll_loss", "mse_loss",
           "l1_loss", "smooth_l1_loss", "binary_cross_entropy",
           "binary_cross_entropy_with_logits", "embedding", "layer_norm", "rms_norm",
           "batch_norm", "group_norm", "conv1d", "conv2d", "conv_transpose2d", "max_pool2d",
           "max_pool2d_with_indices", "avg_pool2d", "adaptive_avg_pool2d",
           "scaled_dot_product_attention", "one_hot", "pad", "normalize", "cosine_similarity",
           # beyond API.md
           "logsigmoid", "softmin", "hardtanh", "relu6", "hardsigmoid", "hardswish", "selu",
           "celu", "mish", "softsign", "glu", "huber_loss", "kl_div", "dropout1d", "dropout2d",
           "dropout3d", "unfold", "fold", "pixel_shuffle", "pixel_unshuffle",
           "pairwise_distance", "adaptive_avg_pool1d", "interpolate", "instance_norm",
           "margin_ranking_loss", "hinge_embedding_loss", "soft_margin_loss",
           "multilabel_soft_margin_loss", "cosine_embedding_loss", "triplet_margin_loss",
           "poisson_nll_loss", "gaussian_nll_loss",
           # tapegrad extensions (no PyTorch counterpart)
           "linear_relu"]
