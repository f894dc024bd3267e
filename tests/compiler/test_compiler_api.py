"""The compiler's front end (compiler/api.py): guards on what the graph depends on, not on the
identity of the argument tensors (a fresh leaf each call hits the cache and still gets its
``.grad``, as eager); ``opt.zero_grad(set_to_none=False)`` captured inside a training step;
``explain`` reporting the inner compiled functions that ran eagerly under a transform.

Values are compared with eager tapegrad bitwise (numpy kernels) and at 1e-12 against PyTorch
eager in float64.
"""
import warnings

import numpy as np
import pytest
import torch

import tapegrad as tg
import tapegrad.nn as nn
import tapegrad.nn.functional as F
from tapegrad.compiler import api
from tapegrad.func import grad, jvp, vmap


@pytest.fixture(autouse=True)
def _numpy_kernels(monkeypatch):
    monkeypatch.setenv("TAPEGRAD_COMPILE_KERNELS", "numpy")  # bitwise eager


_W = np.random.default_rng(0).standard_normal((3, 4))


def _step(T, W):
    def step(x):
        y = ((x @ W).tanh() ** 2).sum()
        y.backward()
        return y

    return step


# --- 1) fresh leaf arguments --------------------------------------------------------------
@pytest.mark.parametrize("reuse", [False, True])
def test_fresh_leaf_arguments_hit_the_cache_and_get_their_grad(reuse):
    rng = np.random.default_rng(1)
    xs = [rng.standard_normal((2, 3)) for _ in range(6)]
    Wc, We = (tg.tensor(_W, requires_grad=True) for _ in range(2))
    Wt = torch.tensor(_W, requires_grad=True)
    f, e, t = tg.compile(_step(tg, Wc)), _step(tg, We), _step(torch, Wt)
    if reuse:  # one leaf: its .grad accumulates over the calls
        xc, xe = tg.tensor(xs[0], requires_grad=True), tg.tensor(xs[0], requires_grad=True)
        xt = torch.tensor(xs[0], requires_grad=True)
    for x in xs:
        if not reuse:  # a new leaf each call (the same spec)
            xc, xe = tg.tensor(x, requires_grad=True), tg.tensor(x, requires_grad=True)
            xt = torch.tensor(x, requires_grad=True)
        a, b, c = f(xc), e(xe), t(xt)
        np.testing.assert_array_equal(a.detach().numpy(), b.detach().numpy())
        np.testing.assert_allclose(a.detach().numpy(), c.detach().numpy(), rtol=0, atol=1e-12)
        np.testing.assert_array_equal(xc.grad.numpy(), xe.grad.numpy())
        np.testing.assert_allclose(xc.grad.numpy(), xt.grad.numpy(), rtol=0, atol=1e-12)
        np.testing.assert_array_equal(Wc.grad.numpy(), We.grad.numpy())
        np.testing.assert_allclose(Wc.grad.numpy(), Wt.grad.numpy(), rtol=0, atol=1e-12)
    # two graphs: W.grad (and a reused x.grad) absent on the first call, accumulated after;
    # fresh leaves: the second graph writes each call's own x.grad, never the first leaf's
    assert len(f.entries) == 2 and f.n_hits == len(xs) - 2 and not f.breaks
    assert len(f.compile_times) == 2


def test_fresh_leaf_arguments_in_a_step_read_after_its_last_op():
    """A tail-read step (``loss.item()`` after ``opt.step()``): the replay's skipped
    backward gives this call's leaf its gradient."""
    def make(T, W):
        opt = T.optim.SGD([W], lr=0.1)

        def step(x):
            opt.zero_grad()
            y = ((x @ W).tanh() ** 2).sum()
            y.backward()
            opt.step()
            return y.item()

        return step

    Wc, We = (tg.tensor(_W, requires_grad=True) for _ in range(2))
    Wt = torch.tensor(_W, requires_grad=True)
    f, e, t = tg.compile(make(tg, Wc)), make(tg, We), make(torch, Wt)
    rng = np.random.default_rng(8)
    for _ in range(6):
        x = rng.standard_normal((2, 3))
        xc, xe = tg.tensor(x, requires_grad=True), tg.tensor(x, requires_grad=True)
        xt = torch.tensor(x, requires_grad=True)
        a, b, c = f(xc), e(xe), t(xt)
        assert a == b and abs(a - c) < 1e-12
        np.testing.assert_array_equal(xc.grad.numpy(), xe.grad.numpy())
        np.testing.assert_allclose(xc.grad.numpy(), xt.grad.numpy(), rtol=0, atol=1e-12)
        np.testing.assert_array_equal(Wc.detach().numpy(), We.detach().numpy())
        np.testing.assert_allclose(Wc.detach().numpy(), Wt.detach().numpy(), rtol=0, atol=1e-12)
    # W.grad None on the first call, present (then set to None) after: two graphs
    assert [type(x).__name__ for x in f.entries] == ["TailEntry"] * 2 and f.n_hits == 4
    assert all(x.n_fallbacks == 0 for x in f.entries)


def test_fresh_leaf_with_a_grad_already_is_guarded_per_call():
    f = tg.compile(lambda x: (x * x).sum().backward())
    x0 = tg.tensor([1.0, 2.0], requires_grad=True)
    f(x0), f(tg.tensor([1.0, 2.0], requires_grad=True))
    assert len(f.entries) == 1 and f.n_hits == 1  # a fresh leaf: no grad, the same graph
    x = tg.tensor([3.0, 4.0], requires_grad=True)
    x.grad = tg.tensor([10.0, 20.0])  # this argument's .grad exists: accumulate (new graph)
    f(x)
    np.testing.assert_array_equal(x.grad.numpy(), [16.0, 28.0])
    assert len(f.entries) == 2
    y = tg.tensor([1.0, 1.0], requires_grad=True)
    y.grad = tg.tensor([1.0, 2.0])
    f(y)  # its own grad read and written (not x's)
    np.testing.assert_array_equal(y.grad.numpy(), [3.0, 4.0])
    np.testing.assert_array_equal(x.grad.numpy(), [16.0, 28.0])
    assert len(f.entries) == 2 and f.n_hits == 2


def test_in_place_write_to_a_fresh_argument_goes_to_that_argument():
    def g(x):
        with tg.no_grad():
            x.mul_(2)
        return x + 1

    f = tg.compile(g)
    a, b = tg.ones(3, dtype=tg.float64), tg.full((3,), 5.0, dtype=tg.float64)
    f(a)
    out = f(b)
    np.testing.assert_array_equal(a.numpy(), [2.0, 2.0, 2.0])
    np.testing.assert_array_equal(b.numpy(), [10.0, 10.0, 10.0])
    np.testing.assert_array_equal(out.numpy(), [11.0, 11.0, 11.0])
    assert len(f.entries) == 1 and f.n_hits == 1


def test_one_tensor_passed_twice_is_guarded():
    f = tg.compile(lambda x, y: x * 2 + y)
    a = tg.ones(3, dtype=tg.float64)
    f(a, a)
    out = f(tg.ones(3, dtype=tg.float64), tg.zeros(3, dtype=tg.float64))
    np.testing.assert_array_equal(out.numpy(), [2.0, 2.0, 2.0])
    assert len(f.entries) == 2
    np.testing.assert_array_equal(f(a, a).numpy(), [3.0, 3.0, 3.0])
    assert f.n_hits == 1


def test_keyword_tensor_argument_is_read_each_call():
    f = tg.compile(lambda x, y=None: x + y)
    f(tg.ones(2, dtype=tg.float64), y=tg.ones(2, dtype=tg.float64))
    out = f(tg.ones(2, dtype=tg.float64), y=tg.tensor([5.0, 7.0], dtype=tg.float64))
    np.testing.assert_array_equal(out.numpy(), [6.0, 8.0])
    assert len(f.entries) == 1 and f.n_hits == 1


_STATE = tg.tensor([1.0, 2.0], dtype=tg.float64)


def test_argument_that_is_state_read_by_reference_is_guarded_by_identity():
    f = tg.compile(lambda x: x * _STATE)
    np.testing.assert_array_equal(f(_STATE).numpy(), [1.0, 4.0])
    other = tg.tensor([3.0, 4.0], dtype=tg.float64)
    np.testing.assert_array_equal(f(other).numpy(), [3.0, 8.0])  # not other * other
    np.testing.assert_array_equal(f(tg.tensor([5.0, 6.0], dtype=tg.float64)).numpy(),
                                  [5.0, 12.0])
    np.testing.assert_array_equal(f(_STATE).numpy(), [1.0, 4.0])
    assert len(f.entries) == 2 and f.n_hits == 2


def test_keyword_tensor_of_a_forward_that_needs_grad_gets_its_gradient():
    f = tg.compile(lambda x, y=None: (x * y).tanh())
    rng = np.random.default_rng(9)
    for _ in range(3):
        x, y = rng.standard_normal(4), rng.standard_normal(4)
        yc = tg.tensor(y, requires_grad=True)
        yt = torch.tensor(y, requires_grad=True)
        out = f(tg.tensor(x), y=yc)
        want = torch.tanh(torch.tensor(x) * yt)
        np.testing.assert_allclose(out.detach().numpy(), want.detach().numpy(), rtol=0,
                                   atol=1e-12)
        out.sum().backward()
        want.sum().backward()
        np.testing.assert_allclose(yc.grad.numpy(), yt.grad.numpy(), rtol=0, atol=1e-12)
    assert len(f.entries) == 1 and f.n_hits == 2


def test_recompile_limit_still_warns_on_real_spec_changes(monkeypatch):
    monkeypatch.setattr(api, "cache_size_limit", 3)
    W = tg.tensor(_W, requires_grad=True)
    f = tg.compile(_step(tg, W))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # fresh leaves of one spec: no warning
        for _ in range(6):
            f(tg.randn(2, 3, dtype=tg.float64, requires_grad=True))
    assert len(f.entries) == 2
    f(tg.randn(5, 3, dtype=tg.float64, requires_grad=True))  # a new shape: a third graph
    assert len(f.entries) == 3
    with pytest.warns(RuntimeWarning, match="cache size limit"):
        x = tg.randn(7, 3, dtype=tg.float64, requires_grad=True)
        f(x)
    assert len(f.entries) == 3 and x.grad is not None  # eager: still exact


# --- 2) zero_grad(set_to_none=False) inside a compiled step ------------------------------
def _model(T, seed=0):
    rng = np.random.default_rng(seed)
    m = T.nn.Sequential(T.nn.Linear(4, 8), T.nn.Tanh(), T.nn.Linear(8, 3)).double()
    with T.no_grad():
        for p in m.parameters():
            p.copy_(T.tensor(rng.standard_normal(tuple(p.shape))))
    return m


def _opt(T, name, params):
    if name == "sgd":
        return T.optim.SGD(params, lr=0.1, momentum=0.9)
    return T.optim.Adam(params, lr=0.01)


def _train_step(T, m, opt, read, who="opt"):
    def step(x, t):
        (opt if who == "opt" else m).zero_grad(set_to_none=False)
        loss = T.nn.functional.cross_entropy(m(x), t)
        loss.backward()
        opt.step()
        return loss.item() if read else loss

    return step


@pytest.mark.parametrize("who", ["opt", "model"])
@pytest.mark.parametrize("read", [False, True])
@pytest.mark.parametrize("name", ["sgd", "adam"])
def test_zero_grad_keep_tensors_step_is_one_graph(name, read, who):
    mc, me, mt = _model(tg), _model(tg), _model(torch)
    oc, oe, ot = (_opt(T, name, m.parameters()) for T, m in ((tg, mc), (tg, me), (torch, mt)))
    f = tg.compile(_train_step(tg, mc, oc, read, who))
    e, t = _train_step(tg, me, oe, read, who), _train_step(torch, mt, ot, read, who)
    rng = np.random.default_rng(2)
    for _ in range(20):
        x, y = rng.standard_normal((5, 4)), rng.integers(0, 3, 5)
        a = f(tg.tensor(x), tg.tensor(y))
        b = e(tg.tensor(x), tg.tensor(y))
        c = t(torch.tensor(x), torch.tensor(y))
        a, b, c = (v if type(v) is float else float(v.detach()) for v in (a, b, c))
        assert a == b and abs(a - c) < 1e-12
    for p, q, r in zip(mc.parameters(), me.parameters(), mt.parameters()):
        np.testing.assert_array_equal(p.detach().numpy(), q.detach().numpy())
        np.testing.assert_array_equal(p.grad.numpy(), q.grad.numpy())
        np.testing.assert_allclose(p.detach().numpy(), r.detach().numpy(), rtol=0, atol=1e-12)
        np.testing.assert_allclose(p.grad.numpy(), r.grad.numpy(), rtol=0, atol=1e-12)
    # the first call (no grads yet) and the steady state: two graphs, no break
    assert len(f.entries) == 2 and f.n_hits == 18 and not f.breaks
    out = tg.compiler.explain(_train_step(tg, mc, oc, read, who))(tg.tensor(x), tg.tensor(y))
    assert out.graph_count == 1 and out.graph_break_count == 0


def test_zero_grad_keep_tensors_zeros_in_place_with_a_version_bump():
    m = _model(tg)
    opt = tg.optim.SGD(m.parameters(), lr=0.1)
    w, b = m[0].weight, m[0].bias
    last = m[2].weight

    def zero():
        opt.zero_grad(set_to_none=False)
        return (last * 2).sum()

    f = tg.compile(zero)
    w.grad = tg.ones(*w.shape, dtype=tg.float64)
    last.grad = tg.ones(*last.shape, dtype=tg.float64)
    for k in range(3):  # b.grad is None: stays None (never a zero tensor)
        gw, gl = w.grad, last.grad
        gw._data[...] = k + 1
        vw, vl = gw._version[0], gl._version[0]
        f()
        assert w.grad is gw and last.grad is gl and b.grad is None
        assert not gw.numpy().any() and not gl.numpy().any()
        assert gw._version[0] == vw + 1 and gl._version[0] == vl + 1
    assert len(f.entries) == 1 and f.n_hits == 2 and not f.breaks
    b.grad = tg.ones(*b.shape, dtype=tg.float64)  # a grad that exists now: a new graph
    f()
    assert not b.grad.numpy().any() and len(f.entries) == 2


def test_zero_grad_keep_tensors_after_the_step():
    mc, me = _model(tg), _model(tg)
    oc, oe = tg.optim.Adam(mc.parameters(), lr=0.01), tg.optim.Adam(me.parameters(), lr=0.01)

    def make(m, opt):
        def step(x):
            loss = (m(x) ** 2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=False)
            return loss

        return step

    f, e = tg.compile(make(mc, oc)), make(me, oe)
    rng = np.random.default_rng(3)
    for _ in range(5):
        x = rng.standard_normal((3, 4))
        np.testing.assert_array_equal(f(tg.tensor(x)).detach().numpy(),
                                      e(tg.tensor(x)).detach().numpy())
    for p, q in zip(mc.parameters(), me.parameters()):
        np.testing.assert_array_equal(p.detach().numpy(), q.detach().numpy())
        np.testing.assert_array_equal(p.grad.numpy(), q.grad.numpy())
        assert not p.grad.numpy().any()
    assert not f.breaks and f.n_hits == 3


# --- 3) explain shows an inner compiled function that ran eagerly ------------------------
_W3 = tg.tensor(np.random.default_rng(4).standard_normal((3, 2)))


def _loss(x):
    return ((x @ _W3).tanh() ** 2).sum()


@pytest.mark.parametrize("kind", ["vmap", "jvp", "grad(grad)"])
def test_explain_shows_inner_fallback(kind):
    inner = tg.compile(_loss)
    x = tg.tensor(np.random.default_rng(5).standard_normal((5, 3)))
    if kind == "vmap":
        def outer(x):
            return vmap(grad(inner))(x)  # the inner call's line
    elif kind == "jvp":
        def outer(x):
            return jvp(inner, (x[0],), (x[0].cos(),))[1]  # the inner call's line
    else:
        def outer(x):
            return grad(lambda v: grad(inner)(v).sum())(x[0])  # the inner call's line
    inner(x[:1])  # already compiled once, and already fell back once, outside explain
    outer(x)
    out = tg.compiler.explain(outer)(x)
    assert out.graph_count == 1 and out.graph_break_count == 0
    (name, brk), = out.inner_fallbacks
    assert name == "_loss" and "runs eagerly" in brk.reason
    assert {"vmap": "vmap", "jvp": "jvp", "grad(grad)": "grad of grad"}[kind] in brk.reason
    assert "test_compiler_api.py" in brk.where and "the inner call's line" in brk.where
    text = str(out)
    assert "_loss: " + brk.reason in text and brk.where in text
    # the outer graph (the inner's ops inlined) gives the transform's values
    c = tg.compile(outer)
    for seed in (6, 7):
        x = tg.tensor(np.random.default_rng(seed).standard_normal((5, 3)))
        np.testing.assert_allclose(c(x).numpy(), outer(x).numpy(), rtol=0, atol=1e-12)
    assert c.inner_fallbacks and c.n_hits == 1


def test_explain_without_inner_compiled_functions_reports_none():
    out = tg.compiler.explain(lambda x: vmap(grad(_loss))(x))(tg.ones(2, 3, dtype=tg.float64))
    assert out.inner_fallbacks == [] and "ran eagerly" not in str(out)


def test_logs_name_argument_guards_and_inner_fallbacks(monkeypatch, capsys):
    monkeypatch.setenv("TAPEGRAD_LOGS", "guards,breaks")
    f = tg.compile(lambda x: (x * x).sum().backward())
    f(tg.ones(2, dtype=tg.float64, requires_grad=True))
    err = capsys.readouterr().err
    assert "grad argument 0 None" in err  # the argument's .grad, named by position
    inner = tg.compile(_loss)
    vmap(grad(inner))(tg.ones(2, 3, dtype=tg.float64))
    err = capsys.readouterr().err
    assert "[tapegrad.compile breaks] _loss" in err and "(vmap)" in err
