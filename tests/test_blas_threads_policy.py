"""backend.blas's thread policy: which products run on one BLAS thread (by work and by bytes
moved), and what a second thread does to the bits of the products it takes."""
import numpy as np
import pytest

import tapegrad
from tapegrad.backend import blas
from helpers import BlasThreadRecorder

needs_blas = pytest.mark.skipif(blas.LIBRARY is None, reason="numpy's BLAS is not OpenBLAS")


@pytest.fixture
def restore_threads():
    before = tapegrad.get_num_threads()
    yield
    tapegrad.set_num_threads(before)


@pytest.fixture
def documented_bounds(monkeypatch):
    """The bounds docs/performance.md states, whatever the environment overrides."""
    monkeypatch.setattr(blas, "SERIAL_WORK", 1 << 27)
    monkeypatch.setattr(blas, "SERIAL_BYTES", 1 << 25)


# (m, k, n, itemsize, runs on one thread)
DECISIONS = [
    (64, 784, 256, 4, True),        # the small Adam MLP's first layer: few MB, little work
    (256, 256, 256, 8, True),
    (511, 512, 512, 8, True),       # just under the work bound, 6 MB
    (512, 512, 512, 8, False),      # the work bound itself
    (40, 50, 60, 8, False),         # below OpenBLAS's own one-thread bound: left to it
    (512, 2, 256, 8, False),        # ditto (4 * 65536 multiply-adds)
    (1024, 2, 512, 8, True),        # skinny, 4 MB
    (2048, 2, 1024, 8, True),       # skinny, 17 MB
    (4096, 2, 2048, 8, False),      # the scale step's first layer: 67 MB
    (4096, 2048, 3, 8, False),      # its last layer
    (2, 4096, 2048, 8, False),      # its first layer's weight gradient
    (4096, 2, 2048, 4, False),      # float32: 32 MiB and a few KB
    (4096, 2, 2040, 4, True),       # float32, just under 32 MiB
    (1024, 1024, 1024, 8, False),   # large on both counts
]


@pytest.mark.parametrize("m,k,n,itemsize,serial", DECISIONS)
def test_policy_by_work_and_bytes(documented_bounds, m, k, n, itemsize, serial):
    assert blas.runs_serial(m, k, n, itemsize) is serial


def test_bounds_at_their_edges(documented_bounds):
    # bytes moved: both operands and the output, at the element size
    k, n = 2, 1024
    m = (blas.SERIAL_BYTES // 8 - k * n) // (k + n)  # largest m under the byte bound
    assert (m * k + k * n + m * n) * 8 < blas.SERIAL_BYTES <= ((m + 1) * (k + n) + k * n) * 8
    assert blas.runs_serial(m, k, n, 8)
    assert not blas.runs_serial(m + 1, k, n, 8)
    assert blas.runs_serial(m, k, n, 4)  # half the bytes at float32


def test_a_zero_bound_turns_the_switch_off(monkeypatch):
    monkeypatch.setattr(blas, "SERIAL_BYTES", 0)
    assert not blas.runs_serial(256, 256, 256, 8)
    monkeypatch.setattr(blas, "SERIAL_BYTES", 1 << 25)
    monkeypatch.setattr(blas, "SERIAL_WORK", 0)
    assert not blas.runs_serial(256, 256, 256, 8)




@needs_blas
def test_matmul_follows_the_policy(restore_threads, documented_bounds, monkeypatch):
    rec = BlasThreadRecorder()
    monkeypatch.setattr(blas, "xp", rec)
    tapegrad.set_num_threads(2)
    small = np.ones((64, 256)), np.ones((256, 256))
    skinny_small = np.ones((2048, 2)), np.ones((2, 1024))
    skinny_large = np.ones((4096, 2)), np.ones((2, 2048))
    stacked = np.ones((3, 4096, 2)), np.ones((3, 2, 2048))  # per product, as numpy loops
    for a, b in (small, skinny_small, skinny_large, stacked):
        blas.matmul(a, b)
    assert rec.seen == [1, 1, 2, 2]
    assert blas.LIBRARY.get_num_threads() == 2


# The products the bytes bound hands to two threads are skinny (a large operand and a small
# work): one side below 2**27 / (4 MiB of elements) = 32 at float64. OpenBLAS's threaded GEMM
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
                                                                       documented_bounds, dtype):
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
