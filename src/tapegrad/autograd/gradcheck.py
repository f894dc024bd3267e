"""gradcheck / gradgradcheck: compare the tape's gradients with central differences."""
from tapegrad.backend import xp


class GradcheckError(RuntimeError):
    """Raised when analytical and numerical gradients disagree (names the worst element)."""


def _tensors(inputs):
    from tapegrad.tensor import Tensor

    inputs = (inputs,) if isinstance(inputs, Tensor) else tuple(inputs)
    return inputs, [i for i, t in enumerate(inputs) if isinstance(t, Tensor) and t.requires_grad]


def _flat_outputs(out):
    from tapegrad.tensor import Tensor

    outs = (out,) if isinstance(out, Tensor) else tuple(out)
    return [o for o in outs if isinstance(o, Tensor)]


def _numerical(fn, inputs, diff, eps):
    """Jacobian columns by central differences: J[out][in] of shape (out.numel, in.numel)."""
    from tapegrad.autograd.grad_mode import no_grad

    with no_grad():
        base = [o._data.copy() for o in _flat_outputs(fn(*inputs))]
    jac = [[xp.zeros((o.size, inputs[i]._data.size)) for i in diff] for o in base]
    for k, i in enumerate(diff):
        data = inputs[i]._data  # nudged in place, element by element, whatever its layout
        for j, idx in enumerate(xp.ndindex(data.shape)):
            orig = data[idx]
            with no_grad():
                data[idx] = orig + eps
                plus = [o._data.astype(xp.float64) for o in _flat_outputs(fn(*inputs))]
                data[idx] = orig - eps
                minus = [o._data.astype(xp.float64) for o in _flat_outputs(fn(*inputs))]
            data[idx] = orig
            for m, (p, q) in enumerate(zip(plus, minus)):
                jac[m][k][:, j] = ((p - q) / (2 * eps)).reshape(-1)
    return jac


def _analytical(fn, inputs, diff):
    from tapegrad.autograd import grad

    outs = [o for o in _flat_outputs(fn(*inputs))]
    jac = []
    for o in outs:
        rows = [xp.zeros((o._data.size, inputs[i]._data.size)) for i in diff]
        if o.requires_grad:
            for r in range(o._data.size):
                seed = xp.zeros(o._data.shape, o._data.dtype)  # C order: reshape(-1) is a view
                seed.reshape(-1)[r] = 1
                gs = grad(o, [inputs[i] for i in diff], grad_outputs=seed, retain_graph=True,
                          allow_unused=True)
                for k, g in enumerate(gs):
                    if g is not None:
                        rows[k][r] = g._data.reshape(-1)
        jac.append(rows)
    return jac


def gradcheck(func, inputs, *, eps=1e-6, atol=1e-5, rtol=1e-3, raise_exception=True,
              **_ignored) -> bool:
    """As ``torch.autograd.gradcheck``: tape gradients vs central differences in float64.

    >>> x = tapegrad.randn(3, dtype=tapegrad.float64, requires_grad=True)
    >>> tapegrad.autograd.gradcheck(lambda t: (t * t).sum(), (x,))
    True
    """
    inputs, diff = _tensors(inputs)
    for i in diff:
        if inputs[i]._data.dtype != xp.float64:
            raise GradcheckError(
                f"gradcheck: input {i} has dtype {inputs[i].dtype}; gradcheck needs float64 "
                "inputs for central differences to be meaningful")
    numerical = _numerical(func, inputs, diff, eps)
    analytical = _analytical(func, inputs, diff)
    for m, (num_rows, ana_rows) in enumerate(zip(numerical, analytical)):
        for k, (n, a) in enumerate(zip(num_rows, ana_rows)):
            err = xp.abs(a - n)
            bad = err > atol + rtol * xp.abs(n)
            if bad.any():
                r, c = xp.unravel_index(int(xp.argmax(err - rtol * xp.abs(n))), err.shape)
                msg = (f"gradcheck: Jacobian mismatch for output {m} with respect to input "
                       f"{diff[k]}: worst element (output {r}, input {c}): analytical "
                       f"{a[r, c]!r} vs numerical {n[r, c]!r} (abs error {err[r, c]:.3e}, "
                       f"{int(bad.sum())} of {bad.size} elements out of tolerance)")
                if raise_exception:
                    raise GradcheckError(msg)
                return False
    return True


def gradgradcheck(func, inputs, grad_outputs=None, *, eps=1e-6, atol=1e-5, rtol=1e-3,
                  raise_exception=True, **_ignored) -> bool:
    """As ``torch.autograd.gradgradcheck``: gradcheck of the vector-Jacobian product."""
    from tapegrad.autograd import grad
    from tapegrad.autograd.grad_mode import enable_grad
    from tapegrad.tensor import Tensor

    inputs, diff = _tensors(inputs)
    outs = _flat_outputs(func(*inputs))
    if grad_outputs is None:
        rng = xp.random.default_rng(0)
        grad_outputs = [Tensor._from_data(rng.standard_normal(o.shape), requires_grad=True)
                        for o in outs]
    else:
        grad_outputs = [g if isinstance(g, Tensor) else Tensor._from_data(g)
                        for g in grad_outputs]
    n = len(inputs)

    def vjp(*args):
        # grad mode on even while central differences run it: the vjp needs the graph
        with enable_grad():
            xs, gos = args[:n], args[n:]
            pairs = [(o, g) for o, g in zip(_flat_outputs(func(*xs)), gos) if o.requires_grad]
            if not pairs:
                raise GradcheckError("gradgradcheck: no output of the function requires grad")
            gs = grad([o for o, _ in pairs], [xs[i] for i in diff],
                      grad_outputs=[g for _, g in pairs], create_graph=True,
                      materialize_grads=True)
        return tuple(gs)

    return gradcheck(vjp, tuple(inputs) + tuple(grad_outputs), eps=eps, atol=atol, rtol=rtol,
                     raise_exception=raise_exception)
