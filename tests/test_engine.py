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
