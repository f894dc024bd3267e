"""compiler/kernels_optim.py: clip_grad_norm_ fused with the Adam/AdamW step that reads its
clipped gradients (one node, the scaling inside the Adam pass), and the clip's norms summed
as numpy's pairwise recursion (precomputed programs): bitwise eager's, float32 and float64."""
import numpy as np
import pytest

pytest.importorskip("numba")

import tapegrad  # noqa: E402
from tapegrad.compiler import kernels_optim as K, op_kernels, passes  # noqa: E402
from tapegrad.compiler.ir import Node, Value  # noqa: E402
from tapegrad.nn import utils as nn_utils  # noqa: E402

DTYPES = [np.float64, np.float32]
FUSED = "clip_grad_norm_optimizer_step"


def _bits(a):
    a = np.asarray(a)
    return a.view({8: np.int64, 4: np.int32}[a.dtype.itemsize])


# --- numpy's pairwise sum of squares --------------------------------------------------------
@pytest.mark.parametrize("n", [0, 1, 7, 8, 9, 127, 128, 129, 135, 136, 255, 256, 257, 1000,
                               6080, 12288, 16387, 100003])
def test_program_is_numpys_recursion(n):
    prog = K._program(n)
    leaves = [t for t in prog if t >= 0]
    assert sum(leaves) == n and all(t <= 128 for t in leaves)
    assert prog.count(-1) == len(leaves) - 1
    starts = np.cumsum([0] + leaves[:-1])
    assert all(s % 8 == 0 for s in starts)  # (the kernel reads blocks as rows of 8)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", ["plain", "nan", "inf", "tiny", "huge"])
def test_sum_of_squares_is_numpys_bitwise(dtype, kind):
    K._kernels()
    import sys

    mod = sys.modules[K._kernels()["clip_norms"].py_func.__module__]
    rng = np.random.default_rng(5)
    vals = np.empty(64, dtype)
    for n in list(range(0, 300)) + [1000, 6080, 12288, 16387, 100003]:
        a = rng.standard_normal(n).astype(dtype)
        if n and kind == "nan":
            a[n // 2] = np.nan
        elif n and kind == "inf":
            a[n - 1] = -np.inf
        elif kind == "tiny":
            a *= 1e-30 if dtype == np.float32 else 1e-200  # squares underflow
        elif kind == "huge":
            a *= 1e20 if dtype == np.float32 else 1e160  # squares overflow
        prog = np.array(K._program(n), np.int64)
        with np.errstate(over="ignore", under="ignore", invalid="ignore"):
            want = np.add.reduce(a * a)
        got = dtype(mod.sumsq(a, prog, 0, len(prog), vals))
        assert _bits(got) == _bits(want), n


# --- the fused node in a compiled training step ----------------------------------------------
def _mlp(dtype, make_opt, clip_all=True):
    tapegrad.manual_seed(0)
    nn = tapegrad.nn
    model = nn.Sequential(nn.Linear(5, 16), nn.Tanh(), nn.Linear(16, 16), nn.Tanh(),
                          nn.Linear(16, 3)).to(getattr(tapegrad, np.dtype(dtype).name))
    opt = make_opt(model)
    clipped = list(model.parameters())[0 if clip_all else 2:]

    def step(x, y):
        loss = ((model(x) - y) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_(clipped, 0.05)
        opt.step()
        return loss.item()

    return step, model, opt


OPTIMIZERS = {
    "adamw_groups": lambda m: tapegrad.optim.AdamW(
        [{"params": [m[0].weight, m[2].weight, m[4].weight], "weight_decay": 0.1},
         {"params": [m[0].bias, m[2].bias, m[4].bias], "weight_decay": 0.0}], lr=3e-2,
        betas=(0.9, 0.95)),
    "adam_coupled_maximize": lambda m: tapegrad.optim.Adam(
        m.parameters(), lr=1e-2, weight_decay=0.05, maximize=True),
    "adamw_lerp_high_foreach": lambda m: tapegrad.optim.AdamW(
        m.parameters(), lr=1e-2, betas=(0.3, 0.9), foreach=True),
    "adam_plain": lambda m: tapegrad.optim.Adam(m.parameters(), lr=1e-2, foreach=False),
    # the step reads only some of the clipped gradients: the others are scaled on their own
    "adamw_subset": lambda m: tapegrad.optim.AdamW(list(m.parameters())[:4], lr=1e-2),
}


def _data(dtype, n=7):
    rng = np.random.default_rng(1)
    return [(tapegrad.tensor(rng.standard_normal((8, 5)).astype(dtype)),
             tapegrad.tensor(rng.standard_normal((8, 3)).astype(dtype))) for _ in range(n)]


def _same(ref, got):
    (lr, mr, orr), (lg, mg, og) = ref, got
    assert lr == lg
    for p, q in zip(mr.parameters(), mg.parameters()):
        np.testing.assert_array_equal(_bits(p.detach().numpy()), _bits(q.detach().numpy()))
        np.testing.assert_array_equal(_bits(p.grad.numpy()), _bits(q.grad.numpy()))
        assert p._version[0] == q._version[0]
        if p in orr.state:
            for k in ("exp_avg", "exp_avg_sq", "step"):
                np.testing.assert_array_equal(_bits(orr.state[p][k].numpy()),
                                              _bits(og.state[q][k].numpy()), k)
        else:
            assert q not in og.state


def _train(dtype, kind, compiled, between=None, clip_all=True, options=None):
    step, model, opt = _mlp(dtype, OPTIMIZERS[kind], clip_all)
    fn = tapegrad.compile(step, options=options) if compiled else step
    losses = []
    for i, (x, y) in enumerate(_data(dtype)):
        if between is not None:
            between(i, opt)
        losses.append(fn(x, y))
    return (losses, model, opt), fn


def _graph(fn):
    e = fn.entries[-1]
    return getattr(e, "run_graph", None) or e.graph


def _plain(monkeypatch, *args, **kwargs):
    """The compiled step without the optimizer's and the clip's kernels (so without the
    fused one: the fused node's numpy body runs, the two nodes' own bodies, eager's code);
    the rest of the step the same kernels (numba's matmul kernels add in another order
    than BLAS: the whole compiled step is not bitwise eager's, this part is)."""
    with monkeypatch.context() as m:
        for name in ("optimizer_step", "clip_grad_norm"):
            m.setitem(op_kernels._FACTORIES, name, [])
        plain, pfn = _train(*args, **kwargs)
    assert f"{FUSED}_kernel(" not in pfn.entries[-1].source
    return plain, pfn


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", sorted(OPTIMIZERS))
def test_fused_clip_and_step_is_eager_bitwise(monkeypatch, dtype, kind):
    """The compiled step with the fused kernel and without it: the same losses, parameters,
    clipped gradients, state and versions, bitwise."""
    monkeypatch.setenv("TAPEGRAD_COMPILE_KERNELS", "numba")
    plain, pfn = _plain(monkeypatch, dtype, kind, True)
    assert _graph(pfn).count(FUSED) == 1
    got, fn = _train(dtype, kind, True)
    g = _graph(fn)
    assert g.count(FUSED) == 1 and g.count("clip_grad_norm") == 0
    assert g.count("optimizer_step") == 0
    assert f"{FUSED}_kernel(" in fn.entries[-1].source
    _same(plain, got)


@pytest.mark.parametrize("dtype", DTYPES)
def test_numpy_backend_runs_the_fused_nodes_body(monkeypatch, dtype):
    """The numpy backend (bitwise eager's) runs the fused node's body: eager's results."""
    monkeypatch.setenv("TAPEGRAD_COMPILE_KERNELS", "numpy")
    eager, _ = _train(dtype, "adamw_groups", False)
    got, fn = _train(dtype, "adamw_groups", True)
    assert _graph(fn).count(FUSED) == 1 and f"{FUSED}_kernel(" not in fn.entries[-1].source
    _same(eager, got)


def test_clip_of_fewer_gradients_than_the_step_reads_is_not_fused(monkeypatch):
    monkeypatch.setenv("TAPEGRAD_COMPILE_KERNELS", "numpy")  # (bitwise eager's)
    eager, _ = _train(np.float64, "adam_plain", False, clip_all=False)
    got, fn = _train(np.float64, "adam_plain", True, clip_all=False)
    g = _graph(fn)
    assert g.count(FUSED) == 0 and g.count("clip_grad_norm") == 1
    assert g.count("optimizer_step") == 1
    _same(eager, got)


def test_value_check_mode_sees_the_fused_node_as_the_two(monkeypatch):
    """options={'check': True} evaluates the graph before and after each pass: the fused
    effect node reports the clip's results and what the step consumes (passes._observed)."""
    monkeypatch.setenv("TAPEGRAD_COMPILE_KERNELS", "numpy")  # (bitwise eager's)
    eager, _ = _train(np.float32, "adamw_groups", False)
    got, fn = _train(np.float32, "adamw_groups", True, options={"check": True})
    assert _graph(fn).count(FUSED) == 1
    _same(eager, got)


@pytest.mark.parametrize("dtype", DTYPES)
def test_state_replaced_or_amsgrad_between_calls(monkeypatch, dtype):
    """The Adam plan is rebuilt when the state's arrays change (load_state_dict, a state
    tensor replaced), and a call it does not serve (AMSGrad switched on) runs the clip kernel
    and the node's own step: bitwise eager's throughout."""
    monkeypatch.setenv("TAPEGRAD_COMPILE_KERNELS", "numba")

    def between(i, opt):
        if i == 2:
            opt.load_state_dict(opt.state_dict())
        elif i == 3:
            p = next(iter(opt.state))
            opt.state[p]["exp_avg"] = opt.state[p]["exp_avg"].clone()
        elif i == 4:
            p = next(iter(opt.state))
            opt.state[p]["exp_avg_sq"].data = opt.state[p]["exp_avg_sq"].data.clone()
        elif i == 5:
            for g in opt.param_groups:
                g["amsgrad"] = True
            for st in opt.state.values():
                st["max_exp_avg_sq"] = tapegrad.zeros_like(st["exp_avg_sq"])

    plain, _ = _plain(monkeypatch, dtype, "adam_coupled_maximize", True, between)
    got, fn = _train(dtype, "adam_coupled_maximize", True, between)
    assert f"{FUSED}_kernel(" in fn.entries[-1].source
    _same(plain, got)


def test_clipped_gradients_of_the_fused_node_become_grads_without_a_copy(monkeypatch):
    monkeypatch.setenv("TAPEGRAD_COMPILE_KERNELS", "numba")
    from tapegrad.compiler import memory

    (_, model, _), fn = _train(np.float32, "adamw_groups", True)
    g = _graph(fn)
    grads = [v for kind, _, _, v in g.writes if kind == "grad"]
    plan = memory.plan(g)
    assert grads and all(v.producer.name == FUSED for v in grads)
    assert all(id(v) in plan.owned for v in grads)
    assert fn.entries[-1].source.count("set_grad_owned(") == len(grads)


# --- the pass on hand-built graphs ----------------------------------------------------------
def _step_graph(between_reads=False, between_effect=False):
    """clip_grad_norm of two gradients, optionally a node reading a clipped gradient or an
    effect between, then an AdamW step over both parameters (the clip's order reversed)."""
    from tapegrad.compiler.ir import Graph, Input

    w = tapegrad.nn.Parameter(tapegrad.tensor(np.ones((3, 2))))
    b = tapegrad.nn.Parameter(tapegrad.tensor(np.ones(3)))
    opt = tapegrad.optim.AdamW([w, b])
    g = Graph()
    pw, pb = g.new_value((3, 2), np.float64, "p"), g.new_value((3,), np.float64, "p")
    gw, gb = g.new_value((3, 2), np.float64, "g"), g.new_value((3,), np.float64, "g")
    for v, t, kind in ((pw, w, "ref"), (pb, b, "ref"), (gw, w, "grad"), (gb, b, "grad")):
        g.inputs.append((v, Input(kind, ref=t, label="t")))
    outs = [g.new_value((), np.float64), g.new_value((3, 2), np.float64),
            g.new_value((3,), np.float64)]
    clip = Node(None, "clip_grad_norm", [gw, gb],
                {"max_norm": 1.0, "norm_type": 2.0, "error_if_nonfinite": False}, outs,
                impl=lambda *a, **k: nn_utils._clip_arrays(*a, **k))
    g.nodes.append(clip)
    if between_reads:
        r = g.new_value((3,), np.float64)
        g.nodes.append(Node(None, "neg", [outs[2]], {}, [r], impl=np.negative))
        g.outputs.append(r)
    if between_effect:
        g.nodes.append(Node(None, "effect", [], {}, [], effect=True, impl=lambda: ()))
    news = [g.new_value((3,), np.float64), g.new_value((3, 2), np.float64)]
    step = Node(None, "optimizer_step", [pb, pw, outs[2], outs[1]], {"optimizer": "AdamW"},
                news, effect=True, impl=lambda *a, **k: a[:2], meta={"optimizer": opt})
    g.nodes.append(step)
    g.writes += [("grad", w, "w", outs[1]), ("grad", b, "b", outs[2])]
    return g


def test_pass_fuses_at_the_steps_place_with_the_step_order():
    g = _step_graph()
    f = passes.fuse_clip_optimizer_step(g)
    assert [n.name for n in f.nodes] == [FUSED]
    node = f.nodes[0]
    assert node.effect and node.meta["perm"] == [1, 0]
    assert node.outputs == g.nodes[0].outputs + g.nodes[1].outputs
    assert node.inputs == g.nodes[0].inputs + g.nodes[1].inputs[:2]
    assert "fuse_clip_optimizer_step" in [name for name, _ in passes.PASSES]


@pytest.mark.parametrize("what", ["between_reads", "between_effect"])
def test_pass_leaves_a_clip_read_or_an_effect_before_the_step(what):
    g = _step_graph(**{what: True})
    assert passes.fuse_clip_optimizer_step(g) is g


def test_clip_kernel_falls_back_to_eager_for_other_sizes():
    """A gradient of another size than traced (the precomputed programs do not fit): eager's
    code, the same results."""
    grads = [np.ones((4, 5)), np.arange(7.0)]
    vals = [Value(f"g{i}", a.shape, a.dtype) for i, a in enumerate(grads)]
    params = {"max_norm": 0.5, "norm_type": 2.0, "error_if_nonfinite": False}
    node = Node(None, "clip_grad_norm", vals, params,
                [Value("t", (), np.float64)] + [Value(f"o{i}", v.shape, v.dtype)
                                                for i, v in enumerate(vals)])
    fn = K.clip_grad_norm_factory(node)
    other = [np.full((4, 6), 2.0), np.arange(9.0)]
    for arrays in (grads, other):
        got = fn(*arrays, **params)
        want = nn_utils._clip_arrays(*arrays, **params)
        for a, b in zip(got, want):
            np.testing.assert_array_equal(_bits(a), _bits(b))


# --- clipping in place (eager's ``g *= coef``) where nothing else sees the gradient ----------
def _capture_fused(fn):
    """Wrap the compiled step's fused kernel: record (inputs, outputs) of its calls."""
    ns = fn.entries[-1].run.__globals__
    key = [k for k in ns if k.startswith(f"{FUSED}_kernel")][0]
    real, seen = ns[key], []

    def spy(*arrays, **kw):
        out = real(*arrays, **kw)
        seen.append((arrays, out))
        return out

    ns[key] = spy
    return seen


@pytest.mark.parametrize("dtype", DTYPES)
def test_private_gradients_are_clipped_in_place(monkeypatch, dtype):
    """A gradient a fresh op made that only the clip reads (the weights' matmul gradients,
    the biases' sums) becomes its own clipped output: no new array; the same bits."""
    monkeypatch.setenv("TAPEGRAD_COMPILE_KERNELS", "numba")
    plain, _ = _plain(monkeypatch, dtype, "adamw_groups", True)
    step, model, opt = _mlp(dtype, OPTIMIZERS["adamw_groups"])
    fn = tapegrad.compile(step)
    data = _data(dtype)
    losses = [fn(x, y) for x, y in data[:3]]
    node = [n for n in _graph(fn).nodes if n.name == FUSED][0]
    assert any(node.meta["inplace"])
    seen = _capture_fused(fn)
    losses += [fn(x, y) for x, y in data[3:]]
    nc = len(node.meta["clip"].inputs)
    for arrays, out in seen:
        same = [o is a for o, a in zip(out[1:1 + nc], arrays[:nc])]
        assert same == [bool(f) for f in node.meta["inplace"]]
    _same(plain, (losses, model, opt))


def _raw_read_step(dtype):
    tapegrad.manual_seed(0)
    nn = tapegrad.nn
    model = nn.Sequential(nn.Linear(5, 16), nn.Tanh(), nn.Linear(16, 3)).to(
        getattr(tapegrad, np.dtype(dtype).name))
    opt = tapegrad.optim.AdamW(model.parameters(), lr=1e-2)

    def step(x, y):
        loss = ((model(x) - y) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        raw = model[0].weight.grad * 2.0  # the unclipped gradient, read before the clip
        nn.utils.clip_grad_norm_(model.parameters(), 0.05)
        opt.step()
        return loss.detach(), raw.sum()

    return step, model, opt


@pytest.mark.parametrize("kernels_", ["numba", "numpy"])
def test_a_gradient_read_before_the_clip_is_not_clipped_in_place(monkeypatch, kernels_):
    """The first weight's gradient has another reader: it gets a new clipped array (the
    reader sees the unclipped values), the others may go in place; eager's results."""
    monkeypatch.setenv("TAPEGRAD_COMPILE_KERNELS", kernels_)
    data = _data(np.float64)
    estep, em, _ = _raw_read_step(np.float64)
    want = [tuple(t.item() for t in estep(x, y)) for x, y in data]
    cstep, cm, _ = _raw_read_step(np.float64)
    fn = tapegrad.compile(cstep)
    got = [tuple(t.item() for t in fn(x, y)) for x, y in data]
    node = [n for n in _graph(fn).nodes if n.name == FUSED][0]
    w = list(cm.parameters()).index(cm[0].weight)
    assert not node.meta["inplace"][w] and any(node.meta["inplace"])
    if kernels_ == "numpy":  # (numba's matmul kernels add in another order than BLAS)
        assert got == want
        for p, q in zip(em.parameters(), cm.parameters()):
            np.testing.assert_array_equal(_bits(p.detach().numpy()), _bits(q.detach().numpy()))
    else:
        np.testing.assert_allclose(np.array(got), np.array(want), rtol=1e-10)
