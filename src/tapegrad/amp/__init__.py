"""``tapegrad.amp`` as ``torch.amp``: autocast (mixed precision) and GradScaler (loss scaling).

>>> with tapegrad.amp.autocast("cpu", dtype=tapegrad.bfloat16):
...     loss = loss_fn(model(x), y)
"""
from tapegrad.amp.autocast_mode import (autocast, custom_bwd, custom_fwd,  # noqa: F401
                                        is_autocast_available)
from tapegrad.amp.grad_scaler import GradScaler  # noqa: F401

__all__ = ["autocast", "custom_bwd", "custom_fwd", "is_autocast_available", "GradScaler"]
