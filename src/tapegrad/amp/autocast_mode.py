"""Autocast: ops run in the dtype PyTorch's CPU autocast picks for them (``torch.autocast``).

Inside ``with tapegrad.autocast("cpu"):`` an interpreter (a ``DispatchMode``) sees every op
of the thread and, by the op's registered name, casts its floating-point Tensor inputs first:

- lower precision (the region's dtype, bfloat16 by default): matmul, linear, conv, bmm,
  scaled dot-product attention ...;
- float32: prod, losses, reflection/replication padding ...;
- promote: cat and stack run in the widest floating type among their inputs.

float64 inputs are never cast, as in PyTorch. The casts are recorded ``to_dtype`` ops, so
gradients flow back to each input in its own dtype. The op itself then runs with autocast
off (PyTorch's excluded dispatch key), and so does the body of a composite decorated with
``autocast_composite`` (``F.conv2d``, ``F.mse_loss`` ...): PyTorch lists those by their aten
name, and tapegrad builds them from smaller ops that must not be cast again.

The lists are PyTorch 2.13's (``aten/src/ATen/autocast_mode.cpp``, ``AutocastCPU``),
restricted to the ops tapegrad has; ``POLICY`` is the one table. State is per thread, as in
PyTorch: a region in one thread leaves every other thread's ops alone.
"""
import functools
import threading
import warnings

from tapegrad import dtypes
from tapegrad.autograd.engine import DispatchMode
from tapegrad.ops import registry as _registry

__all__ = ["autocast", "autocast_decorator", "is_autocast_available", "custom_fwd",
           "custom_bwd"]

# PyTorch's default autocast dtype per device type (c10's autocast_dtype table)
_DEFAULT_DTYPE = {"cpu": dtypes.bfloat16, "cuda": dtypes.float16, "xpu": dtypes.float16,
                  "mps": dtypes.float16, "hpu": dtypes.bfloat16, "xla": dtypes.bfloat16,
                  "hip": dtypes.float16, "ipu": dtypes.float16, "mtia": dtypes.float16,
                  "privateuseone": dtypes.float16}
_DEVICE_TYPES = ("cpu", "cuda", "ipu", "xpu", "mkldnn", "opengl", "opencl", "ideep", "hip",
                 "ve", "fpga", "maia", "xla", "lazy", "vulkan", "mps", "meta", "hpu", "mtia",
                 "privateuseone")
_AVAILABLE = ("cpu", "cuda")  # device types whose autocast tapegrad implements


class _State(threading.local):
    """This thread's autocast state (``__init__`` runs once per thread)."""

    def __init__(self):
        self.enabled = {"cpu": False, "cuda": False}
        self.dtype = dict(_DEFAULT_DTYPE)
        self.cpu = False  # enabled["cpu"], read on every op
        self.depth = 0  # autocast modes of this thread on its interpreter stack
        self.excluded = False  # inside an autocast op or composite: nothing more is cast
        self.cache_enabled = True
        self.nesting = 0
        self.cache = {}  # id(fp32 leaf weight) -> (weight, its lower-precision cast)
        self.frames = []  # what each entered region restores on exit, innermost last


_state = _State()
# CPU autocast regions open in any thread (changed under _regions_lock on enter/exit). While it
# is 0, as in every program that never autocasts, a composite's wrapper reads no thread-local
# state: the per-call cost of autocast_composite is one global read (see docs/performance.md)
_regions = 0
_regions_lock = threading.Lock()


def _device_type(device_type):
    if device_type not in _DEVICE_TYPES:
        raise RuntimeError(f"Expected one of {', '.join(_DEVICE_TYPES)} device type at start "
                           f"of device string: {device_type}")
    return device_type


# --- PyTorch's torch.* autocast state functions ---------------------------------------------
def is_autocast_available(device_type: str) -> bool:
    """As ``torch.amp.is_autocast_available``: True for ``"cpu"`` and ``"cuda"``."""
    return _device_type(device_type) in _AVAILABLE


def is_autocast_enabled(device_type: str = None) -> bool:
    """As ``torch.is_autocast_enabled(device_type)`` (no argument: ``"cuda"``), this thread."""
    return _state.enabled.get(_device_type("cuda" if device_type is None else device_type),
                              False)


def set_autocast_enabled(device_type, enabled=None) -> None:
    """As ``torch.set_autocast_enabled(device_type, enabled)`` (or ``(enabled)`` for cuda).

    Ops are cast only inside an ``autocast`` region (see docs/differences.md)."""
    if enabled is None:
        device_type, enabled = "cuda", device_type
    st = _state
    st.enabled[_device_type(device_type)] = bool(enabled)
    st.cpu = st.enabled["cpu"]


def get_autocast_dtype(device_type: str):
    """As ``torch.get_autocast_dtype(device_type)``: bfloat16 for cpu, float16 for cuda."""
    return _state.dtype.get(_device_type(device_type), dtypes.float16)


def set_autocast_dtype(device_type: str, dtype) -> None:
    """As ``torch.set_autocast_dtype(device_type, dtype)``."""
    _state.dtype[_device_type(device_type)] = dtype


def is_autocast_cpu_enabled() -> bool:
    """Deprecated as in PyTorch: ``is_autocast_enabled("cpu")``."""
    warnings.warn("torch.is_autocast_cpu_enabled() is deprecated. Please use "
                  "torch.is_autocast_enabled('cpu') instead.", DeprecationWarning, stacklevel=2)
    return _state.enabled["cpu"]


def set_autocast_cpu_enabled(enabled: bool) -> None:
    """Deprecated as in PyTorch: ``set_autocast_enabled("cpu", enabled)``."""
    warnings.warn("torch.set_autocast_cpu_enabled(enabled) is deprecated. Please use "
                  "torch.set_autocast_enabled('cpu', enabled) instead.", DeprecationWarning,
                  stacklevel=2)
    set_autocast_enabled("cpu", enabled)


def get_autocast_cpu_dtype():
    """Deprecated as in PyTorch: ``get_autocast_dtype("cpu")``."""
    warnings.warn("torch.get_autocast_cpu_dtype() is deprecated. Please use "
                  "torch.get_autocast_dtype('cpu') instead.", DeprecationWarning, stacklevel=2)
    return _state.dtype["cpu"]


def set_autocast_cpu_dtype(dtype) -> None:
    """Deprecated as in PyTorch: ``set_autocast_dtype("cpu", dtype)``."""
    warnings.warn("torch.set_autocast_cpu_dtype(dtype) is deprecated. Please use "
                  "torch.set_autocast_dtype('cpu', dtype) instead.", DeprecationWarning,
                  stacklevel=2)
    _state.dtype["cpu"] = dtype


def is_autocast_cache_enabled() -> bool:
    """As ``torch.is_autocast_cache_enabled()``."""
    return _state.cache_enabled


def set_autocast_cache_enabled(enabled: bool) -> None:
    """As ``torch.set_autocast_cache_enabled(enabled)``."""
    _state.cache_enabled = bool(enabled)


def clear_autocast_cache() -> None:
    """As ``torch.clear_autocast_cache()``: drop this thread's cached weight casts."""
    _state.cache.clear()


def autocast_increment_nesting() -> int:
    """As ``torch.autocast_increment_nesting()``."""
    _state.nesting += 1
    return _state.nesting


def autocast_decrement_nesting() -> int:
    """As ``torch.autocast_decrement_nesting()``."""
    _state.nesting -= 1
    return _state.nesting


# --- the policies -----------------------------------------------------------------------------
LOWER, FP32, PROMOTE, KEEP = "lower_precision_fp", "fp32", "promote", "keep"


def _einsum_policy(args, kwargs):
    """torch.einsum contracts a label shared by two operands with bmm (lower precision);
    products without a shared summed label and single-operand sums stay in their dtype."""
    if args and type(args[0]) is list:  # the op: (operands,), equation=
        equation, n = kwargs.get("equation"), len(args[0])
    elif args and isinstance(args[0], str):  # the front end: (equation, *operands)
        operands = args[1:]
        if len(operands) == 1 and isinstance(operands[0], (list, tuple)):
            operands = operands[0]
        equation, n = args[0], len(operands)
    else:  # sublist form: left to the ops it runs
        return None
    lhs, _, rhs = equation.replace(" ", "").partition("->")
    terms = [t.replace("...", "") for t in lhs.split(",")]
    if "->" not in equation:
        once = [c for c in set("".join(terms)) if "".join(terms).count(c) == 1]
        rhs = "".join(sorted(once))
    shared = [c for c in set("".join(terms)) if c not in rhs and sum(c in t for t in terms) > 1]
    return LOWER if n > 1 and shared else KEEP


def _pad_policy(args, kwargs):
    """F.pad runs reflection_pad1d/2d and replication_pad1d/2d/3d, which PyTorch lists fp32."""
    pad = args[1] if len(args) > 1 else kwargs.get("pad", ())
    mode = args[2] if len(args) > 2 else kwargs.get("mode", "constant")
    if (mode == "reflect" and len(pad) in (2, 4)) or (mode == "replicate"
                                                       and len(pad) in (2, 4, 6)):
        return FP32
    return None


# Keyed by the registered op name, or by the name of a composite decorated with
# ``autocast_composite``. Composites PyTorch does not list but tapegrad builds from listed ops
# (dot from matmul, unfold from conv2d) are KEEP: their body runs without autocast, as the
# unlisted aten kernel does.
POLICY = {
    # lower_precision_fp
    "matmul": LOWER, "mm": LOWER, "bmm": LOWER, "linear": LOWER, "linear_relu": LOWER,
    "conv1d": LOWER, "conv2d": LOWER, "conv_transpose2d": LOWER,
    "scaled_dot_product_attention": LOWER,
    "einsum": _einsum_policy,
    # fp32
    "prod": FP32, "binary_cross_entropy": FP32, "nll_loss": FP32, "cross_entropy": FP32,
    "cross_entropy_index": FP32, "softmax_cross_entropy": FP32, "mse_loss": FP32,
    "l1_loss": FP32, "smooth_l1_loss": FP32, "huber_loss": FP32, "kl_div": FP32,
    "margin_ranking_loss": FP32, "hinge_embedding_loss": FP32, "soft_margin_loss": FP32,
    "cosine_embedding_loss": FP32, "triplet_margin_loss": FP32, "poisson_nll_loss": FP32,
    "binary_cross_entropy_with_logits": FP32,
    "pad": _pad_policy,
    "linalg_inv": FP32, "linalg_cholesky": FP32, "linalg_solve": FP32, "linalg_lstsq": FP32,
    "linalg_qr": FP32, "linalg_qr_r": FP32, "linalg_svd": FP32, "linalg_eigh": FP32,
    # promote
    "cat": PROMOTE, "stack": PROMOTE,
    # unlisted in PyTorch, built here from listed ops
    "dot": KEEP, "outer": KEEP, "unfold": KEEP,
}

_LOW_NP = frozenset(d.np for d in (dtypes.float16, dtypes.bfloat16, dtypes.float32))


def _eligible(t):
    """A floating-point Tensor autocast may cast (float64 never is)."""
    return isinstance(t, _registry.Tensor) and t._data.dtype in _LOW_NP


def _widest(name, tensors, st):
    """PyTorch's ``promote_type``/``prioritize``: the widest type, starting from the region's."""
    current = st.dtype["cpu"]
    for t in tensors:
        if not _eligible(t):
            continue
        nxt = t.dtype
        if current is dtypes.float32 or nxt is dtypes.float32:
            current = dtypes.float32
        elif current is not nxt:
            raise RuntimeError(f"{name}: Unexpected floating ScalarType in "
                               f"at::autocast::prioritize ({nxt} in a {st.dtype['cpu']} "
                               "autocast region)")
    return current


def _cast(t, to, st):
    if not _eligible(t) or t.dtype is to:
        return t
    if (to is st.dtype["cpu"] and st.cache_enabled and t.dtype is dtypes.float32
            and t._requires_grad and t.grad_fn is None
            and not isinstance(getattr(t, "_view", None), tuple)):
        # cache lower-precision casts of fp32 leaf weights for the region (Apex's heuristic)
        hit = st.cache.get(id(t))
        if hit is not None and hit[0] is t:
            return hit[1]
        out = _registry.REGISTRY["to_dtype"](t, dtype=to)
        st.cache[id(t)] = (t, out)
        return out
    return _registry.REGISTRY["to_dtype"](t, dtype=to)


def _flat(values):
    for v in values:
        if type(v) in (list, tuple):
            yield from v
        else:
            yield v


def _cast_all(name, policy, args, kwargs, st):
    if policy == PROMOTE:
        to = _widest(name, _flat(list(args) + list(kwargs.values())), st)
    else:
        to = st.dtype["cpu"] if policy == LOWER else dtypes.float32

    def one(v):
        if type(v) in (list, tuple):
            return type(v)(_cast(x, to, st) for x in v)
        return _cast(v, to, st)

    return [one(a) for a in args], {k: one(v) for k, v in kwargs.items()}


def _run(name, policy, fn, args, kwargs):
    """Cast ``args`` under ``policy``, then run ``fn`` with autocast off in this thread."""
    st = _state
    if policy != KEEP:
        args, kwargs = _cast_all(name, policy, args, kwargs, st)
    prev = st.excluded
    st.excluded = True
    try:
        return fn(*args, **kwargs)
    finally:
        st.excluded = prev


def _policy(name, args, kwargs):
    policy = POLICY.get(name)
    if policy is not None and not isinstance(policy, str):
        policy = policy(args, kwargs)
    return policy


class _AutocastMode(DispatchMode):
    """The interpreter an enabled region pushes on the thread's stack."""

    def interpret(self, op, args, params):
        st = _state
        if st.excluded or not st.cpu:
            return op(*args, **params)
        policy = _policy(op.name, args, params)
        if policy is None:
            return op(*args, **params)
        return _run(op.name, policy, op, args, params)


def autocast_composite(fn):
    """Give a composite built from smaller ops the autocast policy ``POLICY`` lists under its
    name (PyTorch lists the aten op; tapegrad's body must not be cast op by op)."""
    name = fn.__name__

    @functools.wraps(fn)
    def composite(*args, **kwargs):
        if not _regions:  # no autocast region in any thread: nothing to cast
            return fn(*args, **kwargs)
        st = _state
        if not st.cpu or st.excluded or not st.depth:
            return fn(*args, **kwargs)
        policy = _policy(name, args, kwargs)
        if policy is None:
            return fn(*args, **kwargs)
        return _run(name, policy, fn, args, kwargs)

    return composite


def lower_precision_region() -> bool:
    """True where an op listed lower precision would be cast now: inside an enabled CPU
    region of this thread, outside any autocast op or composite (the RNN layers ask)."""
    if not _regions:
        return False
    st = _state
    return st.cpu and not st.excluded and bool(st.depth)


def run_lower_precision(name, fn, *args):
    """Run ``fn(*args)`` as an op PyTorch lists lower precision (``mkldnn_rnn_layer``): its
    floating inputs (float64 aside) cast to the region's dtype, autocast off inside."""
    return _run(name, LOWER, fn, args, {})


def cast_lower_precision(*tensors):
    """``tensors`` cast to the region's dtype as a lower-precision op's inputs are (None,
    float64 and non-floating tensors unchanged); the casts are recorded ops."""
    st = _state
    return tuple(None if t is None else _cast(t, st.dtype["cpu"], st) for t in tensors)


# --- the context manager ----------------------------------------------------------------------
def autocast_decorator(autocast_instance, func):
    @functools.wraps(func)
    def decorate_autocast(*args, **kwargs):
        with autocast_instance:
            return func(*args, **kwargs)

    return decorate_autocast


class autocast:
    """As ``torch.autocast(device_type, dtype=None, enabled=True, cache_enabled=None)``: a
    context manager (or decorator) in which ops run in PyTorch's autocast dtypes.

    >>> with tapegrad.autocast("cpu", dtype=tapegrad.bfloat16):
    ...     loss = F.cross_entropy(model(x), y)   # linear in bfloat16, the loss in float32
    >>> loss.backward()                           # outside the region, as PyTorch advises
    """

    def __init__(self, device_type: str, dtype=None, enabled: bool = True,
                 cache_enabled: bool = None):
        if not isinstance(device_type, str):
            raise ValueError(f"Expected `device_type` of type `str`, got: `{type(device_type)}`")
        self.fast_dtype = get_autocast_dtype(device_type) if dtype is None else dtype
        self.device = device_type
        if not is_autocast_available(device_type):
            raise RuntimeError(f"User specified an unsupported autocast device_type "
                               f"'{device_type}'")
        self._cache_enabled = is_autocast_cache_enabled() if cache_enabled is None else \
            cache_enabled
        if enabled:
            from tapegrad import cuda

            if device_type == "cuda" and not cuda.is_available():
                warnings.warn("CUDA is not available or torch_xla is imported. Disabling "
                              "autocast.", stacklevel=2)
                enabled = False
            elif device_type != "cuda" and self.fast_dtype not in (dtypes.bfloat16,
                                                                   dtypes.float16):
                name = device_type.upper()
                warnings.warn(f"In {name} autocast, but the target dtype is not supported. "
                              f"Disabling autocast.\n{name} Autocast only supports dtypes of "
                              "tapegrad.bfloat16, tapegrad.float16 currently.", stacklevel=2)
                enabled = False
        self._enabled = enabled

    def __enter__(self):
        global _regions
        st = _state
        device = self.device
        # what exit restores lives in the thread's state, so one instance may be entered by
        # several threads (a decorated forward) or recursively
        frame = (st.cache_enabled, st.enabled[device], st.dtype[device], None)
        set_autocast_enabled(device, self._enabled)
        st.dtype[device] = self.fast_dtype
        autocast_increment_nesting()
        st.cache_enabled = self._cache_enabled
        if device == "cpu":
            mode = _AutocastMode()
            mode.__enter__()
            st.depth += 1
            with _regions_lock:
                _regions += 1
            frame = frame[:3] + (mode,)
        st.frames.append(frame)
        return self

    def __exit__(self, *exc):
        global _regions
        st = _state
        cache_enabled, enabled, dtype, mode = st.frames.pop()
        if mode is not None:
            st.depth -= 1
            with _regions_lock:
                _regions -= 1
            mode.__exit__(*exc)
        if autocast_decrement_nesting() == 0:
            st.cache.clear()
        set_autocast_enabled(self.device, enabled)
        st.dtype[self.device] = dtype
        st.cache_enabled = cache_enabled
        return False

    def __call__(self, func):
        return autocast_decorator(self, func)


# --- custom autograd Functions ------------------------------------------------------------------
def _cast_value(value, device_type, dtype):
    """Floating-point Tensors (not float64) in ``value`` (nested containers too) to ``dtype``."""
    if isinstance(value, _registry.Tensor):
        return value.to(dtype) if _eligible(value) else value
    if isinstance(value, (str, bytes)):
        return value
    if isinstance(value, dict):
        return {_cast_value(k, device_type, dtype): _cast_value(v, device_type, dtype)
                for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_cast_value(v, device_type, dtype) for v in value)
    return value


def custom_fwd(fwd=None, *, device_type: str, cast_inputs=None):
    """As ``torch.amp.custom_fwd``: for ``forward`` of an ``autograd.Function``; with
    ``cast_inputs``, inside an enabled region the inputs are cast and forward runs without
    autocast."""
    if not isinstance(device_type, str):
        raise ValueError(f"Expected `device_type` of type `str`, got: `{type(device_type)}`")
    if fwd is None:
        return functools.partial(custom_fwd, device_type=device_type, cast_inputs=cast_inputs)

    @functools.wraps(fwd)
    def decorate_fwd(*args, **kwargs):
        args[0]._dtype = get_autocast_dtype(device_type)
        if cast_inputs is None:
            args[0]._fwd_used_autocast = is_autocast_enabled(device_type)
            return fwd(*args, **kwargs)
        args[0]._fwd_used_autocast = False
        if is_autocast_enabled(device_type):
            with autocast(device_type=device_type, enabled=False):
                return fwd(*_cast_value(args, device_type, cast_inputs),
                           **_cast_value(kwargs, device_type, cast_inputs))
        return fwd(*args, **kwargs)

    return decorate_fwd


def custom_bwd(bwd=None, *, device_type: str):
    """As ``torch.amp.custom_bwd``: ``backward`` runs with forward's autocast state."""
    if not isinstance(device_type, str):
        raise ValueError(f"Expected `device_type` of type `str`, got: `{type(device_type)}`")
    if bwd is None:
        return functools.partial(custom_bwd, device_type=device_type)

    @functools.wraps(bwd)
    def decorate_bwd(*args, **kwargs):
        with autocast(device_type=device_type, enabled=args[0]._fwd_used_autocast,
                      dtype=args[0]._dtype):
            return bwd(*args, **kwargs)

    return decorate_bwd
