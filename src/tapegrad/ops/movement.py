"""Movement ops: broadcast, reshape, permute, cat, pad. Views where numpy gives views.

The primitives are few: ``broadcast_to``/``sum_to`` (the only un-broadcasting), ``reshape``,
``permute``, then ``cat``, ``stack``, ``repeat``, ``flip``, ``roll``, ``tril``/``triu`` and
``constant_pad_nd``; split and the non-constant pads are expressed through the indexing ops
(``ops/indexing.py``: ``getitem``, ``index``, gather and friends). squeeze, flatten, expand
and friends are reshapes, permutes and broadcasts. ``_dim`` is the one dim normaliser.
"""
import operator

from tapegrad import dtypes
from tapegrad.ops import elementwise as _E
from tapegrad.ops.registry import op, xp
from tapegrad.ops import registry as _registry
from tapegrad.amp.autocast_mode import autocast_composite  # PyTorch's autocast lists


@op(saves="none", view=True, name="broadcast_to", linear=True)
def broadcast_to_op(a, shape):
    """As ``torch.broadcast_to``. Its gradient, ``sum_to``, is the only un-broadcast rule."""
    if a.flags.c_contiguous and type(a) is xp.ndarray:  # device arrays: their broadcast_to
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


@broadcast_to_op.grad(traces=True)
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


@sum_to.grad(traces=True)
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


@reshape_op.grad(traces=True)
def _(g, out, a, shape):
    return reshape_op(g, shape=a.shape)


@op(saves="none", view=True, name="permute", linear=True)
def permute_op(a, dims):
    return a.transpose(dims)


@permute_op.grad(traces=True)
def _(g, out, a, dims):
    return permute_op(g, dims=tuple(int(i) for i in xp.argsort(dims)))


# --- views: a view's chain of view ops, replayed (in-place ops on views) ---------------
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
    if getattr(w.flags, "writeable", True) and xp.may_share_memory(w, out):  # CuPy: no flag
        w[...] = v
    else:  # the chain copies on this layout, or ends in a read-only broadcast: by position
        index = replay_view(xp.arange(out.size).reshape(out.shape), chain)
        tmp = out.copy()  # C-contiguous: reshape(-1) is a view of it
        tmp.reshape(-1)[index] = v
        out[...] = tmp
    return out


@copy_slices.grad(traces=True)
def _(g, out, a, v, chain, inplace=False, needs=(True, True)):
    ga = copy_slices(g, 0, chain=chain) if needs[0] else None
    gv = replay_view(g, chain) if needs[1] else None
    return ga, gv


@copy_slices.jvp
def _(t, out, a, v, chain, inplace=False):
    # linear in (a, v), always into a new tangent (never into a's tangent in place); a
    # constant v writes 0
    ta = t[0] if t[0] is not None else xp.zeros(tuple(a.shape), a._data.dtype)
    tv = t[1] if len(t) > 1 and t[1] is not None else 0
    return copy_slices(ta, tv, chain=chain)


# --- joining, repeating and rearranging ops ----------------------------------------------
@op(saves="none", needs=True, name="cat", linear=True)
def cat_op(arrays, dim):
    return xp.concatenate(arrays, axis=dim)


@cat_op.grad(traces=True)
def _(g, out, *inputs, dim, needs=None):
    grads, start, lead = [], 0, (slice(None),) * dim
    for i, a in enumerate(inputs):
        stop = start + a.shape[dim]
        grads.append(_I.getitem(g, index=lead + (slice(start, stop), Ellipsis))
                     if needs is None or needs[i] else None)
        start = stop
    return tuple(grads)


@op(saves="none", needs=True, name="stack", linear=True)
def stack_op(arrays, dim):
    return xp.stack(arrays, axis=dim)


@stack_op.grad(traces=True)
def _(g, out, *inputs, dim, needs=None):
    lead = (slice(None),) * dim
    return tuple(_I.getitem(g, index=lead + (i, Ellipsis)) if needs is None or needs[i] else None
                 for i in range(len(inputs)))


@op(saves="none", name="repeat", linear=True)
def repeat_op(a, sizes):
    return xp.tile(a, sizes)


@repeat_op.grad(traces=True)
def _(g, out, a, sizes):
    # view g as (r0, n0, r1, n1, ...) and sum over the repeats: the only un-broadcast rule
    shape = (1,) * (len(sizes) - len(a.shape)) + tuple(a.shape)
    split = tuple(x for r, n in zip(sizes, shape) for x in (r, n))
    ones = tuple(x for n in shape for x in (1, n))
    return reshape_op(sum_to(reshape_op(g, shape=split), shape=ones), shape=a.shape)


@op(saves="none", name="flip", linear=True)
def flip_op(a, dims):
    return xp.flip(a, dims).copy()  # PyTorch's flip copies: writes must not reach the input


@flip_op.grad(traces=True)
def _(g, out, a, dims):
    return flip_op(g, dims=dims)


@op(saves="none", name="roll", linear=True)
def roll_op(a, shifts, dims):
    return xp.roll(a, shifts, dims)


@roll_op.grad(traces=True)
def _(g, out, a, shifts, dims):
    return roll_op(g, shifts=tuple(-s for s in shifts), dims=dims)


@op(saves="none", name="tril", linear=True)
def tril_op(a, diagonal=0):
    return xp.tril(a, diagonal)


@tril_op.grad(traces=True)
def _(g, out, a, diagonal=0):
    return tril_op(g, diagonal=diagonal)


@op(saves="none", name="triu", linear=True)
def triu_op(a, diagonal=0):
    return xp.triu(a, diagonal)


@triu_op.grad(traces=True)
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


@constant_pad.grad(traces=True)
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
    """The one dim normaliser: ``d`` (negative allowed) as an index into ``ndim`` dims (a
    0-d tensor takes dims 0 and -1); IndexError with PyTorch's wording when out of range."""
    n = ndim or 1
    if type(d) is not int:
        d = operator.index(d)  # numpy ints, 0-d tensors; TypeError for floats
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
        out.append(_I.getitem(input, index=lead + (slice(start, start + s), Ellipsis)))
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
    return tuple(_I.getitem(input, index=lead + (i, Ellipsis)) for i in range(input.shape[d]))


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
            source = _pad_source(n, lo, hi, mode)
            rec = _I.recorder() if _I.grad_state.modes else None
            if rec is not None:  # made from shapes only: a constant of the compiler's graph
                rec.constant(_registry.Tensor._make(source))
            out = _I.index_op(out, index=(slice(None),) * d + (source, Ellipsis))
    return out


__all__ = ["reshape", "flatten", "unflatten", "squeeze", "unsqueeze", "permute", "transpose",
           "swapaxes", "swapdims", "t", "broadcast_to", "broadcast_tensors", "tile", "cat",
           "concat", "concatenate", "stack", "split", "chunk", "unbind", "flip", "fliplr",
           "flipud", "roll", "tril", "triu"]
TENSOR_METHODS = [n for n in __all__ if n not in (
    "cat", "concat", "concatenate", "stack", "broadcast_tensors")] + [
    "view", "expand", "expand_as", "repeat"]


# the indexing ops live in ops/indexing.py (which imports this module's shape ops): imported
# last, and the names that moved there stay reachable here (``movement.getitem``, ...)
from tapegrad.ops import indexing as _I  # noqa: E402
_MOVED = frozenset(("getitem", "index_op", "index_backward", "index_put_op", "index_key",
                    "tensor_getitem", "index_put", "gather", "scatter_add", "index_select",
                    "take_along_dim", "out_of_range", "_out_of_bounds", "_index_array", "_grid",
                    "_check_index_shape", "_check_gather_bounds", "_INDEX_TYPES_MSG",
                    "_add_rows", "_take", "_sequence_as_tuple", "_index_item",
                    "_basic_tuple_key", "_all_advanced_key"))


def __getattr__(name):
    if name in _MOVED:
        return getattr(_I, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
