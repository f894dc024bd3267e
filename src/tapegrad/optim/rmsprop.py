"""RMSprop, plain or centered, with momentum and weight decay (``torch.optim.RMSprop``)."""
from tapegrad.backend import xp
from tapegrad.optim.optimizer import (Optimizer, addcdiv_, addcmul_, check_nonnegative,
                                      check_unsupported, lerp_, scalar_dtype)


def rmsprop(param, grad, state, group):
    """One RMSprop step on one parameter's arrays, as PyTorch's single-tensor ``rmsprop``."""
    lr, alpha, weight_decay, momentum = (group["lr"], group["alpha"], group["weight_decay"],
                                         group["momentum"])
    if group["maximize"]:
        grad = -grad
    step = state["step"]
    step += 1
    if weight_decay != 0:
        grad = grad + weight_decay * param
    square_avg = state["square_avg"]
    square_avg *= alpha
    addcmul_(square_avg, grad, grad, 1 - alpha)
    if group["centered"]:
        grad_avg = state["grad_avg"]
        lerp_(grad_avg, grad, 1 - alpha)
        avg = square_avg.copy()
        addcmul_(avg, grad_avg, grad_avg, -1)
        xp.sqrt(avg, out=avg)
    else:
        avg = xp.sqrt(square_avg)
    avg += group["eps"]
    if momentum > 0:
        buf = state["momentum_buffer"]
        buf *= momentum
        addcdiv_(buf, grad, avg)
        param -= lr * buf
    else:
        addcdiv_(param, grad, avg, -lr)


def rmsprop_state(param, group):
    state = {"step": xp.zeros((), dtype=scalar_dtype()), "square_avg": xp.zeros_like(param)}
    if group["momentum"] > 0:
        state["momentum_buffer"] = xp.zeros_like(param)
    if group["centered"]:
        state["grad_avg"] = xp.zeros_like(param)
    return state


class RMSprop(Optimizer):
    """As ``torch.optim.RMSprop(params, lr=1e-2, alpha=0.99, eps=1e-8, weight_decay=0,
    momentum=0, centered=False, capturable=False, foreach=None, maximize=False)``.

    >>> opt = tapegrad.optim.RMSprop(model.parameters(), lr=1e-2, centered=True)
    """

    update = staticmethod(rmsprop)
    init_state = staticmethod(rmsprop_state)
    elementwise = True

    def __init__(self, params, lr=1e-2, alpha=0.99, eps=1e-8, weight_decay=0, momentum=0,
                 centered=False, capturable=False, foreach=None, maximize=False,
                 differentiable=False):
        check_nonnegative(lr=lr, eps=eps, momentum=momentum, weight_decay=weight_decay,
                          alpha=alpha)
        check_unsupported(differentiable)
        defaults = dict(lr=lr, momentum=momentum, alpha=alpha, eps=eps, centered=centered,
                        weight_decay=weight_decay, capturable=capturable, foreach=foreach,
                        maximize=maximize, differentiable=differentiable)
        super().__init__(params, defaults)
