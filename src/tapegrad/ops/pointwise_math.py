"""Pointwise math beyond the arithmetic core of ``elementwise.py``: inverse and hyperbolic
trigonometry, ``atan2``/``hypot``, base-2 and base-10 logs, ``logaddexp``, ``xlogy``,
``heaviside``, ``frac``, ``nan_to_num``, the fused-looking composites
``lerp``/``addcmul``/``addcdiv``; NaN-ignoring ``fmax``/``fmin``, ``signbit``, ``sgn``,
``float_power``, ``rsub`` and the bit shifts ``bitwise_left_shift``/``bitwise_right_shift``
(``<<``, ``>>``).

Each op's gradient rule sits under it and uses only Python operators and registered ops, so
it runs on raw arrays and, with ``create_graph``, on Tensors (second order for free).
"""
import math

from tapegrad import dtypes
from tapegrad.ops import registry
from tapegrad.ops.elementwise import (_floating, isnan, pow, sigmoid, sign, sqrt, sub_alpha,
                                      where_op, zeros_like_grad)
from tapegrad.ops.registry import op, xp



def _unary(name, forward, doc, flops=10):
    """A float unary op ``forward(x)`` (integers become the default float dtype)."""

    def fwd(a):
        return forward(_floating(a))

    fwd.__name__, fwd.__doc__ = name, doc
    return op(flops=flops, float_only=True, name=name, pointwise=True)(fwd)


tan = _unary("tan", xp.tan, "As ``torch.tan``.")
asin = _unary("asin", xp.arcsin, "As ``torch.asin`` (``arcsin``).")
acos = _unary("acos", xp.arccos, "As ``torch.acos`` (``arccos``).")
atan = _unary("atan", xp.arctan, "As ``torch.atan`` (``arctan``).")
sinh = _unary("sinh", xp.sinh, "As ``torch.sinh``.")
cosh = _unary("cosh", xp.cosh, "As ``torch.cosh``.")
asinh = _unary("asinh", xp.arcsinh, "As ``torch.asinh`` (``arcsinh``).")
acosh = _unary("acosh", xp.arccosh, "As ``torch.acosh`` (``arccosh``).")
atanh = _unary("atanh", xp.arctanh, "As ``torch.atanh`` (``arctanh``).")
log2 = _unary("log2", xp.log2, "As ``torch.log2``.")
log10 = _unary("log10", xp.log10, "As ``torch.log10``.")
exp2 = _unary("exp2", xp.exp2, "As ``torch.exp2``: ``2 ** x``.")
deg2rad = _unary("deg2rad", lambda a: a * a.dtype.type(math.pi / 180), "As ``torch.deg2rad``.", 1)
rad2deg = _unary("rad2deg", lambda a: a * a.dtype.type(180 / math.pi), "As ``torch.rad2deg``.", 1)

# C-library functions: in a fused loop where numba's call is numpy's ufunc (probed), else
# numpy's ufunc of the operand before the kernel (compiler/kernels.py)
for _o, _fn in ((tan, "tan"), (asin, "arcsin"), (acos, "arccos"), (atan, "arctan"),
                (sinh, "sinh"), (cosh, "cosh"), (asinh, "arcsinh"), (acosh, "arccosh"),
                (atanh, "arctanh"), (log2, "log2"), (log10, "log10"), (exp2, "exp2")):
    _o.lower(f"np.{_fn}({{0}})", ufunc=(_fn,), libm=(_fn,))
deg2rad.lower(f"({{0}} * {{dt}}({math.pi / 180!r}))")  # the constant rounded to the dtype
rad2deg.lower(f"({{0}} * {{dt}}({180 / math.pi!r}))")

_LN2, _LN10 = math.log(2.0), math.log(10.0)

tan.grad(lambda g, out, a: g * (1 + tan(a) * tan(a)))
asin.grad(lambda g, out, a: g / sqrt(1 - a * a))
acos.grad(lambda g, out, a: -g / sqrt(1 - a * a))
atan.grad(lambda g, out, a: g / (1 + a * a))
sinh.grad(lambda g, out, a: g * cosh(a))
cosh.grad(lambda g, out, a: g * sinh(a))
asinh.grad(lambda g, out, a: g / sqrt(a * a + 1))
acosh.grad(lambda g, out, a: g / sqrt(a * a - 1))
atanh.grad(lambda g, out, a: g / (1 - a * a))
log2.grad(lambda g, out, a: g / (a * _LN2))
log10.grad(lambda g, out, a: g / (a * _LN10))
exp2.grad(lambda g, out, a: g * exp2(a) * _LN2)
deg2rad.grad(lambda g, out, a: g * (math.pi / 180))
rad2deg.grad(lambda g, out, a: g * (180 / math.pi))


@op(flops=2, saves="none", pointwise=True)
def frac(a):
    """As ``torch.frac``: ``x - trunc(x)`` (the sign of ``x`` kept); gradient 1."""
    if a.dtype.kind in "iub":
        raise RuntimeError(f"frac: not implemented for integer dtype {a.dtype} (as PyTorch)")
    return a - xp.trunc(a)


frac.lower("({0} - np.trunc({0}))")

@frac.grad
def _(g, out, a):
    return g


# --- binary -----------------------------------------------------------------------------
@op(flops=20, elementwise=True, float_only=True, needs=True, pointwise=True)
def atan2(a, b):
    """As ``torch.atan2(input, other)``: the angle of the point (other, input)."""
    return xp.arctan2(a, b)


atan2.lower("np.arctan2({0}, {1})", libm=("arctan2",))

@atan2.grad
def _(g, out, a, b, needs=(True, True)):
    scale = g / (a * a + b * b)
    return scale * b if needs[0] else None, -scale * a if needs[1] else None


@op(flops=4, saves="both", elementwise=True, float_only=True, needs=True, pointwise=True)
def hypot(a, b):
    """As ``torch.hypot``: ``sqrt(a**2 + b**2)`` without overflow."""
    if a.dtype.kind in "iub":
        raise RuntimeError(f"hypot: not implemented for integer dtype {a.dtype}")
    return xp.hypot(a, b)


hypot.lower("np.hypot({0}, {1})", ufunc=("hypot",), libm=("hypot",))

@hypot.grad
def _(g, out, a, b, needs=(True, True)):
    scale = g / out
    return scale * a if needs[0] else None, scale * b if needs[1] else None


@op(flops=12, elementwise=True, float_only=True, needs=True, pointwise=True)
def logaddexp(a, b):
    """As ``torch.logaddexp``: ``log(exp(a) + exp(b))`` without overflow."""
    return xp.logaddexp(a, b)


# numpy's own algorithm around C-library exp and log1p: probed as one function
logaddexp.lower("np.logaddexp({0}, {1})", ufunc=("logaddexp",), libm=("logaddexp",))

@logaddexp.grad
def _(g, out, a, b, needs=(True, True)):
    wa = sigmoid(a - b)  # exp(a) / (exp(a) + exp(b))
    return g * wa if needs[0] else None, g * (1 - wa) if needs[1] else None


@op(flops=12, elementwise=True, float_only=True, needs=True, pointwise=True)
def logaddexp2(a, b):
    """As ``torch.logaddexp2``: ``log2(2**a + 2**b)``."""
    return xp.logaddexp2(a, b)


logaddexp2.lower("np.logaddexp2({0}, {1})", ufunc=("logaddexp2",),
                 libm=("logaddexp2",))

@logaddexp2.grad
def _(g, out, a, b, needs=(True, True)):
    wa = sigmoid((a - b) * _LN2)
    return g * wa if needs[0] else None, g * (1 - wa) if needs[1] else None


@op(flops=3, elementwise=True, float_only=True, needs=True, pointwise=True)
def xlogy(a, b):
    """As ``torch.xlogy``: ``a * log(b)``, 0 where ``a == 0`` (unless ``b`` is NaN)."""
    with xp.errstate(divide="ignore", invalid="ignore"):
        out = a * xp.log(b)
    return xp.where((a == 0) & ~xp.isnan(b), out.dtype.type(0), out)  # a scalar: any device


xlogy.lower("({dt}(0.0) if (({0} == 0) & ({1} == {1})) else {0} * np.log({1}))",
            libm=("log",))

@xlogy.grad
def _(g, out, a, b, needs=(True, True)):
    ga = where_op((a == 0) & (b <= 0), 0.0, xlogy(g, b)) if needs[0] else None
    return ga, g * a / b if needs[1] else None


@op(flops=1, saves="none", pointwise=True)
def heaviside(a, values):
    """As ``torch.heaviside(input, values)``: ``values`` where ``input`` is 0, else
    ``input > 0`` (NaN gives 0, as PyTorch's kernel); no derivative, as in PyTorch."""
    if a.dtype != values.dtype:
        raise TypeError(f"heaviside is not yet implemented for tensors with different dtypes "
                        f"({a.dtype} and {values.dtype})")
    return xp.where(a == 0, values, a > 0).astype(a.dtype, copy=False)


heaviside.lower("({1} if {0} == 0 else ({dt}(1.0) if {0} > 0 else {dt}(0.0)))")

@heaviside.grad
def _(g, out, a, values):
    raise RuntimeError("heaviside: the derivative is not implemented (as in PyTorch)")


@op(flops=1, saves="both", elementwise=True, float_only=True, needs=True, pointwise=True)
def copysign(a, b):
    """As ``torch.copysign``: ``|a|`` with ``b``'s sign (a float result)."""
    return xp.copysign(a, b)


copysign.lower("np.copysign({0}, {1})", ufunc=("copysign",), libm=("copysign",))

@copysign.grad
def _(g, out, a, b, needs=(True, True)):
    # d|a|*s/da = sign(a) * sign(out), 0 at a == 0 (PyTorch's rule)
    ga = where_op(a == 0, 0.0, g * sign(a) * sign(out)) if needs[0] else None
    return ga, zeros_like_grad(g) if needs[1] else None


# --- composites: one op each, rules recordable ------------------------------------------------
def _check_floating(name, *ts):
    for t in ts:
        if isinstance(t, registry.Tensor) and t._data.dtype.kind in "iub":
            raise RuntimeError(f"{name}: expected a floating-point tensor, got {t.dtype} "
                               f"(shape {tuple(t.shape)})")


def lerp(input, end, weight):
    """As ``torch.lerp``: ``input + weight * (end - input)``, computed from whichever end is
    nearer, as PyTorch does (exact at both ends).

    >>> tapegrad.lerp(tapegrad.zeros(2), tapegrad.ones(2), 0.25)     # tensor([0.25, 0.25])
    """
    _check_floating("lerp", input, end, weight)
    if isinstance(weight, (int, float)):
        if abs(weight) < 0.5:
            return input + weight * (end - input)
        return end - (end - input) * (1 - weight)
    near = abs(weight) < 0.5
    return where_op(near, input + weight * (end - input), end - (end - input) * (1 - weight))


def addcmul(input, tensor1, tensor2, *, value=1):
    """As ``torch.addcmul``: ``input + value * tensor1 * tensor2``."""
    return input + (tensor1 * value) * tensor2 if value != 1 else input + tensor1 * tensor2


def addcdiv(input, tensor1, tensor2, *, value=1):
    """As ``torch.addcdiv``: ``input + value * tensor1 / tensor2`` (integer division refused,
    as in PyTorch)."""
    def integral(t):
        return not isinstance(t, registry.Tensor) or t._data.dtype.kind in "iub"

    if integral(tensor1) and integral(tensor2):
        raise RuntimeError("addcdiv: integer division with addcdiv is no longer supported, and "
                           "in a future release addcdiv will perform a true division of tensor1 "
                           "and tensor2. Use addcmul(input, tensor1, 1 / tensor2) instead.")
    return input + (tensor1 * value) / tensor2 if value != 1 else input + tensor1 / tensor2


@op(flops=3, elementwise=False, saves="inputs", pointwise=True)
def nan_to_num_op(a, nan=0.0, posinf=None, neginf=None):
    return xp.nan_to_num(a, nan=nan, posinf=posinf, neginf=neginf)



def _nan_to_num_scalar(ctx, a, nan=0.0, posinf=None, neginf=None):
    """numpy's nan_to_num for one element: the replacements cast to the dtype, infinities
    the dtype's largest finite values unless given."""
    fi = xp.finfo(ctx.dtype)
    big = ctx.const(fi.max if posinf is None else posinf)
    small = ctx.const(fi.min if neginf is None else neginf)
    return (f"({ctx.const(nan)} if {a} != {a} else ({big} if {a} == np.inf else "
            f"({small} if {a} == -np.inf else {a})))")


nan_to_num_op.lower(_nan_to_num_scalar, accepts=lambda n: all(
    v is None or type(v) in (int, float) for v in n.params.values()))

@nan_to_num_op.grad
def _(g, out, a, nan=0.0, posinf=None, neginf=None):
    from tapegrad.func._vmap import host, like  # under vmap: a batched condition

    return where_op(like(xp.isfinite(host(a)), a), g, 0.0)


def _data(a):
    return a._data if isinstance(a, registry.Tensor) else a


def nan_to_num(input, nan=0.0, posinf=None, neginf=None):
    """As ``torch.nan_to_num``: NaN to ``nan``, infinities to ``posinf``/``neginf`` (default:
    the dtype's largest/lowest finite value); the gradient is zero where replaced."""
    if input._data.dtype.kind in "iub":
        from tapegrad.creation import clone

        return clone(input)
    return nan_to_num_op(input, nan=nan, posinf=posinf, neginf=neginf)


arcsin, arccos, arctan, arcsinh, arccosh, arctanh = asin, acos, atan, asinh, acosh, atanh
arctan2 = atan2


@op(flops=2, elementwise=True, needs=True, pointwise=True)
def fmax(a, b):
    """As ``torch.fmax``: the larger of ``a`` and ``b``, the other where one is NaN."""
    return xp.fmax(a, b)


# numpy's: the other operand where one is NaN, the second on a tie (fmax(-0.0, 0.0) is 0.0)
fmax.lower("({0} if (({0} > {1}) | ({1} != {1})) else {1})", ufunc=("fmax",))

@fmax.grad
def _(g, out, a, b, needs=(True, True)):
    to_a = (a >= b) | isnan(b)  # PyTorch's rule: ties go to a
    return where_op(to_a, g, 0.0) if needs[0] else None, \
        where_op(to_a, 0.0, g) if needs[1] else None


@op(flops=2, elementwise=True, needs=True, pointwise=True)
def fmin(a, b):
    """As ``torch.fmin``: the smaller of ``a`` and ``b``, the other where one is NaN."""
    return xp.fmin(a, b)


fmin.lower("({0} if (({0} < {1}) | ({1} != {1})) else {1})", ufunc=("fmin",))

@fmin.grad
def _(g, out, a, b, needs=(True, True)):
    to_a = (a <= b) | isnan(b)
    return where_op(to_a, g, 0.0) if needs[0] else None, \
        where_op(to_a, 0.0, g) if needs[1] else None


@op(flops=1, saves="none", differentiable=False, pointwise=True)
def signbit(a):
    """As ``torch.signbit``: True where the sign bit is set (-0.0 and -NaN too)."""
    if a.dtype.kind == "b":
        return xp.zeros(a.shape, bool)
    return xp.signbit(a) if a.dtype.kind not in "iu" else a < 0


signbit.lower("np.signbit({0})", operands="same", libm=("signbit",))

def float_power(input, exponent):
    """As ``torch.float_power``: ``pow`` computed in float64 (the result is float64)."""
    def as_double(x):
        if isinstance(x, registry.Tensor):
            return x if x.dtype is dtypes.float64 else x.to(dtypes.float64)
        return x

    if not isinstance(input, registry.Tensor):
        input = registry.Tensor._make(xp.asarray(input, xp.float64))
    return pow(as_double(input), as_double(exponent))


def float_power_(self, exponent):
    """As ``Tensor.float_power_``: in place, on a float64 tensor only (as PyTorch)."""
    if self.dtype is not dtypes.float64:
        name = {"float32": "Float", "float16": "Half", "bfloat16": "BFloat16"}.get(
            self.dtype.name, self.dtype.name)
        raise RuntimeError(f"the base given to float_power_ has dtype {name} but the "
                           f"operation's result requires dtype Double")
    from tapegrad.tensor import _generic_inplace

    return _generic_inplace("float_power")(self, exponent)


def sgn(input):
    """As ``torch.sgn``: ``sign`` (tapegrad has no complex dtypes)."""
    return sign(input)


def rsub(input, other, alpha=1):
    """As ``torch.rsub``: ``other - alpha * input``."""
    return sub_alpha(other, input, alpha)


def _shift(name, left):
    def forward(a, b):
        if isinstance(a, float) or isinstance(b, float):
            raise NotImplementedError(f'"{"l" if left else "r"}shift_cpu" not implemented for '
                                      f"float ({name} takes integer tensors)")
        if not isinstance(a, xp.ndarray):  # a weak Python int takes the tensor's dtype
            a = xp.asarray(a, b.dtype)
        if a.dtype.kind not in "iu":
            raise NotImplementedError(f'"{"l" if left else "r"}shift_cpu" not implemented for '
                                      f"{a.dtype} ({name} takes integer tensors)")
        bits = a.dtype.itemsize * 8
        b = xp.asarray(b).astype(xp.int64)
        wide = (b < 0) | (b >= bits)  # PyTorch: 0 (left) or the sign fill (right)
        by = xp.where(wide, 0, b).astype(a.dtype)
        if left:
            return xp.where(wide, a.dtype.type(0), xp.left_shift(a, by)).astype(a.dtype)
        fill = xp.right_shift(a, a.dtype.type(bits - 1)) if a.dtype.kind == "i" else \
            a.dtype.type(0)
        return xp.where(wide, fill, xp.right_shift(a, by)).astype(a.dtype)

    forward.__name__ = name
    forward.__doc__ = (f"As ``torch.{name}``: integer {'left' if left else 'right'} shift "
                       f"(``{'<<' if left else '>>'}``); shifts outside [0, bits) give "
                       f"{'0' if left else 'the sign fill (0 unsigned)'}, as PyTorch.")
    return op(flops=1, saves="none", elementwise=True, differentiable=False, name=name,
              pointwise=True)(forward)


bitwise_left_shift = _shift("bitwise_left_shift", True)
bitwise_right_shift = _shift("bitwise_right_shift", False)

for _o in (bitwise_left_shift, bitwise_right_shift):
    _o.not_lowered("integer shifts: the fused loop takes float and bool values")



__all__ = ["tan", "asin", "acos", "atan", "sinh", "cosh", "asinh", "acosh", "atanh", "arcsin",
           "arccos", "arctan", "arcsinh", "arccosh", "arctanh", "log2", "log10", "exp2",
           "deg2rad", "rad2deg", "frac", "atan2", "arctan2", "hypot", "logaddexp", "logaddexp2",
           "xlogy", "heaviside", "copysign", "lerp", "addcmul", "addcdiv", "nan_to_num",
           "fmax", "fmin", "signbit", "float_power", "sgn", "rsub", "bitwise_left_shift",
           "bitwise_right_shift"]
TENSOR_METHODS = [n for n in __all__ if n != "rsub"]
# Tensor.<name>_ for these (lerp_, addcmul_, addcdiv_ are Tensor's own; float_power_ is its
# own too, float64 only), and the in-place forms PyTorch has for ops defined elsewhere
INPLACE = [n for n in __all__ if n not in ("lerp", "addcmul", "addcdiv", "logaddexp",
                                           "logaddexp2", "fmax", "fmin", "signbit",
                                           "float_power", "rsub")]
INPLACE += ["logical_and", "logical_or", "logical_xor", "bitwise_not", "true_divide", "erfc",
            "cumsum", "tril", "triu"]
