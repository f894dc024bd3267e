"""Fused ops (issue 5, item 3) and the engine's in-place gradient accumulation (item 4).

linear_relu is a tapegrad extension: PyTorch's counterpart is ``F.relu(F.linear(...))``.
"""
import numpy as np
import pytest
import torch

import tapegrad
import tapegrad.nn.functional as TF
from helpers import check_op, check_torch, make_inputs


def _linear_relu(T, x, w, b=None):
    if T is tapegrad:
        return TF.linear_relu(x, w, b)
    return torch.relu(torch.nn.functional.linear(x, w, b))


def _away_from_kink(specs, seed):
    """The inputs' pre-activations are all at least 1e-2 from ReLU's kink (gradcheck safe)."""
    arrays = make_inputs(specs, seed)
    z = arrays[0] @ arrays[1].T + (arrays[2] if len(arrays) > 2 else 0)
    assert np.abs(z).min() > 1e-2, "choose another seed: a pre-activation sits near 0"
    return arrays


@pytest.mark.parametrize("specs,seed", [
    ([(4, 3), (5, 3), (5,)], 0),
    ([(4, 3), (5, 3)], 0),
    ([(2, 2, 3), (4, 3), (4,)], 0),
    ([(3,), (2, 3), (2,)], 0),
])
def test_linear_relu_vs_torch(specs, seed):
    arrays = _away_from_kink(specs, seed)
    check_op(lambda T, *xs: _linear_relu(T, *xs), arrays)


def test_linear_relu_gradient_is_zero_at_the_kink():
    # a zero weight row and a zero bias make that unit's pre-activation exactly 0:
    # ReLU's gradient there is 0 in PyTorch, and the fused mask (out > 0) agrees
    w = np.array([[0.0, 0.0, 0.0], [0.5, -1.0, 2.0]])
    # (torch agreement only: finite differences straddle the kink, so no gradcheck here)
    check_torch(lambda T, x, w, b: _linear_relu(T, x, w, b),
                [np.arange(6.0).reshape(2, 3) - 2, w, np.zeros(2)])


def test_linear_relu_matches_the_two_node_version_bitwise():
    rng = np.random.default_rng(3)
    arrays = [rng.standard_normal(s) for s in [(6, 5), (7, 5), (7,)]]
    g = rng.standard_normal((6, 7))
    results = []
    for fused in (True, False):
        x, w, b = (tapegrad.tensor(a, requires_grad=True) for a in arrays)
        y = TF.linear_relu(x, w, b) if fused else TF.relu(TF.linear(x, w, b))
        y.backward(tapegrad.tensor(g))
        results.append([y.detach().numpy(), x.grad.numpy(), w.grad.numpy(), b.grad.numpy()])
    for a, b in zip(*results):
        np.testing.assert_array_equal(a, b)


def test_linear_relu_is_one_node():
    x = tapegrad.randn(3, 4, dtype=tapegrad.float64)
    w = tapegrad.randn(2, 4, dtype=tapegrad.float64, requires_grad=True)
    b = tapegrad.randn(2, dtype=tapegrad.float64, requires_grad=True)
    y = TF.linear_relu(x, w, b)
    assert y.grad_fn.name() == "LinearReluBackward"
    assert [n for n, _ in y.grad_fn.next_functions] == [None, None, None]  # straight to leaves
    with tapegrad.no_grad():
        z = TF.linear_relu(x, w, b)
    assert z.grad_fn is None and not z.requires_grad
    np.testing.assert_array_equal(z.numpy(), y.detach().numpy())


def test_linear_relu_skips_gradients_nobody_wants():
    x = tapegrad.randn(3, 4, dtype=tapegrad.float64, requires_grad=True)
    w = tapegrad.randn(2, 4, dtype=tapegrad.float64)
    b = tapegrad.randn(2, dtype=tapegrad.float64)
    TF.linear_relu(x, w, b).sum().backward()
    assert x.grad is not None and w.grad is None and b.grad is None


def test_linear_relu_errors():
    with pytest.raises(RuntimeError, match=r"linear_relu: .*\(2, 3\).*\(4, 5\)"):
        TF.linear_relu(tapegrad.randn(2, 3), tapegrad.randn(5, 4))
    with pytest.raises(RuntimeError, match=r"linear_relu: .*same dtype.*float32.*float64"):
        TF.linear_relu(tapegrad.randn(2, 3), tapegrad.randn(5, 3, dtype=tapegrad.float64))
    with pytest.raises(RuntimeError, match=r"linear_relu: weight must be 2-D"):
        TF.linear_relu(tapegrad.randn(2, 3), tapegrad.randn(3))
    with pytest.raises(RuntimeError, match=r"linear_relu: bias of shape \(3,\)"):
        TF.linear_relu(tapegrad.randn(2, 3), tapegrad.randn(5, 3), tapegrad.randn(3))
