"""Scans and differences: ``cumprod``, ``cummax``/``cummin``, ``logcumsumexp``, ``diff``,
``gradient``, ``trapezoid``/``trapz``, ``cumulative_trapezoid``.

``cumprod`` and ``logcumsumexp`` are ops whose gradient rules use registered ops only (the
rules call the ops themselves, so second order comes for free); the others are composites of
registered ops.
"""
import collections
import numbers
import operator

from tapegrad import dtypes
from tapegrad.ops import registry
from tapegrad.ops.elementwise import abs, exp, log, logical_xor, where_op
from tapegrad.ops.movement import _dim, broadcast_to_op, cat, flip_op, reshape_op
from tapegrad.ops.indexing import _grid, getitem, index_op
from tapegrad.ops.reduce import _cast_back, reverse_cumsum, sum_op
from tapegrad.ops.reduce import _cast_back, reverse_cumsum, sum_op
from tapegrad.ops.reduce import cumsum_op
from tapegrad.ops.registry import op, xp
from tapegrad.backend import array_module


def _data(a):
    return a._data if isinstance(a, registry.Tensor) else a


def _along(a, d, start=None, stop=None):
    """``a[..., start:stop]`` along dim ``d`` (a view op, so it records)."""
    return getitem(a, index=(slice(None),) * d + (slice(start, stop),))


# --- cumprod ---------------------------------------------------------------------------------
@op(flops=1, saves="both", name="cumprod")
def cumprod_op(a, dim, dtype=None):
    if a.ndim == 0:
        return a.astype(dtype or a.dtype)
    return xp.cumprod(a, axis=dim, dtype=dtype)


def _cumprod_grad_with_zeros(g, a, d):
    """``grad_k = sum_{j >= k} g_j prod_{m <= j, m != k} a_m``: exact where ``a`` has zeros,
    as PyTorch's backward (O(n^2), built from ops so that it records with create_graph)."""
    s, n = tuple(a.shape), a.shape[d]
    lifted_shape = s[:d] + (n,) + s[d:]
    lifted = broadcast_to_op(reshape_op(a, shape=s[:d] + (1,) + s[d:]), shape=lifted_shape)
    tail = (1,) * (len(s) - d - 1)
    eye = xp.eye(n, dtype=bool).reshape((n, n) + tail)
    upper = xp.triu(xp.ones((n, n), dtype=bool)).reshape((n, n) + tail)  # j >= k
    omitted = cumprod_op(where_op(eye, 1.0, lifted), dim=d + 1)  # [k, j]: a_k set to 1
    gj = reshape_op(g, shape=s[:d] + (1,) + s[d:])
    return sum_op(where_op(upper, omitted * gj, 0.0), dims=(d + 1,))


@cumprod_op.grad
def _(g, out, a, dim, dtype=None):
    g = _cast_back(g, a)
    if a.ndim == 0 or a.shape[dim] <= 1:
        return g
    from tapegrad.func._vmap import host  # under vmap: the decision for the physical batch

    if not (host(a) == 0).any():
        return reverse_cumsum(_cast_back(out, a) * g, dim=dim) / a
    return _cumprod_grad_with_zeros(g, a, dim)


@cumprod_op.jvp
def _(t, out, a, dim, dtype=None):
    # d out_j = sum_{k <= j} t_k prod_{m <= j, m != k} a_m; out * cumsum(t / a) without zeros
    t = t[0]
    if a.ndim == 0 or a.shape[dim] <= 1:
        return t
    from tapegrad.func._vmap import host

    if not (host(a) == 0).any():
        return _cast_back(out, a) * cumsum_op(t / a, dim=dim)
    s, n, d = tuple(a.shape), a.shape[dim], dim
    lifted = broadcast_to_op(reshape_op(a, shape=s[:d] + (1,) + s[d:]),
                             shape=s[:d] + (n,) + s[d:])
    tail = (1,) * (len(s) - d - 1)
    eye = xp.eye(n, dtype=bool).reshape((n, n) + tail)
    upper = xp.triu(xp.ones((n, n), dtype=bool)).reshape((n, n) + tail)  # j >= k
    omitted = cumprod_op(where_op(eye, 1.0, lifted), dim=d + 1)  # [k, j]: a_k set to 1
    tk = reshape_op(t, shape=s[:d] + (n, 1) + s[d + 1:])
    return sum_op(where_op(upper, omitted * tk, 0.0), dims=(d,))


def cumprod(input, dim, *, dtype=None):
    """As ``torch.cumprod``: running products along ``dim``; bool/int accumulate in int64.
    The gradient is exact where the input has zeros (PyTorch's rule).

    >>> tapegrad.cumprod(tapegrad.tensor([1., 2., 3.]), 0)       # tensor([1., 2., 6.])
    """
    d = _dim(dim, input.ndim, "cumprod")
    np_dtype_ = dtypes.to_dtype(dtype).np if dtype is not None else (
        xp.int64 if input._data.dtype.kind in "biu" else None)
    return cumprod_op(input, dim=d, dtype=np_dtype_)


# --- cummax / cummin ---------------------------------------------------------------------------
CummaxResult = collections.namedtuple("cummax", ["values", "indices"])
CumminResult = collections.namedtuple("cummin", ["values", "indices"])


def _running_extreme_index(a, d, ufunc):
    """PyTorch's running arg-extreme along ``d``: ties and NaN take the latest index (its
    kernel updates on ``x >= best`` (``<=`` for cummin) and on every NaN)."""
    best = ufunc.accumulate(a, axis=d)
    hit = a == best
    if a.dtype.kind not in "iub":
        hit |= xp.isnan(a) & xp.isnan(best)
    shape = [1] * a.ndim
    shape[d] = a.shape[d]
    pos = xp.where(hit, array_module(a).arange(a.shape[d]).reshape(shape), 0)
    return xp.maximum.accumulate(pos, axis=d).astype(xp.int64)


def _cum_extreme(name, ufunc, result):
    def fn(input, dim):
        d = _dim(dim, input.ndim, name)
        if input.ndim == 0:
            return result(input.clone(), registry.Tensor._make(xp.zeros((), xp.int64)))
        if input.shape[d] == 0:
            return result(input.clone(), registry.Tensor._make(xp.zeros(input.shape, xp.int64)))
        if getattr(input._data, "value", None) is not None:  # under tapegrad.func.vmap: the
            # indices of the physical batch, batched again; values gathered by an op
            from tapegrad.func._vmap import physical_array, rebatch
            from tapegrad.ops.reduce import take_along_reduce

            a = physical_array(input)
            idx = rebatch(_running_extreme_index(a, d + a.ndim - input.ndim, ufunc), input)
            return result(take_along_reduce(input, idx=idx, dim=d, keepdim=True), idx)
        idx = _running_extreme_index(input._data, d, ufunc)
        # the values are a gather at the indices: the gradient is PyTorch's scatter_add
        return result(index_op(input, index=_grid(idx, d), accumulate=True),
                      registry.Tensor._make(idx))

    fn.__name__ = name
    fn.__doc__ = (f"As ``torch.{name}``: ``(values, indices)`` of the running "
                  f"{name[3:]}imum along ``dim``; ties and NaN take the latest index, as "
                  f"PyTorch's kernel; the gradient goes to the picked entries.")
    return fn


cummax = _cum_extreme("cummax", xp.maximum, CummaxResult)
cummin = _cum_extreme("cummin", xp.minimum, CumminResult)


# --- logcumsumexp -----------------------------------------------------------------------------
@op(flops=12, saves="both", name="logcumsumexp")
def logcumsumexp_op(a, dim):
    if a.ndim == 0:
        return a.copy()
    return xp.logaddexp.accumulate(a, axis=dim)


def _reverse_logcumsumexp(x, d):
    return flip_op(logcumsumexp_op(flip_op(x, dims=(d,)), dim=d), dims=(d,))


@logcumsumexp_op.grad
def _(g, out, a, dim):
    if a.ndim == 0:
        return g
    # PyTorch's stable rule: positive and negative parts of g, each summed in log space
    dt = _data(g).dtype
    low = dtypes.bfloat16 is not None and dt == dtypes.bfloat16.np  # numpy's finfo: no bf16
    lowest = float((dtypes._ml_dtypes.finfo if low else xp.finfo)(dt).min)
    with xp.errstate(divide="ignore", over="ignore"):  # lowest - out may round to -inf
        log_abs = log(abs(g))
        from tapegrad.func._vmap import host, like  # under vmap: batched conditions

        pos = where_op(like(host(g) > 0, g), log_abs, lowest)
        neg = where_op(like(host(g) < 0, g), log_abs, lowest)
        return (exp(_reverse_logcumsumexp(pos - out, dim) + a)
                - exp(_reverse_logcumsumexp(neg - out, dim) + a))


@logcumsumexp_op.jvp
def _(t, out, a, dim):
    # PyTorch's logcumsumexp_jvp: cumsum(e t) / cumsum(e), e = exp(a - max), 0 where the
    # running sum underflows below 1e-13
    if a.ndim == 0:
        return t[0]
    from tapegrad.func._vmap import host, like  # under vmap: the physical batch's values

    ha = host(a)
    e = exp(a - like(xp.max(ha, axis=dim + ha.ndim - a.ndim, keepdims=True), a))
    running = cumsum_op(e, dim=dim)
    tiny = like(host(running) < 1e-13, running)
    return where_op(tiny, 0.0, cumsum_op(e * t[0], dim=dim) / where_op(tiny, 1.0, running))


def logcumsumexp(input, dim):
    """As ``torch.logcumsumexp``: ``log(cumsum(exp(input)))`` along ``dim``, without
    overflow (floating-point input, as PyTorch's CPU kernel)."""
    d = _dim(dim, input.ndim, "logcumsumexp")
    if input._data.dtype.kind in "iub":
        raise NotImplementedError(f'"logcumsumexp_out_cpu" not implemented for {input.dtype} '
                                  f"(logcumsumexp takes floating-point input)")
    return logcumsumexp_op(input, dim=d)


# --- differences and integration ------------------------------------------------------------
def diff(input, n=1, dim=-1, prepend=None, append=None):
    """As ``torch.diff``: the ``n``-th forward difference along ``dim`` (``logical_xor`` for
    bool), after concatenating ``prepend`` and ``append``.

    >>> tapegrad.diff(tapegrad.tensor([1, 3, 6]))                   # tensor([2, 3])
    """
    if input.ndim == 0:
        raise RuntimeError("diff expects input to be at least one-dimensional")
    n = operator.index(n)
    if n < 0:
        raise RuntimeError(f"order must be non-negative but got {n}")
    d = _dim(dim, input.ndim, "diff")
    parts = []
    for what, t in (("prepend", prepend), ("input", input), ("append", append)):
        if t is None:
            continue
        if not isinstance(t, registry.Tensor):
            raise TypeError(f"diff(): argument '{what}' must be Tensor, not {type(t).__name__}")
        if t.ndim != input.ndim:
            raise RuntimeError("diff expects prepend or append to be the same dimension as "
                               f"input (input {tuple(input.shape)}, {what} "
                               f"{tuple(t.shape)})")
        parts.append(t)
    x = cat(parts, d) if len(parts) > 1 else input
    for _ in range(min(n, x.shape[d])):
        hi, lo = _along(x, d, 1), _along(x, d, 0, -1)
        x = logical_xor(hi, lo) if x._data.dtype.kind == "b" else hi - lo
    return x


def _check_not_bool(name, *ts):
    for t in ts:
        if isinstance(t, registry.Tensor) and t._data.dtype.kind == "b":
            raise RuntimeError(f"{name}: received a bool input, but bool is not supported")


def _zeros_except(y, d):
    shape = tuple(y.shape[:d]) + tuple(y.shape[d + 1:])
    return registry.Tensor._make(xp.zeros(shape, y._data.dtype))


def _dx_from_x(name, y, x, d):
    """The spacings ``x[1:] - x[:-1]`` along ``d``, shaped to broadcast with ``y``'s
    differences (a 1-d ``x`` lies along ``d``; a shorter ``x`` is padded with leading 1s)."""
    if x.ndim == 1:
        if x.shape[0] != y.shape[d]:
            raise RuntimeError(f"{name}: There must be one `x` value for each sample point "
                               f"(x has {x.shape[0]}, y has {y.shape[d]} along dim {d})")
        shape = [1] * y.ndim
        shape[d] = x.shape[0]
        x = reshape_op(x, shape=tuple(shape))
    elif x.ndim < y.ndim:
        x = reshape_op(x, shape=(1,) * (y.ndim - x.ndim) + tuple(x.shape))
    return _along(x, d, 1) - _along(x, d, 0, -1)


def _check_dx(name, dx):
    if isinstance(dx, (bool, complex)) or not isinstance(dx, numbers.Real):
        raise RuntimeError(f"{name}: Currently, we only support dx as a real number.")
    return float(dx)


def trapezoid(y, x=None, *, dx=None, dim=-1):
    """As ``torch.trapezoid``: the trapezoidal rule along ``dim``, with sample points ``x``
    or a constant spacing ``dx`` (default 1).

    >>> tapegrad.trapezoid(tapegrad.tensor([1., 2., 3.]))           # tensor(4.)
    """
    d = _dim(dim, y.ndim, "trapezoid")
    if x is not None and dx is not None:
        raise RuntimeError("trapezoid: pass either x or dx, not both")
    if y.shape[d] == 0:
        return _zeros_except(y, d)
    if isinstance(x, registry.Tensor):
        _check_not_bool("trapezoid", y, x)
        spacing = _dx_from_x("trapezoid", y, x, d)
        return sum_op(spacing * (_along(y, d, 1) + _along(y, d, 0, -1)), dims=(d,)) / 2.0
    _check_not_bool("trapezoid", y)
    h = _check_dx("trapezoid", 1 if x is None and dx is None else dx if dx is not None else x)
    s = y.sum(d)
    ends = getitem(y, index=(slice(None),) * d + (0,)) + getitem(y, index=(slice(None),) * d
                                                                  + (-1,))
    return (s - ends * 0.5) * h


def trapz(y, x=None, *, dx=None, dim=-1):
    """As ``torch.trapz``: ``trapezoid``."""
    return trapezoid(y, x, dx=dx, dim=dim)


def cumulative_trapezoid(y, x=None, *, dx=None, dim=-1):
    """As ``torch.cumulative_trapezoid``: the running trapezoidal integral along ``dim`` (one
    entry fewer than ``y``)."""
    d = _dim(dim, y.ndim, "cumulative_trapezoid")
    if x is not None and dx is not None:
        raise RuntimeError("cumulative_trapezoid: pass either x or dx, not both")
    pair = _along(y, d, 0, -1) + _along(y, d, 1)
    if isinstance(x, registry.Tensor):
        _check_not_bool("cumulative_trapezoid", y, x)
        if y.shape[d] == 0:
            return y.clone()
        spacing = _dx_from_x("cumulative_trapezoid", y, x, d)
        return (spacing / 2.0 * pair).cumsum(d)
    _check_not_bool("cumulative_trapezoid", y)
    h = _check_dx("cumulative_trapezoid",
                  1 if x is None and dx is None else dx if dx is not None else x)
    return (h / 2.0 * pair).cumsum(d)


def _prepend_append(center, prepend, append, d):
    return cat([prepend, center, append], d)


def gradient(input, *, spacing=1, dim=None, edge_order=1):
    """As ``torch.gradient``: second-order central differences in the interior and first- or
    second-order (``edge_order``) one-sided ones at the edges, one tensor per dim. ``spacing``
    is a number, a list of numbers (one per dim) or a list of coordinate tensors.

    >>> tapegrad.gradient(tapegrad.tensor([1., 4., 9.]))       # (tensor([3., 4., 5.]),)
    """
    if edge_order not in (1, 2):
        raise RuntimeError("torch.gradient only supports edge_order=1 and edge_order=2.")
    if dim is None:
        dims = list(range(input.ndim))
        where_dims = "since dim argument was not given"
    else:
        dims = [dim] if isinstance(dim, int) else list(dim)
        where_dims = f"since dim argument was given as {dim}"
    dims = [_dim(d, input.ndim, "gradient") for d in dims]
    if len(set(dims)) != len(dims):
        raise RuntimeError(f"torch.gradient: dim {dim} appears multiple times in the list of "
                           f"dims")
    if isinstance(spacing, registry.Tensor) and spacing.ndim == 0:
        spacing = spacing.item()
    if isinstance(spacing, (list, tuple)):
        spacing = list(spacing)
        if len(spacing) != len(dims):
            raise RuntimeError(
                f"torch.gradient expected spacing to be unspecified, a scalar or a list of "
                f"length equal to 'self.dim() = {input.ndim}', {where_dims}, but got a list "
                f"of length {len(spacing)}")
    else:
        spacing = [spacing] * len(dims)
    for d in dims:
        if input.shape[d] < edge_order + 1:
            raise RuntimeError(
                "torch.gradient expected each dimension size to be at least edge_order+1 "
                f"(dim {d} of input {tuple(input.shape)} has size {input.shape[d]})")
    out = []
    for d, h in zip(dims, spacing):
        def sl(start, stop=None):
            return _along(input, d, start, stop)

        if isinstance(h, registry.Tensor):
            if h.ndim != 1 or h.shape[0] != input.shape[d]:
                raise RuntimeError(
                    f"torch.gradient expected each tensor to be on the same device and to "
                    f"have one coordinate per entry of dim {d} (got shape {tuple(h.shape)} "
                    f"for size {input.shape[d]})")
            shape = [1] * input.ndim
            shape[d] = -1
            ax = _along(h, 0, 1) - _along(h, 0, 0, -1)
            dx1, dx2 = _along(ax, 0, 0, -1), _along(ax, 0, 1)
            a = reshape_op(-dx2 / (dx1 * (dx1 + dx2)), shape=tuple(shape))
            b = reshape_op((dx2 - dx1) / (dx1 * dx2), shape=tuple(shape))
            c = reshape_op(dx1 / (dx2 * (dx1 + dx2)), shape=tuple(shape))
            center = a * sl(0, -2) + b * sl(1, -1) + c * sl(2)
            if edge_order == 1:
                prepend = (sl(1, 2) - sl(0, 1)) / ax[0]
                append = (sl(-1) - sl(-2, -1)) / ax[-1]
            else:
                a = -(2.0 * ax[0] + ax[1]) / (ax[0] * (ax[0] + ax[1]))
                b = (ax[0] + ax[1]) / (ax[0] * ax[1])
                c = (-ax[0]) / (ax[1] * (ax[0] + ax[1]))
                prepend = a * sl(0, 1) + b * sl(1, 2) + c * sl(2, 3)
                a = ax[-1] / (ax[-2] * (ax[-1] + ax[-2]))
                b = -(ax[-1] + ax[-2]) / (ax[-1] * ax[-2])
                c = (2 * ax[-1] + ax[-2]) / (ax[-1] * (ax[-1] + ax[-2]))
                append = a * sl(-3, -2) + b * sl(-2, -1) + c * sl(-1)
            out.append(_prepend_append(center, prepend, append, d))
            continue
        center = (sl(2) - sl(0, -2)) / h
        if edge_order == 1:
            prepend = (sl(1, 2) - sl(0, 1)) / h
            append = (sl(-1) - sl(-2, -1)) / h
        else:
            prepend = (sl(0, 1) * -1.5 + sl(1, 2) * 2 - sl(2, 3) * 0.5) / h
            append = (sl(-3, -2) * 0.5 + sl(-2, -1) * -2 + sl(-1) * 1.5) / h
        out.append(_prepend_append(center / 2, prepend, append, d))
    return tuple(out)


__all__ = ["cumprod", "cummax", "cummin", "logcumsumexp", "diff", "gradient", "trapezoid",
           "trapz", "cumulative_trapezoid"]
TENSOR_METHODS = ["cumprod", "cummax", "cummin", "logcumsumexp", "diff"]
INPLACE = ["cumprod"]
