"""``tapegrad.serialization`` as ``torch.serialization``: PyTorch's ``torch.save`` file format,
read and written without torch, and the safe-globals registry of ``weights_only`` loads.

**The format** (as ``torch.save`` writes it since PyTorch 1.6): a zip archive of stored
(uncompressed) records under one folder (``archive/`` here)

- ``data.pkl``: the object, pickled with protocol 2. Each tensor is
  ``torch._utils._rebuild_tensor_v2(storage, storage_offset, size, stride, requires_grad,
  OrderedDict())`` (a Parameter wraps it in ``torch._utils._rebuild_parameter``); each storage
  is a persistent id ``("storage", torch.FloatStorage, key, "cpu", numel)``;
- ``data/<key>``: each storage's bytes, 64-byte aligned in the file;
- ``.format_version`` (``1``), ``.storage_alignment`` (``64``), ``byteorder`` (``little``),
  ``version`` (``3``) and ``.data/serialization_id``.

Tensors that share memory (views, a transposed tensor) share one storage, so they load as
views of one another. Dtypes map to tapegrad's: float64/32/16, bfloat16, int64/32/16/8,
uint8, bool (other PyTorch dtypes raise a clear error when a tensor uses them).

**Loading with ``weights_only=True``** (the default) runs a restricted unpickler, written
opcode by opcode: it never imports or calls anything from the file but an allow-list --
tensor rebuild functions, storage types and dtypes (each mapped to tapegrad's),
``collections.OrderedDict``/``Counter``, ``torch.Size``, ``torch.device``, ``set``,
``complex``, ``bytearray``, ``_codecs.encode`` -- and the globals added with
``add_safe_globals``; anything else raises ``pickle.UnpicklingError``, as in PyTorch. Globals
of the modules ``sys``, ``os``, ``posix`` and ``nt`` are refused even when added. Its work is
bounded by the file: ``bytearray`` is rebuilt only from contents, tensors only from storages
(never by calling ``torch.Tensor``), ``torch.Size`` only from int64s, and hashing keys of
shared tuples has a budget; tensors with backward hooks are refused.
``weights_only=False`` uses Python's unpickler, as PyTorch does: only for trusted files.
"""
import _compat_pickle
import collections
import copyreg
import io as _io
import pickle
import pickletools
import secrets
import struct
import sys
import zipfile

from tapegrad import dtypes
from tapegrad.backend import xp, to_host
from tapegrad.backend.numpy_backend import Device
from tapegrad.io import _CorruptCheckpoint, _bounded_repr, load, save
from tapegrad.tensor import Tensor

__all__ = ["save", "load", "add_safe_globals", "get_safe_globals", "clear_safe_globals",
           "safe_globals", "get_unsafe_globals_in_checkpoint"]

DEFAULT_PROTOCOL = 2
_ALIGNMENT = 64
_BLOCKED_MODULES = ("sys", "os", "posix", "nt")

# --- safe globals ------------------------------------------------------------------------------
_safe_globals = set()


def add_safe_globals(safe_globals: list) -> None:
    """As ``torch.serialization.add_safe_globals``: allow these functions/classes in
    ``weights_only`` loads. An item is the object (matched by ``module.qualname``) or a tuple
    ``(object, "full.path.in.the.file")``.

    >>> tapegrad.serialization.add_safe_globals([MyConfig])
    """
    global _safe_globals
    _safe_globals = _safe_globals.union(set(safe_globals))


def get_safe_globals() -> list:
    """As ``torch.serialization.get_safe_globals()``: the globals added by the user."""
    return list(_safe_globals)


def clear_safe_globals() -> None:
    """As ``torch.serialization.clear_safe_globals()``."""
    global _safe_globals
    _safe_globals = set()


class safe_globals:
    """As ``torch.serialization.safe_globals([...])``: a context manager that allows these
    globals in ``weights_only`` loads inside its block.

    >>> with tapegrad.serialization.safe_globals([MyConfig]):
    ...     tapegrad.load("ckpt.pt")
    """

    def __init__(self, safe_globals: list):
        self.safe_globals = safe_globals

    def __enter__(self):
        add_safe_globals(self.safe_globals)

    def __exit__(self, *exc):
        global _safe_globals
        _safe_globals = _safe_globals - set(self.safe_globals)


def _user_globals():
    out = {}
    for g in _safe_globals:
        if isinstance(g, tuple):
            if len(g) != 2:
                raise ValueError("Expected tuple of length 2 (global, str of callable full "
                                 f"path), but got tuple of length: {len(g)}")
            if type(g[1]) is not str:
                raise TypeError("Expected second item in tuple to be str of callable full path, "
                                f"but got: {type(g[1])}")
            out[g[1]] = g[0]
        else:
            out[f"{g.__module__}.{g.__qualname__}"] = g
    return out


# --- storages and tensors ----------------------------------------------------------------------
_STORAGE_DTYPES = {"DoubleStorage": "float64", "FloatStorage": "float32",
                   "HalfStorage": "float16", "BFloat16Storage": "bfloat16",
                   "LongStorage": "int64", "IntStorage": "int32", "ShortStorage": "int16",
                   "CharStorage": "int8", "ByteStorage": "uint8", "BoolStorage": "bool",
                   "ComplexFloatStorage": "complex64", "ComplexDoubleStorage": "complex128",
                   "QInt8Storage": "qint8", "QUInt8Storage": "quint8", "QInt32Storage": "qint32",
                   "QUInt4x2Storage": "quint4x2", "QUInt2x4Storage": "quint2x4"}
_STORAGE_OF = {v: k for k, v in _STORAGE_DTYPES.items()}
_TORCH_DTYPES = ["float64", "float32", "float16", "bfloat16", "int64", "int32", "int16", "int8",
                 "uint8", "bool", "complex32", "complex64", "complex128", "uint16", "uint32",
                 "uint64", "float8_e5m2", "float8_e4m3fn", "float8_e5m2fnuz", "float8_e4m3fnuz",
                 "qint8", "quint8", "qint32", "quint4x2", "quint2x4", "bits8", "bits16"]


def _tapegrad_dtype(name):
    try:
        return dtypes.to_dtype(name) if name in dtypes._NAMES else None
    except TypeError:
        return None


class _StorageType:
    """What ``torch.FloatStorage`` & co. unpickle to: the element type of a storage."""

    def __init__(self, name, dtype_name):
        self.name, self.dtype_name = name, dtype_name
        self.dtype = _tapegrad_dtype(dtype_name)

    def __repr__(self):
        return f"torch.{self.name}"


class _UnsupportedDtype:
    """A PyTorch dtype tapegrad has no counterpart for (complex64, float8...)."""

    def __init__(self, name):
        self.name = name

    def __repr__(self):
        return f"torch.{self.name}"


class _Storage:
    """A loaded storage: a 1-D array of its elements, on the CPU. ``map_location``
    callables receive it and may return it."""

    def __init__(self, array, dtype):
        self.array, self.dtype = array, dtype

    device = property(lambda self: Device("cpu"))

    def cpu(self):
        return self

    def size(self):
        return self.array.shape[0]

    def nbytes(self):
        return self.array.nbytes

    def __repr__(self):
        return f"<storage of {self.size()} {self.dtype.name} elements>"


_INT64_MAX = 2**63 - 1
_MAX_DIMS = 64  # numpy's limit; checked before multiplying out sizes the file may repeat


def _int_tuple(value, what):
    """A tensor's size or stride: ints that fit PyTorch's int64, as PyTorch requires."""
    if type(value) not in (list, tuple) or any(type(v) is not int for v in value):
        raise _CorruptCheckpoint(f"tensor {what} {_bounded_repr(value)} is not a tuple of ints")
    for v in value:
        if not -_INT64_MAX - 1 <= v <= _INT64_MAX:
            raise _CorruptCheckpoint(f"tensor {what} {_bounded_repr(value)} holds "
                                     f"{_bounded_repr(v)}, outside int64")
    return tuple(value)


def _no_hooks(backward_hooks, what):
    """PyTorch never writes hooks (torch.save drops them): a file that carries some wants
    objects of its choosing called at backward time, and tapegrad does not restore them."""
    if backward_hooks:
        raise pickle.UnpicklingError(f"{what} is rebuilt with backward hooks "
                                     f"{_bounded_repr(backward_hooks)}; tapegrad does not load "
                                     "hooks from a file")


def _rebuild_tensor_v2(storage, storage_offset, size, stride, requires_grad=False,
                       backward_hooks=None, metadata=None):
    if not isinstance(storage, _Storage):
        raise _CorruptCheckpoint(f"a tensor is rebuilt from {type(storage).__name__}, not a "
                                 "storage")
    _no_hooks(backward_hooks, "a tensor")
    size, stride = _int_tuple(size, "size"), _int_tuple(stride, "stride")
    arr = storage.array
    if type(storage_offset) is not int or not 0 <= storage_offset <= _INT64_MAX or \
            len(size) != len(stride) or len(size) > _MAX_DIMS or any(n < 0 for n in size) or \
            any(s < 0 for s in stride):
        raise _CorruptCheckpoint(f"invalid tensor geometry: offset "
                                 f"{_bounded_repr(storage_offset)}, size {_bounded_repr(size)}, "
                                 f"stride {_bounded_repr(stride)} (at most {_MAX_DIMS} dims)")
    numel = 1
    for n in size:
        numel *= n
    if numel:
        last = storage_offset + sum((n - 1) * s for n, s in zip(size, stride))
        if last >= arr.shape[0]:
            raise _CorruptCheckpoint(f"a tensor of size {size}, stride {stride} at offset "
                                     f"{storage_offset} reaches element {last} of a storage of "
                                     f"{arr.shape[0]}")
        # a stride too large in bytes for numpy can only be a size-1 dim's (a longer dim
        # would reach past the storage): it addresses nothing, so it becomes 0
        strides = [s * arr.itemsize if s * arr.itemsize <= _INT64_MAX else 0 for s in stride]
        data = xp.lib.stride_tricks.as_strided(arr[storage_offset:], shape=size, strides=strides)
    else:
        data = arr[:0].reshape(size)
    t = Tensor._make(data)
    if requires_grad:
        t.requires_grad = bool(requires_grad)
    return t


def _rebuild_tensor(storage, storage_offset, size, stride):
    return _rebuild_tensor_v2(storage, storage_offset, size, stride)


def _parameter(data, requires_grad=True):
    from tapegrad.nn.parameter import Parameter

    if not isinstance(data, Tensor):
        raise _CorruptCheckpoint(f"a Parameter is rebuilt from {type(data).__name__}")
    return Parameter(data, requires_grad=bool(requires_grad))


def _rebuild_parameter(data, requires_grad, backward_hooks=None):
    _no_hooks(backward_hooks, "a Parameter")
    return _parameter(data, requires_grad)


def _set_state(obj, state, what):
    if state:
        raise _CorruptCheckpoint(f"{what} carries Python attributes {_bounded_repr(state)}, "
                                 "which tapegrad tensors cannot hold")
    return obj


def _rebuild_parameter_with_state(data, requires_grad, backward_hooks, state):
    _no_hooks(backward_hooks, "a Parameter")
    return _set_state(_parameter(data, requires_grad), state, "a Parameter")


def _rebuild_from_type_v2(func, new_type, args, state):
    from tapegrad.nn.parameter import Parameter

    ret = func(*args)
    if new_type is Parameter and not isinstance(ret, Parameter):
        ret = _parameter(ret, ret.requires_grad)
    elif new_type is not Tensor and new_type is not Parameter:
        raise _CorruptCheckpoint(f"tensor subclass {_bounded_repr(new_type)} is not supported")
    return _set_state(ret, state, "a tensor")


def _size(dims=()):
    """``torch.Size(dims)``: a tuple of ints, refused as PyTorch refuses other items."""
    if type(dims) not in (list, tuple):
        raise _CorruptCheckpoint(f"torch.Size is rebuilt from {_bounded_repr(dims)}, not a "
                                 "sequence of ints")
    for i, v in enumerate(dims):
        if type(v) not in (int, bool) or not -_INT64_MAX - 1 <= v <= _INT64_MAX:
            raise _CorruptCheckpoint(f"torch.Size takes int64 items, but item {i} of "
                                     f"{_bounded_repr(dims)} is {_bounded_repr(v)}")
    return tuple(int(v) for v in dims)


def _device(spec, index=None):
    return Device(spec) if index is None else Device(spec, index)


def _bytes_from_latin1(text, encoding="latin1"):
    if type(text) is not str or encoding not in ("latin1", "latin-1"):
        raise _CorruptCheckpoint(f"_codecs.encode of {_bounded_repr(text)} with encoding "
                                 f"{_bounded_repr(encoding)}")
    return text.encode("latin1")


def _bytearray(data=b"", encoding=None):
    """``bytearray`` as pickles rebuild it, from its contents (bytes, or text and an
    encoding): never from a count, which would allocate whatever size the file names."""
    if encoding is not None:
        return bytearray(_bytes_from_latin1(data, encoding))
    if type(data) not in (bytes, bytearray):
        raise _CorruptCheckpoint(f"bytearray is rebuilt from {_bounded_repr(data)}, not bytes")
    return bytearray(data)


def _torch_globals():
    """PyTorch's globals that a weights-only load accepts, mapped to tapegrad's."""
    from tapegrad.nn.parameter import Parameter

    out = {"collections.OrderedDict": collections.OrderedDict,
           "collections.Counter": collections.Counter,
           "torch._utils._rebuild_tensor_v2": _rebuild_tensor_v2,
           "torch._utils._rebuild_tensor": _rebuild_tensor,
           "torch._utils._rebuild_parameter": _rebuild_parameter,
           "torch._utils._rebuild_parameter_with_state": _rebuild_parameter_with_state,
           "torch._tensor._rebuild_from_type_v2": _rebuild_from_type_v2,
           "torch.nn.parameter.Parameter": Parameter, "torch.Tensor": Tensor,
           "torch.Size": _size, "torch.device": _device,
           "_codecs.encode": _bytes_from_latin1, "builtins.bytearray": _bytearray,
           "builtins.set": set, "builtins.complex": complex}
    for name in _TORCH_DTYPES:
        out[f"torch.{name}"] = _tapegrad_dtype(name) or _UnsupportedDtype(name)
    for name, dtype_name in _STORAGE_DTYPES.items():
        out[f"torch.{name}"] = _StorageType(name, dtype_name)
    # PyTorch allows the class by its defining module's name only, as it pickles it
    out["torch.storage.UntypedStorage"] = _StorageType("UntypedStorage", "uint8")
    return out


_GLOBALS = []


def _allowed():
    if not _GLOBALS:
        _GLOBALS.append(_torch_globals())
    return _GLOBALS[0]


def _full_name(module, name):
    if (module, name) in _compat_pickle.NAME_MAPPING:
        module, name = _compat_pickle.NAME_MAPPING[(module, name)]
    elif module in _compat_pickle.IMPORT_MAPPING:
        module = _compat_pickle.IMPORT_MAPPING[module]
    if module == "torch.tensor":
        module = "torch._tensor"
    return module, name


# --- the restricted unpickler ------------------------------------------------------------------
_HASHING = (set, collections.Counter, collections.OrderedDict)
_MAX_HASH_WORK = 1 << 24  # steps; a checkpoint's keys are strings and ints, which cost none
_OP = {name: code[0] for name, code in vars(pickle).items()
       if name.isupper() and isinstance(code, bytes) and len(code) == 1}


class _WeightsUnpickler:
    """Rebuilds a pickle opcode by opcode, creating only allowed objects (see module doc).
    Malformed data raises ``_CorruptCheckpoint``; a disallowed object ``UnpicklingError``."""

    def __init__(self, data, persistent_load, encoding="utf-8"):
        self.data, self.pos = data, 0
        self.persistent_load = persistent_load
        self.encoding = encoding

    def read(self, n):
        end = self.pos + n
        if n < 0 or end > len(self.data):
            raise _CorruptCheckpoint("data.pkl is truncated")
        out = self.data[self.pos:end]
        self.pos = end
        return out

    def readline(self):
        end = self.data.find(b"\n", self.pos)
        if end < 0:
            raise _CorruptCheckpoint("data.pkl is truncated")
        out = self.data[self.pos:end]
        self.pos = end + 1
        return out

    def load(self):
        self.allowed, self.user = _allowed(), _user_globals()
        self.allowed_values = [v for v in self.allowed.values()] + list(self.user.values())
        self.hash_work = _MAX_HASH_WORK
        self.sizes = {}  # id(tuple) -> (the tuple, kept alive so its id stays its own; size)
        self.stack, self.metastack, self.memo = [], [], {}
        try:
            while True:
                op = self.read(1)[0]
                if op == _OP["STOP"]:
                    if len(self.stack) != 1 or self.metastack:
                        raise _CorruptCheckpoint("data.pkl ends with an unbalanced stack")
                    return self.stack[0]
                self.step(op)
        except (IndexError, KeyError, TypeError, ValueError, AttributeError,
                OverflowError) as e:
            raise _CorruptCheckpoint(f"malformed data.pkl at byte {self.pos}: "
                                     f"{type(e).__name__}: {e}") from None

    def hashing(self, items):
        """Charge the work of hashing (and comparing) ``items`` as keys. Tuples cache no hash:
        one that holds the tuple below it twice per level, 40 levels deep through the memo,
        takes 2**40 steps to hash, so the whole load gets a budget of such steps. A tuple's
        size as hashing walks it is computed once over its distinct parts (tuples cannot
        change) and remembered."""
        for item in items:
            if type(item) in (tuple, frozenset):
                self.hash_work -= 2 * self.walked_size(item)  # hash, then compare to its equal
                if self.hash_work < 0:
                    raise _CorruptCheckpoint(
                        f"data.pkl builds keys of tuples that share the tuples inside them so "
                        f"often that hashing them would take more than {_MAX_HASH_WORK} steps "
                        f"(at byte {self.pos}); refused")
        return items

    def walked_size(self, root):
        sizes, pending = self.sizes, [root]
        while pending:  # post-order over distinct tuples; tuples cannot hold themselves
            item = pending[-1]
            if id(item) in sizes:
                pending.pop()
                continue
            inner = [v for v in item if type(v) in (tuple, frozenset) and id(v) not in sizes]
            if inner:
                pending.extend(inner)
                continue
            pending.pop()
            sizes[id(item)] = (item, 1 + sum(sizes[id(v)][1] if type(v) in (tuple, frozenset)
                                              else 1 for v in item))
        return sizes[id(root)][1]

    def construct(self, func, args, new=False):
        """``func(*args)`` (``cls.__new__(cls, *args)`` for NEWOBJ) of an allowed callable.
        Tensors come only from storages: the legacy ``torch.Tensor(n)`` would allocate
        whatever size the file names, and a Parameter wraps a rebuilt tensor."""
        from tapegrad.nn.parameter import Parameter

        if func is Parameter:
            return _parameter(*args)
        if func is Tensor and args:
            raise pickle.UnpicklingError(f"the file calls torch.Tensor{_bounded_repr(args)}; "
                                         "tapegrad rebuilds tensors only from their storages")
        return func.__new__(func, *args) if new else func(*args)

    def _allowed_callable(self, obj):
        return any(obj is v for v in self.allowed_values)

    def step(self, op):  # noqa: C901 - one branch per opcode, as in pickle.py
        O, stack, read = _OP, self.stack, self.read
        if op == O["PROTO"] or op == O["FRAME"]:
            read(1 if op == O["PROTO"] else 8)
        elif op == O["GLOBAL"]:
            stack.append(self.find_class(self.readline().decode("utf-8"),
                                         self.readline().decode("utf-8")))
        elif op == O["STACK_GLOBAL"]:
            name, module = stack.pop(), stack.pop()
            if type(name) is not str or type(module) is not str:
                raise _CorruptCheckpoint("STACK_GLOBAL with non-string names")
            stack.append(self.find_class(module, name))
        elif op == O["REDUCE"]:
            args, func = stack.pop(), stack[-1]
            if not self._allowed_callable(func):
                msg = f"Trying to call reduce for unrecognized function {_bounded_repr(func)}"
                raise pickle.UnpicklingError(msg)
            if type(args) is not tuple:
                raise _CorruptCheckpoint("REDUCE arguments are not a tuple")
            if any(func is f for f in _HASHING):  # builds a set or dict of the items in args
                for a in args:
                    if type(a) in (list, tuple):
                        self.hashing(a)
                        self.hashing([p[0] for p in a if type(p) in (list, tuple) and p])
            stack[-1] = self.construct(func, args)
        elif op == O["NEWOBJ"]:
            args, cls = stack.pop(), stack.pop()
            if not (isinstance(cls, type) and self._allowed_callable(cls)):
                raise pickle.UnpicklingError("Can only create new object for nn.Parameter or "
                                             "classes allowlisted via `add_safe_globals` but "
                                             f"got {_bounded_repr(cls)}")
            stack.append(self.construct(cls, args, new=True))
        elif op == O["BUILD"]:
            self.build(stack.pop(), stack[-1])
        elif op == O["BINPERSID"]:
            pid = stack.pop()
            if type(pid) is not tuple:
                raise pickle.UnpicklingError(f"persistent_load id must be tuple, but got "
                                             f"{type(pid)}")
            stack.append(self.persistent_load(pid))
        elif op == O["MARK"]:
            self.metastack.append(stack)
            self.stack = []
        elif op == O["POP"]:
            stack.pop()
        elif op == O["POP_MARK"]:
            self.pop_mark()
        elif op == O["DUP"]:
            stack.append(stack[-1])
        elif op in (O["BINPUT"], O["LONG_BINPUT"]):
            i = read(1)[0] if op == O["BINPUT"] else struct.unpack("<I", read(4))[0]
            self.memo[i] = stack[-1]
        elif op == O["MEMOIZE"]:
            self.memo[len(self.memo)] = stack[-1]
        elif op in (O["BINGET"], O["LONG_BINGET"]):
            i = read(1)[0] if op == O["BINGET"] else struct.unpack("<I", read(4))[0]
            if i not in self.memo:
                raise _CorruptCheckpoint(f"data.pkl refers to memo entry {i}, never stored")
            stack.append(self.memo[i])
        elif op in (O["NONE"], O["NEWTRUE"], O["NEWFALSE"]):
            stack.append(None if op == O["NONE"] else op == O["NEWTRUE"])
        elif op in (O["BININT"], O["BININT1"], O["BININT2"]):
            fmt = {O["BININT"]: "<i", O["BININT1"]: "<B", O["BININT2"]: "<H"}[op]
            stack.append(struct.unpack(fmt, read(struct.calcsize(fmt)))[0])
        elif op in (O["LONG1"], O["LONG4"]):
            n = read(1)[0] if op == O["LONG1"] else struct.unpack("<i", read(4))[0]
            stack.append(pickle.decode_long(read(n)))
        elif op == O["BINFLOAT"]:
            stack.append(struct.unpack(">d", read(8))[0])
        elif op in (O["BINUNICODE"], O["SHORT_BINUNICODE"], O["BINUNICODE8"]):
            n = self.length(op, O["SHORT_BINUNICODE"], O["BINUNICODE"])
            stack.append(str(read(n), "utf-8", "surrogatepass"))
        elif op in (O["BINBYTES"], O["SHORT_BINBYTES"], O["BINBYTES8"]):
            stack.append(bytes(read(self.length(op, O["SHORT_BINBYTES"], O["BINBYTES"]))))
        elif op == O["BYTEARRAY8"]:
            stack.append(bytearray(read(struct.unpack("<Q", read(8))[0])))
        elif op in (O["SHORT_BINSTRING"], O["BINSTRING"]):
            n = read(1)[0] if op == O["SHORT_BINSTRING"] else struct.unpack("<i", read(4))[0]
            raw = read(n)
            stack.append(raw if self.encoding == "bytes" else raw.decode(self.encoding))
        elif op in (O["EMPTY_TUPLE"], O["EMPTY_LIST"], O["EMPTY_DICT"], O["EMPTY_SET"]):
            stack.append({O["EMPTY_TUPLE"]: tuple, O["EMPTY_LIST"]: list,
                          O["EMPTY_DICT"]: dict, O["EMPTY_SET"]: set}[op]())
        elif op == O["TUPLE"]:
            items = tuple(self.pop_mark())
            self.stack.append(items)
        elif op in (O["TUPLE1"], O["TUPLE2"], O["TUPLE3"]):
            n = {O["TUPLE1"]: 1, O["TUPLE2"]: 2, O["TUPLE3"]: 3}[op]
            if len(stack) < n:
                raise _CorruptCheckpoint("TUPLE on a short stack")
            stack[-n:] = [tuple(stack[-n:])]
        elif op in (O["LIST"], O["DICT"], O["FROZENSET"]):
            items = self.pop_mark()
            self.hashing(items[::2] if op == O["DICT"] else items if op == O["FROZENSET"] else [])
            if op == O["DICT"]:
                self.stack.append(dict(zip(items[::2], items[1::2])))
            else:
                self.stack.append(list(items) if op == O["LIST"] else frozenset(items))
        elif op in (O["APPEND"], O["APPENDS"]):
            items = [stack.pop()] if op == O["APPEND"] else self.pop_mark()
            if type(self.stack[-1]) is not list:
                raise pickle.UnpicklingError(f"Can only append to lists, but got "
                                             f"{type(self.stack[-1])}")
            self.stack[-1].extend(items)
        elif op in (O["SETITEM"], O["SETITEMS"]):
            items = [stack.pop(-2), stack.pop()] if op == O["SETITEM"] else self.pop_mark()
            target = self.stack[-1]
            if type(target) not in (dict, collections.OrderedDict, collections.Counter):
                raise pickle.UnpicklingError("Can only SETITEM for dict, collections.OrderedDict"
                                             f", collections.Counter, but got {type(target)}")
            if len(items) % 2:
                raise _CorruptCheckpoint("SETITEMS with an odd number of items")
            self.hashing(items[::2])
            for i in range(0, len(items), 2):
                target[items[i]] = items[i + 1]
        elif op == O["ADDITEMS"]:
            items = self.pop_mark()
            if type(self.stack[-1]) is not set:
                raise pickle.UnpicklingError(f"Can only add to sets, got {type(self.stack[-1])}")
            self.stack[-1].update(self.hashing(items))
        else:
            name = pickletools.code2op.get(chr(op))
            raise pickle.UnpicklingError(f"Unsupported operand {op}"
                                         + (f" ({name.name})" if name else ""))

    def length(self, op, short, four):
        if op == short:
            return self.read(1)[0]
        return struct.unpack("<I" if op == four else "<Q", self.read(4 if op == four else 8))[0]

    def pop_mark(self):
        if not self.metastack:
            raise _CorruptCheckpoint("data.pkl pops a MARK it never set")
        items, self.stack = self.stack, self.metastack.pop()
        return items

    def find_class(self, module, name):
        module, name = _full_name(module, name)
        full = f"{module}.{name}"
        if module in _BLOCKED_MODULES:
            raise pickle.UnpicklingError(f"Trying to load unsupported GLOBAL {full} whose module "
                                         f"{module} is blocked.")
        if full in self.allowed:
            return self.allowed[full]
        if full in self.user:
            return self.user[full]
        if full.startswith("builtins."):
            full = full[len("builtins."):]
        raise pickle.UnpicklingError(
            f"Unsupported global: GLOBAL {full} was not an allowed global by default. Please use "
            f"`tapegrad.serialization.add_safe_globals([{full}])` or the "
            f"`tapegrad.serialization.safe_globals([{full}])` context manager to allowlist this "
            "global if you trust this class/function.")

    def build(self, state, inst):
        from tapegrad.nn.parameter import Parameter

        if isinstance(inst, (Tensor, Parameter)):
            _set_state(inst, state, "a tensor")
        elif type(inst) is collections.OrderedDict or type(inst) in self.user.values():
            if hasattr(inst, "__setstate__") and type(inst) is not collections.OrderedDict:
                inst.__setstate__(state)
                return
            slots = None
            if isinstance(state, tuple) and len(state) == 2:
                state, slots = state
            if state:
                inst.__dict__.update(state)
            for k, v in (slots or {}).items():
                setattr(inst, k, v)
        else:
            raise pickle.UnpicklingError("Can only build Tensor, Parameter, OrderedDict or types "
                                         f"allowlisted via `add_safe_globals`, but got "
                                         f"{type(inst)}")


def _weights_only_message(name, message):
    return (f"Weights only load failed for {name}. Re-running `tapegrad.load` with "
            "`weights_only` set to `False` will likely succeed, but it can result in arbitrary "
            "code execution. Do it only if you got the file from a trusted source.\n\t"
            f"WeightsUnpickler error: {message}")


# --- loading -----------------------------------------------------------------------------------
class _ObjectError(Exception):
    """An exception that is not the file's fault -- raised by its own objects while unpickling
    with ``weights_only=False``, or by the caller's ``map_location`` -- carried through the
    unpicklers and re-raised as it is, not reported as a corrupt file."""

    def __init__(self, error):
        self.error = error


def _on_cpu(storage, location):
    where = location.type if isinstance(location, Device) else str(location)
    if where.split(":")[0] != "cpu":
        raise RuntimeError(f"Attempting to deserialize object on device {_bounded_repr(where)}, "
                           "but tapegrad runs on the CPU only. Please use tapegrad.load with "
                           "map_location='cpu' to map your storages to the CPU.")
    return storage


def _restore_location_of(map_location):
    """``restore(storage, location)`` for a ``map_location`` as ``torch.load`` takes it."""
    if map_location is None:
        return _on_cpu
    if isinstance(map_location, dict):
        return lambda storage, location: _on_cpu(storage, map_location.get(location, location))
    if isinstance(map_location, (str, bytes, Device)):
        target = map_location.decode() if isinstance(map_location, bytes) else map_location
        return lambda storage, location: _on_cpu(storage, target)
    if callable(map_location):
        def restore(storage, location):
            try:
                result = map_location(storage, location)
            except Exception as e:
                raise _ObjectError(e) from None
            if result is None:
                return _on_cpu(storage, location)
            if not isinstance(result, _Storage):
                raise _ObjectError(TypeError(
                    f"tapegrad.load: map_location returned {type(result).__name__} for a storage "
                    f"at {_bounded_repr(location)}; it must return the storage it was given (or "
                    "None)"))
            return result
        return restore
    raise TypeError(f"tapegrad.load: map_location must be a device, string, dict or callable, "
                    f"got {type(map_location).__name__}")


def _check_map_location(map_location):
    """For files without storages (tapegrad's older format, safetensors): the target is CPU."""
    if map_location is None or not callable(map_location) or isinstance(map_location, Device):
        _restore_location_of(map_location)(None, "cpu")


def _ascii(value):
    return value.decode("ascii") if isinstance(value, bytes) else value


def _data_pkl(archive):
    names = archive.names()
    found = [n for n in names if n.count("/") == 1 and n.split("/")[1] == "data.pkl"]
    if len(found) > 1:  # torch.save writes one folder; which one counts would be a guess
        raise _CorruptCheckpoint(f"it holds {len(found)} data.pkl records ({', '.join(found[:4])}"
                                 f"{', ...' if len(found) > 4 else ''}); refused as ambiguous")
    if not found:
        if any(n.endswith("constants.pkl") for n in names):
            raise _CorruptCheckpoint("it is a TorchScript archive (torch.jit.save), which "
                                     "tapegrad does not read")
        raise _CorruptCheckpoint("it is a zip archive but neither a PyTorch checkpoint (no "
                                 "data.pkl) nor a tapegrad checkpoint")
    return found[0][:-len("data.pkl")]


def _load_zip(archive, name, map_location, weights_only, pickle_module, pickle_load_args):
    prefix = _data_pkl(archive)
    byteorder = "little"
    if prefix + "byteorder" in archive.infos:
        byteorder = archive.read(prefix + "byteorder").decode("ascii", "replace")
        if byteorder not in ("little", "big"):
            raise _CorruptCheckpoint(f"unknown byte order {_bounded_repr(byteorder)}")
    restore = _restore_location_of(map_location)
    storages = {}

    def persistent_load(pid):
        if type(pid) is not tuple or len(pid) != 5 or _ascii(pid[0]) != "storage":
            raise _CorruptCheckpoint(f"unknown persistent id {_bounded_repr(pid)}")
        _, stype, key, location, numel = pid
        key, location = _ascii(key), _ascii(location)
        if not isinstance(stype, _StorageType) or type(key) is not str or \
                type(location) is not str or type(numel) is not int or numel < 0:
            raise _CorruptCheckpoint(f"malformed storage id {_bounded_repr(pid, 120)}")
        if key in storages:
            return storages[key]
        if stype.dtype is None:
            raise _CorruptCheckpoint(f"storage {key:.80} holds torch.{stype.dtype_name} elements, "
                                     "which tapegrad does not support")
        np_dtype = stype.dtype.np
        raw = archive.read(f"{prefix}data/{key}")
        if len(raw) != numel * np_dtype.itemsize:
            raise _CorruptCheckpoint(f"storage {key:.80} declares {numel} elements of "
                                     f"{stype.dtype.name} ({numel * np_dtype.itemsize} bytes) "
                                     f"but its record holds {len(raw)} bytes")
        arr = xp.frombuffer(bytearray(raw), dtype=np_dtype)
        if byteorder != sys.byteorder:
            arr.byteswap(inplace=True)
        storages[key] = restore(_Storage(arr, stype.dtype), location)
        return storages[key]

    data = archive.read(prefix + "data.pkl")
    if weights_only:
        try:
            return _WeightsUnpickler(data, persistent_load,
                                     pickle_load_args.get("encoding", "utf-8")).load()
        except pickle.UnpicklingError as e:
            raise pickle.UnpicklingError(_weights_only_message(name, str(e))) from None
    base = (pickle_module or pickle).Unpickler

    class _Unpickler(base):
        def find_class(self, module, qualname):
            full_module, full_name = _full_name(module, qualname)
            found = _allowed().get(f"{full_module}.{full_name}")
            if found is not None:
                return found
            if full_module == "torch" or full_module.startswith("torch."):
                raise pickle.UnpicklingError(
                    f"the file pickles PyTorch's {full_module}.{full_name}, which tapegrad does "
                    "not provide (a whole PyTorch object, such as a torch.nn.Module, was saved: "
                    "save its state_dict() instead)")
            return super().find_class(module, qualname)

    unpickler = _Unpickler(_io.BytesIO(data), **pickle_load_args)
    unpickler.persistent_load = persistent_load
    try:
        return unpickler.load()
    except _ObjectError:
        raise
    except (_CorruptCheckpoint, pickle.UnpicklingError, EOFError) as e:
        raise _CorruptCheckpoint(str(e)) from None
    except Exception as e:
        raise _ObjectError(e) from None


def get_unsafe_globals_in_checkpoint(f) -> list:
    """As ``torch.serialization.get_unsafe_globals_in_checkpoint(f)``: the globals in a
    checkpoint that a ``weights_only`` load would refuse (the file is scanned, never run).

    Every opcode that can name an object is read (``GLOBAL``, ``INST``, ``STACK_GLOBAL``, the
    copyreg extensions ``EXT1/2/4``), and ``STACK_GLOBAL``'s operands are followed through the
    stack and the memo. A pickle whose globals cannot be known without running it raises
    ``pickle.UnpicklingError`` rather than answering with a list that could miss one.
    """
    from tapegrad.io import _FORMAT, CheckpointError, _Archive, _seekable

    name = f if isinstance(f, (str, bytes)) or hasattr(f, "__fspath__") else None
    fh = open(f, "rb") if name is not None else f
    try:
        archive = _Archive(fh if _seekable(fh) else _io.BytesIO(fh.read()))
        if _FORMAT in archive.infos:  # tapegrad's older JSON format names no globals
            return []
        found = _globals_in_pickle(archive.read(_data_pkl(archive) + "data.pkl"))
    except _UnknowableGlobal as e:
        raise pickle.UnpicklingError(f"get_unsafe_globals_in_checkpoint: {f}: {e}") from None
    except (_CorruptCheckpoint, zipfile.BadZipFile, ValueError) as e:
        raise CheckpointError(f"get_unsafe_globals_in_checkpoint: {f} is not a valid "
                              f"checkpoint: {e}") from None
    finally:
        if name is not None:
            fh.close()
    safe = set(_allowed()) | set(_user_globals())
    return sorted(found - safe)


class _UnknowableGlobal(Exception):
    pass


_STRING_OPS = frozenset({"STRING", "BINSTRING", "SHORT_BINSTRING", "UNICODE", "BINUNICODE",
                         "SHORT_BINUNICODE", "BINUNICODE8"})
_MARK = object()  # a MARK on the simulated stack
_UNKNOWN = object()  # a value the scan does not follow (only strings can name a global)


def _globals_in_pickle(data):
    """The full names of every global a pickle refers to, found by simulating its stack and
    memo (strings only) without building or calling anything. Only GLOBAL, INST,
    STACK_GLOBAL and EXT* bring a callable into a pickle; the other opcodes build plain data,
    so a pickle cannot call what this does not see."""
    found, stack, memo = set(), [], {}

    def pop(pos):
        if not stack or stack[-1] is _MARK:
            raise _CorruptCheckpoint(f"data.pkl pops an empty stack at byte {pos}")
        return stack.pop()

    for op, arg, pos in pickletools.genops(data):
        kind = op.name
        if kind in ("GLOBAL", "INST"):
            found.add("%s.%s" % _full_name(*arg.split(" ", 1)))
        elif kind == "STACK_GLOBAL":
            if len(stack) < 2 or not all(type(v) is str for v in stack[-2:]):
                raise _UnknowableGlobal(f"data.pkl builds a global with STACK_GLOBAL (at byte "
                                        f"{pos}) from values that are not string constants; "
                                        "which global it names cannot be known without "
                                        "running it")
            found.add("%s.%s" % _full_name(stack[-2], stack[-1]))
        elif kind in ("EXT1", "EXT2", "EXT4"):
            key = copyreg._inverted_registry.get(arg)
            if key is None:
                raise _UnknowableGlobal(f"data.pkl names a global by copyreg extension code "
                                        f"{arg} (at byte {pos}), which is not registered")
            found.add("%s.%s" % _full_name(*key))
        # the opcode's effect on the stack and the memo
        if kind in ("PUT", "BINPUT", "LONG_BINPUT", "MEMOIZE"):
            if not stack or stack[-1] is _MARK:
                raise _CorruptCheckpoint(f"data.pkl memoizes an empty stack at byte {pos}")
            memo[len(memo) if kind == "MEMOIZE" else arg] = stack[-1]
            continue
        if kind in ("GET", "BINGET", "LONG_BINGET"):
            if arg not in memo:
                raise _CorruptCheckpoint(f"data.pkl refers to memo entry {arg}, never stored")
            stack.append(memo[arg])
            continue
        if kind == "DUP":
            stack.append(stack[-1] if stack else pop(pos))
            continue
        before = op.stack_before
        if pickletools.markobject in before:
            while stack and stack[-1] is not _MARK:
                stack.pop()
            if not stack:
                raise _CorruptCheckpoint(f"data.pkl pops a MARK it never set at byte {pos}")
            stack.pop()
            before = before[:before.index(pickletools.markobject)]
        for _ in before:
            pop(pos)
        for after in op.stack_after:
            stack.append(_MARK if after is pickletools.markobject else
                         arg if kind in _STRING_OPS and type(arg) is str else _UNKNOWN)
    return found


# --- saving ------------------------------------------------------------------------------------
class _Global:
    """A global written by name (``torch._utils._rebuild_tensor_v2``), torch not needed."""

    __slots__ = ("module", "name")

    def __init__(self, module, name):
        self.module, self.name = module, name

    def __call__(self, *args):  # pickle requires reduce functions to be callable
        raise TypeError(f"{self.module}.{self.name} is a name written into a pickle")


_GLOBAL_CACHE = {}


def _global(module, name):
    key = (module, name)
    if key not in _GLOBAL_CACHE:
        _GLOBAL_CACHE[key] = _Global(module, name)
    return _GLOBAL_CACHE[key]


class _StorageRef:
    __slots__ = ("key", "type_name", "array")

    def __init__(self, key, type_name, array):
        self.key, self.type_name, self.array = key, type_name, array


_byte_bounds = getattr(getattr(xp.lib, "array_utils", None), "byte_bounds", None) or \
    getattr(xp, "byte_bounds")  # numpy 2 moved it; pyproject allows numpy 1.26


def _contiguous_strides(shape):
    strides, step = [], 1
    for n in reversed(shape):
        strides.append(step)
        step *= max(n, 1)
    return tuple(reversed(strides))


class _Pickler(pickle._Pickler):
    """Python's pickler, writing tensors as PyTorch does (persistent storage ids)."""

    def __init__(self, file, protocol):
        super().__init__(file, protocol=protocol)
        self.storages = []
        self.by_root = {}  # (id(root array), dtype) -> _StorageRef
        self.keep = []  # the root arrays, so their ids stay unique while pickling

    def persistent_id(self, obj):
        if type(obj) is _StorageRef:
            return ("storage", _global("torch", obj.type_name), obj.key, "cpu",
                    obj.array.shape[0])
        return None

    def save(self, obj, save_persistent_id=True):
        if type(obj) is dtypes.dtype:
            obj = _global("torch", obj.name)
        if type(obj) is not _Global:
            return super().save(obj, save_persistent_id)
        memo = self.memo.get(id(obj))
        if memo is not None:
            self.write(self.get(memo[0]))
            return
        self.write(pickle.GLOBAL + f"{obj.module}\n{obj.name}\n".encode("utf-8"))
        self.memoize(obj)

    def reducer_override(self, obj):
        if not isinstance(obj, Tensor):
            return NotImplemented
        from tapegrad.nn.parameter import Parameter

        hooks = collections.OrderedDict()
        if isinstance(obj, Parameter):
            return (_global("torch._utils", "_rebuild_parameter"),
                    (Tensor._make(obj._data), bool(obj.requires_grad), hooks))
        arr = to_host(obj._data)  # device tensors are saved from a host copy
        storage, offset, strides = self.storage_of(arr)
        return (_global("torch._utils", "_rebuild_tensor_v2"),
                (storage, offset, tuple(arr.shape), strides, bool(obj.requires_grad), hooks))

    def storage_of(self, arr):
        try:
            type_name = _STORAGE_OF[dtypes.from_numpy_dtype(arr.dtype).name]
        except (TypeError, KeyError):
            raise TypeError(f"tapegrad.save: cannot save a tensor of dtype {arr.dtype}") from None
        size = arr.itemsize
        strides = tuple(s // size if n > 1 else c for s, n, c in
                        zip(arr.strides, arr.shape, _contiguous_strides(arr.shape)))
        root = arr
        while isinstance(root.base, xp.ndarray):
            root = root.base
        shareable = arr.size > 0 and root.dtype == arr.dtype and \
            all(s >= 0 for s in root.strides) and \
            all(s >= 0 and s % size == 0 for s, n in zip(arr.strides, arr.shape) if n > 1)
        if shareable:
            low, high = _byte_bounds(root)
            start = _byte_bounds(arr)[0]
            shareable = (start - low) % size == 0 and (high - low) % size == 0
        if not shareable:  # a fresh contiguous copy as its own storage
            root = xp.ascontiguousarray(arr).reshape(-1)
            low = start = _byte_bounds(root)[0] if root.size else 0
            high = low + root.nbytes
            strides = _contiguous_strides(arr.shape)
        key = (id(root), arr.dtype)
        ref = self.by_root.get(key)
        if ref is None:
            flat = xp.lib.stride_tricks.as_strided(root, shape=((high - low) // size,),
                                                   strides=(size,), writeable=False)
            ref = self.by_root[key] = _StorageRef(str(len(self.storages)), type_name, flat)
            self.storages.append(ref)
            self.keep.append(root)
        return ref, (start - low) // size, strides


def _pickle(obj, protocol=DEFAULT_PROTOCOL):
    """``(data.pkl bytes, storages)`` for ``obj``; raises before any file is touched."""
    buf = _io.BytesIO()
    pickler = _Pickler(buf, protocol)
    pickler.dump(obj)
    return buf.getvalue(), pickler.storages


def _write_zip(f, data, disable_byteorder_record=False):
    """Write PyTorch's zip checkpoint: records under ``archive/``, storages 64-byte aligned."""
    pkl, storages = data
    with zipfile.ZipFile(f, "w", compression=zipfile.ZIP_STORED, allowZip64=True) as z:
        base = z.fp.tell()

        def record(name, payload):
            payload = memoryview(payload).cast("B")
            info = zipfile.ZipInfo("archive/" + name, date_time=(1980, 1, 1, 0, 0, 0))
            size = payload.nbytes
            zip64 = size * 1.05 > zipfile.ZIP64_LIMIT  # as zipfile decides for its header
            header = 30 + len(info.filename.encode("utf-8")) + (20 if zip64 else 0)
            pad = -(z.fp.tell() - base + header + 4) % _ALIGNMENT
            info.extra = b"FB" + struct.pack("<H", pad) + b"Z" * pad
            info.file_size = size
            with z.open(info, "w", force_zip64=zip64) as w:
                w.write(payload)

        record("data.pkl", pkl)
        record(".format_version", b"1")
        record(".storage_alignment", str(_ALIGNMENT).encode())
        if not disable_byteorder_record:
            record("byteorder", sys.byteorder.encode())
        for ref in storages:
            record(f"data/{ref.key}", ref.array.view(xp.uint8) if ref.array.size else b"")
        record("version", b"3\n")
        record(".data/serialization_id", "".join(
            str(secrets.randbelow(10)) for _ in range(40)).encode())
