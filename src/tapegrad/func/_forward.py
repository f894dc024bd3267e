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

Tangents are kept per level by the identity of the primal's backend array, so a Tensor
re-wrapping the same array (a saved output in a gradient rule, ``detach()``) keeps its
tangent; a view is a new array and gets its own.
"""
from tapegrad.autograd.engine import DispatchMode, Meta
from tapegrad.autograd.grad_mode import state as grad_state
from tapegrad.dtypes import FLOAT_NP
from tapegrad.ops import registry
from tapegrad.ops.registry import REGISTRY

Tensor = None  # tapegrad.tensor.Tensor, set lazily (import cycle)


def _tensor_cls():
    global Tensor
    if Tensor is None:
        from tapegrad.tensor import Tensor as T

        Tensor = T
    return Tensor


class ForwardLevel(DispatchMode):
    """One forward-mode level (``forward_ad.dual_level``, one ``func.jvp`` call)."""

    def __init__(self):
        _tensor_cls()
        self.tangents = {}  # id(primal array) -> (primal array, tangent Tensor)

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

    def interpret(self, op, args, params):
        listed = bool(args) and type(args[0]) is list
        flat = args[0] if listed else args
        tangents = [self.tangent(a) for a in flat]
        if not op.differentiable or all(t is None for t in tangents):
            return op(*args, **params)
        if op.elementwise and not listed:
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
        out = op(*args, **params)
        if not isinstance(out, Tensor) or out._data.dtype not in FLOAT_NP:
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
    total = None
    n = len(flat)
    for i, t in enumerate(tangents):
        if t is None:
            continue
        t = _fit(t, out, op)
        gi = _call_rule(op, t, saved_out, inputs, params, [j == i for j in range(n)])[i]
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

