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
    ``intensity``, ``inputs`` (ids of the producers)."""
    from tapegrad.tensor import Tensor

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
    saved = sum(r["saved_bytes"] for r in rows)
    flops = sum(r["flops"] or 0 for r in rows)
    return "\n".join([fmt(cols), fmt(["-" * w for w in widths])] + [fmt(x) for x in lines]
                     + [f"{len(rows)} nodes; {saved:,} bytes saved for backward; "
                        f"{flops:,} forward FLOPs"])


def to_dot(outputs, path=None) -> str:
    """The graph as Graphviz DOT source (written to ``path`` when given)."""
    out = ["digraph tape {", '  rankdir=BT; node [shape=box, fontname="Helvetica", '
           'fontsize=10];']
    for r in nodes(outputs):
        if r["op"] == "leaf":
            label = f"leaf\\n{r['shape']} {r['dtype']}"
            out.append(f'  {r["id"]} [label="{label}", style=filled, fillcolor=lightblue];')
        else:
            label = (f"{r['op']}\\n{r['grad_fn']}\\n{r['shape']} {r['dtype']}\\n"
                     f"saved {_num(r['saved_bytes'])} B\\nFLOPs {_num(r['flops'])}, "
                     f"{_num(r['intensity'], '{:.2f}')} FLOP/B")
            out.append(f'  {r["id"]} [label="{label}"];')
        for i in r["inputs"]:
            out.append(f"  {i} -> {r['id']};")
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


__all__ = ["nodes", "table", "to_dot", "render"]
