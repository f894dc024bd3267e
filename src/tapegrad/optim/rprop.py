"""Rprop: resilient backpropagation, sign-based per-element step sizes (``torch.optim.Rprop``)."""
from tapegrad.backend import xp
from tapegrad.optim.optimizer import (Optimizer, addcmul_, check_nonnegative,
                                      check_unsupported, scalar_dtype)


def rprop(param, grad, state, group):
    """One Rprop step on one parameter's arrays, as PyTorch's single-tensor ``rprop``."""
    etaminus, etaplus = group["etas"]
    step_size_min, step_size_max = group["step_sizes"]
    if group["maximize"]:
        grad = -grad
    prev, step_size = state["prev"], state["step_size"]
    step_t = state["step"]
    step_t += 1
    sign = xp.sign(grad * prev)
    sign = xp.where(sign > 0, etaplus, xp.where(sign < 0, etaminus,
                                                xp.where(sign == 0, 1, sign)))
    step_size *= sign.astype(step_size.dtype, copy=False)
    xp.clip(step_size, step_size_min, step_size_max, out=step_size)
    # where the gradient changed sign, skip this step and forget the gradient
    grad = xp.where(sign == etaminus, 0, grad).astype(grad.dtype, copy=False)
    addcmul_(param, xp.sign(grad), step_size, -1)
    prev[...] = grad


class Rprop(Optimizer):
    """As ``torch.optim.Rprop(params, lr=1e-2, etas=(0.5, 1.2), step_sizes=(1e-6, 50), *,
    capturable=False, foreach=None, maximize=False, differentiable=False)``.

    ``step_size`` starts at the group's ``lr`` when a parameter's state is created.

    >>> opt = tapegrad.optim.Rprop(model.parameters())
    """

    update = staticmethod(rprop)
    elementwise = True

    def __init__(self, params, lr=1e-2, etas=(0.5, 1.2), step_sizes=(1e-6, 50), *,
                 capturable=False, foreach=None, maximize=False, differentiable=False):
        check_nonnegative(lr=lr)
        if not 0.0 < etas[0] < 1.0 < etas[1]:
            raise ValueError(f"Invalid eta values: {etas[0]}, {etas[1]}")
        check_unsupported(differentiable)
        defaults = dict(lr=lr, etas=etas, step_sizes=step_sizes, foreach=foreach,
                        maximize=maximize, differentiable=differentiable,
                        capturable=capturable)
        super().__init__(params, defaults)

    def init_state(self, param, group):
        return {"step": xp.zeros((), dtype=scalar_dtype()), "prev": xp.zeros_like(param),
                "step_size": xp.full_like(param, group["lr"])}
