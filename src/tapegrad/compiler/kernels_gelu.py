"""Exact GELU's forward and gradient sharing one erf (issue 9).

Eager's ``gelu(x)`` computes ``(x * 0.5) * (1 + erf(x / sqrt 2))`` and its gradient rule
``gelu_backward(g, x)`` computes ``1 + erf(x / sqrt 2)`` again from the same ``x`` (so does
PyTorch: the rule keeps no more than ``x``). Erf is most of GELU's cost (float64: one numpy
``exp`` and two rational fits an element; float32: a degree-23 polynomial), so where a traced
graph has both on the same value the pass ``share_gelu_erf`` makes the forward return
``w = 1 + erf(x / sqrt 2)`` beside its result (``gelu_with_cdf``) and the gradient read it
(``gelu_backward_from_cdf``): one array of the input's size kept from forward to backward,
one erf less per GELU per step, the same bits (the same operations on the same values).

Each node has a numpy body (eager's own ops, used without numba and as the reference) and a
numba kernel (one pass; float64 erf reads numpy's ``exp`` computed before it, float32 erf is
``erf32``, as ``kernels.py``'s fused GELU kernels do).
"""
import numpy as np

from tapegrad.compiler import kernels, op_kernels, passes
from tapegrad.compiler.ir import Node, Value
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
    replace = {}
    for f in graph.nodes:
        if f.name != "gelu" or f.op is None or f.params.get("approximate", "none") != "none" \
                or not isinstance(f.inputs[0], Value) or id(f.inputs[0]) not in backward:
            continue
        x = f.inputs[0]
        if x.dtype not in (np.float32, np.float64) or f.outputs[0].dtype != x.dtype:
            continue
        rules = [b for b in backward[id(x)] if b.outputs[0].dtype == x.dtype and
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


def _source(name, dtype):
    """The numba source of the two kernels for one dtype (flat, C-contiguous operands)."""
    f64 = dtype == np.float64
    t = "np.float64" if f64 else "np.float32"
    erf = "erf64(u, e[i])" if f64 else "np.float32(erf32(np.float64(u)))"
    head = ["import math", "import numpy as np", "from numba import njit", "",
            kernels.erf64_source() if f64 else kernels.erf32_source(), ""]
    if name == "forward":
        body = [f"def gelu_with_cdf_{t[3:]}(x, e, out, w):",
                "    for i in range(x.size):",
                "        xi = x[i]",
                f"        u = xi * {t}({_SQRT1_2!r})",
                f"        wi = {t}(1.0) + {erf}",
                "        w[i] = wi",
                f"        out[i] = (xi * {t}(0.5)) * wi"]
    else:
        body = [f"def gelu_backward_from_cdf_{t[3:]}(g, x, w, p, out):",
                "    for i in range(x.size):",
                f"        out[i] = g[i] * (({t}(0.5) * w[i]) + (x[i] * (p[i] * "
                f"{t}({_INV_SQRT_2PI!r}))))"]
    return "\n".join(head + ['@njit(error_model="numpy", cache=True)'] + body) + "\n"


def _flat(a):
    return a.reshape(-1) if a.flags.c_contiguous else np.ascontiguousarray(a).reshape(-1)


@op_kernels.register("gelu_with_cdf")
def gelu_with_cdf_factory(node):
    x = node.inputs[0]
    dt = np.dtype(x.dtype)
    fn = kernels.load(f"gelu_with_cdf_{dt.name}", _source("forward", dt))
    # float64 erf's exp(-min(|u|, 6)^2), numpy's, as eager (kernels.outside_call), into a
    # scratch array of this node's (as the generated code's planned buffers: one per entry)
    scratch = np.empty(int(np.prod(x.shape)), dt) if dt == np.float64 else None

    def gelu_with_cdf_kernel(xa):
        out, w = np.empty(xa.shape, dt), np.empty(xa.shape, dt)
        xf = _flat(xa)
        e = xf if scratch is None else kernels.outside_call("gelu_erf_exp", xf, scratch)
        fn(xf, e, out.reshape(-1), w.reshape(-1))
        return out, w

    return gelu_with_cdf_kernel


@op_kernels.register("gelu_backward_from_cdf")
def gelu_backward_from_cdf_factory(node):
    g, x, w = node.inputs
    if not (g.dtype == x.dtype == w.dtype) or not (g.shape == x.shape == w.shape):
        return None
    dt = np.dtype(x.dtype)
    fn = kernels.load(f"gelu_backward_from_cdf_{dt.name}", _source("backward", dt))
    scratch = np.empty(int(np.prod(x.shape)), dt)  # exp(-0.5 x x), numpy's (eager's order)

    def gelu_backward_from_cdf_kernel(ga, xa, wa):
        out = np.empty(xa.shape, dt)
        xf = _flat(xa)
        fn(_flat(ga), xf, _flat(wa), kernels.outside_call("gelu_exp", xf, scratch),
           out.reshape(-1))
        return out

    return gelu_backward_from_cdf_kernel
