"""Movement ops: broadcast, reshape, permute, indexing, cat, pad. Views where numpy gives views.

The primitives are few: ``broadcast_to``/``sum_to`` (the only un-broadcasting), ``reshape``,
``permute``, the indexing family (``getitem`` for basic indexing, ``index`` for integer-array
and mask indexing, ``index_backward`` and ``index_put``) through which gather, scatter_add,
index_select, split and the non-constant pads are expressed, then ``cat``, ``stack``,
``repeat``, ``flip``, ``roll``, ``tril``/``triu`` and ``constant_pad_nd``. squeeze, flatten,
expand and friends are reshapes, permutes and broadcasts.
"""
import operator
import warnings

from tapegrad import dtypes
from tapegrad.ops import elementwise as _E
from tapegrad.ops.registry import op, xp
from tapegrad.ops import registry as _registry
from tapegrad.amp.autocast_mode import autocast_composite  # PyTorch's autocast lists


@op(saves="none", view=True, name="broadcast_to", linear=True)
def broadcast_to_op(a, shape):
    """As ``torch.broadcast_to``. Its gradient, ``sum_to``, is the only un-broadcast rule."""
    if a.flags.c_contiguous:
        # a zero-stride view built directly: ~10x cheaper than xp.broadcast_to's checks
        lead = len(shape) - a.ndim
        strides = [0] * lead
        for n, m, s in zip(a.shape, shape[lead:], a.strides):
            if n == m:
                strides.append(s)
            elif n == 1:
                strides.append(0)
            else:
                raise ValueError(f"cannot broadcast shape {a.shape} to {tuple(shape)}")
        if lead >= 0:
            try:
                out = xp.ndarray(shape, a.dtype, a, 0, strides)
            except (TypeError, ValueError, BufferError):
                return xp.broadcast_to(a, shape)
            out.flags.writeable = False
            return out
    return xp.broadcast_to(a, shape)


@broadcast_to_op.grad
def _(g, out, a, shape):
    return sum_to(g, shape=a.shape)


@op(flops=1, saves="none", linear=True)
def sum_to(a, shape):
    """Sum ``a`` down to ``shape`` (the inverse of broadcasting)."""
    shape = tuple(shape)
    if a.shape == shape:
        return a
    lead = a.ndim - len(shape)
    axes = tuple(range(lead)) + tuple(
        i + lead for i, n in enumerate(shape) if n == 1 and a.shape[i + lead] != 1)
    s = a.sum(axis=axes, keepdims=True)
    return s.reshape(shape) if lead else s


@sum_to.grad
def _(g, out, a, shape):
    return broadcast_to_op(g, shape=a.shape)


_registry.per_input_element(sum_to)  # a reduction: FLOPs per input element


@op(saves="none", view=True, name="reshape", linear=True)
def reshape_op(a, shape):
    try:
        return a.reshape(shape)
    except ValueError:
        raise RuntimeError(f"reshape: shape '{list(shape)}' is invalid for input of size "
                           f"{a.size}") from None


@reshape_op.grad
def _(g, out, a, shape):
    return reshape_op(g, shape=a.shape)


@op(saves="none", view=True, name="permute", linear=True)
def permute_op(a, dims):
    return a.transpose(dims)


@permute_op.grad
def _(g, out, a, dims):
    return permute_op(g, dims=tuple(int(i) for i in xp.argsort(dims)))


# --- indexing: one key format (a tuple numpy understands, normalised by ``index_key``) ---
@op(saves="none", view=True, name="getitem", linear=True)
def getitem(a, index):
    """Basic indexing (ints, slices, None, Ellipsis): a view, as in numpy and PyTorch."""
    return a[index]


@getitem.grad
def _(g, out, a, index):
    return index_backward(g, shape=a.shape, index=index, accumulate=False)


@op(saves="none", name="index", linear=True)
def index_op(a, index, accumulate=True):
    """Integer-array / mask indexing (a copy). ``accumulate``: the index may repeat elements."""
    return a[index]


@index_op.grad
def _(g, out, a, index, accumulate=True):
    return index_backward(g, shape=a.shape, index=index, accumulate=accumulate)


@op(saves="none", linear=True)
def index_backward(g, shape, index, accumulate=True):
    """``zeros(shape)`` with ``g`` put at ``index``; repeated indices add (``np.add.at``)."""
    if accumulate and len(index) == 2 and index[1] is Ellipsis and g.dtype.kind == "f" \
            and isinstance(index[0], xp.ndarray) and index[0].dtype.kind in "iu":
        return _add_rows(g, shape, index[0])
    out = xp.zeros(shape, dtype=g.dtype)
    if accumulate:
        xp.add.at(out, index, g)
    else:
        out[index] = g
    return out


def _add_rows(g, shape, rows):
    """``zeros(shape)`` with the rows of ``g`` added at ``rows`` (x[idx]'s gradient, as in an
    embedding): one bincount, ~4x faster than ``np.add.at`` and summing in the same order."""
    n = shape[0]
    width = 1
    for m in shape[1:]:
        width *= m
    rows = rows.reshape(-1)
    rows = xp.where(rows < 0, rows + n, rows)
    flat = rows if width == 1 else (rows[:, None] * width + xp.arange(width)).reshape(-1)
    out = xp.bincount(flat, weights=g.reshape(-1), minlength=n * width)
    return out.astype(g.dtype, copy=False).reshape(shape)


@index_backward.grad
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
        xp.add.at(out, index, v)
    else:
        out[index] = v
    return out


@index_put_op.grad
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


def replay_view(a, chain):
    """Apply a view's recorded ``(view op, params)`` chain to ``a`` (a Tensor or an array)."""
    for o, params in chain:
        a = o(a, **params)
    return a


@op(saves="none", needs=True, name="copy_slices", linear=True)
def copy_slices(a, v, chain, inplace=False):
    """A copy of ``a`` with the region that its view ``replay_view(a, chain)`` covers replaced
    by ``v`` (PyTorch's ``CopySlices``: a base's history after an in-place op on one of its
    views). ``inplace``: write into ``a`` itself and return it (the in-place op's forward;
    the gradient rule always copies)."""
    out = a if inplace else a.copy()
    w = replay_view(out, chain)
    if w.flags.writeable and xp.may_share_memory(w, out):
        w[...] = v
    else:  # the chain copies on this layout, or ends in a read-only broadcast: by position
        index = replay_view(xp.arange(out.size).reshape(out.shape), chain)
        tmp = out.copy()  # C-contiguous: reshape(-1) is a view of it
        tmp.reshape(-1)[index] = v
        out[...] = tmp
    return out


@copy_slices.grad
def _(g, out, a, v, chain, inplace=False, needs=(True, True)):
    ga = copy_slices(g, 0, chain=chain) if needs[0] else None
    gv = replay_view(g, chain) if needs[1] else None
    return ga, gv


# --- joining, repeating and rearranging ops ----------------------------------------------
@op(saves="none", needs=True, name="cat", linear=True)
def cat_op(arrays, dim):
    return xp.concatenate(arrays, axis=dim)


@cat_op.grad
def _(g, out, *inputs, dim, needs=None):
    grads, start, lead = [], 0, (slice(None),) * dim
    for i, a in enumerate(inputs):
        stop = start + a.shape[dim]
        grads.append(getitem(g, index=lead + (slice(start, stop), Ellipsis))
                     if needs is None or needs[i] else None)
        start = stop
    return tuple(grads)


@op(saves="none", needs=True, name="stack", linear=True)
def stack_op(arrays, dim):
    return xp.stack(arrays, axis=dim)


@stack_op.grad
def _(g, out, *inputs, dim, needs=None):
    lead = (slice(None),) * dim
    return tuple(getitem(g, index=lead + (i, Ellipsis)) if needs is None or needs[i] else None
                 for i in range(len(inputs)))


@op(saves="none", name="repeat", linear=True)
def repeat_op(a, sizes):
    return xp.tile(a, sizes)


@repeat_op.grad
def _(g, out, a, sizes):
    # view g as (r0, n0, r1, n1, ...) and sum over the repeats: the only un-broadcast rule
    shape = (1,) * (len(sizes) - len(a.shape)) + tuple(a.shape)
    split = tuple(x for r, n in zip(sizes, shape) for x in (r, n))
    ones = tuple(x for n in shape for x in (1, n))
    return reshape_op(sum_to(reshape_op(g, shape=split), shape=ones), shape=a.shape)


@op(saves="none", name="flip", linear=True)
def flip_op(a, dims):
    return xp.flip(a, dims).copy()  # PyTorch's flip copies: writes must not reach the input


@flip_op.grad
def _(g, out, a, dims):
    return flip_op(g, dims=dims)


@op(saves="none", name="roll", linear=True)
def roll_op(a, shifts, dims):
    return xp.roll(a, shifts, dims)


@roll_op.grad
def _(g, out, a, shifts, dims):
    return roll_op(g, shifts=tuple(-s for s in shifts), dims=dims)


@op(saves="none", name="tril", linear=True)
def tril_op(a, diagonal=0):
    return xp.tril(a, diagonal)


@tril_op.grad
def _(g, out, a, diagonal=0):
    return tril_op(g, diagonal=diagonal)


@op(saves="none", name="triu", linear=True)
def triu_op(a, diagonal=0):
    return xp.triu(a, diagonal)


@triu_op.grad
def _(g, out, a, diagonal=0):
    return triu_op(g, diagonal=diagonal)


@op(saves="none", name="constant_pad_nd")
def constant_pad(a, widths, value=0):
    """Pad (or, with negative widths, crop) each dim by ``widths[d] = (before, after)``."""
    shape, src, dst = [], [], []
    for d, (n, (lo, hi)) in enumerate(zip(a.shape, widths)):
        m = n + lo + hi
        if m < 0:
            raise RuntimeError(
                f"pad: the input size {n}, plus negative padding {lo} and {hi} resulted in a "
                f"negative output size, which is invalid. Check dimension {d} of your input.")
        shape.append(m)
        start = max(-lo, 0)
        length = max(n - max(-hi, 0) - start, 0)
        src.append(slice(start, start + length))
        dst.append(slice(max(lo, 0), max(lo, 0) + length))
    out = xp.full(shape, value, dtype=a.dtype)
    out[tuple(dst)] = a[tuple(src)]
    return out


@constant_pad.grad
def _(g, out, a, widths, value=0):
    return constant_pad(g, widths=tuple((-lo, -hi) for lo, hi in widths), value=0)


@constant_pad.jvp
def _(t, out, a, widths, value=0):
    return constant_pad(t[0], widths=widths, value=0)  # affine: the fill has no tangent


# --- argument normalisation ----------------------------------------------------------------
def _shape_args(shape):
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        shape = shape[0]
    return tuple(int(s) for s in shape)


def _dim(d, ndim, name):
    n = max(ndim, 1)
    d = operator.index(d)
    if not -n <= d < n:
        raise IndexError(f"{name}: dimension out of range (expected to be in range of "
                         f"[{-n}, {n - 1}], but got {d})")
    return d % n


def _dims(dims, ndim, name):
    """A dim or a sequence of dims, normalised; duplicates raise as in PyTorch."""
    if isinstance(dims, (tuple, list)):
        out = tuple(_dim(d, ndim, name) for d in dims)
    else:
        out = (_dim(dims, ndim, name),)
    for i, d in enumerate(out):
        if d in out[:i]:
            raise RuntimeError(f"{name}: dim {d} appears multiple times in the list of dims")
    return out


def _check_tensor(x, name, what="input"):
    if not isinstance(x, _registry.Tensor):
        raise TypeError(f"{name}(): argument '{what}' must be Tensor, not {type(x).__name__}")


def _index_array(index, name):
    """An integer index argument (Tensor, ndarray or list) as a backend integer array."""
    data = index._data if isinstance(index, _registry.Tensor) else xp.asarray(index)
    if data.dtype != xp.int64 and data.dtype != xp.int32:  # as PyTorch: no int8/int16/uint8
        if data.size == 0 and data.dtype.kind == "f" and not isinstance(index, _registry.Tensor):
            return data.astype(xp.int64)
        raise RuntimeError(f"{name}(): Expected dtype int32/int64 for index, got {data.dtype}")
    return data


def out_of_range(idx, n):
    """The first index of an integer array outside [0, n) (the smallest if any is negative,
    else the largest), or None. The one range check of the index-taking ops: a single
    reduction when all are in range, since a negative int viewed as unsigned is >= 2**63."""
    if idx.size == 0:
        return None
    if idx.dtype.kind == "i":
        if idx.view(f"u{idx.dtype.itemsize}").max() < n:
            return None
    elif idx.max() < n:
        return None
    lo = idx.min()
    return int(lo) if lo < 0 else int(idx.max())


def _out_of_bounds(idx, n):
    """The first index in ``idx`` outside [-n, n), or None."""
    if idx.size == 0:
        return None
    lo, hi = idx.min(), idx.max()
    if lo >= -n and hi < n:
        return None
    return int(lo) if lo < -n else int(hi)


# --- shape functions (exported as tapegrad.X and Tensor.X) --------------------------------
def reshape(input, *args, shape=None):
    """As ``torch.reshape`` / ``Tensor.reshape``: ``x.reshape(2, -1)`` or ``x.reshape((2, -1))``."""
    shape = _shape_args(args) if shape is None else _shape_args((shape,))
    if shape.count(-1) > 1:
        raise RuntimeError(f"reshape: only one dimension can be inferred (shape {list(shape)})")
    if any(s < -1 for s in shape):
        raise RuntimeError(f"reshape: invalid shape dimension {min(shape)} in {list(shape)}")
    return reshape_op(input, shape=shape)


def view(input, *shape):
    """As ``Tensor.view`` (tapegrad reshapes: numpy copies only when it must)."""
    return reshape(input, *shape)


def flatten(input, start_dim=0, end_dim=-1):
    """As ``torch.flatten``: ``x.flatten(1)`` merges dims ``start_dim..end_dim`` into one."""
    if input.ndim == 0:
        _dim(start_dim, 0, "flatten"), _dim(end_dim, 0, "flatten")
        return reshape_op(input, shape=(1,))
    s, e = _dim(start_dim, input.ndim, "flatten"), _dim(end_dim, input.ndim, "flatten")
    if s > e:
        raise RuntimeError("flatten: start_dim cannot come after end_dim "
                           f"(start_dim={start_dim}, end_dim={end_dim}, shape "
                           f"{tuple(input.shape)})")
    shape = input.shape
    n = 1
    for k in shape[s:e + 1]:
        n *= k
    return reshape(input, shape[:s] + (n,) + shape[e + 1:])


def unflatten(input, dim, sizes):
    """As ``torch.unflatten``: ``x.unflatten(1, (2, -1))`` splits dim 1 into ``sizes``."""
    d = _dim(dim, input.ndim, "unflatten")
    sizes = tuple(int(s) for s in sizes)
    if not sizes:
        raise RuntimeError("unflatten: sizes must be non-empty")
    n = input.shape[d]
    known = 1
    for s in sizes:
        if s != -1:
            known *= s
    if sizes.count(-1) > 1 or (sizes.count(-1) == 0 and known != n) or \
            (sizes.count(-1) == 1 and (known == 0 or n % known)):
        raise RuntimeError(f"unflatten: Provided sizes {list(sizes)} don't multiply up to the "
                           f"size of dim {dim} ({n}) in the input tensor of shape "
                           f"{tuple(input.shape)}")
    sizes = tuple(n // known if s == -1 else s for s in sizes)
    return reshape(input, input.shape[:d] + sizes + input.shape[d + 1:])


def squeeze(input, dim=None):
    """As ``torch.squeeze``: drop size-1 dims (all, one ``dim``, or a tuple of dims)."""
    shape = input.shape
    if dim is None:
        new = tuple(n for n in shape if n != 1)
    else:
        dims = _dims(dim, input.ndim, "squeeze")
        new = tuple(n for i, n in enumerate(shape) if n != 1 or i not in dims)
    return reshape_op(input, shape=new)  # a view even when nothing is squeezed


def unsqueeze(input, dim):
    """As ``torch.unsqueeze``: insert a size-1 dim at ``dim`` (in [-ndim-1, ndim])."""
    d = _dim(dim, input.ndim + 1, "unsqueeze")
    return reshape_op(input, shape=input.shape[:d] + (1,) + input.shape[d:])


def permute(input, *args, dims=None):
    """As ``torch.permute``: ``x.permute(2, 0, 1)`` or ``torch.permute(x, (2, 0, 1))``."""
    dims = _shape_args(args) if dims is None else _shape_args((dims,))
    if len(dims) != input.ndim:
        raise RuntimeError(f"permute: number of dimensions in the tensor input does not match "
                           f"the length of the desired ordering of dimensions i.e. input.dim() "
                           f"= {input.ndim} is not equal to len(dims) = {len(dims)}")
    return permute_op(input, dims=_dims(dims, input.ndim, "permute"))


def transpose(input, dim0, dim1):
    """As ``torch.transpose``: swap two dims."""
    n = input.ndim
    a, b = _dim(dim0, n, "transpose"), _dim(dim1, n, "transpose")
    if n == 0:
        return reshape_op(input, shape=())
    dims = list(range(n))
    dims[a], dims[b] = dims[b], dims[a]
    return permute_op(input, dims=tuple(dims))


swapaxes = swapdims = transpose


def t(input):
    """As ``torch.t``: transpose a tensor of at most 2 dims."""
    if input.ndim > 2:
        raise RuntimeError(f"t: expects a tensor with <= 2 dimensions, but self is "
                           f"{input.ndim}D")
    return transpose(input, 0, -1)


def expand(input, *sizes):
    """As ``Tensor.expand``: ``x.expand(4, -1)``; -1 keeps a dim, new dims go on the left."""
    sizes = _shape_args(sizes)
    lead = len(sizes) - input.ndim
    if lead < 0:
        raise RuntimeError(f"expand: the number of sizes provided ({len(sizes)}) must be "
                           f"greater or equal to the number of dimensions in the tensor "
                           f"({input.ndim})")
    shape = []
    for i, s in enumerate(sizes):
        if i < lead:
            if s < 0:
                raise RuntimeError(f"expand: the expanded size of the tensor ({s}) isn't "
                                   f"allowed in a leading, non-existing dimension {i}")
            shape.append(s)
            continue
        n = input.shape[i - lead]
        if s == -1:
            s = n
        elif n != s and n != 1 or s < 0:
            raise RuntimeError(
                f"expand: the expanded size of the tensor ({s}) must match the existing size "
                f"({n}) at non-singleton dimension {i}.  Target sizes: {list(sizes)}.  Tensor "
                f"sizes: {list(input.shape)}")
        shape.append(s)
    shape = tuple(shape)
    return broadcast_to_op(input, shape=shape)


def expand_as(input, other):
    """As ``Tensor.expand_as``: ``x.expand(other.size())``."""
    return expand(input, tuple(other.shape))


def broadcast_to(input, size=None, *, shape=None):
    """As ``torch.broadcast_to(input, size)`` (= ``input.expand(size)``).

    ``shape=`` is the internal form used by dispatch and gradient rules: a target already
    known to be valid, on Tensors or raw arrays, without the checks.
    """
    if shape is not None:
        return broadcast_to_op(input, shape=shape)
    return expand(input, tuple(size))


def broadcast_tensors(*tensors):
    """As ``torch.broadcast_tensors``."""
    if len(tensors) == 1 and isinstance(tensors[0], (tuple, list)):
        tensors = tuple(tensors[0])
    try:
        shape = xp.broadcast_shapes(*(tuple(x.shape) for x in tensors))
    except ValueError:
        raise RuntimeError("broadcast_tensors: shapes " + ", ".join(
            str(tuple(x.shape)) for x in tensors) + " cannot be broadcast together") from None
    return tuple(expand(x, shape) for x in tensors)


def repeat(input, *sizes):
    """As ``Tensor.repeat``: ``x.repeat(2, 1)`` tiles ``x`` (sizes may add leading dims)."""
    sizes = _shape_args(sizes)
    if len(sizes) < input.ndim:
        raise RuntimeError("repeat: Number of dimensions of repeat dims can not be smaller "
                           f"than number of dimensions of tensor ({len(sizes)} < {input.ndim})")
    if any(s < 0 for s in sizes):
        raise RuntimeError(f"repeat: Trying to create tensor with negative dimension: {sizes}")
    return repeat_op(input, sizes=sizes)


def tile(input, *args, dims=None):
    """As ``torch.tile``: like ``repeat``, but missing leading dims of ``dims`` count as 1."""
    dims = _shape_args(args) if dims is None else _shape_args((dims,))
    return repeat(input, (1,) * (input.ndim - len(dims)) + dims)


def _joined_inputs(tensors, name):
    if isinstance(tensors, _registry.Tensor) or not isinstance(tensors, (tuple, list)):
        raise TypeError(f"{name}(): argument 'tensors' must be tuple of Tensors, not "
                        f"{type(tensors).__name__}")
    tensors = list(tensors)
    if not tensors:
        raise ValueError(f"{name}(): expected a non-empty list of Tensors")
    for i, x in enumerate(tensors):
        if not isinstance(x, _registry.Tensor):
            raise TypeError(f"{name}(): expected Tensor as element {i} in argument 0, but got "
                            f"{type(x).__name__}")
    dt = tensors[0].dtype
    for x in tensors[1:]:
        dt = dtypes.promote_types(dt, x.dtype)
    return [x if x._data.dtype is dt.np else _E.to_dtype(x, dtype=dt) for x in tensors]


@autocast_composite
def cat(tensors, dim=0):
    """As ``torch.cat``: ``cat([x, y], dim=1)``; mixed dtypes promote as in PyTorch."""
    tensors = _joined_inputs(tensors, "cat")
    # PyTorch's legacy rule: 1-D empty tensors are skipped whatever the others' shapes
    kept = [x for x in tensors if not (x.ndim == 1 and x.shape[0] == 0)]
    if not kept:
        return cat_op(tensors, dim=0)
    for i, x in enumerate(kept):
        if x.ndim == 0:
            raise RuntimeError(f"cat: zero-dimensional tensor (at position {i}) cannot be "
                               "concatenated")
    ref = kept[0]
    d = _dim(dim, ref.ndim, "cat")
    for i, x in enumerate(kept[1:], 1):
        if x.ndim != ref.ndim:
            raise RuntimeError(f"cat: Tensors must have same number of dimensions: got "
                               f"{ref.ndim} and {x.ndim}")
        for k in range(ref.ndim):
            if k != d and x.shape[k] != ref.shape[k]:
                raise RuntimeError(
                    f"cat: Sizes of tensors must match except in dimension {d}. Expected "
                    f"size {ref.shape[k]} but got size {x.shape[k]} for tensor number {i} in "
                    f"the list (shapes {tuple(ref.shape)} and {tuple(x.shape)})")
    return cat_op(kept, dim=d)


concat = concatenate = cat


@autocast_composite
def stack(tensors, dim=0):
    """As ``torch.stack``: join equal-shaped tensors along a new dim."""
    tensors = _joined_inputs(tensors, "stack")
    ref = tensors[0]
    for i, x in enumerate(tensors[1:], 1):
        if x.shape != ref.shape:
            raise RuntimeError(f"stack expects each tensor to be equal size, but got "
                               f"{list(ref.shape)} at entry 0 and {list(x.shape)} at entry {i}")
    return stack_op(tensors, dim=_dim(dim, ref.ndim + 1, "stack"))


def _slices(input, d, sizes):
    lead = (slice(None),) * d
    out, start = [], 0
    for s in sizes:
        out.append(getitem(input, index=lead + (slice(start, start + s), Ellipsis)))
        start += s
    return tuple(out)


def split(tensor, split_size_or_sections, dim=0):
    """As ``torch.split``: chunks of ``split_size`` (the last may be smaller) or of the
    sizes listed; each a view."""
    if tensor.ndim == 0:
        raise RuntimeError("split: expected a tensor with at least one dimension")
    d = _dim(dim, tensor.ndim, "split")
    n = tensor.shape[d]
    if isinstance(split_size_or_sections, (list, tuple)):
        sizes = [int(s) for s in split_size_or_sections]
        if sum(sizes) != n or any(s < 0 for s in sizes):
            raise RuntimeError(
                f"split_with_sizes expects split_sizes to sum exactly to {n} (input tensor's "
                f"size at dimension {d}), but got split_sizes={sizes}")
        return _slices(tensor, d, sizes)
    size = operator.index(split_size_or_sections)
    if size < 0 or (size == 0 and n != 0):
        raise RuntimeError(f"split: split_size can only be 0 if dimension size is 0, but got "
                           f"split_size={size} for dimension {d} of size {n}"
                           if size == 0 else
                           f"split: split expects split_size be non-negative, but got "
                           f"split_size={size}")
    if n == 0:
        return _slices(tensor, d, [0])
    return _slices(tensor, d, [min(size, n - i) for i in range(0, n, size)])


def chunk(input, chunks, dim=0):
    """As ``torch.chunk``: split into at most ``chunks`` pieces of size ceil(n / chunks)."""
    if chunks <= 0:
        raise RuntimeError(f"chunk expects `chunks` to be greater than 0, got: {chunks}")
    if input.ndim == 0:
        raise RuntimeError("chunk expects at least a 1-dimensional tensor")
    d = _dim(dim, input.ndim, "chunk")
    n = input.shape[d]
    if n == 0:
        return _slices(input, d, [0] * chunks)
    return split(input, -(-n // chunks), dim)


def unbind(input, dim=0):
    """As ``torch.unbind``: the slices along ``dim``, with that dim removed (views)."""
    if input.ndim == 0:
        raise IndexError("unbind: dimension specified as 0 but tensor has no dimensions")
    d = _dim(dim, input.ndim, "unbind")
    lead = (slice(None),) * d
    return tuple(getitem(input, index=lead + (i, Ellipsis)) for i in range(input.shape[d]))


def flip(input, *args, dims=None):
    """As ``torch.flip(x, dims)`` / ``x.flip(0, 1)``: reverse the order along ``dims``."""
    dims = _shape_args(args) if dims is None else _shape_args((dims,))
    return flip_op(input, dims=_dims(dims, input.ndim, "flip") if input.ndim else ())


def fliplr(input):
    """As ``torch.fliplr``."""
    if input.ndim < 2:
        raise RuntimeError("fliplr: Input must be >= 2-d.")
    return flip_op(input, dims=(1,))


def flipud(input):
    """As ``torch.flipud``."""
    if input.ndim < 1:
        raise RuntimeError("flipud: Input must be >= 1-d.")
    return flip_op(input, dims=(0,))


def roll(input, shifts, dims=None):
    """As ``torch.roll``: ``roll(x, 1, 0)``; without ``dims`` the flattened tensor is rolled."""
    shifts = tuple(int(s) for s in shifts) if isinstance(shifts, (tuple, list)) else \
        (operator.index(shifts),)
    if dims is None:
        if len(shifts) != 1:
            raise RuntimeError(f"roll: shifts and dimensions must align. shifts: "
                               f"{len(shifts)}, dims:0")
        flat = reshape_op(input, shape=(-1,))
        return reshape_op(roll_op(flat, shifts=shifts, dims=(0,)), shape=input.shape)
    dims = tuple(dims) if isinstance(dims, (tuple, list)) else (dims,)
    if not shifts:
        raise RuntimeError("roll: `shifts` required")
    if len(shifts) != len(dims):
        raise RuntimeError(f"roll: shifts and dimensions must align. shifts: {len(shifts)}, "
                           f"dims:{len(dims)}")
    dims = tuple(_dim(d, input.ndim, "roll") for d in dims)
    return roll_op(input, shifts=shifts, dims=dims)


def tril(input, diagonal=0):
    """As ``torch.tril``: zero the elements above the ``diagonal``-th diagonal (batched)."""
    if input.ndim < 2:
        raise RuntimeError(f"tril: input tensor must have at least 2 dimensions, got shape "
                           f"{tuple(input.shape)}")
    return tril_op(input, diagonal=operator.index(diagonal))


def triu(input, diagonal=0):
    """As ``torch.triu``: zero the elements below the ``diagonal``-th diagonal (batched)."""
    if input.ndim < 2:
        raise RuntimeError(f"triu: input tensor must have at least 2 dimensions, got shape "
                           f"{tuple(input.shape)}")
    return triu_op(input, diagonal=operator.index(diagonal))


# --- gather, scatter and friends: advanced indexing with an open grid ---------------------
def _grid(idx, d):
    """The advanced-index key that picks ``a[..., idx[i, j, k], ...]`` along dim ``d``."""
    nd = idx.ndim
    return tuple(idx if k == d else xp.arange(n).reshape((1,) * k + (n,) + (1,) * (nd - k - 1))
                 for k, n in enumerate(idx.shape))


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


def _check_gather_bounds(idx, n, d, name):
    bad = out_of_range(idx, n)
    if bad is not None:
        raise RuntimeError(f"{name}(): index {bad} is out of bounds for dimension {d} with "
                           f"size {n}")


def gather(input, dim, index, *, sparse_grad=False):
    """As ``torch.gather``: ``out[i][j] = input[index[i][j]][j]`` for ``dim=0``."""
    idx = _index_array(index, "gather")
    d = _dim(dim, input.ndim, "gather")
    _check_index_shape(input, d, idx, "gather")
    if input.ndim == 0 or idx.ndim == 0:
        flat = reshape_op(input, shape=(1,)) if input.ndim == 0 else input
        out = gather(flat, 0, idx.reshape((1,) * flat.ndim))
        return reshape_op(out, shape=idx.shape)
    _check_gather_bounds(idx, input.shape[d], d, "gather")
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
    _check_gather_bounds(idx, input.shape[d], d, "scatter_add")
    if src.shape != idx.shape:  # only src[:index.shape] takes part
        src = getitem(src, index=tuple(slice(0, n) for n in idx.shape) + (Ellipsis,))
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
        bad = out_of_range(idx, n)
        if bad is not None:
            # PyTorch's CPU kernels raise IndexError, but RuntimeError on their dim-1 and
            # empty-input paths
            exc = RuntimeError if input.ndim > 1 and (d == 1 or input.numel() == 0) else \
                IndexError
            raise exc(f"index_select(): index {bad} is out of range "
                      f"for dimension {d} with size {n}")
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
        idx = idx.reshape(-1)
        _check_gather_bounds(idx, input.numel(), 0, "take_along_dim")
        return gather(reshape_op(input, shape=(-1,)), 0, idx)
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
    idx = xp.broadcast_to(idx, idx_shape)
    n = input.shape[d]
    if out_of_range(idx, n) is not None:
        if n == 0:
            raise RuntimeError(f"take_along_dim(): ZeroDivisionError: indices {tuple(idx.shape)} "
                               f"taken modulo the size 0 of dimension {d} of input "
                               f"{tuple(input.shape)}")
        idx = idx % n
    return gather(expand(input, in_shape), d, idx)


# --- pad (nn.functional.pad) ---------------------------------------------------------------
_PAD_MODES = ("constant", "reflect", "replicate", "circular")


def _pad_source(n, lo, hi, mode):
    """For each output position along one dim, the input position it copies."""
    p = xp.arange(-lo, n + hi)
    if mode == "reflect":
        p = xp.abs(p)
        return xp.where(p > n - 1, 2 * (n - 1) - p, p)
    if mode == "replicate":
        return xp.clip(p, 0, n - 1)
    return p % n


@autocast_composite
def pad(input, pad, mode="constant", value=None):
    """As ``torch.nn.functional.pad``: ``pad=(left, right, top, bottom, ...)`` pads the last
    dim first. Modes ``constant`` (negative widths crop), ``reflect``, ``replicate``,
    ``circular``."""
    pad = tuple(operator.index(p) for p in pad)
    if len(pad) % 2:
        raise RuntimeError(f"pad: Padding length must be divisible by 2 (got {pad})")
    nd = input.ndim
    if len(pad) > 2 * nd:
        raise RuntimeError(f"pad: Padding length should be less than or equal to two times the "
                           f"input dimension but got padding length {len(pad)} and input of "
                           f"dimension {nd}")
    if mode not in _PAD_MODES:
        raise NotImplementedError(f"pad: Unrecognised padding mode {mode}")
    k = len(pad) // 2
    widths = [(0, 0)] * (nd - k) + [(pad[2 * i], pad[2 * i + 1]) for i in range(k)][::-1]
    if mode == "constant":
        return constant_pad(input, widths=tuple(widths), value=0 if value is None else value)
    if value is not None and value != 0:
        raise RuntimeError(f"pad: Padding mode \"{mode}\" doesn't take in value argument")
    if not (k in (1, 2, 3) and nd in (k + 1, k + 2)):
        raise NotImplementedError(
            f"pad: Padding size {len(pad)} is not supported for {nd}D input tensor with mode "
            f"{mode!r}. Supported: 2D or 3D input with padding size 2, 3D or 4D with 4, 4D or "
            "5D with 6")
    out = input
    for d in range(nd - k, nd):
        lo, hi = widths[d]
        n = input.shape[d]
        if mode == "reflect" and (lo >= n or hi >= n):
            raise RuntimeError(
                f"pad: Padding size should be less than the corresponding input dimension, but "
                f"got: padding ({lo}, {hi}) at dimension {d} of input {list(input.shape)}")
        if mode == "circular" and (lo > n or hi > n):
            raise RuntimeError(f"pad: Padding value causes wrapping around more than once "
                               f"(padding ({lo}, {hi}) at dimension {d} of input "
                               f"{list(input.shape)})")
        if n + lo + hi < 0 or (n == 0 and lo + hi > 0):
            raise RuntimeError(f"pad: padding ({lo}, {hi}) at dimension {d} of input "
                               f"{list(input.shape)} gives an invalid output size")
        if lo or hi:
            out = index_op(out, index=(slice(None),) * d + (_pad_source(n, lo, hi, mode),
                                                             Ellipsis))
    return out


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
    elif isinstance(i, (list, tuple, xp.ndarray)):
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


__all__ = ["reshape", "flatten", "unflatten", "squeeze", "unsqueeze", "permute", "transpose",
           "swapaxes", "swapdims", "t", "broadcast_to", "broadcast_tensors", "tile", "cat",
           "concat", "concatenate", "stack", "split", "chunk", "unbind", "flip", "fliplr",
           "flipud", "roll", "gather", "scatter_add", "index_select", "take_along_dim", "tril",
           "triu"]
TENSOR_METHODS = [n for n in __all__ if n not in (
    "cat", "concat", "concatenate", "stack", "broadcast_tensors")] + [
    "view", "expand", "expand_as", "repeat"]
