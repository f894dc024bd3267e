"""Hand-written parameter updates inside a compiled training step, and fallback warnings.

Every way users write an SGD-style update (``p -= lr * p.grad``, through ``.data``, ``sub_``,
``add_(alpha=)``, ``copy_``, momentum buffers in a dict or a list, ``.grad`` cleared or
zeroed) compiles into the step's one graph: the in-place op is recorded as its out-of-place
op and the parameter's new value is written back into its own array. Compiled runs are
compared with eager ones from the same weights bitwise: with the numpy kernels the compiled
code calls the same numpy functions on the same operands in the same order (docs/design.md),
so any difference is a bug, not rounding; the spiral MLP also runs with numba's kernels,
whose small matmuls are the BLAS's own chains of fused multiply-adds on these shapes (the
probe in kernels.blas_is_fma_chain, tests/compiler/test_compiler_exactness.py).

A compiled function that runs eagerly on most calls warns (``CompileFallbackWarning``) with
the reason and the user's line; one that mostly runs compiled does not.
"""
import random
import warnings

import pytest

import tapegrad as tg
import tapegrad.nn.functional as F
from tapegrad import nn
from tapegrad.bench.spiral import init_params, spiral_data
from tapegrad.compiler import CompileFallbackWarning, api, explain

LR = 0.1
STEPS = 10


@pytest.fixture
def numpy_kernels(monkeypatch):
    monkeypatch.setenv("TAPEGRAD_COMPILE_KERNELS", "numpy")


def _mlp(dtype, sizes=(2, 16, 3)):
    """The spiral example's model (Linear, ReLU, Linear) from fixed weights."""
    ps = init_params(sizes, seed=0)
    layers = []
    for k in range(0, len(ps), 2):
        lin = nn.Linear(ps[k].shape[1], ps[k].shape[0]).to(dtype)
        with tg.no_grad():
            lin.weight.copy_(tg.tensor(ps[k]))
            lin.bias.copy_(tg.tensor(ps[k + 1]))
        layers += [lin, nn.ReLU()]
    return nn.Sequential(*layers[:-1])


# --- the update forms: (p, state) -> None, run under no_grad --------------------------------
def isub(p, state):
    p -= LR * p.grad


def data_isub(p, state):
    p.data -= LR * p.grad


def sub_(p, state):
    p.sub_(LR * p.grad)


def add_alpha(p, state):
    p.add_(p.grad, alpha=-LR)


def data_add_(p, state):
    p.data.add_(p.grad, alpha=-LR)


def copy_(p, state):
    p.copy_(p - LR * p.grad)


def data_copy_(p, state):
    p.data.copy_(p.data - LR * p.grad)


def momentum_dict(p, state):
    """Buffers in a dict keyed by parameter, made on the first call (torch's SGD momentum)."""
    buf = state.get(p)
    if buf is None:
        buf = state[p] = p.grad.clone()
    else:
        buf.mul_(0.9).add_(p.grad)
    p.sub_(buf, alpha=LR)


def momentum_list(p, state):
    """Buffers in a list, zeros made on the first call, read by position."""
    bufs, order = state.setdefault("bufs", []), state.setdefault("order", {})
    k = order.setdefault(id(p), len(order))
    if len(bufs) <= k:
        bufs.append(tg.zeros_like(p))
    bufs[k].mul_(0.9).add_(p.grad, alpha=1.0)
    p.data.add_(bufs[k], alpha=-LR)


FORMS = [isub, data_isub, sub_, add_alpha, data_add_, copy_, data_copy_, momentum_dict,
         momentum_list]


def _clear_none(p):
    p.grad = None


def _clear_zero(p):
    p.grad.zero_()


def _training_step(model, params, update, clear, item=False):
    """The MLP's step with the hand-written ``update`` and ``clear`` of each parameter,
    returning the loss (or, with ``item``, its Python value)."""
    state = {}

    def step(x, t):
        loss = F.cross_entropy(model(x), t)
        loss.backward()
        with tg.no_grad():
            for p in params:
                update(p, state)
                clear(p)
        return loss.item() if item else loss

    return step


def _run(update, clear, dtype, compiled, steps=STEPS):
    model = _mlp(dtype)
    X, y = spiral_data(64, seed=1)
    x, t = tg.tensor(X).to(dtype), tg.tensor(y)
    params = list(model.parameters())
    step = _training_step(model, params, update, clear)
    fn = tg.compile(step) if compiled else step
    losses, grads = [], []
    for _ in range(steps):
        losses.append(fn(x, t).detach().numpy().copy())
        grads.append([None if p.grad is None else p.grad.numpy().copy() for p in params])
    return params, losses, grads, fn


def _bitwise(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


@pytest.mark.parametrize("dtype", [tg.float64, tg.float32], ids=["float64", "float32"])
@pytest.mark.parametrize("clear", [_clear_none, _clear_zero], ids=["grad_none", "grad_zero"])
@pytest.mark.parametrize("update", FORMS, ids=[f.__name__ for f in FORMS])
def test_update_form_compiles_into_one_graph_bitwise(numpy_kernels, update, clear, dtype):
    pe, le, ge, _ = _run(update, clear, dtype, compiled=False)
    pc, lc, gc_, fn = _run(update, clear, dtype, compiled=True)
    for a, b in zip(le, lc):
        assert _bitwise(a, b)
    for p, q in zip(pe, pc):
        assert _bitwise(p.detach().numpy(), q.detach().numpy())
        assert p._version[0] == q._version[0]  # eager's bumps (none through .data)
        assert q.grad_fn is None and q.requires_grad
    for a, b in zip(ge, gc_):  # .grad None / zeros after each step, as eager leaves it
        assert [x is None for x in a] == [x is None for x in b]
        assert all(x is None or _bitwise(x, z) for x, z in zip(a, b))
    # no break; after the warm-up traces (the first call makes .grad / the buffers) every
    # call runs the one compiled graph
    assert not fn.breaks and fn.n_eager == 0
    assert len(fn.entries) <= 2 and fn.n_hits >= STEPS - 2
    out = explain(fn)(*_inputs(dtype))
    assert out.graph_break_count == 0 and not out.fallbacks


def _inputs(dtype):
    X, y = spiral_data(64, seed=1)
    return tg.tensor(X).to(dtype), tg.tensor(y)


@pytest.mark.parametrize("update", [isub, data_add_, copy_, momentum_dict],
                         ids=["isub", "data_add_", "copy_", "momentum_dict"])
def test_update_step_returning_loss_item_replays_compiled(numpy_kernels, update):
    """``return loss.item()`` after the update: the whole step is one graph whose read is
    served after it ran (``TailEntry``), the writes replayed without diverging."""
    def run(compiled):
        model = _mlp(tg.float64)
        x, t = _inputs(tg.float64)
        params = list(model.parameters())
        step = _training_step(model, params, update, _clear_none, item=True)
        fn = tg.compile(step) if compiled else step
        return [fn(x, t) for _ in range(STEPS)], params, fn

    le, pe, _ = run(False)
    lc, pc, fn = run(True)
    assert le == lc
    for p, q in zip(pe, pc):
        assert _bitwise(p.detach().numpy(), q.detach().numpy())
        assert p._version[0] == q._version[0]
    # momentum_dict's first call makes the buffers: its replay of the second call diverges
    # (that call runs eagerly), the entry is dropped, the third call traces the steady step
    first = 1 if update is momentum_dict else 0
    assert not fn.breaks and fn.n_eager == first and fn.n_hits >= STEPS - 2 - first
    assert len(fn.entries) == 1 and type(fn.entries[0]).__name__ == "TailEntry"
    assert fn.entries[0].n_fallbacks == 0


@pytest.mark.parametrize("update", [data_isub, data_add_, data_copy_],
                         ids=["data_isub", "data_add_", "data_copy_"])
def test_update_through_data_in_grad_mode(numpy_kernels, update):
    """``.data`` updates written without ``no_grad`` (grad mode on): the same graph."""
    def run(compiled):
        model = _mlp(tg.float32)
        x, t = _inputs(tg.float32)
        params = list(model.parameters())

        def step(x, t):
            loss = F.cross_entropy(model(x), t)
            loss.backward()
            for p in params:
                update(p, {})
                p.grad = None
            return loss

        fn = tg.compile(step) if compiled else step
        return [fn(x, t).detach().numpy() for _ in range(STEPS)], params, fn

    le, pe, _ = run(False)
    lc, pc, fn = run(True)
    assert all(_bitwise(a, b) for a, b in zip(le, lc))
    for p, q in zip(pe, pc):
        assert _bitwise(p.detach().numpy(), q.detach().numpy())
        assert p._version[0] == q._version[0]
    assert not fn.breaks and len(fn.entries) == 1 and fn.n_hits == STEPS - 1


def test_update_through_data_keeps_eager_version_semantics(numpy_kernels):
    """A write through ``.data`` bumps neither the parameter's counter nor breaks autograd's
    saved-tensor check; a direct in-place write bumps it once per op, as eager."""
    start = next(_mlp(tg.float64).parameters())._version[0]
    for update, bumps in ((data_add_, 0), (sub_, 1), (momentum_dict, 1)):
        pc, *_ = _run(update, _clear_none, tg.float64, compiled=True, steps=5)
        pe, *_ = _run(update, _clear_none, tg.float64, compiled=False, steps=5)
        assert [p._version[0] for p in pc] == [p._version[0] for p in pe]
        assert all(p._version[0] == pe[0]._version[0] for p in pe)
        assert pe[0]._version[0] - start == 5 * bumps


def test_momentum_buffers_are_written_back_with_eager_versions(numpy_kernels):
    model = _mlp(tg.float64)
    x, t = _inputs(tg.float64)
    params = list(model.parameters())
    state = {}
    ref_model = _mlp(tg.float64)
    ref_state = {}

    def make(m, st):
        ps = list(m.parameters())

        def step(x, t):
            loss = F.cross_entropy(m(x), t)
            loss.backward()
            with tg.no_grad():
                for p in ps:
                    momentum_dict(p, st)
                    p.grad = None
            return loss

        return step

    fn, ref = tg.compile(make(model, state)), make(ref_model, ref_state)
    for _ in range(6):
        fn(x, t), ref(x, t)
    for p, q in zip(params, ref_model.parameters()):
        b, rb = state[p], ref_state[q]
        assert _bitwise(b.numpy(), rb.numpy())
        assert b._version[0] == rb._version[0]  # mul_ and add_: two bumps a step
    assert fn.n_hits >= 4 and not fn.breaks


def test_spiral_manual_sgd_loop_with_numba_kernels():
    """The example-style loop (nn.Linear MLP, cross-entropy, ``p -= lr * p.grad``, grads
    cleared) with the default kernels: one graph, eager's bits (see the module docstring)."""
    pytest.importorskip("numba")
    pe, le, _, _ = _run(isub, _clear_none, tg.float64, compiled=False, steps=20)
    pc, lc, _, fn = _run(isub, _clear_none, tg.float64, compiled=True, steps=20)
    assert all(_bitwise(a, b) for a, b in zip(le, lc))
    assert all(_bitwise(p.detach().numpy(), q.detach().numpy()) for p, q in zip(pe, pc))
    assert len(fn.entries) == 1 and fn.n_hits == 19 and not fn.breaks


def test_update_loop_writes_the_sgd_pattern_the_optimizer_hook_writes(numpy_kernels):
    """A plain loop and optim.SGD give the same graph ops for the update (sub of mul)."""
    from tapegrad.compiler import tracer

    model = _mlp(tg.float64)
    x, t = _inputs(tg.float64)
    params = list(model.parameters())

    def step(x, t):
        loss = F.cross_entropy(model(x), t)
        loss.backward()
        with tg.no_grad():
            for p in params:
                p -= LR * p.grad
                p.grad = None
        return loss

    g = tracer.trace(step, x, t)
    writes = [w for w in g.writes if w[0] == "data"]
    assert len(writes) == len(params)
    made = {id(v): n for n in g.nodes for v in n.outputs}
    assert all(made[id(v)].name == "sub" for _, _, _, v in writes)


# --- fallback warnings ----------------------------------------------------------------------
def _fallbacks(caught):
    return [w for w in caught if issubclass(w.category, CompileFallbackWarning)]


def test_warns_for_an_in_place_write_it_cannot_capture():
    x = tg.ones(4, dtype=tg.float64)

    def step(x):
        y = x * 2
        with tg.no_grad():
            y.data[1:3].add_(1.0)  # a write into a view of a tensor reached through .data
        return y.sum()

    fn = tg.compile(step)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(6):
            assert fn(x).item() == 10.0  # eager: still exact
    found = _fallbacks(caught)
    assert len(found) == 1  # once per function and reason
    msg = str(found[0].message)
    assert "view" in msg and "y.data[1:3].add_(1.0)" in msg and "step" in msg
    assert found[0].filename == __file__  # attributed to the caller's line
    out = explain(fn)(x)
    assert [b.reason for b in out.fallbacks] == [found[0].message.args[0].split(": ", 2)[2]
                                                 .rsplit(" (at ", 1)[0]]
    assert "Runs eagerly on most calls" in str(out)


def test_warns_when_the_recompile_limit_is_hit(monkeypatch):
    monkeypatch.setattr(api, "cache_size_limit", 3)
    x = tg.ones(3, dtype=tg.float64)

    def scale(x, k):
        return x * k

    fn = tg.compile(scale)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for k in range(8):  # a Python int that changes every call: a new guard set each time
            fn(x, k)
    found = _fallbacks(caught)
    assert len(found) == 1
    msg = str(found[0].message)
    assert "cache size limit" in msg and "fn(x, k)" in msg
    assert fn.n_eager == 5 and len(fn.entries) == 3


def test_warns_for_a_function_refused_for_python_random_numbers():
    x = tg.ones(3, dtype=tg.float64)

    def noisy(x):
        return x * random.random()

    fn = tg.compile(noisy)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            fn(x)
        assert not _fallbacks(caught)  # two calls: too few to say "most"
        for _ in range(4):
            fn(x)
    found = _fallbacks(caught)
    assert len(found) == 1
    msg = str(found[0].message)
    assert "random" in msg and "fn(x)" in msg and "noisy" in msg


def test_no_warning_for_a_compiled_step_nor_for_one_break_in_a_mostly_compiled_function():
    x = tg.ones(3, dtype=tg.float64)
    with warnings.catch_warnings():
        warnings.simplefilter("error", CompileFallbackWarning)
        _, _, _, fn = _run(isub, _clear_none, tg.float64, compiled=True, steps=12)
        assert fn.n_hits == 11

        def sometimes(x, odd):
            y = x * 2
            if odd:  # an uncapturable write on a rare path: those calls run eagerly
                with tg.no_grad():
                    y.data[1:3].add_(1.0)
            return y.sum()

        f = tg.compile(sometimes)
        for odd in [False] * 6 + [True] * 3 + [False] * 6:
            f(x, odd)
        assert f.n_eager == 2 and len(f.breaks) == 1 and f.n_hits == 11


def test_tail_replay_of_a_write_checks_its_operands(numpy_kernels):
    """``alpha`` is an operand of the write only (no op of the user's computes it): a replay
    that met another ``alpha`` must not reuse the recorded write; that call reruns eagerly."""
    def run(compiled):
        model = _mlp(tg.float64)
        x, t = _inputs(tg.float64)
        params = list(model.parameters())
        lrs = {"lr": 0.1}

        def step(x, t):
            loss = F.cross_entropy(model(x), t)
            loss.backward()
            with tg.no_grad():
                for p in params:
                    p.add_(p.grad, alpha=-lrs["lr"])  # (a dict entry: no guard sees it)
                    p.grad = None
            return loss.item()

        fn = tg.compile(step) if compiled else step
        out = []
        for i in range(6):
            lrs["lr"] = 0.3 if i == 4 else 0.1
            out.append(fn(x, t))
        return out, params, fn

    le, pe, _ = run(False)
    lc, pc, fn = run(True)
    assert le == lc
    assert all(_bitwise(p.detach().numpy(), q.detach().numpy()) for p, q in zip(pe, pc))
    assert sum(e.n_fallbacks for e in fn.entries) == 1 and fn.n_eager == 1
