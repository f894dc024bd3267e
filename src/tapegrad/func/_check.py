"""``check_grads``: JAX's derivative check, in forward and reverse mode, to any order."""
import numpy as np


def _T():
    from tapegrad.tensor import Tensor

    return Tensor


def _dot(xs, ys):
    return sum(float((x.detach() * y.detach()).sum().item()) for x, y in zip(xs, ys))


def _outputs(out):
    return list(out) if isinstance(out, (tuple, list)) else [out]


def _directions(args, rng):
    import tapegrad

    return tuple(tapegrad.tensor(rng.standard_normal(tuple(a.shape)), dtype=a.dtype)
                 for a in args)


def _numerical_jvp(f, args, v, eps):
    plus = f(*[a + eps * d for a, d in zip(args, v)])
    minus = f(*[a - eps * d for a, d in zip(args, v)])
    return [(p - m) / (2 * eps) for p, m in zip(_outputs(plus), _outputs(minus))]


def _close(a, b, atol, rtol, what):
    a, b = np.asarray(a.detach().numpy()), np.asarray(b.detach().numpy())
    if not np.allclose(a, b, atol=atol, rtol=rtol):
        raise AssertionError(f"check_grads: {what} disagrees with central differences (max "
                             f"abs difference {np.max(np.abs(a - b)):.3g})")


def check_grads(f, args, order, modes, eps, atol, rtol, _rng=None):
    from tapegrad.func._transforms import jvp, vjp

    T = _T()
    args = tuple(args)
    for a in args:
        if not isinstance(a, T) or not a.is_floating_point():
            raise TypeError("check_grads: args must be floating point Tensors")
    modes = (modes,) if isinstance(modes, str) else tuple(modes)
    for m in modes:
        if m not in ("fwd", "rev"):
            raise ValueError(f"check_grads: unknown mode {m!r} (expected 'fwd' or 'rev')")
    rng = _rng or np.random.default_rng(0)
    v = _directions(args, rng)
    numeric = _numerical_jvp(f, args, v, eps)
    if "fwd" in modes:
        _, tangents = jvp(f, args, v)
        for t, n in zip(_outputs(tangents), numeric):
            _close(t, n, atol, rtol, f"forward mode (order {_order_name(order)})")
    if "rev" in modes:
        out, fn = vjp(f, *args)
        outs = _outputs(out)
        u = _directions(outs, rng)
        grads = fn(*u) if isinstance(out, (tuple, list)) else fn(u[0])
        # <u, J v> two ways: reverse mode's v . (J^T u) against central differences
        lhs = _dot(grads, v)
        rhs = _dot(u, numeric)
        if not np.isclose(lhs, rhs, atol=atol * max(1, abs(rhs)), rtol=rtol):
            raise AssertionError(f"check_grads: reverse mode (order {_order_name(order)}) "
                                 f"disagrees with central differences: {lhs!r} vs {rhs!r}")
    if order > 1:
        # the next order: the same checks on the first derivative along v
        def df(*xs):
            return jvp(f, xs, v)[1]

        check_grads(df, args, order - 1, modes, eps, atol, rtol, rng)


def _order_name(order):
    return order
