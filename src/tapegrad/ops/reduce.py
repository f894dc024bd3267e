"""Reductions. ``dim`` is normalised to a tuple of axes in one place: ``axes``."""
from tapegrad import dtypes
from tapegrad.ops.registry import op, xp
from tapegrad.ops.movement import broadcast_to, reshape_op as reshape


def axes(dim, ndim, name="reduce"):
    """Normalise PyTorch's ``dim`` (None, int, or sequence; negative allowed) to a tuple."""
    if dim is None:
        return tuple(range(ndim))
    dims = (dim,) if isinstance(dim, int) else tuple(dim)
    if not dims and ndim == 0:
        return ()
    n = max(ndim, 1)
    out = []
    for d in dims:
        if not -n <= d < n:
            raise IndexError(
                f"{name}: dimension out of range (expected to be in range of [{-n}, {n - 1}],"
                f" but got {d})")
        out.append(d % n if ndim else 0)
    if len(set(out)) != len(out):
        raise RuntimeError(f"{name}: dim {dim} appears multiple times in the list of dims")
    return tuple(sorted(out)) if ndim else ()


def keep_shape(shape, dims):
    """The shape a keepdim=False reduction's result has with its reduced dims put back as 1."""
    return tuple(1 if i in dims else n for i, n in enumerate(shape))


@op(flops=1, saves="none", name="sum")
def sum_op(a, dims, keepdim=False, dtype=None):
    return a.sum(axis=dims, keepdims=keepdim, dtype=dtype)


@sum_op.grad
def _(g, out, a, dims, keepdim=False, dtype=None):
    if not keepdim:
        g = reshape(g, shape=keep_shape(a.shape, dims))
    return broadcast_to(g, shape=a.shape)


# --- PyTorch-signature functions (exported as tapegrad.X and Tensor.X) ------------------
def sum(input, dim=None, keepdim=False, *, dtype=None):
    """As ``torch.sum``: ``x.sum()``, ``x.sum(dim=1, keepdim=True)``."""
    kind = input._data.dtype.kind
    np_dtype = dtypes.to_dtype(dtype).np if dtype is not None else (
        xp.int64 if kind in "biu" else None)
    return sum_op(input, dims=axes(dim, input.ndim, "sum"), keepdim=keepdim, dtype=np_dtype)


__all__ = ["sum"]
TENSOR_METHODS = ["sum"]
