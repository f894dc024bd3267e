"""As ``torch.autograd.forward_ad``: dual tensors for forward-mode differentiation.

    with forward_ad.dual_level():
        x = forward_ad.make_dual(primal, tangent)
        y = f(x)
        jvp = forward_ad.unpack_dual(y).tangent

Each level is a ``tapegrad.func._forward.ForwardLevel`` (a DispatchMode): ops on duals
inside it compute tangents with the ops' JVP rules (true forward mode, one pass).
"""
from collections import namedtuple

from tapegrad.autograd.grad_mode import state as grad_state
from tapegrad.func._forward import ForwardLevel

UnpackedDualTensor = namedtuple("UnpackedDualTensor", ["primal", "tangent"])


def _levels():
    return [m for m in grad_state.modes if isinstance(m, ForwardLevel)]


class dual_level(ForwardLevel):
    """As ``torch.autograd.forward_ad.dual_level``: a context holding one forward-AD level.

    >>> with dual_level():
    ...     y = make_dual(x, v) * 2
    """

    def __enter__(self):
        if any(type(m) is dual_level for m in grad_state.modes):
            raise RuntimeError("dual_level: nested forward AD levels are not supported (as in "
                               "PyTorch); use tapegrad.func.jvp to nest forward mode")
        return super().__enter__()

    def __exit__(self, *exc):
        super().__exit__(*exc)
        self.tangents.clear()
        return False


def _level(level, name):
    if level is not None:
        return level
    levels = _levels()
    if not levels:
        raise RuntimeError(f"{name}: this function can only be called inside a forward AD "
                           "level (with forward_ad.dual_level())")
    return levels[-1]


def make_dual(tensor, tangent, *, level=None):
    """As ``forward_ad.make_dual``: a view of ``tensor`` carrying ``tangent`` at ``level``."""
    from tapegrad.ops.registry import REGISTRY

    lv = _level(level, "make_dual")
    if not tensor.is_floating_point():
        raise ValueError(f"make_dual: expected a floating point primal, got {tensor.dtype}")
    if tuple(tangent.shape) != tuple(tensor.shape):
        raise RuntimeError(f"make_dual: trying to set a forward gradient that has a different "
                           f"size than that of the original Tensor, this is not supported. "
                           f"Tensor is of size {list(tensor.shape)} while the given forward "
                           f"gradient is of size {list(tangent.shape)}.")
    if tangent.dtype != tensor.dtype:
        raise RuntimeError(f"make_dual: expected the tangent to have dtype {tensor.dtype}, "
                           f"got {tangent.dtype}")
    dual = lv.below(REGISTRY["alias"], tensor)
    lv.set_tangent(dual, tangent)
    return dual


def unpack_dual(tensor, *, level=None):
    """As ``forward_ad.unpack_dual``: ``(primal, tangent)``; the primal is a view of
    ``tensor`` without a tangent, the tangent None where ``tensor`` has none."""
    from tapegrad.ops.registry import REGISTRY

    lv = _level(level, "unpack_dual")
    tangent = lv.tangent(tensor)
    if tangent is None:
        return UnpackedDualTensor(tensor, None)
    return UnpackedDualTensor(lv.below(REGISTRY["alias"], tensor), tangent)


def enter_dual_level():
    """As ``forward_ad.enter_dual_level``: enter a new level; returns it."""
    return dual_level().__enter__()


def exit_dual_level(*, level=None):
    """As ``forward_ad.exit_dual_level``."""
    _level(level, "exit_dual_level").__exit__(None, None, None)


__all__ = ["dual_level", "make_dual", "unpack_dual", "UnpackedDualTensor",
           "enter_dual_level", "exit_dual_level"]
