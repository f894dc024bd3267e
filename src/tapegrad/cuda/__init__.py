"""``tapegrad.cuda`` as ``torch.cuda`` on PyTorch's CPU-only build: no CUDA device exists.

The queries answer as PyTorch's CPU build does (``is_available()`` False, ``device_count()``
0, memory counters 0); seeding is a no-op (PyTorch queues CUDA seeds until CUDA initialises,
which never happens here); calls that need a device (``synchronize``, ``current_device``,
``get_device_name`` ...) raise ``AssertionError: Torch not compiled with CUDA enabled`` as
PyTorch does. A GPU backend replaces these answers here and adds ``"cuda"`` to
``tapegrad.backend.device.SUPPORTED``.

>>> device = "cuda" if tapegrad.cuda.is_available() else "cpu"
"""
import collections

from tapegrad.backend.device import device as _device, no_cuda
from tapegrad.tensor import tensor_types as _tensor_types


def is_available() -> bool:
    """As ``torch.cuda.is_available()``: False (tapegrad has no CUDA backend yet)."""
    return False


def is_initialized() -> bool:
    """As ``torch.cuda.is_initialized()``: False."""
    return False


def device_count() -> int:
    """As ``torch.cuda.device_count()``: 0."""
    return 0


def is_bf16_supported(including_emulation: bool = True) -> bool:
    """As ``torch.cuda.is_bf16_supported()`` without CUDA: False."""
    return False


def get_arch_list() -> list:
    """As ``torch.cuda.get_arch_list()`` without CUDA: []."""
    return []


# --- seeding: PyTorch queues these until CUDA initialises, which never happens here -------
def manual_seed(seed) -> None:
    """As ``torch.cuda.manual_seed(seed)``: a no-op without CUDA (PyTorch's lazy seeding).

    ``tapegrad.manual_seed`` seeds tapegrad's own generator."""
    int(seed)


def manual_seed_all(seed) -> None:
    """As ``torch.cuda.manual_seed_all(seed)``: a no-op without CUDA."""
    int(seed)


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
    """As ``torch.cuda.empty_cache()``: nothing is cached without CUDA."""


def memory_allocated(device=None) -> int:
    """As ``torch.cuda.memory_allocated()``: 0 without CUDA."""
    return 0


def max_memory_allocated(device=None) -> int:
    """As ``torch.cuda.max_memory_allocated()``: 0 without CUDA."""
    return 0


def memory_reserved(device=None) -> int:
    """As ``torch.cuda.memory_reserved()``: 0 without CUDA."""
    return 0


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


init = _needs_cuda("init", "()")
synchronize = _needs_cuda("synchronize", "(device=None)")
current_device = _needs_cuda("current_device", "()")
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
