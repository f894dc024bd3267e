"""The process tapegrad runs in: thread counts (as ``torch.set_num_threads`` and friends)
and the memory freed arrays leave in the heap (``empty_cache``).

tapegrad's ops run in the calling thread; the only thread pool under them is the BLAS
library numpy calls (OpenBLAS in numpy's wheels), which does their matrix products. So the
intra-op count *is* that BLAS's thread count, set through ctypes on the library numpy has
loaded (``tapegrad.backend.blas``). tapegrad has no inter-op pool: the inter-op count is
kept and checked with PyTorch's rules, and nothing reads it.
"""
import os

from tapegrad.backend import blas as _blas
from tapegrad.backend import numpy_backend as _numpy_backend

_intra = None  # what set_num_threads set, for a numpy whose BLAS cannot be controlled
_interop = None


def _check(name, n):
    if type(n) is bool or not hasattr(n, "__index__"):
        raise RuntimeError(f"{name} expects an int, but got {type(n).__name__}")
    n = n.__index__()
    if n <= 0:
        raise RuntimeError(f"{name} expects a positive integer")
    return n


def set_num_threads(n: int) -> None:
    """As ``torch.set_num_threads``: threads for intra-op parallelism, i.e. numpy's BLAS.

    Process-wide, as OpenBLAS's pool is. Matrix products too small to gain from a second
    thread, in work and in bytes moved, still run on one (``tapegrad.backend.blas.runs_serial``)::

        tapegrad.set_num_threads(1)   # BLAS on one thread, e.g. on a busy machine
    """
    global _intra
    n = _check("set_num_threads", n)
    _intra = n
    _blas.set_num_threads(n)


def get_num_threads() -> int:
    """As ``torch.get_num_threads``: numpy's BLAS thread count (by default OpenBLAS's: one
    per core, or ``OPENBLAS_NUM_THREADS`` / ``OMP_NUM_THREADS`` when set)."""
    n = _blas.num_threads()
    if n is not None:
        return n
    return _intra if _intra is not None else (os.cpu_count() or 1)


def set_num_interop_threads(n: int) -> None:
    """As ``torch.set_num_interop_threads``: may be called once, with a positive int.

    tapegrad runs no inter-op parallel work (ops run in the calling thread, one after the
    other), so the count is recorded and reported by ``get_num_interop_threads`` only.
    """
    global _interop
    n = _check("set_num_interop_threads", n)
    if _interop is not None:
        raise RuntimeError("Error: cannot set number of interop threads after parallel work "
                           "has started or set_num_interop_threads called")
    _interop = n


def get_num_interop_threads() -> int:
    """As ``torch.get_num_interop_threads``: the count set, else the number of CPUs."""
    return _interop if _interop is not None else (os.cpu_count() or 1)


def empty_cache() -> None:
    """Hand the memory that freed arrays left in the process back to the OS.

    tapegrad keeps freed large blocks in the heap for reuse (glibc's allocator tuned at
    import, see README "Memory held by the process"), as PyTorch's caching allocator keeps
    freed GPU blocks; this is the counterpart of ``torch.cuda.empty_cache``. Live tensors
    are untouched. Elsewhere than glibc it does nothing::

        del activations
        tapegrad.empty_cache()        # RSS falls back to what live arrays need
    """
    _numpy_backend.release_memory()
