"""``Identity``, ``Linear``, ``Bilinear`` (as in ``torch.nn``)."""
import math

from tapegrad.nn import functional as F
from tapegrad.nn import init
from tapegrad.nn.module import Module
from tapegrad.nn.layers._utils import kaiming_reset_, weight_and_bias

__all__ = ["Identity", "Linear", "Bilinear"]


class Identity(Module):
    """As ``torch.nn.Identity``: returns its input; constructor arguments are ignored."""

    def __init__(self, *args, **kwargs):
        super().__init__()

    def forward(self, input):
        return input


class Linear(Module):
    """As ``torch.nn.Linear(in_features, out_features, bias=True)``: ``y = x W^T + b``.

    ``weight`` is (out_features, in_features); both start as U(-1/sqrt(in), 1/sqrt(in)).
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True, device=None,
                 dtype=None):
        super().__init__()
        self.in_features = in_features
        self.out_features = out_features
        weight_and_bias(self, (out_features, in_features), (out_features,), bias, device, dtype)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        kaiming_reset_(self.weight, self.bias)

    def forward(self, input):
        return F.linear(input, self.weight, self.bias)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}")


class NonDynamicallyQuantizableLinear(Linear):
    """PyTorch's name for ``MultiheadAttention.out_proj`` (kept so reprs print the same)."""


class Bilinear(Module):
    """As ``torch.nn.Bilinear(in1, in2, out, bias=True)``: ``y = x1^T A x2 + b``.

    ``weight`` is (out, in1, in2); weight and bias start as U(-1/sqrt(in1), 1/sqrt(in1)).
    """

    def __init__(self, in1_features: int, in2_features: int, out_features: int,
                 bias: bool = True, device=None, dtype=None):
        super().__init__()
        self.in1_features = in1_features
        self.in2_features = in2_features
        self.out_features = out_features
        weight_and_bias(self, (out_features, in1_features, in2_features), (out_features,), bias,
                        device, dtype)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        bound = 1 / math.sqrt(self.weight.shape[1])
        init.uniform_(self.weight, -bound, bound)
        if self.bias is not None:
            init.uniform_(self.bias, -bound, bound)

    def forward(self, input1, input2):
        return _bilinear(input1, input2, self.weight, self.bias)

    def extra_repr(self) -> str:
        return (f"in1_features={self.in1_features}, in2_features={self.in2_features}, "
                f"out_features={self.out_features}, bias={self.bias is not None}")


def _bilinear(x1, x2, weight, bias):
    """``y[..., o] = sum_ij x1[..., i] W[o, i, j] x2[..., j] + b[o]`` with matmul and sum."""
    out_features, in1, in2 = weight.shape
    if x1.shape[-1] != in1 or x2.shape[-1] != in2 or x1.shape[:-1] != x2.shape[:-1]:
        raise RuntimeError(
            f"bilinear: input1 {tuple(x1.shape)} and input2 {tuple(x2.shape)} do not match "
            f"weight {tuple(weight.shape)} (expected (..., {in1}) and (..., {in2}) with the "
            "same leading dims)")
    lead = tuple(x1.shape[:-1])
    n = math.prod(lead)
    w = weight.permute(1, 0, 2).reshape(in1, out_features * in2)
    a = (x1.reshape(n, in1) @ w).reshape(n, out_features, in2)
    y = (a * x2.reshape(n, 1, in2)).sum(-1).reshape(lead + (out_features,))
    return y if bias is None else y + bias
