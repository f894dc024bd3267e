"""The kernel compiler: a fused group becomes one loop nest compiled by numba, or a chain of
numpy ufunc calls into planned buffers when numba is absent (the same results).

A fused node (``passes.fuse``) holds a pointwise body and, optionally, column sums of its
result (a bias gradient: ``sum(dims=(0,))``). Its operands are full-shape arrays, rows that
broadcast along the leading dims (a bias), one value per channel of a leading axis (a
conv's (1, C, 1, 1) bias, read per row through a 1-D view: its broadcast is never copied;
an elementwise-only group then runs over rows of one (example, channel) plane each), or
scalars (a Python float such as SGD's lr, a 0-d value). numba's kernel runs the body once per element, in registers, writing the result
and accumulating the sums in the same pass::

    @njit(error_model="numpy", cache=True)      # fastmath off: IEEE, no FMA but ``fma``'s
    def k_3f2a(x0, x1, out0, red0):             # add -> relu, column sums
        R, C = out0.shape
        for j in range(C):
            red0[j] = 0.0
        for i in range(R):
            for j in range(C):
                t0 = x0[i, j] + x1[j]
                t1 = t0 if (t0 >= zero or t0 != t0) else zero
                out0[i, j] = t1
                red0[j] += t1

Exactness: ``+ - * /``, comparisons, casts, max/min (numpy's NaN rule) round exactly as the
numpy ufuncs do; the column sums add rows in order, as numpy's ``add.reduce`` over a leading
axis of a C-contiguous array does, so they are bit-identical too. ``exp``/``log``/``tanh``
call the C library where numpy may use its own SIMD code (AVX512F: float64 exp and log;
float32; tanh): a group using one of them is compiled only where the two agree (probed once
per dtype, ``libm_exact``), or where numpy can compute the call before the kernel from one of
the group's operands (``outside``: gelu_backward's ``exp(-x*x/2)``, ``exp(x)``; the kernel
reads the result as an operand), else it stays numpy's ufunc calls (eager's results);
``TAPEGRAD_COMPILE_LIBM=1`` takes the C library's anyway (within an ulp, not bitwise).
``erf`` (and GELU and its gradient, which eager writes with it): in float32 a polynomial
(``erf32``, no libm call, so the loop vectorises: 1.9 vs 11.5 ns an element measured) taken
in float64 and rounded once, as eager rounds its float64 erf (the same except within 5.4e-14
relative of a rounding midpoint: ~60 of 6.1e8 float32 inputs, 1 ulp); in float64 it is
eager's own function (``ops.error_function``) operation for operation (``erf64``), its one
``exp`` computed by numpy before the kernel (``outside``): bitwise eager's, and branch-free
so that the loop vectorises. The fused cross-entropy sums each row in numpy's pairwise order
and leaves its max, exp and log to numpy: bitwise eager's. Small matmuls and contractions
are the BLAS's fma chains: eager's bits where the BLAS computes the plain chain (probed per
shape), else within 2 gamma_n sum|a b| of eager's (``blas_is_fma_chain`` below).

Sources are written to a cache directory and imported, so numba's ``cache=True`` keeps the
machine code between processes (a warm compile loads it instead of running LLVM).
``TAPEGRAD_COMPILE_KERNELS=numpy`` (or ``numba``) forces a backend; the default takes numba
when it imports.
"""
import hashlib
import importlib.util
import os
import sys
import tempfile

import numpy as np

from tapegrad.compiler.ir import Value
from tapegrad.ops.error_function import CEPHES, CLAMP

class Unsupported(Exception):
    """A node's scalar form cannot be compiled exactly here (its group stays numpy calls)."""


class Scalar:
    """What an op's scalar form (``ops.registry.Lowering``) is written with, for one node:
    ``dt`` the result's numpy type in source (``np.float32``), ``const(v)`` a constant of it,
    ``libm``/``erf`` the calls that need more than numba's own functions. Planning (``pre``
    None) collects what the form needs; writing (``pre``: the operands ``outside`` made)
    reads them."""

    def __init__(self, node, pre=None, assume_libm=False):
        self.node = node
        self.dtype = np.dtype(node.outputs[0].dtype)
        self.dt = _np_type(self.dtype)
        self.pre = pre
        self.assume_libm = assume_libm  # (planning only: which operands are always needed)
        self.needs = {}  # (id(node), role) -> (operand index, name)
        self.helpers = set()  # numba functions the kernel module defines first

    def const(self, v):
        return constant(self.dt, v)

    def libm(self, fn, expr, operand=None, name=None, compute=None):
        """numba's ``np.<fn>(expr)`` where it is numpy's ufunc here (``libm_exact``); else
        numpy's value, computed before the kernel by ``compute(x, out)`` (eager's own calls)
        from the node's full-shape operand ``operand`` (``name``: its label in the generated
        code), else the node is not compiled."""
        if self.assume_libm or libm_exact(fn, self.dtype):
            return f"np.{fn}({expr})"
        if compute is None:
            raise Unsupported(f"{self.node.name}: numba's {fn} is not numpy's here")
        return self._pre("libm", operand, name, compute)

    def erf(self, u, operand, scale=1.0, name="erf_exp"):
        """erf of the expression ``u`` = ``operand * scale`` as eager computes it: float32
        ``erf32`` (a float64 polynomial, rounded once); float64 ``erf64`` reading numpy's
        ``exp(-min(|u|, 6)^2)`` computed before the kernel from the operand (``erf_exp``), so
        that operand is a group input (``group_inputs``)."""
        if self.dtype == np.float32:
            self.helpers.add("erf32")
            return f"{self.dt}(erf32(np.float64({u})))"
        if self.dtype != np.float64:
            raise Unsupported(f"{self.node.name}: erf in {self.dtype}")
        self.helpers.add("erf64")
        e = self._pre("erf", operand, name, _ErfExp(scale))
        return f"erf64({u}, {e})"

    def _pre(self, role, operand, name, compute):
        known = _OUTSIDE.setdefault(name, compute)
        if known != compute:
            raise ValueError(f"two computations before a kernel are named {name!r}")
        self.needs[(id(self.node), role)] = (operand, name)
        return "_" if self.pre is None else self.pre[(id(self.node), role)]


# name -> compute(x, out): the values numpy computes before a kernel, registered by the scalar
# forms that need them (Scalar._pre); "erf_exp" (erf of an operand itself) from the start
_OUTSIDE = {}


class _Ufunc:
    """``np.<name>(x, *constants, out=out)``: an op's ufunc before the kernel."""

    def __init__(self, ufunc):
        self.key = tuple(ufunc)
        self.fn = getattr(np, ufunc[0])

    def __eq__(self, other):
        return isinstance(other, _Ufunc) and other.key == self.key

    __hash__ = None

    def __call__(self, x, out):
        return self.fn(x, *self.key[1:], out=out)


class _ErfExp:
    """``exp(-a*a)``, ``a = min(|x * scale|, 6)``: ``ops.error_function.erf64``'s one exp."""

    def __init__(self, scale):
        self.scale = scale

    def __eq__(self, other):
        return isinstance(other, _ErfExp) and other.scale == self.scale

    __hash__ = None

    def __call__(self, x, out):
        return erf_exp(x, out, self.scale)


_OUTSIDE["erf_exp"] = _ErfExp(1.0)


def constant(dt, v):
    """numba source of the number ``v`` as a scalar of the numpy type ``dt`` (``np.float32``),
    infinities and NaN included."""
    v = float(v)
    if v != v:
        return f"{dt}(np.nan)"
    if v in (float("inf"), float("-inf")):
        return f"{dt}({'-' if v < 0 else ''}np.inf)"
    return f"{dt}({v!r})"


def lowering(node):
    """The scalar form of ``node``'s op (``Op.lower``), or None."""
    op = node.op
    return None if op is None else op.lowering


def scalar_expr(node, args, pre=None, assume_libm=False):
    """``(source, Scalar)``: one element of ``node`` as numba source over its operands'
    expressions ``args``, from its op's lowering. Raises ``Unsupported``."""
    low = node.op.lowering
    ctx = Scalar(node, pre, assume_libm)
    if callable(low.scalar):
        return low.scalar(ctx, *args, **node.params), ctx
    if low.libm and not (assume_libm or all(libm_exact(f, ctx.dtype) for f in low.libm)):
        # numpy's own loop rounds otherwise: its ufunc of the one operand, before the kernel
        if low.ufunc is None or len(node.inputs) != 1:
            raise Unsupported(f"{node.name}: numba's {low.libm} is not numpy's here")
        return ctx._pre("libm", 0, low.ufunc[0], _Ufunc(low.ufunc)), ctx
    consts = {k: ctx.const(node.params.get(k, d)) for k, d in zip(low.params, low.defaults)}
    return low.scalar.format(*args, dt=ctx.dt, **consts), ctx


def accepts(node, weak=()):
    """Whether ``node``'s lowering applies to this call: its params, the kinds and dtypes of
    its operands and result (``Lowering``'s facts)."""
    low = lowering(node)
    if low is None or len(node.outputs) != 1:
        return False
    out = node.outputs[0]
    if low.accepts is not None:
        if not low.accepts(node):
            return False
    elif any(k not in low.params or type(v) not in (int, float)
             for k, v in node.params.items()):
        return False
    if out.dtype.kind not in low.kinds:
        return False
    rule = low.operands
    if isinstance(rule, tuple) and len(rule) != len(node.inputs):
        return False
    vals = [a for a in node.inputs if isinstance(a, Value)]
    for i, a in enumerate(node.inputs):
        r = rule[i] if isinstance(rule, tuple) else rule
        if not isinstance(a, Value):
            if type(a) not in (int, float) or r == "bool":
                return False
        elif r == "bool":
            if a.dtype.kind != "b":
                return False
        elif a.dtype.kind not in low.kinds:
            return False
        elif r == "out" and a.dtype != out.dtype and id(a) not in weak:
            return False  # a 0-d array of another dtype promotes (NumPy 2)
    return not (rule == "same" and len({a.dtype for a in vals}) > 1)


def compiles(node, weak=()):
    """Whether ``node``'s scalar form can be part of a numba kernel on this machine: it takes
    the call (``accepts``) and writes it, its C-library calls being numba's where they equal
    numpy's, else values numpy computes before the kernel (then its operand must be a group
    input, which ``supported`` checks per group)."""
    if not accepts(node, weak):
        return False
    try:
        scalar_expr(node, [f"a{i}" for i in range(len(node.inputs))])
    except Unsupported:
        return False
    return True


def group_inputs(node):
    """The operands of ``node`` numpy reads before its numba kernel on every machine (a
    float64 erf's argument: ``Scalar.erf``): a group input, never a value made inside it."""
    if lowering(node) is None or backend() != "numba" or not accepts(node):
        return []
    try:
        _, ctx = scalar_expr(node, [f"a{i}" for i in range(len(node.inputs))],
                             assume_libm=True)
    except Unsupported:
        return []
    return [node.inputs[k] for k, _ in ctx.needs.values()]


def _polevl(x, coeffs, monic=False):
    """Cephes' ``polevl`` (``p1evl`` when ``monic``: a leading 1 not stored), Horner's rule
    in its order."""
    s = f"({x} + {coeffs[0]!r})" if monic else repr(coeffs[0])
    for c in coeffs[1:]:
        s = f"({s} * {x} + {c!r})"
    return s


def erf64_source():
    """The numba source of ``erf64(u, e)``: ``ops.error_function.erf64`` for one element,
    operation for operation, ``e`` being numpy's ``exp(-a*a)``, ``a = min(|u|, 6)``. Both
    formulas are computed and one is selected (no branch: the loop vectorises); NaN takes the
    first, as eager's ``|x| > 1`` mask does."""
    c = CEPHES
    return ('@njit(inline="always")\n'
            "def erf64(u, e):\n"
            "    z = u * u\n"
            f"    small = u * {_polevl('z', c['T'])} / {_polevl('z', c['U'], True)}\n"
            "    a = abs(u)\n"
            f"    b = a if a <= {CLAMP!r} else {CLAMP!r}\n"
            f"    big = math.copysign(1.0 - (e * {_polevl('b', c['P'])}) / "
            f"{_polevl('b', c['Q'], True)}, u)\n"
            "    return big if a > 1.0 else small\n")


# float32 erf without a libm call, so that LLVM vectorises the loop around it: x * P(t),
# t = x*x/8 - 1 on |x| <= 4, P the degree-23 Chebyshev interpolant of erf(sqrt u)/sqrt u on
# [0, 16] written in powers of t; evaluated in float64, relative error <= 5.4e-14 of erf,
# so rounded once to float32 it is scipy's float32 erf (correctly rounded: math.erf rounded)
# except where erf lies within that of a rounding midpoint (then 1 ulp). Beyond 4, erf
# rounds to +-1 in float32; NaN stays NaN (the comparison is false).
ERF32_COEFFS = (
    0.3535309956433878, -0.17657623330136532, 0.13167511689964084, -0.10771044253014905,
    0.09020899387698399, -0.07472786567162942, 0.059886909359934994, -0.04576511177349191,
    0.03306059062184811, -0.022473555537373086, 0.014349836806032582, -0.00860629367904577,
    0.0048527008914917595, -0.002577962875421378, 0.0012946046887796594,
    -0.0006135610536966054, 0.00027244442325580383, -0.00011675995435633769,
    5.0995742764843516e-05, -1.9474614222107485e-05, 4.867587784831905e-06,
    -1.8477082233652099e-06, 1.525078675158126e-06, -4.7677593373708656e-07)


def _estrin(coeffs, t, powers):
    """``sum(c_k t^k)`` by Estrin's scheme: pairs ``c_2k + c_2k+1 t``, then pairs of those
    with ``t^2``, ``t^4``, ... (``powers``: the names of t^2, t^4, ...). Independent
    multiply-adds instead of Horner's chain of 23: 1.3x faster measured on the vectorised
    loop; |t| <= 1 and decaying coefficients, so its rounding (~1e-16) stays far below the
    fit's 5.4e-14 (0 differences from Horner's float32 results on 2e7 inputs)."""
    level = [f"({coeffs[k]!r} + {coeffs[k + 1]!r} * {t})" if k + 1 < len(coeffs)
             else repr(coeffs[k]) for k in range(0, len(coeffs), 2)]
    for pw in powers:
        if len(level) == 1:
            break
        level = [f"({level[k]} + {level[k + 1]} * {pw})" if k + 1 < len(level) else level[k]
                 for k in range(0, len(level), 2)]
    assert len(level) == 1, "not enough powers of t"
    return level[0]


def erf32_source():
    """The numba source of ``erf32(x)`` (float64 in, float64 out; inlined by numba)."""
    poly = _estrin(ERF32_COEFFS, "t", ("t2", "t4", "t8", "t16"))
    return ('@njit(inline="always")\n'
            "def erf32(x):\n"
            "    z = np.float64(4.0) if x > 4.0 else (np.float64(-4.0) if x < -4.0 else x)\n"
            "    t = z * z * 0.125 - 1.0\n"
            "    t2 = t * t\n"
            "    t4 = t2 * t2\n"
            "    t8 = t4 * t4\n"
            "    t16 = t8 * t8\n"
            f"    return z * {poly}\n")


def outside(body, ins, out_shape, weak=()):
    """What numpy computes before the numba kernel, each read by the kernel as one more
    full-shape operand (eager's bits: eager's own calls on the same values), from a
    full-shape operand ``x`` of the group: ``{(id(node), role): (x, name)}`` for the needs
    of the body's scalar forms (``Scalar.libm``, ``Scalar.erf``, a ``libm`` ufunc of the
    operand itself). A need whose operand is not a group input is left out (``supported``
    then refuses the group)."""
    ids = {id(a) for a in ins}
    found = {}
    for m in body:
        if lowering(m) is None or not accepts(m, weak):
            continue
        try:
            _, ctx = scalar_expr(m, [f"a{i}" for i in range(len(m.inputs))])
        except Unsupported:
            continue
        for key, (k, name) in ctx.needs.items():
            x = m.inputs[k]
            if isinstance(x, Value) and id(x) in ids and x.dtype == m.outputs[0].dtype and \
                    operand_kind(x, out_shape, weak) == "full":
                found[key] = (x, name)
    return found


ERF_EXP_SOURCE = f"""import numpy as np
from numba import njit


@njit(error_model="numpy", cache=True)
def erf_exp_argument(x, scale, out):
    for i in range(x.size):
        a = abs(x[i] * scale)
        a = a if a <= {CLAMP!r} else {CLAMP!r}
        out[i] = (-a) * a
    return out
"""


def erf_exp(x, buf, scale=1.0):
    """``ops.error_function.erf64``'s ``exp(-a*a)``, ``a = min(|x * scale|, 6)``, into
    ``buf``: the argument (exact ``* abs min``: any order of elements gives eager's bits) in
    one numba pass, then numpy's exp as eager calls it."""
    load("erf_exp_argument", ERF_EXP_SOURCE)(x.reshape(-1), scale, buf.reshape(-1))
    return np.exp(buf, out=buf)


def outside_call(name, x, buf):
    """numpy's value of ``outside``'s computation ``name`` of ``x`` into ``buf`` (the kernel's
    own array, read by the kernel call that follows)."""
    return _OUTSIDE[name](x, buf)


_numba = None
_loaded = {}  # source hash -> compiled dispatcher (one per process)


def backend():
    """``"numba"`` or ``"numpy"``: the kernel compiler in use (``TAPEGRAD_COMPILE_KERNELS``)."""
    global _numba
    want = os.environ.get("TAPEGRAD_COMPILE_KERNELS", "auto")
    if want == "numpy":
        return "numpy"
    if _numba is None:
        try:
            import numba  # noqa: F401 - optional extra "compile"

            _numba = True
        except ImportError:
            _numba = False
    if want == "numba" and not _numba:
        raise ImportError("TAPEGRAD_COMPILE_KERNELS=numba: numba is not installed "
                          "(pip install 'tapegrad[compile]')")
    return "numba" if _numba else "numpy"


# numba's exp, log, tanh, sin, ... call the C library; numpy's ufuncs use their own SIMD code
# on some CPUs (AVX512F: float64 exp and log; AVX2/AVX512: float32; SVML tanh), within an ulp
# of it but not bitwise. A scalar form calling one of these (``Lowering.libm``) where numpy's
# differs is computed by numpy before the kernel (``outside``) or stays numpy's ufunc chain
# (eager's results); TAPEGRAD_COMPILE_LIBM=1 takes the C library's anyway (faster, an ulp).
_libm_same = {}  # (dtype name, function) -> numba's call equals numpy's ufunc here

LIBM_PROBE = """import numpy as np
from numba import njit


@njit(error_model="numpy", cache=True)
def libm_probe_{fn}(x, y, out):
    for i in range(x.size):
        out[i] = np.{fn}({args})
    return out
"""


def probe_values(dtype):
    """The values ``libm_exact`` compares on: 4096 spread over the range where the functions
    are used (|x| up to ~25), 2048 in [-1.2, 1.2] (the inverse trigonometric functions' domain),
    2048 of magnitudes 1e-6..1e6 of both signs, and the special values."""
    rng = np.random.default_rng(0)
    parts = [rng.standard_normal(4096) * 6, rng.uniform(-1.2, 1.2, 2048),
             10.0 ** rng.uniform(-6, 6, 2048) * rng.choice([-1.0, 1.0], 2048),
             np.array([0.0, -0.0, 1.0, -1.0, 0.5, 2.0, np.inf, -np.inf, np.nan])]
    return np.concatenate(parts).astype(dtype)


def libm_exact(name, dtype):
    """Whether numba's ``np.<name>`` (a C-library call) gives numpy's ufunc ``name`` bit for
    bit on this machine, probed once per dtype (``probe_values``; a binary function pairs
    them with a shuffled copy): any difference means numpy has its own loop here."""
    if os.environ.get("TAPEGRAD_COMPILE_LIBM") == "1":
        return True
    dt = np.dtype(dtype)
    same = _libm_same.get((dt.name, name))
    if same is None:
        uf = getattr(np, name)
        x = probe_values(dt)
        y = np.random.default_rng(1).permutation(x)
        args = "x[i]" if uf.nin == 1 else "x[i], y[i]"
        with np.errstate(all="ignore"):
            ref = uf(x) if uf.nin == 1 else uf(x, y)
            try:
                got = load(f"libm_probe_{name}", LIBM_PROBE.format(fn=name, args=args))(
                    x, y, np.empty_like(ref))
            except Exception:  # noqa: BLE001 - numba has no scalar form of it: never exact
                got = None
        same = got is not None and got.dtype == ref.dtype and _same_bits(got, ref)
        _libm_same[(dt.name, name)] = same
    return same


def _same_bits(a, b):
    nan = np.isnan(a)
    if not np.array_equal(nan, np.isnan(b)):
        return False
    u = f"u{a.dtype.itemsize}"
    return bool(np.array_equal(a[~nan].view(u), b[~nan].view(u)))


# Eager's products go to the BLAS (numpy's matmul). OpenBLAS rounds each element of a GEMM as
# one chain of fused multiply-adds over the contraction in order (acc = 0, then acc = fma(a[i,
# p], b[p, j], acc) for p = 0, 1, ...) unless it splits the contraction into blocks (here: from
# a few hundred terms on, depending on the shapes). A kernel's small matmul and contraction
# compute that chain with ``fma`` (llvm.fma: rounded once, as the BLAS's vfmadd; no slower than
# a multiply and an add), so they are eager's bits wherever the BLAS runs the plain chain: a
# one-time probe per case (shapes, layouts, dtype: ``blas_is_fma_chain``) says where. Elsewhere
# (a blocked contraction, another BLAS) the kernel's sum is the same terms in another order:
# within 2 * gamma_n * sum_i |a_i b_i| of eager's (n terms, gamma_n = n u / (1 - n u), u the
# unit roundoff: each order is within gamma_n of the exact sum). ``TAPEGRAD_COMPILE_EXACT=1``
# leaves such a group to eager's own calls (bitwise, slower: ~2x on the H=2048 spiral step).


def exact_only():
    """``TAPEGRAD_COMPILE_EXACT=1``: fuse a product only where it is eager's bits."""
    return os.environ.get("TAPEGRAD_COMPILE_EXACT") == "1"


FMA = '''from llvmlite import ir as _fma_ir
from numba import types as _fma_types
from numba.extending import intrinsic as _fma_intrinsic


@_fma_intrinsic
def fma(typingctx, a, b, c):
    """a * b + c rounded once (llvm.fma): the BLAS's multiply-add."""
    if not (a == b == c and a in (_fma_types.float32, _fma_types.float64)):
        return None

    def codegen(context, builder, signature, args):
        ty = args[0].type
        fn = builder.module.declare_intrinsic("llvm.fma", [ty],
                                              _fma_ir.FunctionType(ty, [ty, ty, ty]))
        return builder.call(fn, args)

    return a(a, b, c), codegen


'''
FMA_PROBE = "import numpy as np\nfrom numba import njit\n\n" + FMA + '''
@njit(error_model="numpy", cache=True)
def fma_chain(a, b, out):
    # out = a @ b, each element the chain acc = fma(a[i, p], b[p, j], acc) from acc = 0
    zero = out.dtype.type(0)
    for i in range(a.shape[0]):
        for j in range(b.shape[1]):
            acc = zero
            for p in range(a.shape[1]):
                acc = fma(a[i, p], b[p, j], acc)
            out[i, j] = acc
    return out
'''
_blas_chain = {}  # (dtype, shapes, layouts) -> eager's matmul is the fma chain there


def blas_is_fma_chain(dtype, a_shape, a_t, b_shape, b_t):
    """Whether eager's matmul (``ops.linalg.matmul``: numpy's, the BLAS) of operands of these
    shapes (``a_t``/``b_t``: a transposed view, as ``x.T``) gives the fma chain's bits; probed
    once per case on random values with exact zeros of both signs among them."""
    from tapegrad.backend.blas import num_threads
    from tapegrad.ops.linalg import matmul

    dt = np.dtype(dtype)
    # (the thread count too: OpenBLAS's threaded GEMM may round otherwise)
    key = (dt.name, tuple(a_shape), bool(a_t), tuple(b_shape), bool(b_t), num_threads())
    same = _blas_chain.get(key)
    if same is None:
        rng = np.random.default_rng(len(_blas_chain))

        def operand(shape, t):
            x = (rng.standard_normal(shape[::-1] if t else shape) * 4).astype(dt)
            x.flat[::7] = 0.0
            x.flat[3::11] = -0.0
            return x.T if t else x

        a, b = operand(a_shape, a_t), operand(b_shape, b_t)
        want = np.asarray(matmul.forward(a, b))
        got = load("fma_chain", FMA_PROBE)(np.ascontiguousarray(a), np.ascontiguousarray(b),
                                           np.empty(want.shape, dt))
        same = _blas_chain[key] = bool(np.array_equal(want.view(f"u{dt.itemsize}"),
                                                      got.view(f"u{dt.itemsize}")))
    return same


def _transposed(v):
    """Whether the 2-D Value ``v`` is a transposed view (``w.T``: a permute's result)."""
    p = v.producer
    return p is not None and p.name == "permute" and len(v.shape) == 2 and tuple(
        p.params.get("dims", ())) in ((1, 0), (-1, -2), (1, -2), (-1, 0))


def products_exact(body, contract=()):
    """Whether a group's small matmuls and contractions, computed as fma chains, are eager's
    matmul bit for bit (``blas_is_fma_chain``): a contraction's product is ``permute(x) @ y``
    (``x`` the rows' matrix seen transposed)."""
    for m in body:
        if m.name == "matmul":
            a, b = m.inputs
            if not blas_is_fma_chain(a.dtype, a.shape, _transposed(a), b.shape,
                                     _transposed(b)):
                return False
    for mm, p, _, _, _ in contract:
        x, y = p.inputs[0], mm.inputs[1]
        if not blas_is_fma_chain(x.dtype, x.shape[::-1], True, y.shape, _transposed(y)):
            return False
    return True


def cache_dir():
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "tapegrad", "kernels")


def matrices(body, contract=()):
    """ids of the Values a group's small matmuls and contractions read whole rows of."""
    return {id(a) for m in body if m.name == "matmul" for a in m.inputs} | {
        id(c[4]) for c in contract}


def chan_axis(a, out_shape):
    """The axis ``k`` when ``a`` holds one value per index of axis ``k`` of a result of
    ``out_shape`` (3 or more dims, ``k`` not the last): shape (1, C, 1, 1) itself, or the
    ``broadcast_to`` of such a shape to ``out_shape`` (a zero-stride view that reshaping
    to (rows, columns) would copy). Else None."""
    out_shape = tuple(out_shape)
    if len(out_shape) < 3:
        return None
    src = a.shape
    p = a.producer
    if src == out_shape and p is not None and p.name == "broadcast_to" and \
            isinstance(p.inputs[0], Value):
        src = p.inputs[0].shape
    if len(src) > len(out_shape):
        return None
    src = (1,) * (len(out_shape) - len(src)) + tuple(src)
    axes = [k for k, d in enumerate(src) if d != 1]
    if len(axes) != 1 or axes[0] >= len(out_shape) - 1 or src[axes[0]] != out_shape[axes[0]]:
        return None
    return axes[0]


def operand_kind(a, out_shape, weak=(), mats=()):
    """How a kernel reads one input: "full" (same shape), "row" (broadcast over the leading
    dims), "scalar" (0-d or a Python number), "matrix" (a small matmul's operand, indexed
    by the product), "chan" (one value per index of one leading axis: a conv's (1, C, 1, 1)
    bias, or its ``broadcast_to`` view, read per row without copying it: ``chan_axis``), or
    None (not a kernel operand)."""
    if not isinstance(a, Value):
        return "scalar" if type(a) in (int, float) else None
    if chan_axis(a, out_shape) is not None:
        return "chan"
    if a.shape == tuple(out_shape):
        return "full"
    if id(a) in mats:
        return "matrix"
    if a.shape == () or id(a) in weak:
        return "scalar"
    if out_shape and len(a.shape) <= len(out_shape) and a.shape[-1:] == tuple(out_shape[-1:]) \
            and all(d == 1 for d in a.shape[:-1]):
        return "row"
    return None


def supported(body, ins, out_shape, weak=(), contract=()):
    """Whether numba can compile this group exactly: float/bool values, each op's scalar form
    (``Op.lower``) accepting its call (``accepts``: params, operand and result dtypes), its
    C-library calls numpy's here or computed by numpy before the kernel (``outside``)."""
    if not out_shape or any(d == 0 for d in out_shape):
        return False
    if contract and (len(out_shape) != 2 or any(
            c[3].dtype != body[-1].outputs[0].dtype or c[4].dtype != c[3].dtype
            for c in contract)):
        return False
    mats = matrices(body, contract)
    for a in ins:
        if operand_kind(a, out_shape, weak, mats) is None or a.dtype.kind not in "fb":
            return False
    if (contract or any(m.name == "matmul" for m in body)) and \
            exact_only() and not products_exact(body, contract):
        return False  # (the BLAS blocks this product: eager's own matmul calls)
    inputs = {id(a) for a in ins}
    pre = outside(body, ins, out_shape, weak)
    for m in body:
        out = m.outputs[0]
        if out.shape not in ((), tuple(out_shape)) or out.dtype.kind not in "fb":
            return False
        if m.name == "matmul" and lowering(m) is None:  # a small matmul (passes.small_k_matmul)
            a, b = m.inputs
            if len(out_shape) != 2 or id(a) not in inputs or id(b) not in inputs or \
                    a.shape != (out_shape[0], b.shape[0]) or b.shape[1] != out_shape[1]:
                return False
            continue
        if not accepts(m, weak):
            return False
        try:
            _, ctx = scalar_expr(m, [f"a{i}" for i in range(len(m.inputs))])
        except Unsupported:
            return False
        if any(key not in pre for key in ctx.needs):
            return False  # numpy's value of an operand that is not a group input
    return True


def _np_type(dt):
    return f"np.{np.dtype(dt).name}"


def numba_source(fname, body, ins, out_value, n_reduce, weak=(), contract=(), store=True,
                 kinds=None, pre=None):
    """The numba source of one kernel (see the module docstring) and the operand kinds.
    ``contract``: ``(matmul, permute, form, wide, narrow)`` accumulated over the rows:
    "left" ``narrow.T @ wide`` (k, C), "right" ``wide.T @ narrow`` (C, k), accumulated
    transposed as (k, C) so every accumulation runs along the contiguous columns.

    Rows are walked one at a time: a row's scalars (a small matmul's left operand, a
    contraction's narrow side) and the rows of the operands are taken once per row, and the
    accumulators are the kernel's own arrays (nothing can alias them), so LLVM vectorises
    the column loop (1.5x measured on the fused backward kernel). ``pre``: ``{(id(node),
    role): Value}``, the operand (one of ``ins``) holding numpy's exp/log/tanh for that node
    (``outside``)."""
    pre = pre or {}
    shape = out_value.shape
    if kinds is None:  # (given when the result was reshaped to (rows, columns))
        kinds = [operand_kind(a, shape, weak, matrices(body, contract)) for a in ins]
    param = {id(a): f"x{i}" for i, a in enumerate(ins)}
    params = [f"x{i}" for i in range(len(ins))] + ["out0"] + [
        f"red{k}" for k in range(n_reduce)] + [f"con{k}" for k in range(len(contract))] + [
        f"x{i}d" for i, kind in enumerate(kinds) if kind == "chan"]  # rows per channel
    flat = len(shape) == 1  # a 1-D result: one loop (else the operands come as (R, C))
    odt = _np_type(out_value.dtype)
    lines = ["import math", "import numpy as np", "from numba import njit", ""]
    helpers = set()  # the scalar forms' helper functions (Scalar.erf), defined first
    for m in body:
        if lowering(m) is not None:
            helpers |= scalar_expr(m, [f"a{i}" for i in range(len(m.inputs))])[1].helpers
    for h in sorted(helpers):
        lines += ["", HELPERS[h]()]
    if contract or any(m.name == "matmul" and lowering(m) is None for m in body):
        lines += ["", FMA]
    lines += ["", '@njit(error_model="numpy", cache=True)',
             f"def {fname}({', '.join(params)}):",
             "    C = out0.shape[0]" if flat else "    R, C = out0.shape"]
    accs = [f"acc{k}" for k in range(n_reduce)]
    for k, c in enumerate(contract):
        accs += [f"acc{k}_{q}" for q in range(c[4].shape[1])]
    for a in accs:
        lines.append(f"    {a} = np.zeros(C, {odt})")
    # rows of a small matmul's right operand, taken once
    hoisted = {}
    for m in body:
        if m.name == "matmul" and lowering(m) is None:
            b = param[id(m.inputs[1])]
            for k in range(m.inputs[0].shape[1]):
                nm = f"{b}_r{k}"
                if nm not in hoisted:
                    hoisted[nm] = f"{b}[{k}]"
    for nm, expr in hoisted.items():
        lines.append(f"    {nm} = {expr}")
    local = {}
    pad = " " * 8
    if flat:
        lines.append("    for j in range(C):")
        for i, (a, kind) in enumerate(zip(ins, kinds)):
            local[id(a)] = {"full": f"x{i}[j]", "row": f"x{i}[j]", "scalar": f"x{i}",
                            "matrix": None}[kind]
    else:
        for i, kind in enumerate(kinds):  # a channel operand's position: counters, no division
            if kind == "chan":
                lines.append(f"    x{i}c = 0")
                lines.append(f"    x{i}r = 0")
        lines.append("    for i in range(R):")
        row_scalars = {}
        for m in body:
            if m.name == "matmul" and lowering(m) is None:
                a = param[id(m.inputs[0])]
                for k in range(m.inputs[0].shape[1]):
                    row_scalars[f"{a}_{k}"] = f"{a}[i, {k}]"
        for _, _, _, _, narrow in contract:
            a = param[id(narrow)]
            for k in range(narrow.shape[1]):
                row_scalars[f"{a}_{k}"] = f"{a}[i, {k}]"
        for nm, expr in row_scalars.items():
            lines.append(f"        {nm} = {expr}")
        for i, (a, kind) in enumerate(zip(ins, kinds)):
            if kind == "full":
                lines.append(f"        x{i}i = x{i}[i]")
            elif kind == "chan":  # the channel's value: x{i}d rows to a channel, cycling
                lines += [f"        x{i}i = x{i}[x{i}c]", f"        x{i}r += 1",
                          f"        if x{i}r == x{i}d:", f"            x{i}r = 0",
                          f"            x{i}c += 1", f"            if x{i}c == x{i}.shape[0]:",
                          f"                x{i}c = 0"]
            local[id(a)] = {"full": f"x{i}i[j]", "row": f"x{i}[j]", "scalar": f"x{i}",
                            "chan": f"x{i}i", "matrix": None}[kind]
        if store:
            lines.append("        o = out0[i]")
        lines.append("        for j in range(C):")
        pad = " " * 12
    pre_local = {key: local[id(v)] for key, v in pre.items()}
    for j, m in enumerate(body):
        out = m.outputs[0]
        dt = _np_type(out.dtype)
        vals = [a for a in m.inputs if isinstance(a, Value)]
        # a Python number takes the array operands' dtype (NumPy 2's weak scalars): the
        # result's, or the compared operands' for a bool result
        peer = dt if out.dtype.kind == "f" or not vals else _np_type(vals[0].dtype)

        def arg(a):
            return local[id(a)] if isinstance(a, Value) else constant(peer, a)

        args = [arg(a) for a in m.inputs]
        if m.name == "matmul" and lowering(m) is None:  # the BLAS's fma chain (FMA)
            a, b = (param[id(x)] for x in m.inputs)
            expr = f"{dt}(0.0)"
            for k in range(m.inputs[0].shape[1]):
                expr = f"fma({a}_{k}, {b}_r{k}[j], {expr})"
        else:
            expr = scalar_expr(m, args, pre_local)[0]
        t = f"t{j}"
        lines.append(f"{pad}{t} = {expr}")
        local[id(out)] = t
    res = local[id(body[-1].outputs[0])]
    if store:
        lines.append(f"{pad}out0[j] = {res}" if flat else f"{pad}o[j] = {res}")
    for k in range(n_reduce):
        lines.append(f"{pad}acc{k}[j] += {res}")
    for k, (_, _, form, wide, narrow) in enumerate(contract):
        w = res if wide is body[-1].outputs[0] else local[id(wide)]
        nm = param[id(narrow)]
        for c in range(narrow.shape[1]):  # X.T @ Y: X[i, c] * Y[i, j], rows in order
            a, b = (f"{nm}_{c}", w) if form == "left" else (w, f"{nm}_{c}")
            lines.append(f"{pad}acc{k}_{c}[j] = fma({a}, {b}, acc{k}_{c}[j])")
    for k in range(n_reduce):
        lines.append(f"    red{k}[:] = acc{k}")
    for k, c in enumerate(contract):
        for q in range(c[4].shape[1]):
            lines.append(f"    con{k}[{q}] = acc{k}_{q}")
    lines.append("    return out0")
    return "\n".join(lines) + "\n", kinds


HELPERS = {"erf32": erf32_source, "erf64": erf64_source}  # Scalar's helper functions


def load(fname, source):
    """Compile (or load from numba's cache) the kernel ``fname`` defined by ``source``."""
    key = hashlib.sha1(source.encode()).hexdigest()[:16]
    fn = _loaded.get(key)
    if fn is not None:
        return fn
    mod_name = f"tapegrad_kernel_{key}"
    for d in (cache_dir(), os.path.join(tempfile.gettempdir(), f"tapegrad-{os.getuid()}")):
        path = os.path.join(d, mod_name + ".py")
        try:  # (an unwritable cache directory: the temporary one)
            os.makedirs(d, exist_ok=True)
            if not os.path.exists(path):
                tmp = f"{path}.{os.getpid()}.tmp"
                with open(tmp, "w") as f:
                    f.write(source)
                os.replace(tmp, path)
            break
        except OSError:
            continue
    spec = importlib.util.spec_from_file_location(mod_name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[mod_name] = mod
    spec.loader.exec_module(mod)
    fn = _loaded[key] = getattr(mod, fname)
    return fn


FLOATS = (np.dtype(np.float32), np.dtype(np.float64))  # the dtypes the numba kernels take


def float_dtype(*values):
    """The one float dtype (float32 or float64) of these Values (None entries skipped), or
    None: a hand-written kernel's dtype check."""
    dts = {np.dtype(v.dtype) for v in values if v is not None}
    if len(dts) != 1:
        return None
    dt = dts.pop()
    return dt if dt in FLOATS else None


# --- numpy's pairwise block with its eight accumulators as vector lanes --------------------
# numba runs no SLP vectoriser, so eight scalar accumulators stay eight scalar chains; these
# intrinsics hold them as the lanes of 256-bit vectors (the same IEEE operations, one vector
# instruction instead of eight): sum_block8, prod_block8 (each product rounded), max_block8.
# A kernel module's numba source includes LANES (after its own imports) as it does PAIRWISE.
LANES = '''from numba import types
from numba.core import cgutils
from numba.extending import intrinsic
from llvmlite import ir


def _lanes(kind):
    """The codegen of a reduction over x[o:o + n] (n a multiple of 8, >= 8) of flat C arrays
    in numpy's pairwise-block order: accumulator k takes x[k], x[k + 8], ... in order, the
    eight combined ((0+1)+(2+3))+((4+5)+(6+7)); the accumulators are the lanes of 256-bit
    vectors (8 float32, or 2 x 4 float64): the same IEEE operations as eight scalar
    accumulators (LLVM forms no FMA without fast-math flags), one vector operation instead
    of eight. kind "sum": x = a; "prod": x = a * b (each product rounded); "max": the max of
    a (``x > acc``, select: exact where a holds no NaN, a zero's sign aside)."""
    def codegen(context, builder, signature, args):
        k_arrays = 1 if kind != "prod" else 2
        arrs = [context.make_array(t)(context, builder, v)
                for t, v in zip(signature.args[:k_arrays], args[:k_arrays])]
        o, n = args[k_arrays], args[k_arrays + 1]
        f32 = signature.args[0].dtype == types.float32
        fty = context.get_value_type(signature.args[0].dtype)
        size = 4 if f32 else 8
        lanes = 8 if f32 else 4
        parts = 8 // lanes
        vty = ir.VectorType(fty, lanes)
        ptrs = [builder.bitcast(builder.gep(x.data, [o]), vty.as_pointer()) for x in arrs]

        def load(at):
            v = builder.load(builder.gep(ptrs[0], [at]), align=size)
            if kind == "prod":
                v = builder.fmul(v, builder.load(builder.gep(ptrs[1], [at]), align=size))
            return v

        def join(x, y):  # x the accumulator
            if kind == "max":
                return builder.select(builder.fcmp_ordered(">", y, x), y, x)
            return builder.fadd(x, y)

        accs = []
        for q in range(parts):
            acc = cgutils.alloca_once(builder, vty)
            builder.store(load(ir.Constant(n.type, q)), acc)
            accs.append(acc)
        nv = builder.sdiv(n, ir.Constant(n.type, lanes))
        step = ir.Constant(n.type, parts)
        with cgutils.for_range_slice(builder, step, nv, step) as (idx, _):
            for q, acc in enumerate(accs):
                at = builder.add(idx, ir.Constant(n.type, q))
                builder.store(join(builder.load(acc), load(at)), acc)
        e = []
        for acc in accs:
            v = builder.load(acc)
            e += [builder.extract_element(v, ir.Constant(ir.IntType(32), k))
                  for k in range(lanes)]
        lo = join(join(e[0], e[1]), join(e[2], e[3]))
        hi = join(join(e[4], e[5]), join(e[6], e[7]))
        return join(lo, hi)

    return codegen


def _flat(*xs):
    return all(isinstance(x, types.Array) and x.ndim == 1 and x.layout == "C" and
               x.dtype in (types.float32, types.float64) for x in xs) and \
        len({x.dtype for x in xs}) == 1


@intrinsic
def prod_block8(typingctx, a, b, o, n):
    """numpy's pairwise block over (a * b)[o:o + n] (_lanes)."""
    if not _flat(a, b):
        return None
    return a.dtype(a, b, types.intp, types.intp), _lanes("prod")


@intrinsic
def sum_block8(typingctx, a, o, n):
    """numpy's pairwise block over a[o:o + n] (_lanes)."""
    if not _flat(a):
        return None
    return a.dtype(a, types.intp, types.intp), _lanes("sum")


@intrinsic
def max_block8(typingctx, a, o, n):
    """The max of a[o:o + n], NaN-free (_lanes)."""
    if not _flat(a):
        return None
    return a.dtype(a, types.intp, types.intp), _lanes("max")\n\n\n'''


# --- numpy's pairwise sum ------------------------------------------------------------------
# numpy's pairwise sum as numba source, shared by the kernel modules that sum rows as eager does.
# pairwise_block is inlined into its callers (numba IR inlining): compiled on its own, LLVM
# keeps the eight running sums scalar; inlined into a caller's row loop it adds them as one
# vector (the same eight sums, the same bits), 2x faster on rows of 95 (512 rows: 14 -> 7 us)
PAIRWISE = '''@njit(error_model="numpy", cache=True, inline="always")
def pairwise_block(a, lo, n):
    if n < 8:
        res = a.dtype.type(0)
        for i in range(lo, lo + n):
            res += a[i]
        return res
    r0, r1, r2, r3 = a[lo], a[lo + 1], a[lo + 2], a[lo + 3]
    r4, r5, r6, r7 = a[lo + 4], a[lo + 5], a[lo + 6], a[lo + 7]
    i = lo + 8
    end = lo + n - n % 8
    while i < end:
        r0 += a[i]
        r1 += a[i + 1]
        r2 += a[i + 2]
        r3 += a[i + 3]
        r4 += a[i + 4]
        r5 += a[i + 5]
        r6 += a[i + 6]
        r7 += a[i + 7]
        i += 8
    res = ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))
    while i < lo + n:
        res += a[i]
        i += 1
    return res


@njit(error_model="numpy", cache=True)
def pairwise_sum(a, lo, n):
    # numpy's recursion (halves, a multiple of 8 on the left) walked with explicit stacks:
    # numba's on-disk cache mishandles recursive functions
    if n <= 128:
        return pairwise_block(a, lo, n)
    t_lo = np.empty(192, np.int64)
    t_n = np.empty(192, np.int64)
    t_join = np.empty(192, np.bool_)
    vals = np.empty(64, a.dtype)
    t_lo[0], t_n[0], t_join[0] = lo, n, False
    nt, nv = 1, 0
    while nt:
        nt -= 1
        l, m = t_lo[nt], t_n[nt]
        if t_join[nt]:
            vals[nv - 2] = vals[nv - 2] + vals[nv - 1]
            nv -= 1
        elif m <= 128:
            vals[nv] = pairwise_block(a, l, m)
            nv += 1
        else:
            m2 = m // 2
            m2 -= m2 % 8
            t_lo[nt], t_n[nt], t_join[nt] = l, m, True
            t_lo[nt + 1], t_n[nt + 1], t_join[nt + 1] = l + m2, m - m2, False
            t_lo[nt + 2], t_n[nt + 2], t_join[nt + 2] = l, m2, False
            nt += 3
    return vals[0]
'''

# --- softmax cross-entropy with class indices: loss, gradient and its column sums ---------
# the fused node's kernels live in kernels_loss.py (eager's arithmetic op for op, numpy's own
# exp and log between numba passes)
def cross_entropy():
    """The fused cross-entropy's gradient kernel (numba; its module also holds
    ``pairwise_sum``), compiled once per process."""
    from tapegrad.compiler import kernels_loss

    return kernels_loss.cross_entropy()


def cross_entropy_call(with_sum):
    """The generated code's side of the fused cross-entropy node (kernels_loss.py): the loss,
    the logits' gradient and, ``with_sum``, its column sums, eager's bits."""
    from tapegrad.compiler import kernels_loss

    return kernels_loss.cross_entropy_call(with_sum)
