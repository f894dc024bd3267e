"""dtypes and PyTorch's type promotion: the one place that decides result dtypes."""
from tapegrad.backend import xp

try:  # bfloat16 has no numpy dtype of its own; ml_dtypes provides one (optional extra)
    import ml_dtypes as _ml_dtypes
except ImportError:  # pragma: no cover - exercised only without the extra
    _ml_dtypes = None

BOOL, INT, FLOAT = 0, 1, 2  # promotion categories, lowest to highest


class dtype:
    """A tensor element type, printed as in PyTorch (``tapegrad.float32``)."""

    __slots__ = ("name", "np", "category", "itemsize", "is_floating_point", "is_signed")

    def __init__(self, name, np_dtype, category):
        self.name = name
        self.np = xp.dtype(np_dtype)
        self.category = category
        self.itemsize = self.np.itemsize
        self.is_floating_point = category == FLOAT
        self.is_signed = name not in ("bool", "uint8")

    def __repr__(self):
        return f"tapegrad.{self.name}"

    def __reduce__(self):
        return (_by_name, (self.name,))


bool_ = dtype("bool", xp.bool_, BOOL)
uint8 = dtype("uint8", xp.uint8, INT)
int8 = dtype("int8", xp.int8, INT)
int16 = dtype("int16", xp.int16, INT)
int32 = dtype("int32", xp.int32, INT)
int64 = dtype("int64", xp.int64, INT)
float16 = dtype("float16", xp.float16, FLOAT)
float32 = dtype("float32", xp.float32, FLOAT)
float64 = dtype("float64", xp.float64, FLOAT)
bfloat16 = dtype("bfloat16", _ml_dtypes.bfloat16, FLOAT) if _ml_dtypes else None

ALL = [d for d in (bool_, uint8, int8, int16, int32, int64, float16, bfloat16, float32, float64) if d]
_FROM_NP = {d.np: d for d in ALL}
# numpy dtypes of floating-point tensors (ml_dtypes' bfloat16 has numpy kind "V", not "f")
FLOAT_NP = frozenset(d.np for d in ALL if d.category == FLOAT)


def is_floating(d) -> bool:
    """Whether ``d``, a tapegrad dtype or a backend (numpy) dtype, is floating point: the one
    floating test (bfloat16 included, which ``np.dtype.kind == "f"`` misses). The per-op hot
    paths (dispatch, the in-place fast paths, vmap and jvp per op) read ``FLOAT_NP`` itself."""
    return d.category == FLOAT if type(d) is dtype else d in FLOAT_NP


_NAMES = {d.name: d for d in ALL}
_NAMES.update({"bool": bool_, "half": float16, "float": float32, "double": float64,
               "long": int64, "int": int32, "short": int16})


def _by_name(name):
    return _NAMES[name]


_default = [float32]


def get_default_dtype() -> dtype:
    """As ``torch.get_default_dtype()``: the dtype of Python floats (float32 unless set)."""
    return _default[0]


def set_default_dtype(d: dtype) -> None:
    """As ``torch.set_default_dtype(torch.float64)``."""
    d = to_dtype(d)
    if d not in (float16, float32, float64, bfloat16):
        raise TypeError(f"set_default_dtype: only floating-point types are supported, got {d}")
    _default[0] = d


def to_dtype(d) -> dtype:
    """Normalise a tapegrad dtype, numpy dtype, Python type or name to a tapegrad dtype."""
    if isinstance(d, dtype):
        return d
    if d is float:
        return _default[0]
    if d is int:
        return int64
    if d is bool:
        return bool_
    if isinstance(d, str) and d in _NAMES:
        return _NAMES[d]
    try:
        return _FROM_NP[xp.dtype(d)]
    except (TypeError, KeyError):
        raise TypeError(f"dtype: {d!r} is not a dtype tapegrad supports") from None


def from_numpy_dtype(np_dtype) -> dtype:
    try:
        return _FROM_NP[np_dtype]
    except KeyError:
        raise TypeError(f"dtype: numpy dtype {np_dtype} is not supported by tapegrad") from None


def promote_types(a: dtype, b: dtype) -> dtype:
    """As ``torch.promote_types``: the higher category wins; within one, the wider type."""
    if a is b:
        return a
    if a.category != b.category:
        return a if a.category > b.category else b
    if a.category == FLOAT and {a, b} == {float16, bfloat16}:
        return float32
    if bfloat16 is not None and bfloat16 in (a, b):
        return a if b is bfloat16 else b  # the other one is float32/float64
    return _FROM_NP[xp.promote_types(a.np, b.np)]


def scalar_dtype(value) -> dtype:
    """The dtype PyTorch gives a Python scalar standing alone."""
    if isinstance(value, bool):
        return bool_
    if isinstance(value, int):
        return int64
    if isinstance(value, float):
        return _default[0]
    raise TypeError(f"expected a Python number, got {type(value).__name__}")


def _combine(higher, lower):
    # torch's combine_categories: a lower-priority operand only matters if it is of a
    # higher category (e.g. an int tensor times a float scalar becomes float)
    if higher is None:
        return lower
    if lower is None or higher.category == FLOAT:
        return higher
    if higher is bool_ or lower.category == FLOAT:
        return promote_types(higher, lower)
    return higher


def result_type(*operands) -> dtype:
    """As ``torch.result_type``: tensors with dims outrank 0-dim tensors outrank Python scalars.

    Operands are Tensors (anything with ``_data``) or Python numbers.
    """
    dims = zeros = wrapped = None
    for o in operands:
        data = getattr(o, "_data", None)
        if data is None:
            d = scalar_dtype(o)
            wrapped = d if wrapped is None else promote_types(wrapped, d)
            continue
        d = _FROM_NP[data.dtype]
        if data.ndim:
            dims = d if dims is None else promote_types(dims, d)
        else:
            zeros = d if zeros is None else promote_types(zeros, d)
    return _combine(dims, _combine(zeros, wrapped))
