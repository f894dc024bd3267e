"""Loss scaling (``torch.amp.GradScaler``): multiply the loss so that small float16
gradients do not flush to zero, unscale before the step, skip steps whose gradients hold
inf/NaN and adapt the scale (halve on overflow, double after ``growth_interval`` clean steps).

The arithmetic is PyTorch's CPU kernels': the scale is a float32 0-d tensor; the inverse
scale is ``float32(1 / float64(scale))``; gradients are multiplied in their op-math type
(float32 for float16/bfloat16/float32 gradients, float64 for float64); a gradient counts as
non-finite before it is unscaled; the new scale is ``float32(float64(scale) * factor)``.
"""
import warnings
from collections import defaultdict
from enum import Enum

from tapegrad import dtypes
from tapegrad.backend import xp

__all__ = ["OptState", "GradScaler"]


class OptState(Enum):
    READY = 0
    UNSCALED = 1
    STEPPED = 2


def _refresh_per_optimizer_state():
    return {"stage": OptState.READY, "found_inf_per_device": {}}


def _full(value, dtype):
    from tapegrad.creation import full

    return full((), value, dtype=dtype)


def _non_finite_check_and_unscale_(grads, found_inf, inv_scale):
    """PyTorch's ``_amp_foreach_non_finite_check_and_unscale_`` on CPU, in place."""
    inv = inv_scale._data[()]
    for g in grads:
        data = g._data
        if not xp.isfinite(data).all():
            found_inf._data[...] = 1.0
        if inv != 1.0:
            opmath = xp.float64 if data.dtype == xp.float64 else xp.float32
            data[...] = (data.astype(opmath) * opmath(inv)).astype(data.dtype)
        g._version[0] += 1


def _update_scale_(scale, growth_tracker, found_inf, growth_factor, backoff_factor,
                   growth_interval):
    """PyTorch's ``_amp_update_scale_`` on CPU, in place."""
    if found_inf._data[()]:
        scale._data[...] = xp.float32(float(scale._data[()]) * backoff_factor)
        growth_tracker._data[...] = 0
        return
    successful = int(growth_tracker._data[()]) + 1
    if successful == growth_interval:
        new_scale = xp.float32(float(scale._data[()]) * growth_factor)
        if xp.isfinite(new_scale):
            scale._data[...] = new_scale
        growth_tracker._data[...] = 0
    else:
        growth_tracker._data[...] = successful


class GradScaler:
    """As ``torch.amp.GradScaler(device="cuda", init_scale=2.**16, growth_factor=2.0,
    backoff_factor=0.5, growth_interval=2000, enabled=True)``.

    tapegrad has no CUDA: with ``device="cuda"`` (the default) an enabled scaler warns and
    disables itself, as PyTorch's CPU build does. Use ``GradScaler("cpu")``::

        scaler = tapegrad.amp.GradScaler("cpu")
        with tapegrad.autocast("cpu", dtype=tapegrad.float16):
            loss = loss_fn(model(x), y)
        scaler.scale(loss).backward()
        scaler.step(optimizer)      # skipped when a gradient is inf/NaN
        scaler.update()
    """

    def __init__(self, device: str = "cuda", init_scale: float = 2.0 ** 16,
                 growth_factor: float = 2.0, backoff_factor: float = 0.5,
                 growth_interval: int = 2000, enabled: bool = True) -> None:
        self._device = device
        self._enabled = enabled
        if device == "cuda":
            from tapegrad import cuda

            if enabled and not cuda.is_available():
                warnings.warn("torch.cuda.amp.GradScaler is enabled, but CUDA is not "
                              "available.  Disabling.", stacklevel=2)
                self._enabled = False
        if self._enabled:
            if growth_factor <= 1.0:
                raise AssertionError("The growth factor must be > 1.0.")
            if backoff_factor >= 1.0:
                raise AssertionError("The backoff factor must be < 1.0.")
            self._init_scale = init_scale
            self._scale = None
            self._growth_factor = growth_factor
            self._backoff_factor = backoff_factor
            self._growth_interval = growth_interval
            self._init_growth_tracker = 0
            self._growth_tracker = None
            self._per_optimizer_states = defaultdict(_refresh_per_optimizer_state)

    def _check_scale_growth_tracker(self, funcname):
        fix = ("This may indicate your script did not use scaler.scale(loss or outputs) "
               "earlier in the iteration.")
        if self._scale is None:
            raise AssertionError(f"Attempted {funcname} but _scale is None.  " + fix)
        if self._growth_tracker is None:
            raise AssertionError(f"Attempted {funcname} but _growth_tracker is None.  " + fix)
        return self._scale, self._growth_tracker

    def _lazy_init_scale_growth_tracker(self):
        self._scale = _full(self._init_scale, dtypes.float32)
        self._growth_tracker = _full(self._init_growth_tracker, dtypes.int32)

    def scale(self, outputs):
        """``outputs * scale`` for a Tensor, or each Tensor of a (nested) list/tuple/iterable."""
        from tapegrad.tensor import Tensor

        if not self._enabled:
            return outputs
        if self._scale is None:
            if not isinstance(outputs, Tensor) and not hasattr(outputs, "__iter__"):
                raise ValueError("outputs must be a Tensor or an iterable of Tensors")
            self._lazy_init_scale_growth_tracker()

        def apply_scale(val):
            if isinstance(val, Tensor):
                return val * self._scale
            if hasattr(val, "__iter__"):
                iterable = map(apply_scale, val)
                return type(val)(iterable) if isinstance(val, (list, tuple)) else iterable
            raise ValueError("outputs must be a Tensor or an iterable of Tensors")

        return apply_scale(outputs)

    def _unscale_grads_(self, optimizer, inv_scale, found_inf, allow_fp16):
        per_dtype = defaultdict(list)
        for group in optimizer.param_groups:
            for param in group["params"]:
                if param.grad is None:
                    continue
                if not allow_fp16 and param.grad.dtype is dtypes.float16:
                    raise ValueError("Attempting to unscale FP16 gradients.")
                per_dtype[param.grad.dtype].append(param.grad)
        for grads in per_dtype.values():
            _non_finite_check_and_unscale_(grads, found_inf, inv_scale)
        return {"cpu": found_inf} if per_dtype else {}

    def unscale_(self, optimizer) -> None:
        """Divide ``optimizer``'s gradients by the scale in place (once per ``update``), e.g.
        before clipping them; records whether any was inf/NaN."""
        if not self._enabled:
            return
        self._check_scale_growth_tracker("unscale_")
        optimizer_state = self._per_optimizer_states[id(optimizer)]
        if optimizer_state["stage"] is OptState.UNSCALED:
            raise RuntimeError("unscale_() has already been called on this optimizer since the "
                               "last update().")
        elif optimizer_state["stage"] is OptState.STEPPED:
            raise RuntimeError("unscale_() is being called after step().")
        inv_scale = _full(xp.float32(1.0 / xp.float64(self._scale._data[()])), dtypes.float32)
        found_inf = _full(0.0, dtypes.float32)
        optimizer_state["found_inf_per_device"] = self._unscale_grads_(optimizer, inv_scale,
                                                                       found_inf, False)
        optimizer_state["stage"] = OptState.UNSCALED

    def _maybe_opt_step(self, optimizer, optimizer_state, *args, **kwargs):
        if not sum(v.item() for v in optimizer_state["found_inf_per_device"].values()):
            return optimizer.step(*args, **kwargs)
        return None

    def step(self, optimizer, *args, **kwargs):
        """Unscale (unless ``unscale_`` ran), then ``optimizer.step()`` unless a gradient was
        inf/NaN; returns the step's return value (None when skipped)."""
        if not self._enabled:
            return optimizer.step(*args, **kwargs)
        if "closure" in kwargs:
            raise RuntimeError("Closure use is not currently supported if GradScaler is "
                               "enabled.")
        self._check_scale_growth_tracker("step")
        optimizer_state = self._per_optimizer_states[id(optimizer)]
        if optimizer_state["stage"] is OptState.STEPPED:
            raise RuntimeError("step() has already been called since the last update().")
        if optimizer_state["stage"] is OptState.READY:
            self.unscale_(optimizer)
        if len(optimizer_state["found_inf_per_device"]) == 0:
            raise AssertionError("No inf checks were recorded for this optimizer.")
        retval = self._maybe_opt_step(optimizer, optimizer_state, *args, **kwargs)
        optimizer_state["stage"] = OptState.STEPPED
        return retval

    def update(self, new_scale=None) -> None:
        """Back off on any inf/NaN seen since the last update, else grow after
        ``growth_interval`` clean steps; or set ``new_scale`` (a float or 1-element tensor)."""
        from tapegrad.tensor import Tensor

        if not self._enabled:
            return
        _scale, _growth_tracker = self._check_scale_growth_tracker("update")
        if new_scale is not None:
            if isinstance(new_scale, float):
                _scale._data[...] = new_scale
            else:
                reason = ("new_scale should be a float or a 1-element torch.cuda.FloatTensor or "
                          "torch.FloatTensor with requires_grad=False.")
                if (not isinstance(new_scale, Tensor) or new_scale.device.type != self._device
                        or new_scale.numel() != 1 or new_scale.requires_grad):
                    raise AssertionError(reason)
                _scale._data[...] = new_scale._data.reshape(())
        else:
            found_infs = [found_inf for state in self._per_optimizer_states.values()
                          for found_inf in state["found_inf_per_device"].values()]
            if len(found_infs) == 0:
                raise AssertionError("No inf checks were recorded prior to update.")
            found_inf_combined = _full(float(sum(f._data[()] for f in found_infs)),
                                       dtypes.float32)
            _update_scale_(_scale, _growth_tracker, found_inf_combined, self._growth_factor,
                           self._backoff_factor, self._growth_interval)
        self._per_optimizer_states = defaultdict(_refresh_per_optimizer_state)

    def get_scale(self) -> float:
        """The current scale (``init_scale`` before the first ``scale``; 1.0 if disabled)."""
        if self._enabled:
            return self._init_scale if self._scale is None else self._scale.item()
        return 1.0

    def get_growth_factor(self) -> float:
        return self._growth_factor

    def set_growth_factor(self, new_factor: float) -> None:
        self._growth_factor = new_factor

    def get_backoff_factor(self) -> float:
        return self._backoff_factor

    def set_backoff_factor(self, new_factor: float) -> None:
        self._backoff_factor = new_factor

    def get_growth_interval(self) -> int:
        return self._growth_interval

    def set_growth_interval(self, new_interval: int) -> None:
        self._growth_interval = new_interval

    def _get_growth_tracker(self) -> int:
        if self._enabled:
            return self._init_growth_tracker if self._growth_tracker is None else \
                self._growth_tracker.item()
        return 0

    def is_enabled(self) -> bool:
        return self._enabled

    def state_dict(self) -> dict:
        """As PyTorch's: scale, growth_factor, backoff_factor, growth_interval and
        _growth_tracker; ``{}`` when disabled."""
        if self._enabled:
            return {"scale": self.get_scale(), "growth_factor": self._growth_factor,
                    "backoff_factor": self._backoff_factor,
                    "growth_interval": self._growth_interval,
                    "_growth_tracker": self._get_growth_tracker()}
        return {}

    def load_state_dict(self, state_dict: dict) -> None:
        if not self._enabled:
            return
        if len(state_dict) == 0:
            raise RuntimeError("The source state dict is empty, possibly because it was saved "
                               "from a disabled instance of GradScaler.")
        self._init_scale = state_dict["scale"]
        if self._scale is not None:
            self._scale._data[...] = state_dict["scale"]
        self._growth_factor = state_dict["growth_factor"]
        self._backoff_factor = state_dict["backoff_factor"]
        self._growth_interval = state_dict["growth_interval"]
        self._init_growth_tracker = state_dict["_growth_tracker"]
        if self._growth_tracker is not None:
            self._growth_tracker._data[...] = state_dict["_growth_tracker"]

    def __getstate__(self):
        state = self.__dict__.copy()
        if self._enabled:
            if len(self._per_optimizer_states) != 0:
                raise AssertionError("A GradScaler instance may only be pickled at the "
                                     "beginning of an iteration, or at the end after "
                                     "scaler.update().")
            state["_init_scale"] = self.get_scale()
            state["_init_growth_tracker"] = self._get_growth_tracker()
            state["_scale"] = None
            state["_growth_tracker"] = None
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
