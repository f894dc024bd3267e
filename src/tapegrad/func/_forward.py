"""Forward mode: a ``DispatchMode`` that carries a tangent beside each primal.

A ``ForwardLevel`` sees every op call on Tensors in its thread. It runs the op below itself
(the next mode, or eagerly, recorded on the tape), then computes the output's tangent from
the inputs' tangents with the op's JVP rule, again as ops below itself: so tangents are
differentiable by the tape (grad of jvp), and a level above or below (another jvp, vmap)
sees the tangent computation as ordinary ops. The rule is, in order:

- ``op.jvp_rule`` (``@mul.jvp``), written beside the op's forward and gradient rule;
- derived for ``linear`` ops: ``op(tangents)`` (PyTorch's ``auto_linear``);
- derived for ``pointwise`` ops from the gradient rule: the Jacobian is diagonal, so
  ``sum_i rule(g=t_i)[i]`` is the JVP (PyTorch's ``auto_element_wise``);
- otherwise, as a last resort, the transpose of the (linear in g) gradient rule, by reverse
  mode over it, with a warning naming the op (once per op). ``fallback_ops()`` lists the ops
  that would take this path: none of the registered ops does (an op registered later without
  a JVP rule, a custom one, still works this way).

When nothing could see the tangent computation as ops (no mode below this level, no op
watcher) and the tape could not record it (no input tangent or primal requires grad, or
only through graphs recorded inside a ``func.jvp`` level, which never reach a tangent), the
rule runs on the backend arrays instead, right after the primal: no Tensor, dispatch or
mode per tangent op (``_array_jvp``; the same rules, through the ops' forwards).

Tangents are kept per level by the identity of the primal's backend array, so a Tensor
re-wrapping the same array (a saved output in a gradient rule, ``detach()``) keeps its
tangent; a view is a new array and gets its own.
"""
from tapegrad.autograd.engine import WATCH, DispatchMode, Meta, _next_seq
from tapegrad.autograd.grad_mode import state as grad_state
from tapegrad.dtypes import FLOAT_NP
from tapegrad.ops import registry
from tapegrad.ops.registry import REGISTRY, ndarray

Tensor = None  # tapegrad.tensor.Tensor, set lazily (import cycle)


def _tensor_cls():
    global Tensor
    if Tensor is None:
        from tapegrad.tensor import Tensor as T

        Tensor = T
    return Tensor


class ForwardLevel(DispatchMode):
    """One forward-mode level (``forward_ad.dual_level``, one ``func.jvp`` call)."""

    def __init__(self, private=False):
        _tensor_cls()
        self.tangents = {}  # id(primal array) -> (primal array, tangent Tensor)
        # private (func.jvp): no tangent is seen before the level returns, so a graph that a
        # transform inside records (grad's tape in jvp(grad(f))) is never asked for a
        # tangent's gradient. ``seal()`` marks where "inside" starts; ``outer`` turns True for
        # good once an op reads a requiring-grad tensor from outside (a closure, a new leaf)
        self.private = private
        self.entry_seq = -1
        self.outer = not private

    def seal(self):
        """Nodes recorded from now on are inside this (private) level."""
        self.entry_seq = _next_seq()

    def _inner(self, a):
        """Is requiring-grad ``a`` from inside this private level? A leaf on a tangent-carrying
        array (grad's handle on a dual), or a registered op's output recorded since ``seal``
        (by induction over the ops this level saw; anything else: outside, for good)."""
        if self.outer:
            return False
        n = a.grad_fn
        if n is None:
            e = self.tangents.get(id(a._data))
            if e is not None and e[0] is a._data:
                return True
        elif n.seq > self.entry_seq and REGISTRY.get(getattr(n.op, "name", None)) is n.op:
            return True
        self.outer = True
        return False

    def _raw(self, flat, tangents):
        """May this op's tangent be computed on backend arrays, unrecorded? Asked only with no
        mode below (another level, vmap or the compiler's tracer must see the tangent ops) and
        no watcher: when the tape could not record it anyway: grad mode off, or no input
        tangent requires grad and no primal input does (inner ones of a private level aside)."""
        if not grad_state.enabled:
            return True
        for t in tangents:
            if t is not None and t._requires_grad:
                return False
        for a in flat:
            if isinstance(a, Tensor) and a._requires_grad and not self._inner(a):
                return False
        return True

    def tangent(self, t):
        if not isinstance(t, Tensor):
            return None
        e = self.tangents.get(id(t._data))
        if e is None or e[0] is not t._data:
            return None
        if e[2][0] != e[3]:
            return self._refreshed(t)
        return e[1]

    def _refreshed(self, t):
        """The tangent of ``t`` after an in-place write to its storage since it was set: a
        view's is its base's tangent through the view's chain (as PyTorch's views of the
        base's tangent); anything else was written outside the in-place machinery: raise."""
        view = getattr(t, "_view", None)
        if type(view) is not tuple:
            _modified_in_place(t)
        base, chain, _ = view
        bt = self.tangent(base)
        if bt is None:
            del self.tangents[id(t._data)]
            return None
        from tapegrad.ops.movement import replay_view

        tangent = self.below(replay_view, bt, chain)
        self.set_tangent(t, tangent)
        return tangent

    def set_tangent(self, t, tangent):
        # the version counter (shared with views) read now: an in-place write to the primal
        # afterwards bumps it, and reading the stale tangent then raises
        v = t._version
        self.tangents[id(t._data)] = (t._data, tangent, v, v[0])

    def below(self, fn, *args, **kwargs):
        """Run ``fn`` with this level off the stack (its ops get no tangent here)."""
        st = grad_state
        modes = st.modes
        st.modes = [m for m in modes if m is not self]
        try:
            return fn(*args, **kwargs)
        finally:
            st.modes = modes

    def _tangents(self, flat):
        """``([self.tangent(a) for a in flat], taped)``, the list None when no input has a
        tangent; ``taped``: in grad mode, whether an input or a tangent requires grad (only
        then can the tape see this op's tangent: ``_raw`` is asked)."""
        found = None
        taped = False
        enabled = grad_state.enabled
        get = self.tangents.get
        for i, a in enumerate(flat):
            if isinstance(a, Tensor):
                if enabled and a._requires_grad:
                    taped = True
                e = get(id(a._data))
                if e is not None and e[0] is a._data:
                    t = e[1] if e[2][0] == e[3] else self._refreshed(a)
                    if t is not None:
                        if found is None:
                            found = [None] * len(flat)
                        found[i] = t
                        if enabled and t._requires_grad:
                            taped = True
        return found, taped

    def interpret(self, op, args, params):
        listed = bool(args) and type(args[0]) is list
        flat = args[0] if listed else args
        tangents, taped = self._tangents(flat)
        # no mode below, no watcher (WATCH holding this level alone is the common case)
        alone = not grad_state.modes and (
            (len(WATCH) == 1 and WATCH[0][1] is self) or not _watched())
        if tangents is None or not op.differentiable:
            if taped and not self.outer:
                for a in flat:  # its output counts as inside only if its inputs do
                    if isinstance(a, Tensor) and a._requires_grad and not self._inner(a):
                        break
            return _eager(op, args, params) if alone else op(*args, **params)
        if op.elementwise and not listed and not (
                len(flat) == 2 and isinstance(flat[0], Tensor) and isinstance(flat[1], Tensor)
                and flat[0]._data.dtype is flat[1]._data.dtype
                and flat[0]._data.shape == flat[1]._data.shape
                and not (op.float_only and flat[0]._data.dtype.kind in "biu")):
            # promote and broadcast here, as dispatch would below: a gradient rule reads the
            # broadcast inputs its Node saved, and they must carry tangents at this level
            st = grad_state
            modes = st.modes
            st.modes = modes + [self]
            try:
                args = flat = registry._prepare_elementwise(op, list(flat))
            finally:
                st.modes = modes
            tangents = [self.tangent(a) for a in flat]
        out = _eager(op, args, params) if alone else op(*args, **params)
        if not isinstance(out, Tensor):
            return out
        od = out._data
        if od.dtype not in FLOAT_NP:
            return out
        if alone and od.dtype in _RAW_DTYPES and (not taped or self._raw(flat, tangents)):
            t = _array_jvp(op, od, flat, tangents, params, listed)
            if t is not _ON_TENSORS:
                if t is not None:
                    if type(t) is not ndarray or t.dtype is not od.dtype or t.shape != od.shape:
                        t = _fit_array(t, od, op)
                    self.set_tangent(out, Tensor._make(t))
                return out
        t = jvp_of(op, out, flat, tangents, params, listed)
        if t is not None:
            self.set_tangent(out, _fit(t, out, op))
        return out


# --- in-place ops (called by tapegrad.inplace while a mode is open) ------------------------
def _levels():
    return [m for m in grad_state.modes if isinstance(m, ForwardLevel)]


def carries_tangent(t, operands=()):
    """Whether ``t`` or a Tensor among ``operands`` has a tangent at an open forward level:
    an in-place op on ``t`` must then go through the out-of-place path, which computes one."""
    for level in _levels():
        if level.tangent(t) is not None:
            return True
        for o in operands:
            if isinstance(o, Tensor) and level.tangent(o) is not None:
                return True
    return False


def carry_tangent(src, dst):
    """After an in-place op: ``dst`` (written, its version bumped) takes ``src``'s tangent
    (none: ``dst`` has none now); before it: the snapshot ``dst`` of ``src`` takes it."""
    for level in _levels():
        tangent = level.tangent(src)
        if tangent is not None:
            level.set_tangent(dst, tangent)
        else:
            level.tangents.pop(id(dst._data), None)


def restamp(base):
    """``base``'s tangent was set by the in-place op's copy_slices before the version bump:
    mark it current (its views' tangents refresh from it when next read)."""
    for level in _levels():
        e = level.tangents.get(id(base._data))
        if e is not None and e[0] is base._data:
            level.set_tangent(base, e[1])


def _modified_in_place(t):
    raise RuntimeError(
        f"forward mode: a tensor of shape {tuple(t.shape)} that carries a tangent was modified "
        "in place (an in-place op on it, on its base or on a view of it) after its tangent was "
        "computed; tapegrad's forward mode does not differentiate in-place ops (its tangent "
        "would be stale): use the out-of-place form (y = y * x rather than y.mul_(x))")


def _fit(t, out, op):
    if not isinstance(t, Tensor):
        t = Tensor._make(registry.xp.asarray(t))
    if t._data.dtype != out._data.dtype:
        t = REGISTRY["to_dtype"](t, dtype=out.dtype)
    if t._data.shape != out._data.shape:
        try:
            t = REGISTRY["broadcast_to"](t, shape=out._data.shape)
        except RuntimeError:
            raise RuntimeError(f"{op.name}: its JVP rule returned a tangent of shape "
                               f"{tuple(t.shape)} for an output of shape "
                               f"{tuple(out.shape)}") from None
    return t


def _watched():
    """Is an op watcher (checkpointing, anomaly mode, the memory tracker) open anywhere?"""
    for _, w in WATCH:
        if not isinstance(w, DispatchMode):
            return True
    return False


def aliases(tensors):
    """``alias(t)`` of each of ``tensors`` (views: the duals a level gives tangents), run by
    the mode below (call it through ``level.below``)."""
    alias = REGISTRY["alias"]
    if grad_state.modes or _watched():
        return [alias(t) for t in tensors]
    return [_eager(alias, (t,), {}) for t in tensors]


def _eager(op, args, params):
    """``op(*args, **params)`` run eagerly (recorded on the tape), with no mode below and no
    watcher: straight to dispatch, as ``registry._watched`` would after finding neither."""
    st = grad_state
    if st.watching:
        return op(*args, **params)
    st.watching = True
    try:
        return registry.dispatch(op, args, params)
    finally:
        st.watching = False


# --- tangents on backend arrays -------------------------------------------------------------
# When nothing can record or watch the tangent computation (ForwardLevel._raw), the JVP rule
# runs on the arrays right after the primal: the same rule, through the ops' forwards (an op
# called on arrays is its forward), with no Tensor, dispatch or mode per tangent op. Float16
# and bfloat16 keep the Tensor path (numpy promotes their products with a Python float apart
# from tapegrad's promotion). Derived rules (linear, pointwise) are built from forwards and
# gradient rules, which run on arrays by design; a hand-written JVP rule runs on arrays only
# when listed in ARRAY_RULES (read to call only ops and array-safe operators).
_RAW_DTYPES = frozenset(d for d in FLOAT_NP if d.itemsize >= 4 and d.kind == "f")
_ON_TENSORS = object()
ARRAY_RULES = frozenset((
    "linear", "linear_relu", "matmul", "einsum", "softmax", "log_softmax",
    "softmax_cross_entropy", "cross_entropy_index", "cross_entropy_index_backward",
    "nll_loss", "layer_norm", "batch_norm", "embedding", "l2_norm", "var", "std",
    "logsumexp", "constant_pad_nd", "conv2d", "conv2d_input", "conv2d_weight",
    "max", "min", "amax", "amin", "max_dim", "min_dim", "take_along_reduce", "prod", "norm",
    "binary_cross_entropy", "scaled_dot_product_attention"))


def _array_jvp(op, od, flat, tangents, params, listed):
    """``jvp_of`` on backend arrays: the output's tangent (an array, a scalar or None) from
    the output array ``od``, the inputs and their tangent Tensors; ``_ON_TENSORS`` when the
    op's rule must run on Tensors."""
    ts = [None if t is None else t._data for t in tangents]
    xs = [a._data if isinstance(a, Tensor) else a for a in flat]
    if op.jvp_rule is not None:
        if op.name not in ARRAY_RULES:
            return _ON_TENSORS
        return op.jvp_rule(ts, od, *xs, **params)
    if op.linear:
        targs = []
        for a, x, t in zip(flat, xs, ts):
            if t is not None:
                targs.append(t)
            elif isinstance(a, Tensor):
                targs.append(registry.xp.zeros_like(x) if x.dtype in FLOAT_NP else x)
            elif isinstance(a, (int, float)) and not isinstance(a, bool) and op.elementwise:
                targs.append(0)
            else:
                targs.append(a)
        return op.forward(targs, **params) if listed else op.forward(*targs, **params)
    if op.pointwise:
        if op.rule is None:
            return None
        shape = od.shape
        if len(flat) == 1:  # unary (relu, exp, ...): its one input carries the tangent
            x = xs[0]
            if op.elementwise and x.shape != shape:
                x = _broadcast_to(x, shape=shape)
            return _call_rule(op, _fit_array(ts[0], od, op), od if op.save_out else None,
                              [x if op.save_inputs else Meta(x)], params,
                              op.needs and [True])[0]
        inputs = []
        for a, x in zip(flat, xs):
            if isinstance(a, Tensor):
                if op.elementwise and x.shape != shape:
                    x = _broadcast_to(x, shape=shape)
                if not op.save_inputs:
                    x = Meta(x)
            inputs.append(x)
        return _rule_tangents(op, ts, _fit_array, od, od if op.save_out else None, inputs,
                              params)
    return _ON_TENSORS


def _broadcast_to(a, shape):
    return REGISTRY["broadcast_to"].forward(a, shape=shape)


def _fit_array(t, od, op):
    """``_fit`` on arrays: the tangent as an array of the output's dtype and shape."""
    if isinstance(t, Tensor):  # a rule that made a Tensor of its own (no graph: no input had)
        t = t._data
    elif type(t) is not registry.xp.ndarray:
        t = registry.xp.asarray(t)
    if t.dtype != od.dtype:
        t = REGISTRY["to_dtype"].forward(t, dtype=od.dtype)
    if t.shape != od.shape:
        try:
            t = _broadcast_to(t, shape=od.shape)
        except ValueError:
            raise RuntimeError(f"{op.name}: its JVP rule returned a tangent of shape "
                               f"{tuple(t.shape)} for an output of shape "
                               f"{tuple(od.shape)}") from None
    return t


def _zeros_like(a):
    from tapegrad.creation import zeros_like

    return zeros_like(a)


def jvp_of(op, out, flat, tangents, params, listed=False):
    """The tangent of ``out = op(*flat, **params)`` given the inputs' tangents (None: zero)."""
    if op.jvp_rule is not None:
        return op.jvp_rule(tangents, out, *flat, **params)
    if op.linear:
        targs = []
        for a, t in zip(flat, tangents):
            if t is not None:
                targs.append(t)
            elif isinstance(a, Tensor):
                targs.append(_zeros_like(a) if a._data.dtype in FLOAT_NP else a)
            elif isinstance(a, (int, float)) and not isinstance(a, bool) and op.elementwise:
                targs.append(0)  # add(x, 2) is affine: the constant has no tangent
            else:
                targs.append(a)
        return op(targs, **params) if listed else op(*targs, **params)
    if op.pointwise:
        return _pointwise_jvp(op, out, flat, tangents, params)
    return _transposed_vjp(op, out, flat, tangents, params)


def _rule_inputs(op, flat, out):
    """The inputs as the gradient rule sees them in a graph-recording backward."""
    if op.elementwise:
        flat = registry._prepare_elementwise(op, list(flat))
        shape = out._data.shape
        flat = [REGISTRY["broadcast_to"](a, shape=shape)
                if isinstance(a, Tensor) and a._data.shape != shape else a for a in flat]
    if not op.save_inputs:
        flat = [Meta(a._data) if isinstance(a, Tensor) else a for a in flat]
    return flat, (out if op.save_out else None)


def _call_rule(op, g, saved_out, inputs, params, wanted):
    if op.needs:
        grads = op.rule(g, saved_out, *inputs, needs=wanted, **params)
    else:
        grads = op.rule(g, saved_out, *inputs, **params)
    if type(grads) is not tuple and type(grads) is not list:
        grads = (grads,)
    return grads


def _pointwise_jvp(op, out, flat, tangents, params):
    if op.rule is None:
        return None
    inputs, saved_out = _rule_inputs(op, flat, out)
    return _rule_tangents(op, tangents, _fit, out, saved_out, inputs, params)


def _rule_tangents(op, tangents, fit, out, saved_out, inputs, params):
    """A pointwise op's JVP: each input's tangent (``fit`` to the output ``out``) through
    the gradient rule, the contributions summed (None where no input has a tangent). The
    Tensor path and the array path share it, with their own ``fit``."""
    total = None
    n = len(inputs)
    for i, t in enumerate(tangents):
        if t is None:
            continue
        wanted = op.needs and [j == i for j in range(n)]  # read by a rule with needs only
        gi = _call_rule(op, fit(t, out, op), saved_out, inputs, params, wanted)[i]
        if gi is None:
            continue
        total = gi if total is None else total + gi
    return total


FALLBACK = set()  # ops whose JVP ran through the transposed gradient rule


def fallback_ops():
    """Names of the ops with neither a JVP rule nor a pointwise/linear flag."""
    return sorted(n for n, o in REGISTRY.items()
                  if o.differentiable and o.jvp_rule is None and not o.linear
                  and not o.pointwise)


def _transposed_vjp(op, out, flat, tangents, params):
    """J t as the transpose of the linear map g -> J^T g (the gradient rule), by reverse
    mode over the rule: for ops with no forward rule of their own."""
    from tapegrad.autograd import grad as autograd_grad
    from tapegrad.autograd.grad_mode import enable_grad
    from tapegrad.creation import zeros

    if op.rule is None:
        return None
    if op.name not in FALLBACK:
        import warnings

        warnings.warn(f"{op.name}: no forward-mode (JVP) rule; its tangent is computed by "
                      "reverse mode over its gradient rule (slower; write one with "
                      f"@{op.name}.jvp)", RuntimeWarning, stacklevel=2)
    FALLBACK.add(op.name)
    with enable_grad():
        u = zeros(tuple(out.shape), dtype=out.dtype, requires_grad=True)
        saved_out = out if op.save_out else None
        inputs = flat if op.save_inputs else [Meta(a._data) if isinstance(a, Tensor) else a
                                               for a in flat]
        wanted = [t is not None for t in tangents]
        grads = _call_rule(op, u, saved_out, inputs, params, wanted)
        s = None
        for gi, t in zip(grads, tangents):
            if gi is None or t is None:
                continue
            term = (gi * t).sum()
            s = term if s is None else s + term
        if s is None or not s.requires_grad:
            return None
        from tapegrad.creation import ones_like

        (jt,) = autograd_grad(s, u, grad_outputs=ones_like(s), create_graph=True,
                              allow_unused=True)
    return jt

