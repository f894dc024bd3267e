"""RAdam: Adam with the variance rectification term (``torch.optim.RAdam``)."""
from tapegrad.backend import xp
from tapegrad.optim.adam import adam_moments_
from tapegrad.optim.optimizer import (Optimizer, check_betas, check_nonnegative,
                                      check_unsupported, scalar_dtype)


def radam(param, grad, state, group):
    """One RAdam step on one parameter's arrays, as PyTorch's single-tensor ``radam``."""
    beta1, beta2 = group["betas"]
    lr = group["lr"]
    step, exp_avg, exp_avg_sq, _ = adam_moments_(param, grad, state, group)
    bias_correction1 = 1 - beta1**step
    bias_correction2 = 1 - beta2**step
    update = exp_avg / bias_correction1
    rho_inf = 2 / (1 - beta2) - 1
    rho_t = rho_inf - 2 * step * (beta2**step) / bias_correction2
    update *= lr
    if rho_t > 5.0:
        adaptive_lr = xp.sqrt(exp_avg_sq)
        adaptive_lr += group["eps"]
        # PyTorch's ``number / tensor`` is ``tensor.reciprocal() * number``
        adaptive_lr = xp.reciprocal(adaptive_lr) * bias_correction2**0.5
        rect = ((rho_t - 4) * (rho_t - 2) * rho_inf
                / ((rho_inf - 4) * (rho_inf - 2) * rho_t)) ** 0.5
        update *= adaptive_lr
        update *= rect
    param -= update


def radam_state(param, group):
    return {"step": xp.zeros((), dtype=scalar_dtype()), "exp_avg": xp.zeros_like(param),
            "exp_avg_sq": xp.zeros_like(param)}


class RAdam(Optimizer):
    """As ``torch.optim.RAdam(params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0,
    decoupled_weight_decay=False, *, foreach=None, maximize=False)``.

    >>> opt = tapegrad.optim.RAdam(model.parameters())
    """

    update = staticmethod(radam)
    init_state = staticmethod(radam_state)
    elementwise = True

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0,
                 decoupled_weight_decay=False, *, foreach=None, maximize=False,
                 capturable=False, differentiable=False):
        check_nonnegative(lr=lr, eps=eps)
        check_betas(betas)
        check_nonnegative(weight_decay=weight_decay)
        check_unsupported(differentiable)
        defaults = dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay,
                        maximize=maximize, foreach=foreach, capturable=capturable,
                        decoupled_weight_decay=decoupled_weight_decay,
                        differentiable=differentiable)
        super().__init__(params, defaults)
