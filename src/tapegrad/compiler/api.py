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
import functools
import operator
import os
import random
import sys
import sysconfig
import threading
import time
import types
import warnings
import weakref
from collections import OrderedDict

import numpy as np

from tapegrad.amp.autocast_mode import _state as _autocast_state
from tapegrad.autograd.grad_mode import state as grad_state
from tapegrad.compiler import passes
from tapegrad.compiler.pipeline import lower
from tapegrad.compiler.ir import Graph, Input, Node, Value, call_node, freeze
from tapegrad.compiler.tracer import (MODULE_EPOCH, CompilerMode, GraphBreak, _sgd_key,
                                      _traced_class, slot_params, trace_call, unflatten,
                                      user_frame)
from tapegrad.compiler.tracer import active as active_tracer
from tapegrad.dtypes import _default as _default_dtype
from tapegrad.ops.registry import _prepare_elementwise, dispatch
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


def _modules_of(fn, args):
    """The nn.Modules a function can reach directly (for the training-flag guard)."""
    from tapegrad.nn.module import Module

    found = []
    seen = set()

    def add(o):
        if isinstance(o, Module) and id(o) not in seen:
            seen.add(id(o))
            found.extend(m for m in o.modules())
        elif isinstance(o, (list, tuple)):
            for x in o[:64]:
                add(x)

    for a in args:
        add(a)
    target = getattr(fn, "__self__", None)
    if target is not None:
        add(target)
        for v in list(vars(target).values())[:256] if hasattr(target, "__dict__") else ():
            add(v)
    func = getattr(fn, "__func__", fn)
    if isinstance(fn, Module):
        add(fn)
        func = type(fn).forward
    code = getattr(func, "__code__", None)
    for cell in getattr(func, "__closure__", None) or ():
        try:
            add(cell.cell_contents)
        except ValueError:
            pass
    if code is not None:
        g = getattr(func, "__globals__", {})
        for name in code.co_names:
            if name in g:
                add(g[name])
    uniq, ids = [], set()
    for m in found:
        if id(m) not in ids:
            ids.add(id(m))
            uniq.append(m)
    return uniq


def _state_tensors(fn, modules):
    """The tensors ``fn`` can read by reference (its modules' parameters and buffers, tensors
    in its closure, the globals it names, its object's attributes): id -> weak reference."""
    found = []
    for m in modules:
        found += list(m.parameters()) + list(m.buffers())
    func = getattr(fn, "__func__", fn)
    for cell in getattr(func, "__closure__", None) or ():
        try:
            found.append(cell.cell_contents)
        except ValueError:
            pass
    code = getattr(func, "__code__", None)
    if code is not None:
        g = getattr(func, "__globals__", {})
        found += [g[name] for name in code.co_names if name in g]
    target = getattr(fn, "__self__", None)
    if target is not None and hasattr(target, "__dict__"):
        found += list(vars(target).values())
    return {id(t): weakref.ref(t) for t in found if isinstance(t, Tensor)}


_SCALARS = frozenset((int, float, bool, complex, str, bytes, type(None)))
_LIMIT = 4096  # elements one guard may walk: beyond, a container is too large to guard


class Unguardable(Exception):
    """Python state too large to guard (a container of more than ``_LIMIT`` elements)."""


def _scalar_key(v):
    """A Python scalar by type and value: ``True``, ``1`` and ``1.0`` differ, and so do
    ``0.0`` and ``-0.0``; a NaN equals itself."""
    if type(v) is float and (v != v or v == 0.0):
        return (float, repr(v))
    return (type(v), v)


def _arg_key(a, tensors):
    """A non-tensor argument's key: scalars by type and value, tuples, lists and dicts by
    structure and their elements' keys (recursively), other hashable values by type and
    equality, the rest by identity. Each tensor inside is appended to ``tensors`` (in walk
    order) and keyed as the call's tensors are: shape, dtype, requires_grad."""
    t = type(a)
    if t in _SCALARS:
        return _scalar_key(a)
    if isinstance(a, Tensor):
        tensors.append(a)
        d = a._data
        return ("T", d.shape, d.dtype.str, a._requires_grad)
    if isinstance(a, (tuple, list)):
        if len(a) > _LIMIT:
            raise Unguardable(f"an argument of {len(a)} elements")
        return (t, tuple([_arg_key(x, tensors) for x in a]))
    if isinstance(a, dict):
        if len(a) > _LIMIT:
            raise Unguardable(f"an argument of {len(a)} elements")
        return (t, tuple([(_arg_key(k, tensors), _arg_key(x, tensors)) for k, x in a.items()]))
    try:
        hash(a)
        return ("V", t, a)
    except TypeError:
        return ("O", id(a))


def _spec(args, kwargs):
    """The call's argument types: the eager-after-break key and part of every guard. Returns
    ``(key, tensors)``: ``tensors`` every tensor of the call in walk order when a container
    argument holds some, else None (they are the arguments themselves)."""
    out = []
    nested = None
    for a in args:
        if isinstance(a, Tensor):
            d = a._data
            out.append(("T", d.shape, d.dtype.str, a._requires_grad))
        elif type(a) in _SCALARS:
            out.append(_scalar_key(a))
        else:
            inner = []
            out.append(_arg_key(a, inner))
            if inner:
                nested = (nested or []) + inner
    for k in sorted(kwargs):
        v = kwargs[k]
        if isinstance(v, Tensor):
            out.append(("K", k, ("T", v._data.shape, v._data.dtype.str, v._requires_grad)))
            continue
        inner = []
        out.append(("K", k, _arg_key(v, inner)))
        if inner:
            nested = (nested or []) + inner
    if nested is not None:
        flat = [a for a in args if isinstance(a, Tensor)] + nested
        flat += [kwargs[k] for k in sorted(kwargs) if isinstance(kwargs[k], Tensor)]
    else:
        flat = None
    n = len(args) + len(kwargs)
    if nested is not None or n > 1 and len(set(map(id, (*args, *kwargs.values())))) < n:
        # an object passed twice: which tensors of the walk are the same one is part of the key
        seen, alias = {}, []
        walk = flat if flat is not None else list(args) + [kwargs[k] for k in sorted(kwargs)]
        for k, a in enumerate(walk):
            if isinstance(a, Tensor):
                j = seen.setdefault(id(a), k)
                if j != k:
                    alias.append((k, j))
        if alias:
            out.append(("A", tuple(alias)))
    return tuple(out), flat


def _arg_places(args, kwargs):
    """id(tensor) -> where the call passed it: ("a", i), ("k", name), or ("p", path) for a
    tensor inside a tuple, list or dict argument (path: the argument's position or keyword,
    then the keys down to the tensor)."""
    places = {}

    def walk(o, path):
        if isinstance(o, Tensor):
            places.setdefault(id(o), ("p", path))
        elif isinstance(o, (tuple, list)):
            for j, x in enumerate(o[:_LIMIT]):
                walk(x, path + (j,))
        elif isinstance(o, dict):
            for k, x in list(o.items())[:_LIMIT]:
                walk(x, path + (k,))

    for i, a in enumerate(args):
        if isinstance(a, Tensor):
            places.setdefault(id(a), ("a", i))
    for k, v in (kwargs or {}).items():
        if isinstance(v, Tensor):
            places.setdefault(id(v), ("k", k))
    for i, a in enumerate(args):
        if isinstance(a, (tuple, list, dict)):
            walk(a, (i,))
    for k, v in (kwargs or {}).items():
        if isinstance(v, (tuple, list, dict)):
            walk(v, (k,))
    return places


def _resolve(place, args, kwargs):
    """The tensor a place names in this call: an argument (or a tensor inside one), or the
    ``.grad`` (read now) of one or of a fixed tensor (a gradient the graph writes in place)."""
    kind, key, grad = place
    if kind == "a":
        t = args[key]
    elif kind == "k":
        t = kwargs[key]
    elif kind == "p":
        t = args[key[0]] if type(key[0]) is int else kwargs[key[0]]
        for k in key[1:]:
            t = t[k]
    else:
        t = key
    return t.grad if grad else t


def mode_key():
    """The thread's modes a trace consults, part of every guard: grad and inference mode,
    CPU autocast (on, its dtype, inside an autocast op), the default dtype (of Python floats),
    and the interpreters on the thread's stack."""
    st = grad_state
    ac = _autocast_state
    return (st.enabled, st.inference, _default_dtype[0], ac.cpu and ac.dtype["cpu"],
            ac.excluded, tuple(map(type, st.modes)) if st.modes else ())


# --- guards on the Python state a function reads ---------------------------------------------
# The walk finds what a function can read besides its arguments: the globals its code names
# (and the code of the user functions those lead to, and of nested code objects), its closure
# cells, the attributes those names pick out of the objects, classes and Python modules it
# reaches, and every nn.Module it reaches. A guard item is checked before a cached graph runs.
_MISSING = object()
_GET, _CELL, _MRO, _CONTENTS, _SLOT = 0, 1, 2, 3, 4
_LIBRARY = tuple({os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep} |
                 {p + os.sep for k in ("stdlib", "platstdlib", "purelib", "platlib")
                  for p in [sysconfig.get_paths().get(k)] if p})
_MODULE_PLAIN = (str, bytes, int, float, bool, type(None))
_HEAPTYPE = 1 << 9  # Py_TPFLAGS_HEAPTYPE: a class made by a class statement (mutable)
_ITERATORS = (types.GeneratorType, types.AsyncGeneratorType, types.CoroutineType,
              type(iter([])), type(iter(())), type(iter({})), type(iter(range(0))))


def _library_code(code):
    """Code of tapegrad, the standard library or an installed package: its globals and
    names are not walked (only what the user's code reaches is guarded)."""
    return code.co_filename.startswith(_LIBRARY) or code.co_filename.startswith("<frozen")


def _state_key(v, keep):
    """A value read by reference, keyed for a guard: scalars by type and value, tuples, lists
    and dicts by structure and their elements' keys, everything else (a tensor too: the graph
    reads it by reference) by identity. ``keep`` (a list, at the snapshot) holds each object
    keyed by identity, so no new object can take its id while the guard lives."""
    t = type(v)
    if t in _SCALARS:
        return _scalar_key(v)
    if t is tuple or t is list or isinstance(v, (tuple, list)):
        if len(v) > _LIMIT:
            raise Unguardable(f"a {t.__name__} of {len(v)} elements")
        if keep is not None:
            keep.append(v)
        return (t, tuple([_state_key(x, keep) for x in v]))
    if isinstance(v, dict):
        if len(v) > _LIMIT:
            raise Unguardable(f"a {t.__name__} of {len(v)} elements")
        if keep is not None:
            keep.append(v)
        return (t, tuple([(_state_key(k, keep), _state_key(x, keep)) for k, x in v.items()]))
    if keep is not None:
        keep.append(v)
    return ("o", id(v))


def _library_class(cls):
    """A class defined by tapegrad, the standard library or an installed package: its
    attributes are not guarded (as its functions' code is not walked)."""
    module = sys.modules.get(cls.__module__)
    path = getattr(module, "__file__", None) or ""
    return path.startswith(_LIBRARY)


def _differs(v, value):
    """Whether ``v`` is not a scalar or tuple of scalars of key ``value``."""
    if type(v) not in _SCALARS and type(v) is not tuple:
        return True
    try:
        return _state_key(v, None) != value
    except (Unguardable, RecursionError):
        return True


def _mro_lookup(cls, name):
    """What ``cls.name`` resolves to in its classes' dicts (the raw descriptor: a
    classmethod is not bound anew each time)."""
    for k in cls.__mro__:
        d = k.__dict__
        if name in d:
            return d[name]
    return _MISSING


def _module_fact(m, keep):
    """What an nn.Module holds: its class and each entry of its ``__dict__``: plain values
    (numbers, strings, tuples of them) by value, everything else (parameters, buffers,
    children, hook dicts) by identity, with the contents of its dicts and sets. Changed only
    through Module methods, which move ``tracer.MODULE_EPOCH`` on."""
    d = m.__dict__
    values = list(d.values())
    out = [type(m), tuple(d)]
    for v in values:
        t = type(v)
        if t in _SCALARS:
            out.append(_scalar_key(v))
        elif t is dict or t is OrderedDict:
            out.append(id(v))
            if v:
                out.append(tuple(v))
                out.append(tuple(map(id, v.values())))
                if keep is not None:
                    keep.append(list(v.values()))
        elif t is set:
            out.append((id(v), frozenset(v)))
        elif t is tuple and all(type(x) in _SCALARS for x in v):
            out.append(_state_key(v, None))
        else:
            out.append(id(v))
    if keep is not None:
        keep.append(values)
    return tuple(out)


class StateGuard:
    """The Python state a function can read, as found before a trace; ``check()`` tells
    whether it is all still the same. Items are ``(kind, source, key, object, value key)``:
    the value at ``source[key]`` (a dict: globals, a Python module's or an object's
    ``__dict__``), in a closure cell, found in a class's MRO, or in an object's ``__slots__``
    field, must be that object or, with a value key, equal by value; ``_CONTENTS`` items
    re-key a mutable container (a list, dict) found there. nn.Modules are checked by
    ``_module_fact``, only when ``tracer.MODULE_EPOCH`` moved since the last check that
    passed."""

    def __init__(self, fn, args=(), kwargs=None, modules=()):
        self.items = []
        self.keep = []
        self.modules = []  # (module, its fact)
        self.epoch = MODULE_EPOCH[0]
        self._seen = set()
        self._objects = []  # (object, attribute names already guarded)
        self._names = set()
        self._codes = []
        for m in modules:
            self._visit(m)
        self._root(fn)
        self._drain()
        for a in (*args, *(kwargs or {}).values()):  # objects passed in: their attributes
            if not isinstance(a, Tensor) and type(a) not in _SCALARS:
                self._visit(a, contents=False)  # (a container's structure is in the key)
        self._drain()
        self._seen = self._objects = self._codes = None

    def _drain(self):
        """Walk the queued code, then the attributes the names found so far pick out."""
        while self._codes or any(len(done) < len(self._names) for _, done in self._objects):
            while self._codes:
                self._code(*self._codes.pop())
            for obj, done in list(self._objects):
                for name in self._names - done:
                    done.add(name)
                    self._attribute(obj, name)

    def _root(self, fn):
        func = fn
        if isinstance(fn, functools.partial):
            for a in (*fn.args, *fn.keywords.values()):
                self._visit(a)
            func = fn.func
        target = getattr(func, "__self__", None)
        if target is not None and not isinstance(target, types.ModuleType):
            self._visit(target)
        func = getattr(func, "__func__", func)
        if isinstance(func, types.FunctionType):
            self._function(func, root=True)
        elif not isinstance(func, types.BuiltinFunctionType):
            self._visit(func)

    def _function(self, f, root=False):
        code = f.__code__
        if root or not _library_code(code):
            self._codes.append((code, f.__globals__, f.__closure__))
            for name in ("__defaults__", "__kwdefaults__"):  # (a mutable default's contents)
                if getattr(f, name) is not None:
                    self._item(_SLOT, f, name, getattr(f, name))

    def _code(self, code, g, closure):
        key = (id(code), id(g), id(closure))  # (closures of one code object differ)
        if key in self._seen:
            return
        self._seen.add(key)
        self.keep.append((code, g, closure))
        self._names.update(code.co_names)
        builtins = g.get("__builtins__")
        builtins = getattr(builtins, "__dict__", builtins) or {}
        for name in code.co_names:
            if name in g:
                self._item(_GET, g, name, g[name])
            elif name in builtins:  # a global of that name made later would shadow it
                self.items.append((_GET, g, name, _MISSING, None))
        for cell in closure or ():
            try:
                v = cell.cell_contents
            except ValueError:
                v = _MISSING
            self._item(_CELL, cell, None, v)
        for c in code.co_consts:
            if isinstance(c, types.CodeType):
                self._codes.append((c, g, None))

    def _attribute(self, obj, name):
        if isinstance(obj, type):
            v = _mro_lookup(obj, name)
            if v is not _MISSING:
                self._item(_MRO, obj, name, v)
            return
        if isinstance(obj, _module_class()):
            return  # (its own attributes are its fact)
        d = getattr(obj, "__dict__", None)
        if isinstance(d, dict) and name in d:
            self._item(_GET, d, name, d[name])
        elif not isinstance(obj, types.ModuleType):
            v = _mro_lookup(type(obj), name)
            if not _library_class(type(obj)):
                if isinstance(v, types.MemberDescriptorType):  # a __slots__ field
                    self._item(_SLOT, obj, name, getattr(obj, name, _MISSING))
            else:
                self._library_method(obj, v)

    def _library_method(self, obj, f):
        """A method of a library object the user's code calls (``sched.get_last_lr()``):
        the fields of ``obj`` its code names (and of the methods of ``obj`` it names in
        turn) are guarded, as the user's own. A method the compiler hooks (an optimizer's or
        scheduler's ``step``, ``zero_grad``: effect nodes that run it at each call) is not."""
        f = f.fget if isinstance(f, property) else getattr(f, "__func__", f)
        if not isinstance(f, types.FunctionType) or hasattr(f, "__wrapped__") or \
                getattr(f, "_compiler_hook", False):
            return
        key = (id(obj), id(f.__code__))
        if key in self._seen:
            return
        self._seen.add(key)
        d = getattr(obj, "__dict__", None)
        for name in f.__code__.co_names:
            if isinstance(d, dict) and name in d:
                self._item(_GET, d, name, d[name])
            else:
                self._library_method(obj, _mro_lookup(type(obj), name))

    def _item(self, kind, source, key, v):
        t = type(v)
        if t in _SCALARS:
            self.items.append((kind, source, key, v, _scalar_key(v)))
            return
        if t is tuple and all(type(x) in _SCALARS for x in v):
            self.items.append((kind, source, key, v, _state_key(v, None)))
            return
        self.keep.append(v)
        self.items.append((kind, source, key, v, None))
        if v is not _MISSING:
            self._visit(v)

    def _visit(self, v, contents=True):
        """Guard what ``v`` holds (a container's contents, a module's state) and walk on."""
        if id(v) in self._seen or type(v) in _SCALARS or isinstance(v, Tensor):
            return
        self._seen.add(id(v))
        self.keep.append(v)
        if isinstance(v, (tuple, list, dict)):
            if contents:
                key = _state_key(v, self.keep)
                if type(v) is not tuple:
                    self.items.append((_CONTENTS, v, None, None, key))
            for x in (v.values() if isinstance(v, dict) else v):
                self._visit(x)
            return
        if isinstance(v, (types.FunctionType, types.MethodType)):
            if isinstance(v, types.MethodType):
                self._visit(v.__self__)
                v = v.__func__
            if isinstance(v, types.FunctionType):
                self._function(v)
            return
        if isinstance(v, (types.BuiltinFunctionType, types.CodeType)):
            return
        if isinstance(v, functools.partial):
            for x in (v.func, *v.args, *v.keywords.values()):
                self._visit(x)
            return
        if isinstance(v, types.ModuleType) and v.__name__ in ("random", "numpy.random") or \
                isinstance(v, (random.Random, np.random.Generator, np.random.RandomState)):
            # a number drawn in the traced call would be a literal of the graph
            raise Unguardable(f"it reads Python random numbers ({type(v).__name__} "
                              f"{getattr(v, '__name__', '')})")
        if isinstance(v, _ITERATORS) or not isinstance(v, type) and \
                hasattr(type(v), "__next__") and (not type(v).__flags__ & _HEAPTYPE or
                                                  _library_class(type(v))):
            # what the next call takes from it is hidden in its state: nothing to guard by
            raise Unguardable(f"it reads a {type(v).__name__}, whose position no guard "
                              "can see")
        if isinstance(v, (staticmethod, classmethod)):
            self._visit(v.__func__)
            return
        if isinstance(v, property):
            for f in (v.fget, v.fset):
                if f is not None:
                    self._visit(f)
            return
        if isinstance(v, _module_class()):
            self.modules.append((v, _module_fact(v, self.keep)))
            for x in v.__dict__.values():
                if isinstance(x, dict):
                    for y in x.values():
                        self._visit(y)
                elif isinstance(x, (list, tuple)) or not isinstance(x, _MODULE_PLAIN):
                    self._visit(x)
            self._visit(type(v))
            return
        if isinstance(v, type):
            if v.__flags__ & _HEAPTYPE and not _library_class(v):  # (a static type is fixed)
                self._objects.append((v, set()))
                self._class(v)
            return
        self._objects.append((v, set()))  # a Python module, any other object
        if not isinstance(v, types.ModuleType):
            self._visit(type(v))

    def _class(self, cls):
        """A user class's own functions are code the call may run (a Module's forward)."""
        for k in cls.__mro__:
            if id(k) in self._seen:
                continue
            self._seen.add(id(k))
            for x in list(vars(k).values()):
                f = getattr(x, "__func__", x)
                if isinstance(f, types.FunctionType) and not _library_code(f.__code__):
                    self._function(f)

    def check(self):
        """Whether the state is as found; cheap enough for every call."""
        for kind, source, key, want, value in self.items:
            if kind == _GET:
                v = source.get(key, _MISSING)
            elif kind == _CELL:
                try:
                    v = source.cell_contents
                except ValueError:
                    v = _MISSING
            elif kind == _MRO:
                v = _mro_lookup(source, key)
            elif kind == _SLOT:
                v = getattr(source, key, _MISSING)
            else:
                try:
                    if _state_key(source, None) != value:
                        return False
                except (Unguardable, RecursionError):  # (grown too large, or into itself)
                    return False
                continue
            if v is not want and (value is None or _differs(v, value)):
                return False
        epoch = MODULE_EPOCH[0]
        if self.epoch != epoch and self.modules:
            for m, fact in self.modules:
                if _module_fact(m, None) != fact:
                    return False
            self.epoch = epoch
        return True

    def describe(self):
        """One line per item (``TAPEGRAD_LOGS=guards``)."""
        names = {_GET: "value", _CELL: "closure cell", _MRO: "class attribute",
                 _CONTENTS: "contents of", _SLOT: "slot"}
        lines = []
        for kind, source, key, want, value in self.items:
            what = key if key is not None else type(source).__name__
            how = f"== {value[1]!r}" if value is not None and kind != _CONTENTS else \
                "unchanged" if kind == _CONTENTS else f"is {type(want).__name__}@{id(want)}"
            lines.append(f"state {names[kind]} {what} {how}")
        lines += [f"state module {type(m).__name__}@{id(m)} unchanged" for m, _ in self.modules]
        return lines


def _module_class():
    from tapegrad.nn.module import Module

    return Module


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


def _tail_reads(graph, tracer):
    """Every value read came after the last op (``loss.item()`` once the optimizer stepped):
    the whole call is one graph, its reads served after it ran (``TailEntry``)."""
    n = len(graph.nodes)
    return tracer.tail_ok and tracer.joint is None and \
        all(k == n for k, _, _ in tracer.splits) and \
        all(src.kind in ("arg", "ref", "hyper") for _, src in graph.inputs)


class _Diverged(Exception):
    """A tail replay met Python that did something else than the traced call did."""


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
