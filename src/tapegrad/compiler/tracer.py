"""Capture: run a function eagerly under a ``DispatchMode`` and record every op into a Graph.

The tracer is one more interpreter of the op records (``autograd.engine.DispatchMode``):
every op dispatched on Tensors, including the ``to_dtype``/``broadcast_to`` a binary op
inserts and the ops inside composites, comes to ``interpret``, which runs it eagerly (so
shapes and dtypes are known and the call's side effects happen exactly once) and records a
Node. ``loss.backward()`` under the tracer runs the engine with ``create_graph``, so the
gradient rules execute as ops on Tensors and are recorded too: the joint graph is traced,
never re-derived. A rule not audited as value-independent (``Op.rule_traces``) or one that
meets a value computed outside ops becomes one ``vjp`` node that calls the rule on arrays at
run time, exactly as eager backward does. ``optimizer.step()`` becomes one effect node that
runs the optimizer's own update on the live parameters and state at run time (so the LR a
scheduler sets and Adam's step count are read each call, never baked in).

What cannot be captured is a *graph break* (``GraphBreak``): reading values into Python
(``.item()``, ``bool(t)``, ``.tolist()``, ``.numpy()``, ``float(t)``, printing), random
draws, tensors made outside ops from data (a frozen batch would be wrong), in-place changes
made outside ops. On a break the call finishes eagerly (its result is exact) and the break,
with its source line, is reported.
"""
import gc
import os
import sys
import threading
import traceback
import weakref

import numpy as np

from tapegrad.amp import autocast_mode
from tapegrad.autograd import engine
from tapegrad.autograd.engine import DispatchMode
from tapegrad.autograd.grad_mode import state as grad_state
from tapegrad.compiler.ir import Graph, Input, Node, Value
from tapegrad.ops.registry import REGISTRY, dispatch, _prepare_elementwise
from tapegrad.tensor import Tensor

_PKG = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class GraphBreak(Exception):
    """A point the tracer cannot capture; ``reason`` and ``where`` (the user's source line)."""

    def __init__(self, reason, where=""):
        super().__init__(f"{reason}" + (f" (at {where})" if where else ""))
        self.reason = reason
        self.where = where


def user_frame():
    """``file:line`` of the innermost frame outside tapegrad (the user's code), and its text."""
    for fs in reversed(traceback.extract_stack()):
        if not os.path.abspath(fs.filename).startswith(_PKG):
            return f"{fs.filename}:{fs.lineno}: {(fs.line or '').strip()}"
    return ""


def active():
    """The tracer active in this thread, if any."""
    for m in reversed(grad_state.modes):
        if isinstance(m, Tracer):
            return m
    return None


def _tail_replay():
    """The tail replay (``replay._TailReplay``) running in this thread, if any: it skips the
    optimizer and scheduler steps the compiled graph runs."""
    for m in reversed(grad_state.modes):
        if getattr(m, "tail_replay", False):
            return m
    return None


# --- tensors seen by the trace: reading their values into Python is a graph break --------
_READS = ("item", "tolist", "numpy", "__bool__", "__float__", "__int__", "__index__",
          "__array__", "__repr__", "__str__", "__format__")
_traced_classes = {}


def _reader(name):
    base = getattr(Tensor, name)

    def method(self, *args, **kwargs):
        reason = f"Tensor.{name.strip('_')}() reads a tensor's value into Python"
        tr = active()
        if tr is not None:
            if tr.split_reads and not tr.broken:
                tr.split_at(reason, self)
            else:
                tr.graph_break(reason)
        else:
            for m in reversed(grad_state.modes):  # a compiled function replaying its pieces
                if hasattr(m, "on_read"):
                    m.on_read(self)
                    break
        return base(self, *args, **kwargs)

    method.__name__ = name
    return method


def _setitem_method(cls):
    base = cls.__setitem__

    def __setitem__(self, index, value):
        tr = active()
        if tr is None or tr.broken:
            return base(self, index, value)
        return tr.setitem(self, index, value, base)

    return __setitem__


def _fill_method(cls):
    base = cls.fill_

    def fill_(self, value):
        """``t.fill_(number)`` (and ``zero_``) on a traced tensor: ``t[...] = number``."""
        tr = active()
        if tr is None or tr.broken or not isinstance(value, (bool, int, float)):
            return base(self, value)
        tr.setitem(self, Ellipsis, value, lambda t, index, v: base(t, v))
        return self

    fill_.__name__ = "fill_"
    return fill_


def _has_mask(p):
    """Whether param ``p`` (an index key) holds a boolean array."""
    if isinstance(p, Tensor):
        p = p._data
    if isinstance(p, np.ndarray):
        return p.dtype.kind == "b"
    return type(p) in (tuple, list) and any(_has_mask(x) for x in p)


def _int_list(x):
    """A (nested) list of Python ints, bools excluded (a list of bools is a mask)."""
    return all(_int_list(i) if type(i) is list else type(i) is int for i in x) and bool(x)


def _mask_write(t, index, value):
    """``t[mask] = value`` (``mask`` a boolean tensor over ``t``'s leading dims, ``value`` a
    number or a tensor that broadcasts to the trailing dims) as ``where(mask, value, t)``: the
    same elements written, a static shape. ``None`` when the index or value is of another
    kind (eager's own path)."""
    m = index[0] if type(index) is tuple and len(index) == 1 else index
    if not isinstance(m, Tensor) or m._data.dtype.kind != "b" or not m.ndim:
        return None
    k, shape = m.ndim, tuple(t.shape)
    if tuple(m.shape) != shape[:k]:
        return None
    if isinstance(value, Tensor):
        vshape = tuple(value.shape)
    elif isinstance(value, (bool, int, float)):
        vshape = ()
    else:
        return None
    while len(vshape) > len(shape) - k and vshape[0] == 1:  # eager drops leading 1s
        vshape = vshape[1:]
    try:
        if len(vshape) > len(shape) - k or \
                np.broadcast_shapes(vshape, shape[k:]) != shape[k:]:
            return None
    except ValueError:
        return None
    extra = len(shape) - k

    def where_mask(a, v):
        from tapegrad.ops import elementwise as E, movement as M

        cond = M.reshape_op(m, shape=m.shape + (1,) * extra) if extra else m
        dt = a._data.dtype
        if isinstance(v, Tensor):
            if tuple(v.shape) != vshape:
                v = M.reshape_op(v, shape=vshape)
            if v._data.dtype != dt:
                v = E.to_dtype(v, dtype=a.dtype)
        else:
            v = bool(v) if dt.kind == "b" else int(v) if dt.kind in "iu" else float(v)
        return E.where_op(cond, v, a)

    return where_mask


def _aliasing(name):
    """``detach()`` / ``.data``: a new Tensor over the same array stands for the same value."""
    base = getattr(Tensor, name)
    get = base.fget if isinstance(base, property) else base

    def method(self, *args):
        out = get(self, *args)
        tr = active()
        if tr is not None and not tr.broken and isinstance(out, Tensor):
            e = tr.tmap.get(id(self))
            if e is not None and e[0] is self and out._data is self._data:
                tr._bind(out, e[1])
        return out

    method.__name__ = name
    return property(method, base.fset) if isinstance(base, property) else method


def _traced_class(cls):
    """``cls`` with the value-reading methods and in-place fast paths seen by the tracer
    (the same layout, so ``__class__`` can be swapped for the trace and back)."""
    t = _traced_classes.get(cls)
    if t is None:
        body = {"__slots__": (), "__module__": cls.__module__}
        for name in _READS:
            body[name] = _reader(name)
        for name in ("detach", "data"):
            body[name] = _aliasing(name)
        body["__setitem__"] = _setitem_method(cls)
        body["fill_"] = _fill_method(cls)
        t = type(cls.__name__, (cls,), body)
        _traced_classes[cls] = t
        if cls is Tensor:  # a traced view made stale by an in-place op on its base
            from tapegrad.inplace import _StaleView

            stale = _traced_class(_StaleView)
            t._stale_cls, stale._fresh_cls = stale, t
    return t


def _untraced_class(t, cls):
    """The class ``t`` goes back to after the trace (a view made stale meanwhile stays so)."""
    if getattr(type(t), "_fresh_cls", None) is not None:
        from tapegrad.inplace import _StaleView

        return _StaleView
    return cls


class _RuleProxy:
    """Stands in for a Node's op during a traced backward: records its gradient rule."""

    def __init__(self, op, tracer):
        self._op = op
        self._tracer = tracer

    def __getattr__(self, name):
        return getattr(self._op, name)

    def rule(self, g, out, *saved, **params):
        tr, op = self._tracer, self._op
        if tr.broken:
            return op.rule(g, out, *saved, **params)
        if op.rule_traces:
            outer = tr.dirty
            tr.dirty = False
            tr.rule_depth += 1
            # recorded, never differentiated again (the backward was asked without
            # create_graph): grad mode off, so no broadcast_to is materialised for a
            # gradient's own gradient and no tape Node is made (numpy broadcasts as eager)
            enabled, grad_state.enabled = grad_state.enabled, False
            try:
                grads = op.rule(g, out, *saved, **params)
            finally:
                grad_state.enabled = enabled
                tr.rule_depth -= 1
            dirty, tr.dirty = tr.dirty, outer
            if not dirty or tr.broken:
                return grads
        return tr.opaque_rule(op, g, out, saved, params)


class _Shape:
    """What a rule reads of an input nobody saved: shape and dtype (a literal of the graph)."""

    __slots__ = ("shape", "dtype")

    def __init__(self, shape, dtype):
        self.shape, self.dtype = tuple(shape), np.dtype(dtype)

    @property
    def ndim(self):
        return len(self.shape)

    def __repr__(self):
        return f"shape{list(self.shape)}"


def _vjp_impl(rule, has_out, pick):
    def vjp(g, *rest, **params):
        out, saved = (rest[0], rest[1:]) if has_out else (None, rest)
        grads = rule(g, out, *saved, **params)
        if type(grads) not in (tuple, list):
            grads = (grads,)
        return tuple(grads[i] for i in pick)

    return vjp


class CompilerMode(DispatchMode):
    """A mode of the compiler (the tracer, a compiled function's replay). It enters below the
    other modes at the top of the thread's stack (an autocast region the call runs in), so
    the casts they make reach it as ops and the graph holds what eager runs; and with a fresh
    autocast cast cache, so a cast cached before the call (a tensor the graph would read by
    reference, stale in a later region) is made again as a recorded op."""

    def __enter__(self):
        modes = grad_state.modes
        k = len(modes)
        while k and not isinstance(modes[k - 1], CompilerMode):
            k -= 1
        grad_state.modes = modes[:k] + [self] + modes[k:]
        engine.add_watcher(self)
        st = autocast_mode._state
        self._cast_cache, st.cache = st.cache, {}
        return self

    def __exit__(self, *exc):
        modes = grad_state.modes
        if not any(m is self for m in modes):
            raise RuntimeError(f"{type(self).__name__}: exited twice or in another thread")
        grad_state.modes = [m for m in modes if m is not self]
        engine.remove_watcher(self)
        autocast_mode._state.cache = self._cast_cache
        return False


class Tracer(CompilerMode):
    """Records the ops of one eager call into ``self.graph`` (see the module docstring)."""

    def __init__(self, args):
        self.graph = Graph()
        self.tmap = {}  # id(Tensor) -> [Tensor, Value, version]
        self.amap = {}  # id(array) -> Value, for Tensors that wrap a traced array (detach, out)
        self.broken = None  # the first GraphBreak, once the trace gave up
        self.breaks = []
        self.rule_depth = 0
        self.dirty = False
        self.fullgraph = False
        self.guards = []  # (kind, object, expected) checked before a cached graph runs
        self.mutated = {}  # id(external Tensor) -> Tensor changed in place by traced code
        self.stepped = {}  # id(param) -> param updated by an optimizer_step node
        self.optimizers = []
        self.swapped = []  # (Tensor, original class)
        self.held = []  # keeps arrays and tensors alive so ids stay unique
        self.n_backward = 0
        self.args = args
        self.joint = None  # (forward outputs, differentiable sources, their gradients)
        # id(array) -> (Tensor, version): made by zeros/ones/full/arange/eye/... from shapes and Python
        # numbers during the call; constants of the graph, no break
        self.static = {}
        self.in_effect = False  # inside a python_effect call: nested ones are part of it
        # > 0 while library code the graph runs as one effect node writes (an optimizer's own
        # update): those writes are the node's, not recorded op by op (records_writes)
        self.quiet = 0
        self.wrote = False  # an in-place write was recorded (record_write)
        self.extra_bumps = {}  # index in graph.writes -> version bumps beyond the write-back's
        self.holders = {}  # id(array) -> the bound tensors over it (a parameter, its .data)
        self._by_array = None  # id(array) -> census tensor, made on the first write
        self.split_reads = False  # value reads split the graph into pieces (entries.SplitEntry)
        self.splits = []  # (node index, Value read, GraphBreak)
        # what a tail replay (entries.TailEntry: reads only after the last op of a training step)
        # skips over: node index -> ("backward" | "step" | "effect", end index, ...)
        self.spans = {}
        self.tail_ok = True  # False: something a tail replay cannot skip (autograd.grad...)
        self.rg_values = set()  # ids of the Values whose tensors required grad
        self.inner = []  # (name, GraphBreak): compiled functions called here that ran eagerly
        # the census: tensors alive before the call (state the graph reads by reference)
        from tapegrad import random as _random
        gen_cls = _random.Generator
        found = _live()
        objs = [o for o in found if type(o) is not gen_cls]
        gens = [o for o in found if type(o) is gen_cls]
        self.census = {id(t): (t, t._version[0], t.grad, None if t.grad is None else
                               t.grad._version[0]) for t in objs}
        self.grad_owner = {id(t.grad): t for t in objs if t.grad is not None}
        gens = gens or [_random.default_generator]
        self.rng = [(gen, gen._rng.bit_generator.state) for gen in gens]
        for i, a in enumerate(args):
            if isinstance(a, Tensor):
                self._add_input(a, Input("arg", index=i), f"a{i}")

    # --- values -------------------------------------------------------------------------
    def _bind(self, t, v):
        self.tmap[id(t)] = [t, v, t._version[0]]
        self.amap[id(t._data)] = v
        self.held.append(t)
        self.holders.setdefault(id(t._data), []).append(t)
        cls = type(t)
        if cls is Tensor or cls is _parameter():
            self.swapped.append((t, cls))
            t.__class__ = _traced_class(cls)

    def _add_input(self, t, src, hint):
        d = t._data
        v = self.graph.new_value(d.shape, d.dtype, hint)
        self.graph.inputs.append((v, src))
        self.guards.append(("tensor", src, (d.shape, d.dtype, t._requires_grad)))
        self._bind(t, v)
        return v

    def value_of(self, t):
        """The Value a Tensor (or array) argument stands for; lifts external state."""
        if isinstance(t, Tensor):
            e = self.tmap.get(id(t))
            if e is not None and e[0] is t:
                if t._version[0] != e[2] and grad_state.enabled and \
                        getattr(type(t), "_fresh_cls", None) is not None:
                    modes = grad_state.modes  # (interpret runs outside the modes)
                    grad_state.modes = modes + [self]
                    try:  # a view whose base was written: replayed; alias() rebinds it
                        t.grad_fn
                    finally:
                        grad_state.modes = modes
                    e = self.tmap[id(t)]
                if t._version[0] != e[2]:
                    self.graph_break("a tensor was modified in place outside ops")
                return e[1]
            v = self.amap.get(id(t._data))
            if v is not None:  # a detach(), or a saved output the engine re-wrapped
                self._bind(t, v)
                return v
            s = self.static.get(id(t._data))  # (or a wrapper of its array: embedding's idx)
            if s is not None and s[0]._data is t._data and s[0]._version[0] == s[1]:
                v = self.graph.new_value(t._data.shape, t._data.dtype, "c")
                self.graph.consts[v] = np.array(t._data)  # a copy: later writes stay out
                self._bind(t, v)
                return v
            c = self.census.get(id(t))
            if c is not None and c[0] is t:
                if t._version[0] != c[1]:
                    self.graph_break("a tensor was modified in place outside ops")
                owner = self.grad_owner.get(id(t))
                if owner is not None and owner.grad is t:
                    return self._add_input(t, Input("grad", ref=owner, label=_label(owner)),
                                           "g")
                return self._add_input(t, Input("ref", ref=t, label=_label(t)), "p")
            return self._constant(t._data, t)
        if isinstance(t, np.ndarray):
            v = self.amap.get(id(t))
            return v if v is not None else self._constant(t, None)
        return t  # a Python scalar, None, ...: a literal of the graph

    def _constant(self, array, t):
        if self.rule_depth:
            self.dirty = True  # the rule becomes a vjp node; this constant is dead code
        elif self._rng_changed():
            self.graph_break(_RNG_BREAK)
        else:
            self.graph_break("a tensor computed outside ops (its values would be frozen into "
                             "the graph)")
        v = self.graph.new_value(array.shape, array.dtype, "c")
        self.graph.consts[v] = array
        self.held.append(array)
        if t is not None:
            self._bind(t, v)
        return v

    # --- breaks -------------------------------------------------------------------------
    def split_at(self, reason, t):
        """A value read (``split_reads``): the graph so far is one compiled piece, the read
        runs in Python, the next piece starts here (as torch.compile's graph breaks)."""
        brk = GraphBreak(reason, user_frame())
        self.breaks.append(brk)
        if self.fullgraph:
            self.broken = brk
            raise brk
        v = self.value_of(t)
        if not self.broken:
            self.splits.append((len(self.graph.nodes), v if isinstance(v, Value) else None, brk))

    def graph_break(self, reason):
        brk = GraphBreak(reason, user_frame())
        self.breaks.append(brk)
        if self.broken is None:
            self.broken = brk
            if self.fullgraph:
                raise brk

    # --- ops ----------------------------------------------------------------------------
    def interpret(self, o, args, params):
        if self.broken:
            return dispatch(o, args, params)
        if o.elementwise:  # its to_dtype/broadcast_to are ops of the graph too
            if any(type(a) is np.ndarray and id(a) in self.amap for a in args):
                args = [self._known(a) for a in args]  # (a rule's saved param array)
            modes = grad_state.modes
            grad_state.modes = modes + [self]
            try:
                args = _prepare_elementwise(o, args)
            finally:
                grad_state.modes = modes
        variadic = type(args[0]) is list
        flat = args[0] if variadic else args
        ins = [self.value_of(a) for a in flat]
        slotted = None
        for k, p in params.items():
            if isinstance(p, (np.ndarray, Tensor)) or (
                    isinstance(p, (tuple, list)) and any(isinstance(x, (np.ndarray, Tensor))
                                                         for x in p)):
                slotted = self._array_params(params) if slotted is None else slotted
                if slotted:
                    break
                if self.rule_depth:
                    self.dirty = True
                elif _has_mask(p):
                    self.graph_break(f"{o.name}: a boolean-mask index (the result's shape "
                                     "depends on the mask's values)")
                else:
                    self.graph_break(f"{o.name}: an array-valued parameter {k}= computed "
                                     "outside ops")
        out = dispatch(o, args, params)
        if self.broken:
            return out
        d = out._data
        v = self.graph.new_value(d.shape, d.dtype)
        if params.get("inplace") is True and o.name == "copy_slices":
            params = dict(params, inplace=False)  # functional: the write-back is alias()'s
        if slotted:  # integer index arrays of traced tensors: inputs of the node
            key, extra = slotted
            self.graph.nodes.append(Node(None, o.name, ins + extra, key, [v],
                                         impl=_slotted_impl(o, len(ins), variadic),
                                         meta={"op": o, "n_in": len(ins)}))
        else:
            self.graph.nodes.append(Node(o, o.name, ins, params, [v], variadic=variadic))
        self._bind(out, v)
        if out._requires_grad:
            self.rg_values.add(id(v))
        return out

    def _known(self, a):
        """A traced array as a Tensor standing for its Value (``_prepare_elementwise`` would
        copy a bare array into an unknown tensor)."""
        v = self.amap.get(id(a)) if type(a) is np.ndarray else None
        if v is None:
            return a
        t = Tensor._make(a)
        self._bind(t, v)
        return t

    def _array_params(self, params):
        """Params holding arrays that are traced tensors' data (``x[idx]``'s index, saved by
        its rule too; attention's dropout ``keep``): ``(params with each array a Slot, their
        Values)``, or ``()``. Boolean masks stay breaks (a mask index's result shape depends on
        the data)."""
        def find(x):
            v = self.amap.get(id(x))
            b = x.base
            if v is None and type(b) is np.ndarray and b.shape == x.shape and \
                    b.strides == x.strides and b.dtype == x.dtype and \
                    b.ctypes.data == x.ctypes.data:  # a whole view (index.reshape(-1))
                v = self.amap.get(id(b))
            s = self.static.get(id(x)) if v is None else None
            if s is not None and s[0]._data is x and s[0]._version[0] == s[1]:
                v = self.value_of(s[0])  # a literal (a list index, _grid's aranges)
            if v is None or x.dtype.kind == "b":  # a mask: data-dependent shapes
                raise LookupError
            return v

        try:
            return slot_params(params, find)
        except LookupError:
            return ()

    def record(self, name, impl, inputs, params, arrays, effect=False, meta=None):
        """Record a compiler-level node whose outputs are ``arrays``; returns their Values."""
        outs = [self.graph.new_value(a.shape, a.dtype) for a in arrays]
        self.graph.nodes.append(Node(None, name, inputs, params, outs, effect=effect,
                                     impl=impl, meta=meta))
        return outs

    # --- array code outside ops (nn.functional._array_fn / _assign) ------------------------
    def array_fn(self, name, fn, tensors, params, random=False):
        """``fn(*arrays, **params)`` as one node that runs ``fn`` at run time (running
        statistics, pooling indices, gradient clipping): nothing is frozen. ``random``: ``fn``
        draws from a generator; the node is an effect, kept in program order, so the compiled
        call draws the same numbers from the same stream as the eager call."""
        arrays = [t._data for t in tensors]

        def eager():
            out = fn(*arrays, **params)
            return tuple(map(Tensor._make, out)) if isinstance(out, tuple) else \
                Tensor._make(out)

        if self.broken:
            return eager()
        if random and self._rng_changed():  # an earlier draw the trace did not see
            self.graph_break(_RNG_BREAK)
            return eager()
        ins = [self.value_of(t) for t in tensors]
        if self.broken:
            return eager()
        out = fn(*arrays, **params)
        multi = isinstance(out, tuple)
        outs = [np.asarray(a) for a in (out if multi else (out,))]
        if random:
            self.rng = [(gen, gen._rng.bit_generator.state) for gen, _ in self.rng]
        vals = self.record(name, _array_impl(fn, multi), ins, params, outs, effect=random,
                           meta={"random": True} if random else None)
        result = []
        for a, v in zip(outs, vals):
            t = Tensor._make(a)
            self._bind(t, v)
            result.append(t)
        return tuple(result) if multi else result[0]

    def alias(self, dst, src):
        """``dst`` stands for ``src``'s value (``inplace._inplace``: the copy of the input, then
        the tensor after the write); an external tensor written so is written back."""
        if self.broken:
            return
        e = self.tmap.get(id(src))
        if e is None or e[0] is not src:
            c = self.census.get(id(src))  # state not read yet (the base of a view written)
            if c is None or c[0] is not src or src._version[0] != c[1]:
                return
            self.value_of(src)
            e = self.tmap[id(src)]
        self._bind(dst, e[1])
        c = self.census.get(id(dst))
        if c is not None and c[0] is dst:
            self.mutated[id(dst)] = dst

    def constant(self, t):
        """``t`` (made outside ops from shapes and params only) is a constant of the graph."""
        self.static[id(t._data)] = (t, t._version[0])

    def index_grid(self, key, d):
        """The hook point of ``indexing._grid`` (the advanced-index key of gather, scatter,
        take_along_dim...): its ``arange`` components (all but ``d``) are made from shapes
        only, so they are constants of the graph; the index itself stays the traced tensor's
        array (an input of the node)."""
        if not self.broken:
            for k, a in enumerate(key):
                if k != d:
                    self.constant(Tensor._make(a))

    def made_from_shapes(self, t):
        """The hook point of the factories (``creation.FROM_SHAPES``) and of backward's
        implicit ones: ``t`` is a constant of the graph (as torch.compile specialises it),
        not a break."""
        if not self.broken:
            self.static[id(t._data)] = (t, t._version[0])

    def assign(self, t, value):
        """``t`` takes ``value`` in place (no grad): later reads see the new Value; a tensor
        from outside the call is written back at the end of the compiled call."""
        def eager():
            np.copyto(t._data, value._data, casting="unsafe")
            t._version[0] += 1
            return t

        if self.broken:
            return eager()
        if value._data.shape != t._data.shape or value._data.dtype != t._data.dtype:
            self.graph_break(f"an in-place write of {value._data.dtype}{list(value.shape)} "
                             f"into {t._data.dtype}{list(t.shape)}")
            return eager()
        self.value_of(t)  # (its shape and dtype are guarded)
        v = self.value_of(value)
        if self.broken:
            return eager()
        eager()
        self.tmap[id(t)] = [t, v, t._version[0]]
        c = self.census.get(id(t))
        if c is not None and c[0] is t:
            self.mutated[id(t)] = t
        return t

    def setitem(self, t, index, value, base):
        """``t[index] = value`` on a traced tensor, functionalised: the out-of-place op
        (``index_put``; ``copy_slices`` for a basic index in grad mode; ``where`` for a
        boolean mask, whose written shape is static) on ``t``'s value, written back into
        ``t``'s buffer, ``t`` (and a view's base) then standing for the result. In grad mode
        this is eager's own in-place machinery (``inplace._inplace``: ``t`` takes over the
        result's history, views are rebased) with every tensor it makes known to the trace;
        a Python number assigned becomes a literal of the graph and a list index a constant."""
        from tapegrad.inplace import _differentiable, _inplace

        if self.broken:
            return base(t, index, value)
        tracked = _differentiable(t, (value,))
        masked = _mask_write(t, index, value)
        if masked is None:
            index = self._literal_index(index)
            if tracked and isinstance(value, (bool, int, float)):
                lit = Tensor._make(np.asarray(value, dtype=t._data.dtype))
                self.constant(lit)
                self.held.append(lit)
                value = lit
        if tracked:
            if masked is None:
                return base(t, index, value)
            _inplace(t, "__setitem__", masked, (value,), {})
            return None
        if t._data.base is not None and type(getattr(t, "_view", None)) is tuple:
            return base(t, index, value)  # a view: its base changes too (read later: a break)
        self.value_of(t)
        if self.broken:
            return base(t, index, value)
        from tapegrad.ops import indexing

        write = masked or (lambda a, v: indexing.index_put(a, v, index=index))
        prev, grad_state.enabled = grad_state.enabled, False
        try:
            new = write(t, value)
        except (RuntimeError, ValueError, IndexError, TypeError):
            new = None  # eager's path below raises its own error for this write
        finally:
            grad_state.enabled = prev
        if new is None or self.broken or new._data.shape != t._data.shape or \
                new._data.dtype != t._data.dtype:
            return base(t, index, value)
        np.copyto(t._data, new._data)
        t._version[0] += 1
        self.tmap[id(t)] = [t, self.tmap[id(new)][1], t._version[0]]
        c = self.census.get(id(t))
        if c is not None and c[0] is t:
            self.mutated[id(t)] = t
        return None

    def _literal_index(self, index):
        """``index`` with each list of Python ints a constant of the graph (an int64 tensor
        the node reads, as ``Tensor.__getitem__`` reads the list) instead of an array made
        outside ops."""
        if type(index) is tuple:
            return tuple(self._literal_index(i) for i in index)
        if type(index) is list and _int_list(index):
            lit = Tensor._make(np.asarray(index, dtype=np.int64))
            self.constant(lit)
            self.held.append(lit)
            return lit
        return index

    # --- backward -----------------------------------------------------------------------
    def trace_backward(self, roots, root_grads, retain_graph, inputs):
        """Called by ``engine.run_backward``: rerun it with the rules recorded as ops."""
        if self.broken:
            return self._untraced_backward(roots, root_grads, retain_graph, inputs)
        self.n_backward += 1
        start = len(self.graph.nodes)
        span = [tuple(self.tmap[id(r)][1] if id(r) in self.tmap else None for r in roots),
                tuple(self.tmap[id(g)][1] if isinstance(g, Tensor) and id(g) in self.tmap
                      else None for g in root_grads)]
        leaves = [t for t, *_ in self.census.values() if t._requires_grad]
        before = [t.grad for t in leaves]
        grads = []
        for r, g in zip(roots, root_grads):
            if isinstance(g, Tensor):
                grads.append(g)
                continue
            g = np.asarray(g)
            t = Tensor._make(g)
            v = self.amap.get(id(g))
            if v is None:
                flat = g.reshape(-1)
                if flat.size and (flat == flat[0]).all():  # the implicit ones of backward()
                    fill = flat[0].item()
                    (v,) = self.record("full", _full, [], {"shape": g.shape, "fill": fill,
                                                           "dtype": g.dtype}, [g])
                else:
                    v = self._constant(g, None)
            self._bind(t, v)
            grads.append(t)
        nodes = engine.toposort([r.grad_fn for r in roots if r.grad_fn is not None])
        ops = [(n, n.op) for n in nodes]
        for n, op in ops:
            n.op = _RuleProxy(op, self)
        try:
            found = engine.run_backward(roots, grads, retain_graph, True, inputs)
            if found is not None:  # autograd.grad / backward(inputs=): the caller wants arrays
                found = [g._data if isinstance(g, Tensor) else g for g in found]
                self.tail_ok = False
            elif not self.broken:
                made = [(t, self.value_of(t.grad)) for t, b in zip(leaves, before)
                        if t.grad is not b and t.grad is not None]
                self.spans[start] = ("backward", len(self.graph.nodes), *span, made)
            return found
        finally:
            for n, op in ops:
                n.op = op

    def _untraced_backward(self, roots, root_grads, retain_graph, inputs):
        modes = grad_state.modes
        grad_state.modes = [m for m in modes if m is not self]
        try:
            return engine.run_backward(roots, root_grads, retain_graph, False, inputs)
        finally:
            grad_state.modes = modes

    def opaque_rule(self, op, g, out, saved, params):
        """A gradient rule as one vjp node: the rule runs on arrays, as eager backward does."""
        ins = [self.value_of(g)]
        arr = [g._data if isinstance(g, Tensor) else g]
        has_out = out is not None
        out_arr = None
        if has_out:
            ins.append(self.value_of(out))
            out_arr = out._data if isinstance(out, Tensor) else out
        for s in saved:
            if isinstance(s, Tensor):
                ins.append(self.value_of(s))
                arr.append(s._data)
            elif isinstance(s, (engine.Node, engine.Meta)):
                shp = _Shape(s.shape, s.dtype)
                ins.append(shp)
                arr.append(shp)
            else:
                ins.append(s)
                arr.append(s)
        grads = op.rule(arr[0], out_arr, *arr[1:], **params)
        if type(grads) not in (tuple, list):
            grads = (grads,)
        pick = tuple(i for i, x in enumerate(grads) if x is not None)
        arrays = [np.asarray(grads[i]) for i in pick]
        impl = _vjp_impl(op.rule, has_out, pick)
        slotted = self._array_params(params) if any(
            isinstance(p, (np.ndarray, Tensor)) or type(p) in (tuple, list) and any(
                isinstance(x, (np.ndarray, Tensor)) for x in p) for p in params.values()) else ()
        if slotted:  # a param that is a traced array (an index, a dropout mask): read each run
            params, extra = slotted
            impl = _slotted_vjp(impl, len(ins))
            ins = ins + extra
        vals = self.record(f"vjp_{op.name}", impl, ins, params, arrays)
        result = [None] * len(grads)
        for i, v, a in zip(pick, vals, arrays):
            t = Tensor._make(a)
            self._bind(t, v)
            result[i] = t
        return tuple(result)

    # --- in-place fast paths and the optimizer ------------------------------------------
    def records_writes(self):
        """Whether an in-place op without grad is recorded now (``inplace._recorder``)."""
        return not self.broken and not self.quiet

    def record_write(self, t, name, fn, args, kwargs):
        """An in-place op without grad (``p -= lr * p.grad``, ``p.data.add_(g, alpha=-lr)``,
        ``buf.mul_(m).add_(g)``, ``p.copy_(new)``, ``g.zero_()``; ``inplace._inplace`` calls
        this): ``fn(t, *args, **kwargs)``, its out-of-place form, is recorded on ``t``'s value
        and its result written into ``t``'s buffer as eager writes it (its checks, cast and
        version bump). Every tensor over that buffer (``t``, the parameter behind a ``.data``)
        then stands for the result; one alive before the call is written back at the end of
        each compiled call. None: not captured (a view of another tensor: eager's write)."""
        if t._data.base is not None and type(getattr(t, "_view", None)) is tuple:
            # its base changes too, and a base reached through ``.data`` does not share the
            # view's version counter: no later read would notice
            self.graph_break(f"Tensor.{name} without grad into a view of another tensor")
            return None
        self._lift(t)
        if self.broken:
            return None
        args = tuple(self._literal(a) for a in args)
        start, before = len(self.graph.nodes), self.tmap[id(t)][1]
        prev, grad_state.enabled = grad_state.enabled, False
        try:
            result = fn(t, *args, **kwargs)
            if self.broken or not isinstance(result, Tensor):
                return None
            from tapegrad.inplace import _write

            _write(t, result._data, name)  # eager's checks and message, cast and bump
            if result._data.dtype != t._data.dtype:
                from tapegrad.ops import elementwise as E

                result = E.to_dtype(result, dtype=t.dtype)
        finally:
            grad_state.enabled = prev
        if self.broken:
            return t
        if result._data.shape != t._data.shape:
            self.graph_break(f"Tensor.{name}: the result does not keep the tensor's shape")
            return t
        v = self.value_of(result)
        key = self._write_key(fn, args, kwargs)
        if key is not None and start not in self.spans and len(self.graph.nodes) > start:
            # a tail replay jumps over the write's nodes when the same write comes with the
            # same operands (replay._TailReplay.record_write)
            self.spans[start] = ("write", len(self.graph.nodes), name, fn, before, key, v)
        self.amap[id(t._data)] = v
        for x in self.holders.get(id(t._data), ()) + [t]:
            if x._data is t._data:
                self.tmap[id(x)] = [x, v, x._version[0]]
                c = self.census.get(id(x))
                if c is not None and c[0] is x:
                    self.mutated[id(x)] = x
        self.wrote = True
        return t

    def _write_key(self, fn, args, kwargs):
        """What decides a write's nodes besides ``fn`` and the written value: the operands'
        Values and the Python scalars by type and exact value; None when ``fn`` closes over
        state (``addcmul_``'s value) or an operand is of another kind."""
        if getattr(fn, "__closure__", True) is not None:
            return None
        key = []
        for a in (*args, *kwargs.items()):
            k = None
            if type(a) is tuple:  # a keyword argument
                k, a = a
            if isinstance(a, Tensor):
                e = self.tmap.get(id(a))
                if e is None or e[0] is not a:
                    return None
                key.append((k, e[1]))
            elif a is None or type(a) in (bool, int, float):
                key.append((k, type(a), repr(a)))
            else:
                return None
        return tuple(key)

    def _lift(self, t):
        """Make ``t`` stand for its value before a write: a tensor over a census tensor's
        array (``p.data`` of a parameter not read yet) stands for that tensor's value."""
        e = self.tmap.get(id(t))
        if (e is None or e[0] is not t) and id(t._data) not in self.amap and \
                self.census.get(id(t), (None,))[0] is not t:
            if self._by_array is None:
                self._by_array = {id(c[0]._data): c[0] for c in self.census.values()}
            owner = self._by_array.get(id(t._data))
            if owner is not None and owner._data is t._data:
                v = self.value_of(owner)
                if not self.broken:
                    self._bind(t, v)
                return
        self.value_of(t)

    def _literal(self, a):
        """A 0-d array an in-place op made from a Python number (``fill_``'s value): a
        constant of the graph."""
        if type(a) is np.ndarray and not a.ndim and id(a) not in self.amap:
            lit = Tensor._make(a)
            self.constant(lit)
            self.held.append(lit)
            return lit
        return a

    def _quietly(self, call, *args):
        """``call(*args)`` with its in-place writes unrecorded (the effect node runs it)."""
        self.quiet += 1
        try:
            return call(*args)
        finally:
            self.quiet -= 1

    def optimizer_step(self, opt, original):
        """``opt.step()`` under the tracer: one effect node running the real update."""
        if self.broken:
            return original(opt)
        start = len(self.graph.nodes)
        stepped = [p for g in opt.param_groups for p in g["params"] if p.grad is not None]
        if _plain_sgd(opt):
            self._trace_sgd(opt, original)
        else:
            self._optimizer_node(opt, original)
        if not self.broken:
            self.spans[start] = ("step", len(self.graph.nodes), opt, tuple(map(id, stepped)),
                                 [(p, self.tmap[id(p)][1]) for p in stepped])

    def _optimizer_node(self, opt, original):
        groups = [[p for p in g["params"] if p.grad is not None] for g in opt.param_groups]
        params = [p for ps in groups for p in ps]
        ins = [self.value_of(p) for p in params] + [self.value_of(p.grad) for p in params]
        if self.broken:
            return original(opt)
        self._quietly(original, opt)
        for p in params:
            self.stepped[id(p)] = p
        impl = _optimizer_impl(opt, original, params)
        outs = self.record("optimizer_step", impl, ins, {"optimizer": type(opt).__name__},
                           [p._data for p in params], effect=True, meta={"optimizer": opt})
        for p, v in zip(params, outs):
            self.tmap[id(p)] = [p, v, p._version[0]]
        return None

    def _trace_sgd(self, opt, original):
        """Plain SGD (no momentum, weight decay, maximize) as IR ops, so the passes can fuse
        and plan it: ``p - lr * g`` per parameter (eager's ``param -= lr * grad``), the
        group's ``lr`` a graph input read at each call (kind "hyper"), the new value written
        back into the parameter's array. Guarded on the group's other hyperparameters."""
        mul, sub = REGISTRY["mul"], REGISTRY["sub"]
        plan = []
        for gi, group in enumerate(opt.param_groups):
            ps = [p for p in group["params"] if p.grad is not None]
            if not ps:
                continue
            lr = self.graph.new_value((), np.float64, "lr")
            self.graph.inputs.append((lr, Input("hyper", index=gi, ref=group, label="lr")))
            self.guards.append(("hyper", group, _sgd_key(group)))
            plan += [(p, lr) for p in ps]
        steps = [(p, self.value_of(p), self.value_of(p.grad), lr) for p, lr in plan]
        if self.broken:
            return original(opt)
        self._quietly(original, opt)
        for p, pv, gv, lr in steps:
            d = p._data
            step = self.graph.new_value(d.shape, p.grad._data.dtype)
            self.graph.nodes.append(Node(mul, "mul", [gv, lr], {}, [step]))
            new = self.graph.new_value(d.shape, d.dtype)
            self.graph.nodes.append(Node(sub, "sub", [pv, step], {}, [new]))
            self.tmap[id(p)] = [p, new, p._version[0]]
            self.stepped[id(p)] = p
            self.mutated[id(p)] = p
        return None

    def zero_grads(self, opt, original, params=None):
        """``opt.zero_grad(set_to_none=False)`` (``params``: ``module.zero_grad(...)``'s, which
        replaces a gradient with a history by a detached one): each ``.grad`` that exists takes
        zeros, as a functionalised write (a ``full`` node; a gradient from before the call is written
        back in place at the end, its version bumped, as eager's; it is guarded to exist); a
        gradient that is None stays None. The old values are never read (no graph input)."""
        module = params is not None
        if params is None:
            params = [p for g in opt.param_groups for p in g["params"]]
        owners = [p for p in params if p._grad is not None]
        if self.broken or any(type(p._grad._data) is not np.ndarray for p in owners):
            return original(opt, False)
        # a gradient that appears later needs its own graph
        self.guards += [("grad", p, None) for p in params if p._grad is None]
        if not owners:
            return None
        start = len(self.graph.nodes)
        for p in owners:
            g = p._grad
            d = g._data
            e = self.tmap.get(id(g))
            if e is not None and e[0] is g and g._version[0] != e[2]:
                self.graph_break("a tensor was modified in place outside ops")
                return original(opt, False)
            (v,) = self.record("full", _full, [], {"shape": d.shape, "fill": 0,
                                                   "dtype": d.dtype}, [np.zeros_like(d)])
            if module and g.grad_fn is not None:
                g = g.detach()
            original_one(g)
            self._bind(g, v)
            if g is not p._grad:
                p.grad = g
            c = self.census.get(id(g))
            if c is not None and c[0] is g:
                self.mutated[id(g)] = g
                self.guards.append(("grad", p, (d.shape, d.dtype)))
        self.spans[start] = ("zero_grad", len(self.graph.nodes), opt,
                             tuple(id(p) for p in params if p._grad is not None))
        return None

    def python_effect(self, name, call, args):
        """A Python call that only changes Python state the graph reads at run time (an LR
        scheduler's ``step()`` sets the LR the optimizer_step node reads): one effect node
        that makes the same call each time the graph runs, in program order."""
        if self.broken or self.in_effect or any(isinstance(a, Tensor) for a in args):
            return call(*args)  # (a tensor argument: read as a value, i.e. a break)
        self.in_effect = True
        try:
            result = self._quietly(call, *args)
        finally:
            self.in_effect = False
        if not self.broken:
            impl = _effect_impl(call, args)
            self.spans[len(self.graph.nodes)] = ("effect", len(self.graph.nodes) + 1, name,
                                                 args)
            self.record(name, impl, [], {}, [], effect=True, meta={"call": call})
        return result

    def joint_backward(self, result):
        """For a forward whose outputs need grad (``compile(model)``): trace the backward of
        its outputs w.r.t. the differentiable inputs, with the output gradients as inputs
        (kind "cot"). Leaves ``.grad`` alone (``autograd.grad``'s capture)."""
        leaves, _ = _flatten(result)
        outs = [t for t in leaves if isinstance(t, Tensor)]
        if not outs or any(not t._requires_grad or t._data.dtype.kind != "f" for t in outs):
            return None
        diff = [(v, src) for v, src in self.graph.inputs
                if src.kind in ("arg", "ref") and self._source_tensor(src).requires_grad]
        if not diff:
            return None
        cots = []
        for k, t in enumerate(outs):
            ct = Tensor._make(np.ones_like(t._data))
            self._add_input(ct, Input("cot", index=k), "ct")
            cots.append(ct)
        tensors = [self._source_tensor(src) for _, src in diff]
        found = self.trace_backward(outs, cots, True, tensors)
        if self.broken:
            return None
        grads = []
        for t, g in zip(tensors, found):
            if g is None:
                g = np.zeros_like(t._data)
                (v,) = self.record("full", _full, [], {"shape": g.shape, "fill": 0.0,
                                                       "dtype": g.dtype}, [g])
            else:
                v = self.amap[id(g)]
            grads.append(v)
        return [self.tmap[id(t)][1] for t in outs], [src for _, src in diff], grads

    def _source_tensor(self, src):
        return self.args[src.index] if src.kind == "arg" else src.ref

    # --- the end ------------------------------------------------------------------------
    def finish(self, result):
        """Outputs, write-backs and the checks only the end can make; restores classes."""
        g = self.graph
        try:
            if not self.broken:
                self._check_rng()
            if not self.broken:
                leaves, tree = _flatten(result)
                g.out_tree = tree
                g.outputs = [self.value_of(x) if isinstance(x, Tensor) else x for x in leaves]
                self._writes()
        finally:
            for t, cls in self.swapped:
                t.__class__ = _untraced_class(t, cls)
            self.swapped = []
            if self.n_backward:  # eager leaves own plain gradients, never a rule's array
                for t, _, grad, _ in self.census.values():
                    gr = t.grad
                    if gr is not grad and gr is not None:
                        t.grad = Tensor._make(np.array(gr._data))
        return g

    def _rng_changed(self):
        return any(gen._rng.bit_generator.state != state for gen, state in self.rng)

    def _check_rng(self):
        if self._rng_changed():
            self.graph_break(_RNG_BREAK)

    def _writes(self):
        g = self.graph
        for key, (t, version, grad, grad_version) in self.census.items():
            if t._version[0] != version and key not in self.mutated and key not in \
                    self.stepped:
                self.graph_break(f"tensor {_label(t)} was modified in place outside ops")
                return
            if t.grad is not grad or (grad is not None and grad._version[0] != grad_version
                                      and id(grad) not in self.mutated):
                if t.grad is None:
                    g.writes.append(("grad", t, _label(t), None))
                else:
                    v = self.value_of(t.grad)
                    if self.broken:
                        return
                    g.writes.append(("grad", t, _label(t), v))
                self.guards.append(("grad", t, None if grad is None else
                                    (grad._data.shape, grad._data.dtype)))
        for key, t in self.mutated.items():
            g.writes.append(("data", t, _label(t), self.tmap[key][1]))
            # the version bumps eager made (a write-back bumps once): ``buf.mul_(m).add_(g)``
            # two, a write through ``p.data`` none (its own counter)
            bumps = t._version[0] - self.census[key][1]
            if bumps != 1:
                self.extra_bumps[len(g.writes) - 1] = bumps - 1
        for v, src in g.inputs:
            if src.kind == "grad":
                gr = src.ref.grad
                self.guards.append(("grad", src.ref, None if gr is None else
                                    (gr._data.shape, gr._data.dtype)))


_RNG_BREAK = "random numbers were drawn (dropout, rand...): each call needs fresh ones"


def _subclasses(cls):
    """``cls`` and all its live subclasses (those made at run time included)."""
    out, todo = {cls}, [cls]
    while todo:
        for sub in todo.pop().__subclasses__():
            if sub not in out:
                out.add(sub)
                todo.append(sub)
    return out


def _gc_key():
    stats = gc.get_stats()
    return stats[1]["collections"], stats[2]["collections"], gc.get_freeze_count()


class _Census:
    """Every live instance of the Tensor classes and ``random.Generator``, found without a
    walk of the whole heap each time.

    An instance of a Python class refers to its class, so one ``gc.get_referrers`` (in C) finds
    them all, but it visits every object: 25-80 ms once PyTorch, numba or JAX are imported.
    Objects are born in generation 0 and reach generation 2 only in a collection of generation
    1 or 2 (CPython 3.11-3.13's gc). So the census keeps weak references to what it found, a gc
    callback adds the young generations' instances at the start of each such collection, and
    the next census is those still alive plus the young generations' (a few thousand objects).
    A collection the callback did not see voids the reuse: the next census walks the heap.
    The callback costs ~0.3 ms a collection (up to 8% of a loop that only allocates objects it
    keeps), so after ``IDLE`` collections without a census it stops carrying (a long eager run
    after compiling pays no more; the next compile walks the heap once).
    """

    def __init__(self, generator_class):
        self.generator_class = generator_class
        self.key = None  # the gc counts for which ``refs`` holds every instance born before
        self.refs = {}  # id -> weakref.KeyedRef, removed when its instance dies
        self.carried = False  # the callback carried the census into the running collection
        self.lock = threading.Lock()
        self.hooked = False
        self.idle = 0  # collections carried since the last census

    IDLE = 50

    def classes(self):
        return _subclasses(Tensor) | {self.generator_class}

    def _young(self, classes, seen=()):
        return [o for g in (0, 1) for o in gc.get_objects(g)
                if type(o) in classes and id(o) not in seen]

    def _keep(self, objs):
        refs = self.refs
        for o in objs:
            r = refs.get(id(o))
            if r is None or r() is not o:
                refs[id(o)] = weakref.KeyedRef(o, self._drop, id(o))

    def _drop(self, ref):  # a kept instance died: its reference goes with it
        if self.refs.get(ref.key) is ref:
            self.refs.pop(ref.key, None)

    def on_gc(self, phase, info):
        if info["generation"] == 0 or self.key is None:
            return
        if phase == "stop":
            if self.carried:
                self.carried, self.key = False, _gc_key()
            return
        if not self.lock.acquire(blocking=False):  # a census is running in another thread
            self.key = None
            return
        try:
            if _gc_key() == self.key:
                self._keep(self._young(self.classes()))
                self.carried = True
                self.idle += 1
                if self.idle > self.IDLE:
                    self.key, self.carried = None, False
            else:
                self.key = None
        except Exception:  # (interpreter shutdown): the next census walks the heap
            self.key, self.carried = None, False
        finally:
            self.lock.release()

    def live(self):
        """The live instances: the kept ones still alive, then the young generations' new ones
        (or, without a valid census, all of them in the order of a heap walk)."""
        enabled = gc.isenabled()
        gc.disable()  # no collection (nor callback) while the census is taken
        try:
            with self.lock:
                classes, key, found = self.classes(), _gc_key(), None
                if self.key == key:
                    old = [o for o in (r() for r in list(self.refs.values())) if o is not None]
                    found = old + self._young(classes, set(map(id, old)))
                    if _gc_key() != key:  # another thread's gc.collect() moved objects on
                        found = None
                if found is None:
                    found = [o for o in gc.get_referrers(*classes) if type(o) in classes]
                self._keep(found)
                self.idle = 0
                if (3, 11) <= sys.version_info[:2] < (3, 14):
                    self.key = key
                    if not self.hooked:
                        gc.callbacks.append(self.on_gc)
                        self.hooked = True
                return found
        finally:
            if enabled:
                gc.enable()


_CENSUS = []  # the one _Census, made at the first trace


def _live():
    if not _CENSUS:
        from tapegrad import random as _random

        _CENSUS.append(_Census(_random.Generator))
    return _CENSUS[0].live()


def _parameter():
    from tapegrad.nn.parameter import Parameter

    return Parameter


def _label(t):
    return f"{type(t).__name__}{list(t.shape)}@{id(t) % 10007}"


def _sgd_key(group):
    get = group.get  # checked on every compiled call: no generator
    return (get("momentum"), get("weight_decay"), get("maximize"), get("nesterov"))


def _plain_sgd(opt):
    """An SGD whose step is ``p -= lr * g`` for every parameter (traced as ops)."""
    from tapegrad.optim.sgd import SGD

    if type(opt) is not SGD or type(opt).step is not _optimizer_step_hook():
        return False
    for group in opt.param_groups:
        if _sgd_key(group) != (0, 0, False, False) or type(group["lr"]) not in (int, float):
            return False
        for p in group["params"]:
            g = p.grad
            if g is not None and (g._data.dtype != p._data.dtype or g._data.shape !=
                                  p._data.shape or p._data.dtype.kind != "f"):
                return False
    return True


def original_one(g):
    """What ``Optimizer.zero_grad(set_to_none=False)`` does to one gradient (an array)."""
    if g.grad_fn is not None:
        g.detach_()
    else:
        g._requires_grad = False
    g._data[...] = 0
    g._version[0] += 1


def _optimizer_step_hook():
    from tapegrad.optim.optimizer import Optimizer

    return Optimizer.step


def _full(shape, fill, dtype):
    return np.full(shape, fill, dtype=dtype)


class Slot:
    """In a node's params: the array that is the node's input ``n_in + j`` at run time."""

    __slots__ = ("j",)

    def __init__(self, j):
        self.j = j

    def __eq__(self, other):
        return type(other) is Slot and other.j == self.j

    def __hash__(self):
        return hash(("Slot", self.j))

    def __repr__(self):
        return f"<input {self.j}>"


def fill_slots(p, extra):
    """``p`` with each Slot replaced by its array from ``extra``."""
    if type(p) is Slot:
        return extra[p.j]
    if type(p) in (tuple, list):
        return type(p)(fill_slots(x, extra) for x in p)
    return p


def slot_params(params, find):
    """``(params with each array a Slot, their Values)``: every array (or Tensor's array) in
    ``params``, nested in tuples and lists too, becomes ``Slot(j)`` with ``find(array)`` the
    ``j``-th Value; ``find`` raises LookupError for an array that cannot be a slot."""
    extra = []

    def slot(x):
        if isinstance(x, Tensor):
            x = x._data
        if isinstance(x, np.ndarray):
            extra.append(find(x))
            return Slot(len(extra) - 1)
        if type(x) in (tuple, list):
            return type(x)(slot(y) for y in x)
        return x

    return {k: slot(p) for k, p in params.items()}, extra


def _slotted_impl(o, n_in, variadic):
    def impl(*arrays, **params):
        ins, extra = arrays[:n_in], arrays[n_in:]
        params = {k: fill_slots(p, extra) for k, p in params.items()}
        return o.forward(list(ins), **params) if variadic else o.forward(*ins, **params)

    impl.__name__ = o.name
    return impl


def _slotted_vjp(vjp, n_in):
    def impl(*arrays, **params):
        extra = arrays[n_in:]
        return vjp(*arrays[:n_in], **{k: fill_slots(p, extra) for k, p in params.items()})

    impl.__name__ = vjp.__name__
    return impl


def _effect_impl(call, args):
    def python_effect():
        call(*args)
        return ()

    python_effect.__name__ = getattr(call, "__name__", "python_effect")
    return python_effect


def _array_impl(fn, multi):
    def array_fn(*arrays, **params):
        out = fn(*arrays, **params)
        return tuple(np.asarray(a) for a in out) if multi else np.asarray(out)

    array_fn.__name__ = getattr(fn, "__name__", "array_fn").strip("_") or "array_fn"
    return array_fn


def _optimizer_impl(opt, original, params):
    from tapegrad.tensor import Tensor as T

    wanted = {id(p) for p in params}

    def optimizer_step(*arrays, optimizer=None):
        n = len(params)
        others = [(p, p.grad) for grp in opt.param_groups for p in grp["params"]
                  if id(p) not in wanted and p.grad is not None]
        for p, _ in others:
            p.grad = None
        for p, gr in zip(params, arrays[n:]):
            p.grad = T._make(gr)
        try:
            original(opt)
        finally:
            for p, gr in others:
                p.grad = gr
        return tuple(p._data for p in params)

    return optimizer_step


def _flatten(obj):
    """Leaves (Tensors and other values) and a tree to rebuild ``obj`` from new leaves."""
    leaves = []

    def walk(o):
        if isinstance(o, Tensor):
            leaves.append(o)
            return ("leaf", len(leaves) - 1)
        if isinstance(o, (tuple, list)) and type(o) in (tuple, list):
            return (type(o), [walk(x) for x in o])
        if type(o) is dict:
            return (dict, [(k, walk(x)) for k, x in o.items()])
        leaves.append(o)
        return ("leaf", len(leaves) - 1)

    return leaves, walk(obj)


def unflatten(tree, leaves):
    kind, body = tree
    if kind == "leaf":
        return leaves[body]
    if kind is dict:
        return {k: unflatten(x, leaves) for k, x in body}
    return kind(unflatten(x, leaves) for x in body)


# --- optimizer.step() and backward() come to the tracer ----------------------------------
def trace_call(fn, args, kwargs=None, fullgraph=False, joint=False, split_reads=False):
    """Run ``fn(*args, **kwargs)`` under a Tracer: ``(result, graph or None, tracer)``."""
    tr = Tracer(args)
    tr.kwargs = kwargs or {}  # (entries.Entry names the tensors passed so by keyword)
    tr.fullgraph = fullgraph
    tr.split_reads = split_reads
    try:
        with tr:
            result = fn(*args, **(kwargs or {}))
            if joint and not tr.broken and not tr.splits and grad_state.enabled and \
                    not tr.n_backward and not any(n.effect for n in tr.graph.nodes):
                tr.joint = tr.joint_backward(result)
        graph = tr.finish(result)
    except BaseException:
        for t, cls in tr.swapped:
            t.__class__ = _untraced_class(t, cls)
        tr.swapped = []
        raise
    if tr.broken and fullgraph:
        raise tr.broken
    return result, (None if tr.broken else graph), tr


def trace(fn, *args, **kwargs):
    """As ``torch.fx.symbolic_trace``/``jax.make_jaxpr``: run ``fn(*args)`` once (eagerly,
    side effects included) and return its graph (``print(graph)`` reads it).

    >>> g = tapegrad.compiler.trace(lambda x: (x * 2).sum(), tapegrad.ones(3))
    >>> print(g)
    """
    _, graph, tr = trace_call(fn, args, kwargs, fullgraph=True)
    return graph


