"""SGD with momentum, dampening, Nesterov momentum and weight decay (``torch.optim.SGD``)."""
from tapegrad.backend import xp
from tapegrad.optim.optimizer import Optimizer, check_unsupported


def sgd(param, grad, state, group):
    """One SGD step on one parameter's arrays, as PyTorch's single-tensor ``sgd``."""
    lr, momentum, weight_decay = group["lr"], group["momentum"], group["weight_decay"]
    if group["maximize"]:
        grad = -grad
    if weight_decay != 0:
        grad = grad + weight_decay * param
    if momentum != 0:
        buf = state.get("momentum_buffer")
        if buf is None:
            buf = state["momentum_buffer"] = xp.array(grad)  # an array even for a 0-d grad
        else:
            buf *= momentum
            buf += (1 - group["dampening"]) * grad
        grad = grad + momentum * buf if group["nesterov"] else buf
    param -= lr * grad


class SGD(Optimizer):
    """As ``torch.optim.SGD(params, lr=1e-3, momentum=0, dampening=0, weight_decay=0,
    nesterov=False, *, maximize=False, foreach=None)``.

    >>> opt = tapegrad.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    """

    update = staticmethod(sgd)
    elementwise = True
    _scalar_state = ()

    def __init__(self, params, lr=1e-3, momentum=0, dampening=0, weight_decay=0,
                 nesterov=False, *, maximize=False, foreach=None, differentiable=False,
                 fused=None):
        if lr < 0.0:
            raise ValueError(f"Invalid learning rate: {lr}")
        if momentum < 0.0:
            raise ValueError(f"Invalid momentum value: {momentum}")
        if weight_decay < 0.0:
            raise ValueError(f"Invalid weight_decay value: {weight_decay}")
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError("Nesterov momentum requires a momentum and zero dampening")
        check_unsupported(differentiable, fused)
        defaults = dict(lr=lr, momentum=momentum, dampening=dampening,
                        weight_decay=weight_decay, nesterov=nesterov, maximize=maximize,
                        foreach=foreach, differentiable=differentiable, fused=fused)
        super().__init__(params, defaults)

