"""The array backend: the one place that imports the array module.

Ops take ``xp`` from here, so a GPU backend is a new file, not a second copy of every op.
"""
from tapegrad.backend.numpy_backend import (xp, DEVICE, reduce_axis, release_memory,
                                            keeps_freed_memory)

__all__ = ["xp", "DEVICE", "reduce_axis", "release_memory", "keeps_freed_memory"]

# --- device arrays: the array module is taken from the arrays --------------------------------
# numpy is the default everywhere; a device backend (cupy_backend, or a test's stand-in)
# registers its array type here. Nothing below runs on an all-cpu program's per-op path:
# dispatch only asks when an op's result is not a numpy array, or when its forward failed.
from tapegrad.backend import numpy_backend as _numpy_backend  # noqa: E402
from tapegrad.backend import scatter as _scatter  # noqa: E402

_MODULES = {}        # device array type -> its backend module
DEVICE_TYPES = set()  # the device array types (dispatch keeps these as op results)
_BY_TYPE = {}        # device type ("cuda") -> its backend, once registered
_LOADED = [False]    # whether the CuPy backend was tried


def register(backend) -> None:
    """Make ``backend`` (a module or object with numpy_backend's interface plus DEVICE_TYPE,
    ARRAY_TYPE, device_of, to_device, to_host, device_count) the one for its device type."""
    _MODULES[backend.ARRAY_TYPE] = backend
    DEVICE_TYPES.add(backend.ARRAY_TYPE)
    _BY_TYPE[backend.DEVICE_TYPE] = backend


def unregister(backend) -> None:
    _MODULES.pop(backend.ARRAY_TYPE, None)
    DEVICE_TYPES.discard(backend.ARRAY_TYPE)
    if _BY_TYPE.get(backend.DEVICE_TYPE) is backend:
        del _BY_TYPE[backend.DEVICE_TYPE]


def cuda_backend():
    """The registered CUDA backend: CuPy's, imported on first call when CuPy is installed and
    sees a device; None otherwise."""
    if "cuda" not in _BY_TYPE and not _LOADED[0]:
        _LOADED[0] = True
        try:
            from tapegrad.backend import cupy_backend
        except ImportError:
            return None
        if cupy_backend.AVAILABLE:
            register(cupy_backend)
    return _BY_TYPE.get("cuda")


def backend_of(a):
    """The backend module holding array ``a`` (numpy_backend for host arrays)."""
    return _MODULES.get(type(a), _numpy_backend)


def array_module(*arrays):
    """As ``cupy.get_array_module``: the array module of the first device array among
    ``arrays``, else numpy (scalars, lists and numpy arrays are host data)."""
    for a in arrays:
        b = _MODULES.get(type(a))
        if b is not None:
            return b.xp
    return xp


def device_of(a):
    """The ``tapegrad.device`` array ``a`` lives on."""
    b = _MODULES.get(type(a))
    return DEVICE if b is None else b.device_of(a)


def to_host(a):
    """``a`` as a numpy array: device arrays are copied to the host, host arrays returned as
    they are. Host-only work (saving, printing, numpy's RNG, data loading) goes through this."""
    b = _MODULES.get(type(a))
    return a if b is None else b.to_host(a)


def to_device(a, dev):
    """Array ``a`` on ``dev`` (a cpu or cuda ``tapegrad.device``): the same array when it is
    already there, else a copy."""
    if dev.type == "cpu":
        return to_host(a)
    b = cuda_backend() if dev.type == "cuda" else _BY_TYPE.get(dev.type)
    if b is None:
        raise RuntimeError(f"to: no {dev.type} backend")
    return b.to_device(a, dev.index)


def on_device_of(ref, a):
    """Host array ``a`` copied to the device array ``ref`` lives on (``a`` itself when ``ref``
    is a host array): small constants an op builds with numpy (divisors, masks)."""
    b = _MODULES.get(type(ref))
    return a if b is None else b.to_device(a, b.device_of(ref).index)


def add_at(a, index, values) -> None:
    """``numpy.add.at(a, index, values)`` (unbuffered: repeated indices add) on ``a``'s device
    (host: ``scatter.add_at``, add.at's bits by faster paths; CuPy: ``cupyx.scatter_add``)."""
    b = _MODULES.get(type(a))
    if b is None:
        _scatter.add_at(a, index, values)
    else:
        b.add_at(a, index, values)


def sum_rows(values, rows, n):
    """float64 sums of ``values``' rows by ``rows`` into ``n`` rows, as ``numpy.bincount``
    with weights adds them (``scatter.sum_rows``; host arrays)."""
    return _scatter.sum_rows(values, rows, n)


def mixed_device_error(name, tensors):
    """PyTorch's error for an op given tensors on two devices, or None when all share one."""
    seen = []
    for t in tensors:
        d = device_of(t._data)
        if d not in seen:
            seen.append(d)
    if len(seen) < 2:
        return None
    return RuntimeError(f"Expected all tensors to be on the same device, but found at least two "
                        f"devices, {seen[0]} and {seen[1]}! (in {name})")


__all__ += ["add_at", "sum_rows", "on_device_of", "array_module", "backend_of", "device_of", "to_host",
            "to_device", "register",
            "unregister", "cuda_backend", "DEVICE_TYPES", "mixed_device_error"]
