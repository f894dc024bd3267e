"""One helper checks an op three ways: PyTorch values and gradients, gradcheck, second order.

    check_op(lambda T, x, y: T.mul(x, y), [(3, 4), (4,)])

``fn(T, *tensors)`` is written once and run with ``T = tapegrad`` and ``T = torch``. Inputs
are shapes (random float64 normals) or numpy arrays (integer arrays never require grad).
"""
import numpy as np
import torch

import tapegrad

RTOL = 1e-12


def make_inputs(specs, seed=0, low=None, high=None, away_from=None):
    """Random float64 arrays for shapes; arrays pass through. ``away_from`` nudges kinks."""
    rng = np.random.default_rng(seed)
    arrays = []
    for s in specs:
        if isinstance(s, np.ndarray):
            arrays.append(s)
            continue
        if isinstance(s, (int, float)) and not isinstance(s, bool):
            arrays.append(s)
            continue
        a = rng.uniform(low, high, size=s) if low is not None else rng.standard_normal(s)
        if away_from is not None:
            for k in np.atleast_1d(away_from):
                close = np.abs(a - k) < 0.1
                a = np.where(close, a + 0.2 * np.sign(a - k + 1e-3), a)
        arrays.append(np.asarray(a, dtype=np.float64))
    return arrays


def _wrap(lib, arrays, requires_grad, dtype=None):
    out = []
    for a in arrays:
        if not isinstance(a, np.ndarray):
            out.append(a)
            continue
        if dtype is not None and a.dtype == np.float64:
            a = a.astype(dtype)
        grad = requires_grad and a.dtype.kind == "f"
        if lib is torch:
            out.append(torch.tensor(a, requires_grad=grad))
        else:
            out.append(tapegrad.tensor(a, requires_grad=grad))
    return out


def _outputs(out):
    if isinstance(out, (tuple, list)):
        return list(out)
    return [out]


def to_numpy(t):
    if isinstance(t, torch.Tensor):
        return t.detach().numpy()
    return np.asarray(t.detach().numpy()) if isinstance(t, tapegrad.Tensor) else np.asarray(t)


def assert_close(actual, expected, rtol=RTOL, atol=None, what="value"):
    actual, expected = to_numpy(actual), to_numpy(expected)
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != {expected.shape}"
    if expected.dtype.kind in "biu":
        np.testing.assert_array_equal(actual, expected, err_msg=what)
        return
    if atol is None:
        scale = np.max(np.abs(expected)) if expected.size else 1.0
        atol = rtol * max(float(scale), 1e-300)
    np.testing.assert_allclose(actual, expected, rtol=rtol, atol=atol, err_msg=what)


def check_torch(fn, arrays, rtol=RTOL, dtype=None, grad=True, seed=1):
    """Values and gradients (for a random upstream gradient) agree with PyTorch."""
    tg_in = _wrap(tapegrad, arrays, grad, dtype)
    th_in = _wrap(torch, arrays, grad, dtype)
    tg_out = _outputs(fn(tapegrad, *tg_in))
    th_out = _outputs(fn(torch, *th_in))
    assert len(tg_out) == len(th_out)
    for a, b in zip(tg_out, th_out):
        assert str(a.dtype).split(".")[-1] == str(b.dtype).split(".")[-1], \
            f"dtype {a.dtype} != {b.dtype}"
        assert_close(a, b, rtol=rtol)
    if not grad:
        return
    rng = np.random.default_rng(seed)
    pairs = [(a, b) for a, b in zip(tg_out, th_out)
             if b.requires_grad and b.dtype.is_floating_point]
    if not pairs:
        return
    seeds = [rng.standard_normal(b.shape).astype(to_numpy(b).dtype) for _, b in pairs]
    tapegrad.autograd.backward([a for a, _ in pairs], [tapegrad.tensor(s) for s in seeds])
    torch.autograd.backward([b for _, b in pairs], [torch.tensor(s) for s in seeds])
    for i, (a, b) in enumerate(zip(tg_in, th_in)):
        if isinstance(b, torch.Tensor) and b.requires_grad:
            if b.grad is None:
                assert a.grad is None or not np.any(to_numpy(a.grad)), f"input {i}: grad"
                continue
            assert a.grad is not None, f"input {i}: tapegrad produced no gradient"
            assert a.grad.shape == a.shape and a.grad.dtype == a.dtype
            assert_close(a.grad, b.grad, rtol=rtol, what=f"gradient of input {i}")


def check_op(fn, specs, *, seed=0, low=None, high=None, away_from=None, grad=True,
             second_order=True, float32=True, rtol=RTOL):
    """The three-way check: PyTorch (float64 and float32), gradcheck, gradgradcheck."""
    arrays = make_inputs(specs, seed, low, high, away_from)
    check_torch(fn, arrays, rtol=rtol, grad=grad)
    if float32:
        check_torch(fn, arrays, rtol=2e-5, dtype=np.float32, grad=grad)
    if not grad:
        return
    inputs = _wrap(tapegrad, arrays, True)

    def f(*xs):
        return fn(tapegrad, *xs)

    assert tapegrad.autograd.gradcheck(f, inputs)
    if second_order:
        assert tapegrad.autograd.gradgradcheck(f, inputs)
