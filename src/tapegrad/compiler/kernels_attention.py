"""Attention's numba kernels and one graph pass, for any model's attention (op_kernels.py),
bitwise eager's (the same IEEE operations in the same order, numpy's own ``exp``, eager's
BLAS calls), float32 and float64.

* The forward (``scaled_dot_product_attention`` and ``..._probs``, the one that also returns
  its probabilities for the backward) where the bias is one (T, S) mask for every batch
  entry and head (the causal mask) or none: eager's two batched BLAS products; between them
  ``attention_scores`` (``* scale + bias`` over each (b, h) block in one loop, NaNs flagged,
  the row's max, less the max) copies each row's *live span* (up to its mask's last entry
  that is not -inf) into one compact buffer, numpy's ``exp`` runs over that buffer only (a
  causal mask: 52% of the scores; the rest are -inf - max = -inf, whose exp is exactly 0),
  and ``attention_norm`` writes each row back (zeros past its span), sums it in numpy's
  pairwise order and divides. A row whose max is not finite (NaN, +-inf scores, a fully
  masked row) is copied whole, so its NaNs come out as eager's. The output is written by
  BLAS through a transposed view of a (B, T, H, E) buffer (``np.matmul(p, v, out=...)``:
  the same products, only the stores' row stride differs), so the model's
  ``permute(0, 2, 1, 3)`` and ``reshape`` to (B, T, H E) are views, not a copy. Other
  biases: kernels_norm_softmax's kernel.
* ``softmax_backward`` (kernels_norm_softmax.fuse_softmax_backward's rule ``p * (g - sum(g * p))``):
  the row sums of the products as vector lanes, then one loop a row.
* ``absorb_gradient_products`` (a pass after kernels_norm_softmax.merge_split_gradients):
  attention's q/k/v gradient products read only by the split's concatenated gradient become one
  ``concatenate_products`` node; its kernel has BLAS write each product straight into its
  slice of the output (``out=`` through the permutation), then scales the q and k parts
  and adds 0.0 in place (eager's ``* scale`` and its adds of zeros): no product arrays, no
  concatenating copy.

numpy's pairwise row sums (8 running sums over strides of 8, combined as a tree) and the row
max use ``_lanes``: LLVM intrinsics holding the eight sums in the lanes of 256-bit vectors,
the same IEEE additions (numba runs no SLP vectoriser, so eight scalar sums stay scalar).
tests/compiler/test_compiler_attention_fast.py checks each kernel against eager.
"""
import numpy as np

from tapegrad.compiler import kernels, op_kernels, passes
from tapegrad.compiler.ir import Node, Value, call_node

_FLOATS = kernels.FLOATS
_K = {}

# Each row is 2-D indexed (a row view costs its reference counts: 1.5 ns a row) and the
# compact buffer by unsigned offsets (a signed one gets numba's wraparound select per
# element, which stops LLVM's vectoriser: 35 vs 7 us a pass over the GPT's 2048 rows).
# numba runs no SLP vectoriser: only loops vectorise, so each step over a row is one loop.
SOURCE = '''import numpy as np
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic
from llvmlite import ir


''' + kernels.PAIRWISE + '''

''' + kernels.LANES + '''

@njit(error_model="numpy", cache=True)
def softmax_backward_flat(gp, p, out, tmp, C):
    """Rows of C of the flat C-contiguous gp, p, out: out = p * (gp - sum(gp * p)) per row,
    softmax's rule op for op with numpy's pairwise row sum (8 <= C <= 128: prod_block8
    and the rest in order; otherwise the products into tmp, then pairwise_sum)."""
    N = p.shape[0]
    CU = np.uint64(C)
    e = C - C % 8
    short = 8 <= C <= 128
    for r in range(N // C):
        o = r * C
        if short:
            sm = prod_block8(gp, p, o, e)
            for j in range(e, C):
                sm += gp[o + j] * p[o + j]
        else:
            for j in range(C):
                tmp[j] = gp[o + j] * p[o + j]
            sm = pairwise_block(tmp, 0, C) if C <= 128 else pairwise_sum(tmp, 0, C)
        ou = np.uint64(o)
        for j in range(CU):
            out[ou + j] = p[ou + j] * (gp[ou + j] - sm)

@njit(error_model="numpy", cache=True)
def attention_scores(s4, b2, scale, has_bias, c, start, lens, hi):
    """Row r of the (B, H, T, S) products s4 seen as (R, S) rows s (r = ((b h) t)), in blocks
    of T rows: t = s[r] * scale (+ b2[r % T], b2 (T, S)) in place, less the row's max (NaN
    when the row holds one), into c from n on, where n then advances by the row's span:
    hi[r % T] when the max is finite (past it t is -inf - max = -inf, exp 0), else S. c
    holds S more than the spans; hi gets 1 + the last j where b2[i, j] is not -inf (S
    without a bias). The max: max_block8 (exact: the max of numbers is one of them; numpy's
    may be a zero of the other sign, which no exp sees: t - (+-0) differs only for
    t = +-0, exp 1 either way). Returns n."""
    B, H, T, S = s4.shape
    R = B * H * T
    s = s4.reshape(R, S)
    ninf = s.dtype.type(-np.inf)
    for i in range(T):
        h = S
        if has_bias:
            h = 0
            for j in range(S):
                if b2[i, j] != ninf:
                    h = j + 1
        hi[i] = h
    SU = np.uint64(S)
    TS = np.uint64(T * S)
    zero = s.dtype.type(0)
    sf = s.reshape(R * S)
    bf = b2.reshape(b2.size)
    n = np.uint64(0)
    e = S - S % 8
    for blk in range(R // T):
        # one loop over the block's T rows (a loop per row of 32 costs its setup each time)
        o = np.uint64(blk) * TS
        bad = False
        if has_bias:
            for j in range(TS):
                t = sf[o + j] * scale + bf[j]  # two roundings: numba forms no FMA
                sf[o + j] = t
                bad |= t != t
        else:
            for j in range(TS):
                t = sf[o + j] * scale
                sf[o + j] = t
                bad |= t != t
        for i in range(T):
            r = blk * T + i
            nan = False
            if bad:
                for j in range(S):
                    nan |= s[r, j] != s[r, j]
            if nan:
                m = s.dtype.type(np.nan)
            else:
                if e:
                    m = max_block8(sf, r * S, e)
                    j0 = e
                else:
                    m = s[r, 0]
                    j0 = 1
                for j in range(j0, S):
                    v = s[r, j]
                    m = v if v > m else m
            h = np.uint64(hi[i]) if m - m == zero else SU
            start[r] = n
            lens[r] = h
            for j in range(SU):
                c[n + j] = s[r, j] - m
            n += h
    return n


@njit(error_model="numpy", cache=True)
def attention_norm(s4, c, start, lens):
    """Row r of s4 seen as (R, S) rows s: s[r] = e / sum(e) with e = c's span of row r,
    then zeros (exp(-inf)); the sum numpy's pairwise one over the whole row (sum_block8 and
    the rest in order for 8 <= S <= 128)."""
    S = s4.shape[-1]
    R = s4.size // S
    s = s4.reshape(R, S)
    sf = s4.reshape(R * S)
    SU = np.uint64(S)
    zero = s.dtype.type(0)
    e = S - S % 8 if 8 <= S <= 128 else 0
    for r in range(R):
        n0 = start[r]
        h = lens[r]
        for j in range(SU):
            s[r, j] = c[n0 + j] if j < h else zero
        if e:
            tot = sum_block8(sf, r * S, e)
            for j in range(e, S):
                tot += s[r, j]
        elif S < 8:
            tot = zero
            for j in range(S):
                tot += s[r, j]
        else:
            tot = pairwise_sum(s[r], 0, S)
        for j in range(h):  # past the span 0 / tot is the +0.0 already there (tot >= 1)
            s[r, j] = s[r, j] / tot


@njit(error_model="numpy", cache=True)
def scale_add_zero(x, cs):
    """In place over (P, A, Q) x: x[p, a, q] = x[p, a, q] * cs[a] + 0.0 (cs 1 where there is
    no scale: x * 1 is x, so x + 0.0 as eager's add of zeros; -0.0 becomes +0.0)."""
    P, A, Q = x.shape
    zero = x.dtype.type(0)
    if Q == 1:
        for p in range(P):
            for a in range(A):
                x[p, a, 0] = x[p, a, 0] * cs[a] + zero
    else:
        for p in range(P):
            for a in range(A):
                c = cs[a]
                for q in range(Q):
                    x[p, a, q] = x[p, a, q] * c + zero


@njit(error_model="numpy", cache=True)
def scale_add_zero_sums(x, cs, red):
    """scale_add_zero over (P, A) x (the concatenation along the last axis) with the column
    sums of the result: each row added in order into red zeroed first (numpy's add.reduce
    over axis 0, into 0.0)."""
    P, A = x.shape
    zero = x.dtype.type(0)
    for a in range(A):
        red[a] = zero
    for p in range(P):
        for a in range(A):
            v = x[p, a] * cs[a] + zero
            x[p, a] = v
            red[a] += v
'''


def _kernels():
    """The numba functions, compiled (or loaded from numba's cache) on first use."""
    if not _K:
        import sys

        mod = sys.modules[kernels.load("attention_scores", SOURCE).py_func.__module__]
        for name in ("attention_scores", "attention_norm", "scale_add_zero",
                     "scale_add_zero_sums", "softmax_backward_flat"):
            _K[name] = getattr(mod, name)
    return _K


_floats = kernels.float_dtype  # (the one float dtype of Values, or None)


def _mask_shape(bias, T, S):
    """bias's shape as 2-D (rows, cols) broadcasting to (T, S), its leading dims all 1; None
    where it varies across batch entries or heads (or does not broadcast)."""
    shape = tuple(bias.shape)
    if len(shape) > 4 or any(d != 1 for d in shape[:-2]):
        return None
    two = (1,) * (2 - len(shape[-2:])) + shape[-2:]
    if two[0] not in (1, T) or two[1] not in (1, S):
        return None
    return two


def attention_operands(node):
    """A ``scaled_dot_product_attention[_probs]`` node's checks shared by the kernels: 4-D
    q (B, H, T, D), k (B, H, S, D), v (B, H, S, E) of one float dtype (and an optional bias
    Value of it), no dropout, a number as scale: ``(bias, (B, H, T, D, S, E), dtype,
    scale)``, or None."""
    ins = list(node.inputs) + [None] * (4 - len(node.inputs))
    q, k, v, bias = ins[:4]
    if len(node.inputs) not in (3, 4) or node.params.get("keep") is not None or \
            not all(isinstance(a, Value) for a in (q, k, v)):
        return None
    if bias is not None and not isinstance(bias, Value):
        return None
    if len(q.shape) != 4 or len(k.shape) != 4 or len(v.shape) != 4:
        return None
    B, H, T, D = q.shape
    S, E = k.shape[2], v.shape[3]
    if tuple(k.shape) != (B, H, S, D) or tuple(v.shape) != (B, H, S, E) or \
            0 in (B, H, T, D, S, E):
        return None
    dt = _floats(q, k, v, bias)
    scale = node.params.get("scale", 1.0)
    if dt is None or not isinstance(scale, (int, float)) or isinstance(scale, bool):
        return None
    return bias, (B, H, T, D, S, E), dt, scale


def attention_forward(node, probs):
    """The kernel for a ``scaled_dot_product_attention`` node (``probs``: its ``_probs``
    form, returning (out, p)), or None where it does not apply."""
    got = attention_operands(node)
    if got is None:
        return None
    bias, (B, H, T, D, S, E), dt, scale = got
    two = None if bias is None else _mask_shape(bias, T, S)
    if bias is not None and two is None:
        return None
    from tapegrad.backend import blas

    K = _kernels()
    scores, norm = K["attention_scores"], K["attention_norm"]
    sc = dt.type(scale)
    none2 = np.zeros((1, 1), dt)
    # a product blas.matmul does not switch to one thread is its plain np.matmul
    direct = blas.LIBRARY is None or not blas.runs_serial(T, E, S, dt.itemsize)
    matmul = blas.matmul
    # scratch kept by the kernel (a compiled function is not reentrant: memory.py): a fresh
    # 256 KB buffer each call costs its page faults in the step
    c = np.empty(B * H * T * S + S, dt)
    start, lens, hi = (np.empty(n, t) for n, t in ((B * H * T, np.uint64),
                                                  (B * H * T, np.uint64), (T, np.int64)))

    def probabilities(q, k, bias):
        s = matmul(q, np.swapaxes(k, -1, -2))  # eager's products (its BLAS calls)
        if bias is None:
            b2 = none2
        elif bias.shape == (T, S) and bias.flags.c_contiguous:
            b2 = bias
        else:
            b2 = np.ascontiguousarray(np.broadcast_to(bias.reshape(two), (T, S)))
        n = scores(s, b2, sc, bias is not None, c, start, lens, hi)
        live = c[:n]
        np.exp(live, out=live)  # numpy's own exp (SIMD), as eager's softmax
        norm(s, c, start, lens)
        return s

    def product(p, v):
        if not direct:
            return matmul(p, v)
        out = np.empty((B, T, H, E), dt).transpose(0, 2, 1, 3)
        np.matmul(p, v, out=out)  # BLAS stores through the (B, T, H, E) layout
        return out

    if probs:
        def attention_probs_fast(q, k, v, bias=None, scale=1.0, keep=None):
            p = probabilities(q, k, bias)
            return product(p, v), p

        return attention_probs_fast

    def attention_fast(q, k, v, bias=None, scale=1.0, keep=None):
        return product(probabilities(q, k, bias), v)

    return attention_fast



# --- attention's q/k/v gradients: BLAS writes each product into its slice ----------------
def _blas_direct(a, b):
    """Whether ``backend.blas.matmul`` runs these Values' product as one plain np.matmul
    (each product's work outside its thread switch), so np.matmul(..., out=) is its call."""
    from tapegrad.backend import blas

    if len(a.shape) > 2 and len(b.shape) == 2:
        return False  # blas.matmul may run a stack times a matrix as one 2-D GEMM
    if {np.dtype(a.dtype), np.dtype(b.dtype)} - set(_FLOATS) or a.dtype != b.dtype:
        return False
    return blas.LIBRARY is None or not blas.runs_serial(
        a.shape[-2], a.shape[-1], b.shape[-1], np.dtype(a.dtype).itemsize)


def _products_impl(program, ext, mms, concat, sums=()):
    """The node's numpy body: the absorbed nodes in their order (eager's operations), then
    the concatenation's own body over the products (and, with ``sums``, the traced column
    sums of the result: the next linear's bias gradient)."""
    def concatenate_products(*arrays):
        env = {id(v): a for v, a in zip(ext, arrays)}
        for m in program:
            args = [env[id(a)] if isinstance(a, Value) else a for a in m.inputs]
            for v, o in zip(m.outputs, call_node(m, args)):
                env[id(v)] = o
        res = concat(*[env[id(m.outputs[0])] for m in mms])
        if not sums:
            return res
        return (res,) + tuple(call_node(m, [res.reshape(m.inputs[0].shape)])[0]
                              for m in sums)

    return concatenate_products


def _absorbable(m, inside):
    """Whether ``m`` (producing an operand of the nodes ``inside``) can join them: a permute
    (a view), the fused softmax gradient, or a product blas.matmul runs as one np.matmul."""
    if m is None or m.op is None and m.name != "softmax_backward" or \
            not all(isinstance(a, Value) for a in m.inputs):
        return False
    if m.name == "permute":
        return len(m.inputs) == 1
    if m.name == "softmax_backward":
        return m.impl is not None and len(m.inputs) == 2 and \
            all(np.dtype(a.dtype) in _FLOATS for a in m.inputs)
    return m.name == "matmul" and len(m.inputs) == 2 and not m.params and \
        all(len(a.shape) >= 2 for a in m.inputs) and _blas_direct(*m.inputs)


def absorb_gradient_products(graph):
    """A graph pass: a ``concatenate_gradients`` node (kernels_norm_softmax.merge_split_gradients:
    attention's q/k/v gradients put into the split's (B, T, 3 H D) gradient) whose sources
    are each a ``matmul`` read by nothing else becomes ``concatenate_products`` over the
    products' operands: its kernel lets BLAS write each product straight into its slice of
    the output (np.matmul(..., out=) through the permutation: the same products, only the
    stores' stride differs), then one in-place pass ``x * c + 0.0``; no product array, no
    copy. The nodes making the products' operands join it where nothing else reads them:
    permutes, attention's fused softmax gradient and the product it reads (g v^T): the
    kernel computes those into buffers of its own."""
    from tapegrad.compiler.ir import readers

    uses = readers(graph)
    producer = {id(v): n for n in graph.nodes for v in n.outputs}
    pos = {id(n): i for i, n in enumerate(graph.nodes)}
    replace, drop = {}, set()
    for n in graph.nodes:
        meta = n.meta or {}
        if n.name != "concatenate_gradients" or n.impl is None or "chains" not in meta:
            continue
        mms = [producer.get(id(x)) for x in n.inputs]
        if any(m is None or m.name != "matmul" or not _absorbable(m, ()) or
               len(uses.get(id(m.outputs[0]), ())) != 1 or id(m) in drop for m in mms):
            continue
        inside = {id(m): m for m in mms}
        grew = True
        while grew:  # operands' producers read only by the group join it
            grew = False
            for m in list(inside.values()):
                for a in m.inputs:
                    pm = producer.get(id(a))
                    if pm is None or id(pm) in inside or id(pm) in drop or \
                            not _absorbable(pm, inside):
                        continue
                    if all(all(id(u) in inside for u in uses.get(id(v), ()))
                           for v in pm.outputs):
                        inside[id(pm)] = pm
                        grew = True
        program = sorted(inside.values(), key=lambda m: pos[id(m)])
        made = {id(v) for m in program for v in m.outputs}
        ext = []
        for m in program:
            for a in m.inputs:
                if isinstance(a, Value) and id(a) not in made and \
                        all(a is not e for e in ext):
                    ext.append(a)
        sums = [m for m, _ in passes.column_sums(graph, n.outputs[0])]
        replace[id(n)] = Node(None, "concatenate_products", ext, {},
                              list(n.outputs) + [m.outputs[0] for m in sums],
                              impl=_products_impl(program, ext, mms, n.impl, sums),
                              meta=dict(meta, nodes=program + list(meta.get("nodes", ())),
                                        products=mms, program=program, sums=sums))
        drop.update(inside)
        drop.update(id(m) for m in sums)
    return passes.replace_nodes(graph, replace, drop)


@op_kernels.register("concatenate_products")
def concatenate_products_factory(node):
    """``concatenate_products`` over float32/float64: the absorbed permutes as views, the
    softmax gradient (softmax_backward_flat) and any other product into buffers kept by
    the kernel (C-contiguous, as eager's fresh results), each concatenated product written
    by np.matmul into its slice of a fresh output seen in the product's shape (a view:
    checked on an empty probe, with rows BLAS can store through, as numpy's matmul
    requires to call it), then ``scale_add_zero`` over the output. None (the body runs)
    where a slice's view would be a copy or not a BLAS output."""
    meta = node.meta or {}
    chains, cuts, mms = meta.get("chains"), meta.get("cuts"), meta.get("products")
    program = meta.get("program", mms)
    out = node.outputs[0]
    if chains is None or cuts is None or mms is None or len(mms) != len(chains) or \
            not all(isinstance(a, Value) for a in node.inputs):
        return None
    dt = _floats(out, *node.inputs)
    shape = tuple(out.shape)
    if dt is None or any(d == 0 for d in shape) or len({c[0] for c in cuts}) != 1:
        return None
    axis = cuts[0][0]
    probe = np.empty(shape, dt)
    slot = {id(m.outputs[0]): i for i, m in enumerate(mms)}
    cs = np.ones(shape[axis], dt)
    views = []
    for m, ch, (_, start, stop) in zip(mms, chains, cuts):
        scale, dims = ch if ch is not None else (None, None)
        xs = tuple(m.outputs[0].shape)
        if np.dtype(m.outputs[0].dtype) != dt or len(xs) < 2:
            return None
        seen = xs if dims is None else tuple(xs[d] for d in dims)
        sl = (slice(None),) * axis + (slice(start, stop),)
        part = probe[sl]
        if part.size != int(np.prod(seen, dtype=np.int64)):
            return None
        try:
            view = part.reshape(seen)
        except ValueError:
            return None
        if not np.shares_memory(view, probe) or view.base is None:
            return None
        dst = view if dims is None else view.transpose(np.argsort(dims))
        isz = dt.itemsize
        if dst.shape != xs or dst.strides[-1] != isz or dst.strides[-2] % isz or \
                dst.strides[-2] // isz < xs[-1]:
            return None  # numpy's matmul would not hand this output to BLAS
        views.append((sl, seen, None if dims is None else tuple(np.argsort(dims))))
        if scale is not None:
            cs[start:stop] = dt.type(scale)
    # the program as steps over a list of arrays: the inputs', then each node's result
    at = {id(v): i for i, v in enumerate(node.inputs)}
    steps = []
    sbk = _kernels()["softmax_backward_flat"]
    for m in program:
        try:
            src = [at[id(a)] for a in m.inputs]
        except KeyError:
            return None
        o = m.outputs[0]
        if np.dtype(o.dtype) != dt:
            return None
        if m.name == "permute":
            steps.append(("view", src, tuple(m.params.get("dims", ())), None))
        elif id(o) in slot:
            steps.append(("product", src, slot[id(o)], None))
        elif m.name == "matmul":
            steps.append(("matmul", src, None, np.empty(tuple(o.shape), dt)))
        elif m.name == "softmax_backward" and tuple(m.inputs[0].shape) == tuple(o.shape) \
                and node.impl is not None:
            size = int(np.prod(o.shape, dtype=np.int64))
            C = o.shape[-1]
            if size == 0:
                return None
            steps.append(("softmax", src, (size, C, np.empty(C, dt)),
                          np.empty(tuple(o.shape), dt)))
        else:
            return None
        at[id(o)] = len(at)
    fix, fix_sums = _kernels()["scale_add_zero"], _kernels()["scale_add_zero_sums"]
    P = int(np.prod(shape[:axis], dtype=np.int64))
    Q = int(np.prod(shape[axis + 1:], dtype=np.int64))
    body = node.impl
    sums = meta.get("sums") or ()
    if sums and (Q != 1 or any(np.dtype(m.outputs[0].dtype) != dt or
                               tuple(m.inputs[0].shape) != (P, shape[axis]) for m in sums)):
        return None  # (the column sums of a concatenation along the last axis only)

    def concatenate_products_kernel(*arrays):
        res = np.empty(shape, dt)
        vals = list(arrays)
        for kind, src, arg, buf in steps:
            if kind == "view":
                vals.append(vals[src[0]].transpose(arg))
            elif kind == "product":
                sl, seen, inv = views[arg]
                dst = res[sl].reshape(seen)
                if inv is not None:
                    dst = dst.transpose(inv)
                np.matmul(vals[src[0]], vals[src[1]], out=dst)  # BLAS stores into the slice
                vals.append(dst)
            elif kind == "matmul":
                vals.append(np.matmul(vals[src[0]], vals[src[1]], out=buf))
            else:  # the softmax gradient
                size, C, tmp = arg
                gp, p = vals[src[0]], vals[src[1]]
                if not (gp.flags.c_contiguous and p.flags.c_contiguous):
                    return body(*arrays)  # strided rows: numpy's own sums (eager's bits)
                sbk(gp.reshape(size), p.reshape(size), buf.reshape(size), tmp, C)
                vals.append(buf)
        if not sums:
            fix(res.reshape(P, shape[axis], Q), cs)
            return res
        red = np.empty(shape[axis], dt)
        fix_sums(res.reshape(P, shape[axis]), cs, red)
        return (res, red) + tuple(red.copy() for _ in range(len(sums) - 1))

    return concatenate_products_kernel


# --- softmax's gradient rule (fused by kernels_norm_softmax.fuse_softmax_backward) ----------------
def softmax_backward(node):
    """The kernel for a ``softmax_backward`` node over float32/float64 (any shape: rows of
    its last axis), or None. Inputs that are not C-contiguous go to the node's own ops:
    numpy sums a strided row in another order than the pairwise one (eager's bits)."""
    if len(node.inputs) != 2 or not all(isinstance(a, Value) for a in node.inputs):
        return None
    gp, p = node.inputs
    dt = _floats(gp, p)
    if dt is None or gp.shape != p.shape or not p.shape or any(d == 0 for d in p.shape):
        return None
    fn = _kernels()["softmax_backward_flat"]
    shape = tuple(p.shape)
    C = shape[-1]
    size = int(np.prod(shape, dtype=np.int64))
    tmp = np.empty(C, dt)

    body = node.impl

    def softmax_backward_fast(gp, p):
        if not (gp.flags.c_contiguous and p.flags.c_contiguous) and body is not None:
            return body(gp, p)
        out = np.empty(shape, dt)
        fn(np.ascontiguousarray(gp).reshape(size), np.ascontiguousarray(p).reshape(size),
           out.reshape(size), tmp, C)
        return out

    return softmax_backward_fast
