"""Sparse COO tensors, as PyTorch's ``layout=torch.sparse_coo``.

A sparse tensor is a ``Tensor`` (the subclass ``SparseCooTensor``) holding ``indices`` (an
int64 array of shape (sparse_dim, nnz)) and ``values`` (a Tensor of shape (nnz, *dense)).
Everything differentiable happens to ``values`` through registered ops: the constructor's
alias, ``coalesce``, ``to_dense``, ``to_sparse`` and the sparse-dense product
``sparse_addmm``, so the tape, gradcheck and ``create_graph`` see ordinary ops. A sparse
leaf that requires grad keeps its gradient on its values (one per stored entry: the
gradient at that entry's position) and shows it as a coalesced sparse ``.grad``.

Where a dense tensor holds its array, a sparse one holds ``SparseData``: the dense shape
and dtype, and nothing to compute with. An op that does not take sparse inputs reaches it
in its forward and raises there, and dispatch reports the op and the shapes: sparse
tensors are never densified behind the caller's back.
"""
import itertools
import math
import weakref

from tapegrad import dtypes
from tapegrad.autograd.grad_mode import state as grad_state
from tapegrad.backend import xp
from tapegrad.backend.scatter import sparse_rows
from tapegrad.ops import elementwise as _E, linalg as _L
from tapegrad.ops.movement import reshape_op, permute_op, _dim, _dims
from tapegrad.ops.indexing import index_op, index_backward
from tapegrad.ops.reduce import sum_op
from tapegrad.ops.registry import op
from tapegrad import tensor as _T
from tapegrad import printing as _P
from tapegrad.sparse.layout import sparse_coo

Tensor = _T.Tensor

_UNSUPPORTED = ("expected a strided (dense) tensor but got layout=tapegrad.sparse_coo: this "
                "operation does not support sparse tensors (convert with .to_dense() first)")


class SparseData:
    """What a sparse tensor holds in place of an array: its dense shape and dtype only.

    Reading ``shape``, ``dtype``, ``ndim``, ``size`` works; anything else (numpy calls,
    arithmetic, indexing, methods) raises ``TypeError`` naming the layout, which dispatch
    rewraps with the op's name and input shapes."""

    __slots__ = ("shape", "dtype", "ndim", "size", "itemsize")

    def __init__(self, shape, dtype):
        self.shape = tuple(shape)
        self.dtype = dtype
        self.ndim = len(self.shape)
        self.size = math.prod(self.shape)
        self.itemsize = dtype.itemsize

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        raise TypeError(_UNSUPPORTED)

    def _refuse(self, *args, **kwargs):
        raise TypeError(_UNSUPPORTED)

    __array__ = __getitem__ = __setitem__ = __iter__ = __bool__ = __float__ = __int__ = _refuse
    __index__ = __neg__ = __pos__ = __abs__ = __invert__ = _refuse


for _name in ("add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "matmul", "and", "or",
              "xor", "lshift", "rshift"):
    setattr(SparseData, f"__{_name}__", SparseData._refuse)
    setattr(SparseData, f"__r{_name}__", SparseData._refuse)


# --- ops over the values ------------------------------------------------------------------
def _alias(name, doc):
    """An identity op over values: gives the sparse result its own ``grad_fn`` (PyTorch's
    name) so that it is not mistaken for the leaf it was built from."""

    @op(saves="none", name=name, linear=True)
    def alias(values):
        return values

    alias.forward.__doc__ = doc

    @alias.grad
    def _(g, out, values):
        return g

    return alias


construct_op = _alias("sparse_coo_tensor_with_dims_and_tensors",
                      "sparse_coo_tensor's values (SparseCooTensorWithDimsAndTensorsBackward).")
values_op = _alias("values", "A coalesced sparse tensor's values(), differentiable.")
transpose_op = _alias("sparse_transpose", "The values of a transposed sparse tensor.")


@op(flops=1, saves="none", name="coalesce", linear=True)
def coalesce_op(values, inverse, n):
    """Sum the values of duplicate entries: entry k goes to slot ``inverse[k]`` of ``n``."""
    return index_backward(values, shape=(n,) + values.shape[1:], index=(inverse, Ellipsis))


@coalesce_op.grad
def _(g, out, values, inverse, n):
    return index_op(g, index=(inverse, Ellipsis))


@op(flops=1, saves="none", name="to_dense", linear=True)
def to_dense_op(values, flat, shape):
    """Scatter-add the values into zeros(shape); ``flat``: each entry's linear position over
    the sparse dims (duplicates add, as PyTorch's to_dense does)."""
    lead = math.prod(shape[:len(shape) - values.ndim + 1])
    out = index_backward(values, shape=(lead,) + values.shape[1:], index=(flat, Ellipsis))
    return out.reshape(shape)


@to_dense_op.grad
def _(g, out, values, flat, shape):
    lead = math.prod(shape[:len(shape) - values.ndim + 1])
    return index_op(reshape_op(g, shape=(lead,) + tuple(values.shape[1:])),
                    index=(flat, Ellipsis))


@op(saves="none", name="to_sparse", linear=True)
def to_sparse_op(a, index):
    """The entries of dense ``a`` at ``index`` (a tuple of index arrays): a sparse values."""
    return a[index]


@to_sparse_op.grad
def _(g, out, a, index):
    return index_backward(g, shape=a.shape, index=index, accumulate=False)


@op(flops=2, needs=True, uses=((1,), (0,)), name="sparse_addmm")
def sparse_addmm(values, dense, rows, cols, n):
    """``S @ dense`` for the 2-D sparse S with entries ``(rows[k], cols[k], values[k])`` and
    ``n`` rows; ``dense`` 2-D or 1-D. Contributions are added row by row in entry order, as
    PyTorch's CPU kernel adds them (over the coalesced entries)."""
    passes = _PASSES.get(id(rows))  # the rows of a matrix multiplied before (``_products``)
    if passes is not None:
        out = passes.add(values, dense, rows, cols, n)
        if out is not None:
            return out
    out = _fused(values, dense, rows, cols, n)
    if out is not None:
        return out
    if dense.ndim == 1:
        contrib = values * dense[cols]
        return index_backward(contrib, shape=(n,), index=(rows, Ellipsis))
    contrib = values[:, None] * dense[cols]
    return index_backward(contrib, shape=(n, dense.shape[1]), index=(rows, Ellipsis))


@sparse_addmm.grad
def _(g, out, values, dense, rows, cols, n, needs=(True, True)):
    grad_values = grad_dense = None
    if needs[0]:  # d/dv_k = <g[row_k], dense[col_k]>: the gradient at the entry's position
        prod = index_op(g, index=(rows, Ellipsis)) * index_op(dense, index=(cols, Ellipsis))
        grad_values = prod if prod.ndim == 1 else sum_op(prod, dims=(1,))
    if needs[1]:  # S^T @ g
        grad_dense = sparse_addmm(values, g, rows=cols, cols=rows, n=dense.shape[0])
    return grad_values, grad_dense


@sparse_addmm.jvp
def _(t, out, values, dense, rows, cols, n):
    r = sparse_addmm(t[0], dense, rows=rows, cols=cols, n=n) if t[0] is not None else None
    if t[1] is not None:
        rd = sparse_addmm(values, t[1], rows=rows, cols=cols, n=n)
        r = rd if r is None else r + rd
    return r


# --- products of one matrix, many times: the row sums planned once ----------------------------
_PASSES = {}  # id(index view) -> _Passes, dropped when the view dies (weakref.finalize)


class _Passes:
    """``sparse_addmm``'s sums by output row for one sparse matrix's ``rows`` (and its ``cols``),
    planned once for the many products a training loop takes with the same matrix.

    The entries are grouped into passes: pass k holds the k-th entry (in entry order) of every
    row that has one, so no row repeats within a pass and each pass is one fancy-indexed add
    into a float64 accumulator. Every row's sum thus starts at 0.0 and adds its entries'
    products in entry order in float64, as ``index_backward``'s bincount does: the same bits,
    without bincount's per-element flat positions. The plan is built at the second product
    (a matrix used once never pays for it) and only used while the passes are few against
    the work (a very skewed row length gives many tiny passes: bincount then stays faster).
    With numba installed, a float product large enough is one ``_fused`` pass instead, the
    same bits again; the plan is still made, for the products numba's loop does not take."""

    __slots__ = ("bounds", "cols", "dest", "order", "source", "uses")

    def __init__(self, cols):
        # weak: the registry must not keep the views alive (their death drops the entry)
        self.cols, self.uses, self.order = weakref.ref(cols), 0, None

    def _plan(self, rows, cols):
        by_row = xp.argsort(rows, kind="stable")
        grouped = rows[by_row]
        first = xp.empty(grouped.shape[0], dtype=bool)
        first[0] = True
        first[1:] = grouped[1:] != grouped[:-1]
        starts = xp.flatnonzero(first)
        rank = xp.arange(grouped.shape[0]) - xp.repeat(starts, xp.diff(
            xp.append(starts, grouped.shape[0])))
        by_rank = xp.argsort(rank, kind="stable")  # within a pass, entries stay row-sorted
        self.order = by_row[by_rank]
        self.dest = rows[self.order]
        self.source = cols[self.order]
        self.bounds = xp.searchsorted(rank[by_rank], xp.arange(int(rank.max()) + 2)).tolist()

    def add(self, values, dense, rows, cols, n):
        """``S @ dense`` through the passes, or None where bincount is the better way."""
        if cols is not self.cols() or type(values) is not xp.ndarray \
                or type(dense) is not xp.ndarray or rows.shape[0] == 0:
            return None
        if self.order is None:
            self.uses += 1
            if self.uses < 2:
                return None
            self._plan(rows, cols)
        out = _fused(values, dense, rows, cols, n)
        if out is not None:
            return out
        width = dense.shape[1] if dense.ndim == 2 else 1
        # a pass costs ~20 us of calls and saves ~2.5 ns per element against bincount
        # (measured, float32, 2 cores): below ~8k elements a pass, bincount is faster
        if (len(self.bounds) - 1) * 8192 > rows.shape[0] * width:
            return None
        picked = values[self.order]
        prod = (picked[:, None] if dense.ndim == 2 else picked) * dense[self.source]
        if prod.dtype.kind != "f":
            return None
        out = xp.zeros((n,) + dense.shape[1:], dtype=xp.float64)
        dest, bounds = self.dest, self.bounds
        for a, b in itertools.pairwise(bounds):
            out[dest[a:b]] += prod[a:b]
        return out.astype(prod.dtype, copy=False)


def _fused(values, dense, rows, cols, n):
    """``S @ dense`` in one numba pass over the entries (``backend.scatter.sparse_rows``: the
    products, then each row's float64 sum from 0.0 in entry order: the bits of the bincount
    and planned paths, without the (nnz, width) product array), or None where it does not
    apply (numba missing, mixed or integer dtypes, a small product)."""
    if type(values) is not xp.ndarray or type(dense) is not xp.ndarray:
        return None
    out = sparse_rows(values, dense, rows, cols, n)
    return None if out is None else out.astype(values.dtype, copy=False)


def _products(s):
    """The (rows, cols) index views of a coalesced 2-D sparse tensor, the same objects on
    every call, with their row-sum plans registered (``_Passes``)."""
    if s._product_views is None:
        rows, cols = s._indices_array
        for a, b in ((rows, cols), (cols, rows)):
            _PASSES[id(a)] = _Passes(b)
            weakref.finalize(a, _PASSES.pop, id(a), None)
        s._product_views = (rows, cols)
    return s._product_views


# --- the tensor ---------------------------------------------------------------------------
def _groups(indices):
    """Coalescing of an (sparse_dim, nnz) index array: (unique indices sorted
    lexicographically, inverse: each entry's slot, first: each slot's first entry)."""
    sd, nnz = indices.shape
    if nnz == 0:
        return indices, xp.zeros(0, xp.int64), xp.zeros(0, xp.int64)
    order = xp.lexsort(indices[::-1]) if sd else xp.arange(nnz)
    ordered = indices[:, order]
    new = xp.empty(nnz, dtype=bool)
    new[0] = True
    new[1:] = (ordered[:, 1:] != ordered[:, :-1]).any(axis=0) if sd else False
    inverse = xp.empty(nnz, dtype=xp.int64)
    inverse[order] = xp.cumsum(new) - 1
    return xp.ascontiguousarray(ordered[:, new]), inverse, order[new]


def _sparse(indices, values, shape, coalesced):
    """A sparse tensor over ``indices`` (int64 array) and ``values`` (a Tensor it owns)."""
    if _L._sparse is None:  # the first sparse tensor: matmul starts checking for them
        _L.accept_sparse(SparseCooTensor, matmul)
    t = object.__new__(SparseCooTensor)
    t._data = SparseData(shape, values._data.dtype)
    t._indices_array = indices
    t._values_tensor = values
    t._coalesced = bool(coalesced)
    t._coalescing = None
    t._product_views = None
    t.grad_fn = values.grad_fn
    t._requires_grad = values._requires_grad
    t._version = [0]
    t._hooks = None
    return t


def _in_place_refused(name):
    def method(self, *args, **kwargs):
        raise RuntimeError(f"{name}: in-place operations on sparse_coo tensors are not "
                           f"supported (shape {self.shape}); use the out-of-place form")

    method.__name__ = name
    return method


class SparseCooTensor(Tensor):
    """A tensor with ``layout=tapegrad.sparse_coo`` (``tapegrad.sparse_coo_tensor``,
    ``Tensor.to_sparse()``): indices of shape (sparse_dim, nnz), values (nnz, *dense)."""

    __slots__ = ("_indices_array", "_values_tensor", "_coalesced", "_coalescing",
                 "_product_views")

    # --- layout and structure -------------------------------------------------------------
    @property
    def layout(self):
        return sparse_coo

    @property
    def is_sparse(self) -> bool:
        return True

    def sparse_dim(self) -> int:
        """As ``Tensor.sparse_dim()``: the number of sparse dims (rows of ``indices``)."""
        return self._indices_array.shape[0]

    def dense_dim(self) -> int:
        """As ``Tensor.dense_dim()``: the dims each value carries."""
        return self._values_tensor.ndim - 1

    def _nnz(self) -> int:
        """As ``Tensor._nnz()``: the number of stored entries (duplicates included)."""
        return self._indices_array.shape[1]

    def is_coalesced(self) -> bool:
        """As ``Tensor.is_coalesced()``: indices unique and sorted lexicographically."""
        return self._coalesced

    def _indices(self):
        """As ``Tensor._indices()``: the stored indices, coalesced or not."""
        return Tensor._make(self._indices_array)

    def _values(self):
        """As ``Tensor._values()``: the stored values, detached (as PyTorch's)."""
        return self._values_tensor.detach()

    def indices(self):
        """As ``Tensor.indices()``: needs a coalesced tensor."""
        if not self._coalesced:
            raise RuntimeError("Cannot get indices on an uncoalesced tensor, please call "
                               ".coalesce() first")
        return Tensor._make(self._indices_array)

    def values(self):
        """As ``Tensor.values()``: needs a coalesced tensor; differentiable."""
        if not self._coalesced:
            raise RuntimeError("Cannot get values on an uncoalesced tensor, please call "
                               ".coalesce() first")
        return values_op(self._values_tensor)

    def _coalesce_plan(self):
        if self._coalescing is None:
            self._coalescing = _groups(self._indices_array)
        return self._coalescing

    def coalesce(self):
        """As ``Tensor.coalesce()``: duplicates summed, indices sorted lexicographically."""
        if self._coalesced:
            return self
        unique, inverse, _ = self._coalesce_plan()
        values = coalesce_op(self._values_tensor, inverse=inverse, n=unique.shape[1])
        return _sparse(unique, values, self.shape, True)

    def to_dense(self, dtype=None, *, masked_grad=None):
        """As ``Tensor.to_dense()``: the dense tensor (differentiable in the values)."""
        if dtype is not None:
            raise RuntimeError("dtype argument is not supported by sparse_to_dense")
        shape = self.shape
        sd = self.sparse_dim()
        idx = self._indices_array
        if sd == 0:
            flat = xp.zeros(idx.shape[1], dtype=xp.int64)
        else:
            flat = xp.ravel_multi_index(tuple(idx), shape[:sd])
        return to_dense_op(self._values_tensor, flat=flat, shape=shape)

    def to_sparse(self, sparse_dim=None, *, layout=None, blocksize=None, dense_dim=None):
        """As ``Tensor.to_sparse()``: a sparse_coo tensor is returned as it is."""
        if layout not in (None, sparse_coo):
            raise RuntimeError(f"to_sparse: layout {layout} is not supported (only "
                               "tapegrad.sparse_coo)")
        if sparse_dim is not None and sparse_dim != self.sparse_dim():
            raise RuntimeError(f"to_sparse: conversion from sparse_coo with sparse_dim="
                               f"{self.sparse_dim()} to sparse_dim={sparse_dim} is not "
                               "supported")
        return self

    # --- autograd -------------------------------------------------------------------------
    @property
    def requires_grad(self) -> bool:
        return self._values_tensor._requires_grad

    @requires_grad.setter
    def requires_grad(self, value):
        if self.grad_fn is not None and not value:
            raise RuntimeError(
                "you can only change requires_grad flags of leaf variables. If you want to use "
                "a computed variable in a subgraph that doesn't require differentiation use "
                "var_no_grad = var.detach().")
        self._values_tensor.requires_grad = value
        self._requires_grad = self._values_tensor._requires_grad

    @property
    def grad(self):
        """A leaf's gradient: sparse, coalesced, at this tensor's (coalesced) entries."""
        g = self._values_tensor.grad
        if g is None or self.grad_fn is not None:
            return None
        if self._coalesced:
            return _sparse(self._indices_array, Tensor._make(g._data), self.shape, True)
        unique, _, first = self._coalesce_plan()
        # every duplicate of a position holds the gradient at that position: take one
        return _sparse(unique, Tensor._make(g._data[first]), self.shape, True)

    @grad.setter
    def grad(self, value):
        if value is not None:
            raise RuntimeError("grad: only None can be assigned to the .grad of a sparse_coo "
                               "tensor in tapegrad")
        self._values_tensor.grad = None

    def backward(self, gradient=None, retain_graph=None, create_graph=False, inputs=None):
        raise RuntimeError(f"backward: a sparse_coo tensor (shape {self.shape}) cannot start a "
                           "backward pass; reduce it to a dense tensor first (e.g. "
                           "tapegrad.sparse.sum)")

    def register_hook(self, hook):
        raise RuntimeError("register_hook: hooks on sparse_coo tensors are not supported")

    def retain_grad(self):
        raise RuntimeError("retain_grad: not supported for sparse_coo tensors")

    def detach(self):
        """As ``Tensor.detach()``: the same indices and values, no graph."""
        return _sparse(self._indices_array, self._values_tensor.detach(), self.shape,
                       self._coalesced)

    def clone(self, memory_format=None):
        """As ``Tensor.clone()``: copies of the indices and values (differentiable)."""
        return _sparse(self._indices_array.copy(), self._values_tensor.clone(), self.shape,
                       self._coalesced)

    def to(self, *args, **kwargs):
        """As ``Tensor.to``: a dtype change converts the values (differentiable)."""
        dtype, copy, dev = _T._to_args(self, args, kwargs)
        if dev is not None and dev.type != "cpu":
            raise RuntimeError(f"to: sparse tensors live on the cpu only (got device {dev})")
        if dtype is not None and dtype.np != self._data.dtype:
            return _sparse(self._indices_array, self._values_tensor.to(dtype), self.shape,
                           self._coalesced)
        return self.clone() if copy else self

    # --- conversion to Python and numpy: refused, as in PyTorch ---------------------------
    def numpy(self, force=False):
        raise TypeError("can't convert Sparse layout tensor to numpy. Use Tensor.to_dense() "
                        "first.")

    def __array__(self, dtype=None, copy=None):
        raise TypeError("can't convert Sparse layout tensor to numpy. Use Tensor.to_dense() "
                        "first.")

    def tolist(self):
        raise RuntimeError("tolist: not supported for sparse_coo tensors; use "
                           "Tensor.to_dense() first")

    def item(self):
        raise RuntimeError("item: not supported for sparse_coo tensors; use Tensor.to_dense() "
                           "first")

    def __dlpack__(self, *args, **kwargs):
        raise RuntimeError("Cannot export sparse_coo tensors through DLPack; use "
                           "Tensor.to_dense() first")

    def __getstate__(self):
        raise TypeError("pickling sparse_coo tensors is not supported in tapegrad; save the "
                        "indices and values")

    def __repr__(self):
        return _repr(self)

    # --- arithmetic -----------------------------------------------------------------------
    def t(self):
        """As ``Tensor.t()``: a 2-D sparse tensor with its two dims swapped."""
        if self.sparse_dim() > 2 or self.dense_dim() != 0:
            raise RuntimeError(f"t: expects a tensor with <= 2 sparse and 0 dense dimensions, "
                               f"but got {self.sparse_dim()} sparse and {self.dense_dim()} "
                               "dense dimensions")
        return self.transpose(0, 1) if self.ndim == 2 else self

    def transpose(self, dim0, dim1):
        """As ``Tensor.transpose`` of a sparse tensor: two sparse dims (indices swap) or two
        dense dims (values transpose)."""
        d0, d1 = _dim(dim0, self.ndim, "transpose"), _dim(dim1, self.ndim, "transpose")
        sd = self.sparse_dim()
        shape = list(self.shape)
        shape[d0], shape[d1] = shape[d1], shape[d0]
        if d0 == d1:
            return _sparse(self._indices_array, transpose_op(self._values_tensor), self.shape,
                           self._coalesced)
        if d0 < sd and d1 < sd:
            order = list(range(sd))
            order[d0], order[d1] = order[d1], order[d0]
            return _sparse(self._indices_array[order], transpose_op(self._values_tensor),
                           tuple(shape), False)
        if d0 >= sd and d1 >= sd:
            dims = list(range(self._values_tensor.ndim))
            a, b = d0 - sd + 1, d1 - sd + 1
            dims[a], dims[b] = dims[b], dims[a]
            return _sparse(self._indices_array, permute_op(self._values_tensor, dims=tuple(dims)),
                           tuple(shape), self._coalesced)
        raise RuntimeError(f"transpose: cannot swap sparse dim and dense dim of a sparse_coo "
                           f"tensor (dims {d0} and {d1}, sparse_dim {sd}, shape {self.shape})")

    def _scaled(self, other, name, fn):
        if isinstance(other, Tensor) and other.ndim == 0 and not other.is_sparse:
            pass
        elif not isinstance(other, (int, float, bool)):
            raise TypeError(f"{name}: a sparse_coo tensor combines with a Python number or a "
                            f"0-d tensor here, not {type(other).__name__}")
        return _sparse(self._indices_array, fn(self._values_tensor, other), self.shape,
                       self._coalesced)

    def mul(self, other):
        """As ``Tensor.mul``: by a number or 0-d tensor (sparse result), or by a dense tensor
        of the same shape (sparse result: the values times the dense entries)."""
        if isinstance(other, Tensor) and not other.is_sparse and other.ndim > 0:
            if tuple(other.shape) != self.shape:
                raise RuntimeError(f"mul: a sparse_coo tensor of shape {self.shape} multiplies "
                                   f"a dense tensor of the same shape only, got "
                                   f"{tuple(other.shape)}")
            picked = index_op(other, index=tuple(self._indices_array) + (Ellipsis,))
            return _sparse(self._indices_array, _E.mul(self._values_tensor, picked),
                           self.shape, self._coalesced)
        if isinstance(other, SparseCooTensor):
            raise RuntimeError(f"mul: sparse_coo * sparse_coo is not supported in tapegrad "
                               f"(shapes {self.shape} and {other.shape})")
        return self._scaled(other, "mul", _E.mul)

    __mul__ = __rmul__ = mul

    def div(self, other):
        """As ``Tensor.div`` by a number or a 0-d tensor."""
        return self._scaled(other, "div", _E.div_op)

    __truediv__ = div

    def __neg__(self):
        return _sparse(self._indices_array, _E.neg(self._values_tensor), self.shape,
                       self._coalesced)

    neg = __neg__

    def add(self, other, alpha=1):
        """As ``Tensor.add``: sparse + sparse of one shape is sparse (entries merged as
        PyTorch merges them); sparse + dense raises, as in PyTorch."""
        if not isinstance(other, SparseCooTensor):
            raise RuntimeError("add(sparse, dense) is not supported. Use add(dense, sparse) "
                               "instead.")
        return _add(self, other, alpha)

    __add__ = add

    def sub(self, other, alpha=1):
        """As ``Tensor.sub`` of two sparse tensors."""
        if not isinstance(other, SparseCooTensor):
            raise RuntimeError("sub(sparse, dense) is not supported. Use sub(dense, sparse) "
                               "instead.")
        return _add(self, other, -alpha)

    __sub__ = sub

    def __radd__(self, other):  # dense + sparse: dense, as in PyTorch
        if isinstance(other, Tensor):
            return _E.add(other, self.to_dense())
        raise TypeError(f"add: a number plus a sparse_coo tensor is not supported "
                        f"(shape {self.shape})")

    def __rsub__(self, other):
        if isinstance(other, Tensor):
            return _E.sub(other, self.to_dense())
        raise TypeError(f"sub: a number minus a sparse_coo tensor is not supported "
                        f"(shape {self.shape})")

    def matmul(self, other):
        """As ``Tensor.matmul`` with a sparse operand (see ``tapegrad.sparse.mm``)."""
        return matmul(self, other, name="matmul")

    def mm(self, mat2):
        return matmul(self, mat2, name="mm")

    def __matmul__(self, other):
        return matmul(self, other, name="matmul")

    def __rmatmul__(self, other):
        return matmul(other, self, name="matmul")

    def sum(self, dim=None, keepdim=False, dtype=None):
        """As ``Tensor.sum`` of a sparse tensor: ``tapegrad.sparse.sum``."""
        if keepdim:
            raise RuntimeError("sum: keepdim=True is not supported for sparse_coo tensors")
        return sparse_sum(self, dim, dtype=dtype)


for _name in ("add_", "sub_", "mul_", "div_", "pow_", "zero_", "fill_", "copy_", "normal_",
              "uniform_", "clamp_", "neg_", "abs_", "exp_", "log_", "sqrt_", "relu_",
              "masked_fill_", "addcmul_", "addcdiv_", "lerp_", "__setitem__", "__iadd__",
              "__isub__", "__imul__", "__itruediv__", "__ipow__"):
    setattr(SparseCooTensor, _name, _in_place_refused(_name.strip("_") + "_"
                                                      if _name.startswith("__") else _name))


# --- construction ---------------------------------------------------------------------------
def _index_rows(indices):
    data = indices._data if isinstance(indices, Tensor) else xp.asarray(indices)
    if isinstance(indices, SparseCooTensor):
        raise TypeError("sparse_coo_tensor: indices must be a dense tensor")
    if data.dtype.kind not in "iub":
        if data.dtype.kind == "f" and data.size and not (data == xp.floor(data)).all():
            raise RuntimeError("sparse_coo_tensor: indices must be integers")
    if data.ndim != 2:
        if data.ndim == 1 and data.size == 0:
            data = data.reshape(1, 0)
        else:
            raise RuntimeError(f"sparse_coo_tensor: indices must be a 2-D (sparse_dim, nnz) "
                               f"tensor, got shape {tuple(data.shape)}")
    return xp.ascontiguousarray(data, dtype=xp.int64)


def sparse_coo_tensor(indices, values, size=None, *, dtype=None, device=None,
                      requires_grad=False, check_invariants=None, is_coalesced=None):
    """As ``torch.sparse_coo_tensor``: entries ``values[k]`` at ``indices[:, k]``.

    >>> tapegrad.sparse_coo_tensor([[0, 1], [2, 0]], [3., 4.], (2, 3))
    """
    from tapegrad.backend.device import resolve as resolve_device

    resolve_device(device, "sparse_coo_tensor")
    idx = _index_rows(indices)
    if isinstance(values, SparseCooTensor):
        raise TypeError("sparse_coo_tensor: values must be a dense tensor")
    if not isinstance(values, Tensor):
        values = Tensor._from_data(values, dtype=dtype)
    elif dtype is not None and dtypes.to_dtype(dtype).np != values._data.dtype:
        values = values.to(dtypes.to_dtype(dtype))
    if values.ndim == 0:
        raise RuntimeError("sparse_coo_tensor: values must have at least one dim (nnz, ...), "
                           "got a 0-d tensor")
    sd, nnz = idx.shape
    if values.shape[0] != nnz:
        raise RuntimeError(f"indices and values must have same nnz, but got nnz from indices: "
                           f"{nnz}, nnz from values: {values.shape[0]}")
    dense_shape = tuple(values.shape[1:])
    if size is None:
        lead = tuple(int(m) + 1 for m in idx.max(axis=1)) if nnz else (0,) * sd
        if nnz and idx.min() < 0:
            raise RuntimeError(f"sparse_coo_tensor: found negative index {int(idx.min())}")
        shape = lead + dense_shape
    else:
        shape = tuple(int(s) for s in size)
        if len(shape) != sd + len(dense_shape):
            raise RuntimeError(f"'len(size) == sparse_dim + dense_dim' is not satisfied: "
                               f"len(size) = {len(shape)}, sparse_dim = {sd}, dense_dim = "
                               f"{len(dense_shape)}")
        if shape[sd:] != dense_shape:
            raise RuntimeError(f"sparse_coo_tensor: values has incorrect size, expected "
                               f"{list((nnz,) + shape[sd:])}, got {list(values.shape)}")
        if nnz:
            for d in range(sd):
                lo, hi = int(idx[d].min()), int(idx[d].max())
                if lo < 0:
                    raise RuntimeError(f"sparse_coo_tensor: found negative index {lo} for "
                                       f"dim {d}")
                if hi >= shape[d]:
                    raise RuntimeError(f"sparse_coo_tensor: size is inconsistent with indices: "
                                       f"for dim {d}, size is {shape[d]} but found index {hi}")
    if values._requires_grad and grad_state.enabled:
        owned = construct_op(values)
    else:
        owned = values.detach()
    if requires_grad:
        owned.requires_grad = True
    coalesced = nnz <= 1 if is_coalesced is None else bool(is_coalesced)
    return _sparse(idx, owned, shape, coalesced)


def to_sparse(x, sparse_dim=None, *, layout=None, blocksize=None, dense_dim=None):
    """As ``Tensor.to_sparse()``: the nonzero entries of a dense tensor, coalesced.

    ``sparse_dim`` (or ``dense_dim``) splits the dims as in PyTorch: an entry is kept when any
    element of its dense block is nonzero."""
    if isinstance(x, SparseCooTensor):
        return x.to_sparse(sparse_dim, layout=layout, blocksize=blocksize, dense_dim=dense_dim)
    if layout not in (None, sparse_coo):
        raise RuntimeError(f"to_sparse: layout {layout} is not supported (only "
                           "tapegrad.sparse_coo)")
    if blocksize is not None:
        raise RuntimeError("to_sparse: blocksize is only for block sparse layouts")
    ndim = x.ndim
    sd = ndim if sparse_dim is None else int(sparse_dim)
    if dense_dim is not None:
        sd = ndim - int(dense_dim)
    if not 0 < sd <= ndim:
        raise RuntimeError(f"to_sparse: sparse_dim must be in [1, {ndim}] for a tensor of "
                           f"shape {tuple(x.shape)}, got {sd}")
    data = x._data
    if getattr(data, "value", None) is not None:  # PyTorch's vmap has no sparse tensors either
        raise RuntimeError("to_sparse: the nonzero pattern depends on the values: not supported "
                           "on a batched tensor inside tapegrad.func.vmap")
    mask = data != 0
    if sd < ndim:
        mask = mask.any(axis=tuple(range(sd, ndim)))
    where = xp.nonzero(mask)  # row-major: lexicographic order, so coalesced
    indices = xp.stack(where).astype(xp.int64, copy=False)
    values = to_sparse_op(x, index=tuple(where) + (Ellipsis,))
    return _sparse(indices, values, tuple(x.shape), True)


# --- sums, merges and products --------------------------------------------------------------
def _merge(a, b):
    """Output slots of a's and b's entries in a + b, as PyTorch merges: walk both entry lists,
    take the lexicographically smaller index, add the two when equal. (out indices,
    slots of a, slots of b)."""
    ia, ib = a._indices_array, b._indices_array
    na, nb = ia.shape[1], ib.shape[1]
    if a._coalesced and b._coalesced:  # sorted, unique: one stable sort is the merge
        both = xp.concatenate([ia, ib], axis=1)
        unique, inverse, _ = _groups(both)
        return unique, inverse[:na], inverse[na:]
    ta, tb = list(map(tuple, ia.T.tolist())), list(map(tuple, ib.T.tolist()))
    slot_a, slot_b = xp.empty(na, xp.int64), xp.empty(nb, xp.int64)
    out = []
    i = j = 0
    while i < na or j < nb:
        if j == nb or (i < na and ta[i] < tb[j]):
            slot_a[i] = len(out)
            out.append(ta[i])
            i += 1
        elif i == na or ta[i] > tb[j]:
            slot_b[j] = len(out)
            out.append(tb[j])
            j += 1
        else:
            slot_a[i] = slot_b[j] = len(out)
            out.append(ta[i])
            i += 1
            j += 1
    rows = xp.array(out, dtype=xp.int64).T if out else xp.zeros((ia.shape[0], 0), xp.int64)
    return xp.ascontiguousarray(rows), slot_a, slot_b


def _add(a, b, alpha):
    if a.shape != b.shape:
        raise RuntimeError(f"add: expected 'self' and 'other' to have same size, but self has "
                           f"size {list(a.shape)} while other has size {list(b.shape)} (FYI: "
                           "op2-sparse addition does not currently support broadcasting)")
    if a.sparse_dim() != b.sparse_dim():
        raise RuntimeError(f"add: sparse tensors with different sparse dims ({a.sparse_dim()} "
                           f"and {b.sparse_dim()}) cannot be added")
    out, slot_a, slot_b = _merge(a, b)
    n = out.shape[1]
    va, vb = a._values_tensor, b._values_tensor
    dt = dtypes.result_type(va, vb)
    if va._data.dtype != dt.np:
        va = _E.to_dtype(va, dtype=dt)
    if vb._data.dtype != dt.np:
        vb = _E.to_dtype(vb, dtype=dt)
    if alpha != 1:
        vb = _E.mul(vb, alpha)
    values = _E.add(coalesce_op(va, inverse=slot_a, n=n), coalesce_op(vb, inverse=slot_b, n=n))
    return _sparse(out, values, a.shape, a._coalesced and b._coalesced)


def sparse_sum(input, dim=None, dtype=None):
    """As ``torch.sparse.sum``: all dims give a dense 0-d tensor; some dims give a sparse
    tensor (coalesced) while sparse dims remain, else a dense one."""
    if not isinstance(input, SparseCooTensor):
        raise RuntimeError(f"sparse.sum: expected a sparse_coo tensor, got layout "
                           f"tapegrad.strided (shape {tuple(input.shape)})")
    values = input._values_tensor
    if dtype is not None:
        values = values.to(dtypes.to_dtype(dtype))
    if dim is None:
        return sum_op(values, dims=tuple(range(values.ndim)))
    dims = _dims(dim, input.ndim, "sparse.sum")
    sd = input.sparse_dim()
    sparse_dims = [d for d in dims if d < sd]
    dense_dims = tuple(d - sd + 1 for d in dims if d >= sd)
    if dense_dims:
        values = sum_op(values, dims=dense_dims)
    if len(sparse_dims) == sd:
        return sum_op(values, dims=(0,))
    keep = [d for d in range(input.ndim) if d not in dims]
    shape = tuple(input.shape[d] for d in keep)
    if not sparse_dims:
        return _sparse(input._indices_array, values, shape, input._coalesced)
    rows = [d for d in range(sd) if d not in sparse_dims]
    reduced = _sparse(xp.ascontiguousarray(input._indices_array[rows]), values, shape, False)
    return reduced.coalesce()


def _check_dense(x, name, what):
    if not isinstance(x, Tensor):
        raise TypeError(f"{name}(): argument '{what}' must be Tensor, not {type(x).__name__}")


def _sparse_sparse(a, b, name):
    """The product of two 2-D sparse tensors: sparse, coalesced (values differentiable)."""
    if a.shape[1] != b.shape[0]:
        raise RuntimeError(f"{name}: shapes {a.shape} and {b.shape} cannot be multiplied "
                           f"({a.shape[1]} != {b.shape[0]})")
    if a.dtype is not b.dtype:
        raise RuntimeError(f"{name}: expected both operands to have the same dtype, but got "
                           f"{a.dtype} and {b.dtype}")
    a, b = a.coalesce(), b.coalesce()
    (ai, ak), (bk, bj) = a._indices_array, b._indices_array
    start = xp.searchsorted(bk, ak, side="left")
    count = xp.searchsorted(bk, ak, side="right") - start
    total = int(count.sum())
    pos_a = xp.repeat(xp.arange(ak.shape[0]), count)
    offsets = xp.cumsum(count) - count
    pos_b = xp.repeat(start - offsets, count) + xp.arange(total)
    values = _E.mul(index_op(a._values_tensor, index=(pos_a, Ellipsis)),
                    index_op(b._values_tensor, index=(pos_b, Ellipsis)))
    indices = xp.stack([ai[pos_a], bj[pos_b]]) if total else xp.zeros((2, 0), xp.int64)
    return _sparse(indices, values, (a.shape[0], b.shape[1]), total <= 1).coalesce()


def _dense_mm(a, b, name):
    if a.ndim != 2 or b.ndim != 2:
        raise RuntimeError(f"{name}: expected 2-D matrices, got shapes {tuple(a.shape)} and "
                           f"{tuple(b.shape)}")
    if a.shape[1] != b.shape[0]:
        raise RuntimeError(f"{name}: shapes {tuple(a.shape)} and {tuple(b.shape)} cannot be "
                           f"multiplied ({a.shape[1]} != {b.shape[0]})")
    if a.dtype is not b.dtype:
        raise RuntimeError(f"{name}: expected both operands to have the same dtype, but got "
                           f"{a.dtype} and {b.dtype}")
    return _L.matmul(a, b)


def matmul(input, other, name="sparse.mm"):
    """Products with a sparse operand: sparse @ dense and dense @ sparse give dense results,
    sparse @ sparse a sparse one. ``name`` is the function the caller used (errors and the
    gradient rule of a sparse leaf depend on it)."""
    _check_dense(input, name, "input")
    _check_dense(other, name, "mat2")
    a_sparse, b_sparse = isinstance(input, SparseCooTensor), isinstance(other, SparseCooTensor)
    for x in (input, other):
        if isinstance(x, SparseCooTensor) and (x.sparse_dim() != 2 or x.dense_dim() != 0):
            raise RuntimeError(f"{name}: expected a 2-D sparse_coo tensor with 2 sparse and 0 "
                               f"dense dims, got shape {x.shape} with sparse_dim "
                               f"{x.sparse_dim()} and dense_dim {x.dense_dim()}")
        if isinstance(x, SparseCooTensor) and name != "sparse.mm" and x.requires_grad \
                and x.grad_fn is None and grad_state.enabled:
            raise RuntimeError(
                f"{name}: the sparse_coo leaf of shape {x.shape} requires grad; PyTorch's "
                f"{name} gives it a dense gradient, which tapegrad does not make. Use "
                "tapegrad.sparse.mm (sparse gradient, as in PyTorch) or detach it")
    if a_sparse and b_sparse:
        return _sparse_sparse(input, other, name)
    if not (a_sparse or b_sparse):  # spmm and sparse.mm of dense matrices: their mm
        return _dense_mm(input, other, name)
    dense = other if a_sparse else input
    if dense.ndim not in (1, 2) or (name in ("mm", "spmm", "sparse.mm") and dense.ndim != 2):
        raise RuntimeError(f"{name}: expected a 2-D dense operand (1-D also for matmul), "
                           f"got shape {tuple(dense.shape)}")
    sp = input if a_sparse else other
    if a_sparse and sp.shape[1] != dense.shape[0]:
        raise RuntimeError(f"{name}: shapes {sp.shape} (sparse_coo) and {tuple(dense.shape)} "
                           f"cannot be multiplied ({sp.shape[1]} != {dense.shape[0]})")
    if b_sparse and dense.shape[-1] != sp.shape[0]:
        raise RuntimeError(f"{name}: shapes {tuple(dense.shape)} and {sp.shape} (sparse_coo) "
                           f"cannot be multiplied ({dense.shape[-1]} != {sp.shape[0]})")
    if sp.dtype is not dense.dtype:
        raise RuntimeError(f"{name}: expected both operands to have the same dtype, but got "
                           f"{input.dtype} and {other.dtype}")
    if a_sparse:
        s = sp.coalesce()
        rows, cols = _products(s)
        return sparse_addmm(s._values_tensor, dense, rows=rows, cols=cols, n=sp.shape[0])
    # dense @ S = (S^T @ dense^T)^T
    s = sp.t().coalesce()
    rows, cols = s._indices_array
    if dense.ndim == 1:
        return sparse_addmm(s._values_tensor, dense, rows=rows, cols=cols, n=sp.shape[1])
    out = sparse_addmm(s._values_tensor, permute_op(dense, dims=(1, 0)), rows=rows, cols=cols,
                       n=sp.shape[1])
    return permute_op(out, dims=(1, 0))


# --- printing: PyTorch's _str_intern for sparse tensors ---------------------------------------
def _tensor_str(data, indent):
    return _P._body(data, indent) if data.size else "[]"


def _repr(t):
    prefix = "tensor("
    indent = len(prefix)
    np_dtype = t._data.dtype
    suffixes = [f"size={t.shape}", f"nnz={t._nnz()}"]
    if not (np_dtype == dtypes.get_default_dtype().np or np_dtype in (xp.int64, xp.bool_)):
        suffixes.append(f"dtype={t.dtype}")
    idx, vals = t._indices_array, t._values_tensor._data
    indices_str = _tensor_str(idx, indent + len("indices=tensor("))
    if idx.size == 0:
        indices_str += f", size={tuple(idx.shape)}"
    values_str = _tensor_str(vals, indent + len("values=tensor("))
    if vals.size == 0:
        values_str += f", size={tuple(vals.shape)}"
    out = (prefix + "indices=tensor(" + indices_str + "),\n" + " " * indent + "values=tensor("
           + values_str + ")")
    suffixes.append(f"layout={sparse_coo}")
    if t.grad_fn is not None:
        suffixes.append(f"grad_fn=<{t.grad_fn.name()}>")
    elif t.requires_grad:
        suffixes.append("requires_grad=True")
    last = len(out) - out.rfind("\n") + 1
    force = True
    for sfx in suffixes:
        if force or last + len(sfx) + 2 > _P._LINEWIDTH:
            out += ",\n" + " " * indent + sfx
            last = indent + len(sfx)
            force = False
        else:
            out += ", " + sfx
            last += len(sfx) + 2
    return out + ")"
