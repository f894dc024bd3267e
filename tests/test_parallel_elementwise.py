"""backend.parallel: opt-in numba loops for large elementwise work. Off by default (numpy's
expression runs); when on, large same-shape contiguous float operands take the parallel loop,
whose results are the scalar function's element by element at any thread count."""
import math

import numpy as np
import pytest

from tapegrad.backend import parallel

pytestmark = pytest.mark.skipif(not parallel.available(), reason="numba not installed")


def _fma():
    return parallel.Elementwise(lambda a, b, c: a * b + c, lambda a, b, c: a * b + c, 3)


def test_off_by_default_runs_numpy(monkeypatch):
    monkeypatch.setattr(parallel, "ENABLED", False)
    op = _fma()
    a = np.ones(parallel.PARALLEL_MIN)
    assert not op.runs_parallel(a, a, a)
    np.testing.assert_array_equal(op(a, a, a), np.full_like(a, 2.0))
    assert op._loops is None  # nothing compiled


def test_which_calls_take_the_loop(monkeypatch):
    monkeypatch.setattr(parallel, "ENABLED", True)
    monkeypatch.setattr(parallel, "PARALLEL_MIN", 1000)
    op = _fma()
    big, small = np.ones(1000), np.ones(999)
    assert op.runs_parallel(big, big, big)
    assert not op.runs_parallel(small, small, small)                 # below the bound
    assert not op.runs_parallel(big, big, np.ones(2000)[::2])       # strided
    assert not op.runs_parallel(big, big, big.astype(np.float32))   # mixed dtypes
    assert not op.runs_parallel(big.astype(np.int64), big, big)     # not float
    assert not op.runs_parallel(big, big)                           # wrong arity


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_loop_is_the_scalar_function_at_any_thread_count(monkeypatch, dtype):
    monkeypatch.setattr(parallel, "ENABLED", True)
    monkeypatch.setattr(parallel, "PARALLEL_MIN", 1000)
    silu = parallel.Elementwise(lambda x: x / (1.0 + math.exp(-x)),
                                lambda x: x / (1.0 + np.exp(-x)), 1)
    x = np.random.default_rng(0).standard_normal((40, 50)).astype(dtype)
    together = silu(x)
    alone = silu.parallel(x, threads=False)
    assert together.shape == x.shape and together.dtype == x.dtype
    np.testing.assert_array_equal(together, alone)  # no sum is split: same bits
    # numba's exp is not numpy's: each within a few ulps of the exact value
    exact = x.astype(np.float64) / (1.0 + np.exp(-x.astype(np.float64)))
    np.testing.assert_allclose(together, exact, rtol=8 * np.finfo(dtype).eps, atol=0)
    out = np.empty_like(x)
    assert silu(x, out=out) is out
    np.testing.assert_array_equal(out, together)
