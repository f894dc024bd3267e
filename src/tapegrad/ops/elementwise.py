"""Elementwise ops. Binary ops see inputs already promoted and broadcast by dispatch."""
from tapegrad import dtypes
from tapegrad.ops.registry import op, xp


def np_dtype(d):
    return d.np if isinstance(d, dtypes.dtype) else xp.dtype(d)


@op(saves="none")
def to_dtype(a, dtype):
    """Cast to ``dtype`` (``Tensor.to(dtype)``); the gradient is cast back."""
    return a.astype(np_dtype(dtype), copy=False)


@to_dtype.grad
def _(g, out, a, dtype):
    return to_dtype(g, dtype=a.dtype)


@op(flops=1, saves="none", elementwise=True)
def add(a, b):
    return a + b


@add.grad
def _(g, out, a, b):
    return g, g


@op(flops=1, saves="none", elementwise=True)
def sub(a, b):
    return a - b


@sub.grad
def _(g, out, a, b):
    return g, -g


@op(flops=1, elementwise=True)
def mul(a, b):
    return a * b


@mul.grad
def _(g, out, a, b):
    return g * b, g * a


@op(flops=1, elementwise=True, float_only=True)
def div(a, b):
    return a / b


@div.grad
def _(g, out, a, b):
    gb = g / b
    return gb, -gb * a / b


@op(flops=1, saves="none")
def neg(a):
    return -a


@neg.grad
def _(g, out, a):
    return -g


@op(flops=10, saves="both", elementwise=True)
def pow(a, b):
    """As ``torch.pow``: ``a ** b`` elementwise (tensor or scalar exponent)."""
    return a**b


@pow.grad
def _(g, out, a, b):
    ga = g * b * a ** (b - 1) if not isinstance(b, (int, float)) or b != 0 else g * 0
    gb = None
    if not isinstance(b, (int, float)):
        # d/db a^b = a^b log a; PyTorch masks a == 0 (where b >= 0) to 0 rather than nan
        gb = g * where(a == 0, 0.0, out * log(where(a == 0, 1.0, a)))
    return ga, gb


@op(flops=10, saves="out", float_only=True)
def exp(a):
    return xp.exp(a)


@exp.grad
def _(g, out, a):
    return g * out


@op(flops=10, float_only=True)
def log(a):
    return xp.log(a)


@log.grad
def _(g, out, a):
    return g / a


@op(flops=10, saves="out", float_only=True)
def sqrt(a):
    return xp.sqrt(a)


@sqrt.grad
def _(g, out, a):
    return g / (2 * out)


@op(flops=10, saves="out", float_only=True)
def tanh(a):
    return xp.tanh(a)


@tanh.grad
def _(g, out, a):
    return g * (1 - out * out)


@op(flops=4, saves="out", float_only=True)
def sigmoid(a):
    # split by sign so exp never overflows
    e = xp.exp(-xp.abs(a))
    return xp.where(a >= 0, 1 / (1 + e), e / (1 + e)).astype(a.dtype, copy=False)


@sigmoid.grad
def _(g, out, a):
    return g * out * (1 - out)


@op(flops=1, saves="out")
def relu(a):
    return xp.maximum(a, 0)


@relu.grad
def _(g, out, a):
    return g * (out > 0)


@op(flops=1, elementwise=True)
def where(cond, a, b):
    """As ``torch.where(cond, a, b)``."""
    return xp.where(cond, a, b)


@where.grad
def _(g, out, cond, a, b):
    return None, where(cond, g, 0), where(cond, 0, g)


def _compare(name, fn):
    f = lambda a, b: fn(a, b)  # noqa: E731
    f.__name__ = name
    f.__doc__ = f"As ``torch.{name}``: elementwise comparison; the result is bool, without grad."
    return op(flops=1, elementwise=True, differentiable=False)(f)


eq = _compare("eq", xp.equal)
ne = _compare("ne", xp.not_equal)
lt = _compare("lt", xp.less)
le = _compare("le", xp.less_equal)
gt = _compare("gt", xp.greater)
ge = _compare("ge", xp.greater_equal)


# --- PyTorch-signature functions (exported as tapegrad.X and Tensor.X) ------------------
def add_alpha(input, other, alpha=1):
    """As ``torch.add(input, other, alpha=1)``."""
    return add(input, other if alpha == 1 else mul(other, alpha))


def sub_alpha(input, other, alpha=1):
    """As ``torch.sub(input, other, alpha=1)``."""
    return sub(input, other if alpha == 1 else mul(other, alpha))


__all__ = ["mul", "div", "neg", "pow", "exp", "log", "sqrt", "tanh", "sigmoid", "relu",
           "where", "eq", "ne", "lt", "le", "gt", "ge"]
TENSOR_METHODS = __all__[:]
