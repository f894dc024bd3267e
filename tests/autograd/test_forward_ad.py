"""tapegrad.autograd.forward_ad against torch.autograd.forward_ad (float64, 1e-12)."""
import numpy as np
import pytest
import torch
import torch.autograd.forward_ad as tfwd

import tapegrad
import tapegrad.autograd.forward_ad as gfwd
from helpers import assert_close

RNG = np.random.default_rng(7)
X = RNG.standard_normal((3, 4))
T = RNG.standard_normal((3, 4))
W = RNG.standard_normal((5, 4))
TW = RNG.standard_normal((5, 4))


def both(fn, arrays, tangents):
    """``fn(lib, *duals)`` inside a dual level of each library: (primal, tangent) pairs."""
    out = []
    for lib, fwd in ((tapegrad, gfwd), (torch, tfwd)):
        with fwd.dual_level():
            duals = [fwd.make_dual(lib.tensor(a), lib.tensor(t)) for a, t in zip(arrays, tangents)]
            res = fn(lib, *duals)
            res = res if isinstance(res, tuple) else (res,)
            out.append([fwd.unpack_dual(r) for r in res])
    return out


def test_make_dual_unpack_dual_against_torch():
    def fn(lib, x, w):
        h = lib.nn.functional.linear(x, w).tanh()
        return lib.nn.functional.log_softmax(h, dim=-1), (h * h).sum(), x.var(dim=0)

    got, want = both(fn, [X, W], [T, TW])
    for (gp, gt), (tp, tt) in zip(got, want):
        assert_close(gp, tp)
        assert_close(gt, tt, what="tangent")


def test_a_tensor_without_tangent_unpacks_to_none():
    for lib, fwd in ((tapegrad, gfwd), (torch, tfwd)):
        with fwd.dual_level():
            x = fwd.make_dual(lib.tensor(X), lib.tensor(T))
            c = lib.tensor(W)
            assert fwd.unpack_dual(c).tangent is None
            primal, tangent = fwd.unpack_dual(x * 2)
            assert fwd.unpack_dual(primal).tangent is None  # the primal is a plain view
            assert_close(tangent, torch.tensor(2 * T))


def test_errors_as_torch():
    x, t = tapegrad.tensor(X), tapegrad.tensor(T)
    with pytest.raises(RuntimeError, match="forward AD level"):
        gfwd.make_dual(x, t)
    with gfwd.dual_level():
        with pytest.raises(RuntimeError, match="different size"):
            gfwd.make_dual(x, tapegrad.tensor(W))
        with pytest.raises(RuntimeError, match="not supported"):
            with gfwd.dual_level():
                pass
    with tfwd.dual_level():  # torch refuses the same two
        with pytest.raises(RuntimeError):
            tfwd.make_dual(torch.tensor(X), torch.tensor(W))
        with pytest.raises(RuntimeError):
            with tfwd.dual_level():
                pass


def test_enter_and_exit_dual_level():
    level = gfwd.enter_dual_level()
    try:
        y = gfwd.make_dual(tapegrad.tensor(X), tapegrad.tensor(T)).exp()
        assert_close(gfwd.unpack_dual(y).tangent, torch.tensor(np.exp(X) * T))
    finally:
        gfwd.exit_dual_level(level=level)
    with pytest.raises(RuntimeError, match="forward AD level"):
        gfwd.unpack_dual(y)


def test_in_place_ops_on_duals_and_views_match_torch():
    def fn(lib, x, w):
        y = x * 1
        y.mul_(x.sin())
        y[1:, :2].add_(x[:2, 2:] ** 2)
        y.T[0].sub_(w[0, :3])
        y[0] = w[1, :4] * 3
        return y, y[2]

    got, want = both(fn, [X, W], [T, TW])
    for (gp, gt), (tp, tt) in zip(got, want):
        assert_close(gp, tp)
        assert_close(gt, tt, what="tangent")


def test_tangent_is_differentiable_by_reverse_mode():
    # d/dx <grad f(x), v> through a dual's tangent: forward-over-reverse (an hvp) vs torch
    grads = []
    for lib, fwd in ((tapegrad, gfwd), (torch, tfwd)):
        x = lib.tensor(X, requires_grad=True)
        with fwd.dual_level():
            y = (fwd.make_dual(x, lib.tensor(T)).sin() * x).sum()
            tangent = fwd.unpack_dual(y).tangent
        (g,) = lib.autograd.grad(tangent, x)
        grads.append(g)
    assert_close(grads[0], grads[1])


def test_float_primal_required():
    with gfwd.dual_level():
        with pytest.raises(ValueError, match="floating point"):
            gfwd.make_dual(tapegrad.tensor([1, 2]), tapegrad.tensor([1, 2]))
