"""The fused activation, mask and normalisation ops (silu, leaky_relu, hardtanh's mask
backward, sigmoid, where's branch-free select, batch_norm's and group_norm's one-op forwards
and rules): PyTorch's values and gradients (1e-12 in float64, float32 within a few
roundings), gradcheck, second order, forward mode and vmap through ``check_op``; NaN,
infinities and limits; errors; the compiled step equal to eager bit for bit."""
import numpy as np
import pytest
import torch

import tapegrad
import tapegrad.nn.functional as F
from tapegrad.ops.elementwise import select
from helpers import check_op, assert_close

SPECIAL = np.array([-800.0, -720.0, -710.0, -40.0, -1.0, -0.0, 0.0, 1e-300, 1.0, 40.0, 800.0,
                    np.inf, -np.inf, np.nan])


# --- activations through check_op ----------------------------------------------------------
@pytest.mark.parametrize("fn", [
    lambda T, x: T.sigmoid(x),
    lambda T, x: T.nn.functional.silu(x),
    lambda T, x: T.nn.functional.silu(4 * x),
], ids=["sigmoid", "silu", "silu_wide"])
def test_smooth_activations(fn):
    check_op(fn, [(6, 7)])


@pytest.mark.parametrize("slope", [0.01, 0.2, 1.0, 0.0, 3.0, -0.5])
def test_leaky_relu(slope):
    check_op(lambda T, x: T.nn.functional.leaky_relu(x, slope), [(6, 7)], away_from=0.0)


@pytest.mark.parametrize("fn", [
    lambda T, x: T.nn.functional.relu6(3 * x),
    lambda T, x: T.nn.functional.hardtanh(x),
    lambda T, x: T.nn.functional.hardtanh(x, -0.5, 2.0),
], ids=["relu6", "hardtanh", "hardtanh_bounds"])
def test_hardtanh_mask_backward(fn):
    check_op(fn, [(6, 7)], away_from=[-1.0, -0.5, 0.0, 1.0, 2.0])


@pytest.mark.parametrize("shapes", [
    [(96, 96), (96, 96), (96, 96)],  # past select's size threshold: the branch-free path
    [(96, 96), (96,), (96, 1)],  # broadcast operands
    [(5, 4), (5, 4), (4,)],  # below it: numpy's where
])
def test_where(shapes):
    check_op(lambda T, c, x, y: T.where(c > 0, x * 2, y), shapes)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_large_activations_float32_and_64_agree_with_torch(dtype):
    # 131k elements (the wide MLP's layer): every fast path. float32 within a few roundings:
    # each op is <= 5 correctly rounded steps plus numpy's and Sleef's exp (each < 1 ulp)
    rtol = 1e-12 if dtype == np.float64 else 4e-7 * 8
    x = np.random.default_rng(0).standard_normal((256, 512)).astype(dtype) * 4
    g = np.random.default_rng(1).standard_normal((256, 512)).astype(dtype)
    for name in ("sigmoid", "silu", "leaky_relu", "relu6"):
        outs = []
        for lib, f in ((tapegrad, F), (torch, torch.nn.functional)):
            t = lib.tensor(x, requires_grad=True)
            y = {"sigmoid": lambda: lib.sigmoid(t), "silu": lambda: f.silu(t),
                 "leaky_relu": lambda: f.leaky_relu(t, 0.1), "relu6": lambda: f.relu6(t)}[name]()
            y.backward(lib.tensor(g))
            outs.append((y, t.grad))
        assert_close(outs[0][0], outs[1][0], rtol=rtol, what=f"{name} value")
        assert_close(outs[0][1], outs[1][1], rtol=rtol, what=f"{name} grad")


# --- NaN, infinities, limits --------------------------------------------------------------
def _both(name, x, g, *args):
    res = []
    for lib, f in ((tapegrad, F), (torch, torch.nn.functional)):
        t = lib.tensor(x, requires_grad=True)
        y = lib.sigmoid(t) if name == "sigmoid" else getattr(f, name)(t, *args)
        y.backward(lib.tensor(g))
        res.append((np.asarray(y.detach().numpy()), np.asarray(t.grad.numpy())))
    return res


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name,args", [("sigmoid", ()), ("silu", ()), ("leaky_relu", (0.1,)),
                                       ("leaky_relu", (0.0,)), ("leaky_relu", (2.0,)),
                                       ("relu6", ()), ("hardtanh", (-1.0, 1.0))])
@pytest.mark.parametrize("n", [1, 1024])  # one copy; then repeated past select's threshold
def test_special_values_match_torch(dtype, name, args, n):
    x = np.tile(SPECIAL, n).astype(dtype)
    g = np.ones_like(x)
    (y, gx), (ty, tgx) = _both(name, x, g, *args)
    if name in ("relu6", "hardtanh"):
        # at a NaN input PyTorch's vectorised loop gives 0, its scalar tail (a tensor of a
        # few elements) the gradient: tapegrad gives 0 at every size
        nan = np.isnan(x)
        assert (gx[nan] == 0).all()
        gx, tgx = gx[~nan], tgx[~nan]
    # limits: exp(-x) overflowing gives PyTorch's 0 (sigmoid(-720) is 0 there, not e^-720)
    np.testing.assert_allclose(y, ty, rtol=1e-6 if dtype == np.float32 else 1e-12, atol=0)
    np.testing.assert_allclose(gx, tgx, rtol=1e-6 if dtype == np.float32 else 1e-12, atol=0)
    assert np.array_equal(np.isnan(y), np.isnan(ty)) and np.array_equal(np.isnan(gx),
                                                                           np.isnan(tgx))


@pytest.mark.parametrize("name,args", [("leaky_relu", (0.1,)), ("relu6", ()),
                                       ("hardtanh", (-1.0, 1.0)), ("silu", ())])
def test_nan_and_inf_upstream_gradients_match_torch(name, args):
    # the masks select: a NaN or inf gradient is zeroed where PyTorch's backward zeroes it
    # (hardtanh outside its bounds) and passed on where it passes it (a NaN input included)
    x = np.tile(SPECIAL, 1024)
    g = np.tile([np.nan, np.inf, -np.inf, 1.0], x.size // 4 + 1)[:x.size]
    (_, gx), (_, tgx) = _both(name, x, g, *args)  # (PyTorch's vectorised loop: 1024 copies)
    np.testing.assert_allclose(gx, tgx, rtol=1e-12, atol=0)


def test_select_is_numpy_where_bit_for_bit():
    rng = np.random.default_rng(0)
    for dt in (np.float32, np.float64):
        for sc, sa, sb in [((120, 90), (120, 90), (120, 90)), ((120, 90), (90,), ()),
                           ((120, 1), (120, 90), (1, 90)), ((240, 90), (90,), (240, 1))]:
            c = rng.random(sc) > 0.5
            a = rng.standard_normal(sa).astype(dt)
            b = rng.standard_normal(sb).astype(dt)
            a.flat[::7] = np.nan
            a.flat[1::7] = -0.0
            a.flat[2::7] = -np.inf
            for cond in (c, c.astype(dt)):
                for x, y in ((a, b), (a, 0.0), (0.0, b), (a, -0.0), (a, 0.3), (np.inf, b)):
                    got, want = select(cond, x, y), np.where(cond, x, y)
                    assert got.dtype == want.dtype and got.shape == want.shape
                    assert np.array_equal(np.ascontiguousarray(got).view(np.uint8),
                                          np.ascontiguousarray(want).view(np.uint8))


def test_select_leaves_other_dtypes_to_numpy():
    c = np.arange(10000) % 3 == 0
    i = np.arange(10000)
    assert np.array_equal(select(c, i, -i), np.where(c, i, -i))
    f = np.ones(10000, np.float32)
    got = select(c, f, np.float64(2.0))  # a numpy scalar is no weak number: float64
    assert got.dtype == np.float64 and np.array_equal(got, np.where(c, f, np.float64(2.0)))


def test_sigmoid_and_silu_reduced_floats():
    # float16: computed in float32 and rounded once (silu), sigmoid as before
    x = np.linspace(-10, 10, 101).astype(np.float16)
    for name in ("silu", "sigmoid"):
        ours = (F.silu if name == "silu" else tapegrad.sigmoid)(tapegrad.tensor(x))
        theirs = getattr(torch.nn.functional, name)(torch.tensor(x))
        assert ours.dtype == tapegrad.float16
        np.testing.assert_allclose(ours.numpy().astype(np.float64),
                                   theirs.numpy().astype(np.float64), rtol=2e-3, atol=1e-3)


def test_integer_inputs_become_float():
    i = tapegrad.tensor([-2, 0, 3])
    assert F.silu(i).dtype == tapegrad.get_default_dtype()
    assert F.leaky_relu(i.float(), 0.5).tolist() == [-1.0, 0.0, 3.0]


# --- batch norm ---------------------------------------------------------------------------
@pytest.mark.parametrize("shape,affine", [((4, 3, 5, 6), True), ((4, 3, 5, 6), False),
                                          ((5, 3, 7), True), ((6, 3), True), ((6, 3), False)])
def test_batch_norm_training(shape, affine):
    c = shape[1]
    specs = [shape, (c,), (c,)] if affine else [shape]
    check_op(lambda T, x, *wb: T.nn.functional.batch_norm(x, None, None, *wb, training=True),
             specs)


def test_batch_norm_large_mean_keeps_digits():
    # the variance is that of the centred values (two passes): a mean 1e3 stds away from 0
    # still gives PyTorch's values at 1e-12 (the mean itself is good to ~ulp(1e3) = 1e-13);
    # one pass, E[x^2] - E[x]^2, would lose ~6 digits (ulp(1e6) = 1e-10 in the variance)
    x = np.random.default_rng(0).standard_normal((8, 4, 5, 5)) + 1e3
    ours = F.batch_norm(tapegrad.tensor(x), None, None, training=True)
    theirs = torch.nn.functional.batch_norm(torch.tensor(x), None, None, training=True)
    assert_close(ours, theirs, rtol=1e-12)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_batch_norm_module_step_matches_torch(dtype):
    # BatchNorm2d in training: output, input/weight/bias gradients and running stats.
    # float32: sums of 4096 values (pairwise) and a few roundings per element
    rtol = 1e-12 if dtype == np.float64 else 2e-5
    rng = np.random.default_rng(0)
    x = rng.standard_normal((16, 16, 16, 16)).astype(dtype)
    g = rng.standard_normal(x.shape).astype(dtype)
    res = []
    for lib in (tapegrad, torch):
        bn = lib.nn.BatchNorm2d(16)
        if dtype == np.float64:
            bn = bn.double()
        with lib.no_grad():
            bn.weight.copy_(lib.tensor(np.linspace(0.5, 1.5, 16).astype(dtype)))
            bn.bias.copy_(lib.tensor(np.linspace(-1, 1, 16).astype(dtype)))
        t = lib.tensor(x, requires_grad=True)
        y = bn(t)
        y.backward(lib.tensor(g))
        res.append((y, t.grad, bn.weight.grad, bn.bias.grad, bn.running_mean, bn.running_var))
    for i, (a, b) in enumerate(zip(*res)):
        assert_close(a, b, rtol=rtol, what=f"output {i}")


def test_batch_norm_errors():
    x = tapegrad.randn(4, 3, 5)
    with pytest.raises(RuntimeError, match=r"batch_norm: weight should contain 3 elements"):
        F.batch_norm(x, None, None, tapegrad.ones(4), training=True)
    with pytest.raises(ValueError, match=r"batch_norm: Expected more than 1 value per channel"):
        F.batch_norm(tapegrad.randn(1, 3), None, None, training=True)
    with pytest.raises(ValueError, match=r"hardtanh: min_val"):
        F.hardtanh(x, 2.0, 1.0)


def test_batch_norm_empty_batch():
    x = tapegrad.zeros(0, 3, 4, requires_grad=True)
    y = F.batch_norm(x, None, None, tapegrad.ones(3), tapegrad.zeros(3), training=True)
    assert tuple(y.shape) == (0, 3, 4)


# --- group norm ---------------------------------------------------------------------------
@pytest.mark.parametrize("shape,groups,affine", [((3, 4, 5, 6), 2, "wb"), ((3, 4, 5), 2, "w"),
                                                 ((3, 4, 5), 4, ""), ((5, 6), 2, "wb"),
                                                 ((2, 3, 4, 2), 1, "wb")])
def test_group_norm(shape, groups, affine):
    # (a bias without a weight is left out: PyTorch's backward fails on it, "tensor does not
    # have a device")
    c = shape[1]
    specs = [shape] + [(c,)] * len(affine)
    check_op(lambda T, x, *wb: T.nn.functional.group_norm(x, groups, *wb), specs)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_group_norm_module_step_matches_torch(dtype):
    # the U-Net's GroupNorm(4, 16) on (8, 16, 8, 8); float32: sums of 256 values, a few
    # roundings per element
    rtol = 1e-12 if dtype == np.float64 else 2e-5
    rng = np.random.default_rng(0)
    x = rng.standard_normal((8, 16, 8, 8)).astype(dtype) * 3 + 1
    g = rng.standard_normal(x.shape).astype(dtype)
    res = []
    for lib in (tapegrad, torch):
        gn = lib.nn.GroupNorm(4, 16)
        if dtype == np.float64:
            gn = gn.double()
        with lib.no_grad():
            gn.weight.copy_(lib.tensor(np.linspace(0.5, 1.5, 16).astype(dtype)))
            gn.bias.copy_(lib.tensor(np.linspace(-1, 1, 16).astype(dtype)))
        t = lib.tensor(x, requires_grad=True)
        y = gn(t)
        y.backward(lib.tensor(g))
        res.append((y, t.grad, gn.weight.grad, gn.bias.grad))
    for i, (a, b) in enumerate(zip(*res)):
        assert_close(a, b, rtol=rtol, what=f"output {i}")


def test_group_norm_vmap_over_weights_only():
    # an unbatched input with per-example weights: vmap loops over the batch
    from tapegrad.func import vmap

    x, w = tapegrad.randn(3, 4, 5), tapegrad.randn(2, 4)
    with pytest.warns(UserWarning, match="group_norm"):
        out = vmap(lambda w_: F.group_norm(x, 2, w_))(w)
    want = np.stack([F.group_norm(x, 2, w[i]).numpy() for i in range(2)])
    assert np.array_equal(out.numpy(), want)


def test_group_norm_errors_and_empty():
    x = tapegrad.randn(2, 6, 3)
    with pytest.raises(RuntimeError, match=r"group_norm: Expected number of channels"):
        F.group_norm(x, 4)
    with pytest.raises(RuntimeError, match=r"group_norm: Expected weight to be a vector"):
        F.group_norm(x, 3, tapegrad.ones(5))
    e = F.group_norm(tapegrad.zeros(0, 6, 3, requires_grad=True), 3, tapegrad.ones(6))
    assert tuple(e.shape) == (0, 6, 3)


def test_group_norm_float16_in_float32():
    x = np.random.default_rng(0).standard_normal((2, 4, 8)).astype(np.float16)
    ours = F.group_norm(tapegrad.tensor(x), 2)
    theirs = torch.nn.functional.group_norm(torch.tensor(x), 2)
    assert ours.dtype == tapegrad.float16
    # computed in float32 and rounded once to float16 (half an ulp: 2^-11 relative)
    np.testing.assert_allclose(ours.numpy().astype(np.float64),
                               theirs.numpy().astype(np.float64), rtol=1e-3, atol=1e-3)


# --- compiled: one graph, eager's bits ----------------------------------------------------
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_compiled_step_equals_eager_bitwise(dtype):
    rng = np.random.default_rng(0)
    x0 = rng.standard_normal((8, 4, 6, 6)).astype(dtype)
    w0 = rng.standard_normal((4,)).astype(dtype)

    def step(x, w):
        h = F.batch_norm(x, None, None, w, None, training=True)
        h = F.silu(h) + F.leaky_relu(h, 0.1) + F.relu6(3 * F.group_norm(h, 2, w))
        y = tapegrad.where(h > 0.5, tapegrad.sigmoid(h), h * 0.25)
        loss = (y * y).sum()
        loss.backward()
        return loss

    def run(fn):
        x = tapegrad.tensor(x0, requires_grad=True)
        w = tapegrad.tensor(w0, requires_grad=True)
        loss = fn(x, w)
        return loss.detach().numpy(), x.grad.numpy(), w.grad.numpy()

    eager = run(step)
    compiled_step = tapegrad.compile(step)
    for _ in range(3):  # traced, then generated code
        compiled = run(compiled_step)
        for a, b in zip(eager, compiled):
            assert np.array_equal(a, b)
    ex = tapegrad.compiler.explain(step)(tapegrad.tensor(x0, requires_grad=True),
                                         tapegrad.tensor(w0, requires_grad=True))
    assert (ex.graph_count, ex.graph_break_count) == (1, 0)
