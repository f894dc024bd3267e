"""Order statistics, counting and covariance: ``median``/``nanmedian``, ``kthvalue``, ``mode``,
``quantile``/``nanquantile``, ``msort``, ``histc``, ``bincount``, ``bucketize``/
``searchsorted``, ``unique``/``unique_consecutive``, ``cov``/``corrcoef``.

Selections pick an index per slice with PyTorch's rule and gather there, so the gradient goes
to the picked entries (as PyTorch's ``value_selecting_reduction_backward``); ``median()`` and
``nanmedian()`` without a dim share the gradient among the entries equal to the result.
Counting ops have no gradient.
"""
import collections
import operator
import warnings

from tapegrad.ops import registry
from tapegrad.ops.pointwise_math import lerp
from tapegrad.ops.linalg import mm
from tapegrad.ops.movement import _dim, permute_op, reshape_op
from tapegrad.ops.indexing import _grid, index_op
from tapegrad.ops.reduce import _spread, _spread_jvp, take_along_reduce
from tapegrad.ops.registry import op, xp
from tapegrad.ops.selection import sort

MedianResult = collections.namedtuple("median", ["values", "indices"])
NanmedianResult = collections.namedtuple("nanmedian", ["values", "indices"])
KthvalueResult = collections.namedtuple("kthvalue", ["values", "indices"])
ModeResult = collections.namedtuple("mode", ["values", "indices"])


def _pick(input, idx, d, keepdim):
    """``(values, indices)``: ``input`` at ``idx`` (one per slice along ``d``; under vmap,
    indices of the physical batch: see ``_values_along``)."""
    if input.ndim == 0:
        return input.clone(), registry.Tensor._make(xp.zeros((), xp.int64))
    idx = idx.astype(xp.int64, copy=False)
    if getattr(input._data, "value", None) is not None:
        from tapegrad.func._vmap import rebatch

        idx = rebatch(idx, input)  # batched indices: take_along_reduce's batch rule
        return take_along_reduce(input, idx=idx, dim=d, keepdim=keepdim), idx
    values = take_along_reduce(input, idx=idx, dim=d, keepdim=keepdim)
    return values, registry.Tensor._make(xp.asarray(idx))


def _values_along(input, d):
    """``input``'s array and the axis of its dim ``d``: under ``tapegrad.func.vmap`` the
    physical batch (every example's values, batch dims in front) and ``d`` past them, so the
    indices picked from the values are every example's."""
    if getattr(input._data, "value", None) is None:
        return input._data, d
    from tapegrad.func._vmap import physical_array

    a = physical_array(input)
    return a, d + a.ndim - input.ndim


def _nonempty(name, input, d):
    if input.ndim and input.shape[d] == 0:
        raise IndexError(f"{name}(): Expected reduction dim {d} to have non-zero size.")


# --- median ---------------------------------------------------------------------------------
def _lower_median(a, ignore_nan):
    flat = a.reshape(-1)
    nan = xp.isnan(flat) if flat.dtype.kind not in "iub" else xp.zeros(flat.shape, bool)
    if nan.any() and not ignore_nan:
        return xp.asarray(xp.nan, a.dtype)
    values = xp.sort(flat[~nan])
    if values.size == 0:
        return xp.asarray(xp.nan if a.dtype.kind not in "iub" else 0, a.dtype)
    return xp.asarray(values[(values.size - 1) // 2])


@op(flops=1, saves="both", name="median")
def median_all(a, ignore_nan=False):
    return _lower_median(a, ignore_nan)


@median_all.grad
def _(g, out, a, ignore_nan=False):
    return _spread(g, out, a, tuple(range(a.ndim)), False, True)


@median_all.jvp
def _(t, out, a, ignore_nan=False):
    return _spread_jvp(t[0], out, a, tuple(range(a.ndim)), False, True)


def _median_index(a, d, ignore_nan):
    """PyTorch's index: the lower median in (value, index) order; ``median`` gives the first
    NaN of a slice holding one, ``nanmedian`` ranks the non-NaN entries only."""
    order = xp.argsort(a, axis=d, kind="stable")  # NaN last, ties by index
    n = a.shape[d]
    nan = xp.isnan(a) if a.dtype.kind not in "iub" else xp.zeros(a.shape, bool)
    count = nan.sum(axis=d, keepdims=True)
    if ignore_nan:
        pos = xp.maximum((n - count - 1) // 2, 0)
        return xp.take_along_axis(order, pos, axis=d).squeeze(d)
    pos = xp.full(count.shape, (n - 1) // 2)
    idx = xp.take_along_axis(order, pos, axis=d).squeeze(d)
    first_nan = xp.argmax(nan, axis=d)
    return xp.where(count.squeeze(d) > 0, first_nan, idx)


def _median(name, result, ignore_nan, input, dim, keepdim):
    if dim is None:
        return median_all(input, ignore_nan=ignore_nan)
    d = _dim(dim, input.ndim, name)
    _nonempty(name, input, d)
    if input.ndim == 0:
        return result(*_pick(input, None, d, keepdim))
    a, da = _values_along(input, d)
    idx = _median_index(a, da, ignore_nan)
    if keepdim:
        idx = xp.expand_dims(idx, da)
    return result(*_pick(input, idx, d, keepdim))


def median(input, dim=None, keepdim=False):
    """As ``torch.median``: the lower median (NaN if any entry is NaN). Without ``dim`` one
    value, whose gradient is shared among the entries equal to it; with ``dim``
    ``(values, indices)``, the index PyTorch's (the lower median in (value, index) order).

    >>> tapegrad.median(tapegrad.tensor([3., 1., 2., 4.]))           # tensor(2.)
    """
    return _median("median", MedianResult, False, input, dim, keepdim)


def nanmedian(input, dim=None, keepdim=False):
    """As ``torch.nanmedian``: ``median`` of the non-NaN entries (NaN where all are NaN)."""
    return _median("nanmedian", NanmedianResult, True, input, dim, keepdim)


# --- kthvalue ---------------------------------------------------------------------------------
def _gt_or_nan(x, y):
    return (x != x and y == y) or x > y


def _quickselect(values, k):
    """PyTorch's ``quick_select_template`` (median-of-three quickselect with NaN largest)
    over one slice: the index it leaves at position ``k``; its choice among equal values is
    the one PyTorch's kthvalue returns."""
    arr, idx = list(values), list(range(len(values)))

    def swap(a, b):
        arr[a], arr[b] = arr[b], arr[a]
        idx[a], idx[b] = idx[b], idx[a]

    lo, hi = 0, len(arr) - 1
    while hi > lo:
        if hi == lo + 1:
            if _gt_or_nan(arr[lo], arr[hi]):
                swap(lo, hi)
            break
        swap(lo + (hi - lo) // 2, lo + 1)
        if _gt_or_nan(arr[lo + 1], arr[hi]):
            swap(lo + 1, hi)
        if _gt_or_nan(arr[lo], arr[hi]):
            swap(lo, hi)
        if _gt_or_nan(arr[lo + 1], arr[lo]):
            swap(lo + 1, lo)
        i, j, pivot = lo + 1, hi, arr[lo]
        while True:
            i += 1
            while _gt_or_nan(pivot, arr[i]):
                i += 1
            j -= 1
            while _gt_or_nan(arr[j], pivot):
                j -= 1
            if j < i:
                break
            swap(i, j)
        swap(lo, j)
        if j <= k:
            lo = i
        if j >= k:
            hi = j - 1
    return idx[k]


def kthvalue(input, k, dim=-1, keepdim=False):
    """As ``torch.kthvalue``: the ``k``-th smallest entry along ``dim`` and its index (NaN
    counts as the largest); among equal values the index PyTorch's quickselect leaves.

    >>> tapegrad.kthvalue(tapegrad.tensor([3., 1., 2.]), 2)       # values 2., indices 2
    """
    k = operator.index(k)
    d = _dim(dim, input.ndim, "kthvalue")
    n = input.shape[d] if input.ndim else 1
    if not 1 <= k <= n:
        raise RuntimeError(f"kthvalue(): selected number k out of range for dimension {d} "
                           f"(k={k}, size {n}, input of shape {tuple(input.shape)})")
    if input.ndim == 0:
        return KthvalueResult(*_pick(input, None, d, keepdim))
    a, da = _values_along(input, d)
    a = xp.moveaxis(a, da, -1)
    rows = a.reshape(-1, n)
    order = xp.argsort(rows, axis=-1, kind="stable")
    idx = order[:, k - 1].copy()
    ordered = xp.take_along_axis(rows, order, axis=-1)
    with xp.errstate(invalid="ignore"):
        ties = (ordered[:, 1:] == ordered[:, :-1]).any(axis=-1)
    if rows.dtype.kind not in "iub":
        ties |= xp.isnan(rows).any(axis=-1)
    for r in xp.flatnonzero(ties):  # the exact kernel only where the choice is ambiguous
        idx[r] = _quickselect(rows[r].tolist(), k - 1)
    idx = idx.reshape(a.shape[:-1])
    if keepdim:
        idx = xp.expand_dims(idx, da)
    return KthvalueResult(*_pick(input, idx, d, keepdim))


# --- mode -------------------------------------------------------------------------------------
def _mode_index(row):
    """The most frequent value (the smallest among equally frequent ones) and, among its
    entries, the last index (PyTorch's for slices of up to 16 entries: see differences.md)."""
    values, inverse, counts = xp.unique(row, return_inverse=True, return_counts=True,
                                        equal_nan=False)
    best = int(xp.argmax(counts))
    return int(xp.flatnonzero(inverse.reshape(-1) == best)[-1])


def mode(input, dim=-1, keepdim=False):
    """As ``torch.mode``: the most frequent value along ``dim`` (the smallest if several) and
    an index of it (the last).

    >>> tapegrad.mode(tapegrad.tensor([2., 1., 1., 2., 3.]))       # values 1., indices 2
    """
    d = _dim(dim, input.ndim, "mode")
    _nonempty("mode", input, d)
    if input.ndim == 0:
        return ModeResult(*_pick(input, None, d, keepdim))
    a, da = _values_along(input, d)
    a = xp.moveaxis(a, da, -1)
    rows = a.reshape(-1, a.shape[-1])
    idx = xp.array([_mode_index(r) for r in rows], dtype=xp.int64).reshape(a.shape[:-1])
    if keepdim:
        idx = xp.expand_dims(idx, da)
    return ModeResult(*_pick(input, idx, d, keepdim))


def msort(input):
    """As ``torch.msort``: ``sort(input, dim=0).values``."""
    return sort(input, 0).values


# --- quantile ---------------------------------------------------------------------------------
_INTERPOLATIONS = ("linear", "lower", "higher", "midpoint", "nearest")


def _quantile(name, input, q, dim, keepdim, interpolation, ignore_nan):
    if input.numel() == 0:
        raise RuntimeError(f"{name}() input tensor must be non-empty")
    if input._data.dtype not in (xp.float32, xp.float64):
        raise RuntimeError(f"{name}() input tensor must be either float or double dtype "
                           f"(got {input.dtype})")
    if interpolation not in _INTERPOLATIONS:
        raise RuntimeError(f"{name}() interpolation must be one of linear, lower, higher, "
                           f"midpoint or nearest, but got {interpolation}")
    dt = input._data.dtype
    if isinstance(q, registry.Tensor):
        if q.ndim > 1:
            raise RuntimeError(f"{name}() q must be a scalar or 1D tensor (got shape "
                               f"{tuple(q.shape)})")
        if q._data.dtype != dt:
            raise RuntimeError(f"{name}() q tensor must be same dtype as the input tensor "
                               f"({q.dtype} and {input.dtype})")
        qs, scalar = q._data.reshape(-1), q.ndim == 0
        if qs.size and (qs.min() < 0 or qs.max() > 1):
            raise RuntimeError(f"{name}() q values must be in the range [0, 1]")
    else:
        if not 0 <= q <= 1:
            raise RuntimeError(f"{name}() q must be in the range [0, 1] but got {q}")
        qs, scalar = xp.asarray([q], dt), True
    if dim is None:
        x, d = reshape_op(input, shape=(-1,)), None
    else:
        d = _dim(dim, input.ndim, name)
        x = input if input.ndim == 0 else permute_op(
            input, dims=tuple(i for i in range(input.ndim) if i != d) + (d,))
        if input.ndim == 0:
            x = reshape_op(x, shape=(1,))
    s = sort(x, -1).values  # NaN last; the gradient reaches the picked entries
    from tapegrad.func._vmap import host, like  # under vmap: ranks of the physical batch

    data = host(s)
    n = data.shape[-1]
    batch = data.shape[:-1]
    nan = xp.isnan(data)
    if ignore_nan:  # ranks among the non-NaN entries; all NaN: rank 0 (a NaN)
        ranks = qs * (xp.sum(~nan, axis=-1, keepdims=True) - 1).astype(dt)
        ranks = xp.where(ranks < 0, dt.type(0), ranks)
    else:  # a NaN in the slice: the last rank (a NaN)
        ranks = xp.broadcast_to(qs * dt.type(n - 1), batch + qs.shape).copy()
        ranks[nan.any(axis=-1)] = n - 1
    ranks = xp.broadcast_to(ranks, batch + qs.shape)
    if interpolation == "lower":
        ranks = xp.floor(ranks)
    elif interpolation == "higher":
        ranks = xp.ceil(ranks)
    elif interpolation == "nearest":
        ranks = xp.round(ranks)  # half to even, as torch.round
    below = ranks.astype(xp.int64)
    last = s.ndim - 1
    if data.ndim > s.ndim:  # batched: the ranks as batched indices of take_along_reduce
        def pick(r):
            return take_along_reduce(s, idx=like(r, s), dim=last, keepdim=True)
    else:
        def pick(r):
            return index_op(s, index=_grid(r, last), accumulate=True)
    out = pick(below)
    if interpolation in ("linear", "midpoint"):
        weights = xp.full(ranks.shape, 0.5, dt) if interpolation == "midpoint" else \
            (ranks - below).astype(dt)
        above = pick(xp.ceil(ranks).astype(xp.int64))
        w = like(xp.asarray(weights), s)
        out = lerp(out, above, w if isinstance(w, registry.Tensor) else registry.Tensor._make(w))
    # batch + (Q,) -> (Q,) + batch, then the kept dims
    out = permute_op(out, dims=(last,) + tuple(range(last)))
    if keepdim:
        kept = [1] * input.ndim if d is None else [
            1 if i == d else input.shape[i] for i in range(input.ndim)]
        out = reshape_op(out, shape=(qs.size,) + tuple(kept))
    if scalar:
        out = reshape_op(out, shape=tuple(out.shape[1:]))
    return out


def quantile(input, q, dim=None, keepdim=False, *, interpolation="linear"):
    """As ``torch.quantile``: the ``q``-quantiles (a number or 1-d tensor, in [0, 1]) along
    ``dim`` (of the flattened input when None), with PyTorch's ``interpolation`` modes
    (``linear``, ``lower``, ``higher``, ``midpoint``, ``nearest``); NaN if a slice has NaN.
    A 1-d ``q`` adds a leading dim.

    >>> tapegrad.quantile(tapegrad.tensor([0., 1., 2., 3.]), 0.5)     # tensor(1.5000)
    """
    return _quantile("quantile", input, q, dim, keepdim, interpolation, False)


def nanquantile(input, q, dim=None, keepdim=False, *, interpolation="linear"):
    """As ``torch.nanquantile``: ``quantile`` ignoring NaN (NaN where a slice is all NaN)."""
    return _quantile("nanquantile", input, q, dim, keepdim, interpolation, True)


# --- counting (no gradient) ------------------------------------------------------------------
def histc(input, bins=100, min=0, max=0):
    """As ``torch.histc``: counts in ``bins`` equal bins over [min, max] (the data's range
    when both are 0); entries outside are ignored; the result has the input's dtype."""
    a = input._data
    if getattr(a, "value", None) is not None:  # under vmap: each example's histogram
        from tapegrad.func._vmap import host, like

        pa = host(input)
        lead = pa.shape[:pa.ndim - input.ndim]
        rows = pa.reshape((-1,) + tuple(input.shape))
        out = xp.stack([histc(registry.Tensor._make(r), bins, min, max)._data for r in rows])
        return like(out.reshape(lead + out.shape[1:]), input)
    if a.dtype.kind in "iub":
        raise NotImplementedError(f'"histogram_cpu" not implemented for {input.dtype} '
                                  f"(histc takes floating-point input)")
    bins = operator.index(bins)
    if bins <= 0:
        raise RuntimeError(f"torch.histogram(): bins must be > 0, but got {bins} for "
                           f"dimension 0")
    lo, hi = a.dtype.type(min), a.dtype.type(max)
    if lo == hi and a.size:
        lo, hi = a.min(), a.max()
    if lo == hi:
        lo, hi = lo - 1, hi + 1
    if not (xp.isfinite(lo) and xp.isfinite(hi)):
        raise RuntimeError(f"torch.histc: range of [{lo:g}, {hi:g}] is not finite")
    if lo > hi:
        raise RuntimeError("torch.histc: max must be larger than min")
    x = a.reshape(-1)
    x = x[(x >= lo) & (x <= hi)]
    # PyTorch's linear map from value to bin (computed in the input's dtype), the right edge
    # in the last bin
    pos = ((x - lo) * a.dtype.type(bins) / (hi - lo)).astype(xp.int64)
    pos = xp.minimum(pos, bins - 1)
    return registry.Tensor._make(xp.bincount(pos, minlength=bins).astype(a.dtype))


@op(flops=1, saves="none", name="bincount")
def bincount_op(weights, idx, minlength):
    out_dtype = xp.float32 if weights.dtype == xp.float32 else xp.float64
    return xp.bincount(idx, weights.astype(xp.float64), minlength=minlength).astype(out_dtype)


@bincount_op.grad
def _(g, out, weights, idx, minlength):
    raise RuntimeError("bincount: the derivative for 'bincount' is not implemented (as in "
                       "PyTorch)")


@bincount_op.jvp
def _(t, out, weights, idx, minlength):
    raise RuntimeError("bincount: the derivative for 'bincount' is not implemented (as in "
                       "PyTorch, forward mode included)")


def bincount(input, weights=None, minlength=0):
    """As ``torch.bincount``: the count of each value of a 1-d non-negative integer tensor
    (the sum of ``weights`` at it: float32 weights give float32, others float64), at least
    ``minlength`` long.

    >>> tapegrad.bincount(tapegrad.tensor([2, 0, 2]))               # tensor([1, 0, 2])
    """
    a = input._data
    if a.dtype.kind not in "iub":
        raise NotImplementedError(f'"bincount_cpu" not implemented for {input.dtype}')
    minlength = operator.index(minlength)
    if minlength < 0:
        raise RuntimeError("minlength should be >= 0")
    if a.ndim != 1 or (a.size and a.min() < 0):
        raise RuntimeError(f"bincount only supports 1-d non-negative integral inputs (got "
                           f"shape {tuple(input.shape)})")
    if weights is None:
        return registry.Tensor._make(xp.bincount(a, minlength=minlength).astype(xp.int64))
    if tuple(weights.shape) != tuple(input.shape):
        raise RuntimeError(f"weights should be 1-d and have the same length as input (input "
                           f"{tuple(input.shape)}, weights {tuple(weights.shape)})")
    return bincount_op(weights, idx=a, minlength=minlength)


def _sorted_search(name, seq, values, side, sorter):
    """``searchsorted`` over the last dim of ``seq`` (rows matching ``values``' leading
    dims, or one 1-d sequence)."""
    s, v = getattr(seq, "_data", seq), values
    if sorter is not None:
        order = sorter._data if isinstance(sorter, registry.Tensor) else xp.asarray(sorter)
        if order.shape != s.shape:
            raise RuntimeError(f"{name}(): boundary and sorter must have the same size, but "
                               f"got boundary tensor {list(s.shape)} and got sorter tensor "
                               f"{list(order.shape)}")
        bad = None
        if order.size and (order.min() < 0 or order.max() >= s.shape[-1]):
            bad = int(order.min()) if order.min() < 0 else int(order.max())
        if bad is not None:
            raise RuntimeError(f"{name}(): sorter index out of range (got {bad} for a "
                               f"sequence of {s.shape[-1]})")
        s = xp.take_along_axis(s, order, axis=-1)
    if s.ndim == 1:
        return xp.searchsorted(s, v, side=side)
    rows, vals = s.reshape(-1, s.shape[-1]), v.reshape(-1, v.shape[-1])
    out = xp.stack([xp.searchsorted(r, x, side=side) for r, x in zip(rows, vals)]) \
        if rows.shape[0] else xp.zeros(vals.shape, xp.int64)
    return out.reshape(v.shape)


def searchsorted(sorted_sequence, input, *, out_int32=False, right=False, side=None,
                 sorter=None):
    """As ``torch.searchsorted``: for each value, the index where it would be inserted into
    the last dim of ``sorted_sequence`` to keep it sorted (``right=True`` / ``side='right'``:
    after equal entries); int64, or int32 with ``out_int32``.

    >>> tapegrad.searchsorted(tapegrad.tensor([1, 3, 5]), tapegrad.tensor([3, 6]))  # [1, 3]
    """
    if side is not None:
        if side not in ("left", "right"):
            raise RuntimeError(f"torch.searchsorted(): side can only be 'left' or 'right' but "
                               f"got {side}")
        if right and side == "left":
            raise RuntimeError("torch.searchsorted(): side and right can't be set to "
                               "opposites, got side of left while right was True")
        right = side == "right"
    scalar = not isinstance(input, registry.Tensor)
    values = xp.asarray(input) if scalar else input._data
    seq = sorted_sequence
    if seq.ndim == 0:
        raise RuntimeError("torch.searchsorted(): boundaries tensor should have positive "
                           "dimension, but got 0 dimension")
    if scalar and seq.ndim != 1:
        raise RuntimeError(f"torch.searchsorted(): input value can be a scalar only when "
                           f"boundaries tensor dimension is 1, but we got boundaries tensor "
                           f"dim({seq.ndim}) and input value's dim(0) numel(1)")
    if seq.ndim != 1 and (values.ndim != seq.ndim or values.shape[:-1] != seq.shape[:-1]):
        raise RuntimeError(
            f"torch.searchsorted(): boundaries tensor should be 1 dimension or the first N-1 "
            f"dimensions of boundaries tensor and input value tensor must match, but we got "
            f"boundaries tensor {list(seq.shape)} and input value tensor "
            f"{list(values.shape)}")
    dt = xp.int32 if out_int32 else xp.int64
    from tapegrad.func._vmap import is_batched, host, like

    if not scalar and (is_batched(input) or is_batched(seq)):  # under vmap: the physical batch
        s, v = host(seq), host(input)
        lead = s.shape[:s.ndim - seq.ndim] if is_batched(seq) else v.shape[:v.ndim - input.ndim]
        if is_batched(seq) and not is_batched(input):
            v = xp.broadcast_to(v, lead + v.shape)
        elif is_batched(input) and not is_batched(seq) and seq.ndim > 1:
            s = xp.broadcast_to(s, lead + s.shape)
        if sorter is not None:
            sorter = xp.broadcast_to(host(sorter), s.shape)
        out = _sorted_search("searchsorted", s, v, "right" if right else "left", sorter)
        return like(xp.asarray(out).astype(dt), input if is_batched(input) else seq)
    out = _sorted_search("searchsorted", seq, values, "right" if right else "left", sorter)
    return registry.Tensor._make(xp.asarray(out).astype(dt))


def bucketize(input, boundaries, *, out_int32=False, right=False):
    """As ``torch.bucketize``: the bucket of each value among the 1-d ``boundaries``:
    ``boundaries[i-1] < x <= boundaries[i]`` (``right=True``: ``<= x <``)."""
    if boundaries.ndim != 1:
        raise RuntimeError(f"boundaries tensor must be 1 dimension, but got dim("
                           f"{boundaries.ndim})")
    return searchsorted(boundaries, input, out_int32=out_int32, right=right)


# --- unique -----------------------------------------------------------------------------------
def _unique_parts(a, dim, consecutive):
    """(values, inverse, counts) over the flattened array or the slices along ``dim``."""
    if dim is None:
        flat = a.reshape(-1)
        if consecutive:
            start = xp.ones(flat.shape, bool)
            start[1:] = flat[1:] != flat[:-1]
            return _runs(flat, start, a.shape)
        values, inverse, counts = xp.unique(flat, return_inverse=True, return_counts=True,
                                            equal_nan=False)
        return values, inverse.reshape(a.shape), counts
    moved = xp.moveaxis(a, dim, 0)
    rows = moved.reshape(moved.shape[0], -1)
    if consecutive:
        start = xp.ones(rows.shape[0], bool)
        start[1:] = (rows[1:] != rows[:-1]).any(axis=1) if rows.shape[1] else False
        values, inverse, counts = _runs(rows, start, (rows.shape[0],))
    else:
        values, inverse, counts = xp.unique(rows, axis=0, return_inverse=True,
                                            return_counts=True, equal_nan=False)
    values = xp.moveaxis(values.reshape((values.shape[0],) + moved.shape[1:]), 0, dim)
    return values, inverse.reshape(-1), counts


def _runs(x, start, inverse_shape):
    first = xp.flatnonzero(start)
    counts = xp.diff(xp.append(first, len(start)))
    inverse = xp.cumsum(start) - 1
    return x[first], inverse.reshape(inverse_shape), counts


@op(flops=1, saves="none", name="unique")
def unique_op(a, dim=None, consecutive=False):
    return _unique_parts(a, dim, consecutive)[0]


@unique_op.grad
def _(g, out, a, dim=None, consecutive=False):
    raise NotImplementedError("the derivative for 'unique' is not implemented (as in PyTorch)")


@unique_op.jvp
def _(t, out, a, dim=None, consecutive=False):
    raise NotImplementedError("the derivative for 'unique' is not implemented (as in PyTorch, "
                              "forward mode included)")


def _unique(name, input, return_inverse, return_counts, dim, consecutive):
    d = None if dim is None else _dim(dim, input.ndim, name)
    if d is not None and input.ndim and input.shape[d] == 0 and input.numel() == 0 \
            and any(n == 0 for i, n in enumerate(input.shape) if i != d):
        raise RuntimeError(f"{name}: Number of zero sized dimensions is more than one, so "
                           f"unique cannot be applied (input of shape {tuple(input.shape)})")
    if d is not None and input.ndim == 0:
        d = None
    values = unique_op(input, dim=d, consecutive=consecutive)
    if not (return_inverse or return_counts):
        return values
    _, inverse, counts = _unique_parts(input._data, d, consecutive)
    out = [values]
    if return_inverse:
        out.append(registry.Tensor._make(inverse.astype(xp.int64)))
    if return_counts:
        out.append(registry.Tensor._make(counts.astype(xp.int64)))
    return tuple(out)


def unique(input, sorted=True, return_inverse=False, return_counts=False, dim=None):
    """As ``torch.unique``: the distinct values (or slices along ``dim``), sorted (as on
    PyTorch's CPU, also with ``sorted=False``), with the inverse indices and the counts on
    request; NaNs are each distinct.

    >>> tapegrad.unique(tapegrad.tensor([3, 1, 3]))                 # tensor([1, 3])
    """
    return _unique("unique", input, return_inverse, return_counts, dim, False)


def unique_consecutive(input, return_inverse=False, return_counts=False, dim=None):
    """As ``torch.unique_consecutive``: one entry (or slice along ``dim``) per run of equal
    consecutive ones, with the inverse indices and run lengths on request."""
    return _unique("unique_consecutive", input, return_inverse, return_counts, dim, True)


# --- covariance -------------------------------------------------------------------------------
def cov(input, *, correction=1, fweights=None, aweights=None):
    """As ``torch.cov``: the covariance of the rows (variables) of a 1-d or 2-d input over its
    columns (observations), with integer frequency weights ``fweights``, observation weights
    ``aweights`` and ``correction`` (1: unbiased), by PyTorch's formula.

    >>> tapegrad.cov(tapegrad.tensor([[0., 1., 2.], [2., 1., 0.]]))   # [[1., -1.], [-1., 1.]]
    """
    if input.ndim > 2:
        raise RuntimeError(f"cov(): expected input to have two or fewer dimensions but got an "
                           f"input with {input.ndim} dimensions")
    if input._data.dtype.kind == "b":
        raise RuntimeError("cov(): bool dtype is not supported for input")
    x = reshape_op(input, shape=(1, -1)) if input.ndim < 2 else input
    n = x.shape[1]
    w = None
    if fweights is not None:
        if fweights.ndim > 1:
            raise RuntimeError(f"cov(): expected fweights to have one or fewer dimensions but "
                               f"got fweights with {fweights.ndim} dimensions")
        if fweights._data.dtype.kind not in "iu":
            raise RuntimeError(f"cov(): expected fweights to have integral dtype but got "
                               f"fweights with {fweights.dtype} dtype")
        if fweights.numel() != n:
            raise RuntimeError(f"cov(): expected fweights to have the same numel as there are "
                               f"observations in the input but got {fweights.numel()} != {n}")
        if fweights.numel() and fweights._data.min() < 0:
            raise RuntimeError(f"cov(): fweights cannot be negative but got "
                               f"{int(fweights._data.min())}")
        w = fweights
    if aweights is not None:
        if aweights.ndim > 1:
            raise RuntimeError(f"cov(): expected aweights to have one or fewer dimensions but "
                               f"got aweights with {aweights.ndim} dimensions")
        if aweights._data.dtype.kind in "iub":
            raise RuntimeError(f"cov(): expected aweights to have floating point dtype but "
                               f"got aweights with {aweights.dtype} dtype")
        if aweights.numel() != n:
            raise RuntimeError(f"cov(): expected aweights to have the same numel as there are "
                               f"observations in the input but got {aweights.numel()} != {n}")
        if aweights.numel() and aweights._data.min() < 0:
            raise RuntimeError(f"cov(): aweights cannot be negative but got "
                               f"{float(aweights._data.min())}")
        w = aweights if w is None else w * aweights
    if w is None:
        w_sum = registry.Tensor._make(xp.asarray(n, xp.int64))
    else:
        w_sum = w.sum()
        if not w_sum._data.any():
            raise RuntimeError("cov(): weights sum to zero, can't be normalized")
    avg = (x * w if w is not None else x).sum(1) / w_sum
    if w is not None and aweights is not None and correction != 0:
        norm_factor = w_sum - correction * (w * aweights).sum() / w_sum
    else:
        norm_factor = w_sum - correction
    if (norm_factor._data <= 0).all():
        warnings.warn("cov(): degrees of freedom is <= 0. Correction should be strictly less "
                      "than the number of observations.", UserWarning, stacklevel=2)
        norm_factor = norm_factor * 0
    x = x - reshape_op(avg, shape=(-1, 1))
    c = mm(x, (x * w if w is not None else x).T)
    out = c / norm_factor
    return reshape_op(out, shape=tuple(k for k in out.shape if k != 1))


def corrcoef(input):
    """As ``torch.corrcoef``: Pearson correlation coefficients of the rows, clipped to
    [-1, 1] (``cov`` normalised by the standard deviations)."""
    if input.ndim > 2:
        raise RuntimeError(f"corrcoef(): expected input to have two or fewer dimensions but "
                           f"got an input with {input.ndim} dimensions")
    c = cov(input)
    if c.ndim == 0:
        return c / c
    from tapegrad.ops.elementwise import clamp, sqrt
    from tapegrad.ops.selection import diagonal

    std = sqrt(diagonal(c))
    c = c / reshape_op(std, shape=(-1, 1))
    c = c / reshape_op(std, shape=(1, -1))
    return clamp(c, -1, 1)


__all__ = ["median", "nanmedian", "kthvalue", "mode", "msort", "quantile", "nanquantile",
           "histc", "bincount", "searchsorted", "bucketize", "unique", "unique_consecutive",
           "cov", "corrcoef"]
TENSOR_METHODS = ["median", "nanmedian", "kthvalue", "mode", "msort", "quantile",
                  "nanquantile", "histc", "bincount", "unique", "unique_consecutive", "cov",
                  "corrcoef"]
INPLACE = []
