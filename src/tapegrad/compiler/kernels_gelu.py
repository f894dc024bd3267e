"""Exact GELU's forward and gradient sharing one erf (issue 9).

Eager's ``gelu(x)`` computes ``(x * 0.5) * (1 + erf(x / sqrt 2))`` and its gradient rule
``gelu_backward(g, x)`` computes ``1 + erf(x / sqrt 2)`` again from the same ``x`` (so does
PyTorch: the rule keeps no more than ``x``). Erf is most of GELU's cost (float64: one numpy
``exp`` and two rational fits an element; float32: a degree-23 polynomial), so where a traced
graph has both on the same value the pass ``share_gelu_erf`` makes the forward return
``w = 1 + erf(x / sqrt 2)`` beside its result (``gelu_with_cdf``) and the gradient read it
(``gelu_backward_from_cdf``): one array of the input's size kept from forward to backward,
one erf less per GELU per step, the same bits (the same operations on the same values).

Each node has a numpy body (eager's own ops, used without numba and as the reference) and
numba kernels: float32 erf is ``erf32`` (as ``kernels.py``'s fused GELU kernels), float64 erf
is eager's ``erf64`` run as eager runs it (the few lanes with |u| > 1 gathered, numpy's ``exp``
of theirs only), and the gradient's ``exp(-x*x/2)`` is numpy's of an argument a numba pass
forms.
"""
import numpy as np

from tapegrad.compiler import kernels, op_kernels, passes
from tapegrad.compiler.ir import Node, Value
from tapegrad.compiler.kernels import _polevl
from tapegrad.ops.error_function import CEPHES, CLAMP
from tapegrad.ops.nn import _INV_SQRT_2PI, _SQRT1_2


def _erf(x):
    from tapegrad.ops.elementwise import erf

    return erf(x)


def gelu_with_cdf(x):
    """``(gelu(x), 1 + erf(x / sqrt 2))`` as eager's ``ops.nn.gelu`` computes them."""
    w = 1 + _erf(x * _SQRT1_2)
    return (x * 0.5 * w).astype(x.dtype, copy=False), w.astype(x.dtype, copy=False)


def gelu_backward_from_cdf(g, x, w):
    """``gelu_backward(g, x)`` given ``w = 1 + erf(x / sqrt 2)`` (eager's ``ops.nn``
    expression, operation for operation)."""
    cdf = 0.5 * w
    pdf = np.exp(-0.5 * x * x) * _INV_SQRT_2PI
    return (g * (cdf + x * pdf)).astype(g.dtype, copy=False)


def share_gelu_erf(graph):
    """A graph pass: ``gelu(x)`` and ``gelu_backward(g, x)`` of the same ``x`` (exact form)
    become ``gelu_with_cdf(x) -> (out, w)`` and ``gelu_backward_from_cdf(g, x, w)``."""
    backward = {}
    for n in graph.nodes:
        if n.name == "gelu_backward" and n.op is not None and \
                n.params.get("approximate", "none") == "none" and len(n.inputs) == 2 and \
                all(isinstance(a, Value) for a in n.inputs):
            backward.setdefault(id(n.inputs[1]), []).append(n)
    pos = {id(n): i for i, n in enumerate(graph.nodes)}
    replace = {}
    for f in graph.nodes:
        if f.name != "gelu" or f.op is None or f.params.get("approximate", "none") != "none" \
                or not isinstance(f.inputs[0], Value) or id(f.inputs[0]) not in backward:
            continue
        x = f.inputs[0]
        if x.dtype not in (np.float32, np.float64) or f.outputs[0].dtype != x.dtype:
            continue
        # rules after this forward (they read its w) not taken by an earlier forward of x
        rules = [b for b in backward[id(x)] if pos[id(b)] > pos[id(f)] and id(b) not in
                 replace and b.outputs[0].dtype == x.dtype and
                 b.inputs[0].shape == x.shape and b.inputs[0].dtype == x.dtype]
        if not rules:
            continue
        w = graph.new_value(x.shape, x.dtype, f"{f.outputs[0].name}_cdf")
        replace[id(f)] = Node(None, "gelu_with_cdf", [x], {}, [f.outputs[0], w],
                              impl=gelu_with_cdf)
        for b in rules:
            replace[id(b)] = Node(None, "gelu_backward_from_cdf", [b.inputs[0], x, w], {},
                                  list(b.outputs), impl=gelu_backward_from_cdf)
    return passes.replace_nodes(graph, replace, set())


def _src(lines, erf="", flags=""):
    return "\n".join(["import math", "import numpy as np", "from numba import njit", "",
                      erf, "", f'@njit(error_model="numpy", cache=True{flags})'] + lines) + "\n"


def _forward32():
    """float32: one pass, erf by ``erf32`` (in float64, rounded once). Multiply-adds may
    contract to FMAs: the only adds are erf32's polynomial (not bitwise by design; the same
    float32 results as without FMAs on 3e7 inputs, 1.2x faster) and ``1 + erf``, whose
    operand is the float32 rounding, which LLVM cannot contract across."""
    return _src(["def gelu_with_cdf_float32(x, out, w):",
                 "    for i in range(x.size):",
                 "        xi = x[i]",
                 f"        u = xi * np.float32({_SQRT1_2!r})",
                 "        wi = np.float32(1.0) + np.float32(erf32(np.float64(u)))",
                 "        w[i] = wi",
                 "        out[i] = (xi * np.float32(0.5)) * wi"], kernels.erf32_source(),
                ', fastmath={"contract"}')


# float64, eager's erf64 (ops.error_function) in three steps, as eager runs it: the lanes
# with |u| > 1 (~2% of a GPT's GELU arguments) gathered with their exp argument; numpy's exp
# of those; the first formula over every lane and the second over the gathered ones, each a
# vectorised loop, the second's values scattered back. The same operations per element as
# eager's (and as kernels.erf64), so the same bits.
_GATHER64 = _src([
    "def gelu_cdf_gather_float64(x, ub, arg, idx):",
    "    m = 0",
    "    for i in range(x.size):",
    f"        u = x[i] * {_SQRT1_2!r}",
    "        a = abs(u)",
    "        if a > 1.0:",
    "            idx[m] = i",
    "            ub[m] = u",
    f"            b = a if a <= {CLAMP!r} else {CLAMP!r}",
    "            arg[m] = (-b) * b",
    "            m += 1",
    "    return m"])


def _finish64():
    c = CEPHES
    return _src([
        "def gelu_cdf_finish_float64(x, out, w, ub, e, idx, m):",
        "    for i in range(x.size):",
        "        xi = x[i]",
        f"        u = xi * {_SQRT1_2!r}",
        "        z = u * u",
        f"        wi = 1.0 + u * {_polevl('z', c['T'])} / {_polevl('z', c['U'], True)}",
        "        w[i] = wi",
        "        out[i] = (xi * 0.5) * wi",
        "    for k in range(m):",
        "        u = ub[k]",
        "        a = abs(u)",
        f"        b = a if a <= {CLAMP!r} else {CLAMP!r}",
        f"        ub[k] = math.copysign(1.0 - (e[k] * {_polevl('b', c['P'])}) / "
        f"{_polevl('b', c['Q'], True)}, u)",
        "    for k in range(m):",
        "        i = idx[k]",
        "        wi = 1.0 + ub[k]",
        "        w[i] = wi",
        "        out[i] = (x[i] * 0.5) * wi"])


def _backward(dtype):
    """``g * (0.5 w + x pdf)``; first the argument of pdf's exp, ``(-0.5 x) x``."""
    t = f"np.{np.dtype(dtype).name}"
    return (_src([f"def gelu_pdf_argument_{t[3:]}(x, out):",
                  "    for i in range(x.size):",
                  f"        out[i] = ({t}(-0.5) * x[i]) * x[i]"]),
            _src([f"def gelu_backward_from_cdf_{t[3:]}(g, x, w, p, out):",
                  "    for i in range(x.size):",
                  f"        out[i] = g[i] * (({t}(0.5) * w[i]) + (x[i] * (p[i] * "
                  f"{t}({_INV_SQRT_2PI!r}))))"]))


def _flat(a):
    return a.reshape(-1) if a.flags.c_contiguous else np.ascontiguousarray(a).reshape(-1)


@op_kernels.register("gelu_with_cdf")
def gelu_with_cdf_factory(node):
    x = node.inputs[0]
    dt = np.dtype(x.dtype)
    if dt == np.float32:
        fn = kernels.load("gelu_with_cdf_float32", _forward32())

        def gelu_with_cdf_kernel(xa):
            out, w = np.empty(xa.shape, dt), np.empty(xa.shape, dt)
            fn(_flat(xa), out.reshape(-1), w.reshape(-1))
            return out, w

        return gelu_with_cdf_kernel
    gather = kernels.load("gelu_cdf_gather_float64", _GATHER64)
    finish = kernels.load("gelu_cdf_finish_float64", _finish64())
    n = int(np.prod(x.shape))
    # scratch arrays of this node's (as the generated code's planned buffers: one per entry)
    ub, arg, idx = np.empty(n), np.empty(n), np.empty(n, np.int64)

    def gelu_with_cdf_kernel(xa):
        out, w = np.empty(xa.shape, dt), np.empty(xa.shape, dt)
        xf = _flat(xa)
        m = gather(xf, ub, arg, idx)
        e = np.exp(arg[:m], out=arg[:m])  # numpy's exp, as eager's erf64
        finish(xf, out.reshape(-1), w.reshape(-1), ub, e, idx, m)
        return out, w

    return gelu_with_cdf_kernel


@op_kernels.register("gelu_backward_from_cdf")
def gelu_backward_from_cdf_factory(node):
    g, x, w = node.inputs
    if not (g.dtype == x.dtype == w.dtype) or not (g.shape == x.shape == w.shape):
        return None
    dt = np.dtype(x.dtype)
    arg_src, src = _backward(dt)
    argument = kernels.load(f"gelu_pdf_argument_{dt.name}", arg_src)
    fn = kernels.load(f"gelu_backward_from_cdf_{dt.name}", src)
    p = np.empty(int(np.prod(x.shape)), dt)  # exp(-0.5 x x): numpy's exp, as eager

    def gelu_backward_from_cdf_kernel(ga, xa, wa):
        out = np.empty(xa.shape, dt)
        xf = _flat(xa)
        argument(xf, p)
        fn(_flat(ga), xf, _flat(wa), np.exp(p, out=p), out.reshape(-1))
        return out

    return gelu_backward_from_cdf_kernel
