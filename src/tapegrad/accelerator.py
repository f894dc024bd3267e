"""``tapegrad.accelerator`` as ``torch.accelerator`` on a machine without an accelerator.

>>> device = tapegrad.accelerator.current_accelerator() or tapegrad.device("cpu")
"""
from tapegrad import cuda as _cuda


def is_available() -> bool:
    """As ``torch.accelerator.is_available()``: whether an accelerator (CUDA) can be used."""
    return _cuda.is_available()


def device_count() -> int:
    """As ``torch.accelerator.device_count()``: 0 without an accelerator."""
    return _cuda.device_count()


def current_accelerator(check_available: bool = False):
    """As ``torch.accelerator.current_accelerator()``: the accelerator's device type as a
    ``tapegrad.device``, or None (always None for now: tapegrad has no CUDA backend)."""
    return None


def _no_accelerator(name):
    def f(*args, **kwargs):
        raise RuntimeError(f"accelerator.{name}: Cannot access accelerator device when none is "
                           "available.")

    f.__name__ = f.__qualname__ = name
    f.__doc__ = f"As ``torch.accelerator.{name}``: raises without an accelerator."
    return f


current_device_index = _no_accelerator("current_device_index")
current_device_idx = current_device_index
set_device_index = _no_accelerator("set_device_index")
set_device_idx = set_device_index
synchronize = _no_accelerator("synchronize")
