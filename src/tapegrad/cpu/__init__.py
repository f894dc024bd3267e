"""``tapegrad.cpu`` as ``torch.cpu``: the CPU device module (its ``amp`` namespace)."""
from tapegrad.cpu import amp  # noqa: F401


def is_available() -> bool:
    """As ``torch.cpu.is_available()``: True."""
    return True


def device_count() -> int:
    """As ``torch.cpu.device_count()``: 1."""
    return 1


def current_device() -> str:
    """As ``torch.cpu.current_device()``: ``"cpu"``."""
    return "cpu"


def synchronize(device=None) -> None:
    """As ``torch.cpu.synchronize()``: CPU work is synchronous."""
