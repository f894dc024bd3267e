"""The compiler's IR: a graph of SSA values with shapes and dtypes, one op record per node.

A ``Graph`` is data you can print (``print(graph)``, as a jaxpr or ``torch.fx``'s
``print_readable`` reads)::

    graph(%x: f64[512, 2], %W1: f64[32, 2] = ref Parameter, ...) {
      %3: f64[2, 32] = transpose(%W1, dim0=0, dim1=1)
      %4: f64[512, 32] = matmul(%x, %3)
      ...
      return (%9,)  writes: W1.grad <- %21
    }

- ``Value``: one SSA value (``%name``), its ``shape`` and numpy ``dtype``; produced by one
  ``Node`` (or a graph input, or a constant).
- ``Node``: one call of an op record (``ops.registry.Op``) or of a compiler-level op
  (``optimizer_step``, ``vjp``, ``fused``, ``full``): ``inputs`` (Values, or Python literals
  such as the ``2.0`` of ``x * 2.0``), ``params`` (the op's keyword arguments, frozen into a
  hashable tuple), ``outputs`` (Values). ``effect`` marks nodes with side effects outside
  the graph (the optimizer's in-place step): passes never drop or move them.
- ``Graph``: ``inputs`` (each with its ``source``: argument ``i``, a tensor held by
  reference, or the ``.grad`` of one), ``consts`` (Value -> array), ``nodes`` in program
  order, ``outputs`` and ``writes`` (values stored back into ``.grad`` attributes).

``evaluate(graph, arrays)`` runs a graph node by node on arrays: the reference the passes'
value check compares against (codegen.py produces the fast version of the same program).
"""
import itertools

import numpy as np

_DT = {"float64": "f64", "float32": "f32", "float16": "f16", "int64": "i64", "int32": "i32",
       "int16": "i16", "int8": "i8", "uint8": "u8", "bool": "bool", "bfloat16": "bf16"}


class Value:
    """One SSA value: ``%name: dtype[shape]``."""

    __slots__ = ("name", "shape", "dtype", "producer", "index")

    def __init__(self, name, shape, dtype, producer=None, index=0):
        self.name = name
        self.shape = tuple(shape)
        self.dtype = np.dtype(dtype)
        self.producer = producer  # the Node that makes it; None for inputs and constants
        self.index = index  # which output of the producer

    def type_str(self):
        return f"{_DT.get(self.dtype.name, self.dtype.name)}[{', '.join(map(str, self.shape))}]"

    def __repr__(self):
        return f"%{self.name}"


class Input:
    """Where a graph input comes from at run time."""

    __slots__ = ("kind", "index", "ref", "label")

    def __init__(self, kind, index=None, ref=None, label=""):
        self.kind = kind  # "arg" (positional tensor argument), "ref" (a tensor), "grad"
        self.index = index
        self.ref = ref  # the Tensor ("ref") or the leaf whose .grad it is ("grad")
        self.label = label

    def __repr__(self):
        if self.kind == "arg":
            return f"arg {self.index}"
        if self.kind == "hyper":
            return f"param_groups[{self.index}][{self.label!r}]"
        return f"{'ref' if self.kind == 'ref' else 'grad of'} {self.label}"


def freeze(v):
    """A hashable stand-in for a param value (lists -> tuples, slices/arrays -> tuples)."""
    if isinstance(v, (list, tuple)):
        return tuple(freeze(x) for x in v)
    if isinstance(v, slice):
        return ("slice", v.start, v.stop, v.step)
    if isinstance(v, dict):
        return tuple(sorted((k, freeze(x)) for k, x in v.items()))
    if isinstance(v, np.ndarray):
        return ("array", v.dtype.str, v.shape, v.tobytes())
    try:
        hash(v)
    except TypeError:
        return ("id", id(v))
    return v


class Node:
    """One op call: ``outputs = op(*inputs, **params)``."""

    __slots__ = ("op", "name", "inputs", "params", "outputs", "effect", "variadic", "impl",
                 "meta")

    def __init__(self, op, name, inputs, params, outputs, effect=False, variadic=False,
                 impl=None, meta=None):
        self.op = op  # an ops.registry.Op, or None for compiler-level nodes (see impl)
        self.name = name
        self.inputs = list(inputs)
        self.params = dict(params)
        self.outputs = list(outputs)
        self.effect = effect
        self.variadic = variadic  # the op takes its tensor inputs as one list (cat, stack)
        self.impl = impl  # compiler-level nodes: a callable over arrays
        self.meta = meta  # extra per-kind data (the fused body, the optimizer, ...)
        for i, v in enumerate(self.outputs):
            v.producer, v.index = self, i

    def key(self):
        """What CSE compares: op, inputs (Values by identity), frozen params."""
        ins = tuple(("v", id(a)) if isinstance(a, Value) else ("c", type(a).__name__, freeze(a))
                    for a in self.inputs)
        return (self.name, id(self.op) if self.op is not None else id(self.impl), ins,
                freeze(self.params), self.variadic)

    def values_in(self):
        return [a for a in self.inputs if isinstance(a, Value)]

    def __repr__(self):
        return format_node(self)


def _fmt_param(v):
    if isinstance(v, np.dtype) or type(v).__name__ == "dtype":
        return str(v)
    if isinstance(v, np.ndarray):
        return f"array{list(v.shape)}"
    if callable(v) and hasattr(v, "__name__"):
        return v.__name__
    r = repr(v)
    return r if len(r) <= 40 else r[:37] + "..."


def format_node(n):
    outs = ", ".join(f"%{v.name}: {v.type_str()}" for v in n.outputs)
    args = [repr(a) if isinstance(a, Value) else _fmt_param(a) for a in n.inputs]
    if n.variadic:
        args = ["[" + ", ".join(args) + "]"]
    args += [f"{k}={_fmt_param(v)}" for k, v in n.params.items()]
    text = f"{outs} = {n.name}({', '.join(args)})"
    if n.effect:
        text += "  # effect"
    if n.name == "fused" and n.meta is not None:
        body = "; ".join(format_node(m) for m in n.meta["nodes"])
        text += f"  {{ {body} }}"
    return text


class Graph:
    """A traced program: inputs, constants, nodes in program order, outputs, write-backs."""

    def __init__(self):
        self.inputs = []  # [(Value, Input)]
        self.consts = {}  # Value -> array
        self.nodes = []
        self.outputs = []  # [Value or literal]
        # [(kind, Tensor, label, Value or None)]: "grad": t.grad <- value (None: cleared);
        # "data": the value is copied into t's array (an in-place update of outside state)
        self.writes = []
        self.out_tree = None  # how to rebuild the function's return value
        self._names = itertools.count()

    def new_value(self, shape, dtype, hint=None):
        n = next(self._names)
        return Value(f"{hint}{n}" if hint else str(n), shape, dtype)

    def copy(self):
        """A shallow structural copy (Values and Nodes shared until a pass replaces them)."""
        g = Graph()
        g.inputs = list(self.inputs)
        g.consts = dict(self.consts)
        g.nodes = list(self.nodes)
        g.outputs = list(self.outputs)
        g.writes = list(self.writes)
        g.out_tree = self.out_tree
        g._names = self._names
        return g

    def used_values(self):
        """Values read by the outputs and write-backs (the roots DCE keeps alive)."""
        roots = [v for v in self.outputs if isinstance(v, Value)]
        roots += [v for _, _, _, v in self.writes if v is not None]
        return roots

    def __len__(self):
        return len(self.nodes)

    def count(self, name=None):
        return sum(1 for n in self.nodes if name is None or n.name == name)

    def __str__(self):
        ins = [f"%{v.name}: {v.type_str()}" + ("" if src.kind == "arg" else f" = {src!r}")
               for v, src in self.inputs]
        lines = ["graph(" + ", ".join(ins) + ") {"]
        for v, a in self.consts.items():
            lines.append(f"  %{v.name}: {v.type_str()} = constant")
        for n in self.nodes:
            lines.append("  " + format_node(n))
        outs = ", ".join(repr(v) if isinstance(v, Value) else _fmt_param(v)
                         for v in self.outputs)
        tail = f"  return ({outs}{',' if len(self.outputs) == 1 else ''})"
        if self.writes:
            tail += "  writes: " + ", ".join(
                f"{label}{'.grad' if kind == 'grad' else ''} <- {'None' if v is None else repr(v)}"
                for kind, _, label, v in self.writes)
        lines.append(tail)
        lines.append("}")
        return "\n".join(lines)

    print_readable = __str__


def producers(graph):
    """id(Value) -> the node of ``graph`` that makes it (inputs and constants have none)."""
    return {id(v): n for n in graph.nodes for v in n.outputs}


OUTSIDE = Node(None, "<outside>", [], {}, [])  # reads a graph's outputs and write-backs


def readers(graph):
    """id(Value) -> the nodes of ``graph`` reading it, in program order, each once (``mul(x,
    x)`` reads x once); the graph's outputs and write-backs are read by ``OUTSIDE``. The
    index the fusing passes match against: a value is private to a group of nodes when all
    its readers are in the group."""
    uses = {}
    for n in graph.nodes:
        for a in n.inputs:
            if isinstance(a, Value):
                lst = uses.setdefault(id(a), [])
                if not lst or lst[-1] is not n:
                    lst.append(n)
    for v in graph.used_values():
        uses.setdefault(id(v), []).append(OUTSIDE)
    return uses


def call_node(n, args):
    """Run one node on arrays (``args``: its inputs with Values replaced by arrays)."""
    if n.impl is not None:
        out = n.impl(*args, **n.params)
    elif n.variadic:
        out = n.op.forward(list(args), **n.params)
    else:
        out = n.op.forward(*args, **n.params)
    if len(n.outputs) == 1 and not isinstance(out, (tuple, list)):
        out = (out,)
    return [o if type(o) is np.ndarray else np.asarray(o) for o in out]


def evaluate(graph, arrays):
    """Run ``graph`` on ``arrays`` (one per graph input), node by node: the reference
    interpreter (the passes' value check). Returns ``(outputs, writes)`` as arrays."""
    env = {id(v): a for (v, _), a in zip(graph.inputs, arrays)}
    for v, a in graph.consts.items():
        env[id(v)] = a
    for n in graph.nodes:
        args = [env[id(a)] if isinstance(a, Value) else a for a in n.inputs]
        for v, o in zip(n.outputs, call_node(n, args)):
            env[id(v)] = o
    outs = [env[id(v)] if isinstance(v, Value) else v for v in graph.outputs]
    writes = [None if v is None else env[id(v)] for _, _, _, v in graph.writes]
    return outs, writes
