"""ASGD: averaged stochastic gradient descent (``torch.optim.ASGD``)."""
from tapegrad.backend import xp
from tapegrad.optim.optimizer import (Optimizer, check_nonnegative, check_unsupported,
                                      scalar_dtype)


def asgd(param, grad, state, group):
    """One ASGD step on one parameter's arrays, as PyTorch's single-tensor ``asgd``.

    ``eta`` and ``mu`` are scalar state in the scalar dtype (float32 by default), as in
    PyTorch, so their rounding matches.
    """
    lr, lambd, alpha, t0 = group["lr"], group["lambd"], group["alpha"], group["t0"]
    if group["maximize"]:
        grad = -grad
    step_t, eta, mu, ax = state["step"], state["eta"], state["mu"], state["ax"]
    step_t += 1
    weight_decay = group["weight_decay"]
    if weight_decay != 0:
        grad = grad + weight_decay * param
    eta_value = float(eta)
    param *= 1 - lambd * eta_value
    param += -eta_value * grad
    mu_value = float(mu)
    if mu_value != 1:
        diff = param - ax
        diff *= mu_value
        ax += diff
    else:
        ax[...] = param
    step = float(step_t)
    # PyTorch makes the new values tensors of the default dtype before copying them in, so
    # they round through the scalar dtype even where the state was cast to the parameter's
    eta[...] = xp.asarray(lr / ((1 + lambd * lr * step) ** alpha), dtype=scalar_dtype())
    mu[...] = xp.asarray(1 / max(1, step - t0), dtype=scalar_dtype())


def asgd_state(param, group):
    return {"step": xp.zeros((), dtype=scalar_dtype()),
            "eta": xp.asarray(group["lr"], dtype=scalar_dtype()),
            "mu": xp.ones((), dtype=scalar_dtype()), "ax": xp.zeros_like(param)}


class ASGD(Optimizer):
    """As ``torch.optim.ASGD(params, lr=1e-2, lambd=1e-4, alpha=0.75, t0=1e6, weight_decay=0,
    foreach=None, maximize=False, differentiable=False, capturable=False)``.

    The averaged parameters are ``optimizer.state[p]["ax"]``.

    >>> opt = tapegrad.optim.ASGD(model.parameters(), lr=1e-2, t0=100)
    """

    update = staticmethod(asgd)
    init_state = staticmethod(asgd_state)
    elementwise = True
    _scalar_state = ("step", "eta", "mu")

    def __init__(self, params, lr=1e-2, lambd=1e-4, alpha=0.75, t0=1e6, weight_decay=0,
                 foreach=None, maximize=False, differentiable=False, capturable=False):
        check_nonnegative(lr=lr, weight_decay=weight_decay)
        check_unsupported(differentiable)
        defaults = dict(lr=lr, lambd=lambd, alpha=alpha, t0=t0, weight_decay=weight_decay,
                        foreach=foreach, maximize=maximize, differentiable=differentiable,
                        capturable=capturable)
        super().__init__(params, defaults)
