"""Ops that pick part of a tensor or reorder it: ``sort``/``argsort``/``topk``, the diagonal
family (``diagonal``, ``diag_embed``, ``diag``), ``narrow``, ``view_as`` and the ``alias``
behind the legacy ``torch.Tensor(tensor)``.

Sorting computes an order on the array, then gathers the values through the ``index`` op
(whose gradient puts ``g`` back at the picked positions); ``diagonal`` is a view and
``diag_embed`` its gradient (and vice versa).
"""
import collections
import operator

from tapegrad.ops import registry as _registry
from tapegrad.ops.movement import _dim, reshape_op
from tapegrad.ops.indexing import _grid, getitem, index_op
from tapegrad.ops.registry import op, xp
from tapegrad.ops.reduce import take_along_reduce
from tapegrad.backend import array_module


@op(saves="none", view=True, linear=True)
def alias(a):
    """A differentiable alias sharing ``a``'s storage (``torch.Tensor(t)``)."""
    return a.view()


@alias.grad
def _(g, out, a):
    return g


def _writable_diagonal(a, offset, dim1, dim2):
    """``numpy.diagonal`` (diagonal dim last) as a view writable when ``a`` is."""
    v = xp.diagonal(a, offset, dim1, dim2)
    if not hasattr(a.flags, "writeable"):  # CuPy: no read-only arrays; its diagonal is a view
        return v
    start = [slice(None)] * a.ndim
    start[dim2 if offset >= 0 else dim1] = slice(abs(offset), None)
    corner = a[tuple(start)] if v.size else a
    return xp.lib.stride_tricks.as_strided(corner, v.shape, v.strides,
                                           writeable=a.flags.writeable)


@op(saves="none", view=True, name="diagonal", linear=True)
def diagonal_op(a, offset, dim1, dim2):
    return _writable_diagonal(a, offset, dim1, dim2)


@diagonal_op.grad
def _(g, out, a, offset, dim1, dim2):
    return diag_embed_op(g, shape=a.shape, offset=offset, dim1=dim1, dim2=dim2)


@op(saves="none", name="diag_embed", linear=True)
def diag_embed_op(a, shape, offset, dim1, dim2):
    """Zeros of ``shape`` with ``a``'s last dim on the ``offset`` diagonal of (dim1, dim2)."""
    out = xp.zeros(shape, dtype=a.dtype)
    _writable_diagonal(out, offset, dim1, dim2)[...] = a
    return out


@diag_embed_op.grad
def _(g, out, a, shape, offset, dim1, dim2):
    return diagonal_op(g, offset=offset, dim1=dim1, dim2=dim2)


def _diag_dims(ndim, dim1, dim2, name):
    d1, d2 = _dim(dim1, ndim, name), _dim(dim2, ndim, name)
    if d1 == d2:
        raise RuntimeError(f"{name}: diagonal dimensions cannot be identical {dim1}, {dim2}")
    return d1, d2


def diagonal(input, offset=0, dim1=0, dim2=1):
    """As ``torch.diagonal``: a view of the ``offset`` diagonal of dims (dim1, dim2), placed
    last. ``x.diagonal().add_(1)`` writes into ``x``.

    >>> tapegrad.diagonal(tapegrad.eye(3) * 2)          # tensor([2., 2., 2.])
    """
    d1, d2 = _diag_dims(input.ndim, dim1, dim2, "diagonal")
    return diagonal_op(input, offset=operator.index(offset), dim1=d1, dim2=d2)


def diag_embed(input, offset=0, dim1=-2, dim2=-1):
    """As ``torch.diag_embed``: the last dim of ``input`` on the ``offset`` diagonal of new
    dims (dim1, dim2) of size ``n + |offset|``; all else zero."""
    offset = operator.index(offset)
    ndim = input.ndim + 1
    d1, d2 = _diag_dims(ndim, dim1, dim2, "diag_embed")
    m = input.shape[-1] + abs(offset)
    rest = iter(input.shape[:-1])
    shape = tuple(m if k in (d1, d2) else next(rest) for k in range(ndim))
    return diag_embed_op(input, shape=shape, offset=offset, dim1=d1, dim2=d2)


def diag(input, diagonal=0):
    """As ``torch.diag``: a 1-d input becomes a square matrix with it on the ``diagonal``-th
    diagonal; of a 2-d input, a copy of that diagonal.

    >>> tapegrad.diag(tapegrad.tensor([1., 2.]), 1).shape     # (3, 3)
    """
    diagonal = operator.index(diagonal)
    if input.ndim == 1:
        return diag_embed(input, diagonal, 0, 1)
    if input.ndim == 2:
        from tapegrad.creation import clone

        return clone(diagonal_op(input, offset=diagonal, dim1=0, dim2=1))
    raise RuntimeError(f"diag(): Supports 1D or 2D tensors. Got {input.ndim}D")


def narrow(input, dim, start, length):
    """As ``torch.narrow``: the view ``input[..., start:start + length, ...]`` along ``dim``
    (``start`` may be negative, or a 0-d integer tensor)."""
    if input.ndim == 0:
        raise RuntimeError("narrow() cannot be applied to a 0-dim tensor.")
    if isinstance(start, _registry.Tensor):
        if start.ndim != 0 or start._data.dtype.kind not in "iu":
            raise RuntimeError("narrow(): start must be an 0-dim integral Tensor.")
        start = int(start._data)
    start, length = operator.index(start), operator.index(length)
    if length < 0:
        raise RuntimeError("narrow(): length must be non-negative.")
    d = _dim(dim, input.ndim, "narrow")
    n = input.shape[d]
    if not -n <= start <= n:
        raise IndexError(f"narrow(): start out of range (expected to be in range of [{-n}, {n}], "
                         f"but got {start})")
    if start < 0:
        start += n
    if start + length > n:
        raise RuntimeError(f"narrow(): start ({start}) + length ({length}) exceeds dimension size "
                           f"({n}) of dim {d} of a tensor of shape {tuple(input.shape)}.")
    return getitem(input, index=(slice(None),) * d + (slice(start, start + length),))


def view_as(input, other):
    """As ``Tensor.view_as(other)``: ``input.view(other.shape)``."""
    return reshape_op(input, shape=tuple(other.shape))


# --- sorting ------------------------------------------------------------------------------
def _order(a, d, descending):
    """A stable sort order of ``a`` along ``d``; NaN sorts as the largest value (as PyTorch).

    Descending: sort the reversed array stably and reverse the result, so ties keep their
    original order in both directions."""
    if not descending:
        return xp.argsort(a, axis=d, kind="stable")
    idx = xp.argsort(xp.flip(a, d), axis=d, kind="stable")
    return (a.shape[d] - 1) - xp.flip(idx, d)


def _gather(input, idx, d):
    """``input`` at ``idx`` along ``d`` (each position picked once: no accumulation)."""
    if input.ndim == 0:
        return reshape_op(index_op(reshape_op(input, shape=(1,)), index=(idx.reshape(1),),
                                   accumulate=False), shape=())
    return index_op(input, index=_grid(idx, d), accumulate=False)


SortResult = collections.namedtuple("sort", ["values", "indices"])
TopkResult = collections.namedtuple("topk", ["values", "indices"])


@op(flops=0, saves="none", differentiable=False)
def sort_order(a, dim, descending=False):
    """The stable order that sorts ``a`` along ``dim`` (int64): sort's indices as an op, so
    ``tapegrad.func.vmap`` batches it (a batched input's array is no data to sort in Python)."""
    return _order(a, dim, descending).astype(xp.int64, copy=False)


def _batched(input):
    return getattr(input._data, "value", None) is not None  # a tapegrad.func.vmap value


def _sort_order(input, dim, descending, name):
    d = _dim(dim, input.ndim, name)
    if input.ndim == 0:
        return xp.zeros((), xp.int64), d
    if _batched(input):
        return sort_order(input, dim=d, descending=descending), d
    return _order(input._data, d, descending).astype(xp.int64, copy=False), d


def _picked(input, idx, d):
    """``(values, indices)`` of ``input`` at ``idx`` along ``d`` (an array, or a vmap op's
    Tensor of indices: then gathered by the batched ``take_along_reduce``)."""
    if isinstance(idx, _registry.Tensor):
        return take_along_reduce(input, idx=idx, dim=d, keepdim=True), idx
    return _gather(input, idx, d), _registry.Tensor._make(idx)


def sort(input, dim=-1, descending=False, stable=False):
    """As ``torch.sort``: ``(values, indices)`` along ``dim``; the gradient flows to the
    picked positions. tapegrad's sort is always stable (ties keep their order), which is
    what PyTorch guarantees with ``stable=True``."""
    idx, d = _sort_order(input, dim, descending, "sort")
    return SortResult(*_picked(input, idx, d))


def argsort(input, dim=-1, descending=False, stable=False):
    """As ``torch.argsort``: the indices that sort ``input`` along ``dim`` (stable)."""
    idx = _sort_order(input, dim, descending, "argsort")[0]
    return idx if isinstance(idx, _registry.Tensor) else _registry.Tensor._make(idx)


def topk(input, k, dim=-1, largest=True, sorted=True):
    """As ``torch.topk``: the ``k`` largest (``largest=False``: smallest) entries along ``dim``
    and their indices, largest first; NaN counts as the largest value. Among equal values
    the lower index comes first (see docs/differences.md); ``sorted=False`` also returns them
    sorted.

    >>> tapegrad.topk(tapegrad.tensor([1., 5., 3.]), 2)      # values [5, 3], indices [1, 2]
    """
    if input.dtype.name == "bool":
        raise RuntimeError("topk does not support bool dtypes on CPU")
    k = operator.index(k)
    d = _dim(dim, input.ndim, "topk")
    n = input.shape[d] if input.ndim else 1
    if not 0 <= k <= n:
        raise RuntimeError(f"topk: selected index k out of range (k={k} for dimension {d} of "
                           f"size {n} of a tensor of shape {tuple(input.shape)})")
    if input.ndim == 0:
        idx = xp.zeros((), xp.int64)
    elif _batched(input):
        idx = getitem(sort_order(input, dim=d, descending=largest),
                      index=(slice(None),) * d + (slice(0, k),))
    else:
        order = _order(input._data, d, largest)
        idx = xp.take(order, array_module(order).arange(k), axis=d).astype(xp.int64, copy=False)
    return TopkResult(*_picked(input, idx, d))


__all__ = ["diagonal", "diag_embed", "diag", "narrow", "sort", "argsort", "topk"]
TENSOR_METHODS = __all__[:] + ["view_as"]
