"""More pointwise ops: ``fmax``/``fmin`` (NaN-ignoring), ``signbit``, ``float_power``, ``sgn``,
``rsub`` and the bit shifts ``bitwise_left_shift``/``bitwise_right_shift`` (``<<``, ``>>``).
"""
from tapegrad import dtypes
from tapegrad.ops import registry
from tapegrad.ops.elementwise import isnan, pow, sign, sub_alpha, where_op
from tapegrad.ops.registry import op, xp


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

__all__ = ["fmax", "fmin", "signbit", "float_power", "sgn", "rsub", "bitwise_left_shift",
           "bitwise_right_shift"]
TENSOR_METHODS = ["fmax", "fmin", "signbit", "float_power", "sgn", "bitwise_left_shift",
                  "bitwise_right_shift"]
# Tensor.<name>_; float_power_ is its own (float64 only). Also in-place forms PyTorch has for
# ops defined elsewhere.
INPLACE = ["sgn", "bitwise_left_shift", "bitwise_right_shift", "logical_and", "logical_or",
           "logical_xor", "bitwise_not", "true_divide", "erfc", "cumsum", "tril",
           "triu"]
