"""backend.blas's thread policy: which products run on one BLAS thread (the cost model's
predicted time at one thread against two), and what a second thread does to the bits of the
products it takes."""
import os
import subprocess
import sys

import numpy as np
import pytest
from helpers import BlasThreadRecorder

import tapegrad
from tapegrad.backend import blas

needs_blas = pytest.mark.skipif(blas.LIBRARY is None, reason="numpy's BLAS is not OpenBLAS")


@pytest.fixture
def restore_threads():
    before = tapegrad.get_num_threads()
    yield
    tapegrad.set_num_threads(before)


@pytest.fixture
def documented_model(monkeypatch):
    """The constants docs/performance.md states, whatever the environment overrides."""
    for name, value in (("GEMM_FLOPS", {4: 103e9, 8: 51e9}), ("LEFT_BYTES", 6.5e9),
                        ("STREAM_BYTES", 10e9), ("TWO_THREAD_FLOPS", 1.8),
                        ("TWO_THREAD_BYTES", 1.7), ("THREAD_COST", 150e-6)):
        monkeypatch.setattr(blas, name, value)


# (m, k, n, itemsize, runs on one thread)
DECISIONS = [
    (64, 784, 256, 4, True),        # the small Adam MLP's first layer: ~0.25 ms
    (64, 784, 256, 8, False),       # float64: twice that, a second thread pays
    (256, 64, 512, 4, True),        # the suite's mlp_wide_silu, first layer
    (256, 512, 512, 4, False),      # ... its 512-wide layer: 1.3 ms at one thread
    (512, 256, 512, 4, False),      # ... that layer's weight gradient
    (256, 512, 512, 8, False),
    (256, 256, 256, 4, True),
    (256, 256, 256, 8, False),
    (40, 50, 60, 8, False),         # below OpenBLAS's own one-thread bound: left to it
    (512, 2, 256, 8, False),        # ditto (4 * 65536 multiply-adds)
    (1024, 2, 512, 4, True),        # skinny, 2 MB
    (2048, 2, 1024, 4, False),      # skinny, 8 MB: its memory time pays for the thread
    (4096, 2, 2048, 8, False),      # the scale step's first layer: 67 MB
    (4096, 2048, 3, 8, False),      # its last layer
    (2, 4096, 2048, 8, False),      # its first layer's weight gradient
    (2048, 4096, 2, 4, False),
    (1024, 1024, 1024, 8, False),   # large on both counts
]


@pytest.mark.parametrize("m,k,n,itemsize,serial", DECISIONS)
def test_policy_by_predicted_time(documented_model, m, k, n, itemsize, serial):
    assert blas.runs_serial(m, k, n, itemsize) is serial


SHAPES = [(m, k, n) for m in (2, 64, 256, 1024, 4096) for k in (2, 64, 512, 2048)
          for n in (3, 64, 512, 2048)]


def test_rule_is_the_models_comparison(documented_model):
    for m, k, n in SHAPES:
        for itemsize in (4, 8):
            if m * k * n <= blas.OPENBLAS_SERIAL_WORK:
                assert not blas.runs_serial(m, k, n, itemsize)
                continue
            t1 = blas.one_thread_seconds(m, k, n, itemsize)
            t2 = blas.two_thread_seconds(m, k, n, itemsize)
            assert blas.runs_serial(m, k, n, itemsize) is (t2 >= t1), (m, k, n, itemsize)


def test_a_larger_product_never_goes_back_to_one_thread(documented_model):
    # doubling any side, or the element size, adds time on one thread and saves more on two
    for m, k, n in SHAPES:
        for itemsize in (4, 8):
            if blas.runs_serial(m, k, n, itemsize) or m * k * n <= blas.OPENBLAS_SERIAL_WORK:
                continue
            for bigger in ((2 * m, k, n), (m, 2 * k, n), (m, k, 2 * n)):
                assert not blas.runs_serial(*bigger, itemsize), (bigger, itemsize)
            if itemsize == 4:
                assert not blas.runs_serial(m, k, n, 8)


def test_thread_cost_sets_the_crossover(documented_model, monkeypatch):
    monkeypatch.setattr(blas, "THREAD_COST", 0.0)  # every product above OpenBLAS's bound
    assert not any(blas.runs_serial(m, k, n, 4) for m, k, n in SHAPES)
    monkeypatch.setattr(blas, "THREAD_COST", 1.0)  # a second per hand-off: none
    assert all(blas.runs_serial(m, k, n, 4) for m, k, n in SHAPES
               if m * k * n > blas.OPENBLAS_SERIAL_WORK)


def test_serial_work_bounds_square_products():
    # SERIAL_WORK, derived from the module's constants: a float32 product whose time is its
    # arithmetic runs on one thread below it and on two above
    side = round(blas.SERIAL_WORK ** (1 / 3))
    assert blas.runs_serial(side - 4, side - 4, side - 4, 4)
    assert not blas.runs_serial(side + 4, side + 4, side + 4, 4)


def test_thread_cost_from_the_environment():
    code = "from tapegrad.backend import blas; print(blas.THREAD_COST)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**os.environ, "TAPEGRAD_BLAS_THREAD_COST_US": "4000"}, check=True)
    assert float(out.stdout) == pytest.approx(4e-3)


@needs_blas
def test_matmul_follows_the_policy(restore_threads, documented_model, monkeypatch):
    rec = BlasThreadRecorder()
    monkeypatch.setattr(blas, "xp", rec)
    tapegrad.set_num_threads(2)
    small = np.ones((64, 256)), np.ones((256, 256))
    square = np.ones((256, 512), np.float32), np.ones((512, 512), np.float32)
    skinny_small = np.ones((1024, 2), np.float32), np.ones((2, 512), np.float32)
    skinny_large = np.ones((4096, 2)), np.ones((2, 2048))
    stacked = np.ones((3, 4096, 2)), np.ones((3, 2, 2048))  # per product, as numpy loops
    for a, b in (small, square, skinny_small, skinny_large, stacked):
        blas.matmul(a, b)
    assert rec.seen == [1, 2, 1, 2, 2]
    assert blas.LIBRARY.get_num_threads() == 2


# The products the model hands to two threads by their memory time are skinny (a large
# operand and little work). OpenBLAS's threaded GEMM
# splits the output's rows and columns between threads, never the k sum, but its edge tiles
# are computed by other micro-kernels than its full tiles, and where a thread's share is not a
# multiple of the kernel's unroll the element-to-kernel assignment changes. Measured with
# OpenBLAS 0.3.31: the scale step's products (powers of two) agree bit for bit at 1, 2 and 3
# threads; a (2500, 20) @ (20, 2500) float64 product differs in ~1e-5 of its elements, and a
# (300, 700) @ (700, 1000) one (threaded by work, as it always was) in 70%.
SCALE_STEP = [((4096, 2), (2, 2048)), ((4096, 2048), (2048, 3)), ((4096, 3), (3, 2048)),
              ((2048, 4096), (4096, 3)), ((2, 4096), (4096, 2048))]


def _product(sa, sb, dtype, threads, seed=0):
    tapegrad.set_num_threads(threads)
    rng = np.random.default_rng(seed)
    a, b = rng.standard_normal(sa).astype(dtype), rng.standard_normal(sb).astype(dtype)
    return blas.matmul(a, b)


@needs_blas
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_scale_step_products_bitwise_identical_at_one_and_two_threads(restore_threads,
                                                                       documented_model, dtype):
    for sa, sb in SCALE_STEP:
        assert not blas.runs_serial(sa[0], sa[1], sb[1], np.dtype(dtype).itemsize)
        np.testing.assert_array_equal(_product(sa, sb, dtype, 1), _product(sa, sb, dtype, 2))


@needs_blas
def test_threaded_products_deterministic_and_within_rounding(restore_threads):
    sa, sb = (2500, 20), (20, 2500)
    one, two = _product(sa, sb, np.float64, 1), _product(sa, sb, np.float64, 2)
    # a given shape at a given count is the same bits every call (the compiler's exactness
    # probes compare against eager on that assumption)
    np.testing.assert_array_equal(two, _product(sa, sb, np.float64, 2))
    # across counts: the same 20-term sum, rounded by another kernel; each is within
    # k * eps * sum|a_i b_i| of the exact value, so they differ by at most twice that
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal(sa), rng.standard_normal(sb)
    bound = 2 * sa[1] * np.finfo(np.float64).eps * (np.abs(a) @ np.abs(b))
    assert np.all(np.abs(one - two) <= bound)


def test_sweep_table_tells_free_and_busy_batches_apart(documented_model):
    # bench blas --sweep: per shape, batches [seconds per call, cores other processes used];
    # one thread counts where the others left it its core, two threads split at FREE_CORES;
    # the rule column is runs_serial's answer
    from tapegrad.bench import blas as bench

    one = {"256x512x512": [[1.3e-3, 1.0], [1.4e-3, 0.1], [9e-3, 1.3]]}
    two = {"256x512x512": [[0.8e-3, 0.1], [0.7e-3, 0.3], [16e-3, 1.2]]}
    (row,) = bench.sweep_rows({("float32", 1): [one], ("float32", 2): [two]}, ("float32",))
    assert row[:2] == ["float32", "256x512x512"]
    assert row[4:9] == ["1350", "750 (2)", "1.80x", "16000 (1)", "0.08x"]
    assert row[-1] == "count"
