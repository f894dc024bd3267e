"""compiler/kernels_norm_softmax.py (LayerNorm, softmax, attention numba kernels) and the float32
``erf32`` of kernels.py: each kernel against its op's numpy forward, and the compiled char-GPT
training step (numba backend) against eager over 100 steps."""
import math

import numpy as np
import pytest

pytest.importorskip("numba")

import tapegrad  # noqa: E402
from tapegrad.compiler import kernels, kernels_norm_softmax, op_kernels  # noqa: E402
from tapegrad.compiler.ir import Node, Value  # noqa: E402
from tapegrad.ops import nn as N  # noqa: E402

DTYPES = [np.float64, np.float32]


def _node(name, inputs, params, dtype, out_shape=None):
    vals = [Value(f"in{i}", a.shape, np.dtype(a.dtype)) if isinstance(a, np.ndarray) else a
            for i, a in enumerate(inputs)]
    shape = out_shape if out_shape is not None else inputs[0].shape
    return Node(None, name, vals, params, [Value("out", tuple(shape), np.dtype(dtype))])


def _ln_params(C):
    return {"axes": None, "eps": 1e-5, "param_shape": (C,)}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(16, 32, 64), (3, 1), (5, 7), (2, 3, 8), (4, 130),
                                   (2, 1000), (1, 1, 1)])
@pytest.mark.parametrize("affine", ["both", "weight", "none"])
def test_layer_norm_kernel_is_eager_bitwise(dtype, shape, affine):
    rng = np.random.default_rng(sum(shape))
    C = shape[-1]
    x = (rng.standard_normal(shape) * 3 + 1.5).astype(dtype)
    w = rng.standard_normal(C).astype(dtype) if affine != "none" else None
    b = rng.standard_normal(C).astype(dtype) if affine == "both" else None
    params = dict(_ln_params(C), axes=(len(shape) - 1,))
    ins = [a for a in (x, w, b) if a is not None]
    fn = kernels_norm_softmax.layer_norm_factory(_node("layer_norm", ins, params, dtype))
    assert fn is not None
    got = fn(*ins, **params)
    want = N.layer_norm.forward(*ins, **params)
    assert got.dtype == want.dtype == dtype and got.shape == want.shape
    assert np.array_equal(got, want)


def test_layer_norm_kernel_declines_what_it_does_not_compute():
    x = np.ones((4, 6))
    w = np.ones(6)
    f = kernels_norm_softmax.layer_norm_factory
    assert f(_node("layer_norm", [x, w], {"axes": (0, 1), "eps": 1e-5,
                                           "param_shape": (4, 6)}, np.float64)) is None
    assert f(_node("layer_norm", [x.astype(np.float32), w], dict(_ln_params(6), axes=(1,)),
                   np.float64)) is None  # mixed dtypes
    assert f(_node("layer_norm", [x.astype(np.int64)], dict(_ln_params(6), axes=(1,)),
                   np.int64)) is None
    assert f(_node("layer_norm", [np.ones((0, 6))], dict(_ln_params(6), axes=(1,)),
                   np.float64)) is None  # empty: the op's forward (a copy)
    assert f(_node("layer_norm", [x, 2.0], dict(_ln_params(6), axes=(1,)),
                   np.float64)) is None  # a literal weight


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(16, 4, 32, 32), (3, 1), (2, 5, 9), (2, 300)])
def test_softmax_kernel_is_eager_bitwise(dtype, shape):
    rng = np.random.default_rng(len(shape))
    x = (rng.standard_normal(shape) * 4).astype(dtype)
    if shape[-1] > 1:
        x[(0,) * (len(shape) - 1)][1] = -np.inf  # a masked entry
    for dim in (-1, len(shape) - 1):
        fn = kernels_norm_softmax.softmax_factory(_node("softmax", [x], {"dim": dim}, dtype))
        got, want = fn(x, dim=dim), N.softmax.forward(x, dim)
        assert got.dtype == dtype and np.array_equal(got, want)


def test_softmax_kernel_nan_and_fully_masked_rows_as_eager():
    x = np.array([[1.0, np.nan, 2.0], [-np.inf, -np.inf, -np.inf], [np.inf, 0.0, 1.0]])
    fn = kernels_norm_softmax.softmax_factory(_node("softmax", [x], {"dim": 1}, np.float64))
    np.testing.assert_array_equal(fn(x, dim=1), N.softmax.forward(x, 1))
    node = _node("softmax", [x], {"dim": 0}, np.float64)
    assert kernels_norm_softmax.softmax_factory(node) is None


def _qkv(rng, dtype, B=16, H=4, T=32, D=16):
    """q, k, v as the GPT makes them: permuted views of one (B, T, 3 H D) projection."""
    qkv = rng.standard_normal((B, T, 3 * H * D)).astype(dtype)
    return [qkv[..., i * H * D:(i + 1) * H * D].reshape(B, T, H, D).transpose(0, 2, 1, 3)
            for i in range(3)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bias", ["causal", "none", "per_batch", "full"])
@pytest.mark.parametrize("dims", [(16, 4, 32, 16), (2, 3, 5, 7), (1, 1, 1, 1)])
def test_attention_kernel_is_eager_bitwise(dtype, bias, dims):
    rng = np.random.default_rng(dims[2])
    B, H, T, D = dims
    q, k, v = _qkv(rng, dtype, B, H, T, D)
    if bias == "causal":
        bb = np.triu(np.full((T, T), -np.inf), 1).astype(dtype)
    elif bias == "per_batch":
        bb = rng.standard_normal((B, 1, 1, T)).astype(dtype)
    elif bias == "full":
        bb = rng.standard_normal((B, H, T, T)).astype(dtype)
    else:
        bb = None
    ins = [q, k, v] + ([bb] if bb is not None else [])
    params = {"scale": 0.25, "keep": None}
    fn = kernels_norm_softmax.attention_factory(_node("scaled_dot_product_attention", ins, params,
                                             dtype))
    assert fn is not None
    got = fn(*ins, **params)
    want = N.scaled_dot_product_attention.forward(*ins, **params)
    assert got.dtype == dtype and got.shape == want.shape
    assert np.array_equal(got, want)


def test_attention_kernel_declines_dropout_and_other_shapes():
    rng = np.random.default_rng(0)
    q, k, v = _qkv(rng, np.float64, 2, 2, 4, 3)
    f = kernels_norm_softmax.attention_factory
    keep = np.ones((2, 2, 4, 4))
    assert f(_node("scaled_dot_product_attention", [q, k, v, None],
                   {"scale": 1.0, "keep": keep}, np.float64)) is None
    assert f(_node("scaled_dot_product_attention", [q[0], k[0], v[0]],
                   {"scale": 1.0, "keep": None}, np.float64)) is None  # 3-D
    assert f(_node("scaled_dot_product_attention", [q, k.astype(np.float32), v],
                   {"scale": 1.0, "keep": None}, np.float64)) is None
    assert f(_node("scaled_dot_product_attention", [q, k, v, np.ones((3, 4))],
                   {"scale": 1.0, "keep": None}, np.float64)) is None  # no broadcast


def test_kernels_are_registered_for_the_node_names():
    x = np.ones((2, 8))
    node = _node("layer_norm", [x], dict(_ln_params(8), axes=(1,)), np.float64)
    assert op_kernels.lookup(node) is not None
    assert op_kernels.lookup(_node("softmax", [x], {"dim": 1}, np.float64)) is not None


def test_erf32_within_one_ulp_of_erf_rounded_once():
    """kernels.erf32 (float64 polynomial, rounded once to float32) against math.erf rounded
    to float32, on a million float32 values across the range, the edges and NaN."""
    src = ("import math\nimport numpy as np\nfrom numba import njit\n\n\n"
           + kernels.erf32_source() + '''

@njit(error_model="numpy", cache=True)
def erf32_test_loop(x, out):
    for i in range(x.shape[0]):
        out[i] = np.float32(erf32(np.float64(x[i])))
''')
    fn = kernels.load("erf32_test_loop", src)
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.standard_normal(500_000) * 2, rng.uniform(-6, 6, 500_000),
                        10.0 ** rng.uniform(-45, 1, 20_000),
                        [0.0, -0.0, 1e-45, 3.9, 4.0, 4.1, -4.0, 1e30, -1e30, np.inf, -np.inf,
                         np.nan]]).astype(np.float32)
    got = np.empty_like(x)
    fn(x, got)
    want = np.array([math.erf(float(v)) for v in x.astype(np.float64)]).astype(np.float32)
    nan = np.isnan(want)
    assert np.array_equal(np.isnan(got), nan)
    ulps = np.abs(got[~nan].view(np.int32).astype(np.int64)
                  - want[~nan].view(np.int32).astype(np.int64))
    assert ulps.max() <= 1
    assert (ulps != 0).mean() < 1e-5  # 1 ulp only within 5.4e-14 of a rounding midpoint


def _gpt_losses(dtype, n_steps, compiled):
    from tapegrad.bench import models as M
    from tapegrad.bench.compile import _model_step

    state, batches = M.initial_state("gpt"), M.make_data("gpt", 8)
    S = M.Step(tapegrad, "gpt", state, batches, dtype)
    if not compiled:
        return [S() for _ in range(n_steps)], None
    fn = tapegrad.compile(_model_step(S))
    return [fn(*S._batch()) for _ in range(n_steps)], fn


@pytest.mark.parametrize("dtype", DTYPES)
def test_compiled_gpt_step_with_gpt_kernels_matches_eager_over_100_steps(monkeypatch, dtype):
    monkeypatch.setenv("TAPEGRAD_COMPILE_KERNELS", "numba")
    want, _ = _gpt_losses(dtype, 100, compiled=False)
    got, fn = _gpt_losses(dtype, 100, compiled=True)
    src = fn.entries[-1].source
    # (the attention forward returns its probabilities: no separate softmax node is left;
    # the embeddings' table gradients come out of the last LayerNorm gradient's kernel;
    # attention's softmax gradient and products are inside concatenate_products)
    for name in ("layer_norm_kernel", "layer_norm_backward_kernel",
                 "clip_grad_norm_optimizer_step_kernel", "residual_layer_norm_backward_kernel",
                 "concatenate_products_kernel", "scaled_dot_product_attention_probs_kernel"):
        assert name in src, name
    assert "embedding_backward(" not in src  # (eager's scatter)
    assert fn.n_hits >= 98 and not fn.breaks
    assert all(math.isfinite(v) for v in got)
    # every kernel of this step is eager's bits (float32 GELU included: kernels_gelu's erf
    # equals eager's on every float32 input), so 100 steps agree exactly
    assert got == want
    assert want[-1] < want[0] - 0.5  # it trains


def _mlp_step(dtype, make_opt, clip):
    """A small relu MLP's training step (MSE, optional clipping, the given optimizer) and
    its parameters: fused relu kernels are exact, so compiled and eager agree bitwise."""
    tapegrad.manual_seed(0)
    nn = tapegrad.nn
    model = nn.Sequential(nn.Linear(5, 16), nn.ReLU(), nn.Linear(16, 3)).to(
        getattr(tapegrad, np.dtype(dtype).name))
    opt = make_opt(model)

    def step(x, y):
        loss = ((model(x) - y) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        if clip:
            nn.utils.clip_grad_norm_(model.parameters(), 0.05)
        opt.step()
        return loss.item()

    return step, model, opt


OPTIMIZERS = {
    "adamw_groups": lambda m: tapegrad.optim.AdamW(
        [{"params": [m[0].weight, m[2].weight], "weight_decay": 0.1},
         {"params": [m[0].bias, m[2].bias], "weight_decay": 0.0}], lr=3e-2, betas=(0.9, 0.95)),
    "adam_coupled_maximize": lambda m: tapegrad.optim.Adam(
        m.parameters(), lr=1e-2, weight_decay=0.05, maximize=True),
    "adamw_lerp_high": lambda m: tapegrad.optim.AdamW(m.parameters(), lr=1e-2,
                                                        betas=(0.3, 0.9), foreach=False),
}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", sorted(OPTIMIZERS))
def test_adam_and_clip_kernels_are_eager_bitwise(monkeypatch, dtype, kind):
    """The same compiled step with and without the two kernels (the eager optimizer step
    and clip_grad_norm_ in the graph): bitwise the same losses, parameters, gradients and
    state (the numba backend's fused matmul kernels add in another order than BLAS, so
    the whole compiled step is not bitwise eager's; the step and the clip are)."""
    monkeypatch.setenv("TAPEGRAD_COMPILE_KERNELS", "numba")
    rng = np.random.default_rng(1)
    data = [(tapegrad.tensor(rng.standard_normal((8, 5)).astype(dtype)),
             tapegrad.tensor(rng.standard_normal((8, 3)).astype(dtype))) for _ in range(6)]
    eager, em, eo = _mlp_step(dtype, OPTIMIZERS[kind], clip=True)
    with monkeypatch.context() as m:
        for name in ("optimizer_step", "clip_grad_norm"):
            m.setitem(op_kernels._FACTORIES, name, [])
        plain = tapegrad.compile(eager)
        a = [plain(x, y) for x, y in data]
    assert "optimizer_step_kernel(" not in plain.entries[-1].source
    raw, cm, co = _mlp_step(dtype, OPTIMIZERS[kind], clip=True)
    comp = tapegrad.compile(raw)
    b = [comp(x, y) for x, y in data]
    src = comp.entries[-1].source
    # (one node: kernels_optim.fuse_clip_optimizer_step; its kernel needs both parts' kernels)
    assert "clip_grad_norm_optimizer_step_kernel(" in src
    assert a == b
    for p, q in zip(em.parameters(), cm.parameters()):
        assert np.array_equal(p.detach().numpy(), q.detach().numpy())
        assert np.array_equal(p.grad.numpy(), q.grad.numpy())
        for k in ("exp_avg", "exp_avg_sq", "step"):
            assert np.array_equal(eo.state[p][k].numpy(), co.state[q][k].numpy()), k
        assert p._version[0] == q._version[0]


def test_adam_kernel_runs_the_real_step_where_it_does_not_serve(monkeypatch):
    """AMSGrad (switched on after compiling): the node's own step runs, exact."""
    monkeypatch.setenv("TAPEGRAD_COMPILE_KERNELS", "numba")
    rng = np.random.default_rng(2)
    data = [(tapegrad.tensor(rng.standard_normal((8, 5))),
             tapegrad.tensor(rng.standard_normal((8, 3)))) for _ in range(5)]
    make = OPTIMIZERS["adam_coupled_maximize"]
    raw_e, em, eo = _mlp_step(np.float64, make, clip=False)
    with monkeypatch.context() as m:
        m.setitem(op_kernels._FACTORIES, "optimizer_step", [])
        eager = tapegrad.compile(raw_e)
        eager(*data[0])
    raw, cm, co = _mlp_step(np.float64, make, clip=False)
    comp = tapegrad.compile(raw)
    comp(*data[0])
    assert "optimizer_step_kernel(" in comp.entries[-1].source
    for i, (x, y) in enumerate(data[1:], 1):
        if i == 3:
            for o in (eo, co):
                for g in o.param_groups:
                    g["amsgrad"] = True
                for st in o.state.values():
                    st["max_exp_avg_sq"] = tapegrad.zeros_like(st["exp_avg_sq"])
        assert eager(x, y) == comp(x, y)
    for p, q in zip(em.parameters(), cm.parameters()):
        assert np.array_equal(p.detach().numpy(), q.detach().numpy())
        assert np.array_equal(eo.state[p]["max_exp_avg_sq"].numpy(),
                              co.state[q]["max_exp_avg_sq"].numpy())


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("pad", [None, 2, -1])
def test_embedding_backward_kernel_is_eager_bitwise(dtype, pad):
    rng = np.random.default_rng(5)
    g = rng.standard_normal((16, 32, 8)).astype(dtype)
    idx = rng.integers(-7, 7, size=(16, 32))  # repeated and negative indices
    params = {"num_weights": 7, "padding_idx": pad, "scale": None}
    fn = kernels_norm_softmax.embedding_backward_factory(_node(
        "embedding_backward", [g, idx], params, dtype, (7, 8)))
    got = fn(g, idx, **params)
    want = N.embedding_backward.forward(g, idx, **params)
    assert got.dtype == dtype and np.array_equal(got, want)
    bad = idx.copy()
    bad[3, 4] = 7
    with pytest.raises(IndexError):
        fn(g, bad, **params)
    assert kernels_norm_softmax.embedding_backward_factory(_node(
        "embedding_backward", [g, idx], dict(params, scale=np.ones((16, 32))), dtype,
        (7, 8))) is None


def _ln_step(C, dtype, bias, seed=0):
    rng = np.random.default_rng(seed)
    dt = getattr(tapegrad, np.dtype(dtype).name)
    x = tapegrad.tensor((rng.standard_normal((3, 5, C)) * 2 + 1).astype(dtype),
                        requires_grad=True)
    w = tapegrad.tensor(rng.standard_normal(C).astype(dtype), requires_grad=True)
    b = tapegrad.tensor(rng.standard_normal(C).astype(dtype), requires_grad=True) \
        if bias else None
    k = tapegrad.tensor(rng.standard_normal((3, 5, C)).astype(dtype))
    leaves = [t for t in (x, w, b) if t is not None]

    def step(x, w, k):
        for t in leaves:
            t.grad = None
        y = tapegrad.nn.functional.layer_norm(x, (C,), w, b)
        loss = (y * k).sum() + (y * y).mean()
        loss.backward()
        return loss

    assert x.dtype == dt
    return step, (x, w, k), leaves


@pytest.mark.parametrize("backend", ["numpy", "numba"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("C,bias", [(64, True), (8, False), (130, True), (1, True)])
def test_layer_norm_backward_pass_is_eager_bitwise(monkeypatch, backend, dtype, C, bias):
    """The traced LayerNorm rule becomes one layer_norm_backward node (numpy backend: the
    rule's own nodes in order; numba: one pass per row): gradients bitwise eager's."""
    monkeypatch.setenv("TAPEGRAD_COMPILE_KERNELS", backend)
    step, args, leaves = _ln_step(C, dtype, bias)
    eager = []
    for _ in range(3):
        loss = step(*args)
        eager.append((loss.detach().numpy().copy(), [t.grad.numpy().copy() for t in leaves]))
    comp = tapegrad.compile(step)
    for k in range(3):
        loss = comp(*args)
        np.testing.assert_array_equal(loss.detach().numpy(), eager[k][0])
        for t, ge in zip(leaves, eager[k][1]):
            np.testing.assert_array_equal(t.grad.numpy(), ge)
    src = comp.entries[-1].source
    kernel = backend == "numba" and C > 1  # C = 1: the factory declines (the nodes run)
    assert ("layer_norm_backward_kernel(" if kernel else "layer_norm_backward(") in src
    assert "sqrt(" not in src.split("def ")[-1]  # the rule's nodes are gone from the step


def test_layer_norm_backward_pass_leaves_a_rule_whose_values_are_read_elsewhere():
    from tapegrad.compiler import passes, tracer

    step, args, _ = _ln_step(16, np.float64, True)
    before = [p for p in passes.PASSES if p[0] not in ("fuse_layer_norm_backward", "fuse")]
    graph = passes.optimize(tracer.trace(step, *args), before)  # (no-op reshapes gone)
    assert any(n.name == "layer_norm_backward"
               for n in passes.fuse_layer_norm_backward(graph).nodes)
    s1 = next(n for n in graph.nodes if n.name == "sum" and n.params.get("keepdim"))
    graph.outputs.append(s1.outputs[0])  # the mean's row sums, read outside the rule
    assert not any(n.name == "layer_norm_backward"
                   for n in passes.fuse_layer_norm_backward(graph).nodes)


def _softmax_step(kind, dtype, seed=0):
    rng = np.random.default_rng(seed)
    F = tapegrad.nn.functional
    shape = (2, 3, 5, 7) if kind == "softmax" else (2, 3, 6, 4)
    leaves = [tapegrad.tensor(rng.standard_normal(shape).astype(dtype), requires_grad=True)
              for _ in range(1 if kind == "softmax" else 3)]
    k = tapegrad.tensor(rng.standard_normal(shape).astype(dtype))

    def step(*args):
        for t in leaves:
            t.grad = None
        if kind == "softmax":
            y = F.softmax(leaves[0], dim=-1)
        else:
            y = F.scaled_dot_product_attention(*leaves, is_causal=True)
        loss = (y * k).sum()
        loss.backward()
        return loss

    return step, leaves


@pytest.mark.parametrize("backend", ["numpy", "numba"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", ["softmax", "attention"])
def test_softmax_backward_pass_is_eager_bitwise(monkeypatch, backend, dtype, kind):
    """softmax's rule ``p * (g - sum(g * p))`` (alone, and inside attention's rule) becomes
    one softmax_backward node: gradients bitwise eager's."""
    monkeypatch.setenv("TAPEGRAD_COMPILE_KERNELS", backend)
    step, leaves = _softmax_step(kind, dtype)
    eager = []
    for _ in range(3):
        loss = step()
        eager.append((loss.detach().numpy().copy(), [t.grad.numpy().copy() for t in leaves]))
    comp = tapegrad.compile(step)
    for k in range(3):
        loss = comp()
        np.testing.assert_array_equal(loss.detach().numpy(), eager[k][0])
        for t, ge in zip(leaves, eager[k][1]):
            np.testing.assert_array_equal(t.grad.numpy(), ge)
    src = comp.entries[-1].source
    assert ("softmax_backward_kernel(" if backend == "numba" else "softmax_backward(") in src


def test_softmax_backward_pass_leaves_a_rule_whose_values_are_read_elsewhere():
    from tapegrad.compiler import passes, tracer

    step, _ = _softmax_step("softmax", np.float64)
    graph = tracer.trace(step)
    assert any(n.name == "softmax_backward" for n in passes.fuse_softmax_backward(graph).nodes)
    s = next(n for n in graph.nodes if n.name == "sum" and n.params.get("keepdim"))
    graph.outputs.append(s.outputs[0])  # the row sums, read outside the rule
    assert not any(n.name == "softmax_backward"
                   for n in passes.fuse_softmax_backward(graph).nodes)


@pytest.mark.parametrize("backend", ["numpy", "numba"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("variant", ["causal", "plain", "scale"])
def test_attention_shares_its_probabilities_with_its_rule(monkeypatch, backend, dtype,
                                                           variant):
    """The forward returns the probabilities its traced rule would recompute (one product,
    scale/mask pass and softmax less): losses and gradients bitwise eager's."""
    monkeypatch.setenv("TAPEGRAD_COMPILE_KERNELS", backend)
    rng = np.random.default_rng(3)
    F = tapegrad.nn.functional
    leaves = [tapegrad.tensor(rng.standard_normal((2, 3, 6, 4)).astype(dtype),
                              requires_grad=True) for _ in range(3)]
    k = tapegrad.tensor(rng.standard_normal((2, 3, 6, 4)).astype(dtype))
    kw = {"causal": {"is_causal": True}, "plain": {}, "scale": {"scale": 0.3}}[variant]

    def step():
        for t in leaves:
            t.grad = None
        loss = (F.scaled_dot_product_attention(*leaves, **kw) * k).sum()
        loss.backward()
        return loss

    eager = []
    for _ in range(3):
        loss = step()
        eager.append((loss.detach().numpy().copy(), [t.grad.numpy().copy() for t in leaves]))
    comp = tapegrad.compile(step)
    for i in range(3):
        loss = comp()
        np.testing.assert_array_equal(loss.detach().numpy(), eager[i][0])
        for t, ge in zip(leaves, eager[i][1]):
            np.testing.assert_array_equal(t.grad.numpy(), ge)
    src = comp.entries[-1].source
    body = src.split("def ")[-1]
    assert ("scaled_dot_product_attention_probs_kernel(" if backend == "numba"
            else "scaled_dot_product_attention_probs(") in body
    assert "softmax(" not in body and "softmax_kernel(" not in body  # no recomputation


def _bits(a):
    a = np.asarray(a)
    return a.view(np.int64 if a.dtype == np.float64 else np.int32)


@pytest.mark.parametrize("backend", ["numpy", "numba"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("cover", [True, False])
def test_split_gradients_become_one_concatenation(monkeypatch, backend, dtype, cover):
    """q, k, v = x.split(...) (as the GPT's qkv): their gradients put into zeros and added
    become one concatenation (+ 0.0, so -0.0 turns +0.0 as eager's adds do): bitwise eager's,
    signs of zeros included. Slices that do not cover the axis stay as they are."""
    monkeypatch.setenv("TAPEGRAD_COMPILE_KERNELS", backend)
    rng = np.random.default_rng(4)
    x = tapegrad.tensor(rng.standard_normal((2, 5, 12)).astype(dtype), requires_grad=True)
    ws = [rng.standard_normal((2, 5, 4)).astype(dtype) for _ in range(3)]
    ws[1][0, 0, :2] = -0.0  # a gradient of -0.0
    ws = [tapegrad.tensor(w) for w in ws]

    def step():
        x.grad = None
        if cover:
            q, k, v = x.split(4, dim=2)
        else:
            q, k, v = x[..., 0:4], x[..., 4:8], x[..., 7:11]
        loss = (q * ws[0]).sum() + (k * ws[1]).sum() + (v * ws[2]).sum()
        loss.backward()
        return loss

    eager = []
    for _ in range(3):
        loss = step()
        eager.append((loss.detach().numpy().copy(), x.grad.numpy().copy()))
    comp = tapegrad.compile(step)
    for i in range(3):
        loss = comp()
        np.testing.assert_array_equal(_bits(loss.detach().numpy()), _bits(eager[i][0]))
        np.testing.assert_array_equal(_bits(x.grad.numpy()), _bits(eager[i][1]))
    src = comp.entries[-1].source  # the numpy body, or numba's concatenate_gradients_kernel
    assert ("concatenate_gradients" in src) == cover
