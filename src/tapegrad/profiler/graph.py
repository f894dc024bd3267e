"""Profile a compiled graph kernel by kernel: where the roofline bound moves when the compiler
fuses.

    g = tapegrad.compiler.trace(step)                  # the step's graph (runs it once)
    fused = tapegrad.compiler.passes.optimize(g)
    with tapegrad.profiler.profile() as before:
        tapegrad.profiler.graph.run(g)                 # one event per op node
    with tapegrad.profiler.profile() as after:
        tapegrad.profiler.graph.run(fused)             # one event per kernel
    before.roofline(); after.roofline()

``run`` executes a graph node by node, as the compiler's reference interpreter does
(``compiler.ir.call_node``: each op's numpy forward, a fused kernel's numpy body), reading its
inputs where the graph says they live (arguments, tensors held by reference, ``.grad``,
optimizer hyperparameters) and storing its write-backs (``.grad``, in-place parameter updates)
as the generated code does, so it is one real step. Every node is an event (kind "kernel") in
the profilers open in this thread, with FLOPs and bytes from the op records
(``tapegrad.viz.graph_nodes``): a fused kernel's FLOPs are its body's and its bytes only what
crosses its boundary, so the intensity fusion gains is measured, not assumed.

What it does not time is the generated code itself (``tapegrad.compile``'s function): that
code calls numpy and its kernels directly, from a namespace the profiler cannot watch without
a hook in the compiler's code generator. The node-by-node run executes the same kernels' numpy
bodies (not numba's loop nests, where that backend compiles one) and adds one Python call per
node.
"""
import math
import time

from tapegrad.ops import registry
from tapegrad.profiler.timing import _active, _shapes


def inputs(graph, args=()):
    """The arrays of ``graph``'s inputs: ``args`` (the traced call's positional arguments) for
    argument inputs, the live tensors for the others (their ``.grad`` for grad inputs)."""
    arrays = []
    for v, src in graph.inputs:
        if src.kind == "arg":
            arrays.append(args[src.index]._data)
        elif src.kind == "array":
            arrays.append(args[src.index])
        elif src.kind == "ref":
            arrays.append(src.ref._data)
        elif src.kind == "hyper":
            arrays.append(src.ref[src.label])
        else:
            g = src.ref.grad
            if g is None:
                raise RuntimeError(f"profiler.graph.run: input %{v.name} is the .grad of "
                                   f"{src.label}, which is None now")
            arrays.append(g._data)
    return arrays


def _cost(n):
    """(FLOPs, bytes read, bytes written) of a node; nodes no op record counts (vjp,
    optimizer, the fused cross entropy) get 0 FLOPs and their boundary bytes."""
    from tapegrad.viz import _node_cost, _operand

    flops, read, written = _node_cost(n)
    if flops is None:
        return (0, registry.read_bytes([_operand(a) for a in n.inputs]),
                registry.written_bytes(n.outputs))
    return flops, read, written


def _name(n):
    if n.name == "fused" and n.meta is not None:
        return "fused[" + ",".join(m.name for m in n.meta.get("nodes", ())) + "]"
    return n.name


def run(graph, args=(), observe=None):
    """Run ``graph`` (``tapegrad.compiler.ir.Graph``) once, node by node, each node an event
    of the profilers open in this thread; returns the outputs' arrays (see the module doc).
    ``observe(node, input_arrays, seconds)`` is called after each node when given."""
    from tapegrad.compiler import codegen
    from tapegrad.compiler.ir import Value, call_node

    profilers = _active()
    env = {id(v): a for (v, _), a in zip(graph.inputs, inputs(graph, args))}
    env.update({id(v): a for v, a in graph.consts.items()})
    for n in graph.nodes:
        vals = [env[id(a)] if isinstance(a, Value) else a for a in n.inputs]
        name = _name(n)
        events = [p._begin(name, "kernel") for p in profilers]
        t0 = time.perf_counter_ns()
        outs = call_node(n, vals)
        t1 = time.perf_counter_ns()
        for p, e in zip(profilers, events):
            e.start_ns = t0
            p._end(name)
            e.end_ns = t1  # the kernel alone, not the bookkeeping around it
        for v, o in zip(n.outputs, outs):
            env[id(v)] = o
        if observe is not None:
            observe(n, vals, (t1 - t0) * 1e-9)
        if events:
            flops, read, written = _cost(n)
            shapes = _shapes([a for a in vals if hasattr(a, "shape")])
            dtypes = [str(v.dtype) for v in n.outputs] or ["-"]
            for p, e in zip(profilers, events):
                e.flops, e.bytes_read, e.bytes_written = flops, read, written
                e.dtypes = dtypes
                if p.record_shapes:
                    e.input_shapes = shapes
    for kind, t, _, v in graph.writes:
        array = None if v is None else env[id(v)]
        (codegen.set_grad if kind == "grad" else codegen.set_data)(t, array)
    return [env[id(v)] if isinstance(v, Value) else v for v in graph.outputs]


class KernelFusion:
    """One fused kernel of a step, fused and unfused: ``name``, ``calls``; ``flops``;
    ``fused_bytes``/``unfused_bytes`` (its body's ops one by one each read and write their
    operands); ``fused_seconds``/``unfused_seconds`` (the same inputs, the body's ops run one
    by one); ``fused_bound``/``unfused_bound`` (``roofline.classify``); ``body`` (op names)."""

    __slots__ = ("name", "body", "dtype", "calls", "flops", "fused_bytes", "unfused_bytes",
                 "fused_seconds", "unfused_seconds", "fused_bound", "unfused_bound",
                 "unfused_ops")

    def __init__(self, name, body, dtype):
        self.name, self.body, self.dtype = name, body, dtype
        self.calls = self.flops = self.fused_bytes = self.unfused_bytes = 0
        self.fused_seconds = self.unfused_seconds = 0.0
        self.fused_bound = self.unfused_bound = None
        self.unfused_ops = 0

    fused_intensity = property(lambda self: self.flops / self.fused_bytes
                               if self.fused_bytes else math.inf)
    unfused_intensity = property(lambda self: self.flops / self.unfused_bytes
                                 if self.unfused_bytes else math.inf)
    moved = property(lambda self: self.fused_bound != self.unfused_bound)

    def __repr__(self):
        return (f"KernelFusion({self.name!r}, {self.unfused_bound} -> {self.fused_bound}, "
                f"{self.unfused_intensity:.2f} -> {self.fused_intensity:.2f} FLOP/B)")


def fusion(graph, args=(), passes=None, ceilings=None, repeats=3):
    """Every fused kernel of ``graph`` after the compiler's passes (``passes``: ``(name,
    function)`` pairs, the compiler's own by default), measured fused and unfused on the same
    inputs: a list of ``KernelFusion`` (the bound of each, before and after), and the
    ``Roofline`` of the optimised graph's run. The graph runs ``repeats`` times after one
    warm-up run; each run is a real step (a training step's graph updates the parameters)."""
    from tapegrad.compiler import passes as P
    from tapegrad.compiler.ir import call_node
    from tapegrad.profiler.roofline import Roofline, classify, load_ceilings, rows_of
    from tapegrad.profiler.timing import profile

    ceilings = ceilings or load_ceilings()
    optimized = P.optimize(graph, P.PASSES if passes is None else passes)
    kernels = {}
    measuring = [False]

    def observe(n, vals, seconds):
        if n.name != "fused" or n.meta is None or not measuring[0]:
            return
        body = list(n.meta.get("nodes", ())) + list(n.meta.get("reduce", ()))
        k = kernels.get(id(n))
        if k is None:
            k = kernels[id(n)] = KernelFusion(_name(n), [m.name for m in body],
                                              str(n.outputs[0].dtype))
            k.flops, read, written = _cost(n)
            k.fused_bytes = read + written
            k.unfused_bytes = sum(sum(_cost(m)[1:]) for m in body)
            k.unfused_ops = len(body)
        k.calls += 1
        k.fused_seconds += seconds
        env = {id(v): a for v, a in zip(n.inputs, vals)}
        for m in body:  # the same ops on the same arrays, one call each, as eager runs them
            xs = [env.get(id(a), a) for a in m.inputs]
            t0 = time.perf_counter_ns()
            out = call_node(m, xs)
            k.unfused_seconds += (time.perf_counter_ns() - t0) * 1e-9
            for v, o in zip(m.outputs, out):
                env[id(v)] = o

    run(optimized, args)
    measuring[0] = True
    with profile() as prof:
        for _ in range(repeats):
            run(optimized, args, observe)
    for k in kernels.values():
        calls = max(k.calls, 1)
        k.fused_bound = classify(k.flops * calls, k.fused_bytes * calls, k.fused_seconds,
                                 calls, ceilings, k.dtype)[0]
        # unfused: one op call per body op, each paying its own roof and dispatch
        k.unfused_bound = classify(k.flops * calls, k.unfused_bytes * calls,
                                   k.unfused_seconds, calls * k.unfused_ops, ceilings,
                                   k.dtype)[0]
    events = [e for e in prof.events() if e.kind == "kernel"]
    return list(kernels.values()), Roofline(rows_of(events, ceilings), ceilings)


def fusion_table(kernels):
    """``fusion``'s kernels as a table: intensity and bound unfused (one op call per body op)
    and fused (one kernel call). The times are the numpy reference runs (see the module doc);
    the bound is ``roofline.classify``'s, from FLOPs, bytes and calls."""
    lines = [f"{'kernel':<34}{'calls':>6}{'unfused FLOP/B':>16}  {'bound':<15}"
             f"{'fused FLOP/B':>13}  {'bound':<15}{'bytes saved':>12}"]
    for k in sorted(kernels, key=lambda k: -(k.unfused_bytes - k.fused_bytes)):
        lines.append(f"{k.name[:33]:<34}{k.calls:>6}{k.unfused_intensity:>16.2f}  "
                     f"{k.unfused_bound:<15}{k.fused_intensity:>13.2f}  {k.fused_bound:<15}"
                     f"{1 - k.fused_bytes / k.unfused_bytes:>12.0%}"
                     + ("  <- moved" if k.moved else ""))
    lines.append(f"{sum(k.moved for k in kernels)} of {len(kernels)} kernels changed bound "
                 "when fused")
    return "\n".join(lines)


__all__ = ["run", "inputs", "fusion", "fusion_table", "KernelFusion"]
