"""CuPy backend: the CUDA array module and the device facts, behind numpy_backend's interface.

Imported only on demand (``tapegrad.backend.cuda_backend()``): importing CuPy costs about a
second and initialises nothing on the GPU, but a cpu-only program should not pay it. Import
fails (ImportError) where CuPy is not installed; ``AVAILABLE`` is False where CuPy is
installed but no CUDA device is visible (no driver, ``CUDA_VISIBLE_DEVICES=``).
"""
import cupy as xp

from tapegrad.backend.device import device as Device

DEVICE_TYPE = "cuda"
ARRAY_TYPE = xp.ndarray


def device_count() -> int:
    """CUDA devices CuPy can see (0 without a driver or device)."""
    try:
        return xp.cuda.runtime.getDeviceCount()
    except Exception:  # cupy_backends.cuda.api.runtime.CUDARuntimeError: no driver / device
        return 0


AVAILABLE = device_count() > 0
DEVICE = Device("cuda", 0)


def device_of(a) -> Device:
    """The ``tapegrad.device`` a CuPy array lives on: ``cuda:N``."""
    return Device("cuda", a.device.id)


def current_index() -> int:
    return xp.cuda.runtime.getDevice()


def to_device(a, index=None):
    """A host (numpy) or CuPy array copied to CUDA device ``index`` (the current one if None);
    an array already there is returned as is."""
    index = current_index() if index is None else index
    if isinstance(a, ARRAY_TYPE) and a.device.id == index:
        return a
    with xp.cuda.Device(index):
        return xp.asarray(a) if not isinstance(a, ARRAY_TYPE) else a.copy()


def to_host(a):
    """The numpy copy of a CuPy array (synchronous)."""
    return xp.asnumpy(a)


def add_at(a, index, values) -> None:
    """``numpy.add.at`` on the device: repeated indices add (atomics)."""
    import cupyx

    cupyx.scatter_add(a, index, values)


def synchronize(index=None) -> None:
    with xp.cuda.Device(current_index() if index is None else index):
        xp.cuda.runtime.deviceSynchronize()


def manual_seed(seed, index=None) -> None:
    """Seed CuPy's generator on one device (its own stream, not numpy's)."""
    with xp.cuda.Device(current_index() if index is None else index):
        xp.random.seed(int(seed) % (1 << 64))


def manual_seed_all(seed) -> None:
    for i in range(device_count()):
        manual_seed(seed, i)


def reduce_axis(ufunc, a, axis, keepdims=False):
    """``ufunc.reduce(a, axis, keepdims)`` (the GPU needs no short-axis special case)."""
    return ufunc.reduce(a, axis=axis, keepdims=keepdims)


def release_memory() -> bool:
    """Free the blocks CuPy's memory pool caches (``torch.cuda.empty_cache``)."""
    pool = xp.get_default_memory_pool()
    held = pool.total_bytes() - pool.used_bytes()
    pool.free_all_blocks()
    xp.get_default_pinned_memory_pool().free_all_blocks()
    return held > 0


def keeps_freed_memory() -> bool:
    """CuPy's memory pool keeps freed blocks for reuse, as PyTorch's caching allocator."""
    return True


def memory_allocated(index=None) -> int:
    return xp.get_default_memory_pool().used_bytes()


def memory_reserved(index=None) -> int:
    return xp.get_default_memory_pool().total_bytes()


def _special():
    import cupyx.scipy.special
    return cupyx.scipy.special


special = _special()  # erf & co on the device (scipy.special's names)
