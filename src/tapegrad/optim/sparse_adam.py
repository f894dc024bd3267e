"""SparseAdam (``torch.optim.SparseAdam``): tapegrad has no sparse gradients.

PyTorch's SparseAdam only steps parameters whose ``.grad`` is a sparse tensor (from
``nn.Embedding(sparse=True)``) and raises for a dense one. Every tapegrad gradient is dense,
so the constructor validates its arguments as PyTorch's does and ``step`` raises PyTorch's
error for a dense gradient, naming the replacement.
"""
from tapegrad.autograd.grad_mode import enable_grad
from tapegrad.optim.optimizer import Optimizer, check_betas


class SparseAdam(Optimizer):
    """As ``torch.optim.SparseAdam(params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8,
    maximize=False)``; ``step`` raises: tapegrad's gradients are never sparse (use Adam)."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, maximize=False):
        if not 0.0 < lr:
            raise ValueError(f"Invalid learning rate: {lr}")
        if not 0.0 < eps:
            raise ValueError(f"Invalid epsilon value: {eps}")
        check_betas(betas)
        defaults = dict(lr=lr, betas=betas, eps=eps, maximize=maximize)
        super().__init__(params, defaults)

    def step(self, closure=None):
        loss = None
        if closure is not None:
            with enable_grad():
                loss = closure()
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    raise RuntimeError(
                        "SparseAdam does not support dense gradients, please consider Adam "
                        "instead (tapegrad has no sparse gradients: nn.Embedding(sparse=True) "
                        f"is not supported; got a dense gradient of shape {tuple(p.shape)})")
        return loss  # no parameter has a gradient: nothing to update
