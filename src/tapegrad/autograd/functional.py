"""As ``torch.autograd.functional``: jacobian, hessian, vjp, jvp, hvp, vhp.

Built on ``tapegrad.func`` (``jvp`` is true forward mode here, where PyTorch's
``autograd.functional.jvp`` uses the double-vjp trick). Inputs are a Tensor or a tuple of
Tensors; results follow PyTorch's nesting (a tuple where the inputs or outputs were one).
"""
from tapegrad import func as _func


def _tuple(x):
    return (x, False) if isinstance(x, tuple) else ((x,), True)


def _check(inputs, name):
    from tapegrad.tensor import Tensor

    for i, x in enumerate(inputs):
        if not isinstance(x, Tensor):
            raise TypeError(f"{name}: The inputs given to {name} must be either a Tensor or a "
                            f"tuple of Tensors but the value at index {i} has type "
                            f"{type(x).__name__}.")


def _maybe_detach(ts, create_graph):
    if create_graph:
        return ts
    return tuple(t.detach() for t in ts)


def vjp(func, inputs, v=None, create_graph=False, strict=False):
    """As ``torch.autograd.functional.vjp``: ``(func_output, v^T J)``."""
    inputs, single = _tuple(inputs)
    _check(inputs, "vjp")
    out, fn = _func.vjp(func, *inputs)
    outs, single_out = _tuple(out)
    if v is None:
        if len(outs) != 1 or outs[0].numel() != 1:
            raise RuntimeError("vjp: The vector v can only be None if the user-provided "
                               "function returns a single Tensor with a single element.")
        from tapegrad.creation import ones_like

        v = ones_like(outs[0])
    vs, _ = _tuple(v)
    grads = fn(*vs) if not single_out else fn(vs[0])
    grads = _maybe_detach(grads, create_graph)
    out = _maybe_detach(outs, create_graph)
    return (out[0] if single_out else out), (grads[0] if single else grads)


def jvp(func, inputs, v=None, create_graph=False, strict=False):
    """As ``torch.autograd.functional.jvp``: ``(func_output, J v)`` (one forward-mode pass)."""
    inputs, single = _tuple(inputs)
    _check(inputs, "jvp")
    if v is None:
        if len(inputs) != 1 or inputs[0].numel() != 1:
            raise RuntimeError("jvp: The vector v can only be None if the input to the "
                               "user-provided function is a single Tensor with a single "
                               "element.")
        from tapegrad.creation import ones_like

        v = ones_like(inputs[0])
    vs, _ = _tuple(v)
    out, t = _func.jvp(func, inputs, vs)
    outs, single_out = _tuple(out)
    ts, _ = _tuple(t)
    outs, ts = _maybe_detach(outs, create_graph), _maybe_detach(ts, create_graph)
    return (outs[0] if single_out else outs), (ts[0] if single_out else ts)


def jacobian(func, inputs, create_graph=False, strict=False, vectorize=False,
             strategy="reverse-mode"):
    """As ``torch.autograd.functional.jacobian``: ``out.shape + input.shape`` blocks."""
    if strategy not in ("reverse-mode", "forward-mode"):
        raise ValueError('Expected strategy to be either "forward-mode" or "reverse-mode".')
    inputs, single = _tuple(inputs)
    _check(inputs, "jacobian")
    transform = _func.jacrev if strategy == "reverse-mode" else _func.jacfwd
    jac = transform(func, argnums=tuple(range(len(inputs))))(*inputs)
    out_is_tuple = isinstance(jac, tuple) and len(jac) and isinstance(jac[0], tuple)
    rows = jac if out_is_tuple else (jac,)
    rows = tuple(_maybe_detach(r, create_graph) for r in rows)
    if single:
        rows = tuple(r[0] for r in rows)
    return rows if out_is_tuple else rows[0]


def hessian(func, inputs, create_graph=False, strict=False, vectorize=False,
            outer_jacobian_strategy="reverse-mode"):
    """As ``torch.autograd.functional.hessian``: the Hessian of a scalar function."""
    inputs, single = _tuple(inputs)
    _check(inputs, "hessian")
    argnums = tuple(range(len(inputs)))
    inner = _func.jacrev(func, argnums=argnums)
    outer = _func.jacfwd if outer_jacobian_strategy == "forward-mode" else _func.jacrev
    h = outer(inner, argnums=argnums)(*inputs)
    h = tuple(_maybe_detach(r, create_graph) for r in h)
    return h[0][0] if single else h


def vhp(func, inputs, v=None, create_graph=False, strict=False):
    """As ``torch.autograd.functional.vhp``: ``(func_output, v^T H)``."""
    inputs, single = _tuple(inputs)
    _check(inputs, "vhp")
    vs, _ = _tuple(v)
    out, fn = _func.vjp(_func.grad(func, argnums=tuple(range(len(inputs)))), *inputs)
    res = _maybe_detach(fn(vs), create_graph)
    value = func(*inputs)
    value = value if create_graph else value.detach()
    return value, (res[0] if single else res)


def hvp(func, inputs, v=None, create_graph=False, strict=False):
    """As ``torch.autograd.functional.hvp``: ``(func_output, H v)`` (forward-over-reverse;
    equal to ``vhp`` for the symmetric Hessian of a twice-differentiable function)."""
    inputs, single = _tuple(inputs)
    _check(inputs, "hvp")
    vs, _ = _tuple(v)
    _, hv = _func.jvp(_func.grad(func, argnums=tuple(range(len(inputs)))), inputs, vs)
    value = func(*inputs)
    value = value if create_graph else value.detach()
    return value, (_maybe_detach(hv, create_graph)[0] if single
                   else _maybe_detach(hv, create_graph))


__all__ = ["vjp", "jvp", "jacobian", "hessian", "vhp", "hvp"]
