"""Gradients keep their tensor's shape and dtype: the ``.grad`` setter validates as
PyTorch's does, and a root gradient of another dtype is cast to the output's dtype at the root
(never blamed on an internal node), so a leaf's ``.grad`` never changes dtype."""
import numpy as np
import pytest
import torch

import tapegrad

LIBS = pytest.mark.parametrize("lib", [tapegrad, torch], ids=["tapegrad", "torch"])


@LIBS
@pytest.mark.parametrize("make_grad, error", [
    (lambda L: L.ones(1), RuntimeError),                       # would broadcast in SGD
    (lambda L: L.ones(2, 3), RuntimeError),
    (lambda L: L.ones(3, dtype=L.float64), RuntimeError),
    (lambda L: L.ones(3, dtype=L.int64), RuntimeError),
    (lambda L: [1.0, 2.0, 3.0], TypeError),
    (lambda L: np.ones(3, dtype=np.float32), TypeError),
])
def test_grad_setter_refuses_what_pytorch_refuses(lib, make_grad, error):
    p = lib.zeros(3, requires_grad=True)
    with pytest.raises(error):
        p.grad = make_grad(lib)
    assert p.grad is None


@LIBS
def test_grad_setter_accepts_a_matching_gradient_and_none(lib):
    p = lib.zeros(3, requires_grad=True)
    p.grad = lib.ones(3)
    assert p.grad.dtype == lib.float32 and tuple(p.grad.shape) == (3,)
    p.grad = None
    assert p.grad is None
    q = lib.zeros(2)  # also on a tensor that does not require grad, as PyTorch
    q.grad = lib.ones(2)
    del q.grad
    assert q.grad is None


def test_grad_setter_messages_name_both_sizes_and_dtypes():
    p = tapegrad.zeros(3, requires_grad=True)
    with pytest.raises(RuntimeError, match=r"size '\[1\]' to a tensor of size '\[3\]'"):
        p.grad = tapegrad.ones(1)
    with pytest.raises(RuntimeError, match="float64.*float32"):
        p.grad = tapegrad.ones(3, dtype=tapegrad.float64)


def test_sgd_never_sees_a_broadcasting_gradient():
    p = tapegrad.nn.Parameter(tapegrad.zeros(3))
    opt = tapegrad.optim.SGD([p], lr=1.0)
    with pytest.raises(RuntimeError):
        p.grad = tapegrad.ones(1)
    opt.step()  # nothing assigned: nothing moves
    np.testing.assert_array_equal(p.detach().numpy(), np.zeros(3))


def _root_cases(lib):
    x = lib.tensor([1.0, 2.0, 3.0], dtype=lib.float64, requires_grad=True)
    return x, [lib.ones(3, dtype=lib.float32), lib.ones(3, dtype=lib.int64),
               lib.tensor([True, False, True]), lib.ones(3, dtype=lib.float64)]


@pytest.mark.parametrize("i", range(4))
def test_backward_with_a_gradient_of_another_dtype_matches_pytorch(i):
    results = []
    for lib in (tapegrad, torch):
        x, gs = _root_cases(lib)
        (x * x).backward(gs[i])
        results.append((str(x.grad.dtype).split(".")[-1], x.grad.detach().numpy()))
        x.grad = None
        x.backward(gs[i])  # the root is the leaf itself
        assert x.grad.dtype == lib.float64
        (g,) = lib.autograd.grad((x * 3).sum() * x, x, grad_outputs=gs[i])
        results.append((str(g.dtype).split(".")[-1], g.detach().numpy()))
        (g,) = lib.autograd.grad(x.exp(), x, grad_outputs=gs[i], create_graph=True)
        results.append((str(g.dtype).split(".")[-1], g.detach().numpy()))
    n = len(results) // 2
    for (dt_a, a), (dt_b, b) in zip(results[:n], results[n:]):
        assert dt_a == dt_b == "float64"
        np.testing.assert_allclose(a, b, rtol=1e-15)


@LIBS
def test_root_gradient_of_the_wrong_shape_is_named_at_the_root(lib):
    x = lib.ones(3, dtype=lib.float64, requires_grad=True)
    with pytest.raises(RuntimeError, match="Mismatch in shape"):
        (x * 2).backward(lib.ones(1, dtype=lib.float64))
    with pytest.raises(RuntimeError, match="Mismatch in shape"):
        lib.autograd.grad(x * 2, x, grad_outputs=lib.ones(2, 3, dtype=lib.float64))


def test_grad_of_a_zero_dim_parameter_takes_in_place_ops():
    # a full reduction's gradient is a numpy scalar; .grad must still be an array to write into
    results = []
    for lib in (tapegrad, torch):
        p = lib.nn.Parameter(lib.tensor(2.0, dtype=lib.float64))
        (p * p).backward()
        p.grad.add_(1.0)
        p.grad.mul_(3.0)
        (p * p * p).backward()  # accumulates into the written-to gradient
        before = float(p.grad)
        p.grad.copy_(lib.tensor(-1.5, dtype=lib.float64))
        results.append((before, float(p.grad)))
    assert results[0] == results[1] == (27.0, -1.5)
