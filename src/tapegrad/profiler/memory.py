"""Memory accounting: live and peak bytes, measured by tracemalloc, itemised per op.

    with tapegrad.profiler.memory() as m:
        loss = model(x).sum()
        loss.backward()
    print(m.peak_bytes, m.live_bytes)
    print(m.report())

numpy reports every array buffer it allocates to tracemalloc (in its own domain,
``np.lib.tracemalloc_domain``), so the tracker measures rather than estimates: it reads
tracemalloc's current and peak traced bytes around every op the framework dispatches and
every gradient rule backward runs (an op watcher, registered only while the tracker is
open), and attributes the difference to that op. ``peak_bytes`` is the high-water mark of
everything allocated since the tracker opened (array buffers plus the small Python objects
of the tape), ``live_bytes`` what is still held; ``numpy_live_bytes`` counts array buffers
only (one tracemalloc snapshot of numpy's domain at entry and exit).

Threads: the per-op table lists only the ops of the thread that opened the tracker (its
watcher is per thread), but tracemalloc counts the whole process, so while other threads
allocate, ``peak_bytes`` and ``live_bytes`` include their allocations too. Trackers open in
several threads at once share one tracemalloc session, stopped when the last one closes, but
only if no other thread is alive then: stopping tracemalloc while another thread allocates
can crash CPython (gh-128679), so with threads about it stays on (``tracemalloc.stop()`` once
they are done turns it off).

``storage_bytes`` is the complementary static view: the bytes of the distinct buffers that
parameters, gradients, optimizer state and a graph's saved activations hold right now.
"""
import threading
import tracemalloc

from tapegrad.autograd.engine import Node, add_watcher, remove_watcher, toposort
from tapegrad.backend import xp


_tracing_lock = threading.Lock()
_tracing_users = 0  # open trackers that started tracemalloc or joined one that did


def _start_tracing():
    global _tracing_users
    with _tracing_lock:
        if _tracing_users == 0 and tracemalloc.is_tracing():
            return False  # the user's own tracemalloc session: leave it running
        if _tracing_users == 0:
            tracemalloc.start()
        _tracing_users += 1
        return True


def _stop_tracing():
    global _tracing_users
    with _tracing_lock:
        _tracing_users -= 1
        # Stopping tracemalloc while another thread allocates can crash CPython (a race in
        # PyTraceMalloc_Untrack, CPython gh-128679): with other threads alive, it stays on
        if _tracing_users == 0 and threading.active_count() == 1:
            tracemalloc.stop()


def _numpy_traced_bytes():
    snapshot = tracemalloc.take_snapshot().filter_traces(
        [tracemalloc.DomainFilter(True, xp.lib.tracemalloc_domain)])
    return sum(t.size for t in snapshot.traces)


class OpMemory:
    """One row of the per-op table (summed over calls): ``net_bytes``, the traced bytes an op
    call added and still held when it returned (its output, or a rule's gradients; negative
    when it freed more); ``peak_bytes``, the largest high-water mark above the level at the
    call's start (output plus temporaries)."""

    __slots__ = ("name", "calls", "net_bytes", "peak_bytes")

    def __init__(self, name):
        self.name, self.calls, self.net_bytes, self.peak_bytes = name, 0, 0, 0

    def __repr__(self):
        return (f"OpMemory({self.name!r}, calls={self.calls}, net_bytes={self.net_bytes}, "
                f"peak_bytes={self.peak_bytes})")


class MemoryTracker:
    """Live and peak traced bytes over a region, and per op (PyTorch: ``torch.cuda.memory_*``
    statistics and ``torch.profiler.profile(profile_memory=True)``)."""

    def __init__(self, per_op: bool = True, numpy_only_live: bool = True):
        self.per_op = per_op
        self.numpy_only_live = numpy_only_live
        self.ops = {}  # op name (or "XBackward") -> OpMemory
        self.baseline = 0
        self._peak = 0
        self._final = None
        self._started = False
        self._region = None
        self._in_backward = False
        self._numpy_start = None
        self.numpy_live_bytes = None

    # --- context manager --------------------------------------------------------------
    def __enter__(self):
        self._started = _start_tracing()
        if self.numpy_only_live:
            self._numpy_start = _numpy_traced_bytes()
        current, _ = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        self.baseline = self._peak = current
        self._final = None
        if self.per_op:
            add_watcher(self)
        return self

    def __exit__(self, *exc):
        if self.per_op:
            remove_watcher(self)
        current, peak = tracemalloc.get_traced_memory()
        self._peak = max(self._peak, peak)
        self._final = current
        if self.numpy_only_live:
            self.numpy_live_bytes = _numpy_traced_bytes() - self._numpy_start
        if self._started:
            _stop_tracing()
        return False

    # --- figures ----------------------------------------------------------------------
    @property
    def peak_bytes(self) -> int:
        """Highest traced bytes above the level at entry, so far (or up to exit)."""
        if self._final is None:
            self._peak = max(self._peak, tracemalloc.get_traced_memory()[1])
        return self._peak - self.baseline

    @property
    def live_bytes(self) -> int:
        """Traced bytes still held above the level at entry (now, or at exit)."""
        current = self._final if self._final is not None else tracemalloc.get_traced_memory()[0]
        return current - self.baseline

    def report(self, top: int = 20) -> str:
        """A table: peak and live bytes, then the ops that kept or briefly needed the most."""
        lines = [f"peak {_fmt(self.peak_bytes)}, live {_fmt(self.live_bytes)}"
                 + (f" (numpy buffers {_fmt(self.numpy_live_bytes)})"
                    if self.numpy_live_bytes is not None else "")]
        if self.ops:
            lines.append(f"{'op':<24}{'calls':>8}{'held after':>14}{'max transient':>16}")
            rows = sorted(self.ops.values(), key=lambda r: -max(abs(r.net_bytes), r.peak_bytes))
            for r in rows[:top]:
                lines.append(f"{r.name:<24}{r.calls:>8}{_fmt(r.net_bytes):>14}"
                             f"{_fmt(r.peak_bytes):>16}")
        return "\n".join(lines)

    # --- op watcher (see autograd.engine.WATCH; this thread's ops only) ---------------------------------------
    def _begin(self):
        current, peak = tracemalloc.get_traced_memory()
        if peak > self._peak:
            self._peak = peak
        tracemalloc.reset_peak()
        self._region = current

    def _end(self, name):
        current, peak = tracemalloc.get_traced_memory()
        if peak > self._peak:
            self._peak = peak
        row = self.ops.get(name)
        if row is None:
            row = self.ops[name] = OpMemory(name)
        row.calls += 1
        row.net_bytes += current - self._region
        row.peak_bytes = max(row.peak_bytes, peak - self._region)

    def before_op(self, op):
        if not self._in_backward:
            self._begin()

    def after_op(self, op, args, out):
        if not self._in_backward:
            self._end(op.name)

    def before_backward(self, node):
        self._in_backward = True
        self._begin()

    def after_backward(self, node, grads):
        self._in_backward = False
        self._end(node.name())


def memory(per_op: bool = True) -> MemoryTracker:
    """A memory tracker to use as a context manager (see the module docstring)."""
    return MemoryTracker(per_op=per_op)


def _fmt(n):
    if n is None:
        return "-"
    sign = "-" if n < 0 else ""
    n = abs(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{sign}{n:.0f} {unit}" if unit == "B" else f"{sign}{n:.2f} {unit}"
        n /= 1024


def _buffer(a):
    while isinstance(a.base, xp.ndarray):
        a = a.base
    return a


def storage_bytes(parameters=(), optimizer=None, outputs=()) -> dict:
    """Bytes of the distinct array buffers the framework holds now, by what holds them.

    ``parameters``: tensors (or a module, via ``.parameters()``), counted with their
    ``.grad``; ``optimizer``: its ``state`` (tensors and arrays in each parameter's dict);
    ``outputs``: tensors whose graph's saved activations are counted. A buffer shared by
    two holders is counted once, under the first.
    """
    from tapegrad.tensor import Tensor

    seen = set()
    totals = {"parameters": 0, "gradients": 0, "optimizer_state": 0, "activations": 0}

    def add(kind, a):
        if isinstance(a, Tensor):
            a = a._data
        if not isinstance(a, xp.ndarray):
            return
        b = _buffer(a)
        if id(b) not in seen:
            seen.add(id(b))
            totals[kind] += b.nbytes

    if hasattr(parameters, "parameters"):
        parameters = parameters.parameters()
    parameters = list(parameters)
    for p in parameters:
        add("parameters", p)
    for p in parameters:
        if p.grad is not None:
            add("gradients", p.grad)
    if optimizer is not None:
        for state in getattr(optimizer, "state", {}).values():
            for v in (state.values() if isinstance(state, dict) else ()):
                add("optimizer_state", v)
    if isinstance(outputs, Tensor):
        outputs = [outputs]
    roots = [t.grad_fn for t in outputs if t.grad_fn is not None]
    for node in toposort(roots):
        if type(node) is not Node:
            continue
        for a in node.saved or ():
            add("activations", a)
        if node.out is not None:
            add("activations", node.out)
    totals["total"] = sum(totals.values())
    return totals


__all__ = ["memory", "MemoryTracker", "OpMemory", "storage_bytes"]
