"""Tensor: a backend array, its grad and the Node that made it. Operators delegate to ops."""
import weakref

from tapegrad import dtypes
from tapegrad.autograd import engine
from tapegrad.autograd.grad_mode import state as grad_state
from tapegrad.backend import xp, DEVICE
from tapegrad.ops import registry


class Tensor:
    """As ``torch.Tensor``: an n-dimensional array that records the ops applied to it."""

    __slots__ = ("_data", "_requires_grad", "grad", "grad_fn", "_version", "_hooks",
                 "__weakref__")
    __array_ufunc__ = None  # numpy defers to our reflected operators (array + tensor)
    __array_priority__ = 1000

    def __init__(self, data, dtype=None, requires_grad=False):
        self._data = _to_array(data, dtype)
        self.grad = None
        self.grad_fn = None
        self._version = [0]
        self._hooks = None
        self._requires_grad = False
        if requires_grad:
            self.requires_grad = True

    @staticmethod
    def _make(data, grad_fn=None):
        """Wrap a backend array without copying (the hot path's constructor)."""
        t = _new(Tensor)
        t._data = data
        t.grad = None
        t.grad_fn = grad_fn
        t._version = [0]
        t._hooks = None
        t._requires_grad = grad_fn is not None
        return t

    @classmethod
    def _wrap(cls, value):
        return value if isinstance(value, Tensor) else Tensor(value)

    # --- attributes -------------------------------------------------------------------
    @property
    def requires_grad(self) -> bool:
        return self._requires_grad

    @requires_grad.setter
    def requires_grad(self, value):
        value = bool(value)
        if not value and self.grad_fn is not None:
            raise RuntimeError(
                "you can only change requires_grad flags of leaf variables. If you want to use "
                "a computed variable in a subgraph that doesn't require differentiation use "
                "var_no_grad = var.detach().")
        if value and self._data.dtype.kind not in "fc":
            raise RuntimeError(
                "only Tensors of floating point and complex dtype can require gradients "
                f"(got {self.dtype})")
        self._requires_grad = value

    def requires_grad_(self, requires_grad=True):
        self.requires_grad = requires_grad
        return self

    @property
    def data(self):
        """As ``Tensor.data``: this tensor's storage, detached from the graph."""
        return self.detach()

    @data.setter
    def data(self, value):
        self._data = value._data if isinstance(value, Tensor) else _to_array(value, None)

    @property
    def shape(self) -> tuple:
        return self._data.shape

    def size(self, dim=None):
        if dim is None:
            return self._data.shape
        return self._data.shape[dim]

    def dim(self) -> int:
        return self._data.ndim

    @property
    def ndim(self) -> int:
        return self._data.ndim

    def numel(self) -> int:
        return self._data.size

    nelement = numel

    @property
    def dtype(self):
        return dtypes.from_numpy_dtype(self._data.dtype)

    @property
    def device(self):
        return DEVICE

    @property
    def is_leaf(self) -> bool:
        return self.grad_fn is None

    @property
    def is_floating_point(self):
        return lambda: self._data.dtype.kind == "f"

    def element_size(self) -> int:
        return self._data.itemsize

    def __len__(self):
        if self._data.ndim == 0:
            raise TypeError("len() of a 0-d tensor")
        return self._data.shape[0]

    def __repr__(self):
        body = xp.array2string(self._data, separator=", ", prefix="tensor(")
        extra = ""
        if self._data.dtype not in (dtypes.get_default_dtype().np, xp.int64, xp.bool_):
            extra += f", dtype={self.dtype}"
        if self.grad_fn is not None:
            extra += f", grad_fn=<{self.grad_fn.name()}>"
        elif self.requires_grad:
            extra += ", requires_grad=True"
        return f"tensor({body}{extra})"

    def __hash__(self):
        return id(self)

    def __bool__(self):
        if self._data.size != 1:
            raise RuntimeError(
                f"Boolean value of Tensor with more than one value is ambiguous (shape "
                f"{self.shape})")
        return bool(self._data)

    def __float__(self):
        return float(self.item())

    def __int__(self):
        return int(self.item())

    def __index__(self):
        if self._data.dtype.kind not in "iub" or self._data.size != 1:
            raise TypeError("only integer tensors of a single element can be converted to an index")
        return int(self._data)

    # --- conversion -------------------------------------------------------------------
    def numpy(self, force=False):
        """As ``Tensor.numpy()``: the array itself, sharing memory."""
        if self.requires_grad and not force:
            raise RuntimeError(
                "Can't call numpy() on Tensor that requires grad. Use tensor.detach().numpy() "
                "instead.")
        return self._data

    def __array__(self, dtype=None, copy=None):
        return self._data if dtype is None else self._data.astype(dtype)

    def tolist(self):
        return self._data.tolist()

    def item(self):
        if self._data.size != 1:
            raise RuntimeError(
                f"item: a Tensor with {self._data.size} elements cannot be converted to Scalar")
        return self._data.item()

    def detach(self):
        """As ``Tensor.detach()``: same storage and version counter, no graph."""
        t = Tensor._make(self._data)
        t._version = self._version
        return t

    def detach_(self):
        self.grad_fn = None
        self._requires_grad = False
        return self

    # --- autograd ---------------------------------------------------------------------
    def backward(self, gradient=None, retain_graph=None, create_graph=False, inputs=None):
        """As ``Tensor.backward``: accumulate d(self)/d(leaf) into every leaf's ``.grad``."""
        if gradient is None and inputs is None and not create_graph and self._requires_grad \
                and self._data.size == 1:  # the common case, without the general checks
            engine.run_backward([self], [xp.ones(self._data.shape, self._data.dtype)],
                                bool(retain_graph))
            return
        from tapegrad.autograd import backward

        backward([self], None if gradient is None else [gradient], retain_graph,
                 create_graph, inputs=inputs)

    def retain_grad(self):
        """As ``Tensor.retain_grad()``: keep ``.grad`` on this non-leaf after backward."""
        if not self.requires_grad:
            raise RuntimeError("can't retain_grad on Tensor that has requires_grad=False")
        if self.grad_fn is not None:
            self.grad_fn.retained = weakref.ref(self)

    @property
    def retains_grad(self) -> bool:
        return self.grad_fn is not None and self.grad_fn.retained is not None

    def register_hook(self, hook):
        """As ``Tensor.register_hook``: ``hook(grad)`` may return a replacement gradient."""
        if not self.requires_grad:
            raise RuntimeError(
                "cannot register a hook on a tensor that doesn't require gradient")
        if self.grad_fn is not None:
            return self.grad_fn.register_hook(hook)
        if self._hooks is None:
            self._hooks = []
        self._hooks.append(hook)
        return engine._Handle(self._hooks, hook)


def _to_array(data, dtype):
    """Build a backend array as ``torch.tensor`` would: Python floats take the default dtype."""
    if isinstance(data, Tensor):
        arr = data._data.copy()
    elif isinstance(data, xp.ndarray):
        arr = data.copy()
    elif isinstance(data, xp.generic):
        arr = xp.asarray(data)
    else:
        arr = xp.asarray(data)
        if arr.dtype == xp.float64 and not _has_numpy_floats(data):
            arr = arr.astype(dtypes.get_default_dtype().np)
        elif arr.dtype.kind == "i":
            arr = arr.astype(xp.int64)
        elif arr.dtype.kind not in "biuf":
            raise TypeError(f"tensor: cannot build a tensor from {type(data).__name__} "
                            f"(numpy made dtype {arr.dtype})")
    if dtype is not None:
        arr = arr.astype(dtypes.to_dtype(dtype).np, copy=False)
    dtypes.from_numpy_dtype(arr.dtype)  # raises for unsupported dtypes
    return arr


def _has_numpy_floats(data):
    if isinstance(data, xp.floating):
        return data.dtype == xp.float64
    if isinstance(data, (list, tuple)):
        return any(_has_numpy_floats(d) for d in data[:1])
    return False


_new = object.__new__
make = Tensor._make
registry.Tensor = engine.Tensor = Tensor
registry.make = make

# --- operators and methods: each delegates to an op --------------------------------------
from tapegrad.ops import elementwise as _E, reduce as _R, movement as _M, linalg as _L  # noqa: E402

def _method(fn):
    return fn  # plain functions and ops (Op.__get__) both bind as methods


for _module in (_E, _R, _M, _L):
    for _name in _module.TENSOR_METHODS:
        setattr(Tensor, _name, _method(getattr(_module, _name)))


def _binary(fn, reflected=False):
    if reflected:
        return lambda self, other: fn(other, self)
    return fn  # an op binds as a method (Op.__get__)


Tensor.__add__ = _binary(_E.add)
Tensor.__radd__ = _binary(_E.add, True)
Tensor.__sub__ = _binary(_E.sub)
Tensor.__rsub__ = _binary(_E.sub, True)
Tensor.__mul__ = _binary(_E.mul)
Tensor.__rmul__ = _binary(_E.mul, True)
Tensor.__truediv__ = _binary(_E.div)
Tensor.__rtruediv__ = _binary(_E.div, True)
Tensor.__pow__ = _binary(_E.pow)
Tensor.__rpow__ = _binary(_E.pow, True)
Tensor.__matmul__ = _binary(_L.matmul)
Tensor.__rmatmul__ = _binary(_L.matmul, True)
Tensor.__eq__ = _binary(_E.eq)
Tensor.__ne__ = _binary(_E.ne)
Tensor.__lt__ = _binary(_E.lt)
Tensor.__le__ = _binary(_E.le)
Tensor.__gt__ = _binary(_E.gt)
Tensor.__ge__ = _binary(_E.ge)
Tensor.__neg__ = _method(_E.neg)
Tensor.add = _E.add_alpha
Tensor.sub = _E.sub_alpha
Tensor.T = property(lambda self: _M.permute_op(self, dims=tuple(range(self.ndim))[::-1]))
Tensor.mT = property(lambda self: _M.transpose(self, -2, -1))
