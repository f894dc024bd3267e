"""Reductions, comparisons, index ops and matrix products built as composites of registered
ops (so their gradients, second order included, come from the ops they are made of):
``nansum``/``nanmean``, ``std_mean``/``var_mean``, ``aminmax``, ``count_nonzero``,
``isclose``/``allclose``/``equal``, ``nonzero``/``argwhere``, ``tril_indices``/
``triu_indices``, ``addmm``/``baddbmm``/``addmv``/``addr``, ``tensordot``, ``meshgrid``,
``rot90``, ``masked_select``, ``index_add``/``index_copy``/``index_fill``, ``scatter``, ``take``.

Index-taking ops check every index against the size of its dim first and raise as PyTorch
does (IndexError or RuntimeError); they never wrap.
"""
import collections
import operator

from tapegrad.ops import registry
from tapegrad.ops.elementwise import where_op, isnan, logical_not
from tapegrad.ops.linalg import bmm, einsum, matmul, mm, outer
from tapegrad.ops.movement import _dim, _dims, broadcast_tensors, flip, reshape_op, transpose
from tapegrad.ops.indexing import (_grid, _index_array, _check_index_shape, getitem, index_op,
                                   index_put_op, range_checked, _check_gather_bounds)
from tapegrad.ops.reduce import amax, amin, mean, std, sum, var
from tapegrad.ops.registry import xp

Tensor = None  # registry.Tensor, looked up at call time


# --- reductions -----------------------------------------------------------------------------
def nansum(input, dim=None, keepdim=False, *, dtype=None):
    """As ``torch.nansum``: ``sum`` treating NaN as zero (whose gradient is then zero)."""
    if input._data.dtype.kind not in "iub":
        input = where_op(isnan(input), 0.0, input)
    return sum(input, dim, keepdim, dtype=dtype)


def nanmean(input, dim=None, keepdim=False, *, dtype=None):
    """As ``torch.nanmean``: the mean of the non-NaN entries (NaN where there are none)."""
    if input._data.dtype.kind in "iub":
        raise RuntimeError(f"nanmean(): expected input to have floating point or complex dtype "
                           f"but got {input.dtype}")
    count = sum(logical_not(isnan(input)), dim, keepdim)
    return nansum(input, dim, keepdim, dtype=dtype) / count


def std_mean(input, dim=None, unbiased=None, keepdim=False, *, correction=None):
    """As ``torch.std_mean``: ``(std, mean)`` over the same dims."""
    return (std(input, dim, unbiased, keepdim, correction=correction),
            mean(input, dim, keepdim))


def var_mean(input, dim=None, unbiased=None, keepdim=False, *, correction=None):
    """As ``torch.var_mean``: ``(var, mean)`` over the same dims."""
    return (var(input, dim, unbiased, keepdim, correction=correction),
            mean(input, dim, keepdim))


AminmaxResult = collections.namedtuple("aminmax", ["min", "max"])


def aminmax(input, *, dim=None, keepdim=False):
    """As ``torch.aminmax``: ``(amin, amax)`` over ``dim`` (all dims when None)."""
    d = () if dim is None else dim
    if dim is None and input.numel() == 0:
        raise RuntimeError("aminmax(): cannot compute aminmax over an empty dimension as the "
                           "operation has no identity.")
    return AminmaxResult(amin(input, d, keepdim), amax(input, d, keepdim))


def count_nonzero(input, dim=None):
    """As ``torch.count_nonzero``: int64 counts of the nonzero entries over ``dim``."""
    d = None if dim is None else _dims(dim, input.ndim, "count_nonzero")
    return registry.Tensor._make(xp.asarray(xp.count_nonzero(input._data, axis=d))).long()


# --- comparisons (no gradient) ----------------------------------------------------------------
def isclose(input, other, rtol=1e-05, atol=1e-08, equal_nan=False):
    """As ``torch.isclose``: ``|input - other| <= atol + rtol * |other|`` (or equal)."""
    if input.dtype is not other.dtype:
        raise RuntimeError(f"isclose: {input.dtype} did not match {other.dtype}")
    if rtol < 0 or atol < 0:
        raise RuntimeError(f"isclose: rtol ({rtol}) and atol ({atol}) must be non-negative")
    a, b = input._data, other._data
    if a.dtype.kind in "iub":
        a, b = a.astype(xp.float64), b.astype(xp.float64)
    return registry.Tensor._make(
        xp.asarray(xp.isclose(a, b, rtol=rtol, atol=atol, equal_nan=equal_nan)))


def allclose(input, other, rtol=1e-05, atol=1e-08, equal_nan=False):
    """As ``torch.allclose``: whether every pair ``isclose`` (a Python bool)."""
    return bool(isclose(input, other, rtol, atol, equal_nan)._data.all())


def equal(input, other):
    """As ``torch.equal``: same shape and the same values (a Python bool; NaN != NaN)."""
    return input.shape == other.shape and bool(xp.array_equal(input._data, other._data))


def nonzero(input, *, as_tuple=False):
    """As ``torch.nonzero``: the (n, ndim) int64 indices of the nonzero entries, in row-major
    order; ``as_tuple=True`` gives one index vector per dim."""
    idx = xp.nonzero(xp.atleast_1d(input._data))
    if as_tuple:
        return tuple(registry.Tensor._make(i.astype(xp.int64)) for i in idx)
    out = xp.stack(idx, axis=1).astype(xp.int64) if input.ndim else \
        xp.zeros((len(idx[0]), 0), xp.int64)
    return registry.Tensor._make(xp.asarray(out))


def argwhere(input):
    """As ``torch.argwhere``: ``nonzero(input)``."""
    return nonzero(input)


def _tri_indices(name, fn, row, col, offset, dtype):
    if row < 0 or col < 0:
        raise RuntimeError(f"{name}: row and col must be non-negative, got {row} and {col}")
    r, c = fn(row, offset, col)
    from tapegrad.dtypes import to_dtype, int64

    return registry.Tensor._make(
        xp.stack([r, c]).astype((to_dtype(dtype) if dtype else int64).np))


def tril_indices(row, col, offset=0, *, dtype=None, device=None, layout=None):
    """As ``torch.tril_indices``: a (2, N) tensor of the lower triangle's coordinates."""
    return _tri_indices("tril_indices", xp.tril_indices, row, col, offset, dtype)


def triu_indices(row, col, offset=0, *, dtype=None, device=None, layout=None):
    """As ``torch.triu_indices``: a (2, N) tensor of the upper triangle's coordinates."""
    return _tri_indices("triu_indices", xp.triu_indices, row, col, offset, dtype)


# --- matrix products with an added term ---------------------------------------------------------
def _scaled_sum(input, product, beta, alpha):
    if alpha != 1:
        product = product * alpha
    if beta == 0:  # as PyTorch: input is ignored (NaN in it does not propagate)
        return product + 0 * where_op(isnan(input), 0.0, input)
    return (input * beta if beta != 1 else input) + product


def addmm(input, mat1, mat2, *, beta=1, alpha=1):
    """As ``torch.addmm``: ``beta * input + alpha * (mat1 @ mat2)``."""
    return _scaled_sum(input, mm(mat1, mat2), beta, alpha)


def baddbmm(input, batch1, batch2, *, beta=1, alpha=1):
    """As ``torch.baddbmm``: ``beta * input + alpha * bmm(batch1, batch2)``."""
    return _scaled_sum(input, bmm(batch1, batch2), beta, alpha)


def addmv(input, mat, vec, *, beta=1, alpha=1):
    """As ``torch.addmv``: ``beta * input + alpha * (mat @ vec)``."""
    if mat.ndim != 2 or vec.ndim != 1:
        raise RuntimeError(f"addmv: vector + matrix @ vector expected, got {input.ndim}, "
                           f"{mat.ndim}, {vec.ndim}")
    return _scaled_sum(input, matmul(mat, vec), beta, alpha)


def addr(input, vec1, vec2, *, beta=1, alpha=1):
    """As ``torch.addr``: ``beta * input + alpha * outer(vec1, vec2)``."""
    return _scaled_sum(input, outer(vec1, vec2), beta, alpha)


_LETTERS = "abcdefghijklmnopqrstuvwxyz"


def tensordot(a, b, dims=2):
    """As ``torch.tensordot``: contract the last ``dims`` dims of ``a`` with the first of ``b``,
    or the listed pairs ``dims=([dims of a], [dims of b])``."""
    if isinstance(dims, int) or (isinstance(dims, registry.Tensor) and dims.ndim == 0):
        n = int(dims)
        if n < 0:
            raise RuntimeError(f"tensordot expects dims >= 0, but got dims={n}")
        da, db = list(range(a.ndim - n, a.ndim)), list(range(n))
    else:
        da, db = [list(d) if isinstance(d, (list, tuple)) else [d] for d in dims]
    if len(da) != len(db):
        raise RuntimeError(f"tensordot: both dimension lists should have the same length "
                           f"(got {da} and {db})")
    da = [_dim(d, a.ndim, "tensordot") for d in da]
    db = [_dim(d, b.ndim, "tensordot") for d in db]
    for i, j in zip(da, db):
        if a.shape[i] != b.shape[j]:
            raise RuntimeError(f"tensordot: contracted dimensions need to match, but first has "
                               f"size {a.shape[i]} in dim {i} and second has size {b.shape[j]} "
                               f"in dim {j}")
    la = list(_LETTERS[:a.ndim])
    lb = list(_LETTERS[a.ndim:a.ndim + b.ndim])
    for i, j in zip(da, db):
        lb[j] = la[i]
    out = [c for k, c in enumerate(la) if k not in da] + \
        [c for k, c in enumerate(lb) if k not in db]
    return einsum(f"{''.join(la)},{''.join(lb)}->{''.join(out)}", a, b)


def meshgrid(*tensors, indexing="ij"):
    """As ``torch.meshgrid``: coordinate grids from 1-d tensors (``indexing='ij'`` or
    ``'xy'``); each output is an expanded view of its input."""
    if len(tensors) == 1 and isinstance(tensors[0], (list, tuple)):
        tensors = tuple(tensors[0])
    if indexing not in ("ij", "xy"):
        raise RuntimeError(f"meshgrid: indexing must be one of 'xy' or 'ij', got {indexing}")
    for t in tensors:
        if t.ndim > 1:
            raise RuntimeError(f"meshgrid: Expected 0D or 1D tensor in the tensor list but got "
                               f"a tensor of shape {tuple(t.shape)}")
    ts = list(tensors)
    swap = indexing == "xy" and len(ts) >= 2
    if swap:
        ts[0], ts[1] = ts[1], ts[0]
    shape = tuple(t.numel() for t in ts)
    n = len(ts)
    out = [reshape_op(t, shape=(1,) * k + (-1,) + (1,) * (n - k - 1)).expand(*shape)
           for k, t in enumerate(ts)]
    if swap:
        out[0], out[1] = out[1], out[0]
    return tuple(out)


def rot90(input, k=1, dims=(0, 1)):
    """As ``torch.rot90``: rotate by ``k`` quarter turns in the plane ``dims`` (from the
    first towards the second axis)."""
    if len(dims) != 2:
        raise RuntimeError(f"rot90: expected total rotation dims == 2, but got dims = "
                           f"{len(dims)}")
    if input.ndim < 2:
        raise RuntimeError(f"rot90: expected total dims >= 2, but got total dims = {input.ndim}")
    d0, d1 = _dim(dims[0], input.ndim, "rot90"), _dim(dims[1], input.ndim, "rot90")
    if d0 == d1:
        raise RuntimeError(f"rot90: expected rotation dims to be different, but got dim0 = "
                           f"{d0} and dim1 = {d1}")
    k = operator.index(k) % 4
    if k == 1:
        return transpose(flip(input, d1), d0, d1)
    if k == 2:
        return flip(input, (d0, d1))
    if k == 3:
        return flip(transpose(input, d0, d1), d1)
    return input.clone()


# --- index ops ------------------------------------------------------------------------------
def masked_select(input, mask):
    """As ``torch.masked_select``: the entries where ``mask`` (broadcast with ``input``) is
    True, as a 1-d tensor."""
    if mask._data.dtype.kind != "b":
        raise RuntimeError(f"masked_select: expected BoolTensor for mask, got {mask.dtype}")
    if getattr(input._data, "value", None) is not None or \
            getattr(mask._data, "value", None) is not None:
        raise RuntimeError("vmap: masked_select's output shape depends on the data of each "
                           "example; it is not supported under tapegrad.func.vmap (as PyTorch)")
    a, m = broadcast_tensors(input, mask)
    return getitem(a, index=(m._data,))


def _index_args(name, input, dim, index, negative=False, exc=IndexError):
    """The index vector and dim; indices outside [0, n) (with ``negative``: [-n, n)) raise
    ``exc``, as PyTorch's kernel for ``name`` does."""
    idx = _index_array(index, name)
    if idx.ndim > 1:
        raise IndexError(f"{name}(): Index is supposed to be a vector (got shape "
                         f"{tuple(idx.shape)})")
    d = _dim(dim, input.ndim, name)
    n = input.shape[d] if input.ndim else 1
    idx = range_checked(index, idx, n, f"{name}(): index {{}} is out of bounds for dimension "
                        f"{d} with size {n} (input of shape {tuple(input.shape)})",
                        exc.__name__, negative=negative)[1]
    return idx.reshape(-1), d


def _source_shape(name, input, d, idx, source):
    want = input.shape[:d] + (idx.size,) + input.shape[d + 1:] if input.ndim else \
        (idx.size,) if idx.size != 1 else ()
    if tuple(source.shape) != tuple(want) and not (input.ndim == 0 and source.numel() == 1):
        raise RuntimeError(f"{name}(): source of shape {tuple(source.shape)} does not match "
                           f"the indexed shape {tuple(want)} (input {tuple(input.shape)}, "
                           f"dim {d}, {idx.size} indices)")


def _key(input, d, idx):
    return (slice(None),) * d + (idx,) if input.ndim else (idx.reshape(-1) * 0,)


def _as_input_dtype(name, input, source):
    if source.dtype is not input.dtype:
        raise RuntimeError(f"{name}(): self ({input.dtype}) and source ({source.dtype}) must "
                           f"have the same scalar type")


def index_add(input, dim, index, source, *, alpha=1):
    """As ``torch.index_add``: ``out[..., index[i], ...] += alpha * source[..., i, ...]``
    along ``dim`` (repeated indices add up)."""
    idx, d = _index_args("index_add", input, dim, index, exc=RuntimeError)
    _as_input_dtype("index_add", input, source)
    _source_shape("index_add", input, d, idx, source)
    src = source * alpha if alpha != 1 else source
    if input.ndim == 0:
        return reshape_op(index_put_op(reshape_op(input, shape=(1,)), reshape_op(
            src, shape=(-1,)), index=(idx * 0,), accumulate=True), shape=())
    return index_put_op(input, src, index=_key(input, d, idx), accumulate=True)


def index_copy(input, dim, index, source):
    """As ``torch.index_copy``: ``out[..., index[i], ...] = source[..., i, ...]``."""
    idx, d = _index_args("index_copy", input, dim, index)
    _as_input_dtype("index_copy", input, source)
    _source_shape("index_copy", input, d, idx, source)
    if input.ndim == 0:
        return reshape_op(index_put_op(reshape_op(input, shape=(1,)), reshape_op(
            source, shape=(-1,)), index=(idx * 0,)), shape=())
    return index_put_op(input, source, index=_key(input, d, idx))


def index_fill(input, dim, index, value):
    """As ``torch.index_fill``: the slices at ``index`` along ``dim`` set to ``value`` (a
    number or a 0-d tensor, which then receives the gradient)."""
    idx, d = _index_args("index_fill", input, dim, index, negative=True)
    if isinstance(value, registry.Tensor):
        if value.ndim != 0:
            raise RuntimeError(f"index_fill(): only supports a 0-dimensional value tensor, but "
                               f"got tensor with {value.ndim} dimension(s).")
        if value.dtype is not input.dtype:
            value = value.to(input.dtype)
    if input.ndim == 0:
        return reshape_op(index_put_op(reshape_op(input, shape=(1,)), value,
                                       index=(idx * 0,)), shape=())
    return index_put_op(input, value, index=_key(input, d, idx))


def scatter(input, dim, index, src=None, *, value=None, reduce=None):
    """As ``torch.scatter``: ``out[index[i][j]][j] = src[i][j]`` for ``dim=0`` (``src`` a
    tensor, or a number as ``value``); ``reduce='add'``/``'multiply'`` as PyTorch's."""
    if src is None and value is None:
        raise TypeError("scatter(): pass src (a tensor) or value (a number)")
    if src is not None and not isinstance(src, registry.Tensor):
        src, value = None, src
    idx = _index_array(index, "scatter")
    d = _dim(dim, input.ndim, "scatter")
    _check_index_shape(input, d, idx, "scatter")
    if src is not None:
        if src.dtype is not input.dtype:
            raise RuntimeError(f"scatter(): Expected self.dtype to be equal to src.dtype (got "
                               f"{input.dtype} and {src.dtype})")
        if idx.ndim != src.ndim or any(i > s for i, s in zip(idx.shape, src.shape)):
            raise RuntimeError(f"scatter(): Expected index {list(idx.shape)} to be no larger "
                               f"than self {list(input.shape)} apart from dimension {d} and to "
                               f"be no larger size than src {list(src.shape)}")
    n = input.shape[d] if input.ndim else 1
    idx = _check_gather_bounds(index, idx, n, d, "scatter")
    if input.ndim == 0:
        flat = reshape_op(input, shape=(1,))
        s = reshape_op(src, shape=(1,)) if src is not None else None
        out = scatter(flat, 0, idx.reshape(1), s, value=value, reduce=reduce)
        return reshape_op(out, shape=())
    if src is not None and tuple(src.shape) != idx.shape:
        src = getitem(src, index=tuple(slice(0, k) for k in idx.shape))
    key = _grid(idx, d)
    if reduce is None:
        return index_put_op(input, src if src is not None else value, index=key)
    if reduce not in ("add", "multiply"):
        raise RuntimeError(f"scatter(): reduce argument must be either add or multiply, got "
                           f"{reduce!r}")
    v = src if src is not None else registry.Tensor._make(xp.full(idx.shape, value,
                                                          input._data.dtype))
    if input.requires_grad or getattr(v, "requires_grad", False):
        raise RuntimeError(f"scatter(reduce={reduce!r}): the derivative is not implemented (as "
                           "in PyTorch); use scatter_add or scatter_reduce")
    if reduce == "add":
        return index_put_op(input, v, index=key, accumulate=True)
    out = input._data.copy()
    xp.multiply.at(out, key, v._data)
    return registry.Tensor._make(out)


def take(input, index):
    """As ``torch.take``: entries of the flattened ``input`` at ``index`` (shape of
    ``index``); indices in [-numel, numel), others raise."""
    idx = _index_array(index, "take")
    n = input.numel()
    idx = range_checked(index, idx, n, f"take(): out of range: tried to access index {{}} on a "
                        f"tensor of {n} elements.", negative=True)[1]
    return index_op(reshape_op(input, shape=(-1,)), index=(idx,), accumulate=True)


__all__ = ["nansum", "nanmean", "std_mean", "var_mean", "aminmax", "count_nonzero", "isclose",
           "allclose", "equal", "nonzero", "argwhere", "tril_indices", "triu_indices", "addmm",
           "baddbmm", "addmv", "addr", "tensordot", "meshgrid", "rot90", "masked_select",
           "index_add", "index_copy", "index_fill", "scatter", "take"]
TENSOR_METHODS = [n for n in __all__ if n not in ("std_mean", "var_mean", "tril_indices",
                                                  "triu_indices", "tensordot", "meshgrid")]
INPLACE = ["addmm", "baddbmm", "addmv", "addr", "index_add", "index_copy", "index_fill",
           "scatter"]
