"""Exact GELU's forward and gradient sharing one erf.

Eager's ``gelu(x)`` computes ``(x * 0.5) * (1 + erf(x / sqrt 2))`` and its gradient rule
``gelu_backward(g, x)`` computes ``1 + erf(x / sqrt 2)`` again from the same ``x`` (so does
PyTorch: the rule keeps no more than ``x``). Erf is most of GELU's cost (float64: one numpy
``exp`` and two rational fits an element; float32: a float64 polynomial), so where a traced
graph has both on the same value the pass ``share_gelu_erf`` makes the forward return
``w = 1 + erf(x / sqrt 2)`` beside its result (``gelu_with_cdf``) and the gradient read it
(``gelu_backward_from_cdf``): one array of the input's size kept from forward to backward
(two: the forward also writes the gradient's exp argument ``(-0.5 x) x``), one erf less per
GELU per step, the same bits (the same operations on the same values).

Each node has a numpy body (eager's own ops, used without numba and as the reference) and
numba kernels: float32 erf is ``ERF32_SHORT``, a degree-15 fit, where |u| <= 2 (nearly every
GELU argument) and ``ERF32_MID``, a degree-21 fit of erf on 2 < |u| <= 4, beyond (checked on
every float32 input: GELU's float32 results are eager's), float64 erf
is eager's ``erf64`` run as eager runs it (the few lanes with |u| > 1 gathered, numpy's ``exp``
of theirs only), and the gradient's ``exp(-x*x/2)`` is numpy's of the argument the forward
kernel wrote. The gradient node also returns the next linear's bias gradient (the column sums of its
result), added up row by row as its kernel writes them.
"""
import numpy as np

from tapegrad.compiler import kernels, op_kernels, passes
from tapegrad.compiler.ir import Node, Value, call_node
from tapegrad.compiler.kernels import _polevl
from tapegrad.ops.error_function import CEPHES, CLAMP
from tapegrad.ops.nn import _INV_SQRT_2PI, _SQRT1_2


def _erf(x):
    from tapegrad.ops.elementwise import erf

    return erf(x)


def gelu_with_cdf(x):
    """``(gelu(x), 1 + erf(x / sqrt 2), -0.5 * x * x)`` as eager's ``ops.nn.gelu`` computes
    the first two and ``gelu_backward`` the argument of its ``exp``."""
    w = 1 + _erf(x * _SQRT1_2)
    return ((x * 0.5 * w).astype(x.dtype, copy=False), w.astype(x.dtype, copy=False),
            (-0.5 * x * x).astype(x.dtype, copy=False))


def gelu_backward_from_cdf(g, x, w, a):
    """``gelu_backward(g, x)`` given ``w = 1 + erf(x / sqrt 2)`` and ``a = -0.5 * x * x``
    (eager's ``ops.nn`` expression, operation for operation)."""
    cdf = 0.5 * w
    pdf = np.exp(a) * _INV_SQRT_2PI
    return (g * (cdf + x * pdf)).astype(g.dtype, copy=False)


def _backward_with_sums(sums):
    """The numpy body of a ``gelu_backward_from_cdf`` that also returns the column sums of
    its result (``sums``: the traced ``sum(., dims=(0,))`` nodes it replaces, run as they
    were on the result or its ``(rows, C)`` reshape)."""
    def gelu_backward_from_cdf(g, x, w, a):
        out = _gelu_backward_from_cdf(g, x, w, a)
        return (out,) + tuple(call_node(m, [out.reshape(m.inputs[0].shape)])[0]
                              for m in sums)

    return gelu_backward_from_cdf


_gelu_backward_from_cdf = gelu_backward_from_cdf


def share_gelu_erf(graph):
    """A graph pass: ``gelu(x)`` and ``gelu_backward(g, x)`` of the same ``x`` (exact form)
    become ``gelu_with_cdf(x) -> (out, w)`` and ``gelu_backward_from_cdf(g, x, w)``; the
    latter also returns the column sums of its result that the graph takes (the next layer's
    bias gradient, ``passes.column_sums``), its kernel adding each row as it writes it."""
    backward = {}
    for n in graph.nodes:
        if n.name == "gelu_backward" and n.op is not None and \
                n.params.get("approximate", "none") == "none" and len(n.inputs) == 2 and \
                all(isinstance(a, Value) for a in n.inputs):
            backward.setdefault(id(n.inputs[1]), []).append(n)
    pos = {id(n): i for i, n in enumerate(graph.nodes)}
    replace, drop = {}, set()
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
        a = graph.new_value(x.shape, x.dtype, f"{f.outputs[0].name}_pdfarg")
        replace[id(f)] = Node(None, "gelu_with_cdf", [x], {}, [f.outputs[0], w, a],
                              impl=gelu_with_cdf)
        for b in rules:
            sums = [m for m, _ in passes.column_sums(graph, b.outputs[0])]
            replace[id(b)] = Node(None, "gelu_backward_from_cdf", [b.inputs[0], x, w, a], {},
                                  list(b.outputs) + [m.outputs[0] for m in sums],
                                  impl=_backward_with_sums(sums) if sums
                                  else gelu_backward_from_cdf)
            drop.update(id(m) for m in sums)
    return passes.replace_nodes(graph, replace, drop)


def _src(lines, erf="", flags=""):
    return "\n".join(["import math", "import numpy as np", "from numba import njit", "",
                      erf, "", f'@njit(error_model="numpy", cache=True{flags})'] + lines) + "\n"


# float32 erf where GELU's arguments mostly fall, |u| <= 2 (u*u <= 4: |x| <= 2.83): u * P(t),
# t = u*u/2 - 1, P the degree-15 Chebyshev interpolant of erf(sqrt s)/sqrt s on s in [0, 4]
# (16 nodes, computed with mpmath at 40 digits, converted to powers of t in mpmath, each
# coefficient rounded once to float64), evaluated in float64 by Horner's rule (multiply-adds
# may contract to FMAs). Relative error <= 1.2e-15 of erf (mpmath, 20000 points), 1/45 of
# ``ERF32_COEFFS``'s. Rounded once to float32 it is eager's (float64 Cephes erf, rounded) on
# all but 3 of the 1.07e9 float32 u in [0, 2] (1 ulp, |u| < 4e-4, where ``1 + erf`` rounds
# both to the same float32; erf32 differs at 263 of them); odd, as eager's. With
# ``ERF32_MID`` beyond, the float32 GELU kernel's (out, w) are eager's on every one of the
# 2^32 float32 inputs (benchmarks/gelu_float32_all_inputs.py; erf32 on every lane: 19
# differ). 16 coefficients instead of 24: 1.4x fewer float64 operations an element,
# the loop's bound.
ERF32_SHORT = (
    0.6749332360396545, -0.26111186093124533, 0.11947913860991874, -0.048662777449162455,
    0.017128344570413016, -0.005234875836003433, 0.0014050914348710947,
    -0.0003351435347665326, 7.18009644294896e-05, -1.3946268865600212e-05,
    2.4758957031803304e-06, -4.0451986966138103e-07, 6.108547961400175e-08,
    -8.605401204315784e-09, 1.2020242842740404e-09, -1.4770385263261938e-10)
ERF32_SHORT_BOUND = 4.0  # u*u: the short fit's range (beyond it: ERF32_MID)
BLOCK32 = 16  # lanes a block: one vectorised pass, then its lanes beyond the fit again

# float32 erf on 2 < |u| <= 4: P(|u| - 3) with the sign of u, P the degree-21 Chebyshev
# interpolant of erf itself on [2, 4] (mpmath as above), Horner (FMAs allowed); absolute error
# 1.2e-16 (mpmath, 20001 points): float64's own rounding of values near 1, as eager's. Beyond
# |u| = 4 it reads P(1) = erf(4) = 1 - 1.5e-8, which rounds to 1 in float32 as eager's erf of
# any |u| >= 4 does. Rounded once to float32 it is eager's on all 2^31 float32 u > 2 (both
# signs by symmetry; benchmarks/gelu_float32_all_inputs.py checks GELU on all 2^32 inputs).
ERF32_MID = (
    0.9999779095030015, 0.00013925305194674271, -0.0004177591558412556,
    0.0007891006276994829, -0.0010443978895603287, 0.0010165472791614273,
    -0.0007380411759402074, 0.00039057165600032257, -0.00013477705608615903,
    1.3906879241971658e-05, 1.5616212735273337e-05, -1.0793589415124638e-05,
    3.030775953859953e-06, 1.2330114803181393e-07, -4.526455657826449e-07,
    1.6589728761611673e-07, -9.234371291391946e-09, -1.5171225894452588e-08,
    5.896497955760714e-09, -2.5065252244382397e-10, -4.2997607112188544e-10,
    1.0070263428361818e-10)


def _horner(coeffs, t):
    s = repr(coeffs[-1])
    for c in coeffs[-2::-1]:
        s = f"({s} * {t} + {c!r})"
    return s


def erf32_short_source():
    """The numba source of ``erf32_short(u)`` (float64 u with ``u*u <= 4``) and
    ``erf32_mid(u)`` (float64 u with ``u*u > 4``, not NaN); inlined."""
    return ('@njit(inline="always")\n'
            "def erf32_short(u):\n"
            "    t = u * u * 0.5 - 1.0\n"
            f"    return u * {_horner(ERF32_SHORT, 't')}\n\n\n"
            '@njit(inline="always")\n'
            "def erf32_mid(u):\n"
            "    a = abs(u)\n"
            "    v = (a if a <= 4.0 else 4.0) - 3.0\n"
            f"    return math.copysign({_horner(ERF32_MID, 'v')}, u)\n")


def _forward32():
    """float32: blocks of ``BLOCK32`` lanes, each one vectorised pass of ``ERF32_SHORT``
    (writing every lane, and the gradient's exp argument) and a flag of the lanes beyond its
    range; a flagged block's such lanes are written again with ``ERF32_MID`` (a vectorised
    pass with masked stores). Multiply-adds may contract to FMAs: the only adds are the
    polynomials' and ``1 + erf``, whose operand is a float32 rounding (cannot contract). NaN
    stays in the short pass (``u*u > 4`` is false): NaN, as eager. Cost (standalone, 131072
    lanes): normal inputs of spread 0.88 (the char-GPT's) 0.15 ms, erf32 on every lane 0.18;
    where |x| > 2.83 is common a flagged block costs both fits (spread 4: ~0.3 ms)."""
    b = BLOCK32
    lane = ["xi = x[j]",
            f"u = np.float64(xi * np.float32({_SQRT1_2!r}))",
            "s = u * u",
            "wi = np.float32(1.0) + np.float32(erf32_short(u))",
            "w[j] = wi",
            "out[j] = (xi * np.float32(0.5)) * wi",
            "pa[j] = (np.float32(-0.5) * xi) * xi"]
    wide = ["xi = x[j]",
            f"u = np.float64(xi * np.float32({_SQRT1_2!r}))",
            f"if u * u > {ERF32_SHORT_BOUND!r}:",
            "    wi = np.float32(1.0) + np.float32(erf32_mid(u))",
            "    w[j] = wi",
            "    out[j] = (xi * np.float32(0.5)) * wi"]
    return _src(["def gelu_with_cdf_float32(x, out, w, pa):",
                 "    n = x.size",
                 f"    for b in range(0, n - n % {b}, {b}):",
                 "        bad = np.int32(0)",
                 f"        for j in range(b, b + {b}):"] +
                ["            " + s for s in lane] +
                [f"            bad |= np.int32(s > {ERF32_SHORT_BOUND!r})",
                 "        if bad:",
                 f"            for j in range(b, b + {b}):"] +
                ["                " + s for s in wide] +
                [f"    for j in range(n - n % {b}, n):"] +
                ["        " + s for s in lane] +
                ["        " + s for s in wide], erf32_short_source(), ', fastmath={"contract"}')


def _erf_float32():
    """erf of float32 u as the GELU kernel computes it (``erf32_short`` where u*u <= 4,
    ``erf32_mid`` beyond; the same source and flags), rounded to float32: the tests' view."""
    return _src(["def erf_float32(u, out):",
                 "    for i in range(u.size):",
                 "        v = np.float64(u[i])",
                 f"        if v * v > {ERF32_SHORT_BOUND!r}:",
                 "            out[i] = np.float32(erf32_mid(v))",
                 "        else:",
                 "            out[i] = np.float32(erf32_short(v))"],
                erf32_short_source(), ', fastmath={"contract"}')


def erf_float32(u):
    """float32 erf of the float32 array ``u`` by the forward kernel's two fits (numba)."""
    u = np.ascontiguousarray(u, np.float32)
    out = np.empty_like(u)
    kernels.load("erf_float32", _erf_float32())(u.reshape(-1), out.reshape(-1))
    return out


def erf_fits_float64(u):
    """The float32 kernel's erf of the float64 array ``u`` before its float32 rounding
    (``erf32_short`` where u*u <= 4, else ``erf32_mid``; numba, the kernel's source and
    flags): the fits' own accuracy, for the tests."""
    u = np.ascontiguousarray(u, np.float64)
    out = np.empty_like(u)
    kernels.load("erf_fits_float64", _src([
        "def erf_fits_float64(u, out):", "    for i in range(u.size):",
        "        v = u[i]",
        f"        out[i] = erf32_mid(v) if v * v > {ERF32_SHORT_BOUND!r} else erf32_short(v)"],
        erf32_short_source(), ', fastmath={"contract"}'))(u.reshape(-1), out.reshape(-1))
    return out


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
        "def gelu_cdf_finish_float64(x, out, w, pa, ub, e, idx, m):",
        "    for i in range(x.size):",
        "        xi = x[i]",
        f"        u = xi * {_SQRT1_2!r}",
        "        z = u * u",
        f"        wi = 1.0 + u * {_polevl('z', c['T'])} / {_polevl('z', c['U'], True)}",
        "        w[i] = wi",
        "        out[i] = (xi * 0.5) * wi",
        "        pa[i] = (-0.5 * xi) * xi",
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
    """``g * (0.5 w + x pdf)``, ``pdf``'s exp numpy's of the forward's ``-0.5 x x``; without
    and with the result's column sums."""
    t = f"np.{np.dtype(dtype).name}"
    value = f"g[i] * (({t}(0.5) * w[i]) + (x[i] * (p[i] * {t}({_INV_SQRT_2PI!r}))))"
    return (_src([f"def gelu_backward_from_cdf_{t[3:]}(g, x, w, p, out):",
                  "    for i in range(x.size):",
                  f"        out[i] = {value}"]),
            # with the column sums of the (R, C) result: each row added in order into 0.0
            # (numpy's add.reduce over axis 0 of a C-contiguous matrix: a column of -0.0
            # sums to 0.0, as numpy 2.4's)
            _src([f"def gelu_backward_from_cdf_sums_{t[3:]}(g, x, w, p, out, red, R, C):",
                  "    acc = np.zeros(C, out.dtype)",
                  "    for r in range(R):",
                  "        base = r * C",
                  "        for j in range(C):",
                  "            i = base + j",
                  f"            o = {value}",
                  "            out[i] = o",
                  "            acc[j] += o",
                  "    red[:] = acc"]))


def _flat(a):
    return a.reshape(-1) if a.flags.c_contiguous else np.ascontiguousarray(a).reshape(-1)


@op_kernels.register("gelu_with_cdf")
def gelu_with_cdf_factory(node):
    x = node.inputs[0]
    dt = np.dtype(x.dtype)
    if dt == np.float32:
        fn = kernels.load("gelu_with_cdf_float32", _forward32())

        def gelu_with_cdf_kernel(xa):
            out, w, pa = (np.empty(xa.shape, dt) for _ in range(3))
            fn(_flat(xa), out.reshape(-1), w.reshape(-1), pa.reshape(-1))
            return out, w, pa

        return gelu_with_cdf_kernel
    gather = kernels.load("gelu_cdf_gather_float64", _GATHER64)
    finish = kernels.load("gelu_cdf_finish_float64", _finish64())
    n = int(np.prod(x.shape))
    # scratch arrays of this node's (as the generated code's planned buffers: one per entry)
    ub, arg, idx = np.empty(n), np.empty(n), np.empty(n, np.int64)

    def gelu_with_cdf_kernel(xa):
        out, w, pa = (np.empty(xa.shape, dt) for _ in range(3))
        xf = _flat(xa)
        m = gather(xf, ub, arg, idx)
        e = np.exp(arg[:m], out=arg[:m])  # numpy's exp, as eager's erf64
        finish(xf, out.reshape(-1), w.reshape(-1), pa.reshape(-1), ub, e, idx, m)
        return out, w, pa

    return gelu_with_cdf_kernel


@op_kernels.register("gelu_backward_from_cdf")
def gelu_backward_from_cdf_factory(node):
    g, x, w, a = node.inputs
    if not (g.dtype == x.dtype == w.dtype == a.dtype) or \
            not (g.shape == x.shape == w.shape == a.shape):
        return None
    dt = np.dtype(x.dtype)
    src, sums_src = _backward(dt)
    p = np.empty(int(np.prod(x.shape)), dt)  # exp(-0.5 x x): numpy's exp, as eager
    n_sums = len(node.outputs) - 1
    if n_sums:  # the column sums of the result (share_gelu_erf): (R, C) rows in order
        fn = kernels.load(f"gelu_backward_from_cdf_sums_{dt.name}", sums_src)
        C = x.shape[-1]
        R = p.size // C if C else 0

        def gelu_backward_from_cdf_kernel(ga, xa, wa, aa):
            out, red = np.empty(xa.shape, dt), np.empty(C, dt)
            fn(_flat(ga), _flat(xa), _flat(wa), np.exp(_flat(aa), out=p), out.reshape(-1),
               red, R, C)
            return (out, red) + tuple(red.copy() for _ in range(n_sums - 1))

        return gelu_backward_from_cdf_kernel
    fn = kernels.load(f"gelu_backward_from_cdf_{dt.name}", src)

    def gelu_backward_from_cdf_kernel(ga, xa, wa, aa):
        out = np.empty(xa.shape, dt)
        fn(_flat(ga), _flat(xa), _flat(wa), np.exp(_flat(aa), out=p), out.reshape(-1))
        return out

    return gelu_backward_from_cdf_kernel
