import gc

import numpy as np
import pytest

import tapegrad
from helpers import check_op


def test_chain_rule_matches_torch():
    check_op(lambda T, x, b: ((x * b + b).exp() @ x.mT).sum(), [(2, 3), (3,)])


def test_diamond_accumulates():
    x = tapegrad.tensor([3.0], dtype=tapegrad.float64, requires_grad=True)
    y = x * x
    y.backward(tapegrad.tensor([1.0], dtype=tapegrad.float64))
    assert x.grad.item() == 6.0  # both branches summed, not overwritten


def test_deep_chain_no_recursion():
    x = tapegrad.tensor([1.0], dtype=tapegrad.float64, requires_grad=True)
    z = x
    for _ in range(100_000):
        z = z * 1.0
    z.sum().backward()
    assert x.grad.item() == 1.0


def test_no_reference_cycles():
    gc.collect()
    gc.disable()
    try:
        w = tapegrad.tensor(np.ones((4, 4)), requires_grad=True)
        x = tapegrad.tensor(np.ones((8, 4)))
        import weakref

        h = (x @ w).tanh()
        ref = weakref.ref(h.grad_fn)
        loss = h.sum()
        loss.backward()
        del h, loss
        assert ref() is None, "the graph survived its output: a reference cycle"
    finally:
        gc.enable()


def test_backward_twice_raises():
    x = tapegrad.tensor([1.0, 2.0], requires_grad=True)
    y = (x * x).sum()
    y.backward()
    with pytest.raises(RuntimeError, match="second time"):
        y.backward()


def test_nonscalar_backward_needs_gradient():
    x = tapegrad.tensor([1.0, 2.0], requires_grad=True)
    with pytest.raises(RuntimeError, match="scalar"):
        (x * 2).backward()


def test_nodes_save_only_what_wanted_gradients_read():
    """mul/div/matmul/linear declare uses=: an input is saved only if a wanted gradient
    reads it, as in PyTorch (less memory; modifying an unsaved input is no error)."""
    from tapegrad.autograd.engine import Node

    w = tapegrad.tensor(np.ones((4, 2)), requires_grad=True)
    x = tapegrad.tensor(np.ones((3, 4)))
    y = x @ w  # only w wants a gradient, which reads x: w's version is not watched
    assert y.grad_fn.saved[0] is x and y.grad_fn.versions[1] is None
    h = w * 3.0
    m = h * tapegrad.tensor(np.full((4, 2), 0.5))  # a dropout-style mask: h is not kept
    assert type(m.grad_fn.saved[0]) is Node and m.grad_fn.saved[0].shape == (4, 2)
    import weakref

    ref = weakref.ref(h._data)
    del h
    assert ref() is None  # the activation is freed although m's graph is alive


def test_in_place_on_an_input_nobody_reads_matches_torch():
    import torch

    def run(T, x0):
        x = T.tensor(x0, requires_grad=True)
        y = x * 1.5
        t = y[:, 0] * 2  # reads y[:, 0] but saves only the scalar's partner
        y[:, 1] = t  # modifies y in place: fine, nothing saved y
        (y * y).sum().backward()
        return x.grad.numpy() if T is tapegrad else x.grad.numpy()

    x0 = np.arange(6.0).reshape(3, 2) / 7
    np.testing.assert_allclose(run(tapegrad, x0), run(torch, x0), rtol=1e-12)
