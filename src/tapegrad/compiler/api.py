"""``tapegrad.compile``: trace on the first call, optimise, generate code; guards and a cache.

Each call checks the cached entries' guards (argument shapes, dtypes and requires_grad, and
which arguments are one tensor, never their identity: what the graph reads or writes of an
argument, its ``.grad`` included, is that call's; the identity of an argument that is also
state the function reads by reference; non-tensor arguments by value; the shapes of tensors
the graph reads by reference; whether each gradient it reads or writes exists; grad mode;
the training flags of the modules it can see). A hit runs the generated code; a miss traces
again (that call runs eagerly while it is recorded, so its result is exact), up to
``cache_size_limit`` entries per function, then the function runs eagerly with a warning.
A call whose trace hits a graph break runs to the end eagerly; further calls with the same
argument types run eagerly at once. A function that runs eagerly on most of its calls warns
once per reason (``CompileFallbackWarning``, with the reason and the user's line).
"""
import os
import sys
import threading
import time
import warnings

import numpy as np

from tapegrad.autograd.grad_mode import state as grad_state
from tapegrad.compiler import passes
from tapegrad.compiler.pipeline import lower
from tapegrad.compiler.ir import Graph, Input, Value
from tapegrad.compiler.entries import (Entry, SplitEntry, TailEntry, _check_inputs,
                                      _guard_label, _splittable, _tail_reads)
from tapegrad.compiler.guards import (_SCALARS, StateGuard, Unguardable, _modules_of, _resolve,
                                     _spec, _state_tensors, mode_key)
from tapegrad.compiler.tracer import (GraphBreak, trace_call, unflatten,
                                      user_frame)
from tapegrad.compiler.tracer import active as active_tracer
from tapegrad.tensor import Tensor

cache_size_limit = 8  # as torch._dynamo.config.cache_size_limit
# a compiled function warns (CompileFallbackWarning) once this many calls did not trace and
# more than half of them ran eagerly
FALLBACK_MIN_CALLS = 3


class CompileFallbackWarning(UserWarning, RuntimeWarning):
    """A compiled function runs eagerly on most of its calls: the reason and the user's source
    line (``CompiledFunction.fallbacks`` keeps them). Shown once per function and reason. A
    ``RuntimeWarning`` too, as the cache-size-limit warning always was."""
_calls = threading.local()  # .depth: compiled calls running in this thread
_tracing = threading.RLock()
DEBUG = os.environ.get("TAPEGRAD_COMPILE_DEBUG", "") not in ("", "0")
LOG_KINDS = ("graphs", "passes", "code", "breaks", "guards")


def log_kinds():
    """What ``TAPEGRAD_LOGS`` asks to print (as ``TORCH_LOGS``), read at each compile:
    ``graphs`` (traced and optimised IR), ``passes`` (node counts per pass), ``code`` (the
    generated source), ``breaks`` (graph breaks with source lines), ``guards``; ``all``.
    ``TAPEGRAD_COMPILE_DEBUG=1`` is ``graphs,code``."""
    want = {k.strip() for k in os.environ.get("TAPEGRAD_LOGS", "").split(",") if k.strip()}
    if "all" in want:
        want = set(LOG_KINDS)
    bad = want - set(LOG_KINDS)
    if bad:
        raise ValueError(f"TAPEGRAD_LOGS: unknown {sorted(bad)}; expected a comma-separated "
                         f"subset of {list(LOG_KINDS)} or 'all'")
    if DEBUG or os.environ.get("TAPEGRAD_COMPILE_DEBUG", "") not in ("", "0"):
        want |= {"graphs", "code"}
    return want


def _log(name, kind, text):
    print(f"[tapegrad.compile {kind}] {name}\n{text}", file=sys.stderr)


def _inside_transform():
    """Why a compiled graph cannot run here (None when it can): under ``jvp``/``vmap`` (a
    replay of numpy code would skip their tangents and batching) or under two reverse-mode
    transforms (``grad(grad(...))``: the compiled backward is not differentiable)."""
    from tapegrad.func._forward import ForwardLevel
    from tapegrad.func._transforms import reverse_depth
    from tapegrad.func._vmap import VmapLevel

    for m in grad_state.modes:
        if isinstance(m, (ForwardLevel, VmapLevel)):
            kind = "jvp/jacfwd" if isinstance(m, ForwardLevel) else "vmap"
            return (f"called inside a function transform ({kind}): runs eagerly so the "
                    "transform sees each op")
    if reverse_depth() > 1:
        return ("called inside nested reverse-mode transforms (grad of grad): runs eagerly, "
                "the compiled backward is not differentiable")
    return None


class CompiledFunction:
    """What ``tapegrad.compile(fn)`` returns: call it as ``fn``."""

    def __init__(self, fn, fullgraph=False, dynamic=False, backend="tapegrad", mode=None,
                 check=False, passes_=None):
        self.fn = fn
        self.fullgraph = fullgraph
        self.dynamic = dynamic
        self.backend = backend
        self.mode = mode
        self.check = check or os.environ.get("TAPEGRAD_COMPILE_CHECK", "") not in ("", "0")
        self.passes = passes.PASSES if passes_ is None else passes_
        self.entries = []
        self.eager_specs = set()
        self.breaks = []  # GraphBreak, in the order met
        self.inner_fallbacks = []  # (name, GraphBreak): compiled functions it called, eager
        self.compile_times = []  # seconds per trace+compile
        self.n_calls = self.n_hits = 0
        self._last = None
        self._warned = set()  # reasons a CompileFallbackWarning was shown for
        self.n_eager = 0  # calls run eagerly without tracing (a break, a refusal, the limit)
        self.fallbacks = []  # GraphBreak per reason warned about (CompileFallbackWarning)
        self._eager_why = {}  # spec -> the GraphBreak its calls run eagerly for
        self._diverged = None  # the GraphBreak for replays that diverged (SplitEntry/TailEntry)
        self.n_dropped = 0  # replay entries dropped after diverging on their first replay
        self.n_diverged = 0  # hits whose replay diverged and ran eagerly (in n_eager too)
        self._modules = None
        self._state = None  # id -> weakref of the tensors fn reads by reference
        self._lock = threading.RLock()
        self.n_contended = 0  # calls run eagerly: another thread was inside this function
        self.__wrapped__ = fn
        self.__name__ = getattr(fn, "__name__", type(fn).__name__)
        self.__doc__ = getattr(fn, "__doc__", None)

    def _training(self, args):
        if self._modules is None:
            self._modules = _modules_of(self.fn, args)
        return tuple(m.training for m in self._modules)

    def __call__(self, *args, **kwargs):
        why = _inside_transform()
        if why is not None:  # a replay would bypass the transform: eager, with the reason
            self.n_calls += 1
            brk = GraphBreak(why, user_frame())
            if not any(b.reason == why for b in self.breaks):
                self.breaks.append(brk)
                if "breaks" in log_kinds():
                    _log(self.__name__, "breaks", f"{brk.reason}\n    at {brk.where}")
            outer = active_tracer()
            if outer is not None:  # traced by an enclosing compile/explain: tell its report
                outer.inner.append((self.__name__, brk))
            return self.fn(*args, **kwargs)
        # One call at a time: a function's graphs reuse their buffers, placeholders and
        # argument boxes from call to call. A thread already inside a compiled call never
        # waits for another (no two threads can wait on each other): it runs eagerly instead.
        depth = getattr(_calls, "depth", 0)
        if not self._lock.acquire(blocking=not depth):
            self.n_calls += 1
            self.n_contended += 1
            return self.fn(*args, **kwargs)
        _calls.depth = depth + 1
        try:
            return self._call(args, kwargs)
        finally:
            _calls.depth = depth
            self._lock.release()

    def _call(self, args, kwargs):
        self.n_calls += 1
        try:
            spec, flat = _spec(args, kwargs)
        except Unguardable as e:
            self._fell_back(self._break(f"{e}: too large to guard; runs eagerly"))
            return self.fn(*args, **kwargs)
        except RecursionError:
            self._fell_back(self._break("an argument that contains itself cannot be guarded; "
                                        "runs eagerly"))
            return self.fn(*args, **kwargs)
        modes = mode_key()
        training = self._training(args)
        state = self._state
        if state is None:
            state = self._state = _state_tensors(self.fn, self._modules)
        tensors = args if flat is None else flat
        if state and not state.keys().isdisjoint(map(id, tensors)):
            # an argument that is also state the function reads by reference: its identity
            same = tuple((i, id(a)) for i, a in enumerate(tensors)  # is part of the key
                         if id(a) in state and state[id(a)]() is a)
            if same:
                spec = spec + (("S", same),)
        last = self._last  # fast path: the entry that ran last time is checked first
        if last is not None and last.check(spec, modes, training, args, kwargs):
            self.n_hits += 1
            return self._run(last, args, kwargs)
        for e in self.entries:
            if e is not last and e.check(spec, modes, training, args, kwargs):
                self.n_hits += 1
                self._last = e
                return self._run(e, args, kwargs)
        if spec in self.eager_specs:
            self._fell_back(self._eager_why.get(spec))
            return self.fn(*args, **kwargs)
        if len(self.entries) >= cache_size_limit:
            reason = (f"hit the cache size limit ({cache_size_limit} graphs, "
                      "api.cache_size_limit): a call whose guards match none of them runs "
                      "eagerly")
            brk = self._break(reason)
            self._fell_back(brk, now=True)
            return self.fn(*args, **kwargs)
        return self._compile(args, kwargs, spec, modes, training)

    def _fell_back(self, brk, now=False, stacklevel=4):
        """Count a call that ran eagerly for ``brk``'s reason without tracing; warn once per
        reason (``CompileFallbackWarning``) when most calls run eagerly: at least
        ``FALLBACK_MIN_CALLS`` calls that did not trace, more than half of them eager (``now``:
        at once, the cache size limit)."""
        self.n_eager += 1
        if brk is None or brk.reason in self._warned:
            return
        n = self.n_eager + self.n_hits - self.n_diverged
        if now or (n >= FALLBACK_MIN_CALLS and 2 * self.n_eager > n):
            self._warned.add(brk.reason)
            self.fallbacks.append(brk)
            code = getattr(self.fn, "__code__", None)
            defined = f" (defined at {code.co_filename}:{code.co_firstlineno})" if code else ""
            warnings.warn(f"tapegrad.compile: {self.__name__}{defined} runs eagerly on "
                          f"{self.n_eager} of {n} calls that did not trace (the compiler is "
                          "off on this path): "
                          f"{brk.reason} (at {brk.where})", CompileFallbackWarning,
                          stacklevel=stacklevel)  # (the compiled function's caller)

    def _break(self, reason):
        """Record a reason the function runs eagerly (once), as a graph break; returns it."""
        for b in self.breaks:
            if b.reason == reason:
                return b
        brk = GraphBreak(reason, user_frame())
        self.breaks.append(brk)
        if "breaks" in log_kinds():
            _log(self.__name__, "breaks", f"{brk.reason}\n    at {brk.where}")
        return brk

    def _compile(self, args, kwargs, spec, modes, training):
        t0 = time.perf_counter()
        try:  # the Python state it reads, as it is before the call (its own writes included)
            guard = StateGuard(self.fn, args, kwargs, self._modules)
        except Exception as e:  # noqa: BLE001 - state too large or too odd to walk: eager
            guard = e if isinstance(e, Unguardable) else Unguardable(f"{type(e).__name__}: {e}")
        with _tracing:  # one trace at a time: a trace swaps the classes of shared tensors
            result, graph, tracer = trace_call(self.fn, args, kwargs, self.fullgraph,
                                               joint=True, split_reads=True)
        self.inner_fallbacks.extend(tracer.inner)
        logs = log_kinds()
        if graph is not None and tracer.splits:
            if _splittable(graph, tracer):
                entry = SplitEntry(spec, modes, training, graph, tracer, self.passes,
                                   _fname(self.__name__))
                self.breaks.extend(b for _, _, b in tracer.splits)
                self.entries.append(entry)
                self.compile_times.append(time.perf_counter() - t0)
                if "breaks" in logs:
                    _log(self.__name__, "breaks", "\n".join(
                        f"{b.reason}\n    at {b.where}" for _, _, b in tracer.splits))
                if "code" in logs:
                    _log(self.__name__, "code", entry.source)
                return result
            if _tail_reads(graph, tracer):  # e.g. ``loss.item()`` after ``optimizer.step()``
                entry = TailEntry(spec, modes, training, graph, tracer, self.passes,
                                  _fname(self.__name__))
                self.entries.append(entry)
                self.compile_times.append(time.perf_counter() - t0)
                if "graphs" in logs:
                    _log(self.__name__, "graphs", f"# traced ({len(graph.nodes)} nodes)\n"
                         f"{graph}\n# optimised ({len(entry.run_graph.nodes)} nodes)\n"
                         f"{entry.run_graph}")
                if "code" in logs:
                    _log(self.__name__, "code", entry.source)
                return result
            tracer.breaks = [b for _, _, b in tracer.splits[:1]]
            graph = None  # reads inside a training step: eager (below)
        if graph is None:
            self.breaks.extend(tracer.breaks[:1])
            self.eager_specs.add(spec)
            if tracer.breaks:
                self._eager_why[spec] = tracer.breaks[0]
            if "breaks" in logs:
                _log(self.__name__, "breaks", "\n".join(f"{b.reason}\n    at {b.where}"
                                                        for b in tracer.breaks[:1]))
            return result
        if isinstance(guard, Unguardable):
            self._eager_why[spec] = self._break(f"the Python state it reads: {guard}; runs "
                                                "eagerly")
            self.eager_specs.add(spec)
            return result
        entry = Entry(spec, modes, training, graph, tracer)
        entry.state = guard
        entry.keep_args = [a for a in (*args, *kwargs.values())  # (ids in the key stay theirs)
                           if not isinstance(a, Tensor) and type(a) not in _SCALARS]
        if tracer.joint is not None:
            self._build_joint(entry, tracer, args)
        else:
            check = _check_inputs(graph, args) if self.check else None
            entry.graph, entry.source, entry.run = lower(
                graph, self.passes, _fname(self.__name__), log=entry.log, check=check)
            entry.copy_out = _aliased_outputs(entry.graph)
        if "graphs" in logs:
            _log(self.__name__, "graphs", f"# traced ({len(graph.nodes)} nodes)\n{graph}\n"
                 f"# optimised ({len(entry.graph.nodes)} nodes)\n{entry.graph}")
        if "passes" in logs:
            _log(self.__name__, "passes", "\n".join(f"{name:20s} {a:5d} -> {b:5d} nodes"
                                                    for name, a, b in entry.log))
        if "guards" in logs:
            _log(self.__name__, "guards", "\n".join(
                [f"args {spec}", f"modes {modes}", f"training flags {training}"] +
                [f"{kind} {_guard_label(t)} {exp}" for kind, t, exp in entry.checks] +
                entry.state.describe()))
        if "code" in logs:
            _log(self.__name__, "code", entry.source)
        self.entries.append(entry)
        self.compile_times.append(time.perf_counter() - t0)
        return result

    def _run(self, e, args, kwargs=None):
        if isinstance(e, (TailEntry, SplitEntry)):
            before = e.n_fallbacks
            result = e.replay(self.fn, args, kwargs)
            if e.n_fallbacks != before:  # the replay diverged: this call ran eagerly
                self.n_diverged += 1
                if self._diverged is None:
                    self._diverged = GraphBreak(
                        "its Python did something else than the traced call (another branch, "
                        "an op or a read not recorded), so the compiled replay reran the call "
                        "eagerly", user_frame())
                self._fell_back(self._diverged, stacklevel=5)
                if not e.n_replays and self.n_dropped < cache_size_limit and e in self.entries:
                    # never replayed: made by a call unlike the later ones (state the first
                    # call creates, as momentum buffers in a dict): the next call traces anew
                    self.entries.remove(e)
                    self._last = None
                    self.n_dropped += 1
            return result
        if e.joint is not None:
            return e.joint(args, kwargs)
        refs, writes = e.bind(args, kwargs)
        arrays = e.run(args, refs, writes)
        for k, extra in e.bumps:
            writes[k]._version[0] += extra
        outs = [Tensor._make(np.array(a) if k in e.copy_out else a)
                if isinstance(v, Value) else v
                for k, (a, v) in enumerate(zip(arrays, e.graph.outputs))]
        return unflatten(e.graph.out_tree, outs)

    # --- forward graphs that need a backward (compile(model)) ---------------------------
    def _build_joint(self, entry, tracer, args):
        fwd_outs, sources, grads = tracer.joint
        g = tracer.graph
        fwd, bwd, n_saved = _partition(g, fwd_outs, grads)
        log = entry.log
        fwd, fsrc, frun = lower(fwd, self.passes, _fname(self.__name__) + "_forward", log=log)
        bwd, bsrc, brun = lower(bwd, self.passes, _fname(self.__name__) + "_backward", log=log)
        entry.graph = fwd
        entry.backward_graph = bwd
        entry.source = fsrc + "\n" + bsrc
        refs = [src.ref if src.kind in ("ref", "grad") else None for _, src in fwd.inputs]
        n_out = len(fwd_outs)
        diff_refs = [s.ref for s in sources if s.kind == "ref"]
        arg_pos = [s.index for s in sources if s.kind == "arg"]
        tree = g.out_tree
        out_values = g.outputs
        from tapegrad.autograd.function import Function

        class Compiled(Function):
            @staticmethod
            def forward(ctx, *tensors):
                call_args = tensors[:len(args_box[0])]
                arrays = frun(call_args, args_box[1], args_box[2])
                ctx.saved_arrays = arrays[n_out:]
                return tuple(Tensor._make(a) for a in arrays[:n_out])

            @staticmethod
            def backward(ctx, *gouts):
                cots = [np.zeros(v.shape, v.dtype) if gr is None else gr._data
                        for gr, v in zip(gouts, fwd_outs)]
                found = brun(list(ctx.saved_arrays) + cots, [None] * len(bwd.inputs), [])
                n_args = len(args_box[0])
                result = [None] * (n_args + len(diff_refs))
                k = 0
                for s, a in zip(sources, found):
                    if s.kind == "arg":
                        result[s.index] = Tensor._make(a)
                    else:
                        result[n_args + k] = Tensor._make(a)
                        k += 1
                return tuple(result)

        Compiled.__name__ = _fname(self.__name__) + "Compiled"
        args_box = [args, refs, []]  # this call's arguments, refs and write-back targets
        ref_places = [(i, entry.arg_places[id(r)] + (False,)) for i, r in enumerate(refs)
                      if r is not None and id(r) in entry.arg_places]

        def run(call_args, call_kwargs=None):
            args_box[0] = call_args
            args_box[2] = entry.bind(call_args, call_kwargs)[1]
            if ref_places:
                args_box[1] = list(refs)
                for i, place in ref_places:
                    args_box[1][i] = _resolve(place, call_args, call_kwargs)
            diff = diff_refs if not ref_places else \
                [entry.here(r, call_args, call_kwargs) for r in diff_refs]  # (kwargs)
            outs = Compiled.apply(*call_args, *diff)
            for k, extra in entry.bumps:
                args_box[2][k]._version[0] += extra
            outs = outs if isinstance(outs, tuple) else (outs,)
            it = iter(outs)
            leaves = []
            for v in out_values:
                leaves.append(next(it) if isinstance(v, Value) else v)
            return unflatten(tree, leaves)

        del arg_pos
        entry.joint = run
        entry.n_saved = n_saved


def _aliased_outputs(graph):
    """Outputs that are inputs, constants or repeated: copied so callers own them."""
    plain = {id(v) for v, _ in graph.inputs} | {id(v) for v in graph.consts}
    seen, copy = set(), set()
    for k, v in enumerate(graph.outputs):
        if isinstance(v, Value):
            if id(v) in plain or id(v) in seen:
                copy.add(k)
            seen.add(id(v))
    return copy


def _partition(g, fwd_outs, grads):
    """Split a joint graph into forward and backward graphs (AOTAutograd's default partition):
    nodes that do not depend on the output gradients run in the forward; the forward's values
    the backward reads are saved (extra forward outputs, first inputs of the backward)."""
    cot = {id(v) for v, src in g.inputs if src.kind == "cot"}
    needs_cot = set(cot)
    for n in g.nodes:
        if any(isinstance(a, Value) and id(a) in needs_cot for a in n.inputs):
            needs_cot.update(id(v) for v in n.outputs)
    fwd_nodes = [n for n in g.nodes if not any(id(v) in needs_cot for v in n.outputs)]
    bwd_nodes = [n for n in g.nodes if any(id(v) in needs_cot for v in n.outputs)]
    made_in_bwd = {id(v) for n in bwd_nodes for v in n.outputs} | cot
    saved, seen = [], set()
    for v in [a for n in bwd_nodes for a in n.inputs] + list(grads):
        if isinstance(v, Value) and id(v) not in made_in_bwd and id(v) not in seen:
            seen.add(id(v))
            saved.append(v)
    fwd = Graph()
    fwd._names = g._names
    fwd.inputs = [(v, s) for v, s in g.inputs if s.kind != "cot"]
    fwd.consts = dict(g.consts)
    fwd.nodes = fwd_nodes
    fwd.outputs = list(fwd_outs) + saved
    fwd.writes = list(g.writes)  # write-backs (a buffer, a .grad zeroed) run in the forward
    bwd = Graph()
    bwd._names = g._names
    bwd.inputs = [(v, Input("array", index=k)) for k, v in enumerate(saved)]
    cots = [v for v, s in g.inputs if s.kind == "cot"]
    bwd.inputs += [(v, Input("array", index=len(saved) + k)) for k, v in enumerate(cots)]
    bwd.consts = dict(g.consts)
    bwd.nodes = bwd_nodes
    bwd.outputs = list(grads)
    return passes.dce(fwd), bwd, len(saved)


def _fname(name):
    return "".join(c if c.isalnum() else "_" for c in name) or "compiled"


class CompiledModule:
    """What ``tapegrad.compile(module)`` returns (PyTorch's ``OptimizedModule``): calling it
    runs the compiled forward; attributes are the module's."""

    def __init__(self, module, **options):
        object.__setattr__(self, "_orig_mod", module)
        object.__setattr__(self, "_compiled", CompiledFunction(module.__call__, **options))

    def __call__(self, *args, **kwargs):
        return self._compiled(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._orig_mod, name)

    def __setattr__(self, name, value):
        setattr(self._orig_mod, name, value)

    def __repr__(self):
        return f"CompiledModule({self._orig_mod!r})"


def compile(model=None, *, fullgraph=False, dynamic=False, backend="tapegrad", mode=None,
            options=None, disable=False):
    """As ``torch.compile``: trace ``model`` (a function or an ``nn.Module``) on its first
    call, optimise the graph and run generated code on later calls whose guards hold.

    >>> step = tapegrad.compile(train_step)       # forward, backward(), optimizer.step()
    >>> model = tapegrad.compile(model)           # forward compiled; backward a compiled graph
    """
    if model is None:
        return lambda m: compile(m, fullgraph=fullgraph, dynamic=dynamic, backend=backend,
                                 mode=mode, options=options, disable=disable)
    if disable:
        return model
    if backend not in ("tapegrad", "inductor", "eager", None) and not callable(backend):
        raise ValueError(f"tapegrad.compile: unknown backend {backend!r}; tapegrad compiles "
                         "with its own ('tapegrad')")
    opts = dict(options or {})
    kw = dict(fullgraph=fullgraph, dynamic=dynamic, backend=backend, mode=mode,
              check=bool(opts.get("check", False)))
    from tapegrad.nn.module import Module

    if isinstance(model, Module):
        return CompiledModule(model, **kw)
    if not callable(model):
        raise TypeError(f"tapegrad.compile: expected a function or nn.Module, got "
                        f"{type(model).__name__}")
    return CompiledFunction(model, **kw)


class ExplainOutput:
    """What ``explain(fn)(*args)`` returns (as ``torch._dynamo.explain``)."""

    def __init__(self, graphs, breaks, pass_log, inner_fallbacks=(), fallbacks=(), calls=None):
        self.graphs = graphs
        self.graph_count = len(graphs)
        self.graph_break_count = len(breaks)
        self.break_reasons = breaks
        self.pass_log = pass_log
        # compiled functions the traced call called that ran eagerly (under jvp/vmap or grad
        # of grad): (name, GraphBreak with the reason and the calling line). Their ops were
        # traced into this graph, so they are no break of it, but they did not run compiled
        self.inner_fallbacks = list(inner_fallbacks)
        # the reasons the function ran eagerly on most calls (CompileFallbackWarning), and
        # (calls, compiled calls, eager calls without a trace) over its life
        self.fallbacks = list(fallbacks)
        self.calls = calls

    def __str__(self):
        lines = [f"Graph Count: {self.graph_count}",
                 f"Graph Break Count: {self.graph_break_count}"]
        if self.break_reasons:
            lines.append("Break Reasons:")
            for b in self.break_reasons:
                lines.append(f"  {b.reason}\n    at {b.where}")
        if self.inner_fallbacks:
            lines.append("Compiled functions called inside that ran eagerly:")
            for name, b in self.inner_fallbacks:
                lines.append(f"  {name}: {b.reason}\n    at {b.where}")
        if self.calls is not None:
            n, hits, eager = self.calls
            lines.append(f"Calls: {n} ({hits} compiled, {eager} eager, {n - hits - eager} "
                         "traced or other)")
        if self.fallbacks:
            lines.append("Runs eagerly on most calls:")
            for b in self.fallbacks:
                lines.append(f"  {b.reason}\n    at {b.where}")
        if self.pass_log:
            lines.append("Passes (nodes before -> after):")
            for name, a, b in self.pass_log:
                lines.append(f"  {name:15s} {a:5d} -> {b:5d}")
        return "\n".join(lines)


def explain(fn):
    """``explain(fn)(*args)``: trace one call and report graphs, breaks and pass counts, and
    the compiled functions ``fn`` called that ran eagerly (``inner_fallbacks``). Given a
    ``CompiledFunction``, the call is one more of its calls and the report covers its whole
    life: every graph and break, how many calls ran compiled or eagerly, and the reasons it
    runs eagerly on most calls (``fallbacks``, as its ``CompileFallbackWarning`` said)."""
    def run(*args, **kwargs):
        c = fn if isinstance(fn, CompiledFunction) else CompiledFunction(fn)
        c(*args, **kwargs)
        log = [x for e in c.entries for x in e.log]
        graphs = [g for e in c.entries for g in getattr(e, "graphs", [e.graph])]
        return ExplainOutput(graphs, c.breaks, log, c.inner_fallbacks, c.fallbacks,
                             (c.n_calls, c.n_hits - c.n_diverged, c.n_eager))

    return run


__all__ = ["compile", "explain", "CompiledFunction", "CompiledModule", "GraphBreak",
           "CompileFallbackWarning", "cache_size_limit"]
