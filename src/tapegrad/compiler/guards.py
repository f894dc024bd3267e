"""Guards of a compiled function: when may a cached graph run again?

A call's key is its arguments by structure, type and value (tensors by shape, dtype and
requires_grad), the active modes (``mode_key``: grad mode, autocast, default dtype,
dispatch modes) and the training flags; ``StateGuard`` snapshots the Python state the
traced code names (globals, closure cells, defaults, attributes of objects and modules,
container contents) and rechecks it on each call.
"""
import functools
import os
import random
import sys
import sysconfig
import types
import weakref
from collections import OrderedDict

import numpy as np

from tapegrad.amp.autocast_mode import _state as _autocast_state
from tapegrad.autograd.grad_mode import state as grad_state
from tapegrad.dtypes import _default as _default_dtype
from tapegrad.nn.module import MODULE_EPOCH
from tapegrad.tensor import Tensor


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
    through Module methods, which move ``nn.module.MODULE_EPOCH`` on."""
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
    ``_module_fact``, only when ``nn.module.MODULE_EPOCH`` moved since the last check that
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
        scheduler's ``step``, ``zero_grad``: ``engine.hook_point``s, effect nodes that run it at
        each call) is not."""
        f = f.fget if isinstance(f, property) else getattr(f, "__func__", f)
        if not isinstance(f, types.FunctionType) or hasattr(f, "__wrapped__") or \
                getattr(f, "hook_point", False):
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
