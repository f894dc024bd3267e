"""``save``/``load`` of state dicts, checkpoints and whole objects, and safetensors files.

``tapegrad.save`` writes PyTorch's own ``torch.save`` format (a zip of ``data.pkl`` plus one
record per storage; see ``tapegrad.serialization``), which ``torch.load`` reads, and
``tapegrad.load`` reads it (from PyTorch or tapegrad) with ``weights_only=True`` by default.
``tapegrad.load`` also reads the older **tapegrad checkpoint format** described here, which
``tapegrad.save`` wrote before: an uncompressed ZIP archive with

- ``tapegrad/format``: the text ``tapegrad-checkpoint 1``;
- ``tapegrad/object.json``: the saved object as JSON, every value tagged with its type
  (``{"$dict": [[key, value], ...]}`` keeps key types and order, ``{"$tuple": [...]}``,
  ``{"$float": "inf"}``, ``{"$tensor": 3, "dtype": "float32", "requires_grad": false,
  "parameter": false}``, ``{"$ndarray": 4, ...}``, ``{"$dtype": "float64"}``, ...);
- ``tapegrad/arrays/<n>.npy``: each tensor's data in numpy's ``.npy`` format (dtypes numpy
  cannot describe, such as bfloat16, are stored as same-width unsigned ints and viewed back).

Loading reads JSON and ``.npy`` without pickle: it builds only the types listed above and
never runs code from the file. A tensor saved twice in one object (shared) is stored once and
loaded as one tensor.

Loading distrusts the file (both formats): ZIP's CRC-32 of every member is checked; a
member's declared size must match what the file holds (stored members), a compressed member
may inflate at most ``_MAX_INFLATE_RATIO`` times and never past its declared size, and the
members together at most that many times the file's size; an ``.npy`` header must describe
exactly the bytes that follow it; an array's dtype must be one tapegrad has (or, for a plain
numpy array, numeric); nesting too deep for the decoder is refused; two members with one name,
encrypted members and members needing a newer zip version are refused. Every such failure
raises ``CheckpointError`` (a ``RuntimeError``) naming the file and what is wrong; objects
from the file appear in messages through ``_bounded_repr``. A non-seekable stream is read
into memory first.

Writes to a path are atomic: the data goes to a temporary file in the same directory,
is flushed and fsync'ed, then ``os.replace``-d over the target (and the directory fsync'ed),
so a crash mid-write leaves the previous file intact. The temporary file is removed when the
write fails (any exception, KeyboardInterrupt included); one left by a process that was
killed carries its pid and host in its name, and the next save to the same path removes it.
"""
import base64
import collections
import io as _io
import json
import os
import pickle
import socket
import tempfile
import warnings
import zipfile
import zlib

from tapegrad import dtypes
from tapegrad.backend import xp, to_host
from tapegrad.tensor import Tensor

__all__ = ["save", "load", "save_file", "load_file"]

_MAGIC = b"tapegrad-checkpoint 1"
_FORMAT, _OBJECT, _ARRAYS = "tapegrad/format", "tapegrad/object.json", "tapegrad/arrays/"


# --- atomic writes -----------------------------------------------------------------------------
def _file_mode(path):
    try:
        return os.stat(path).st_mode & 0o777
    except FileNotFoundError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


def _host_tag():
    return f"{zlib.crc32(socket.gethostname().encode()):08x}"


def _pid_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError):
        return True  # exists (owned by someone else) or cannot tell: keep its file
    return True


def _remove_stale_temporaries(directory, base):
    """Remove ``.<base>.<pid>.<host>.*.tmp`` files left by dead processes on this host."""
    prefix, host = f".{base}.", _host_tag()
    try:
        names = os.listdir(directory)
    except OSError:
        return
    for name in names:
        if not (name.startswith(prefix) and name.endswith(".tmp")):
            continue
        parts = name[len(prefix):].split(".")
        if len(parts) != 4 or not parts[0].isdigit() or parts[1] != host:
            continue  # another host's (or the old unnamed) temporary: not ours to judge
        pid = int(parts[0])
        if pid != os.getpid() and not _pid_alive(pid):
            try:
                os.unlink(os.path.join(directory, name))
            except OSError:
                pass


def atomic_write(path, write):
    """Run ``write(file)`` into a temporary file beside ``path``, then swap it in atomically."""
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    base = os.path.basename(path)
    _remove_stale_temporaries(directory, base)
    fd, tmp = tempfile.mkstemp(prefix=f".{base}.{os.getpid()}.{_host_tag()}.", suffix=".tmp",
                               dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, _file_mode(path))
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    try:  # make the rename itself durable
        dir_fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(dir_fd)
    except OSError:
        pass
    finally:
        os.close(dir_fd)


# --- encoding ----------------------------------------------------------------------------------
def _array_dtype_name(arr):
    try:
        return dtypes.from_numpy_dtype(arr.dtype).name
    except TypeError:
        if arr.dtype.kind in "biufc" and arr.dtype.isnative:
            return None  # a plain numpy dtype tapegrad has no name for (uint16, complex...)
        raise TypeError(f"tapegrad.save: cannot save an array of dtype {arr.dtype}") from None


class _Encoder:
    def __init__(self):
        self.arrays = []
        self.tensors = {}  # id -> array index: a tensor met twice is stored once
        self.keep = []  # the tensors themselves, so their ids stay unique while encoding

    def array(self, arr):
        self.arrays.append(arr)
        return len(self.arrays) - 1

    def encode(self, obj, where="obj"):
        if obj is None or isinstance(obj, (bool, str)) or type(obj) is int:
            return obj
        if type(obj) is float:
            if obj != obj or obj in (float("inf"), float("-inf")):
                return {"$float": repr(obj)}
            return obj
        if isinstance(obj, Tensor):
            idx = self.tensors.get(id(obj))
            if idx is not None:
                return {"$ref": idx}
            from tapegrad.nn.parameter import Parameter

            idx = self.tensors[id(obj)] = self.array(to_host(obj._data))  # saved from the host
            self.keep.append(obj)
            return {"$tensor": idx, "dtype": obj.dtype.name,
                    "requires_grad": bool(obj.requires_grad),
                    "parameter": isinstance(obj, Parameter)}
        if isinstance(obj, xp.ndarray):
            return {"$ndarray": self.array(obj), "dtype": _array_dtype_name(obj)}
        if isinstance(obj, xp.generic):
            arr = xp.asarray(obj)
            return {"$ndarray": self.array(arr), "dtype": _array_dtype_name(arr),
                    "scalar": True}
        if isinstance(obj, dtypes.dtype):
            return {"$dtype": obj.name}
        if isinstance(obj, complex):
            return {"$complex": [self.encode(obj.real), self.encode(obj.imag)]}
        if isinstance(obj, (bytes, bytearray)):
            return {"$bytes": base64.b64encode(bytes(obj)).decode("ascii")}
        if isinstance(obj, int):  # subclasses (IntEnum...) are saved as their value
            return int(obj)
        if isinstance(obj, float):
            return self.encode(float(obj), where)
        if isinstance(obj, dict):
            tag = ("$counter" if isinstance(obj, collections.Counter) else
                   "$odict" if isinstance(obj, collections.OrderedDict) else "$dict")
            items = [[self.encode(k, f"{where} key {k!r}"), self.encode(v, f"{where}[{k!r}]")]
                     for k, v in obj.items()]
            return {tag: items}
        if isinstance(obj, tuple) and not hasattr(obj, "_fields"):
            return {"$tuple": [self.encode(v, f"{where}[{i}]") for i, v in enumerate(obj)]}
        if isinstance(obj, list):
            return [self.encode(v, f"{where}[{i}]") for i, v in enumerate(obj)]
        raise TypeError(
            f"tapegrad.save: cannot save {type(obj).__module__}.{type(obj).__qualname__} at "
            f"{where}; supported are tensors, numpy arrays, numbers, strings, bytes, None, "
            "dtypes and dicts/lists/tuples of them")


def _contiguous(arr):
    return arr if arr.flags.c_contiguous else arr.copy(order="C")  # keeps 0-d arrays 0-d


def _npy_bytes(arr):
    if arr.dtype.kind == "V" or not arr.dtype.isnative or arr.dtype.type.__module__ != "numpy":
        arr = arr.view(xp.dtype(f"u{arr.dtype.itemsize}"))  # e.g. bfloat16 as uint16
    buf = _io.BytesIO()
    xp.save(buf, _contiguous(arr), allow_pickle=False)
    return buf.getvalue()


def _write_checkpoint(tree, arrays, f):
    with zipfile.ZipFile(f, "w", compression=zipfile.ZIP_STORED) as z:
        z.writestr(_FORMAT, _MAGIC)
        z.writestr(_OBJECT, json.dumps(tree, allow_nan=False))
        for i, arr in enumerate(arrays):
            _write_array(z, i, arr)


def _write_array(z, i, arr):
    z.writestr(f"{_ARRAYS}{i}.npy", _npy_bytes(arr))


def save(obj, f, pickle_module=None, pickle_protocol=2, _use_new_zipfile_serialization=True,
         _disable_byteorder_record=False) -> None:
    """As ``torch.save(obj, f)``: write ``obj`` in PyTorch's zip format to a path or binary file.

    State dicts, checkpoints (nested dicts/lists/tuples of tensors, numbers, strings) and whole
    objects (modules, optimizers) are pickled as PyTorch does, tensors as storages; a state dict
    written here loads in PyTorch with ``torch.load(f, weights_only=True)``. Writes to a path
    are atomic. See ``tapegrad.serialization`` for the format.

    >>> tapegrad.save({"model": model.state_dict(), "opt": opt.state_dict()}, "ckpt.pt")
    """
    from tapegrad import serialization

    if not _use_new_zipfile_serialization:
        raise RuntimeError("tapegrad.save: _use_new_zipfile_serialization=False (PyTorch's "
                           "legacy pre-1.6 format) is not supported; tapegrad writes the zip "
                           "format")
    if pickle_module is not None and pickle_module is not pickle:
        raise RuntimeError(f"tapegrad.save: pickle_module={pickle_module!r} is not supported; "
                           "tapegrad pickles with its own restricted-format pickler")
    data = serialization._pickle(obj, pickle_protocol)  # errors surface before any file I/O
    write = lambda fh: serialization._write_zip(fh, data, _disable_byteorder_record)  # noqa
    if isinstance(f, (str, os.PathLike)):
        atomic_write(f, write)
    else:
        write(f)


def _save_legacy(obj, f) -> None:
    """Write ``obj`` in tapegrad's older JSON + ``.npy`` format (see the module docstring);
    ``load`` still reads it. Supports dicts/lists/tuples of tensors, numpy arrays, numbers,
    strings, bytes, None and dtypes."""
    enc = _Encoder()
    tree = enc.encode(obj)  # errors surface here, before any file is touched
    arrays = enc.arrays
    if isinstance(f, (str, os.PathLike)):
        atomic_write(f, lambda fh: _write_checkpoint(tree, arrays, fh))
    else:
        _write_checkpoint(tree, arrays, f)


# --- decoding ----------------------------------------------------------------------------------
class CheckpointError(RuntimeError):
    """A file ``load`` cannot read: not a checkpoint, truncated, corrupt or malformed. The
    message names the file and what is wrong."""


class _CorruptCheckpoint(Exception):
    pass


def _bounded_repr(obj, limit=80):
    """``repr(obj)`` cut to about ``limit`` characters, built piece by piece so that the full
    repr is never formed: a few hundred bytes of pickle can make a list that holds the list
    below it twice per level, whose full repr is exponential in its depth. Objects other than
    builtin scalars and containers show as their type (their own repr may be anything)."""
    out, length = [], 0
    for piece in _repr_pieces(obj, _REPR_DEPTH, limit):
        out.append(piece)
        length += len(piece)
        if length > limit:
            return "".join(out)[:limit] + "..."
    return "".join(out)


_REPR_DEPTH = 4
_BRACKETS = {list: "[]", tuple: "()", set: "{}", frozenset: "{}", dict: "{}"}


def _repr_pieces(obj, depth, limit):
    # only the builtin types' own methods run (never a subclass's override), so formatting
    # an error runs no code that the file chose
    kind = type(obj)
    if obj is None or kind in (bool, float, complex):
        yield repr(obj)
    elif issubclass(kind, int):  # a huge int's decimal form is slow (and limited) to build
        bits = int.bit_length(obj)
        yield int.__repr__(obj) if bits <= 256 else f"<int of {bits} bits>"
    elif issubclass(kind, (str, bytes, bytearray)):
        base = next(t for t in (str, bytes, bytearray) if issubclass(kind, t))
        yield base.__repr__(base.__getitem__(obj, slice(0, limit)))
        if base.__len__(obj) > limit:
            yield "..."
    elif issubclass(kind, type):
        yield f"<class '{type.__getattribute__(obj, '__module__')}." \
              f"{type.__getattribute__(obj, '__qualname__')}'>"
    elif issubclass(kind, tuple(_BRACKETS)):
        base = next(t for t in _BRACKETS if issubclass(kind, t))
        if kind is not base:
            yield kind.__name__ + "("
        yield _BRACKETS[base][0]
        size = base.__len__(obj)
        if size and depth == 0:
            yield "..."
        elif size:
            for i, item in enumerate(dict.items(obj) if base is dict else base.__iter__(obj)):
                if i:
                    yield ", "
                if base is dict:
                    yield from _repr_pieces(item[0], depth - 1, limit)
                    yield ": "
                    item = item[1]
                yield from _repr_pieces(item, depth - 1, limit)
        if base is tuple and size == 1:
            yield ","
        yield _BRACKETS[base][1]
        if kind is not base:
            yield ")"
    elif kind.__module__.startswith("tapegrad."):  # our own reprs are short
        yield repr(obj)[:limit]
    else:
        yield f"<{kind.__module__}.{kind.__qualname__} object>"


_MAX_INFLATE_RATIO = 100  # tensor data barely compresses; a member inflating more is a bomb
_NPY_MAX_HEADER = 10000


class _Archive:
    """A zip archive opened for loading, whose members are checked before they are read."""

    def __init__(self, f):
        start = f.tell()
        length = f.seek(0, os.SEEK_END) - start
        f.seek(start)
        try:
            self.z = zipfile.ZipFile(f, "r")
        except NotImplementedError as e:  # zipfile's own refusal of a newer zip version
            raise _CorruptCheckpoint(f"a member needs {e} to extract; this reader supports up "
                                     f"to {zipfile.MAX_EXTRACT_VERSION / 10:.1f}") from None
        self.infos = {}
        total = 0
        for info in self.z.infolist():
            name, size = info.filename, info.file_size
            if name in self.infos:  # zip readers disagree on which copy counts
                raise _CorruptCheckpoint(f"it holds two members named {name}; refused as "
                                         "ambiguous")
            if info.flag_bits & 0x1:
                raise _CorruptCheckpoint(f"member {name} is encrypted; checkpoints are not")
            if info.compress_type == zipfile.ZIP_STORED:
                if info.compress_size != size:
                    raise _CorruptCheckpoint(f"member {name} declares {size} bytes but stores "
                                             f"{info.compress_size}")
            elif info.compress_type == zipfile.ZIP_DEFLATED:
                if size > _MAX_INFLATE_RATIO * max(info.compress_size, 1):
                    raise _CorruptCheckpoint(
                        f"member {name} would inflate {info.compress_size} bytes to {size} "
                        f"(more than {_MAX_INFLATE_RATIO}x): refused as a zip bomb")
            else:
                raise _CorruptCheckpoint(f"member {name} uses zip compression method "
                                         f"{info.compress_type}; only stored and deflated "
                                         "members are read")
            if info.header_offset + info.compress_size > length:
                raise _CorruptCheckpoint(f"member {name} extends past the end of the file "
                                         f"({length} bytes): truncated")
            total += size
            self.infos[name] = info
        if total > _MAX_INFLATE_RATIO * max(length, 1):
            raise _CorruptCheckpoint(f"its members declare {total} bytes, more than "
                                     f"{_MAX_INFLATE_RATIO}x the file's {length}")

    def names(self):
        return list(self.infos)

    def read(self, name):
        info = self.infos.get(name)
        if info is None:
            raise _CorruptCheckpoint(f"member {name} is missing")
        try:
            with self.z.open(info) as member:  # inflates at most file_size bytes; checks CRC-32
                data = member.read()
        except zlib.error as e:
            raise _CorruptCheckpoint(f"member {name} is corrupt: its deflate data does not "
                                     f"inflate ({e})") from None
        if len(data) != info.file_size:
            raise _CorruptCheckpoint(f"member {name} holds {len(data)} bytes, its header "
                                     f"declares {info.file_size}")
        return data


def _npy_array(raw, what):
    """An ``.npy`` file's array, its header checked against the bytes that follow it."""
    f = _io.BytesIO(raw)
    try:
        version = xp.lib.format.read_magic(f)
        read_header = (xp.lib.format.read_array_header_1_0 if version == (1, 0) else
                       xp.lib.format.read_array_header_2_0)
        shape, fortran, dtype = read_header(f, max_header_size=_NPY_MAX_HEADER)
    except (ValueError, TypeError, SyntaxError) as e:
        raise _CorruptCheckpoint(f"{what} has a malformed .npy header: {e}") from None
    if dtype.hasobject:
        raise _CorruptCheckpoint(f"{what} holds Python objects (dtype {dtype}); refused")
    count = 1
    for n in shape:
        count *= n
    offset = f.tell()
    if count * dtype.itemsize != len(raw) - offset:
        raise _CorruptCheckpoint(f"{what}: its .npy header declares shape {tuple(shape)} of "
                                 f"{dtype} ({count * dtype.itemsize} bytes) but "
                                 f"{len(raw) - offset} bytes follow")
    flat = xp.frombuffer(bytearray(memoryview(raw)[offset:]), dtype=dtype)
    return flat.reshape(shape, order="F" if fortran else "C")


class _Decoder:
    def __init__(self, z):
        self.z = z
        self.tensors = {}

    def array(self, i, dtype_name, tensor=False):
        """Array ``i``, of the tapegrad dtype named ``dtype_name``; or for a plain numpy array
        (``dtype_name`` None), of a numeric dtype, the only kind ``save`` writes."""
        if type(i) is not int:
            raise _CorruptCheckpoint(f"array index {_bounded_repr(i)} is not an int")
        raw = self.z.read(f"{_ARRAYS}{i}.npy")
        arr = _npy_array(raw, f"array {i}")
        if dtype_name is None and not tensor:
            if arr.dtype.kind not in "biufc" or not arr.dtype.isnative:
                raise _CorruptCheckpoint(f"array {i} has numpy dtype {arr.dtype}, which tapegrad "
                                         "does not load (only bool and native integer, float "
                                         "and complex arrays)")
            return arr
        want = _dtype(dtype_name, f"array {i}").np
        # dtypes numpy cannot describe (bfloat16) are stored as same-width unsigned ints
        stored_as = want if want.type.__module__ == "numpy" and want.kind != "V" else \
            xp.dtype(f"u{want.itemsize}")
        if arr.dtype not in (want, stored_as):
            raise _CorruptCheckpoint(f"array {i} holds numpy dtype {arr.dtype}, but the object "
                                     f"says {dtype_name}")
        return arr.view(want)

    def decode(self, node):
        if node is None or isinstance(node, (bool, int, float, str)):
            return node
        if isinstance(node, list):
            return [self.decode(v) for v in node]
        if not isinstance(node, dict) or len(node) == 0:
            raise _CorruptCheckpoint(f"unexpected JSON value {_bounded_repr(node)}")
        if "$tensor" in node:
            idx = node["$tensor"]
            t = Tensor._make(self.array(idx, node.get("dtype"), tensor=True))
            if node.get("parameter"):
                from tapegrad.nn.parameter import Parameter

                t = Parameter(t, requires_grad=bool(node.get("requires_grad")))
            elif node.get("requires_grad"):
                t.requires_grad = True
            self.tensors[idx] = t
            return t
        if "$ref" in node:
            if type(node["$ref"]) is not int or node["$ref"] not in self.tensors:
                raise _CorruptCheckpoint(f"reference to unknown tensor "
                                         f"{_bounded_repr(node['$ref'])}")
            return self.tensors[node["$ref"]]
        if "$ndarray" in node:
            arr = self.array(node["$ndarray"], node.get("dtype"))
            return arr[()] if node.get("scalar") else arr
        tag, value = next(iter(node.items()))
        if tag in ("$dict", "$odict", "$counter"):
            items = [(_hashable(self.decode(k)), self.decode(v)) for k, v in value]
            if tag == "$counter":
                return collections.Counter(dict(items))
            return collections.OrderedDict(items) if tag == "$odict" else dict(items)
        if tag == "$tuple":
            return tuple(self.decode(v) for v in value)
        if tag == "$float":  # only the values JSON cannot write
            if value not in ("nan", "inf", "-inf"):
                raise _CorruptCheckpoint(f"$float of {_bounded_repr(value)}, not nan or inf")
            return float(value)
        if tag == "$complex":
            return complex(self.decode(value[0]), self.decode(value[1]))
        if tag == "$bytes":
            return base64.b64decode(value)
        if tag == "$dtype":
            return _dtype(value, "a dtype entry")
        raise _CorruptCheckpoint(f"unknown tag {_bounded_repr(tag)}")


def _dtype(name, what):
    """The tapegrad dtype a file names, refused with its name when tapegrad has none."""
    if type(name) is not str or name not in dtypes._NAMES:
        supported = ", ".join(d.name for d in dtypes.ALL)
        raise _CorruptCheckpoint(f"{what} has dtype {_bounded_repr(name)}, which tapegrad does "
                                 f"not support (supported: {supported})")
    return dtypes._NAMES[name]


def _hashable(key):
    return tuple(_hashable(k) for k in key) if isinstance(key, list) else key


def load(f, map_location=None, pickle_module=None, *, weights_only=None, mmap=None,
         **pickle_load_args):
    """As ``torch.load(f, map_location=None, *, weights_only=True)``: read a path or binary
    file written by ``tapegrad.save`` or ``torch.save`` (or tapegrad's older format).

    With ``weights_only=True`` (the default, as in PyTorch 2.6+) a restricted unpickler
    rebuilds only tensors, containers, numbers, strings, dtypes and the globals added with
    ``tapegrad.serialization.add_safe_globals``; it never runs code from the file and refuses
    anything else with ``pickle.UnpicklingError``. ``weights_only=False`` unpickles whole
    objects (modules, optimizers) as PyTorch does: only for files you trust. A truncated,
    corrupt or malformed file raises ``CheckpointError`` (a ``RuntimeError``) naming it.
    ``map_location`` (a device, string, dict or callable) must lead to the CPU. A path ending
    in ``.safetensors`` is read with ``load_file``, as in PyTorch.

    >>> state = tapegrad.load("ckpt.pt")
    """
    from tapegrad import serialization

    weights_only_not_set = weights_only is None
    if weights_only is None:
        weights_only = pickle_module is None
    # PyTorch's environment overrides, with its precedence and warning
    truthy = ("1", "y", "yes", "true")
    force = os.getenv("TORCH_FORCE_WEIGHTS_ONLY_LOAD", "0").lower() in truthy
    force_no = os.getenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "0").lower() in truthy
    if force and force_no:
        raise RuntimeError("Only one of `TORCH_FORCE_WEIGHTS_ONLY_LOAD` or "
                           "`TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD` should be set, but both were set.")
    if force:
        weights_only = True
    elif force_no and weights_only_not_set:
        warnings.warn("Environment variable TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD detected, since the"
                      "`weights_only` argument was not explicitly passed to `torch.load`, forcing "
                      "weights_only=False.", UserWarning, stacklevel=2)
        weights_only = False
    if weights_only and pickle_module is not None:
        raise RuntimeError("Can not safely load weights when explicit pickle_module is specified")
    if mmap:
        raise RuntimeError("tapegrad.load: mmap=True is not supported; the file is read into "
                           "memory")
    if weights_only and pickle_load_args:
        warnings.warn("pickle_load_args only works if `weights_only=False`.")
    pickle_load_args.setdefault("encoding", "utf-8")
    if isinstance(f, (str, os.PathLike)) and os.fspath(f).endswith(".safetensors"):
        serialization._check_map_location(map_location)
        return load_file(f)
    if isinstance(f, (str, os.PathLike)):
        with open(f, "rb") as fh:  # a missing or unreadable file raises its own OSError
            return _load(fh, os.fspath(f), map_location, weights_only, pickle_module,
                         pickle_load_args)
    return _load(f, getattr(f, "name", repr(f)), map_location, weights_only, pickle_module,
                 pickle_load_args)


_TORCH_LEGACY_MAGIC = b"\x80\x02\x8a\x0al\xfc\x9cF\xf9 j\xa8P\x19"


def _seekable(f):
    try:
        return f.seekable() and f.tell() >= 0
    except (AttributeError, OSError):
        return False


def _load(f, name, map_location, weights_only, pickle_module, pickle_load_args):
    from tapegrad import serialization

    if not _seekable(f):  # a zip is read from its end: buffer a pipe or socket first
        f = _io.BytesIO(f.read())
    try:
        start = f.tell()
        head = f.read(len(_TORCH_LEGACY_MAGIC))
        f.seek(start)
        if head == _TORCH_LEGACY_MAGIC:
            raise _CorruptCheckpoint("it is in PyTorch's legacy (pre-1.6) format, which tapegrad "
                                     "does not read: re-save it with a current torch.save")
        if not head.startswith(b"PK\x03\x04"):
            raise _CorruptCheckpoint("it is not a zip archive (no zip header at its start)")
        archive = _Archive(f)
        if _FORMAT not in archive.infos:
            return serialization._load_zip(archive, name, map_location, weights_only,
                                           pickle_module, pickle_load_args)
        serialization._check_map_location(map_location)
        if archive.read(_FORMAT) != _MAGIC:
            raise _CorruptCheckpoint(f"unknown format {archive.read(_FORMAT)[:40]!r}")
        tree = json.loads(archive.read(_OBJECT))
        return _Decoder(archive).decode(tree)
    except serialization._ObjectError as e:  # raised by the file's own objects (weights_only=False)
        raise e.error from None
    except RecursionError:
        raise CheckpointError(f"tapegrad.load: {name} is not a valid checkpoint or is corrupt: "
                              "its objects are nested too deeply") from None
    except (_CorruptCheckpoint, zipfile.BadZipFile, zipfile.LargeZipFile, KeyError, ValueError,
            TypeError, EOFError, OSError) as e:
        raise CheckpointError(f"tapegrad.load: {name} is not a valid checkpoint or is "
                              f"corrupt: {e}") from None


# --- safetensors -------------------------------------------------------------------------------
def _safetensors():
    try:
        import safetensors
        import safetensors.numpy
    except ImportError:
        raise ImportError("tapegrad: safetensors support needs the `safetensors` package "
                          "(pip install safetensors)") from None
    return safetensors


_ST_DTYPES = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16",
              "I64": "int64", "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8",
              "BOOL": "bool"}


def save_file(tensors: dict, filename, metadata=None) -> None:
    """As ``safetensors.torch.save_file(tensors, filename, metadata=None)``: a flat dict of
    named tensors to a ``.safetensors`` file (atomic), readable by PyTorch's safetensors.

    >>> tapegrad.io.save_file(model.state_dict(), "model.safetensors")
    """
    st = _safetensors()
    if not isinstance(tensors, dict):
        raise TypeError(f"save_file: expected a dict of str to Tensor, got "
                        f"{type(tensors).__name__}")
    arrays = {}
    for k, v in tensors.items():
        if not isinstance(k, str):
            raise TypeError(f"save_file: keys must be str, got {k!r}")
        if not isinstance(v, Tensor):
            raise TypeError(f"save_file: {k!r} is a {type(v).__name__}, expected a Tensor")
        arrays[k] = _contiguous(to_host(v._data))
    if metadata is not None and not all(isinstance(k, str) and isinstance(v, str)
                                        for k, v in metadata.items()):
        raise TypeError("save_file: metadata must map str to str")
    data = st.numpy.save(arrays, metadata=metadata)
    atomic_write(filename, lambda f: f.write(data))


def load_file(filename, device="cpu") -> dict:
    """As ``safetensors.torch.load_file(filename)``: a ``.safetensors`` file's tensors by name
    (including bfloat16, via ml_dtypes)."""
    st = _safetensors()
    name = os.fspath(filename)
    with open(name, "rb") as f:
        raw = f.read()
    try:
        entries = st.deserialize(raw)
    except Exception as e:  # safetensors raises its own SafetensorError
        raise RuntimeError(f"load_file: {name} is not a valid safetensors file: {e}") from None
    out = {}
    for key, info in entries:
        dt = _ST_DTYPES.get(info["dtype"])
        if dt is None or (dt == "bfloat16" and dtypes.bfloat16 is None):
            raise RuntimeError(f"load_file: {name}: tensor {key!r} has dtype {info['dtype']}, "
                               "which tapegrad does not support"
                               + (" (install ml_dtypes for bfloat16)" if dt else ""))
        arr = xp.frombuffer(info["data"], dtype=dtypes.to_dtype(dt).np).reshape(info["shape"])
        out[key] = Tensor._make(arr)
    return out
