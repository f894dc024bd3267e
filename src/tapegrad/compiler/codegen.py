"""Execution: a Graph becomes readable Python source over numpy arrays (no Tensor, no Node).

The generated function reads its inputs' arrays (arguments, tensors held by reference,
``.grad`` of leaves), calls each op's numpy forward in program order, runs fused pointwise
kernels as one function each, stores the write-backs and returns the outputs' arrays::

    def compiled(args, refs):
        a0 = args[0]._data
        p2 = refs[0]._data
        v4 = linear(a0, p2, p3)
        v5 = relu(v4)
        ...
        set_grad(refs[0], v15)
        return (v6,)

``TAPEGRAD_COMPILE_DEBUG=1`` prints every graph and its source when it is compiled.
"""
import hashlib
import math
import re
import sys

import numpy as np

from tapegrad.compiler import kernels, memory, op_kernels
from tapegrad.compiler.ir import Value
from tapegrad.tensor import Tensor

_make, _GRAD = Tensor._make, Tensor.grad  # (set_grad_owned)

def _ident(name):
    s = re.sub(r"\W", "_", str(name))
    return s if s[:1].isalpha() else "v" + s


def _literal(v):
    """Python source for a literal that reads back as the same value, or None."""
    if v is None or isinstance(v, (bool, str)):
        return repr(v)
    if isinstance(v, int):
        return repr(v)
    if isinstance(v, float):
        return repr(v) if math.isfinite(v) else None
    if isinstance(v, tuple):
        parts = [_literal(x) for x in v]
        if any(p is None for p in parts):
            return None
        return "(" + ", ".join(parts) + ("," if len(parts) == 1 else "") + ")"
    return None


class _Writer:
    def __init__(self):
        self.ns = {"asarray": np.asarray, "np": np}
        self.lines = []
        self.kernels = []
        self.n_kernels = 0
        self.counter = 0

    def bind(self, hint, obj):
        """A namespace name for ``obj`` (ops' forwards, dtypes, arrays, callables)."""
        for k, v in self.ns.items():
            if v is obj and k.startswith(hint):
                return k
        name = _ident(hint)
        if name in self.ns:
            self.counter += 1
            name = f"{name}_{self.counter}"
        self.ns[name] = obj
        return name

    def arg(self, a, names):
        if isinstance(a, Value):
            return names[id(a)]
        lit = _literal(a)
        return lit if lit is not None else self.bind("k", a)

    def call(self, n, names):
        if n.impl is not None:
            fn = self.bind(n.name, n.impl)
        else:
            fn = self.bind(n.op.name, n.op.forward)
        args = [self.arg(a, names) for a in n.inputs]
        if n.variadic:
            args = ["[" + ", ".join(args) + "]"]
        for k, v in n.params.items():
            lit = _literal(v)
            args.append(f"{k}={lit if lit is not None else self.bind(f'{n.name}_{k}', v)}")
        return f"{fn}({', '.join(args)})"


def _kernel(w, n, names, out_expr=None, weak=()):
    """A fused node as one kernel function; returns the call expression. numba's loop nest
    (kernels.py) when it compiles the group exactly, else numpy ufunc steps that write into
    buffers the kernel owns (``out=``), bit-identical to the unfused ops. ``out_expr``: the
    planned buffer of the result (memory.py), or None for a fresh one."""
    body = n.meta["nodes"]
    reduce = n.meta.get("reduce", ())
    ins = n.inputs
    kname = _ident(f"fused_{w.n_kernels}")
    w.n_kernels += 1
    vals = [a for a in ins if isinstance(a, Value)]
    main = n.outputs[0]
    con = n.meta.get("contract", ())
    if kernels.backend() == "numba" and kernels.supported(body, vals, main.shape, weak, con) \
            and all(len(main.shape) == 2 for _ in reduce):
        return _numba_kernel(w, n, names, kname, vals, out_expr, weak)
    local = {}
    params = []
    for i, a in enumerate(ins):
        if isinstance(a, Value):
            local[id(a)] = f"x{i}"
            params.append(f"x{i}")
    lines = [f"def {kname}({', '.join(params + ['out=None'])}):"]
    lines.append("    # " + " -> ".join(m.name for m in body) + (" -> sum" * len(reduce)))
    owned = None  # the previous step's value, when this kernel allocated it (a ufunc result)
    for j, m in enumerate(body):
        out = m.outputs[0]
        # an op whose forward is one numpy ufunc call (its lowering's ``ufunc``) may write
        # into a buffer the kernel owns (``out=``) with bit-identical results
        low = kernels.lowering(m)
        uf = low.ufunc[0] if low is not None and low.ufunc else None
        extra = [repr(c) for c in low.ufunc[1:]] if uf else []
        exact_uf = uf and not m.params and all(not isinstance(a, Value) or a.dtype == out.dtype
                                              for a in m.inputs)
        last = j == len(body) - 1
        if last and out_expr is not None and exact_uf and out.shape == main.shape:
            args = [w.arg(a, local) for a in m.inputs] + extra
            lines.append(f"    np.{uf}({', '.join(args)}, out=out)")
            local[id(out)] = "out"
        elif (owned is not None and exact_uf and owned.shape == out.shape
                and owned.dtype == out.dtype and any(a is owned for a in m.inputs)):
            buf = local[id(owned)]
            args = [w.arg(a, local) for a in m.inputs] + extra
            lines.append(f"    np.{uf}({', '.join(args)}, out={buf})")
            local[id(out)] = buf
        else:
            t = f"t{j}"
            expr = w.call(m, local)
            lines.append(f"    {t} = {expr}" if out.shape else f"    {t} = asarray({expr})")
            local[id(out)] = t
            if last and out_expr is not None:
                lines.append(f"    np.copyto(out, {t})")
                local[id(out)] = "out"
        owned = out if (uf and not m.params and out.shape) else None
    res = local[id(body[-1].outputs[0])]
    if res in params:  # never hand back an input as the kernel's (fresh) result
        lines.append(f"    {res} = {res}.copy()")
    outs = [res]
    for k, r in enumerate(reduce):
        outs.append(f"r{k}")
        lines.append(f"    r{k} = {w.call(r, {id(r.inputs[0]): res})}")
    local[id(body[-1].outputs[0])] = res
    for k, (mm, p, _, _, _) in enumerate(con):  # eager's own permute and matmul calls
        lines.append(f"    pt{k} = {w.call(p, local)}")
        local[id(p.outputs[0])] = f"pt{k}"
        lines.append(f"    c{k} = {w.call(mm, local)}")
        outs.append(f"c{k}")
    lines.append(f"    return {', '.join(outs)}{',' if len(outs) > 1 else ''}")
    w.kernels.append("\n".join(lines))
    exec("\n".join(lines), w.ns)  # noqa: S102 - the kernel source is ours
    call = [names[id(a)] for a in ins if isinstance(a, Value)]
    if out_expr is not None:
        call.append(f"out={out_expr}")
    return f"{kname}({', '.join(call)})"


def _chan_index(a, shape):
    """The index that takes a "chan" operand's values along its axis as a 1-D view: 0 on
    every other axis (``x[0, :, 0, 0]``; a zero-stride broadcast view is not copied)."""
    k = kernels.chan_axis(a, shape) - (len(shape) - len(a.shape))
    return ", ".join(":" if i == k else "0" for i in range(len(a.shape)))


def _products(n):
    """The comment on a numba kernel's products (small matmuls, contractions): eager's bits
    where the BLAS computes the same fma chain (``kernels.products_exact``), else the bound."""
    body, con = n.meta["nodes"], n.meta.get("contract", ())
    if not con and not any(m.name == "matmul" for m in body):
        return ""
    if kernels.products_exact(body, con):
        return "  [products: the BLAS's fma chains, eager's bits]"
    return "  [products: BLAS blocks, reordered sums: within 2 gamma_n sum|a b| of eager's]"


def _numba_kernel(w, n, names, kname, vals, out_expr, weak):
    """The Python side of a numba kernel: operands reshaped to (rows, columns), the result
    buffer (planned, or fresh), the column sums; the loop nest itself is in kernels.py."""
    body = n.meta["nodes"]
    reduce = n.meta.get("reduce", ())
    main = n.outputs[0]
    shape = main.shape
    cols = shape[-1]
    rows = 1
    for d in shape[:-1]:
        rows *= d
    pre = {}  # numpy's exp/log/tanh of an operand, one more operand (kernels.outside)
    for k, (nid, (x, fn)) in enumerate(kernels.outside(body, vals, shape, weak).items()):
        pre[nid] = Value(f"{x.name}_{fn}", x.shape, x.dtype)
        buf = w.bind(f"prebuf{k}", np.empty(x.shape, x.dtype))
        names = {**names, id(pre[nid]): f"{w.bind('outside_call', kernels.outside_call)}"
                 f"({fn!r}, {names[id(x)]}, {buf})"}
        vals = vals + [pre[nid]]
    mats = kernels.matrices(body, n.meta.get("contract", ()))
    kinds = [kernels.operand_kind(a, shape, weak, mats) for a in vals]
    split = len(shape) - 1  # rows: the dims before ``split``; columns: the rest
    if len(shape) >= 3 and not reduce and not n.meta.get("contract") and n.meta.get(
            "store", True) and all(k in ("full", "chan", "scalar") for k in kinds):
        # elementwise only: long rows (the inner loop vectorises), each row inside one
        # channel of every "chan" operand (its axis and those before it are the rows)
        split = max([kernels.chan_axis(a, shape) for a, k in zip(vals, kinds)
                     if k == "chan"], default=0) + 1
        rows, cols = math.prod(shape[:split]), math.prod(shape[split:])
    direct = len(shape) in (1, 2) and all(
        len(a.shape) == 1 for a in vals
        if kernels.operand_kind(a, shape, weak, mats) == "row") and not (
            reduce and len(shape) == 1)
    kmain = Value(main.name, shape, main.dtype)
    con = n.meta.get("contract", ())
    src, kinds = kernels.numba_source("KERNEL", body, vals, kmain if direct else
                                      Value(main.name, (rows, cols), main.dtype),
                                      len(reduce), weak, con, n.meta.get("store", True),
                                      kinds, pre)
    # named after its source alone (no shapes, no value names): the same loop nest at other
    # shapes or in other graphs is the same kernel, compiled once per machine
    fname = f"k_{hashlib.sha1(src.encode()).hexdigest()[:12]}"
    src = src.replace("def KERNEL(", f"def {fname}(", 1)
    kfn = w.bind(fname, kernels.load(fname, src))
    dt = w.bind(f"dt_{main.dtype.name}", main.dtype)
    if direct:  # operands as they are: no wrapper, no reshape; the kernel call inline
        w.kernels.append(src.split("\n\n\n", 1)[-1].rstrip())
        pre, call = [], []
        for a, kind in zip(vals, kinds):
            nm = names[id(a)]
            if kind == "scalar" and not (id(a) in weak and main.dtype == np.float64):
                nm = f"{dt}.type({nm})"
            call.append(nm)
        res = _ident("v" + main.name if main.name[:1].isdigit() else main.name)
        if out_expr is None:
            pre.append(f"{res} = np.empty({shape!r}, {dt})")
            call.append(res)
        else:
            pre.append(f"{res} = {out_expr}")
            call.append(res)
        outs = [res]
        for k, r in enumerate(reduce):
            rn = _ident("v" + r.outputs[0].name if r.outputs[0].name[:1].isdigit()
                        else r.outputs[0].name)
            pre.append(f"{rn} = np.empty(({cols},), {dt})")
            call.append(rn)
            outs.append(rn)
        post = []
        for c in con:
            v = c[0].outputs[0]
            cn = _ident("v" + v.name if v.name[:1].isdigit() else v.name)
            if c[2] == "left":
                pre.append(f"{cn} = np.empty({v.shape!r}, {dt})")
                call.append(cn)
            else:  # accumulated as (k, C): stored back in the product's layout
                pre.append(f"{cn}_t = np.empty({v.shape[::-1]!r}, {dt})")
                call.append(f"{cn}_t")
                post.append(f"{cn} = np.ascontiguousarray({cn}_t.T)")
        pre.append(f"{kfn}({', '.join(call)})  # {' -> '.join(m.name for m in body)}"
                   + (" -> sum" * len(reduce)) + (" -> matmul" * len(con)) + _products(n))
        pre.extend(post)
        return pre, None
    params = [f"x{i}" for i in range(len(vals))]
    lines = [f"def {kname}({', '.join(params + ['out=None'])}):",
             "    # " + " -> ".join(m.name for m in body) + (" -> sum" * len(reduce))
             + f"  [numba {fname}]" + _products(n)]
    lines.append(f"    o = out if out is not None and out.flags.c_contiguous else "
                 f"np.empty({shape!r}, {dt})")
    call = []
    for p, kind, a in zip(params, kinds, vals):
        if kind == "full":
            call.append(f"{p}.reshape({rows}, {cols})")
        elif kind == "matrix":
            call.append(p)
        elif kind == "row":
            call.append(f"{p}.reshape({cols})")
        elif kind == "chan":  # its values along the axis: a view, never a copy
            call.append(f"{p}[{_chan_index(a, shape)}]")
        else:
            call.append(f"{dt}.type({p})")
    call.append(f"o.reshape({rows}, {cols})")
    outs = ["o"]
    for k in range(len(reduce)):
        lines.append(f"    r{k} = np.empty(({cols},), {dt})")
        call.append(f"r{k}")
        outs.append(f"r{k}")
    post = []
    for k, c in enumerate(con):
        shp = c[0].outputs[0].shape
        lines.append(f"    c{k} = np.empty({(shp if c[2] == 'left' else shp[::-1])!r}, {dt})")
        call.append(f"c{k}")
        outs.append(f"c{k}")
        if c[2] != "left":
            post.append(f"    c{k} = np.ascontiguousarray(c{k}.T)")
    for a, kind in zip(vals, kinds):  # a channel operand's rows per channel (kernels.py)
        if kind == "chan":
            call.append(str(math.prod(shape[kernels.chan_axis(a, shape) + 1:split])))
    lines.append(f"    {kfn}({', '.join(call)})")
    lines.extend(post)
    if out_expr is not None:
        lines.append("    if out is not None and o is not out:")
        lines.append("        np.copyto(out, o)")
    lines.append(f"    return {', '.join(outs)}{',' if len(outs) > 1 else ''}")
    w.kernels.append(src.split("\n\n\n", 1)[-1].rstrip())
    w.kernels.append("\n".join(lines))
    exec("\n".join(lines), w.ns)  # noqa: S102 - the kernel source is ours
    call = [names[id(a)] for a in vals]
    if out_expr is not None:
        call.append(f"out={out_expr}")
    return f"{kname}({', '.join(call)})"

def generate(graph, name="compiled"):
    """``(source, function)``: ``function(args, refs)`` runs ``graph``; refs are the tensors
    the graph reads by reference (in ``graph.inputs`` order) or whose grads it reads."""
    w = _Writer()
    names = {}
    lines = []
    for i, (v, src) in enumerate(graph.inputs):
        nm = _ident(v.name)
        names[id(v)] = nm
        if src.kind == "arg":
            lines.append(f"    {nm} = args[{src.index}]._data")
        elif src.kind == "array":
            lines.append(f"    {nm} = args[{src.index}]")
        elif src.kind == "ref":
            lines.append(f"    {nm} = refs[{i}]._data")
        elif src.kind == "hyper":  # an optimizer hyperparameter, read at each call
            lines.append(f"    {nm} = {w.bind('group', src.ref)}[{src.label!r}]")
        else:
            lines.append(f"    {nm} = refs[{i}].grad._data")
    for v, arr in graph.consts.items():
        names[id(v)] = w.bind(_ident("c" + v.name), arr)
    plan = memory.plan(graph)
    weak = {id(v) for v, src in graph.inputs if src.kind == "hyper"}  # Python numbers
    bufs = [w.bind(f"buf{k}", np.empty(shape, dtype)) for k, (shape, dtype) in
            enumerate(plan.slots)]
    for n in graph.nodes:
        outs = [_ident("v" + v.name if v.name[:1].isdigit() else v.name) for v in n.outputs]
        target = plan.out.get(id(n.outputs[0])) if n.outputs else None
        out_expr = None
        if target is not None and target[0] == "recycle":
            shape, dtype = plan.recycled[target[1]]
            out_expr = (f"recycle({w.bind(f'box{target[1]}', [None])}, {shape!r}, "
                        f"{w.bind(f'dt_{dtype.name}', dtype)})")
        elif target is not None:
            out_expr = names[id(target[1])] if target[0] == "inplace" else bufs[target[1]]
        for v, nm in zip(n.outputs, outs):
            names[id(v)] = nm
        if n.name == "fused":
            expr = _kernel(w, n, names, out_expr, weak)
            if isinstance(expr, tuple):  # an inline kernel call: its own statements
                lines.extend("    " + x for x in expr[0])
                continue
        elif n.name == "cross_entropy_fused" and kernels.backend() == "numba":
            fn = w.bind("cross_entropy_fused", kernels.cross_entropy_call(len(n.outputs) > 2))
            expr = w.call(n, names).replace(w.bind(n.name, n.impl), fn, 1)
        elif kernels.backend() == "numba" and (kfn := op_kernels.lookup(n)) is not None:
            expr = w.call(n, names).split("(", 1)[1]
            expr = f"{w.bind(n.name + '_kernel', kfn)}({expr}"
        elif out_expr is not None:  # a small matmul into its planned buffer
            a, b = (names[id(x)] for x in n.inputs)
            expr = f"np.matmul({a}, {b}, out={out_expr})"
        elif memory.small_matmul(n):  # what backend.blas.matmul calls for this size
            a, b = (names[id(x)] for x in n.inputs)
            expr = f"np.matmul({a}, {b})"
        elif n.name == "permute" and n.op is not None and len(n.inputs[0].shape) == 2 and \
                tuple(n.params.get("dims", ())) in ((1, 0), (-1, -2), (1, -2), (-1, 0)):
            expr = f"{names[id(n.inputs[0])]}.T"
        else:
            expr = w.call(n, names)
        if not outs:  # an effect for its side effect only (an LR scheduler's step)
            lines.append(f"    {expr}")
        elif n.name.startswith("vjp_") or n.name == "optimizer_step" or len(outs) > 1:
            lines.append(f"    {', '.join(outs)}, = {expr}")
        elif len(outs) == 1 and not n.outputs[0].shape:
            lines.append(f"    {outs[0]} = asarray({expr})")
        else:
            lines.append(f"    {outs[0]} = {expr}")
    w.ns["set_grad"] = set_grad
    w.ns["set_data"] = set_data
    w.ns["set_grad_owned"] = set_grad_owned
    w.ns["recycle"] = recycle
    for k, (kind, t, label, v) in enumerate(graph.writes):
        val = "None" if v is None else w.arg(v, names)
        fn = "set_grad" if kind == "grad" else "set_data"
        if kind == "grad" and v is not None and id(v) in plan.owned:
            fn = "set_grad_owned"  # made fresh by this call and stored once: no copy
        lines.append(f"    {fn}(writes[{k}], {val})  # {label}")
    outs = [w.arg(v, names) for v in graph.outputs]
    lines.append(f"    return ({', '.join(outs)}{',' if len(outs) == 1 else ''})")
    head = f"def {name}(args, refs, writes):"
    source = "\n\n".join(w.kernels + [head + "\n" + "\n".join(lines)]) + "\n"
    exec(head + "\n" + "\n".join(lines), w.ns)  # noqa: S102 - the source is ours
    return source, w.ns[name]


def set_grad(t, array):
    """Store a gradient the way eager backward leaves it: a fresh tensor owning its data."""
    t.grad = None if array is None else _make(np.array(array))


def recycle(box, shape, dtype):
    """The array returned last time when nothing else holds it (memory.py), else a new one.
    Three references mean only ``box``, ``a`` and ``getrefcount``'s argument."""
    a = box[0]
    if a is None or sys.getrefcount(a) > 3:
        a = box[0] = np.empty(shape, dtype)
    return a


def set_grad_owned(t, array):
    """``set_grad`` for an array this call made and nothing else holds: no copy. The
    ``.grad`` setter's shape and dtype checks hold by the guards (the traced gradient of a
    tensor of the traced shape and dtype): it is skipped unless a subclass defines its own."""
    g = _make(array if type(array) is np.ndarray else np.asarray(array))
    if type(t).grad is _GRAD:
        t._grad = g
    else:
        t.grad = g


def set_data(t, array):
    """Write an in-place update of outside state back into the tensor's own array."""
    if array is not t._data:
        np.copyto(t._data, array)
    t._version[0] += 1
