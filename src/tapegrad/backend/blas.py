"""The BLAS library numpy calls, and its thread count, through ctypes.

numpy's wheels bundle OpenBLAS (``numpy.libs/libscipy_openblas64_-*.so``); its pthreads
pool is process-wide and defaults to one thread per core. It is found as threadpoolctl
finds it: the OpenBLAS shared object already loaded from numpy's library folder (or, for
a numpy built against a system OpenBLAS, the one in this process's memory map), and its
``openblas_get_num_threads`` / ``openblas_set_num_threads`` under the prefixes and
suffixes the builds use (``scipy_openblas_set_num_threads64_``, ...). It is only ever
opened with ``RTLD_NOLOAD``: a library numpy has not loaded is never loaded here. Where no
such library is found (numpy on MKL or Accelerate) the calls below do nothing and say so.

``matmul`` is ``xp.matmul`` with the thread count chosen per product by a cost model of this
machine (arithmetic and memory time, one thread against two plus the second thread's cost;
see ``runs_serial``): a product too short to gain from a second thread runs with the BLAS at
one thread. A stack of matrices times one transposed matrix is one GEMM over the stack's rows.
"""
import ctypes
import math
import os
import threading

import numpy as xp

_PREFIXES = ("openblas", "scipy_openblas")
_SUFFIXES = ("", "64_", "_64")


class OpenBLAS:
    """One loaded OpenBLAS: its path and its get/set thread-count functions."""

    def __init__(self, path, get, set_):
        self.path, self._get, self._set = path, get, set_

    def get_num_threads(self) -> int:
        return self._get()

    def set_num_threads(self, n: int) -> None:
        self._set(n)


def _numpy_lib_dirs():
    root = os.path.dirname(os.path.abspath(xp.__file__))
    return [os.path.join(os.path.dirname(root), "numpy.libs"),  # manylinux, Windows wheels
            os.path.join(root, ".dylibs")]                     # macOS wheels


def _loaded_paths():
    """Shared objects in this process's memory map (Linux), in load order."""
    try:
        with open("/proc/self/maps") as f:
            lines = f.read().splitlines()
    except OSError:
        return []
    seen = {}
    for line in lines:
        path = line.split(maxsplit=5)[-1] if line.count(" ") >= 5 else ""
        if path.startswith("/") and ".so" in path:
            seen.setdefault(path, None)
    return list(seen)


def _candidates():
    own = []
    for d in _numpy_lib_dirs():
        try:
            own += sorted(os.path.join(d, f) for f in os.listdir(d))
        except OSError:
            pass
    # a numpy linked against a system OpenBLAS: the one loaded, but never another wheel's
    # private copy (scipy.libs holds scipy's own, which numpy does not call)
    loaded = [p for p in _loaded_paths() if ".libs" + os.sep not in p]
    names = [p for p in own + loaded if "openblas" in os.path.basename(p).lower()]
    return list(dict.fromkeys(names))


def _open(path):
    mode = getattr(os, "RTLD_NOLOAD", 0)
    try:
        # PyDLL keeps the GIL across the call: get/set are a few instructions, and holding it
        # makes the switch in ``matmul`` atomic with respect to other Python threads
        lib = ctypes.PyDLL(path, mode=mode)
    except OSError:
        return None
    for prefix in _PREFIXES:
        for suffix in _SUFFIXES:
            get = getattr(lib, f"{prefix}_get_num_threads{suffix}", None)
            set_ = getattr(lib, f"{prefix}_set_num_threads{suffix}", None)
            if get is not None and set_ is not None:
                get.argtypes, get.restype = [], ctypes.c_int
                set_.argtypes, set_.restype = [ctypes.c_int], None
                return OpenBLAS(path, get, set_)
    return None


def find_openblas():
    """The OpenBLAS numpy calls, or None (not OpenBLAS, or not found)."""
    for path in _candidates():
        lib = _open(path)
        if lib is not None:
            return lib
    return None


LIBRARY = find_openblas()


def num_threads():
    """The BLAS's thread count (outside any serial matmul), or None without a BLAS to ask."""
    if LIBRARY is None:
        return None
    with _lock:
        return _serial[1] if _serial[0] else LIBRARY.get_num_threads()


def set_num_threads(n: int) -> bool:
    """Set the BLAS's thread count; returns whether there was a BLAS to set."""
    if LIBRARY is None:
        return False
    with _lock:
        if _serial[0]:  # inside a serial matmul elsewhere: it restores this value on leaving
            _serial[1] = n
        else:
            LIBRARY.set_num_threads(n)
    return True


# --- one thread or the count set: a cost model per product ------------------------------
# A product (m, k) @ (k, n) takes, on one thread, the longer of its arithmetic time and its
# memory time: 2*m*n*k flops at the one-thread GEMM rate of its dtype, or its operands read
# and its output written at one thread's streaming rates (the left operand slower: OpenBLAS
# copies it into packed panels, which is all the work there is when n is tiny). A second
# thread divides each by what two cores achieve together (nearly 2 for arithmetic, less for
# memory, which the cores share) and adds a fixed cost per product: waking the worker and
# waiting for it at the end. So the decision is by predicted time: a product runs with the
# BLAS at one thread unless two threads are predicted faster. Skinny products over large
# arrays ((4096, 2) @ (2, 2048): little work, 67 MB) take two threads by their memory time,
# square ones by their arithmetic, tiny ones neither.
#
# The constants are this 2-core machine's (AMD EPYC, OpenBLAS 0.3.31), measured by
# ``python -m tapegrad bench blas --sweep``; docs/performance.md, "BLAS threads", has the
# tables. THREAD_COST is what a second thread costs on a *free* core; when another process
# keeps that core busy, each hand-off waits for a scheduler time slice (4-16 ms measured), so
# every product the rule threads is slower than at one thread unless it lasts tens of ms:
# on a shared machine, ``tapegrad.set_num_threads(1)``, or TAPEGRAD_BLAS_THREAD_COST_US set
# to such a slice, keeps them on one. OpenBLAS itself keeps a GEMM below 4 * 65536
# multiply-adds on one thread (GEMM_MULTITHREAD_THRESHOLD), so the switch is only made above.
OPENBLAS_SERIAL_WORK = 4 * 65536
GEMM_FLOPS = {4: 103e9, 8: 51e9}     # one-thread GEMM flop/s, float32 and float64
LEFT_BYTES = 6.5e9                   # one-thread bytes/s of the left operand (packed)
STREAM_BYTES = 10e9                  # one-thread bytes/s of the right operand and the output
TWO_THREAD_FLOPS = 1.8               # two threads' arithmetic speed-up
TWO_THREAD_BYTES = 1.7               # two threads' memory speed-up
THREAD_COST = float(os.environ.get("TAPEGRAD_BLAS_THREAD_COST_US", "150")) * 1e-6
# the fewest multiply-adds a product whose time is its arithmetic takes to two threads, at
# float32 (the faster rate): below it such a product runs on one thread (a cheap bound for
# callers; a skinny product's memory time can take it to two threads with fewer)
SERIAL_WORK = int(THREAD_COST * GEMM_FLOPS[4] / 2 / (1 - 1 / TWO_THREAD_FLOPS))
_lock = threading.Lock()
_serial = [0, 0]  # matmuls inside the switch now, the thread count to restore after them


def _times(m, k, n, itemsize):
    """(arithmetic seconds, memory seconds) of an (m, k) @ (k, n) product on one thread."""
    flops = 2 * m * k * n / (GEMM_FLOPS[4] if itemsize == 4 else GEMM_FLOPS[8])
    memory = itemsize * (m * k / LEFT_BYTES + (k * n + m * n) / STREAM_BYTES)
    return flops, memory


def one_thread_seconds(m: int, k: int, n: int, itemsize: int) -> float:
    """The model's time of an (m, k) @ (k, n) product at one BLAS thread."""
    return max(_times(m, k, n, itemsize))


def two_thread_seconds(m: int, k: int, n: int, itemsize: int) -> float:
    """The model's time of the product at two BLAS threads, the other core free."""
    flops, memory = _times(m, k, n, itemsize)
    return max(flops / TWO_THREAD_FLOPS, memory / TWO_THREAD_BYTES) + THREAD_COST


def runs_serial(m: int, k: int, n: int, itemsize: int) -> bool:
    """Whether an (m, k) @ (k, n) product of ``itemsize``-byte elements runs on one thread."""
    work = m * k * n
    if work <= OPENBLAS_SERIAL_WORK:
        return False  # OpenBLAS's own decision: one thread already
    # ``two_thread_seconds >= one_thread_seconds``, written out: this runs before every
    # product above OpenBLAS's bound, some of them ~10 us long
    flops = 2 * work / (GEMM_FLOPS[4] if itemsize == 4 else GEMM_FLOPS[8])
    memory = itemsize * (m * k / LEFT_BYTES + (k * n + m * n) / STREAM_BYTES)
    one = max(flops, memory)
    if one <= THREAD_COST:
        return True
    return max(flops / TWO_THREAD_FLOPS, memory / TWO_THREAD_BYTES) + THREAD_COST >= one


def matmul(a, b):
    """``xp.matmul(a, b)``, with the BLAS at one thread when each product is small."""
    if a.dtype.itemsize == 2 and a.dtype.kind in "fV" and a.dtype == b.dtype:
        # bfloat16/float16: a float32 GEMM rounded once, as PyTorch's CPU kernels accumulate
        # (numpy's bfloat16 matmul returns float32; its float16 one has no BLAS)
        return matmul(a.astype(xp.float32), b.astype(xp.float32)).astype(a.dtype)
    if a.ndim > 2 and b.ndim == 2 and not b.flags.c_contiguous:
        # a stack times a transposed matrix (linear's x @ w.T): one 2-D GEMM over the
        # stack's rows. numpy's stacked product against a non-contiguous matrix is 1.2-1.7x
        # slower (float64/float32, (16, 32, K) @ (K, N) for K, N in 64..256), while against
        # a contiguous one its GEMM per leading index is 1.1-1.2x *faster* than the single
        # GEMM here (OpenBLAS 0.3.31), so that case is left to numpy. Each output row is the
        # same K-term dot product either way, and for the shapes the BLAS takes to its GEMM
        # kernels the bits agree too, but not for every shape (one row per index goes to
        # GEMV; some tiny products to other kernels): which form runs is fixed by the
        # operands' layout alone, so eager is consistent with itself
        lead = a.shape[:-1]
        rows = a.reshape(math.prod(lead), a.shape[-1])
        return matmul(rows, b).reshape(*lead, b.shape[-1])
    # a.size * n bounds the per-product work from above: the common tiny product pays one
    # multiply, not _work's shape reads
    if a.size * b.shape[-1] <= OPENBLAS_SERIAL_WORK or LIBRARY is None \
            or not runs_serial(a.shape[-2] if a.ndim > 1 else 1, a.shape[-1],
                               b.shape[-1] if b.ndim > 1 else 1,
                               max(a.dtype.itemsize, b.dtype.itemsize)):
        return xp.matmul(a, b)
    with _lock:
        if _serial[0] == 0:
            _serial[1] = LIBRARY.get_num_threads()
            if _serial[1] > 1:
                LIBRARY.set_num_threads(1)
        _serial[0] += 1
    try:
        return xp.matmul(a, b)
    finally:
        with _lock:
            _serial[0] -= 1
            if _serial[0] == 0 and _serial[1] > 1:
                LIBRARY.set_num_threads(_serial[1])
