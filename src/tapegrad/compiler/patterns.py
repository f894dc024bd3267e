"""Patterns traced from ordinary functions and matched by structure.

A fusing pass used to recognise a construct (LayerNorm's gradient, softmax's gradient) by
walking chains of readers by op name and input position, a second copy of the rule it
looked for, which could drift from the rule eager runs. A ``Pattern`` instead is an
ordinary function over tensors, usually the very rule an op registers, traced into a small
graph the first time a graph could contain it. ``Pattern.rewrite(graph)`` finds every
place where the graph computes the same thing and replaces the matched nodes by one node
(whose kernel is registered in ``op_kernels`` under the pattern's name, beside it).

Matching is structural: the pattern's output nodes are matched backwards through their
inputs (same op record, same parameters, inputs matched in order), then the pattern's
other nodes forwards from values already matched. A pattern input matches any value; a
literal in the pattern matches the same literal, except the ``symbols`` (distinctive
example values such as an ``eps`` of 1.2345e-5 or a row length of 7) that match any
literal, consistently everywhere they occur, parameters included. A match is used only if
nothing outside it reads a value made inside it (other than the pattern's outputs), the
fused node can stand where the last matched node stood, and the pattern's ``guard``
accepts the bound symbols and values.

The pattern graph is run through the same clean-up passes (``simplify``, ``cse``, ``dce``)
the step's graph went through first, so that the two are in the same normal form. A
pattern is specialised per rank of its anchor (the node making its first output): ``trace``
examples depend on it (a reduction's ``dims`` name the last axis by number).
"""
import numpy as np

from tapegrad.compiler.ir import Node, Value, producers, readers

_NORMALISE = None  # the clean-up passes, resolved at first use (passes imports kernels)


def _normalise(graph):
    global _NORMALISE
    if _NORMALISE is None:
        from tapegrad.compiler import passes
        _NORMALISE = [("simplify", passes.simplify), ("cse", passes.cse),
                      ("dce", passes.dce)]
    from tapegrad.compiler.passes import optimize
    return optimize(graph, _NORMALISE)


class Pattern:
    """``fn`` traced on ``examples(rank)`` (a list of ``(args, symbols)``: example tensors
    and ``{name: example value}`` of the literals that match any literal), replaced by a
    node ``name`` whose inputs are the matched values of ``fn``'s arguments and whose
    params are ``params(bound)`` (``bound``: symbol name -> matched literal, and
    ``"inputs"`` -> the matched input Values). ``guard(bound)`` may refuse a match."""

    def __init__(self, name, fn, examples, params=lambda bound: {}, guard=lambda bound: True,
                 impl=None):
        self.name = name
        self.fn = fn
        self.examples = examples
        self.params = params
        self.guard = guard
        self.impl = impl  # impl(nodes, inputs, outputs) -> callable over arrays (reference)
        self._traced = {}  # rank -> [(pattern graph, symbols)]
        self._anchor = None

    def variants(self, rank):
        """The pattern graphs for an anchor of this rank (traced once per rank)."""
        got = self._traced.get(rank)
        if got is None:
            from tapegrad.autograd.grad_mode import no_grad
            from tapegrad.compiler.tracer import trace

            got = []
            for args, symbols in self.examples(rank):
                with no_grad():
                    g = _normalise(trace(self.fn, *args))
                got.append((g, symbols))
            self._traced[rank] = got
        return got

    def anchor_op(self):
        """The op record of the node making the pattern's first output."""
        if self._anchor is None:
            g, _ = self.variants(2)[0]
            self._anchor = producers(g)[id(g.outputs[0])].op
        return self._anchor

    def rewrite(self, graph):
        """``graph`` with every match replaced by one ``self.name`` node."""
        anchor = self.anchor_op()
        if anchor is None or not any(n.op is anchor for n in graph.nodes):
            return graph
        producer = producers(graph)
        uses = readers(graph)
        pos = {id(n): i for i, n in enumerate(graph.nodes)}
        replace, taken = {}, set()
        for n in graph.nodes:
            if n.op is not anchor or id(n) in taken or not n.outputs:
                continue
            for pg, symbols in self.variants(len(n.outputs[0].shape)):
                m = _Match(pg, graph, symbols, producer, uses)
                if not m.run(n):
                    continue
                group = list(m.nodes.values())
                if any(id(t) in taken for t in group) or not self._usable(m, group, pos):
                    continue
                bound = dict(m.symbols)
                bound["inputs"] = [m.values[id(v)] for v, _ in pg.inputs]
                if not self.guard(bound):
                    continue
                group.sort(key=lambda t: pos[id(t)])
                outs = [m.values[id(v)] for v in pg.outputs]
                ins = bound["inputs"]
                node = Node(None, self.name, ins, self.params(bound), outs,
                            impl=(self.impl or _run_nodes)(group, ins, outs),
                            meta={"nodes": group})
                replace[id(group[-1])] = node
                taken.update(id(t) for t in group)
                break
        if not replace:
            return graph
        g = graph.copy()
        g.nodes = [replace.get(id(t), t) for t in graph.nodes
                   if id(t) in replace or id(t) not in taken]
        return g

    @staticmethod
    def _usable(m, group, pos):
        """No value made inside the match is read outside it (its outputs excepted), and
        nothing between its first and last node reads an output (the fused node stands
        where the last one stood)."""
        inside = {id(t) for t in group}
        outs = {id(v) for v in m.outputs()}
        for t in group:
            for v in t.outputs:
                if id(v) not in outs and any(id(u) not in inside for u in m.uses.get(id(v), ())):
                    return False
        first = min(pos[id(t)] for t in group)
        last = max(pos[id(t)] for t in group)
        for u in m.target.nodes[first:last + 1]:
            if id(u) not in inside and any(isinstance(a, Value) and id(a) in outs
                                           for a in u.inputs):
                return False
        return True


def _run_nodes(nodes, inputs, outputs):
    """The matched nodes themselves, in order: the node's reference implementation (the
    numpy backend's, and the pass value check's), bitwise what the graph computed."""
    from tapegrad.compiler.ir import call_node

    def run(*arrays, **params):
        env = {id(v): a for v, a in zip(inputs, arrays)}
        for t in nodes:
            args = [env[id(a)] if isinstance(a, Value) else a for a in t.inputs]
            for v, o in zip(t.outputs, call_node(t, args)):
                env[id(v)] = o
        out = tuple(env[id(v)] for v in outputs)
        return out if len(out) > 1 else out[0]

    return run


class _Match:
    """One attempt to match pattern graph ``pg`` in ``target`` from an anchor node."""

    def __init__(self, pg, target, symbols, producer, uses):
        self.pg, self.target = pg, target
        self.sym_of = {}  # example literal -> symbol name
        for name, v in symbols.items():
            self.sym_of[(type(v), v)] = name
        self.symbols = {}
        self.producer, self.uses = producer, uses
        self.p_producer = producers(pg)
        self.p_consts = {id(v): a for v, a in pg.consts.items()}
        self.nodes = {}  # id(pattern node) -> target node
        self.values = {}  # id(pattern value) -> target value
        self.used = set()  # ids of target nodes matched

    def outputs(self):
        return [self.values[id(v)] for v in self.pg.outputs]

    def run(self, anchor):
        first = self.p_producer.get(id(self.pg.outputs[0]))
        if first is None or not self._node(first, anchor):
            return False
        for pn in self.pg.nodes:  # the rest, forwards from values already matched
            if id(pn) in self.nodes:
                continue
            if not self._extend(pn):
                return False
        return all(id(v) in self.values for v in self.pg.outputs)

    def _extend(self, pn):
        for pa in pn.inputs:
            if isinstance(pa, Value) and id(pa) in self.values:
                for cand in self.uses.get(id(self.values[id(pa)]), ()):
                    if cand.op is not pn.op or id(cand) in self.used:
                        continue
                    saved = (dict(self.nodes), dict(self.values), set(self.used),
                             dict(self.symbols))
                    if self._node(pn, cand):
                        return True
                    self.nodes, self.values, self.used, self.symbols = saved
                return False
        return False

    def _node(self, pn, tn):
        if id(pn) in self.nodes:
            return self.nodes[id(pn)] is tn
        if id(tn) in self.used or tn.op is not pn.op or pn.op is None or \
                tn.variadic != pn.variadic or len(tn.inputs) != len(pn.inputs) or \
                len(tn.outputs) != len(pn.outputs) or tn.effect or \
                set(tn.params) != set(pn.params):
            return False
        self.nodes[id(pn)] = tn
        self.used.add(id(tn))
        for pv, tv in zip(pn.outputs, tn.outputs):
            if id(pv) in self.values and self.values[id(pv)] is not tv:
                return False
            self.values[id(pv)] = tv
        for k, pv in pn.params.items():
            if not self._literal(pv, tn.params[k]):
                return False
        for pa, ta in zip(pn.inputs, tn.inputs):
            if isinstance(pa, Value):
                if not isinstance(ta, Value) or not self._value(pa, ta):
                    return False
            elif isinstance(ta, Value) or not self._literal(pa, ta):
                return False
        return True

    def _value(self, pv, tv):
        if id(pv) in self.values:
            return self.values[id(pv)] is tv
        if id(pv) in self.p_consts:  # a constant of the pattern: the same array
            a = self.target.consts.get(tv)
            want = self.p_consts[id(pv)]
            if a is None or a.shape != want.shape or not np.array_equal(a, want):
                return False
            self.values[id(pv)] = tv
            return True
        pn = self.p_producer.get(id(pv))
        if pn is None:  # an input of the pattern: any value
            self.values[id(pv)] = tv
            return True
        tn = self.producer.get(id(tv))
        if tn is None or tv.index != pv.index:
            return False
        return self._node(pn, tn)

    def _literal(self, p, t):
        if isinstance(p, (tuple, list)):
            return isinstance(t, (tuple, list)) and len(p) == len(t) and \
                all(self._literal(a, b) for a, b in zip(p, t))
        if isinstance(p, bool) or not isinstance(p, (int, float)):
            return type(p) is type(t) and (p == t if not isinstance(p, np.ndarray)
                                           else np.array_equal(p, t))
        name = self.sym_of.get((type(p), p))
        if name is None:
            return type(p) is type(t) and p == t
        if type(t) is not type(p):
            return False
        if name in self.symbols:
            return self.symbols[name] == t
        self.symbols[name] = t
        return True
