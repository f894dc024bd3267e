"""``tapegrad.device`` (PyTorch's ``torch.device``) and the one check of where tensors may live.

A device is only a name (``type``, ``index``); which types can hold tensors is decided in one
place, ``resolve``, from ``SUPPORTED``. A GPU backend adds ``"cuda"`` there (and to
``tapegrad.cuda.is_available``) instead of touching every factory.
"""

# PyTorch's device types, in the order its error message lists them
TYPES = ("cpu", "cuda", "ipu", "xpu", "mkldnn", "opengl", "opencl", "ideep", "hip", "ve", "fpga",
         "maia", "xla", "lazy", "vulkan", "mps", "meta", "hpu", "mtia", "privateuseone")
SUPPORTED = ("cpu",)  # the device types tapegrad can hold tensors on


class NoCudaError(AssertionError, RuntimeError):
    """Raised where PyTorch's CPU-only build raises ``AssertionError: Torch not compiled with
    CUDA enabled``; also a RuntimeError, which tapegrad's other device errors are."""


def no_cuda(name=None):
    prefix = f"{name}: " if name else ""
    return NoCudaError(f"{prefix}Torch not compiled with CUDA enabled (tapegrad runs on the cpu "
                       "only here: CUDA needs CuPy, the 'cuda' extra, and a visible device; see "
                       "docs/differences.md)")


class device:
    """As ``torch.device``: ``device("cpu")``, ``device("cuda", 0)``, ``device("cuda:1")``.

    Printed, compared and hashed as in PyTorch: ``device("cpu") == device("cpu")``, but a
    device never equals a string and ``device("cpu") != device("cpu", 0)``.

    >>> tapegrad.device("cuda:1").index
    1
    """

    __slots__ = ("_type", "_index")

    def __init__(self, type=None, index=None):
        if isinstance(type, device):
            if index is not None:
                raise TypeError("device(): a device object cannot be combined with an index")
            type, index = type.type, type.index
        elif type is None:
            raise TypeError("device() missing required argument 'type' (pos 1)")
        elif not isinstance(type, str):
            if isinstance(type, bool) or not hasattr(type, "__index__"):
                raise TypeError(f"device(): argument 'type' must be str, not "
                                f"{builtins_type(type).__name__}")
            raise RuntimeError("Cannot access accelerator device when none is available.")
        else:
            type, parsed = _parse(type)
            if parsed is not None:
                if index is not None:
                    raise RuntimeError("type (string) must not include an index because index "
                                       f"was passed explicitly: {type}:{parsed}")
                index = parsed
        if index is not None:
            if isinstance(index, bool) or not hasattr(index, "__index__"):
                raise TypeError(f"device(): argument 'index' must be int, not "
                                f"{builtins_type(index).__name__}")
            index = index.__index__()
            if index < 0:
                raise RuntimeError("Device index must not be negative")
        object.__setattr__(self, "_type", type)
        object.__setattr__(self, "_index", index)

    @property
    def type(self) -> str:
        return self._type

    @property
    def index(self):
        return self._index

    def __setattr__(self, name, value):
        raise AttributeError(f"attribute '{name}' of 'torch.device' objects is not writable")

    def __eq__(self, other):
        if not isinstance(other, device):
            return False
        return self._type == other._type and self._index == other._index

    def __ne__(self, other):
        return not self == other

    def __hash__(self):
        return hash((self._type, self._index))

    def __repr__(self):
        if self._index is None:
            return f"device(type='{self._type}')"
        return f"device(type='{self._type}', index={self._index})"

    def __str__(self):
        return self._type if self._index is None else f"{self._type}:{self._index}"

    def __reduce__(self):
        return (device, (self._type,) if self._index is None else (self._type, self._index))


builtins_type = type


def _parse(s):
    """``"cuda:1"`` -> ``("cuda", 1)``, ``"cpu"`` -> ``("cpu", None)``; PyTorch's errors."""
    if not s:
        raise RuntimeError("Device string must not be empty")
    name, sep, idx = s.partition(":")
    if name not in TYPES:
        raise RuntimeError(f"Expected one of {', '.join(TYPES)} device type at start of device "
                           f"string: {s}")
    if not sep:
        return name, None
    if not idx.isdigit() or (len(idx) > 1 and idx[0] == "0"):
        raise RuntimeError(f"Invalid device string: '{s}'")
    return name, int(idx)


CPU = device("cpu")


def resolve(dev, name):
    """The device a tensor made by ``name`` lives on (``None`` means the cpu).

    The one device check: ``"cpu"``, ``"cpu:0"`` and cpu device objects resolve to the cpu
    (as PyTorch, the cpu index is dropped); ``"cuda"`` raises as PyTorch's CPU-only build does;
    other device types raise a RuntimeError naming ``name``.
    """
    if dev is None or dev is CPU:
        return CPU
    if not isinstance(dev, device):
        try:
            dev = device(dev)
        except (TypeError, RuntimeError) as e:
            raise builtins_type(e)(f"{name}: {e}") from None
    if dev.type in SUPPORTED:
        return CPU if dev.type == "cpu" else dev
    if dev.type == "cuda":
        from tapegrad import backend
        if backend.cuda_backend() is None:
            raise no_cuda(name)
        raise RuntimeError(f"{name}: device={str(dev)!r} is not supported here; make the tensor "
                           "with a factory's device= or move it with .to('cuda') (see "
                           "docs/differences.md, Devices)")
    raise RuntimeError(f"{name}: device type '{dev.type}' is not supported (tapegrad runs on the "
                       f"cpu only for now; got device={str(dev)!r})")
