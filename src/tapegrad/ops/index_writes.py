"""Index writes and tensor builders: ``put``, ``masked_scatter``, ``scatter_reduce``,
``index_reduce``, ``renorm``, ``block_diag``, ``cartesian_prod``, ``combinations``, ``vander``,
``movedim``/``moveaxis``, ``ravel``.

``scatter_reduce`` is an op whose gradient rule is PyTorch's ``scatter_reduce_backward``,
written with registered ops (so it records with create_graph); the others are composites.
Indices outside their range raise as PyTorch does (``out_of_range``), never wrap.
"""
import itertools
import operator

from tapegrad import dtypes
from tapegrad.backend import add_at
from tapegrad.ops import registry
from tapegrad.ops.elementwise import where_op
from tapegrad.ops.composites import _index_args
from tapegrad.ops.scan import cumprod
from tapegrad.ops.movement import _dim, broadcast_tensors, cat, flip, permute_op, reshape_op, stack
from tapegrad.ops.indexing import (_check_gather_bounds, _check_index_shape, _grid,
                                   _index_array, getitem, index_op, index_put_op, out_of_range)
from tapegrad.ops.reduce import norm_op
from tapegrad.ops.registry import op, xp


def _data(a):
    return a._data if isinstance(a, registry.Tensor) else a


# --- put, masked_scatter -----------------------------------------------------------------------
def put(input, index, source, accumulate=False):
    """As ``torch.put`` (``Tensor.put``): ``source`` written at the flat positions ``index``
    (in [-numel, numel)) of ``input``; ``accumulate=True`` adds, repeats adding up."""
    idx = _index_array(index, "put").reshape(-1)
    if source.dtype is not input.dtype:
        raise RuntimeError(f"put(): self ({input.dtype}) and source ({source.dtype}) expected "
                           f"to have the same dtype")
    if idx.size != source.numel():
        raise RuntimeError(f"put(): Expected source and index to have the same number of "
                           f"elements, but got source.numel() = {source.numel()}, "
                           f"index.numel() = {idx.size}")
    n = input.numel()
    flat_idx = xp.where(idx < 0, idx + n, idx)
    bad = out_of_range(flat_idx, n)
    if bad is not None:
        raise IndexError(f"out of range: tried to access index {bad - n if bad < 0 else bad} "
                         f"on a tensor of {n} elements.")
    out = index_put_op(reshape_op(input, shape=(-1,)), reshape_op(source, shape=(-1,)),
                       index=(flat_idx,), accumulate=accumulate)
    return reshape_op(out, shape=tuple(input.shape))


def masked_scatter(input, mask, source):
    """As ``torch.masked_scatter``: the entries of ``source``, in order, written where
    ``mask`` (broadcast with ``input``) is True."""
    if mask._data.dtype.kind != "b":
        raise RuntimeError(f"masked_scatter_ only supports boolean masks, but got mask with "
                           f"dtype {mask.dtype}")
    if source.dtype is not input.dtype:
        raise RuntimeError(f"masked_scatter: expected self and source to have same dtypes but "
                           f"got {input.dtype} and {source.dtype}")
    a, m = broadcast_tensors(input, mask)
    k = int(m._data.sum())
    if source.numel() < k:
        raise RuntimeError(f"masked_scatter: expected source to have at least as many elements "
                           f"as ones in mask (source has {source.numel()}, mask has {k})")
    src = getitem(reshape_op(source, shape=(-1,)), index=(slice(0, k),))
    return index_put_op(a, src, index=(m._data,))


# --- scatter_reduce ----------------------------------------------------------------------------
_REDUCTIONS = ("sum", "prod", "mean", "amax", "amin")


def _identity(reduce, dtype):
    if reduce in ("sum", "mean"):
        return 0
    if reduce == "prod":
        return 1
    if dtype in dtypes.FLOAT_NP:  # (bfloat16 has numpy kind "V")
        return -xp.inf if reduce == "amax" else xp.inf
    info = xp.iinfo(dtype) if dtype.kind in "iu" else None
    if info is None:  # bool
        return reduce == "amin"
    return info.min if reduce == "amax" else info.max


def _counts(shape, index, dim, include_self):
    """How many values land on each position (the self value counting once), 0 -> 1."""
    n = xp.ones(shape) if include_self else xp.zeros(shape)
    add_at(n, _grid(index, dim), xp.ones(index.shape))
    n[n == 0] = 1
    return n


@op(flops=1, saves="both", needs=True, name="scatter_reduce")
def scatter_reduce_op(a, src, index, dim, reduce, include_self=True):
    key = _grid(index, dim)
    out = a.copy()
    if not include_self:
        out[key] = _identity(reduce, a.dtype)
    if reduce in ("sum", "mean"):
        add_at(out, key, src)
    elif reduce == "prod":
        xp.multiply.at(out, key, src)
    elif reduce == "amax":
        xp.maximum.at(out, key, src)
    else:
        xp.minimum.at(out, key, src)
    if reduce == "mean":
        count = _counts(a.shape, index, dim, include_self)
        if a.dtype.kind in "iub":
            return xp.floor_divide(out, count.astype(a.dtype))
        return (out / count).astype(a.dtype, copy=False)
    return out


@scatter_reduce_op.grad
def _(g, out, a, src, index, dim, reduce, include_self=True, needs=(True, True)):
    # PyTorch's scatter_reduce_backward
    key = _grid(index, dim)

    def gather(x):
        return index_op(x, index=key, accumulate=True)

    def scatter_add(base, v):
        return index_put_op(base, v, index=key, accumulate=True)

    dt = _data(g).dtype
    if reduce == "sum":
        ga, gs = g, gather(g)
    elif reduce == "mean":
        n = _counts(a.shape, index, dim, include_self).astype(dt)
        ga, gs = g / n, gather(g) / n[key]
    elif reduce == "prod":
        if any(getattr(getattr(x, "_data", None), "value", None) is not None for x in (a, src)):
            raise RuntimeError("vmap: the gradient of scatter_reduce(reduce='prod') is not "
                               "supported on batched tensors inside vmap")
        masked_self = where_op(_data(a) == 0, 1.0, a)
        ga = g * scatter_reduce_op(masked_self, src, index=index, dim=dim, reduce="prod",
                                   include_self=include_self) / masked_self
        src_zero = _data(src) == 0
        zeros_at = xp.zeros(a.shape)
        add_at(zeros_at, key, src_zero)
        single = src_zero & (zeros_at[key] == 1)
        masked_src = where_op(single, 1.0, src)
        masked_result = scatter_reduce_op(a, masked_src, index=index, dim=dim, reduce="prod",
                                          include_self=include_self)
        gs = where_op(single, gather(g * masked_result),
                      gather(g * out) / where_op(src_zero, 1.0, src))
    else:  # amax / amin: shared evenly among the entries equal to the result
        value = gather(out)
        from tapegrad.func._vmap import host, like  # under vmap: batched masks

        ref = out if getattr(_data(out), "value", None) is not None else a
        self_is = like((host(a) == host(out)).astype(dt), ref)
        ref = value if getattr(_data(value), "value", None) is not None else src
        src_is = like((host(src) == host(value)).astype(dt), ref)
        share = g / index_put_op(self_is, src_is, index=key, accumulate=True)
        ga, gs = self_is * share, src_is * gather(share)
    if not include_self:
        ga = index_put_op(ga, 0.0, index=key)
    return ga if needs[0] else None, gs if needs[1] else None


@scatter_reduce_op.jvp
def _(t, out, a, src, index, dim, reduce, include_self=True):
    ta, ts = t[0], t[1]
    if reduce in ("sum", "mean"):  # linear in (a, src)
        zero = registry.Tensor._make
        ta = ta if ta is not None else zero(xp.zeros(tuple(a.shape), _data(out).dtype))
        ts = ts if ts is not None else zero(xp.zeros(tuple(src.shape), _data(out).dtype))
        return scatter_reduce_op(ta, ts, index=index, dim=dim, reduce=reduce,
                                 include_self=include_self)
    # prod, amax, amin: each output depends on its own entry of a and the src entries
    # scattered to it, so J t = D_a t_a + scatter_add(D_src t_src), the local derivatives D
    # being the gradient rule at g = 1
    ones = registry.Tensor._make(xp.ones(tuple(out.shape), _data(out).dtype))
    da, ds = scatter_reduce_op.rule(ones, out, a, src, index, dim, reduce, include_self,
                                    needs=(ta is not None, ts is not None))
    r = da * ta if ta is not None else None
    if ts is not None:
        rs = index_put_op(ones * 0, ds * ts, index=_grid(index, dim), accumulate=True)
        r = rs if r is None else r + rs
    return r


def _scatter_reduce_args(name, input, dim, index, src):
    idx = _index_array(index, name)
    d = _dim(dim, input.ndim, name)
    if src.dtype is not input.dtype:
        raise RuntimeError(f"{name}(): Expected self.dtype to be equal to src.dtype (got "
                           f"{input.dtype} and {src.dtype})")
    _check_index_shape(input, d, idx, name)
    if idx.ndim != max(src.ndim, 1) and not (idx.ndim == 0 and src.ndim <= 1) or any(
            i > s for i, s in zip(idx.shape, src.shape)):
        raise RuntimeError(f"{name}(): Expected index {list(idx.shape)} to be no larger than "
                           f"self {list(input.shape)} apart from dimension {d} and to be no "
                           f"larger size than src {list(src.shape)}")
    idx = _check_gather_bounds(index, idx, input.shape[d] if input.ndim else 1, d, name)
    return idx, d


def scatter_reduce(input, dim, index, src, reduce, *, include_self=True):
    """As ``torch.scatter_reduce``: ``src`` reduced into ``input`` at ``index`` along ``dim``
    with ``reduce`` in ``sum``, ``prod``, ``mean``, ``amax``, ``amin`` (``include_self=False``:
    the written positions start from the values alone); PyTorch's gradients.

    >>> x = tapegrad.zeros(3)
    >>> x.scatter_reduce(0, tapegrad.tensor([0, 0, 2]), tapegrad.tensor([1., 2., 3.]), "amax")
    tensor([2., 0., 3.])
    """
    if reduce not in _REDUCTIONS:
        raise RuntimeError(f"reduce argument must be either sum, prod, mean, amax or amin, got "
                           f"{reduce}")
    idx, d = _scatter_reduce_args("scatter_reduce", input, dim, index, src)
    if input.ndim == 0 or idx.ndim == 0:
        flat = reshape_op(input, shape=(-1,))
        out = scatter_reduce(flat, 0, idx.reshape(-1), reshape_op(src, shape=(-1,)), reduce,
                             include_self=include_self)
        return reshape_op(out, shape=tuple(input.shape))
    if tuple(src.shape) != idx.shape:  # only src[:index.shape] takes part
        src = getitem(src, index=tuple(slice(0, k) for k in idx.shape))
    return scatter_reduce_op(input, src, index=idx, dim=d, reduce=reduce,
                             include_self=include_self)


def index_reduce(input, dim, index, source, reduce, *, include_self=True):
    """As ``torch.index_reduce``: ``source[..., i, ...]`` reduced into
    ``input[..., index[i], ...]`` along ``dim`` with ``reduce`` in ``prod``, ``mean``,
    ``amax``, ``amin`` (a ``scatter_reduce`` with the index spread over ``source``)."""
    if reduce not in ("prod", "mean", "amax", "amin"):
        raise RuntimeError(f"index_reduce(): Expected reduce to be one of prod, mean, amax or "
                           f"amin but got {reduce}.")
    idx, d = _index_args("index_reduce", input, dim, index)
    if source.dtype is not input.dtype:
        raise RuntimeError(f"index_reduce(): self ({input.dtype}) and source ({source.dtype}) "
                           f"must have the same scalar type")
    want = tuple(input.shape[:d]) + (idx.size,) + tuple(input.shape[d + 1:])
    if input.ndim and tuple(source.shape) != want:
        raise RuntimeError(f"index_reduce(): source of shape {tuple(source.shape)} does not "
                           f"match the indexed shape {want} (input {tuple(input.shape)}, dim "
                           f"{d}, {idx.size} indices)")
    if input.ndim == 0:
        return scatter_reduce(input, 0, idx.reshape(()), reshape_op(source, shape=()), reduce,
                              include_self=include_self)
    shape = [1] * input.ndim
    shape[d] = idx.size
    full = xp.broadcast_to(idx.reshape(shape), want)
    return scatter_reduce_op(input, source, index=full, dim=d, reduce=reduce,
                             include_self=include_self)


# --- builders ---------------------------------------------------------------------------------
def renorm(input, p, dim, maxnorm):
    """As ``torch.renorm``: each slice along ``dim`` whose ``p``-norm exceeds ``maxnorm`` is
    scaled to norm ``maxnorm`` (by ``maxnorm / (norm + 1e-7)``, as PyTorch)."""
    if p <= 0:
        raise RuntimeError(f"renorm: non-positive-norm not supported (p={p})")
    if maxnorm < 0:
        raise RuntimeError(f"renorm: expected maxnorm to be >= 0 but got {maxnorm}")
    if input.ndim <= 1:
        raise RuntimeError(f"renorm: input needs at least 2 dimensions, got {input.ndim} "
                           f"dimensions")
    if input._data.dtype.kind in "iub":
        raise RuntimeError(f"renorm: expected a floating-point input, got {input.dtype}")
    d = _dim(dim, input.ndim, "renorm")
    norm = norm_op(input, p=p, dims=tuple(i for i in range(input.ndim) if i != d),
                   keepdim=True)
    factor = where_op(norm > maxnorm, maxnorm / (norm + 1e-7), 1.0)  # (an op: vmap-safe)
    return input * factor


def _zeros(shape, dt):
    return registry.Tensor._make(xp.zeros(shape, dt.np))


def block_diag(*tensors):
    """As ``torch.block_diag``: the tensors (0-d, 1-d as a row, or 2-d) along the diagonal of
    a zero matrix, in their promoted dtype.

    >>> tapegrad.block_diag(tapegrad.ones(1, 1), tapegrad.ones(2, 2)).shape     # (3, 3)
    """
    mats = []
    for i, t in enumerate(tensors):
        if t.ndim > 2:
            raise RuntimeError(f"torch.block_diag: Input tensors must have 2 or fewer "
                               f"dimensions. Input {i} has {t.ndim} dimensions")
        mats.append(reshape_op(t, shape=(1, 1)) if t.ndim == 0 else
                    reshape_op(t, shape=(1, -1)) if t.ndim == 1 else t)
    if not mats:
        return _zeros((1, 0), dtypes.get_default_dtype())
    dt = dtypes.result_type(*mats)
    mats = [m if m.dtype is dt else m.to(dt) for m in mats]
    width = sum(m.shape[1] for m in mats)
    rows, col = [], 0
    for m in mats:
        r, c = m.shape
        rows.append(cat([_zeros((r, col), dt), m, _zeros((r, width - col - c), dt)], 1))
        col += c
    return cat(rows, 0)


def _check_vector(name, t):
    if t.ndim != 1:
        raise RuntimeError(f"{name}: Expect a 1D vector, but got shape {list(t.shape)}")


def cartesian_prod(*tensors):
    """As ``torch.cartesian_prod``: the rows of all combinations of the 1-d tensors' entries
    (the first varying slowest); one tensor is returned as it is."""
    from tapegrad.ops.composites import meshgrid

    for t in tensors:
        _check_vector("cartesian_prod", t)
    if len(tensors) == 1:
        return tensors[0]
    if any(t.dtype is not tensors[0].dtype for t in tensors):
        raise RuntimeError("meshgrid expects all tensors to have the same dtype")
    grids = meshgrid(*tensors, indexing="ij")
    return stack([reshape_op(g, shape=(-1,)) for g in grids], 1)


def combinations(input, r=2, with_replacement=False):
    """As ``torch.combinations``: the length-``r`` combinations of a 1-d tensor's entries,
    as rows (``itertools.combinations`` order; with replacement on request)."""
    _check_vector("combinations", input)
    r = operator.index(r)
    if r < 0:
        raise RuntimeError(f"Expect a non-negative number, but got {r}")
    if r == 0:
        return registry.Tensor._make(xp.zeros((0,), input._data.dtype))
    n = input.shape[0]
    pick = itertools.combinations_with_replacement if with_replacement else \
        itertools.combinations
    idx = xp.array(list(pick(range(n), r)), dtype=xp.int64).reshape(-1, r)
    return index_op(input, index=(idx,), accumulate=True)


def vander(x, N=None, increasing=False):
    """As ``torch.vander``: columns ``x**(N-1), ..., x, 1`` (``increasing``: reversed), by
    PyTorch's cumulative product; integer input gives int64.

    >>> tapegrad.vander(tapegrad.tensor([1, 2, 3]), N=3)     # [[1, 1, 1], [4, 2, 1], [9, 3, 1]]
    """
    if x.ndim != 1:
        raise RuntimeError(f"x must be a one-dimensional tensor (got shape {tuple(x.shape)}).")
    n = x.shape[0] if N is None else operator.index(N)
    if n < 0:
        raise RuntimeError("N must be non-negative.")
    dt = dtypes.promote_types(x.dtype, dtypes.int64)
    if x.dtype is not dt:
        x = x.to(dt)
    if n == 0:
        return _zeros((x.shape[0], 0), dt)
    ones = registry.Tensor._make(xp.ones((x.shape[0], 1), dt.np))
    if n == 1:
        out = ones
    else:
        powers = cumprod(reshape_op(x, shape=(-1, 1)).expand(x.shape[0], n - 1), 1)
        out = cat([ones, powers], 1)
    return out if increasing else flip(out, 1)


def movedim(input, source, destination):
    """As ``torch.movedim`` / ``moveaxis``: the dims ``source`` moved to ``destination``, the
    others keeping their order."""
    src = list(source) if isinstance(source, (list, tuple)) else [source]
    dst = list(destination) if isinstance(destination, (list, tuple)) else [destination]
    if len(src) != len(dst):
        raise RuntimeError(f"movedim: Invalid source or destination dims: source ({src} dims) "
                           f"should contain the same number of dims as destination ({dst} "
                           f"dims)")
    src = [_dim(s, input.ndim, "movedim") for s in src]
    dst = [_dim(d, input.ndim, "movedim") for d in dst]
    for what, dims in (("source", src), ("destination", dst)):
        if len(set(dims)) != len(dims):
            raise RuntimeError(f"movedim: repeated dim in `{what}` ({dims})")
    if input.ndim == 0:
        return permute_op(input, dims=())
    order = [None] * input.ndim
    for s, d in zip(src, dst):
        order[d] = s
    rest = iter(i for i in range(input.ndim) if i not in src)
    order = [next(rest) if o is None else o for o in order]
    return permute_op(input, dims=tuple(order))


moveaxis = movedim


def ravel(input):
    """As ``torch.ravel``: the entries as a 1-d tensor."""
    return reshape_op(input, shape=(-1,))


__all__ = ["put", "masked_scatter", "scatter_reduce", "index_reduce", "renorm", "block_diag",
           "cartesian_prod", "combinations", "vander", "movedim", "moveaxis", "ravel"]
TENSOR_METHODS = ["put", "masked_scatter", "scatter_reduce", "index_reduce", "renorm",
                  "movedim", "moveaxis", "ravel"]
INPLACE = ["put", "masked_scatter", "scatter_reduce", "index_reduce", "renorm"]
