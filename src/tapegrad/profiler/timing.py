"""Op-level timing: ``tapegrad.profiler.profile`` and ``record_function``, as ``torch.profiler``.

    with tapegrad.profiler.profile(record_shapes=True, with_flops=True) as prof:
        with tapegrad.profiler.record_function("step"):
            loss = model(x).sum()
            loss.backward()
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=10))
    prof.export_chrome_trace("trace.json")   # open in https://ui.perfetto.dev
    prof.roofline()                          # see tapegrad.profiler.roofline

The profiler is an op watcher (``tapegrad.autograd.engine.add_watcher``) of the thread that
opens it: it times every op that thread dispatches on Tensors and every gradient rule
backward runs (events named ``MulBackward`` etc., as ``grad_fn.name()``), and
``record_function`` ranges. An op's FLOPs and bytes come from its record
(``Op.cost``); a gradient rule's are estimated from its forward's: the forward's FLOPs once
per input that wants a gradient (exact for products: each input's gradient is a product of
the same size), bytes read the incoming gradient and what the node saved, bytes written the
gradients. Times are wall-clock (``time.perf_counter_ns``) in microseconds, as PyTorch's
tables; an op's time includes its dispatch (dtype promotion, broadcasting, recording).
In-place ops (``add_``, ``p -= lr * g``, ``copy_``) and optimizers' per-parameter updates
(events ``SGD.update``, ``Adam.update``...) bypass dispatch; while a profiler is open they
are events too (kind "inplace", through ``tapegrad.inplace.watch_inplace``, which swaps the
plain methods back when the last profiler closes).

Limitation: a watcher is not shown an op call's keyword parameters; a recorded call keeps
them on its Node, an unrecorded one (no grad) does not, so an op whose cost rule needs them
(einsum's equation) is then counted at its ``flops`` per output element.
"""
import enum
import json
import os
import sys
import threading
import time
import tracemalloc
import weakref

from tapegrad.autograd.engine import Node, add_watcher, remove_watcher
from tapegrad.inplace import watch_inplace
from tapegrad.ops import registry
from tapegrad.profiler.memory import _start_tracing, _stop_tracing

_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_local = threading.local()  # .profilers: the profilers open in this thread, innermost last


class ProfilerActivity(enum.Enum):
    """As ``torch.profiler.ProfilerActivity``; tapegrad runs on the CPU only."""

    CPU = 0
    CUDA = 1


def _active():
    return getattr(_local, "profilers", ())


class FunctionEvent:
    """One timed range: an op call (``kind`` "op"), a gradient rule ("backward") or a
    ``record_function`` range ("user"). Times in microseconds, as PyTorch's ``FunctionEvent``."""

    __slots__ = ("id", "name", "kind", "start_ns", "end_ns", "child_ns", "thread",
                 "input_shapes", "dtypes", "flops", "bytes_read", "bytes_written",
                 "memory_bytes", "memory_start", "child_memory", "stack", "parent")

    def __init__(self, id, name, kind, start_ns, thread, parent):
        self.id, self.name, self.kind, self.start_ns = id, name, kind, start_ns
        self.end_ns = start_ns
        self.child_ns = 0
        self.thread = thread
        self.parent = parent
        self.input_shapes = self.dtypes = self.stack = None
        self.flops = self.bytes_read = self.bytes_written = self.memory_bytes = 0
        self.memory_start = self.child_memory = 0

    key = property(lambda self: self.name)
    cpu_time_total = property(lambda self: (self.end_ns - self.start_ns) / 1e3)
    self_cpu_time_total = property(lambda self: (self.end_ns - self.start_ns - self.child_ns) / 1e3)
    time_range = property(lambda self: (self.start_ns / 1e3, self.end_ns / 1e3))
    cpu_memory_usage = property(lambda self: self.memory_bytes)
    self_cpu_memory_usage = property(lambda self: self.memory_bytes - self.child_memory)

    def __repr__(self):
        return (f"<FunctionEvent {self.name} ({self.kind}) cpu_time_total="
                f"{self.cpu_time_total:.1f}us flops={self.flops}>")


class FunctionEventAvg:
    """Events with one key summed (``key_averages``): the fields PyTorch's table shows."""

    __slots__ = ("key", "kind", "count", "cpu_time_total", "self_cpu_time_total", "flops",
                 "bytes_read", "bytes_written", "cpu_memory_usage", "self_cpu_memory_usage",
                 "input_shapes", "stack", "dtypes")

    def __init__(self, key, kind, input_shapes=None, stack=None):
        self.key, self.kind, self.input_shapes, self.stack = key, kind, input_shapes, stack
        self.count = 0
        self.cpu_time_total = self.self_cpu_time_total = 0.0
        self.flops = self.bytes_read = self.bytes_written = 0
        self.cpu_memory_usage = self.self_cpu_memory_usage = 0
        self.dtypes = None

    def add(self, e):
        self.count += 1
        self.cpu_time_total += e.cpu_time_total
        self.self_cpu_time_total += e.self_cpu_time_total
        self.flops += e.flops
        self.bytes_read += e.bytes_read
        self.bytes_written += e.bytes_written
        self.cpu_memory_usage += e.cpu_memory_usage
        self.self_cpu_memory_usage += e.self_cpu_memory_usage
        if self.dtypes is None:
            self.dtypes = e.dtypes
        return self

    cpu_time = property(lambda self: self.cpu_time_total / max(self.count, 1))
    self_cpu_time = property(lambda self: self.self_cpu_time_total / max(self.count, 1))

    def __repr__(self):
        return (f"<FunctionEventAvg key={self.key} count={self.count} cpu_time_total="
                f"{self.cpu_time_total:.1f}us self={self.self_cpu_time_total:.1f}us "
                f"flops={self.flops}>")


_SORT_KEYS = ("cpu_time", "cpu_time_total", "self_cpu_time", "self_cpu_time_total", "count",
              "flops", "cpu_memory_usage", "self_cpu_memory_usage", "bytes_read",
              "bytes_written")


class EventList(list):
    """A list of events (or averages) with PyTorch's ``table``."""

    def __init__(self, events=(), with_flops=False, profile_memory=False, with_shapes=False):
        super().__init__(events)
        self._with_flops, self._profile_memory, self._with_shapes = (
            with_flops, profile_memory, with_shapes)

    def total_average(self):
        total = FunctionEventAvg("Total", "total")
        for e in self:
            total.count += getattr(e, "count", 1)
            for f in ("cpu_time_total", "self_cpu_time_total", "flops", "bytes_read",
                      "bytes_written", "cpu_memory_usage", "self_cpu_memory_usage"):
                setattr(total, f, getattr(total, f) + getattr(e, f))
        return total

    def table(self, sort_by=None, row_limit=100, max_name_column_width=55, header=None,
              top_level_events_only=False):
        """The events as PyTorch's profiler table, sorted by ``sort_by`` (descending): one of
        ``cpu_time_total``, ``self_cpu_time_total``, ``cpu_time``, ``self_cpu_time``,
        ``count``, ``flops``, ``cpu_memory_usage``, ``self_cpu_memory_usage``."""
        rows = list(self)
        if top_level_events_only:
            rows = [e for e in rows if getattr(e, "parent", None) is None]
        if sort_by is not None:
            if sort_by not in _SORT_KEYS:
                raise ValueError(f"table: sort_by={sort_by!r} is not one of {_SORT_KEYS}")
            rows.sort(key=lambda e: getattr(e, sort_by), reverse=True)
        if row_limit is not None and row_limit >= 0:
            rows = rows[:row_limit]
        self_total = sum(e.self_cpu_time_total for e in self) or 1.0
        cols = ["Name", "Self CPU %", "Self CPU", "CPU total %", "CPU total", "CPU time avg",
                "# of Calls"]
        if self._profile_memory:
            cols += ["CPU Mem", "Self CPU Mem"]
        if self._with_shapes:
            cols += ["Input Shapes"]
        if self._with_flops:
            cols += ["Total MFLOPs"]
        lines = []
        for e in rows:
            name = e.key if len(e.key) <= max_name_column_width else (
                e.key[:max_name_column_width - 3] + "...")
            r = [name, f"{e.self_cpu_time_total / self_total:.2%}",
                 _us(e.self_cpu_time_total), f"{e.cpu_time_total / self_total:.2%}",
                 _us(e.cpu_time_total), _us(e.cpu_time_total / max(getattr(e, "count", 1), 1)),
                 str(getattr(e, "count", 1))]
            if self._profile_memory:
                r += [_bytes(e.cpu_memory_usage), _bytes(e.self_cpu_memory_usage)]
            if self._with_shapes:
                r += [str(e.input_shapes) if e.input_shapes is not None else ""]
            if self._with_flops:
                r += [f"{e.flops / 1e6:.3f}" if e.flops else "--"]
            lines.append(r)
        widths = [max(len(c), *(len(r[i]) for r in lines)) if lines else len(c)
                  for i, c in enumerate(cols)]
        rule = "  ".join("-" * w for w in widths)
        fmt = lambda r: "  ".join(  # noqa: E731
            (s.ljust(w) if i in (0, len(cols) - 1) and cols[i] in ("Name", "Input Shapes")
             else s.rjust(w)) for i, (s, w) in enumerate(zip(r, widths)))
        out = ([header] if header else []) + [rule, fmt(cols), rule] + [fmt(r) for r in lines]
        out += [rule, f"Self CPU time total: {_us(self_total if self else 0.0)}"]
        return "\n".join(out)

    def __str__(self):
        return self.table()


def _us(x):
    if x >= 1e6:
        return f"{x / 1e6:.3f}s"
    if x >= 1e3:
        return f"{x / 1e3:.3f}ms"
    return f"{x:.3f}us"


def _bytes(n):
    for unit, size in (("Gb", 1 << 30), ("Mb", 1 << 20), ("Kb", 1 << 10)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n} b"


def _array(a):
    """An argument as the cost rules read it: an array, a stand-in with shape and dtype, a
    list of those (variadic ops), or a Python scalar."""
    data = getattr(a, "_data", None)
    if data is not None:
        return data
    if type(a) is list:
        return [_array(x) for x in a]
    if isinstance(a, Node):
        return _Shape(a.shape, a.dtype)
    return a


class _Shape:
    __slots__ = ("shape", "dtype")

    def __init__(self, shape, dtype):
        self.shape, self.dtype = tuple(shape), dtype


def _shapes(args):
    out = []
    for a in args:
        if type(a) is list:
            out.append([list(getattr(x, "shape", ())) for x in a])
        else:
            shape = getattr(a, "shape", None)
            out.append(list(shape) if shape is not None else [])
    return out


def _call_site(limit=5):
    """The innermost frames outside tapegrad's package: where the user called in."""
    frames = []
    f = sys._getframe(2)
    while f is not None and len(frames) < limit:
        path = f.f_code.co_filename
        if not path.startswith(_PACKAGE_DIR) and "contextlib" not in path:
            frames.append(f"{path}({f.f_lineno}): {f.f_code.co_name}")
        f = f.f_back
    return frames


class profile:
    """Time ops, gradient rules and ``record_function`` ranges (``torch.profiler.profile``).

    ``record_shapes``: keep input shapes (``key_averages(group_by_input_shape=True)``);
    ``profile_memory``: the bytes each event allocated and still held when it returned,
    measured with tracemalloc as ``tapegrad.profiler.memory`` measures them (numpy reports its
    buffers to tracemalloc): ``cpu_memory_usage`` includes nested events, ``self_cpu_memory_usage``
    not (negative when an event freed more than it allocated);
    ``with_flops``: show FLOPs (always counted, for ``roofline``); ``with_stack``: the Python
    call site of each op (in the trace and ``key_averages(group_by_stack_n=n)``).
    ``activities``: accepted for PyTorch's signature; only ``ProfilerActivity.CPU`` exists.

    >>> with profile(with_flops=True) as prof:
    ...     (tapegrad.ones(64, 64) @ tapegrad.ones(64, 64)).sum()
    >>> prof.key_averages().table(sort_by="flops")
    """

    def __init__(self, activities=None, record_shapes=False, profile_memory=False,
                 with_flops=False, with_stack=False, with_modules=False, schedule=None,
                 on_trace_ready=None, experimental_config=None, acc_events=False,
                 use_cuda=None):
        activities = set(activities) if activities is not None else {ProfilerActivity.CPU}
        unknown = [a for a in activities if not isinstance(a, ProfilerActivity)]
        if unknown:
            raise ValueError(f"profile: activities must be ProfilerActivity values, got "
                             f"{unknown}")
        if ProfilerActivity.CPU not in activities:
            raise ValueError("profile: tapegrad has only CPU activity to profile "
                             f"(activities={sorted(a.name for a in activities)})")
        self.activities = activities
        self.record_shapes = record_shapes
        self.profile_memory = profile_memory
        self.with_flops = with_flops
        self.with_stack = with_stack
        self.on_trace_ready = on_trace_ready
        self._events = []
        self._stack = []  # open events of this thread, innermost last
        self._forward_flops = weakref.WeakKeyDictionary()  # Node -> its forward's FLOPs
        self._thread = None
        self._next_id = 0
        self._t0 = None
        self._open = False
        self._tracing = False

    # --- context manager --------------------------------------------------------------
    def start(self):
        self._thread = threading.get_ident()
        if self.profile_memory:
            self._tracing = _start_tracing()
        self._t0 = time.perf_counter_ns()
        _local.profilers = _active() + (self,)
        add_watcher(self)
        watch_inplace(True)
        self._open = True
        return self

    def stop(self):
        if not self._open:
            return
        watch_inplace(False)
        remove_watcher(self)
        if self._tracing:
            _stop_tracing()
            self._tracing = False
        _local.profilers = tuple(p for p in _active() if p is not self)
        self._open = False
        self._stack.clear()
        if self.on_trace_ready is not None:
            self.on_trace_ready(self)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
        return False

    def step(self):
        """As ``prof.step()``: marks a step boundary (a ``ProfilerStep#n`` range is not kept;
        tapegrad has no schedule)."""

    # --- events -------------------------------------------------------------------------
    def _begin(self, name, kind):
        parent = self._stack[-1] if self._stack else None
        e = FunctionEvent(self._next_id, name, kind, time.perf_counter_ns(), self._thread,
                          parent.id if parent is not None else None)
        self._next_id += 1
        self._stack.append(e)
        if self.profile_memory and tracemalloc.is_tracing():
            e.memory_start = tracemalloc.get_traced_memory()[0]
        return e

    def _end(self, name):
        end = time.perf_counter_ns()
        stack = self._stack
        while stack:  # an op that raised leaves its event open: drop it
            e = stack.pop()
            if e.name == name:
                break
        else:
            return None
        e.end_ns = end
        if self.profile_memory and tracemalloc.is_tracing():
            e.memory_bytes = tracemalloc.get_traced_memory()[0] - e.memory_start
        if stack:
            stack[-1].child_ns += end - e.start_ns
            stack[-1].child_memory += e.memory_bytes
        self._events.append(e)
        return e

    def _stack_of(self, e):
        if self.with_stack:
            e.stack = _call_site()

    def before_op(self, op):
        self._begin(op.name, "op")

    def after_op(self, op, args, out):
        e = self._end(op.name)
        if e is None:
            return
        arrays = [_array(a) for a in args]
        data = out._data if hasattr(out, "_data") else out
        # a watcher is not shown the call's params; a recorded call keeps them on its Node
        node = getattr(out, "grad_fn", None)
        recorded = node is not None and type(node) is Node and node.op is op
        try:
            e.flops, e.bytes_read, e.bytes_written = op.cost(
                arrays, data, node.params if recorded else {})
        except (KeyError, TypeError):  # a rule that needs the params (einsum's equation)
            e.flops, e.bytes_read, e.bytes_written = (
                op.flops * registry.numel(data), registry.read_bytes(arrays),
                registry.written_bytes(data))
        if recorded:
            self._forward_flops[node] = e.flops
        if self.record_shapes:
            e.input_shapes = _shapes(arrays)
        e.dtypes = [str(getattr(a, "dtype", type(a).__name__)) for a in arrays
                    if type(a) is not list]
        self._stack_of(e)

    def before_inplace(self, name):
        self._begin(name, "inplace")

    def after_inplace(self, name, written, read):
        """An in-place op or an optimizer's update (``tapegrad.inplace.watch_inplace``): bytes
        read are its operands (and the old value), bytes written the updated buffers; FLOPs
        those of the out-of-place pointwise op per element written (``add_``: 1), 0 for
        copies, fills and optimizer updates (no op record counts their arithmetic)."""
        e = self._end(name)
        if e is None:
            return
        arrays = [a for a in read if hasattr(a, "shape")]
        o = registry.REGISTRY.get(name.rstrip("_"))
        if o is not None and (o.elementwise or o.pointwise):
            e.flops = o.flops * registry.numel(written[0])
        e.bytes_read = registry.read_bytes(arrays)
        e.bytes_written = registry.written_bytes(written)
        if self.record_shapes:
            e.input_shapes = _shapes(read)
        e.dtypes = [str(a.dtype) for a in written]
        self._stack_of(e)

    def before_backward(self, node):
        self._begin(node.name(), "backward")

    def after_backward(self, node, grads):
        e = self._end(node.name())
        if e is None:
            return
        wanting = sum(p is not None for p in node.parents)
        flops = self._forward_flops.get(node)
        if flops is None:  # recorded before the profiler opened: cost from the saved shapes
            try:
                saved = [_array(a) for a in (node.saved or ())]
                flops = node.op.cost(saved, _Shape(node.shape, node.dtype), node.params)[0]
            except Exception:
                flops = 0
        e.flops = flops * wanting
        saved = [_array(a) for a in (node.saved or ())]
        e.bytes_read = (registry.numel(_Shape(node.shape, node.dtype)) * node.dtype.itemsize
                        + registry.read_bytes([a for a in saved if hasattr(a, "strides")])
                        + (node.out.nbytes if node.out is not None else 0))
        e.bytes_written = registry.written_bytes([_array(g) for g in grads if g is not None])
        if self.record_shapes:
            e.input_shapes = [list(node.shape)]
        e.dtypes = [str(node.dtype)]
        self._stack_of(e)

    # --- results ------------------------------------------------------------------------
    def events(self):
        """Every timed event, in order of completion (PyTorch: ``prof.events()``)."""
        return EventList(self._events, self.with_flops, self.profile_memory, False)

    def key_averages(self, group_by_input_shape=False, group_by_stack_n=0):
        """Events summed per name (and input shapes, or the ``n`` innermost call-site frames)."""
        if group_by_input_shape and not self.record_shapes:
            raise RuntimeError("key_averages: group_by_input_shape=True needs "
                               "profile(record_shapes=True)")
        if group_by_stack_n and not self.with_stack:
            raise RuntimeError("key_averages: group_by_stack_n needs profile(with_stack=True)")
        groups = {}
        for e in self._events:
            key = (e.name,)
            if group_by_input_shape:
                key += (repr(e.input_shapes),)
            if group_by_stack_n:
                key += (tuple((e.stack or [])[:group_by_stack_n]),)
            row = groups.get(key)
            if row is None:
                row = groups[key] = FunctionEventAvg(
                    e.name, e.kind, e.input_shapes if group_by_input_shape else None,
                    (e.stack or [])[:group_by_stack_n] if group_by_stack_n else None)
            row.add(e)
        return EventList(groups.values(), self.with_flops, self.profile_memory,
                         group_by_input_shape)

    def export_chrome_trace(self, path):
        """Write the events in the Chrome trace format (JSON; opens in Perfetto and
        chrome://tracing): forward ops, gradient rules and ``record_function`` ranges."""
        pid = os.getpid()
        category = {"op": "cpu_op", "inplace": "cpu_op", "kernel": "kernel",
                    "backward": "autograd", "user": "user_annotation"}
        trace = []
        for e in sorted(self._events, key=lambda e: (e.start_ns, -e.end_ns)):
            args = {"External id": e.id}
            if e.input_shapes is not None:
                args["Input Dims"] = e.input_shapes
            if e.dtypes:
                args["Input type"] = e.dtypes
            if e.kind != "user":
                args["flops"] = e.flops
                args["bytes read"] = e.bytes_read
                args["bytes written"] = e.bytes_written
            if e.stack:
                args["Call stack"] = ";".join(e.stack)
            trace.append({"ph": "X", "cat": category[e.kind], "name": e.name, "pid": pid,
                          "tid": e.thread, "ts": (e.start_ns - self._t0) / 1e3,
                          "dur": (e.end_ns - e.start_ns) / 1e3, "args": args})
        trace.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0,
                      "args": {"name": "tapegrad"}})
        with open(path, "w") as f:
            json.dump({"schemaVersion": 1, "displayTimeUnit": "ms", "traceEvents": trace,
                       "deviceProperties": []}, f)
        return path

    def roofline(self, ceilings=None, plot=None, show=True, **kw):
        """The roofline table of the profiled ops (see ``tapegrad.profiler.roofline``)."""
        from tapegrad.profiler.roofline import roofline

        return roofline(self, ceilings=ceilings, plot=plot, show=show, **kw)


class record_function:
    """Label a range of code in every profiler open in this thread (as
    ``torch.profiler.record_function``); a context manager or a decorator, free when no
    profiler is open.

    >>> with record_function("forward"):
    ...     y = model(x)
    """

    def __init__(self, name, args=None):
        self.name = name
        self.args = args
        self._open = ()

    def __enter__(self):
        self._open = _active()
        for p in self._open:
            p._stack_of(p._begin(self.name, "user"))
        return self

    def __exit__(self, *exc):
        for p in self._open:
            p._end(self.name)
        self._open = ()
        return False

    def __call__(self, fn):
        import functools

        @functools.wraps(fn)
        def wrapped(*args, **kwargs):
            with record_function(self.name):
                return fn(*args, **kwargs)

        return wrapped


__all__ = ["profile", "record_function", "ProfilerActivity", "FunctionEvent",
           "FunctionEventAvg", "EventList"]
