"""compiler/kernels_norm_softmax.py: the optimizer, clipping, attention and split-gradient
kernels where they take their less common paths (several dtypes in one optimizer,
uneven step counts, state replaced between calls, strided and non-finite gradients, NaN
scores, the heads' gradient chains absorbed into the concatenation): each bitwise eager's
(tests/compiler/test_compiler_kernels_norm_softmax.py covers the common paths)."""
import numpy as np
import pytest

pytest.importorskip("numba")

import tapegrad  # noqa: E402
from tapegrad.compiler import kernels_norm_softmax, op_kernels  # noqa: E402
from tapegrad.compiler.ir import Node, Value  # noqa: E402
from tapegrad.nn import utils as nn_utils  # noqa: E402
from tapegrad.ops import nn as N  # noqa: E402

DTYPES = [np.float64, np.float32]


def _bits(a):
    a = np.asarray(a)
    return a.view(np.int64 if a.dtype == np.float64 else np.int32)


def _node(name, inputs, params, dtype, out_shape=None):
    vals = [Value(f"in{i}", a.shape, np.dtype(a.dtype)) if isinstance(a, np.ndarray) else a
            for i, a in enumerate(inputs)]
    shape = out_shape if out_shape is not None else inputs[0].shape
    return Node(None, name, vals, params, [Value("out", tuple(shape), np.dtype(dtype))])


# --- the optimizer step: numba calls over chunks of parameters ------------------------------
def _two_dtype_step(make_opt, clip, depth=1):
    """A float64 and a float32 layer trained by one optimizer: two buckets of the kernel
    (``depth``: float64 layers; over 4, more parameters than one chunk of the kernels)."""
    tapegrad.manual_seed(0)
    nn = tapegrad.nn
    a = nn.Sequential(nn.Linear(5, 7), *[m for _ in range(depth - 1)
                                         for m in (nn.ReLU(), nn.Linear(7, 7))])
    a = a.to(tapegrad.float64)
    b = nn.Linear(7, 3).to(tapegrad.float32)
    params = list(a.parameters()) + list(b.parameters())
    opt = make_opt(a, b)

    def step(x, y):
        h = a(x).relu().to(tapegrad.float32)
        loss = ((b(h) - y) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        if clip:
            nn.utils.clip_grad_norm_(b.parameters(), 0.05)
        opt.step()
        return loss.item()

    return step, params, opt


def _weights(*ms):
    return [p for m in ms for n, p in m.named_parameters() if n.endswith("weight")]


def _biases(*ms):
    return [p for m in ms for n, p in m.named_parameters() if n.endswith("bias")]


OPTIMIZERS = {
    "adamw_groups": lambda a, b: tapegrad.optim.AdamW(
        [{"params": _weights(a, b), "weight_decay": 0.1},
         {"params": _biases(a, b), "weight_decay": 0.0, "betas": (0.3, 0.9)}], lr=3e-2),
    "adam_maximize": lambda a, b: tapegrad.optim.Adam(
        list(a.parameters()) + list(b.parameters()), lr=1e-2, weight_decay=0.05,
        maximize=True),
}


def _run_both(monkeypatch, make_opt, between=None, n=6, clip=True, depth=1):
    """The same compiled step with the two kernels and without them (the node's own
    optimizer step and clip: eager's code): losses, parameters, gradients, state and
    versions, bitwise. ``between(i, opt)`` runs on both optimizers before call i."""
    monkeypatch.setenv("TAPEGRAD_COMPILE_KERNELS", "numba")
    rng = np.random.default_rng(1)
    data = [(tapegrad.tensor(rng.standard_normal((8, 5))),
             tapegrad.tensor(rng.standard_normal((8, 3)).astype(np.float32)))
            for _ in range(n)]
    raw_e, ep, eo = _two_dtype_step(make_opt, clip, depth)
    with monkeypatch.context() as m:
        for name in ("optimizer_step", "clip_grad_norm"):
            m.setitem(op_kernels._FACTORIES, name, [])
        plain = tapegrad.compile(raw_e)
        want = []
        for i, (x, y) in enumerate(data):
            if between is not None:
                between(i, eo)
            want.append(plain(x, y))
    assert "optimizer_step_kernel(" not in plain.entries[-1].source
    raw, cp, co = _two_dtype_step(make_opt, clip, depth)
    comp = tapegrad.compile(raw)
    got = []
    for i, (x, y) in enumerate(data):
        if between is not None:
            between(i, co)
        got.append(comp(x, y))
    assert "optimizer_step_kernel(" in comp.entries[-1].source
    assert got == want
    for p, q in zip(ep, cp):
        assert p.dtype == q.dtype
        np.testing.assert_array_equal(_bits(p.detach().numpy()), _bits(q.detach().numpy()))
        np.testing.assert_array_equal(_bits(p.grad.numpy()), _bits(q.grad.numpy()))
        for k in ("exp_avg", "exp_avg_sq", "step"):
            np.testing.assert_array_equal(_bits(eo.state[p][k].numpy()),
                                          _bits(co.state[q][k].numpy()), k)
        assert p._version[0] == q._version[0]
    return comp


@pytest.mark.parametrize("kind", sorted(OPTIMIZERS))
@pytest.mark.parametrize("depth", [1, 6])
def test_optimizer_kernel_serves_two_dtypes_in_one_call(monkeypatch, kind, depth):
    _run_both(monkeypatch, OPTIMIZERS[kind], depth=depth)


@pytest.mark.parametrize("depth", [1, 6])
def test_optimizer_kernel_with_uneven_step_counts(monkeypatch, depth):
    """A parameter's step count set apart (in place: the kernel's plan stays): its
    constants are its own, the others' are shared, as eager's per-parameter step."""
    def between(i, opt):
        if i == 3:
            for p in opt.param_groups[0]["params"][1::3]:
                opt.state[p]["step"]._data[...] = 40.0

    _run_both(monkeypatch, OPTIMIZERS["adamw_groups"], between, depth=depth)


def test_optimizer_kernel_follows_a_loaded_state(monkeypatch):
    """load_state_dict between calls (new state tensors, new group dicts): the kernel's
    plan is rebuilt from the optimizer, not kept from the arrays it saw."""
    def between(i, opt):
        if i == 3:
            sd = opt.state_dict()
            for st in sd["state"].values():
                st["exp_avg"] = st["exp_avg"] * 0.5
            sd["param_groups"][0]["lr"] = 1e-3
            opt.load_state_dict(sd)

    _run_both(monkeypatch, OPTIMIZERS["adamw_groups"], between)


def test_optimizer_kernel_follows_state_tensors_replaced_in_their_dicts(monkeypatch):
    """A moment replaced by a new tensor in the same state dict, another's array replaced
    through ``.data``: the plan sees both (identity of each tensor and of its array)."""
    def between(i, opt):
        ps = opt.param_groups[0]["params"]
        if i == 2:
            st = opt.state[ps[0]]
            st["exp_avg"] = tapegrad.ones_like(st["exp_avg"]) * 0.01
        if i == 4:
            t = opt.state[ps[1]]["exp_avg_sq"]
            t.data = tapegrad.full_like(t, 0.5)

    _run_both(monkeypatch, OPTIMIZERS["adamw_groups"], between)


def test_optimizer_kernel_step_count_rounds_as_float32(monkeypatch):
    """A float32 step count past 2**24: + 1 rounds to even (eager's float32 step_t += 1);
    the kernel's constants use the same rounded count (beta2 near 1: 1 - beta2 ** step
    still tells the counts apart in float64)."""
    before = tapegrad.get_default_dtype()
    tapegrad.set_default_dtype(tapegrad.float32)
    try:
        def between(i, opt):
            if i == 2:
                for st in opt.state.values():
                    assert st["step"]._data.dtype == np.float32
                    st["step"]._data[...] = 2.0 ** 24 + 2

        _run_both(monkeypatch, lambda a, b: tapegrad.optim.AdamW(
            list(a.parameters()) + list(b.parameters()), lr=1e-2, betas=(0.9, 0.9999999)),
            between, n=5)
    finally:
        tapegrad.set_default_dtype(before)  # the suite's default: later tests rely on it


# --- clip_grad_norm_: numba calls over chunks of gradients ------------------------------------
def _clip_case(dtype, kind):
    rng = np.random.default_rng(7)
    base = rng.standard_normal((6, 9)).astype(dtype)
    grads = [base.T,  # transposed: summed in C order of the transpose, as eager's ravel
             rng.standard_normal(300).astype(dtype)[::3],  # a strided 1-D view
             rng.standard_normal((2, 3, 4)).astype(dtype),
             np.zeros((0, 4), dtype),
             np.asarray(rng.standard_normal(), dtype).reshape(()),
             rng.standard_normal(1000).astype(dtype) * 1e-3]
    if kind == "nan":
        grads[2][1, 1, 1] = np.nan
    elif kind == "inf":
        grads[5][17] = -np.inf
    elif kind == "small":
        grads = [np.asarray(g * 1e-6) for g in grads]  # total below max_norm: coef 1
    elif kind == "negzero":
        grads[2][0, 0, :] = -0.0
    return grads


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", ["plain", "nan", "inf", "small", "negzero", "many"])
def test_clip_kernel_is_eager_bitwise(dtype, kind):
    grads = _clip_case(dtype, kind)
    if kind == "many":  # three chunks of the kernels
        grads = grads + [np.asarray(g * 2) for g in grads] + [np.asarray(g * 0.5)
                                                              for g in grads[:5]]
    params = {"max_norm": 0.5, "norm_type": 2.0, "error_if_nonfinite": False}
    fn = kernels_norm_softmax.clip_grad_norm_factory(_node("clip_grad_norm", grads, params, dtype))
    assert fn is not None
    before = [g.copy() for g in grads]
    got = fn(*grads, **params)
    with np.errstate(invalid="ignore", over="ignore"):
        want = nn_utils._clip_arrays(*grads, **params)
    assert len(got) == len(want) == len(grads) + 1
    for a, b in zip(got, want):
        assert a.dtype == b.dtype == dtype and a.shape == b.shape
        np.testing.assert_array_equal(a, b)  # NaN where eager's NaN
        if kind != "nan" and kind != "inf":
            np.testing.assert_array_equal(_bits(a), _bits(b))
    for g, b in zip(grads, before):  # the inputs are left alone
        np.testing.assert_array_equal(_bits(g), _bits(b))


def test_clip_kernel_declines_other_norms_and_mixed_dtypes():
    g = [np.ones(3), np.ones(2)]
    f = kernels_norm_softmax.clip_grad_norm_factory
    base = {"max_norm": 1.0, "norm_type": 2.0, "error_if_nonfinite": False}
    assert f(_node("clip_grad_norm", g, dict(base, norm_type=1.0), np.float64)) is None
    assert f(_node("clip_grad_norm", g, dict(base, error_if_nonfinite=True),
                   np.float64)) is None
    assert f(_node("clip_grad_norm", [g[0], g[1].astype(np.float32)], base,
                   np.float64)) is None


# --- attention: the shift pass with non-finite scores ----------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bias", ["causal", "none", "rows"])
def test_attention_kernel_nan_and_inf_scores_as_eager(dtype, bias):
    rng = np.random.default_rng(11)
    B, H, T, D = 2, 3, 7, 5
    q, k, v = (rng.standard_normal((B, H, T, D)).astype(dtype) for _ in range(3))
    q[0, 1, 2, 3] = np.nan  # one NaN row of scores
    q[1, 2, 4, 0] = np.inf  # a row with +-inf scores: inf - inf = NaN, as eager
    k[1, 0, 6, 1] = -1e30 if dtype == np.float64 else -1e20  # overflow to -inf
    bb = {"causal": np.triu(np.full((T, T), -np.inf), 1).astype(dtype), "none": None,
          "rows": rng.standard_normal((B, 1, T, 1)).astype(dtype)}[bias]
    ins = [q, k, v] + ([bb] if bb is not None else [])
    params = {"scale": 0.4, "keep": None}
    fn = kernels_norm_softmax.attention_factory(_node("scaled_dot_product_attention", ins, params,
                                             dtype))
    assert fn is not None
    got = fn(*ins, **params)
    with np.errstate(invalid="ignore", over="ignore"):
        want = N.scaled_dot_product_attention.forward(*ins, **params)
    assert np.isnan(want).any() and np.isfinite(want).any()
    np.testing.assert_array_equal(got, want)
    fin = np.isfinite(want)
    np.testing.assert_array_equal(_bits(got[fin]), _bits(want[fin]))


# --- the split's gradient: the heads' chains absorbed into the concatenation -----------------
def _heads_step(dtype, kind, seed=0):
    """x -> q, k, v by split, each viewed as heads and transposed, as the GPT's attention:
    their gradients' reshape(permute(...)) chains. ``kind``: "attention" (causal attention:
    its rule's q and k gradients are mul(matmul, scale)) or "scaled" (q and k scaled by the
    loss, a -0.0 in q's gradient)."""
    rng = np.random.default_rng(seed)
    B, T, H, D = 2, 5, 3, 4
    C = H * D
    x = tapegrad.tensor(rng.standard_normal((B, T, 3 * C)).astype(dtype), requires_grad=True)
    ws = [rng.standard_normal((B, H, T, D)).astype(dtype) for _ in range(3)]
    ws[0][0, 0, 0, :] = -0.0  # q's gradient -0.0 there: + 0.0 makes it +0.0, as eager
    ws = [tapegrad.tensor(w) for w in ws]

    def step():
        x.grad = None
        q, k, v = x.split(C, dim=2)
        q, k, v = (z.view(B, T, H, D).transpose(1, 2) for z in (q, k, v))
        if kind == "attention":
            y = tapegrad.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            loss = (y * ws[0]).sum()
        else:
            loss = ((q * 0.25) * ws[0]).sum() + ((k * 3) * ws[1]).sum() + (v * ws[2]).sum()
        loss.backward()
        return loss

    return step, x


@pytest.mark.parametrize("backend", ["numpy", "numba"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", ["attention", "scaled"])
def test_split_gradient_absorbs_the_heads_chains(monkeypatch, backend, dtype, kind):
    monkeypatch.setenv("TAPEGRAD_COMPILE_KERNELS", backend)
    step, x = _heads_step(dtype, kind)
    eager = []
    for _ in range(2):
        loss = step()
        eager.append((loss.detach().numpy().copy(), x.grad.numpy().copy()))
    comp = tapegrad.compile(step)
    for i in range(2):
        loss = comp()
        np.testing.assert_array_equal(_bits(loss.detach().numpy()), _bits(eager[i][0]))
        np.testing.assert_array_equal(_bits(x.grad.numpy()), _bits(eager[i][1]))
    body = comp.entries[-1].source.split("\ndef ")[-1]
    # (attention's: its products absorbed too, kernels_attention.absorb_gradient_products)
    name = "concatenate_products" if kind == "attention" else "concatenate_gradients"
    line = [ln for ln in body.splitlines() if name in ln]
    assert len(line) == 1
    assert (f"{name}_kernel" in line[0]) == (backend == "numba")
    # absorbed: no reshape of a head-major gradient back to (B, T, C) is left
    assert not [ln for ln in body.splitlines() if "= reshape(" in ln and
                ", shape=(2, 5, 12)" in ln]
    if kind == "attention":  # nor the rule's products by the scale (0.5 = 1 / sqrt(4))
        assert not [ln for ln in body.splitlines() if "= mul(" in ln and ", 0.5)" in ln]


def test_concatenate_kernel_declines_a_slice_it_cannot_view():
    """Slices along axis 1 of a (2, 6, 4) output, each seen in its source's (4, 4) shape:
    merging the slice's two first axes would need a copy, so the numpy body runs; a
    source shape that splits the slice's axes is served (-0.0 becomes +0.0)."""
    dt = np.dtype(np.float64)
    cuts = [(1, 0, 2), (1, 2, 4), (1, 4, 6)]
    out = Value("out", (2, 6, 4), dt)
    flat = [Value(f"x{i}", (4, 4), dt) for i in range(3)]
    node = Node(None, "concatenate_gradients", flat, {}, [out],
                meta={"chains": [(None, (1, 0))] * 3, "cuts": cuts})
    assert kernels_norm_softmax.concatenate_gradients_factory(node) is None
    split = [Value(f"x{i}", (2, 4, 1, 2), dt) for i in range(3)]
    node = Node(None, "concatenate_gradients", split, {}, [out],
                meta={"chains": [(0.5, (0, 2, 3, 1))] * 3, "cuts": cuts})
    fn = kernels_norm_softmax.concatenate_gradients_factory(node)
    assert fn is not None
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal((2, 4, 1, 2)) for _ in range(3)]
    xs[1][0, 0, 0, 0] = -0.0
    got = fn(*xs)
    want = np.concatenate([np.transpose(a * 0.5, (0, 2, 3, 1)).reshape(2, 2, 4) for a in xs],
                          axis=1) + 0.0
    np.testing.assert_array_equal(_bits(got), _bits(want))
    assert not np.signbit(got[0, 2, 0])
