"""The tape: Node, toposort and the backward pass.

A Node is one recorded op call. It points at its inputs' producers (``parents``: a Node,
a leaf Tensor that requires grad, or None) and keeps only what the op's gradient rule
declared it needs (``saved``). It never points at its own output Tensor, so a graph is a
DAG of plain references, freed by reference counting the moment its output goes.
"""
import itertools
import threading
import weakref
from heapq import heappop, heappush

from tapegrad.autograd.grad_mode import state as grad_state
from tapegrad.backend import xp

Tensor = None  # set by tapegrad.tensor
# Op watchers (checkpointing, anomaly mode, the memory tracker): objects with before_op(op),
# after_op(op, args, out), before_backward(node), after_backward(node, grads). Entries are
# (thread, watcher): a watcher sees only the ops of the thread that added it, or of every
# thread when that is None (anomaly mode, global as in PyTorch). Empty (the default): dispatch
# pays one check per op; while any thread watches, the others pay a filter per op.
WATCH = []
_watch_lock = threading.Lock()


def add_watcher(watcher, all_threads=False):
    """Show ``watcher`` this thread's ops (every thread's with ``all_threads``)."""
    with _watch_lock:
        WATCH.append((None if all_threads else threading.get_ident(), watcher))


def remove_watcher(watcher):
    with _watch_lock:
        WATCH[:] = [e for e in WATCH if e[1] is not watcher]


def observer(event):
    """The innermost mode of this thread that takes part in the library call ``event``: one
    whose class has a method of that name, or None. Library code calls it at its hook points
    (an optimizer's or scheduler's step, ``zero_grad``, a tensor made from shapes only), so a
    mode such as the compiler's tracer observes them without replacing library functions.
    With no watcher in any thread it costs one check of a global list."""
    if not WATCH:
        return None
    for m in reversed(grad_state.modes):
        if getattr(type(m), event, None) is not None:
            return m
    return None


def hook_point(fn):
    """Mark ``fn`` as a library call that asks ``observer`` whether a mode takes it over (the
    compiler records an optimizer's step as a node of its graph): a compiled function's
    guards do not read the state such a method reads, since the mode sees each call."""
    fn.hook_point = True
    return fn


def watchers():
    """The watchers of the calling thread's ops, oldest first."""
    me = threading.get_ident()
    return [w for t, w in WATCH if (t is None or t == me) and not isinstance(w, DispatchMode)]


class DispatchMode:
    """An interpreter of op calls that can *replace* eager execution (PyTorch's
    ``TorchDispatchMode``): inside ``with mode:``, every op dispatched on Tensors in this
    thread goes to ``mode.interpret(op, args, params)`` instead of running. While
    ``interpret`` runs, the mode is off the stack, so an op it calls goes to the mode below,
    or runs eagerly (and is recorded on the tape) when there is none. Modes nest per thread;
    the innermost sees an op first. The compiler's tracer, autocast and the function
    transforms are such modes::

        class Log(DispatchMode):
            def interpret(self, op, args, params):
                print(op.name)
                return op(*args, **params)       # the mode below, or eager
    """

    def interpret(self, op, args, params):
        return op(*args, **params)

    def __enter__(self):
        grad_state.modes = grad_state.modes + [self]
        add_watcher(self)  # makes WATCH non-empty: dispatch's one check sends ops our way
        return self

    def __exit__(self, *exc):
        modes = grad_state.modes
        if not modes or modes[-1] is not self:
            raise RuntimeError(f"{type(self).__name__}: modes must be exited in the reverse "
                               "order of entering (per thread)")
        grad_state.modes = modes[:-1]
        remove_watcher(self)
        return False


# Creation order. count.__next__ is one C call, atomic under the GIL, so the order stays a
# topological one (every Node newer than its inputs' Nodes) when threads interleave
_next_seq = itertools.count().__next__


class Meta:
    """What a rule may read of an input the op did not save: its shape and dtype."""

    __slots__ = ("shape", "dtype")

    def __init__(self, array):
        self.shape = array.shape
        self.dtype = array.dtype

    @property
    def ndim(self):
        return len(self.shape)


class Node:
    """One op call on the tape (PyTorch's ``grad_fn``)."""

    __slots__ = ("op", "parents", "saved", "versions", "out", "out_version", "params",
                 "shape", "dtype", "hooks", "retained", "stack", "recompute", "seq",
                 "__weakref__")

    def __init__(self, op, inputs, out, params):
        self.seq = _next_seq()  # creation order: every Node is newer than its inputs' Nodes
        self.op = op
        self.params = params
        data = out._data
        self.shape = data.shape
        self.dtype = data.dtype
        self.hooks = self.retained = self.stack = self.recompute = None
        parents = []
        for a in inputs:
            if isinstance(a, Tensor) and a._requires_grad:
                parents.append(a if a.grad_fn is None else a.grad_fn)
            else:
                parents.append(None)
        self.parents = parents
        if op.save_inputs:
            keep = op.keep
            if keep is None:
                self.saved = inputs
                self.versions = [a._version[0] if isinstance(a, Tensor) else None
                                 for a in inputs]
            else:
                # only what the wanted gradients read (op.uses). An input left out always
                # wants a gradient itself, so its producer (a Node or the leaf) stands in
                # for it: it has the input's shape, dtype and ndim, and keeps no data alive
                mask, bit = 0, 1
                for p in parents:
                    if p is not None:
                        mask |= bit
                    bit <<= 1
                saved, versions = [], []
                for a, p, k in zip(inputs, parents, keep[mask]):
                    if k and isinstance(a, Tensor):
                        saved.append(a)
                        versions.append(a._version[0])
                    else:
                        saved.append(a if p is None else p)
                        versions.append(None)
                self.saved = saved
                self.versions = versions
        else:  # shapes only: an input that wants a gradient has its producer stand in
            self.saved = [a if p is None and not isinstance(a, Tensor) else
                          p if p is not None else Meta(a._data)
                          for a, p in zip(inputs, parents)]
            self.versions = None
        if op.save_out:
            self.out = data
            self.out_version = (out._version, out._version[0])
        else:
            self.out = None

    @property
    def ndim(self):
        return len(self.shape)

    def name(self) -> str:
        """As ``grad_fn.name()``: e.g. ``MulBackward``."""
        return "".join(w[:1].upper() + w[1:] for w in self.op.name.split("_")) + "Backward"

    @property
    def next_functions(self):
        return tuple((p if isinstance(p, Node) else None, 0) for p in self.parents)

    def register_hook(self, fn):
        if self.hooks is None:
            self.hooks = []
        self.hooks.append(fn)
        return _Handle(self.hooks, fn)

    def __repr__(self):
        return f"<{self.name()}>"

    def _unpack(self, create_graph):
        """The rule's (out, inputs): raw arrays, or Tensors that carry the graph."""
        saved = self.saved
        if saved is None and self.recompute is not None:  # checkpointed: recompute, refill
            self.recompute.refill()
            saved = self.saved
        if saved is None:
            raise RuntimeError(
                f"{self.name()}: trying to backward through the graph a second time (or "
                "directly access saved tensors after they have already been freed). Saved "
                "intermediate values of the graph are freed when you call .backward() or "
                "autograd.grad(). Specify retain_graph=True if you need to backward through "
                "the graph a second time.")
        if self.versions is not None:
            for i, (a, v) in enumerate(zip(saved, self.versions)):
                if v is not None and a._version[0] != v:
                    raise RuntimeError(
                        "one of the variables needed for gradient computation has been "
                        f"modified by an inplace operation: input {i} of {self.name()}, of "
                        f"shape {tuple(a.shape)}, is at version {a._version[0]}; expected "
                        f"version {v} instead.")
        out = self.out
        if out is not None and self.out_version[0][0] != self.out_version[1]:
            raise RuntimeError(
                "one of the variables needed for gradient computation has been modified by "
                f"an inplace operation: the output of {self.name()}, of shape {self.shape}, "
                f"is at version {self.out_version[0][0]}; expected {self.out_version[1]}.")
        if create_graph:
            if out is not None:
                out = Tensor._make(out, grad_fn=self)
            return out, saved
        return out, [a._data if isinstance(a, Tensor) else a for a in saved]


class _Handle:
    __slots__ = ("hooks", "fn")

    def __init__(self, hooks, fn):
        self.hooks, self.fn = hooks, fn

    def remove(self):
        if self.fn in self.hooks:
            self.hooks.remove(self.fn)


# Post-accumulate-grad hooks (Tensor.register_post_accumulate_grad_hook), by id of the leaf:
# (weakref to the leaf, hooks). Kept here, not on the Tensor, so the hot path pays nothing
POST_HOOKS = {}


def add_post_accumulate_hook(leaf, hook):
    key = id(leaf)
    entry = POST_HOOKS.get(key)
    if entry is None or entry[0]() is not leaf:
        entry = POST_HOOKS[key] = (weakref.ref(leaf, lambda _, k=key: POST_HOOKS.pop(k, None)),
                                   [])
    entry[1].append(hook)
    return _Handle(entry[1], hook)


def run_post_accumulate_hooks(leaf):
    entry = POST_HOOKS.get(id(leaf))
    if entry is not None and entry[0]() is leaf:
        for hook in list(entry[1]):
            hook(leaf)


def _post_schedule(roots):
    """For the leaves with post-accumulate hooks below ``roots``: [(seq, leaf)], ascending,
    where seq is that of the oldest Node feeding the leaf. Nodes are replayed newest first, so
    once the next Node is older than seq, the leaf's gradient is complete."""
    oldest = {}
    for r in roots:
        if r.grad_fn is None and id(r) in POST_HOOKS:
            oldest[id(r)] = (-1, r)
    for node, leaf in leaves_below(roots):
        k = id(leaf)
        if k in POST_HOOKS and (k not in oldest or oldest[k][0] > node.seq):
            oldest[k] = (node.seq, leaf)
    return sorted(oldest.values(), key=lambda e: e[0]), set()


def leaves_below(roots):
    """(node, leaf) for each Node reachable from the Tensors ``roots`` and each leaf Tensor
    among its inputs; every Node once, in no set order. Iterative, not recursive."""
    stack, seen = [r.grad_fn for r in roots if r.grad_fn is not None], set()
    while stack:
        node = stack.pop()
        if node in seen:
            continue
        seen.add(node)
        for p in node.parents:
            if type(p) is Node:
                stack.append(p)
            elif p is not None:
                yield node, p


def _fire_post(post, older_than):
    """Run the hooks of the scheduled leaves complete before a Node of seq ``older_than``."""
    schedule, reached = post
    while schedule and schedule[-1][0] > older_than:
        leaf = schedule.pop()[1]
        if id(leaf) in reached:
            run_post_accumulate_hooks(leaf)


def toposort(roots):
    """Nodes reachable from ``roots``, each before its inputs' nodes. Iterative, not recursive."""
    order, visited = [], set()
    stack = [(r, False) for r in roots]
    while stack:
        node, expanded = stack.pop()
        if expanded:
            order.append(node)
            continue
        if node in visited:
            continue
        visited.add(node)
        stack.append((node, True))
        for p in node.parents:
            if type(p) is Node and p not in visited:
                stack.append((p, False))
    order.reverse()
    return order


def _shape_error(node, i, parent, g):
    shape, dt = (parent.shape, parent.dtype) if type(parent) is Node else (
        parent._data.shape, parent._data.dtype)
    gd = g._data if isinstance(g, Tensor) else g
    return RuntimeError(
        f"{node.name()}: gradient for input {i} has shape {tuple(gd.shape)} and dtype "
        f"{gd.dtype}, but the input has shape {tuple(shape)} and dtype {dt}")


def _to_input_dtype(node, i, parent, g, dt):
    """A gradient of the input's shape in a wider float type than a bfloat16 input (a rule
    computing with a Python float in numpy) is cast to the input's dtype, as PyTorch's
    engine casts each gradient to its input's dtype; any other mismatch is an error."""
    from tapegrad import dtypes  # (an import cycle at module level; only on a mismatch)
    gd = g._data if isinstance(g, Tensor) else g
    shape = parent.shape if type(parent) is Node else parent._data.shape
    if (dtypes.bfloat16 is None or dt != dtypes.bfloat16.np or gd.shape != tuple(shape)
            or gd.dtype.kind != "f"):
        raise _shape_error(node, i, parent, g)
    return g.to(dtypes.bfloat16) if isinstance(g, Tensor) else gd.astype(dt)


def _run_hooks(hooks, g, create_graph):
    for hook in list(hooks):
        result = hook(g if create_graph else Tensor._make(g))
        if result is not None:
            g = result if create_graph else result._data
    return g


def run_backward(roots, root_grads, retain_graph=False, create_graph=False, inputs=None):
    """Replay the tape from ``roots`` backwards.

    With ``inputs`` (``autograd.grad``), returns their gradients and leaves ``.grad`` alone;
    otherwise accumulates into the ``.grad`` of leaves (and of tensors that retain grad).
    Gradients are raw arrays unless ``create_graph``, when they are Tensors with a graph.
    """
    if grad_state.modes and not create_graph:  # the compiler's tracer records the rules
        for m in reversed(grad_state.modes):
            if hasattr(m, "trace_backward"):
                return m.trace_backward(roots, root_grads, retain_graph, inputs)
    capture = None
    if inputs is not None:
        capture = {}
        for t in inputs:
            capture[id(t.grad_fn) if t.grad_fn is not None else id(t)] = None
    # Nodes are replayed newest first: creation order is a topological order (a Node is
    # made after its inputs' Nodes), so a heap on -seq needs no separate sort and visits
    # only the Nodes a gradient actually reaches
    pending = {}
    heap = []
    # Nodes whose pending gradient is an array this pass allocated (a diamond's sum), so
    # further contributions are added in place. A rule's output or a caller's gradient may
    # be held elsewhere (returned twice by add's rule, passed to backward()): never owned.
    owned = set()
    post = _post_schedule(roots) if POST_HOOKS and capture is None else None
    for r, g in zip(roots, root_grads):
        if r.grad_fn is None:
            _accumulate_leaf(r, g, create_graph, capture)
            if post is not None:
                post[1].add(id(r))
            continue
        node = r.grad_fn
        if node in pending:
            pending[node] = pending[node] + g
        else:
            pending[node] = g
            heappush(heap, (-node.seq, node))
    watch = (watchers() or None) if WATCH else None
    prev_enabled = grad_state.enabled
    grad_state.enabled = create_graph
    try:
        while heap:
            if post is not None and post[0] and post[0][-1][0] > -heap[0][0]:
                _fire_post(post, -heap[0][0])
            node = heappop(heap)[1]
            g = pending.pop(node)
            if owned:
                owned.discard(node)  # g leaves the engine's hands (hooks, capture, rule)
            if node.hooks:
                g = _run_hooks(node.hooks, g, create_graph)
            if node.retained is not None:
                t = node.retained()
                if t is not None and capture is None:
                    t._grad = g if create_graph else Tensor._make(_owned(g))
            if capture is not None and id(node) in capture:
                capture[id(node)] = g
            op = node.op
            out, saved = node._unpack(create_graph)
            if watch is not None:
                for w in watch:
                    w.before_backward(node)
            if op.needs:
                grads = op.rule(g, out, *saved, needs=[p is not None for p in node.parents],
                                **node.params)
            else:
                grads = op.rule(g, out, *saved, **node.params)
            if type(grads) is not tuple and type(grads) is not list:
                grads = (grads,)
            if watch is not None:
                for w in watch:
                    w.after_backward(node, grads)
            if not retain_graph and (op.save_inputs or op.save_out):
                node.saved = node.out = None  # freed as consumed; a second backward raises
            i = -1
            for parent, gi in zip(node.parents, grads):
                i += 1
                if parent is None or gi is None:
                    continue
                if type(parent) is Node:
                    gd = gi._data if create_graph else gi
                    if gd.shape != parent.shape or gd.dtype != parent.dtype:
                        gi = _to_input_dtype(node, i, parent, gi, parent.dtype)
                    if parent not in pending:
                        pending[parent] = gi
                        heappush(heap, (-parent.seq, parent))
                    elif parent in owned:  # a sum this pass allocated: nobody else holds it
                        pending[parent] += gi
                    else:
                        pending[parent] = pending[parent] + gi
                        if not create_graph:
                            owned.add(parent)
                else:
                    pd = parent._data
                    gd = gi._data if create_graph else gi
                    if gd.shape != pd.shape or gd.dtype != pd.dtype:
                        gi = _to_input_dtype(node, i, parent, gi, pd.dtype)
                    _accumulate_leaf(parent, gi, create_graph, capture)
                    if post is not None:
                        post[1].add(id(parent))
        if post is not None:
            _fire_post(post, -2)
    finally:
        grad_state.enabled = prev_enabled
    if capture is not None:
        return [capture[id(t.grad_fn) if t.grad_fn is not None else id(t)] for t in inputs]
    return None


def _owned(g):
    """A copy of gradient array ``g`` in its layout, on its device (``np.array`` would pull a
    device array to the host). A numpy scalar (a full reduction's gradient) becomes a 0-d
    array: a ``.grad`` must take in-place ops."""
    if type(g) is xp.ndarray or not hasattr(g, "copy") or xp.isscalar(g):
        return xp.array(g)
    return g.copy(order="K")


def _accumulate_leaf(leaf, g, create_graph, capture):
    hooks = leaf._hooks
    if hooks:
        g = _run_hooks(hooks, g, create_graph)
    if capture is not None:
        key = id(leaf)
        if key in capture:
            capture[key] = g if capture[key] is None else capture[key] + g
        return
    if create_graph:
        leaf._grad = g if leaf._grad is None else leaf._grad + g
    elif leaf._grad is None:
        leaf._grad = Tensor._make(_owned(g))  # owned: later in-place accumulation is safe
    else:
        leaf._grad._data += g
