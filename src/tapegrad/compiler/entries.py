"""Cache entries of a compiled function: one traced graph each, with its guards.

``Entry`` runs a graph made of the whole call; ``SplitEntry`` runs the pieces between the
value reads that split a trace, replaying the Python between them; ``TailEntry`` runs a
training step whose value reads all come after its last op, replaying only that tail.
"""
import weakref

import numpy as np

from tapegrad.compiler.pipeline import lower
from tapegrad.compiler.ir import Graph, Input, Node, Value
from tapegrad.compiler.guards import _arg_places, _resolve
from tapegrad.compiler.replay import _Diverged, _Replay, _TailReplay
from tapegrad.compiler.tracer import (_sgd_key)
from tapegrad.tensor import Tensor


class Entry:
    """One compiled graph and the guards under which it is valid."""

    def __init__(self, spec, modes, training, graph, tracer):
        self.spec = spec
        self.modes = modes
        self.training = training
        self.state = None  # a StateGuard (None: the call's Python reruns, as in a replay)
        self.refs = [src.ref if src.kind in ("ref", "grad") else None
                     for _, src in graph.inputs]
        # tensors the trace met as the call's arguments (and their gradients) are named by
        # position, resolved at each call: a fresh leaf of the same spec is the same graph
        self.arg_places = _arg_places(tracer.args, getattr(tracer, "kwargs", None))
        owners = tracer.grad_owner  # id(a gradient alive before the call) -> its leaf
        checks = []
        for kind, obj, expected in tracer.guards:
            if kind == "tensor" and obj.kind == "ref":
                if id(obj.ref) not in self.arg_places:  # (an argument's spec is the key's)
                    checks.append(("ref", obj.ref, expected))
            elif kind == "grad":
                place = self.arg_places.get(id(obj))
                checks.append(("grad", obj if place is None else place + (False,), expected))
            elif kind == "hyper":  # a traced SGD step: its group's other hyperparameters
                checks.append(("hyper", obj, expected))
        self.checks = checks
        self.writes = [t for _, t, _, _ in graph.writes]
        # (write index, version bumps beyond the write-back's one) where eager bumped a
        # written tensor's counter another number of times (a ``.data`` write: none)
        self.bumps = tuple(sorted(tracer.extra_bumps.items()))
        self.places = []  # (0: refs / 1: writes, position, place)
        for i, (_, src) in enumerate(graph.inputs):
            if src.kind in ("ref", "grad") and id(src.ref) in self.arg_places:
                self.places.append((0, i, self.arg_places[id(src.ref)] + (False,)))
        for k, (kind, t, _, _) in enumerate(graph.writes):
            owner = owners.get(id(t)) if kind == "data" else None
            if kind == "data" and owner is not None and owner.grad is t:
                # a gradient written in place (zero_grad(set_to_none=False)): whichever
                # tensor is the leaf's .grad when the call starts, as eager writes it
                self.places.append((1, k, self.arg_places.get(id(owner), ("t", owner)) +
                                    (True,)))
            elif id(t) in self.arg_places:
                self.places.append((1, k, self.arg_places[id(t)] + (False,)))
        self.graph = graph
        self.log = []
        self.source = None
        self.run = None
        self.joint = None

    def bind(self, args, kwargs=None):
        """``(refs, writes)`` of this call: the tensors named by argument position resolved."""
        if not self.places:
            return self.refs, self.writes
        lists = (list(self.refs), list(self.writes))
        for which, k, place in self.places:
            lists[which][k] = _resolve(place, args, kwargs)
        return lists

    def here(self, t, args, kwargs=None):
        """The tensor of this call that stands where the traced call had ``t``."""
        place = self.arg_places.get(id(t))
        return t if place is None else _resolve(place + (False,), args, kwargs)

    def check(self, spec, modes, training, args=(), kwargs=None):
        if spec != self.spec or modes != self.modes or training != self.training:
            return False
        for kind, t, expected in self.checks:
            if type(t) is tuple:  # the gradient of an argument
                if not _grad_as_traced(_resolve(t, args, kwargs).grad, expected):
                    return False
                continue
            if kind == "ref":
                d = t._data
                if d.shape != expected[0] or d.dtype != expected[1] or \
                        t._requires_grad != expected[2]:
                    return False
            elif kind == "hyper":
                if _sgd_key(t) != expected:
                    return False
            elif not _grad_as_traced(t.grad, expected):
                return False
        return self.state is None or self.state.check()


def _grad_as_traced(g, expected):
    """A ``.grad`` guard: None as in the trace, or of the traced (shape, dtype)."""
    if g is None or expected is None:
        return g is None and expected is None
    return g._data.shape == expected[0] and g._data.dtype == expected[1]


def _guard_label(t):
    if type(t) is tuple:  # a place: the call's argument (by position or keyword)
        return f"argument {t[1]!r}"
    return f"{type(t).__name__}{list(t.shape)}@{id(t) % 10007}"


def _check_inputs(graph, args):
    arrays = []
    for v, src in graph.inputs:
        if src.kind == "arg":
            arrays.append(np.array(args[src.index]._data))
        elif src.kind == "ref":
            arrays.append(np.array(src.ref._data))
        elif src.kind == "grad" and src.ref.grad is not None:
            arrays.append(np.array(src.ref.grad._data))
        elif src.kind == "hyper":
            arrays.append(src.ref[src.label])
        else:
            arrays.append(np.ones(v.shape, v.dtype))
    return arrays


def _splittable(graph, tracer):
    """Pieces replay forward work only: no backward, effects, write-backs, random draws, or
    op results that need grad (their tape would be missing)."""
    if tracer.n_backward or graph.writes or tracer.mutated or tracer.wrote:
        return False
    if any(n.effect for n in graph.nodes):
        return False
    made = {id(v) for n in graph.nodes for v in n.outputs}
    return all(src.kind in ("arg", "ref", "grad") for _, src in graph.inputs) and \
        not any(t._requires_grad for t, v, _ in tracer.tmap.values() if id(v) in made)


class SplitEntry(Entry):
    """A function whose value reads (``.item()``, ``bool(t)``...) split it: each stretch of ops
    between reads is one compiled piece. Each call runs the function's Python again under
    ``_Replay``: ops that match the recorded ones return placeholder tensors, and when the
    ops of a piece are all issued (just before the read) its generated code runs and fills
    them; the read then sees real values. Any divergence (another branch taken, an op not
    seen when recording) evaluates what was issued so far and finishes the call eagerly."""

    def __init__(self, spec, modes, training, graph, tracer, passes_, name):
        super().__init__(spec, modes, training, graph, tracer)
        bounds = sorted({k for k, _, _ in tracer.splits if 0 < k < len(graph.nodes)})
        # a Python number operand after a read (``y * v`` with v = t.item()) is an input of
        # its piece, read from ``self.slots`` at each call (a weak scalar, as in eager)
        self.slots = {}
        self.slot_values = set()
        nodes = []
        for k, n in enumerate(graph.nodes):
            if bounds and k >= bounds[0] and any(type(a) in (float, int) for a in n.inputs):
                ins = []
                for a in n.inputs:
                    if type(a) in (float, int):
                        v = graph.new_value((), np.float64 if type(a) is float else np.int64,
                                            "s")
                        self.slots[v.name] = a
                        self.slot_values.add(id(v))
                        graph.inputs.append((v, Input("hyper", index=0, ref=self.slots,
                                                      label=v.name)))
                        a = v
                    ins.append(a)
                n = Node(n.op, n.name, ins, n.params, n.outputs, n.effect, n.variadic,
                         n.impl, n.meta)
            nodes.append(n)
        graph.nodes = nodes
        bounds.append(len(nodes))
        self.ends = set(bounds)
        reads = {id(v) for _, v, _ in tracer.splits if v is not None}
        seg_of, pieces, start = {}, [], 0
        for b in bounds:
            pieces.append(nodes[start:b])
            for n in nodes[start:b]:
                for v in n.outputs:
                    seg_of[id(v)] = len(pieces) - 1
            start = b
        needed = [dict() for _ in pieces]
        for k, ns in enumerate(pieces):
            for n in ns:
                for a in n.values_in():
                    j = seg_of.get(id(a))
                    if j is not None and j != k:
                        needed[j][id(a)] = a
        for v in [v for v in graph.outputs if isinstance(v, Value)]:
            if id(v) in seg_of:
                needed[seg_of[id(v)]][id(v)] = v
        for n in nodes:
            for v in n.outputs:
                if id(v) in reads:
                    needed[seg_of[id(v)]][id(v)] = v
        consts = {id(v) for v in graph.consts}
        self.pieces, sources, self.graphs = [], [], []
        for k, ns in enumerate(pieces):
            made = {id(v) for n in ns for v in n.outputs}
            ins, seen = [], set()
            for n in ns:
                for a in n.values_in():
                    if id(a) not in made and id(a) not in consts and id(a) not in seen and \
                            id(a) not in self.slot_values:
                        seen.add(id(a))
                        ins.append(a)
            g = Graph()
            g._names = graph._names
            g.inputs = [(v, Input("array", index=j)) for j, v in enumerate(ins)]
            g.inputs += [(v, src) for v, src in graph.inputs if src.kind == "hyper" and
                         any(x is v for n in ns for x in n.inputs)]
            g.consts = {v: a for v, a in graph.consts.items()
                        if any(x is v for n in ns for x in n.inputs)}
            g.nodes = list(ns)
            g.outputs = list(needed[k].values())
            g, src, run = lower(g, passes_, f"{name}_piece{k}", log=self.log)
            sources.append(src)
            self.graphs.append(g)
            self.pieces.append((ins, list(needed[k].values()), run))
        self.source = "\n".join(sources)
        self.graph = graph
        self.n_replays = self.n_fallbacks = 0  # calls run as pieces; of those, gone eager

    def replay(self, fn, args, kwargs=None):
        kwargs = kwargs or {}
        mode = _Replay(self, args, kwargs)
        try:
            try:
                with mode:
                    result = fn(*args, **kwargs)
                mode.flush_end()
            finally:
                mode.restore()
        except Exception:
            if mode.fallen:
                raise  # raised by the eager rest of the call: the function's own error
            # library Python read a placeholder not yet computed (an index's bounds check
            # on a computed index): the pieces are pure, so the call reruns eagerly (exact)
            self.n_fallbacks += 1
            return fn(*args, **kwargs)
        self.n_replays += 1
        self.n_fallbacks += mode.fallen
        return result


def _tail_reads(graph, tracer):
    """Every value read came after the last op (``loss.item()`` once the optimizer stepped):
    the whole call is one graph, its reads served after it ran (``TailEntry``)."""
    n = len(graph.nodes)
    return tracer.tail_ok and tracer.joint is None and \
        all(k == n for k, _, _ in tracer.splits) and \
        all(src.kind in ("arg", "ref", "hyper") for _, src in graph.inputs)


class TailEntry(Entry):
    """A training step whose value reads (``loss.item()``, ``float(loss)``) all come after
    its last op. Each call reruns the function's Python under ``_TailReplay``: ops return
    placeholders, ``backward()``, ``optimizer.step()`` and scheduler steps are skipped (the
    graph does them), and at the first read (or at the end) the whole compiled graph runs,
    with its write-backs, and fills the placeholders the reads see. Nothing real happens
    before that point, so a call whose Python diverges from the trace is run again eagerly
    from its start (exact; Python side effects before the divergence happen twice)."""

    def __init__(self, spec, modes, training, graph, tracer, passes_, name):
        super().__init__(spec, modes, training, graph, tracer)
        self.spans = tracer.spans
        self.rg_values = tracer.rg_values
        self.slots, self.slot_values, self.ends = {}, set(), set()
        full = graph.copy()
        seen = {id(v) for v in full.outputs if isinstance(v, Value)}
        for _, v, _ in tracer.splits:
            if v is not None and id(v) not in seen and v not in graph.consts:
                seen.add(id(v))
                full.outputs.append(v)
        self.out_values = list(full.outputs)
        self.run_graph, self.source, self.run = lower(full, passes_, name, log=self.log)
        self.n_replays = self.n_fallbacks = 0
        self._passes, self._name = passes_, name
        self.kept = []  # intermediates the function stores away: outputs of the run too
        # the tensors the traced call made (not its arguments, state or write-back targets)
        # that are not outputs: one still alive at the first replay (the tracer is gone by
        # then) is held by something the function stored it in (a dict, an attribute)
        made = {id(v) for n in graph.nodes for v in n.outputs}
        outs = {id(v) for v in self.out_values if isinstance(v, Value)}
        before = {id(src.ref) for _, src in graph.inputs if src.kind in ("ref", "grad")}
        before |= {id(t) for _, t, _, _ in graph.writes}
        before |= {id(a) for a in (*tracer.args, *getattr(tracer, "kwargs", {}).values())
                   if isinstance(a, Tensor)}
        self._traced = [(weakref.ref(t), v) for t, v, _ in tracer.tmap.values()
                        if id(v) in made and id(v) not in outs and id(t) not in before]

    def keep(self, values):
        """Make ``values`` (intermediates the function stores away, where eager would leave
        them computed) outputs of the run graph too: each call fills their placeholders."""
        have = {id(v) for v in self.out_values if isinstance(v, Value)}
        extra = []
        for v in values:
            if id(v) not in have:
                have.add(id(v))
                extra.append(v)
        if not extra:
            return
        outs = list(self.out_values) + extra
        full = self.graph.copy()
        full.outputs = list(outs)
        self.run_graph, self.source, self.run = lower(full, self._passes, self._name,
                                                      log=self.log)
        self.out_values = outs
        self.kept += extra

    def replay(self, fn, args, kwargs=None):
        kwargs = kwargs or {}
        if self._traced is not None:  # the first replay: what the traced call stored away
            alive = [v for r, v in self._traced if r() is not None]
            self._traced = None
            self.keep(alive)
        mode = _TailReplay(self, args, kwargs)
        try:
            try:
                with mode:
                    result = fn(*args, **kwargs)
                mode.flush_end()
                mode.check_kept()
            finally:
                mode.restore()
        except _Diverged:
            self.n_fallbacks += 1
            return fn(*args, **kwargs)
        except Exception:
            if mode.done:
                raise  # after the graph ran: the function's own error
            # before anything real ran, library Python read a placeholder not yet computed
            # (an index's bounds check on a computed index): rerun eagerly (exact)
            for t, g in reversed(mode.grads_set):
                t.grad = g
            self.n_fallbacks += 1
            return fn(*args, **kwargs)
        self.n_replays += 1
        return result
