"""Autograd semantics, side by side with PyTorch."""
import gc
import weakref

import numpy as np
import pytest
import torch

import tapegrad
from helpers import assert_close

LIBS = [tapegrad, torch]


def leaf(T, data, requires_grad=True):
    return T.tensor(data, dtype=T.float64, requires_grad=requires_grad)


@pytest.mark.parametrize("T", LIBS, ids=["tapegrad", "torch"])
def test_requires_grad_propagation(T):
    a = leaf(T, [1.0, 2.0])
    b = leaf(T, [3.0, 4.0], requires_grad=False)
    assert (a * b).requires_grad and not (b * 2).requires_grad
    assert (b + a).requires_grad and (b + a).grad_fn is not None
    assert not (a > b).requires_grad  # comparisons carry no grad
    assert a.is_leaf and b.is_leaf and not (a * b).is_leaf
    assert (a * b).grad_fn.name().startswith("MulBackward")
    with pytest.raises(RuntimeError):
        (a * 2).requires_grad = False
    b.requires_grad_()
    assert b.requires_grad and b.is_leaf


@pytest.mark.filterwarnings("ignore:The .grad attribute of a Tensor that is not a leaf")
@pytest.mark.parametrize("T", LIBS, ids=["tapegrad", "torch"])
def test_grad_only_on_leaves_unless_retained(T):
    x = leaf(T, [1.0, 2.0])
    y = x * 3
    z = y * y
    y.retain_grad()
    assert y.retains_grad and not z.retains_grad
    w = z * 1
    w.sum().backward()
    assert x.grad.tolist() == [18.0, 36.0]
    assert y.grad.tolist() == [6.0, 12.0]
    assert z.grad is None


@pytest.mark.parametrize("T", LIBS, ids=["tapegrad", "torch"])
def test_accumulation_until_zeroed(T):
    x = leaf(T, [1.0, -1.0])
    for _ in range(3):
        (x * x).sum().backward()
    assert x.grad.tolist() == [6.0, -6.0]
    g = x.grad
    (x * 1).sum().backward()
    assert x.grad is g  # accumulated in place, same tensor
    x.grad = None
    (x * 2).sum().backward()
    assert x.grad.tolist() == [2.0, 2.0]
    x.grad.zero_()
    (x * 2).sum().backward()
    assert x.grad.tolist() == [2.0, 2.0]


@pytest.mark.parametrize("T", LIBS, ids=["tapegrad", "torch"])
def test_retain_graph_and_second_backward(T):
    x = leaf(T, [1.0, 2.0])
    y = (x.exp() * x).sum()
    y.backward(retain_graph=True)
    first = x.grad.clone()
    y.backward()
    assert_close(x.grad, first * 2)
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        y.backward()


@pytest.mark.parametrize("T", LIBS, ids=["tapegrad", "torch"])
def test_grad_modes(T):
    x = leaf(T, [1.0])
    with T.no_grad():
        assert not (x * 2).requires_grad
        assert not T.is_grad_enabled()
        with T.enable_grad():
            assert (x * 2).requires_grad
    assert T.is_grad_enabled()
    with T.set_grad_enabled(False):
        assert not (x * 2).requires_grad
    assert (x * 2).requires_grad
    T.set_grad_enabled(False)
    assert not (x * 2).requires_grad
    T.set_grad_enabled(True)
    with T.inference_mode():
        assert not (x * 2).requires_grad
    with T.inference_mode(False):
        assert (x * 2).requires_grad

    @T.no_grad()
    def f(v):
        return v * 2

    @T.enable_grad()
    def g(v):
        return v * 2

    @T.set_grad_enabled(False)
    def h(v):
        return v * 2

    assert not f(x).requires_grad and not h(x).requires_grad
    with T.no_grad():
        assert g(x).requires_grad
    assert T.is_grad_enabled()


@pytest.mark.parametrize("T", LIBS, ids=["tapegrad", "torch"])
def test_detach_shares_storage_and_version(T):
    x = leaf(T, [1.0, 2.0])
    y = x * 2
    d = y.detach()
    assert not d.requires_grad and d.is_leaf
    d[0] = 10.0
    assert y.tolist()[0] == 10.0
    assert d._version == y._version
    z = y * y
    d.add_(1)  # y's version moved: z's backward must notice
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        z.sum().backward()


@pytest.mark.parametrize("T", LIBS, ids=["tapegrad", "torch"])
def test_hooks(T):
    x = leaf(T, [1.0, 2.0])
    seen = []
    hx = x.register_hook(lambda g: seen.append(("x", g.tolist())))
    y = x * 3
    y.register_hook(lambda g: g * 10)  # replaces the gradient flowing into y's producer
    (y * y).sum().backward()
    assert seen == [("x", [180.0, 360.0])]
    assert x.grad.tolist() == [180.0, 360.0]
    hx.remove()
    x.grad = None
    h2 = x.register_hook(lambda g: g + 1)
    (x * 1).sum().backward()
    assert x.grad.tolist() == [2.0, 2.0] and len(seen) == 1
    h2.remove()
    x.grad = None
    (x * 1).sum().backward()
    assert x.grad.tolist() == [1.0, 1.0]
    with pytest.raises(RuntimeError, match="doesn't require"):
        T.ones(2).register_hook(lambda g: g)


@pytest.mark.parametrize("T", LIBS, ids=["tapegrad", "torch"])
def test_backward_errors(T):
    x = leaf(T, [1.0, 2.0])
    with pytest.raises(RuntimeError, match="implicitly created only for scalar outputs"
                       if T is torch else "scalar outputs"):
        (x * 2).backward()
    (x * 2).backward(T.ones(2, dtype=T.float64))
    assert x.grad.tolist() == [2.0, 2.0]
    with pytest.raises(RuntimeError, match="does not require grad"):
        T.ones(2).sum().backward()
    with pytest.raises(RuntimeError, match="floating point"):
        T.tensor([1, 2], requires_grad=True)
    with pytest.raises(RuntimeError, match="floating point"):
        T.tensor([1, 2]).requires_grad_()


def test_grad_fn_names_and_next_functions():
    x = leaf(tapegrad, [1.0, 2.0])
    y = (x * 2).exp().sum()
    assert y.grad_fn.name() == "SumBackward"
    (nxt, _), = y.grad_fn.next_functions
    assert nxt.name() == "ExpBackward"
    assert repr(x * 2) == "tensor([2., 4.], dtype=tapegrad.float64, grad_fn=<MulBackward>)"


def test_autograd_grad_allow_unused_and_materialize():
    for T in LIBS:
        x, y = leaf(T, [1.0, 2.0]), leaf(T, [3.0])
        out = (x * x).sum()
        with pytest.raises(RuntimeError, match="not have been used in the graph"):
            T.autograd.grad(out, [x, y], retain_graph=True)
        gx, gy = T.autograd.grad(out, [x, y], allow_unused=True, retain_graph=True)
        assert gx.tolist() == [2.0, 4.0] and gy is None
        gx, gy = T.autograd.grad(out, [x, y], materialize_grads=True)
        assert gy.tolist() == [0.0]
        assert x.grad is None  # autograd.grad leaves .grad alone


def _hvp(T, xs, vs):
    x, v = leaf(T, xs), leaf(T, vs, requires_grad=False)
    f = (x.exp() * x.sin() + x ** 3).sum()
    (g,) = T.autograd.grad(f, x, create_graph=True)
    (hv,) = T.autograd.grad((g * v).sum(), x)
    return g, hv


def test_hessian_vector_product_matches_torch():
    xs, vs = [0.3, -1.2, 0.8], [1.0, 0.5, -2.0]
    g1, hv1 = _hvp(tapegrad, xs, vs)
    g2, hv2 = _hvp(torch, xs, vs)
    assert_close(g1, g2)
    assert_close(hv1, hv2)


def test_gradient_penalty_matches_torch():
    rng = np.random.default_rng(0)
    w_np, x_np = rng.standard_normal((3, 4)), rng.standard_normal((5, 4))
    grads = []
    for T in LIBS:
        w = T.tensor(w_np, requires_grad=True)
        x = T.tensor(x_np, requires_grad=True)
        out = (x @ w.mT).tanh().sum()
        (gx,) = T.autograd.grad(out, x, create_graph=True)
        penalty = ((gx * gx).sum(1) - 1.0) ** 2
        loss = out + penalty.sum()
        loss.backward()
        grads.append((loss, w.grad, x.grad))
    for a, b in zip(*grads):
        assert_close(a, b)


def test_integer_outputs_do_not_require_grad():
    x = leaf(tapegrad, [1.5, 2.5])
    assert not x.long().requires_grad
    with pytest.raises(RuntimeError, match="does not require grad"):
        x.long().sum().backward()


def test_deep_chain_of_100000_ops():
    x = tapegrad.tensor([1.0], dtype=tapegrad.float64, requires_grad=True)
    z = x
    for _ in range(100_000):
        z = z + 1.0
    z.sum().backward()
    assert x.grad.item() == 1.0 and z.item() == 100_001.0


def test_training_step_leaves_no_reference_cycles():
    rng = np.random.default_rng(0)
    w = tapegrad.tensor(rng.standard_normal((4, 8)), requires_grad=True)
    b = tapegrad.tensor(np.zeros(8), requires_grad=True)
    x = tapegrad.tensor(rng.standard_normal((16, 4)))
    gc.collect()
    gc.disable()
    try:
        h = (x @ w + b).tanh()
        h2 = h * h
        h2.retain_grad()
        loss = (h2.exp() - h).sum()
        refs = [weakref.ref(h), weakref.ref(h2), weakref.ref(loss), weakref.ref(h.grad_fn),
                weakref.ref(h2.grad_fn), weakref.ref(loss.grad_fn), weakref.ref(h._data),
                weakref.ref(h2._data)]
        loss.backward()
        with tapegrad.no_grad():
            w.add_(w.grad, alpha=-0.1)
            b.add_(b.grad, alpha=-0.1)
        del h, h2, loss
        alive = [r() for r in refs if r() is not None]
        assert not alive, f"alive after the step: {alive}"
    finally:
        gc.enable()


def test_inplace_and_function_leave_no_reference_cycles():
    class Square(tapegrad.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            y = x * x
            ctx.save_for_backward(x, y)
            return y

        @staticmethod
        def backward(ctx, g):
            x, _ = ctx.saved_tensors
            return 2 * g * x

    x = tapegrad.tensor([1.0, 2.0], requires_grad=True)
    gc.collect()
    gc.disable()
    try:
        y = x * 2
        y.add_(1)
        z = Square.apply(y)
        refs = [weakref.ref(y), weakref.ref(z), weakref.ref(z.grad_fn), weakref.ref(y.grad_fn)]
        z.sum().backward()
        del y, z
        assert all(r() is None for r in refs)
    finally:
        gc.enable()
