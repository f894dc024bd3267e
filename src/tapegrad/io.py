"""``save``/``load`` of state dicts and checkpoints, and safetensors files.

**The tapegrad checkpoint format** (``tapegrad.save``): an uncompressed ZIP archive with

- ``tapegrad/format``: the text ``tapegrad-checkpoint 1``;
- ``tapegrad/object.json``: the saved object as JSON, every value tagged with its type
  (``{"$dict": [[key, value], ...]}`` keeps key types and order, ``{"$tuple": [...]}``,
  ``{"$float": "inf"}``, ``{"$tensor": 3, "dtype": "float32", "requires_grad": false,
  "parameter": false}``, ``{"$ndarray": 4, ...}``, ``{"$dtype": "float64"}``, ...);
- ``tapegrad/arrays/<n>.npy``: each tensor's data in numpy's ``.npy`` format (dtypes numpy
  cannot describe, such as bfloat16, are stored as same-width unsigned ints and viewed back).

Loading reads JSON and ``.npy`` with ``allow_pickle=False``: it builds only the types
listed above and never runs code from the file. ZIP's CRC-32 of every member is checked,
so a corrupt or truncated file raises ``RuntimeError`` naming the path. A tensor saved twice
in one object (shared) is stored once and loaded as one tensor.

Writes to a path are atomic: the data goes to a temporary file in the same directory,
is flushed and fsync'ed, then ``os.replace``-d over the target (and the directory fsync'ed),
so a crash mid-write leaves the previous file intact.
"""
import base64
import collections
import io as _io
import json
import os
import tempfile
import zipfile

from tapegrad import dtypes
from tapegrad.backend import xp
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


def atomic_write(path, write):
    """Run ``write(file)`` into a temporary file beside ``path``, then swap it in atomically."""
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp",
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

            idx = self.tensors[id(obj)] = self.array(obj._data)
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


def save(obj, f) -> None:
    """As ``torch.save(obj, f)``: write a state dict or checkpoint to a path or binary file.

    ``obj`` may nest dicts, lists and tuples of tensors, numpy arrays, numbers, strings,
    bytes and None (model/optimizer/scheduler state dicts, RNG states). Writes to a path are
    atomic. See the module docstring for the format.

    >>> tapegrad.save({"model": model.state_dict(), "opt": opt.state_dict()}, "ckpt.tg")
    """
    enc = _Encoder()
    tree = enc.encode(obj)  # errors surface here, before any file is touched
    arrays = enc.arrays
    if isinstance(f, (str, os.PathLike)):
        atomic_write(f, lambda fh: _write_checkpoint(tree, arrays, fh))
    else:
        _write_checkpoint(tree, arrays, f)


# --- decoding ----------------------------------------------------------------------------------
class _CorruptCheckpoint(Exception):
    pass


class _Decoder:
    def __init__(self, z):
        self.z = z
        self.tensors = {}

    def array(self, i, dtype_name):
        try:
            raw = self.z.read(f"{_ARRAYS}{int(i)}.npy")
        except KeyError:
            raise _CorruptCheckpoint(f"array {i} is missing") from None
        arr = xp.load(_io.BytesIO(raw), allow_pickle=False)
        if dtype_name is not None:
            want = dtypes.to_dtype(dtype_name).np
            if arr.dtype != want:
                if arr.dtype.itemsize != want.itemsize:
                    raise _CorruptCheckpoint(f"array {i} has dtype {arr.dtype}, expected "
                                             f"{dtype_name}")
                arr = arr.view(want)
        return arr

    def decode(self, node):
        if node is None or isinstance(node, (bool, int, float, str)):
            return node
        if isinstance(node, list):
            return [self.decode(v) for v in node]
        if not isinstance(node, dict) or len(node) == 0:
            raise _CorruptCheckpoint(f"unexpected JSON value {node!r:.80}")
        if "$tensor" in node:
            idx = node["$tensor"]
            t = Tensor._make(self.array(idx, node["dtype"]))
            if node.get("parameter"):
                from tapegrad.nn.parameter import Parameter

                t = Parameter(t, requires_grad=bool(node.get("requires_grad")))
            elif node.get("requires_grad"):
                t.requires_grad = True
            self.tensors[idx] = t
            return t
        if "$ref" in node:
            if node["$ref"] not in self.tensors:
                raise _CorruptCheckpoint(f"reference to unknown tensor {node['$ref']}")
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
        if tag == "$float":
            return float(value)
        if tag == "$complex":
            return complex(self.decode(value[0]), self.decode(value[1]))
        if tag == "$bytes":
            return base64.b64decode(value)
        if tag == "$dtype":
            return dtypes.to_dtype(value)
        raise _CorruptCheckpoint(f"unknown tag {tag!r}")


def _hashable(key):
    return tuple(_hashable(k) for k in key) if isinstance(key, list) else key


def load(f, map_location=None, weights_only=True, **kwargs):
    """As ``torch.load(f)``: read what ``tapegrad.save`` wrote (a path or binary file).

    Only the format's data types are rebuilt and no code from the file runs, so loading an
    untrusted file is safe (``weights_only`` is always on). A corrupt, truncated or foreign
    file raises ``RuntimeError`` naming it; ``map_location`` may only name the CPU.
    """
    if map_location not in (None, "cpu") and str(map_location) != "cpu":
        raise RuntimeError(f"tapegrad.load: map_location={map_location!r}; tapegrad runs on "
                           "the CPU only")
    if isinstance(f, (str, os.PathLike)):
        with open(f, "rb") as fh:  # a missing or unreadable file raises its own OSError
            return _load(fh, os.fspath(f))
    return _load(f, getattr(f, "name", repr(f)))


def _load(f, name):
    try:
        with zipfile.ZipFile(f, "r") as z:
            names = set(z.namelist())
            if _FORMAT not in names:
                hint = " (it looks like a PyTorch file: load it with torch and convert, or use " \
                       "safetensors)" if any(n.endswith("data.pkl") for n in names) else ""
                raise _CorruptCheckpoint("not a tapegrad checkpoint" + hint)
            if z.read(_FORMAT) != _MAGIC:
                raise _CorruptCheckpoint(f"unknown format {z.read(_FORMAT)[:40]!r}")
            tree = json.loads(z.read(_OBJECT))
            return _Decoder(z).decode(tree)
    except (_CorruptCheckpoint, zipfile.BadZipFile, zipfile.LargeZipFile, KeyError, ValueError,
            TypeError, EOFError, OSError) as e:
        raise RuntimeError(f"tapegrad.load: {name} is not a valid tapegrad checkpoint or is "
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
        arrays[k] = _contiguous(v._data)
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
