"""tapegrad.compile on whole training steps of the examples' models: compiled losses
equal eager's over the run, with no graph break, one trace per guard set.

Each test builds the same model twice from one seed, runs the step eagerly and compiled on the
same batches, and compares every loss and the final parameters and buffers bitwise (the numpy
kernels reorder no arithmetic), over 100 steps, with tiny sizes so the file stays quick.
"""
import numpy as np
import pytest

import tapegrad as tg
import tapegrad.nn as nn
import tapegrad.nn.functional as F
from tapegrad.compiler import api
from tapegrad.examples import char_gpt, digits_cnn


@pytest.fixture(autouse=True)
def _numpy_kernels(monkeypatch):
    """The pure-numpy kernels (bit-identical to eager by construction): numba's JIT of every
    fused group of an LSTM step alone takes ~20 s here; its kernels have their own tests."""
    monkeypatch.setenv("TAPEGRAD_COMPILE_KERNELS", "numpy")


def _run(make, batches, steps, rtol=0.0, max_entries=2):
    """``make()`` -> (step, module, extra state: a function returning tensors, or None);
    returns the compiled CompiledFunction."""
    runs = []
    for compiled in (False, True):
        step, model, extra, *outer = make()
        call = step = tg.compile(step) if compiled else step
        if outer:  # outer(*batch, compiled step) calls the step
            call = lambda *a: outer[0](*a[:-1], a[-1], step)  # noqa: E731
        losses = [float(call(*batches(i)).detach().numpy()) for i in range(steps)]
        tensors = list(model.state_dict().values()) + (extra() if extra else [])
        state = [t.detach().numpy().copy() for t in tensors]
        runs.append((losses, state, step))
    (le, se, _), (lc, sc, comp) = runs
    if rtol == 0.0:
        assert le == lc
        for a, b in zip(se, sc):
            np.testing.assert_array_equal(a, b)
    else:
        np.testing.assert_allclose(lc, le, rtol=rtol, atol=0)
        for a, b in zip(se, sc):
            np.testing.assert_allclose(b, a, rtol=rtol, atol=1e-15)
    assert not comp.breaks, [(b.reason, b.where) for b in comp.breaks]
    assert comp.n_hits == steps - len(comp.entries) and len(comp.entries) <= max_entries
    return comp


def _names(comp):
    return [n.name for e in comp.entries for n in e.graph.nodes]


def test_digits_cnn_adam_cosine_schedule_inside_the_step():
    """The digits CNN (conv, max-pool, linear) with Adam and a cosine LR schedule whose
    ``step()`` runs inside the compiled step; synthetic 8x8 digits."""
    rng = np.random.default_rng(0)
    xs = [tg.tensor(rng.random((8, 1, 8, 8))) for _ in range(10)]
    ys = [tg.tensor(rng.integers(0, 10, 8)) for _ in range(10)]

    def make():
        tg.manual_seed(0)
        model = digits_cnn.build(tg)
        opt = tg.optim.Adam(model.parameters(), lr=3e-3)
        sched = tg.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=100)

        def step(x, y):
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()  # Python state the optimizer reads: an effect node, run each call
            return loss

        return step, model, lambda: [opt.state[p]["exp_avg_sq"] for p in model.parameters()]

    comp = _run(make, lambda i: (xs[i % 10], ys[i % 10]), 100)
    names = _names(comp)
    assert "max_pool2d_indices" in names  # the pooling indices are recomputed each call
    assert "CosineAnnealingLR.step" in names and "optimizer_step" in names


def test_char_gpt_adamw_clipping_warmup():
    """char_gpt's model (tied embeddings, causal attention, GELU MLP), AdamW with decay groups,
    clip_grad_norm_ and a warmup -> cosine SequentialLR stepped inside the step."""
    vocab, block = 12, 8
    data = np.random.default_rng(1).integers(0, vocab, 2000)
    offs = np.random.default_rng(2).integers(0, len(data) - block - 1, (100, 4))
    xb = [tg.tensor(np.stack([data[o:o + block] for o in offs[i]])) for i in range(100)]
    yb = [tg.tensor(np.stack([data[o + 1:o + block + 1] for o in offs[i]])) for i in range(100)]

    def make():
        tg.manual_seed(0)
        model = char_gpt.build(tg, vocab, block=block, dim=16, heads=2, layers=1)
        opt, sched = char_gpt.make_optimizer(tg, model, steps=100, warmup=10)

        def step(x, y):
            logits = model(x)
            loss = F.cross_entropy(logits.view(-1, vocab), y.view(-1))
            opt.zero_grad()
            loss.backward()
            tg.nn.utils.clip_grad_norm_(model.parameters(), 0.5)  # active: norms are ~1
            opt.step()
            sched.step()
            return loss

        return step, model, None

    comp = _run(make, lambda i: (xb[i], yb[i]), 100)
    names = _names(comp)  # (kernels_optim fuses the clip with AdamW's step: one node)
    assert "clip_grad_norm_optimizer_step" in names and "SequentialLR.step" in names


def test_lstm_adam_100_steps():
    rng = np.random.default_rng(3)
    x, y = tg.tensor(rng.standard_normal((4, 6, 3))), tg.tensor(rng.standard_normal((4, 2)))

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.lstm = nn.LSTM(3, 8, num_layers=2, batch_first=True)
            self.head = nn.Linear(8, 2)

        def forward(self, x):
            out, (h, c) = self.lstm(x)
            return self.head(out[:, -1]) + 0.1 * c[-1].sum(dim=1, keepdim=True)

    def make():
        tg.manual_seed(0)
        model = Net().double()
        opt = tg.optim.Adam(model.parameters(), lr=0.01)

        def step(x, y):
            loss = F.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            return loss

        return step, model, None

    _run(make, lambda i: (x, y), 100)


def test_batchnorm_running_stats_and_train_eval_switching():
    """BatchNorm's running statistics and num_batches_tracked are written back each compiled
    call; the training flag is guarded (one graph per mode, no retrace after)."""
    rng = np.random.default_rng(4)
    xs = [tg.tensor(rng.standard_normal((8, 2, 5, 5))) for _ in range(4)]
    y = tg.tensor(rng.integers(0, 3, 8))

    def make():
        tg.manual_seed(0)
        model = nn.Sequential(nn.Conv2d(2, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(),
                              nn.Linear(36, 16), nn.BatchNorm1d(16), nn.ReLU(),
                              nn.Linear(16, 3)).double()
        opt = tg.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

        def step(x, y):
            if not model.training:  # a Python branch on the flag the guards read
                with tg.no_grad():
                    return F.cross_entropy(model(x), y)
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            return loss

        def switched(x, y, train, step):  # the mode is switched outside the compiled step
            model.train(train)
            return step(x, y)

        return step, model, None, switched

    # train, train, eval, train, train, eval, ...: guards on the flag select the graph
    comp = _run(make, lambda i: (xs[i % 4], y, i % 3 != 2), 100, max_entries=3)
    assert [e.training[0] for e in comp.entries] == [True, True, False]  # (grads absent)
    assert "batch_norm_stats" in _names(comp) and "batch_norm_eval_stats" in _names(comp)
    train_graph = comp.entries[0].graph
    written = [t for kind, t, _, _ in train_graph.writes if kind == "data"]
    assert len(written) == 6  # 2 x (running_mean, running_var, num_batches_tracked)


def test_module_training_flag_guard_recompiles_once_per_mode():
    model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4)).double()
    f = tg.compile(model)
    x = tg.tensor(np.random.default_rng(5).standard_normal((6, 3)))
    ref = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4)).double()
    ref.load_state_dict(model.state_dict())
    for k in range(6):
        train = k % 2 == 0
        model.train(train), ref.train(train)
        with tg.no_grad():
            np.testing.assert_array_equal(f(x).numpy(), ref(x).numpy())
    np.testing.assert_array_equal(model[1].running_var.numpy(), ref[1].running_var.numpy())
    assert int(model[1].num_batches_tracked.numpy()) == 3
    assert len(f._compiled.entries) == 2 and f._compiled.n_hits == 4


def test_dropout_draws_the_same_stream_as_eager():
    """Dropout's mask is a node that draws from the default generator at run time, in program
    order: the compiled step consumes the random stream exactly as eager does (no break)."""
    rng = np.random.default_rng(6)
    x, y = tg.tensor(rng.standard_normal((32, 5))), tg.tensor(rng.integers(0, 3, 32))
    states = []

    def make():
        tg.manual_seed(7)
        model = nn.Sequential(nn.Linear(5, 16), nn.ReLU(), nn.Dropout(0.3), nn.Linear(16, 16),
                              nn.ReLU(), nn.Dropout(0.5), nn.Linear(16, 3)).double()
        opt = tg.optim.SGD(model.parameters(), lr=0.1)
        tg.manual_seed(8)
        states.append(None)

        def step(x, y):
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            return loss

        return step, model, None

    def batches(i):
        if i == 99:
            states[-1] = tg.random.default_generator._rng.bit_generator.state
        return x, y

    comp = _run(make, batches, 100)
    assert states[0] == states[1]  # the same numbers drawn, in the same order
    random = [n for e in comp.entries for n in e.graph.nodes if n.name == "dropout_mask"]
    assert random and all(n.effect for n in random)


def test_gradient_penalty_with_create_graph():
    """A WGAN-GP style penalty: autograd.grad(create_graph=True) inside the step, then the
    backward of a loss that contains the gradient (second order, traced through the rules)."""
    rng = np.random.default_rng(8)
    x = tg.tensor(rng.standard_normal((16, 4)))

    def make():
        tg.manual_seed(0)
        model = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 1)).double()
        opt = tg.optim.Adam(model.parameters(), lr=0.01)

        def step(x):
            x = x.detach().requires_grad_(True)
            out = model(x)
            (g,) = tg.autograd.grad(out.sum(), x, create_graph=True)
            loss = out.mean() + 10 * ((g.norm(dim=1) - 1) ** 2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            return loss

        return step, model, None

    _run(make, lambda i: (x,), 100)


def test_tapegrad_logs_prints_graphs_passes_code_and_breaks(monkeypatch, capsys):
    monkeypatch.setenv("TAPEGRAD_LOGS", "graphs,passes,code,breaks")
    f = tg.compile(lambda x: (x * 2.0).exp().sum(dim=0))
    f(tg.ones(2, 3, dtype=tg.float64))
    err = capsys.readouterr().err
    assert "# traced (3 nodes)" in err and "mul(%a00, 2.0)" in err and "# optimised" in err
    assert "[tapegrad.compile passes]" in err and "dce" in err and "-> " in err
    assert "[tapegrad.compile code]" in err and "def _lambda_(args, refs, writes):" in err

    def reads(x):
        return x * x.sum().item()

    tg.compile(reads)(tg.ones(2, dtype=tg.float64))
    err = capsys.readouterr().err
    assert "[tapegrad.compile breaks] reads" in err and "Tensor.item()" in err
    assert "test_compiler_models.py" in err and "x.sum().item()" in err
    monkeypatch.setenv("TAPEGRAD_LOGS", "graphs,nonsense")
    with pytest.raises(ValueError, match="TAPEGRAD_LOGS: unknown"):
        tg.compile(lambda x: x + 1)(tg.ones(2))
    monkeypatch.delenv("TAPEGRAD_LOGS")
    tg.compile(lambda x: x + 1)(tg.ones(2))
    assert capsys.readouterr().err == ""


# --- graph breaks split into compiled pieces -------------------------------------------------
def _two_pieces(x):
    y = (x * 2.0).exp()
    scale = y.sum().item()  # the break: piece 0 | Python reads the value | piece 1
    return ((y * (1.0 / scale) + x).tanh() * scale).sum(dim=0)


def test_item_in_the_middle_runs_compiled_piece_python_compiled_piece():
    c = tg.compile(_two_pieces)
    rng = np.random.default_rng(9)
    for _ in range(5):
        x = tg.tensor(rng.standard_normal((4, 3)))
        np.testing.assert_array_equal(c(x).numpy(), _two_pieces(x).numpy())
    (e,) = c.entries
    assert isinstance(e, api.SplitEntry) and len(e.pieces) == 2
    assert e.n_replays == 4 and e.n_fallbacks == 0 and c.n_hits == 4
    names = [[n.name for n in g.nodes] for g in e.graphs]
    assert "exp" in str(e.graphs[0]) and "tanh" in str(e.graphs[1])  # each piece optimised
    assert len(names) == 2
    (b,) = c.breaks
    assert "item" in b.reason and "test_compiler_models.py" in b.where
    assert "y.sum().item()" in b.where


def test_explain_and_fullgraph_name_the_break():
    out = tg.compiler.explain(_two_pieces)(tg.ones(2, 3, dtype=tg.float64))
    assert out.graph_count == 2 and out.graph_break_count == 1
    text = str(out)
    assert "Graph Count: 2" in text and "Graph Break Count: 1" in text
    assert "Tensor.item() reads" in text and "y.sum().item()" in text
    assert "Passes (nodes before -> after):" in text
    with pytest.raises(tg.compiler.GraphBreak) as err:
        tg.compile(_two_pieces, fullgraph=True)(tg.ones(2, 3, dtype=tg.float64))
    assert "test_compiler_models.py" in str(err.value) and "y.sum().item()" in str(err.value)


def test_python_branch_on_a_read_falls_back_exactly():
    """The pieces follow the branch taken when recording; another branch is detected at its
    first differing op: what was issued is evaluated and the call finishes eagerly."""
    def f(x):
        s = x.sum()
        if s.item() > 0:
            return (x * 2).exp()
        return (x - 1).tanh()

    c = tg.compile(f)
    for v in (1.0, 2.0, -1.0, 3.0, -2.0):
        x = tg.tensor([v, 0.5 * v], dtype=tg.float64)
        np.testing.assert_array_equal(c(x).numpy(), f(x).numpy())
    (e,) = c.entries
    assert e.n_replays == 4 and e.n_fallbacks == 2


def test_read_inside_a_training_step_runs_that_call_eagerly():
    """A read in a step with backward() and optimizer.step(): that call and later ones with
    the same argument types run eagerly (exact); the break is reported with its line."""
    rng = np.random.default_rng(10)
    x, y = tg.tensor(rng.standard_normal((8, 3))), tg.tensor(rng.integers(0, 2, 8))

    def make():
        tg.manual_seed(0)
        model = nn.Linear(3, 2).double()
        opt = tg.optim.SGD(model.parameters(), lr=0.1)

        def step(x, y):
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            if loss.item() > 0:  # read in the middle of a training step
                opt.step()
            return loss

        return step, model

    (s1, m1), (s2, m2) = make(), make()
    c = tg.compile(s2)
    for _ in range(5):
        assert s1(x, y).item() == c(x, y).item()
    for p, q in zip(m1.parameters(), m2.parameters()):
        np.testing.assert_array_equal(p.detach().numpy(), q.detach().numpy())
    assert not c.entries and len(c.breaks) == 1 and "loss.item() > 0" in c.breaks[0].where


def test_an_intermediate_kept_outside_the_function_is_filled():
    kept = []

    def f(x):
        y = x.exp()
        z = y * 3.0  # used by nothing after the read: no piece needs to fill it
        kept.append(z)
        return y * y.sum().item()

    c = tg.compile(f)
    for k in range(3):
        x = tg.tensor([0.1 * k, 0.2], dtype=tg.float64)
        np.testing.assert_array_equal(c(x).numpy(), f(x).numpy())
        np.testing.assert_array_equal(kept[-2].numpy(), kept[-1].numpy())
    assert c.entries[0].n_replays == 2


def test_item_after_the_optimizer_step_keeps_the_step_compiled():
    """``loss.item()`` (logged, and returned) after ``optimizer.step()``: the whole step is one
    compiled graph (TailEntry); the read is served once the graph ran. char-GPT with AdamW,
    clipping and a scheduler, 30 steps: losses, logs and parameters equal eager bitwise."""
    vocab, block = 12, 8
    data = np.random.default_rng(1).integers(0, vocab, 2000)
    offs = np.random.default_rng(2).integers(0, len(data) - block - 1, (30, 4))
    xb = [tg.tensor(np.stack([data[o:o + block] for o in offs[i]])) for i in range(30)]
    yb = [tg.tensor(np.stack([data[o + 1:o + block + 1] for o in offs[i]])) for i in range(30)]
    runs = []
    for compiled in (False, True):
        tg.manual_seed(0)
        model = char_gpt.build(tg, vocab, block=block, dim=16, heads=2, layers=1)
        opt, sched = char_gpt.make_optimizer(tg, model, steps=100, warmup=10)
        log = []

        def step(x, y):
            loss = F.cross_entropy(model(x).view(-1, vocab), y.view(-1))
            opt.zero_grad()
            loss.backward()
            tg.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
            opt.step()
            sched.step()
            log.append(loss.item())
            return float(loss)

        call = tg.compile(step) if compiled else step
        out = [call(xb[i], yb[i]) for i in range(30)]
        runs.append((out, log, [p.detach().numpy().copy() for p in model.parameters()], call))
    (oe, le, pe, _), (oc, lc, pc, comp) = runs
    assert oe == oc and le == lc
    for a, b in zip(pe, pc):
        np.testing.assert_array_equal(a, b)
    assert not comp.breaks and comp.n_hits == 30 - len(comp.entries)
    assert all(type(e).__name__ == "TailEntry" for e in comp.entries)
    assert sum(e.n_replays for e in comp.entries) == comp.n_hits
    assert not any(e.n_fallbacks for e in comp.entries)
    names = _names(comp)
    assert "optimizer_step" in names and not [n for n in names if n.startswith("vjp_")]


def test_tail_read_step_whose_python_diverges_reruns_eagerly():
    """A tail-read step whose Python takes another branch (no optimizer step this call):
    nothing ran before the divergence, so the call reruns eagerly from its start (exact)."""
    rng = np.random.default_rng(11)
    x, y = tg.tensor(rng.standard_normal((8, 3))), tg.tensor(rng.integers(0, 2, 8))
    runs = []
    for compiled in (False, True):
        tg.manual_seed(0)
        model = nn.Linear(3, 2).double()
        opt = tg.optim.Adam(model.parameters(), lr=0.1)
        flags = {"step": True}

        def step(x, y):
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            if flags["step"]:  # Python state the guards do not see
                opt.step()
            return loss.item()

        call = tg.compile(step) if compiled else step
        out = []
        for i in range(6):
            flags["step"] = i != 3
            out.append(call(x, y))
        runs.append((out, [p.detach().numpy().copy() for p in model.parameters()], call))
    (oe, pe, _), (oc, pc, comp) = runs
    assert oe == oc
    for a, b in zip(pe, pc):
        np.testing.assert_array_equal(a, b)
    assert sum(e.n_fallbacks for e in comp.entries) == 1
    assert sum(e.n_replays for e in comp.entries) == comp.n_hits - 1


def test_tail_read_step_with_index_tensors_and_setitem():
    """A tail-read step indexing with integer tensors and writing ``z[idx] = v`` into an
    intermediate: replayed (no eager reruns), equal to eager bitwise with new indices each call;
    the returned tensor is a plain tensor."""
    runs = []
    for compiled in (False, True):
        tg.manual_seed(0)
        emb = tg.randn(10, 4, requires_grad=True)
        opt = tg.optim.Adam([emb], lr=0.1)

        def step(i, t):
            h = emb[i]
            z = h * 1.0
            z[t % 3] = h[:2] * 0.5
            loss = (z * z).sum()
            opt.zero_grad()
            loss.backward()
            opt.step()
            loss.item()
            return loss

        call = tg.compile(step) if compiled else step
        rng = np.random.default_rng(0)
        out = [call(tg.tensor(rng.integers(0, 10, 6)), tg.tensor(rng.integers(0, 6, 2)))
               for _ in range(8)]
        runs.append(([o.item() for o in out], emb.detach().numpy().copy(), call, out[-1]))
    (oe, pe, _, _), (oc, pc, comp, last) = runs
    assert oe == oc
    np.testing.assert_array_equal(pe, pc)
    assert sum(e.n_replays for e in comp.entries) == comp.n_hits > 0 and not comp.breaks
    assert not any(e.n_fallbacks for e in comp.entries)
    assert last.grad_fn is None and not last.requires_grad


def test_tail_read_step_indexing_with_a_computed_index_reruns_exactly():
    """An index computed from the step's own float values (``argmax``) is only a placeholder
    when the Python replays: the index's bounds check cannot be trusted, so such calls rerun
    eagerly (exact); index arithmetic on arguments is computed at once and replays."""
    runs = []
    for compiled in (False, True):
        tg.manual_seed(0)
        emb = tg.randn(10, 4, requires_grad=True)
        opt = tg.optim.Adam([emb], lr=0.1)

        def step(i):
            h = emb[(i + 3) % 10]  # arithmetic on an argument: real during the replay
            k = h.sum(1).argmax(0, keepdim=True).expand(3)  # from the step's values
            loss = (h[k] * h[k]).sum() + (h * h).sum()
            opt.zero_grad()
            loss.backward()
            opt.step()
            return loss.item()

        call = tg.compile(step) if compiled else step
        rng = np.random.default_rng(0)
        out = [call(tg.tensor(rng.integers(0, 10, 6))) for _ in range(6)]
        runs.append((out, emb.detach().numpy().copy(), call))
    (oe, pe, _), (oc, pc, comp) = runs
    assert oe == oc
    np.testing.assert_array_equal(pe, pc)
    assert not comp.breaks and all(type(e).__name__ == "TailEntry" for e in comp.entries)
