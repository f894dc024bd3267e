"""Graph -> graph passes: DCE, CSE, constant folding, simplification, pointwise fusion.

Each pass is a small function that returns a new Graph (the input graph is left as it was,
so a pass can be checked against the printout of its input). ``optimize(graph,
check=arrays)`` runs them in order; with ``check`` it is the value-check mode: the graph is
evaluated before and after every pass on the same inputs and a ``PassCheckError`` names
the first pass that changed a result (outputs, write-backs, or what effect nodes consume).
"""
import importlib

import numpy as np

from tapegrad.compiler.ir import Graph, Node, Value, call_node, evaluate
from tapegrad.compiler import kernels
from tapegrad.ops.registry import REGISTRY


def fusible(n, weak=()):
    """Whether node ``n`` may join a pointwise group: its op has a scalar form (``Op.lower``,
    the one place the compiler learns an op is pointwise) and it makes one non-scalar value.
    With numba, also a form that can compile here (``kernels.compiles``): one that cannot (a
    C-library call numba rounds otherwise, no numpy ufunc to compute it before the kernel)
    would turn its whole group into numpy calls, so it stays a node of its own."""
    if not (n.op is not None and n.op.lowering is not None and len(n.outputs) == 1
            and n.outputs[0].shape != ()):
        return False
    return kernels.backend() != "numba" or kernels.compiles(n, weak)


class PassCheckError(AssertionError):
    """Raised by the value-check mode: ``pass_name`` changed a result."""

    def __init__(self, pass_name, detail):
        super().__init__(f"pass {pass_name!r} changed a result: {detail}")
        self.pass_name = pass_name


def _substitute(graph, subst, drop=()):
    """A new graph with Values replaced per ``subst`` (id -> Value) and ``drop`` nodes gone."""
    def s(a):
        while isinstance(a, Value) and id(a) in subst:
            a = subst[id(a)]
        return a

    g = graph.copy()
    nodes = []
    for n in graph.nodes:
        if id(n) in drop:
            continue
        ins = [s(a) for a in n.inputs]
        if any(x is not y for x, y in zip(ins, n.inputs)):
            n = Node(n.op, n.name, ins, n.params, n.outputs, n.effect, n.variadic, n.impl,
                     n.meta)
        nodes.append(n)
    g.nodes = nodes
    g.outputs = [s(v) for v in graph.outputs]
    g.writes = [(k, t, label, s(v)) for k, t, label, v in graph.writes]
    return g


def _uses(graph):
    uses = {}
    for n in graph.nodes:
        for a in n.inputs:
            if isinstance(a, Value):
                uses[id(a)] = uses.get(id(a), 0) + 1
    for v in graph.used_values():
        uses[id(v)] = uses.get(id(v), 0) + 1
    return uses


def dce(graph):
    """Dead-node elimination: keep effect nodes, run-time checks (ops flagged ``check``) and
    what the outputs, write-backs and effects read; drop everything else (gradients nobody
    reads, unused forward values). A check stays even when nothing reads its result: eager
    raises on a bad value whatever is done with it (``scatter_add``'s input gradient)."""
    live = {id(v) for v in graph.used_values()}
    keep = []
    for n in reversed(graph.nodes):
        if n.effect or getattr(n.op, "check", False) or any(id(v) in live for v in n.outputs):
            keep.append(n)
            live.update(id(a) for a in n.inputs if isinstance(a, Value))
    g = graph.copy()
    g.nodes = keep[::-1]
    g.consts = {v: a for v, a in graph.consts.items() if id(v) in live}
    return g


def cse(graph):
    """Common-subexpression elimination: a node equal to an earlier one (same op, same input
    Values, same params) reuses its outputs. Effect and vjp nodes are never merged."""
    seen, subst, drop = {}, {}, set()
    for n in graph.nodes:
        if n.effect or (n.impl is not None and n.name != "full"):
            continue
        ins = [subst.get(id(a), a) if isinstance(a, Value) else a for a in n.inputs]
        probe = Node(n.op, n.name, ins, n.params, [], n.effect, n.variadic, n.impl)
        k = probe.key()
        first = seen.get(k)
        if first is None:
            seen[k] = n
            continue
        for old, new in zip(n.outputs, first.outputs):
            subst[id(old)] = new
        drop.add(id(n))
    return _substitute(graph, subst, drop)


def fold_constants(graph):
    """Nodes without effects whose inputs are all constants are evaluated now."""
    g = graph.copy()
    consts = dict(graph.consts)
    known = {id(v): a for v, a in consts.items()}
    nodes = []
    for n in graph.nodes:
        vals = n.values_in()
        pure = not n.effect and (n.impl is None or n.name == "full")
        if pure and all(id(v) in known for v in vals):
            outs = call_node(n, [known[id(a)] if isinstance(a, Value) else a
                                 for a in n.inputs])
            for v, o in zip(n.outputs, outs):
                known[id(v)] = o
                consts[v] = o
            continue
        nodes.append(n)
    g.nodes = nodes
    g.consts = consts
    return g


def _same(v, a):
    return isinstance(a, Value) and a.shape == v.shape and a.dtype == v.dtype


def simplify(graph):
    """Algebraic simplification: identity reshapes, broadcasts, casts, permutes, sum_to and
    multiplication by one become their input (each bit-identical to what it replaces)."""
    subst = {}
    drop = set()
    for n in graph.nodes:
        if n.effect or n.impl is not None or len(n.outputs) != 1:
            continue
        out = n.outputs[0]
        ins = [subst.get(id(a), a) if isinstance(a, Value) else a for a in n.inputs]
        src = None
        if n.name in ("reshape", "broadcast_to", "sum_to", "to_dtype", "expand") and \
                _same(out, ins[0]):
            src = ins[0]
        elif n.name == "permute" and tuple(n.params.get("dims", ())) == tuple(
                range(len(out.shape))):
            src = ins[0]
        elif n.name == "mul" and len(ins) == 2:
            a, b = ins
            if _same(out, a) and not isinstance(b, Value) and type(b) in (int, float) \
                    and b == 1 and a.dtype.kind == "f":
                src = a
            elif _same(out, b) and not isinstance(a, Value) and type(a) in (int, float) \
                    and a == 1 and b.dtype.kind == "f":
                src = b
        if src is not None:
            subst[id(out)] = src
            drop.add(id(n))
    return _substitute(graph, subst, drop)


SMALL_K = 4  # a product with this few terms per element is a pointwise step of a kernel


def small_k_matmul(n):
    """``matmul(a, b)`` of 2-D operands with a contraction of at most ``SMALL_K`` terms
    (the first layer's ``x @ W.T`` on 2-D inputs, ``g @ W`` for 3 classes): each output
    element is a few multiply-adds, so it fuses with its pointwise reader (the matrix it
    would write and the next kernel read is never made)."""
    if n.name != "matmul" or len(n.inputs) != 2:
        return False
    a, b = n.inputs
    return (isinstance(a, Value) and isinstance(b, Value) and len(a.shape) == 2
            and len(b.shape) == 2 and a.shape[1] <= SMALL_K and a.dtype == b.dtype
            and a.dtype.kind == "f")


def fuse(graph):
    """Fusion of pointwise chains (and trees) into single kernels: a pointwise node whose only
    reader is the next pointwise node of the same shape joins that node's group, unless an
    effect node lies between them. Each group becomes one ``fused`` node whose body is the
    group's nodes in program order (codegen.py writes it as one function)."""
    uses = _uses(graph)
    pos = {id(n): i for i, n in enumerate(graph.nodes)}
    effects = [i for i, n in enumerate(graph.nodes) if n.effect]
    reader = {}
    for n in graph.nodes:
        for a in n.inputs:
            if isinstance(a, Value):
                reader[id(a)] = n
    group = {}  # id(node) -> id(root node of its group)

    def root(n):
        r = id(n)
        while group.get(r, r) != r:
            r = group[r]
        return r

    weak = {id(v) for v, src in graph.inputs if src.kind == "hyper"}  # Python numbers

    def pointwise(n):
        return fusible(n, weak) or (small_k_matmul(n) and n.outputs[0].shape != ())

    for n in graph.nodes:
        if not pointwise(n):
            continue
        out = n.outputs[0]
        m = reader.get(id(out))
        if m is None or uses.get(id(out), 0) != 1 or not pointwise(m) or m.name == "matmul":
            continue  # a matmul reads whole rows and columns: only its own inputs feed it
        if m.outputs[0].shape != out.shape or any(a is out for a in kernels.group_inputs(m)):
            continue
        lo, hi = pos[id(n)], pos[id(m)]
        if any(lo < e < hi for e in effects):
            continue
        group[id(n)] = id(m)
    members = {}
    for n in graph.nodes:
        if pointwise(n):
            members.setdefault(root(n), []).append(n)
    # column sums of a group's result (a bias gradient) join its kernel as extra outputs
    last_of = {id(b[-1].outputs[0]): r for r, b in members.items()}
    epilogue, absorbed = {}, set()
    for n in graph.nodes:
        if (n.name == "sum" and n.op is not None and len(n.inputs) == 1
                and isinstance(n.inputs[0], Value) and len(n.inputs[0].shape) == 2
                and tuple(n.params.get("dims") or ()) == (0,) and not n.params.get("keepdim")
                and n.params.get("dtype") is None and id(n.inputs[0]) in last_of):
            epilogue.setdefault(last_of[id(n.inputs[0])], []).append(n)
            absorbed.add(id(n))
    contract = _contractions(graph, members, last_of, uses, pos, effects, absorbed)
    g = graph.copy()
    nodes = []
    for n in graph.nodes:
        if id(n) in absorbed:
            continue  # computed by its group's kernel
        body = members.get(root(n)) if pointwise(n) else None
        reduce = epilogue.get(root(n), []) if body is not None else []
        con = contract.get(root(n), []) if body is not None else []
        if body is None or (len(body) == 1 and not reduce and not con and not (
                fusible(body[0], weak) and body[0].op.lowering.alone
                and kernels.backend() == "numba")):
            nodes.append(n)
            continue
        if n is not body[-1]:
            continue  # placed at the group's last node
        inner = {id(v) for m in body for v in m.outputs}
        ins, seen = [], set()
        for m in body:
            for a in m.inputs:
                if isinstance(a, Value) and id(a) not in inner and id(a) not in seen:
                    seen.add(id(a))
                    ins.append(a)
        for _, p, _, _, small in con:
            for a in (p.inputs[0], small):
                if id(a) not in inner and id(a) not in seen:
                    seen.add(id(a))
                    ins.append(a)
        outs = [body[-1].outputs[0]] + [r.outputs[0] for r in reduce] + \
            [c[0].outputs[0] for c in con]
        main = body[-1].outputs[0]
        absorbed_reads = len(reduce) + sum(1 for c in con if c[1].inputs[0] is main)
        fused = Node(None, "fused", ins, {}, outs, impl=_fused_impl(body, ins, reduce, con),
                     meta={"nodes": body, "reduce": reduce, "contract": con,
                           # only its own epilogues read the result: a kernel need not store it
                           "store": uses.get(id(main), 0) > absorbed_reads})
        nodes.append(fused)
    g.nodes = nodes
    return g


def _contractions(graph, members, last_of, uses, pos, effects, absorbed):
    """``X.T @ Y`` over a group's rows, where one side is the group's result or one of its
    full-shape inputs and the other has at most ``SMALL_K`` columns (``dW1 = dz.T @ x``,
    ``dW2 = g.T @ h``): accumulated by the group's kernel in the same pass over the rows.
    Returns ``{group root: [(matmul, permute, form, wide side, narrow side)]}``."""
    producer = {id(v): n for n in graph.nodes for v in n.outputs}
    first_read = {}
    for i, n in enumerate(graph.nodes):
        for a in n.values_in():
            first_read.setdefault(id(a), i)
    full_in = {}
    for r, b in members.items():
        shape = b[-1].outputs[0].shape
        inner = {id(v) for m in b for v in m.outputs}
        for m in b:
            for a in m.inputs:
                if isinstance(a, Value) and id(a) not in inner and a.shape == shape:
                    full_in.setdefault(id(a), r)
    contract = {}
    for n in graph.nodes:
        if n.name != "matmul" or n.op is None or small_k_matmul(n) or len(n.inputs) != 2:
            continue
        a, b = n.inputs
        t = producer.get(id(a)) if isinstance(a, Value) else None
        if t is None or t.name != "permute" or t.op is None or len(a.shape) != 2 or \
                uses.get(id(a)) != 1 or not isinstance(b, Value) or len(b.shape) != 2 or \
                tuple(t.params.get("dims", ())) not in ((1, 0), (-1, -2), (1, -2), (-1, 0)):
            continue
        x = t.inputs[0]
        if not isinstance(x, Value) or x.shape[0] != b.shape[0] or x.dtype != b.dtype or \
                x.dtype.kind != "f":
            continue
        for wide, narrow, form, r in [(w_, n_, f_, r_) for w_, n_, f_ in (
                (b, x, "left"), (x, b, "right")) for r_ in (last_of.get(id(w_)),
                                                            full_in.get(id(w_)))]:
            if r is None or narrow.shape[1] > SMALL_K or len(wide.shape) != 2:
                continue
            body = members[r]
            gpos = pos[id(body[-1])]
            inner = {id(v) for m in body for v in m.outputs}
            sp = producer.get(id(narrow))
            if body[-1].outputs[0].shape != wide.shape or id(narrow) in inner or \
                    (sp is not None and pos[id(sp)] > gpos) or \
                    first_read.get(id(n.outputs[0]), gpos + 1) <= gpos or \
                    any(min(gpos, pos[id(n)]) < e < max(gpos, pos[id(n)]) for e in effects):
                continue  # (a matmul before the group moves down to it: nothing reads it yet)
            contract.setdefault(r, []).append((n, t, form, wide, narrow))
            absorbed.update((id(n), id(t)))
            break
    return contract


def _fused_impl(body, ins, reduce=(), contract=()):
    """The reference evaluation of a fused group (the generated kernel is the fast one)."""
    def fused(*arrays):
        env = {id(v): a for v, a in zip(ins, arrays)}
        for m in body:
            args = [env[id(a)] if isinstance(a, Value) else a for a in m.inputs]
            env[id(m.outputs[0])] = call_node(m, args)[0]
        res = env[id(body[-1].outputs[0])]
        if not reduce and not contract:
            return res
        con = []
        for mm, p, _, _, _ in contract:
            (pt,) = call_node(p, [env[id(p.inputs[0])]])
            con.append(call_node(mm, [pt, env[id(mm.inputs[1])]])[0])
        return (res,) + tuple(call_node(r, [res])[0] for r in reduce) + tuple(con)

    return fused


def split_linear(graph):
    """``linear(x, w, b)`` whose only reader is a pointwise node becomes ``matmul(x, w.T)``
    and ``add(., b)``, so the bias add joins that node's kernel (the ReLU after a layer).
    Bit-identical: eager's linear is the same product followed by ``+= b``."""
    uses = _uses(graph)
    readers = {}
    for n in graph.nodes:
        for a in n.inputs:
            if isinstance(a, Value):
                readers.setdefault(id(a), []).append(n)
    g = graph.copy()
    nodes = []
    for n in graph.nodes:
        ins = n.inputs
        if (n.name == "linear" and n.op is not None and len(ins) == 3 and not n.params
                and all(isinstance(a, Value) for a in ins) and len(ins[0].shape) == 2
                and len(ins[1].shape) == 2 and len(ins[2].shape) == 1
                and len({a.dtype for a in ins}) == 1 and ins[0].dtype.kind == "f"
                and uses.get(id(n.outputs[0])) == 1
                and readers.get(id(n.outputs[0]), [None])[0] is not None
                and fusible(readers[id(n.outputs[0])][0])):
            x, w, b = ins
            out = n.outputs[0]
            wt = graph.new_value((w.shape[1], w.shape[0]), w.dtype)
            mm = graph.new_value(out.shape, out.dtype)
            nodes.append(Node(REGISTRY["permute"], "permute", [w], {"dims": (1, 0)}, [wt]))
            nodes.append(Node(REGISTRY["matmul"], "matmul", [x, wt], {}, [mm]))
            nodes.append(Node(REGISTRY["add"], "add", [mm, b], {}, [out]))
            continue
        nodes.append(n)
    g.nodes = nodes
    return g


def fuse_cross_entropy(graph):
    """``cross_entropy_index`` and its gradient (the backward op, or an opaque rule) on the
    same logits become one node computing the loss, the gradient and (when read) the
    gradient's column sums (the last bias gradient) in one pass: numba's kernel in generated
    code, the two eager calls as the reference here."""
    fwd = {}
    for i, n in enumerate(graph.nodes):
        if n.name == "cross_entropy_index" and n.op is not None and len(n.inputs) == 2:
            fwd[(id(n.inputs[0]), id(n.inputs[1]))] = (i, n)
    pos = {id(n): i for i, n in enumerate(graph.nodes)}
    made_at = {id(v): pos[id(n)] for n in graph.nodes for v in n.outputs}
    replace, drop = {}, set()
    for n in graph.nodes:
        if n.name not in ("cross_entropy_index_backward", "vjp_cross_entropy_index") \
                or len(n.inputs) != 3:
            continue
        gv, x, t = n.inputs
        hit = fwd.get((id(x), id(t)))
        if hit is None or not isinstance(x, Value) or not isinstance(gv, Value) \
                or len(x.shape) != 2 or x.dtype.kind != "f" or t.dtype.kind not in "iu" \
                or gv.shape != () or made_at.get(id(gv), -1) >= hit[0] \
                or dict(hit[1].params) != dict(n.params) or id(hit[1]) in replace:
            continue
        f = hit[1]
        grad = n.outputs[0]
        sums = [m for m in graph.nodes if m.name == "sum" and m.inputs and m.inputs[0] is grad
                and tuple(m.params.get("dims") or ()) == (0,) and not m.params.get("keepdim")
                and m.params.get("dtype") is None][:1]
        outs = [f.outputs[0], grad] + [m.outputs[0] for m in sums]
        fused = Node(None, "cross_entropy_fused", [x, t, gv], dict(f.params), outs,
                     impl=_cross_entropy_impl(f, n, sums),
                     meta={"forward": f, "rule": n, "sums": sums})
        replace[id(f)] = fused
        drop.add(id(n))
        drop.update(id(m) for m in sums)
    return replace_nodes(graph, replace, drop)


def column_sums(graph, value):
    """The ``sum(., dims=(0,))`` nodes (no keepdim, no dtype) that reduce ``value`` over all
    but its last axis: read directly (``value`` 2-D) or through a ``reshape`` of it to
    ``(-1, C)`` / ``(rows, C)`` (a linear's bias gradient of a 3-D activation). A kernel that
    writes ``value`` row by row can add each row into these sums as it goes: numpy's
    reduction over the leading axis of a C-contiguous matrix adds the rows in order, one
    element at a time, into 0.0 (its identity: a column of -0.0 sums to 0.0, numpy 2.4),
    so the same running sums are its bits. Returns ``[(sum_node,
    reshape_node or None)]``."""
    if len(value.shape) < 2:
        return []
    cols = value.shape[-1]
    rows = int(np.prod(value.shape[:-1], dtype=np.int64))
    views = {id(value): None}
    for n in graph.nodes:
        if n.name == "reshape" and n.inputs and n.inputs[0] is value and len(n.outputs) == 1 \
                and tuple(n.outputs[0].shape) == (rows, cols):
            views[id(n.outputs[0])] = n
    found = []
    for n in graph.nodes:
        if n.name == "sum" and n.inputs and isinstance(n.inputs[0], Value) \
                and id(n.inputs[0]) in views and len(n.inputs[0].shape) == 2 \
                and tuple(n.params.get("dims") or ()) == (0,) and not n.params.get("keepdim") \
                and n.params.get("dtype") is None and n.outputs[0].dtype == value.dtype:
            found.append((n, views[id(n.inputs[0])]))
    return found


def replace_nodes(graph, replace, drop):
    """``graph`` with each node whose id is in ``replace`` swapped for its new node and the
    nodes in ``drop`` gone (a fusing pass's last step); ``graph`` itself if nothing changes."""
    if not replace:
        return graph
    g = graph.copy()
    g.nodes = [replace.get(id(n), n) for n in graph.nodes if id(n) not in drop]
    return g


def _cross_entropy_impl(f, rule, sums):
    def cross_entropy_fused(x, t, g, **params):
        loss = f.op.forward(x, t, **params)
        (grad,) = call_node(rule, [g, x, t])
        return (np.asarray(loss), grad) + tuple(call_node(m, [grad])[0] for m in sums)

    return cross_entropy_fused


def _kernel_pass(module, name, doc):
    """A pass defined beside its node's hand-written kernel, in ``compiler/<module>.py``
    (imported at the first run: those modules import this one)."""
    def run(graph):
        return getattr(importlib.import_module(f"tapegrad.compiler.{module}"), name)(graph)

    run.__name__ = run.__qualname__ = name
    run.__doc__ = f"{doc} (compiler/{module}.py)."
    return run


fuse_layer_norm_backward = _kernel_pass(
    "kernels_norm_softmax", "fuse_layer_norm_backward",
    "LayerNorm's traced gradient rule as one node")
fuse_residual_layer_norm = _kernel_pass(
    "kernels_residual", "fuse_residual_layer_norm",
    "A residual sum read by a LayerNorm as one node")
fuse_residual_backward = _kernel_pass(
    "kernels_residual", "fuse_residual_backward",
    "A LayerNorm gradient, the residual add of its gx and their column sums as one node")
fuse_softmax_backward = _kernel_pass(
    "kernels_norm_softmax", "fuse_softmax_backward", "softmax's traced gradient rule as one node")
share_attention_probabilities = _kernel_pass(
    "kernels_norm_softmax", "share_attention_probabilities",
    "attention's forward also returns its probabilities for its traced rule")
merge_split_gradients = _kernel_pass(
    "kernels_norm_softmax", "merge_split_gradients",
    "A split's three slice gradients added into zeros as one concatenation")
absorb_gradient_products = _kernel_pass(
    "kernels_attention", "absorb_gradient_products",
    "attention's q/k/v gradient products written by BLAS into the merged concatenation")
share_gelu_erf = _kernel_pass(
    "kernels_gelu", "share_gelu_erf",
    "GELU's forward returns ``1 + erf(x / sqrt 2)`` for its gradient on the same value")
fuse_clip_optimizer_step = _kernel_pass(
    "kernels_optim", "fuse_clip_optimizer_step",
    "clip_grad_norm_ and the Adam/AdamW step reading its clipped gradients as one node")


PASSES = (("simplify", simplify), ("cse", cse), ("fold_constants", fold_constants),
          ("dce", dce), ("split_linear", split_linear),
          ("fuse_cross_entropy", fuse_cross_entropy),
          ("fuse_layer_norm_backward", fuse_layer_norm_backward),
          ("fuse_residual_layer_norm", fuse_residual_layer_norm),
          ("fuse_residual_backward", fuse_residual_backward),
          ("fuse_softmax_backward", fuse_softmax_backward),
          ("share_attention_probabilities", share_attention_probabilities),
          ("merge_split_gradients", merge_split_gradients),
          ("absorb_gradient_products", absorb_gradient_products),
          ("share_gelu_erf", share_gelu_erf),
          ("fuse_clip_optimizer_step", fuse_clip_optimizer_step), ("fuse", fuse))


def _observed(graph, arrays):
    """Outputs, write-backs and effect-node inputs, evaluated without running effects."""
    env = {id(v): a for (v, _), a in zip(graph.inputs, arrays)}
    env.update({id(v): a for v, a in graph.consts.items()})
    seen = []
    for n in graph.nodes:
        args = [env[id(a)] if isinstance(a, Value) else a for a in n.inputs]
        observe = n.meta.get("observe") if n.effect and isinstance(n.meta, dict) else None
        if observe is not None:  # an effect node that also computes (kernels_optim's)
            outs, consumed = observe(args)
            seen.extend(consumed)
        elif n.effect:
            seen.extend(a for a in args if isinstance(a, np.ndarray))
            outs = [np.array(a) for a in args[:len(n.outputs)]]
            outs += [np.zeros(v.shape, v.dtype) for v in n.outputs[len(outs):]]  # draws
        else:
            outs = call_node(n, args)
        for v, o in zip(n.outputs, outs):
            env[id(v)] = o
    seen += [env[id(v)] if isinstance(v, Value) else v for v in graph.outputs]
    seen += [env[id(v)] for _, _, _, v in graph.writes if v is not None]
    return seen


def _equal(a, b):
    a, b = np.asarray(a), np.asarray(b)
    return a.shape == b.shape and a.dtype == b.dtype and np.array_equal(a, b, equal_nan=True)


def optimize(graph, passes=PASSES, check=None, log=None):
    """Run ``passes`` (name, function) in order. ``check``: input arrays for the value-check
    mode. ``log``: a list that receives ``(pass name, nodes before, nodes after)``."""
    before = _observed(graph, check) if check is not None else None
    for name, fn in passes:
        n0 = len(graph.nodes)
        graph = fn(graph)
        if log is not None:
            log.append((name, n0, len(graph.nodes)))
        if check is not None:
            after = _observed(graph, check)
            if len(after) != len(before):
                raise PassCheckError(name, f"{len(before)} results became {len(after)}")
            for i, (x, y) in enumerate(zip(before, after)):
                if not _equal(x, y):
                    raise PassCheckError(name, f"result {i} differs")
            before = after
    return graph


__all__ = ["dce", "cse", "fold_constants", "simplify", "fuse", "split_linear",
           "fuse_cross_entropy", "optimize", "PASSES",
           "PassCheckError", "evaluate", "Graph"]
