"""User-defined differentiable ops: ``autograd.Function``, as in PyTorch.

    class Exp(tapegrad.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            y = x.exp()
            ctx.save_for_backward(y)
            return y

        @staticmethod
        def backward(ctx, grad):
            (y,) = ctx.saved_tensors
            return grad * y

    y = Exp.apply(x)

How it sits on the tape: each ``apply`` records one ordinary ``Node`` whose op is a per-call
record (``_FunctionOp``, with the attributes the engine reads from a registered ``Op``) and
whose saved value is the ``ctx``. The engine calls the record's rule like any other; the
rule hands the user's ``backward`` Tensors (raw gradients are wrapped; with
``create_graph=True`` they already carry a graph, and the backward's tapegrad ops record the
gradient's graph). A Function with several outputs gives each output a small Node that packs
its gradient (``_GradPack``) for the shared Node, so the engine's one-output-per-Node
bookkeeping (gradient sums on diamonds, shape checks) is unchanged.
"""
import weakref

from tapegrad import dtypes
from tapegrad.autograd.engine import Node
from tapegrad.autograd.grad_mode import state as grad_state
from tapegrad.backend import xp


def _tensor_cls():
    from tapegrad.tensor import Tensor

    return Tensor


class FunctionCtx:
    """The ``ctx`` of ``forward``/``backward``: save tensors, read which inputs need grad."""

    def __init__(self, needs_input_grad):
        self.needs_input_grad = needs_input_grad
        self.materialize_grads = True
        self._to_save = None
        self._saved = None  # [(Tensor or None, version) or ("output", index, array, version)]
        self._non_differentiable = set()
        self._nodes = None  # weak references to the Nodes of the outputs (saved outputs)

    def save_for_backward(self, *tensors):
        """As ``ctx.save_for_backward``: tensors (or None) ``backward`` reads back, with the
        in-place check: modifying one before backward makes ``saved_tensors`` raise."""
        Tensor = _tensor_cls()
        for t in tensors:
            if t is not None and not isinstance(t, Tensor):
                raise TypeError(f"save_for_backward can only save tensors or None, got "
                                f"{type(t).__name__}")
        self._to_save = tensors

    @property
    def saved_tensors(self):
        """The tensors given to ``save_for_backward``, checked against in-place changes."""
        if self._saved is None:
            return tuple(self._to_save or ())
        Tensor = _tensor_cls()
        out = []
        for i, entry in enumerate(self._saved):
            if entry is None:
                out.append(None)
                continue
            if len(entry) == 5:  # ("output", index, data, version list, version)
                _, k, data, version_list, version = entry
                t = None
                if version_list[0] == version:
                    ref = self._nodes[k] if self._nodes else None
                    node = ref() if ref is not None else None
                    t = Tensor._make(data, grad_fn=node if grad_state.enabled else None)
                    t._version = version_list
            else:
                t, version = entry
                version_list = t._version
            if version_list[0] != version:
                raise RuntimeError(
                    "one of the variables needed for gradient computation has been modified by "
                    f"an inplace operation: saved tensor {i} of this Function, is at version "
                    f"{version_list[0]}; expected version {version} instead.")
            out.append(t)
        return tuple(out)

    def mark_non_differentiable(self, *tensors):
        """As ``ctx.mark_non_differentiable``: these outputs never require grad."""
        self._non_differentiable.update(id(t) for t in tensors)

    def set_materialize_grads(self, value: bool):
        """As ``ctx.set_materialize_grads``: False passes None (not zeros) for unused outputs."""
        self.materialize_grads = bool(value)

    def mark_dirty(self, *tensors):
        raise RuntimeError("mark_dirty: in-place autograd.Functions are not supported by "
                           "tapegrad; return a new tensor instead (see docs/differences.md)")


class _FunctionOp:
    """The per-call op record of one ``Function.apply``: what the engine reads of an Op."""

    __slots__ = ("name", "rule", "fn", "n_outputs", "out_meta", "saves", "save_inputs",
                 "save_out", "needs", "view", "differentiable", "elementwise", "float_only",
                 "fused", "flops")

    def __init__(self, fn, n_outputs, out_meta, saves):
        self.name = fn.__name__
        self.fn = fn
        self.rule = _function_rule
        self.n_outputs = n_outputs
        self.out_meta = out_meta  # [(shape, numpy dtype)] per output, for zero gradients
        self.saves = "out" if saves else "none"
        self.save_inputs = False
        self.save_out = saves  # so the engine frees the ctx after backward (unless retained)
        self.needs = self.view = self.elementwise = self.float_only = self.fused = False
        self.differentiable = True
        self.flops = 0


class _OutputOp:
    """Output ``index`` of a multi-output Function: packs its gradient for the shared Node."""

    __slots__ = ("name", "rule", "index", "n_outputs", "saves", "save_inputs", "save_out",
                 "needs", "view", "differentiable", "elementwise", "float_only", "fused",
                 "flops")

    def __init__(self, name, index, n_outputs):
        self.name = name
        self.rule = self._rule
        self.index, self.n_outputs = index, n_outputs
        self.saves = "none"
        self.save_inputs = self.save_out = self.needs = self.view = False
        self.elementwise = self.float_only = self.fused = False
        self.differentiable = True
        self.flops = 0

    def _rule(self, g, out, placeholder):
        grads = [None] * self.n_outputs
        grads[self.index] = g
        return (_GradPack(grads),)


_PACK_SHAPE = ()
_PACK_DTYPE = "function-output-gradients"  # the shared Node's stand-in dtype


class _GradPack:
    """The gradients of a multi-output Function's outputs, summed across uses like one array."""

    __slots__ = ("grads",)
    shape = _PACK_SHAPE
    dtype = _PACK_DTYPE

    def __init__(self, grads):
        self.grads = grads

    @property
    def _data(self):  # the engine reads ``g._data`` for shape checks under create_graph
        return self

    def __add__(self, other):
        return _GradPack([b if a is None else a if b is None else a + b
                          for a, b in zip(self.grads, other.grads)])


def _function_rule(g, out, ctx):
    op = ctx._op
    create_graph = grad_state.enabled
    Tensor = _tensor_cls()
    grads = g.grads if isinstance(g, _GradPack) else [g]
    wrapped = []
    for k, gk in enumerate(grads):
        if gk is None:
            if ctx.materialize_grads and op.out_meta[k] is not None:  # None: not a Tensor
                shape, dt = op.out_meta[k]
                wrapped.append(Tensor._make(xp.zeros(shape, dtype=dt)))
            else:
                wrapped.append(None)
        else:
            wrapped.append(gk if isinstance(gk, Tensor) else Tensor._make(gk))
    result = op.fn.backward(ctx, *wrapped)
    if not isinstance(result, tuple):
        result = (result,)
    inputs = ctx._input_meta
    name = f"{op.name}Backward"
    if len(result) != len(inputs):
        if len(result) < len(inputs) or any(r is not None for r in result[len(inputs):]):
            raise RuntimeError(f"function {name} returned an incorrect number of gradients "
                               f"(expected {len(inputs)}, got {len(result)})")
        result = result[:len(inputs)]
    out_grads = []
    for i, (x, gi) in enumerate(zip(inputs, result)):
        if gi is None or x is None or not x[0]:
            if gi is not None and x is None:
                raise RuntimeError(f"function {name} returned a gradient different than None "
                                   f"at position {i + 1}, but the corresponding forward input "
                                   "was not a Tensor")
            out_grads.append(None)
            continue
        if not isinstance(gi, Tensor):
            raise TypeError(f"function {name} returned a {type(gi).__name__} as gradient "
                            f"{i}; expected a Tensor or None")
        gi = _conform(gi, x, name, i)
        out_grads.append(gi if create_graph else gi._data)
    return tuple(out_grads)


def _conform(g, x, name, i):
    """Sum a broadcast gradient down to the input's shape and cast it to the input's dtype."""
    from tapegrad.ops.elementwise import to_dtype
    from tapegrad.ops.movement import sum_to

    _, shape, dtype = x
    if g.shape != shape:
        try:
            if xp.broadcast_shapes(g.shape, shape) != tuple(g.shape):
                raise ValueError
        except ValueError:
            raise RuntimeError(f"function {name} returned an invalid gradient at index {i} - "
                               f"got {list(g.shape)} but expected shape compatible with "
                               f"{list(shape)}") from None
        g = sum_to(g, shape=shape)
    if g._data.dtype != dtype:
        g = to_dtype(g, dtype=dtype)
    return g


class Function:
    """As ``torch.autograd.Function``: subclass with static ``forward(ctx, *args)`` and
    ``backward(ctx, *grads)``, call with ``MyFn.apply(*args)``.

    ``forward`` runs without recording; ``backward`` returns one gradient (or None) per
    ``forward`` argument. PyTorch's ``setup_context`` style (``forward(*args)`` plus
    ``setup_context(ctx, inputs, output)``) works too.
    """

    @staticmethod
    def forward(ctx, *args, **kwargs):
        raise NotImplementedError("You must implement the forward function for custom "
                                  "autograd.Function.")

    @staticmethod
    def backward(ctx, *grad_outputs):
        raise NotImplementedError("You must implement either the backward or vjp method for "
                                  "your custom autograd.Function to use it with backward mode "
                                  "AD.")

    vjp = backward

    @staticmethod
    def setup_context(ctx, inputs, output):
        raise NotImplementedError("setup_context is not implemented.")

    def __init__(self, *args, **kwargs):
        raise RuntimeError("autograd.Function: call MyFunction.apply(...), not MyFunction() "
                           "(forward and backward are static methods)")

    @classmethod
    def apply(cls, *args, **kwargs):
        Tensor = _tensor_cls()
        if kwargs:
            raise TypeError(f"{cls.__name__}.apply: keyword arguments are not supported by "
                            "autograd.Function.apply (as in PyTorch); pass them positionally")
        recording = grad_state.enabled
        needs = tuple(recording and isinstance(a, Tensor) and a._requires_grad for a in args)
        ctx = FunctionCtx(needs)
        separate = cls.setup_context is not Function.setup_context
        prev = grad_state.enabled
        grad_state.enabled = False
        try:
            if separate:
                output = cls.forward(*args)
                cls.setup_context(ctx, args, output)
            else:
                output = cls.forward(ctx, *args)
        finally:
            grad_state.enabled = prev
        single = not isinstance(output, tuple)
        outputs = [output] if single else list(output)
        outs = []
        for o in outputs:
            if isinstance(o, Tensor) and any(o is a for a in args):
                alias = Tensor._make(o._data)  # an input returned as-is: a new view of it
                alias._version = o._version
                if id(o) in ctx._non_differentiable:
                    ctx._non_differentiable.add(id(alias))
                o = alias
            outs.append(o)
        if any(needs):
            _record(cls, ctx, args, outs)
        else:
            ctx._saved = _snapshot_saved(ctx, args, outs)
        return outs[0] if single else tuple(outs)


def _snapshot_saved(ctx, args, outs):
    """Saved tensors with their versions; outputs are kept as data (no Node -> ctx cycle)."""
    if not ctx._to_save:
        return []
    saved = []
    for t in ctx._to_save:
        if t is None:
            saved.append(None)
            continue
        k = next((k for k, o in enumerate(outs) if o is t), None)
        if k is not None:
            saved.append(("output", k, t._data, t._version, t._version[0]))
        else:
            saved.append((t, t._version[0]))
    ctx._to_save = None
    return saved


def _record(cls, ctx, args, outs):
    Tensor = _tensor_cls()
    diff = [k for k, o in enumerate(outs)
            if isinstance(o, Tensor) and id(o) not in ctx._non_differentiable
            and dtypes.is_floating(o._data.dtype)]
    ctx._saved = _snapshot_saved(ctx, args, outs)
    if not diff:
        return
    meta = [(o._data.shape, o._data.dtype) if isinstance(o, Tensor) else None for o in outs]
    fop = _FunctionOp(cls, len(outs), meta, bool(ctx._saved))
    node = Node(fop, list(args), outs[diff[0]], {})
    node.saved = [ctx]
    node.out = node.out_version = None
    ctx._op = fop
    ctx._input_meta = tuple((a._requires_grad, a._data.shape, a._data.dtype)
                            if isinstance(a, Tensor) else None for a in args)
    if len(outs) == 1:
        outs[0].grad_fn = node
        outs[0]._requires_grad = True
        ctx._nodes = [weakref.ref(node)]
        return
    node.shape, node.dtype = _PACK_SHAPE, _PACK_DTYPE
    link = Tensor._make(xp.zeros(()), grad_fn=node)
    nodes = [None] * len(outs)
    for k in diff:
        o = outs[k]
        sub = Node(_OutputOp(cls.__name__, k, len(outs)), [link], o, {})
        o.grad_fn = sub
        o._requires_grad = True
        nodes[k] = weakref.ref(sub)
    ctx._nodes = nodes


class _DelayedErrorOp:
    """The op of a gradient computed by a ``once_differentiable`` backward under
    ``create_graph``: differentiating it again raises (PyTorch's ``DelayedError``)."""

    __slots__ = ("name", "rule", "saves", "save_inputs", "save_out", "needs", "view",
                 "differentiable", "elementwise", "float_only", "fused", "flops")

    def __init__(self):
        self.name = "DelayedError"
        self.rule = self._rule
        self.saves = "none"
        self.save_inputs = self.save_out = self.needs = self.view = False
        self.elementwise = self.float_only = self.fused = False
        self.differentiable = True
        self.flops = 0

    @staticmethod
    def _rule(g, out, *inputs):
        raise RuntimeError("trying to differentiate twice a function that was marked with "
                           "@once_differentiable")


_DELAYED_ERROR = _DelayedErrorOp()


def once_differentiable(backward):
    """As ``torch.autograd.function.once_differentiable``: the decorated ``backward`` runs
    without recording; under ``create_graph`` its gradients carry a node that raises if they
    are differentiated again."""
    import functools

    @functools.wraps(backward)
    def wrapper(ctx, *grads):
        recording = grad_state.enabled  # the engine sets grad mode to create_graph
        grad_state.enabled = False
        try:
            result = backward(ctx, *grads)
        finally:
            grad_state.enabled = recording
        Tensor = _tensor_cls()
        links = [g for g in grads if isinstance(g, Tensor) and g._requires_grad]
        if not recording or not links:
            return result
        single = not isinstance(result, tuple)
        out = []
        for r in ((result,) if single else result):
            if isinstance(r, Tensor):
                r = Tensor._make(r._data)
                r.grad_fn = Node(_DELAYED_ERROR, links, r, {})
                r._requires_grad = True
            out.append(r)
        return out[0] if single else tuple(out)

    return wrapper


__all__ = ["Function", "FunctionCtx", "once_differentiable"]
