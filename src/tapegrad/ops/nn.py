"""Fused nn composites: ops whose numerics or speed need their own gradient rule.

Each rule is written with registered ops only, so it runs on raw arrays (plain backward)
and on Tensors (``create_graph``): second derivatives come from recording the rule. Where a
rule needs another big computation (conv, pooling, embedding) that computation is itself an
op here, and the family closes on itself: conv2d, conv2d_input and conv2d_weight are the
three partial derivatives of one trilinear form, so each one's rule is the other two.
"""
import math

from tapegrad.backend import reduce_axis, array_module, add_at
from tapegrad.ops.registry import op, xp
from tapegrad.ops import registry as _registry
from tapegrad.ops.elementwise import exp, log, sqrt, tanh, sigmoid, erf, where_op as where
from tapegrad.ops.elementwise import mul, add
from tapegrad.ops.elementwise import np_dtype, to_dtype, eq, ne, gt, select, _floating
from tapegrad.ops.movement import reshape_op as reshape, sum_to, broadcast_to_op as broadcast_to
from tapegrad.ops.movement import permute_op as permute
from tapegrad.ops.reduce import sum_op
from tapegrad.ops.linalg import matmul, blas_matmul
from tapegrad.ops.indexing import recorder
from tapegrad.autograd.grad_mode import state as grad_state
# convolution and pooling live in their own families; re-exported for ``ops.nn`` readers
from tapegrad.ops.convolution import (  # noqa: F401
    conv2d, conv2d_input, conv2d_weight, _patches, _columns, _col2im)
from tapegrad.ops.pooling import (  # noqa: F401
    max_pool2d_indices, max_pool2d, max_pool2d_backward, avg_pool2d, avg_pool2d_backward)


def _keep(g, shape, dims):
    """``g`` (reduced over ``dims`` without keepdim) reshaped so it broadcasts against shape."""
    return reshape(g, shape=tuple(1 if i in dims else n for i, n in enumerate(shape)))


def _mean_keep(a, dims, n):
    return sum_op(a, dims=dims, keepdim=True) / n


# --- linear ------------------------------------------------------------------------------
@op(flops=2, needs=True, fused=True, uses=((1,), (0,), ()))
def linear(x, w, b=None):
    """``x @ w.T + b``; fused so the rule needs no transposed copy and sums the bias once."""
    out = blas_matmul(x, w.T)  # a stack of rows: one 2-D GEMM (backend.blas.matmul)
    if b is not None:
        out += b
    return out


@linear.grad(traces=True)
def _(g, out, x, w, b=None, needs=(True, True, True)):
    gx = matmul(g, w) if needs[0] else None
    gw = gb = None
    if needs[1] or (b is not None and needs[2]):
        g2 = reshape(g, shape=(-1, w.shape[0]))
        if needs[1]:
            gw = matmul(g2.mT, reshape(x, shape=(-1, w.shape[1])))
        if b is not None and needs[2]:
            gb = sum_op(g2, dims=(0,))
    return gx, gw, gb


@linear.jvp
def _(t, out, x, w, b=None):
    tx, tw = t[0], t[1]
    tb = t[2] if len(t) > 2 else None
    if tx is None:  # the bias tangent is added in place into the one product
        return linear(x, tw, tb) if tw is not None else tb
    r = linear(tx, w, tb)
    return r if tw is None else r + linear(x, tw)


@op(flops=3, saves="both", needs=True, fused=True, uses=((1,), (0,), ()))
def linear_relu(x, w, b=None):
    """``relu(x @ w.T + b)`` as one node: the bias add and the ReLU run in place on the
    matmul's fresh output, and the rule masks ``g`` by ``out > 0`` then applies linear's."""
    out = blas_matmul(x, w.T)
    if b is not None:
        out += b
    return xp.maximum(out, 0, out=out)


@linear_relu.grad
def _(g, out, x, w, b=None, needs=(True, True, True)):
    return linear.rule(g * (out > 0), None, x, w, b, needs=needs)


@linear_relu.jvp
def _(t, out, x, w, b=None):
    r = linear.jvp_rule(t, None, x, w, b)
    return None if r is None else r * (out > 0)


_contraction = _registry.contraction_cost

_numel = _registry.numel
# x (..., in) against w (out, in): 2 * rows * out * in
linear.costs(_contraction(lambda a, out: 2 * _numel(out) * a[0].shape[-1]))
linear_relu.costs(_contraction(lambda a, out: 2 * _numel(out) * a[0].shape[-1]))


# --- activations -------------------------------------------------------------------------
_GELU_BETA = math.sqrt(2.0) * (2.0 / math.sqrt(math.pi)) * 0.5
_GELU_KAPPA = 0.044715
_SQRT1_2 = 1.0 / math.sqrt(2.0)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)


@op(flops=20, float_only=True, fused=True, pointwise=True)
def gelu(x, approximate="none"):
    """Exact ``x * Phi(x)`` or the tanh approximation, as ``torch.nn.functional.gelu``."""
    if approximate == "tanh":
        out = 0.5 * x * (1 + xp.tanh(_GELU_BETA * (x + _GELU_KAPPA * x * x * x)))
    else:
        out = x * 0.5 * (1 + erf(x * _SQRT1_2))
    return out.astype(x.dtype, copy=False)  # numpy makes bfloat16 * Python float a float32


@gelu.grad(traces=True)
def _(g, out, x, approximate="none"):
    return gelu_backward(g, x, approximate=approximate)


def _exact_gelu(node):
    """Whether a gelu/gelu_backward node is the exact (erf) form: the one with a scalar form."""
    return set(node.params) <= {"approximate"} and node.params.get("approximate") in (
        None, "none")


def _gelu_scalar(ctx, x, approximate="none"):
    """gelu's forward for one element, eager's operations in eager's order (erf: ctx.erf)."""
    c = ctx.const
    phi = ctx.erf(f"({x} * {c(_SQRT1_2)})", 0, _SQRT1_2, "gelu_erf_exp")
    return f"(({x} * {c(0.5)}) * ({c(1.0)} + {phi}))"


gelu.lower(_gelu_scalar, accepts=_exact_gelu, alone=True)


def _gelu_d2(x, approximate):
    """gelu''(x), written with ops so that higher orders record."""
    if approximate == "tanh":
        t = tanh(_GELU_BETA * (x + _GELU_KAPPA * x * x * x))
        du = _GELU_BETA * (1 + 3 * _GELU_KAPPA * x * x)
        return (1 - t * t) * (du - x * t * du * du + 3 * _GELU_BETA * _GELU_KAPPA * x * x)
    return exp(-0.5 * x * x) * _INV_SQRT_2PI * (2 - x * x)


@op(flops=25, fused=True, pointwise=True)
def gelu_backward(g, x, approximate="none"):
    """``g * gelu'(x)``: gelu's gradient, an op so that its own gradient is gelu''."""
    if approximate == "tanh":
        inner = _GELU_BETA * (x + _GELU_KAPPA * x * x * x)
        t = xp.tanh(inner)
        left = 0.5 * x
        right = 1 + t
        dright = left * (1 - t * t) * _GELU_BETA * (1 + 3 * _GELU_KAPPA * x * x)
        return (g * (0.5 * right + dright)).astype(g.dtype, copy=False)
    cdf = 0.5 * (1 + erf(x * _SQRT1_2))
    pdf = xp.exp(-0.5 * x * x) * _INV_SQRT_2PI
    return (g * (cdf + x * pdf)).astype(g.dtype, copy=False)  # bfloat16 * Python float


def _gelu_exp(x, out):
    """gelu_backward's ``exp(-0.5 * x * x)`` into ``out``: eager's ufunc calls in its order."""
    xp.multiply(-0.5, x, out=out)
    xp.multiply(out, x, out=out)
    return xp.exp(out, out=out)


def _gelu_backward_scalar(ctx, g, x, approximate="none"):
    """gelu_backward's forward for one element, eager's operations in eager's order; its exp
    numba's where that is numpy's, else numpy's before the kernel (``_gelu_exp``)."""
    c = ctx.const
    phi = ctx.erf(f"({x} * {c(_SQRT1_2)})", 1, _SQRT1_2, "gelu_erf_exp")
    e = ctx.libm("exp", f"(({c(-0.5)} * {x}) * {x})", 1, "gelu_exp", _gelu_exp)
    return f"({g} * (({c(0.5)} * ({c(1.0)} + {phi})) + ({x} * ({e} * {c(_INV_SQRT_2PI)}))))"


gelu_backward.lower(_gelu_backward_scalar, accepts=_exact_gelu, alone=True)


@gelu_backward.grad(traces=True)
def _(gg, out, g, x, approximate="none"):
    return gelu_backward(gg, x, approximate=approximate), gg * g * _gelu_d2(x, approximate)


@op(flops=20, float_only=True, fused=True, pointwise=True)
def softplus(x, beta=1.0, threshold=20.0):
    """``log1p(exp(beta x)) / beta``, linear above ``threshold`` (as PyTorch)."""
    bx = x * beta
    out = xp.where(bx > threshold, x, xp.log1p(xp.exp(xp.minimum(bx, threshold))) / beta)
    return out if out.dtype == x.dtype else out.astype(x.dtype)  # bfloat16 * float: float32



def _softplus_scalar(ctx, x, beta=1.0, threshold=20.0):
    """softplus for one element, eager's operations (numpy's minimum: NaN propagates)."""
    bx, th = f"({x} * {ctx.const(beta)})", ctx.const(threshold)
    low = f"({bx} if (({bx} < {th}) | ({bx} != {bx})) else {th})"  # a tie: the threshold
    soft = f"{ctx.libm('log1p', ctx.libm('exp', low))} / {ctx.const(beta)}"
    return f"({x} if {bx} > {th} else {soft})"


softplus.lower(_softplus_scalar, params=("beta", "threshold"))

@softplus.grad
def _(g, out, x, beta=1.0, threshold=20.0):
    bx = x * beta
    return where(bx > threshold, g, g * sigmoid(bx))


@op(flops=10, float_only=True, fused=True, pointwise=True)
def elu(x, alpha=1.0):
    """``x`` above 0, ``alpha * expm1(x)`` below (expm1: exp(x) - 1 loses digits near 0)."""
    out = xp.where(x > 0, x, alpha * xp.expm1(xp.minimum(x, 0)))
    return out if out.dtype == x.dtype else out.astype(x.dtype)  # bfloat16 * float: float32



elu.lower("({0} if {0} > {dt}(0.0) else {alpha} * np.expm1("
          "({0} if (({0} < {dt}(0.0)) | ({0} != {0})) else {dt}(0.0))))",  # min(-0.0, 0): 0.0
          params=("alpha",), libm=("expm1",))

@elu.grad
def _(g, out, x, alpha=1.0):
    return where(x > 0, g, g * alpha * exp(x))


@op(flops=2, fused=True, pointwise=True)
def hardtanh(x, min_val=-1.0, max_val=1.0):
    """``x`` clipped to [min_val, max_val] (``relu6`` is [0, 6])."""
    out = xp.clip(x, min_val, max_val)
    return out if out.dtype == x.dtype else out.astype(x.dtype)  # int * float bounds: float


def _hardtanh_scalar(ctx, x, min_val=-1.0, max_val=1.0):
    """numpy's clip for one element: NaN stays, a tie keeps ``x``."""
    lo, hi = ctx.const(min_val), ctx.const(max_val)
    m = f"({x} if (({x} >= {lo}) | ({x} != {x})) else {lo})"
    return f"({m} if (({m} <= {hi}) | ({m} != {m})) else {hi})"


hardtanh.lower(_hardtanh_scalar, params=("min_val", "max_val"))


@hardtanh.grad
def _(g, out, x, min_val=-1.0, max_val=1.0):
    return hardtanh_backward(g, x, min_val=min_val, max_val=max_val)


@op(flops=3, fused=True, pointwise=True)
def hardtanh_backward(g, x, min_val=-1.0, max_val=1.0):
    """``g`` where ``min_val < x < max_val``, else 0: zero on the bounds (clamp's rule passes
    on them) and where ``x`` is NaN (as PyTorch's vectorised loop; its scalar tail, used for
    the last few elements, passes ``g`` there)."""
    inside = x > min_val
    inside &= x < max_val
    return select(inside, g, 0.0)


hardtanh_backward.lower("({0} if (({1} > {min_val}) & ({1} < {max_val})) else {dt}(0.0))",
                        params=("min_val", "max_val"))


@hardtanh_backward.grad
def _(gg, out, g, x, min_val=-1.0, max_val=1.0):
    # a mask of x: no gradient reaches x (it is piecewise constant in x)
    return hardtanh_backward(gg, x, min_val=min_val, max_val=max_val), None


def _reduced_float(x):
    """float16/bfloat16 (bfloat16's numpy kind is "V"): computed in float32 and rounded once,
    as PyTorch's CPU kernels compute reduced floats."""
    return x.dtype.kind != "f" or x.dtype.itemsize < 4


@op(flops=5, float_only=True, fused=True, pointwise=True)
def silu(x):
    """``x * sigmoid(x)`` as PyTorch's kernel writes it, ``x / (1 + exp(-x))``: one op, four
    passes in one buffer, and the rule reads only ``x``."""
    x = _floating(x)
    if _reduced_float(x):
        return silu.forward(x.astype(xp.float32)).astype(x.dtype)
    e = xp.negative(x, out=xp.empty_like(x))
    with xp.errstate(over="ignore", invalid="ignore"):  # exp(inf): -inf / inf is NaN there too
        xp.exp(e, out=e)
        e += 1
        return xp.divide(x, e, out=e)


# float32/float64: the forward's passes for one element (float16/bfloat16 go through float32)
silu.lower("({0} / (np.exp(-{0}) + {dt}(1.0)))", libm=("exp",),
           accepts=lambda n: n.outputs[0].dtype.itemsize >= 4)


@silu.grad
def _(g, out, x):
    return silu_backward(g, x)


@op(flops=9, fused=True, pointwise=True, needs=True)
def silu_backward(g, x):
    """``g * s * (1 + x * (1 - s))`` with ``s = sigmoid(x)``: silu's gradient (PyTorch's
    formula), an op so that its own gradient is silu''."""
    if _reduced_float(x):
        return silu_backward.forward(g.astype(xp.float32), x.astype(xp.float32)).astype(g.dtype)
    s = sigmoid.forward(x)
    d = xp.subtract(1, s)
    with xp.errstate(invalid="ignore"):  # x = +-inf: inf * 0 is NaN, as in PyTorch
        d *= x
        d += 1
        d *= s
        return _times(d, g)


def _silu_backward_scalar(ctx, g, x):
    """silu_backward for one element, the forward's operations in order."""
    one = ctx.const(1.0)
    s = f"({one} / ({ctx.libm('exp', f'-{x}')} + {one}))"
    return f"(((({one} - {s}) * {x} + {one}) * {s}) * {g})"


silu_backward.lower(_silu_backward_scalar, accepts=lambda n: n.outputs[0].dtype.itemsize >= 4)


def _times(fresh, g):
    """``fresh * g``, in ``fresh``'s buffer where the product has its dtype and shape."""
    fs, gs = fresh.shape, g.shape
    if fresh.dtype != g.dtype or len(gs) > len(fs) or any(
            d != 1 and d != f for d, f in zip(gs[::-1], fs[::-1])):
        return fresh * g
    fresh *= g
    return fresh


@silu_backward.grad
def _(gg, out, g, x, needs=(True, True)):
    gg_g = silu_backward(gg, x) if needs[0] else None
    gx = None
    if needs[1]:  # silu'' = s (1 - s) (2 + x (1 - 2 s))
        s = sigmoid(x)
        gx = gg * g * (s * (1 - s) * (2 + x * (1 - 2 * s)))
    return gg_g, gx


@op(flops=2, fused=True, pointwise=True)
def leaky_relu(x, negative_slope=0.01):
    """``x`` where ``x > 0``, else ``negative_slope * x`` (PyTorch's values, NaN and inf
    included)."""
    s = negative_slope
    x = _floating(x)
    if x.dtype.kind == "f" and 0 < s <= 1:
        # max(x, s x) picks x above 0 and s x below: two passes, no branch per element
        out = xp.multiply(x, s, out=xp.empty_like(x))
        return xp.maximum(out, x, out=out)
    with xp.errstate(invalid="ignore"):  # a slope of 0 times inf: NaN, as in PyTorch
        out = xp.where(x > 0, x, x * s)
    return out if out.dtype == x.dtype else out.astype(x.dtype)  # bfloat16 * float: float32


def _leaky_relu_scalar(ctx, x, negative_slope=0.01):
    """leaky_relu for one element, as the forward computes it: numpy's maximum of ``s x``
    and ``x`` (NaN propagates) for a slope in (0, 1], else the where."""
    sx = f"({x} * {ctx.const(negative_slope)})"
    if 0 < negative_slope <= 1:
        return f"({sx} if (({sx} > {x}) | ({sx} != {sx})) else {x})"
    return f"({x} if {x} > {ctx.const(0.0)} else {sx})"


leaky_relu.lower(_leaky_relu_scalar, params=("negative_slope",))


@leaky_relu.grad
def _(g, out, x, negative_slope=0.01):
    return leaky_relu_backward(g, x, negative_slope=negative_slope)


@op(flops=2, fused=True, pointwise=True)
def leaky_relu_backward(g, x, negative_slope=0.01):
    """``g`` where ``x > 0``, else ``g * negative_slope``: ``g`` times a factor of 1 or the
    slope (exact: ``g * 1`` is ``g``), so no branch per element."""
    s = negative_slope
    if g.dtype.kind == "f" and math.isfinite(s):
        dt = g.dtype.type
        up = x > 0
        if 0 <= s <= 1:
            f = xp.maximum(up, dt(s), dtype=g.dtype)  # True: 1, False: the slope
        else:
            f = xp.multiply(~up, dt(s), dtype=g.dtype)  # 0 or s; + up: 1 or s, exactly
            f += up
        return _times(f, g)
    return xp.where(x > 0, g, (g * s).astype(g.dtype, copy=False))  # (bfloat16 * float: f32)


# g times 1 (exactly g) or the slope, as the forward's factor
leaky_relu_backward.lower("({0} * ({dt}(1.0) if {1} > {dt}(0.0) else {negative_slope}))",
                          params=("negative_slope",))


@leaky_relu_backward.grad
def _(gg, out, g, x, negative_slope=0.01):
    # a mask of x times g: no gradient reaches x (it is piecewise constant in x)
    return leaky_relu_backward(gg, x, negative_slope=negative_slope), None


@op(flops=10, float_only=True, fused=True, pointwise=True)
def log_sigmoid(x):
    """``min(x, 0) - log1p(exp(-|x|))``: never overflows, never logs an underflowed 0."""
    return xp.minimum(x, 0) - xp.log1p(xp.exp(-xp.abs(x)))


@log_sigmoid.grad
def _(g, out, x):
    return g * sigmoid(-x)


log_sigmoid.lower("(({0} if (({0} < {dt}(0.0)) | ({0} != {0})) else {dt}(0.0)) - "
                  "np.log1p(np.exp(-abs({0}))))", libm=("log1p", "exp"))


@op(flops=2, saves="both", fused=True)
def l2_norm(x, dim):
    """``sqrt(sum(x * x, dim, keepdim=True))``; its gradient is 0 where the norm is 0."""
    return xp.sqrt((x * x).sum(axis=dim, keepdims=True))


@l2_norm.grad
def _(g, out, x, dim):
    zero = out == 0
    return x * (g / where(zero, 1.0, out)) * (out != 0)


@l2_norm.jvp
def _(t, out, x, dim):
    zero = out == 0
    return where(zero, 0.0, sum_op(x * t[0], dims=dim, keepdim=True) / where(zero, 1.0, out))


# --- softmax family ----------------------------------------------------------------------
@op(flops=5, saves="out", float_only=True, fused=True)
def softmax(x, dim):
    """Softmax over ``dim`` with the max subtracted first."""
    if x.size == 0:  # nothing to normalise (and no max over an empty dim)
        return x.copy()
    e = xp.exp(x - reduce_axis(xp.maximum, x, dim, keepdims=True))
    return e / reduce_axis(xp.add, e, dim, keepdims=True)


@softmax.grad(traces=True)
def _(g, out, x, dim):
    return out * (g - sum_op(g * out, dims=(dim,), keepdim=True))


@softmax.jvp
def _(t, out, x, dim):
    return out * (t[0] - sum_op(t[0] * out, dims=(dim,), keepdim=True))


@op(flops=5, saves="out", float_only=True, fused=True)
def log_softmax(x, dim):
    """``x - max - log(sum(exp(x - max)))``: fused, since the log of a softmax underflows."""
    if x.size == 0:
        return x.copy()
    s = x - reduce_axis(xp.maximum, x, dim, keepdims=True)
    return s - xp.log(reduce_axis(xp.add, xp.exp(s), dim, keepdims=True))


@log_softmax.grad(traces=True)
def _(g, out, x, dim):
    return g - exp(out) * sum_op(g, dims=(dim,), keepdim=True)


@log_softmax.jvp
def _(t, out, x, dim):
    return t[0] - sum_op(exp(out) * t[0], dims=(dim,), keepdim=True)


def _weighted_sum(q, a, dim):
    """``sum(q * a, dim)`` where ``q == 0`` contributes 0 even when ``a`` is -inf."""
    with xp.errstate(invalid="ignore"):
        return reduce_axis(xp.add, xp.where(q == 0, 0, q * a), dim)


@op(flops=8, needs=True, fused=True)
def softmax_cross_entropy(x, q, dim):
    """Per-sample ``-sum(q * log_softmax(x), dim)`` for a (weighted) target distribution q.

    Fused: the gradient is ``softmax(x) * sum(q) - q``, never through the log of a softmax.
    """
    return -_weighted_sum(q, log_softmax.forward(x, dim), dim)


@softmax_cross_entropy.grad(traces=True)
def _(g, out, x, q, dim, needs=(True, True)):
    logp = log_softmax(x, dim=dim)
    ge = _keep(g, x.shape, (dim,))
    gx = ge * (exp(logp) * sum_op(q, dims=(dim,), keepdim=True) - q) if needs[0] else None
    gq = -ge * logp if needs[1] else None
    return gx, gq


@softmax_cross_entropy.jvp
def _(t, out, x, q, dim):
    # d(-sum q logp) = sum(q) <softmax, tx> - <q, tx> - <tq, logp>
    logp = log_softmax(x, dim=dim)
    r = None
    if t[0] is not None:
        r = (sum_op(exp(logp) * t[0], dims=(dim,)) * sum_op(q, dims=(dim,))
             - sum_op(q * t[0], dims=(dim,)))
    if len(t) > 1 and t[1] is not None:
        rq = nll_loss(logp, t[1], dim=dim)
        r = rq if r is None else r + rq
    return r


@op(flops=8, fused=True)
def cross_entropy_index(x, t, ignore_index=-100, mean=True):
    """Mean (or sum) cross-entropy of logits (N, C) against class indices (N,): one node.

    The common case of ``F.cross_entropy``, without building a one-hot target: per row
    ``logsumexp(x) - x[target]``, ignored rows counted out. Fused: the gradient is
    ``(softmax(x) - onehot) * valid / count``, never through the log of a softmax.
    """
    n = x.shape[0]
    s = x - reduce_axis(xp.maximum, x, 1, keepdims=True)
    lse = xp.log(reduce_axis(xp.add, xp.exp(s), 1))
    valid = t != ignore_index
    if valid.all():
        losses = lse - s[xp.arange(n), t]
        count = n
    else:
        losses = xp.where(valid, lse - s[xp.arange(n), xp.where(valid, t, 0)], 0)
        count = int(valid.sum())
    total = losses.sum()
    if not mean:
        return total
    return total / count if count else xp.full((), xp.nan, x.dtype)  # all ignored: nan


@cross_entropy_index.grad(traces=True)
def _(g, out, x, t, ignore_index=-100, mean=True):
    return cross_entropy_index_backward(g, x, t, ignore_index=ignore_index, mean=mean), None


def _shape_constant(a, like):
    """``a``, made from shapes and params only, as a Tensor when ``like`` is one: under the
    compiler's tracer a constant of the graph (not a value computed outside ops)."""
    if not isinstance(like, _registry.Tensor):
        return a
    t = _registry.Tensor._make(a)
    rec = recorder() if grad_state.modes else None
    if rec is not None:
        rec.constant(t)
    return t


def _ce_target(x, t, ignore_index, mean, empty=0.0):
    """One-hot ``target`` (..., N, C), the valid rows ``keep`` (..., N, 1) and the loss's
    1 / count (``empty`` where every row is ignored) from the class indices ``t`` (..., N), for
    the rules and vmap's batch rules (a leading batch dim). Built from ops: under vmap or a
    tracer the indices are batched or symbolic, so nothing here reads their values in Python
    (on arrays, forward mode's array path, the ops run as their forwards)."""
    c = x.shape[-1]
    dt = np_dtype(x.dtype)  # x is an array, or a Tensor in a rule
    rows = tuple(t.shape) + (1,)
    valid = ne(t, ignore_index)
    keep = to_dtype(reshape(valid, shape=rows), dtype=dt)
    # an ignored row's index may name a class (0 <= ignore_index < C): keep zeroes it
    classes = _shape_constant(array_module(getattr(x, "_data", x)).arange(c), x)
    target = to_dtype(eq(reshape(t, shape=rows), classes), dtype=dt) * keep
    if not mean:
        return target, keep, 1.0
    count = sum_op(valid, dims=(len(t.shape) - 1,), dtype=dt)
    some = gt(count, 0)
    return target, keep, where(some, 1.0 / where(some, count, 1.0), empty)


@op(flops=6, fused=True)
def cross_entropy_index_backward(g, x, t, ignore_index=-100, mean=True):
    """cross_entropy_index's gradient ``(softmax(x) * valid - onehot) * g / count``: one op,
    so a traced backward reads the indices at run time (nothing frozen)."""
    # on arrays, without a one-hot: ((softmax * valid) - onehot) * (g / count) in that order
    # (the compiler's fused kernel matches it bit for bit); the rules build it from ops
    n = x.shape[0]
    valid = t != ignore_index
    everything = bool(valid.all())
    count = (n if everything else int(valid.sum())) if mean else 1
    # every row ignored: the loss is nan but its gradient 0, as PyTorch's nll_loss backward
    scale = g * ((1.0 / count) if count else 0.0)
    out = softmax.forward(x, 1)
    rows = array_module(x).arange(n)
    if everything:
        out[rows, t] -= 1
    else:
        out *= valid[:, None]
        out[rows, xp.where(valid, t, 0)] -= valid
    if xp.result_type(out, scale) != out.dtype:  # a wider g: the product promotes
        return out * scale
    out *= scale
    return out


@cross_entropy_index_backward.grad(traces=True)
def _(gg, out, g, x, t, ignore_index=-100, mean=True):
    target, keep, scale = _ce_target(x, t, ignore_index, mean)
    p = softmax(x, dim=1)
    u = gg * keep * (g * scale)
    gx = p * (u - sum_op(u * p, dims=(1,), keepdim=True))
    gg_g = sum_op(gg * (p * keep - target), dims=(0, 1)) * scale
    return gg_g, gx, None


@cross_entropy_index_backward.jvp
def _(tt, out, g, x, t, ignore_index=-100, mean=True):
    target, keep, scale = _ce_target(x, t, ignore_index, mean)
    p = softmax(x, dim=1)
    r = None
    if tt[0] is not None:
        r = (p * keep - target) * (tt[0] * scale)
    if len(tt) > 1 and tt[1] is not None:
        dp = p * (tt[1] - sum_op(tt[1] * p, dims=(1,), keepdim=True))
        rx = dp * keep * (g * scale)
        r = rx if r is None else r + rx
    return r


@cross_entropy_index.jvp
def _(t, out, x, target, ignore_index=-100, mean=True):
    # a scalar loss: J t = <d loss / dx, t>, the derivative being (softmax - onehot) * valid
    # (on arrays, forward mode's array path, it stays an array)
    one = _shape_constant(xp.ones((), np_dtype(x.dtype)), x)
    d = cross_entropy_index.rule(one, out, x, target, ignore_index, mean)[0]
    return sum_op(d * t[0], dims=tuple(range(x.ndim)))


@op(flops=2, needs=True, fused=True)
def nll_loss(x, q, dim):
    """Per-sample ``-sum(q * x, dim)``: q is the one-hot target scaled by the class weight."""
    return -_weighted_sum(q, x, dim)


@nll_loss.grad(traces=True)
def _(g, out, x, q, dim, needs=(True, True)):
    ge = _keep(g, x.shape, (dim,))
    return (-ge * q if needs[0] else None), (-ge * x if needs[1] else None)


@nll_loss.jvp
def _(t, out, x, q, dim):
    # bilinear in (x, q)
    r = nll_loss(t[0], q, dim=dim) if t[0] is not None else None
    if len(t) > 1 and t[1] is not None:
        rq = nll_loss(x, t[1], dim=dim)
        r = rq if r is None else r + rq
    return r


_BCE_EPS = 1e-12


@op(flops=10, needs=True, fused=True)
def binary_cross_entropy(x, t):
    """Elementwise ``-(t log x + (1 - t) log(1 - x))`` with each log clamped at -100."""
    with xp.errstate(divide="ignore"):
        return (t - 1) * xp.maximum(xp.log1p(-x), -100) - t * xp.maximum(xp.log(x), -100)


@binary_cross_entropy.grad
def _(g, out, x, t, needs=(True, True)):
    gx = gt = None
    if needs[0]:
        d = (1 - x) * x
        gx = g * (x - t) / where(d < _BCE_EPS, _BCE_EPS, d)
    if needs[1]:
        gt = -g * log(x / (1 - x))
    return gx, gt


@binary_cross_entropy.jvp
def _(t, out, x, y):
    r = None
    if t[0] is not None:
        d = (1 - x) * x
        r = t[0] * (x - y) / where(d < _BCE_EPS, _BCE_EPS, d)
    if len(t) > 1 and t[1] is not None:
        ry = -t[1] * log(x / (1 - x))
        r = ry if r is None else r + ry
    return r


# these reduce: their FLOPs are per element of the input, not of the (smaller) output
for _reducing in (l2_norm, softmax_cross_entropy, cross_entropy_index, nll_loss):
    _registry.per_input_element(_reducing)


# --- normalisation -----------------------------------------------------------------------
def _norm_forward(x, w=None, b=None, *, axes, eps, param_shape):
    if x.size == 0:  # an empty batch: nothing to standardise (and no mean of nothing)
        return x.copy()
    if x.dtype.kind == "V":  # bfloat16: in float32, rounded once (as PyTorch's CPU kernel)
        f = xp.float32
        return _norm_forward(x.astype(f), None if w is None else w.astype(f),
                             None if b is None else b.astype(f), axes=axes, eps=eps,
                             param_shape=param_shape).astype(x.dtype)
    mean = x.mean(axis=axes, keepdims=True)
    xc = x - mean
    rstd = 1 / xp.sqrt((xc * xc).mean(axis=axes, keepdims=True) + eps)
    out = xc * rstd
    if w is not None:
        out = out * w.reshape(param_shape)
    if b is not None:
        out = out + b.reshape(param_shape)
    return out


def _norm_rule(g, out, x, w=None, b=None, *, axes, eps, param_shape, needs=(True,) * 3):
    n = 1
    for a in axes:
        n *= x.shape[a]
    n = max(n, 1)  # an empty batch: its statistics reach no gradient, so no 0 / 0 for them
    xc = x - _mean_keep(x, axes, n)
    rstd = 1 / sqrt(_mean_keep(xc * xc, axes, n) + eps)
    xhat = xc * rstd
    gx = gw = gb = None
    if needs[0]:
        gxhat = g * reshape(w, shape=param_shape) if w is not None else g
        gx = rstd * (gxhat - _mean_keep(gxhat, axes, n)
                     - xhat * _mean_keep(gxhat * xhat, axes, n))
    if w is not None and needs[1]:
        gw = reshape(sum_to(g * xhat, shape=param_shape), shape=w.shape)
    if b is not None and needs[2]:
        gb = reshape(sum_to(g, shape=param_shape), shape=b.shape)
    return gx, gw, gb


def _norm_jvp(t, out, x, w=None, b=None, *, axes, eps, param_shape):
    # d xhat = rstd * (dxc - xhat * mean(xhat * dxc)), dxc = tx - mean(tx)
    n = 1
    for a in axes:
        n *= x.shape[a]
    n = max(n, 1)
    tx = t[0]
    tw = t[1] if len(t) > 1 else None
    tb = t[2] if len(t) > 2 else None
    r = None
    if tx is not None or tw is not None:
        xc = x - _mean_keep(x, axes, n)
        rstd = 1 / sqrt(_mean_keep(xc * xc, axes, n) + eps)
        xhat = xc * rstd
    if tx is not None:
        dxc = tx - _mean_keep(tx, axes, n)
        r = rstd * (dxc - xhat * _mean_keep(xhat * dxc, axes, n))
        if w is not None:
            r = r * reshape(w, shape=param_shape)
    if tw is not None:
        rw = xhat * reshape(tw, shape=param_shape)
        r = rw if r is None else r + rw
    if tb is not None:
        rb = reshape(tb, shape=param_shape)
        r = rb if r is None else r + rb
    return r


def _norm_op(name, doc):
    def forward(x, w=None, b=None, *, axes, eps, param_shape):
        return _norm_forward(x, w, b, axes=axes, eps=eps, param_shape=param_shape)

    forward.__doc__ = doc
    o = op(flops=8, needs=True, fused=True, name=name)(forward)
    o.grad(_norm_rule, traces=True)
    o.jvp(_norm_jvp)
    return o


layer_norm = _norm_op("layer_norm", "Standardise over the trailing ``axes``, then scale/shift.")


def _channel_sum(a, axes):
    """Sums of ``a`` over ``axes``, kept. For (N, C, ...) over all but C: the batch dim first
    (a contiguous pass adding whole planes), then each channel's plane (numpy's pairwise sum
    over contiguous memory), 2-3x faster than one reduction over (0, 2, ...)."""
    nd = len(a.shape)
    if nd > 2 and axes == (0,) + tuple(range(2, nd)):
        return sum_op(sum_op(a, dims=(0,), keepdim=True), dims=axes[1:], keepdim=True)
    return sum_op(a, dims=axes, keepdim=True)


def _count(x, axes):
    n = 1
    for a in axes:
        n *= x.shape[a]
    return max(n, 1)  # an empty batch: its statistics reach no gradient, so no 0 / 0 for them


@op(flops=6, needs=True, fused=True)
def batch_norm(x, w=None, b=None, *, axes, eps, param_shape):
    """Standardise each channel of ``x`` (N, C, ...) with its batch mean and biased variance
    over ``axes`` (two passes: the variance of the centred values, as PyTorch's), then
    scale/shift per channel: six passes over ``x``, 1 / std and the weight folded into one
    per-channel factor."""
    if x.size == 0 or _reduced_float(x):
        return _norm_forward(x, w, b, axes=axes, eps=eps, param_shape=param_shape)
    n = _count(x, axes)
    xc = x - _channel_sum(x, axes) / n
    scale = 1 / xp.sqrt(_channel_sum(xc * xc, axes) / n + eps)
    if w is not None:
        scale = scale * w.reshape(param_shape)
    out = _times(xc, scale)
    if b is not None:
        b = b.reshape(param_shape)
        if out.dtype == xp.result_type(out, b) and out.ndim >= b.ndim:
            out += b
        else:
            out = out + b
    return out


@batch_norm.grad(traces=True)
def _(g, out, x, w=None, b=None, *, axes, eps, param_shape, needs=(True,) * 3):
    # with xc = x - mean, r = 1 / std and the per-channel sums S(g), S(g xc):
    # gx = (g - S(g) / n - xc r^2 S(g xc) / n) r w, gw = S(g xc) r, gb = S(g)
    n = _count(x, axes)
    xc = x - _channel_sum(x, axes) / n
    r = 1 / sqrt(_channel_sum(xc * xc, axes) / n + eps)
    gx = gw = gb = None
    sg = _channel_sum(g, axes) if needs[0] or (b is not None and needs[2]) else None
    sgx = _channel_sum(g * xc, axes) if needs[0] or (w is not None and needs[1]) else None
    if needs[0]:
        k = r * reshape(w, shape=param_shape) if w is not None else r
        gx = (g - sg / n - xc * (sgx * (r * r) / n)) * k
    if w is not None and needs[1]:
        gw = reshape(_sum_to(sgx * r, param_shape), shape=w.shape)
    if b is not None and needs[2]:
        gb = reshape(_sum_to(sg, param_shape), shape=b.shape)
    return gx, gw, gb


batch_norm.jvp(_norm_jvp)


def _per_channel(v, n, groups, cg):
    """A per-group value (N, G, 1) as per-channel (N, C, 1)."""
    return reshape(broadcast_to(v, shape=(n, groups, cg)), shape=(n, groups * cg, 1))


def _per_plane(x):
    """Elements of one (sample, channel) plane of (N, C, ...) ``x``: spelled out, as numpy
    infers no -1 for an empty batch."""
    return math.prod(x.shape[2:])


def _per_group(x, groups):
    return x.shape[1] // groups * _per_plane(x)


@op(flops=6, needs=True, fused=True)
def group_norm(x, w=None, b=None, *, groups, eps):
    """Standardise each group of channels of each sample of ``x`` (N, C, ...) (biased
    variance of the centred values), then scale/shift per channel: six passes, 1 / std and
    the weight folded into one per-(sample, channel) factor."""
    if x.size == 0:
        return x.copy()
    if _reduced_float(x):  # in float32, rounded once (PyTorch's CPU kernels)
        f = xp.float32
        return group_norm.forward(x.astype(f), None if w is None else w.astype(f),
                                  None if b is None else b.astype(f), groups=groups,
                                  eps=eps).astype(x.dtype)
    n, c = x.shape[:2]
    xr = x.reshape(n, groups, _per_group(x, groups))
    m = xr.shape[2]
    xc = xr - reduce_axis(xp.add, xr, 2, keepdims=True) / m
    scale = 1 / xp.sqrt(reduce_axis(xp.add, xc * xc, 2, keepdims=True) / m + eps)
    out = xc.reshape(n, c, _per_plane(x))
    if w is not None:
        scale = (scale * w.reshape(1, groups, c // groups)).reshape(n, c, 1)
    out = _times(out if w is not None else xc, scale).reshape(n, c, _per_plane(x))
    if b is not None:
        b = b.reshape(1, c, 1)
        if out.dtype == xp.result_type(out, b):
            out += b
        else:
            out = out + b
    return out.reshape(x.shape)


@group_norm.grad(traces=True)
def _(g, out, x, w=None, b=None, *, groups, eps, needs=(True,) * 3):
    # per group (sums S over a group's elements, m of them; xc = x - mean, r = 1 / std):
    # gx = (g w - S(g w) / m - xc r^2 S(g w xc) / m) r; the group sums come from the
    # per-channel sums S_c(g), S_c(g xc) (N, C), so g w xc is never formed
    n, c = x.shape[:2]
    cg = c // groups
    xr = reshape(x, shape=(n, groups, _per_group(x, groups)))
    m = xr.shape[2]
    xc = xr - sum_op(xr, dims=(2,), keepdim=True) / m
    r = 1 / sqrt(sum_op(xc * xc, dims=(2,), keepdim=True) / m + eps)  # (N, G, 1)
    gc = reshape(g, shape=(n, c, _per_plane(x)))
    xcc = reshape(xc, shape=(n, c, _per_plane(x)))
    sg = sum_op(gc, dims=(2,))  # (N, C)
    sgx = sum_op(gc * xcc, dims=(2,))
    gx = gw = gb = None
    if needs[0]:
        wg = reshape(w, shape=(1, groups, cg)) if w is not None else None

        def group_sum(s):  # (N, C) per-channel sums, weighted, to (N, G, 1) group sums
            s = reshape(s, shape=(n, groups, cg))
            return sum_op(s * wg if wg is not None else s, dims=(2,), keepdim=True)

        k1 = _per_channel(r, n, groups, cg)
        if w is not None:
            k1 = k1 * reshape(w, shape=(1, c, 1))
        k2 = _per_channel(group_sum(sgx) * (r * r * r) / m, n, groups, cg)
        k3 = _per_channel(group_sum(sg) * r / m, n, groups, cg)
        gx = reshape(gc * k1 - xcc * k2 - k3, shape=x.shape)
    if w is not None and needs[1]:
        gw = sum_op(sgx * reshape(_per_channel(r, n, groups, cg), shape=(n, c)), dims=(0,))
    if b is not None and needs[2]:
        gb = sum_op(sg, dims=(0,))
    return gx, gw, gb


@group_norm.jvp
def _(t, out, x, w=None, b=None, *, groups, eps):
    # d xhat = r (dxc - xhat mean(xhat dxc)) per group, dxc = tx - mean(tx); then per channel
    # d out = d xhat w + xhat tw + tb
    n, c = x.shape[:2]
    tx = t[0]
    tw = t[1] if len(t) > 1 else None
    tb = t[2] if len(t) > 2 else None
    r_out = None
    if tx is not None or tw is not None:
        xr = reshape(x, shape=(n, groups, _per_group(x, groups)))
        m = xr.shape[2]
        xc = xr - sum_op(xr, dims=(2,), keepdim=True) / m
        xhat = xc * (1 / sqrt(sum_op(xc * xc, dims=(2,), keepdim=True) / m + eps))
    if tx is not None:
        txr = reshape(tx, shape=(n, groups, _per_group(x, groups)))
        dxc = txr - sum_op(txr, dims=(2,), keepdim=True) / m
        d = (dxc - xhat * (sum_op(xhat * dxc, dims=(2,), keepdim=True) / m)) * (
            1 / sqrt(sum_op(xc * xc, dims=(2,), keepdim=True) / m + eps))
        r_out = reshape(d, shape=(n, c, _per_plane(x)))
        if w is not None:
            r_out = r_out * reshape(w, shape=(1, c, 1))
    if tw is not None:
        rw = reshape(xhat, shape=(n, c, _per_plane(x))) * reshape(tw, shape=(1, c, 1))
        r_out = rw if r_out is None else r_out + rw
    if tb is not None:
        rb = reshape(tb, shape=(1, c, 1))
        r_out = rb if r_out is None else r_out + rb
    if r_out is None:
        return None
    if tuple(r_out.shape) != (n, c, math.prod(x.shape[2:])):
        r_out = broadcast_to(r_out, shape=(n, c, math.prod(x.shape[2:])))
    return reshape(r_out, shape=tuple(x.shape))


@group_norm.batch
def _(args, bdims, groups, eps):
    # each sample is standardised alone: vmap's batch joins the sample dim (N); per-example
    # weights or biases scale/shift the standardised values after, as (B, 1, C, 1, ...)
    if bdims[0] is None:  # one input for the whole batch: the loop over the batch
        return NotImplemented
    x = _to_front(args[0], bdims[0])
    shape = tuple(x.shape)
    params = list(args[1:]) + [None] * (3 - len(args))
    batched = any(d is not None for d in bdims[1:])
    out = group_norm(reshape(x, shape=(shape[0] * shape[1],) + shape[2:]),
                     *(() if batched else params), groups=groups, eps=eps)
    out = reshape(out, shape=shape)
    if batched:
        for p, d, combine in ((params[0], bdims[1], mul),
                              (params[1], bdims[2] if len(bdims) > 2 else None, add)):
            if p is None:
                continue
            p = _to_front(p, d) if d is not None else reshape(p, shape=(1,) + tuple(p.shape))
            lead = tuple(p.shape)[0]
            out = combine(out, reshape(p, shape=(lead, 1, shape[2]) + (1,) * (len(shape) - 3)))
    return out, 0


def _to_front(a, k):
    """``a`` with its dim ``k`` moved to the front."""
    if k == 0:
        return a
    return permute(a, dims=(k,) + tuple(i for i in range(len(a.shape)) if i != k))


# --- embedding ---------------------------------------------------------------------------
@op(saves="inputs", fused=True)
def embedding(w, idx, padding_idx=None, scale=None):
    """Rows ``w[idx]``; the ``padding_idx`` row gets no gradient; ``scale`` (per lookup)
    multiplies the gradient (scale_grad_by_freq)."""
    return w[idx]


@embedding.grad(traces=True)
def _(g, out, w, idx, padding_idx=None, scale=None):
    return embedding_backward(g, idx, num_weights=w.shape[0], padding_idx=padding_idx,
                              scale=scale), None


@embedding.jvp
def _(t, out, w, idx, padding_idx=None, scale=None):
    return embedding(t[0], idx, padding_idx=padding_idx, scale=scale)  # linear in w


@op(fused=True, linear=True)
def embedding_backward(g, idx, num_weights, padding_idx=None, scale=None):
    """Scatter-add ``g`` into a (num_weights, dim) table, the padding row left at zero."""
    d = g.shape[-1]
    if scale is not None:
        g = g * scale[..., None]
    out = array_module(g).zeros((num_weights, d), dtype=g.dtype)
    add_at(out, idx.reshape(-1), g.reshape(-1, d))
    if padding_idx is not None:
        out[padding_idx] = 0
    return out


@embedding_backward.grad(traces=True)
def _(gg, out, g, idx, num_weights, padding_idx=None, scale=None):
    if padding_idx is not None:
        keep = xp.ones((num_weights, 1), dtype=gg.dtype)
        keep[padding_idx] = 0
        gg = gg * keep
    rows = embedding(gg, idx)
    return (rows if scale is None else rows * scale[..., None]), None


# --- attention ---------------------------------------------------------------------------
@op(flops=4, needs=True, fused=True)
def scaled_dot_product_attention(q, k, v, bias=None, scale=1.0, keep=None):
    """``softmax(q k^T * scale + bias) * keep @ v``; ``keep`` folds in dropout (already
    divided by 1 - p) and zeroes fully masked rows."""
    s = blas_matmul(q, xp.swapaxes(k, -1, -2)) * scale
    if bias is not None:
        s = s + bias
    s = s.astype(q.dtype, copy=False)  # numpy makes bfloat16 * Python float a float32
    p = softmax.forward(s, -1)
    if keep is not None:
        p = p * keep
    return blas_matmul(p, v)


@scaled_dot_product_attention.grad(traces=True)
def _(g, out, q, k, v, bias=None, scale=1.0, keep=None, needs=(True,) * 4):
    if np_dtype(q.dtype).kind != "f":  # keeps bfloat16 (a Python float would not); a float
        scale = xp.asarray(scale, np_dtype(q.dtype))  # stays a literal (traceable, same bits)
    s = matmul(q, k.mT) * scale
    if bias is not None:
        s = s + bias
    p = softmax(s, dim=s.ndim - 1)
    pk = p * keep if keep is not None else p
    gq = gk = gv = gb = None
    if needs[2]:
        gv = _sum_to(matmul(pk.mT, g), v.shape)
    if needs[0] or needs[1] or (bias is not None and needs[3]):
        gp = matmul(g, v.mT)
        if keep is not None:
            gp = gp * keep
        gs = p * (gp - sum_op(gp * p, dims=(p.ndim - 1,), keepdim=True))
        if needs[0]:
            gq = _sum_to(matmul(gs, k) * scale, q.shape)
        if needs[1]:
            gk = _sum_to(matmul(gs.mT, q) * scale, k.shape)
        if bias is not None and needs[3]:
            gb = _sum_to(gs, bias.shape)
    return gq, gk, gv, gb


@scaled_dot_product_attention.jvp
def _(t, out, q, k, v, bias=None, scale=1.0, keep=None):
    # ds = (tq k^T + q tk^T) scale + tbias; dp = p (ds - sum(p ds)); dout = dp keep v + p keep tv
    tq, tk, tv = t[0], t[1], t[2]
    tb = t[3] if len(t) > 3 else None
    scale = xp.asarray(scale, np_dtype(q.dtype))
    s = matmul(q, k.mT) * scale
    if bias is not None:
        s = s + bias
    p = softmax(s, dim=s.ndim - 1)
    ds = None
    for term in ((matmul(tq, k.mT) * scale) if tq is not None else None,
                 (matmul(q, tk.mT) * scale) if tk is not None else None, tb):
        if term is not None:
            ds = term if ds is None else ds + term
    r = None
    if ds is not None:
        dp = p * (ds - sum_op(ds * p, dims=(p.ndim - 1,), keepdim=True))
        r = matmul(dp * keep if keep is not None else dp, v)
    if tv is not None:
        rv = matmul(p * keep if keep is not None else p, tv)
        r = rv if r is None else r + rv
    return r


@scaled_dot_product_attention.costs
def _(arrays, out, params):
    # q k^T and p v: 2 * L * S * (E + Ev) per batch entry (out is (..., L, Ev))
    q, k, v = arrays[:3]
    batch = _numel(out) // (q.shape[-2] * v.shape[-1])
    flops = 2 * batch * q.shape[-2] * k.shape[-2] * (q.shape[-1] + v.shape[-1])
    return flops, _registry.read_bytes(arrays), _registry.written_bytes(out)


def _sum_to(a, shape):
    return a if tuple(a.shape) == tuple(shape) else sum_to(a, shape=tuple(shape))
