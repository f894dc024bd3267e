"""Autocast and GradScaler against PyTorch 2.13's CPU autocast (the oracle).

Each case is written once as ``fn(T, F, r)`` and run with ``T = tapegrad`` and ``T = torch``
inside ``T.autocast("cpu", dtype=...)``; ``r(shape, dtype)`` builds the same random input in
both. Output dtypes must agree; values must agree to the lower precision's rounding.
"""
import pickle
import threading
import warnings

import numpy as np
import pytest
import torch

import tapegrad
import tapegrad.nn.functional as tF


def _inputs(T):
    rng = np.random.default_rng(0)

    def r(shape, dt="float32", positive=False):
        a = rng.standard_normal(shape)
        if positive:
            a = np.abs(a) + 0.1
        return T.tensor(a).to(getattr(T, dt))

    return r


def _ones(T, n, dt="bfloat16"):
    return T.ones(n, dtype=getattr(T, dt))


def _idx(T, *v):
    return T.tensor(list(v))


# name: (fn(T, F, r), what PyTorch lists it as). Covers every op of PyTorch's CPU lists that
# tapegrad has, with float32 inputs (lower precision ops) or bfloat16 inputs (float32 ops),
# and unlisted ops whose dtype must stay as without autocast.
CASES = {
    # lower_precision_fp
    "matmul": lambda T, F, r: T.matmul(r((3, 4)), r((4, 5))),
    "matmul_op": lambda T, F, r: r((3, 4)) @ r((4, 5), "bfloat16"),
    "matmul_batched": lambda T, F, r: r((2, 3, 4)) @ r((4, 5)),
    "matmul_float64": lambda T, F, r: r((3, 4), "float64") @ r((4, 5), "float64"),
    "mm": lambda T, F, r: T.mm(r((3, 4)), r((4, 5), "bfloat16")),
    "bmm": lambda T, F, r: T.bmm(r((2, 3, 4)), r((2, 4, 5))),
    "linear": lambda T, F, r: F.linear(r((3, 4)), r((5, 4)), r((5,))),
    "linear_nobias": lambda T, F, r: F.linear(r((2, 3, 4)), r((5, 4))),
    "conv1d": lambda T, F, r: F.conv1d(r((1, 2, 8)), r((3, 2, 3)), r((3,)), padding=1),
    "conv2d": lambda T, F, r: F.conv2d(r((1, 2, 5, 5)), r((3, 2, 3, 3)), r((3,)), stride=2),
    "conv_transpose2d": lambda T, F, r: F.conv_transpose2d(r((1, 2, 4, 4)), r((2, 3, 3, 3)),
                                                           r((3,))),
    "sdpa": lambda T, F, r: F.scaled_dot_product_attention(r((1, 2, 3, 4)), r((1, 2, 3, 4)),
                                                           r((1, 2, 3, 4))),
    "einsum_matmul": lambda T, F, r: T.einsum("ij,jk->ik", r((3, 4)), r((4, 5))),
    "einsum_batched": lambda T, F, r: T.einsum("bij,bjk->bik", r((2, 3, 4)), r((2, 4, 5))),
    "einsum_inner": lambda T, F, r: T.einsum("i,i->", r((4,)), r((4,))),
    "einsum_product": lambda T, F, r: T.einsum("i,i->i", r((4,)), r((4,))),
    "einsum_sum": lambda T, F, r: T.einsum("ij->i", r((3, 4))),
    "mha": lambda T, F, r: T.nn.MultiheadAttention(4, 2)(r((3, 1, 4)), r((3, 1, 4)),
                                                          r((3, 1, 4)))[0],
    # fp32
    "prod": lambda T, F, r: T.prod(r((3, 4), "bfloat16")),
    "prod_dim": lambda T, F, r: T.prod(r((3, 4), "bfloat16"), 1),
    "mse_loss": lambda T, F, r: F.mse_loss(r((3, 4), "bfloat16"), r((3, 4), "bfloat16")),
    "l1_loss": lambda T, F, r: F.l1_loss(r((3, 4), "bfloat16"), r((3, 4), "bfloat16")),
    "smooth_l1_loss": lambda T, F, r: F.smooth_l1_loss(r((3, 4), "bfloat16"),
                                                       r((3, 4), "bfloat16")),
    "huber_loss": lambda T, F, r: F.huber_loss(r((3, 4), "bfloat16"), r((3, 4), "bfloat16")),
    "cross_entropy": lambda T, F, r: F.cross_entropy(r((3, 4), "bfloat16"), _idx(T, 0, 1, 2)),
    "cross_entropy_probs": lambda T, F, r: F.cross_entropy(
        r((3, 4), "bfloat16"), F.softmax(r((3, 4), "bfloat16"), -1)),
    "cross_entropy_smooth": lambda T, F, r: F.cross_entropy(
        r((3, 4), "bfloat16"), _idx(T, 0, 1, 2), label_smoothing=0.1),
    "nll_loss": lambda T, F, r: F.nll_loss(r((3, 4), "bfloat16"), _idx(T, 0, 1, 2)),
    "binary_cross_entropy": lambda T, F, r: F.binary_cross_entropy(
        T.sigmoid(r((3, 4), "bfloat16")), T.sigmoid(r((3, 4), "bfloat16"))),
    "bce_with_logits": lambda T, F, r: F.binary_cross_entropy_with_logits(
        r((3, 4), "bfloat16"), T.sigmoid(r((3, 4), "bfloat16"))),
    "kl_div": lambda T, F, r: F.kl_div(r((3, 4), "bfloat16"), r((3, 4), "bfloat16", True),
                                       reduction="batchmean"),
    "margin_ranking_loss": lambda T, F, r: F.margin_ranking_loss(
        r((3,), "bfloat16"), r((3,), "bfloat16"), _ones(T, 3)),
    "hinge_embedding_loss": lambda T, F, r: F.hinge_embedding_loss(r((3,), "bfloat16"),
                                                                   _ones(T, 3)),
    "soft_margin_loss": lambda T, F, r: F.soft_margin_loss(r((3,), "bfloat16"), _ones(T, 3)),
    "cosine_embedding_loss": lambda T, F, r: F.cosine_embedding_loss(
        r((3, 4), "bfloat16"), r((3, 4), "bfloat16"), _ones(T, 3)),
    "triplet_margin_loss": lambda T, F, r: F.triplet_margin_loss(
        r((3, 4), "bfloat16"), r((3, 4), "bfloat16"), r((3, 4), "bfloat16")),
    "poisson_nll_loss": lambda T, F, r: F.poisson_nll_loss(r((3, 4), "bfloat16"),
                                                           r((3, 4), "bfloat16", True)),
    "reflection_pad1d": lambda T, F, r: F.pad(r((1, 2, 5), "bfloat16"), (1, 1), mode="reflect"),
    "reflection_pad2d": lambda T, F, r: F.pad(r((1, 2, 5, 5), "bfloat16"), (1, 1, 1, 1),
                                              mode="reflect"),
    "replication_pad1d": lambda T, F, r: F.pad(r((1, 2, 5), "bfloat16"), (1, 2),
                                               mode="replicate"),
    "replication_pad2d": lambda T, F, r: F.pad(r((1, 2, 5, 5), "bfloat16"), (1, 1, 2, 0),
                                               mode="replicate"),
    "linalg_inv": lambda T, F, r: T.linalg.inv(r((3, 3), "bfloat16") + 3 * T.eye(3)),
    "linalg_solve": lambda T, F, r: T.linalg.solve(r((3, 3), "bfloat16") + 3 * T.eye(3),
                                                   r((3, 2), "bfloat16")),
    "linalg_cholesky": lambda T, F, r: T.linalg.cholesky(
        (lambda a: a @ a.mT + T.eye(3))(r((3, 3), "bfloat16"))),
    "linalg_eigh": lambda T, F, r: T.linalg.eigh(
        (lambda a: a @ a.mT + T.eye(3))(r((3, 3), "bfloat16")))[0],
    # promote
    "cat_mixed": lambda T, F, r: T.cat([r((3,), "bfloat16"), r((3,))]),
    "cat_lower": lambda T, F, r: T.cat([r((3,), "bfloat16"), r((3,), "bfloat16")]),
    "cat_float64": lambda T, F, r: T.cat([r((3,), "float64"), r((3,), "bfloat16")]),
    "stack_mixed": lambda T, F, r: T.stack([r((3,), "bfloat16"), r((3,))]),
    "stack_lower": lambda T, F, r: T.stack([r((3,), "bfloat16"), r((3,), "bfloat16")]),
    # unlisted: run in their inputs' dtypes
    "dot": lambda T, F, r: T.dot(r((4,)), r((4,))),
    "outer": lambda T, F, r: T.outer(r((4,)), r((4,))),
    "unfold": lambda T, F, r: F.unfold(r((1, 2, 4, 4)), 2),
    "reflection_pad3d": lambda T, F, r: F.pad(r((1, 2, 3, 3, 3), "bfloat16"), (1,) * 6,
                                              mode="reflect"),
    "circular_pad": lambda T, F, r: F.pad(r((1, 2, 5), "bfloat16"), (1, 1), mode="circular"),
    "constant_pad": lambda T, F, r: F.pad(r((1, 2, 5), "bfloat16"), (1, 1)),
    "softmax": lambda T, F, r: F.softmax(r((3, 4)), -1),
    "softmax_lower": lambda T, F, r: F.softmax(r((3, 4), "bfloat16"), -1),
    "log_softmax_lower": lambda T, F, r: F.log_softmax(r((3, 4), "bfloat16"), -1),
    "sum_lower": lambda T, F, r: T.sum(r((3, 4), "bfloat16")),
    "cumsum_lower": lambda T, F, r: T.cumsum(r((3, 4), "bfloat16"), 0),
    "exp_lower": lambda T, F, r: T.exp(r((3,), "bfloat16")),
    "gelu_lower": lambda T, F, r: F.gelu(r((3,), "bfloat16")),
    "add_mixed": lambda T, F, r: r((3,), "bfloat16") + r((3,)),
    "where_mixed": lambda T, F, r: T.where(r((3,)) > 0, r((3,), "bfloat16"), r((3,))),
    "max_pool2d": lambda T, F, r: F.max_pool2d(r((1, 1, 4, 4), "bfloat16"), 2),
    "avg_pool2d": lambda T, F, r: F.avg_pool2d(r((1, 1, 4, 4), "bfloat16"), 2),
    "embedding": lambda T, F, r: F.embedding(_idx(T, 0, 2), r((3, 4))),
    "gaussian_nll_loss": lambda T, F, r: F.gaussian_nll_loss(
        r((3, 4), "bfloat16"), r((3, 4), "bfloat16"), r((3, 4), "bfloat16", True)),
    "normalize": lambda T, F, r: F.normalize(r((3, 4), "bfloat16")),
    "logsumexp": lambda T, F, r: T.logsumexp(r((3, 4), "bfloat16"), 1),
}


def _run(T, F, fn, dtype="bfloat16"):
    T.manual_seed(0)
    r = _inputs(T)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with T.autocast("cpu", dtype=getattr(T, dtype)):
            return fn(T, F, r)


@pytest.mark.parametrize("name", sorted(CASES))
def test_output_dtype_as_torch(name):
    fn = CASES[name]
    expected = _run(torch, torch.nn.functional, fn)
    got = _run(tapegrad, tF, fn)
    assert str(got.dtype).split(".")[-1] == str(expected.dtype).split(".")[-1], name
    if name != "mha":  # its weights are random per library
        e = expected.detach().float().numpy()
        g = got.detach().float().numpy()
        np.testing.assert_allclose(g, e, rtol=2 ** -7, atol=2 ** -7 * np.abs(e).max())


# --- behaviour of the region ------------------------------------------------------------------
def test_state_functions_and_nesting():
    assert not tapegrad.is_autocast_enabled("cpu")
    assert tapegrad.get_autocast_dtype("cpu") is tapegrad.bfloat16
    assert tapegrad.get_autocast_dtype("cuda") is tapegrad.float16
    x = tapegrad.randn(3, 4)
    with tapegrad.autocast("cpu"):
        assert tapegrad.is_autocast_enabled("cpu") and not tapegrad.is_autocast_enabled()
        assert (x @ x.T).dtype is tapegrad.bfloat16
        with tapegrad.autocast("cpu", enabled=False):
            assert not tapegrad.is_autocast_enabled("cpu")
            assert (x @ x.T).dtype is tapegrad.float32
            with tapegrad.autocast("cpu", dtype=tapegrad.float16):
                assert (x @ x.T).dtype is tapegrad.float16
        assert (x @ x.T).dtype is tapegrad.bfloat16
    assert not tapegrad.is_autocast_enabled("cpu")
    assert (x @ x.T).dtype is tapegrad.float32


def test_decorator_and_deprecated_spellings():
    @tapegrad.autocast("cpu")
    def f(x):
        return x @ x.T

    x = tapegrad.randn(3, 4)
    assert f(x).dtype is tapegrad.bfloat16
    with pytest.warns(FutureWarning, match="torch.cpu.amp.autocast"):
        ctx = tapegrad.cpu.amp.autocast()
    with ctx:
        assert tapegrad.is_autocast_enabled("cpu")
    with pytest.warns(FutureWarning, match="torch.cuda.amp.autocast"):
        with pytest.warns(UserWarning, match="CUDA is not available"):
            ctx = tapegrad.cuda.amp.autocast()
    assert ctx._enabled is False
    with pytest.warns(UserWarning, match="target dtype is not supported"):
        assert tapegrad.autocast("cpu", dtype=tapegrad.float32)._enabled is False
    with pytest.raises(ValueError, match="device_type"):
        tapegrad.autocast(1)


def test_per_thread():
    seen = {}
    x = tapegrad.randn(3, 4)
    go, done = threading.Event(), threading.Event()

    def other():
        go.wait()
        seen["enabled"] = tapegrad.is_autocast_enabled("cpu")
        seen["dtype"] = (x @ x.T).dtype
        done.set()

    t = threading.Thread(target=other)
    t.start()
    with tapegrad.autocast("cpu"):
        go.set()
        done.wait()
        assert (x @ x.T).dtype is tapegrad.bfloat16
    t.join()
    assert seen == {"enabled": False, "dtype": tapegrad.float32}


def test_prioritize_error_and_float64_untouched():
    with tapegrad.autocast("cpu"):
        h = tapegrad.randn(3).half()
        with pytest.raises(RuntimeError, match="cat: Unexpected floating ScalarType"):
            tapegrad.cat([h, h])
        d = tapegrad.randn(3, 3, dtype=tapegrad.float64)
        assert (d @ d).dtype is tapegrad.float64


def test_gradients_flow_back_in_input_dtypes_and_weight_cache():
    r = _inputs(torch)
    xt, wt = r((4, 3)).requires_grad_(), r((5, 3)).requires_grad_()
    r = _inputs(tapegrad)
    xg, wg = r((4, 3)).requires_grad_(), r((5, 3)).requires_grad_()
    for T, F, x, w in ((torch, torch.nn.functional, xt, wt), (tapegrad, tF, xg, wg)):
        with T.autocast("cpu"):
            y = F.linear(x, w)
            z = F.linear(x * 2, w)  # the cached cast of w: one node, two uses
            loss = F.mse_loss(y + z, T.zeros(4, 5))
        loss.backward()
    assert xg.grad.dtype is tapegrad.float32 and wg.grad.dtype is tapegrad.float32
    np.testing.assert_allclose(xg.grad.numpy(), xt.grad.numpy(), rtol=1e-2, atol=1e-2)
    np.testing.assert_allclose(wg.grad.numpy(), wt.grad.numpy(), rtol=1e-2, atol=1e-2)
    with tapegrad.autocast("cpu"):
        a = tF.linear(xg, wg)
        b = tF.linear(xg, wg)
    assert a.grad_fn.parents[1] is b.grad_fn.parents[1]  # the same cast Node of the weight


# --- training against PyTorch ---------------------------------------------------------------
def _mlp(T):
    T.manual_seed(0)
    nn = T.nn
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16), nn.GELU(),
                         nn.Linear(16, 3))


def _cnn(T):
    nn = T.nn
    return nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(4, 6, 3), nn.ReLU(), nn.Flatten(), nn.Linear(6, 3))


def _train(T, model, x, y, steps=20):
    opt = T.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        with T.autocast("cpu", dtype=T.bfloat16):
            out = model(x)
            loss = T.nn.functional.cross_entropy(out, y)
        assert out.dtype is T.bfloat16 and loss.dtype is T.float32
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("build,shape", [(_mlp, (32, 8)), (_cnn, (16, 1, 6, 6))])
def test_training_matches_torch(build, shape):
    rng = np.random.default_rng(1)
    x, y = rng.standard_normal(shape).astype(np.float32), rng.integers(0, 3, shape[0])
    tm = build(torch)
    gm = build(tapegrad)
    gm.load_state_dict({k: tapegrad.tensor(v.detach().numpy()) for k, v in
                        tm.state_dict().items()})
    lt, st = _train(torch, tm, torch.tensor(x), torch.tensor(y))
    lg, sg = _train(tapegrad, gm, tapegrad.tensor(x), tapegrad.tensor(y))
    assert lg[-1] < lg[0]
    # bfloat16 keeps 8 bits: the runs may differ by a rounding flip, never drift apart
    np.testing.assert_allclose(lg, lt, rtol=2e-2, atol=2e-2)
    for k in st:
        np.testing.assert_allclose(sg[k], st[k], rtol=5e-2, atol=5e-2, err_msg=k)


# --- GradScaler -------------------------------------------------------------------------------
def _scaler_run(T, scaler, steps=14):
    """A tiny float32 model whose loss is multiplied by a huge factor on some steps (inf/NaN
    gradients after scaling), with unscale_ + clipping on others."""
    T.manual_seed(0)
    w = T.nn.Parameter(T.tensor([[0.5, -0.25], [0.125, 1.0]]))
    b = T.nn.Parameter(T.tensor([0.1, -0.1]))
    opt = T.optim.SGD([w, b], lr=0.01)
    x = T.tensor([[1.0, 2.0], [3.0, -1.0]])
    log = []
    for i in range(steps):
        opt.zero_grad()
        loss = ((x @ w.T + b) ** 2).sum() * (3e38 if i in (2, 3, 9) else 1.0)
        scaler.scale(loss).backward()
        if i % 4 == 1:
            scaler.unscale_(opt)
            T.nn.utils.clip_grad_norm_([w, b], 1.0)
        scaler.step(opt)
        scaler.update()
        log.append((scaler.get_scale(), scaler._get_growth_tracker(),
                    w.detach().numpy().copy(), b.detach().numpy().copy()))
    return log


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the overflows it provokes
def test_grad_scaler_matches_torch():
    kw = dict(init_scale=2.0 ** 10, growth_factor=1.7, backoff_factor=0.3, growth_interval=3)
    lt = _scaler_run(torch, torch.amp.GradScaler("cpu", **kw))
    lg = _scaler_run(tapegrad, tapegrad.amp.GradScaler("cpu", **kw))
    scales = [s for s, *_ in lt]
    assert len(set(scales)) > 3  # backed off and grew
    for (st, gt, wt, bt), (sg, gg, wg, bg) in zip(lt, lg):
        assert sg == st and gg == gt  # the scale and tracker exactly
        np.testing.assert_allclose(wg, wt, rtol=1e-6)  # float32 clipping and SGD: to rounding
        np.testing.assert_allclose(bg, bt, rtol=1e-6)


def test_grad_scaler_state_machine_and_state_dict():
    for T in (torch, tapegrad):
        scaler = T.amp.GradScaler("cpu", init_scale=8.0, growth_interval=2)
        w = T.nn.Parameter(T.ones(2))
        opt = T.optim.SGD([w], lr=0.1)
        scaler.scale((w * 2).sum()).backward()
        scaler.unscale_(opt)
        with pytest.raises(RuntimeError, match="unscale_\\(\\) has already been called"):
            scaler.unscale_(opt)
        scaler.step(opt)
        with pytest.raises(RuntimeError, match="step\\(\\) has already been called"):
            scaler.step(opt)
        with pytest.raises(RuntimeError, match="unscale_\\(\\) is being called after step"):
            scaler.unscale_(opt)
        with pytest.raises(RuntimeError, match="Closure use"):
            scaler.step(opt, closure=lambda: 0)
        scaler.update()
        sd = scaler.state_dict()
        assert sd == {"scale": 8.0, "growth_factor": 2.0, "backoff_factor": 0.5,
                      "growth_interval": 2, "_growth_tracker": 1}
        other = T.amp.GradScaler("cpu")
        other.load_state_dict(sd)
        assert other.state_dict() == sd
        clone = pickle.loads(pickle.dumps(scaler))
        assert clone.state_dict() == sd
        fresh = T.amp.GradScaler("cpu")
        with pytest.raises(AssertionError, match="Attempted step but _scale is None"):
            fresh.step(opt)
        off = T.amp.GradScaler("cpu", enabled=False)
        assert off.state_dict() == {} and off.get_scale() == 1.0
        loss = (w * 2).sum()
        assert off.scale(loss) is loss
        with pytest.raises(RuntimeError, match="source state dict is empty"):
            T.amp.GradScaler("cpu").load_state_dict({})


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the overflows it provokes
def test_grad_scaler_without_cuda_disables_itself():
    with pytest.warns(UserWarning, match="CUDA is not available.  Disabling"):
        assert not tapegrad.amp.GradScaler().is_enabled()
    with pytest.warns(FutureWarning, match="torch.cuda.amp.GradScaler"):
        with pytest.warns(UserWarning, match="Disabling"):
            assert not tapegrad.cuda.amp.GradScaler().is_enabled()
    with pytest.warns(FutureWarning, match="torch.cpu.amp.GradScaler"):
        assert tapegrad.cpu.amp.GradScaler().is_enabled()
    with pytest.raises(ValueError, match="Attempting to unscale FP16 gradients"):
        scaler = tapegrad.amp.GradScaler("cpu")
        w = tapegrad.nn.Parameter(tapegrad.ones(2).half())
        opt = tapegrad.optim.SGD([w], lr=0.1)
        scaler.scale(w.float().sum()).backward()
        scaler.step(opt)


def test_mixed_precision_example_small():
    from tapegrad.examples import mixed_precision

    results = mixed_precision.main(["--steps", "100"])  # ~5 s
    unscaled, scaled, bf16 = (results[m] for m in mixed_precision.MODES)
    assert unscaled[1] > 0.9  # float16 without scaling: the hidden layers' gradients flush
    assert scaled[1] < 0.1 and bf16[1] < 0.1
    assert scaled[2] == 2.0 ** 16 and bf16[2] == 1.0
    assert scaled[0][-1] < 0.5 * unscaled[0][-1] and bf16[0][-1] < 0.5 * unscaled[0][-1]
