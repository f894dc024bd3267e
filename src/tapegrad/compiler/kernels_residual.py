"""LayerNorm over a residual stream (any pre- or post-norm block): graph passes and kernels.

* ``fuse_residual_layer_norm`` (a pass): ``s = add(a, b)`` read by ``layer_norm(s, w, b)``
  (every block's residual sum before its next LayerNorm; ``b`` may be a ``broadcast_to`` over
  leading axes, the position embedding) becomes one ``residual_layer_norm`` node returning
  ``(s, layer_norm(s))``: the kernel writes each row of the sum and normalises it while it is
  in cache. An operand made by ``embedding(table, idx)`` and read only by the add (the token
  rows) is gathered from the table by the kernel (``gather=True``).
* ``fuse_residual_backward`` (a pass): a ``layer_norm_backward`` node (kernels_norm_softmax's fused
  rule) whose ``gx`` is only read by ``add(r, gx)`` (the residual gradient) becomes one
  ``residual_layer_norm_backward`` node writing ``r + gx`` row by row; the column sums of its
  main output (a linear's bias gradient ``sum(reshape(., (-1, C)), dims=(0,))``, found by
  ``passes.column_sums``) and a ``sum_to`` over its leading axes (the position embedding's
  gradient) come out of the same pass as extra outputs, and an ``embedding_backward`` of the
  result or of that leading sum (the token and position tables' gradients) is scattered by
  the node's wrapper (rows in order into zeros, as ``np.add.at``). The column sums are added a
  tile of rows at a time, each sum in a register across the tile's rows (the same additions
  in the same order, without a store-to-load chain per row).
* The row kernels sum a row as numpy's pairwise sum does for 8 <= C <= 128 (one block of
  eight accumulators, combined ``((0+1)+(2+3))+((4+5)+(6+7))``, the rest added in order)
  with the eight accumulators held in 256-bit vectors (``kernels.LANES``' ``sum_block8``: the
  same lane-wise IEEE additions; numba's scalar code keeps them in eight registers one
  ``vaddss`` at a time), and they work on tiles of 8 rows phase by phase (all the tile's
  means, then its variances, ...), so the out-of-order core overlaps the rows' dependency
  chains (reduction, division, square root) instead of waiting on each row's. Other widths
  use kernels.PAIRWISE's ``pairwise_sum``. Scratch is kept by each kernel (used only inside
  the numba call, which holds the GIL); outputs are last call's arrays when nothing holds
  them (``codegen.recycle``).

Every result is bitwise eager's (the same IEEE operations in the same order as
``ops.nn._norm_forward`` / ``_norm_rule``, numpy's add and its axis-0 reductions), float32
and float64; the nodes' ``impl`` runs the replaced nodes themselves (the numpy backend and
the passes' value check). tests/compiler/test_compiler_residual.py checks each.
"""
import numpy as np

from tapegrad.compiler import ir, kernels, op_kernels, passes
from tapegrad.compiler.codegen import recycle
from tapegrad.compiler.ir import Node, Value, call_node

_FLOATS = kernels.FLOATS
TILE = 8  # rows per tile: enough independent chains for the core, a few KB of scratch

SOURCE = '''import numpy as np
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic
from llvmlite import ir


''' + kernels.LANES + kernels.PAIRWISE + '''

@njit(error_model="numpy", cache=True, inline="always")
def rowsum_short(a, n):
    """numpy's pairwise sum of a[:n] for 8 <= n <= 128 (one block)."""
    e = n - n % 8
    s = sum_block8(a, 0, e)
    for k in range(e, n):
        s += a[k]
    return s


@njit(error_model="numpy", cache=True, inline="always")
def colsums(acc, a, b, t0, T, prod):
    """acc += a[t0 + l] (prod: a[t0 + l] * b[l]) for l = 0..T-1 in order, acc zeroed before
    the first tile (numpy's add.reduce over axis 0: rows in order into its identity 0.0, so a
    column of -0.0 sums to 0.0). Full tiles of 8: one pass over the columns adding the 8
    rows in order."""
    C = acc.shape[0]
    if T == 8:
        r0 = a[t0]
        r1 = a[t0 + 1]
        r2 = a[t0 + 2]
        r3 = a[t0 + 3]
        r4 = a[t0 + 4]
        r5 = a[t0 + 5]
        r6 = a[t0 + 6]
        r7 = a[t0 + 7]
        if prod:
            s0, s1, s2, s3, s4, s5, s6, s7 = b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]
            for j in range(C):
                v = acc[j] + r0[j] * s0[j]
                v = v + r1[j] * s1[j]
                v = v + r2[j] * s2[j]
                v = v + r3[j] * s3[j]
                v = v + r4[j] * s4[j]
                v = v + r5[j] * s5[j]
                v = v + r6[j] * s6[j]
                acc[j] = v + r7[j] * s7[j]
        else:
            for j in range(C):
                v = acc[j] + r0[j]
                v = v + r1[j]
                v = v + r2[j]
                v = v + r3[j]
                v = v + r4[j]
                v = v + r5[j]
                v = v + r6[j]
                acc[j] = v + r7[j]
        return
    for l in range(T):
        r = a[t0 + l]
        if prod:
            q = b[l]
            for j in range(C):
                acc[j] += r[j] * q[j]
        else:
            for j in range(C):
                acc[j] += r[j]


@njit(error_model="numpy", cache=True)
def scatter_rows(g, idx, out):
    """out[idx[i]] += g[i] for i in order (np.add.at's order) into a zeroed table; False
    (and nothing written) if an index lies outside [-W, W)."""
    W = out.shape[0]
    for i in range(idx.shape[0]):
        if idx[i] < -W or idx[i] >= W:
            return False
    for i in range(g.shape[0]):
        r = idx[i]
        if r < 0:
            r += W
        o = out[r]
        gi = g[i]
        for j in range(g.shape[1]):
            o[j] += gi[j]
    return True


@njit(error_model="numpy", cache=True, inline="always")
def rowsum_long(a, n):
    """numpy's pairwise sum of a[:n], any n."""
    return pairwise_sum(a, 0, n)
'''

# the row kernels, written once with ROWSUM and compiled twice (a branch between the two sums
# inside one kernel measured 20-40% slower: the general sum's code stays in the loops)
ROWS = '''

@njit(error_model="numpy", cache=True)
def residual_ln_rows(a, aidx, b2, has_res, x, w, bias, eps, has_w, has_b, out, st):
    """x[i] = a[i] + b2[i % len(b2)] when has_res (else x is the input), then
    out[i] = (x[i] - mean) / sqrt(var + eps) * w + bias, as ops.nn._norm_forward, op for
    op; tiles of len(st[0]) rows, phase by phase (st: (2, tile) scratch). out's rows hold
    the squares meanwhile. A non-empty aidx: a is a table and row i's first operand is
    a[aidx[i]] (the embedding's w[idx], negative indices wrapping as numpy's); False, with
    nothing written, where an index lies outside [-len(a), len(a))."""
    R, C = x.shape
    T = st.shape[1]
    mean = st[0]
    rstd = st[1]
    Rb = b2.shape[0]
    n = x.dtype.type(C)
    one = x.dtype.type(1)
    gather = aidx.shape[0] > 0
    Wa = a.shape[0]
    if gather:
        for i in range(R):
            if aidx[i] < -Wa or aidx[i] >= Wa:
                return False
    rb = 0  # i % Rb, counted (a division per row costs)
    for t0 in range(0, R, T):
        t1 = min(R, t0 + T)
        if has_res:
            for i in range(t0, t1):
                if gather:
                    r = aidx[i]
                    if r < 0:
                        r += Wa
                    ai = a[r]
                else:
                    ai = a[i]
                bi = b2[rb]
                rb += 1
                if rb == Rb:
                    rb = 0
                xi = x[i]
                for j in range(C):
                    xi[j] = ai[j] + bi[j]
        for i in range(t0, t1):
            mean[i - t0] = ROWSUM(x[i], C) / n
        for i in range(t0, t1):
            xi = x[i]
            sq = out[i]
            m = mean[i - t0]
            for j in range(C):
                d = xi[j] - m
                sq[j] = d * d
            rstd[i - t0] = one / np.sqrt(ROWSUM(sq, C) / n + eps)
        for i in range(t0, t1):
            xi = x[i]
            o = out[i]
            m = mean[i - t0]
            r = rstd[i - t0]
            if has_w and has_b:
                for j in range(C):
                    o[j] = (xi[j] - m) * r * w[j] + bias[j]
            elif has_w:
                for j in range(C):
                    o[j] = (xi[j] - m) * r * w[j]
            elif has_b:
                for j in range(C):
                    o[j] = (xi[j] - m) * r + bias[j]
            else:
                for j in range(C):
                    o[j] = (xi[j] - m) * r
    return True


@njit(error_model="numpy", cache=True)
def ln_backward_rows(g, x, w, eps, res, mode, out, acc, n_cs, pos, n_pos, sc, st):
    """LayerNorm's gradient over the last axis (ops.nn._norm_rule, op for op) on tiles of
    len(st[0]) rows, phase by phase; out[i] = gx[i] (mode 0), res[i] + gx[i] (1) or
    gx[i] + res[i] (2). acc[0], acc[1]: gw and gb, column sums of g * xhat and g;
    acc[2:2 + n_cs]: column sums of out; pos (n_pos > 0): out summed over its leading axes,
    rows i % n_pos (numpy's axis-0 add.reduce: rows in order into 0.0; acc and pos are
    zeroed here first).
    sc: (3, tile, C) scratch, st: (4, tile)."""
    R, C = x.shape
    T = st.shape[1]
    n = x.dtype.type(C)
    one = x.dtype.type(1)
    m1 = st[0]
    m3 = st[1]
    m4 = st[2]
    rs = st[3]
    gxh = sc[0]
    xh = sc[1]
    tmp = sc[2]
    gw = acc[0]
    gb = acc[1]
    nextrow = 0
    zero = x.dtype.type(0)
    for k in range(2 + n_cs):
        for j in range(C):
            acc[k, j] = zero
    for k in range(n_pos):
        for j in range(C):
            pos[k, j] = zero
    for t0 in range(0, R, T):
        t1 = min(R, t0 + T)
        for i in range(t0, t1):
            l = i - t0
            gi = g[i]
            p = gxh[l]
            for j in range(C):
                p[j] = gi[j] * w[j]
            m3[l] = ROWSUM(p, C) / n
            m1[l] = ROWSUM(x[i], C) / n
        for i in range(t0, t1):
            l = i - t0
            xi = x[i]
            q = tmp[l]
            m = m1[l]
            for j in range(C):
                d = xi[j] - m
                q[j] = d * d
            rs[l] = one / np.sqrt(ROWSUM(q, C) / n + eps)
        for i in range(t0, t1):
            l = i - t0
            xi = x[i]
            h = xh[l]
            p = gxh[l]
            q = tmp[l]
            m = m1[l]
            r = rs[l]
            for j in range(C):
                v = (xi[j] - m) * r
                h[j] = v
                q[j] = p[j] * v
            m4[l] = ROWSUM(q, C) / n
        for i in range(t0, t1):
            l = i - t0
            o = out[i]
            h = xh[l]
            p = gxh[l]
            a3 = m3[l]
            a4 = m4[l]
            r = rs[l]
            if mode == 0:
                for j in range(C):
                    o[j] = r * ((p[j] - a3) - h[j] * a4)
            elif mode == 1:
                ri = res[i]
                for j in range(C):
                    o[j] = ri[j] + r * ((p[j] - a3) - h[j] * a4)
            else:
                ri = res[i]
                for j in range(C):
                    o[j] = r * ((p[j] - a3) - h[j] * a4) + ri[j]
            if n_pos:  # each row adds into its own row of pos: no chain from row to row
                pr = pos[nextrow]
                for j in range(C):
                    pr[j] += o[j]
                nextrow += 1  # i % n_pos, counted (a division per row costs)
                if nextrow == n_pos:
                    nextrow = 0
        # the column sums over the tile's rows, in order, each sum held in a register
        # across them (one load and store a tile, not a store-to-load chain per row)
        colsums(gb, g, g, t0, t1 - t0, False)
        colsums(gw, g, xh, t0, t1 - t0, True)
        for k in range(n_cs):
            colsums(acc[2 + k], out, out, t0, t1 - t0, False)
'''
SOURCE += ROWS.replace("ROWSUM", "rowsum_short").replace("_rows(", "_rows_short(")
SOURCE += ROWS.replace("ROWSUM", "rowsum_long").replace("_rows(", "_rows_long(")

_K = {}


def _kernels():
    """The numba functions, compiled (or loaded from numba's cache) on first use."""
    if not _K:
        import sys

        mod = sys.modules[kernels.load("rowsum_short", SOURCE).py_func.__module__]
        for name in ("residual_ln_rows", "ln_backward_rows"):
            for kind in ("short", "long"):
                _K[name, kind] = getattr(mod, f"{name}_{kind}")
        _K["scatter_rows"] = mod.scatter_rows
    return _K


def _rows_kernel(name, C):
    """The row kernel for rows of C: one pairwise block (8 <= C <= 128) or the general sum."""
    return _kernels()[name, "short" if 8 <= C <= 128 else "long"]


_floats = kernels.float_dtype  # (the one float dtype of Values, or None)


def _layer_norm_ok(f, x):
    """``layer_norm`` node ``f`` on ``x`` normalises x's last axis, with a weight and bias
    of that length (Values) or None, all one float dtype: what the row kernel serves."""
    if not x.shape or any(d == 0 for d in x.shape):
        return False
    p = f.params
    C = x.shape[-1]
    if tuple(p.get("axes") or ()) != (len(x.shape) - 1,) or tuple(
            p.get("param_shape") or ()) != (C,) or not isinstance(p.get("eps"), (int, float)):
        return False
    extra = list(f.inputs[1:])
    if any(not isinstance(a, Value) or tuple(a.shape) != (C,) for a in extra if a is not None):
        return False
    return _floats(x, *[a for a in extra if a is not None]) is not None


def _is_op(n, name):
    return n is not None and n.name == name and n.op is not None


# --- forward: the residual sum and the LayerNorm reading it ---------------------------------
def _leading_broadcast(v, shape, producer):
    """``v`` made by ``broadcast_to(s, shape)`` that only repeats ``s`` over leading axes
    (s.shape == shape[k:]): ``(s, broadcast node)``, else None."""
    n = producer.get(id(v))
    if not _is_op(n, "broadcast_to") or not isinstance(n.inputs[0], Value):
        return None
    s = n.inputs[0]
    k = len(shape) - len(s.shape)
    if k < 1 or tuple(s.shape) != tuple(shape[k:]) or s.dtype != v.dtype or not s.shape:
        return None
    return s, n


def _residual_ln_impl(add, bc, f, emb):
    def residual_layer_norm(*arrays, **params):
        if emb is not None:  # (table, indices): the embedding's rows are the first operand
            (a,) = call_node(emb, list(arrays[:2]))
            arrays = arrays[1:]
        else:
            a = arrays[0]
        b, wb = arrays[1], arrays[2:]
        if bc is not None:
            (b,) = call_node(bc, [b])
        (s,) = call_node(add, [b, a] if params["swap"] else [a, b])
        (y,) = call_node(f, [s] + list(wb))
        return s, y

    return residual_layer_norm


def fuse_residual_layer_norm(graph):
    """A graph pass: ``s = add(a, b)`` (one float dtype, same shape, or ``b`` a leading-axes
    ``broadcast_to``) read by ``layer_norm(s, ...)`` over its last axis becomes one
    ``residual_layer_norm(a, b, w, bias) -> (s, y)`` node at the add's place; a broadcast_to
    read only by the add goes too (the kernel repeats its rows)."""
    fwd = [n for n in graph.nodes if _is_op(n, "layer_norm")]
    if not fwd:
        return graph
    producer = {id(v): n for n in graph.nodes for v in n.outputs}
    pos = {id(n): i for i, n in enumerate(graph.nodes)}
    uses = ir.readers(graph)
    replace, drop = {}, set()
    for f in fwd:
        x = f.inputs[0] if f.inputs else None
        if not isinstance(x, Value) or not _layer_norm_ok(f, x):
            continue
        add = producer.get(id(x))
        if not _is_op(add, "add") or len(add.inputs) != 2 or add.params or \
                not all(isinstance(a, Value) for a in add.inputs) or id(add) in replace:
            continue
        a, b = add.inputs
        if a.dtype != x.dtype or b.dtype != x.dtype:
            continue
        swap, bc = False, None
        if tuple(a.shape) != tuple(x.shape):
            a, b, swap = b, a, True
            if tuple(a.shape) != tuple(x.shape):
                continue
        hit = _leading_broadcast(b, x.shape, producer)
        if hit is not None and not [m for m in uses.get(id(b), ()) if m is not add]:
            b, bc = hit  # (a view read elsewhere too stays; the kernel then reads it)
        elif tuple(b.shape) != tuple(x.shape):
            continue
        lo, hi = pos[id(add)], pos[id(f)]
        if any(n.effect for n in graph.nodes[lo:hi + 1]):
            continue
        wb = list(f.inputs[1:])
        if any(isinstance(v, Value) and id(v) in producer and pos[id(producer[id(v)])] > lo
               for v in wb):
            continue  # a weight made after the add: the node cannot move up to it
        params = dict(f.params)
        params["swap"] = swap
        ins = [a, b]
        emb = producer.get(id(a))  # the token embedding's rows, read only by the add
        if not swap and _is_op(emb, "embedding") and len(emb.inputs) == 2 and \
                all(isinstance(v, Value) for v in emb.inputs) and \
                emb.inputs[0].dtype == a.dtype and len(emb.inputs[0].shape) == 2 and \
                emb.inputs[0].shape[1] == a.shape[-1] and emb.inputs[1].dtype.kind in "iu" and \
                int(np.prod(emb.inputs[1].shape, dtype=np.int64)) == _rows(a.shape) and \
                uses.get(id(a), []) == [add] and b is not a and id(emb) not in drop:
            ins = list(emb.inputs) + [b]
            params["gather"] = True
            drop.add(id(emb))
        else:
            emb = None
        fused = Node(None, "residual_layer_norm", ins + wb, params,
                     [x, f.outputs[0]], impl=_residual_ln_impl(add, bc, f, emb),
                     meta={"add": add, "broadcast": bc, "layer_norm": f, "embedding": emb})
        replace[id(add)] = fused
        drop.add(id(f))
        if bc is not None:
            drop.add(id(bc))
    return passes.replace_nodes(graph, replace, drop)


def _rows(shape):
    return int(np.prod(shape[:-1], dtype=np.int64))


@op_kernels.register("residual_layer_norm")
def residual_layer_norm_factory(node):
    """The fused residual sum and LayerNorm (``fuse_residual_layer_norm``)."""
    gather = bool(node.params.get("gather"))
    if gather:  # (table, indices, b, ...): the first operand's rows gathered by the kernel
        a, idx, b = node.inputs[:3]
        wb = node.inputs[3:]
    else:
        a, b = node.inputs[:2]
        wb = node.inputs[2:]
    s, y = node.outputs
    dt = _floats(a, b, *wb)
    if dt is None or len(wb) > 2:
        return None
    shape = tuple(s.shape)
    C = shape[-1]
    R = _rows(shape)
    Rb = _rows(b.shape) if len(b.shape) > 1 else 1
    fn = _rows_kernel("residual_ln_rows", C)
    empty = np.empty(0, dt)
    swap = bool(node.params.get("swap"))
    if swap and tuple(b.shape) != shape:
        return None  # a broadcast first operand: numpy's add(bcast, a) has the same bits,
        # but keep the one layout the kernel is written for
    st = np.empty((2, min(TILE, R)), dt)  # scratch: used only inside the numba call
    box = [None]
    both = (2, R, C)
    no_idx = np.empty(0, np.int64)
    n_in = 3 if gather else 2
    impl = node.impl

    def residual_layer_norm_kernel(*arrays, axes, eps, param_shape, swap, gather=False):
        buf = recycle(box, both, dt)  # s and y: one array, last call's when nothing holds it
        wb = arrays[n_in:]
        w = wb[0] if wb else None
        bias = wb[1] if len(wb) > 1 else None
        if gather:
            first, idx, second = arrays[:3]
            idx = idx.reshape(-1)
        else:
            first, second = (arrays[1], arrays[0]) if swap else arrays[:2]
            idx = no_idx
        if not second.flags.c_contiguous or not (gather or first.flags.c_contiguous):
            # numpy's add may keep a strided layout, and LayerNorm then sums its rows in
            # another order: eager's ops
            return impl(*arrays, axes=axes, eps=eps, param_shape=param_shape, swap=swap,
                        gather=gather)
        if not gather:
            first = first.reshape(R, C)
        if not fn(first, idx, second.reshape(Rb, C), True, buf[0],
                  empty if w is None else w, empty if bias is None else bias, dt.type(eps),
                  w is not None, bias is not None, buf[1], st):
            return impl(*arrays, axes=axes, eps=eps, param_shape=param_shape, swap=swap,
                        gather=gather)  # an index out of range: eager's ops and IndexError
        return buf[0].reshape(shape), buf[1].reshape(shape)

    return residual_layer_norm_kernel


def layer_norm_call(shape, dt):
    """The row kernel for a plain ``layer_norm`` over the last axis of ``shape`` (no residual
    sum): ``call(x, w, b, eps) -> out`` (kernels_norm_softmax's layer_norm factory serves it)."""
    from tapegrad.ops.nn import _norm_forward

    C = shape[-1]
    fn = _rows_kernel("residual_ln_rows", C)
    R = _rows(shape)
    empty = np.empty(0, dt)
    e2 = np.empty((1, 0), dt)
    no_idx = np.empty(0, np.int64)
    st = np.empty((2, min(TILE, R)), dt)

    def call(x, w, b, eps):
        out = np.empty(shape, dt)
        if not x.flags.c_contiguous:  # numpy then sums the rows in another order
            return _norm_forward(x, w, b, axes=(len(shape) - 1,), eps=eps, param_shape=(C,))
        fn(e2, no_idx, e2, False, x.reshape(R, C), empty if w is None else w,
           empty if b is None else b, dt.type(eps), w is not None, b is not None,
           out.reshape(R, C), st)
        return out

    return call


# --- backward: LayerNorm's gradient, the residual gradient and their column sums ------------
def _sum_to_leading(n, value):
    """``sum_to(value, shape)`` that sums only leading axes (shape == value.shape[k:])."""
    if not _is_op(n, "sum_to") or not n.inputs or n.inputs[0] is not value:
        return False
    shape = tuple(n.params.get("shape") or ())
    k = len(value.shape) - len(shape)
    return k >= 1 and len(shape) >= 2 and shape == tuple(value.shape[k:]) and \
        n.outputs[0].dtype == value.dtype


def _ln_backward_residual_impl(ln, add, sums, tos, embs):
    def residual_layer_norm_backward(g, x, w, *rest, **params):
        outs = call_node(ln, [g, x, w])
        main = outs[0]
        res, idxs = rest[:len(rest) - len(embs)], rest[len(rest) - len(embs):]
        if add is not None:
            (main,) = call_node(add, [res[0], main] if params["residual"] == 1
                                else [main, res[0]])
        extra = [call_node(m, [main.reshape(m.inputs[0].shape)])[0] for m in sums]
        lead = [call_node(m, [main])[0] for m in tos]
        srcs = [main] + lead
        tables = [call_node(n, [srcs[k], i])[0] for (n, k), i in zip(embs, idxs)]
        return (main,) + tuple(outs[1:]) + tuple(extra) + tuple(lead) + tuple(tables)

    return residual_layer_norm_backward


def _embedding_grad(n, v):
    """``embedding_backward(v, idx, num_weights)`` (no scale): its table can be scattered
    from ``v``'s rows by the kernel that writes them."""
    if not _is_op(n, "embedding_backward") or len(n.inputs) != 2 or n.inputs[0] is not v:
        return False
    idx = n.inputs[1]
    p = n.params
    W, pad = p.get("num_weights"), p.get("padding_idx")
    return isinstance(idx, Value) and idx.dtype.kind in "iu" and p.get("scale") is None and \
        type(W) is int and (pad is None or type(pad) is int) and len(v.shape) >= 2 and \
        int(np.prod(idx.shape, dtype=np.int64)) == _rows(v.shape) and \
        tuple(n.outputs[0].shape) == (W, v.shape[-1]) and n.outputs[0].dtype == v.dtype


def fuse_residual_backward(graph):
    """A graph pass: each ``layer_norm_backward`` node (g, x, w) -> (gx, gw[, gb]) whose gx
    is read only by ``add(r, gx)`` / ``add(gx, r)`` becomes one
    ``residual_layer_norm_backward(g, x, w, r)`` node (at the add's place) returning
    ``(r + gx, gw[, gb], column sums..., leading sums...)``: the ``sum(., dims=(0,))`` of
    its main output (passes.column_sums) and the ``sum_to`` over its leading axes join as
    extra outputs. Without such an add, the node still takes its main output's sums."""
    lns = [n for n in graph.nodes if n.name == "layer_norm_backward" and n.impl is not None
           and len(n.inputs) == 3 and len(n.outputs) in (2, 3)]
    if not lns:
        return graph
    pos = {id(n): i for i, n in enumerate(graph.nodes)}
    uses = ir.readers(graph)
    replace, drop = {}, set()
    for ln in lns:
        g, x, w = ln.inputs
        gx = ln.outputs[0]
        if not all(isinstance(v, Value) for v in (g, x, w)) or _floats(g, x, w) is None or \
                not x.shape or g.shape != x.shape or tuple(w.shape) != (x.shape[-1],):
            continue
        readers = uses.get(id(gx), [])
        add, mode, res, main, at = None, 0, [], gx, ln
        if len(readers) == 1 and _is_op(readers[0], "add") and not readers[0].params and \
                len(readers[0].inputs) == 2 and id(readers[0]) not in drop:
            m = readers[0]
            other = m.inputs[1] if m.inputs[0] is gx else m.inputs[0]
            if isinstance(other, Value) and other is not gx and other.shape == gx.shape and \
                    other.dtype == gx.dtype and m.outputs[0].dtype == gx.dtype and \
                    m.outputs[0].shape == gx.shape and \
                    not any(n.effect for n in graph.nodes[pos[id(ln)]:pos[id(m)] + 1]) and \
                    all(pos[id(u)] > pos[id(m)] for v in ln.outputs[1:]
                        for u in uses.get(id(v), ()) if id(u) in pos):
                add, res, main, at = m, [other], m.outputs[0], m
                mode = 1 if m.inputs[1] is gx else 2
        sums, views = [], []
        for s, view in passes.column_sums(graph, main):
            if id(s) in drop or pos[id(s)] < pos[id(at)]:
                continue
            sums.append(s)
            if view is not None:
                views.append(view)
        tos = [n for n in uses.get(id(main), ()) if _sum_to_leading(n, main)
               and id(n) not in drop and pos[id(n)] > pos[id(at)]][:1]
        embs = [(n, k) for k, v in enumerate([main] + [t.outputs[0] for t in tos])
                for n in uses.get(id(v), ()) if _embedding_grad(n, v) and id(n) not in drop
                and pos[id(n)] > pos[id(at)] and (
                    n.inputs[1].producer is None or id(n.inputs[1].producer) not in pos
                    or pos[id(n.inputs[1].producer)] < pos[id(at)])]
        params = dict(ln.params)
        params["residual"] = mode
        outs = [main] + list(ln.outputs[1:]) + [s.outputs[0] for s in sums] + \
            [t.outputs[0] for t in tos] + [n.outputs[0] for n, _ in embs]
        fused = Node(None, "residual_layer_norm_backward",
                     [g, x, w] + res + [n.inputs[1] for n, _ in embs], params, outs,
                     impl=_ln_backward_residual_impl(ln, add, sums, tos, embs),
                     meta={"layer_norm_backward": ln, "add": add, "sums": sums, "sum_to": tos,
                           "embeddings": embs, "with_gb": len(ln.outputs) == 3})
        replace[id(at)] = fused
        if add is not None:
            drop.add(id(ln))
        drop.update(id(s) for s in sums)
        drop.update(id(t) for t in tos)
        drop.update(id(n) for n, _ in embs)
        for view in views:  # a (rows, C) view read by nothing but the absorbed sums
            if all(id(u) in drop for u in uses.get(id(view.outputs[0]), ())):
                drop.add(id(view))
    return passes.replace_nodes(graph, replace, drop)


@op_kernels.register("residual_layer_norm_backward")
def residual_layer_norm_backward_factory(node):
    """The fused LayerNorm gradient with the residual add and the sums of its result."""
    g, x, w = node.inputs[:3]
    meta = node.meta or {}
    embs = meta.get("embeddings", ())
    floats = node.inputs[:len(node.inputs) - len(embs)]
    dt = _floats(*floats)
    if dt is None or x.shape[-1] == 1 or any(d == 0 for d in x.shape):
        return None  # (C == 1: numpy's sum_to then reduces a contiguous run: pairwise)
    with_gb = meta.get("with_gb", len(node.outputs) >= 3)
    n_cs = len(meta.get("sums", ()))
    tos = meta.get("sum_to", ())
    if len(tos) > 1:
        return None
    shape = tuple(x.shape)
    C = shape[-1]
    R = _rows(shape)
    mode = int(node.params.get("residual", 0))
    pshape = tuple(tos[0].outputs[0].shape) if tos else None
    P = _rows(pshape) if tos else 0
    if tos and (len(pshape) < 2 or R % P):
        return None
    fn = _rows_kernel("ln_backward_rows", C)
    tile = min(TILE, R)
    e2 = np.empty((1, C), dt)
    sc = np.empty((3, tile, C), dt)  # scratch: used only inside the numba call
    st = np.empty((4, tile), dt)
    boxes = [None], [None], [None]
    nacc = 2 + n_cs
    flat = (R, C)
    prows = (P, C)
    n_res = 1 if mode else 0
    # the embedding tables scattered from the result (k = 0) or its leading sums (k = 1)
    plan = [(k, n.params["num_weights"], n.params.get("padding_idx")) for n, k in embs]
    scatter = _kernels()["scatter_rows"]
    from tapegrad.ops import nn as nn_ops

    eager_table = nn_ops.embedding_backward.forward
    impl = node.impl

    def residual_layer_norm_backward_kernel(g, x, w, *rest, axes, eps, residual):
        if not (g.flags.c_contiguous and x.flags.c_contiguous and (
                not n_res or rest[0].flags.c_contiguous)):
            # numpy sums a strided row in another order (and lays its results out so)
            return impl(g, x, w, *rest, axes=axes, eps=eps, residual=residual)
        out = recycle(boxes[0], flat, dt)  # last call's arrays when nothing holds them
        acc = recycle(boxes[1], (nacc, C), dt)  # gw, gb and the column sums: one array
        pos = recycle(boxes[2], prows, dt) if P else e2
        fn(g.reshape(flat), x.reshape(flat), w, dt.type(eps),
           rest[0].reshape(flat) if n_res else e2, mode, out, acc, n_cs, pos, P, sc, st)
        main = out.reshape(shape)
        sums = tuple(acc[2:]) + ((pos.reshape(pshape),) if P else ())
        outs = ((main, acc[0], acc[1]) if with_gb else (main, acc[0])) + sums
        if not plan:
            return outs
        tables = []
        for (k, W, pad), idx in zip(plan, rest[n_res:]):
            src = pos if k else out
            t = np.zeros((W, C), dt)
            if not scatter(src, idx.reshape(-1), t):
                t = eager_table(src, idx, W, padding_idx=pad)  # eager's IndexError
            if pad is not None:
                t[pad] = 0
            tables.append(t)
        return outs + tuple(tables)

    return residual_layer_norm_backward_kernel
