"""Fused ops and the engine's in-place gradient accumulation.

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


# --- the engine adds a diamond's further contributions in place, into its own sums only ----
def _torch_grad(fn, x, g):
    xt = torch.tensor(x, requires_grad=True)
    fn(torch, xt).backward(torch.tensor(g))
    return xt.grad.numpy()


def _fan_out(T, x):
    """``t = exp(x)`` read by five ops: five contributions reach exp's node."""
    t = x.exp()
    return t * 2 + t * 3 + t.sin() + t * t


def test_diamond_sums_in_place_agree_with_torch():
    rng = np.random.default_rng(0)
    x, g = rng.standard_normal((3, 4)), rng.standard_normal((3, 4))
    xt = tapegrad.tensor(x, requires_grad=True)
    _fan_out(tapegrad, xt).backward(tapegrad.tensor(g))
    np.testing.assert_allclose(xt.grad.numpy(), _torch_grad(_fan_out, x, g), rtol=1e-12)


def test_in_place_accumulation_never_touches_a_callers_gradient():
    # add's rule hands the caller's gradient to both parents; exp's node then receives it
    # three times (two as the very same array): the engine must copy before adding in place
    rng = np.random.default_rng(1)
    x, g = rng.standard_normal((2, 3)), rng.standard_normal((2, 3))
    g_before = g.copy()
    gt = tapegrad.tensor(g)
    xt = tapegrad.tensor(x, requires_grad=True)
    t = xt.exp()
    ((t + t) + t).backward(gt)
    np.testing.assert_array_equal(gt.numpy(), g_before)
    np.testing.assert_array_equal(g, g_before)
    np.testing.assert_allclose(xt.grad.numpy(), 3 * g * np.exp(x), rtol=1e-12)


def test_in_place_accumulation_never_touches_hooked_or_returned_gradients():
    rng = np.random.default_rng(2)
    x = rng.standard_normal((2, 3))
    xt = tapegrad.tensor(x, requires_grad=True)
    t = xt.exp()
    u = t * 1.5
    seen = []
    u.register_hook(lambda grad: seen.append((grad, grad.numpy().copy())))
    t.retain_grad()
    y = u * 2 + u * 3 + u * 4 + t.sin()
    gu, gt_, gx = tapegrad.autograd.grad(y.sum(), [u, t, xt], retain_graph=True)
    snapshot = [a.numpy().copy() for a in (gu, gt_, gx)]
    y.sum().backward()
    # the hook saw u's gradient (9 everywhere); neither it nor autograd.grad's results
    # changed while the engine went on accumulating into its own buffers
    for grad, copy in seen:
        np.testing.assert_array_equal(grad.numpy(), copy)
    np.testing.assert_array_equal(seen[0][1], np.full((2, 3), 9.0))
    for a, copy in zip((gu, gt_, gx), snapshot):
        np.testing.assert_array_equal(a.numpy(), copy)
    np.testing.assert_allclose(t.grad.numpy(), 13.5 + np.cos(np.exp(x)), rtol=1e-12)
    np.testing.assert_allclose(gx.numpy(), (13.5 + np.cos(np.exp(x))) * np.exp(x), rtol=1e-12)


def test_in_place_accumulation_is_off_with_create_graph():
    x = tapegrad.tensor([0.3, -0.7], dtype=tapegrad.float64, requires_grad=True)
    t = x * x
    y = (t + t + t).sum()
    (gx,) = tapegrad.autograd.grad(y, [x], create_graph=True)
    (ggx,) = tapegrad.autograd.grad(gx.sum(), [x])
    np.testing.assert_allclose(gx.detach().numpy(), 6 * x.detach().numpy(), rtol=1e-12)
    np.testing.assert_allclose(ggx.numpy(), [6.0, 6.0], rtol=1e-12)


# --- the benchmarks' quick modes (smoke tests: nothing here is timed) ----------------------
def test_bench_fusion_quick(capsys):
    from tapegrad import cli

    assert cli.main(["bench", "fusion", "--quick"]) == 0
    text = capsys.readouterr().out
    assert "linear_relu vs relu(linear)" in text and "Adam, 50 params" in text
    # every pair's fused and composite versions agree (the printed sanity check)
    errs = [float(line.rsplit("agree to ", 1)[1].split()[0])
            for line in text.splitlines() if "agree to" in line]
    assert len(errs) == 5 and max(errs) < 1e-12


def test_bench_scale_quick(capsys):
    from tapegrad.bench import scale

    results = scale.main(["--quick", "--threads", "1"])
    assert set(results) == {"float64", "float32"}
    assert {"tapegrad relu(linear)", "tapegrad linear_relu", "numpy by hand"} <= set(
        results["float64"])
    text = capsys.readouterr().out
    assert "peak MiB allocated" in text and "bandwidth" in text
    # the diamond's baseline (the engine with in-place sums off) could be built and timed
    assert "allocating sums (before)" in text


def test_fused_mlp_trainer_matches_the_unfused_one():
    from tapegrad.bench.scale import FusedMLPTrainer
    from tapegrad.bench.spiral import MLPTrainer, init_params, spiral_data

    X, y = spiral_data(64)
    params = init_params((2, 16, 3), seed=1)
    fused = FusedMLPTrainer(tapegrad, params, X, y).train(5)
    plain = MLPTrainer(tapegrad, params, X, y).train(5)
    assert fused == plain  # bitwise: the fused node does exactly the two nodes' arithmetic
