"""nn.functional against torch.nn.functional: values, gradients, gradcheck, second order."""
import numpy as np
import pytest
import torch

import tapegrad
import tapegrad.nn.functional as TF
from helpers import check_op, check_torch, make_inputs, assert_close


def F(T):
    return T.nn.functional


def _outs(out):
    return list(out) if isinstance(out, (tuple, list)) else [out]


def gradgrad(fn, specs, seed=0, low=None, high=None, away_from=None):
    """Second order: gradcheck of the vector-Jacobian product, recorded with create_graph.

    (A stricter variant of autograd.gradgradcheck for this file: the upstream gradients are
    held constant, since the vjp is linear in them and its Jacobian there is the first-order
    one gradcheck already checked, so every central difference probes the second order.)
    """
    arrays = make_inputs(specs, seed, low, high, away_from)
    inputs = [tapegrad.tensor(a, requires_grad=a.dtype.kind == "f")
              if isinstance(a, np.ndarray) else a for a in arrays]
    diff = [i for i, t in enumerate(inputs) if isinstance(t, tapegrad.Tensor) and t.requires_grad]
    outs = [o for o in _outs(fn(tapegrad, *inputs)) if o.requires_grad]
    rng = np.random.default_rng(seed + 1)
    gos = [tapegrad.tensor(rng.standard_normal(o.shape)) for o in outs]
    n = len(inputs)

    def vjp(*args):
        with tapegrad.enable_grad():
            ys = [o for o in _outs(fn(tapegrad, *args[:n])) if o.requires_grad]
            gs = tapegrad.autograd.grad(ys, [args[i] for i in diff], grad_outputs=list(args[n:]),
                                        create_graph=True, allow_unused=True)
        found = tuple(g for g in gs if g is not None)
        assert found, "no gradient reached the inputs"
        return found

    assert tapegrad.autograd.gradcheck(vjp, tuple(inputs) + tuple(gos))


def check(fn, specs, second_order=True, **kw):
    """check_op (PyTorch values/gradients in float64 and float32, gradcheck), then a real
    second-order check."""
    check_op(fn, specs, second_order=False, **kw)
    if second_order:
        opts = {k: kw[k] for k in ("seed", "low", "high", "away_from") if k in kw}
        gradgrad(fn, specs, **opts)


def test_linear():
    check(lambda T, x, w, b: F(T).linear(x, w, b), [(2, 3), (4, 3), (4,)])
    check(lambda T, x, w: F(T).linear(x, w), [(2, 2, 3), (4, 3)])
    check(lambda T, x, w, b: F(T).linear(x, w, b), [(3,), (2, 3), (2,)])


def test_linear_fused_matches_composite():
    x, w, b = make_inputs([(3, 4), (5, 4), (5,)])
    xs = [tapegrad.tensor(a, requires_grad=True) for a in (x, w, b)]
    ys = [tapegrad.tensor(a, requires_grad=True) for a in (x, w, b)]
    fused = TF.linear(*xs)
    composite = ys[0] @ ys[1].mT + ys[2]
    assert_close(fused, composite)
    g = np.random.default_rng(0).standard_normal((3, 5))
    fused.backward(tapegrad.tensor(g))
    composite.backward(tapegrad.tensor(g))
    for a, c in zip(xs, ys):
        assert_close(a.grad, c.grad)


@pytest.mark.parametrize("name,kwargs,kinks", [
    ("relu", {}, 0.0), ("leaky_relu", {"negative_slope": 0.2}, 0.0), ("gelu", {}, None),
    ("gelu", {"approximate": "tanh"}, None), ("silu", {}, None), ("tanh", {}, None),
    ("sigmoid", {}, None), ("softplus", {}, None), ("softplus", {"beta": 2.0, "threshold": 1.5},
                                                    0.75),
    ("elu", {}, 0.0), ("elu", {"alpha": 0.5}, 0.0)])
def test_activation(name, kwargs, kinks):
    check(lambda T, x: getattr(F(T), name)(x, **kwargs), [(3, 4)], away_from=kinks)


def test_gelu_third_order():
    x = tapegrad.tensor(np.linspace(-2, 2, 5), requires_grad=True)
    xt = torch.tensor(np.linspace(-2, 2, 5), requires_grad=True)
    for approx in ("none", "tanh"):
        gs = []
        for lib, v in ((tapegrad, x), (torch, xt)):
            y = F(lib).gelu(v, approximate=approx).sum()
            (g1,) = lib.autograd.grad(y, v, create_graph=True)
            (g2,) = lib.autograd.grad(g1.sum(), v, create_graph=True)
            (g3,) = lib.autograd.grad(g2.sum(), v)
            gs.append((g1, g2, g3))
        for a, b in zip(*gs):
            assert_close(a, b, rtol=1e-10)


@pytest.mark.parametrize("name", ["softmax", "log_softmax"])
def test_softmax_family(name):
    check(lambda T, x: getattr(F(T), name)(x, dim=1), [(2, 3, 2)])
    check(lambda T, x: getattr(F(T), name)(x, dim=-1), [(3, 4)], float32=False)
    check_torch(lambda T, x: getattr(F(T), name)(x, dim=0, dtype=T.float64), make_inputs([(4,)]))


def test_softmax_stable_and_fused_matches_composite():
    x = tapegrad.tensor([[1000.0, 0.0, -1000.0]], dtype=tapegrad.float64)
    ls = TF.log_softmax(x, dim=1).numpy()
    assert np.isfinite(ls).all() and ls[0, 0] == 0.0 and ls[0, 2] == -2000.0
    a = make_inputs([(3, 5)])[0]
    t = tapegrad.tensor(a)
    e = np.exp(a - a.max(1, keepdims=True))
    assert_close(TF.softmax(t, 1), e / e.sum(1, keepdims=True))
    assert_close(TF.log_softmax(t, 1), np.log(e / e.sum(1, keepdims=True)), rtol=1e-10)


def test_dropout():
    tapegrad.manual_seed(0)
    x = tapegrad.tensor(np.ones((200, 50)), requires_grad=True)
    y = TF.dropout(x, p=0.3)
    kept = y.numpy(force=True) != 0
    assert abs(kept.mean() - 0.7) < 0.02
    np.testing.assert_allclose(y.numpy(force=True)[kept], 1 / 0.7)
    y.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), kept / 0.7)
    assert TF.dropout(x, 0.3, training=False) is x
    assert not TF.dropout(x, 1.0).numpy(force=True).any()
    tapegrad.manual_seed(5)
    a = TF.dropout(x, 0.5).numpy(force=True)
    tapegrad.manual_seed(5)
    assert np.array_equal(a, TF.dropout(x, 0.5).numpy(force=True))
    with pytest.raises(ValueError, match="between 0 and 1"):
        TF.dropout(x, 1.5)


# --- losses --------------------------------------------------------------------------
TARGET = np.array([0, 2, 1, 2])
TARGET_IGN = np.array([0, -100, 1, 2])
WEIGHT = np.array([0.5, 2.0, 1.5])


def W(T, x):
    return T.tensor(WEIGHT, dtype=x.dtype)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("smoothing", [0.0, 0.2])
def test_cross_entropy_class_indices(reduction, smoothing):
    kw = dict(reduction=reduction, label_smoothing=smoothing)
    check(lambda T, x, t: F(T).cross_entropy(x, t, **kw), [(4, 3), TARGET])
    check(lambda T, x, t: F(T).cross_entropy(x, t, weight=W(T, x), **kw),
             [(4, 3), TARGET_IGN])
    check(lambda T, x, t: F(T).cross_entropy(x, t, ignore_index=2, **kw), [(4, 3), TARGET])


def test_cross_entropy_spatial_and_unbatched():
    t = np.array([[[0, 1], [2, 2]], [[1, 0], [-100, 2]]])
    check(lambda T, x, t: F(T).cross_entropy(x, t, label_smoothing=0.1), [(2, 3, 2, 2), t])
    check(lambda T, x, t: F(T).cross_entropy(x, t), [(3,), np.array(1)])


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_cross_entropy_probabilities(reduction):
    probs = np.random.default_rng(3).dirichlet(np.ones(3), size=4)
    kw = dict(reduction=reduction)
    check(lambda T, x, p: F(T).cross_entropy(x, p, **kw), [(4, 3), probs])
    check(lambda T, x, p, w: F(T).cross_entropy(x, p, weight=w, label_smoothing=0.3, **kw),
             [(4, 3), probs, WEIGHT])


def test_cross_entropy_fused_matches_composite():
    x = tapegrad.tensor(make_inputs([(4, 3)])[0], requires_grad=True)
    x2 = tapegrad.tensor(x.numpy(force=True), requires_grad=True)
    fused = TF.cross_entropy(x, tapegrad.tensor(TARGET))
    onehot = TF.one_hot(tapegrad.tensor(TARGET), 3).double()
    composite = -(onehot * TF.log_softmax(x2, 1)).sum() / 4
    assert_close(fused, composite)
    fused.backward()
    composite.backward()
    assert_close(x.grad, x2.grad)
    p = np.exp(x2.numpy(force=True))
    p /= p.sum(1, keepdims=True)
    assert_close(x.grad, (p - np.eye(3)[TARGET]) / 4)


def test_cross_entropy_errors():
    x = tapegrad.randn(4, 3)
    with pytest.raises(ValueError, match=r"cross_entropy.*\(4,\).*\(5,\)"):
        TF.cross_entropy(x, tapegrad.tensor([0, 1, 2, 0, 1]))
    with pytest.raises(ValueError, match=r"cross_entropy.*\(4, 3\).*\(4, 2\)"):
        TF.cross_entropy(x, tapegrad.rand(4, 2))
    with pytest.raises(IndexError, match="Target 3 is out of bounds"):
        TF.cross_entropy(x, tapegrad.tensor([0, 1, 3, 0]))
    with pytest.raises(RuntimeError, match=r"cross_entropy: .*float32.*float64"):
        TF.cross_entropy(x, tapegrad.rand(4, 3, dtype=tapegrad.float64))
    with pytest.raises(ValueError, match="not a valid value for reduction"):
        TF.cross_entropy(x, tapegrad.tensor([0, 1, 2, 0]), reduction="avg")


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_nll_loss(reduction):
    check(lambda T, x, t: F(T).nll_loss(x, t, reduction=reduction), [(4, 3), TARGET])
    check(lambda T, x, t: F(T).nll_loss(x, t, weight=W(T, x), reduction=reduction),
             [(4, 3), TARGET_IGN])
    check(lambda T, x, t: F(T).nll_loss(F(T).log_softmax(x, 1), t, reduction=reduction),
             [(2, 3, 2), np.array([[0, 2], [1, 1]])])


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_regression_losses(reduction):
    kw = dict(reduction=reduction)
    check(lambda T, x, y: F(T).mse_loss(x, y, **kw), [(3, 4), (3, 4)])
    check(lambda T, x, y, w: F(T).mse_loss(x, y, weight=w, **kw), [(3, 4), (3, 4), (3, 4)],
             float32=False)
    check(lambda T, x, y: F(T).l1_loss(x - y, 0 * y, **kw), [(3, 4), (3, 4)],
             )
    check(lambda T, d, y: F(T).smooth_l1_loss(d + y, y, **kw), [(3, 4), (3, 4)],
             away_from=[-1.0, 0.0, 1.0])
    check(lambda T, d, y: F(T).smooth_l1_loss(d + y, y, beta=0.5, **kw), [(3, 4), (3, 4)],
             away_from=[-0.5, 0.0, 0.5])


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_binary_cross_entropy(reduction):
    kw = dict(reduction=reduction)
    check(lambda T, x, t: F(T).binary_cross_entropy(x, t, **kw), [(3, 4), (3, 4)],
             low=0.05, high=0.95)
    w = np.array([0.5, 1.0, 2.0, 0.1])
    check(lambda T, x, t: F(T).binary_cross_entropy(x, t, weight=T.tensor(w, dtype=x.dtype),
                                                       **kw),
             [(3, 4), (3, 4)], low=0.05, high=0.95)
    with pytest.raises(RuntimeError, match="binary_cross_entropy: .*weight"):
        TF.binary_cross_entropy(tapegrad.rand(2), tapegrad.rand(2),
                                weight=tapegrad.rand(2, requires_grad=True))


def test_binary_cross_entropy_clamps_log():
    for lib in (tapegrad, torch):
        x = lib.tensor([0.0, 1.0, 0.5], dtype=lib.float64, requires_grad=True)
        t = lib.tensor([1.0, 0.0, 1.0], dtype=lib.float64)
        loss = F(lib).binary_cross_entropy(x, t, reduction="none")
        loss.sum().backward()
        np.testing.assert_allclose(loss.detach().numpy(), [100.0, 100.0, np.log(2)])
        assert np.isfinite(x.grad.numpy()).all()
    with pytest.raises(RuntimeError, match="between 0 and 1"):
        TF.binary_cross_entropy(tapegrad.tensor([1.5]), tapegrad.tensor([1.0]))


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_binary_cross_entropy_with_logits(reduction):
    kw = dict(reduction=reduction)
    check(lambda T, x, t: F(T).binary_cross_entropy_with_logits(x, t, **kw), [(3, 4), (3, 4)])
    w, pw = np.array([0.5, 1.0, 2.0, 0.1]), np.array([3.0, 0.5, 1.0, 2.0])
    check(lambda T, x, t: F(T).binary_cross_entropy_with_logits(
        x, t, weight=T.tensor(w, dtype=x.dtype), pos_weight=T.tensor(pw, dtype=x.dtype), **kw),
        [(3, 4), (3, 4)])
    x = tapegrad.tensor([[800.0, -800.0]], dtype=tapegrad.float64)
    loss = TF.binary_cross_entropy_with_logits(x, tapegrad.tensor([[0.0, 1.0]],
                                                                  dtype=tapegrad.float64))
    assert loss.item() == 800.0


# --- embedding and normalisation -------------------------------------------------------
def test_embedding():
    idx = np.array([[0, 2, 4], [2, 2, 1]])
    check(lambda T, w, i: F(T).embedding(i, w), [(5, 3), idx])
    # padding_idx and scale_grad_by_freq change the gradient on purpose: no gradcheck
    w = make_inputs([(5, 3)])[0]
    check_torch(lambda T, w, i: F(T).embedding(i, w, padding_idx=2), [w, idx])
    check_torch(lambda T, w, i: F(T).embedding(i, w, padding_idx=-1), [w, idx])
    check_torch(lambda T, w, i: F(T).embedding(i, w, scale_grad_by_freq=True), [w, idx])
    x = tapegrad.tensor(w, requires_grad=True)
    (g,) = tapegrad.autograd.grad(TF.embedding(tapegrad.tensor(idx), x, padding_idx=2).sum(), x,
                                  create_graph=True)
    assert not g.numpy(force=True)[2].any()


def test_embedding_max_norm_in_place():
    w = make_inputs([(5, 3)])[0] * 3
    idx = np.array([0, 3, 3])
    a, b = tapegrad.tensor(w), torch.tensor(w)
    ya, yb = TF.embedding(tapegrad.tensor(idx), a, max_norm=1.0), \
        torch.nn.functional.embedding(torch.tensor(idx), b, max_norm=1.0)
    assert_close(ya, yb)
    assert_close(a, b)


def test_layer_norm():
    check(lambda T, x, w, b: F(T).layer_norm(x, (4,), w, b), [(3, 4), (4,), (4,)])
    check(lambda T, x: F(T).layer_norm(x, [2, 3], eps=1e-3), [(2, 2, 3)])
    check(lambda T, x, w: F(T).layer_norm(x, (3,), weight=w), [(2, 3), (3,)])


def test_layer_norm_fused_matches_composite():
    a = make_inputs([(3, 5)])[0]
    x, y = tapegrad.tensor(a, requires_grad=True), tapegrad.tensor(a, requires_grad=True)
    fused = TF.layer_norm(x, (5,))
    mu = y.sum(1, keepdim=True) / 5
    var = ((y - mu) * (y - mu)).sum(1, keepdim=True) / 5
    composite = (y - mu) / tapegrad.sqrt(var + 1e-5)
    assert_close(fused, composite)
    g = tapegrad.tensor(np.random.default_rng(1).standard_normal((3, 5)))
    fused.backward(g)
    composite.backward(g)
    assert_close(x.grad, y.grad, rtol=1e-10)


def test_rms_norm():
    check(lambda T, x, w: F(T).rms_norm(x, (4,), w), [(3, 4), (4,)])
    check(lambda T, x: F(T).rms_norm(x, [2, 3], eps=1e-4), [(2, 2, 3)])


def test_batch_norm_training_updates_running_stats():
    x, w, b = make_inputs([(4, 3, 2), (3,), (3,)])
    rm0, rv0 = np.linspace(-1, 1, 3), np.linspace(0.5, 2, 3)
    stats = {}
    for lib in (tapegrad, torch):
        rm, rv = lib.tensor(rm0.copy()), lib.tensor(rv0.copy())
        check_torch(lambda T, x, w, b: F(T).batch_norm(
            x, rm if T is lib else None, rv if T is lib else None, w, b, training=True,
            momentum=0.3), [x, w, b])
        stats[lib] = (rm, rv)
    # check_torch runs the function twice per library (float64 and float32 is skipped here)
    assert_close(stats[tapegrad][0], stats[torch][0])
    assert_close(stats[tapegrad][1], stats[torch][1])
    check(lambda T, x, w, b: F(T).batch_norm(x, None, None, w, b, training=True),
             [(3, 2, 2, 2), (2,), (2,)])
    check(lambda T, x: F(T).batch_norm(x, None, None, training=True, eps=1e-3), [(4, 3)])


def test_batch_norm_eval():
    rm, rv = np.array([0.1, -0.3]), np.array([0.7, 1.9])
    check(lambda T, x, w, b: F(T).batch_norm(x, T.tensor(rm, dtype=x.dtype),
                                                T.tensor(rv, dtype=x.dtype), w, b),
             [(3, 2, 2), (2,), (2,)])
    with pytest.raises(ValueError, match="more than 1 value per channel"):
        TF.batch_norm(tapegrad.randn(1, 3), None, None, training=True)


def test_group_norm():
    check(lambda T, x, w, b: F(T).group_norm(x, 2, w, b), [(2, 4, 3), (4,), (4,)])
    check(lambda T, x: F(T).group_norm(x, 1, eps=1e-3), [(2, 3, 2, 2)], float32=False)
    with pytest.raises(RuntimeError, match=r"group_norm.*divisible.*\[2, 4, 3\]"):
        TF.group_norm(tapegrad.randn(2, 4, 3), 3)


# --- convolution and pooling -----------------------------------------------------------
@pytest.mark.parametrize("kw", [dict(), dict(stride=2, padding=1), dict(dilation=2, padding=2),
                                dict(padding="same", dilation=(1, 2)), dict(groups=2),
                                dict(stride=(2, 1), padding=(0, 1), groups=2)])
def test_conv2d(kw):
    check(lambda T, x, w, b: F(T).conv2d(x, w, b, **kw), [(2, 2, 5, 5), (4, 2 // kw.get(
        "groups", 1), 3, 3), (4,)])


def test_conv2d_second_order_and_valid():
    check(lambda T, x, w: F(T).conv2d(x, w, padding="valid", stride=2), [(1, 2, 4, 4),
                                                                             (2, 2, 2, 2)])
    check(lambda T, x, w: F(T).conv2d(x, w, padding="same"), [(1, 1, 3, 3), (2, 1, 2, 2)],
             float32=False)
    check(lambda T, x, w: F(T).conv2d(x, w, groups=2, padding=1), [(1, 2, 3, 3),
                                                                       (2, 1, 2, 2)])


def test_conv1d():
    check(lambda T, x, w, b: F(T).conv1d(x, w, b, stride=2, padding=1), [(2, 2, 6), (3, 2, 3),
                                                                            (3,)])
    check(lambda T, x, w: F(T).conv1d(x, w, padding="same", dilation=2), [(2, 4), (2, 2, 2)])


def test_conv_transpose2d():
    check(lambda T, x, w, b: F(T).conv_transpose2d(x, w, b, stride=2, padding=1,
                                                      output_padding=1), [(2, 2, 3, 3),
                                                                          (2, 3, 3, 3), (3,)],
             )
    check(lambda T, x, w: F(T).conv_transpose2d(x, w, groups=2, dilation=2), [
        (1, 2, 2, 3), (2, 1, 2, 2)])
    # output_padding past the stride (allowed below the dilation): the adjoint crops
    check(lambda T, x, w: F(T).conv_transpose2d(x, w, dilation=3, output_padding=(2, 1)), [
        (1, 2, 2, 2), (2, 1, 2, 2)])


def test_conv_errors():
    x = tapegrad.randn(2, 4, 5, 5)
    with pytest.raises(RuntimeError, match=r"conv2d.*\[3, 2, 3, 3\].*input\[2, 4, 5, 5\].*2 "
                                           r"channels.*4 channels"):
        TF.conv2d(x, tapegrad.randn(3, 2, 3, 3))
    with pytest.raises(RuntimeError, match=r"conv2d.*padded input size.*\(5 x 5\).*\(7 x 7\)"):
        TF.conv2d(x, tapegrad.randn(3, 4, 7, 7))
    with pytest.raises(RuntimeError, match=r"conv1d.*\(2\).*\(3\)"):
        TF.conv1d(tapegrad.randn(1, 1, 2), tapegrad.randn(1, 1, 3))
    with pytest.raises(ValueError, match="strided"):
        TF.conv2d(x, tapegrad.randn(3, 4, 3, 3), stride=2, padding="same")


@pytest.mark.parametrize("kw", [dict(kernel_size=2), dict(kernel_size=3, stride=2, padding=1),
                                dict(kernel_size=2, stride=1, dilation=2),
                                dict(kernel_size=(3, 2), stride=2, ceil_mode=True)])
def test_max_pool2d(kw):
    check(lambda T, x: F(T).max_pool2d(x, **kw), [(2, 2, 5, 5)])


def test_max_pool2d_indices_and_ties():
    x = make_inputs([(1, 2, 4, 4)])[0]
    a, ia = TF.max_pool2d(tapegrad.tensor(x), 2, return_indices=True)
    b, ib = torch.nn.functional.max_pool2d(torch.tensor(x), 2, return_indices=True)
    assert_close(a, b)
    assert np.array_equal(ia.numpy(), ib.numpy())
    for lib in (tapegrad, torch):  # ties: the first maximum gets the gradient
        t = lib.tensor(np.ones((1, 1, 2, 2)), requires_grad=True)
        F(lib).max_pool2d(t, 2).sum().backward()
        np.testing.assert_array_equal(t.grad.numpy(), [[[[1, 0], [0, 0]]]])


@pytest.mark.parametrize("k, s, p, d", [(2, 2, 1, 3), (3, 2, 1, 2), (3, 1, 1, 1), (2, 1, 1, 2),
                                        (2, 2, 0, 1)])
def test_max_pool2d_window_of_only_minus_inf_picks_its_first_in_bounds_element(k, s, p, d):
    # PyTorch's kernel starts each window at its first in-bounds row/column (stepping by the
    # dilation); a window whose in-bounds values are all -inf keeps that index
    x = np.random.default_rng(5).standard_normal((2, 2, 7, 6))
    x[np.random.default_rng(6).random(x.shape) < 0.75] = -np.inf
    a, ia = TF.max_pool2d(tapegrad.tensor(x), k, s, p, d, return_indices=True)
    b, ib = torch.nn.functional.max_pool2d(torch.tensor(x), k, s, p, d, return_indices=True)
    np.testing.assert_array_equal(a.numpy(), b.numpy())
    np.testing.assert_array_equal(ia.numpy(), ib.numpy())
    # NaN wins, and of several NaNs in a window the last (PyTorch replaces its best by each)
    x[np.random.default_rng(7).random(x.shape) < 0.3] = np.nan
    for size in ((7, 6), (6, 6)):  # (6, 6) with k = s = 2, no padding: the tiled path
        y = x[:, :, :size[0], :size[1]]
        a, ia = TF.max_pool2d(tapegrad.tensor(y), k, s, p, d, return_indices=True)
        b, ib = torch.nn.functional.max_pool2d(torch.tensor(y), k, s, p, d, return_indices=True)
        np.testing.assert_array_equal(a.numpy(), b.numpy())
        np.testing.assert_array_equal(ia.numpy(), ib.numpy())


@pytest.mark.parametrize("kw", [dict(kernel_size=2), dict(kernel_size=3, stride=2, padding=1),
                                dict(kernel_size=3, stride=2, padding=1,
                                     count_include_pad=False),
                                dict(kernel_size=2, stride=2, ceil_mode=True, padding=1),
                                dict(kernel_size=2, divisor_override=3)])
def test_avg_pool2d(kw):
    check(lambda T, x: F(T).avg_pool2d(x, **kw), [(2, 2, 5, 5)])


@pytest.mark.parametrize("size", [2, (3, 2), (None, 1), 5])
def test_adaptive_avg_pool2d(size):
    check(lambda T, x: F(T).adaptive_avg_pool2d(x, size), [(1, 2, 5, 4)])


def test_pool_errors():
    with pytest.raises(RuntimeError, match="max_pool2d: pad should be at most half"):
        TF.max_pool2d(tapegrad.randn(1, 1, 4, 4), 2, padding=2)
    with pytest.raises(RuntimeError, match="avg_pool2d: Expected 3D or 4D"):
        TF.avg_pool2d(tapegrad.randn(4, 4), 2)


# --- attention -------------------------------------------------------------------------
def test_sdpa_plain_and_scale():
    check(lambda T, q, k, v: F(T).scaled_dot_product_attention(q, k, v), [(2, 3, 2),
                                                                            (2, 4, 2), (2, 4, 3)])
    check(lambda T, q, k, v: F(T).scaled_dot_product_attention(q, k, v, scale=0.3),
             [(1, 2, 2, 2), (1, 2, 3, 2), (1, 2, 3, 2)])


def test_sdpa_masks():
    mask = np.array([[True, False, True], [True, True, False]])
    check(lambda T, q, k, v: F(T).scaled_dot_product_attention(q, k, v, is_causal=True),
             [(1, 3, 2), (1, 3, 2), (1, 3, 2)])
    for L, S in ((2, 4), (4, 2)):  # a causal mask that is not square (L > S: no empty row)
        check(lambda T, q, k, v: F(T).scaled_dot_product_attention(q, k, v, is_causal=True),
              [(1, L, 2), (1, S, 2), (1, S, 3)])
    # the causal bias over host arrays is made once per (L, S, dtype), read-only
    from tapegrad.nn.functional import _causal_bias
    b = _causal_bias(3, 4, np.dtype(np.float32))
    assert b is _causal_bias(3, 4, np.dtype(np.float32)) and not b.flags.writeable
    assert b.dtype == np.float32 and np.array_equal(
        b, np.where(np.tril(np.ones((3, 4), bool)), 0, -np.inf).astype(np.float32))
    check(lambda T, q, k, v, m: F(T).scaled_dot_product_attention(q, k, v, attn_mask=m),
             [(1, 2, 2), (1, 3, 2), (1, 3, 2), mask])
    check(lambda T, q, k, v, m: F(T).scaled_dot_product_attention(q, k, v, attn_mask=m),
             [(1, 2, 2), (1, 3, 2), (1, 3, 2), (2, 3)])


def test_sdpa_grouped_query_heads():
    check(lambda T, q, k, v: F(T).scaled_dot_product_attention(q, k, v, enable_gqa=True),
          [(1, 4, 2, 2), (1, 2, 3, 2), (1, 2, 3, 2)])


def test_regression_losses_broadcast_with_warning():
    with pytest.warns(UserWarning, match="mse_loss: Using a target size"):
        check_torch(lambda T, x, y: F(T).mse_loss(x, y), make_inputs([(3, 4), (4,)]))


def test_sdpa_fused_matches_composite_and_dropout():
    q, k, v = (tapegrad.tensor(a, requires_grad=True) for a in make_inputs([(2, 3, 4)] * 3))
    out = TF.scaled_dot_product_attention(q, k, v)
    ref = TF.softmax(q @ k.mT * 0.5, -1) @ v
    assert_close(out, ref)
    tapegrad.manual_seed(0)
    d = TF.scaled_dot_product_attention(q, k, v, dropout_p=0.5)
    assert d.shape == (2, 3, 4) and not np.allclose(d.numpy(force=True), out.numpy(force=True))
    d.sum().backward()
    assert q.grad is not None and np.isfinite(q.grad.numpy()).all()
    dead = np.array([[False, False, False], [True, True, False], [True, True, True]])
    z = TF.scaled_dot_product_attention(q, k, v, attn_mask=tapegrad.tensor(dead))
    assert not z.numpy(force=True)[:, 0].any() and np.isfinite(z.numpy(force=True)).all()


# --- utilities -------------------------------------------------------------------------
def test_one_hot():
    t = np.array([[0, 3], [1, 1]])
    check_torch(lambda T, t: F(T).one_hot(t), [t], grad=False)
    check_torch(lambda T, t: F(T).one_hot(t, 6), [t], grad=False)
    with pytest.raises(RuntimeError, match="smaller than num_classes"):
        TF.one_hot(tapegrad.tensor([3]), 2)
    with pytest.raises(RuntimeError, match="non-negative"):
        TF.one_hot(tapegrad.tensor([-1]))


@pytest.mark.parametrize("p", [2.0, 1.0, 3.0])
def test_normalize(p):
    check(lambda T, x: F(T).normalize(x, p=p, dim=1), [(2, 3, 2)])
    check(lambda T, x: F(T).normalize(x, p=p, dim=0), [(4,)], float32=False,
             )


def test_cosine_similarity():
    check(lambda T, a, b: F(T).cosine_similarity(a, b), [(3, 4), (3, 4)])
    check(lambda T, a, b: F(T).cosine_similarity(a, b, dim=-1), [(2, 3), (3,)])
    z = np.zeros((2, 3))
    check_torch(lambda T, a, b: F(T).cosine_similarity(a, b), [z, make_inputs([(2, 3)])[0]])


@pytest.mark.parametrize("name,kwargs", [("relu", {}), ("leaky_relu", {"negative_slope": 0.1}),
                                         ("elu", {}), ("silu", {})])
def test_inplace_activations(name, kwargs):
    a = make_inputs([(3, 4)], away_from=0.0)[0]
    g = np.random.default_rng(2).standard_normal((3, 4))
    res = []
    for lib in (tapegrad, torch):
        x = lib.tensor(a, requires_grad=True)
        h = x * 2
        y = getattr(F(lib), name)(h, inplace=True, **kwargs)
        assert y is h
        y.backward(lib.tensor(g))
        res.append((h, x.grad))
    assert_close(res[0][0], res[1][0])
    assert_close(res[0][1], res[1][1])


def test_dropout_inplace():
    x = tapegrad.tensor(np.ones((4, 5)))
    y = TF.dropout(x, 0.5, inplace=True)
    assert y is x and set(np.unique(x.numpy())) <= {0.0, 2.0}


def test_pad_is_reexported():
    assert TF.pad is tapegrad.ops.movement.pad
    check(lambda T, x: F(T).pad(x, (1, 2, 0, 1), value=0.5), [(2, 3, 2)])


def test_linear_layer_norm_sdpa_errors():
    with pytest.raises(RuntimeError, match=r"linear: .*\(2, 3\).*\(4, 5\)"):
        TF.linear(tapegrad.randn(2, 3), tapegrad.randn(5, 4))
    with pytest.raises(RuntimeError, match=r"linear: .*same dtype.*float32.*float64"):
        TF.linear(tapegrad.randn(2, 3), tapegrad.randn(5, 3, dtype=tapegrad.float64))
    with pytest.raises(RuntimeError, match=r"layer_norm: .*normalized_shape=\[4\].*\[3, 5\]"):
        TF.layer_norm(tapegrad.randn(3, 5), (4,))
    with pytest.raises(RuntimeError, match=r"scaled_dot_product_attention: .*\[2, 3, 4\].*"
                                           r"\[2, 5, 3\]"):
        TF.scaled_dot_product_attention(tapegrad.randn(2, 3, 4), tapegrad.randn(2, 5, 3),
                                        tapegrad.randn(2, 5, 3))
    with pytest.raises(RuntimeError, match="is_causal"):
        q = tapegrad.randn(1, 2, 2)
        TF.scaled_dot_product_attention(q, q, q, attn_mask=tapegrad.ones(2, 2), is_causal=True)
    with pytest.raises(IndexError, match=r"embedding: index out of range"):
        TF.embedding(tapegrad.tensor([0, 5]), tapegrad.randn(5, 2))
    with pytest.raises(RuntimeError, match=r"batch_norm: running_mean should contain 3"):
        TF.batch_norm(tapegrad.randn(2, 3), tapegrad.zeros(4), tapegrad.ones(3))
    with pytest.raises(RuntimeError, match=r"conv_transpose2d: .*output padding must be smaller"
                                           r" than either stride or dilation"):
        TF.conv_transpose2d(tapegrad.randn(1, 2, 3, 3), tapegrad.randn(2, 1, 3, 3),
                            output_padding=1)
    with pytest.raises(RuntimeError, match=r"gelu: approximate"):
        TF.gelu(tapegrad.randn(2), approximate="fast")
    with pytest.raises(ValueError, match=r"mse_loss.*Weights and input"):
        TF.mse_loss(tapegrad.randn(2), tapegrad.randn(2), weight=tapegrad.ones(3))
    with pytest.raises(ValueError, match=r"binary_cross_entropy_with_logits.*\(3,\).*\(2,\)"):
        TF.binary_cross_entropy_with_logits(tapegrad.randn(2), tapegrad.rand(3))


# --- each fused op against its composite formulation in tapegrad's own primitives -------
def _conv2d_composite(x, w, stride, padding):
    x = tapegrad.ops.movement.pad(x, (padding,) * 4)
    kh, kw = w.shape[2:]
    oh = (x.shape[2] - kh) // stride + 1
    ow = (x.shape[3] - kw) // stride + 1
    out = 0
    for i in range(kh):  # a sum over kernel offsets of shifted 1x1 convolutions
        for j in range(kw):
            patch = x[:, :, i:i + stride * (oh - 1) + 1:stride, j:j + stride * (ow - 1) + 1:stride]
            out = out + tapegrad.einsum("nchw,oc->nohw", patch, w[:, :, i, j])
    return out


IDX = np.array([[1, 0, 3], [3, 3, 2]])
COMPOSITES = {
    "gelu": ([(3, 4)], lambda x: TF.gelu(x),
             lambda x: x * 0.5 * (1 + tapegrad.erf(x / np.sqrt(2.0)))),
    "gelu_tanh": ([(3, 4)], lambda x: TF.gelu(x, approximate="tanh"),
                  lambda x: 0.5 * x * (1 + tapegrad.tanh(np.sqrt(2 / np.pi)
                                                         * (x + 0.044715 * x ** 3)))),
    "softplus": ([(3, 4)], lambda x: TF.softplus(x, beta=1.5),
                 lambda x: tapegrad.log1p(tapegrad.exp(1.5 * x)) / 1.5),
    "elu": ([(3, 4)], lambda x: TF.elu(x, 0.7),
            lambda x: tapegrad.where(x > 0, x, 0.7 * tapegrad.expm1(x))),
    "log_sigmoid": ([(3, 4)], lambda x: TF.binary_cross_entropy_with_logits(
        x, 0.5 * tapegrad.ones(3, 4, dtype=tapegrad.float64)),
        lambda x: -(0.5 * tapegrad.log(tapegrad.sigmoid(x))
                    + 0.5 * tapegrad.log(1 - tapegrad.sigmoid(x))).mean()),
    "nll_loss": ([(4, 3)], lambda x: TF.nll_loss(x, tapegrad.tensor(TARGET)),
                 lambda x: -(TF.one_hot(tapegrad.tensor(TARGET), 3).double() * x).sum() / 4),
    "binary_cross_entropy": (
        [(3, 4)], lambda x: TF.binary_cross_entropy(tapegrad.sigmoid(x), 0.3 * tapegrad.ones(
            3, 4, dtype=tapegrad.float64)),
        lambda x: -(0.3 * tapegrad.log(tapegrad.sigmoid(x))
                    + 0.7 * tapegrad.log1p(-tapegrad.sigmoid(x))).mean()),
    "normalize": ([(3, 4)], lambda x: TF.normalize(x, dim=1),
                  lambda x: x / tapegrad.sqrt((x * x).sum(1, keepdim=True))),
    "batch_norm": ([(4, 3, 2)], lambda x: TF.batch_norm(x, None, None, training=True),
                   lambda x: (x - x.mean((0, 2), keepdim=True)) / tapegrad.sqrt(
                       x.var((0, 2), keepdim=True, correction=0) + 1e-5)),
    "embedding": ([(4, 3)], lambda w: TF.embedding(tapegrad.tensor(IDX), w),
                  lambda w: TF.one_hot(tapegrad.tensor(IDX), 4).double() @ w),
    "conv2d": ([(2, 3, 5, 5), (4, 3, 3, 3)], lambda x, w: TF.conv2d(x, w, stride=2, padding=1),
               lambda x, w: _conv2d_composite(x, w, 2, 1)),
    "max_pool2d": ([(2, 3, 4, 6)], lambda x: TF.max_pool2d(x, 2),
                   lambda x: x.reshape(2, 3, 2, 2, 3, 2).amax((3, 5))),
    "avg_pool2d": ([(2, 3, 4, 6)], lambda x: TF.avg_pool2d(x, 2),
                   lambda x: x.reshape(2, 3, 2, 2, 3, 2).mean((3, 5))),
}


@pytest.mark.parametrize("name", sorted(COMPOSITES))
def test_fused_matches_composite(name):
    specs, fused, composite = COMPOSITES[name]
    arrays = make_inputs(specs, seed=4)
    results = []
    for fn in (fused, composite):
        xs = [tapegrad.tensor(a, requires_grad=True) for a in arrays]
        out = fn(*xs)
        g = np.random.default_rng(5).standard_normal(out.shape)
        out.backward(tapegrad.tensor(g))
        results.append((out, [x.grad for x in xs]))
    assert_close(results[0][0], results[1][0], rtol=1e-11)
    for a, b in zip(results[0][1], results[1][1]):
        assert_close(a, b, rtol=1e-10, what="gradient")


def test_conv_transpose2d_is_the_adjoint_of_conv2d():
    x, w, y = make_inputs([(2, 4, 7, 6), (6, 2, 3, 2), (2, 6, 4, 3)], seed=6)
    kw = dict(stride=2, padding=1, dilation=(1, 2), groups=2)
    cx = TF.conv2d(tapegrad.tensor(x), tapegrad.tensor(w), **kw).numpy()
    ty = TF.conv_transpose2d(tapegrad.tensor(y), tapegrad.tensor(w), output_padding=(0, 1),
                             **kw).numpy()
    assert ty.shape == x.shape
    np.testing.assert_allclose((cx * y).sum(), (x * ty).sum(), rtol=1e-12)


# --- functions beyond API.md ---------------------------------------------------------------
@pytest.mark.parametrize("name,kwargs,kinks", [
    ("logsigmoid", {}, None), ("hardtanh", {}, [-1.0, 1.0]),
    ("hardtanh", {"min_val": -0.5, "max_val": 2.0}, [-0.5, 2.0]), ("relu6", {}, [0.0, 6.0]),
    ("hardsigmoid", {}, [-3.0, 3.0]), ("hardswish", {}, [-3.0, 3.0]), ("selu", {}, 0.0),
    ("celu", {"alpha": 0.5}, 0.0), ("mish", {}, None), ("softsign", {}, 0.0),
    ("glu", {}, None), ("glu", {"dim": 0}, None), ("softmin", {"dim": 1}, None)])
def test_more_activations(name, kwargs, kinks):
    # PyTorch's hardsigmoid backward multiplies by the float32 constant 1.0f / 6.0f
    rtol = 1e-7 if name == "hardsigmoid" else 1e-12
    kinks = None if kinks is None else np.asarray(kinks) / 4  # the input is scaled by 4
    check(lambda T, x: getattr(F(T), name)(x * 4, **kwargs), [(4, 4)], away_from=kinks, rtol=rtol)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_huber_and_kl_div(reduction):
    check(lambda T, d, y: F(T).huber_loss(d + y, y, reduction=reduction, delta=0.7),
          [(3, 4), (3, 4)], away_from=[-0.7, 0.0, 0.7])
    logp = np.log(np.random.default_rng(1).dirichlet(np.ones(4), size=3))
    p = np.random.default_rng(2).dirichlet(np.ones(4), size=3)
    p[0, 1] = 0.0
    red = "batchmean" if reduction == "mean" else reduction
    check(lambda T, x: F(T).kl_div(x, T.tensor(p, dtype=x.dtype), reduction=red), [logp])
    check(lambda T, x, t: F(T).kl_div(x, t, reduction=red), [logp, p + 0.1])
    check(lambda T, x, t: F(T).kl_div(x, t.log(), reduction=red, log_target=True),
          [logp, p + 0.1])


def test_unfold_fold():
    check(lambda T, x: F(T).unfold(x, (2, 3), padding=1, stride=(2, 1)), [(2, 2, 4, 5)])
    check(lambda T, x: F(T).unfold(x, 2, dilation=2), [(2, 5, 5)])
    check(lambda T, c: F(T).fold(c, (4, 5), (2, 3), padding=1, stride=(2, 1)), [(2, 12, 15)])
    with pytest.raises(RuntimeError, match="fold: .*sliding blocks"):
        TF.fold(tapegrad.randn(1, 12, 14), (4, 5), (2, 3), padding=1, stride=(2, 1))


def test_pixel_shuffle_and_pairwise_distance():
    check(lambda T, x: F(T).pixel_shuffle(x, 2), [(1, 8, 2, 3)])
    check(lambda T, x: F(T).pixel_unshuffle(x, 2), [(2, 4, 6)])
    check(lambda T, a, b: F(T).pairwise_distance(a, b), [(3, 4), (3, 4)])
    check(lambda T, a, b: F(T).pairwise_distance(a, b, p=1.0, keepdim=True), [(3, 4), (4,)])


@pytest.mark.parametrize("name,shape", [("dropout1d", (4, 30, 5)), ("dropout2d", (4, 30, 2, 3)),
                                        ("dropout3d", (30, 2, 2, 2))])
def test_channel_dropout(name, shape):
    tapegrad.manual_seed(1)
    x = tapegrad.tensor(np.ones(shape), requires_grad=True)
    y = getattr(TF, name)(x, p=0.4)
    v = y.numpy(force=True)
    per_channel = v.reshape(v.shape[:2] + (-1,)) if name != "dropout3d" else v.reshape(
        v.shape[0], 1, -1)
    assert (per_channel == per_channel[..., :1]).all()  # a channel is kept or dropped whole
    assert set(np.unique(v)) == {0.0, 1 / 0.6}
    y.sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), v)
    assert getattr(TF, name)(x, 0.4, training=False) is x


@pytest.mark.parametrize("shape,kw", [
    ((1, 2, 5), dict(size=8, mode="linear")),
    ((1, 2, 5), dict(scale_factor=1.7, mode="linear", align_corners=True)),
    ((1, 2, 3, 4), dict(size=(5, 7), mode="bilinear")),
    ((1, 2, 4, 4), dict(scale_factor=0.6, mode="bilinear")),
    ((1, 2, 3, 4), dict(scale_factor=(2, 1.5), mode="bilinear", align_corners=True)),
    ((1, 1, 2, 3, 2), dict(size=(3, 4, 3), mode="trilinear")),
    ((1, 2, 3, 4), dict(size=(6, 8))), ((1, 2, 3, 4), dict(size=(5, 3))),
    ((1, 2, 5), dict(scale_factor=1.5)), ((1, 2, 3, 4), dict(size=(5, 7), mode="nearest-exact")),
    ((1, 2, 6, 5), dict(size=(4, 2), mode="area")), ((1, 2, 7), dict(size=3, mode="area")),
    ((1, 2, 4, 4), dict(scale_factor=1.5, recompute_scale_factor=True, mode="bilinear"))])
def test_interpolate(shape, kw):
    check(lambda T, x: F(T).interpolate(x, **kw), [shape])


def test_interpolate_errors():
    x = tapegrad.randn(1, 1, 4, 4)
    with pytest.raises(ValueError, match="only one of size or scale_factor"):
        TF.interpolate(x, size=2, scale_factor=2)
    with pytest.raises(ValueError, match="align_corners option"):
        TF.interpolate(x, size=2, align_corners=True)
    with pytest.raises(NotImplementedError, match="interpolate: .*linear mode needs 3D"):
        TF.interpolate(x, size=2, mode="linear")


def test_instance_norm():
    check(lambda T, x, w, b: F(T).instance_norm(x, weight=w, bias=b), [(2, 3, 4), (3,), (3,)])
    x = make_inputs([(3, 2, 2, 3)])[0]
    rm0, rv0 = np.array([0.2, -0.1]), np.array([1.5, 0.6])
    out = []
    for lib in (tapegrad, torch):
        rm, rv = lib.tensor(rm0.copy()), lib.tensor(rv0.copy())
        y = F(lib).instance_norm(lib.tensor(x), rm, rv, momentum=0.2)
        z = F(lib).instance_norm(lib.tensor(x), rm, rv, use_input_stats=False)
        out.append((y, z, rm, rv))
    for a, b in zip(*out):
        assert_close(a, b)


SIGNS = np.array([1.0, -1.0, -1.0, 1.0])


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_more_losses(reduction):
    kw = dict(reduction=reduction)
    y = lambda T, x: T.tensor(SIGNS, dtype=x.dtype)  # noqa: E731
    check(lambda T, a, b: F(T).margin_ranking_loss(a, b, y(T, a), margin=0.3, **kw),
          [(4,), (4,)])
    check(lambda T, x: F(T).hinge_embedding_loss(x, y(T, x), margin=0.5, **kw), [(4,)])
    check(lambda T, x: F(T).soft_margin_loss(x, y(T, x), **kw), [(4,)])
    check(lambda T, x, t: F(T).multilabel_soft_margin_loss(x, t, **kw), [(2, 4), (2, 4)])
    check(lambda T, a, b: F(T).cosine_embedding_loss(a, b, y(T, a), margin=-0.2, **kw),
          [(4, 3), (4, 3)])
    check(lambda T, a, p, n: F(T).triplet_margin_loss(a, p, n, margin=2.0, swap=True, **kw),
          [(4, 3), (4, 3), (4, 3)])
    counts = np.array([[0.0, 1.0, 3.0], [2.0, 5.0, 0.0]])
    check(lambda T, x: F(T).poisson_nll_loss(x, T.tensor(counts, dtype=x.dtype), full=True,
                                             **kw), [(2, 3)])
    check(lambda T, x: F(T).poisson_nll_loss(x.exp(), T.tensor(counts, dtype=x.dtype),
                                             log_input=False, **kw), [(2, 3)])
    check(lambda T, x, t, v: F(T).gaussian_nll_loss(x, t, v.exp(), full=True, **kw),
          [(2, 3), (2, 3), (2,)])


# --- the class-index fast path of cross_entropy (one node, no one-hot target) -------------
@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("target", [[0, 3, 1, 2, 1], [0, 3, -100, 2, -100]])
def test_cross_entropy_index_path_matches_torch_and_the_general_path(reduction, target):
    t = np.array(target)
    check_op(lambda T, x: T.nn.functional.cross_entropy(x, T.tensor(t), reduction=reduction),
             [(5, 4)])
    x = tapegrad.tensor(np.random.default_rng(3).standard_normal((5, 4)), requires_grad=True)
    fast = tapegrad.nn.functional.cross_entropy(x, tapegrad.tensor(t), reduction=reduction)
    assert fast.grad_fn.name() == "CrossEntropyIndexBackward"
    rows = tapegrad.nn.functional.cross_entropy(x, tapegrad.tensor(t), reduction="none")
    general = rows.sum() / (t != -100).sum() if reduction == "mean" else rows.sum()
    np.testing.assert_allclose(fast.item(), general.item(), rtol=1e-15)


def test_cross_entropy_index_path_errors():
    x = tapegrad.tensor(np.zeros((2, 3)))
    for bad in ([3, 0], [-2, 0]):
        with pytest.raises(IndexError, match="out of bounds"):
            tapegrad.nn.functional.cross_entropy(x, tapegrad.tensor(bad))
    every_row_ignored = tapegrad.nn.functional.cross_entropy(x, tapegrad.tensor([-100, -100]))
    assert np.isnan(every_row_ignored.item())
