"""vmap records the reverse-mode tape at the logical level only where the physical one is not
needed (a physical op whose only operands requiring grad are leaves of a transform inside the
vmap runs untaped): compositions where the physical tape *is* needed (a grad outside the vmap,
nested vmaps, jacrev/hessian inside vmap) still match torch.func, and the per-sample gradients
leave no graph behind."""
import numpy as np
import pytest
import torch
import torch.func as tf

import tapegrad
import tapegrad.func as fn


def _pair(*shape, seed=0):
    a = np.random.default_rng(seed).standard_normal(shape)
    return tapegrad.tensor(a), torch.tensor(a)


def _close(a, b):
    np.testing.assert_allclose(a.detach().numpy(), b.detach().numpy(), rtol=1e-12, atol=1e-12)


def _f(T):
    def f(w, x):
        return (T.tanh(x @ w) * x.sum()).sum()
    return f


def test_per_sample_grads_leave_no_graph():
    (w, tw), (x, tx) = _pair(3, 2), _pair(5, 4, 3, seed=1)
    g = fn.vmap(fn.grad(_f(tapegrad)), in_dims=(None, 0))(w, x)
    _close(g, tf.vmap(tf.grad(_f(torch)), in_dims=(None, 0))(tw, tx))
    assert not g.requires_grad and g.grad_fn is None


def test_grad_outside_vmap_of_grad_keeps_the_physical_tape():
    (w, tw), (x, tx) = _pair(3, 2), _pair(5, 4, 3, seed=1)

    def outer(T, F):
        return lambda w, x: F.vmap(F.grad(_f(T)), in_dims=(None, 0))(w, x).pow(2).sum()

    _close(fn.grad(outer(tapegrad, fn))(w, x), tf.grad(outer(torch, tf))(tw, tx))
    # and with tapegrad's engine directly (the outer leaf requires grad)
    wl = w.detach().requires_grad_(True)
    (gw,) = tapegrad.autograd.grad(outer(tapegrad, fn)(wl, x), [wl])
    _close(gw, tf.grad(outer(torch, tf))(tw, tx))


def test_nested_vmap_of_grad():
    (w, tw), (x, tx) = _pair(3, 2), _pair(2, 5, 4, 3, seed=2)
    got = fn.vmap(fn.vmap(fn.grad(_f(tapegrad)), in_dims=(None, 0)), in_dims=(None, 0))(w, x)
    want = tf.vmap(tf.vmap(tf.grad(_f(torch)), in_dims=(None, 0)), in_dims=(None, 0))(tw, tx)
    _close(got, want)


@pytest.mark.parametrize("name", ["jacrev", "hessian", "grad_of_grad"])
def test_second_order_inside_vmap(name):
    (w, tw), (x, tx) = _pair(3, 2), _pair(4, 2, 3, seed=3)

    def make(T, F):
        f = _f(T)
        if name == "jacrev":
            return F.jacrev(lambda w, x: T.tanh(x @ w).sum(0))
        if name == "hessian":
            return F.hessian(f)
        return F.grad(lambda w, x: F.grad(f)(w, x).pow(2).sum())

    _close(fn.vmap(make(tapegrad, fn), in_dims=(None, 0))(w, x),
           tf.vmap(make(torch, tf), in_dims=(None, 0))(tw, tx))


def test_batched_and_unbatched_leaves_together():
    (w, tw), (x, tx) = _pair(6, 3, 2, seed=4), _pair(6, 4, 3, seed=5)
    got = fn.vmap(fn.grad(_f(tapegrad), argnums=(0, 1)))(w, x)
    want = tf.vmap(tf.grad(_f(torch), argnums=(0, 1)))(tw, tx)
    for a, b in zip(got, want):
        _close(a, b)
