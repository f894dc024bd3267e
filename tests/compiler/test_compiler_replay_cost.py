"""The tail replay's cheap per-op path (compiler/api.py ``_Replay``/``_TailReplay``)
keeps its correctness role: a call whose Python diverges from the trace (another literal,
another index, another branch) is still detected and rerun eagerly, every traced op is
matched once per call, placeholders never leave the call as traced tensors (and one the
function stores away holds its values, or NaN with a warning on the call that first stores it),
and the shortcuts (params compared without freezing, elementwise promotion skipped) agree with
the general forms they stand for."""
import warnings
import weakref

import numpy as np
import pytest

import tapegrad as tg
import tapegrad.nn as nn
import tapegrad.nn.functional as F
from tapegrad.compiler import api, replay
from tapegrad.compiler.ir import freeze
from tapegrad.ops.registry import REGISTRY, _prepare_elementwise


def _update(opt, loss):
    """The end of a training step: zero_grad, backward, step, and the loss read."""
    opt.zero_grad()
    loss.backward()
    opt.step()
    return loss.item()


@pytest.fixture(autouse=True)
def _numpy_kernels(monkeypatch):
    monkeypatch.setenv("TAPEGRAD_COMPILE_KERNELS", "numpy")


def _same_as_frozen(params, node_params):
    want = {k: freeze(v) for k, v in node_params.items()}
    return replay._same_params(params, want), replay._freeze_params(params) == freeze(node_params)


NAN = float("nan")
_PARAMS = [
    ({}, {}),
    ({"dim": 1}, {"dim": 1}),
    ({"dim": 1}, {"dim": 2}),
    ({"dim": 1}, {"dims": 1}),
    ({"dim": 1}, {"dim": 1, "keepdim": True}),
    ({"dim": 1, "keepdim": True}, {"dim": 1}),
    ({"scale": 1}, {"scale": 1.0}),
    ({"scale": True}, {"scale": 1}),
    ({"scale": None}, {"scale": 0}),
    ({"approximate": "none"}, {"approximate": "tanh"}),
    ({"shape": [16, 32]}, {"shape": (16, 32)}),
    ({"shape": (16, 32)}, {"shape": (16, 32)}),
    ({"shape": (16, 32)}, {"shape": (16, 33)}),
    ({"shape": (np.int64(16), 32)}, {"shape": (16, 32)}),
    ({"shape": (np.array([16]), 32)}, {"shape": (16, 32)}),
    ({"shape": np.array([16, 32])}, {"shape": (16, 32)}),
    ({"shape": np.array([16, 32])}, {"shape": np.array([16, 32])}),
    ({"v": np.array(3)}, {"v": 3}),
    ({"index": (slice(None), slice(0, 64), Ellipsis)},
     {"index": (slice(None), slice(0, 64), Ellipsis)}),
    ({"index": (slice(None), slice(64, 128), Ellipsis)},
     {"index": (slice(None), slice(0, 64), Ellipsis)}),
    ({"index": (slice(None), [0, 2])}, {"index": (slice(None), [0, 2])}),
    ({"index": (slice(None), [0, 2])}, {"index": (slice(None), (0, 2))}),
    ({"index": slice(1, 3)}, {"index": slice(1, 3)}),
    ({"index": (slice(None), slice(0, 64))}, {"index": (slice(None), slice(0, 64), Ellipsis)}),
    ({"index": (Ellipsis, slice(0, 64))}, {"index": (slice(0, 64), Ellipsis)}),
    ({"index": (slice(0, 64), 1)}, {"index": (slice(0, 64), 1.0)}),
    ({"index": (slice(0, 64), 1)}, {"index": (slice(0, 64), (1,))}),
    ({"index": (slice(np.int64(0), 64), None)}, {"index": (slice(0, 64), None)}),
    ({"index": (slice(None), np.array([0, 2]))}, {"index": (slice(None), np.array([0, 2]))}),
    ({"nested": ((1, 2), (3, (4, 5)))}, {"nested": ((1, 2), (3, (4, 5)))}),
    ({"nested": ((1, 2), (3, [4, 5]))}, {"nested": ((1, 2), (3, (4, 5)))}),
    ({"opts": {"a": 1, "b": (2,)}}, {"opts": {"b": (2,), "a": 1}}),
    ({"v": NAN}, {"v": NAN}),
    ({"v": NAN}, {"v": float("nan")}),
    ({"v": (NAN,)}, {"v": (NAN,)}),
    ({"dtype": np.dtype("float32")}, {"dtype": np.float32}),
    ({"dtype": np.dtype("float32")}, {"dtype": np.dtype("float32")}),
    ({"dtype": tg.float32}, {"dtype": tg.float64}),
]


@pytest.mark.parametrize("params,node", _PARAMS, ids=[str(i) for i in range(len(_PARAMS))])
def test_params_compared_without_freezing_agree_with_frozen_equality(params, node):
    fast, frozen = _same_as_frozen(params, node)
    assert fast == frozen


def _elementwise_cases():
    f32 = np.arange(6, dtype=np.float32).reshape(2, 3)
    yield [tg.tensor(f32), tg.tensor(f32 + 1)]
    yield [tg.tensor(f32), tg.tensor(f32.astype(np.float64))]  # promotion: to_dtype
    yield [tg.tensor(f32), tg.tensor(f32[:1])]  # broadcast shapes
    yield [tg.tensor(f32, requires_grad=True), tg.tensor(f32[:1])]  # broadcast_to
    yield [tg.tensor(f32), 2.0]  # a weak Python scalar
    yield [tg.tensor(f32.astype(np.int64)), tg.tensor(f32.astype(np.int64))]  # int
    yield [tg.tensor(f32 > 1), tg.tensor(f32 > 2)]  # bool
    yield [tg.tensor(np.float32(2.0)), tg.tensor(np.float32(3.0))]  # 0-d
    yield [tg.tensor(f32)]
    yield [tg.tensor(f32.astype(np.int64))]
    big = tg.Tensor._make(f32.astype(">f4"))  # a non-native byte order: converted
    yield [big, tg.Tensor._make(f32.astype(">f4"))]


@pytest.mark.parametrize("name", ["add", "sub", "mul", "div", "pow", "maximum"])
def test_elementwise_shortcut_only_where_promotion_changes_nothing(name):
    o = REGISTRY[name]
    assert o.elementwise
    seen_plain = seen_other = 0
    for args in _elementwise_cases():
        if replay._elementwise_plain(args, o.float_only):
            seen_plain += 1
            with tg.enable_grad():
                out = _prepare_elementwise(o, args)
            assert len(out) == len(args) and all(a is b for a, b in zip(out, args))
        else:
            seen_other += 1
    assert seen_plain and seen_other


def _step_run(make, calls, kinds=None):
    """Runs ``make()``'s step eagerly and compiled on the same calls; returns
    (eager losses, compiled losses, eager params, compiled params, compiled function)."""
    runs = []
    for compiled in (False, True):
        step, model = make()
        call = tg.compile(step) if compiled else step
        out = []
        for i, args in enumerate(calls()):
            CALL["i"] = i  # Python state the guards do not see (an eager rerun sees it too)
            out.append(call(*args))
        runs.append((out, [p.detach().numpy().copy() for p in model.parameters()], call))
    (oe, pe, _), (oc, pc, comp) = runs
    return oe, oc, pe, pc, comp


CALL = {"i": 0}


def _calls(n=6, seed=0):
    """A function giving the same ``n`` calls ``(x, y)`` each time it is called."""
    def gen():
        rng = np.random.default_rng(seed)
        for _ in range(n):
            yield tg.tensor(rng.standard_normal((8, 6))), tg.tensor(rng.integers(0, 3, 8))
    return gen


def _model_and_opt():
    tg.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 5), nn.GELU(), nn.Linear(5, 3)).double()
    return model, tg.optim.AdamW(model.parameters(), lr=0.05)


@pytest.mark.parametrize("what", ["literal", "index", "params", "branch"])
def test_a_call_whose_python_differs_from_the_trace_reruns_eagerly(what):
    """One call (the 4th) differs in a literal operand, a slice index, an op's params or the
    ops taken: the replay detects it before anything ran and the call reruns eagerly (the
    losses and parameters equal eager's); the other calls replay."""
    def make():
        model, opt = _model_and_opt()

        def step(x, y):
            odd = CALL["i"] == 3
            h = model(x)
            if what == "literal":
                h = h * (0.25 if odd else 0.5)
            elif what == "index":
                h = h[:, :2] if odd else h[:, 1:]
            elif what == "params":
                h = h - h.mean(dim=0 if odd else 1, keepdim=True)
            elif what == "branch" and odd:
                h = h.tanh()
            loss = F.cross_entropy(h, y % h.shape[1])
            return _update(opt, loss)
        return step, model

    oe, oc, pe, pc, comp = _step_run(make, _calls())
    np.testing.assert_allclose(oc, oe, rtol=1e-12, atol=0)
    for a, b in zip(pe, pc):
        np.testing.assert_allclose(b, a, rtol=1e-12, atol=1e-15)
    # two traces (the first call has no gradients yet, the second has), then replays
    assert [type(e) for e in comp.entries] == [api.TailEntry] * 2 and comp.n_hits == 4
    assert sum(e.n_fallbacks for e in comp.entries) == 1
    assert sum(e.n_replays for e in comp.entries) == 3


def test_every_traced_op_is_matched_once_per_replayed_call(monkeypatch):
    """Each replayed call issues exactly the traced nodes outside the skipped spans
    (backward, optimizer step), in order, and ends with the whole graph matched."""
    model, opt = _model_and_opt()

    def step(x, y):
        loss = F.cross_entropy(model(x) * 0.5 + 1.0, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss.item()

    issued, ends = [], []
    issue, flush = replay._Replay._issue_plan, replay._TailReplay._flush

    def counting_issue(self, p):
        issued.append((self.i, p[0]))
        return issue(self, p)

    def checking_flush(self):
        ends.append((self.i, len(self.nodes)))
        return flush(self)

    comp = tg.compile(step)
    monkeypatch.setattr(replay._Replay, "_issue_plan", counting_issue)
    monkeypatch.setattr(replay._TailReplay, "_flush", checking_flush)
    calls = list(_calls(5)())
    comp(*calls[0])  # the traces: without, then with gradients
    comp(*calls[1])
    e = comp.entries[-1]
    skipped = {k for start, span in e.spans.items() for k in range(start, span[1])}
    want = [k for k in range(len(e.graph.nodes)) if k not in skipped]
    assert want and len(want) < len(e.graph.nodes)
    for args in calls[2:]:
        issued.clear()
        comp(*args)
        assert [k for k, _ in issued] == want
        assert all(n is e.graph.nodes[k] for k, n in issued)
    assert ends == [(len(e.graph.nodes),) * 2] * 3
    assert e.n_replays == 3 and not e.n_fallbacks


def test_placeholders_leave_the_call_as_plain_tensors_with_values():
    """What a replayed call returns or stores (an intermediate, the gradients) is a plain
    Tensor holding its values: no traced class, no stand-in grad_fn, its own array."""
    kept = []

    def make():
        model, opt = _model_and_opt()

        def step(x, y):
            h = model(x)
            loss = F.cross_entropy(h, y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            kept.append(h)
            return loss.item(), h
        return step, model

    calls = list(_calls(5)())
    step_e, model_e = make()
    eager = [step_e(*a) for a in calls]
    kept.clear()
    step_c, model_c = make()
    comp = tg.compile(step_c)
    got = [comp(*a) for a in calls]
    assert sum(e.n_replays for e in comp.entries) == 3
    assert not any(e.n_fallbacks for e in comp.entries)
    arrays = set()
    for (le, he), (lc, hc) in zip(eager, got):  # (checked once every call ran)
        assert lc == pytest.approx(le, rel=1e-12)
        np.testing.assert_allclose(hc.detach().numpy(), he.detach().numpy(), rtol=1e-12,
                                   atol=1e-15)
        arrays.add(id(hc._data))
    assert len(arrays) == len(got)  # each call's output its own array
    assert [h is hc for h, (_, hc) in zip(kept, got)] == [True] * len(got)
    for _, hc in got[2:]:  # the replayed calls' outputs: plain, no history
        assert type(hc) is tg.Tensor and hc.grad_fn is None and not hc.requires_grad
    for p in model_c.parameters():
        assert type(p.grad) is tg.Tensor and p.grad.grad_fn is None
    for pe, pc in zip(model_e.parameters(), model_c.parameters()):
        np.testing.assert_allclose(pc.grad.numpy(), pe.grad.numpy(), rtol=1e-12, atol=1e-15)


def test_promotion_and_broadcast_in_a_replayed_step_are_still_traced_ops():
    """Operands that need a dtype conversion or a broadcast of a tensor requiring grad go
    through the general elementwise path (its to_dtype/broadcast_to are traced nodes); the
    replay matches them every call and the step equals eager's."""
    rng = np.random.default_rng(3)
    bias32 = tg.tensor(rng.standard_normal(3).astype(np.float32))

    def make():
        model, opt = _model_and_opt()
        scale = nn.Parameter(tg.ones(1, 3, dtype=tg.float64))
        opt.add_param_group({"params": [scale]})

        def step(x, y):
            h = model(x) * scale + bias32  # broadcast of a leaf needing grad; f32 -> f64
            loss = F.cross_entropy(h, y)
            return _update(opt, loss)
        return step, model

    oe, oc, pe, pc, comp = _step_run(make, _calls())
    np.testing.assert_allclose(oc, oe, rtol=1e-12, atol=0)
    e = comp.entries[-1]
    names = [n.name for n in e.graph.nodes]
    assert "broadcast_to" in names and "to_dtype" in names
    assert sum(e.n_replays for e in comp.entries) == 4
    assert not any(e.n_fallbacks for e in comp.entries)


@pytest.mark.parametrize("on", ["loss", "hidden", "dropout"])
def test_ops_after_the_read_run_eagerly_on_filled_values_only(on):
    """Python that, on one call only, computes after the read (the graph already ran): an
    op on the read loss (filled) runs eagerly, array code outside ops too (dropout's mask);
    one on an intermediate the graph did not keep raises, naming the op. Calls after it
    replay again."""
    model, opt = _model_and_opt()

    def step(x, y):
        h = model[0](x)
        loss = F.cross_entropy(model[2](model[1](h)), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        value = loss.item()
        if CALL["i"] == 3 and on == "dropout":
            return value, F.dropout(loss.reshape(1).expand(64), 0.5, training=True)
        if CALL["i"] == 3:
            return value, (loss if on == "loss" else h) * 2.0
        return value, None

    comp = tg.compile(step)
    for i, args in enumerate(_calls()()):
        CALL["i"] = i
        if i == 3 and on == "hidden":
            with pytest.raises(RuntimeError, match="mul after the compiled step read an "
                                                   "intermediate the graph did not keep"):
                comp(*args)
            continue
        value, extra = comp(*args)
        if i == 3 and on == "dropout":  # each element dropped or scaled by 2
            got = extra.detach().numpy()
            assert got.shape == (64,) and 0 < (got == 0).sum() < 64
            np.testing.assert_allclose(got[got != 0], 2 * value, rtol=1e-15)
        elif i == 3:
            assert type(extra) is tg.Tensor and extra.item() == pytest.approx(2 * value,
                                                                             rel=1e-15)
    assert sum(e.n_replays for e in comp.entries) == 4 - (on == "hidden")
    assert not any(e.n_fallbacks for e in comp.entries)


def _storing_step(store, when):
    model, opt = _model_and_opt()

    def step(x, y):
        h = model[0](x)
        if when(CALL["i"]):
            store[CALL["i"]] = h  # an intermediate kept past the call (not returned)
        loss = F.cross_entropy(model[2](model[1](h)), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss.item()
    return step, model


def test_an_intermediate_the_function_stores_away_holds_its_values():
    """A step that stores an intermediate outside (as the traced call did): the replay sees
    it alive from the trace and makes it an output of the graph, so every replayed call's
    stored tensor holds eager's values (it held uninitialised memory before)."""
    stores = [{}, {}]
    runs = []
    for compiled, store in zip((False, True), stores):
        step, model = _storing_step(store, lambda i: True)
        call = tg.compile(step) if compiled else step
        for i, args in enumerate(_calls()()):
            CALL["i"] = i
            call(*args)
        runs.append(call)
    comp = runs[1]
    assert sum(e.n_replays for e in comp.entries) == 4
    assert [len(e.kept) for e in comp.entries] == [0, 1]
    for i in range(6):
        a, b = stores[0][i], stores[1][i]
        assert type(b) is tg.Tensor and (i < 2 or b.grad_fn is None)  # (0, 1: the traces)
        np.testing.assert_allclose(b.detach().numpy(), a.detach().numpy(), rtol=1e-12,
                                   atol=1e-15)


def test_an_intermediate_stored_only_on_a_later_call_is_nan_then_kept():
    """An intermediate stored away first on a replayed call (the trace did not store it)
    has no value that call: NaN with a warning naming the function, never uninitialised
    memory; from the next call on the graph outputs it and the stored values are eager's."""
    stores = [{}, {}]
    runs = []
    for compiled, store in zip((False, True), stores):
        step, model = _storing_step(store, lambda i: i >= 3)
        call = tg.compile(step) if compiled else step
        for i, args in enumerate(_calls()()):
            CALL["i"] = i
            if compiled and i == 3:
                with pytest.warns(RuntimeWarning, match="step kept 1 intermediate tensor") \
                        as caught:
                    call(*args)
                assert caught[0].filename == __file__  # (the caller's line)
            else:
                call(*args)
        runs.append(call)
    comp = runs[1]
    assert sum(e.n_replays for e in comp.entries) == 4 and not comp.entries[0].kept
    assert np.isnan(stores[1][3].detach().numpy()).all()
    for i in (4, 5):
        np.testing.assert_allclose(stores[1][i].detach().numpy(),
                                   stores[0][i].detach().numpy(), rtol=1e-12, atol=1e-15)
    assert len(comp.entries[1].kept) == 1


def test_placeholder_arrays_are_reused_only_when_nothing_holds_them():
    """A replayed call's placeholders take the arrays of the last call's (no allocation and
    free each call) only when nothing holds them: an intermediate stored away on every call
    keeps its own array and values through the later calls."""
    store = {}
    step, _ = _storing_step(store, lambda i: i % 2 == 1)
    f = tg.compile(step)
    boxes = []
    for i, args in enumerate(_calls(8)()):
        CALL["i"] = i
        f(*args)
        boxes.append({k: weakref.ref(a) for k, a in  # (weak: a test reference would hold it)
                      f.entries[-1].__dict__.get("_placeholder_arrays", {}).items()})
    held = [store[i] for i in (3, 5, 7)]
    assert len({id(t._data) for t in held}) == 3  # each call's stored tensor its own array
    assert not any(np.shares_memory(a._data, b._data) for a in held for b in held if a is not b)
    ref_store = {}
    ref, _ = _storing_step(ref_store, lambda i: i % 2 == 1)
    for i, args in enumerate(_calls(8)()):
        CALL["i"] = i
        ref(*args)
    for i in (3, 5, 7):
        np.testing.assert_allclose(store[i].detach().numpy(), ref_store[i].detach().numpy(),
                                   rtol=1e-12, atol=1e-15)
    # the arrays no placeholder holds any more are the same objects call after call
    same = [k for k in boxes[-1] if k in boxes[-3] and boxes[-1][k]() is not None and
            boxes[-1][k]() is boxes[-3][k]()]
    assert same and len(same) >= len(boxes[-1]) - 1


@pytest.mark.parametrize("kind", ["gpt", "cnn"])
def test_a_step_that_stores_nothing_keeps_nothing(kind, recwarn):
    """No false alarms: the char-GPT step (AdamW, clipping, a scheduler) and the digits CNN
    step (the optimizer's new parameter values are write-backs, the gradients fresh tensors
    the run sets) keep no intermediate and warn nothing."""
    from tapegrad.bench import models as M, compile as B

    state, batches = M.initial_state(kind), M.make_data(kind, 2)
    comp = M.Step(tg, kind, state, batches, np.dtype("float32"))
    f = tg.compile(B._model_step(comp))
    for _ in range(4):
        f(*comp._batch())
    assert sum(e.n_replays for e in f.entries) == 2 and not any(e.n_fallbacks
                                                                for e in f.entries)
    assert not any(e.kept for e in f.entries)
    assert not [w for w in recwarn if "intermediate" in str(w.message)]


def test_a_kept_intermediate_warning_raised_as_an_error_still_keeps_it():
    """Under ``-W error`` the warning of a newly stored intermediate is raised (the graph
    already ran: the step's updates stand); the entry outputs the intermediate anyway, so
    the next call's stored tensor is eager's."""
    stores = [{}, {}]
    steps = [_storing_step(store, lambda i: i >= 3) for store in stores]
    comp = tg.compile(steps[1][0])
    for i, args in enumerate(_calls()()):
        CALL["i"] = i
        steps[0][0](*args)
        if i == 3:
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                with pytest.raises(RuntimeWarning, match="kept 1 intermediate"):
                    comp(*args)
        else:
            comp(*args)
    assert len(comp.entries[-1].kept) == 1
    for i in (4, 5):
        np.testing.assert_allclose(stores[1][i].detach().numpy(),
                                   stores[0][i].detach().numpy(), rtol=1e-12, atol=1e-15)
