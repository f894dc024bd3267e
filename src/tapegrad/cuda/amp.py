"""``tapegrad.cuda.amp`` as ``torch.cuda.amp`` on PyTorch's CPU-only build: deprecated
spellings (FutureWarning) of ``tapegrad.amp`` for ``"cuda"``. Without CUDA an enabled
autocast or GradScaler warns and disables itself, as PyTorch's CPU build does."""
import functools
import warnings

from tapegrad import dtypes
from tapegrad.amp import autocast_mode as _autocast_mode, grad_scaler as _grad_scaler

__all__ = ["amp_definitely_not_available", "autocast", "custom_bwd", "custom_fwd", "GradScaler"]


def amp_definitely_not_available() -> bool:
    """As ``torch.cuda.amp.amp_definitely_not_available()``: True without CUDA."""
    from tapegrad import cuda

    return not cuda.is_available()


class autocast(_autocast_mode.autocast):
    """As ``torch.cuda.amp.autocast(enabled=True, dtype=float16, cache_enabled=True)``:
    deprecated; ``tapegrad.amp.autocast("cuda", ...)``."""

    def __init__(self, enabled: bool = True, dtype=dtypes.float16, cache_enabled: bool = True):
        warnings.warn("`torch.cuda.amp.autocast(args...)` is deprecated. Please use "
                      "`torch.amp.autocast('cuda', args...)` instead.", FutureWarning,
                      stacklevel=2)
        super().__init__("cuda", enabled=enabled, dtype=dtype, cache_enabled=cache_enabled)


class GradScaler(_grad_scaler.GradScaler):
    """As ``torch.cuda.amp.GradScaler(...)``: deprecated; ``tapegrad.amp.GradScaler("cuda",
    ...)``, which disables itself (with a warning) when enabled without CUDA."""

    def __init__(self, init_scale: float = 2.0 ** 16, growth_factor: float = 2.0,
                 backoff_factor: float = 0.5, growth_interval: int = 2000,
                 enabled: bool = True) -> None:
        warnings.warn("`torch.cuda.amp.GradScaler(args...)` is deprecated. Please use "
                      "`torch.amp.GradScaler('cuda', args...)` instead.", FutureWarning,
                      stacklevel=2)
        super().__init__("cuda", init_scale=init_scale, growth_factor=growth_factor,
                         backoff_factor=backoff_factor, growth_interval=growth_interval,
                         enabled=enabled)


def custom_fwd(fwd=None, *, cast_inputs=None):
    """As ``torch.cuda.amp.custom_fwd``: deprecated; ``amp.custom_fwd(device_type="cuda")``."""
    warnings.warn("`torch.cuda.amp.custom_fwd(args...)` is deprecated. Please use "
                  "`torch.amp.custom_fwd(args..., device_type='cuda')` instead.", FutureWarning,
                  stacklevel=2)
    return _autocast_mode.custom_fwd(fwd, device_type="cuda", cast_inputs=cast_inputs)


def custom_bwd(bwd):
    """As ``torch.cuda.amp.custom_bwd``: deprecated; ``amp.custom_bwd(device_type="cuda")``."""
    warnings.warn("`torch.cuda.amp.custom_bwd(args...)` is deprecated. Please use "
                  "`torch.amp.custom_bwd(args..., device_type='cuda')` instead.", FutureWarning,
                  stacklevel=2)
    return functools.wraps(bwd)(_autocast_mode.custom_bwd(bwd, device_type="cuda"))
