"""tapegrad.set_num_threads & co against threadpoolctl's view of numpy's BLAS and against
torch's argument checks; results identical at any thread count; the small-product switch."""
import os
import subprocess
import sys
import threading

import numpy as np
import pytest
import torch

import tapegrad
import tapegrad.nn.functional as F
from tapegrad.backend import blas
from helpers import BlasThreadRecorder

threadpoolctl = pytest.importorskip("threadpoolctl")
needs_blas = pytest.mark.skipif(blas.LIBRARY is None, reason="numpy's BLAS is not OpenBLAS")


def _numpy_blas_info():
    """threadpoolctl's record of the BLAS numpy calls (the one in numpy's own folders)."""
    numpy_root = os.path.dirname(os.path.dirname(os.path.realpath(np.__file__)))
    infos = [i for i in threadpoolctl.threadpool_info() if i["user_api"] == "blas"
             and os.path.realpath(i["filepath"]).startswith(numpy_root)
             and "numpy" in os.path.relpath(os.path.realpath(i["filepath"]), numpy_root)]
    assert len(infos) == 1, threadpoolctl.threadpool_info()
    return infos[0]


@pytest.fixture
def restore_threads():
    before = tapegrad.get_num_threads()
    yield
    tapegrad.set_num_threads(before)


@needs_blas
def test_finds_the_library_threadpoolctl_finds():
    info = _numpy_blas_info()
    assert info["internal_api"] == "openblas"
    assert os.path.realpath(blas.LIBRARY.path) == os.path.realpath(info["filepath"])
    assert tapegrad.get_num_threads() == info["num_threads"]


@needs_blas
@pytest.mark.parametrize("n", [1, 3, 2, 1])
def test_set_get_round_trip_against_threadpoolctl(restore_threads, n):
    tapegrad.set_num_threads(n)
    assert tapegrad.get_num_threads() == n
    assert _numpy_blas_info()["num_threads"] == n


@needs_blas
def test_get_sees_threadpoolctl_changes(restore_threads):
    controller = threadpoolctl.ThreadpoolController()
    lib = [c for c in controller.lib_controllers
           if os.path.realpath(c.filepath) == os.path.realpath(blas.LIBRARY.path)][0]
    for n in (1, 3):
        lib.set_num_threads(n)
        assert tapegrad.get_num_threads() == n


def _torch_error(fn, arg):
    with pytest.raises(RuntimeError) as info:
        fn(arg)
    return str(info.value)


@pytest.mark.parametrize("arg", [0, -1, 2.0, True, "2"])
def test_set_num_threads_errors_as_torch(restore_threads, arg):
    before = torch.get_num_threads()
    try:
        expected = _torch_error(torch.set_num_threads, arg)
    finally:
        torch.set_num_threads(before)
    assert _torch_error(tapegrad.set_num_threads, arg) == expected


def test_set_num_threads_takes_numpy_ints(restore_threads):
    tapegrad.set_num_threads(np.int64(1))
    assert tapegrad.get_num_threads() == 1


INTEROP = """
import sys
T = __import__(sys.argv[1])
out = [T.get_num_interop_threads()]
for arg in (0, 2.0, True):
    try:
        T.set_num_interop_threads(arg)
    except RuntimeError as e:
        out.append(str(e))
T.set_num_interop_threads(3)
out.append(T.get_num_interop_threads())
try:
    T.set_num_interop_threads(1)
except RuntimeError as e:
    out.append(str(e))
out.append(T.get_num_interop_threads())
print(repr(out))
"""


def test_interop_threads_as_torch():
    # once per process in both libraries: each runs in a fresh interpreter
    results = []
    for name in ("torch", "tapegrad"):
        r = subprocess.run([sys.executable, "-c", INTEROP, name], capture_output=True,
                           text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        results.append(r.stdout.strip().splitlines()[-1])
    assert results[0] == results[1]
    assert "cannot set number of interop threads" in results[1]


# --- results at any thread count ---------------------------------------------------------
# A product the rule keeps on one thread (blas.runs_serial) runs there whatever the count:
# bitwise the same. A longer one is split between threads, and OpenBLAS's threaded GEMM blocks the sum differently from
# its one-thread GEMM (measured: ~70% of a (300, 700) @ (700, 500) product's elements differ
# in the last bit, in float32 and float64), so there the check is the GEMM rounding bound.
SERIAL = [((64, 256), (256, 256)),      # ~0.1-0.2 ms: switched to one thread
          ((500, 300), (300,)),         # matrix-vector
          ((4, 96, 200), (200, 120)),   # batched, each product small
          ((40, 50), (50, 60))]         # below OpenBLAS's own single-thread limit
THREADED = [((300, 700), (700, 1000)), ((2, 512, 784), (784, 512))]


def _products(shapes, dtype, threads):
    """matmul's value and both gradients for each pair of shapes, at ``threads`` threads."""
    tapegrad.set_num_threads(threads)
    rng = np.random.default_rng(0)
    out = []
    for sa, sb in shapes:
        a = tapegrad.tensor(rng.standard_normal(sa).astype(dtype), requires_grad=True)
        b = tapegrad.tensor(rng.standard_normal(sb).astype(dtype), requires_grad=True)
        y = tapegrad.matmul(a, b)
        y.backward(tapegrad.ones_like(y))
        out.append((y.detach().numpy(), a.grad.numpy(), b.grad.numpy(), sa[-1]))
    return out


@needs_blas
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_small_products_bitwise_identical_whatever_the_thread_count(restore_threads, dtype):
    itemsize = np.dtype(dtype).itemsize
    assert all(blas.runs_serial(a[-2], a[-1], b[-1] if len(b) > 1 else 1, itemsize)
               or a[-2] * a[-1] * (b[-1] if len(b) > 1 else 1) <= blas.OPENBLAS_SERIAL_WORK
               for a, b in SERIAL)
    reference = _products(SERIAL, dtype, 1)
    for threads in (2, 3):
        for r, o in zip(reference, _products(SERIAL, dtype, threads)):
            for x, y in zip(r[:3], o[:3]):
                np.testing.assert_array_equal(x, y)


@needs_blas
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_large_products_agree_to_rounding_whatever_the_thread_count(restore_threads, dtype):
    reference = _products(THREADED, dtype, 1)
    eps = np.finfo(dtype).eps
    for threads in (2, 3):
        for r, o in zip(reference, _products(THREADED, dtype, threads)):
            k = r[3]
            for x, y in zip(r[:3], o[:3]):
                # |error| of a k-term sum of products <= k eps sum |terms|; the terms here are
                # products of standard normals (or sums of them over a batch/width)
                bound = k * eps * np.abs(x).max() * 4
                assert np.abs(x.astype(np.float64) - y).max() <= bound


@needs_blas
def test_fused_linear_identical_whatever_the_thread_count(restore_threads):
    # float32, the small Adam MLP's first layer: each of its three products is kept on one
    # thread (float64's twice longer ones take two)
    assert blas.runs_serial(64, 784, 256, 4) and blas.runs_serial(256, 64, 784, 4)
    assert blas.runs_serial(64, 256, 784, 4)

    def step(threads):
        tapegrad.set_num_threads(threads)
        rng = np.random.default_rng(0)
        x = tapegrad.tensor(rng.standard_normal((64, 784), np.float32), requires_grad=True)
        w = tapegrad.tensor(rng.standard_normal((256, 784), np.float32), requires_grad=True)
        b = tapegrad.tensor(rng.standard_normal(256, np.float32), requires_grad=True)
        y = F.linear(x, w, b)
        y.backward(tapegrad.ones_like(y))
        return [y.detach().numpy(), x.grad.numpy(), w.grad.numpy(), b.grad.numpy()]

    for r, o in zip(step(1), step(2)):
        np.testing.assert_array_equal(r, o)


def test_matmul_agrees_with_torch_at_two_threads(restore_threads):
    tapegrad.set_num_threads(2)
    rng = np.random.default_rng(1)
    for sa, sb in SERIAL + THREADED:
        a, b = rng.standard_normal(sa), rng.standard_normal(sb)
        expected = torch.matmul(torch.tensor(a), torch.tensor(b)).numpy()
        got = tapegrad.matmul(tapegrad.tensor(a), tapegrad.tensor(b)).numpy()
        np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-12)


# --- the small-product switch -----------------------------------------------------------


@needs_blas
def test_small_products_run_on_one_thread(restore_threads, monkeypatch):
    rec = BlasThreadRecorder()
    monkeypatch.setattr(blas, "xp", rec)
    tapegrad.set_num_threads(2)
    rng = np.random.default_rng(0)
    small = rng.standard_normal((64, 256)), rng.standard_normal((256, 256))
    big = rng.standard_normal((512, 512)), rng.standard_normal((512, 1024))
    tiny = rng.standard_normal((8, 8)), rng.standard_normal((8, 8))
    assert blas.OPENBLAS_SERIAL_WORK < 64 * 256 * 256
    assert blas.runs_serial(64, 256, 256, 8) and not blas.runs_serial(512, 512, 1024, 8)
    for a, b in (small, big, tiny):
        tapegrad.matmul(tapegrad.tensor(a), tapegrad.tensor(b))
    assert rec.seen == [1, 2, 2]  # tiny: OpenBLAS keeps it on one thread by itself
    assert tapegrad.get_num_threads() == 2 == blas.LIBRARY.get_num_threads()
    # the fused linear's forward and its backward's matmuls take the same path
    rec.seen.clear()
    x = tapegrad.tensor(small[0], requires_grad=True)
    w = tapegrad.tensor(small[1], requires_grad=True)
    F.linear(x, w).sum().backward()
    assert rec.seen == [1, 1, 1]
    assert blas.LIBRARY.get_num_threads() == 2


@needs_blas
def test_switch_restores_the_count_across_python_threads(restore_threads):
    tapegrad.set_num_threads(2)
    a = np.random.default_rng(0).standard_normal((64, 512))
    b = np.random.default_rng(1).standard_normal((512, 256))
    expected = a @ b
    errors = []

    def work():
        for _ in range(200):
            if not np.array_equal(blas.matmul(a, b), expected):
                errors.append("mismatch")

    workers = [threading.Thread(target=work) for _ in range(4)]
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    assert not errors
    assert tapegrad.get_num_threads() == 2 == blas.LIBRARY.get_num_threads()


@needs_blas
def test_set_num_threads_inside_a_switched_call_wins(restore_threads):
    tapegrad.set_num_threads(2)

    class SetsOne:
        def matmul(self, a, b):
            tapegrad.set_num_threads(1)  # as another Python thread could, mid-call
            assert tapegrad.get_num_threads() == 1
            return np.matmul(a, b)

    real = blas.xp
    blas.xp = SetsOne()
    try:
        blas.matmul(np.ones((64, 256)), np.ones((256, 256)))
    finally:
        blas.xp = real
    assert tapegrad.get_num_threads() == 1 == blas.LIBRARY.get_num_threads()


def test_without_a_controllable_blas_the_count_is_recorded(restore_threads, monkeypatch):
    monkeypatch.setattr(blas, "LIBRARY", None)  # as with numpy on MKL or Accelerate
    tapegrad.set_num_threads(3)
    assert tapegrad.get_num_threads() == 3
    a, b = np.ones((64, 256)), np.ones((256, 256))
    np.testing.assert_array_equal(blas.matmul(a, b), a @ b)
