"""Replaying a traced call's Python around its compiled graph.

``_Replay`` re-runs the function with ops answered from the compiled graph's results
(matching each op to the traced node and issuing pieces as their inputs arrive);
``_TailReplay`` does the same for the code after the last op of a training step. A call
whose ops diverge from the trace falls back to eager from that point.
"""
import operator
import sys
import warnings
import weakref

import numpy as np

from tapegrad.autograd.grad_mode import state as grad_state
from tapegrad.compiler.ir import Value, call_node, freeze
from tapegrad.compiler.tracer import (CompilerMode, _traced_class, slot_params)
from tapegrad.ops.registry import _prepare_elementwise, dispatch
from tapegrad.tensor import Tensor


_PLAIN = frozenset((int, float, bool, str, type(None)))


def _freeze_params(params):
    """``ir.freeze(params)`` for an op call's params dict, without recursing into the plain
    values (numbers, strings, tuples of them) that most params are: the same result."""
    if type(params) is not dict:
        return freeze(params)
    if not params:
        return ()
    out = []
    for k, v in params.items():
        t = type(v)
        if t in _PLAIN or t is tuple and all(type(x) in _PLAIN for x in v):
            out.append((k, v))
        else:
            out.append((k, freeze(v)))
    out.sort()
    return tuple(out)


def _same_params(params, want):
    """``_freeze_params(params) == freeze(node params)`` without building the frozen form:
    ``want`` maps each of the node's keys to its frozen value. A plain value is its own
    frozen form; so is a hashable tuple (no list, dict, array, or slice before Python 3.12,
    inside), else it is frozen here (and a tuple that differs as it is, as a hashable slice
    of Python 3.12 does from its frozen form)."""
    if type(params) is not dict:
        return _freeze_params(params) == tuple(sorted(want.items()))
    if len(params) != len(want):
        return False
    for k, v in params.items():
        w = want.get(k, _want_missing)
        if w is _want_missing:
            return False
        if v is w:
            continue
        t = type(v)
        if t in _PLAIN:
            if not v == w:
                return False
            continue
        if t is tuple:
            try:
                hash(v)
            except TypeError:  # an index: slices (frozen as tuples) among plain values
                same = _same_index(v, w)
                if same is not None:
                    if not same:
                        return False
                    continue
            else:
                if v == w:
                    continue
        if freeze(v) != w:
            return False
    return True


def _same_index(v, w):
    """``freeze(v) == w`` for a tuple of plain values, Ellipsis and slices (a getitem
    index), element by element without building the frozen tuple; None for other tuples."""
    if type(w) is not tuple or len(v) != len(w):
        return None
    for x, y in zip(v, w):
        tx = type(x)
        if tx is slice:
            if ("slice", x.start, x.stop, x.step) != y:
                return False
        elif tx in _PLAIN or x is Ellipsis:
            if not (x is y or x == y):
                return False
        else:
            return None
    return True


_want_missing = object()


# what a replay compares per traced node input: a tensor standing for this Value / a constant
# Value (any unknown tensor, as the trace's fresh constant) / a SplitEntry slot / a literal
_IN_VALUE, _IN_CONST, _IN_SLOT, _IN_LIT = 0, 1, 2, 3
_new_tensor = object.__new__  # a placeholder: a traced-class Tensor, slots set by hand


def _placeholder_array(boxes, v, shape, dtype, _refs=sys.getrefcount):
    """The array of ``v``'s placeholder: the one of the last call when nothing holds it any
    more (its references: ``boxes``, ``a`` and getrefcount's argument), else a new one, kept
    for the next call (as ``codegen.recycle``). A step's ~100 placeholders each allocated
    and freed cost ~0.8 us apiece (the char GPT: ~90 us a call), most of it freeing arrays
    of hundreds of KB the run's own arrays had been allocated between."""
    a = boxes.get(id(v))
    if a is None or _refs(a) > 3:
        a = boxes[id(v)] = np.empty(shape, dtype)
    return a
_TENSOR_GRAD = Tensor.grad  # the ``.grad`` property (a subclass may define its own)
_ELEMENTWISE_PLAIN = {}  # (numpy dtype, float_only) -> whether _prepare_elementwise keeps it


def _elementwise_plain(args, float_only):
    """Whether ``_prepare_elementwise(o, args)`` would return ``args`` as they are (no
    to_dtype, no broadcast_to): all Tensors of one dtype and shape, the dtype its own
    promotion (a native dtype), allowed by a float-only op. The replay then skips it."""
    first = args[0]
    if not isinstance(first, Tensor):
        return False
    d = first._data.dtype
    shape = first._data.shape
    for a in args[1:]:
        if not isinstance(a, Tensor) or a._data.dtype is not d or a._data.shape != shape:
            return False
    ok = _ELEMENTWISE_PLAIN.get((d, float_only))
    if ok is None:
        from tapegrad import dtypes

        td = dtypes._FROM_NP.get(d)
        ok = _ELEMENTWISE_PLAIN[(d, float_only)] = td is not None and td.np is d and (
            not float_only or td.category == dtypes.FLOAT)
    return ok


def _same_const(a, c):
    """Whether a call's tensor array ``a`` is bitwise the traced constant ``c``. Constants
    are made outside ops (``zeros(n)``, ``arange(n)``, a list index) from Python values that
    may come from a value read, so each replayed call compares them: as cheap as the
    factory that made ``a`` (one pass over it)."""
    if a is c:
        return True
    if a.shape != c.shape or a.dtype != c.dtype:
        return False
    if a.size <= 1:  # by bytes, as below: -0.0 is not 0.0 (1 / x differs), nan is nan
        return a.tobytes() == c.tobytes()
    a = np.ascontiguousarray(a).reshape(-1).view(np.uint8)
    c = np.ascontiguousarray(c).reshape(-1).view(np.uint8)
    if a.size % 8 == 0:  # (8 bytes a step: about half the time of bytewise)
        a, c = a.view(np.uint64), c.view(np.uint64)
    return np.array_equal(a, c)


def _plain(v):
    """Whether ``v`` is its own frozen form: a plain value, or a tuple of them."""
    return type(v) in _PLAIN or type(v) is tuple and all(_plain(x) for x in v)


def _replay_plan(entry, nodes):
    """Per traced node, once per entry: ``(node, number of inputs, inputs as (want, kind,
    frozen literal), frozen params, its Value inputs when it runs at issue once they are
    known (a view, an integer/bool result; else None), outputs as (Value, shape, dtype,
    needs a stand-in grad_fn), no slot input, frozen params by key, the params when they
    are their own frozen form (else None))``: what ``_Replay._match_plan``/``_issue_plan``
    compare and make, so a call's match builds no lists or frozen forms of the trace."""
    consts = {id(v) for v in entry.graph.consts}
    slots = entry.slot_values
    rg = getattr(entry, "rg_values", ())
    plan = []
    for n in nodes:
        ins = []
        for w in n.inputs:
            if isinstance(w, Value):
                # a constant carries its traced array: a call's tensor must equal it
                ins.append((w, _IN_SLOT if id(w) in slots else
                            _IN_CONST if id(w) in consts else _IN_VALUE,
                            entry.graph.consts[w] if id(w) in consts else None))
            else:
                ins.append((w, _IN_LIT, freeze(w)))
        real = n.op is not None and (n.op.view or all(v.dtype.kind in "iub"
                                                      for v in n.outputs)) and \
            not any(w is None for w in n.inputs)  # (a None literal: never run at issue)
        outs = tuple((v, v.shape, v.dtype, id(v) in rg) for v in n.outputs)
        if any(r for _, _, _, r in outs):
            _placeholder_node()
        plan.append((n, len(ins), tuple(ins), freeze(n.params),
                     tuple(w for w in n.inputs if isinstance(w, Value)) if real else None,
                     outs, all(k != _IN_SLOT for _, k, _ in ins),
                     {k: freeze(v) for k, v in n.params.items()},
                     n.params if all(_plain(v) for v in n.params.values()) else None))
    return plan


class _Replay(CompilerMode):
    """Runs a SplitEntry's function again, issuing its ops lazily into compiled pieces."""

    def __init__(self, entry, args, kwargs=None):
        self.e = entry
        self.nodes = entry.graph.nodes
        self.i = 0
        self.piece = 0
        self.fallen = False
        self.env = {}  # id(Value) -> array
        self.tv = {}  # id(Tensor) -> (Tensor, Value)
        self.placeholders = []  # (Tensor, Value)
        self.filled = set()  # ids of placeholder Tensors holding real values
        self.slots = entry.slots
        self.bound = entry.bind(args, kwargs)  # (at the start: gradients as eager sees them)
        refs = self.bound[0]
        inputs = entry.graph.inputs
        got = entry.__dict__.get("_replay_plan")
        if got is None or got[0] is not self.nodes or got[3] is not inputs or \
                len(got[4]) != len(inputs):  # once per entry (its nodes are fixed)
            got = entry._replay_plan = (
                self.nodes, _replay_plan(entry, self.nodes),
                {id(v) for v in entry.graph.consts}, inputs,
                [(i, src.kind, src.index, v, id(v), src.ref, src.label)
                 for i, (v, src) in enumerate(inputs)])
        self.plan, self.consts = got[1], got[2]
        boxes = entry.__dict__.get("_placeholder_arrays")
        if boxes is None:
            boxes = entry._placeholder_arrays = {}
        self._boxes = boxes
        env, tv = self.env, self.tv
        for i, kind, index, v, vid, ref, label in got[4]:
            if kind == "hyper":
                env[vid] = ref[label]
                continue
            t = args[index] if kind == "arg" else refs[i] if kind == "ref" else refs[i].grad
            tv[id(t)] = (t, v)
            env[vid] = t._data
        for v, a in entry.graph.consts.items():
            env[id(v)] = a
        self._tc = _traced_class(Tensor)
        self._ends = entry.ends
        # a new Tensor over a known array (a detach, a re-wrap inside F.embedding, an index
        # param's array) stands for the same Value, as in the tracer's value_of
        self.av = {id(t._data): (t._data, v) for t, v in self.tv.values()}

    def _match_values(self, flat):
        for a in flat:
            if isinstance(a, Tensor) and id(a) not in self.tv:
                got = self.av.get(id(a._data))
                if got is not None and got[0] is a._data:
                    self.tv[id(a)] = (a, got[1])

    def _value(self, t):
        got = self.tv.get(id(t))
        return got[1] if got is not None and got[0] is t else None

    def _slotted(self, n, args, params):
        """A node whose params held arrays of traced tensors (``Tracer._array_params``)."""
        def find(x):
            got = self.av.get(id(x))
            if got is None or got[0] is not x:
                raise LookupError
            return got[1]

        flat = args[0] if args and type(args[0]) is list else args
        k = n.meta["n_in"]
        try:
            key, extra = slot_params(params, find)
        except LookupError:
            key, extra = None, []
        self._match_values(flat)
        if key is None or len(flat) != k or _freeze_params(key) != self._node_params(n) or \
                any(self._value(a) is not w for a, w in zip(flat, n.inputs[:k])) or \
                len(extra) != len(n.inputs) - k or \
                any(v is not w for v, w in zip(extra, n.inputs[k:])):
            self._fall()
            return dispatch(n.meta["op"], args, params)
        return self._issue(n)[0]

    def _plan_of(self, n):
        """The plan of ``n``: the node being matched is the replay's next one."""
        p = self.plan[self.i]
        return p if p[0] is n else _replay_plan(self.e, [n])[0]

    def _node_params(self, n):
        """``freeze(n.params)``, once per entry (a traced node's params never change)."""
        return self._plan_of(n)[3]

    def _match(self, n, flat, params):
        return self._match_plan(self._plan_of(n), flat, params)

    def _match_plan(self, p, flat, params):
        """Whether the call's inputs and params are the traced node's: each tensor stands
        for the node's input Value (a known tensor, or a new one over a known array), an
        unknown tensor only for a constant, literals and params equal in frozen form."""
        n, n_in, ins, frozen, _, _, simple, want_params, plain_params = p
        if not simple:  # a SplitEntry slot among the inputs (a Python number after a read)
            return self._match_slots(n, flat, params, frozen)
        if len(flat) != n_in:
            return False
        if plain_params is not None and type(params) is dict:
            # the node's params are their own frozen form: so are the call's when hashable
            # (no list, array, dict, slice inside), and then frozen equality is equality
            try:
                hash(tuple(params.values()))
            except TypeError:
                if not _same_params(params, want_params):
                    return False
            else:
                if not (params == plain_params or _same_params(params, want_params)):
                    return False
        elif not _same_params(params, want_params):
            return False
        tv = self.tv
        for a, (want, kind, lit) in zip(flat, ins):
            if isinstance(a, Tensor):
                got = tv.get(id(a))
                if got is None:  # a new Tensor over a known array stands for its Value
                    known = self.av.get(id(a._data))
                    if known is not None and known[0] is a._data:
                        got = tv[id(a)] = (a, known[1])
                if got is not None and got[0] is a:
                    if got[1] is not want:
                        return False
                elif kind != _IN_CONST or not _same_const(a._data, lit):
                    return False
            elif kind != _IN_LIT or (a != lit if type(a) in _PLAIN else freeze(a) != lit):
                return False
        return True

    def _match_slots(self, n, flat, params, frozen):
        self._match_values(flat)
        if len(flat) != len(n.inputs) or _freeze_params(params) != frozen:
            return False
        for a, want in zip(flat, n.inputs):
            if isinstance(a, Tensor):
                got = self.tv.get(id(a))
                if got is not None and got[0] is a:
                    if got[1] is not want:
                        return False
                elif not (isinstance(want, Value) and id(want) in self.consts and
                          _same_const(a._data, self.e.graph.consts[want])):
                    return False
            elif isinstance(want, Value) and id(want) in self.e.slot_values:
                if type(a) is not type(self.e.slots[want.name]):
                    return False
            elif isinstance(want, Value) or freeze(a) != freeze(want):
                return False
        for a, want in zip(flat, n.inputs):
            if isinstance(want, Value) and id(want) in self.e.slot_values:
                self.slots[want.name] = a
                self.env[id(want)] = a
        return True

    def _issue(self, n):
        return self._issue_plan(self._plan_of(n))

    def _issue_plan(self, p):
        """The node's outputs as placeholders (of the traced class, as the trace's tensors;
        a stand-in grad_fn where the trace had a non-leaf), registered for later matches."""
        n, _, _, _, real, spec, _, _, _ = p
        if real is not None:  # (index arithmetic on arguments: cheap)
            env = self.env
            for a in real:
                if env.get(id(a)) is None:
                    break  # (an input is a placeholder: the common case)
            else:
                return self._issue_real(n, spec)
        return self._place(spec, None)

    def _issue_real(self, n, spec):
        """A view of known arrays (``i[:2]`` of an argument) or an integer/bool result of
        them is real at once: an index's bounds check may read it."""
        env = self.env
        return self._place(spec, call_node(n, [env.get(id(a)) if isinstance(a, Value) else a
                                               for a in n.inputs]))

    def _place(self, spec, arrays):
        """The placeholders of one node's outputs (``arrays``: their values where known, else
        None: fresh uninitialised arrays the graph fills)."""
        tv, av, placeholders, tc = self.tv, self.av, self.placeholders, self._tc
        env, filled = self.env, self.filled
        outs = []
        for k, (v, shape, dtype, rg) in enumerate(spec):
            a = None if arrays is None else arrays[k]
            t = _new_tensor(tc)
            t._data = d = _placeholder_array(self._boxes, v, shape, dtype) if a is None else a
            t._grad = t._hooks = None
            t._version = [0]
            if rg:  # a non-leaf, as in the trace (in-place checks)
                t.grad_fn, t._requires_grad = _PLACEHOLDER_NODE[0], True
            else:
                t.grad_fn, t._requires_grad = None, False
            tv[id(t)] = pair = (t, v)
            av[id(d)] = (d, v)
            placeholders.append(pair)
            if a is not None:
                env[id(v)] = a
                filled.add(id(t))
            outs.append(t)
        self.i += 1
        if self.i in self._ends:
            self._flush()
        return outs

    def interpret(self, o, args, params):
        if self.fallen:
            return dispatch(o, args, params)
        if o.elementwise and not _elementwise_plain(args, o.float_only):
            modes = grad_state.modes
            grad_state.modes = modes + [self]
            try:
                args = _prepare_elementwise(o, args)
            finally:
                grad_state.modes = modes
            if self.fallen:
                return dispatch(o, args, params)
        plan = self.plan
        if self.i < len(plan):
            p = plan[self.i]
            n = p[0]
            if n.op is o:
                if self._match_plan(p, args[0] if args and type(args[0]) is list else args,
                                    params):
                    return self._issue_plan(p)[0]
            elif n.op is None and n.meta and n.meta.get("op") is o:
                return self._slotted(n, args, params)
        self._fall()
        return dispatch(o, args, params)

    def array_fn(self, name, fn, tensors, params, random=False):
        n = self.nodes[self.i] if self.i < len(self.nodes) else None
        if not self.fallen and n is not None and n.op is None and n.name == name and \
                not random and self._match(n, list(tensors), params):
            outs = self._issue(n)
            return tuple(outs) if len(outs) > 1 else outs[0]
        self._fall()
        out = fn(*[t._data for t in tensors], **params)
        return tuple(map(Tensor._make, out)) if isinstance(out, tuple) else Tensor._make(out)

    def assign(self, t, value):
        self._fall()
        np.copyto(t._data, value._data, casting="unsafe")
        t._version[0] += 1
        return t

    def constant(self, t):
        pass

    def on_read(self, t):
        if not self.fallen and id(t) not in self.filled and \
                any(p is t for p, _ in self.placeholders):
            self._fall()

    def _flush(self):
        ins, outs, run = self.e.pieces[self.piece]
        arrays = run([self.env[id(v)] for v in ins], [None] * len(ins), [])
        for v, a in zip(outs, arrays):
            self.env[id(v)] = a
        for t, v in self.placeholders:
            if id(t) not in self.filled and id(v) in self.env:
                np.copyto(t._data, self.env[id(v)])
                self.filled.add(id(t))
        self.piece += 1

    def _fall(self):
        """Evaluate every op issued so far from the inputs (exact), fill every placeholder;
        the rest of the call runs eagerly."""
        if self.fallen:
            return
        self.fallen = True
        env = {id(v): self.env[id(v)] for v, _ in self.e.graph.inputs}
        env.update({id(v): a for v, a in self.e.graph.consts.items()})
        for n in self.nodes[:self.i]:
            args = [env[id(a)] if isinstance(a, Value) else a for a in n.inputs]
            for v, o in zip(n.outputs, call_node(n, args)):
                env[id(v)] = o
        for t, v in self.placeholders:
            if id(t) not in self.filled:
                np.copyto(t._data, env[id(v)])
                self.filled.add(id(t))

    def flush_end(self):
        if not self.fallen and self.i != len(self.nodes):
            self._fall()  # fewer ops than recorded: fill what was issued
            return
        # a placeholder no piece had to fill, still held after the call (stored by the
        # function somewhere): evaluated now, so no tensor the caller can reach is undefined
        pending = [(weakref.ref(t), v) for t, v in self.placeholders
                   if id(t) not in self.filled]
        if not pending:
            return
        self.placeholders = [(t, v) for t, v in self.placeholders if id(t) in self.filled]
        self.tv = {}
        alive = [(r(), v) for r, v in pending if r() is not None]
        if alive:
            self.placeholders += alive
            self.fallen = False
            self._fall()

    def restore(self):
        for t, _ in self.placeholders:
            t.__class__ = Tensor


class _Diverged(Exception):
    """A tail replay met Python that did something else than the traced call did."""


def _refcounts(pairs, _first=operator.itemgetter(0)):
    """The reference counts of the tensors of ``(tensor, value)`` pairs (``check_kept``)."""
    return list(map(sys.getrefcount, map(_first, pairs)))


_REFS_OWN = _refcounts([(object(), None)])[0]  # held only by its pair (in the list)
_PLACEHOLDER_NODE = []


def _placeholder_node():
    """One tape Node standing for every replayed placeholder's history (never run)."""
    if not _PLACEHOLDER_NODE:
        from tapegrad.autograd.engine import Node as TapeNode

        n = TapeNode.__new__(TapeNode)
        n.op = n.params = n.saved = n.versions = n.out = n.out_version = None
        n.hooks = n.retained = n.stack = n.recompute = None
        n.parents, n.shape, n.dtype, n.seq = [], (), None, 0
        _PLACEHOLDER_NODE.append(n)
    return _PLACEHOLDER_NODE[0]


class _TailReplay(_Replay):
    tail_replay = True

    def __init__(self, entry, args, kwargs=None):
        super().__init__(entry, args, kwargs)
        self.args = args
        self.kwargs = kwargs
        self.done = False
        self.grads_set = []  # (leaf, its .grad before a skipped backward): undone on divergence

    def _span(self, kind):
        span = self.e.spans.get(self.i)
        if self.done or self.fallen or span is None or span[0] != kind:
            self._fall()
        return span

    def trace_backward(self, roots, root_grads, retain_graph, inputs):
        span = self._span("backward")
        _, end, want_roots, want_grads, made = span
        if inputs is not None or tuple(self._value(r) for r in roots) != want_roots or \
                tuple(self._value(g) if isinstance(g, Tensor) else None
                      for g in root_grads) != want_grads:
            self._fall()
        places, tc, tv = self.e.arg_places, self._tc, self.tv
        for t, v in made:
            if id(t) in places:
                t = self.e.here(t, self.args, self.kwargs)  # (a fresh leaf argument)
            ph = _new_tensor(tc)
            ph._data = _placeholder_array(self._boxes, v, v.shape, v.dtype)
            ph._grad = ph._hooks = ph.grad_fn = None
            ph._version, ph._requires_grad = [0], False
            tv[id(ph)] = pair = (ph, v)
            self.placeholders.append(pair)
            self.grads_set.append((t, t._grad))
            if type(t).grad is _TENSOR_GRAD:  # (the setter's checks hold: v is the traced
                t._grad = ph  # gradient of a tensor guarded to the traced shape and dtype)
            else:
                t.grad = ph
        self.i = end
        return None

    def optimizer_step(self, opt, original):
        span = self._span("step")
        stepped = tuple(id(p) for g in opt.param_groups for p in g["params"]
                        if p.grad is not None)
        if span[2] is not opt or span[3] != stepped:
            self._fall()
        for p, v in span[4]:
            self.tv[id(p)] = (p, v)
        self.i = span[1]

    def zero_grads(self, opt, original, params=None):
        if params is None:
            params = [p for g in opt.param_groups for p in g["params"]]
        with_grad = tuple(id(p) for p in params if p._grad is not None)
        if not with_grad:
            return original(opt, False)  # nothing to zero (none was in the trace either)
        span = self._span("zero_grad")
        if span[2] is not opt or span[3] != with_grad:
            self._fall()
        self.i = span[1]  # the graph writes the zeros

    def python_effect(self, name, call, args):
        span = self._span("effect")
        if span[2] != name or len(span[3]) != len(args) or \
                any(a is not b for a, b in zip(span[3], args)):
            self._fall()
        self.i = span[1]

    def array_fn(self, name, fn, tensors, params, random=False):
        if self.done:  # after the graph ran: eager, on filled values (as interpret)
            return _Replay.array_fn(self, name, fn, tensors, params, random)
        n = self.nodes[self.i] if self.i < len(self.nodes) else None
        if n is None or n.op is not None or n.name != name or \
                bool(n.effect) != bool(random) or not self._match(n, list(tensors), params):
            self._fall()
        outs = self._issue(n)
        return tuple(outs) if len(outs) > 1 else outs[0]

    def alias(self, dst, src):
        v = self._value(src)
        if v is not None and not self.done:
            self.tv[id(dst)] = (dst, v)

    def assign(self, t, value):
        v = self._value(value)
        if self.done or v is None or value._data.shape != t._data.shape or \
                value._data.dtype != t._data.dtype:
            self._fall()
        self.tv[id(t)] = (t, v)
        return t

    def records_writes(self):
        return not self.done

    def record_write(self, t, name, fn, args, kwargs):
        """An in-place write the trace recorded (``Tracer.record_write``): ``fn``'s ops match
        the recorded ones (placeholders); ``t`` and the inputs over its array then stand for
        the result, which the graph's write-back stores when it runs. A tensor left standing
        for the old value makes a later op differ from the trace: the call reruns eagerly."""
        self._match_values((t,))
        before = self._value(t)
        if before is None:
            self._fall()
        span = self.e.spans.get(self.i)
        if span is not None and span[0] == "write" and span[2] == name and span[3] is fn and \
                span[4] is before and self._write_key(args, kwargs) == span[5]:
            v = span[6]  # the same write of the same operands: its nodes are skipped
            self.i = span[1]
        else:
            v = self._replay_write(t, fn, args, kwargs)
        arr = t._data
        self.av[id(arr)] = (arr, v)
        self.tv[id(t)] = (t, v)
        over = self.__dict__.get("_inputs_by_array")
        if over is None:  # (once per call with writes: a parameter behind its .data)
            over = self._inputs_by_array = {
                id(x._data): x for x in (*self.bound[0], *self.args) if isinstance(x, Tensor)}
        x = over.get(id(arr))
        if x is not None and x._data is arr:
            self.tv[id(x)] = (x, v)
        return t

    def _write_key(self, args, kwargs):
        """``Tracer._write_key`` of this call's operands (Values as this replay knows them)."""
        key = []
        for a in (*args, *kwargs.items()):
            k = None
            if type(a) is tuple:
                k, a = a
            if isinstance(a, Tensor):
                self._match_values((a,))
                key.append((k, self._value(a)))
            elif a is None or type(a) in (bool, int, float):
                key.append((k, type(a), repr(a)))
            else:
                return None
        return tuple(key)

    def _replay_write(self, t, fn, args, kwargs):
        """``fn``'s ops matched one by one against the recorded ones; the result's Value."""
        prev, grad_state.enabled = grad_state.enabled, False
        try:
            result = fn(t, *args, **kwargs)
            if isinstance(result, Tensor) and result._data.dtype != t._data.dtype:
                from tapegrad.ops import elementwise

                result = elementwise.to_dtype(result, dtype=t.dtype)
        finally:
            grad_state.enabled = prev
        v = self._value(result) if isinstance(result, Tensor) else None
        if v is None or result._data.shape != t._data.shape:
            self._fall()
        return v

    def _interpret_done(self, o, args, params):
        """``interpret`` once the graph ran (``_flush`` sets it on the instance, so the ops
        before it pay no check): eager, on filled values only."""
        flat = args[0] if args and type(args[0]) is list else args
        if any(isinstance(a, Tensor) and self._value(a) is not None and
               id(a) not in self.filled and any(a is p for p, _ in self.placeholders)
               for a in flat):
            raise RuntimeError(f"tapegrad.compile: {o.name} after the compiled step read "
                               "an intermediate the graph did not keep")
        return dispatch(o, args, params)

    def on_read(self, t):
        if self.done:
            return
        if self.i != len(self.nodes):
            self._fall()  # a read before the graph's end
        self._flush()

    def _flush(self):
        e = self.e
        modes = grad_state.modes
        grad_state.modes = [m for m in modes if m is not self]  # effect nodes' own ops: eager
        try:
            arrays = e.run(self.args, *self.bound)
        finally:
            grad_state.modes = modes
        for k, extra in e.bumps:
            self.bound[1][k]._version[0] += extra
        env = {id(v): a for v, a in zip(e.out_values, arrays) if isinstance(v, Value)}
        for t, v in self.placeholders:
            a = env.get(id(v))
            if a is not None and id(t) not in self.filled:
                np.copyto(t._data, a)
                self.filled.add(id(t))
        self.done = True
        self.interpret = self._interpret_done  # (dropped by restore: no cycle left)

    def _fall(self):
        if not self.done:
            for t, g in reversed(self.grads_set):
                t.grad = g
            raise _Diverged()
        self.fallen = True

    def flush_end(self):
        if not self.done:
            if self.i != len(self.nodes):
                self._fall()  # fewer ops than traced
            self._flush()

    def check_kept(self):
        """After the call: a placeholder the graph did not fill that something outside the
        call still holds (an intermediate the function stored away, which the traced call
        did not) has no value: it is NaN, with a warning, and the entry outputs its Value
        from the next call on (``TailEntry.keep``)."""
        self.tv = self.grads_set = None  # (the replay's own references: one pair each left)
        counts = _refcounts(self.placeholders)
        if not counts or max(counts) <= _REFS_OWN:
            return  # (the common case: all dropped, or returned and filled)
        filled = self.filled
        held = [p for p, n in zip(self.placeholders, counts)
                if n > _REFS_OWN and id(p[0]) not in filled]
        if not held:
            return
        for t, _ in held:  # (never uninitialised memory)
            t._data.fill(np.nan if t._data.dtype.kind in "fc" else 0)
        self.e.keep([v for _, v in held])  # (before the warning, which may be an error)
        warnings.warn(
            f"tapegrad.compile: {self.e._name} kept {len(held)} intermediate tensor(s) "
            f"(shapes {[tuple(t._data.shape) for t, _ in held][:4]}) that its compiled graph "
            "did not output; their values for this call are not computed (NaN, 0 for "
            "integers); later calls output them", RuntimeWarning,
            stacklevel=6)  # (the compiled function's caller)

    def restore(self):
        self.__dict__.pop("interpret", None)
        stand_in = _placeholder_node()
        for t, _ in self.placeholders:  # plain tensors, as a compiled step's outputs are
            t.__class__ = Tensor
            if t.grad_fn is stand_in:
                t.grad_fn, t._requires_grad = None, False
