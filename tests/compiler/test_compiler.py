"""tapegrad.compile and tapegrad.compiler: trace/IR, passes, codegen, guards, breaks.

Compiled results are compared with eager tapegrad bitwise with the numpy kernels (no kernel
reorders arithmetic), at 1e-12 with numba's (libm transcendentals, the fused cross-entropy,
contractions summed row by row; the tests run both, numba's skipped when it is absent) and,
for the training steps, with PyTorch eager at 1e-12 in float64.
"""
import warnings

import numpy as np
import pytest
import torch

import tapegrad as tg
import tapegrad.nn as nn
import tapegrad.nn.functional as F
from helpers import graph_node
from tapegrad.bench.spiral import init_params, spiral_data
from tapegrad.compiler import api, kernels, passes
from tapegrad.compiler.ir import Graph, Input, Node, Value
from tapegrad.ops.registry import REGISTRY


def _mlp(T, sizes=(2, 32, 3), seed=0):
    ps = init_params(sizes, seed=seed)
    layers = []
    for k in range(0, len(ps), 2):
        lin = T.nn.Linear(ps[k].shape[1], ps[k].shape[0]).double()
        with T.no_grad():
            lin.weight.copy_(T.tensor(ps[k]))
            lin.bias.copy_(T.tensor(ps[k + 1]))
        layers += [lin, T.nn.ReLU()]
    return T.nn.Sequential(*layers[:-1])


def _step_fn(T, model, opt, sched=None):
    F_ = T.nn.functional

    def step(x, t):
        opt.zero_grad()
        loss = F_.cross_entropy(model(x), t)
        loss.backward()
        opt.step()
        return loss

    return step


def _same_params(m1, m2, backend="numpy"):
    for p, q in zip(m1.parameters(), m2.parameters()):
        assert _agree(p.detach().numpy(), q.detach().numpy(), backend)


@pytest.fixture(params=["numpy", "numba"])
def kernels_(request, monkeypatch):
    """Both kernel compilers: numpy's (bit-identical to eager) and numba's."""
    if request.param == "numba":
        pytest.importorskip("numba", reason="numba (extra 'compile') is not installed: "
                                            "the numba kernel path is not exercised")
    monkeypatch.setenv("TAPEGRAD_COMPILE_KERNELS", request.param)
    return request.param


def _agree(a, b, backend):
    """numpy kernels equal eager bitwise; numba's fused cross-entropy and exp/log/tanh use
    libm and another summation order: 1e-12 relative."""
    a, b = np.asarray(a), np.asarray(b)
    if backend == "numpy":
        return a.shape == b.shape and np.array_equal(a, b)
    return a.shape == b.shape and np.allclose(a, b, rtol=1e-12, atol=1e-15)


# --- trace and IR -----------------------------------------------------------------------
def test_trace_prints_ssa_values_with_shapes_and_dtypes():
    x = tg.ones(2, 3, dtype=tg.float64)
    g = tg.compiler.trace(lambda x: (x * 2.0).exp().sum(dim=1), x)
    text = str(g)
    assert [n.name for n in g.nodes] == ["mul", "exp", "sum"]
    assert "%a00: f64[2, 3]" in text and "mul(%a00, 2.0)" in text
    assert "f64[2] = sum(" in text and text.strip().endswith("}")
    assert g.print_readable() == text


def test_trace_records_joint_graph_with_backward_and_optimizer_effect():
    model = _mlp(tg)
    opt = tg.optim.SGD(model.parameters(), lr=0.1)
    X, y = spiral_data(16)
    g = tg.compiler.trace(_step_fn(tg, model, opt), tg.tensor(X), tg.tensor(y))
    names = [n.name for n in g.nodes]
    # (the targets' range check is a node: it runs on each call's targets)
    assert names[:5] == ["linear", "relu", "linear", "check_index", "cross_entropy_index"]
    assert "matmul" in names and "cross_entropy_index_backward" in names  # rules as ops
    assert not any(n.startswith("vjp_") for n in names)
    # plain SGD is traced as ops: p - lr * g per parameter, lr a graph input, written back
    assert names[-8:] == ["mul", "sub"] * 4 and not any(n.effect for n in g.nodes)
    assert [k for k, *_ in g.writes] == ["grad"] * 4 + ["data"] * 4
    assert sum(src.kind == "ref" for _, src in g.inputs) == 4  # parameters by reference
    assert [src.kind for _, src in g.inputs].count("hyper") == 1
    assert "param_groups[0]['lr']" in str(g)
    # with momentum the optimizer's own update runs as one effect node
    model = _mlp(tg)
    opt = tg.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    g = tg.compiler.trace(_step_fn(tg, model, opt), tg.tensor(X), tg.tensor(y))
    assert g.nodes[-1].name == "optimizer_step" and g.nodes[-1].effect
    assert [k for k, *_ in g.writes] == ["grad"] * 4


def test_trace_fullgraph_break_names_source_line():
    x = tg.ones(3, dtype=tg.float64)

    def f(x):
        s = (x * 2).sum()
        if s.item() > 0:  # a break: Python control flow on a value
            return s
        return -s

    with pytest.raises(tg.compiler.GraphBreak) as e:
        tg.compiler.trace(f, x)
    assert "item" in str(e.value) and "test_compiler.py" in e.value.where
    assert "s.item() > 0" in e.value.where


# --- passes -----------------------------------------------------------------------------
def _graph(build):
    """A small graph by hand: build(g, inp) -> outputs."""
    g = Graph()
    x = g.new_value((4,), np.float64, "x")
    g.inputs.append((x, Input("array", index=0)))
    g.outputs = build(g, x)
    return g, x


_node = graph_node  # (tests/helpers.py)


def test_dce_removes_exactly_the_dead_nodes():
    keep = {}

    def build(g, x):
        a = _node(g, "exp", [x])
        _node(g, "log", [a])  # dead
        d = _node(g, "tanh", [x])
        _node(g, "mul", [d, 2.0])  # dead
        keep["out"] = _node(g, "add", [a, d])
        return [keep["out"]]

    g, _ = _graph(build)
    out = passes.dce(g)
    assert [n.name for n in out.nodes] == ["exp", "tanh", "add"]
    assert len(g.nodes) == 5  # the input graph is left as it was


def test_cse_merges_exactly_the_duplicates():
    def build(g, x):
        a = _node(g, "exp", [x])
        b = _node(g, "exp", [x])  # duplicate of a
        c = _node(g, "mul", [a, 2.0])
        d = _node(g, "mul", [b, 2.0])  # duplicate of c once b is a
        e = _node(g, "mul", [b, 3.0])  # a different param: kept
        return [_node(g, "add", [c, d]), e]

    g, x = _graph(build)
    out = passes.cse(g)
    assert [n.name for n in out.nodes] == ["exp", "mul", "mul", "add"]
    add = out.nodes[-1]
    assert add.inputs[0] is add.inputs[1]
    arr = [np.linspace(-1, 1, 4)]
    assert all(np.array_equal(a, b) for a, b in
               zip(passes.evaluate(g, arr)[0], passes.evaluate(out, arr)[0]))


def test_fold_and_simplify():
    def build(g, x):
        c = g.new_value((4,), np.float64, "c")
        g.consts[c] = np.arange(4.0)
        k = _node(g, "exp", [c])  # constant: folded
        r = _node(g, "reshape", [x], shape=(4,))  # identity: removed
        m = _node(g, "mul", [r, 1])  # times one: removed
        return [_node(g, "add", [m, k])]

    g, x = _graph(build)
    s = passes.simplify(g)
    assert [n.name for n in s.nodes] == ["exp", "add"]
    assert s.nodes[-1].inputs[0] is x
    f = passes.fold_constants(s)
    assert [n.name for n in f.nodes] == ["add"]
    arr = [np.linspace(-1, 1, 4)]
    assert np.array_equal(passes.evaluate(g, arr)[0][0], passes.evaluate(f, arr)[0][0])


def test_fusion_groups_pointwise_chains(kernels_):
    def build(g, x):
        a = _node(g, "exp", [x])
        b = _node(g, "mul", [a, 2.0])
        c = _node(g, "tanh", [b])  # exp -> mul -> tanh: one kernel
        s = _node(g, "sum", [c], dims=(0,))  # a reduction ends the group
        d = _node(g, "neg", [x])
        e = _node(g, "add", [d, c])  # c has two readers: not fused into e's group
        return [s, e]

    g, x = _graph(build)
    out = passes.fuse(g)
    names = [n.name for n in out.nodes]
    assert names == ["fused", "sum", "fused"]
    assert [m.name for m in out.nodes[0].meta["nodes"]] == ["exp", "mul", "tanh"]
    assert [m.name for m in out.nodes[2].meta["nodes"]] == ["neg", "add"]
    arr = [np.linspace(-1, 1, 4)]
    src, run = tg.compiler.codegen.generate(out)
    got = run([arr[0]], [None], [])
    want = passes.evaluate(g, arr)[0]
    assert all(_agree(a, b, kernels_) for a, b in zip(got, want))
    if kernels_ == "numpy":
        assert "def fused_0(" in src and "out=" in src  # buffers reused inside the kernel
    else:  # one loop nest per group, called inline with its result buffer; a group with
        # exp/tanh stays numpy's ufunc calls where numpy has its own loops for them (eager's)
        libm = kernels.libm_exact("exp", np.float64) and kernels.libm_exact("tanh", np.float64)
        assert src.count("@njit(") == 1 + libm and "# exp -> mul -> tanh" in src


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_gelu_and_erf_chains_fuse_into_one_kernel_each(kernels_, dtype):
    """GELU, its gradient and erf join their pointwise chains; numba computes erf as eager
    does (float32: ``erf32``, in float64 rounded once; float64: ``erf64`` reading numpy's exp
    of its argument, which is therefore the group's input: the chain before a float64 erf
    is not in its kernel). Bitwise eager's, but gelu_backward's float32 exp (libm) within
    float32 rounding."""
    R, C = 64, 33
    g = Graph()
    x = g.new_value((R, C), dtype, "x")
    gr = g.new_value((R, C), dtype, "g")
    b = g.new_value((C,), dtype, "b")
    for i, v in enumerate((x, gr, b)):
        g.inputs.append((v, Input("array", index=i)))
    ins = {"approximate": "none"}
    fwd = _node(g, "mul", [_node(g, "gelu", [_node(g, "add", [x, b])], **ins), 3.0])
    bwd = _node(g, "sub", [_node(g, "gelu_backward", [_node(g, "mul", [gr, 0.5]), x], **ins),
                           1.0])
    erf = _node(g, "add", [_node(g, "erf", [_node(g, "neg", [x])]), 1.0])
    g.outputs = [fwd, bwd, erf]
    out = passes.fuse(g)
    cut = kernels_ == "numba" and dtype == np.float64  # erf64's argument: a group input
    assert [n.name for n in out.nodes] == (
        ["add", "fused", "fused", "neg", "fused"] if cut else ["fused"] * 3)
    assert [[m.name for m in n.meta["nodes"]] for n in out.nodes if n.name == "fused"] == (
        [["gelu", "mul"], ["mul", "gelu_backward", "sub"], ["erf", "add"]] if cut else
        [["add", "gelu", "mul"], ["mul", "gelu_backward", "sub"], ["neg", "erf", "add"]])
    rng = np.random.default_rng(0)
    arr = [(rng.standard_normal(s) * 3).astype(dtype) for s in ((R, C), (R, C), (C,))]
    src, run = tg.compiler.codegen.generate(out)
    got = run(arr, [None] * 3, [])
    want = passes.evaluate(g, arr)[0]
    libm = kernels.libm_exact("exp", dtype)  # gelu_backward's exp: numba's is numpy's here
    if kernels_ == "numba":
        # float32: erf32, a polynomial in float64 rounded once (kernels.py; eager's float32
        # erf except within 5.4e-14 of a rounding midpoint, then 1 ulp); float64: erf64, its
        # exp numpy's before the kernel; gelu_backward a kernel too: its exp by numba where
        # numba's is numpy's, else numpy's before the kernel
        call = "erf64(" if dtype == np.float64 else "erf32(np.float64("
        if dtype == np.float64:
            assert src.count("outside_call('gelu_erf_exp', ") == 2
            assert src.count("outside_call('erf_exp', ") == 1
        calls = src.count(call) - src.count("def " + call)
        assert src.count("@njit(error_model") == 3 and calls == 3
        assert ("outside_call('gelu_exp', " in src) != libm
    for k, (a, w) in enumerate(zip(got, want)):
        a, w = np.asarray(a), np.asarray(w)
        assert a.dtype == w.dtype == dtype
        if kernels_ == "numpy" or k != 1 or not libm:
            assert np.array_equal(a, w), k
        elif dtype == np.float32:
            assert np.abs(a - w).max() <= 4 * np.finfo(dtype).eps * np.abs(w).max(), k
        else:
            assert _agree(a, w, kernels_), k


def test_value_check_names_a_broken_pass():
    def build(g, x):
        return [_node(g, "mul", [_node(g, "exp", [x]), 2.0])]

    g, _ = _graph(build)

    def broken(graph):  # "simplifies" x * 2 to x
        return passes._substitute(graph, {id(graph.nodes[1].outputs[0]):
                                          graph.nodes[0].outputs[0]}, {id(graph.nodes[1])})

    arr = [np.linspace(-1, 1, 4)]
    passes.optimize(g, check=arr)  # the real passes keep every value
    with pytest.raises(passes.PassCheckError) as e:
        passes.optimize(g, (("cse", passes.cse), ("broken", broken)), check=arr)
    assert e.value.pass_name == "broken"


# --- compile: training steps --------------------------------------------------------------
def test_spiral_sgd_step_compiled_equals_eager_and_torch_over_100_steps(kernels_):
    X, y = spiral_data(512)
    m_eager, m_comp, m_torch = _mlp(tg), _mlp(tg), _mlp(torch)
    eager = _step_fn(tg, m_eager, tg.optim.SGD(m_eager.parameters(), lr=0.5))
    comp = tg.compile(_step_fn(tg, m_comp, tg.optim.SGD(m_comp.parameters(), lr=0.5)))
    ref = _step_fn(torch, m_torch, torch.optim.SGD(m_torch.parameters(), lr=0.5))
    Xt, yt, Xr, yr = tg.tensor(X), tg.tensor(y), torch.tensor(X), torch.tensor(y)
    for i in range(100):
        le, lc, lr_ = eager(Xt, yt).item(), comp(Xt, yt).item(), ref(Xr, yr).item()
        assert _agree(le, lc, kernels_), i
        assert abs(lc - lr_) <= 1e-12 * abs(lr_), i
    _same_params(m_eager, m_comp, kernels_)
    assert len(comp.entries) == 2 and comp.n_hits == 98  # grads absent, then present
    for p, q in zip(m_comp.parameters(), m_torch.parameters()):
        np.testing.assert_allclose(p.detach().numpy(), q.detach().numpy(), rtol=1e-11,
                                   atol=1e-13)
        np.testing.assert_allclose(p.grad.numpy(), q.grad.numpy(), rtol=1e-10, atol=1e-13)


def test_step_with_new_batches_each_call(kernels_):
    """Targets and inputs are read each call (a frozen first batch would diverge)."""
    m1, m2 = _mlp(tg), _mlp(tg)
    s1 = _step_fn(tg, m1, tg.optim.SGD(m1.parameters(), lr=0.3, momentum=0.9))
    s2 = tg.compile(_step_fn(tg, m2, tg.optim.SGD(m2.parameters(), lr=0.3, momentum=0.9)))
    rng = np.random.default_rng(1)
    for i in range(20):
        X = tg.tensor(rng.standard_normal((64, 2)))
        y = tg.tensor(rng.integers(0, 3, 64))
        assert _agree(s1(X, y).item(), s2(X, y).item(), kernels_), i
    _same_params(m1, m2, kernels_)
    assert s2.n_hits == 18


def test_adam_with_lr_scheduler_compiled_equals_eager(kernels_):
    X, y = spiral_data(128)
    Xt, yt = tg.tensor(X), tg.tensor(y)
    runs = []
    for compiled in (False, True):
        model = _mlp(tg, (2, 16, 16, 3))
        opt = tg.optim.Adam(model.parameters(), lr=0.01)
        sched = tg.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=30)
        step = _step_fn(tg, model, opt)
        if compiled:
            step = tg.compile(step)
        losses = []
        for _ in range(30):
            losses.append(step(Xt, yt).item())
            sched.step()  # a new LR each step: read at run time, never baked in
        runs.append((losses, model, step))
    assert _agree(runs[0][0], runs[1][0], kernels_)
    _same_params(runs[0][1], runs[1][1], kernels_)
    assert len(runs[1][2].entries) == 2


def test_compiled_module_forward_and_backward_node(kernels_):
    X, y = spiral_data(64)
    m1, m2 = _mlp(tg), _mlp(tg)
    cm = tg.compile(m2)
    o1, o2 = tg.optim.SGD(m1.parameters(), lr=0.2), tg.optim.SGD(m2.parameters(), lr=0.2)
    Xt, yt = tg.tensor(X), tg.tensor(y)
    for i in range(5):
        for m, o in ((m1, o1), (cm, o2)):
            o.zero_grad()
            loss = F.cross_entropy(m(Xt), yt)
            loss.backward()
            o.step()
    _same_params(m1, m2, kernels_)
    e = cm._compiled.entries[-1]
    assert e.joint is not None and cm._compiled.n_hits >= 3
    out = cm(Xt)
    assert out.grad_fn is not None  # one node on the tape for the compiled backward
    assert cm.training and cm._orig_mod is m2


# --- guards, recompiles, breaks -------------------------------------------------------------
def test_guards_recompile_on_shape_dtype_requires_grad_and_grad_mode():
    f = tg.compile(lambda x: (x * x + 1).sum(dim=0))
    a = tg.ones(3, 2, dtype=tg.float64)
    f(a), f(a)
    assert len(f.entries) == 1 and f.n_hits == 1
    f(tg.ones(4, 2, dtype=tg.float64))
    f(tg.ones(3, 2, dtype=tg.float32))
    assert len(f.entries) == 3
    r = tg.ones(3, 2, dtype=tg.float64, requires_grad=True)
    out = f(r)
    out.sum().backward()
    np.testing.assert_array_equal(r.grad.numpy(), 2 * np.ones((3, 2)))
    with tg.no_grad():
        f(r)
    assert len(f.entries) == 5
    x = tg.tensor(np.linspace(-2, 2, 6).reshape(3, 2))
    np.testing.assert_array_equal(f(x).numpy(), (x.numpy() ** 2 + 1).sum(0))


def test_training_flag_is_guarded():
    model = nn.Sequential(nn.Linear(3, 3), nn.Dropout(0.5)).double()
    f = tg.compile(lambda x: model(x))
    x = tg.ones(2, 3, dtype=tg.float64)
    model.eval()
    with tg.no_grad():
        f(x), f(x)
    assert len(f.entries) == 1
    model.train()
    tg.manual_seed(0)
    with tg.no_grad():
        a = f(x)  # a new graph: dropout's mask drawn at run time from the generator
        a2 = f(x)
        tg.manual_seed(0)
        b, b2 = model(x), model(x)
    np.testing.assert_array_equal(a.numpy(), b.numpy())
    np.testing.assert_array_equal(a2.numpy(), b2.numpy())
    assert len(f.entries) == 2 and not f.breaks and f.n_hits == 2


def test_dropout_masks_are_fresh_each_call():
    model = nn.Sequential(nn.Linear(8, 8), nn.Dropout(0.5)).double()
    f = tg.compile(model)
    x = tg.ones(4, 8, dtype=tg.float64)
    tg.manual_seed(3)
    outs = [f(x).detach().numpy().copy() for _ in range(3)]
    tg.manual_seed(3)
    want = [model(x).detach().numpy().copy() for _ in range(3)]
    for a, b in zip(outs, want):
        np.testing.assert_array_equal(a, b)
    assert not np.array_equal(outs[0], outs[1])


def test_cache_limit_then_eager_with_a_warning(monkeypatch):
    monkeypatch.setattr(api, "cache_size_limit", 2)
    f = tg.compile(lambda x, k: x * k)
    x = tg.ones(2, dtype=tg.float64)
    f(x, 1.0), f(x, 2.0)
    with pytest.warns(RuntimeWarning, match="cache size limit"):
        out = f(x, 3.0)
    np.testing.assert_array_equal(out.numpy(), [3.0, 3.0])
    assert len(f.entries) == 2


@pytest.mark.parametrize("read", ["item", "bool", "tolist", "numpy"])
def test_graph_breaks_give_correct_results(read):
    def f(x):
        s = (x * 3).sum()
        if read == "item":
            v = s.item()
        elif read == "bool":
            v = 1.0 if bool(s > 0) else -1.0
        elif read == "tolist":
            v = s.tolist()
        else:
            v = float(s.detach().numpy())
        return x * v

    c = tg.compile(f)
    for k in (1.0, -2.0, 0.5):
        x = tg.tensor([k, 2 * k], dtype=tg.float64)
        np.testing.assert_array_equal(c(x).numpy(), f(x).numpy())
    e, = c.entries  # compiled pieces around the read (torch.compile splits the same way)
    assert isinstance(e, api.SplitEntry) and len(c.breaks) == 1 and e.n_replays == 2
    with pytest.raises(tg.compiler.GraphBreak, match="test_compiler.py"):
        tg.compile(f, fullgraph=True)(tg.ones(2, dtype=tg.float64))


def test_explain_reports_graphs_breaks_and_passes():
    model = _mlp(tg)
    opt = tg.optim.SGD(model.parameters(), lr=0.1)
    X, y = spiral_data(32)
    out = tg.compiler.explain(_step_fn(tg, model, opt))(tg.tensor(X), tg.tensor(y))
    assert out.graph_count == 1 and out.graph_break_count == 0
    names = [name for name, _, _ in out.pass_log]
    assert names == [name for name, _ in passes.PASSES]
    want = ["split_linear", "fuse_cross_entropy", "fuse_layer_norm_backward",
            "fuse_softmax_backward", "share_attention_probabilities", "merge_split_gradients",
            "share_gelu_erf", "fuse_clip_optimizer_step", "fuse"]
    assert [n for n in names if n in want] == want and names[-1] == "fuse"  # (in this order)
    assert "Graph Count: 1" in str(out)

    def bad(x):
        return x * (x.sum().item())

    out = tg.compiler.explain(bad)(tg.ones(2, dtype=tg.float64))
    assert out.graph_count == 2 and out.graph_break_count == 1  # x.sum() | read | x * v
    assert "item" in out.break_reasons[0].reason


def test_in_place_outside_ops_is_captured_not_a_silent_drop():
    w = tg.ones(3, dtype=tg.float64)

    def f(x):
        with tg.no_grad():
            w.clamp_(max=0.5)  # an in-place fast path on outside state: recorded, written back
        return x * w

    c = tg.compile(f)
    x = tg.ones(3, dtype=tg.float64)
    for _ in range(3):
        w.copy_(tg.tensor([1.0, 0.25, 2.0], dtype=tg.float64))
        np.testing.assert_array_equal(c(x).numpy(), [0.5, 0.25, 0.5])
        np.testing.assert_array_equal(w.numpy(), [0.5, 0.25, 0.5])
    assert len(c.entries) == 1 and c.n_hits == 2 and not c.breaks


def test_manual_sgd_in_place_update_is_traced_and_written_back(kernels_):
    X, y = spiral_data(64)
    Xt, yt = tg.tensor(X), tg.tensor(y)
    ms = [_mlp(tg), _mlp(tg)]

    def make(model):
        def step(x, t):
            loss = F.cross_entropy(model(x), t)
            loss.backward()
            with tg.no_grad():
                for p in model.parameters():
                    p.add_(p.grad, alpha=-0.5)
                    p.grad = None
            return loss
        return step

    s0, s1 = make(ms[0]), tg.compile(make(ms[1]))
    for _ in range(10):
        assert _agree(s0(Xt, yt).item(), s1(Xt, yt).item(), kernels_)
    _same_params(*ms, kernels_)
    assert s1.n_hits == 9 and any(k == "data" for k, *_ in s1.entries[0].graph.writes)


# --- the speed layer: SGD as ops, epilogues, small products, memory plan, kernels ---------
def _inputs(g, *shapes, dtype=np.float64):
    vals = []
    for k, shape in enumerate(shapes):
        v = g.new_value(shape, dtype, "x")
        g.inputs.append((v, Input("array", index=k)))
        vals.append(v)
    return vals


def _run_both(g, arrays, backend):
    src, run = tg.compiler.codegen.generate(g)
    return src, run(arrays, [None] * len(g.inputs), [])


def test_sgd_traced_as_ops_reads_the_scheduled_lr_each_call(kernels_):
    X, y = spiral_data(64)
    Xt, yt = tg.tensor(X), tg.tensor(y)
    runs = []
    for compiled in (False, True):
        model = _mlp(tg)
        opt = tg.optim.SGD(model.parameters(), lr=0.5)
        sched = tg.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)
        step = _step_fn(tg, model, opt)
        if compiled:
            step = tg.compile(step)
        arrays = [p._data for p in model.parameters()]
        losses = []
        for _ in range(10):
            losses.append(step(Xt, yt).item())
            sched.step()
        assert all(p._data is a for p, a in zip(model.parameters(), arrays))  # in place
        runs.append((losses, model, step))
    assert _agree(runs[0][0], runs[1][0], kernels_)
    _same_params(runs[0][1], runs[1][1], kernels_)
    comp = runs[1][2]
    assert len(comp.entries) == 2 and comp.n_hits == 8
    # a hyperparameter the traced update assumed (momentum 0) changes: a new graph
    opt = next(m for m in [comp.fn.__closure__] if m)  # the step's closure holds opt
    sgd = [c.cell_contents for c in opt if isinstance(c.cell_contents, tg.optim.SGD)][0]
    sgd.param_groups[0]["momentum"] = 0.9
    comp(Xt, yt)
    assert len(comp.entries) == 3 and comp.entries[-1].graph.count("optimizer_step") == 1


def test_fuse_takes_column_sums_into_the_kernel(kernels_):
    g = Graph()
    a, b = _inputs(g, (5, 3), (5, 3))
    m = g.new_value((5, 3), np.float64)
    g.nodes.append(Node(REGISTRY["mul"], "mul", [a, b], {}, [m]))
    r = g.new_value((5, 3), np.float64)
    g.nodes.append(Node(REGISTRY["relu"], "relu", [m], {}, [r]))
    s = g.new_value((3,), np.float64)
    g.nodes.append(Node(REGISTRY["sum"], "sum", [r], {"dims": (0,)}, [s]))
    g.outputs = [r, s]
    out = passes.fuse(g)
    assert [n.name for n in out.nodes] == ["fused"] and len(out.nodes[0].outputs) == 2
    assert [n.name for n in out.nodes[0].meta["reduce"]] == ["sum"]
    rng = np.random.default_rng(0)
    arr = [rng.standard_normal((5, 3)), rng.standard_normal((5, 3))]
    want = passes.evaluate(g, arr)[0]
    _, got = _run_both(out, arr, kernels_)
    # rows are added in order, as numpy's add.reduce over a leading axis: bitwise both ways
    assert all(np.array_equal(x, y) for x, y in zip(got, want))


def test_split_linear_and_small_k_matmul_join_the_relu_kernel(kernels_):
    g = Graph()
    x, w, b = _inputs(g, (6, 2), (4, 2), (4,))
    h = g.new_value((6, 4), np.float64)
    g.nodes.append(Node(REGISTRY["linear"], "linear", [x, w, b], {}, [h]))
    r = g.new_value((6, 4), np.float64)
    g.nodes.append(Node(REGISTRY["relu"], "relu", [h], {}, [r]))
    g.outputs = [r]
    rng = np.random.default_rng(1)
    arr = [rng.standard_normal((6, 2)), rng.standard_normal((4, 2)), rng.standard_normal(4)]
    split = passes.split_linear(g)
    assert [n.name for n in split.nodes] == ["permute", "matmul", "add", "relu"]
    assert np.array_equal(passes.evaluate(split, arr)[0][0], passes.evaluate(g, arr)[0][0])
    out = passes.fuse(split)
    assert [n.name for n in out.nodes] == ["permute", "fused"]
    assert [m.name for m in out.nodes[1].meta["nodes"]] == ["matmul", "add", "relu"]
    src, got = _run_both(out, arr, kernels_)
    assert _agree(got[0], passes.evaluate(g, arr)[0][0], kernels_)
    if kernels_ == "numba":  # two multiply-adds per element: the BLAS's fma chain
        assert "fma(x0_1, x1_r1[j], fma(x0_0, x1_r0[j], np.float64(0.0)))" in src
        if "eager's bits" in src:  # (the BLAS computes that chain here: probed)
            assert np.array_equal(got[0], passes.evaluate(g, arr)[0][0])


def test_contractions_over_rows_accumulate_in_the_backward_kernel(kernels_):
    model = _mlp(tg)
    opt = tg.optim.SGD(model.parameters(), lr=0.1)
    X, y = spiral_data(48)
    g = tg.compiler.trace(_step_fn(tg, model, opt), tg.tensor(X), tg.tensor(y))
    arr = api._check_inputs(g, (tg.tensor(X), tg.tensor(y)))
    out = passes.optimize(g, check=arr)  # each pass leaves every result bit-identical
    fused = [n for n in out.nodes if n.name == "fused" and n.meta.get("contract")]
    assert len(fused) == 1
    f = fused[0]
    assert [m.name for m in f.meta["nodes"]] == ["matmul", "gt", "to_dtype", "mul"]
    assert sorted(c[2] for c in f.meta["contract"]) == ["left", "right"]  # dW2, dW1
    assert f.meta["store"] is False  # dz is read only by its own epilogues
    assert out.count("cross_entropy_fused") == 1 and out.count("matmul") == 0
    src, run = tg.compiler.codegen.generate(out)
    refs = [src_.ref if src_.kind in ("ref", "grad") else None for _, src_ in out.inputs]
    before = [p.detach().numpy().copy() for p in model.parameters()]
    want_grads = passes.evaluate(out, arr)[1]
    run((tg.tensor(X), tg.tensor(y)), refs, [t for _, t, _, _ in out.writes])
    got_grads = [t.grad.numpy() for kind, t, _, v in out.writes if kind == "grad"]
    assert all(_agree(a, b, kernels_) for a, b in zip(got_grads, want_grads))
    assert not any(np.array_equal(a, p.detach().numpy())
                   for a, p in zip(before, model.parameters()))


def test_memory_plan_liveness_slots_in_place_and_owned():
    model = _mlp(tg)
    opt = tg.optim.SGD(model.parameters(), lr=0.1)
    X, y = spiral_data(32)
    g = passes.optimize(tg.compiler.trace(_step_fn(tg, model, opt), tg.tensor(X),
                                          tg.tensor(y)))
    plan = tg.compiler.memory.plan(g)
    ins = {id(v): src for v, src in g.inputs}
    inplace = [t for t in plan.out.values() if t[0] == "inplace"]
    assert len(inplace) == 4 and all(ins[id(v)].kind == "ref" for _, v in inplace)
    escaping = {id(v) for v in g.outputs if isinstance(v, Value)} | {
        id(v) for _, _, _, v in g.writes if v is not None}
    slots = {k for k, t in plan.out.items() if t[0] == "slot"}
    assert slots and not slots & escaping  # no planned buffer leaves the call
    # two slot values share a buffer only when their lifetimes do not overlap
    pos = {id(v): i for i, n in enumerate(g.nodes) for v in n.outputs}
    last = {}
    for i, n in enumerate(g.nodes):
        for a in n.values_in():
            last[id(a)] = i
    by_slot = {}
    for k in slots:
        by_slot.setdefault(plan.out[k][1], []).append(k)
    for vs in by_slot.values():
        spans = sorted((pos[k], last.get(k, pos[k])) for k in vs)
        assert all(a[1] < b[0] for a, b in zip(spans, spans[1:]))
    grads = [v for kind, _, _, v in g.writes if kind == "grad"]
    assert all(id(v) in plan.owned for v in grads)  # stored as .grad without a copy


def test_clipped_gradients_become_grads_without_a_copy_and_stay_per_call(kernels_):
    """clip_grad_norm_'s outputs are new arrays (its kernel's and its numpy body's): stored
    as ``.grad`` with no copy (memory.FRESH_KERNELS), each call's its own (a gradient kept
    from one step keeps its values after the next), agreeing with eager's."""

    def make():
        tg.manual_seed(3)
        model = tg.nn.Sequential(tg.nn.Linear(3, 5), tg.nn.Tanh(), tg.nn.Linear(5, 2)).to(
            tg.float64)
        opt = tg.optim.AdamW(model.parameters(), lr=0.05)

        def step(x, y):
            loss = ((model(x) - y) ** 2).mean()
            opt.zero_grad()
            loss.backward()
            tg.nn.utils.clip_grad_norm_(model.parameters(), 0.01)
            opt.step()
            return loss.item()
        return model, step

    rng = np.random.default_rng(0)
    data = [(tg.tensor(rng.standard_normal((6, 3))), tg.tensor(rng.standard_normal((6, 2))))
            for _ in range(4)]
    em, estep = make()
    cm, cstep = make()
    f = tg.compile(cstep)
    kept = []
    for x, y in data:
        assert _agree(estep(x, y), f(x, y), kernels_)
        kept.append([(p.grad, p.grad.numpy().copy()) for p in cm.parameters()])
        for pe, pc in zip(em.parameters(), cm.parameters()):
            assert _agree(pe.grad.numpy(), pc.grad.numpy(), kernels_)
    for grads in kept:  # later calls wrote none of an earlier call's gradients
        assert all(np.array_equal(g.numpy(), v) for g, v in grads)
    g = f.entries[-1].run_graph
    plan = tg.compiler.memory.plan(g)
    grads = [v for kind, _, _, v in g.writes if kind == "grad"]
    assert grads and all(v.producer.name in ("clip_grad_norm", "clip_grad_norm_optimizer_step")
                         for v in grads)  # (kernels_optim fuses the clip with AdamW's step)
    assert all(id(v) in plan.owned for v in grads)


def test_returned_results_recycle_only_unheld_arrays(kernels_):
    f = tg.compile(lambda x: (x * 2.0 + 1.0).relu())
    x = tg.tensor(np.linspace(-1, 1, 8))
    f(x), f(x)
    a = f(x)
    first = id(a._data)  # (an id: holding the array would keep it busy)
    del a
    b = f(x)
    assert id(b._data) == first  # nobody held it: reused
    view = b[2:]
    del b
    c = f(x)
    assert c._data is not view._data.base  # a view still holds the last array: a new one
    want = np.maximum(x.numpy() * 2.0 + 1.0, 0)
    np.testing.assert_array_equal(view.numpy(), want[2:])
    np.testing.assert_array_equal(c.numpy(), want)


def test_float32_chain_keeps_weak_scalars_and_matches_eager(kernels_):
    def chain(x):
        return ((x * 1.0001 + 0.5).relu() - 0.25) / 3.0

    x = tg.tensor(np.random.default_rng(2).standard_normal(1000)).float()
    f = tg.compile(chain)
    f(x)
    got = f(x)
    assert got.dtype == tg.float32
    np.testing.assert_array_equal(got.numpy(), chain(x).numpy())  # + - * / max: exact


def test_cross_entropy_kernel_raises_on_a_target_out_of_range(kernels_):
    model = _mlp(tg)
    opt = tg.optim.SGD(model.parameters(), lr=0.1)
    step = tg.compile(_step_fn(tg, model, opt))
    X, y = spiral_data(16)
    step(tg.tensor(X), tg.tensor(y))
    step(tg.tensor(X), tg.tensor(y))
    bad = y.copy()
    bad[3] = 7
    with pytest.raises(IndexError):
        step(tg.tensor(X), tg.tensor(bad))


def test_kernels_on_3d_results_with_a_broadcast_row(kernels_):
    b = tg.tensor(np.linspace(-1, 1, 4))

    def f(x):
        return ((x * 2.0 + b).relu() - 0.5) * x

    x = tg.tensor(np.random.default_rng(3).standard_normal((2, 3, 4)))
    c = tg.compile(f)
    c(x)
    got = c(x)
    assert c.n_hits == 1 and c.entries[0].graph.count("fused") == 1
    np.testing.assert_array_equal(got.numpy(), f(x).numpy())  # + - * max: exact both ways
