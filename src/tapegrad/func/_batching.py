"""Batch rules (``@op.batch``) for the ops that are not pointwise.

A rule takes the physical inputs, their batch dims (None: unbatched) and the op's params, and
returns ``(physical output, its batch dim)``, or NotImplemented to let vmap loop. Most rules
move the batch to the front and shift the op's dim params by one: numpy forwards already
handle a leading dim.
"""
from tapegrad.func._vmap import (move_to_front, pad_after_batch, expand_batch, logical_ndim,
                                 _front, is_batched, DEFERRED, BatchedArray)
from tapegrad.ops.movement import _dim
from tapegrad.backend import xp
from tapegrad.ops.registry import REGISTRY
from tapegrad.ops.nn import _ce_target

R = REGISTRY


def _shift(d, nd):
    return _dim(d, nd, "vmap") + 1  # a logical dim, normalised, past the batch dim


def _shift_all(ds, nd):
    return tuple(_shift(d, nd) for d in ds)


def _only_first(bdims):
    return all(b is None for b in bdims[1:])


def _dim_rule(name, key, kind):
    """Rule for an op whose first input is the only batched one and whose ``key`` param is
    a dim (``int``), dims (``tuple``) or a dim-or-None (None: every dim)."""
    o = R[name]

    def rule(args, bdims, **params):
        if not _only_first(bdims):
            return NotImplemented
        a = move_to_front(args[0], bdims[0])
        nd = a.dim() - 1
        params = dict(params)
        d = params.get(key)
        if d is None:
            if kind != "optional":
                return NotImplemented
            a = R["reshape"](a, shape=(a.shape[0], -1))
            if params.get("keepdim"):
                out = o(a, *args[1:], **dict(params, **{key: 1}))
                return R["reshape"](out, shape=(a.shape[0],) + (1,) * nd), 0
            params[key] = 1
        elif isinstance(d, (tuple, list)):
            params[key] = _shift_all(d, nd)
        else:
            params[key] = _shift(d, nd)
        return o(a, *args[1:], **params), 0

    o.batch(rule)
    return rule


for _n in ("sum", "mean", "max", "min", "amax", "amin", "logsumexp", "var", "std", "flip"):
    _dim_rule(_n, "dims", "tuple")
for _n in ("cumsum", "reverse_cumsum", "softmax", "log_softmax", "sort_order", "cumprod",
           "logcumsumexp"):
    _dim_rule(_n, "dim", "int")
for _n in ("prod", "argmax", "argmin"):
    _dim_rule(_n, "dim", "optional")


@R["norm"].batch
def _(args, bdims, p, dims, keepdim=False):
    a = move_to_front(args[0], bdims[0])
    return R["norm"](a, p=p, dims=_shift_all(dims, a.dim() - 1), keepdim=keepdim), 0


@R["l2_norm"].batch
def _(args, bdims, dim):
    a = move_to_front(args[0], bdims[0])
    nd = a.dim() - 1
    d = _shift_all(dim, nd) if isinstance(dim, (tuple, list)) else _shift(dim, nd)
    return R["l2_norm"](a, dim=d), 0


@R["roll"].batch
def _(args, bdims, shifts, dims):
    a = move_to_front(args[0], bdims[0])
    nd = a.dim() - 1
    if dims is None or (isinstance(dims, (tuple, list)) and not dims):
        flat = R["reshape"](a, shape=(a.shape[0], -1))
        out = R["roll"](flat, shifts=shifts, dims=(1,))
        return R["reshape"](out, shape=tuple(a.shape)), 0
    ds = _shift_all(dims, nd) if isinstance(dims, (tuple, list)) else _shift(dims, nd)
    return R["roll"](a, shifts=shifts, dims=ds), 0


def _same_bdim(name):
    """Ops that act on the last dims (tril, triu) or on nothing positional (alias, clone)."""
    o = R[name]

    def rule(args, bdims, **params):
        if not _only_first(bdims):
            return NotImplemented
        return o(move_to_front(args[0], bdims[0]), *args[1:], **params), 0

    o.batch(rule)


for _n in ("tril", "triu"):
    _same_bdim(_n)


def _passthrough(name):
    o = R[name]

    def rule(args, bdims, **params):
        if not _only_first(bdims):
            return NotImplemented
        return o(*args, **params), bdims[0]

    o.batch(rule)


for _n in ("alias", "clone"):
    _passthrough(_n)


@R["reshape"].batch
def _(args, bdims, shape):
    a = move_to_front(args[0], bdims[0])
    return R["reshape"](a, shape=(a.shape[0],) + tuple(shape)), 0


@R["permute"].batch
def _(args, bdims, dims):
    a = move_to_front(args[0], bdims[0])
    nd = a.dim() - 1
    return R["permute"](a, dims=(0,) + _shift_all(dims, nd)), 0


@R["broadcast_to"].batch
def _(args, bdims, shape):
    a = move_to_front(args[0], bdims[0])
    a = pad_after_batch(a, len(shape) - (a.dim() - 1))
    return R["broadcast_to"](a, shape=(a.shape[0],) + tuple(shape)), 0


@R["sum_to"].batch
def _(args, bdims, shape):
    a = move_to_front(args[0], bdims[0])
    nd = a.dim() - 1
    target = (a.shape[0],) + (1,) * (nd - len(shape)) + tuple(shape)
    out = R["sum_to"](a, shape=target)
    return R["reshape"](out, shape=(a.shape[0],) + tuple(shape)), 0


def _joined(name):
    o = R[name]

    def rule(args, bdims, dim):
        size = next(a.shape[b] for a, b in zip(args, bdims) if b is not None)
        nd = logical_ndim(args[0], bdims[0]) + (name == "stack")
        return o(_front(args, bdims, size), dim=_shift(dim, nd)), 0

    o.batch(rule)


_joined("cat")
_joined("stack")


@R["repeat"].batch
def _(args, bdims, sizes):
    a = move_to_front(args[0], bdims[0])
    a = pad_after_batch(a, len(sizes) - (a.dim() - 1))
    return R["repeat"](a, sizes=(1,) + tuple(sizes)), 0


@R["constant_pad_nd"].batch
def _(args, bdims, widths, value=0):
    a = move_to_front(args[0], bdims[0])
    return R["constant_pad_nd"](a, widths=((0, 0),) + tuple(widths), value=value), 0


@R["diagonal"].batch
def _(args, bdims, offset, dim1, dim2):
    a = move_to_front(args[0], bdims[0])
    nd = a.dim() - 1
    return R["diagonal"](a, offset=offset, dim1=_shift(dim1, nd), dim2=_shift(dim2, nd)), 0


def _is_advanced(k):
    return hasattr(k, "shape") or isinstance(k, list)


def _tensor_key(key):
    """Whether an index key holds a Tensor (the loop picks each example's). An array in it
    that is vmap's placeholder (a batched Tensor's ``_data``) holds no values, and numpy would
    index with its zeros: refused as a read of the batched values."""
    for k in key:
        if type(k) is BatchedArray:
            k.refuse_host_read()
    return any(hasattr(k, "_data") for k in key)


def _index_rule(name):
    o = R[name]

    def rule(args, bdims, index, **params):
        a = move_to_front(args[0], bdims[0])
        key = index if isinstance(index, tuple) else (index,)
        if _tensor_key(key):
            return NotImplemented  # a tensor index: the loop
        arrays = [i for i, k in enumerate(key) if _is_advanced(k)]
        out = o(a, index=(slice(None),) + key, **params)
        if not arrays:
            return out, 0
        # numpy: ints count as advanced once an array is present; advanced indices that are
        # not adjacent put their broadcast dims first, before our batch dim
        adv = [i for i, k in enumerate(key) if _is_advanced(k) or isinstance(k, int)]
        if adv == list(range(adv[0], adv[-1] + 1)):
            return out, 0
        import numpy as np

        shapes = []
        for i in adv:
            k = key[i]
            if hasattr(k, "dtype") and k.dtype == bool:
                shapes.append((int(np.count_nonzero(k)),))
            else:
                shapes.append(np.shape(k))
        return out, len(np.broadcast_shapes(*shapes))

    o.batch(rule)


_index_rule("getitem")
_index_rule("index")


# --- contractions --------------------------------------------------------------------------
@R["matmul"].batch
def _(args, bdims):
    a, b = args
    ba, bb = bdims
    ra, rb = logical_ndim(a, ba), logical_ndim(b, bb)
    mm, reshape, squeeze = R["matmul"], R["reshape"], _squeeze
    if ba is not None and bb is None:
        a = move_to_front(a, ba)
        if ra == 1:
            out = mm(a, b)  # (B, k) @ (..., k, m): the batch lands at dim -2
            return out, (out.dim() - 2 if rb >= 2 else 0)
        return mm(pad_after_batch(a, rb - ra), b), 0
    if ba is None and bb is not None:
        b = move_to_front(b, bb)
        if rb == 1:
            b = reshape(b, shape=(b.shape[0],) + (1,) * max(0, ra - 2) + (b.shape[1], 1))
            return squeeze(mm(a, b), -1), 0
        return mm(a, pad_after_batch(b, ra - rb)), 0
    a, b = move_to_front(a, ba), move_to_front(b, bb)
    if ra == 1 and rb == 1:
        out = mm(reshape(a, shape=(a.shape[0], 1, a.shape[1])),
                 reshape(b, shape=(b.shape[0], b.shape[1], 1)))
        return reshape(out, shape=(out.shape[0],)), 0
    if ra == 1:
        a = reshape(a, shape=(a.shape[0],) + (1,) * (rb - 2) + (1, a.shape[1]))
        return squeeze(mm(a, b), -2), 0
    if rb == 1:
        b = reshape(b, shape=(b.shape[0],) + (1,) * (ra - 2) + (b.shape[1], 1))
        return squeeze(mm(a, b), -1), 0
    r = max(ra, rb)
    return mm(pad_after_batch(a, r - ra), pad_after_batch(b, r - rb)), 0


def _squeeze(t, d):
    shape = list(t.shape)
    del shape[d]
    return R["reshape"](t, shape=tuple(shape))


@R["linear"].batch
def _(args, bdims):
    x, w = args[0], args[1]
    b = args[2] if len(args) > 2 else None
    bx, bw = bdims[0], bdims[1]
    bb = bdims[2] if len(bdims) > 2 else None
    if bw is None and bb is None and bx is not None:
        return R["linear"](move_to_front(x, bx), w, b) if b is not None else \
            R["linear"](move_to_front(x, bx), w), 0
    if bx is None and bw is None:  # only the bias is batched
        out, bo = R["linear"](x, w), None
        bphys = move_to_front(b, bb)
        return R["add"](out, pad_after_batch(bphys, out.dim() - (bphys.dim() - 1))), 0
    # a batched weight: x @ w^T (+ b) through the matmul rule
    wt = R["permute"](w, dims=tuple(range(w.dim() - 2)) + (w.dim() - 1, w.dim() - 2)) \
        if bw is None else _batched_t(w, bw)
    out, bo = R["matmul"].batch_rule([x, wt], [bx, None if bw is None else 0])
    if b is None:
        return out, bo
    out = move_to_front(out, bo)
    if bb is None:
        return R["add"](out, b), 0
    bphys = move_to_front(b, bb)
    return R["add"](out, pad_after_batch(bphys, out.dim() - bphys.dim())), 0


def _batched_t(w, bw):
    w = move_to_front(w, bw)
    n = w.dim()
    return R["permute"](w, dims=tuple(range(n - 2)) + (n - 1, n - 2))


@R["layer_norm"].batch
def _(args, bdims, axes, eps, param_shape):
    if not _only_first(bdims):
        return NotImplemented
    x = move_to_front(args[0], bdims[0])
    nd = x.dim() - 1
    return R["layer_norm"](x, *args[1:], axes=_shift_all(axes, nd), eps=eps,
                           param_shape=param_shape), 0


def _to_front_params(rule):
    rule.batched_params = True
    return rule


def _index_to_front(idx, pbdims, size):
    """A selection's ``idx`` param with this level's batch in front: moved there when batched
    here, else expanded: a Tensor (batched by an outer level: its placeholder array holds no
    values, so it is expanded as an op) or an array fixed for every example (a tangent picked
    at the primal's argmax)."""
    if pbdims and "idx" in pbdims:
        return move_to_front(idx, pbdims["idx"])
    if hasattr(idx, "_data"):
        return expand_batch(idx, size)
    return xp.broadcast_to(idx, (size,) + tuple(idx.shape))


def _selecting(name):
    o = R[name]

    @_to_front_params
    def rule(args, bdims, pbdims=None, idx=None, dim=0, keepdim=False):
        size = (args[0].shape[bdims[0]] if bdims[0] is not None
                else idx.shape[pbdims["idx"]])
        a = move_to_front(args[0], bdims[0]) if bdims[0] is not None else \
            expand_batch(args[0], size)
        nd = a.dim() - 1
        idx = _index_to_front(idx, pbdims, size)
        if hasattr(idx, "_data") and not is_batched(idx):
            idx = idx._data  # the forward takes an array (a Tensor batched further out stays)
        return o(a, idx=idx, dim=_shift(dim, nd), keepdim=keepdim), 0

    o.batch(rule)


for _n in ("max_dim", "min_dim", "take_along_reduce"):
    _selecting(_n)


@R["put_along"].batch
@_to_front_params
def _(args, bdims, pbdims=None, idx=None, shape=(), dim=0, keepdim=False):
    size = args[0].shape[bdims[0]] if bdims[0] is not None else idx.shape[pbdims["idx"]]
    g = move_to_front(args[0], bdims[0]) if bdims[0] is not None else \
        expand_batch(args[0], size)
    if len(shape) == 0:
        return g, 0
    idx = _index_to_front(idx, pbdims, size)
    if hasattr(idx, "_data") and not is_batched(idx):
        idx = idx._data
    return R["put_along"](g, idx=idx, shape=(size,) + tuple(shape),
                          dim=_shift(dim, len(shape)), keepdim=keepdim), 0


def rules():
    """Names of the ops vmap runs with a batch rule (written or derived), not a loop."""
    for name in [n for n in DEFERRED if n in R]:
        DEFERRED.pop(name)(R[name])
    return sorted(n for n, o in REGISTRY.items() if o.batch_rule is not None or o.pointwise)


# --- cross-entropy with class indices -------------------------------------------------------
def _ce_physical(args, bdims):
    """Physical logits ``x`` (B, N, C) and class indices ``t`` (B, N); ``t`` may be batched
    by an outer level too: the target is built from ops (``_ce_target``), never read here."""
    x, t = args[-2], args[-1]
    bx, bt = bdims[-2], bdims[-1]
    # the batch may come from any operand: the backward's incoming gradient alone is batched
    # in jacrev of the loss (one cotangent per output element, x and t shared)
    size = next(a.shape[b] for a, b in zip(args, bdims) if b is not None)
    x = move_to_front(x, bx) if bx is not None else expand_batch(x, size)
    if bt is not None:
        t = move_to_front(t, bt)
    elif hasattr(t, "_data"):
        t = expand_batch(t, size)
    else:
        t = xp.broadcast_to(t, (size,) + tuple(t.shape))
    return x, t


def _ce_parts(x, t, ignore_index, mean, empty):
    """One-hot (B, N, C), valid rows (B, N, 1) and each example's 1 / count (B, 1, 1)."""
    onehot, keep, scale = _ce_target(x, t, ignore_index, mean, empty)
    if not isinstance(scale, float):
        scale = R["reshape"](scale, shape=(x.shape[0], 1, 1))
    return onehot, keep, scale


@R["cross_entropy_index"].batch
def _(args, bdims, ignore_index=-100, mean=True):
    x, t = _ce_physical(args, bdims)
    onehot, keep, scale = _ce_parts(x, t, ignore_index, mean, xp.nan)  # all ignored: nan
    lse = R["logsumexp"](x, dims=(2,), keepdim=True)
    per_row = R["sum"]((lse - x) * onehot, dims=(2,), keepdim=True)  # lse - x[t]
    return R["sum"](per_row * keep * scale, dims=(1, 2)), 0


@R["cross_entropy_index_backward"].batch
def _(args, bdims, ignore_index=-100, mean=True):
    x, t = _ce_physical(args, bdims)
    onehot, keep, scale = _ce_parts(x, t, ignore_index, mean, 0.0)
    g, bg = args[0], bdims[0]
    g = R["reshape"](move_to_front(g, bg), shape=(x.shape[0], 1, 1)) if bg is not None else g
    p = R["softmax"](x, dim=2)
    return (p * keep - onehot) * (g * scale), 0


# --- max pooling: the batch folded into N ----------------------------------------------------
def _fold(t, size):
    """(B, N, ...) -> (B * N, ...)."""
    shape = tuple(t.shape)
    return R["reshape"](t, shape=(size * shape[1],) + shape[2:])


def _unfold(t, size):
    shape = tuple(t.shape)
    return R["reshape"](t, shape=(size, shape[0] // size) + shape[1:])


@R["max_pool2d_indices"].batch
def _(args, bdims, **params):
    x = move_to_front(args[0], bdims[0])
    size = x.shape[0]
    return _unfold(R["max_pool2d_indices"](_fold(x, size), **params), size), 0


@R["max_pool2d"].batch
def _(args, bdims):
    x, idx = args
    bx, bi = bdims
    size = x.shape[bx] if bx is not None else idx.shape[bi]
    x = move_to_front(x, bx) if bx is not None else expand_batch(x, size)
    idx = move_to_front(idx, bi) if bi is not None else expand_batch(idx, size)
    return _unfold(R["max_pool2d"](_fold(x, size), _fold(idx, size)), size), 0


@R["max_pool2d_backward"].batch
def _(args, bdims, size):
    g, idx = args
    bg, bi = bdims
    b = g.shape[bg] if bg is not None else idx.shape[bi]
    g = move_to_front(g, bg) if bg is not None else expand_batch(g, b)
    idx = move_to_front(idx, bi) if bi is not None else expand_batch(idx, b)
    folded = (b * size[0],) + tuple(size[1:])
    return _unfold(R["max_pool2d_backward"](_fold(g, b), _fold(idx, b), size=folded), b), 0


# --- attention: every batched input padded to one logical rank, batch in front ---------------
@R["scaled_dot_product_attention"].batch
@_to_front_params
def _(args, bdims, pbdims=None, scale=1.0, keep=None):
    kb = (pbdims or {}).get("keep")
    ranks = [logical_ndim(a, b) for a, b in zip(args, bdims)]
    ranks.append(0 if keep is None else keep.dim() - 1 if kb is not None else keep.ndim)
    r = max(ranks)
    new = [a if b is None else pad_after_batch(move_to_front(a, b), r - n)
           for a, b, n in zip(args, bdims, ranks)]
    if kb is not None:
        keep = pad_after_batch(move_to_front(keep, kb), r - ranks[-1])
        if not is_batched(keep):
            keep = keep._data
    return R["scaled_dot_product_attention"](*new, scale=scale, keep=keep), 0


# --- reductions to bool, fused pointwise losses, linear + relu -------------------------------
for _n in ("all", "any"):
    _dim_rule(_n, "dims", "optional")


def _pointwise_like(name):
    """A fused op that acts elementwise on same-shaped inputs (broadcast as pointwise ops)."""
    from tapegrad.func._vmap import _pointwise_rule

    R[name].batch(_pointwise_rule(R[name]))


_pointwise_like("binary_cross_entropy")


def _aligned(args, bdims):
    """Batched inputs moved to the front and padded to the largest logical rank ``r``;
    unbatched ones as they are (they broadcast from the right). Returns (new args, r)."""
    ranks = [logical_ndim(a, b) for a, b in zip(args, bdims)]
    r = max(ranks)
    return [a if b is None else pad_after_batch(move_to_front(a, b), r - n)
            for a, b, n in zip(args, bdims, ranks)], r


def _reduced_pair(name):
    """``op(x, q, dim)``: elementwise in x and q (broadcast), then reduced along ``dim``."""
    o = R[name]

    def rule(args, bdims, dim):
        new, r = _aligned(args, bdims)
        size = next(a.shape[b] for a, b in zip(args, bdims) if b is not None)
        new = [a if b is not None else expand_batch(pad_to(a, r), size)
               for a, b in zip(new, bdims)]
        return o(*new, dim=_shift(dim, r)), 0

    o.batch(rule)


for _n in ("nll_loss", "softmax_cross_entropy"):
    _reduced_pair(_n)


@R["linear_relu"].batch
def _(args, bdims):
    out, bo = R["linear"].batch_rule(args, bdims)
    return R["relu"](out), bo


# --- linear algebra on the last two dims: numpy batches the leading dims ---------------------
def _later(name):
    """Register the decorated installer for op ``name``, which is registered after this module
    (linalg): vmap runs it the first time it meets the op (``deferred``), ``rules()`` at once."""
    def deco(install):
        if name in R:
            install(R[name])
        else:
            DEFERRED[name] = install
        return install

    return deco


def _leading(name):
    """An op on the trailing (matrix) dims of one input; its output keeps the leading dims."""
    @_later(name)
    def install(o):
        def rule(args, bdims, **params):
            return o(move_to_front(args[0], bdims[0]), **params), 0

        o.batch(rule)


for _n in ("linalg_cholesky", "linalg_det", "linalg_eigh", "linalg_inv", "linalg_pinv",
           "linalg_qr", "linalg_qr_r", "linalg_slogdet", "linalg_slogdet_sign", "linalg_svd"):
    _leading(_n)


def _leading_pair(name):
    """Two matrix inputs with equal batch dims (the public function broadcast them first):
    both get the vmap batch in front (an unbatched one expanded)."""
    @_later(name)
    def install(o):
        def rule(args, bdims, **params):
            size = next(a.shape[b] for a, b in zip(args, bdims) if b is not None)
            return o(*_front(args, bdims, size), **params), 0

        o.batch(rule)


for _n in ("linalg_solve", "linalg_solve_triangular", "linalg_lstsq"):
    _leading_pair(_n)


@_later("linalg_cross")
def _(o):
    o.batch(_cross_rule)


def _cross_rule(args, bdims, dim):
    new, r = _aligned(args, bdims)
    size = next(a.shape[b] for a, b in zip(args, bdims) if b is not None)
    new = [a if b is not None else expand_batch(pad_to(a, r), size)
           for a, b in zip(new, bdims)]
    return R["linalg_cross"](*new, dim=_shift(dim, r)), 0


def pad_to(t, r):
    """Leading size-1 dims up to rank ``r`` (an unbatched input, as broadcasting would)."""
    return R["reshape"](t, shape=(1,) * (r - t.dim()) + tuple(t.shape))


# --- copies and scatters ---------------------------------------------------------------------
@R["copy"].batch
def _(args, bdims):
    a, src = args
    ba, bs = bdims
    size = a.shape[ba] if ba is not None else src.shape[bs]
    a = move_to_front(a, ba) if ba is not None else expand_batch(a, size)
    if bs is not None:
        src = pad_after_batch(move_to_front(src, bs), a.dim() - src.dim())
    return R["copy"](a, src), 0


@R["diag_embed"].batch
def _(args, bdims, shape, offset, dim1, dim2):
    a = move_to_front(args[0], bdims[0])
    nd = len(shape)
    return R["diag_embed"](a, shape=(a.shape[0],) + tuple(shape), offset=offset,
                           dim1=_shift(dim1, nd), dim2=_shift(dim2, nd)), 0


def _batch_position(index):
    """Where a front batch dim lands in ``x[(slice(None),) + index]`` (numpy's rules: advanced
    indices that are not adjacent put their broadcast dims first)."""
    import numpy as np

    key = index if isinstance(index, tuple) else (index,)
    if not any(_is_advanced(k) for k in key):
        return 0
    adv = [i for i, k in enumerate(key) if _is_advanced(k) or isinstance(k, int)]
    if adv == list(range(adv[0], adv[-1] + 1)):
        return 0
    shapes = [(int(np.count_nonzero(key[i])),) if getattr(key[i], "dtype", None) == bool
              else np.shape(key[i]) for i in adv]
    return len(np.broadcast_shapes(*shapes))


def _place(t, b, pos, rank):
    """Batched ``t`` (batch at ``b``) as a value for an indexed region of logical rank ``rank``
    whose batch sits at ``pos``: front, padded, then moved to ``pos``."""
    t = move_to_front(t, b)
    extra = (t.dim() - 1) - rank
    if extra > 0:  # leading size-1 dims beyond the region's rank (numpy drops them too)
        t = R["reshape"](t, shape=(t.shape[0],) + tuple(t.shape[1 + extra:]))
    t = pad_after_batch(t, rank - (t.dim() - 1))
    if pos == 0:
        return t
    n = t.dim()
    dims = tuple(range(1, pos + 1)) + (0,) + tuple(range(pos + 1, n))
    return R["permute"](t, dims=dims)


@R["index_backward"].batch
def _(args, bdims, shape, index, accumulate=True):
    key = index if isinstance(index, tuple) else (index,)
    if _tensor_key(key):
        return NotImplemented  # a tensor index: the loop
    g = args[0]
    pos = _batch_position(key)
    g = _place(g, bdims[0], pos, g.dim() - 1)
    return R["index_backward"](g, shape=(g.shape[pos],) + tuple(shape),
                               index=(slice(None),) + key, accumulate=accumulate), 0


@R["index_put"].batch
def _(args, bdims, index, accumulate=False, basic=False):
    key = index if isinstance(index, tuple) else (index,)
    if _tensor_key(key):
        return NotImplemented
    a, v = args
    ba, bv = bdims
    size = a.shape[ba] if ba is not None else v.shape[bv]
    a = move_to_front(a, ba) if ba is not None else expand_batch(a, size)
    if bv is not None:
        import numpy as np

        pos = _batch_position(key)
        region = np.empty(tuple(a.shape[1:]), dtype=bool)[key].ndim  # the indexed rank
        v = _place(v, bv, pos, region)
    return R["index_put"](a, v, index=(slice(None),) + key, accumulate=accumulate,
                          basic=basic), 0


# --- normalisation: the batch in front, the params reshaped with it ---------------------------
def _norm_rule(name):
    o = R[name]

    def rule(args, bdims, axes, eps, param_shape):
        size = next(a.shape[b] for a, b in zip(args, bdims) if b is not None)
        x = move_to_front(args[0], bdims[0]) if bdims[0] is not None else \
            expand_batch(args[0], size)
        nd = x.dim() - 1
        params = list(args[1:])
        if any(b is not None for b in bdims[1:]):  # per-example weights: (B,) + param_shape
            params = _front(params, bdims[1:], size)
            shape = (size,) + (1,) * (nd - len(param_shape)) + tuple(param_shape)
        else:
            shape = (1,) + tuple(param_shape)
        return o(x, *params, axes=_shift_all(axes, nd), eps=eps, param_shape=shape), 0

    o.batch(rule)


for _n in ("layer_norm", "batch_norm"):
    _norm_rule(_n)


# --- pooling and convolution: the batch folded into N, or into the channel groups -------------
@R["avg_pool2d"].batch
def _(args, bdims, **params):
    x = move_to_front(args[0], bdims[0])
    size = x.shape[0]
    return _unfold(R["avg_pool2d"](_fold(x, size), **params), size), 0


@R["avg_pool2d_backward"].batch
def _(args, bdims, **params):
    g = move_to_front(args[0], bdims[0])
    size = g.shape[0]
    return _unfold(R["avg_pool2d_backward"](_fold(g, size), **params), size), 0


def _into_channels(t, size):
    """(B, N, C, ...) -> (N, B * C, ...): each example's channels as their own groups."""
    shape = tuple(t.shape)
    t = R["permute"](t, dims=(1, 0) + tuple(range(2, len(shape))))
    return R["reshape"](t, shape=(shape[1], size * shape[2]) + shape[3:])


def _from_channels(t, size):
    """(N, B * C, ...) -> (N, B, C, ...) (the batch at dim 1)."""
    shape = tuple(t.shape)
    return R["reshape"](t, shape=(shape[0], size, shape[1] // size) + shape[2:])


def _merge_front(t):
    """(B, O, ...) -> (B * O, ...)."""
    shape = tuple(t.shape)
    return R["reshape"](t, shape=(shape[0] * shape[1],) + shape[2:])


def _conv_with_weight(name, args, bdims, groups, kw):
    """conv2d / conv2d_input of an image-like ``a`` and weights ``w``: an unbatched ``w``
    folds the batch into N; per-example weights go into channel groups."""
    a, w = args
    ba, bw = bdims
    if bw is None:
        a = move_to_front(a, ba)
        b = a.shape[0]
        return _unfold(R[name](_fold(a, b), w, groups=groups, **kw), b), 0
    b = w.shape[bw]
    a = move_to_front(a, ba) if ba is not None else expand_batch(a, b)
    out = R[name](_into_channels(a, b), _merge_front(move_to_front(w, bw)),
                  groups=groups * b, **kw)
    return _from_channels(out, b), 1


@R["conv2d"].batch
def _(args, bdims, stride, padding, dilation, groups, out_size=None):
    return _conv_with_weight("conv2d", args, bdims, groups, dict(
        stride=stride, padding=padding, dilation=dilation, out_size=out_size))


@R["conv2d_input"].batch
def _(args, bdims, size, stride, padding, dilation, groups):
    return _conv_with_weight("conv2d_input", args, bdims, groups, dict(
        size=size, stride=stride, padding=padding, dilation=dilation))


@R["conv2d_weight"].batch
def _(args, bdims, kernel, stride, padding, dilation, groups):
    x, g = args
    b = next(a.shape[d] for a, d in zip(args, bdims) if d is not None)
    x, g = _front(args, bdims, b)
    out = R["conv2d_weight"](_into_channels(x, b), _into_channels(g, b), kernel=kernel,
                             stride=stride, padding=padding, dilation=dilation,
                             groups=groups * b)
    shape = tuple(out.shape)
    return R["reshape"](out, shape=(b, shape[0] // b) + shape[1:]), 0


# --- einsum: a fresh subscript for the batch --------------------------------------------------
@R["einsum"].batch
def _(args, bdims, equation):
    lhs, out = equation.split("->")
    free = next(c for c in "ZYXWVUTSRQPONMLKJIHGFEDCBAzyxwvutsrqponmlkjihgfedcba"
                if c not in equation)
    terms = lhs.split(",")
    new = []
    for i, (a, b) in enumerate(zip(args, bdims)):
        if b is not None:
            new.append(move_to_front(a, b))
            terms[i] = free + terms[i]
        else:
            new.append(a)
    return R["einsum"](new, equation=",".join(terms) + "->" + free + out), 0


# --- embedding: the batch folded into the table's rows ------------------------------------------
def _offsets(idx, size, rows):
    """Batched indices (B, ...) into B stacked tables of ``rows`` rows: idx + b * rows."""
    off = xp.arange(size, dtype=xp.int64).reshape((size,) + (1,) * (idx.dim() - 1)) * rows
    return R["add"](idx, registry_tensor(off))


def registry_tensor(array):
    from tapegrad.ops import registry

    return registry.Tensor._make(array)


@R["embedding"].batch
def _(args, bdims, padding_idx=None, scale=None):
    w, idx = args
    bw, bi = bdims
    if bw is None:
        return R["embedding"](w, idx, padding_idx=padding_idx, scale=scale), bi
    if scale is not None and type(scale).__name__ == "BatchedArray":
        return NotImplemented
    w = move_to_front(w, bw)
    size, rows = w.shape[0], w.shape[1]
    idx = move_to_front(idx, bi) if bi is not None else expand_batch(idx, size)
    table = R["reshape"](w, shape=(size * rows,) + tuple(w.shape[2:]))
    if padding_idx is not None:  # every example's padding row: no gradient (values as they are)
        pad = xp.zeros((size, rows, 1), bool)
        pad[:, padding_idx] = True
        table = R["where"](registry_tensor(pad.reshape(size * rows, 1)), table.detach(), table)
    if scale is not None:
        scale = xp.broadcast_to(scale, (size,) + tuple(scale.shape))
    return R["embedding"](table, _offsets(idx, size, rows), scale=scale), 0


@R["embedding_backward"].batch
def _(args, bdims, num_weights, padding_idx=None, scale=None):
    if scale is not None and type(scale).__name__ == "BatchedArray":
        return NotImplemented
    size = next(a.shape[b] for a, b in zip(args, bdims) if b is not None)
    g, idx = _front(args, bdims, size)
    if scale is not None:
        scale = xp.broadcast_to(scale, (size,) + tuple(scale.shape))
    out = R["embedding_backward"](g, _offsets(idx, size, num_weights),
                                  num_weights=size * num_weights, scale=scale)
    out = R["reshape"](out, shape=(size, num_weights) + tuple(out.shape[1:]))
    if padding_idx is not None:
        keep = xp.ones((1, num_weights, 1), out._data.dtype)
        keep[0, padding_idx] = 0
        out = R["mul"](out, registry_tensor(keep))
    return out, 0


def _arr(t):
    """A physical index as the array an op's param takes (a Tensor batched further out stays
    a Tensor: the outer level unwraps it)."""
    return t._data if hasattr(t, "_data") and not is_batched(t) else t


# --- a base with a view's region replaced (in-place on a view): by positions ------------------
@R["copy_slices"].batch
def _(args, bdims, chain, inplace=False):
    from tapegrad.ops.movement import replay_view

    a, v = args[0], args[1]
    ba, bv = bdims[0], bdims[1]
    size = a.shape[ba] if ba is not None else v.shape[bv]
    a = move_to_front(a, ba) if ba is not None else expand_batch(a, size)
    shape = tuple(a.shape[1:])
    n = 1
    for s in shape:
        n *= s
    index = replay_view(xp.arange(n).reshape(shape), chain)  # each view element's position
    if bv is not None:
        v = pad_after_batch(move_to_front(v, bv), index.ndim - (v.dim() - 1))
    elif not hasattr(v, "_data"):
        v = registry_tensor(xp.asarray(v, a._data.dtype))
    flat = R["reshape"](a, shape=(size, n))
    out = R["index_put"](flat, v, index=(slice(None), index))
    return R["reshape"](out, shape=(size,) + shape), 0


# --- order statistics and scatters --------------------------------------------------------------
@R["median"].batch
def _(args, bdims, ignore_nan=False):
    a = move_to_front(args[0], bdims[0])
    size = a.shape[0]
    flat = R["reshape"](a, shape=(size, -1))
    n = flat.shape[1]
    dt = flat._data.dtype
    if n == 0:
        return registry_tensor(xp.full((size,), 0 if dt.kind in "iub" else xp.nan, dt)), 0
    order = R["sort_order"](flat, dim=1)  # NaN sorts last
    if dt.kind in "iub" or not ignore_nan:
        k = R["getitem"](order, index=(slice(None), slice((n - 1) // 2, (n - 1) // 2 + 1)))
    else:  # the lower median of each row's non-NaN values (-1: all NaN, the last: NaN)
        count = R["sum"](R["logical_not"](R["isnan"](flat)), dims=(1,), keepdim=True)
        half = R["floor_divide"](R["sub"](count, registry_tensor(xp.asarray(1))),
                                 registry_tensor(xp.asarray(2)))
        k = R["take_along_reduce"](order, idx=_arr(half), dim=1, keepdim=True)
    out = R["reshape"](R["take_along_reduce"](flat, idx=_arr(k), dim=1, keepdim=True),
                       shape=(size,))
    if dt.kind not in "iub" and not ignore_nan:  # a NaN anywhere: NaN
        out = R["where"](R["any"](R["isnan"](flat), dims=(1,)),
                         registry_tensor(xp.asarray(xp.nan, dt)), out)
    return out, 0


@R["scatter_reduce"].batch
@_to_front_params
def _(args, bdims, pbdims=None, index=None, dim=0, reduce="sum", include_self=True):
    ib = (pbdims or {}).get("index")
    size = next((a.shape[b] for a, b in zip(args, bdims) if b is not None), None)
    if size is None:
        size = index.shape[ib]
    a, src = _front(args, bdims, size)
    if ib is not None:
        index = _arr(move_to_front(index, ib))
    else:
        index = xp.broadcast_to(_arr(index), (size,) + tuple(index.shape))
    return R["scatter_reduce"](a, src, index=index, dim=_shift(dim, a.dim() - 1), reduce=reduce,
                               include_self=include_self), 0


# --- data-dependent shapes: refused, as torch.func.vmap refuses them ---------------------------
def _refuse(name, why):
    @_later(name)
    def install(o):
        def rule(args, bdims, **params):
            raise RuntimeError(f"vmap: {name}: {why}: not supported on a batched tensor inside "
                               "vmap (as torch.func.vmap)")

        o.batch(rule)


_refuse("unique", "the output's shape depends on the values")


@_later("bincount")
def _(o):
    @_to_front_params
    def rule(args, bdims, pbdims=None, idx=None, minlength=0):
        if pbdims and "idx" in pbdims:
            raise RuntimeError("vmap: bincount: the output's length depends on the batched "
                               "indices: not supported inside vmap (as torch.func.vmap)")
        w = move_to_front(args[0], bdims[0])
        size, idx = w.shape[0], _arr(idx)
        length = max(int(minlength), int(idx.max()) + 1 if idx.size else 0)
        offset = (xp.arange(size, dtype=idx.dtype)[:, None] * length + idx[None, :]).reshape(-1)
        out = o(R["reshape"](w, shape=(-1,)), idx=offset, minlength=size * length)
        return R["reshape"](out, shape=(size, length)), 0

    o.batch(rule)


# --- sparse COO values: the batch after the entries dim ----------------------------------------
for _n in ("values", "sparse_transpose", "sparse_coo_tensor_with_dims_and_tensors"):
    @_later(_n)
    def _(o):
        o.batch(lambda args, bdims: (o(*args), bdims[0]))


def _entries_first(v, b):
    """Values (nnz, ...) batched at ``b`` -> physical (nnz, B, ...)."""
    v = move_to_front(v, b)
    n = v.dim()
    return R["permute"](v, dims=(1, 0) + tuple(range(2, n)))


@_later("coalesce")
def _(o):
    o.batch(lambda args, bdims, inverse, n: (o(_entries_first(args[0], bdims[0]),
                                               inverse=inverse, n=n), 1))


@_later("to_dense")
def _(o):
    def rule(args, bdims, flat, shape):
        v = _entries_first(args[0], bdims[0])  # (nnz, B, *dense)
        size = v.shape[1]
        dense = tuple(v.shape[2:])
        lead = 1
        for s in shape[:len(shape) - len(dense)]:
            lead *= s
        out = R["index_backward"](v, shape=(lead, size) + dense, index=(flat, Ellipsis))
        out = R["permute"](out, dims=(1, 0) + tuple(range(2, out.dim())))
        return R["reshape"](out, shape=(size,) + tuple(shape)), 0

    o.batch(rule)


@_later("sparse_addmm")
def _(o):
    def rule(args, bdims, rows, cols, n):
        values, dense = args
        bvals, bd = bdims
        size = values.shape[bvals] if bvals is not None else dense.shape[bd]
        dense = move_to_front(dense, bd) if bd is not None else expand_batch(dense, size)
        picked = R["getitem"](dense, index=(slice(None), cols))  # (B, nnz[, m])
        vec = picked.dim() == 2
        if bvals is not None:
            values = move_to_front(values, bvals)
            values = values if vec else R["reshape"](values, shape=tuple(values.shape) + (1,))
        elif not vec:
            values = R["reshape"](values, shape=tuple(values.shape) + (1,))
        contrib = R["mul"](values, picked)
        shape = (size, n) + tuple(picked.shape[2:])
        return R["index_backward"](contrib, shape=shape, index=(slice(None), rows)), 0

    o.batch(rule)


@_later("to_sparse")
def _(o):
    def rule(args, bdims, index):
        a = move_to_front(args[0], bdims[0])
        return o(a, index=(slice(None),) + tuple(index)), _batch_position(index)

    o.batch(rule)
