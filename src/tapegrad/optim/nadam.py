"""NAdam: Adam with Nesterov momentum and a momentum schedule (``torch.optim.NAdam``)."""
from tapegrad.backend import xp
from tapegrad.optim.adam import adam_moments_
from tapegrad.optim.optimizer import (Optimizer, addcdiv_, check_betas, check_nonnegative,
                                      check_unsupported, scalar_dtype)


def nadam(param, grad, state, group):
    """One NAdam step on one parameter's arrays, as PyTorch's single-tensor ``nadam``.

    ``mu_product`` is scalar state kept in the scalar dtype (float32 by default), as in
    PyTorch, so its rounding matches.
    """
    beta1, beta2 = group["betas"]
    lr, momentum_decay = group["lr"], group["momentum_decay"]
    step, exp_avg, exp_avg_sq, grad = adam_moments_(param, grad, state, group)
    bias_correction2 = 1 - beta2**step
    mu_product = state["mu_product"]
    mu = beta1 * (1.0 - 0.5 * (0.96 ** (step * momentum_decay)))
    mu_next = beta1 * (1.0 - 0.5 * (0.96 ** ((step + 1) * momentum_decay)))
    mu_product *= mu
    denom = xp.sqrt(exp_avg_sq / bias_correction2)
    mu_product = float(mu_product)
    mu_product_next = mu_product * mu_next
    denom += group["eps"]
    addcdiv_(param, grad, denom, -lr * (1.0 - mu) / (1.0 - mu_product))
    addcdiv_(param, exp_avg, denom, (-lr * mu_next) / (1.0 - mu_product_next))


def nadam_state(param, group):
    return {"step": xp.zeros((), dtype=scalar_dtype()),
            "mu_product": xp.ones((), dtype=scalar_dtype()),
            "exp_avg": xp.zeros_like(param), "exp_avg_sq": xp.zeros_like(param)}


class NAdam(Optimizer):
    """As ``torch.optim.NAdam(params, lr=2e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0,
    momentum_decay=4e-3, decoupled_weight_decay=False, *, foreach=None, maximize=False)``.

    >>> opt = tapegrad.optim.NAdam(model.parameters())
    """

    update = staticmethod(nadam)
    init_state = staticmethod(nadam_state)
    elementwise = True
    _scalar_state = ("step", "mu_product")

    def __init__(self, params, lr=2e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0,
                 momentum_decay=4e-3, decoupled_weight_decay=False, *, foreach=None,
                 maximize=False, capturable=False, differentiable=False):
        check_nonnegative(lr=lr, eps=eps)
        check_betas(betas)
        check_nonnegative(weight_decay=weight_decay, momentum_decay=momentum_decay)
        check_unsupported(differentiable)
        defaults = dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay,
                        momentum_decay=momentum_decay,
                        decoupled_weight_decay=decoupled_weight_decay, maximize=maximize,
                        foreach=foreach, capturable=capturable, differentiable=differentiable)
        super().__init__(params, defaults)
