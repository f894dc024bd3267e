"""Movement ops: broadcast, reshape, transpose, index, cat. Views where numpy gives views."""
from tapegrad.ops.registry import op, xp


@op(saves="none", view=True)
def broadcast_to(a, shape):
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


@broadcast_to.grad
def _(g, out, a, shape):
    return sum_to(g, shape=a.shape)


@op(flops=1, saves="none")
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
    return broadcast_to(g, shape=a.shape)


@op(saves="none", view=True, name="reshape")
def reshape_op(a, shape):
    try:
        return a.reshape(shape)
    except ValueError:
        raise RuntimeError(f"shape '{list(shape)}' is invalid for input of size {a.size}") \
            from None


@reshape_op.grad
def _(g, out, a, shape):
    return reshape_op(g, shape=a.shape)


@op(saves="none", view=True, name="permute")
def permute_op(a, dims):
    return a.transpose(dims)


@permute_op.grad
def _(g, out, a, dims):
    return permute_op(g, dims=tuple(int(i) for i in xp.argsort(dims)))


# --- PyTorch-signature functions (exported as tapegrad.X and Tensor.X) ------------------
def _shape_args(shape):
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        shape = shape[0]
    return tuple(int(s) for s in shape)


def _dim(d, ndim, name):
    n = max(ndim, 1)
    if not -n <= d < n:
        raise IndexError(f"{name}: dimension out of range (expected to be in range of "
                         f"[{-n}, {n - 1}], but got {d})")
    return d % n


def reshape(input, *shape):
    """As ``torch.reshape`` / ``Tensor.reshape``: ``x.reshape(2, -1)``."""
    shape = _shape_args(shape)
    if shape == input.shape:
        return input
    return reshape_op(input, shape=shape)


def view(input, *shape):
    """As ``Tensor.view`` (tapegrad reshapes; numpy copies only when it must)."""
    return reshape(input, *shape)


def permute(input, *dims):
    """As ``torch.permute``: ``x.permute(2, 0, 1)``."""
    dims = _shape_args(dims)
    if len(dims) != input.ndim:
        raise RuntimeError(f"permute: number of dims {len(dims)} doesn't match the tensor's "
                           f"{input.ndim} (shape {tuple(input.shape)})")
    return permute_op(input, dims=tuple(_dim(d, input.ndim, "permute") for d in dims))


def transpose(input, dim0, dim1):
    """As ``torch.transpose``: swap two dims."""
    n = input.ndim
    if n < 2 and dim0 in (0, -1) and dim1 in (0, -1):
        return input
    dims = list(range(n))
    a, b = _dim(dim0, n, "transpose"), _dim(dim1, n, "transpose")
    dims[a], dims[b] = dims[b], dims[a]
    return permute_op(input, dims=tuple(dims))


def t(input):
    """As ``torch.t``: transpose a tensor of at most 2 dims."""
    if input.ndim > 2:
        raise RuntimeError(f"t: expects a tensor with <= 2 dimensions, but self is "
                           f"{input.ndim}D")
    return transpose(input, 0, 1) if input.ndim == 2 else input


def expand(input, *sizes):
    """As ``Tensor.expand``: -1 keeps a dim; new dims are added on the left."""
    sizes = _shape_args(sizes)
    lead = len(sizes) - input.ndim
    if lead < 0:
        raise RuntimeError(f"expand: the number of sizes provided ({len(sizes)}) must be "
                           f"greater or equal to the number of dimensions ({input.ndim})")
    shape = tuple(input.shape[i - lead] if s == -1 else s for i, s in enumerate(sizes))
    return broadcast_to_shape(input, shape)


def broadcast_to_shape(input, shape):
    """As ``torch.broadcast_to``."""
    shape = tuple(shape)
    if shape == input.shape:
        return input
    try:
        xp.broadcast_shapes(input.shape, shape)
        if len(shape) < input.ndim:
            raise ValueError
    except ValueError:
        raise RuntimeError(f"broadcast_to: the tensor of shape {tuple(input.shape)} cannot be "
                           f"expanded to shape {shape}") from None
    return broadcast_to(input, shape=shape)


__all__ = ["reshape", "permute", "transpose", "t"]
TENSOR_METHODS = __all__ + ["view", "expand"]
