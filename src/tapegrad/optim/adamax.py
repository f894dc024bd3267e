"""Adamax: Adam with the infinity norm (``torch.optim.Adamax``)."""
from tapegrad.backend import xp
from tapegrad.optim.optimizer import (Optimizer, addcdiv_, check_betas, check_nonnegative,
                                      check_unsupported, lerp_, scalar_dtype)


def adamax(param, grad, state, group):
    """One Adamax step on one parameter's arrays, as PyTorch's single-tensor ``adamax``."""
    beta1, beta2 = group["betas"]
    if group["maximize"]:
        grad = -grad
    step_t = state["step"]
    step_t += 1
    weight_decay = group["weight_decay"]
    if weight_decay != 0:
        grad = grad + weight_decay * param
    exp_avg, exp_inf = state["exp_avg"], state["exp_inf"]
    lerp_(exp_avg, grad, 1 - beta1)
    exp_inf *= beta2
    norm = xp.abs(grad)
    norm += group["eps"]
    xp.maximum(exp_inf, norm, out=exp_inf)
    clr = group["lr"] / (1 - beta1 ** float(step_t))
    addcdiv_(param, exp_avg, exp_inf, -clr)


def adamax_state(param, group):
    return {"step": xp.zeros((), dtype=scalar_dtype()), "exp_avg": xp.zeros_like(param),
            "exp_inf": xp.zeros_like(param)}


class Adamax(Optimizer):
    """As ``torch.optim.Adamax(params, lr=2e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0,
    foreach=None, *, maximize=False)``.

    >>> opt = tapegrad.optim.Adamax(model.parameters())
    """

    update = staticmethod(adamax)
    init_state = staticmethod(adamax_state)
    elementwise = True

    def __init__(self, params, lr=2e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0,
                 foreach=None, *, maximize=False, differentiable=False, capturable=False):
        check_nonnegative(lr=lr, eps=eps)
        check_betas(betas)
        check_nonnegative(weight_decay=weight_decay)
        check_unsupported(differentiable)
        defaults = dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay,
                        foreach=foreach, maximize=maximize, differentiable=differentiable,
                        capturable=capturable)
        super().__init__(params, defaults)
