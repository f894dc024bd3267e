"""A stand-in CUDA device on the cpu, for testing the array-module seam without a GPU.

``FakeArray`` is a numpy ndarray subclass registered as the "cuda" backend's array type. It
behaves as CuPy does where the seam matters: every numpy function or ufunc reached with a
fake array goes through ``__array_function__`` / ``__array_ufunc__`` (as numpy hands CuPy
arrays to CuPy), and a plain numpy array meeting a fake one there raises TypeError (CuPy:
"Unsupported type <class 'numpy.ndarray'>"). An op that builds a host array with numpy
directly (``np.zeros(shape)``, ``np.asarray(x)``) for device data therefore either fails on
its next step or returns a host array where a device one is due; ``check_on_device`` catches
both.
"""
import types

import numpy as np

from tapegrad import backend
from tapegrad.backend.device import device as Device


class HostArrayOnDevice(TypeError):
    pass


class FakeArray(np.ndarray):
    """An array "on cuda:0" (its memory is the host's; only its type differs)."""

    def __array_ufunc__(self, ufunc, method, *inputs, out=None, **kwargs):
        _refuse_host(inputs, f"{ufunc.__name__}.{method}")
        args = _unwrap(inputs)
        if out is not None:
            _refuse_host(out, f"{ufunc.__name__}.{method} out=")
            kwargs["out"] = _unwrap(out)
        result = getattr(ufunc, method)(*args, **kwargs)
        if out is not None:
            return out[0] if len(out) == 1 else out
        return _wrap(result)

    def __array_function__(self, func, types_, args, kwargs):
        _refuse_host(args, func.__name__)
        _refuse_host(tuple(kwargs.values()), func.__name__)
        return _wrap(func(*_unwrap(args), **_unwrap(kwargs)))

    def __setitem__(self, key, value):
        np.ndarray.__setitem__(self.view(np.ndarray), _unwrap(key), _unwrap(value))


def _refuse_host(objs, where):
    for o in objs:
        if type(o) is np.ndarray:
            raise HostArrayOnDevice(f"fake device: a host numpy array {o.shape} {o.dtype} "
                                    f"reached {where} with device data")
        if isinstance(o, (list, tuple)):
            _refuse_host(o, where)


def _unwrap(o):
    if isinstance(o, FakeArray):
        return o.view(np.ndarray)
    if isinstance(o, tuple):
        return tuple(_unwrap(x) for x in o)
    if isinstance(o, list):
        return [_unwrap(x) for x in o]
    if isinstance(o, dict):
        return {k: _unwrap(v) for k, v in o.items()}
    return o


def _wrap(o):
    if type(o) is np.ndarray:
        return o.view(FakeArray)
    if isinstance(o, np.generic):  # CuPy reductions give 0-d arrays, not scalars
        return np.asarray(o).view(FakeArray)
    if isinstance(o, tuple):
        return tuple(_wrap(x) for x in o)
    if isinstance(o, list):
        return [_wrap(x) for x in o]
    return o


class _FakeModule(types.ModuleType):
    """The fake device's array module: numpy's functions, returning fake arrays."""

    ndarray = FakeArray

    def __getattr__(self, name):
        f = getattr(np, name)
        if callable(f) and not isinstance(f, (type, np.ufunc)):
            def g(*args, **kwargs):
                return _wrap(f(*_unwrap(args), **_unwrap(kwargs)))
            return g
        return f


class _Wrapped:
    """A module's functions taking and returning fake arrays (cupyx.scipy.special's stand-in)."""

    def __init__(self, module):
        self._m = module

    def __getattr__(self, name):
        f = getattr(self._m, name)
        return lambda *a, **k: _wrap(f(*_unwrap(a), **_unwrap(k)))


class FakeBackend:
    """numpy_backend's interface for the fake "cuda" device."""

    DEVICE_TYPE = "cuda"
    ARRAY_TYPE = FakeArray
    xp = _FakeModule("fake_cupy")
    DEVICE = Device("cuda", 0)
    AVAILABLE = True

    def __init__(self):
        self.seeds = []
        import scipy.special
        self.special = _Wrapped(scipy.special)

    def device_count(self):
        return 1

    def current_index(self):
        return 0

    def device_of(self, a):
        return self.DEVICE

    def to_device(self, a, index=None):
        if index not in (None, 0):
            raise RuntimeError(f"fake device: no cuda:{index}")
        return np.array(_unwrap(a), copy=True).view(FakeArray)

    def to_host(self, a):
        return np.array(a.view(np.ndarray), copy=True)

    def add_at(self, a, index, values):
        _refuse_host((index if isinstance(index, tuple) else (index,)) + (values,), "add_at")
        np.add.at(_unwrap(a), _unwrap(index), _unwrap(values))

    def synchronize(self, index=None):
        pass

    def manual_seed(self, seed, index=None):
        self.seeds.append(int(seed))

    def manual_seed_all(self, seed):
        self.seeds.append(int(seed))

    def reduce_axis(self, ufunc, a, axis, keepdims=False):
        return ufunc.reduce(a, axis=axis, keepdims=keepdims)

    def release_memory(self):
        return False

    def keeps_freed_memory(self):
        return True

    def memory_allocated(self, index=None):
        return 0

    def memory_reserved(self, index=None):
        return 0


def install():
    b = FakeBackend()
    backend.register(b)
    return b


def uninstall(b):
    backend.unregister(b)
