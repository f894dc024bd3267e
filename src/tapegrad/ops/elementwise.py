"""Elementwise ops. Binary ops see inputs already promoted and broadcast by dispatch.

Unary ops that only make sense on floats (``exp``, ``sin``...) turn integer and bool inputs
into the default float dtype in their forward, as PyTorch does; ops that keep the input's
dtype (``abs``, ``floor``, ``relu``...) work on integers too. Gradient rules use only Python
operators and registered ops, so they run on raw arrays and, with ``create_graph``, on
Tensors.
"""
import math

from tapegrad import dtypes
from tapegrad.ops import registry
from tapegrad.ops.registry import op, xp
from tapegrad.backend import DEVICE_TYPES, backend_of
from tapegrad.ops.error_function import erf64



def np_dtype(d):
    return d.np if isinstance(d, dtypes.dtype) else xp.dtype(d)


def _floating(a):
    """Integer and bool arrays become the default float dtype (PyTorch's unary float ops).

    Dtype tests use ``kind in "iub"``: bfloat16 (ml_dtypes) has numpy kind "V", not "f".
    """
    return a.astype(dtypes.get_default_dtype().np) if a.dtype.kind in "iub" else a


def _is_scalar(x):
    return isinstance(x, (int, float))


@op(saves="none", pointwise=True, linear=True)
def to_dtype(a, dtype):
    """Cast to ``dtype`` (``Tensor.to(dtype)``); the gradient is cast back."""
    return a.astype(np_dtype(dtype), copy=False)


to_dtype.lower("{dt}({0})", operands="any", kinds="fb",
               accepts=lambda n: n.outputs[0].dtype.kind == "f")  # (numba casts as astype)


@to_dtype.grad(traces=True)
def _(g, out, a, dtype):
    return to_dtype(g, dtype=a.dtype)


@op(saves="none", differentiable=False, name="zeros_like_grad", pointwise=True)
def zeros_like_grad(a):
    """Zeros of ``a``'s shape and dtype: the gradient of piecewise-constant ops."""
    return xp.zeros(a.shape, a.dtype)


# --- arithmetic -------------------------------------------------------------------------
zeros_like_grad.lower("{dt}(0.0)")


@op(flops=1, saves="none", elementwise=True, pointwise=True, linear=True)
def add(a, b):
    return a + b


add.lower("({0} + {1})", ufunc=("add",))


@add.grad(traces=True)
def _(g, out, a, b):
    return g, g


@op(flops=1, saves="none", elementwise=True, pointwise=True, linear=True)
def sub(a, b):
    return a - b


sub.lower("({0} - {1})", ufunc=("subtract",))


@sub.grad(traces=True)
def _(g, out, a, b):
    return g, -g


@op(flops=1, elementwise=True, needs=True, uses=((1,), (0,)), pointwise=True)
def mul(a, b):
    """As ``torch.mul``: ``a * b`` elementwise, with broadcasting and type promotion."""
    return a * b


mul.lower("({0} * {1})", ufunc=("multiply",))


@mul.grad(traces=True)
def _(g, out, a, b, needs=(True, True)):
    return g * b if needs[0] else None, g * a if needs[1] else None


@op(flops=1, elementwise=True, float_only=True, name="div", needs=True, uses=((1,), (0, 1)),
    pointwise=True)
def div_op(a, b):
    return a / b


div_op.lower("({0} / {1})", ufunc=("true_divide",))


@div_op.grad(traces=True)
def _(g, out, a, b, needs=(True, True)):
    gb = g / b
    return gb if needs[0] else None, -gb * a / b if needs[1] else None


def _check_int_divisor(name, a, b):
    kind = (a if hasattr(a, "dtype") else b).dtype.kind
    if kind in "iub" and xp.any(b == 0):
        raise RuntimeError(f"{name}: ZeroDivisionError (integer division by zero)")


def _floor_divide(a, b):
    _check_int_divisor("floor_divide", a, b)
    return xp.floor_divide(a, b)


@op(flops=1, saves="none", elementwise=True, name="div_floor", pointwise=True)
def floor_div_op(a, b):
    """``torch.div(a, b, rounding_mode='floor')``: division rounded down (zero gradient)."""
    return _floor_divide(a, b)


floor_div_op.not_lowered("numpy's floor division (fmod, then corrections by the signs and "
                         "a rounding step) and the integer divisor check: no scalar form")


@floor_div_op.grad
def _(g, out, a, b):
    return zeros_like_grad(g), zeros_like_grad(g)


@op(flops=1, saves="none", elementwise=True, pointwise=True)
def floor_divide(a, b):
    """As ``torch.floor_divide`` / ``a // b``: division rounded down. As in PyTorch it has no
    derivative; ``div(a, b, rounding_mode='floor')`` is the same with a zero gradient."""
    return _floor_divide(a, b)


floor_divide.not_lowered("numpy's floor division (fmod, then corrections by the signs and "
                         "a rounding step) and the integer divisor check: no scalar form")


@floor_divide.grad
def _(g, out, a, b):
    raise RuntimeError("floor_divide: the derivative is not implemented (as in PyTorch); use "
                       "div(a, b, rounding_mode='floor'), whose gradient is zero")


@op(flops=1, saves="none", elementwise=True, name="trunc_divide", pointwise=True)
def trunc_divide(a, b):
    """``torch.div(a, b, rounding_mode='trunc')``: division rounded toward zero."""
    _check_int_divisor("div", a, b)
    if (a if hasattr(a, "dtype") else b).dtype.kind not in "iub":
        return xp.trunc(a / b)
    q = xp.floor_divide(a, b)
    return q + ((xp.remainder(a, b) != 0) & ((a < 0) != (b < 0)))


trunc_divide.not_lowered("floor division corrected by the remainder's sign, for integers: "
                         "the fused loop takes float and bool values")


@trunc_divide.grad
def _(g, out, a, b):
    return zeros_like_grad(g), zeros_like_grad(g)


@op(flops=2, elementwise=True, needs=True, pointwise=True)
def remainder(a, b):
    """As ``torch.remainder`` / ``a % b``: the remainder takes the divisor's sign (Python's)."""
    _check_int_divisor("remainder", a, b)
    return xp.remainder(a, b)


remainder.not_lowered("numpy's divmod (fmod, then the divisor's sign) and the integer "
                      "divisor check: no scalar form")


@remainder.grad
def _(g, out, a, b, needs=(True, True)):
    return g, (-g * floor_div_op(a, b) if needs[1] else None)


@op(flops=2, elementwise=True, needs=True, pointwise=True)
def fmod(a, b):
    """As ``torch.fmod``: the remainder takes the dividend's sign (C's ``fmod``)."""
    _check_int_divisor("fmod", a, b)
    return xp.fmod(a, b)


fmod.lower("np.fmod({0}, {1})", ufunc=("fmod",), libm=("fmod",))


@fmod.grad
def _(g, out, a, b, needs=(True, True)):
    return g, (-g * trunc_divide(a, b) if needs[1] else None)


@op(flops=1, saves="none", pointwise=True, linear=True)
def neg(a):
    """As ``torch.neg`` / ``-a``."""
    return -a


neg.lower("(-{0})", ufunc=("negative",))


@neg.grad(traces=True)
def _(g, out, a):
    return -g


def _int_pow(a, b):
    """Integer powers as PyTorch computes them: negative exponents give 0, 1 or -1."""
    if _is_scalar(b):
        return a**b  # numpy raises for a negative scalar exponent, as PyTorch does
    a = xp.asarray(a, dtype=b.dtype)  # a Python base takes the exponent tensor's dtype
    neg_exp = b < 0
    if not neg_exp.any():
        return a**b
    small = xp.where(a == 1, 1, xp.where(a == -1, xp.where(b % 2 == 0, 1, -1), 0))
    return xp.where(neg_exp, small, a ** xp.where(neg_exp, 0, b)).astype(
        xp.result_type(a, b), copy=False)


@op(flops=10, saves="both", elementwise=True, needs=True, pointwise=True)
def pow(a, b):
    """As ``torch.pow``: ``a ** b`` with tensor or scalar base and exponent."""
    if (a if hasattr(a, "dtype") else b).dtype.kind in "iub":
        return _int_pow(a, b)
    return a**b


def _pow_scalar(ctx, a, b):
    """``a ** b``'s scalar form: a Python-number exponent numpy computes without ``power``
    (``ndarray.__pow__``'s fast path: 2 squares, 0.5 is sqrt, -1 divides, 1 and 0) is that
    operation; else the C library's pow, where numba's is numpy's."""
    base, e = ctx.node.inputs
    if type(e) in (int, float) and type(base) not in (int, float):
        fast = {2: f"({a} * {a})", 0.5: f"np.sqrt({a})", -1: f"({ctx.dt}(1.0) / {a})",
                1: f"({a})", 0: ctx.const(1.0)}
        if e in fast:
            return fast[e]
    return ctx.libm("power", f"{a}, {b}")


pow.lower(_pow_scalar)


@pow.grad
def _(g, out, a, b, needs=(True, True)):
    ga = gb = None
    if _is_scalar(b):
        ga = zeros_like_grad(g) if b == 0 else g * (b * a ** (b - 1))
        return ga, None
    if needs[0]:
        ga = where_op(b == 0, 0.0, g * (b * a ** (b - 1)))
    if needs[1]:
        if _is_scalar(a):
            # PyTorch: result * log(base); a zero base gives 0 where the exponent is >= 0
            if a == 0:
                gb = g * where_op(b >= 0, 0.0, out * -math.inf)
            else:
                gb = g * (out * (math.log(a) if a > 0 else math.nan))
        else:
            zero = (a == 0) & (b >= 0)  # log(0) masked only where the power is finite
            gb = g * where_op(zero, 0.0, out * log(where_op(zero, 1.0, a)))
    return ga, gb


@op(flops=2, elementwise=True, needs=True, pointwise=True)
def maximum(a, b):
    """As ``torch.maximum``: elementwise max (NaN propagates); ties split the gradient."""
    return xp.maximum(a, b)


# numpy's: a NaN wins, a tie gives the second operand (max(-0.0, 0.0) is 0.0, max(0.0, -0.0)
# -0.0); ``|``, not ``or``: no branch, so LLVM vectorises the loop (2x)
_MAX = "({0} if (({0} > {1}) | ({0} != {0})) else {1})"
_MIN = "({0} if (({0} < {1}) | ({0} != {0})) else {1})"
maximum.lower(_MAX, ufunc=("maximum",))


@maximum.grad
def _(g, out, a, b, needs=(True, True)):
    tie = where_op(a == b, g * 0.5, g)
    return (where_op(a < b, 0.0, tie) if needs[0] else None,
            where_op(a > b, 0.0, tie) if needs[1] else None)


@op(flops=2, elementwise=True, needs=True, pointwise=True)
def minimum(a, b):
    """As ``torch.minimum``: elementwise min (NaN propagates); ties split the gradient."""
    return xp.minimum(a, b)


minimum.lower(_MIN, ufunc=("minimum",))


@minimum.grad
def _(g, out, a, b, needs=(True, True)):
    tie = where_op(a == b, g * 0.5, g)
    return (where_op(a > b, 0.0, tie) if needs[0] else None,
            where_op(a < b, 0.0, tie) if needs[1] else None)


@op(flops=2, elementwise=True, needs=True, name="clamp", pointwise=True)
def clamp_op(a, lo, hi):
    return xp.minimum(xp.maximum(a, lo), hi)


clamp_op.lower(lambda ctx, a, lo, hi: _MIN.format(_MAX.format(a, lo), hi))


@clamp_op.grad
def _(g, out, a, lo, hi, needs=(True, True, True)):
    # PyTorch's clamp_backward_min_max: with lo > hi everything is clamped to hi
    return (where_op((a >= lo) & (a <= hi), g, 0.0) if needs[0] else None,
            where_op((lo > a) & (lo <= hi), g, 0.0) if needs[1] else None,
            where_op((hi < a) | (hi < lo), g, 0.0) if needs[2] else None)


@op(flops=1, elementwise=True, needs=True, pointwise=True)
def clamp_min(a, lo):
    """As ``torch.clamp_min``: ``max(a, lo)``; the gradient goes to ``a`` where ``a >= lo``."""
    return xp.maximum(a, lo)


clamp_min.lower(_MAX, ufunc=("maximum",))


@clamp_min.grad
def _(g, out, a, lo, needs=(True, True)):
    return (where_op(a >= lo, g, 0.0) if needs[0] else None,
            where_op(a < lo, g, 0.0) if needs[1] else None)


@op(flops=1, elementwise=True, needs=True, pointwise=True)
def clamp_max(a, hi):
    """As ``torch.clamp_max``: ``min(a, hi)``; the gradient goes to ``a`` where ``a <= hi``."""
    return xp.minimum(a, hi)


clamp_max.lower(_MIN, ufunc=("minimum",))


@clamp_max.grad
def _(g, out, a, hi, needs=(True, True)):
    return (where_op(a <= hi, g, 0.0) if needs[0] else None,
            where_op(a > hi, g, 0.0) if needs[1] else None)


# --- unary float functions --------------------------------------------------------------
@op(flops=10, saves="out", float_only=True, pointwise=True)
def exp(a):
    """As ``torch.exp``."""
    return xp.exp(_floating(a))


exp.lower("np.exp({0})", ufunc=("exp",), libm=("exp",))


@exp.grad(traces=True)
def _(g, out, a):
    return g * out


@op(flops=10, saves="out", float_only=True, pointwise=True)
def expm1(a):
    """As ``torch.expm1``: ``exp(a) - 1``, accurate near 0."""
    return xp.expm1(_floating(a))


expm1.lower("np.expm1({0})", ufunc=("expm1",), libm=("expm1",))


@expm1.grad
def _(g, out, a):
    return g * (out + 1)


@op(flops=10, float_only=True, pointwise=True)
def log(a):
    """As ``torch.log``."""
    return xp.log(_floating(a))


log.lower("np.log({0})", ufunc=("log",), libm=("log",))


@log.grad(traces=True)
def _(g, out, a):
    return g / a


@op(flops=10, float_only=True, pointwise=True)
def log1p(a):
    """As ``torch.log1p``: ``log(1 + a)``, accurate near 0."""
    return xp.log1p(_floating(a))


log1p.lower("np.log1p({0})", ufunc=("log1p",), libm=("log1p",))


@log1p.grad
def _(g, out, a):
    return g / (a + 1)


@op(flops=10, saves="out", float_only=True, pointwise=True)
def sqrt(a):
    """As ``torch.sqrt``."""
    return xp.sqrt(_floating(a))


sqrt.lower("np.sqrt({0})", ufunc=("sqrt",))  # IEEE: correctly rounded


@sqrt.grad(traces=True)
def _(g, out, a):
    return g / (2 * out)


@op(flops=10, saves="out", float_only=True, pointwise=True)
def rsqrt(a):
    """As ``torch.rsqrt``: ``1 / sqrt(a)``."""
    a = _floating(a)
    return 1 / xp.sqrt(a)


rsqrt.lower("({dt}(1.0) / np.sqrt({0}))")


@rsqrt.grad
def _(g, out, a):
    return -0.5 * g * out**3


@op(flops=1, saves="out", float_only=True, pointwise=True)
def reciprocal(a):
    """As ``torch.reciprocal``: ``1 / a``."""
    return 1 / _floating(a)


reciprocal.lower("({dt}(1.0) / {0})")


@reciprocal.grad
def _(g, out, a):
    return -g * (out * out)


@op(flops=10, float_only=True, pointwise=True)
def sin(a):
    """As ``torch.sin``."""
    return xp.sin(_floating(a))


sin.lower("np.sin({0})", ufunc=("sin",), libm=("sin",))


@sin.grad
def _(g, out, a):
    return g * cos(a)


@op(flops=10, float_only=True, pointwise=True)
def cos(a):
    """As ``torch.cos``."""
    return xp.cos(_floating(a))


cos.lower("np.cos({0})", ufunc=("cos",), libm=("cos",))


@cos.grad
def _(g, out, a):
    return g * -sin(a)


@op(flops=10, saves="out", float_only=True, pointwise=True)
def tanh(a):
    """As ``torch.tanh``."""
    return xp.tanh(_floating(a))


tanh.lower("np.tanh({0})", ufunc=("tanh",), libm=("tanh",))


@tanh.grad(traces=True)
def _(g, out, a):
    return g * (1 - out * out)


@op(flops=4, saves="out", float_only=True, pointwise=True)
def sigmoid(a):
    """As ``torch.sigmoid``: ``1 / (1 + exp(-a))``, PyTorch's formula and limits (an
    ``exp(-a)`` that overflows to inf gives 0, as there)."""
    a = _floating(a)
    if a.dtype.kind == "f" and a.dtype.itemsize >= 4 and type(a) is xp.ndarray:
        # four passes in one buffer: no per-element branch (numpy's where costs a mispredicted
        # branch per element on mixed signs, 5-10x an exp)
        e = xp.negative(a, out=xp.empty_like(a))
        with xp.errstate(over="ignore"):
            xp.exp(e, out=e)
        e += 1
        return xp.divide(1, e, out=e)
    e = xp.exp(-xp.abs(a))  # float16, bfloat16: split by sign so exp never overflows
    return xp.where(a >= 0, 1 / (1 + e), e / (1 + e)).astype(a.dtype, copy=False)


# float32/float64: the forward's four passes for one element (float16/bfloat16 split by sign)
sigmoid.lower("({dt}(1.0) / (np.exp(-{0}) + {dt}(1.0)))", libm=("exp",),
              accepts=lambda n: not n.params and n.outputs[0].dtype.itemsize >= 4)


@sigmoid.grad(traces=True)
def _(g, out, a):
    return g * out * (1 - out)


@op(flops=20, float_only=True, pointwise=True)
def erf(a):
    """As ``torch.erf``: tapegrad's float64 error function (``ops.error_function``: Cephes'
    formulas as array operations), rounded once to the input's dtype."""
    a = _floating(a)
    if type(a) is not xp.ndarray and a.dtype.kind == "f" and type(a) in DEVICE_TYPES:
        return backend_of(a).special.erf(a).astype(a.dtype, copy=False)  # cupyx.scipy.special
    return erf64(a).astype(a.dtype, copy=False)


_TWO_OVER_SQRT_PI = 2.0 / math.sqrt(math.pi)


# float32: a float64 polynomial rounded once (eager's but within 5.4e-14 of a rounding
# midpoint: compiler/kernels.py); float64: erf64 operation for operation, bitwise
erf.lower(lambda ctx, a: ctx.erf(a, 0), alone=True)


@erf.grad
def _(g, out, a):
    return g * (_TWO_OVER_SQRT_PI * exp(-(a * a)))


# --- unary functions that keep the dtype ------------------------------------------------
def _no_bool(name, a):
    if a.dtype.kind == "b":
        raise RuntimeError(f"{name}: Boolean inputs are not supported (input dtype bool)")


@op(flops=1, saves="out", pointwise=True)
def relu(a):
    """As ``torch.relu``: ``max(a, 0)``; the gradient at 0 is 0."""
    _no_bool("relu", a)
    return xp.maximum(a, 0)


relu.lower(_MAX.replace("{1}", "{dt}(0.0)"), ufunc=("maximum", 0))  # relu(-0.0) is 0.0


@relu.grad(traces=True)
def _(g, out, a):
    return g * (out > 0)


@op(flops=1, pointwise=True)
def abs(a):
    """As ``torch.abs``; the gradient at 0 is 0 (``sign``)."""
    _no_bool("abs", a)
    return xp.abs(a)


abs.lower("abs({0})", ufunc=("absolute",))


@abs.grad
def _(g, out, a):
    return g * sign(a)


@op(flops=1, saves="none", pointwise=True)
def sign(a):
    """As ``torch.sign``: -1, 0 or 1 (zero gradient)."""
    return a.copy() if a.dtype.kind == "b" else xp.sign(a)


def _zero_rule(g, out, a, **params):
    return zeros_like_grad(g)


# numpy's: NaN stays NaN, -0.0 gives 0.0
sign.lower("({dt}(1.0) if {0} > 0 else ({dt}(-1.0) if {0} < 0 else "
           "({dt}(0.0) if {0} == 0 else {0})))", ufunc=("sign",))
sign.grad(_zero_rule)


@op(flops=1, saves="none", pointwise=True)
def floor(a):
    """As ``torch.floor`` (zero gradient)."""
    return a.copy() if a.dtype.kind in "iub" else xp.floor(a)


@op(flops=1, saves="none", pointwise=True)
def ceil(a):
    """As ``torch.ceil`` (zero gradient)."""
    return a.copy() if a.dtype.kind in "iub" else xp.ceil(a)


@op(flops=1, saves="none", pointwise=True)
def trunc(a):
    """As ``torch.trunc``: round toward zero (zero gradient)."""
    return a.copy() if a.dtype.kind in "iub" else xp.trunc(a)


@op(flops=2, saves="none", name="round", pointwise=True)
def round_op(a, decimals=0):
    if a.dtype.kind in "iub":
        if decimals:
            raise RuntimeError(f"round: decimals is not supported for {a.dtype} inputs")
        return a.copy()
    if decimals == 0:
        return xp.rint(a)
    # PyTorch's kernel: scale by 10**|decimals| in the input's precision, round half-even
    scale = a.dtype.type(10.0 ** (-decimals if decimals < 0 else decimals))
    return xp.rint(a / scale) * scale if decimals < 0 else xp.rint(a * scale) / scale


floor.lower("np.floor({0})", ufunc=("floor",))
ceil.lower("np.ceil({0})", ufunc=("ceil",))
trunc.lower("np.trunc({0})", ufunc=("trunc",))
round_op.lower("np.rint({0})", accepts=lambda n: n.params.get("decimals", 0) == 0)

for _o in (floor, ceil, trunc, round_op):
    _o.grad(_zero_rule)


def _predicate(name, fn, doc):
    f = lambda a: fn(a)  # noqa: E731
    f.__name__ = name
    f.__doc__ = doc
    return op(flops=1, saves="none", differentiable=False, pointwise=True)(f)


isnan = _predicate("isnan", xp.isnan, "As ``torch.isnan``: bool, without grad.")
isinf = _predicate("isinf", xp.isinf, "As ``torch.isinf``: bool, without grad.")
isfinite = _predicate("isfinite", xp.isfinite, "As ``torch.isfinite``: bool, without grad.")
logical_not = _predicate("logical_not", xp.logical_not,
                         "As ``torch.logical_not``: bool, without grad.")


isnan.lower("({0} != {0})", operands="same", kinds="fb")
isinf.lower("(({0} == np.inf) | ({0} == -np.inf))", operands="same", kinds="fb")
isfinite.lower("(({0} == {0}) & ({0} != np.inf) & ({0} != -np.inf))", operands="same",
               kinds="fb")
logical_not.lower("({0} == 0)", operands="same", kinds="fb")


@op(flops=1, saves="none", differentiable=False, pointwise=True)
def bitwise_not(a):
    """As ``torch.bitwise_not`` / ``~a``: on bool and integer tensors only."""
    if a.dtype.kind not in "iub":
        raise RuntimeError(f"bitwise_not: only integer and bool tensors are supported, got "
                           f"{a.dtype}")
    return xp.invert(a)


bitwise_not.lower("({0} ^ True)", kinds="b")  # (bool: numba's loop takes no integers)

# --- where, comparisons, logical and bitwise ops ----------------------------------------
_INT_OF_SIZE = {4: xp.int32, 8: xp.int64}
# below this many elements numpy's where (one call) beats select's four passes
_SELECT_MIN = 8192


def _bits(v, dt):
    """``v`` (an array of dtype ``dt`` or a Python number) viewed as same-size integers; None
    if a number does not fit ``dt`` (numpy's where then decides)."""
    if type(v) is xp.ndarray:
        return v.view(_INT_OF_SIZE[dt.itemsize]) if v.dtype == dt else None
    if type(v) in (bool, int, float):  # (a numpy scalar is no weak number: numpy decides)
        with xp.errstate(over="ignore"):
            s = dt.type(v)
        if math.isinf(s) and not math.isinf(v):
            return None
        return xp.asarray(s).view(_INT_OF_SIZE[dt.itemsize])
    return None


def select(cond, a, b):
    """``xp.where(cond, a, b)`` without a branch per element: numpy's where branches on each
    condition, so a mask of mixed values costs a mispredicted branch per element (10-20x a
    multiply at 131k float32). For float32/float64 operands the result's bits are
    ``b ^ ((a ^ b) & M)`` with ``M`` all ones where ``cond`` holds: the same bits, NaNs,
    infinities and signed zeros included."""
    ref = a if type(a) is xp.ndarray else b
    if (type(cond) is not xp.ndarray or type(ref) is not xp.ndarray
            or ref.dtype.kind != "f" or ref.dtype.itemsize not in _INT_OF_SIZE
            or max(cond.size, ref.size) < _SELECT_MIN):
        return xp.where(cond, a, b)
    dt = ref.dtype
    ai, bi = _bits(a, dt), _bits(b, dt)
    if ai is None or bi is None:
        return xp.where(cond, a, b)
    shape = xp.broadcast_shapes(cond.shape, ai.shape, bi.shape)
    m = (cond if cond.dtype.kind == "b" else cond != 0).astype(ai.dtype)
    mine = m.shape == shape  # m is a fresh buffer of the result's shape: write into it
    if bi.ndim == 0 and not bi:  # b is +0.0: a's bits where cond, else none
        xp.negative(m, out=m)
        return xp.bitwise_and(ai, m, out=m if mine else None).view(dt)
    if ai.ndim == 0 and not ai:  # a is +0.0: b's bits where cond fails
        m -= 1
        return xp.bitwise_and(bi, m, out=m if mine else None).view(dt)
    xp.negative(m, out=m)
    d = xp.bitwise_and(xp.bitwise_xor(ai, bi), m, out=m if mine else None)
    return xp.bitwise_xor(d, bi, out=d if d.shape == shape else None).view(dt)


@op(flops=1, elementwise=True, needs=True, name="where", pointwise=True)
def where_op(cond, a, b):
    return select(cond, a, b)


# numpy's where takes any condition by its truth (NaN is true, as in numba's ``if``)
where_op.lower("({1} if {0} else {2})", operands=("any", "out", "out"), kinds="fb")


@where_op.grad(traces=True)
def _(g, out, cond, a, b, needs=(False, True, True)):
    return (None, where_op(cond, g, 0.0) if needs[1] else None,
            where_op(cond, 0.0, g) if needs[2] else None)


def _binary_predicate(name, fn, doc):
    f = lambda a, b: fn(a, b)  # noqa: E731
    f.__name__ = name
    f.__doc__ = doc
    return op(flops=1, elementwise=True, differentiable=False, pointwise=True)(f)


def _compare(name, fn):
    return _binary_predicate(
        name, fn, f"As ``torch.{name}``: elementwise comparison; the result is bool, without "
        "grad.")


eq = _compare("eq", xp.equal)
ne = _compare("ne", xp.not_equal)
lt = _compare("lt", xp.less)
le = _compare("le", xp.less_equal)
gt = _compare("gt", xp.greater)
ge = _compare("ge", xp.greater_equal)

for _o, _form, _uf in ((eq, "==", "equal"), (ne, "!=", "not_equal"), (lt, "<", "less"),
                       (le, "<=", "less_equal"), (gt, ">", "greater"),
                       (ge, ">=", "greater_equal")):
    _o.lower(f"({{0}} {_form} {{1}})", operands="same", kinds="fb", ufunc=(_uf,))

def _logical(name, fn):
    return _binary_predicate(name, fn, f"As ``torch.{name}``: bool result, without grad.")


logical_and = _logical("logical_and", xp.logical_and)
logical_or = _logical("logical_or", xp.logical_or)
logical_xor = _logical("logical_xor", xp.logical_xor)

logical_and.lower("(({0} != 0) & ({1} != 0))", operands="same", kinds="fb")
logical_or.lower("(({0} != 0) | ({1} != 0))", operands="same", kinds="fb")
logical_xor.lower("(({0} != 0) != ({1} != 0))", operands="same", kinds="fb")

def _bitwise(name, fn):
    def f(a, b):
        if (a if hasattr(a, "dtype") else b).dtype.kind not in "iub":
            raise RuntimeError(f"{name}: only integer and bool tensors are supported, got "
                               "floating point")
        return fn(a, b)

    f.__name__ = name
    f.__doc__ = f"As ``torch.{name}``: on bool and integer tensors (promoted), without grad."
    return op(flops=1, elementwise=True, differentiable=False, pointwise=True)(f)


bitwise_and = _bitwise("bitwise_and", xp.bitwise_and)
bitwise_or = _bitwise("bitwise_or", xp.bitwise_or)
bitwise_xor = _bitwise("bitwise_xor", xp.bitwise_xor)

for _o, _form in ((bitwise_and, "&"), (bitwise_or, "|"), (bitwise_xor, "^")):
    _o.lower(f"({{0}} {_form} {{1}})", kinds="b")  # (bool: numba's loop takes no integers)


# --- PyTorch-signature functions (exported as tapegrad.X and Tensor.X) ------------------
def _check_alpha(name, input, other, alpha):
    if isinstance(alpha, float) and not dtypes.is_floating(dtypes.result_type(input, other)):
        raise RuntimeError(f"{name}: for integral input tensors, argument alpha must not be a "
                           f"floating point number (got alpha={alpha})")


def add_alpha(input, other, alpha=1):
    """As ``torch.add(input, other, alpha=1)``: ``input + alpha * other``."""
    if alpha == 1 and not isinstance(alpha, float):
        return add(input, other)
    _check_alpha("add", input, other, alpha)
    return add(input, mul(other, alpha))


def sub_alpha(input, other, alpha=1):
    """As ``torch.sub(input, other, alpha=1)``: ``input - alpha * other``."""
    if alpha == 1 and not isinstance(alpha, float):
        return sub(input, other)
    _check_alpha("sub", input, other, alpha)
    return sub(input, mul(other, alpha))


def div(input, other, *, rounding_mode=None):
    """As ``torch.div``: true division, or rounded with ``rounding_mode='trunc'|'floor'``.

    >>> tapegrad.div(tapegrad.tensor([7, -7]), 2, rounding_mode="floor")  # tensor([3, -4])
    """
    if rounding_mode is None:
        return div_op(input, other)
    if rounding_mode == "floor":
        return floor_div_op(input, other)
    if rounding_mode == "trunc":
        return trunc_divide(input, other)
    raise RuntimeError("div expected rounding_mode to be one of None, 'trunc', or 'floor' but "
                       f"found '{rounding_mode}'")


def true_divide(input, other):
    """As ``torch.true_divide``: ``div`` without rounding."""
    return div_op(input, other)


def clamp(input, min=None, max=None):
    """As ``torch.clamp`` / ``torch.clip``: ``min``/``max`` are numbers or tensors, one may be
    None. The gradient reaches ``input`` where ``min <= input <= max``.

    >>> tapegrad.clamp(tapegrad.tensor([-2.0, 0.5, 3.0]), min=0, max=1)  # tensor([0., .5, 1.])
    """
    if min is None and max is None:
        raise RuntimeError("torch.clamp: At least one of 'min' or 'max' must not be None")
    if max is None:
        return clamp_min(input, min)
    if min is None:
        return clamp_max(input, max)
    return clamp_op(input, min, max)


clip = clamp


def round(input, *, decimals=0):
    """As ``torch.round``: half to even, optionally to ``decimals`` places (zero gradient)."""
    return round_op(input, decimals=int(decimals))


def positive(input):
    """As ``torch.positive`` / ``+a``: the input itself (bool raises, as in PyTorch)."""
    if input.dtype is dtypes.bool_:
        raise RuntimeError("positive: the `+` operator on a bool tensor is not supported")
    return input


def square(input):
    """As ``torch.square``: ``input * input``."""
    return mul(input, input)


def where(condition, input=None, other=None):
    """As ``torch.where(condition, input, other)``; ``torch.where(condition)`` gives the
    indices of the True elements (as ``nonzero(as_tuple=True)``).
    """
    Tensor = registry.Tensor
    if isinstance(condition, Tensor):
        if condition._data.dtype.kind != "b":
            raise RuntimeError("where expected condition to be a boolean tensor, but got a "
                               f"tensor with dtype {condition.dtype}")
        if input is None and other is None:
            return tuple(Tensor._make(i) for i in xp.nonzero(condition._data))
    if input is None or other is None:
        raise TypeError("where: pass both input and other (or neither)")
    if not isinstance(input, Tensor) and not isinstance(other, Tensor):
        # two Python scalars: numpy would make float64; PyTorch gives their result dtype
        input = Tensor._make(xp.asarray(input, dtypes.result_type(input, other).np))
    return where_op(condition, input, other)


def masked_fill(input, mask, value):
    """As ``torch.masked_fill``: ``value`` where ``mask`` is True; keeps ``input``'s dtype.

    ``value`` is a number or a 0-dim tensor (which then receives the gradient).
    """
    Tensor = registry.Tensor
    if mask._data.dtype.kind != "b":
        raise RuntimeError(f"masked_fill: only supports boolean masks, but got mask with dtype "
                           f"{mask.dtype}")
    dt = input._data.dtype
    if isinstance(value, Tensor):
        if value.ndim != 0:
            raise RuntimeError("masked_fill: only supports a 0-dimensional value tensor, but got "
                               f"tensor with {value.ndim} dimension(s).")
        if value._data.dtype != dt:
            value = to_dtype(value, dtype=dt)
    else:
        value = bool(value) if dt.kind == "b" else int(value) if dt.kind in "iu" else \
            float(value)
    return where_op(mask, value, input)


negative = neg
multiply = mul
divide = div
absolute = abs

__all__ = ["mul", "multiply", "div", "divide", "true_divide", "floor_divide", "remainder",
           "fmod", "neg", "negative", "pow", "exp", "expm1", "log", "log1p", "sqrt", "rsqrt",
           "reciprocal", "sin", "cos", "tanh", "sigmoid", "erf", "relu", "abs", "absolute",
           "sign", "floor", "ceil", "trunc", "round", "clamp", "clip", "clamp_min", "clamp_max",
           "maximum", "minimum", "where", "masked_fill", "isnan", "isinf", "isfinite",
           "positive", "square", "logical_and", "logical_or", "logical_xor", "logical_not",
           "bitwise_and", "bitwise_or", "bitwise_xor", "bitwise_not",
           "eq", "ne", "lt", "le", "gt", "ge"]
TENSOR_METHODS = [n for n in __all__ if n != "where"]
