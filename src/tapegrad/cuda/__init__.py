"""``tapegrad.cuda`` as ``torch.cuda``, true to the machine.

With CuPy installed (the ``cuda`` extra) and a CUDA device visible, ``is_available()`` is True,
``device_count()`` counts the devices, ``manual_seed(_all)`` seeds CuPy's generators and
``synchronize()`` waits for the device (``tapegrad.backend.cupy_backend``). Otherwise the
queries answer as PyTorch's CPU build does (``is_available()`` False, ``device_count()``
0, memory counters 0); seeding is a no-op (PyTorch queues CUDA seeds until CUDA initialises,
which never happens here); calls that need a device (``synchronize``, ``current_device``,
``get_device_name`` ...) raise ``AssertionError: Torch not compiled with CUDA enabled`` as
PyTorch does. A GPU backend replaces these answers here and adds ``"cuda"`` to
``tapegrad.backend.device.SUPPORTED``.

>>> device = "cuda" if tapegrad.cuda.is_available() else "cpu"
"""
import collections

from tapegrad import backend as _backend
from tapegrad.backend.device import device as _device, no_cuda
from tapegrad.tensor import tensor_types as _tensor_types


def _cuda():
    """The CUDA backend (CuPy's, or a test's stand-in), or None without CuPy or a device."""
    return _backend.cuda_backend()


def is_available() -> bool:
    """As ``torch.cuda.is_available()``: whether CuPy is installed and sees a CUDA device."""
    b = _cuda()
    return b is not None and b.device_count() > 0


def is_initialized() -> bool:
    """As ``torch.cuda.is_initialized()``: whether the CUDA backend has been loaded."""
    return _backend._BY_TYPE.get("cuda") is not None


def device_count() -> int:
    """As ``torch.cuda.device_count()``: the CUDA devices CuPy sees (0 without CuPy)."""
    b = _cuda()
    return 0 if b is None else b.device_count()


def is_bf16_supported(including_emulation: bool = True) -> bool:
    """As ``torch.cuda.is_bf16_supported()`` without CUDA: False."""
    return False


def get_arch_list() -> list:
    """As ``torch.cuda.get_arch_list()`` without CUDA: []."""
    return []


# --- seeding: PyTorch queues these until CUDA initialises, which never happens here -------
def manual_seed(seed) -> None:
    """As ``torch.cuda.manual_seed(seed)``: seeds CuPy's generator on the current device (its
    own stream, not numpy's); a no-op without CUDA (PyTorch's lazy seeding).

    ``tapegrad.manual_seed`` seeds tapegrad's own generator."""
    seed = int(seed)
    b = _cuda()
    if b is not None:
        b.manual_seed(seed)


def manual_seed_all(seed) -> None:
    """As ``torch.cuda.manual_seed_all(seed)``: seeds every device's generator; a no-op
    without CUDA."""
    seed = int(seed)
    b = _cuda()
    if b is not None:
        b.manual_seed_all(seed)


def seed() -> None:
    """As ``torch.cuda.seed()``: a no-op without CUDA."""


def seed_all() -> None:
    """As ``torch.cuda.seed_all()``: a no-op without CUDA."""


def get_rng_state_all() -> list:
    """As ``torch.cuda.get_rng_state_all()``: one state per device, so []."""
    return []


def set_rng_state_all(new_states) -> None:
    """As ``torch.cuda.set_rng_state_all(states)``: one state per device, so nothing to set."""
    for _ in new_states:
        raise no_cuda("set_rng_state_all")


# --- memory: PyTorch's CPU build reports an empty caching allocator -----------------------
def empty_cache() -> None:
    """As ``torch.cuda.empty_cache()``: frees the blocks CuPy's pool caches; nothing is cached
    without CUDA."""
    b = _cuda()
    if b is not None:
        b.release_memory()


def memory_allocated(device=None) -> int:
    """As ``torch.cuda.memory_allocated()``: bytes in use in CuPy's pool; 0 without CUDA."""
    b = _cuda()
    return 0 if b is None else b.memory_allocated()


def max_memory_allocated(device=None) -> int:
    """As ``torch.cuda.max_memory_allocated()``: 0 without CUDA."""
    return 0


def memory_reserved(device=None) -> int:
    """As ``torch.cuda.memory_reserved()``: bytes CuPy's pool holds; 0 without CUDA."""
    b = _cuda()
    return 0 if b is None else b.memory_reserved()


def max_memory_reserved(device=None) -> int:
    """As ``torch.cuda.max_memory_reserved()``: 0 without CUDA."""
    return 0


def memory_stats(device=None) -> collections.OrderedDict:
    """As ``torch.cuda.memory_stats()``: empty without CUDA."""
    return collections.OrderedDict()


# --- calls that need a device raise, as on PyTorch's CPU-only build -----------------------
def _needs_cuda(name, doc):
    def f(*args, **kwargs):
        raise no_cuda(f"cuda.{name}")

    f.__name__ = f.__qualname__ = name
    f.__doc__ = f"As ``torch.cuda.{name}{doc}``: raises ``AssertionError: Torch not compiled " \
                "with CUDA enabled`` (no CUDA device)."
    return f


def _device_index(device):
    if device is None:
        return None
    if isinstance(device, (str, _device)):
        d = _device(device)
        return d.index
    return int(device)


def synchronize(device=None) -> None:
    """As ``torch.cuda.synchronize(device=None)``: waits for the device's work to finish;
    raises as PyTorch's CPU-only build does without CUDA."""
    b = _cuda()
    if b is None:
        raise no_cuda("cuda.synchronize")
    b.synchronize(_device_index(device))


def current_device() -> int:
    """As ``torch.cuda.current_device()``: the current device's index; raises without CUDA."""
    b = _cuda()
    if b is None:
        raise no_cuda("cuda.current_device")
    return b.current_index()


def init() -> None:
    """As ``torch.cuda.init()``: loads the CUDA backend; raises without CUDA."""
    if _cuda() is None:
        raise no_cuda("cuda.init")


set_device = _needs_cuda("set_device", "(device)")
get_device_name = _needs_cuda("get_device_name", "(device=None)")
get_device_properties = _needs_cuda("get_device_properties", "(device)")
get_device_capability = _needs_cuda("get_device_capability", "(device=None)")
mem_get_info = _needs_cuda("mem_get_info", "(device=None)")
reset_peak_memory_stats = _needs_cuda("reset_peak_memory_stats", "(device=None)")
initial_seed = _needs_cuda("initial_seed", "()")
get_rng_state = _needs_cuda("get_rng_state", "(device='cuda')")
set_rng_state = _needs_cuda("set_rng_state", "(new_state, device='cuda')")
current_stream = _needs_cuda("current_stream", "(device=None)")
ipc_collect = _needs_cuda("ipc_collect", "()")


class device:
    """As ``torch.cuda.device(idx)``: a context manager selecting a CUDA device; entering it
    with a device index raises (PyTorch: "compiled without CUDA support"); ``None`` or a
    negative index is a no-op."""

    def __init__(self, device):
        if isinstance(device, (str, _device)):
            d = _device(device)
            if d.type != "cuda":
                raise ValueError(f"Expected a cuda device, but got: {d}")
            device = 0 if d.index is None else d.index
        self.idx = -1 if device is None else int(device)

    def __enter__(self):
        if self.idx >= 0:
            raise RuntimeError("cuda.device: PyTorch was compiled without CUDA support "
                               "(tapegrad has no CUDA backend yet)")

    def __exit__(self, *exc):
        return False


class device_of(device):
    """As ``torch.cuda.device_of(tensor)``: a no-op for cpu tensors."""

    def __init__(self, obj):
        super().__init__(obj.get_device() if obj.is_cuda else -1)


class Stream:
    """As ``torch.cuda.Stream``: cannot be created without CUDA."""

    def __init__(self, *args, **kwargs):
        raise RuntimeError("cuda.Stream requires CUDA support (tapegrad has no CUDA backend yet)")


class Event:
    """As ``torch.cuda.Event``: cannot be created without CUDA."""

    def __init__(self, *args, **kwargs):
        raise RuntimeError("cuda.Event requires CUDA support (tapegrad has no CUDA backend yet)")


# torch.cuda.FloatTensor & co: isinstance is False for cpu tensors; calling one raises
globals().update(_tensor_types("cuda"))
