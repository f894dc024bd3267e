"""Adam, with AMSGrad and (coupled or decoupled) weight decay (``torch.optim.Adam``)."""
from tapegrad.backend import xp
from tapegrad.optim.optimizer import (Optimizer, addcdiv_, addcmul_, check_betas,
                                      check_nonnegative, check_unsupported, lerp_,
                                      scalar_dtype)


def adam_moments_(param, grad, state, group):
    """The start of a step Adam, RAdam and NAdam share: negate ``grad`` if maximizing,
    count the step, apply weight decay (decoupled: ``param`` shrinks by ``lr * weight_decay``;
    coupled: added to the gradient), update the moments ``exp_avg``/``exp_avg_sq`` in place.
    Returns the step number (a float), the two moments and the gradient used."""
    beta1, beta2 = group["betas"]
    if group["maximize"]:
        grad = -grad
    step_t = state["step"]
    step_t += 1
    weight_decay = group["weight_decay"]
    if weight_decay != 0:
        if group["decoupled_weight_decay"]:
            param *= 1 - group["lr"] * weight_decay
        else:
            grad = grad + weight_decay * param
    exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
    lerp_(exp_avg, grad, 1 - beta1)
    exp_avg_sq *= beta2
    addcmul_(exp_avg_sq, grad, grad, 1 - beta2)
    return float(step_t), exp_avg, exp_avg_sq, grad


def adam(param, grad, state, group):
    """One Adam step on one parameter's arrays, as PyTorch's single-tensor ``adam``."""
    beta1, beta2 = group["betas"]
    lr = group["lr"]
    step, exp_avg, exp_avg_sq, _ = adam_moments_(param, grad, state, group)
    bias_correction1 = 1 - beta1**step
    bias_correction2 = 1 - beta2**step
    step_size = lr / bias_correction1
    bias_correction2_sqrt = bias_correction2**0.5
    if group["amsgrad"]:
        max_exp_avg_sq = state["max_exp_avg_sq"]
        xp.maximum(max_exp_avg_sq, exp_avg_sq, out=max_exp_avg_sq)
        denom = xp.sqrt(max_exp_avg_sq)
    else:
        denom = xp.sqrt(exp_avg_sq)
    denom /= bias_correction2_sqrt
    denom += group["eps"]
    addcdiv_(param, exp_avg, denom, -step_size)


def adam_state(param, group):
    state = {"step": xp.zeros((), dtype=scalar_dtype()), "exp_avg": xp.zeros_like(param),
             "exp_avg_sq": xp.zeros_like(param)}
    if group["amsgrad"]:
        state["max_exp_avg_sq"] = xp.zeros_like(param)
    return state


class Adam(Optimizer):
    """As ``torch.optim.Adam(params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0,
    amsgrad=False, *, foreach=None, maximize=False, decoupled_weight_decay=False)``.

    >>> opt = tapegrad.optim.Adam(model.parameters(), lr=1e-3)
    """

    update = staticmethod(adam)
    init_state = staticmethod(adam_state)
    elementwise = True

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0,
                 amsgrad=False, *, foreach=None, maximize=False, capturable=False,
                 differentiable=False, fused=None, decoupled_weight_decay=False):
        check_nonnegative(lr=lr, eps=eps)
        check_betas(betas)
        check_nonnegative(weight_decay=weight_decay)
        check_unsupported(differentiable, fused)
        defaults = dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay,
                        amsgrad=amsgrad, maximize=maximize, foreach=foreach,
                        capturable=capturable, differentiable=differentiable, fused=fused,
                        decoupled_weight_decay=decoupled_weight_decay)
        super().__init__(params, defaults)
