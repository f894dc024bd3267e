"""The op record, the ``@op`` decorator and dispatch: how an op call becomes a tape entry.

An op is a forward over backend arrays plus a gradient rule right under it::

    @op(flops=1, elementwise=True)
    def mul(a, b):
        return a * b

    @mul.grad
    def _(g, out, a, b):
        return g * b, g * a

Calling ``mul`` on Tensors promotes dtypes, broadcasts inputs that need grad through the
``broadcast_to`` op (the only un-broadcasting rule), runs the forward and, in grad mode,
records a Node. Calling it on raw arrays just runs the forward: that is how gradient rules
run without recording when ``create_graph`` is off, and the same rule, given Tensors,
records the graph of the gradient when it is on.
"""
from tapegrad import dtypes
from tapegrad.autograd.grad_mode import state as grad_state
from tapegrad.autograd.engine import Node, Meta, WATCH, watchers
from tapegrad.backend import xp, DEVICE_TYPES, mixed_device_error
from tapegrad.dtypes import FLOAT_NP
from types import MethodType
import inspect

ndarray = xp.ndarray

REGISTRY = {}  # name -> Op: read by the profiler and the compiler
Tensor = None  # set by tapegrad.tensor (breaks the import cycle)
make = None  # Tensor._make (set by tapegrad.tensor): dispatch's binding of the no-copy wrap
view_of = None  # tapegrad.inplace.view_of: wrap a view op's output (base, chain)

_SAVES = ("inputs", "out", "both", "none")


class Op:
    """One registered op: forward, gradient rule and the metadata tools read."""

    __slots__ = ("name", "forward", "rule", "flops", "saves", "save_inputs", "save_out",
                 "elementwise", "float_only", "differentiable", "view", "fused", "needs",
                 "keep", "cost_rule", "pointwise", "linear", "jvp_rule", "batch_rule",
                 "check", "lowering", "unlowered", "rule_traces", "__wrapped__")

    def __init__(self, forward, name, flops, saves, elementwise, float_only, differentiable,
                 view, fused, needs, uses=None, pointwise=False, linear=False, check=False):
        if saves not in _SAVES:
            raise ValueError(f"op {forward.__name__}: saves must be one of {_SAVES}")
        self.name = name or forward.__name__
        self.forward = forward
        self.rule = None
        self.rule_traces = False  # the rule is audited to trace as ops (``grad(traces=True)``)
        self.flops = flops  # per output element; the roofline's numerator
        self.saves = saves
        self.save_inputs = saves in ("inputs", "both")
        self.save_out = saves in ("out", "both")
        self.elementwise = elementwise
        self.float_only = float_only
        self.differentiable = differentiable
        self.view = view
        self.fused = fused
        self.needs = needs  # the rule takes needs=(bool, ...) to skip unneeded inputs
        # uses[i]: the inputs input i's gradient reads. From it, keep[mask] says which inputs
        # a Node saves when the inputs in bitmask ``mask`` want a gradient (None: all)
        self.keep = None
        if uses is not None:
            if not needs:
                raise ValueError(f"op {self.name}: uses= needs needs=True (the rule must skip "
                                 "the gradients whose inputs were not saved)")
            n = len(uses)
            self.keep = [tuple(any(m >> j & 1 and i in uses[j] for j in range(n))
                               for i in range(n)) for m in range(1 << n)]
        self.cost_rule = None  # (arrays, out, params) -> (flops, read, written); see cost()
        # forward mode and vmap (tapegrad.func): pointwise ops get a JVP derived from their
        # gradient rule and a broadcasting batch rule, linear ops jvp = op(tangents)
        self.pointwise = pointwise
        self.linear = linear
        self.jvp_rule = None
        self.batch_rule = None
        # a run-time check of its input's values (raises on bad ones): a compiled graph keeps
        # its node even when nothing reads its result, as eager raises whatever follows
        self.check = check
        # the compiler's fused loop: how one element is computed (``lower``), or why a
        # pointwise op has no such form (``unlowered``: it runs as its own node)
        self.lowering = None
        self.unlowered = None
        self.__wrapped__ = forward

    @property
    def __doc__(self):
        return self.forward.__doc__

    def grad(self, rule=None, *, traces=False):
        """Register the gradient rule ``rule(g, out, *inputs, **params) -> grads``
        (``@x.grad``, or ``@x.grad(traces=True)``). ``traces``: the rule is audited to be
        made of ops over its inputs, shapes and params only, so the compiler's tracer records
        it as graph nodes; otherwise a compiled graph calls it as one opaque ``vjp`` node."""
        if rule is None:
            return lambda r: self.grad(r, traces=traces)
        self.rule = rule
        self.rule_traces = traces
        return rule

    def jvp(self, rule):
        """Register the forward-mode rule ``rule(tangents, out, *inputs, **params) -> tangent``
        (``tangents[i]`` is None where input i has none); read by ``tapegrad.func``."""
        self.jvp_rule = rule
        return rule

    def batch(self, rule):
        """Register the vmap rule ``rule(args, bdims, **params) -> (out, out_bdim)``: ``args``
        the physical inputs, ``bdims[i]`` the batch dim of input i (None: unbatched)."""
        self.batch_rule = rule
        return rule

    def costs(self, rule):
        """Register the op's cost rule ``rule(arrays, out, params) -> (flops, bytes_read,
        bytes_written)``, for ops whose FLOPs are not ``flops`` per output element."""
        self.cost_rule = rule
        return rule

    def lower(self, scalar, **facts):
        """Register the op's scalar form for the compiler's fused loops (``Lowering``: the
        source of one element and the facts the passes read). Returns ``scalar``, so a
        callable form can be registered as a decorator (``@gelu.lower``)."""
        low = self.lowering = Lowering(self.name, scalar, **facts)
        if low.params:  # the template's params take the forward's defaults when not passed
            sig = inspect.signature(self.forward).parameters
            missing = [k for k in low.params if k not in sig]
            if missing:
                raise ValueError(f"op {self.name}: lowering params {missing} are not "
                                 "parameters of its forward")
            low.defaults = tuple(sig[k].default for k in low.params)
        self.unlowered = None
        return scalar

    def not_lowered(self, reason):
        """Record why this pointwise op has no scalar form: the compiler runs it as its own
        node (eager's forward), never inside a fused loop."""
        self.lowering = None
        self.unlowered = reason

    def cost(self, arrays, out, params=None):
        """``(flops, bytes_read, bytes_written)`` of one call: the numbers the profiler, the
        roofline and the compiler read.

        ``arrays``: the forward's positional arguments (arrays, or anything with ``shape``
        and ``dtype`` such as a ``Meta``; a list for variadic ops; Python scalars count 0
        bytes); ``out``: its output (or a tuple of outputs). A view costs nothing. Otherwise,
        unless a cost rule is registered (contractions, reductions), FLOPs are ``flops`` per
        output element; bytes read are each input's distinct bytes (a broadcast input's stride-0
        dims are read once), bytes written the output's.
        """
        if self.cost_rule is not None:
            return self.cost_rule(arrays, out, params or {})
        if self.view:
            return 0, 0, 0
        return self.flops * numel(out), read_bytes(arrays), written_bytes(out)

    def __repr__(self):
        return f"<op {self.name}>"

    def __call__(self, *args, **params):
        for a in args:
            if isinstance(a, Tensor):
                return dispatch(self, args, params)
            if type(a) is list:  # variadic ops (cat, stack, einsum) take a list of inputs
                for t in a:
                    if isinstance(t, Tensor):
                        return dispatch(self, args, params)
        return self.forward(*args, **params)

    def __get__(self, obj, objtype=None):
        # an op stored on a class (Tensor.__mul__ = mul) binds like a function
        return self if obj is None else MethodType(self, obj)


class Lowering:
    """How the compiler's fused loop computes one element of a pointwise op (``Op.lower``),
    written as numba source over scalars, and the facts the fusion passes read. Only a form
    that rounds as the op's eager forward does belongs here: compiled must equal eager bit
    for bit (the C-library calls of ``libm`` are the one probed exception).

    scalar: a template, ``{0}``, ``{1}``... the operands' scalar expressions, ``{dt}`` the
    result's numpy type (``np.float32``: ``{dt}(0.5)`` a constant of it) and ``{name}`` each
    numeric param in ``params`` as a constant of the result's dtype; or a callable
    ``scalar(ctx, *operands, **params) -> source`` for forms that need the kernel's helpers
    (``ctx.dt``, ``ctx.const(v)``, ``ctx.erf(...)``, ``ctx.libm(...)``: compiler/kernels.py).
    ufunc: ``(name, *constants)`` when the forward is exactly ``np.<name>(*operands,
    *constants)`` on float arrays of the result's dtype: numpy's fallback writes it into
    buffers it owns (``out=``), and numpy computes it before the kernel where the loop's
    C-library call would round otherwise (``libm``).
    libm: the numpy functions the form calls whose numba versions are the C library's: the
    loop calls them only where a one-time probe per dtype finds them equal to numpy's ufuncs.
    operands: the dtypes of the array operands: "out" (the result's; the default), "same"
    (one dtype, the result's may differ: comparisons), "any", or one entry per operand
    ("bool", "out" or "any"). kinds: the dtype kinds (numpy's ``kind``) the form is exact
    for, of the operands and the result. params: the numeric params the template reads (any other
    param keeps the node out of a loop). accepts: ``accepts(node) -> bool`` for a form
    exact only for some calls. alone: a one-node kernel beats eager's call (erf's loop).
    """

    __slots__ = ("name", "scalar", "ufunc", "libm", "operands", "kinds", "params", "defaults",
                 "accepts", "alone")

    def __init__(self, name, scalar, ufunc=None, libm=(), operands="out", kinds="f",
                 params=(), accepts=None, alone=False):
        if not (isinstance(scalar, str) or callable(scalar)):
            raise TypeError(f"op {name}: a lowering's scalar form is a template string or a "
                            f"callable, got {type(scalar).__name__}")
        self.name = name
        self.scalar = scalar
        self.ufunc = tuple(ufunc) if ufunc is not None else None
        self.libm = tuple(libm)
        self.operands = operands
        self.kinds = kinds
        self.params = tuple(params)
        self.defaults = ()
        self.accepts = accepts
        self.alone = alone

    def __repr__(self):
        form = self.scalar if isinstance(self.scalar, str) else self.scalar.__name__
        return f"<lowering of {self.name}: {form}>"


def numel(a):
    """Elements of an array, of a shape-and-dtype stand-in, or of a tuple of arrays."""
    if isinstance(a, (tuple, list)):
        return sum(numel(x) for x in a)
    shape = getattr(a, "shape", None)
    if shape is None:
        return 0
    n = 1
    for d in shape:
        n *= d
    return n


def read_bytes(arrays):
    """Distinct bytes of the array arguments: dims of stride 0 (a broadcast) count once."""
    total = 0
    for a in arrays:
        if isinstance(a, (tuple, list)):
            total += read_bytes(a)
            continue
        shape = getattr(a, "shape", None)
        if shape is None:
            continue
        strides = getattr(a, "strides", None) or (1,) * len(shape)
        n = 1
        for d, st in zip(shape, strides):
            if st != 0:
                n *= d
        total += n * a.dtype.itemsize
    return total


def written_bytes(out):
    if isinstance(out, (tuple, list)):
        return sum(written_bytes(o) for o in out)
    return numel(out) * out.dtype.itemsize if hasattr(out, "dtype") else 0


def contraction_cost(flops):
    """A cost rule whose FLOPs are ``flops(arrays, out)`` (a multiply-add counts 2, as in
    ``torch.utils.flop_counter``; bias adds and attention's softmax are not counted, as there)."""
    return lambda arrays, out, params: (flops(arrays, out), read_bytes(arrays),
                                        written_bytes(out))


def per_input_element(o):
    """Give ``o`` the cost of a reduction or scan: ``o.flops`` per element of its input."""
    return o.costs(lambda arrays, out, params: (
        o.flops * numel(arrays[0]), read_bytes(arrays), written_bytes(out)))


def op(flops=0, saves="inputs", elementwise=False, float_only=False, differentiable=True,
       view=False, fused=False, needs=False, name=None, uses=None, pointwise=False,
       linear=False, check=False):
    """Register a forward function as an op (see the module docstring).

    flops: per output element (profiler, roofline). saves: what the rule reads besides g —
    "inputs", "out", "both" or "none" (unsaved inputs are seen as shape/dtype only).
    elementwise: promote and broadcast inputs. float_only: integer inputs become the
    default float dtype. view: the output shares the input's storage (and version counter).
    fused: a composite with its own rule. needs: the rule takes ``needs`` (which inputs
    want a gradient). name: the registered name, when the Python name must differ.
    uses: per input, the inputs its gradient reads (e.g. mul: ``((1,), (0,))``): a Node
    then saves only what the wanted gradients read, as PyTorch does (less memory, and an
    in-place change to an unsaved input is no error).
    pointwise: each output element depends only on the same element of each (broadcast)
    input, so forward mode and vmap derive the op's JVP and batch rule (``tapegrad.func``).
    linear: the op is linear in its tensor inputs jointly (jvp = op(tangents)).
    check: a run-time check (returns its input, raises on bad values): its node stays in a
    compiled graph even when nothing reads its result.
    """

    def register(forward):
        o = Op(forward, name, flops, saves, elementwise, float_only, differentiable, view, fused,
               needs, uses, pointwise, linear, check)
        if o.name in REGISTRY:
            raise ValueError(f"op {o.name} is registered twice")
        REGISTRY[o.name] = o
        return o

    return register


def _broadcast_error(name, args):
    shapes = " and ".join(str(tuple(a.shape)) for a in args if isinstance(a, Tensor))
    return RuntimeError(f"{name}: shapes {shapes} cannot be broadcast together")


def _prepare_elementwise(o, args):
    """Promote to the result dtype and broadcast the inputs that need grad.

    Returns the operands (Tensors, or Python scalars left weak, as numpy 2 keeps them).
    """
    args = [a if isinstance(a, (Tensor, int, float, bool)) else Tensor._from_data(a)
            for a in args]
    dt = dtypes.result_type(*args)
    if o.float_only and dt.category != dtypes.FLOAT:
        dt = dtypes.get_default_dtype()
    shapes = [a._data.shape for a in args if isinstance(a, Tensor)]
    out_shape = shapes[0]
    for s in shapes[1:]:
        if s != out_shape:
            try:
                out_shape = xp.broadcast_shapes(*shapes)
            except ValueError:
                raise _broadcast_error(o.name, args) from None
            break
    to_dtype, broadcast_to = REGISTRY["to_dtype"], REGISTRY["broadcast_to"]
    if dt is dtypes.bfloat16:  # numpy promotes a bare Python float with bfloat16 to float32
        args = [xp.asarray(a, dt.np) if isinstance(a, float) else a for a in args]
    prepared = []
    for a in args:
        if isinstance(a, Tensor):
            if a._data.dtype is not dt.np:
                a = to_dtype(a, dtype=dt)
            if a._data.shape != out_shape and a._requires_grad and grad_state.enabled:
                a = broadcast_to(a, shape=out_shape)
        prepared.append(a)
    return prepared


def dispatch(o, args, params):
    """Run op ``o`` on Tensors and, in grad mode, record it on the tape."""
    if WATCH and not grad_state.watching:
        return _watched(o, args, params)
    if o.elementwise:
        if len(args) == 2:
            a, b = args
            if not (isinstance(b, Tensor) and isinstance(a, Tensor)
                    and a._data.dtype is b._data.dtype and a._data.shape == b._data.shape
                    and not (o.float_only and a._data.dtype.kind in "biu")):
                args = _prepare_elementwise(o, args)
        else:
            args = _prepare_elementwise(o, args)
    first = args[0]
    if type(first) is list:  # variadic: one list of tensors
        args = first
        arrays = ([t._data for t in args],)
    elif len(args) == 1:  # dispatch is only reached with a Tensor among the args
        arrays = (first._data,)
    else:
        arrays = [a._data if isinstance(a, Tensor) else a for a in args]
    try:
        data = o.forward(*arrays, **params) if params else o.forward(*arrays)
    except (ValueError, IndexError, TypeError) as e:
        if o.check:  # a check's error is its message, raised as eager raises it
            raise
        if DEVICE_TYPES:  # a device backend is in use: tensors on two devices fail here
            err = mixed_device_error(o.name, [a for a in args if isinstance(a, Tensor)])
            if err is not None:
                raise err from None
        shapes = ", ".join(f"{tuple(a.shape)} {a.dtype}" for a in args if isinstance(a, Tensor))
        raise RuntimeError(f"{o.name}: {e} (inputs: {shapes})") from None
    if type(data) is not ndarray and type(data) not in DEVICE_TYPES:
        # numpy reductions to 0-d give scalars: keep an array (device arrays stay as they are)
        data = xp.asarray(data)
    if o.view:  # shares args[0]'s storage and version; knows its base and how to replay
        out = view_of(args[0], data, o, params)
    else:
        out = make(data)
    if grad_state.enabled and o.differentiable:
        for a in args:
            if isinstance(a, Tensor) and a._requires_grad:
                if data.dtype in FLOAT_NP:
                    out._requires_grad = True
                    out.grad_fn = Node(o, args, out, params)
                break
    return out


def _watched(o, args, params):
    """Dispatch through this thread's innermost DispatchMode, if any; else with this
    thread's watchers told. Ops dispatched inside a watched op are not watched: the thread's
    ``watching`` flag sends them past the check in ``dispatch``."""
    st = grad_state
    modes = st.modes
    if modes:  # the innermost mode interprets the op, itself off the stack meanwhile
        st.modes = modes[:-1]
        try:
            return modes[-1].interpret(o, args, params)
        finally:
            st.modes = modes
    mine = watchers()
    st.watching = True
    try:
        for w in mine:
            w.before_op(o)
        out = dispatch(o, args, params)
    finally:
        st.watching = False
    for w in mine:
        w.after_op(o, args, out)
    return out


# re-exported for ops modules
__all__ = ["op", "Op", "Lowering", "REGISTRY", "dispatch", "xp", "Meta", "numel", "read_bytes",
           "written_bytes", "per_input_element"]
