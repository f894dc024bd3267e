"""Adagrad with learning-rate decay and an initial accumulator (``torch.optim.Adagrad``)."""
from tapegrad.backend import xp
from tapegrad.optim.optimizer import (Optimizer, addcdiv_, addcmul_, check_nonnegative,
                                      check_unsupported, scalar_dtype)


def adagrad(param, grad, state, group):
    """One Adagrad step on one parameter's arrays, as PyTorch's single-tensor ``adagrad``."""
    step_t = state["step"]
    step_t += 1
    step = float(step_t)
    if group["maximize"]:
        grad = -grad
    weight_decay = group["weight_decay"]
    if weight_decay != 0:
        grad = grad + weight_decay * param
    clr = group["lr"] / (1 + (step - 1) * group["lr_decay"])
    state_sum = state["sum"]
    addcmul_(state_sum, grad, grad, 1)
    std = xp.sqrt(state_sum)
    std += group["eps"]
    addcdiv_(param, grad, std, -clr)


class Adagrad(Optimizer):
    """As ``torch.optim.Adagrad(params, lr=1e-2, lr_decay=0, weight_decay=0,
    initial_accumulator_value=0, eps=1e-10, foreach=None, *, maximize=False)``.

    State is created for every parameter at construction, as in PyTorch; like PyTorch, the
    accumulator starts at the optimizer's ``initial_accumulator_value`` (a per-group value
    is ignored).

    >>> opt = tapegrad.optim.Adagrad(model.parameters(), lr=1e-2)
    """

    update = staticmethod(adagrad)
    elementwise = True

    def __init__(self, params, lr=1e-2, lr_decay=0, weight_decay=0, initial_accumulator_value=0,
                 eps=1e-10, foreach=None, *, maximize=False, differentiable=False, fused=None):
        check_nonnegative(lr=lr, lr_decay=lr_decay, weight_decay=weight_decay,
                          initial_accumulator_value=initial_accumulator_value, eps=eps)
        check_unsupported(differentiable, fused)
        defaults = dict(lr=lr, lr_decay=lr_decay, eps=eps, weight_decay=weight_decay,
                        initial_accumulator_value=initial_accumulator_value, foreach=foreach,
                        maximize=maximize, differentiable=differentiable, fused=fused)
        super().__init__(params, defaults)
        for group in self.param_groups:
            for p in group["params"]:
                self._state_arrays(p, group)

    def init_state(self, param, group):
        value = self.defaults["initial_accumulator_value"]
        return {"step": xp.zeros((), dtype=scalar_dtype()),
                "sum": xp.full_like(param, value)}
