"""Indexing ops: ``Tensor.__getitem__``/``__setitem__``'s keys (``index_key``: PyTorch's
index forms as one tuple numpy understands, with PyTorch's errors), the primitives ``getitem``
(basic indexing, a view), ``index`` (integer-array and mask indexing), ``index_backward``
and ``index_put``, the gather family expressed through them (``gather``, ``scatter_add``,
``index_select``, ``take_along_dim``) and the index checks (``out_of_range``: the one range
check of the index-taking ops). Split out of ``movement.py``, whose shape ops these use.
"""
import math
import operator
import warnings

from tapegrad.autograd import engine as _engine
from tapegrad.autograd.grad_mode import state as grad_state
from tapegrad.ops.registry import op, xp
from tapegrad.backend import array_module, add_at, sum_rows
from tapegrad.backend.scatter import take as take_slices
from tapegrad.ops import registry as _registry
from tapegrad.ops.movement import (_check_tensor, _dim, constant_pad, expand, permute_op,
                                   reshape_op, sum_to)
from tapegrad.ops import elementwise as _E


# --- indexing: one key format (a tuple numpy understands, normalised by ``index_key``) ---
@op(saves="none", view=True, name="getitem", linear=True)
def getitem(a, index):
    """Basic indexing (ints, slices, None, Ellipsis): a view, as in numpy and PyTorch."""
    return a[index]


@getitem.grad(traces=True)
def _(g, out, a, index):
    return index_backward(g, shape=a.shape, index=index, accumulate=False)


@op(saves="none", name="index", linear=True)
def index_op(a, index, accumulate=True):
    """Integer-array / mask indexing (a copy). ``accumulate``: the index may repeat elements."""
    taken = take_slices(a, index)  # rows of one index array: numpy's take, 4-7x faster
    return a[index] if taken is None else taken


@index_op.grad(traces=True)
def _(g, out, a, index, accumulate=True):
    return index_backward(g, shape=a.shape, index=index, accumulate=accumulate)


@op(saves="none", linear=True)
def index_backward(g, shape, index, accumulate=True):
    """``zeros(shape)`` with ``g`` put at ``index``; repeated indices add (``np.add.at``)."""
    if accumulate and len(index) == 2 and index[1] is Ellipsis and type(g) is xp.ndarray \
            and g.dtype.kind == "f" and isinstance(index[0], xp.ndarray) \
            and index[0].dtype.kind in "iu":  # (a device's g: its add_at)
        return _add_rows(g, shape, index[0])
    out = array_module(g).zeros(shape, dtype=g.dtype)
    if accumulate:
        add_at(out, index, g)
    else:
        out[index] = g
    return out


def _add_rows(g, shape, rows):
    """``zeros(shape)`` with the rows of ``g`` added at ``rows`` (x[idx]'s gradient, as in an
    embedding): each sum in float64 from 0.0 in index order, rounded once to ``g``'s dtype
    (``backend.sum_rows``: bincount's bits, numba's loop when installed)."""
    width = math.prod(shape[1:])
    out = sum_rows(g.reshape(rows.size, width), rows.reshape(-1), shape[0])
    return out.astype(g.dtype, copy=False).reshape(shape)


@index_backward.grad(traces=True)
def _(g, out, a, shape, index, accumulate=True):
    return _take(g, index, accumulate)


def _take(a, index, accumulate, basic=False):
    if basic:
        return getitem(a, index=index)
    return index_op(a, index=index, accumulate=accumulate)


@op(saves="none", needs=True, name="index_put", linear=True)
def index_put_op(a, v, index, accumulate=False, basic=False):
    """A copy of ``a`` with ``a[index] = v`` (or ``+= v``, repeats adding, if ``accumulate``)."""
    out = a.copy()
    if accumulate:
        if isinstance(v, xp.ndarray) and v.dtype != a.dtype:
            v = v.astype(a.dtype)
        add_at(out, index, v)
    else:
        out[index] = v
    return out


@index_put_op.grad(traces=True)
def _(g, out, a, v, index, accumulate=False, basic=False, needs=(True, True)):
    ga = gv = None
    if needs[0]:
        ga = g if accumulate else index_put_op(g, 0, index=index, basic=basic)
    if needs[1]:
        gv = _take(g, index, True, basic)
        shape = tuple(v.shape)
        lead = len(shape) - gv.ndim  # v may carry extra leading 1s
        core = shape[lead:] if lead > 0 else shape
        if tuple(gv.shape) != core:
            gv = sum_to(gv, shape=core)
        if lead > 0:
            gv = reshape_op(gv, shape=shape)
        if _E.np_dtype(gv.dtype) != _E.np_dtype(v.dtype):
            gv = _E.to_dtype(gv, dtype=_E.np_dtype(v.dtype))
    return ga, gv


@index_put_op.jvp
def _(t, out, a, v, index, accumulate=False, basic=False):
    # linear in (a, v); a constant v (a number, an array, a tangent-less tensor) writes 0
    ta = t[0] if t[0] is not None else xp.zeros(tuple(a.shape), _E.np_dtype(a.dtype))
    tv = t[1] if len(t) > 1 and t[1] is not None else 0
    return index_put_op(ta, tv, index=index, accumulate=accumulate, basic=basic)


def _index_array(index, name):
    """An integer index argument (Tensor, ndarray or list) as a backend integer array."""
    data = index._data if isinstance(index, _registry.Tensor) else xp.asarray(index)
    if data.dtype != xp.int64 and data.dtype != xp.int32:  # as PyTorch: no int8/int16/uint8
        if data.size == 0 and data.dtype.kind == "f" and not isinstance(index, _registry.Tensor):
            return data.astype(xp.int64)
        raise RuntimeError(f"{name}(): Expected dtype int32/int64 for index, got {data.dtype}")
    return data


def _batched(idx):
    """Whether an index array is vmap's placeholder (``func._vmap.BatchedArray``): it holds no
    values (numpy indexing with it would read zeros), so the index must stay a Tensor that
    ops take."""
    return getattr(idx, "value", None) is not None


def _physical(idx):
    """A vmap-batched index array's values (``func._vmap.BatchedArray``: the placeholder holds
    none): the physical batch, level by level; any other array as it is."""
    value = getattr(idx, "value", None)
    while value is not None:
        idx = value._data
        value = getattr(idx, "value", None)
    return idx


def out_of_range(idx, n):
    """The first index of an integer array outside [0, n) (the smallest if any is negative,
    else the largest), or None. The one range check of the index-taking ops: a single
    reduction when all are in range, since a negative int viewed as unsigned is >= 2**63."""
    idx = _physical(idx)  # a vmap-batched index: every example's indices
    if idx.size == 0:
        return None
    if idx.dtype.kind == "i":
        if idx.view(f"u{idx.dtype.itemsize}").max() < n:
            return None
    elif idx.max() < n:
        return None
    lo = idx.min()
    return int(lo) if lo < 0 else int(idx.max())


_ERRORS = {"IndexError": IndexError, "RuntimeError": RuntimeError}


@op(saves="none", differentiable=False, check=True)
def check_index(idx, n, message, error="IndexError", ignore=None, negative=False):
    """``idx`` itself once every entry (those equal to ``ignore`` aside) lies in [0, n) (with
    ``negative``: [-n, n)), else ``error`` with ``message.format(bad)``; ``bad``:
    ``out_of_range``'s, or with ``ignore`` the first offending entry. An op so that a compiled
    graph checks each call's indices (numpy would wrap a negative one around where eager
    raises); params are literals the printout shows. A vmap-batched ``idx`` is checked over
    its physical batch (every example's indices)."""
    values = _physical(idx)
    if negative:
        bad = out_of_range(values + n, 2 * n)
        if bad is not None:
            raise _ERRORS[error](message.format(bad - n))
        return idx
    bad = out_of_range(values, n)
    if bad is not None and ignore is not None:
        safe = values[values != ignore]
        wrong = safe[(safe < 0) | (safe >= n)]
        bad = int(wrong[0]) if wrong.size else None
    if bad is not None:
        raise _ERRORS[error](message.format(bad))
    return idx


@check_index.batch
def _(args, bdims, **params):
    return check_index(args[0], **params), bdims[0]  # every example's indices at once


def _simplex(v):
    # a probability vector along the last dim: entries >= 0, sum within 1e-6 of 1 (the
    # tolerance of ``distributions.constraints.simplex``)
    return (v >= 0).all(-1) & (abs(v.sum(-1) - 1) < 1e-6)


# check_values' predicates: the entries (or last-dim vectors) that pass
PREDICATES = {
    "real": lambda v: v == v,
    "finite": lambda v: xp.isfinite(v),
    "positive": lambda v: v > 0,
    "nonnegative": lambda v: v >= 0,
    "unit_interval": lambda v: (v >= 0) & (v <= 1),
    "boolean": lambda v: (v == 0) | (v == 1),
    "nonnegative_integer": lambda v: (v % 1 == 0) & (v >= 0),
    "positive_integer": lambda v: (v % 1 == 0) & (v >= 1),
    "simplex": _simplex,
}
_LAST_DIM = frozenset({"simplex"})  # predicates over last-dim vectors, not entries
_ERRORS["ValueError"] = ValueError


@op(saves="none", check=True)
def check_values(x, predicate, message, error="ValueError", nan_ok=False, show=False):
    """``x`` itself once every entry satisfies ``predicate`` (a name in ``PREDICATES``; with
    ``nan_ok`` a nan entry passes too), else ``error`` with ``message`` followed, by ``show``,
    by ``x``'s printout (True), that of its failing entries ("invalid") or nothing (False). An op so that a compiled graph checks each call's values as
    eager does; params are literals the printout shows. A vmap-batched ``x`` is checked over
    its physical batch."""
    v = _physical(x)
    if predicate not in PREDICATES:
        raise ValueError(f"check_values: unknown predicate {predicate!r} (one of "
                         f"{sorted(PREDICATES)})")
    ok = PREDICATES[predicate](v)
    if nan_ok and predicate not in _LAST_DIM:
        ok = ok | (v != v)
    if not bool(xp.all(ok)):
        if show:
            shown = v[~ok] if show == "invalid" else v
            message = f"{message}{_registry.Tensor._make(xp.asarray(shown))}"
        raise _ERRORS[error](message)
    return x


@check_values.grad
def _(g, out, x, **params):
    return g  # the identity: the checked value flows on as it is


@check_values.jvp
def _(t, out, x, **params):
    return t[0]  # (a tangent is not checked: only the primal's values must pass)


@check_values.batch
def _(args, bdims, **params):
    x, b = args[0], bdims[0]
    if b is not None and b != 0 and params["predicate"] in _LAST_DIM:
        # every example's last-dim vectors: the batch dim goes in front
        x = permute_op(x, dims=(b,) + tuple(k for k in range(len(x.shape)) if k != b))
        b = 0
    return check_values(x, **params), b


def value_checked(tensor, predicate, message, error="ValueError", nan_ok=False, show=False):
    """``tensor`` once ``check_values`` passed on it. Eagerly (vmap included) the check reads
    the array (no node); under the compiler's tracer (or its replay) it goes through the op
    and its result stands for ``tensor``, so each compiled call checks its own values."""
    if grad_state.modes and recorder() is not None:
        return check_values(tensor, predicate=predicate, message=message, error=error,
                            nan_ok=nan_ok, show=show)
    check_values.forward(tensor._data, predicate, message, error, nan_ok, show)
    return tensor


def recorder():
    """The active interpreter that records array code as graph nodes (the compiler's tracer),
    or None."""
    for m in reversed(grad_state.modes):
        if hasattr(m, "array_fn"):
            return m
    return None


def range_checked(index, idx, n, message, error="IndexError", ignore=None, negative=False):
    """``(index, idx)`` once ``check_index`` passed on ``idx`` (``index``'s integer array).
    Under the compiler's tracer (or its replay) a Tensor index goes through the op and both
    stand for its result, which every later node must read: no node reads the indices
    before the check."""
    if isinstance(index, _registry.Tensor) and grad_state.modes and recorder() is not None:
        index = check_index(index, n=n, message=message, error=error, ignore=ignore,
                            negative=negative)
        return index, index._data
    check_index.forward(idx, n, message, error, ignore, negative)
    return index, idx


def _out_of_bounds(idx, n):
    """The first index in ``idx`` outside [-n, n), or None."""
    if idx.size == 0:
        return None
    lo, hi = idx.min(), idx.max()
    if lo >= -n and hi < n:
        return None
    return int(lo) if lo < -n else int(hi)


# --- gather, scatter and friends: advanced indexing with an open grid ---------------------
def _grid(idx, d):
    """The advanced-index key that picks ``a[..., idx[i, j, k], ...]`` along dim ``d``."""
    nd, m = idx.ndim, array_module(idx)
    key = tuple(idx if k == d else m.arange(n).reshape((1,) * k + (n,) + (1,) * (nd - k - 1))
                for k, n in enumerate(idx.shape))
    if _engine.WATCH:  # the aranges depend on shapes only: a mode (the compiler's tracer)
        mode = _engine.observer("index_grid")  # keeps them as constants of its graph
        if mode is not None:
            mode.index_grid(key, d)
    return key


def _check_index_shape(input, d, idx, name):
    if idx.ndim != max(input.ndim, 1) and not (idx.ndim == 0 and input.ndim <= 1):
        raise RuntimeError(f"{name}(): Index tensor must have the same number of dimensions as "
                           f"input tensor (index {tuple(idx.shape)}, input "
                           f"{tuple(input.shape)})")
    shape = input.shape if input.ndim else (1,)
    for k in range(idx.ndim):
        if k != d and idx.shape[k] > shape[k]:
            raise RuntimeError(
                f"{name}(): Size does not match at dimension {k} expected index "
                f"{list(idx.shape)} to be no larger than self {list(input.shape)} apart from "
                f"dimension {d}")


def _check_gather_bounds(index, idx, n, d, name):
    """``idx`` once in range (``range_checked``)."""
    return _gather_checked(index, idx, n, d, name)[1]


def _gather_checked(index, idx, n, d, name):
    """``(index, idx)`` once in range (``range_checked``): the Tensor too, which a batched
    index stays (ops take it)."""
    return range_checked(index, idx, n, f"{name}(): index {{}} is out of bounds for dimension "
                         f"{d} with size {n}", "RuntimeError")


def _gather_batched(input, d, index, name):
    """``gather`` with indices batched by vmap: ``take_along_reduce`` with the index Tensor
    as its ``idx`` param, whose batch rule puts the batch in front of both operands; the
    range check reads the physical batch (or, traced, is a node)."""
    from tapegrad.ops.reduce import take_along_reduce

    n = input.shape[d] if input.ndim else 1
    index = _gather_checked(index, index._data, n, d, name)[0]
    if input.ndim == 0 or index.ndim == 0:
        flat = reshape_op(input, shape=(1,)) if input.ndim == 0 else input
        out = _gather_batched(flat, 0, reshape_op(index, shape=(1,) * flat.ndim), name)
        return reshape_op(out, shape=tuple(index.shape))
    if any(m != s for k, (m, s) in enumerate(zip(index.shape, input.shape)) if k != d):
        # only input[:index.shape] (dim d whole) takes part; take_along needs equal shapes
        input = getitem(input, index=tuple(slice(None) if k == d else slice(0, m)
                                           for k, m in enumerate(index.shape)))
    return take_along_reduce(input, idx=index, dim=d, keepdim=True)


def gather(input, dim, index, *, sparse_grad=False):
    """As ``torch.gather``: ``out[i][j] = input[index[i][j]][j]`` for ``dim=0``."""
    idx = _index_array(index, "gather")
    d = _dim(dim, input.ndim, "gather")
    _check_index_shape(input, d, idx, "gather")
    if _batched(idx):
        return _gather_batched(input, d, index, "gather")
    idx = _check_gather_bounds(index, idx, input.shape[d] if input.ndim else 1, d, "gather")
    if input.ndim == 0 or idx.ndim == 0:
        flat = reshape_op(input, shape=(1,)) if input.ndim == 0 else input
        out = gather(flat, 0, idx.reshape((1,) * flat.ndim))
        return reshape_op(out, shape=idx.shape)
    return index_op(input, index=_grid(idx, d), accumulate=True)


def scatter_add(input, dim, index, src):
    """As ``torch.scatter_add`` (out of place): ``out[index[i][j]][j] += src[i][j]`` for
    ``dim=0``; the gradient to ``src`` is a gather."""
    _check_tensor(src, "scatter_add", "src")
    idx = _index_array(index, "scatter_add")
    d = _dim(dim, input.ndim, "scatter_add")
    if input.dtype is not src.dtype:
        raise RuntimeError(f"scatter_add(): Expected self.dtype to be equal to src.dtype "
                           f"(got {input.dtype} and {src.dtype})")
    _check_index_shape(input, d, idx, "scatter_add")
    if idx.ndim != src.ndim or any(i > s for i, s in zip(idx.shape, src.shape)):
        raise RuntimeError(f"scatter_add(): Expected index {list(idx.shape)} to be no larger "
                           f"than self {list(input.shape)} apart from dimension {d} and to be "
                           f"no larger size than src {list(src.shape)}")
    if input.ndim == 0:
        out = scatter_add(reshape_op(input, shape=(1,)), 0, idx.reshape(1),
                          reshape_op(src, shape=(1,)))
        return reshape_op(out, shape=())
    index, idx = _gather_checked(index, idx, input.shape[d], d, "scatter_add")
    if src.shape != idx.shape:  # only src[:index.shape] takes part
        src = getitem(src, index=tuple(slice(0, n) for n in idx.shape) + (Ellipsis,))
    if _batched(idx):  # each example's indices: put_along (an op taking the index Tensor,
        # batched by its rule) over the indexed region, padded with zeros to input's shape
        from tapegrad.ops.reduce import put_along

        region = tuple(input.shape[d] if k == d else m for k, m in enumerate(idx.shape))
        part = put_along(src, idx=index, shape=region, dim=d, keepdim=True)
        if region != tuple(input.shape):
            part = constant_pad(part, widths=tuple((0, n - m) for n, m in
                                                   zip(input.shape, region)))
        return _E.add(input, part)
    return index_put_op(input, src, index=_grid(idx, d), accumulate=True)


def index_select(input, dim, index):
    """As ``torch.index_select``: the entries of ``index`` (a vector) along ``dim``."""
    idx = _index_array(index, "index_select")
    if idx.ndim > 1:
        raise IndexError(f"index_select(): Index is supposed to be a vector (got shape "
                         f"{tuple(idx.shape)})")
    d = _dim(dim, input.ndim, "index_select")
    n = input.shape[d] if input.ndim else 1
    if idx.size:
        if n == 0 and input.ndim > 1:
            raise RuntimeError(f"index_select(): self indexing axis dim should be positive "
                               f"(dimension {d} of input {tuple(input.shape)} has size 0, index "
                               f"has {idx.size} entries)")
        # PyTorch's CPU kernels raise IndexError, but RuntimeError on their dim-1 and
        # empty-input paths
        exc = "RuntimeError" if input.ndim > 1 and (d == 1 or input.numel() == 0) else \
            "IndexError"
        index, idx = range_checked(index, idx, n, f"index_select(): index {{}} is out of "
                                   f"range for dimension {d} with size {n}", exc)
    if _batched(idx):  # each example's indices: a gather along d, through ops
        flat = reshape_op(input, shape=(1,)) if input.ndim == 0 else input
        k = idx.size
        shape = tuple(k if j == d else m for j, m in enumerate(flat.shape))
        along = reshape_op(index, shape=tuple(k if j == d else 1 for j in range(flat.ndim)))
        out = _gather_batched(flat, d, expand(along, shape), "index_select")
        return reshape_op(out, shape=()) if input.ndim == 0 else out
    if input.ndim == 0:
        return reshape_op(index_op(reshape_op(input, shape=(1,)), index=(idx, Ellipsis)),
                          shape=())
    return index_op(input, index=(slice(None),) * d + (idx.reshape(-1), Ellipsis))


def take_along_dim(input, indices, dim=None):
    """As ``torch.take_along_dim``: gather along ``dim`` after broadcasting input and indices;
    with ``dim``, indices are taken modulo the size of ``dim`` (PyTorch 2.13 wraps every
    index, not only negative ones); without ``dim``, a gather from the flattened tensor, where
    any index outside [0, numel) raises."""
    idx = _index_array(indices, "take_along_dim")
    if dim is None:
        if _batched(idx):  # a Tensor through ops (reshaping the placeholder drops its batch)
            return _gather_batched(reshape_op(input, shape=(-1,)), 0,
                                   reshape_op(indices, shape=(-1,)), "take_along_dim")
        idx = _check_gather_bounds(indices, idx, input.numel(), 0, "take_along_dim")
        return gather(reshape_op(input, shape=(-1,)), 0, idx.reshape(-1))
    if idx.dtype != xp.int64:
        raise RuntimeError(f"take_along_dim(): dtype of indices should be int64 (Long) but got "
                           f"{idx.dtype}")
    d = _dim(dim, input.ndim, "take_along_dim")
    if idx.ndim != input.ndim:
        raise RuntimeError(f"take_along_dim(): input and indices should have the same number of "
                           f"dimensions, but got {input.ndim} dimensions for input, and "
                           f"{idx.ndim} dimensions for indices")
    wanted = list(input.shape)
    wanted[d] = idx.shape[d]
    have = list(idx.shape)
    have[d] = input.shape[d]
    try:
        idx_shape = xp.broadcast_shapes(tuple(wanted), idx.shape)
        in_shape = xp.broadcast_shapes(tuple(have), input.shape)
    except ValueError:
        raise RuntimeError(f"take_along_dim(): input of shape {tuple(input.shape)} and indices "
                           f"of shape {tuple(idx.shape)} cannot be broadcast apart from dimension "
                           f"{d}") from None
    n = input.shape[d]
    if _batched(idx):  # the broadcast and the wrap as ops on the Tensor: no host read
        if n == 0 and math.prod(idx_shape):  # every index is out of range: the error below
            _wrap_by_zero(idx_shape, d, input)
        indices = expand(indices, idx_shape)
        if n:
            indices = _E.remainder(indices, n)
        return gather(expand(input, in_shape), d, indices)
    idx = xp.broadcast_to(idx, idx_shape)
    if out_of_range(idx, n) is not None:
        if n == 0:
            _wrap_by_zero(idx.shape, d, input)
        idx = idx % n
    return gather(expand(input, in_shape), d, idx)


def _wrap_by_zero(idx_shape, d, input):
    raise RuntimeError(f"take_along_dim(): ZeroDivisionError: indices {tuple(idx_shape)} taken "
                       f"modulo the size 0 of dimension {d} of input {tuple(input.shape)}")


# --- Tensor.__getitem__ and index_put (which Tensor.__setitem__ uses) ----------------------
_INDEX_TYPES_MSG = ("only integers, slices (`:`), ellipsis (`...`), None and long or byte "
                    "Variables are valid indices")


def _sequence_as_tuple(index):
    # PyTorch's (and old numpy's) heuristic: a short list holding sequences, tensors,
    # slices, None or Ellipsis is a tuple of indices, not one integer-array index
    if len(index) >= 32:
        return False
    for i in index:
        if isinstance(i, (_registry.Tensor, list, tuple, slice, xp.ndarray)) or i is None \
                or i is Ellipsis:
            return True
    return False


def _index_item(i):
    """One index entry as (entry, kind, dims consumed): kind 0 basic, 1 mask, 2 int array."""
    if i is None:
        return None, 0, 0
    if i is Ellipsis:
        return i, 0, 0
    if isinstance(i, slice):
        step = i.step
        if step is not None and operator.index(step) <= 0:
            raise ValueError("slice step cannot be zero" if operator.index(step) == 0 else
                             "step must be greater than zero")
        return slice(None if i.start is None else operator.index(i.start),
                     None if i.stop is None else operator.index(i.stop),
                     None if step is None else operator.index(step)), 0, 1
    if isinstance(i, (bool, xp.bool_)):
        return xp.asarray(bool(i)), 1, 0
    if isinstance(i, _registry.Tensor):
        data = i._data
    elif isinstance(i, (int, xp.integer)):
        return int(i), 0, 1
    elif isinstance(i, (list, tuple, range, xp.ndarray)):  # a range: as a list (PyTorch)
        data = xp.asarray(i)
        if data.size == 0 and data.dtype.kind == "f":
            data = data.astype(xp.int64)
    else:
        try:
            return operator.index(i), 0, 1
        except TypeError:
            raise IndexError(f"{_INDEX_TYPES_MSG} (got {type(i).__name__})") from None
    kind = data.dtype.kind
    if kind == "b" or data.dtype == xp.uint8:
        data = data.astype(bool, copy=False)
        return data, 1, data.ndim
    if kind not in "iu" or data.ndim and data.dtype != xp.int64 and data.dtype != xp.int32 \
            and isinstance(i, _registry.Tensor):  # as PyTorch: not int8/int16 Tensors
        raise IndexError(f"tensors used as indices must be long, int, byte or bool tensors "
                         f"(got {data.dtype})")
    if data.ndim == 0:
        return int(data), 0, 1
    return data, 2, 1


def _basic_tuple_key(index, shape):
    """The key for the common tuple of ints, slices (positive int steps) and None, or None
    when the index needs the general path (which also raises the errors)."""
    d = 0
    ndim = len(shape)
    for i in index:
        t = type(i)
        if t is int:
            if d >= ndim or not -shape[d] <= i < shape[d]:
                return None
            d += 1
        elif t is slice:
            step = i.step
            if step is not None and (type(step) is not int or step <= 0):
                return None
            d += 1
        elif i is not None:
            return None
    if d > ndim:
        return None
    return index + (Ellipsis,)


def index_key(input, index):
    """PyTorch's index (ints, slices, None, Ellipsis, bools, integer/bool Tensors, lists and
    ndarrays, or a tuple of them) as ``(key, basic, accumulate)``: a tuple numpy indexes with
    the same result, whether it is basic indexing (a view), and whether it may repeat
    elements. Raises IndexError naming the index, dim and size as PyTorch does."""
    shape = input.shape
    if type(index) is int:  # the common case first
        n = shape[0] if shape else None
        if n is None:
            raise IndexError("invalid index of a 0-dim tensor. Use `tensor.item()` in Python or "
                             "`tensor.item<T>()` in C++ to convert a 0-dim tensor to a number")
        if not -n <= index < n:
            raise IndexError(f"index {index} is out of bounds for dimension 0 with size {n}")
        return (index, Ellipsis), True, False
    if type(index) is tuple:
        key = _basic_tuple_key(index, shape)
        if key is not None:
            return key, True, False
    elif type(index) is slice and (index.step is None or type(index.step) is int and
                                   index.step > 0) and shape:
        return (index, Ellipsis), True, False
    elif type(index) is _registry.Tensor and shape:  # x[idx], an int32/int64 index Tensor
        data = index._data
        if type(data) is xp.ndarray and data.ndim and data.dtype.kind == "i" \
                and data.dtype.itemsize >= 4 and _out_of_bounds(data, shape[0]) is None:
            return (data, Ellipsis), False, True  # (out of bounds: the general path raises)
    if type(index) is not tuple:
        if type(index) is list and _sequence_as_tuple(index):
            warnings.warn("Using a non-tuple sequence for multidimensional indexing is "
                          "deprecated; use x[tuple(seq)] instead of x[seq] (tapegrad, like "
                          "PyTorch, reads it as a tuple)", UserWarning, stacklevel=3)
            index = tuple(index)
        else:
            index = (index,)
    items, used, kinds, ellipsis = [], 0, 0, False
    for i in index:
        entry, kind, dims = _index_item(i)
        if entry is Ellipsis:
            if ellipsis:
                raise IndexError("an index can only have a single ellipsis ('...')")
            ellipsis = True
        items.append((entry, kind, dims))
        used += dims
        kinds |= 1 << kind
    ndim = len(shape)
    if used > ndim:
        if ndim == 0 and used == 1 and isinstance(items[0][0], int):
            raise IndexError("invalid index of a 0-dim tensor. Use `tensor.item()` in Python or "
                             "`tensor.item<T>()` in C++ to convert a 0-dim tensor to a number")
        raise IndexError(f"too many indices for tensor of dimension {ndim} (got {used} indices "
                         f"for shape {tuple(shape)})")
    d = 0
    ints = False
    for entry, kind, dims in items:
        if entry is Ellipsis:
            d += ndim - used
        elif kind == 0 and dims:
            if type(entry) is int:
                ints = True
                n = shape[d]
                if not -n <= entry < n:
                    raise IndexError(f"index {entry} is out of bounds for dimension {d} with "
                                     f"size {n}")
            d += 1
        elif kind == 2:
            bad = _out_of_bounds(entry, shape[d])
            if bad is not None:
                raise IndexError(f"index {bad} is out of bounds for dimension {d} with size "
                                 f"{shape[d]}")
            d += 1
        elif kind == 1 and dims:
            for j, m in enumerate(entry.shape):
                if m != shape[d + j]:
                    raise IndexError(
                        f"The shape of the mask {list(entry.shape)} at index {j} does not match "
                        f"the shape of the indexed tensor {list(shape)} at index {d + j}")
            d += dims
    if kinds & 6:  # advanced indices must broadcast together
        shapes = [list(e.shape) if k == 2 else [int(e.sum())] for e, k, dims in items
                  if k == 2 or k == 1 and dims]
        try:
            xp.broadcast_shapes(*map(tuple, shapes))
        except ValueError:
            raise IndexError("shape mismatch: indexing tensors could not be broadcast together "
                             "with shapes " + ", ".join(map(str, shapes))) from None
    if ints and kinds > 1 and all(dims for _, kind, dims in items if kind == 1):
        return _all_advanced_key(items, shape, used), False, bool(kinds & 4)
    if ellipsis and used == ndim and kinds > 1:
        # an Ellipsis standing for no dims does not separate advanced indices in PyTorch
        items = [it for it in items if it[0] is not Ellipsis]
        ellipsis = False
    key = tuple(e for e, _, _ in items)
    if not ellipsis:
        key += (Ellipsis,)  # numpy then returns a 0-d array, never a scalar
    return key, kinds <= 1, bool(kinds & 4)


def _all_advanced_key(items, shape, used):
    """The key for an index that mixes ints with integer arrays or masks, in PyTorch's order.

    PyTorch applies ints (selects) before the advanced indices, so whether those are adjacent
    (and where their dims go) is decided without the ints; numpy counts ints as advanced. One
    integer array per input dim, broadcasting to PyTorch's result shape, gives PyTorch's result
    in one numpy step (reads, writes and ``np.add.at`` alike).
    """
    ndim = len(shape)
    out = []  # PyTorch's result dims after the selects: ("s", d, slice) / ("n",) / ("a", d, arr)
    d = 0
    for entry, kind, dims in items:
        if entry is Ellipsis:
            for _ in range(ndim - used):
                out.append(("s", d, slice(None)))
                d += 1
        elif entry is None:
            out.append(("n",))
        elif kind == 0:
            if type(entry) is not int:
                out.append(("s", d, entry))
            d += 1
        else:
            for j, nz in enumerate(entry.nonzero() if kind == 1 else (entry,)):
                out.append(("a", d + j, nz))
            d += dims
    while d < ndim:
        out.append(("s", d, slice(None)))
        d += 1
    adv = [i for i, o in enumerate(out) if o[0] == "a"]
    block = xp.broadcast_shapes(*(out[i][2].shape for i in adv))
    start = adv[0] if adv == list(range(adv[0], adv[0] + len(adv))) else 0
    rest = [o for o in out if o[0] != "a"]
    n_out = len(rest) + len(block)
    axes = list(range(start)) + list(range(start + len(block), n_out))
    key = [None] * ndim
    for o, axis in zip(rest, axes):
        if o[0] == "s":
            r = xp.arange(*o[2].indices(shape[o[1]]))
            key[o[1]] = r.reshape((1,) * axis + (r.size,) + (1,) * (n_out - axis - 1))
    for i in adv:
        a = out[i][2]
        key[out[i][1]] = a.reshape((1,) * start + (1,) * (len(block) - a.ndim) + a.shape
                                   + (1,) * (n_out - start - len(block)))
    d = 0
    for entry, kind, dims in items:  # the selects: ints broadcast as 0-d indices
        if entry is Ellipsis:
            d += ndim - used
        elif kind == 0 and dims:
            if type(entry) is int:
                key[d] = entry
            d += 1
        else:
            d += dims
    return tuple(key)


def tensor_getitem(input, index):
    """As ``Tensor.__getitem__``: basic indexing gives a view, integer-array and mask
    indexing a copy; the gradient of repeated indices accumulates (``np.add.at``)."""
    key, basic, accumulate = index_key(input, index)
    if basic:
        return getitem(input, index=key)
    return index_op(input, index=key, accumulate=accumulate)


def index_put(input, values, index, accumulate=False):
    """Out of place ``input[index] = values`` (or ``+= values`` with ``accumulate``, repeated
    indices adding): the op behind ``Tensor.__setitem__``. ``index`` is anything
    ``Tensor.__getitem__`` takes; ``values`` (Tensor, array or number) broadcasts to the
    indexed shape and is cast to ``input``'s dtype. Gradients: ``input`` gets ``g`` with
    zeros at ``index`` (all of ``g`` with ``accumulate``), ``values`` gets ``g[index]``
    summed back to its shape."""
    key, basic, _ = index_key(input, index)
    if not isinstance(values, (_registry.Tensor, int, float, bool)):
        values = _registry.Tensor._from_data(values)
    return index_put_op(input, values, index=key, accumulate=accumulate, basic=basic)


__all__ = ["gather", "scatter_add", "index_select", "take_along_dim"]
TENSOR_METHODS = list(__all__)
