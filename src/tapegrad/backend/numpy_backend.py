"""numpy backend: the array module and the device facts the profiler needs."""
import numpy as xp


from tapegrad.backend.device import device as Device, CPU as DEVICE  # noqa: F401


def keep_freed_memory(max_block=1 << 30) -> bool:
    """Have glibc's malloc serve and keep large arrays in its heap instead of fresh mmaps.

    By default glibc maps every block over 32 MiB freshly from the kernel and unmaps it on
    free, so each large activation of each training step pays page faults (measured at
    width 2048, batch 4096: ~50 ms of kernel time per step, against ~4 ms with this).
    Raising the mmap and trim thresholds makes freed buffers reusable, as a caching
    allocator would. Returns whether it took effect (glibc only). Set
    TAPEGRAD_KEEP_FREED_MEMORY=0 to leave the allocator alone.
    """
    import os

    if os.environ.get("TAPEGRAD_KEEP_FREED_MEMORY", "1") == "0":
        return False
    mallopt = getattr(_libc(), "mallopt", None)
    if mallopt is None:
        return False
    M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
    return bool(mallopt(M_MMAP_THRESHOLD, max_block)) and bool(
        mallopt(M_TRIM_THRESHOLD, 2 * max_block))


def _libc():
    """The C library, or None where there is none to open."""
    import ctypes
    import ctypes.util

    global _LIBC
    if _LIBC is False:
        try:
            _LIBC = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        except OSError:
            _LIBC = None
    return _LIBC


_LIBC = False
ALLOCATOR_TUNED = keep_freed_memory()


def keeps_freed_memory() -> bool:
    """Whether freed large blocks stay in the process for reuse (see ``keep_freed_memory``):
    True by default on glibc, False with TAPEGRAD_KEEP_FREED_MEMORY=0 or another libc."""
    return ALLOCATOR_TUNED


def release_memory() -> bool:
    """Hand the memory freed blocks still hold back to the OS: glibc's ``malloc_trim(0)``
    (every arena; free pages inside the heap too). Live arrays are untouched, and the next
    large allocations are served fresh from the kernel again. Returns whether any memory
    was released; elsewhere (no glibc) it does nothing and returns False."""
    trim = getattr(_libc(), "malloc_trim", None)
    if trim is None:
        return False
    import ctypes

    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return bool(trim(0))


def reduce_axis(ufunc, a, axis, keepdims=False):
    """``ufunc.reduce(a, axis, keepdims)``, fast when ``axis`` is a short last axis.

    numpy's reduction over a contiguous last axis of 2-7 elements costs ~10x an elementwise
    pass (measured on (512, 3) float64: max 19 us, sum 9 us); folded column by column it is
    a few elementwise passes (2.7 us), in the same sequential order numpy's loop uses for
    such short rows, so sums round identically. Softmax over classes is the common case.
    """
    if type(axis) is tuple:
        if len(axis) != 1:
            return ufunc.reduce(a, axis=axis, keepdims=keepdims)
        axis = axis[0]
    n = a.ndim
    if n >= 2 and (axis == -1 or axis == n - 1) and 1 < a.shape[-1] < 8 \
            and a.dtype.kind == "f" and a.size >= 64:
        out = ufunc(a[..., 0], a[..., 1])
        for j in range(2, a.shape[-1]):
            ufunc(out, a[..., j], out=out)
        return out[..., None] if keepdims else out
    return ufunc.reduce(a, axis=axis, keepdims=keepdims)
