"""Tensor creation: ``tensor``, ``zeros``, ``ones``, ``arange`` ... as in PyTorch.

The argument helpers here (``size_args``, ``check_device``, ``float_dtype``, ``finish``) are
shared with ``tapegrad.random`` so every factory parses ``*size``, ``dtype=``, ``device=``
and ``requires_grad=`` the same way.
"""
import math

from tapegrad import dtypes
from tapegrad.autograd import engine as _engine
from tapegrad.backend import xp, DEVICE_TYPES, array_module
from tapegrad import backend
from tapegrad.backend.device import device as _device, resolve as resolve_device, no_cuda
from tapegrad.ops.registry import op
from tapegrad.tensor import Tensor, _to_target


# --- shared argument handling ------------------------------------------------------------
NO_SIZE = object()  # a factory's ``size=`` keyword when not given


def size_args(size, name, keyword=NO_SIZE):
    """``f(2, 3)``, ``f((2, 3))``, ``f([2, 3])``, ``f(torch.Size)`` and ``f(size=(2, 3))``
    (``keyword``) all mean shape (2, 3); no size at all raises, as in PyTorch."""
    if keyword is not NO_SIZE:
        if size:
            raise TypeError(f"{name}() got multiple values for argument 'size'")
        if not isinstance(keyword, (tuple, list)):
            raise TypeError(f"{name}(): argument 'size' must be tuple of ints, not "
                            f"{type(keyword).__name__}")
        size = (keyword,)
    elif not size:
        raise TypeError(f'{name}() missing 1 required positional arguments: "size"')
    if len(size) == 1 and isinstance(size[0], (tuple, list)):
        size = size[0]
    out = []
    for s in size:
        if isinstance(s, Tensor):
            s = s.item()
        if isinstance(s, bool) or not isinstance(s, int) and not hasattr(s, "__index__"):
            raise TypeError(f"{name}: size must be a sequence of ints, got {list(size)!r}")
        s = int(s)
        if s < 0:
            raise RuntimeError(f"{name}: trying to create tensor with negative dimension {s}: "
                               f"{list(size)}")
        if s > _MAX_BYTES:  # PyTorch's int64 sizes: its argument parser refuses it
            raise TypeError(f"{name}(): argument 'size' failed to unpack the object at pos "
                            f"{len(out) + 1} with error \"Overflow when unpacking long long\" "
                            f"({s} is more than int64 holds)")
        out.append(s)
    return tuple(out)


_MAX_BYTES = 2 ** 63 - 1


def allocate(name, shape, dtype, make, /, *args, **kwargs):
    """``make(*args, **kwargs)``, the new array of ``shape`` and tapegrad ``dtype`` behind
    factory ``name``; sizes no machine can hold raise RuntimeError naming the size and the
    bytes, as PyTorch's allocator does, never numpy's bare MemoryError or ValueError."""
    nbytes = dtype.itemsize
    for n in shape:  # in order, as PyTorch: an overflow before a 0 still counts
        nbytes *= n
        if nbytes > _MAX_BYTES:
            raise RuntimeError(f"{name}: Storage size calculation overflowed with sizes="
                               f"{list(shape)} (dtype {dtype}, {dtype.itemsize} bytes per "
                               f"element: more than {_MAX_BYTES} bytes)")
    if not nbytes and math.prod(n for n in shape if n) * dtype.itemsize > _MAX_BYTES:
        raise RuntimeError(f"{name}: an empty tensor with sizes={list(shape)} (0 bytes) cannot "
                           f"be represented: numpy's strides overflow (see docs/differences.md)")
    try:
        return make(*args, **kwargs)
    except MemoryError:
        raise RuntimeError(f"{name}: can't allocate memory: you tried to allocate {nbytes} "
                           f"bytes (sizes={list(shape)}, dtype {dtype})") from None


def check_device(device, name):
    """Accept ``None``, ``'cpu'``, ``'cpu:0'`` or a cpu ``tapegrad.device`` (returns the cpu);
    ``'cuda'`` returns the cuda device where CuPy sees one (the factory makes its array on the
    host and ``finish`` copies it there), else raises as PyTorch's CPU-only build does
    (``backend.device.resolve`` is the one device check)."""
    if device is not None and (isinstance(device, _device) and device.type == "cuda" or
                               isinstance(device, str) and device.startswith("cuda")):
        if backend.cuda_backend() is None:
            raise no_cuda(name)
        try:
            return _to_target(device)
        except RuntimeError as e:
            raise RuntimeError(f"{name}: {e}") from None
    return resolve_device(device, name)


def float_dtype(dtype, name):
    """The dtype of a floating-point factory (``rand``, ``linspace``): default, or a float."""
    if dtype is None:
        return dtypes.get_default_dtype()
    d = dtypes.to_dtype(dtype)
    if not dtypes.is_floating(d):
        raise TypeError(f"{name}: expected a floating-point dtype, got {d}")
    return d


# Factories whose values depend on shapes and Python numbers only: a mode observing
# ``made_from_shapes`` (the compiler's tracer: such a tensor is a constant of its graph, as
# torch.compile specialises it, not a value read from outside) is told of each one made.
FROM_SHAPES = frozenset(("zeros", "ones", "full", "empty", "arange", "linspace", "eye",
                         "zeros_like", "ones_like", "full_like", "empty_like"))


def finish(array, requires_grad, name="tensor", device=None):
    """Wrap a freshly made array (copied to ``device`` when that is not the cpu);
    ``requires_grad=True`` on integer dtypes raises."""
    if device is not None and device.type != "cpu":
        array = backend.to_device(array, device)
    t = Tensor._make(array)
    if requires_grad:
        t.requires_grad = True
    elif _engine.WATCH and name in FROM_SHAPES:
        m = _engine.observer("made_from_shapes")
        if m is not None:
            m.made_from_shapes(t)
    return t


def _filled(name, size, value, dtype, device, requires_grad, keyword=NO_SIZE):
    dev = check_device(device, name)
    d = dtypes.get_default_dtype() if dtype is None else dtypes.to_dtype(dtype)
    shape = size_args(size, name, keyword)
    if value is None:
        return finish(allocate(name, shape, d, xp.empty, shape, dtype=d.np), requires_grad, name,
                      dev)
    return finish(allocate(name, shape, d, xp.full, shape, value, dtype=d.np), requires_grad,
                  name, dev)


# --- copies: the two ops behind clone(), contiguous() and the in-place writes -----------------
@op(saves="none", linear=True)
def clone(a):
    """As ``torch.clone``: a copy with its own (C-contiguous) storage; gradient passes through."""
    return a.copy(order="C")  # a method, so a device array stays on its device


@clone.grad
def _(g, out, a):
    return g


@op(saves="none", needs=True, name="copy", linear=True)
def copy_op(a, src):
    """``a.copy_(src)`` out of place: ``src`` broadcast to ``a``'s shape and cast to its dtype.

    The gradient w.r.t. ``a``'s old value is zero (it is overwritten), so none is sent.
    """
    return xp.array(xp.broadcast_to(src, a.shape), dtype=a.dtype, copy=True)


@copy_op.grad(traces=True)
def _(g, out, a, src, needs=(True, True)):
    if not needs[1]:
        return None, None
    from tapegrad.ops.elementwise import to_dtype
    from tapegrad.ops.movement import sum_to

    if g.dtype != src.dtype:
        g = to_dtype(g, dtype=src.dtype)
    return None, (sum_to(g, shape=src.shape) if g.shape != src.shape else g)


# --- factories ----------------------------------------------------------------------------
def tensor(data, dtype=None, device=None, requires_grad=False) -> Tensor:
    """As ``torch.tensor``: copies ``data``; Python floats become the default dtype.

    >>> tapegrad.tensor([[1.0, 2.0]], requires_grad=True)
    """
    dev = check_device(device, "tensor")
    if dev is not None and dev.type != "cpu":  # made on the host, copied to the device
        t = Tensor._from_data(data, dtype=dtype)
        return finish(backend.to_device(t._data, dev), requires_grad, "tensor")
    return Tensor._from_data(data, dtype=dtype, requires_grad=requires_grad)


def from_numpy(ndarray) -> Tensor:
    """As ``torch.from_numpy``: a tensor sharing ``ndarray``'s memory (writes show in both).

    >>> a = numpy.zeros(3); t = tapegrad.from_numpy(a); t.add_(1)   # a is now all ones
    """
    if not isinstance(ndarray, xp.ndarray):
        raise TypeError(f"from_numpy: expected np.ndarray (got {type(ndarray).__name__})")
    try:
        dtypes.from_numpy_dtype(ndarray.dtype)
    except TypeError:
        raise TypeError(f"from_numpy: can't convert np.ndarray of type {ndarray.dtype}. The "
                        "only supported types are: " + ", ".join(d.name for d in dtypes.ALL)) \
            from None
    return Tensor._make(ndarray)


def as_tensor(data, dtype=None, device=None) -> Tensor:
    """As ``torch.as_tensor``: shares memory with a tensor or numpy array when the dtype
    already matches, otherwise converts (copies).

    >>> tapegrad.as_tensor(numpy.arange(3))       # shares the array's memory
    """
    dev = check_device(device, "as_tensor")
    if dev is not None and dev.type != "cpu":
        return as_tensor(data, dtype).to(dev)
    if isinstance(data, Tensor):
        return data if dtype is None else data.to(dtype)
    if isinstance(data, xp.ndarray):
        if dtype is None or dtypes.to_dtype(dtype).np == data.dtype:
            return from_numpy(data)
        return Tensor._make(data.astype(dtypes.to_dtype(dtype).np))
    return Tensor._from_data(data, dtype=dtype)


# --- nested data numpy could not make a numeric array of ------------------------------------
def nested_array(data, dtype=None, name="tensor"):
    """The array PyTorch's conversion makes of ``data`` that numpy turned down or made
    non-numeric (ragged lists, strings, ``None``, ints beyond int64), or PyTorch's error for
    it: ``tensor([[1, 2], [3]])`` raises ValueError "expected sequence of length 2 at dim 1
    (got 1)". Checked in PyTorch's order: the shape along first elements, the dtype (when
    not given), then every element against that shape and dtype."""
    if isinstance(data, (str, bytes)):
        raise TypeError(f"{name}(): invalid data type '{type(data).__name__}'")
    sizes, seq = [], data
    while _is_sequence(seq):
        if isinstance(seq, (Tensor, xp.ndarray)):
            sizes.extend(seq.shape)
            break
        if isinstance(seq, str):  # "a"[0] is "a" again: PyTorch runs out of dims
            raise ValueError(f"{name}(): too many dimensions '{type(seq).__name__}' (a string "
                             f"where a number or a sequence of numbers belongs)")
        sizes.append(len(seq))
        if not sizes[-1]:
            break
        seq = seq[0]
    d = _infer_dtype(data, name) if dtype is None else dtypes.to_dtype(dtype)
    if 0 in sizes:  # PyTorch stores nothing, so checks nothing, when the result is empty
        return xp.empty(sizes, dtype=d.np)
    stack = [(data, 0)]
    while stack:
        obj, dim = stack.pop()
        if dim == len(sizes):
            _check_element(obj, d, name)
        elif isinstance(obj, (Tensor, xp.ndarray)):
            for k, (want, got) in enumerate(zip(sizes[dim:], obj.shape)):
                if want != got:
                    raise ValueError(f"{name}(): expected sequence of length {want} at dim "
                                     f"{dim + k} (got {got}) in an array of shape "
                                     f"{tuple(obj.shape)}")
            if obj.ndim != len(sizes) - dim:
                raise ValueError(f"{name}(): expected a sequence of shape {tuple(sizes[dim:])} "
                                 f"at dim {dim} (got an array of shape {tuple(obj.shape)})")
        elif not _is_sequence(obj) or isinstance(obj, (str, bytes)):
            raise TypeError(f"{name}(): not a sequence: expected a sequence of length "
                            f"{sizes[dim]} at dim {dim} (got {type(obj).__name__})")
        elif len(obj) != sizes[dim]:
            raise ValueError(f"{name}(): expected sequence of length {sizes[dim]} at dim {dim} "
                             f"(got {len(obj)})")
        else:
            stack.extend((item, dim + 1) for item in reversed(obj))
    return xp.array(data, dtype=d.np)


def _is_sequence(obj):
    return isinstance(obj, (list, tuple, range, str, bytes, Tensor, xp.ndarray)) and \
        getattr(obj, "ndim", 1) > 0


def _infer_dtype(data, name):
    """PyTorch's ``infer_scalar_type``: bool, int64, the default float, or an array's dtype,
    promoted over every element; an empty sequence is the default float."""
    found, stack = None, [data]
    while stack:
        obj = stack.pop()
        if isinstance(obj, (xp.ndarray, xp.generic)):  # before float: numpy's float64 is one
            d = dtypes.from_numpy_dtype(obj.dtype)
        elif isinstance(obj, bool):
            d = dtypes.bool_
        elif isinstance(obj, int):
            d = dtypes.int64
        elif isinstance(obj, float):
            d = dtypes.get_default_dtype()
        elif isinstance(obj, complex):
            raise TypeError(f"{name}(): complex numbers are not supported (tapegrad has no "
                            f"complex dtypes), got {obj!r}")
        elif isinstance(obj, Tensor):
            d = obj.dtype
        elif isinstance(obj, (str, bytes)):
            raise TypeError(f"{name}(): invalid data type '{type(obj).__name__}' (a "
                            "string among the numbers)")
        elif _is_sequence(obj):
            if not len(obj):
                d = dtypes.get_default_dtype()
            else:
                stack.extend(reversed(obj))  # in order: the first bad element is reported
                continue
        else:
            raise RuntimeError(f"{name}(): Could not infer dtype of {type(obj).__name__}")
        found = d if found is None else dtypes.promote_types(found, d)
    return found


def _check_element(obj, d, name):
    """One element stored into dtype ``d``, as PyTorch's conversion checks it."""
    if isinstance(obj, (Tensor, xp.ndarray)):
        if obj.size != 1:
            raise ValueError(f"{name}(): only one element tensors can be converted to Python "
                             f"scalars (got an element of shape {tuple(obj.shape)})")
    elif isinstance(obj, complex):
        raise TypeError(f"{name}(): complex numbers are not supported (tapegrad has no complex "
                        f"dtypes), got {obj!r}")
    elif not isinstance(obj, (int, float, xp.generic)):
        what = type(obj).__name__
        if dtypes.is_floating(d):
            raise TypeError(f"{name}(): must be real number, not {what} (an element of dtype "
                            f"{d})")
        raise TypeError(f"{name}(): '{what}' object cannot be interpreted as an integer (an "
                        f"element of dtype {d})")
    elif isinstance(obj, int) and not dtypes.is_floating(d) and \
            not -2 ** 63 <= obj < 2 ** 63 and not isinstance(obj, bool):
        raise ValueError(f"{name}(): Overflow when unpacking long long: {obj} does not fit in "
                         f"{d}")


def zeros(*args, size=NO_SIZE, dtype=None, device=None, requires_grad=False) -> Tensor:
    """As ``torch.zeros(2, 3)`` or ``torch.zeros((2, 3), dtype=torch.int64)``."""
    return _filled("zeros", args, 0, dtype, device, requires_grad, size)


def ones(*args, size=NO_SIZE, dtype=None, device=None, requires_grad=False) -> Tensor:
    """As ``torch.ones(2, 3)``."""
    return _filled("ones", args, 1, dtype, device, requires_grad, size)


def empty(*args, size=NO_SIZE, dtype=None, device=None, requires_grad=False) -> Tensor:
    """As ``torch.empty(2, 3)``: uninitialised memory."""
    return _filled("empty", args, None, dtype, device, requires_grad, size)


def full(size, fill_value, dtype=None, device=None, requires_grad=False) -> Tensor:
    """As ``torch.full((2, 3), 7.0)``: the dtype follows ``fill_value`` (bool, int64 or the
    default float) unless given."""
    if dtype is None:
        dtype = _value_dtype(fill_value, "full")
    return _filled("full", (size,), fill_value, dtype, device, requires_grad)


def _value_dtype(value, name):
    if isinstance(value, Tensor):
        return value.dtype
    try:
        return dtypes.scalar_dtype(value)
    except TypeError:
        raise TypeError(f"{name}: fill_value must be a number, got {type(value).__name__}") \
            from None


def _number(x, name, what):
    if isinstance(x, Tensor):
        x = x.item()
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        try:
            x = x.item()  # numpy scalars
        except AttributeError:
            raise TypeError(f"{name}: {what} must be a number, got {type(x).__name__}") \
                from None
    return x


def arange(start=0, end=None, step=1, *, dtype=None, device=None, requires_grad=False) -> Tensor:
    """As ``torch.arange``: ``arange(5)`` is int64, ``arange(0., 1, .1)`` the default float.

    The length is ``ceil((end - start) / step)``, computed in double precision as PyTorch does.
    """
    dev = check_device(device, "arange")
    if end is None:
        start, end = 0, start
    start, end, step = (_number(v, "arange", w) for v, w in
                        ((start, "start"), (end, "end"), (step, "step")))
    if step == 0:
        raise RuntimeError("arange: step must be nonzero")
    if not all(math.isfinite(v) for v in (start, end)):
        raise RuntimeError(f"arange: unsupported range: {start} -> {end}")
    if (end - start) * step < 0:
        raise RuntimeError(f"arange: upper bound and larger bound inconsistent with step sign "
                           f"(start={start}, end={end}, step={step})")
    if dtype is None:
        is_float = any(isinstance(v, float) for v in (start, end, step))
        d = dtypes.get_default_dtype() if is_float else dtypes.int64
    else:
        d = dtypes.to_dtype(dtype)
    if dtypes.is_floating(d):
        n = math.ceil((float(end) - float(start)) / float(step))
        values = allocate("arange", (n,), dtypes.float64,
                          lambda: float(start) + float(step) * xp.arange(n, dtype=xp.float64))
    else:  # PyTorch converts the bounds to the integer type first (truncating)
        first, last, stride = int(start), int(end), int(step)
        if stride == 0:
            raise RuntimeError(f"arange: step {step} truncates to 0 for dtype {d}")
        if d is dtypes.int64:
            sign = (stride > 0) - (stride < 0)
            num = last - first + stride - sign
            n = abs(num) // abs(stride) * (1 if (num >= 0) == (stride > 0) else -1)
        else:
            n = math.ceil((float(end) - float(start)) / float(step))
        n = max(n, 0)
        values = allocate("arange", (n,), dtypes.int64,
                          lambda: first + stride * xp.arange(n, dtype=xp.int64))
    return finish(values.astype(d.np, copy=False), requires_grad, "arange", dev)


def linspace(start, end, steps, *, dtype=None, device=None, requires_grad=False) -> Tensor:
    """As ``torch.linspace(0, 1, 5)``: ``steps`` evenly spaced values including both ends.

    PyTorch fills the first half from ``start`` and the second half back from ``end``; the
    same formula is used here so values agree to the last bit in float64.
    """
    dev = check_device(device, "linspace")
    start, end = _number(start, "linspace", "start"), _number(end, "linspace", "end")
    steps = _number(steps, "linspace", "steps")
    if not isinstance(steps, int) or steps < 0:
        raise RuntimeError(f"linspace: number of steps must be a non-negative int, got {steps}")
    d = dtypes.get_default_dtype() if dtype is None else dtypes.to_dtype(dtype)
    def fill():
        if steps == 1:
            return xp.full(1, start, dtype=xp.float64)
        i = xp.arange(steps, dtype=xp.float64)
        step = (float(end) - float(start)) / (steps - 1) if steps > 1 else 0.0
        half = steps // 2
        return xp.where(i < half, start + step * i, end - step * (steps - 1 - i))

    values = allocate("linspace", (steps,), dtypes.float64, fill)
    if not dtypes.is_floating(d):
        values = xp.trunc(values)
    return finish(values.astype(d.np), requires_grad, "linspace", dev)


def eye(n, m=None, *, dtype=None, device=None, requires_grad=False) -> Tensor:
    """As ``torch.eye(3)`` or ``torch.eye(2, 4)``: ones on the diagonal."""
    dev = check_device(device, "eye")
    n = _number(n, "eye", "n")
    m = n if m is None else _number(m, "eye", "m")
    if n < 0 or m < 0:
        raise RuntimeError(f"eye: n and m must be non-negative, got n={n}, m={m}")
    d = dtypes.get_default_dtype() if dtype is None else dtypes.to_dtype(dtype)
    return finish(allocate("eye", (n, m), d, xp.eye, n, m, dtype=d.np), requires_grad, "eye",
                  dev)


def on_input_device(input, device):
    """Whether a ``*_like`` factory given ``device`` makes its result on ``input``'s device
    array (``input`` is on a device, and ``device`` is None or names that device)."""
    data = input._data
    if type(data) is xp.ndarray or type(data) not in DEVICE_TYPES:
        return False
    if device is None:
        return True
    want = device if isinstance(device, _device) else _device(device)
    have = input.device
    return want.type == have.type and want.index in (None, have.index)


def _like(name, input, value, dtype, device, requires_grad):
    if not isinstance(input, Tensor):
        raise TypeError(f"{name}: expected a Tensor, got {type(input).__name__}")
    d = input.dtype if dtype is None else dtypes.to_dtype(dtype)
    if on_input_device(input, device):  # made with the input's array module, as PyTorch
        m = array_module(input._data)
        arr = m.empty(input.shape, dtype=d.np) if value is None else \
            m.full(input.shape, value, dtype=d.np)
        return finish(arr, requires_grad, name)
    dev = check_device(device, name)
    if value is None:
        return finish(xp.empty(input.shape, dtype=d.np), requires_grad, name, dev)
    return finish(xp.full(input.shape, value, dtype=d.np), requires_grad, name, dev)


def zeros_like(input, *, dtype=None, device=None, requires_grad=False) -> Tensor:
    """As ``torch.zeros_like(x)``: zeros of ``x``'s shape and dtype."""
    return _like("zeros_like", input, 0, dtype, device, requires_grad)


def ones_like(input, *, dtype=None, device=None, requires_grad=False) -> Tensor:
    """As ``torch.ones_like(x)``."""
    return _like("ones_like", input, 1, dtype, device, requires_grad)


def full_like(input, fill_value, *, dtype=None, device=None, requires_grad=False) -> Tensor:
    """As ``torch.full_like(x, 7.0)``: ``x``'s shape and dtype (not ``fill_value``'s)."""
    _value_dtype(fill_value, "full_like")
    return _like("full_like", input, fill_value, dtype, device, requires_grad)


def empty_like(input, *, dtype=None, device=None, requires_grad=False) -> Tensor:
    """As ``torch.empty_like(x)``: uninitialised memory of ``x``'s shape and dtype."""
    return _like("empty_like", input, None, dtype, device, requires_grad)


def from_dlpack(ext_tensor) -> Tensor:
    """As ``torch.from_dlpack``: a tensor sharing memory with any DLPack producer (a numpy
    array, a tapegrad or PyTorch cpu tensor)."""
    if isinstance(ext_tensor, Tensor):
        return ext_tensor.detach()
    try:
        array = xp.from_dlpack(ext_tensor)
    except (TypeError, BufferError, RuntimeError) as e:
        raise RuntimeError(f"from_dlpack: cannot import {type(ext_tensor).__name__}: {e}") \
            from None
    return from_numpy(array)


__all__ = ["tensor", "from_numpy", "as_tensor", "zeros", "ones", "empty", "full", "arange",
           "linspace", "eye", "zeros_like", "ones_like", "full_like", "empty_like",
           "from_dlpack", "clone"]
