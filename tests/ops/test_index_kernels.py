"""The scatter-add paths of ``backend.scatter`` (numba's row loop, numpy's flat positions,
the float64 row sums, the fused sparse product): numpy's ``add.at`` / ``bincount`` bits on
every path, numpy's errors, and the ops built on them against PyTorch."""
import numpy as np
import pytest
import torch

import tapegrad as tg
from tapegrad import dtypes
from tapegrad.backend import scatter
from tapegrad.ops.indexing import index_put
from helpers import check_op, check_torch

PATHS = ["numpy", pytest.param("numba", marks=pytest.mark.skipif(
    scatter.kernels() is None, reason="numba is not installed"))]


@pytest.fixture(params=PATHS)
def path(request, monkeypatch):
    """Run with numba's loops (when installed) or with numpy's paths only."""
    if request.param == "numpy":
        monkeypatch.setattr(scatter, "_kernels", False)
    return request.param


class _AddAtCalls:
    """Stands in for numpy in ``backend.scatter``: records the index of every ``add.at``."""

    def __init__(self):
        self.keys = []
        outer = self

        class Add:
            def at(self, a, key, values):
                outer.keys.append(key)
                return np.add.at(a, key, values)

            def __getattr__(self, name):
                return getattr(np.add, name)

        self.add = Add()

    def __getattr__(self, name):
        return getattr(np, name)


def _bits(a):
    a = np.ascontiguousarray(a)
    return a.view(np.uint8)


def _same_as_add_at(a, key, values):
    want = a.copy()
    np.add.at(want, key, values)
    got = a.copy()
    scatter.add_at(got, key, values)
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(_bits(got), _bits(want))


def _keys(rng, shape):
    """Keys of every form the ops pass: rows (dim 0, a later dim, nd indices), grids."""
    n0, n1, n2 = shape
    return {
        "rows": (rng.integers(-n0, n0, 300),),
        "rows_ellipsis": (rng.integers(0, n0, 300), Ellipsis),
        "bare_array": rng.integers(-n0, n0, 300),
        "dim1_2d_index": (slice(None), rng.integers(-n1, n1, (20, 30))),
        "last_dim": (slice(None), slice(None), rng.integers(0, n2, 3000)),
        "rows_0d": (np.array(3),),
        "grid": (rng.integers(0, n0, (40, n1, 1)), rng.integers(-n1, n1, (1, n1, 1)),
                 rng.integers(0, n2, (40, 1, n2)).astype(np.uint32)),
        "rows_int32": (rng.integers(0, n0, 300).astype(np.int32), Ellipsis),
        # gather/scatter keys along one axis (aranges on the others), negatives wrapping
        "along0": (rng.integers(-n0, n0, (80, n1, n2)), np.arange(n1)[None, :, None],
                   np.arange(n2)[None, None, :]),
        "along1": (np.arange(n0)[:, None, None], rng.integers(-n1, n1, (n0, 20, n2)),
                   np.arange(n2)[None, None, :]),
        "along2": (np.arange(n0)[:, None, None], np.arange(n1)[None, :, None],
                   rng.integers(0, n2, (n0, n1, 3)).astype(np.int32)),
    }


def _indexed_shape(a, key):
    return np.zeros(a.shape)[key].shape


_DTYPES = [np.float32, np.float64, np.int32, np.int64, np.int8, np.float16, bool]
if dtypes.bfloat16 is not None:
    _DTYPES.append(dtypes.bfloat16.np)


@pytest.mark.parametrize("dtype", _DTYPES, ids=lambda d: np.dtype(d).name)
def test_add_at_is_numpys_bit_for_bit(path, dtype):
    rng = np.random.default_rng(0)
    shape = (50, 7, 33)
    a = (rng.standard_normal(shape) * 3).astype(dtype)
    for key in _keys(rng, shape).values():
        values = (rng.standard_normal(_indexed_shape(a, key)) * 3).astype(dtype)
        _same_as_add_at(a, key, values)
        # values broadcast along leading dims, and a non-contiguous view
        _same_as_add_at(a, key, values[..., :1])
        _same_as_add_at(a, key, np.asfortranarray(values))


def test_add_at_one_value_a_row(path):
    rng = np.random.default_rng(8)
    for shape, key, vshape in [((300, 1), (rng.integers(-300, 300, 2000),), (2000, 1)),
                               ((1, 300, 1), (slice(None), rng.integers(0, 300, (40, 50))),
                                (1, 40, 50, 1)),
                               ((300,), rng.integers(-300, 300, 2000), (2000,))]:
        for dtype in (np.float32, np.float64, np.int64):
            _same_as_add_at(np.ones(shape, dtype), key, rng.standard_normal(vshape)
                            .astype(dtype))
    with pytest.raises(IndexError, match="axis 1 with size 300"):
        scatter.add_at(np.ones((1, 300, 1)), (slice(None), np.array([0] * 2000 + [300])),
                       np.ones((1, 2001, 1)))


def test_add_at_duplicates_add_in_index_order(path):
    # float32 sums of 1e8 and 1s depend on the order: add.at's is index order
    a = np.zeros((4, 300), np.float32)
    idx = np.array([2, 2, 2, 2, 0, 2])
    v = np.tile(np.array([1e8, 1, 1, -1e8, 5, 1], np.float32)[:, None], (1, 300))
    _same_as_add_at(a, idx, v)
    got = a.copy()
    scatter.add_at(got, idx, v)
    assert got[2, 0] == np.float32(1.0) and got[0, 0] == 5  # ((1e8 + 1) + 1) - 1e8 + 1


def test_add_at_uint64_indices_as_numpy_reads_them(path):
    # numpy casts uint64 indices to intp: 2**64 - 1 is -1, the last row
    a = np.zeros((60, 40))
    huge = np.array([0] * 2000 + [2 ** 64 - 1], np.uint64)
    _same_as_add_at(a, (huge,), np.ones((2001, 40)))
    _same_as_add_at(a, (np.arange(60)[:, None], huge[None, :] % np.uint64(40)),
                    np.ones((60, 2001)))


def test_add_at_empty_and_zero_sized(path):
    rng = np.random.default_rng(1)
    a = rng.standard_normal((200, 40))
    _same_as_add_at(a, (np.zeros(0, np.int64),), np.zeros((0, 40)))
    _same_as_add_at(np.zeros((0, 40)), (np.zeros(0, np.int64),), np.zeros((0, 40)))
    _same_as_add_at(np.zeros((200, 0)), (rng.integers(0, 200, 3000),), np.zeros((3000, 0)))


def test_add_at_targets_numpy_must_handle(path):
    rng = np.random.default_rng(2)
    a = rng.standard_normal((60, 40))
    idx = rng.integers(0, 60, 100)
    v = rng.standard_normal((100, 40))
    _same_as_add_at(np.asfortranarray(a), idx, v)  # not C-contiguous
    _same_as_add_at(a, idx, v.astype(np.float32))  # values cast by add.at's own rule
    _same_as_add_at(a, (slice(2, None, 3), rng.integers(0, 40, (50, 30))),
                    rng.standard_normal((20, 50, 30)))  # a slice with a step
    _same_as_add_at(a, (rng.random(60) < 0.5,), 1.0)  # a mask, a number
    frozen = a.copy()
    frozen.flags.writeable = False
    with pytest.raises(ValueError):
        scatter.add_at(frozen, idx, v)


@pytest.mark.parametrize("key, shape", [
    ((np.array([0] * 2000 + [60]),), (2001, 40)),
    ((np.array([-61] + [0] * 2000), Ellipsis), (2001, 40)),
    ((slice(None), np.array([0] * 2000 + [40])), (60, 2001)),
    ((np.zeros((2001, 1), np.int64), np.array([[0] * 39 + [40]])), (2001, 40))])
def test_add_at_out_of_range_raises_numpys_error(path, key, shape):
    a = np.zeros((60, 40))
    values = np.ones(shape)
    errors = []
    for fn in (np.add.at, scatter.add_at):
        with pytest.raises(IndexError) as info:
            fn(a, key, values)
        errors.append(str(info.value))
    assert errors[0] == errors[1]
    assert not a.any()  # nothing written before the error


def test_paths_taken(monkeypatch):
    """Rows go to numba's loop (no add.at) when installed, else to one-dimensional add.at
    calls; grids always to one-dimensional add.at; small scatters to add.at as given."""
    rng = np.random.default_rng(3)
    calls = _AddAtCalls()
    monkeypatch.setattr(scatter, "np", calls)
    a = np.zeros((200, 32), np.float32)
    rows = rng.integers(0, 200, 1800)
    v = rng.standard_normal((1800, 32)).astype(np.float32)
    scatter.add_at(a, rows, v)
    scatter.add_at(a, (rows[:, None], np.arange(32)[None, :]), v)
    if scatter.kernels() is not None:
        assert calls.keys == []
    column = np.zeros((200, 1))
    scatter.add_at(column, rows, v[:, :1].astype(np.float64))  # one value a row: 1-d add.at
    assert len(calls.keys) == 1 and calls.keys[0].shape == (1800,)
    calls.keys.clear()
    monkeypatch.setattr(scatter, "_kernels", False)
    scatter.add_at(a, rows, v)
    scatter.add_at(a, (rows[:, None], np.arange(32)[None, :]), v)
    assert calls.keys and all(type(k) is np.ndarray and k.ndim == 1 for k in calls.keys)
    calls.keys.clear()
    scatter.add_at(a, rows[:10], v[:10])  # 320 values: add.at itself
    assert len(calls.keys) == 1 and calls.keys[0].shape == (10,)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
def test_sum_rows_is_bincounts_bit_for_bit(path, dtype):
    rng = np.random.default_rng(4)
    n, width = 300, 24
    rows = rng.integers(-n, n, 2000)
    values = rng.standard_normal((2000, width)).astype(dtype)
    values[rows == 3] = -0.0  # a row of -0.0s sums to +0.0 from bincount's 0.0 start
    values[7, 2], values[9, 5] = np.inf, np.nan
    flat = (np.where(rows < 0, rows + n, rows)[:, None] * width + np.arange(width)).reshape(-1)
    want = np.bincount(flat, weights=values.reshape(-1), minlength=n * width).reshape(n, width)
    got = scatter.sum_rows(values, rows, n)
    assert got.dtype == np.float64
    np.testing.assert_array_equal(_bits(got), _bits(want))
    empty = scatter.sum_rows(np.zeros((0, 3, 4), dtype), np.zeros(0, np.int64), 5)
    assert empty.shape == (5, 3, 4) and not empty.any()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("width", [None, 1, 32])
def test_fused_sparse_rows_are_the_bincount_bits(dtype, width):
    if scatter.kernels() is None:
        pytest.skip("numba is not installed")
    rng = np.random.default_rng(5)
    n, m, nnz = 400, 300, 5000
    rows, cols = rng.integers(0, n, nnz), rng.integers(0, m, nnz)
    values = rng.standard_normal(nnz).astype(dtype)
    values[3] = np.inf
    dense = rng.standard_normal((m,) if width is None else (m, width)).astype(dtype)
    prod = values * dense[cols] if width is None else values[:, None] * dense[cols]
    want = scatter.sum_rows(prod.reshape(nnz, -1), rows, n).reshape((n,) + dense.shape[1:])
    got = scatter.sparse_rows(values, dense, rows, cols, n)
    if width is None or width == 1:  # 5000 values: at the numba threshold
        assert got is not None
    np.testing.assert_array_equal(_bits(got), _bits(want))
    bad = cols.copy()
    bad[-1] = m  # out of range: no fused result (the caller's path raises)
    assert scatter.sparse_rows(values, dense, rows, bad, n) is None


# --- the ops on these paths, against PyTorch ----------------------------------------------------
@pytest.fixture
def small_scatters_too(path, monkeypatch):
    """Every scatter takes the fast paths, so small (gradcheckable) shapes test them."""
    monkeypatch.setattr(scatter, "MIN_VALUES", 1)
    return path


def _put_add(T, x, s, index):
    if T is torch:
        return torch.index_put(x, index, s, accumulate=True)
    return index_put(x, s, index=index, accumulate=True)


_IDX = np.array([3, 0, 3, 3, -1, 5, 0, 2])  # duplicates and negative entries
_POS = np.array([3, 0, 3, 3, 5, 5, 0, 2])  # (index_add and scatter take no negatives)


@pytest.mark.parametrize("fn, specs", [
    (lambda T, x: x[T.tensor(_IDX)] * 1.5, [(6, 4)]),
    (lambda T, x: x[:, T.tensor(_IDX.reshape(2, 4))], [(3, 6, 2)]),
    (lambda T, x: x[T.tensor(_IDX), 1:], [(6, 3)]),
    (lambda T, x, s: x.index_add(0, T.tensor(_POS), s), [(6, 3), (8, 3)]),
    (lambda T, x, s: x.index_add(1, T.tensor(_POS), s, alpha=2.0), [(2, 6, 3), (2, 8, 3)]),
    (lambda T, x, s: _put_add(T, x, s, (T.tensor(_IDX),)), [(6, 3), (8, 3)]),
    (lambda T, x, s: _put_add(T, x, s, (T.tensor(_IDX),)), [(6, 3), (3,)]),
    (lambda T, x, s: _put_add(T, x, s, (T.tensor(_IDX), T.tensor(_POS % 3))), [(6, 3), (8,)]),
    (lambda T, x, s: x.scatter_add(0, T.tensor(_POS.reshape(4, 2)), s), [(6, 2), (4, 2)]),
    (lambda T, x, s: x.scatter_reduce(0, T.tensor(_POS.reshape(4, 2)), s, "mean"),
     [(6, 2), (4, 2)]),
    (lambda T, x: x.gather(1, T.tensor(np.abs(_IDX).reshape(2, 4) % 3)), [(2, 3)]),
    (lambda T, x: x.take(T.tensor(_IDX)), [(3, 2)]),
    (lambda T, w: T.nn.functional.embedding(T.tensor(_POS.reshape(2, 4)), w), [(6, 3)]),
])
def test_ops_match_torch_on_every_path(small_scatters_too, fn, specs):
    check_op(fn, specs, forward=False, vmap=False)


@pytest.mark.parametrize("dtype", [None, np.float32])
def test_large_gathers_and_index_add_match_torch(path, dtype):
    """The mpnn step's sizes: h[rows] and index_add over ~1800 edges of 32 features (float64
    1e-12: each output a sum of a few terms; float32 2e-5: float32 sums over ~16 terms)."""
    rng = np.random.default_rng(6)
    rows = rng.integers(0, 200, 1800)
    h = rng.standard_normal((200, 32))
    m = rng.standard_normal((1800, 32))
    rtol = 1e-12 if dtype is None else 2e-5
    check_torch(lambda T, h, m: (h[T.tensor(rows)] * 2, T.zeros_like(h).index_add(
        0, T.tensor(rows), m)), [h, m], rtol=rtol, dtype=dtype)


def test_index_add_errors_unchanged(path):
    x = tg.zeros(5, 3)
    for bad in ([5, 0, 0], [-1, 0, 0]):
        with pytest.raises(RuntimeError) as ours:
            x.index_add(0, tg.tensor(bad), tg.ones(3, 3))
        with pytest.raises(RuntimeError) as theirs:
            torch.zeros(5, 3).index_add(0, torch.tensor(bad), torch.ones(3, 3))
        assert str(theirs.value) in str(ours.value)


def test_accumulate_false_duplicates_keep_the_last_write(path):
    x = np.zeros((4, 300))
    v = np.arange(600.0).reshape(2, 300)
    out = index_put(tg.tensor(x), tg.tensor(v), index=(tg.tensor([1, 1]),))
    ref = torch.tensor(x).index_put((torch.tensor([1, 1]),), torch.tensor(v))
    np.testing.assert_array_equal(out.numpy(), ref.numpy())


def test_sparse_products_match_torch(path):
    rng = np.random.default_rng(7)
    n = 300
    rows, cols = rng.integers(0, n, 4000), rng.integers(0, n, 4000)
    index = np.stack([np.concatenate([rows, cols]), np.concatenate([cols, rows])])
    vals = rng.standard_normal(8000)
    for dtype, rtol in ((np.float64, 1e-12), (np.float32, 2e-5)):
        x = rng.standard_normal((n, 16)).astype(dtype)
        outs = []
        for T in (tg, torch):
            adj = T.sparse_coo_tensor(T.tensor(index), T.tensor(vals.astype(dtype)),
                                      (n, n)).coalesce()
            xt = T.tensor(x, requires_grad=True)
            for _ in range(3):  # one-shot, planned and again
                y = T.sparse.mm(adj, xt)
            y.sum().backward()
            outs.append((y.detach().numpy(), xt.grad.numpy()))
        for a, b in zip(*outs):
            np.testing.assert_allclose(a, b, rtol=rtol, atol=rtol * np.abs(b).max())


@pytest.mark.parametrize("dtype", [np.int64, np.int32])
def test_index_tensor_key_is_the_general_paths(dtype):
    """``x[idx]`` with one int32/int64 index Tensor takes a short path in ``index_key``: the
    same key, flags and errors as the general path (the same index as a one-element tuple)."""
    from tapegrad.ops.indexing import index_key

    x = tg.zeros(6, 3)
    for idx in ([3, -6, 5, 0], [[1, 1], [-1, 2]]):
        idx = tg.tensor(np.array(idx, dtype))
        (key, basic, acc), (want, wbasic, wacc) = index_key(x, idx), index_key(x, (idx,))
        assert (basic, acc) == (wbasic, wacc) == (False, True)
        assert len(key) == len(want) == 2 and key[1] is want[1] is Ellipsis
        np.testing.assert_array_equal(key[0], want[0])
    for bad in ([0, 6], [-7, 0]):
        errors = []
        for index in (tg.tensor(np.array(bad, dtype)), (tg.tensor(np.array(bad, dtype)),)):
            with pytest.raises(IndexError) as info:
                index_key(x, index)
            errors.append(str(info.value))
        assert errors[0] == errors[1] and "dimension 0 with size 6" in errors[0]


def test_take_is_fancy_indexing():
    """``scatter.take`` (numpy's take for one index array along one axis): fancy indexing's
    values, shape, a fresh C-contiguous copy, and its IndexError; other keys are declined."""
    rng = np.random.default_rng(9)
    a = rng.standard_normal((6, 5, 4))
    for key in [(rng.integers(-6, 6, 20), Ellipsis), (rng.integers(-6, 6, (3, 4)),),
                (slice(None), rng.integers(0, 5, 7).astype(np.int32)),
                (slice(None), slice(None), rng.integers(-4, 4, (2, 2)), Ellipsis),
                (np.zeros(0, np.int64),)]:
        for x in (a, np.asfortranarray(a), a[::-1]):
            got = scatter.take(x, key)
            want = x[key]
            assert got.shape == want.shape and got.flags.c_contiguous
            assert not np.shares_memory(got, x)
            np.testing.assert_array_equal(got, want)
    for key in [(np.array([6]),), (slice(None), np.array([-6]))]:
        errors = []
        for fn in (lambda: a[key], lambda: scatter.take(a, key)):
            with pytest.raises(IndexError) as info:
                fn()
            errors.append(str(info.value))
        assert errors[0] == errors[1]
    for key in [(np.array(2),), (np.array([1], np.uint64),), (rng.random(6) < 0.5,),
                (slice(1, None), np.array([1])), (np.array([1]), np.array([2])), 3]:
        assert scatter.take(a, key) is None
