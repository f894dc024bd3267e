"""Activation modules: ``ReLU``, ``LeakyReLU``, ``ELU``, ``GELU``, ``SiLU``, ``Softplus``,
``Tanh``, ``Sigmoid``, ``Softmax``, ``LogSoftmax`` (as in ``torch.nn``)."""
from tapegrad.nn import functional as F
from tapegrad.nn.module import Module

__all__ = ["ReLU", "LeakyReLU", "ELU", "GELU", "SiLU", "Softplus", "Tanh", "Sigmoid", "Softmax",
           "LogSoftmax"]


class ReLU(Module):
    """As ``torch.nn.ReLU(inplace=False)``: ``max(0, x)``."""

    def __init__(self, inplace: bool = False):
        super().__init__()
        self.inplace = inplace

    def forward(self, input):
        return F.relu(input, inplace=self.inplace)

    def extra_repr(self) -> str:
        return "inplace=True" if self.inplace else ""


class LeakyReLU(Module):
    """As ``torch.nn.LeakyReLU(negative_slope=0.01, inplace=False)``."""

    def __init__(self, negative_slope: float = 1e-2, inplace: bool = False):
        super().__init__()
        self.negative_slope = negative_slope
        self.inplace = inplace

    def forward(self, input):
        return F.leaky_relu(input, self.negative_slope, self.inplace)

    def extra_repr(self) -> str:
        return f"negative_slope={self.negative_slope}" + (", inplace=True" if self.inplace else "")


class ELU(Module):
    """As ``torch.nn.ELU(alpha=1.0, inplace=False)``: ``x`` if ``x > 0`` else
    ``alpha * (exp(x) - 1)``."""

    def __init__(self, alpha: float = 1.0, inplace: bool = False):
        super().__init__()
        self.alpha = alpha
        self.inplace = inplace

    def forward(self, input):
        return F.elu(input, self.alpha, self.inplace)

    def extra_repr(self) -> str:
        return f"alpha={self.alpha}" + (", inplace=True" if self.inplace else "")


class GELU(Module):
    """As ``torch.nn.GELU(approximate='none')``; ``approximate='tanh'`` for the tanh form."""

    def __init__(self, approximate: str = "none"):
        super().__init__()
        self.approximate = approximate

    def forward(self, input):
        return F.gelu(input, approximate=self.approximate)

    def extra_repr(self) -> str:
        return f"approximate={self.approximate!r}"


class SiLU(Module):
    """As ``torch.nn.SiLU(inplace=False)``: ``x * sigmoid(x)``."""

    def __init__(self, inplace: bool = False):
        super().__init__()
        self.inplace = inplace

    def forward(self, input):
        return F.silu(input, inplace=self.inplace)

    def extra_repr(self) -> str:
        return "inplace=True" if self.inplace else ""


class Softplus(Module):
    """As ``torch.nn.Softplus(beta=1.0, threshold=20.0)``: ``log(1 + exp(beta x)) / beta``,
    linear above ``threshold``."""

    def __init__(self, beta: float = 1.0, threshold: float = 20.0):
        super().__init__()
        self.beta = beta
        self.threshold = threshold

    def forward(self, input):
        return F.softplus(input, self.beta, self.threshold)

    def extra_repr(self) -> str:
        return f"beta={self.beta}, threshold={self.threshold}"


class Tanh(Module):
    """As ``torch.nn.Tanh()``."""

    def forward(self, input):
        return input.tanh()


class Sigmoid(Module):
    """As ``torch.nn.Sigmoid()``."""

    def forward(self, input):
        return input.sigmoid()


class Softmax(Module):
    """As ``torch.nn.Softmax(dim=None)``: normalise ``exp(x)`` along ``dim``."""

    def __init__(self, dim=None):
        super().__init__()
        self.dim = dim

    def forward(self, input):
        return F.softmax(input, self.dim)

    def extra_repr(self) -> str:
        return f"dim={self.dim}"


class LogSoftmax(Module):
    """As ``torch.nn.LogSoftmax(dim=None)``: ``log(softmax(x))``, computed stably."""

    def __init__(self, dim=None):
        super().__init__()
        self.dim = dim

    def forward(self, input):
        return F.log_softmax(input, self.dim)

    def extra_repr(self) -> str:
        return f"dim={self.dim}"
