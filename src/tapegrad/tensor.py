"""Tensor: a backend array, its grad and the Node that made it. Operators delegate to ops."""
import operator
import weakref

from tapegrad import dtypes
from tapegrad.autograd import engine
from tapegrad.autograd.grad_mode import state as grad_state
from tapegrad import backend as _backend
from tapegrad.backend import xp, DEVICE, device_of as _device_of, to_device as _to_device
from tapegrad.backend.device import device as _device, resolve as resolve_device, no_cuda
from tapegrad.ops import registry
from tapegrad.printing import _repr


def _generic_inplace(name):
    """``Tensor.<name>_``: the out-of-place ``tapegrad.<name>`` written into the tensor."""

    def method(self, *args, **kwargs):
        return _inplace(self, name + "_", _public(name), args, kwargs)

    method.__name__ = method.__qualname__ = name + "_"
    method.__doc__ = f"As ``Tensor.{name}_``: ``{name}`` in place."
    return method


def _cast_method(name, dtype_name):
    """``Tensor.<name>()`` (``float``, ``long``, ...): ``to(dtypes.<dtype_name>)``."""

    def method(self, memory_format=None):
        return self.to(getattr(dtypes, dtype_name))

    method.__name__ = method.__qualname__ = name
    method.__doc__ = f"As ``Tensor.{name}()``: ``to({dtype_name.rstrip('_')})``."
    return method


def _on_device(kind):
    """``Tensor.is_<kind>``: whether the tensor's array lives on a ``kind`` device."""
    return property(lambda self: self.device.type == kind,
                    doc=f"As ``Tensor.is_{kind}``: True on a {kind} device.")


class Tensor:
    """As ``torch.Tensor``: an n-dimensional array that records the ops applied to it."""

    __slots__ = ("_data", "_requires_grad", "_grad", "grad_fn", "_version", "_hooks",
                 "_view", "__weakref__")  # _view: set on views and bases only (view_of)
    __array_ufunc__ = None  # numpy defers to our reflected operators (array + tensor)
    __array_priority__ = 1000

    def __new__(cls, *args, **kwargs):
        """As PyTorch's legacy constructor ``torch.Tensor(...)``: ``Tensor(2, 3)`` (or
        ``Tensor(size=(2, 3))``) is uninitialised, ``Tensor([1, 2])`` copies data into the
        default float dtype, ``Tensor()`` is empty and ``Tensor(t)`` aliases tensor ``t``.
        ``tapegrad.tensor(data, dtype=...)`` is the constructor to use in new code."""
        if cls is not Tensor:  # a subclass without its own __new__: its __init__ sets it up
            return _new(cls)
        return _legacy_new(None, "cpu", args, kwargs, "Tensor")

    def __init__(self, *args, **kwargs):
        pass

    @staticmethod
    def _from_data(data, dtype=None, requires_grad=False):
        """A new leaf holding a copy of ``data`` (``tapegrad.tensor``'s semantics)."""
        t = Tensor._make(_to_array(data, dtype))
        if requires_grad:
            t.requires_grad = True
        return t

    @staticmethod
    def _make(data, grad_fn=None):
        """Wrap a backend array without copying (the hot path's constructor)."""
        t = _new(Tensor)
        t._data = data
        t._grad = None
        t.grad_fn = grad_fn
        t._version = [0]
        t._hooks = None
        t._requires_grad = grad_fn is not None
        return t

    # --- attributes -------------------------------------------------------------------
    @property
    def grad(self):
        """As ``Tensor.grad``: the accumulated gradient, or None."""
        return self._grad

    @grad.setter
    def grad(self, value):
        if value is not None:  # as PyTorch: a gradient has the tensor's shape and dtype
            if not isinstance(value, Tensor):
                raise TypeError("assigned grad expected to be a Tensor or None but got grad "
                                f"of type {type(value).__name__}")
            if value._data.shape != self._data.shape:
                raise RuntimeError(
                    f"attempting to assign a gradient of size '{list(value.shape)}' to a "
                    f"tensor of size '{list(self.shape)}'. Please ensure that the gradient "
                    "and the tensor are the same size")
            if value._data.dtype != self._data.dtype:
                raise RuntimeError(
                    f"attempting to assign a gradient with dtype '{value.dtype}' to a tensor "
                    f"with dtype '{self.dtype}'. The gradient must match the tensor's dtype")
        self._grad = value

    @grad.deleter
    def grad(self):
        self._grad = None

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
        if value and not dtypes.is_floating(self._data.dtype):
            raise RuntimeError(
                "only Tensors of floating point and complex dtype can require gradients "
                f"(got {self.dtype})")
        self._requires_grad = value

    def requires_grad_(self, requires_grad=True):
        self.requires_grad = requires_grad
        return self

    @property
    def data(self):
        """As ``Tensor.data``: this tensor's storage, detached from the graph, with its own
        version counter (in-place changes through ``.data`` are not tracked, as in PyTorch)."""
        return Tensor._make(self._data)

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
        """As ``Tensor.device``: a ``tapegrad.device``, read from the array's type (numpy: the
        cpu; a CuPy array: ``cuda:N``), so a tensor carries no device slot."""
        d = self._data
        return DEVICE if type(d) is xp.ndarray else _device_of(d)

    # PyTorch's is_<device type> flags, each read from the array's device (tapegrad's arrays
    # live on the cpu or cuda, so the others are False, as on a PyTorch build without them)
    is_cpu = _on_device("cpu")
    is_cuda = _on_device("cuda")
    is_meta = _on_device("meta")
    is_mps = _on_device("mps")
    is_xpu = _on_device("xpu")
    is_xla = _on_device("xla")
    is_ipu = _on_device("ipu")
    is_maia = _on_device("maia")
    is_mtia = _on_device("mtia")
    is_vulkan = _on_device("vulkan")

    # storage kinds tapegrad has no tensor of (a sparse COO tensor has its own is_sparse)
    is_mkldnn = is_quantized = is_nested = is_sparse_csr = property(
        lambda self: False, doc="False: tapegrad has no such tensors.")

    def get_device(self) -> int:
        """As ``Tensor.get_device()``: -1 for cpu tensors, else the device index."""
        return -1 if self.device.type == "cpu" else self.device.index

    @property
    def is_leaf(self) -> bool:
        return self.grad_fn is None

    def is_floating_point(self) -> bool:
        """As ``Tensor.is_floating_point()``."""
        return dtypes.is_floating(self._data.dtype)

    def is_contiguous(self, memory_format=None) -> bool:
        return self._data.flags.c_contiguous

    def _is_view(self) -> bool:
        return self._data.base is not None

    @property
    def layout(self):
        """As ``Tensor.layout``: ``tapegrad.strided`` (sparse tensors: ``sparse_coo``)."""
        return _sparse.strided

    @property
    def is_sparse(self) -> bool:
        """As ``Tensor.is_sparse``: False for dense tensors."""
        return False

    def to_sparse(self, sparse_dim=None, *, layout=None, blocksize=None, dense_dim=None):
        """As ``Tensor.to_sparse()``: the nonzero entries as a sparse_coo tensor."""
        return _sparse.to_sparse(self, sparse_dim, layout=layout, blocksize=blocksize,
                                 dense_dim=dense_dim)

    def to_dense(self, dtype=None, *, masked_grad=None):
        """As ``Tensor.to_dense()``: a dense tensor is returned as it is."""
        return self if dtype is None else self.to(dtype)

    def element_size(self) -> int:
        return self._data.itemsize

    def __len__(self):
        if self._data.ndim == 0:
            raise TypeError("len() of a 0-d tensor")
        return self._data.shape[0]

    def __repr__(self):
        return _repr(self)

    def __format__(self, format_spec):
        """As PyTorch: a 0-d tensor formats as its Python number (``f"{loss:.4f}"``); other
        tensors only with an empty spec (their ``str``)."""
        if self._data.ndim == 0:
            return self._data.item().__format__(format_spec)
        return object.__format__(self, format_spec)

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
        if type(self._data) is not xp.ndarray:
            refuse = getattr(self._data, "refuse_host_read", None)  # vmap's batched values
            if refuse is not None:
                refuse()
            if self.device.type != "cpu":
                raise TypeError(f"can't convert {self.device} device type tensor to numpy. "
                                "Use Tensor.cpu() to copy the tensor to host memory first.")
        return self._data

    def __array__(self, dtype=None, copy=None):
        if type(self._data) is not xp.ndarray:
            self.numpy(force=True)  # raises for device data and for vmap's batched values
        return self._data if dtype is None else self._data.astype(dtype)

    def tolist(self):
        return self._data.tolist()

    def item(self):
        if self._data.size != 1:
            raise RuntimeError(
                f"item: a Tensor with {self._data.size} elements cannot be converted to Scalar")
        return self._data.item()

    def __getstate__(self):
        # pickled and deep-copied tensors own their storage: drop the view bookkeeping
        state = object.__getstate__(self)
        slots = state[1] if type(state) is tuple else state
        if slots:
            slots.pop("_view", None)
        return state

    def detach(self):
        """As ``Tensor.detach()``: same storage and version counter, no graph."""
        t = Tensor._make(self._data)
        t._version = self._version
        return t

    def detach_(self):
        self.grad_fn = None
        self._requires_grad = False
        return self

    # --- conversion: dtype, device, copies ------------------------------------------------
    def to(self, *args, **kwargs):
        """As ``Tensor.to``: ``x.to(torch.float64)``, ``x.to('cpu')``, ``x.to(other)``,
        ``x.to(device=..., dtype=..., copy=True)``. A dtype change is differentiable."""
        dtype, copy, dev = _to_args(self, args, kwargs)
        out = self
        if dev is not None and dev != self.device:
            out = _move(out, dev)
            copy = False
        if dtype is not None and dtype.np != out._data.dtype:
            return _E.to_dtype(out, dtype=dtype)
        return _C.clone(out) if copy else out

    def type(self, dtype=None, non_blocking=False, **kwargs):
        """As ``Tensor.type()``: with no argument PyTorch's type name (``'torch.FloatTensor'``);
        given a dtype, a tensor type (``tapegrad.DoubleTensor``) or its name, ``to`` it."""
        if dtype is None:
            return ("torch.cuda." if self.is_cuda else "torch.") + _TYPE_NAMES[self.dtype.name]
        if isinstance(dtype, str):
            dtype = _type_from_name(dtype)
        if dtype is Tensor:
            dtype = dtypes.get_default_dtype()
        elif isinstance(dtype, TensorType):
            if dtype.device_type != "cpu":
                raise RuntimeError("type: Cannot initialize CUDA without ATen_cuda library "
                                   "(Torch not compiled with CUDA enabled)")
            dtype = dtype.dtype
        return self.to(dtype)

    float, double = _cast_method("float", "float32"), _cast_method("double", "float64")
    half, bfloat16 = _cast_method("half", "float16"), _cast_method("bfloat16", "bfloat16")
    long, int = _cast_method("long", "int64"), _cast_method("int", "int32")
    short, byte = _cast_method("short", "int16"), _cast_method("byte", "uint8")
    bool = _cast_method("bool", "bool_")

    def clone(self, memory_format=None):
        """As ``Tensor.clone()``: a differentiable copy with its own storage."""
        return _C.clone(self)

    def contiguous(self, memory_format=None):
        """As ``Tensor.contiguous()``: ``self`` if already C-contiguous, else a copy."""
        return self if self._data.flags.c_contiguous else _C.clone(self)

    def cpu(self, memory_format=None):
        """As ``Tensor.cpu()``: ``self`` on the cpu, a differentiable copy from a device."""
        return self if type(self._data) is xp.ndarray else self.to("cpu")

    def cuda(self, device=None, non_blocking=False, memory_format=None):
        """As ``Tensor.cuda()``: a copy on the CUDA device (CuPy); without CuPy or a device,
        raises as PyTorch's CPU-only build does."""
        if device is not None and not isinstance(device, (str, _device)):
            device = f"cuda:{operator.index(device)}"
        return self.to("cuda" if device is None else device)

    def __dlpack__(self, *args, **kwargs):
        """DLPack export of the storage (``tapegrad.from_dlpack``, ``torch.from_dlpack``)."""
        if self._requires_grad:
            raise RuntimeError("Can't export tensors that require gradient, use "
                               "tensor.detach()")
        return self._data.__dlpack__(*args, **kwargs)

    def __dlpack_device__(self):
        """As ``Tensor.__dlpack_device__()``: the DLPack device (cpu)."""
        return self._data.__dlpack_device__()

    def new_tensor(self, data, dtype=None, device=None, requires_grad=False):
        """As ``Tensor.new_tensor``: a copy of ``data`` with this tensor's dtype by default."""
        resolve_device(device, "new_tensor")
        return Tensor._from_data(data, dtype=self.dtype if dtype is None else dtype,
                                 requires_grad=requires_grad)

    def new(self, *args, **kwargs):
        """As the legacy ``Tensor.new(...)``: ``torch.Tensor(...)``'s overloads with this
        tensor's dtype (``x.new(2, 3)`` is uninitialised, ``x.new([1, 2])`` copies data)."""
        return _legacy_new(self.dtype, self.device.type, args, kwargs, "new")

    def new_zeros(self, *size, dtype=None, device=None, requires_grad=False):
        """As ``Tensor.new_zeros(2, 3)``: this tensor's dtype by default."""
        return _C.zeros(*size, dtype=dtype or self.dtype, device=device,
                        requires_grad=requires_grad)

    def new_ones(self, *size, dtype=None, device=None, requires_grad=False):
        """As ``Tensor.new_ones()``: ones with this tensor's dtype by default."""
        return _C.ones(*size, dtype=dtype or self.dtype, device=device,
                       requires_grad=requires_grad)

    def new_empty(self, *size, dtype=None, device=None, requires_grad=False):
        """As ``Tensor.new_empty()``: uninitialised, with this tensor's dtype by default."""
        return _C.empty(*size, dtype=dtype or self.dtype, device=device,
                        requires_grad=requires_grad)

    def new_full(self, size, fill_value, dtype=None, device=None, requires_grad=False):
        """As ``Tensor.new_full()``: ``fill_value`` everywhere, this tensor's dtype by default."""
        return _C.full(size, fill_value, dtype=dtype or self.dtype, device=device,
                       requires_grad=requires_grad)

    # --- in-place ops: write into this storage, bump the shared version counter -----------
    def add_(self, other, alpha=1):
        """As ``Tensor.add_(other, alpha=1)``."""
        return _binary_inplace(self, "add_", xp.add, other, alpha, _E.add_alpha)

    def sub_(self, other, alpha=1):
        """As ``Tensor.sub_(other, alpha=1)``."""
        return _binary_inplace(self, "sub_", xp.subtract, other, alpha, _E.sub_alpha)

    def mul_(self, other):
        """As ``Tensor.mul_``."""
        return _binary_inplace(self, "mul_", xp.multiply, other, 1, _E.mul)

    def div_(self, other, rounding_mode=None):
        """As ``Tensor.div_`` (true division)."""
        if rounding_mode is not None:
            return _inplace(self, "div_", _public("div"), (other,),
                            {"rounding_mode": rounding_mode})
        return _binary_inplace(self, "div_", xp.true_divide, other, 1, _E.div, True)

    def pow_(self, exponent):
        """As ``Tensor.pow_``."""
        return _binary_inplace(self, "pow_", xp.power, exponent, 1, _E.pow)

    __iadd__ = add_
    __isub__ = sub_
    __imul__ = mul_

    def __itruediv__(self, other):
        return self.div_(other)

    def __ipow__(self, other):
        return self.pow_(other)

    def addcmul_(self, tensor1, tensor2, value=1):
        """As ``Tensor.addcmul_``: ``self += value * tensor1 * tensor2``."""
        if _tracked(self, (tensor1, tensor2)):
            return _inplace(self, "addcmul_", lambda a, b, c: a + value * b * c,
                            (tensor1, tensor2), {})
        _check_result(self, "addcmul_", tensor1, tensor2, value)
        tmp = tensor1._data * value  # PyTorch's order: self + (value * t1) * t2
        tmp *= tensor2._data
        return _accumulate(self, tmp, "addcmul_")

    def addcdiv_(self, tensor1, tensor2, value=1):
        """As ``Tensor.addcdiv_``: ``self += value * tensor1 / tensor2``."""
        if _tracked(self, (tensor1, tensor2)):
            return _inplace(self, "addcdiv_", lambda a, b, c: a + value * b / c,
                            (tensor1, tensor2), {})
        if not dtypes.is_floating(tensor1._data.dtype) and \
                not dtypes.is_floating(tensor2._data.dtype):
            raise RuntimeError("addcdiv_: integer division with addcdiv is not supported; "
                               "use addcmul_(tensor1, 1 / tensor2) or true division")
        _check_result(self, "addcdiv_", tensor1, tensor2, value)
        tmp = tensor1._data * value  # PyTorch's order: self + (value * t1) / t2
        tmp /= tensor2._data
        return _accumulate(self, tmp, "addcdiv_")

    def lerp_(self, end, weight):
        """As ``Tensor.lerp_``: ``self + weight * (end - self)`` (PyTorch's two-sided form)."""
        if _tracked(self, (end, weight)):
            return _inplace(self, "lerp_", _lerp, (end, weight), {})
        if isinstance(weight, Tensor):
            return _write(self, _lerp(self._data, end._data, weight._data), "lerp_")
        _check_float_result(self, "lerp_")
        d = self._data
        diff = end._data - d
        if abs(weight) < 0.5:
            diff *= weight
            return _accumulate(self, diff, "lerp_")
        diff *= 1 - weight
        if diff.shape != d.shape:
            raise _shape_error("lerp_", self, diff.shape)
        xp.subtract(end._data, diff, out=d, casting="same_kind")
        self._version[0] += 1
        return self

    def clamp_(self, min=None, max=None):
        """As ``Tensor.clamp_(min, max)``."""
        if min is None and max is None:
            raise RuntimeError("clamp_: at least one of 'min' or 'max' must not be None")
        if _tracked(self, (min, max)):
            return _inplace(self, "clamp_", _public("clamp"), (), {"min": min, "max": max})
        lo = min._data if isinstance(min, Tensor) else min
        hi = max._data if isinstance(max, Tensor) else max
        d = self._data
        if lo is not None:
            d = xp.maximum(d, lo)  # NaN propagates, as in PyTorch
        if hi is not None:
            d = xp.minimum(d, hi)
        return _write(self, d, "clamp_")

    clip_ = clamp_

    def clamp_min_(self, min):
        """As ``Tensor.clamp_min_()``: ``clamp_(min=min)``."""
        return self.clamp_(min=min)

    def clamp_max_(self, max):
        """As ``Tensor.clamp_max_()``: ``clamp_(max=max)``."""
        return self.clamp_(max=max)

    def zero_(self):
        """As ``Tensor.zero_()``."""
        return self.fill_(0)

    def fill_(self, value):
        """As ``Tensor.fill_(value)``."""
        if isinstance(value, Tensor) and value.ndim != 0:
            raise RuntimeError(f"fill_: only supports 0-dimension value tensor but got tensor "
                               f"with {value.ndim} dimensions")
        if _tracked(self, (value,)):
            src = value if isinstance(value, Tensor) else xp.asarray(value, self._data.dtype)
            return _inplace(self, "fill_", _C.copy_op, (src,), {})
        self._data[...] = value._data if isinstance(value, Tensor) else value
        self._version[0] += 1
        return self

    def copy_(self, src, non_blocking=False):
        """As ``Tensor.copy_(src)``: broadcast ``src`` to this shape and cast to this dtype."""
        if not isinstance(src, Tensor):
            src = Tensor._from_data(src)
        if _tracked(self, (src,)):
            return _inplace(self, "copy_", _C.copy_op, (src,), {})
        try:
            xp.copyto(self._data, src._data, casting="unsafe")
        except ValueError:
            raise RuntimeError(f"copy_: the source of shape {tuple(src.shape)} cannot be "
                               f"broadcast to the destination's shape {tuple(self.shape)}") \
                from None
        self._version[0] += 1
        return self

    def normal_(self, mean=0.0, std=1.0, *, generator=None):
        """As ``Tensor.normal_(mean, std)``: refill with normal draws (tapegrad's stream)."""
        from tapegrad import random

        _check_float_result(self, "normal_")
        values = mean + std * random.normal_array(random.numpy_rng(generator), self.shape,
                                                  self.dtype)
        return self._refill(values, "normal_")

    def uniform_(self, from_=0.0, to=1.0, *, generator=None, **kwargs):
        """As ``Tensor.uniform_(from, to)`` (``from`` may be passed by keyword)."""
        from tapegrad import random

        from_ = kwargs.pop("from", from_)
        _check_float_result(self, "uniform_")
        u = random.uniform_array(random.numpy_rng(generator), self.shape, self.dtype)
        return self._refill(from_ + (to - from_) * u, "uniform_")

    def bernoulli_(self, p=0.5, *, generator=None):
        """As ``Tensor.bernoulli_(p)``: refill with 0/1 draws, 1 with probability ``p``."""
        from tapegrad import random

        probs = p._data if isinstance(p, Tensor) else p
        return self._refill(random.numpy_rng(generator).random(self.shape) < probs,
                            "bernoulli_")

    def _refill(self, values, name):
        if grad_state.enabled and self._requires_grad:
            return _inplace(self, name, _C.copy_op,
                            (Tensor._make(xp.asarray(values, self._data.dtype)),), {})
        self._data[...] = values
        self._version[0] += 1
        return self

    def exp_(self):
        """As ``Tensor.exp_()``: ``exp`` in place."""
        return _unary_inplace(self, "exp_", xp.exp, _E.exp, True)

    def log_(self):
        """As ``Tensor.log_()``: ``log`` in place."""
        return _unary_inplace(self, "log_", xp.log, _E.log, True)

    def sqrt_(self):
        """As ``Tensor.sqrt_()``: ``sqrt`` in place."""
        return _unary_inplace(self, "sqrt_", xp.sqrt, _E.sqrt, True)

    def tanh_(self):
        """As ``Tensor.tanh_()``: ``tanh`` in place."""
        return _unary_inplace(self, "tanh_", xp.tanh, _E.tanh, True)

    def neg_(self):
        """As ``Tensor.neg_()``: ``neg`` in place."""
        return _unary_inplace(self, "neg_", xp.negative, _E.neg, False)

    def relu_(self):
        """As ``Tensor.relu_()`` (``nn.ReLU(inplace=True)``)."""
        return _unary_inplace(self, "relu_", lambda a, out: xp.maximum(a, 0, out=out), _E.relu,
                              False)

    def sigmoid_(self):
        """As ``Tensor.sigmoid_()``: ``sigmoid`` in place."""
        return _inplace(self, "sigmoid_", _E.sigmoid, (), {})

    def abs_(self):
        """As ``Tensor.abs_()``: ``abs`` in place."""
        return _inplace(self, "abs_", _public("abs"), (), {})

    def masked_fill_(self, mask, value):
        """As ``Tensor.masked_fill_(mask, value)``."""
        return _inplace(self, "masked_fill_", _public("masked_fill"), (mask, value), {})

    sin_, cos_, erf_ = _generic_inplace("sin"), _generic_inplace("cos"), _generic_inplace("erf")
    floor_, ceil_ = _generic_inplace("floor"), _generic_inplace("ceil")
    round_, trunc_ = _generic_inplace("round"), _generic_inplace("trunc")
    sign_, square_ = _generic_inplace("sign"), _generic_inplace("square")
    reciprocal_, rsqrt_ = _generic_inplace("reciprocal"), _generic_inplace("rsqrt")
    log1p_, expm1_ = _generic_inplace("log1p"), _generic_inplace("expm1")
    floor_divide_, remainder_ = _generic_inplace("floor_divide"), _generic_inplace("remainder")
    fmod_, logical_not_ = _generic_inplace("fmod"), _generic_inplace("logical_not")
    bitwise_and_, bitwise_or_ = _generic_inplace("bitwise_and"), _generic_inplace("bitwise_or")
    bitwise_xor_, scatter_add_ = _generic_inplace("bitwise_xor"), _generic_inplace("scatter_add")
    __ifloordiv__, __imod__ = floor_divide_, remainder_
    __iand__, __ior__, __ixor__ = bitwise_and_, bitwise_or_, bitwise_xor_

    def __setitem__(self, index, value):
        """As ``x[index] = value`` (basic, integer-array and boolean-mask indices); ``value``
        broadcasts to the indexed shape and is cast to this dtype. Differentiable when this
        tensor or ``value`` requires grad: basic indices copy into the view, integer-array and
        mask indices go through the ``index_put`` op (as PyTorch)."""
        if _differentiable(self, (value,)):
            if not isinstance(value, Tensor):
                value = Tensor._make(xp.asarray(value, dtype=self._data.dtype))
            key, basic, _ = _I.index_key(self, index)
            if basic:  # as PyTorch: copy_ into the view (the base's history is CopySlices)
                view = _I.getitem(self, index=key)
                extra = value.ndim - view.ndim  # leading 1s of value are dropped, as PyTorch
                if extra > 0 and all(n == 1 for n in value.shape[:extra]):
                    value = _M.reshape(value, value.shape[extra:])
                try:
                    fits = xp.broadcast_shapes(value.shape, view.shape) == view.shape
                except ValueError:
                    fits = False
                if not fits:
                    raise RuntimeError(
                        f"__setitem__: cannot assign a value of shape {tuple(value.shape)} to the "
                        f"indexed shape {tuple(view.shape)} of a tensor of shape "
                        f"{tuple(self.shape)}")
                view.copy_(value)
                return
            _inplace(self, "__setitem__", lambda a, v: _I.index_put(a, v, index=index),
                     (value,), {})
            return
        key = _I.index_key(self, index)[0]
        v = value._data if isinstance(value, Tensor) else value
        try:
            self._data[key] = v
        except (ValueError, TypeError) as e:
            shape = tuple(self._data[key].shape)
            raise RuntimeError(f"__setitem__: cannot assign a value of shape {xp.shape(v)} to "
                               f"the indexed shape {shape} of a tensor of shape "
                               f"{tuple(self.shape)} ({e})") from None
        self._version[0] += 1

    # --- autograd ---------------------------------------------------------------------
    def backward(self, gradient=None, retain_graph=None, create_graph=False, inputs=None):
        """As ``Tensor.backward``: accumulate d(self)/d(leaf) into every leaf's ``.grad``."""
        if gradient is None and inputs is None and not create_graph and self._requires_grad \
                and self._data.size == 1:  # the common case, without the general checks
            engine.run_backward([self], [_backend.array_module(self._data).ones(
                self._data.shape, self._data.dtype)],
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

    def register_post_accumulate_grad_hook(self, hook):
        """As ``Tensor.register_post_accumulate_grad_hook``: ``hook(tensor)`` runs once per
        backward pass, after this leaf's ``.grad`` holds all of the pass's gradient.

        >>> w.register_post_accumulate_grad_hook(lambda p: print(p.grad))
        """
        if not self.requires_grad:
            raise RuntimeError(
                "cannot register a hook on a tensor that doesn't require gradient")
        if self.grad_fn is not None:
            raise RuntimeError(
                "post accumulate grad hooks cannot be registered on non-leaf tensors")
        return engine.add_post_accumulate_hook(self, hook)


def softmax(input, dim, dtype=None):
    """As ``torch.softmax(x, dim)`` / ``x.softmax(dim)``: ``nn.functional.softmax``."""
    from tapegrad.nn import functional

    return functional.softmax(input, dim, dtype=dtype)


def log_softmax(input, dim, dtype=None):
    """As ``torch.log_softmax(x, dim)`` / ``x.log_softmax(dim)``: fused, never log(softmax)."""
    from tapegrad.nn import functional

    return functional.log_softmax(input, dim, dtype=dtype)


Tensor.softmax, Tensor.log_softmax = softmax, log_softmax


# --- conversion helpers -------------------------------------------------------------------
_TYPE_NAMES = {"float32": "FloatTensor", "float64": "DoubleTensor", "float16": "HalfTensor",
               "bfloat16": "BFloat16Tensor", "int64": "LongTensor", "int32": "IntTensor",
               "int16": "ShortTensor", "int8": "CharTensor", "uint8": "ByteTensor",
               "bool": "BoolTensor"}
_TYPE_BY_NAME = {v: dtypes.to_dtype(k) for k, v in _TYPE_NAMES.items() if k in dtypes._NAMES}


class TensorType(type):
    """The metaclass of PyTorch's legacy tensor types (``tapegrad.FloatTensor`` ...): calling
    one builds a ``Tensor`` of its dtype (``torch.Tensor``'s overloads), and ``isinstance``
    checks a tensor's dtype and device type."""

    def __instancecheck__(cls, obj):
        return isinstance(obj, Tensor) and obj.dtype is cls.dtype and \
            obj.device.type == cls.device_type

    def __call__(cls, *args, **kwargs):
        if cls.device_type != "cpu":
            raise no_cuda(cls.__name__)
        return _legacy_new(cls.dtype, cls.device_type, args, kwargs, cls.__name__)

    def __repr__(cls):
        prefix = "torch." if cls.device_type == "cpu" else f"torch.{cls.device_type}."
        return f"<class '{prefix}{cls.__name__}'>"


def tensor_types(device_type):
    """``{'FloatTensor': <type>, ...}``: PyTorch's legacy tensor types for ``device_type``."""
    module = "tapegrad" if device_type == "cpu" else f"tapegrad.{device_type}"
    return {name: TensorType(name, (), {"dtype": dt, "device_type": device_type,
                                        "__module__": module, "__slots__": ()})
            for name, dt in _TYPE_BY_NAME.items()}


TENSOR_TYPES = tensor_types("cpu")


def _type_from_name(name):
    """``x.type('torch.DoubleTensor')``: a type name to a dtype (or the cuda type, which
    raises in ``type``)."""
    parts = name.split(".")
    if parts[0] in ("torch", "tapegrad") and len(parts) == 2 and parts[1] == "Tensor":
        return Tensor
    if parts[0] in ("torch", "tapegrad") and len(parts) == 2 and parts[1] in TENSOR_TYPES:
        return TENSOR_TYPES[parts[1]]
    if parts[0] in ("torch", "tapegrad") and len(parts) == 3 and parts[1] == "cuda" and \
            parts[2] in TENSOR_TYPES:
        raise RuntimeError("type: Cannot initialize CUDA without ATen_cuda library "
                           "(Torch not compiled with CUDA enabled)")
    raise ValueError(f"invalid type: {name!r}")


def _legacy_new(dtype, device_type, args, kwargs, name):
    """``torch.Tensor(...)`` / ``torch.FloatTensor(...)`` / ``x.new(...)``: PyTorch's legacy
    constructor overloads. ``dtype`` None is ``torch.Tensor`` (the default float dtype, and a
    tensor argument of any dtype is aliased)."""
    device = kwargs.pop("device", None)
    size = kwargs.pop("size", None)
    data = kwargs.pop("data", None)
    if kwargs:
        raise TypeError(f"{name}() received an invalid combination of arguments - got "
                        f"unexpected keyword arguments {sorted(kwargs)}; expected (*sizes, *, "
                        "device=None), (data, *, device=None) or (*, size, device=None)")
    if device is not None:
        dev = device if isinstance(device, _device) else _device(device)
        if dev.type != device_type:
            raise RuntimeError(f"legacy constructor expects device type: {device_type} but "
                               f"device type: {dev.type} was passed")
        resolve_device(dev, name)
    target = dtypes.get_default_dtype() if dtype is None else dtype
    if size is not None or data is not None:
        if args or (size is not None and data is not None):
            raise TypeError(f"{name}() received an invalid combination of arguments: "
                            "positional arguments with size= or data=")
        args = (data,) if data is not None else tuple(size)
        if size is not None and not all(_is_size(s) for s in args):
            raise TypeError(f"{name}(): argument 'size' must be tuple of ints, got {size!r}")
    if not args:
        return Tensor._make(xp.empty((0,), dtype=target.np))
    if len(args) == 1 and isinstance(args[0], Tensor):
        src = args[0]
        if device is not None:
            raise RuntimeError(f"Legacy tensor constructor of the form torch.Tensor(tensor, "
                               f"device=device) is not supported.  Use torch.tensor(...) or "
                               f"torch.as_tensor(...) instead.")
        if dtype is not None and src.dtype is not dtype:
            raise TypeError(f"{name}(): expected a tensor of dtype {dtype} (got {src.dtype})")
        return _S.alias(src)
    if all(_is_size(a) for a in args):
        shape = tuple(operator.index(a) for a in args)
        for n in shape:
            if n < 0:
                raise RuntimeError(f"{name}: Trying to create tensor with negative dimension "
                                   f"{n}: {list(shape)}")
        return Tensor._make(xp.empty(shape, dtype=target.np))
    if len(args) > 1:
        raise TypeError(f"{name}() received an invalid combination of arguments - got "
                        f"({', '.join(type(a).__name__ for a in args)}): expected sizes (ints) "
                        "or one sequence of data")
    values = args[0]
    if isinstance(values, str):
        raise TypeError(f"{name}(): invalid data type 'str'")
    if isinstance(values, xp.ndarray):
        return Tensor._make(xp.asarray(values, dtype=target.np))  # shares when it can
    if not isinstance(values, (list, tuple, range)):
        raise TypeError(f"{name}(): data must be a sequence (got {type(values).__name__})")
    return Tensor._make(_to_array(list(values) if isinstance(values, range) else values,
                                  target))


def _is_size(a):
    return not isinstance(a, (bool, Tensor, float)) and hasattr(a, "__index__") and \
        not (isinstance(a, xp.ndarray) and a.ndim)


def _to_args(t, args, kwargs):
    """Parse ``Tensor.to``'s overloads into (dtype or None, copy)."""
    dtype, device = kwargs.pop("dtype", None), kwargs.pop("device", None)
    copy = bool(kwargs.pop("copy", False))
    kwargs.pop("non_blocking", None)
    kwargs.pop("memory_format", None)
    if kwargs:
        raise TypeError(f"to: unexpected keyword arguments {sorted(kwargs)}")
    for a in args:
        if isinstance(a, Tensor):  # to(other): other's dtype and device
            dtype, device = a.dtype, a.device
        elif isinstance(a, dtypes.dtype):
            dtype = a
        elif isinstance(a, bool):
            copy = a  # to(dtype, non_blocking, copy) positional flags: the last bool wins
        elif a is None:
            continue
        elif isinstance(a, (str, _device)):
            device = a
        elif isinstance(a, int):
            device = _device(a)  # an accelerator index: raises on a cpu-only machine
        else:
            dtype = dtypes.to_dtype(a)
    dev = _to_target(device)
    return (None if dtype is None else dtypes.to_dtype(dtype)), copy, dev


def _to_target(device):
    """The device ``Tensor.to`` moves to (None: stay): cuda when a CUDA backend exists, else
    PyTorch's CPU-build error, as ``resolve``."""
    if device is None:
        return None
    dev = device if isinstance(device, _device) else _device(device)
    if dev.type == "cuda":
        b = _backend.cuda_backend()
        if b is None:
            raise no_cuda("to")
        index = b.current_index() if dev.index is None else dev.index
        if index >= b.device_count():
            raise RuntimeError(f"to: CUDA error: invalid device ordinal (device {dev}, "
                               f"{b.device_count()} visible)")
        return _device("cuda", index)
    return resolve_device(dev, "to")


def _move(t, dev):
    """``t`` copied to ``dev``, differentiably: the gradient flows back to ``t``'s device."""
    return to_device(t, device=dev, source=t.device)


@registry.op(saves="none", pointwise=True, linear=True)
def to_device(a, device, source):
    """Copy to ``device`` (``Tensor.to('cuda')``, ``.cpu()``); the gradient is copied back
    to ``source``, the input's device."""
    return _to_device(a, device)


@to_device.grad
def _(g, out, a, device, source):
    return to_device(g, device=source, source=device)


to_device.not_lowered("a copy between devices, not a computation a host loop can do")


def _to_array(data, dtype):
    """Build a backend array as ``torch.tensor`` would: Python floats take the default dtype."""
    if isinstance(data, Tensor):
        arr = data._data.copy()
    elif isinstance(data, xp.ndarray):
        arr = data.copy()
    elif isinstance(data, xp.generic):
        arr = xp.asarray(data)
    else:
        try:
            arr = xp.asarray(data)
        except (ValueError, TypeError, OverflowError):
            arr = None  # ragged: PyTorch's wording from the slow path
        if arr is None or arr.dtype.kind not in "biuf":
            arr = _C.nested_array(data, dtype)  # PyTorch's result or error, checked in its order
        if dtype is None:  # with a dtype, cast once from what numpy built (no double rounding)
            if arr.dtype == xp.float64 and not _has_numpy_floats(data):
                arr = arr.astype(dtypes.get_default_dtype().np)
            elif arr.dtype.kind == "i" and arr.dtype.itemsize < 8 and not _has_numpy_ints(data):
                arr = arr.astype(xp.int64)  # platforms whose default int is 32-bit
    if dtype is not None:
        arr = arr.astype(dtypes.to_dtype(dtype).np, copy=False)
    dtypes.from_numpy_dtype(arr.dtype)  # raises for unsupported dtypes
    return arr


def _has_numpy_floats(data):
    """Whether nested ``data`` holds a float64 that is not a Python float (a numpy float64
    scalar or array, or a float64 Tensor): PyTorch then infers float64, not the default."""
    stack = [data]
    while stack:
        d = stack.pop()
        if type(d) is float:
            continue
        if isinstance(d, (list, tuple)):
            stack.extend(d)
        elif isinstance(d, (xp.ndarray, xp.generic)):
            if d.dtype == xp.float64:
                return True
        elif isinstance(d, Tensor) and d._data.dtype == xp.float64:
            return True
    return False


def _has_numpy_ints(data):
    stack = [data]
    while stack:
        d = stack.pop()
        if isinstance(d, (list, tuple)):
            stack.extend(d)
        elif isinstance(d, (xp.ndarray, xp.integer)) or isinstance(d, Tensor):
            return True
    return False


_new = object.__new__
registry.Tensor = engine.Tensor = Tensor
registry.make = Tensor._make  # dispatch's own name for it (ops modules predate Tensor)

# --- operators and methods: each delegates to an op --------------------------------------
from tapegrad.ops import elementwise as _E, reduce as _R, movement as _M, linalg as _L  # noqa: E402
from tapegrad.ops import selection as _S, indexing as _I  # noqa: E402
from tapegrad.ops import pointwise_math as _PM, composites as _CO  # noqa: E402
from tapegrad.ops import scan as _SC, statistics as _ST, index_writes as _IW  # noqa: E402
from tapegrad import creation as _C  # noqa: E402  (clone, copy_op, factories)
from tapegrad.inplace import (  # noqa: E402  (in-place ops and views)
    _tracked, _public, _check_result, _check_float_result, _shape_error, _write, _accumulate,
    _binary_inplace, _unary_inplace, _lerp, _inplace, _differentiable)

def _method(fn):
    return fn  # plain functions and ops (Op.__get__) both bind as methods


for _module in (_E, _R, _M, _I, _L, _S, _PM, _CO, _SC, _ST, _IW):
    for _name in _module.TENSOR_METHODS:
        setattr(Tensor, _name, _method(getattr(_module, _name)))
for _name in _PM.INPLACE + _CO.INPLACE + _SC.INPLACE + _IW.INPLACE:
    setattr(Tensor, _name + "_", _generic_inplace(_name))  # acos_, scatter_, ... in place
Tensor.float_power_ = _PM.float_power_


def _binary(fn, reflected=False):
    if isinstance(fn, registry.Op):  # self is a Tensor: straight to dispatch
        dispatch = registry.dispatch
        if reflected:
            return lambda self, other: dispatch(fn, (other, self), {})
        return lambda self, other: dispatch(fn, (self, other), {})
    if reflected:
        return lambda self, other: fn(other, self)
    return fn


Tensor.__add__ = _binary(_E.add)
Tensor.__radd__ = _binary(_E.add, True)
Tensor.__sub__ = _binary(_E.sub)
Tensor.__rsub__ = _binary(_E.sub, True)
Tensor.__mul__ = _binary(_E.mul)
Tensor.__rmul__ = _binary(_E.mul, True)
Tensor.__truediv__ = _binary(_E.div_op)
Tensor.__rtruediv__ = _binary(_E.div_op, True)
Tensor.__floordiv__ = _binary(_E.floor_divide)
Tensor.__rfloordiv__ = _binary(_E.floor_divide, True)
Tensor.__mod__ = _binary(_E.remainder)
Tensor.__rmod__ = _binary(_E.remainder, True)
Tensor.__pow__ = _binary(_E.pow)
Tensor.__rpow__ = _binary(_E.pow, True)
Tensor.__and__ = _binary(_E.bitwise_and)
Tensor.__rand__ = _binary(_E.bitwise_and, True)
Tensor.__or__ = _binary(_E.bitwise_or)
Tensor.__ror__ = _binary(_E.bitwise_or, True)
Tensor.__xor__ = _binary(_E.bitwise_xor)
Tensor.__rxor__ = _binary(_E.bitwise_xor, True)
Tensor.__invert__ = _method(_E.bitwise_not)
Tensor.__lshift__ = _binary(_PM.bitwise_left_shift)
Tensor.__rlshift__ = _binary(_PM.bitwise_left_shift, True)
Tensor.__rshift__ = _binary(_PM.bitwise_right_shift)
Tensor.__rrshift__ = _binary(_PM.bitwise_right_shift, True)
Tensor.__ilshift__ = Tensor.bitwise_left_shift_
Tensor.__irshift__ = Tensor.bitwise_right_shift_
Tensor.__abs__ = _method(_E.abs)
Tensor.__pos__ = _method(_E.positive)
Tensor.where = lambda self, condition, other: _E.where(condition, self, other)
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
Tensor.__getitem__ = _I.tensor_getitem
from tapegrad import sparse as _sparse  # noqa: E402  (layouts, sparse_coo tensors)
