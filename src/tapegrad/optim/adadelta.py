"""Adadelta: per-element step sizes from running averages (``torch.optim.Adadelta``)."""
from tapegrad.backend import xp
from tapegrad.optim.optimizer import (Optimizer, addcmul_, check_nonnegative,
                                      check_unsupported, scalar_dtype)


def adadelta(param, grad, state, group):
    """One Adadelta step on one parameter's arrays, as PyTorch's single-tensor ``adadelta``."""
    lr, rho, eps = group["lr"], group["rho"], group["eps"]
    step_t = state["step"]
    step_t += 1
    if group["maximize"]:
        grad = -grad
    weight_decay = group["weight_decay"]
    if weight_decay != 0:
        grad = grad + weight_decay * param
    square_avg, acc_delta = state["square_avg"], state["acc_delta"]
    square_avg *= rho
    addcmul_(square_avg, grad, grad, 1 - rho)
    std = xp.sqrt(square_avg + eps)
    delta = xp.sqrt(acc_delta + eps)
    delta /= std
    delta *= grad
    acc_delta *= rho
    addcmul_(acc_delta, delta, delta, 1 - rho)
    param += -lr * delta


def adadelta_state(param, group):
    return {"step": xp.zeros((), dtype=scalar_dtype()), "square_avg": xp.zeros_like(param),
            "acc_delta": xp.zeros_like(param)}


class Adadelta(Optimizer):
    """As ``torch.optim.Adadelta(params, lr=1.0, rho=0.9, eps=1e-6, weight_decay=0,
    foreach=None, *, capturable=False, maximize=False, differentiable=False)``.

    >>> opt = tapegrad.optim.Adadelta(model.parameters())
    """

    update = staticmethod(adadelta)
    init_state = staticmethod(adadelta_state)
    elementwise = True

    def __init__(self, params, lr=1.0, rho=0.9, eps=1e-6, weight_decay=0, foreach=None, *,
                 capturable=False, maximize=False, differentiable=False):
        check_nonnegative(lr=lr)
        if not 0.0 <= rho <= 1.0:
            raise ValueError(f"Invalid rho value: {rho}")
        check_nonnegative(eps=eps, weight_decay=weight_decay)
        check_unsupported(differentiable)
        defaults = dict(lr=lr, rho=rho, eps=eps, weight_decay=weight_decay, maximize=maximize,
                        capturable=capturable, foreach=foreach, differentiable=differentiable)
        super().__init__(params, defaults)
