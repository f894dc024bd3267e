"""Reductions. ``dim`` is normalised to a tuple of axes in one place: ``axes``.

Gradient rules expand ``g`` back to the input's shape with ``reshape`` (to put reduced dims
back as 1) and the broadcasting of binary ops; they use only registered ops, so they run on
raw arrays and, with ``create_graph``, on Tensors.
"""
import builtins
import collections
import math
import warnings

from tapegrad import dtypes
from tapegrad.ops import registry
from tapegrad.ops.elementwise import abs, eq, exp, isnan, np_dtype, sign, to_dtype, where_op
from tapegrad.ops.movement import _dim, broadcast_to, reshape_op as reshape
from tapegrad.backend import reduce_axis, array_module, DEVICE_TYPES
from tapegrad.ops.registry import op, xp


def axes(dim, ndim, name="reduce"):
    """Normalise PyTorch's ``dim`` (None, int, or sequence; negative allowed) to a tuple.

    None and an empty sequence mean every dim, as in PyTorch's reductions.
    """
    if dim is None:
        return tuple(range(ndim))
    dims = (dim,) if isinstance(dim, int) else tuple(dim)
    if not dims:
        return tuple(range(ndim))
    out = [_dim(d, ndim, name) for d in dims]  # the one dim normaliser
    if len(set(out)) != len(out):
        raise RuntimeError(f"{name}: dim {dim} appears multiple times in the list of dims")
    return tuple(sorted(out)) if ndim else ()


def keep_shape(shape, dims):
    """The shape a keepdim=False reduction's result has with its reduced dims put back as 1."""
    return tuple(1 if i in dims else n for i, n in enumerate(shape))


def _kept(x, shape, dims, keepdim):
    """``x`` (a reduction's result or gradient) with its reduced dims back as size 1."""
    return x if keepdim else reshape(x, shape=keep_shape(shape, dims))


def _count(shape, dims):
    n = 1
    for d in dims:
        n *= shape[d]
    return n


def _cast_back(g, a):
    """A gradient computed in a reduction's ``dtype=`` goes back to the input's dtype."""
    return g if np_dtype(g.dtype) == np_dtype(a.dtype) else to_dtype(g, dtype=a.dtype)


_BF16 = dtypes.bfloat16.np if dtypes.bfloat16 is not None else None


@op(flops=1, saves="none", name="sum", linear=True)
def sum_op(a, dims, keepdim=False, dtype=None):
    if dtype is None:
        if a.dtype is _BF16:  # accumulated in float32, rounded once (PyTorch's opmath)
            return reduce_axis(xp.add, a.astype(xp.float32), dims, keepdim).astype(_BF16)
        return reduce_axis(xp.add, a, dims, keepdim)
    return a.sum(axis=dims, keepdims=keepdim, dtype=dtype)


@sum_op.grad(traces=True)
def _(g, out, a, dims, keepdim=False, dtype=None):
    return broadcast_to(_cast_back(_kept(g, a.shape, dims, keepdim), a), shape=a.shape)


@op(flops=1, saves="none", name="mean", linear=True)
def mean_op(a, dims, keepdim=False, dtype=None):
    if a.size == 0 and _count(a.shape, dims) == 0:  # numpy warns; PyTorch gives nan quietly
        return xp.full_like(a.sum(axis=dims, keepdims=keepdim, dtype=dtype), xp.nan)
    if dtype is None and a.dtype is _BF16:  # accumulated in float32, rounded once
        return xp.asarray(a.mean(axis=dims, keepdims=keepdim, dtype=xp.float32)).astype(_BF16)
    return a.mean(axis=dims, keepdims=keepdim, dtype=dtype)


@mean_op.grad(traces=True)
def _(g, out, a, dims, keepdim=False, dtype=None):
    g = _cast_back(_kept(g, a.shape, dims, keepdim), a)
    n = _count(a.shape, dims)
    return broadcast_to(g / n if n else g, shape=a.shape)  # n == 0: a is empty, so is this


@op(flops=4, name="var")
def var_op(a, dims, correction=1, keepdim=False, full=False):
    if _count(a.shape, dims) - correction > 0:
        return a.var(axis=dims, ddof=correction, keepdims=keepdim)
    return _var_no_dof(a, dims, correction, keepdim)


def _var_no_dof(a, dims, correction, keepdim):
    """The variance with no degrees of freedom left: inf, or nan where every term is 0 or the
    input is empty, as PyTorch (numpy gets the same numbers, with warnings)."""
    n = _count(a.shape, dims)
    with xp.errstate(divide="ignore", invalid="ignore"):
        d = a - a.sum(axis=dims, keepdims=True) / n
        return (d * d).sum(axis=dims, keepdims=keepdim) / builtins.max(n - correction, 0)


def _var_grad(g, a, dims, correction, keepdim, full):
    # PyTorch's var_backward: 2 / (N - correction) * g * (a - mean(a)); ``full`` (no dim
    # given) with N <= correction: g * (nan where a equals its mean, else inf)
    dof = _count(a.shape, dims) - correction
    g = _kept(g, a.shape, dims, keepdim)
    if dof > 0:
        return (2.0 / dof * g) * (a - mean_op(a, dims=dims, keepdim=True))
    with xp.errstate(divide="ignore", invalid="ignore"):  # inf * 0 is nan here, as in PyTorch
        if full:
            at_mean = eq(a, mean_op(a, dims=dims, keepdim=True))
            # built from ops (vmap batches it) in a's shape: g's own products would put
            # 0-d nan/inf products on the graph, and the second order multiplies by them
            return g * to_dtype(where_op(at_mean, math.nan, math.inf), dtype=a.dtype)
        return (2.0 / dof if dof else math.inf) * g * (a - mean_op(a, dims=dims, keepdim=True))


def _data(a):
    return a._data if isinstance(a, registry.Tensor) else a


@var_op.grad
def _(g, out, a, dims, correction=1, keepdim=False, full=False):
    return _var_grad(g, a, dims, correction, keepdim, full)


@op(flops=5, saves="both", name="std")
def std_op(a, dims, correction=1, keepdim=False, full=False):
    if _count(a.shape, dims) - correction > 0:
        return a.std(axis=dims, ddof=correction, keepdims=keepdim)
    return xp.sqrt(_var_no_dof(a, dims, correction, keepdim))


@std_op.grad
def _(g, out, a, dims, correction=1, keepdim=False, full=False):
    zero = out == 0  # PyTorch masks the gradient of a zero std to 0 rather than nan
    g_var = where_op(zero, 0.0, g / (2 * where_op(zero, 1.0, out)))
    return _var_grad(g_var, a, dims, correction, keepdim, full)


def _local_jvp(o, t, out, a, dims, keepdim, params):
    """J t for a reduction whose gradient is ``g`` (kept over ``dims``) times a local
    derivative ``D(a)``: ``D = rule(g=1)``, so ``J t = sum(D * t, dims)`` in one forward pass
    (no reverse mode over the rule)."""
    ones = registry.Tensor._make(xp.ones(out.shape, _data(out).dtype))
    d = o.rule(ones, out, a, **params)
    return sum_op(d * t, dims=dims, keepdim=keepdim)


@var_op.jvp
def _(t, out, a, dims, correction=1, keepdim=False, full=False):
    # PyTorch's var_jvp: 2 / (N - correction) * sum((a - mean(a)) * t)
    if _count(a.shape, dims) - correction > 0:
        d = a - mean_op(a, dims=dims, keepdim=True)
        return sum_op(d * t[0], dims=dims, keepdim=keepdim) * (
            2.0 / (_count(a.shape, dims) - correction))
    return _local_jvp(var_op, t[0], out, a, dims, keepdim,
                      dict(dims=dims, correction=correction, keepdim=keepdim, full=full))


@std_op.jvp
def _(t, out, a, dims, correction=1, keepdim=False, full=False):
    # d std = d var / (2 std); 0 where the std is 0, as the gradient
    dv = var_op.jvp_rule(t, out * out, a, dims, correction, keepdim, full)
    zero = out == 0
    return where_op(zero, 0.0, dv / (2 * where_op(zero, 1.0, out)))


def _spread(g, out, a, dims, keepdim, nan_aware):
    """The gradient of max/min/amax/amin: ``g`` split evenly among the elements that tie."""
    out = _kept(out, a.shape, dims, keepdim)
    g = _kept(g, a.shape, dims, keepdim)
    mask = eq(a, out)
    if nan_aware:  # max()/min(): a NaN result came from the NaN elements
        mask = mask | (isnan(a) & isnan(out))
    count = sum_op(mask, dims=dims, keepdim=True, dtype=np_dtype(g.dtype))
    return where_op(mask, g / count, 0.0)


def _spread_jvp(t, out, a, dims, keepdim, nan_aware):
    """The tangent of max/min/amax/amin: the mean of ``t`` over the elements that tie."""
    o = _kept(out, a.shape, dims, keepdim)
    mask = eq(a, o)
    if nan_aware:
        mask = mask | (isnan(a) & isnan(o))
    count = sum_op(mask, dims=dims, keepdim=keepdim, dtype=np_dtype(t.dtype))
    return sum_op(where_op(mask, t, 0.0), dims=dims, keepdim=keepdim) / count


def _extreme(name, fn, nan_aware):
    def forward(a, dims, keepdim=False):
        if a.size == 0 and len(dims) == a.ndim:  # a dim that is not empty may be reduced
            raise RuntimeError(
                f"{name}(): Expected reduction dim to be specified for input.numel() == 0. "
                "Specify the reduction dim with the 'dim' argument.")
        return fn(a, axis=dims, keepdims=keepdim)

    forward.__doc__ = f"``torch.{name}`` over ``dims``; ties share the gradient evenly."
    o = op(flops=1, saves="both", name=name)(forward)
    o.grad(lambda g, out, a, dims, keepdim=False: _spread(g, out, a, dims, keepdim, nan_aware))
    o.jvp(lambda t, out, a, dims, keepdim=False: _spread_jvp(t[0], out, a, dims, keepdim,
                                                            nan_aware))
    return o


max_op = _extreme("max", xp.max, True)
min_op = _extreme("min", xp.min, True)
amax_op = _extreme("amax", xp.max, False)
amin_op = _extreme("amin", xp.min, False)


def _unsqueeze(a, dim):
    return a.reshape(a.shape[:dim] + (1,) + a.shape[dim:])


def _take_along(a, idx, dim, keepdim=False):
    if a.ndim == 0:
        return a.copy()
    k = idx if keepdim else _unsqueeze(idx, dim)
    out = xp.take_along_axis(a, k, axis=dim)
    return out if keepdim else out.squeeze(dim)


def _selecting(name, fn=None):
    """An op that picks the elements at ``idx`` along ``dim`` (max/min with a dim).

    ``fn`` (xp.max/xp.min) computes the same values faster than gathering at ``idx``.
    """
    def forward(a, idx, dim, keepdim=False):
        if fn is None or a.ndim == 0:
            return _take_along(a, idx, dim, keepdim)
        return fn(a, axis=dim, keepdims=keepdim)

    forward.__doc__ = _take_along.__doc__
    o = op(flops=0, saves="none", name=name, linear=(fn is None))(forward)
    o.grad(lambda g, out, a, idx, dim, keepdim=False:
           put_along(g, idx=idx, shape=a.shape, dim=dim, keepdim=keepdim))
    o.jvp(lambda t, out, a, idx, dim, keepdim=False:
          take_along_reduce(t[0], idx=idx, dim=dim, keepdim=keepdim))
    return o


max_dim = _selecting("max_dim", xp.max)
min_dim = _selecting("min_dim", xp.min)
take_along_reduce = _selecting("take_along_reduce")


@op(flops=0, saves="none", linear=True)
def put_along(g, idx, shape, dim, keepdim=False):
    """Zeros of ``shape`` with ``g`` put at ``idx`` along ``dim``: a selection's gradient."""
    if len(shape) == 0:
        return g.copy()
    m = array_module(g)
    out = m.zeros(shape, g.dtype)
    k = idx if keepdim else _unsqueeze(idx, dim)
    v = g if keepdim else _unsqueeze(g, dim)
    if k.shape[dim] > 1:  # indices may repeat along dim (cummax's under vmap): they add, as
        # the adjoint of take_along must
        grid = tuple(k if i == dim else m.arange(n).reshape((1,) * i + (n,) + (1,) * (len(shape)
                     - i - 1)) for i, n in enumerate(shape))
        xp.add.at(out, grid, v)
        return out
    xp.put_along_axis(out, k, v, axis=dim)
    return out


@put_along.grad
def _(gg, out, g, idx, shape, dim, keepdim=False):
    return take_along_reduce(gg, idx=idx, dim=dim, keepdim=keepdim)


def _arg_forward(fn):
    def forward(a, dim=None, keepdim=False):
        if dim is None:
            i = fn(a)
            return xp.asarray(i).reshape((1,) * a.ndim if keepdim else ())
        if a.ndim == 0:
            return xp.zeros((), xp.int64)
        return fn(a, axis=dim, keepdims=keepdim)

    return forward


argmax_op = op(flops=1, saves="none", differentiable=False, name="argmax")(
    _arg_forward(xp.argmax))
argmin_op = op(flops=1, saves="none", differentiable=False, name="argmin")(
    _arg_forward(xp.argmin))


def _exclusive_prod(a, d):
    """Product of all other elements along ``d``: exclusive cumprods both ways (zero-safe)."""
    n = a.shape[d]
    ones = xp.ones_like(xp.take(a, [0], axis=d))
    left = xp.cumprod(xp.concatenate([ones, xp.take(a, range(n - 1), axis=d)], axis=d), axis=d)
    rev = xp.flip(xp.take(a, range(1, n), axis=d), d)
    right = xp.flip(xp.cumprod(xp.concatenate([ones, rev], axis=d), axis=d), d)
    return left * right


def _exclusive_prod_recorded(a, d):
    """As ``_exclusive_prod`` built from ops (for create_graph): the product of ``a`` with a
    1 in place of each element in turn, so its gradient is again prod's own rule."""
    s, n = a.shape, a.shape[d]
    lifted = broadcast_to(reshape(a, shape=s[:d] + (1,) + s[d:]), shape=s[:d] + (n,) + s[d:])
    eye = xp.eye(n, dtype=bool).reshape((n, n) + (1,) * (len(s) - d - 1))
    return prod_op(where_op(eye, 1.0, lifted), dim=d + 1)


@op(flops=1, saves="both", name="prod")
def prod_op(a, dim=None, keepdim=False, dtype=None):
    if dim is None:
        out = a.prod(dtype=dtype)
        return xp.asarray(out).reshape((1,) * a.ndim) if keepdim else out
    return a.prod(axis=dim, keepdims=keepdim, dtype=dtype)


@prod_op.grad
def _(g, out, a, dim=None, keepdim=False, dtype=None):
    if a.ndim == 0:
        return _cast_back(g, a)
    dims = tuple(range(a.ndim)) if dim is None else (dim,)
    g = _cast_back(_kept(g, a.shape, dims, keepdim), a)
    from tapegrad.func._vmap import host  # under vmap: one decision for the physical batch

    if not (host(a) == 0).any():  # PyTorch: no zeros, so the quotient is safe
        return g * (_cast_back(_kept(out, a.shape, dims, keepdim), a) / a)
    if dim is None:  # as PyTorch: the flattened input, one reduction dim
        if isinstance(a, registry.Tensor):
            others = reshape(_exclusive_prod_recorded(reshape(a, shape=(-1,)), 0), shape=a.shape)
        else:
            others = _exclusive_prod(a.reshape(-1), 0).reshape(a.shape)
    else:
        others = _exclusive_prod_recorded(a, dim) if isinstance(a, registry.Tensor) else \
            _exclusive_prod(a, dim)
    return g * others


@prod_op.jvp
def _(t, out, a, dim=None, keepdim=False, dtype=None):
    # sum over the reduced dim of t times the product of the others (exact with zeros)
    if a.ndim == 0:
        return t[0]
    dims = tuple(range(a.ndim)) if dim is None else (dim,)
    return _local_jvp(prod_op, t[0], out, a, dims, keepdim,
                      dict(dim=dim, keepdim=keepdim, dtype=dtype))


@op(flops=12, saves="both", name="logsumexp")
def logsumexp_op(a, dims, keepdim=False):
    if a.size == 0:  # log(0) = -inf over an empty extent, without numpy's divide warning
        return xp.full_like(a.sum(axis=dims, keepdims=keepdim), -xp.inf)
    m = xp.max(a, axis=dims, keepdims=True)
    m = xp.where(xp.isinf(m), 0, m).astype(a.dtype, copy=False)  # PyTorch masks infinite maxes
    s = xp.exp(a - m).sum(axis=dims, keepdims=keepdim)
    return xp.log(s) + (m if keepdim else m.reshape(s.shape))


@logsumexp_op.grad
def _(g, out, a, dims, keepdim=False):
    # fused: softmax(a) * g, the rule PyTorch uses, without re-reducing
    return _kept(g, a.shape, dims, keepdim) * exp(a - _kept(out, a.shape, dims, keepdim))


@logsumexp_op.jvp
def _(t, out, a, dims, keepdim=False):
    return sum_op(t[0] * exp(a - _kept(out, a.shape, dims, keepdim)), dims=dims,
                  keepdim=keepdim)


@op(flops=3, saves="both", name="norm")
def norm_op(a, p, dims, keepdim=False):
    if p == 2:
        return xp.sqrt((a * a).sum(axis=dims, keepdims=keepdim))
    if p == math.inf:
        return xp.abs(a).max(axis=dims, keepdims=keepdim)
    if p == -math.inf:
        return xp.abs(a).min(axis=dims, keepdims=keepdim)
    if p == 0:
        return (a != 0).sum(axis=dims, keepdims=keepdim).astype(a.dtype)
    if p == 1:
        return xp.abs(a).sum(axis=dims, keepdims=keepdim)
    return (xp.abs(a) ** p).sum(axis=dims, keepdims=keepdim) ** (1.0 / p)


@norm_op.grad
def _(g, out, a, p, dims, keepdim=False):
    # PyTorch's norm_backward, case by case; zero norms give zero gradients
    g = _kept(g, a.shape, dims, keepdim)
    norm = _kept(out, a.shape, dims, keepdim)
    if p == 0:
        return None  # as PyTorch: no gradient flows (the input's .grad stays None)
    if p == 1:
        return sign(a) * g
    zero = norm == 0
    safe_norm = where_op(zero, 1.0, norm)
    if p == 2:
        return g * where_op(zero, 0.0, a / safe_norm)
    if p in (math.inf, -math.inf):
        mag = abs(a)
        mask = eq(mag, norm) | isnan(mag)
        count = sum_op(mask, dims=dims, keepdim=True, dtype=np_dtype(g.dtype))
        return sign(a) * where_op(mask, g / count, 0.0)
    if p < 1:
        at_zero = a == 0
        scaled = sign(a) * where_op(at_zero, 0.0, abs(where_op(at_zero, 1.0, a)) ** (p - 1))
        return scaled * g * norm ** (1 - p)
    scaled = sign(a) * abs(a) ** (p - 1) if p < 2 else a * abs(a) ** (p - 2)
    return scaled * where_op(zero, 0.0, g / safe_norm ** (p - 1))


@norm_op.jvp
def _(t, out, a, p, dims, keepdim=False):
    if p == 0:
        return None  # piecewise constant
    if p == 2:  # <a, t> / |a|, 0 at a zero norm
        zero = out == 0
        return where_op(zero, 0.0, sum_op(a * t[0], dims=dims, keepdim=keepdim)
                        / where_op(zero, 1.0, out))
    # sign(a) |a|^(p-1) / |a|_p^(p-1) (p = 1, inf: sign(a), split among ties) contracted with t
    return _local_jvp(norm_op, t[0], out, a, dims, keepdim, dict(p=p, dims=dims, keepdim=keepdim))


@op(flops=1, saves="none", name="cumsum", linear=True)
def cumsum_op(a, dim, dtype=None):
    if a.ndim == 0:
        return a.astype(dtype or a.dtype)
    return xp.cumsum(a, axis=dim, dtype=dtype)


@cumsum_op.grad
def _(g, out, a, dim, dtype=None):
    return _cast_back(reverse_cumsum(g, dim=dim), a)


@op(flops=1, saves="none", linear=True)
def reverse_cumsum(a, dim):
    """Sums from the end of ``dim`` backwards: ``cumsum``'s gradient (and vice versa)."""
    if a.ndim == 0:
        return a.copy()
    return xp.flip(xp.cumsum(xp.flip(a, dim), axis=dim), dim)


@reverse_cumsum.grad
def _(g, out, a, dim):
    return cumsum_op(g, dim=dim)


def _logical_reduce(name, fn):
    def forward(a, dims, keepdim=False):
        out = fn(a, axis=dims, keepdims=keepdim)
        return out.astype(xp.uint8) if a.dtype == xp.uint8 else out  # PyTorch keeps uint8

    forward.__doc__ = f"As ``torch.{name}``: bool result (uint8 for uint8 input), no grad."
    return op(flops=1, saves="none", differentiable=False, name=name, pointwise=False)(forward)


all_op = _logical_reduce("all", xp.all)
any_op = _logical_reduce("any", xp.any)


# --- PyTorch-signature functions (exported as tapegrad.X and Tensor.X) ------------------
def sum(input, dim=None, keepdim=False, *, dtype=None):
    """As ``torch.sum``: ``x.sum()``, ``x.sum(dim=1, keepdim=True)``; bool/int sum to int64."""
    kind = input._data.dtype.kind
    np_dtype_ = dtypes.to_dtype(dtype).np if dtype is not None else (
        xp.int64 if kind in "biu" else None)
    return sum_op(input, dims=axes(dim, input.ndim, "sum"), keepdim=keepdim, dtype=np_dtype_)


def mean(input, dim=None, keepdim=False, *, dtype=None):
    """As ``torch.mean``: floating-point inputs (or an explicit float ``dtype``) only."""
    if dtype is not None:
        dtype = dtypes.to_dtype(dtype)
        if input._data.dtype != dtype.np:
            input = to_dtype(input, dtype=dtype)
    if input._data.dtype.kind in "iub":
        raise RuntimeError(
            "mean(): could not infer output dtype. Input dtype must be either a floating point "
            f"or complex dtype. Got: {input.dtype}")
    return mean_op(input, dims=axes(dim, input.ndim, "mean"), keepdim=keepdim)


def _var_args(name, input, dim, unbiased, keepdim, correction):
    if isinstance(dim, bool):  # var(x, True): the legacy ``unbiased`` positional
        dim, unbiased = None, dim
    if unbiased is not None and correction is not None:
        raise TypeError(f"{name}(): pass either unbiased= or correction=, not both")
    if correction is None:
        correction = 1 if unbiased is None or unbiased else 0
    if input._data.dtype.kind in "iub":
        raise RuntimeError(f"{name}: std and var only support floating point and complex "
                           f"dtypes (got {input.dtype})")
    dims = axes(dim, input.ndim, name)
    if (_count(input.shape, dims) if input._data.size else 0) - correction <= 0:
        warnings.warn(f"{name}(): degrees of freedom is <= 0. Correction should be strictly less "
                      "than the reduction factor (input numel divided by output numel).",
                      UserWarning, stacklevel=3)
    args = dict(dims=dims, correction=correction, keepdim=keepdim)
    if dim is None or input.ndim == 0:  # PyTorch's rule differs there when N <= correction
        args["full"] = True
    return args


def var(input, dim=None, unbiased=None, keepdim=False, *, correction=None):
    """As ``torch.var``: ``correction=1`` (Bessel) by default; legacy ``unbiased=`` too."""
    return var_op(input, **_var_args("var", input, dim, unbiased, keepdim, correction))


def std(input, dim=None, unbiased=None, keepdim=False, *, correction=None):
    """As ``torch.std``: the square root of ``var``; a zero std has a zero gradient."""
    return std_op(input, **_var_args("std", input, dim, unbiased, keepdim, correction))


ReturnTypes = {n: collections.namedtuple(n, ["values", "indices"]) for n in ("max", "min")}


def _extreme_public(name, full_op, dim_op, arg_op, pairwise):
    def f(input, dim=None, keepdim=False):
        if dim is None:
            return full_op(input, dims=tuple(range(input.ndim)))
        if isinstance(dim, registry.Tensor):  # max(a, b): elementwise
            return pairwise(input, dim)
        d = axes(dim, input.ndim, name)
        d = d[0] if d else 0
        if input.ndim and input.shape[d] == 0:
            raise IndexError(f"{name}(): Expected reduction dim {d} to have non-zero size.")
        if type(input._data) is not xp.ndarray and type(input._data) not in DEVICE_TYPES:
            # a vmap value: the indices are an op's too
            idx = arg_op(input, dim=d, keepdim=keepdim)
            return ReturnTypes[name](dim_op(input, idx=idx, dim=d, keepdim=keepdim), idx)
        idx = arg_op.forward(input._data, dim=d, keepdim=keepdim)
        values = dim_op(input, idx=idx, dim=d, keepdim=keepdim)
        return ReturnTypes[name](values, registry.Tensor._make(idx))

    f.__name__ = name
    f.__doc__ = (
        f"As ``torch.{name}``: ``x.{name}()`` is a 0-dim tensor (ties share the gradient); "
        f"``x.{name}(dim)`` returns ``(values, indices)`` (the gradient goes to the index); "
        f"``{name}(a, b)`` with a tensor ``b`` is elementwise.")
    return f


def _pairwise(name):
    from tapegrad.ops import elementwise

    return getattr(elementwise, name)


max = _extreme_public("max", max_op, max_dim, argmax_op, _pairwise("maximum"))
min = _extreme_public("min", min_op, min_dim, argmin_op, _pairwise("minimum"))


def _nonempty_extents(name, input, dim):
    """Ops without an identity (max, argmax, the inf norm) refuse to reduce an empty dim."""
    if input._data.size == 0 and dim is not None:
        for d in (dim,) if isinstance(dim, int) else dim:
            if input.shape[d] == 0:
                raise IndexError(f"{name}(): Expected reduction dim {d} to have non-zero size.")


def amax(input, dim=(), keepdim=False):
    """As ``torch.amax``: max over ``dim`` (all by default); ties share the gradient evenly."""
    dims = axes(dim, input.ndim, "amax")
    _nonempty_extents("amax", input, dim)
    return amax_op(input, dims=dims, keepdim=keepdim)


def amin(input, dim=(), keepdim=False):
    """As ``torch.amin``: min over ``dim`` (all by default); ties share the gradient evenly."""
    dims = axes(dim, input.ndim, "amin")
    _nonempty_extents("amin", input, dim)
    return amin_op(input, dims=dims, keepdim=keepdim)


def _arg_public(name, arg_op):
    def f(input, dim=None, keepdim=False):
        if dim is not None:
            dim = axes(dim, input.ndim, name)
            dim = dim[0] if dim else 0
        if input._data.size == 0 and dim is None:
            raise IndexError(f"{name}(): Expected reduction dim to be specified for "
                             "input.numel() == 0.")
        _nonempty_extents(name, input, dim)
        if input._data.dtype.kind == "b":
            raise RuntimeError(f"{name}(): does not support bool input")
        return arg_op(input, dim=dim, keepdim=keepdim)

    f.__name__ = name
    f.__doc__ = f"As ``torch.{name}``: int64 indices; ``dim=None`` searches the flattened input."
    return f


argmax = _arg_public("argmax", argmax_op)
argmin = _arg_public("argmin", argmin_op)


def prod(input, dim=None, keepdim=False, *, dtype=None):
    """As ``torch.prod``: over everything or one ``dim``; correct gradients with zeros."""
    if dim is not None:
        if not isinstance(dim, int):
            raise TypeError(f"prod(): dim must be an int, got {type(dim).__name__}")
        dim = axes(dim, input.ndim, "prod")
        dim = dim[0] if dim else None
    np_dtype_ = dtypes.to_dtype(dtype).np if dtype is not None else (
        xp.int64 if input._data.dtype.kind in "biu" else None)
    return prod_op(input, dim=dim, keepdim=keepdim, dtype=np_dtype_)


def logsumexp(input, dim, keepdim=False):
    """As ``torch.logsumexp``: ``log(sum(exp(x), dim))``, stable for large inputs."""
    dims = (dim,) if isinstance(dim, int) else tuple(dim)
    if not dims:
        raise RuntimeError("logsumexp: dim must name at least one dimension")
    if input._data.dtype.kind in "iub":
        input = to_dtype(input, dtype=dtypes.get_default_dtype())
    return logsumexp_op(input, dims=axes(dims, input.ndim, "logsumexp"), keepdim=keepdim)


def norm(input, p="fro", dim=None, keepdim=False, dtype=None):
    """As ``torch.norm``: vector norms (``p`` = 2/'fro' by default, 1, inf, -inf, 0 or any
    number) over ``dim``; the 2-norm of a zero vector has a zero gradient.
    """
    if dtype is not None:
        dtype = dtypes.to_dtype(dtype)
        if input._data.dtype != dtype.np:
            input = to_dtype(input, dtype=dtype)
    if input._data.dtype.kind in "iub":
        raise RuntimeError("linalg.vector_norm: Expected a floating point or complex tensor as "
                           f"input. Got {input.dtype}")
    if isinstance(p, str):
        ndims = 0 if dim is None else 1 if isinstance(dim, int) else len(dim)
        if p != "fro" or ndims > 2:  # as torch.norm: 'fro' over all or <= 2 dims is the
            # vector 2-norm; otherwise a matrix norm (over 2 dims, else raises)
            from tapegrad.linalg import matrix_norm
            return matrix_norm(input, p, tuple(range(input.ndim)) if dim is None else dim,
                               keepdim)
        p = 2
    p = 2.0 if p is None else builtins.float(p)
    if input._data.size == 0 and (p < 0 or p == math.inf):  # max/min/1/x: no identity
        where = "an empty tensor because" if dim is None else None
        for d in () if dim is None else (dim,) if isinstance(dim, int) else dim:
            if input.shape[d] == 0:
                where = f"the dimension {d} because this dimension is empty and"
                break
        if where is not None:
            raise RuntimeError(f"norm: linalg.vector_norm cannot compute the {p:g} norm on "
                               f"{where} the operation does not have an identity (input "
                               f"shape {tuple(input.shape)})")
    return norm_op(input, p=p, dims=axes(dim, input.ndim, "norm"), keepdim=keepdim)


def cumsum(input, dim, *, dtype=None):
    """As ``torch.cumsum``: running sums along ``dim``; bool/int accumulate in int64."""
    d = axes(dim, input.ndim, "cumsum")
    np_dtype_ = dtypes.to_dtype(dtype).np if dtype is not None else (
        xp.int64 if input._data.dtype.kind in "biu" else None)
    return cumsum_op(input, dim=d[0] if d else 0, dtype=np_dtype_)


def _logical_public(name, logical_op):
    def f(input, dim=None, keepdim=False):
        return logical_op(input, dims=axes(dim, input.ndim, name), keepdim=keepdim)

    f.__name__ = name
    f.__doc__ = f"As ``torch.{name}``: bool result over ``dim`` (uint8 for uint8 input)."
    return f


all = _logical_public("all", all_op)
any = _logical_public("any", any_op)

# reductions count their FLOPs per element of the input, not of the (smaller) output
for _reduction in (sum_op, mean_op, var_op, std_op, prod_op, logsumexp_op, norm_op, all_op,
                   any_op):
    registry.per_input_element(_reduction)


__all__ = ["sum", "mean", "var", "std", "max", "min", "amax", "amin", "argmax", "argmin",
           "prod", "logsumexp", "norm", "cumsum", "all", "any"]
TENSOR_METHODS = __all__[:]
