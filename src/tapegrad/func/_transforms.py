"""grad, vjp, jvp and what is built from them (jacrev, jacfwd, hessian, hvp, linearize).

Reverse mode is the tape: a transform makes its inputs fresh differentiable handles (an
``alias`` of an input another level differentiates, else a leaf), runs the function and calls
the engine. Gradient rules then run as ops on Tensors (``create_graph``) whenever another
transform is active (a mode on the stack, or an outer grad the result depends on), so every
level above sees the backward pass as ordinary ops: that is how the transforms compose.
"""
import functools
import threading
import weakref

from tapegrad.autograd.engine import leaves_below
from tapegrad.autograd.grad_mode import enable_grad, state as grad_state
from tapegrad.func import _tree
from tapegrad.func._forward import ForwardLevel, _tensor_cls, aliases
from tapegrad.ops.registry import REGISTRY


def _T():
    return _tensor_cls()  # tapegrad.tensor.Tensor (an import cycle), imported once


def _enter(t):
    """A handle on ``t`` this level differentiates with respect to."""
    if t._requires_grad:
        return REGISTRY["alias"](t)  # keeps the outer level's graph through t
    d = t.detach()  # same array: a forward level's tangent and vmap's batching stay with it
    d.requires_grad_(True)
    if grad_state.modes:  # a leaf made inside vmap levels: they need no physical tape for it
        from tapegrad.func._vmap import VmapLevel

        for m in grad_state.modes:
            if isinstance(m, VmapLevel):
                m.inner[id(d)] = d
    return d


# Leaves of transforms that have returned, by id: a graph reaching only those is dead to every
# level still running (its gradients can never be asked for), so results leave it detached
_DEAD = {}


def _retire(leaves):
    for t in leaves:
        if t.grad_fn is None:
            k = id(t)
            _DEAD[k] = weakref.ref(t, lambda _, k=k: _DEAD.pop(k, None))


def _reaches_outer(tensors, inner):
    """Does the graph of ``tensors`` reach a requiring-grad leaf other than ``inner`` (or
    the leaves of transforms that have returned)?"""
    inner = {id(t) for t in inner} | set(_DEAD)
    roots = [t for t in tensors if t is not None and t._requires_grad]
    if any(t.grad_fn is None and id(t) not in inner for t in roots):
        return True
    return any(id(p) not in inner for _, p in leaves_below(roots))


def _exit(t, keep):
    return t if keep or t is None else t.detach()


def _check_argnums(argnums, n, name):
    nums = argnums if isinstance(argnums, tuple) else (argnums,)
    if isinstance(argnums, tuple) and not argnums:
        raise RuntimeError(f"{name}: argnums must be non-empty")
    for a in nums:
        if not isinstance(a, int):
            raise RuntimeError(f"{name}: argnums must be int or Tuple[int, ...], got: {a!r}")
        if not -n <= a < n:
            raise RuntimeError(f"{name}: Got argnums={a}, but only {n} positional inputs")
    return tuple(a % n for a in nums)


# How many reverse-mode transforms are running ``fn`` in this thread (the compiler runs a
# compiled function eagerly under two or more: its compiled backward is not differentiable)
_reverse = threading.local()


def reverse_depth():
    return getattr(_reverse, "depth", 0)


def _vjp_core(fn, primals, name, has_aux=False):
    """Run ``fn`` on fresh handles of ``primals``: (handles, leaves, outputs, aux)."""
    T = _T()
    handles = _tree.tree_map(lambda x: _enter(x) if isinstance(x, T) else x, primals)
    leaves = [x for x in _tree.flatten(handles)[0] if isinstance(x, T)]
    _reverse.depth = reverse_depth() + 1
    try:
        out = fn(*handles)
    finally:
        _reverse.depth -= 1
    aux = None
    if has_aux:
        if not (isinstance(out, tuple) and len(out) == 2):
            raise RuntimeError(f"{name}(f, ...)(*args): output of function f should be a "
                               "tuple: (output, aux) if has_aux is True")
        out, aux = out
    return handles, leaves, out, aux


def _backward(outputs, cotangents, leaves, name):
    """Gradients of ``outputs`` (weighted by ``cotangents``) w.r.t. ``leaves`` (zeros where
    unused); with a graph when another transform needs it."""
    from tapegrad.autograd import grad as autograd_grad
    from tapegrad.creation import zeros_like

    pairs = [(o, c) for o, c in zip(outputs, cotangents) if o._requires_grad]
    create = bool(grad_state.modes) or _reaches_outer([o for o, _ in pairs], leaves)
    if pairs:
        grads = autograd_grad([o for o, _ in pairs], leaves, grad_outputs=[c for _, c in pairs],
                              create_graph=create, allow_unused=True)
    else:
        grads = [None] * len(leaves)
    # one walk over all the gradients' graphs: when none of them reaches an outer leaf, none
    # does singly (each is detached); only otherwise is each gradient asked on its own
    some = create and _reaches_outer([g for g in grads if g is not None], leaves)
    out = []
    for g, leaf in zip(grads, leaves):
        if g is None:
            g = zeros_like(leaf)
        elif create:
            g = _exit(g, some and _reaches_outer([g], leaves))
        out.append(g)
    return out


def _ones_like(t):
    from tapegrad.creation import ones_like

    return ones_like(t)


def grad_and_value(func, argnums=0, has_aux=False):
    """As ``torch.func.grad_and_value``: ``(grad, value)`` (``((grad, value), aux)`` with
    ``has_aux``).

    >>> g, v = grad_and_value(lambda x: (x ** 2).sum())(tapegrad.ones(3))
    """

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        return _grad_and_value(func, argnums, has_aux, args, kwargs, True)

    return wrapper


def _grad_and_value(func, argnums, has_aux, args, kwargs, want_value):
    """``grad_and_value(func, argnums, has_aux)(*args, **kwargs)``; the value is None unless
    ``want_value`` (``grad`` drops it: no walk of its graph to decide its detach)."""
    T = _T()
    nums = _check_argnums(argnums, len(args), "grad_and_value")
    with enable_grad():
        diff = tuple(args[i] for i in nums)
        _tree_check(diff, "grad_and_value")

        def f(*d):
            full = list(args)
            for i, x in zip(nums, d):
                full[i] = x
            return func(*full, **kwargs)

        handles, leaves, out, aux = _vjp_core(f, diff, "grad_and_value", has_aux)
        if not isinstance(out, T):
            raise RuntimeError("grad_and_value(f)(*args): Expected f(*args) to return a "
                               f"Tensor, got {type(out)}")
        if out.dim() != 0:
            raise RuntimeError("grad_and_value(f)(*args): Expected f(*args) to return a "
                               f"scalar Tensor, got tensor with {out.dim()} dims. Maybe "
                               "you wanted to use the vjp or jacrev APIs instead?")
        grads = _backward([out], [_ones_like(out)], leaves, "grad")
    _retire(leaves)
    it = iter(grads)
    g = _tree.tree_map(lambda x: next(it) if isinstance(x, T) else x, handles)
    if not isinstance(argnums, tuple):
        g = g[0]
    value = _exit(out, _reaches_outer([out], leaves)) if want_value else None
    if has_aux:
        aux = _tree.tree_map(lambda x: _exit(x, _reaches_outer([x], leaves))
                             if isinstance(x, T) else x, aux)
        return (g, value), aux
    return g, value


def _differentiable_dtype(t):
    return t._data.dtype.kind in "fc" or t.is_floating_point()


def _forward_input(x, what, name):
    """Forward mode carries a tangent of the primal's dtype: an integer one has none."""
    if not _differentiable_dtype(x):
        raise ValueError(f"{name}: Expected {what} to be floating point or complex, but got: "
                         f"{x.dtype} (shape {tuple(x.shape)})")


def _tree_check(tree, name):
    T = _T()
    for x in _tree.flatten(tree)[0]:
        if not isinstance(x, T):
            raise RuntimeError(f"{name}: expected the differentiated arguments to be Tensors "
                               f"(or tuples/lists/dicts of them), got {type(x).__name__}")
        if not x.is_floating_point():
            raise RuntimeError(f"{name}: only floating point Tensors can be differentiated, "
                               f"got {x.dtype}")


def grad(func, argnums=0, has_aux=False):
    """As ``torch.func.grad``: the gradient of a scalar function w.r.t. ``argnums``.

    >>> grad(lambda x: x.sin().sum())(x)          # cos(x)
    >>> grad(grad(lambda x: x.sin()))(x0)         # -sin(x0), higher order composes
    """

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        (g, _), *aux = _split(_grad_and_value(func, argnums, has_aux, args, kwargs, False),
                              has_aux)
        return (g, aux[0]) if has_aux else g

    return wrapper


def _split(res, has_aux):
    return (res[0], res[1]) if has_aux else (res,)


def vjp(func, *primals, has_aux=False):
    """As ``torch.func.vjp``: ``(output, vjp_fn)``; ``vjp_fn(cotangent)`` returns a tuple with
    one gradient per primal (``(output, vjp_fn, aux)`` with ``has_aux``)."""
    T = _T()
    _tree_check(primals, "vjp")
    with enable_grad():
        handles, leaves, out, aux = _vjp_core(func, primals, "vjp", has_aux)
    _retire(leaves)  # only vjp_fn asks for their gradients
    outs, out_spec = _tree.flatten(out)
    for o in outs:
        if not isinstance(o, T):
            raise RuntimeError(f"vjp(f, *primals): Expected f to return Tensors, got {type(o)}")
        if not _differentiable_dtype(o):  # (jacrev too: its rows would be zeros)
            raise RuntimeError(f"vjp(f, ...): All outputs of f must be floating-point or "
                               f"complex Tensors, got Tensor with dtype {o.dtype} (shape "
                               f"{tuple(o.shape)})")

    def vjp_fn(*cotangents, retain_graph=True):
        cts = cotangents[0] if len(cotangents) == 1 and not isinstance(out, tuple) else cotangents
        flat = _tree.flatten(cts)[0]
        if len(flat) != len(outs):
            raise RuntimeError(f"vjp_fn: expected {len(outs)} cotangents, got {len(flat)}")
        for o, c in zip(outs, flat):
            if tuple(c.shape) != tuple(o.shape):
                raise RuntimeError(f"vjp_fn: mismatch in shape: cotangent of shape "
                                   f"{tuple(c.shape)} for an output of shape {tuple(o.shape)}")
        with enable_grad():
            grads = _backward(outs, flat, leaves, "vjp")
        it = iter(grads)
        return _tree.tree_map(lambda x: next(it) if isinstance(x, T) else x, handles)

    primal_out = _tree.unflatten([_exit(o, _reaches_outer([o], leaves)) for o in outs], out_spec)
    if has_aux:
        aux = _tree.tree_map(lambda x: _exit(x, _reaches_outer([x], leaves))
                             if isinstance(x, T) else x, aux)
        return primal_out, vjp_fn, aux
    return primal_out, vjp_fn


def jvp(func, primals, tangents, *, strict=False, has_aux=False):
    """As ``torch.func.jvp``: ``(func(*primals), J @ tangents)`` in one forward pass.

    >>> out, t = jvp(torch.sin, (x,), (torch.ones_like(x),))    # t == cos(x)
    """
    T = _T()
    if not isinstance(primals, tuple) or not isinstance(tangents, tuple):
        raise RuntimeError("jvp(f, primals, tangents): Expected primals and tangents to be "
                           "tuples")
    p_flat, p_spec = _flatten_args(primals, T)
    t_flat, _ = _flatten_args(tangents, T)
    if len(p_flat) != len(t_flat):
        raise RuntimeError("jvp(f, primals, tangents): Expected primals and tangents to have "
                           "the same python structure")
    for p, t in zip(p_flat, t_flat):
        if not isinstance(p, T) or not isinstance(t, T):
            raise RuntimeError("jvp(f, primals, tangents): expected primals and tangents to "
                               "be Tensors")
        _forward_input(p, "primal", "jvp(f, primals, tangents)")
        _forward_input(t, "tangent", "jvp(f, primals, tangents)")
        if p._data.shape != t._data.shape:
            raise RuntimeError(f"jvp(f, primals, tangents): Expected primals and tangents to "
                               f"have the same shape, got {tuple(p.shape)} and "
                               f"{tuple(t.shape)}")
    duals = aliases(p_flat)  # by the mode below: the level is not open yet
    level = ForwardLevel(private=True)  # its tangents are seen only when it returns
    with level:
        for d, p, t in zip(duals, p_flat, t_flat):
            level.set_tangent(d, t.to(p.dtype) if t._data.dtype != p._data.dtype else t)
        level.seal()
        out = func(*(duals if p_spec is None else _tree.unflatten(duals, p_spec)))
        aux = None
        if has_aux:
            if not (isinstance(out, tuple) and len(out) == 2):
                raise RuntimeError("jvp(f, primals, tangents): output of function f should be "
                                   "a tuple: (output, aux) if has_aux is True")
            out, aux = out
        outs, spec = ([out], None) if isinstance(out, T) else _tree.flatten(out)
        touts = []
        for o in outs:
            if not isinstance(o, T):
                raise RuntimeError(f"jvp(f, primals, tangents): Expected f to return Tensors, "
                                   f"got {type(o)}")
            t = level.tangent(o)
            touts.append(t if t is not None else level.below(_zeros_like, o))
    level.tangents.clear()
    outs = [_exit(o, o._requires_grad and _reaches_outer([o], ())) for o in outs]
    touts = [_exit(t, t._requires_grad and _reaches_outer([t], ())) for t in touts]
    if spec is None:  # one Tensor out (what _tree.unflatten gives back for it)
        res = (outs[0], touts[0])
    else:
        res = (_tree.unflatten(outs, spec), _tree.unflatten(touts, spec))
    return res + (aux,) if has_aux else res


def _flatten_args(args, T):
    """``_tree.flatten(args)`` of a tuple; ``(list(args), None)`` when it holds only Tensors
    (the same leaves, no walk: the call takes them as they are)."""
    for a in args:
        if not isinstance(a, T):
            return _tree.flatten(args)
    return list(args), None


def _zeros_like(t):
    from tapegrad.creation import zeros_like

    return zeros_like(t)


def linearize(func, *primals):
    """As ``torch.func.linearize``: ``(func(*primals), jvp_fn)``; ``jvp_fn(*tangents)`` is
    ``J @ tangents`` at ``primals`` (each call runs forward mode at the saved primals)."""
    out = func(*primals)

    def jvp_fn(*tangents):
        return jvp(func, primals, tangents)[1]

    return out, jvp_fn


def _basis(t):
    from tapegrad.creation import eye

    n = t.numel()
    return eye(n, dtype=t.dtype).reshape((n,) + tuple(t.shape))


def _over_argnums(func, args, argnums, name):
    """``(diff, f)``: the ``args`` at ``argnums`` and ``func`` as a function of those alone
    (the other args fixed)."""
    nums = _check_argnums(argnums, len(args), name)

    def f(*d):
        full = list(args)
        for i, x in zip(nums, d):
            full[i] = x
        return func(*full)

    return tuple(args[i] for i in nums), f


def jacrev(func, argnums=0, *, has_aux=False, chunk_size=None):
    """As ``torch.func.jacrev``: the Jacobian by reverse mode, one vjp per output element
    (batched with vmap). Output shape: ``out.shape + input.shape``."""
    from tapegrad.func._vmap import vmap

    @functools.wraps(func)
    def wrapper(*args):
        diff, f = _over_argnums(func, args, argnums, "jacrev")

        res = vjp(f, *diff, has_aux=has_aux)
        out, vjp_fn = res[0], res[1]
        outs, spec = _tree.flatten(out)
        jac_per_out = []
        for k, o in enumerate(outs):
            basis = _basis(o)

            def one(v, k=k):
                cts = [v if j == k else _zeros_like(oo) for j, oo in enumerate(outs)]
                return vjp_fn(*(cts if isinstance(out, tuple) else cts[:1]))

            rows = vmap(one, chunk_size=chunk_size)(basis)  # per diff arg: (n_out, *arg.shape)
            rows = tuple(r.reshape(tuple(o.shape) + tuple(a.shape)) for r, a in zip(rows, diff))
            jac_per_out.append(rows if isinstance(argnums, tuple) else rows[0])
        jac = _tree.unflatten(jac_per_out, spec)
        return (jac, res[2]) if has_aux else jac

    return wrapper


def jacfwd(func, argnums=0, has_aux=False, *, randomness="error"):
    """As ``torch.func.jacfwd``: the Jacobian by forward mode, one jvp per input element
    (batched with vmap). Output shape: ``out.shape + input.shape``."""
    from tapegrad.func._vmap import vmap

    @functools.wraps(func)
    def wrapper(*args):
        diff, f = _over_argnums(func, args, argnums, "jacfwd")
        for a in _tree.flatten(diff)[0]:
            if isinstance(a, _T()):
                _forward_input(a, "primal", "jacfwd")

        cols = []
        aux = None
        for k, a in enumerate(diff):
            def push(v, k=k):
                ts = tuple(v if j == k else _zeros_like(d) for j, d in enumerate(diff))
                res = jvp(f, diff, ts, has_aux=has_aux)
                return (res[1], res[2]) if has_aux else res[1]

            res = vmap(push, randomness=randomness)(_basis(a))
            if has_aux:
                res, aux_b = res
                if aux is None:  # aux does not depend on the tangent: take the first
                    aux = _tree.tree_map(lambda x: x[0], aux_b)
            n = a.numel()
            # res: (n_in, *out.shape) per output -> out.shape + a.shape
            cols.append(_tree.tree_map(
                lambda r, a=a, n=n: REGISTRY["permute"](r.reshape((n, -1)), dims=(1, 0)).reshape(
                    tuple(r.shape[1:]) + tuple(a.shape)), res))
        if isinstance(argnums, tuple):
            outs0, spec = _tree.flatten(cols[0])
            per = [_tree.flatten(c)[0] for c in cols]
            jac = _tree.unflatten([tuple(p[i] for p in per) for i in range(len(outs0))], spec)
        else:
            jac = cols[0]
        return (jac, aux) if has_aux else jac

    return wrapper


def hessian(func, argnums=0):
    """As ``torch.func.hessian``: ``jacfwd(jacrev(func))``."""
    return jacfwd(jacrev(func, argnums), argnums)


def hvp(func, primals, tangents):
    """Hessian-vector product by forward-over-reverse, ``jvp(grad(func))``: ``(grad, H v)``.
    (``torch.func`` has no ``hvp``; ``autograd.functional.hvp`` is the reverse-over-reverse
    API.) The Hessian is never formed."""
    nums = 0 if len(primals) == 1 else tuple(range(len(primals)))
    return jvp(grad(func, argnums=nums), primals, tangents)
