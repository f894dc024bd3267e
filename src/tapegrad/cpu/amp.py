"""``tapegrad.cpu.amp`` as ``torch.cpu.amp``: deprecated spellings of ``tapegrad.amp``'s
autocast and GradScaler for ``device_type="cpu"`` (FutureWarning, as in PyTorch)."""
import warnings

from tapegrad import dtypes
from tapegrad.amp import autocast_mode as _autocast_mode, grad_scaler as _grad_scaler

__all__ = ["autocast", "GradScaler"]


class autocast(_autocast_mode.autocast):
    """As ``torch.cpu.amp.autocast(enabled=True, dtype=bfloat16, cache_enabled=True)``:
    deprecated; ``tapegrad.amp.autocast("cpu", ...)``."""

    def __init__(self, enabled: bool = True, dtype=dtypes.bfloat16, cache_enabled: bool = True):
        warnings.warn("`torch.cpu.amp.autocast(args...)` is deprecated. Please use "
                      "`torch.amp.autocast('cpu', args...)` instead.", FutureWarning,
                      stacklevel=2)
        super().__init__("cpu", enabled=enabled, dtype=dtype, cache_enabled=cache_enabled)


class GradScaler(_grad_scaler.GradScaler):
    """As ``torch.cpu.amp.GradScaler(...)``: deprecated; ``tapegrad.amp.GradScaler("cpu",
    ...)``."""

    def __init__(self, init_scale: float = 2.0 ** 16, growth_factor: float = 2.0,
                 backoff_factor: float = 0.5, growth_interval: int = 2000,
                 enabled: bool = True) -> None:
        warnings.warn("`torch.cpu.amp.GradScaler(args...)` is deprecated. Please use "
                      "`torch.amp.GradScaler('cpu', args...)` instead.", FutureWarning,
                      stacklevel=2)
        super().__init__("cpu", init_scale=init_scale, growth_factor=growth_factor,
                         backoff_factor=backoff_factor, growth_interval=growth_interval,
                         enabled=enabled)
