"""Look at the tape: a graph node by node, as a text table and as a Graphviz DOT file.

    loss = model(x).sum()
    print(tapegrad.viz.table(loss))      # op, gradient rule, shape, dtype, saved bytes, FLOPs
    tapegrad.viz.to_dot(loss, "graph.dot")
    tapegrad.viz.render(loss, "graph.svg")   # needs Graphviz's `dot` on PATH

Like torchviz's ``make_dot``, with the numbers: for every Node, the op, its gradient rule
(``grad_fn.name()``), the output's shape and dtype, the bytes it keeps alive for backward
(saved inputs and output; a buffer shared by two nodes is counted under each), its forward's
FLOPs and bytes from the op record (``Op.cost``) and their ratio, the arithmetic intensity.
Leaves that require grad are listed too (``AccumulateGrad`` in PyTorch's terms).

A compiled graph works the same way, before or after the compiler's passes::

    g = tapegrad.compiler.trace(step, x)
    print(tapegrad.viz.table(g))                   # one row per IR node, with its FLOPs
    print(tapegrad.viz.table(tapegrad.compiler.passes.optimize(g)))
    print(tapegrad.viz.compare(g))                 # nodes, kernels, FLOPs, bytes: before/after

A fused kernel is one row: its FLOPs are its body's, its bytes only its inputs and outputs,
so the intensity a fusion gains is in the table.
"""
import os
import shutil
import subprocess

from tapegrad.autograd.engine import Node, Meta, toposort
from tapegrad.backend import xp
from tapegrad.profiler.timing import _Shape, _array


def _roots(outputs):
    from tapegrad.tensor import Tensor

    if isinstance(outputs, (Tensor, Node)):
        outputs = [outputs]
    return [t if isinstance(t, Node) else t.grad_fn for t in outputs
            if isinstance(t, Node) or t.grad_fn is not None]


def _saved_bytes(node):
    # a saved input has a version to check; the others are stand-ins (a producer, a Meta)
    versions = node.versions or ()
    kept = [a for a, v in zip(node.saved or (), versions) if v is not None]
    seen, total = set(), 0
    for a in kept + ([node.out] if node.out is not None else []):
        data = getattr(a, "_data", a)
        if isinstance(data, xp.ndarray) and id(data) not in seen:
            seen.add(id(data))
            total += data.nbytes
    return total


def nodes(outputs):
    """One dict per Node behind ``outputs`` (inputs first), then one per leaf: ``id``,
    ``op``, ``grad_fn``, ``shape``, ``dtype``, ``saved_bytes``, ``flops``, ``bytes``,
    ``intensity``, ``inputs`` (ids of the producers). ``outputs`` may also be a compiled
    graph (``tapegrad.compiler.trace``, before or after ``passes.optimize``): see
    ``graph_nodes``."""
    from tapegrad.tensor import Tensor

    if _is_graph(outputs):
        return graph_nodes(outputs)
    order = list(reversed(toposort(_roots(outputs))))
    ids = {id(n): f"n{i}" for i, n in enumerate(order)}
    rows, leaves = [], {}
    for node in order:
        inputs = []
        for p in node.parents:
            if isinstance(p, Tensor):
                leaves.setdefault(id(p), p)
                inputs.append(f"leaf{list(leaves).index(id(p))}")
            elif p is not None:
                inputs.append(ids[id(p)])
        saved = node.saved
        flops = nbytes = None
        if saved is not None:
            arrays = [_array(a) if not isinstance(a, Meta) else a for a in saved]
            try:
                flops, read, written = node.op.cost(arrays, _Shape(node.shape, node.dtype),
                                                    node.params)
                nbytes = read + written
            except (KeyError, TypeError, AttributeError, IndexError):
                pass  # a variadic op saves its inputs flat: its cost needs the forward's list
        rows.append({"id": ids[id(node)], "op": node.op.name, "grad_fn": node.name(),
                     "shape": tuple(node.shape), "dtype": str(node.dtype),
                     "saved_bytes": _saved_bytes(node), "flops": flops, "bytes": nbytes,
                     "intensity": flops / nbytes if flops is not None and nbytes else None,
                     "inputs": inputs})
    for i, leaf in enumerate(leaves.values()):
        rows.append({"id": f"leaf{i}", "op": "leaf", "grad_fn": "AccumulateGrad",
                     "shape": tuple(leaf.shape), "dtype": str(leaf._data.dtype),
                     "saved_bytes": 0, "flops": None, "bytes": None, "intensity": None,
                     "inputs": []})
    return rows


# --- compiled graphs (tapegrad.compiler's IR) ----------------------------------------------
def _is_graph(x):
    from tapegrad.compiler.ir import Graph

    return isinstance(x, Graph)


class _Strided:
    """A value as the cost rules read it, with the stride-0 dims of a broadcast."""

    __slots__ = ("shape", "dtype", "strides")

    def __init__(self, shape, dtype, strides):
        self.shape, self.dtype, self.strides = shape, dtype, strides


def _operand(a):
    """A graph value as an op's cost rule reads it: the output of a ``broadcast_to``/``expand``
    (a view, as in eager) keeps its source's elements only (stride 0 on the broadcast dims)."""
    from tapegrad.compiler.ir import Value

    if not isinstance(a, Value):
        return a
    n = a.producer
    if n is None or n.op is None or n.name not in ("broadcast_to", "expand"):
        return a
    src = n.inputs[0]
    if not hasattr(src, "shape"):
        return a
    lead = len(a.shape) - len(src.shape)
    strides = tuple(0 if i < lead or (src.shape[i - lead] == 1 and d != 1) else 1
                    for i, d in enumerate(a.shape))
    return _Strided(a.shape, a.dtype, strides)


def _node_cost(n):
    """(FLOPs, bytes read, bytes written) of one graph node from its op record; a fused
    kernel's FLOPs are its body's, its bytes only what crosses the kernel's boundary (its
    inputs and outputs: the intermediates stay in the kernel). Nones where no op record counts
    it (vjp, optimizer)."""
    from tapegrad.ops.registry import read_bytes, written_bytes

    if n.name == "fused" and n.meta is not None:
        body = list(n.meta.get("nodes", ())) + list(n.meta.get("reduce", ()))
        costs = [_node_cost(m) for m in body]
        if any(c[0] is None for c in costs):
            return None, None, None
        ins = [_operand(a) for a in n.inputs]
        return sum(c[0] for c in costs), read_bytes(ins), written_bytes(n.outputs)
    if n.op is None:
        return None, None, None
    args = [_operand(a) for a in n.inputs]
    if n.variadic:
        args = [args]
    out = n.outputs[0] if len(n.outputs) == 1 else tuple(n.outputs)
    try:
        return n.op.cost(args, out, n.params)
    except (KeyError, TypeError, AttributeError, IndexError, ValueError):
        return None, None, None


def graph_nodes(graph):
    """``nodes`` of a compiled graph (``tapegrad.compiler.ir.Graph``): one row per graph
    input (op ``input``; its source, such as ``arg 0`` or ``ref W1``, as ``grad_fn``) and
    constant, then one per node in program order with ``grad_fn`` "-" (a compiled graph
    records no tape; a joint graph's gradient computations are its own nodes) and
    ``saved_bytes`` None. Each ``fused`` kernel is one row whose bytes are its inputs and
    outputs only, so fusion shows as fewer bytes and a higher intensity."""
    from tapegrad.compiler.ir import Value, format_node

    rows, ids = [], {}

    def name(v):
        return "%" + v.name

    for v, src in graph.inputs:
        ids[id(v)] = name(v)
        rows.append({"id": name(v), "op": "input", "grad_fn": repr(src),
                     "shape": tuple(v.shape), "dtype": str(v.dtype), "saved_bytes": None,
                     "flops": None, "bytes": None, "intensity": None, "inputs": []})
    for v in graph.consts:
        ids[id(v)] = name(v)
        rows.append({"id": name(v), "op": "constant", "grad_fn": "-", "shape": tuple(v.shape),
                     "dtype": str(v.dtype), "saved_bytes": None, "flops": None,
                     "bytes": None, "intensity": None, "inputs": []})
    for n in graph.nodes:
        flops, read, written = _node_cost(n)
        nbytes = None if flops is None else read + written
        first = n.outputs[0] if n.outputs else None
        row_id = name(first) if first is not None else f"effect{len(rows)}"
        for v in n.outputs:
            ids[id(v)] = row_id
        op = n.name
        if n.name == "fused" and n.meta is not None:
            op = "fused[" + ",".join(m.name for m in n.meta.get("nodes", ())) + "]"
        rows.append({"id": row_id, "op": op, "grad_fn": "-",
                     "shape": tuple(first.shape) if first is not None else (),
                     "dtype": str(first.dtype) if first is not None else "-",
                     "saved_bytes": None, "flops": flops, "bytes": nbytes,
                     "intensity": flops / nbytes if flops is not None and nbytes else None,
                     "inputs": [ids[id(a)] for a in n.inputs
                                if isinstance(a, Value) and id(a) in ids],
                     "text": format_node(n)})
    return rows


def compare(graph, passes=None) -> str:
    """A compiled graph before and after the compiler's passes (``passes``: the
    ``(name, function)`` list, the compiler's own by default), side by side in numbers: nodes,
    fused kernels, FLOPs and bytes moved, then the table of the optimised graph.

    >>> print(tapegrad.viz.compare(tapegrad.compiler.trace(step, x)))
    """
    from tapegrad.compiler import passes as P

    log = []
    after = P.optimize(graph, P.PASSES if passes is None else passes, log=log)

    def totals(g):
        rows = [r for r in graph_nodes(g) if r["op"] not in ("input", "constant")]
        return (len(rows), sum(r["op"].startswith("fused") for r in rows),
                sum(r["flops"] or 0 for r in rows), sum(r["bytes"] or 0 for r in rows))

    b, a = totals(graph), totals(after)
    lines = ["           nodes  kernels         FLOPs    bytes moved  FLOP/B"]
    for label, t in (("before", b), ("after", a)):
        lines.append(f"{label:<8}{t[0]:>8}{t[1]:>9}{t[2]:>14,}{t[3]:>15,}"
                     f"{(t[2] / t[3] if t[3] else 0):>8.2f}")
    lines.append("passes: " + ", ".join(f"{n} {x}->{y}" for n, x, y in log))
    return "\n".join(lines) + "\n\n" + table(after)


def _num(x, fmt="{:,}"):
    return "-" if x is None else fmt.format(x)


def table(outputs) -> str:
    """The graph behind ``outputs`` as a text table, inputs first."""
    cols = ["id", "op", "gradient rule", "shape", "dtype", "saved B", "FLOPs", "bytes",
            "FLOP/B", "inputs"]
    lines = [[r["id"], r["op"], r["grad_fn"], str(r["shape"]), r["dtype"],
              _num(r["saved_bytes"]), _num(r["flops"]), _num(r["bytes"]),
              _num(r["intensity"], "{:.2f}"), ",".join(r["inputs"])] for r in nodes(outputs)]
    widths = [max(len(c), *(len(x[i]) for x in lines)) if lines else len(c)
              for i, c in enumerate(cols)]
    fmt = lambda x: "  ".join(s.ljust(w) for s, w in zip(x, widths)).rstrip()  # noqa: E731
    rows = nodes(outputs)
    saved = sum(r["saved_bytes"] or 0 for r in rows)
    flops = sum(r["flops"] or 0 for r in rows)
    return "\n".join([fmt(cols), fmt(["-" * w for w in widths])] + [fmt(x) for x in lines]
                     + [f"{len(rows)} nodes; {saved:,} bytes saved for backward; "
                        f"{flops:,} forward FLOPs"])


def to_dot(outputs, path=None) -> str:
    """The graph as Graphviz DOT source (written to ``path`` when given)."""
    out = ["digraph tape {", '  rankdir=BT; node [shape=box, fontname="Helvetica", '
           'fontsize=10];']
    for r in nodes(outputs):
        if r["op"] in ("leaf", "input", "constant"):
            label = f"{r['op']}\\n{r['shape']} {r['dtype']}"
            out.append(f'  "{r["id"]}" [label="{label}", style=filled, fillcolor=lightblue];')
        else:
            label = (f"{r['op']}\\n{r['grad_fn']}\\n{r['shape']} {r['dtype']}\\n"
                     f"saved {_num(r['saved_bytes'])} B\\nFLOPs {_num(r['flops'])}, "
                     f"{_num(r['intensity'], '{:.2f}')} FLOP/B")
            out.append(f'  "{r["id"]}" [label="{label}"];')
        for i in r["inputs"]:
            out.append(f'  "{i}" -> "{r["id"]}";')
    out.append("}")
    text = "\n".join(out) + "\n"
    if path is not None:
        with open(path, "w") as f:
            f.write(text)
    return text


def render(outputs, path="tape.svg"):
    """Render the graph to SVG or PNG (by ``path``'s extension) with Graphviz's ``dot``; if
    it is not installed, raises naming the DOT file written instead."""
    fmt = os.path.splitext(path)[1].lstrip(".") or "svg"
    if fmt not in ("svg", "png", "pdf"):
        raise ValueError(f"viz.render: {path!r}: the format must be svg, png or pdf")
    dot_path = os.path.splitext(path)[0] + ".dot"
    source = to_dot(outputs, dot_path)
    exe = shutil.which("dot")
    if exe is None:
        raise RuntimeError(f"viz.render: Graphviz's `dot` is not on PATH; the DOT source is in "
                           f"{dot_path} (render it with `dot -T{fmt} {dot_path} -o {path}`)")
    subprocess.run([exe, f"-T{fmt}", "-o", path], input=source, text=True, check=True)
    return path


__all__ = ["nodes", "graph_nodes", "compare", "table", "to_dot", "render"]
