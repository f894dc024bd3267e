"""Hand-written numba kernels for LayerNorm, softmax and attention, whatever the model
(op_kernels.py).

Each factory sees one graph node and returns a callable with the op forward's signature
(arrays, then the node's params as keywords), or None where its kernel does not apply (then
the op's numpy forward runs):

* ``layer_norm`` over the last axis: kernels_residual's row kernel (mean, centred variance,
  scale and shift on tiles of rows; the row sums numpy's pairwise sum), in the op's own
  order of operations, so the result is bitwise eager's.
* ``softmax`` over the last axis of a float array: ``x - max`` per row, numpy's own ``exp``
  (its SIMD loop: numba's libm ``exp`` is 6x slower), then the rows' pairwise sums and the
  division: bitwise eager's.
* ``scaled_dot_product_attention`` without dropout: eager's two batched BLAS products, and
  between them one in-place pass (``* scale + bias``, less the row's max), numpy's ``exp``
  and one pass of row sums and divisions instead of eager's seven numpy calls and their
  temporaries: bitwise eager's. (A numba loop nest for the products themselves measured
  slower than BLAS: 2 GFLOP/s, its rows may alias, so LLVM keeps them scalar.) Where the
  bias is one (T, S) mask or none, kernels_attention.py's kernel serves it instead.
* ``layer_norm_backward`` and ``softmax_backward``: nodes made by the graph passes
  ``fuse_layer_norm_backward`` / ``fuse_softmax_backward`` (defined here, run from
  passes.PASSES) out of the traced gradient rules' ~23 / 4 nodes; one pass per row (the
  softmax one's kernel is in kernels_attention.py).
* ``scaled_dot_product_attention_probs``: the pass ``share_attention_probabilities`` makes
  the forward return the probabilities its traced rule would recompute (the rule's own
  q k^T, scale, bias and softmax nodes, on the same arrays: the same bits).
* ``concatenate_gradients``: the pass ``merge_split_gradients`` turns a split's three slice
  gradients put into zeros and added into one concatenation, reading each gradient's
  ``reshape(permute(mul(x, c)))`` chain (the heads' q/k/v gradients) from x; numba writes
  ``x * c + 0.0`` through the permutation into the output's slices (one pass, no copies).
* ``embedding_backward`` as one loop instead of ``np.add.at``: the same operations in the
  same order, bitwise eager's. (The optimizer step's and clip_grad_norm_'s kernels are in
  kernels_optim.py.)

float32 and float64 (the result's dtype is the input's; float32 arithmetic stays float32,
as numpy's with a Python-float constant does). Every kernel is bitwise eager's: the same
IEEE operations in the same order, numpy's own ``exp`` and BLAS calls where eager uses
them (tests/compiler/test_compiler_kernels_norm_softmax.py and its ``_edges`` companion check each).
numba's ``cache=True`` keeps the machine code between processes; the loops hold no
recursion (numba's cache cannot load recursive functions: a segfault).
"""
import numpy as np

from tapegrad.compiler import kernels, op_kernels, passes, patterns
from tapegrad.compiler.ir import Value, readers

_FLOATS = kernels.FLOATS
_K = {}


def _kernels():
    """The numba functions, compiled (or loaded from numba's cache) on first use."""
    if not _K:
        from tapegrad.compiler import kernels

        import sys

        mod = sys.modules[kernels.load("attention_shift", SOURCE).py_func.__module__]
        for name in ("softmax_shift", "softmax_norm", "attention_shift",
                     "layer_norm_backward_rows", "scaled_copy"):
            _K[name] = getattr(mod, name)
    return _K


# The row kernels sum a row of at most 128 (numpy's one pairwise block) by calling
# pairwise_block directly: pairwise_sum's own call around it costs 1.6x softmax_norm's whole
# pass at the GPT's rows of 32 (31 -> 19 us over 2048 rows), 10-20% of the LayerNorm ones.
SOURCE = '''import numpy as np
from numba import njit


''' + kernels.PAIRWISE + '''

@njit(error_model="numpy", cache=True)
def softmax_shift(x, out):
    """out[i] = x[i] - max(x[i]) (numpy's maximum: NaN wins); numpy's exp follows."""
    R, C = x.shape
    for i in range(R):
        xi = x[i]
        oi = out[i]
        m = xi[0]
        for j in range(1, C):
            v = xi[j]
            if v > m or v != v:
                m = v
        for j in range(C):
            oi[j] = xi[j] - m


@njit(error_model="numpy", cache=True)
def softmax_norm(e):
    """e[i] /= sum(e[i]), numpy's pairwise sum."""
    R, C = e.shape
    short = C <= 128  # one block: pairwise_sum's own call costs (SOURCE's note)
    for i in range(R):
        ei = e[i]
        s = pairwise_block(ei, 0, C) if short else pairwise_sum(ei, 0, C)
        for j in range(C):
            ei[j] = ei[j] / s


@njit(error_model="numpy", cache=True)
def attention_shift(s, bias, scale, has_bias):
    """In place over the (B, H, T, S) products q k^T: s = s * scale + bias (broadcast to
    s's shape), less each row's max (numpy's maximum: NaN wins)."""
    B, H, T, S = s.shape
    for bb in range(B):
        for h in range(H):
            for i in range(T):
                r = s[bb, h, i]
                if has_bias:
                    bi = bias[bb, h, i]
                    for j in range(S):
                        r[j] = r[j] * scale + bi[j]  # two roundings: numba forms no FMA
                else:
                    for j in range(S):
                        r[j] = r[j] * scale
                # the max as a branch-free select chain, NaN apart (one NaN: the row's max
                # is NaN, as numpy's): 2.4x faster than one loop testing both
                m = r[0]
                for j in range(S):
                    v = r[j]
                    m = v if v > m else m
                nan = False
                for j in range(S):
                    nan = nan | (r[j] != r[j])
                if nan:
                    m = r.dtype.type(np.nan)
                for j in range(S):
                    r[j] = r[j] - m


@njit(error_model="numpy", cache=True)
def scaled_copy(src, dst, scale, has_scale):
    """dst = src * scale + 0.0 (without a scale: src + 0.0) over two 4-D arrays of one
    shape (any strides): eager's product by a Python number, then its adds of zeros (-0.0
    becomes +0.0)."""
    A, B, C, D = src.shape
    zero = dst.dtype.type(0)
    for a in range(A):
        for b in range(B):
            for c in range(C):
                s = src[a, b, c]
                d = dst[a, b, c]
                if has_scale:
                    for k in range(D):
                        d[k] = s[k] * scale + zero
                else:
                    for k in range(D):
                        d[k] = s[k] + zero


@njit(error_model="numpy", cache=True)
def layer_norm_backward_rows(g, x, w, eps, with_gb, gx, gw, gb, xh, gxh, tmp):
    """LayerNorm's gradient over the last axis (ops.nn._norm_rule, op for op), one pass per
    row: gx; gw and gb as column sums (rows in order, the first row copied, as numpy's
    add.reduce over a leading axis). xh, gxh, tmp: one row each of scratch."""
    R, C = x.shape
    short = C <= 128  # one block: pairwise_sum's own call costs (SOURCE's note)
    n = x.dtype.type(C)
    one = x.dtype.type(1)
    for i in range(R):
        xi = x[i]
        gi = g[i]
        m1 = (pairwise_block(xi, 0, C) if short else pairwise_sum(xi, 0, C)) / n
        for j in range(C):
            xh[j] = xi[j] - m1
        for j in range(C):
            tmp[j] = xh[j] * xh[j]
        rstd = one / np.sqrt((pairwise_block(tmp, 0, C) if short else pairwise_sum(tmp, 0, C))
                             / n + eps)
        for j in range(C):
            xh[j] = xh[j] * rstd
        for j in range(C):
            gxh[j] = gi[j] * w[j]
        m3 = (pairwise_block(gxh, 0, C) if short else pairwise_sum(gxh, 0, C)) / n
        for j in range(C):
            tmp[j] = gxh[j] * xh[j]
        m4 = (pairwise_block(tmp, 0, C) if short else pairwise_sum(tmp, 0, C)) / n
        o = gx[i]
        for j in range(C):
            o[j] = rstd * ((gxh[j] - m3) - xh[j] * m4)
        if i == 0:
            for j in range(C):
                gw[j] = gi[j] * xh[j]
            if with_gb:
                for j in range(C):
                    gb[j] = gi[j]
        else:
            for j in range(C):
                gw[j] += gi[j] * xh[j]
            if with_gb:
                for j in range(C):
                    gb[j] += gi[j]
'''


_floats = kernels.float_dtype  # (the one float dtype of Values, or None)


def _value(a):
    return a if isinstance(a, Value) else None


@op_kernels.register("layer_norm")
def layer_norm_factory(node):
    """LayerNorm over the last axis of a float32/float64 input, weight and bias of that
    length (or None)."""
    x = _value(node.inputs[0]) if node.inputs else None
    if x is None or not x.shape or x.shape[-1] == 0 or any(d == 0 for d in x.shape):
        return None
    p = node.params
    C = x.shape[-1]
    if tuple(p.get("axes", ())) != (len(x.shape) - 1,) or tuple(p.get("param_shape", ())) \
            != (C,) or not isinstance(p.get("eps"), (int, float)):
        return None
    extra = list(node.inputs[1:])
    wb = [_value(a) for a in extra]
    if any(a is not None and w is None for a, w in zip(extra, wb)):
        return None  # a literal weight/bias
    if any(w is not None and tuple(w.shape) != (C,) for w in wb):
        return None
    dt = _floats(x, *wb)
    if dt is None:
        return None
    from tapegrad.compiler.kernels_residual import layer_norm_call

    # (kernels_residual's row kernel: tiles of rows, the pairwise blocks summed in vectors,
    # ops.nn._norm_forward's operations; 1.5-2x faster than a row at a time)
    call = layer_norm_call(tuple(x.shape), dt)

    def layer_norm_kernel(x, w=None, b=None, *, axes, eps, param_shape):
        return call(x, w, b, eps)

    return layer_norm_kernel


@op_kernels.register("softmax")
def softmax_factory(node):
    """softmax over the last axis of a float32/float64 input."""
    x = _value(node.inputs[0]) if node.inputs else None
    if x is None or not x.shape or any(d == 0 for d in x.shape):
        return None
    dim = node.params.get("dim")
    if not isinstance(dim, int) or dim not in (-1, len(x.shape) - 1):
        return None
    dt = _floats(x)
    if dt is None or np.dtype(node.outputs[0].dtype) != dt:
        return None
    shift, norm = _kernels()["softmax_shift"], _kernels()["softmax_norm"]
    shape = tuple(x.shape)
    C = shape[-1]
    R = int(np.prod(shape[:-1], dtype=np.int64))

    def softmax_kernel(x, dim):
        out = np.empty(shape, dt)
        o = out.reshape(R, C)
        shift(x.reshape(R, C), o)
        np.exp(o, out=o)  # numpy's own exp (SIMD), as eager's
        norm(o)
        return out

    return softmax_kernel


@op_kernels.register("scaled_dot_product_attention")
def attention_factory(node):
    """Attention over 4-D float32/float64 q, k, v (no dropout), an additive float bias of
    their dtype broadcasting to the scores, or none. kernels_attention's kernel first (one
    (T, S) mask, rows up to its length), this one for the rest."""
    from tapegrad.compiler import kernels_attention

    fast = kernels_attention.attention_forward(node, probs=False)
    if fast is not None:
        return fast
    got = kernels_attention.attention_operands(node)
    if got is None:
        return None
    bias, (B, H, T, D, S, E), dt, scale = got
    if bias is not None:
        try:
            if np.broadcast_shapes(tuple(bias.shape), (B, H, T, S)) != (B, H, T, S):
                return None
        except ValueError:
            return None
    from tapegrad.backend.blas import matmul

    shift, norm = _kernels()["attention_shift"], _kernels()["softmax_norm"]
    none = np.zeros((1, 1, 1, 1), dt)
    sc = dt.type(scale)

    def attention_kernel(q, k, v, bias=None, scale=1.0, keep=None):
        s = matmul(q, np.swapaxes(k, -1, -2))  # eager's products (its BLAS calls)
        b4 = none if bias is None else np.broadcast_to(bias, (B, H, T, S))
        shift(s, b4, sc, bias is not None)
        np.exp(s, out=s)  # numpy's own exp (SIMD), as eager's softmax
        norm(s.reshape(B * H * T, S))
        return matmul(s, v)

    return attention_kernel


@op_kernels.register("embedding_backward")
def embedding_backward_factory(node):
    """The embedding's weight gradient (no scale_grad_by_freq) as one numba loop over the
    rows in order instead of ``np.add.at``: the same additions in the same order, bitwise
    eager's. Indices outside [-W, W) go to the op's forward (eager's IndexError)."""
    if len(node.inputs) < 2 or node.params.get("scale") is not None:
        return None
    g, idx = node.inputs[:2]
    if not isinstance(g, Value) or not g.shape or _floats(g) is None:
        return None
    if not isinstance(idx, (Value, np.ndarray)) or np.dtype(idx.dtype).kind not in "iu":
        return None
    W = node.params.get("num_weights")
    pad = node.params.get("padding_idx")
    if not isinstance(W, int) or (pad is not None and not isinstance(pad, int)):
        return None
    dt = _floats(g)
    D = g.shape[-1]
    from tapegrad.compiler.kernels_residual import _kernels as residual_kernels
    from tapegrad.ops import nn as nn_ops

    scatter = residual_kernels()["scatter_rows"]  # (it checks the indices' range first)
    forward = nn_ops.embedding_backward.forward

    def embedding_backward_kernel(g, idx, num_weights, padding_idx=None, scale=None):
        out = np.zeros((W, D), dt)
        if not scatter(np.ascontiguousarray(g).reshape(-1, D),
                       idx.reshape(-1).astype(np.int64, copy=False), out):
            return forward(g, idx, num_weights, padding_idx=padding_idx, scale=scale)
        if padding_idx is not None:
            out[padding_idx] = 0
        return out

    return embedding_backward_kernel


# --- LayerNorm's traced gradient rule as one node ------------------------------------------
def _lit(a, value):
    return not isinstance(a, Value) and type(a) in (int, float) and a == value


def _layer_norm_rule(with_bias):
    """LayerNorm's gradient rule (``ops.nn._norm_rule``) over the last axis with a weight, as
    the pattern function of ``fuse_layer_norm_backward``: the rule eager runs, so the pattern
    cannot drift from it."""
    from tapegrad.ops.nn import _norm_rule

    def rule(g, x, w):
        gx, gw, gb = _norm_rule(g, None, x, w, w if with_bias else None,
                                axes=(x.ndim - 1,), eps=_EXAMPLE_EPS,
                                param_shape=(x.shape[-1],))
        return (gx, gw, gb) if with_bias else (gx, gw)

    return rule


_EXAMPLE_EPS = 1.2345e-05  # distinctive example literals: each matches any literal
_EXAMPLE_ROW = 7           # (the same one wherever it occurs): the eps and the row length


def _examples_rows(n_inputs, symbols):
    """Example arrays for a pattern over rows: leading dims of 3, rows of ``_EXAMPLE_ROW``
    (the weight: one row)."""
    def examples(rank):
        import tapegrad

        shape = (3,) * (rank - 1) + (_EXAMPLE_ROW,)
        args = [tapegrad.ones(shape, dtype=tapegrad.float64) for _ in range(2)]
        args += [tapegrad.ones((_EXAMPLE_ROW,), dtype=tapegrad.float64)] * (n_inputs - 2)
        return [(args, symbols)]

    return examples


def _layer_norm_guard(bound):
    g, x, w = bound["inputs"]
    n = bound.get("n")
    return (x.shape and g.shape == x.shape and x.shape[-1] == n and tuple(w.shape) == (n,)
            and isinstance(bound.get("eps"), float))


def _layer_norm_pattern(with_bias):
    return patterns.Pattern(
        "layer_norm_backward", _layer_norm_rule(with_bias),
        _examples_rows(3, {"n": _EXAMPLE_ROW, "eps": _EXAMPLE_EPS}),
        params=lambda b: {"axes": (len(b["inputs"][1].shape) - 1,), "eps": b["eps"]},
        guard=_layer_norm_guard)


_LAYER_NORM_BACKWARD = (_layer_norm_pattern(True), _layer_norm_pattern(False))


def fuse_layer_norm_backward(graph):
    """A graph pass: each traced LayerNorm gradient rule (``ops.nn._norm_rule`` over the
    last axis with a weight: ~23 nodes of row sums, divisions and products), matched as a
    pattern traced from that rule, whose intermediates nothing else reads becomes one
    ``layer_norm_backward`` node ``(g, x, w) -> (gx, gw[, gb])``, served by a numba kernel
    that makes one pass per row (bitwise the nodes' results; the numpy backend runs the
    nodes themselves)."""
    for pattern in _LAYER_NORM_BACKWARD:  # with the bias's gradient first
        graph = pattern.rewrite(graph)
    return graph


@op_kernels.register("layer_norm_backward")
def layer_norm_backward_factory(node):
    """The fused LayerNorm gradient (``fuse_layer_norm_backward``) over float32/float64."""
    if len(node.inputs) != 3 or not all(isinstance(a, Value) for a in node.inputs):
        return None
    g, x, w = node.inputs
    dt = _floats(g, x, w)
    if dt is None or not x.shape or g.shape != x.shape or tuple(w.shape) != (x.shape[-1],) \
            or any(d == 0 for d in x.shape) or not isinstance(node.params.get("eps"), float):
        return None
    if x.shape[-1] == 1:  # numpy's sum_to then reduces a contiguous run: pairwise, not rows
        return None
    with_gb = len(node.outputs) == 3
    fn = _kernels()["layer_norm_backward_rows"]
    shape = tuple(x.shape)
    C = shape[-1]
    R = int(np.prod(shape[:-1], dtype=np.int64))

    def layer_norm_backward_kernel(g, x, w, axes, eps):
        gx = np.empty(shape, dt)
        gw = np.empty(C, dt)
        gb = np.empty(C, dt)
        fn(g.reshape(R, C), x.reshape(R, C), w, dt.type(eps), with_gb, gx.reshape(R, C), gw,
           gb, np.empty(C, dt), np.empty(C, dt), np.empty(C, dt))
        return (gx, gw, gb) if with_gb else (gx, gw)

    return layer_norm_backward_kernel


# --- softmax's gradient rule (also inside attention's) as one node ------------------------
def _softmax_examples(rank):
    """softmax's rule over the last axis, the axis named by number and as -1."""
    import tapegrad

    shape = (3,) * (rank - 1) + (_EXAMPLE_ROW,)
    args = [tapegrad.ones(shape, dtype=tapegrad.float64) for _ in range(2)]
    return [([*args, d], {}) for d in (rank - 1, -1)]


def _softmax_rule(g, p, dim):
    from tapegrad.ops.nn import softmax

    return softmax.rule(g, p, None, dim)


def _softmax_guard(bound):
    gp, p = bound["inputs"]
    return gp is not p and gp.shape == p.shape and gp.dtype == p.dtype and bool(p.shape) \
        and np.dtype(p.dtype) in _FLOATS


_SOFTMAX_BACKWARD = patterns.Pattern("softmax_backward", _softmax_rule, _softmax_examples,
                                     guard=_softmax_guard)


def fuse_softmax_backward(graph):
    """A graph pass: softmax's traced gradient ``p * (g - sum(g * p, last, keepdim))`` (its
    own rule, and attention's for the scores), matched as a pattern traced from softmax's
    rule, whose products and sums nothing else reads becomes one ``softmax_backward`` node
    ``(g, p) -> grad``, served by a numba kernel (one pass per row, bitwise the nodes'
    results; the numpy backend runs the nodes)."""
    return _SOFTMAX_BACKWARD.rewrite(graph)


@op_kernels.register("softmax_backward")
def softmax_backward_factory(node):
    """The fused softmax gradient (``fuse_softmax_backward``) over float32/float64
    (kernels_attention's kernel: its row sums as vector lanes)."""
    from tapegrad.compiler import kernels_attention

    return kernels_attention.softmax_backward(node)


# --- attention's probabilities: computed once, for the forward and the backward ----------
def _attention_probs_impl(f, chain, p_val):
    """The forward's output and its probabilities: the backward's own nodes for p (q k^T,
    * scale, + bias, softmax: the forward's operations on the same arrays, so the same bits),
    then ``p @ v`` as the forward does."""
    from tapegrad.backend.blas import matmul
    from tapegrad.compiler.ir import call_node

    q, k, v = f.inputs[:3]
    bias = f.inputs[3] if len(f.inputs) > 3 else None

    def scaled_dot_product_attention_probs(qa, ka, va, *rest, scale=1.0, keep=None):
        env = {id(q): qa, id(k): ka, id(v): va}
        if bias is not None:
            env[id(bias)] = rest[0]
        for m in chain:
            args = [env[id(a)] if isinstance(a, Value) else a for a in m.inputs]
            for val, o in zip(m.outputs, call_node(m, args)):
                env[id(val)] = o
        pa = env[id(p_val)]
        return matmul(pa, va), pa

    return scaled_dot_product_attention_probs


def share_attention_probabilities(graph):
    """A graph pass: attention's traced rule recomputes the forward's probabilities
    (``softmax(q @ k.mT * scale + bias)``); where those nodes read the forward node's own q,
    k and bias and nothing else reads their intermediates, the forward node becomes
    ``scaled_dot_product_attention_probs`` returning (out, p) and the backward reads that p:
    one product, one scale/mask pass and one softmax less per attention, the same bits (the
    forward computes p by the same operations)."""
    from tapegrad.compiler.ir import Node

    uses = readers(graph)
    producer = {id(v): n for n in graph.nodes for v in n.outputs}
    replace, drop = {}, set()
    for f in graph.nodes:
        if f.name != "scaled_dot_product_attention" or f.op is None or \
                f.params.get("keep") is not None or len(f.inputs) not in (3, 4) or \
                not all(isinstance(a, Value) for a in f.inputs):
            continue
        q, k = f.inputs[:2]
        bias = f.inputs[3] if len(f.inputs) == 4 else None
        scale = f.params.get("scale", 1.0)
        if len(q.shape) < 2 or not isinstance(scale, (int, float)):
            continue
        nd = len(q.shape)
        swap = tuple(range(nd - 2)) + (nd - 1, nd - 2)
        found = None
        for mm in uses.get(id(q), ()):
            if mm.name != "matmul" or mm.inputs[0] is not q:
                continue
            kt = producer.get(id(mm.inputs[1]))
            if kt is None or kt.name != "permute" or kt.inputs[0] is not k or \
                    tuple(kt.params.get("dims", ())) != swap:
                continue
            u = uses.get(id(mm.outputs[0]), [])
            if len(u) != 1 or u[0].name != "mul" or u[0].inputs[0] is not mm.outputs[0] \
                    or not _lit(u[0].inputs[1], scale):
                continue
            sc = u[0]
            chain = [kt, mm, sc]
            last = sc
            if bias is not None:
                u = uses.get(id(sc.outputs[0]), [])
                if len(u) != 1 or u[0].name != "add" or u[0].inputs[1] is not bias:
                    continue
                last = u[0]
                chain.append(last)
            u = uses.get(id(last.outputs[0]), [])
            if len(u) != 1 or u[0].name != "softmax" or u[0].params.get("dim") not in (
                    nd - 1, -1):
                continue
            chain.append(u[0])
            # the permute of k may have other readers: keep it, it is a view
            if all(all(r in chain for r in uses.get(id(m.outputs[0]), ()))
                   for m in chain[1:-1]):
                found = chain
                break
        if found is None or any(id(m) in drop or id(m) in replace for m in found + [f]):
            continue
        p_val = found[-1].outputs[0]
        out = f.outputs[0]
        replace[id(f)] = Node(None, "scaled_dot_product_attention_probs", list(f.inputs),
                              dict(f.params), [out, p_val],
                              impl=_attention_probs_impl(f, found, p_val),
                              meta={"forward": f, "nodes": found})
        drop.update(id(m) for m in found[1:])  # the permute stays (other readers, a view)
    return passes.replace_nodes(graph, replace, drop)


@op_kernels.register("scaled_dot_product_attention_probs")
def attention_probs_factory(node):
    """The attention forward that also returns its probabilities (numba passes around
    eager's BLAS products, as ``scaled_dot_product_attention_kernel``; kernels_attention's
    first)."""
    from tapegrad.compiler import kernels_attention

    fast = kernels_attention.attention_forward(node, probs=True)
    if fast is not None:
        return fast
    from tapegrad.compiler.ir import Node as IRNode

    plain = IRNode(None, "scaled_dot_product_attention", list(node.inputs), dict(node.params),
                   [Value("o", node.outputs[0].shape, node.outputs[0].dtype)])
    if attention_factory(plain) is None:
        return None
    from tapegrad.backend.blas import matmul

    q, k, v = node.inputs[:3]
    B, H, T, D = q.shape
    S = k.shape[2]
    dt = np.dtype(q.dtype)
    shift, norm = _kernels()["attention_shift"], _kernels()["softmax_norm"]
    none = np.zeros((1, 1, 1, 1), dt)
    sc = dt.type(node.params.get("scale", 1.0))

    def attention_probs_kernel(q, k, v, bias=None, scale=1.0, keep=None):
        s = matmul(q, np.swapaxes(k, -1, -2))
        b4 = none if bias is None else np.broadcast_to(bias, (B, H, T, S))
        shift(s, b4, sc, bias is not None)
        np.exp(s, out=s)
        norm(s.reshape(B * H * T, S))
        return matmul(s, v), s

    return attention_probs_kernel


# --- a split's gradient: slices put into zeros and added, as one concatenation ------------
def _slice_of(index, shape):
    """``(axis, start, stop)`` when ``index`` is full slices, one slice(start, stop) and then
    only full slices or an Ellipsis, else None."""
    if type(index) is not tuple:
        return None
    full = slice(None, None, None)
    axis = None
    for d, ix in enumerate(index):
        if ix is Ellipsis:
            if any(x is not Ellipsis and x != full for x in index[d + 1:]):
                return None
            break
        if type(ix) is not slice:
            return None
        if ix == full:
            continue
        if axis is not None or ix.step not in (None, 1) or d >= len(shape):
            return None
        start, stop, _ = ix.indices(shape[d])
        if not (ix.start is None or isinstance(ix.start, int)) or stop <= start:
            return None
        axis = (d, start, stop)
    return axis


def _split_source(g, producer, uses):
    """``g = reshape(permute(x))`` or ``reshape(permute(mul(x, c)))`` (a Python number c),
    each intermediate read by the next node only and ``g`` by its ``index_backward`` only
    (a head's q/k/v gradient put back into (B, T, H D)): ``(nodes, x, c or None, dims)``,
    else None."""
    r = producer.get(id(g))
    if r is None or r.name != "reshape" or r.op is None or len(uses.get(id(g), ())) != 1:
        return None
    pm = producer.get(id(r.inputs[0]))
    if pm is None or pm.name != "permute" or pm.op is None or \
            len(uses.get(id(pm.outputs[0]), ())) != 1:
        return None
    x = pm.inputs[0]
    dims = tuple(pm.params.get("dims", ()))
    if not isinstance(x, Value) or x.dtype != g.dtype or not 1 <= len(x.shape) <= 4 or \
            sorted(dims) != list(range(len(x.shape))):
        return None
    nodes, scale = [pm, r], None
    mm = producer.get(id(x))
    if mm is not None and mm.name == "mul" and mm.op is not None and len(mm.inputs) == 2 \
            and isinstance(mm.inputs[0], Value) and type(mm.inputs[1]) in (int, float) \
            and len(uses.get(id(x), ())) == 1 and mm.inputs[0].dtype == x.dtype \
            and tuple(mm.inputs[0].shape) == tuple(x.shape):
        nodes.insert(0, mm)
        x, scale = mm.inputs[0], mm.inputs[1]
    return nodes, x, scale, dims


def _concat_impl(axis, order, chains):
    """The node's numpy body: each absorbed chain's own nodes (eager's operations), then
    the concatenation and + 0.0."""
    from tapegrad.compiler.ir import call_node

    def concatenate_gradients(*xs):
        gs = []
        for x, ch in zip(xs, chains):
            for m in ch[0] if ch is not None else ():
                x = call_node(m, [x if isinstance(a, Value) else a for a in m.inputs])[0]
            gs.append(x)
        out = np.concatenate([gs[i] for i in order], axis=axis)
        np.add(out, out.dtype.type(0), out=out)  # (v + 0) + 0: -0.0 becomes +0.0, as eager
        return out

    return concatenate_gradients


def merge_split_gradients(graph):
    """A graph pass: ``add(add(a, b), c)`` of three ``index_backward`` results (``x[..., s]``'s
    gradient put into zeros, accumulate=False) whose slices along one axis cover it exactly
    (a q/k/v split's gradient) becomes one ``concatenate_gradients`` node: the slices
    concatenated, plus 0.0 (eager's (v + 0) + 0 turns -0.0 into +0.0; nothing else changes):
    the same bits without three zero-filled arrays and two full-size adds. A gradient made
    by ``reshape(permute(x))`` or ``reshape(permute(mul(x, c)))`` read by nothing else (the
    heads' q/k/v gradients, q and k scaled) is read as x, its nodes absorbed: numba's kernel
    (``concatenate_gradients_factory``) writes ``x * c + 0.0`` through the permutation
    straight into the output's slice, without the reshape's copy and the product's array."""
    from tapegrad.compiler.ir import Node

    uses = readers(graph)
    producer = {id(v): n for n in graph.nodes for v in n.outputs}
    pos = {id(n): i for i, n in enumerate(graph.nodes)}
    replace, drop = {}, set()
    for a2 in graph.nodes:
        if a2.name != "add" or len(a2.inputs) != 2 or not all(
                isinstance(x, Value) for x in a2.inputs):
            continue
        a1 = producer.get(id(a2.inputs[0]))
        if a1 is None or a1.name != "add" or len(a1.inputs) != 2 or \
                len(uses.get(id(a1.outputs[0]), ())) != 1:
            continue
        ibs = [producer.get(id(x)) for x in list(a1.inputs) + [a2.inputs[1]]]
        if any(n is None or n.name != "index_backward" or n.op is None
               or n.params.get("accumulate") or len(uses.get(id(n.outputs[0]), ())) != 1
               for n in ibs) or len({id(n) for n in ibs}) != 3:
            continue
        shape = tuple(ibs[0].params.get("shape", ()))
        out = a2.outputs[0]
        if tuple(out.shape) != shape or np.dtype(out.dtype) not in _FLOATS:
            continue
        cuts = [_slice_of(n.params.get("index"), shape) for n in ibs]
        if any(c is None for c in cuts) or len({c[0] for c in cuts}) != 1:
            continue
        axis = cuts[0][0]
        order = sorted(range(3), key=lambda i: cuts[i][1])
        spans = [cuts[i][1:] for i in order]
        if spans[0][0] != 0 or spans[-1][1] != shape[axis] or any(
                spans[i][1] != spans[i + 1][0] for i in range(2)):
            continue
        gs = [n.inputs[0] for n in ibs]
        if not all(isinstance(g, Value) and g.dtype == out.dtype and tuple(g.shape) ==
                   shape[:axis] + (c[2] - c[1],) + shape[axis + 1:] for g, c in zip(gs, cuts)):
            continue
        # each gradient made by reshape(permute(mul(x, c)))? the node reads x instead
        chains = [_split_source(g, producer, uses) for g in gs]
        group = [m for ch in chains if ch is not None for m in ch[0]] + ibs + [a1, a2]
        if any(id(m) in drop or id(m) in replace for m in group):
            continue
        first = min(pos[id(m)] for m in group)
        made = {id(v) for m in group for v in m.outputs} - {id(out)}
        inside = {id(m) for m in group}
        if any(isinstance(x, Value) and id(x) in made for n in graph.nodes[first:pos[id(a2)]]
               if id(n) not in inside for x in n.inputs):
            continue
        srcs = [g if ch is None else ch[1] for g, ch in zip(gs, chains)]
        replace[id(a2)] = Node(None, "concatenate_gradients", srcs, {}, [out],
                               impl=_concat_impl(axis, order, chains),
                               meta={"nodes": group, "axis": axis, "cuts": cuts,
                                     "chains": [None if ch is None else ch[2:]
                                                for ch in chains]})
        drop.update(id(m) for m in group[:-1])
    return passes.replace_nodes(graph, replace, drop)


@op_kernels.register("concatenate_gradients")
def concatenate_gradients_factory(node):
    """The merged split gradient (``merge_split_gradients``) over float32/float64 as one
    numba pass per slice: each source read through its permutation (a view), times its
    scale, plus 0.0, written into the output's slice seen in the source's shape (a view,
    checked here once on an empty output); bitwise the node's numpy body. None (the body
    runs) where a slice's view would need a copy or a source has more than 4 dims."""
    meta = node.meta or {}
    chains, cuts = meta.get("chains"), meta.get("cuts")
    out = node.outputs[0]
    if chains is None or cuts is None or len(node.inputs) != len(chains) or not all(
            isinstance(a, Value) for a in node.inputs):
        return None
    dt = _floats(out, *node.inputs)
    shape = tuple(out.shape)
    if dt is None or any(d == 0 for d in shape):
        return None
    probe = np.empty(shape, dt)
    plan = []
    for x, ch, (axis, start, stop) in zip(node.inputs, chains, cuts):
        scale, dims = ch if ch is not None else (None, None)
        xs = tuple(x.shape)
        seen = xs if dims is None else tuple(xs[d] for d in dims)
        if len(seen) > 4:
            return None
        sl = (slice(None),) * axis + (slice(start, stop),)
        if probe[sl].size != int(np.prod(seen, dtype=np.int64)):
            return None
        view = probe[sl].reshape(seen)
        if view.base is not probe and view is not probe:
            return None  # the slice seen in the source's shape would be a copy
        lead = (1,) * (4 - len(seen))
        plan.append((sl, dims, lead + seen, dt.type(0 if scale is None else scale),
                     scale is not None))
    copy = _kernels()["scaled_copy"]

    def concatenate_gradients_kernel(*xs):
        res = np.empty(shape, dt)
        for x, (sl, dims, seen4, sc, has) in zip(xs, plan):
            src = x if dims is None else x.transpose(dims)
            copy(src.reshape(seen4), res[sl].reshape(seen4), sc, has)
        return res

    return concatenate_gradients_kernel


# the optimizer step's and clip_grad_norm_'s kernels live in kernels_optim.py (their names
# stay importable from here)
from tapegrad.compiler.kernels_optim import adam_factory, clip_grad_norm_factory  # noqa: E402,F401
