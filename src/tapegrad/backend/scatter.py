"""Scatter-adds on host arrays, faster than ``numpy.add.at`` and bit for bit its results.

``numpy.add.at(a, key, values)`` walks the key's index arrays element by element through a
general iterator: ~0.3 us a row of a (1800, 32) float32 scatter into (200, 32), 10x a plain
pass over the data. Only numpy's one-dimensional case (one index a value) is a plain loop.
The same additions in the same order, by the key's form, for at least ``MIN_VALUES`` values
of ``a``'s dtype into a C-contiguous ``a``:

* **rows** (``key`` picks whole slices along one axis: ``a[idx]``, ``a[:, idx]``,
  ``a[idx, ...]``, what ``index_add``, an embedding's and ``x[idx]``'s gradients take): the
  array seen as (before, n, after) and each value row added into its slice, in index order,
  by numba's loop (``scatter_kernels.scatter_rows``); without numba, each value's flat
  position in ``a`` (in chunks) and numpy's one-dimensional ``add.at``; with one value a
  row (after = before = 1), that one-dimensional ``add.at`` directly;
* **grid** (one integer array per axis, broadcasting: gather's and scatter's keys): along
  one axis (the others' arrays are aranges, as ``gather``/``scatter_add`` build them) numba's
  loop over the (before, indices, after) blocks (``scatter_axis``); otherwise each value's
  flat position in ``a``, then numba's one-dimensional loop (``scatter_flat``); without
  numba, the flat positions and numpy's one-dimensional ``add.at``;
* numpy's ``add.at`` itself for everything else (masks, slices with steps, mixed dtypes,
  values to cast, non-contiguous or read-only targets, small scatters) and whenever an
  index is out of range, so errors are numpy's own.

Each destination receives its values in the order of the key's (C-order) index positions on
every path, with the same IEEE additions, so the results are ``add.at``'s bits.
``sum_rows`` is the float64 accumulation ``bincount`` does (a float32 gradient's rows summed
in float64, in order, then rounded once), through the same numba loop when installed.
"""
import math

import numpy as np

# the dtypes the numba loops take (numba has no float16/bfloat16; bool adds as logical or)
_NUMBA_DTYPES = frozenset(map(np.dtype, (np.float32, np.float64, np.int32, np.int64)))
# below this many values numpy's add.at is as fast as the other paths (measured on (64, 4)
# rows: add.at 4 us, flat positions or a numba call 18 us of fixed costs; add.at spends
# ~20 ns a value on rows, ~2 ns on the flat path and ~0.3 ns in numba's loop), and a process
# that never scatters more never imports numba
MIN_VALUES = 1024
# the flat path's positions are made in chunks of at most this many values (int64 each)
_CHUNK = 1 << 16

_kernels = None  # the scatter_kernels module, False without numba, None before the first try


def kernels():
    """``scatter_kernels`` (numba's loops), or None when numba is not installed."""
    global _kernels
    if _kernels is None:
        try:
            from tapegrad.backend import scatter_kernels
        except ImportError:
            scatter_kernels = False
        _kernels = scatter_kernels
    return _kernels or None


def _rows_key(a, key):
    """``_axis_key`` for a C-contiguous ``a`` (which the scatter loops write through)."""
    return _axis_key(a, key) if a.flags.c_contiguous else None


def take(a, key):
    """``a[key]`` by ``numpy.take`` when ``key`` picks whole slices along one axis by one
    signed integer array of at least one dim (``x[idx]``, ``index_select``), else None: the
    same copy and the same IndexError as fancy indexing, 4-7x faster on rows (numpy's take
    copies row by row; fancy indexing goes through its general iterator)."""
    if type(a) is not np.ndarray:
        return None
    found = _axis_key(a, key)
    if found is None or found[1].dtype.kind != "i" or not found[1].ndim:
        return None
    return np.take(a, found[1], axis=found[0])


def _axis_key(a, key):
    """``(axis, idx)`` when ``key`` picks whole slices of ``a`` along ``axis`` by the integer
    array ``idx`` (full slices before it; Ellipsis or full slices after), else None."""
    if type(key) is not tuple:
        key = (key,)
    axis, ellipsis = None, 0
    for k, item in enumerate(key):
        if type(item) is np.ndarray and _index_dtype(item.dtype) and axis is None:
            axis = k
        elif item is Ellipsis and axis is not None:
            ellipsis += 1
        elif type(item) is not slice or item != _ALL:
            return None
    if axis is None or ellipsis > 1 or len(key) - ellipsis > a.ndim:
        return None
    return axis, key[axis]


_ALL = slice(None)


def _index_dtype(dt):
    # integer indices the loops read as int64 exactly (numpy reads uint64 above 2**63 as
    # negative intp, wrapping: add.at keeps that case)
    return dt.kind == "i" or dt.kind == "u" and dt.itemsize < 8


def add_at(a, key, values) -> None:
    """``numpy.add.at(a, key, values)``: repeated indices add, in index order, bit for bit."""
    if type(values) is np.ndarray and values.size >= MIN_VALUES and type(a) is np.ndarray \
            and values.dtype == a.dtype and a.flags.writeable:
        rows = _rows_key(a, key)
        if rows is not None:
            if _add_rows(a, rows[0], rows[1], values):
                return
        elif _grid_key(a, key) and _add_grid(a, key, values):
            return
    np.add.at(a, key, values)


def _writable(values, v):
    """A C-contiguous writable array of ``v`` (``values`` broadcast): ``values`` itself when
    it holds the same elements (``broadcast_to``'s views are read-only, a second array type
    to numba), else a copy."""
    x = values if values.size == v.size and values.flags.writeable else v
    x = np.ascontiguousarray(x)
    return x if x.flags.writeable else x.copy()


def _grid_key(a, key):
    """Whether ``key`` is one integer array per axis of C-contiguous ``a``."""
    return type(key) is tuple and len(key) == a.ndim > 0 and a.flags.c_contiguous \
        and all(type(i) is np.ndarray and _index_dtype(i.dtype) for i in key)


def _one_axis(a, key, shape):
    """The axis d when ``key`` (broadcasting to ``shape``) is gather's and scatter's grid
    along d: for every other axis k, ``key[k]`` is arange(a.shape[k]) laid along axis k and
    ``shape[k] == a.shape[k]``; else None."""
    ndim = a.ndim
    if len(shape) != ndim:
        return None
    others = [k for k, i in enumerate(key) if not _arange_along(i, k, a.shape[k], ndim)]
    if len(others) > 1:
        return None
    d = others[0] if others else 0
    if any(shape[k] != a.shape[k] for k in range(ndim) if k != d):
        return None
    return d


def _arange_along(i, k, n, ndim):
    if i.ndim != ndim or i.size != n or (n > 1 and i.shape[k] != n):
        return False
    flat = i.reshape(-1)
    return flat[0] == 0 and (n == 1 or flat[-1] == n - 1 and np.array_equal(flat, np.arange(n)))


def _in_range(idx, n):
    return not idx.size or idx.min() >= -n and idx.max() < n


def _add_rows(a, axis, idx, values):
    """``a[(slice(None),) * axis + (idx,)] += v`` in add.at's order; False where numpy must
    do it (values that do not broadcast, an index out of range: numpy raises)."""
    before = math.prod(a.shape[:axis])
    n = a.shape[axis]
    after = math.prod(a.shape[axis + 1:])
    if before == 1 and after == 1:  # one index a value: numpy's fast one-dimensional add.at
        if a.ndim == 1 and idx.ndim == 1:
            return False  # (already that case)
        if not _in_range(idx, n):
            return False
        try:
            v = np.broadcast_to(values, idx.shape + a.shape[axis + 1:])
        except ValueError:
            return False
        np.add.at(a.reshape(-1), idx.reshape(-1), v.reshape(-1))
        return True
    shape = a.shape[:axis] + idx.shape + a.shape[axis + 1:]
    try:
        v = np.broadcast_to(values, shape)
    except ValueError:
        return False
    m = idx.size
    if not m or not after or not before:
        return _in_range(idx, n)
    if a.dtype in _NUMBA_DTYPES:
        k = kernels()
        if k is not None:
            rows = np.ascontiguousarray(idx.reshape(-1), dtype=np.int64)
            return k.scatter_rows(a.reshape(before, n, after), rows,
                                  _writable(values, v).reshape(before, m, after))
    if not _in_range(idx, n):
        return False
    rows = idx.reshape(-1).astype(np.int64, copy=False)
    flat = a.reshape(-1)
    rows = np.where(rows < 0, rows + n, rows)
    v3 = v.reshape(before, m, after)
    inner = np.arange(after)
    # chunks of at most ~_CHUNK positions: whole (before-index, row) blocks, rows in order
    rstep = max(1, _CHUNK // after)
    pstep = max(1, _CHUNK // (m * after))
    for p0 in range(0, before, pstep):
        p = np.arange(p0, min(before, p0 + pstep))[:, None]
        for i0 in range(0, m, rstep):
            pos = ((p * n + rows[i0:i0 + rstep])[..., None] * after + inner).reshape(-1)
            np.add.at(flat, pos, v3[p0:p0 + pstep, i0:i0 + rstep].reshape(-1))
    return True


def _add_grid(a, key, values):
    """``add.at`` with one integer array per axis (gather's and scatter's keys): along one
    axis (``_one_axis``) numba's block loop; else through flat positions, numba's
    one-dimensional loop over them or numpy's one-dimensional add.at; False where numpy
    must do it."""
    try:
        shape = np.broadcast_shapes(*(i.shape for i in key))
        v = np.broadcast_to(values, shape)
    except ValueError:
        return False
    if not math.prod(shape):
        return False  # nothing to add: numpy's add.at decides what an empty key means
    if a.dtype in _NUMBA_DTYPES:
        along = _one_axis(a, key, shape)
        k = kernels() if along is not None else None
        if k is not None:
            d = along
            before, after = math.prod(a.shape[:d]), math.prod(a.shape[d + 1:])
            idx = np.ascontiguousarray(np.broadcast_to(key[d], shape), dtype=np.int64)
            return k.scatter_axis(a.reshape(before, a.shape[d], after),
                                  idx.reshape(before, shape[d], after),
                                  _writable(values, v).reshape(before, shape[d], after))
    pos = None
    stride = 1
    for i, n in zip(reversed(key), reversed(a.shape)):
        if not i.size:
            return False  # (nothing to add: numpy's add.at costs nothing)
        lo = i.min()
        if lo < -n or i.max() >= n:
            return False
        i = i.astype(np.int64, copy=False)
        if lo < 0:
            i = np.where(i < 0, i + n, i)
        term = i * stride if stride != 1 else i
        pos = term if pos is None else pos + term
        stride *= n
    pos = np.broadcast_to(pos, shape).reshape(-1)
    if a.dtype in _NUMBA_DTYPES:
        k = kernels()
        if k is not None:
            return k.scatter_flat(a.reshape(-1), np.ascontiguousarray(pos),
                                  _writable(values, v).reshape(-1))
    np.add.at(a.reshape(-1), pos, v.reshape(-1))
    return True


def sum_rows(values, rows, n):
    """float64 sums of ``values``' rows (leading axis) by ``rows`` (in [-n, n), negative
    wrapping) into ``n`` rows: each sum starts at 0.0 and adds its rows in order in float64,
    as ``numpy.bincount`` with weights does. Returns an (n, *values.shape[1:]) float64
    array."""
    width = math.prod(values.shape[1:])
    k = kernels() if values.size >= MIN_VALUES and width > 1 and values.dtype in _NUMBA_DTYPES \
        else None
    rows = rows.reshape(-1)
    if k is not None:
        out = np.zeros((1, n, width))
        if k.scatter_rows(out, np.ascontiguousarray(rows, dtype=np.int64),
                          _writable(values, values).reshape(1, rows.size, width)):
            return out.reshape((n,) + values.shape[1:])
    rows = np.where(rows < 0, rows + n, rows)
    flat = rows if width == 1 else (rows[:, None] * width + np.arange(width)).reshape(-1)
    out = np.bincount(flat, weights=values.reshape(-1), minlength=n * width)
    return out.reshape((n,) + values.shape[1:])


def sparse_rows(values, dense, rows, cols, n):
    """float64 ``S @ dense`` for the entries ``(rows[k], cols[k], values[k])``: each product
    rounded in the operands' dtype, each row's sum from 0.0 in entry order in float64 (the
    bits of ``sum_rows(values[:, None] * dense[cols], rows, n)``), in one numba pass; None
    where that path does not apply (numba missing, dtypes, a small product)."""
    if values.dtype != dense.dtype or values.dtype not in _NUMBA_DTYPES \
            or values.dtype.kind != "f" or rows.size * (dense.size // max(1, dense.shape[0])) \
            < MIN_VALUES:
        return None
    k = kernels()
    if k is None:
        return None
    d2 = np.ascontiguousarray(dense).reshape(dense.shape[0], -1)
    out = np.zeros((n, d2.shape[1]))
    if not k.sparse_rows(out, np.ascontiguousarray(rows, dtype=np.int64),
                         np.ascontiguousarray(cols, dtype=np.int64),
                         np.ascontiguousarray(values), d2):
        return None
    return out.reshape((n,) + dense.shape[1:])
