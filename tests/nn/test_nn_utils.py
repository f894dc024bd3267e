"""nn.utils against PyTorch: gradient clipping (total norm returned and gradients scaled the
same) and parameter/vector conversion."""
import math

import numpy as np
import pytest
import torch

import tapegrad
import tapegrad.nn as tnn
from helpers import assert_close


def params_with_grads(shapes, dtype=np.float64, seed=0, scale=1.0):
    rng = np.random.default_rng(seed)
    arrays = [(rng.standard_normal(s) * scale).astype(dtype) for s in shapes]
    grads = [(rng.standard_normal(s) * scale).astype(dtype) for s in shapes]
    th, tg = [], []
    for a, g in zip(arrays, grads):
        p = torch.nn.Parameter(torch.tensor(a))
        p.grad = torch.tensor(g)
        th.append(p)
        q = tnn.Parameter(tapegrad.tensor(a))
        q.grad = tapegrad.tensor(g)
        tg.append(q)
    return th, tg


SHAPES = [(3, 4), (5,), (2, 2, 3)]


@pytest.mark.parametrize("norm_type", [2.0, 1, math.inf, 3.0, 0.5, "inf"])
@pytest.mark.parametrize("max_norm", [0.5, 1e3])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_clip_grad_norm_matches_torch(norm_type, max_norm, dtype):
    th, tg = params_with_grads(SHAPES, dtype)
    nt = float(norm_type)
    total_th = torch.nn.utils.clip_grad_norm_(th, max_norm, nt)
    total_tg = tnn.utils.clip_grad_norm_(tg, max_norm, nt)
    rtol = 1e-12 if dtype == np.float64 else 2e-6
    assert total_tg.shape == () and total_tg.dtype == getattr(tapegrad, np.dtype(dtype).name)
    assert_close(total_tg, total_th, rtol=rtol)
    for p, q in zip(tg, th):
        assert p.grad.dtype == p.dtype
        assert_close(p.grad, q.grad, rtol=rtol)


def test_clip_grad_norm_details():
    th, tg = params_with_grads(SHAPES, scale=3.0)
    tg.append(tnn.Parameter(tapegrad.ones(2)))  # no grad: skipped
    th.append(torch.nn.Parameter(torch.ones(2)))
    grad_obj = tg[0].grad
    total = tnn.utils.clip_grad_norm_(iter(tg), 1.0)  # any iterable
    assert_close(total, torch.nn.utils.clip_grad_norm_(iter(th), 1.0))
    assert tg[0].grad is grad_obj  # scaled in place
    new_total = tnn.utils.get_total_norm([p.grad for p in tg[:3]])
    assert abs(new_total.item() - 1.0) < 1e-5  # clipped to max_norm (up to the 1e-6)
    single = tnn.Parameter(tapegrad.tensor(np.ones(3)))
    single.grad = tapegrad.tensor(np.full(3, 2.0))
    assert_close(tnn.utils.clip_grad_norm_(single, 100.0), tapegrad.tensor(np.sqrt(12.0)))
    with pytest.warns(UserWarning, match="empty generator"):
        empty = tnn.utils.clip_grad_norm_((p for p in []), 1.0)
    assert empty.item() == 0.0


def test_clip_grad_norm_nonfinite():
    _, tg = params_with_grads(SHAPES)
    tg[1].grad._data[0] = np.inf
    with pytest.raises(RuntimeError, match="non-finite"):
        tnn.utils.clip_grad_norm_(tg, 1.0, error_if_nonfinite=True)
    total = tnn.utils.clip_grad_norm_(tg, 1.0)
    assert math.isinf(total.item())


def test_clip_grad_norm_on_a_model():
    th = torch.nn.Sequential(torch.nn.Linear(4, 5), torch.nn.Tanh(), torch.nn.Linear(5, 2))
    th.double()
    tg = tnn.Sequential(tnn.Linear(4, 5), tnn.Tanh(), tnn.Linear(5, 2)).double()
    tg.load_state_dict({k: tapegrad.tensor(v.numpy()) for k, v in th.state_dict().items()})
    x = np.random.default_rng(0).standard_normal((6, 4)) * 10
    (th(torch.tensor(x)) ** 2).sum().backward()
    (tg(tapegrad.tensor(x)) ** 2).sum().backward()
    assert_close(tnn.utils.clip_grad_norm_(tg.parameters(), 0.1),
                 torch.nn.utils.clip_grad_norm_(th.parameters(), 0.1))
    for (name, p), q in zip(tg.named_parameters(), th.parameters()):
        assert_close(p.grad, q.grad, what=name)


@pytest.mark.parametrize("clip_value", [0.5, 2.0])
def test_clip_grad_value_matches_torch(clip_value):
    th, tg = params_with_grads(SHAPES, scale=2.0)
    assert torch.nn.utils.clip_grad_value_(th, clip_value) is None
    assert tnn.utils.clip_grad_value_(tg, clip_value) is None
    for p, q in zip(tg, th):
        assert_close(p.grad, q.grad, rtol=0)
    single = tnn.Parameter(tapegrad.tensor([3.0, -3.0]))
    single.grad = tapegrad.tensor([3.0, -3.0])
    tnn.utils.clip_grad_value_(single, 1)
    assert single.grad.tolist() == [1.0, -1.0]


def test_parameters_to_vector_and_back():
    th = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.Linear(2, 1)).double()
    tg = tnn.Sequential(tnn.Linear(3, 2), tnn.Linear(2, 1)).double()
    tg.load_state_dict({k: tapegrad.tensor(v.numpy()) for k, v in th.state_dict().items()})
    vec_tg = tnn.utils.parameters_to_vector(tg.parameters())
    vec_th = torch.nn.utils.parameters_to_vector(th.parameters())
    assert vec_tg.shape == (11,)
    assert_close(vec_tg, vec_th, rtol=0)
    # differentiable: d(sum(vec * c))/dp = c's slice
    c = np.arange(11.0)
    (vec_tg * tapegrad.tensor(c)).sum().backward()
    np.testing.assert_array_equal(tg[0].weight.grad._data, c[:6].reshape(2, 3))
    new = np.linspace(-1, 1, 11)
    tnn.utils.vector_to_parameters(tapegrad.tensor(new), tg.parameters())
    torch.nn.utils.vector_to_parameters(torch.tensor(new), th.parameters())
    for p, q in zip(tg.parameters(), th.parameters()):
        assert_close(p, q, rtol=0)
        assert isinstance(p, tnn.Parameter) and p.requires_grad
    with pytest.raises(TypeError, match="expected tapegrad.Tensor"):
        tnn.utils.vector_to_parameters(new, tg.parameters())
    with pytest.raises(RuntimeError, match="11 elements"):
        tnn.utils.vector_to_parameters(tapegrad.zeros(5), tg.parameters())


def test_training_loop_with_clipping_tracks_torch():
    """Module + loss + clip_grad_norm_ + an optimizer: five steps stay on PyTorch's path."""

    def build(nn):
        return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 3))

    th, tg = build(torch.nn).double(), build(tnn).double()
    tg.load_state_dict({k: tapegrad.tensor(v.numpy()) for k, v in th.state_dict().items()})
    opt_th = torch.optim.Adam(th.parameters(), lr=0.01)
    opt_tg = tapegrad.optim.Adam(tg.parameters(), lr=0.01)
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((16, 4)), rng.integers(0, 3, 16)
    for _ in range(5):
        norms = []
        for model, opt, lib in ((th, opt_th, torch), (tg, opt_tg, tapegrad)):
            opt.zero_grad()
            loss = lib.nn.CrossEntropyLoss()(model(lib.tensor(x)), lib.tensor(y))
            loss.backward()
            norms.append(lib.nn.utils.clip_grad_norm_(model.parameters(), 0.5))
            opt.step()
        assert_close(norms[1], norms[0])
    for (name, a), (_, b) in zip(tg.state_dict().items(), th.state_dict().items()):
        assert_close(a, b, what=name)
