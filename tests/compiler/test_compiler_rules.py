"""Traced gradient rules: each rule audited as value-independent runs
as ops in the joint graph (no opaque ``vjp_<op>`` node that calls the rule on arrays), and the
compiled call equals eager bitwise (numpy kernels: no arithmetic reordered).

Each case is a small function doing forward + ``backward()``; it runs eagerly and compiled on
the same inputs (three calls, the later ones through the generated code) and every loss and
gradient must match exactly.
"""
import numpy as np
import pytest

import tapegrad as tg
import tapegrad.nn.functional as F
from tapegrad.compiler import tracer
from tapegrad.ops import nn as N


@pytest.fixture(autouse=True)
def _numpy_kernels(monkeypatch):
    monkeypatch.setenv("TAPEGRAD_COMPILE_KERNELS", "numpy")


def _leaves(seed, *shapes, dtype="float64"):
    rng = np.random.default_rng(seed)
    return [tg.tensor(rng.standard_normal(s).astype(dtype), requires_grad=True) for s in shapes]


def _check(body, leaves, extra=(), op_names=(), calls=3):
    """``body(*leaves, *extra)`` returns the loss; ``backward()`` is taken inside the traced
    function. The graph holds no ``vjp_`` node and holds each name of ``op_names``; compiled
    losses and gradients equal eager's bitwise."""
    def step(*args):
        for p in leaves:
            p.grad = None
        loss = body(*args)
        loss.backward()
        return loss

    args = list(leaves) + list(extra)
    graph = tracer.trace(step, *args)
    names = [n.name for n in graph.nodes]
    assert not [n for n in names if n.startswith("vjp_")], names
    for name in op_names:
        assert name in names, (name, names)
    eager = []
    for _ in range(calls):
        loss = step(*args)
        eager.append((loss.detach().numpy().copy(), [p.grad.numpy().copy() for p in leaves]))
    comp = tg.compile(step)
    for k in range(calls):
        loss = comp(*args)
        np.testing.assert_array_equal(loss.detach().numpy(), eager[k][0])
        for p, ge in zip(leaves, eager[k][1]):
            np.testing.assert_array_equal(p.grad.numpy(), ge)
    assert not comp.breaks, [(b.reason, b.where) for b in comp.breaks]
    assert comp.n_hits == calls - 1 and len(comp.entries) == 1
    return graph


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_conv2d_and_its_gradient_ops(dtype):
    x, w, b = _leaves(0, (2, 4, 7, 6), (6, 2, 3, 3), (6,), dtype=dtype)

    def body(x, w, b):
        y = F.conv2d(x, w, b, stride=(2, 1), padding=1, groups=2)
        return (y * y).mean()

    _check(body, [x, w, b], op_names=("conv2d", "conv2d_input", "conv2d_weight"))


def test_conv2d_gradient_ops_rules_under_create_graph():
    """A gradient penalty: the rules of conv2d_input and conv2d_weight (the other two ops of
    the trilinear family) are traced too."""
    x, w = _leaves(1, (2, 3, 6, 6), (4, 3, 3, 3))

    def body(x, w):
        y = F.conv2d(x, w, padding=1)
        (gx,) = tg.autograd.grad(y.tanh().sum(), x, create_graph=True)
        return (gx * gx).sum() + y.mean()

    _check(body, [x, w], op_names=("conv2d_input", "conv2d_weight"))


def test_max_and_avg_pool():
    (x,) = _leaves(2, (2, 3, 9, 8))

    def body(x):
        a = F.max_pool2d(x, 3, stride=2, padding=1)
        b = F.avg_pool2d(x, 2, padding=1, count_include_pad=False)
        c = F.max_pool2d(x, 2)  # the tiled (stride = kernel) index path
        return (a * a).sum() + (b * b).sum() + c.sum()

    _check(body, [x], op_names=("max_pool2d_backward", "avg_pool2d_backward",
                                "max_pool2d_indices"))


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_scaled_dot_product_attention(dtype):
    q, k, v = _leaves(3, (2, 2, 5, 4), (2, 2, 5, 4), (2, 2, 5, 3), dtype=dtype)

    def body(q, k, v):
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        b = F.scaled_dot_product_attention(q, k, v, scale=0.3)
        return (a * a).sum() + (b * v).sum()

    graph = _check(body, [q, k, v], op_names=("scaled_dot_product_attention", "softmax"))
    assert sum(n.name == "scaled_dot_product_attention" for n in graph.nodes) == 2


def test_getitem_permute_transpose_stack_cat_split():
    x, y = _leaves(4, (4, 5, 3), (4, 5, 3))

    def body(x, y):
        a = x[1:3, ::2, 0] * x[-1, None, 2:, 1]  # basic indexing: slices, ints, None
        p = y.permute(2, 0, 1).transpose(0, 1)
        s = tg.stack([x, y * 2], dim=1)
        c = tg.cat([x, p.transpose(0, 1).permute(1, 2, 0)], dim=2)
        u, w = tg.split(c, [2, 4], dim=2)
        return (a * a).sum() + (s * s).mean() + (u * w[..., :2]).sum() + p.sum()

    _check(body, [x, y], op_names=("getitem", "index_backward", "permute", "stack", "cat"))


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_cross_entropy_nll_and_log_softmax(dtype):
    x, q = _leaves(5, (6, 4), (6, 4), dtype=dtype)
    t = tg.tensor(np.array([0, 3, 2, 1, 2, 3]))

    def body(x, q, t):
        soft = F.cross_entropy(x, q.softmax(dim=1))  # probability targets
        hard = F.cross_entropy(x, t, ignore_index=2)  # indices, some rows ignored
        nll = N.nll_loss(F.log_softmax(x * 2, dim=1), q.exp(), dim=1)  # the fused op's rule
        return soft + hard + nll.sum()

    _check(body, [x, q], extra=[t], op_names=("cross_entropy_index_backward",
                                             "softmax_cross_entropy", "log_softmax",
                                             "nll_loss"))


def test_cross_entropy_backward_reads_the_indices_each_call():
    """The one-hot target is computed inside an op at run time: new class indices in the
    same buffer shape give the new gradient (nothing from the first trace frozen)."""
    (x,) = _leaves(6, (5, 3))

    def step(x, t):
        x.grad = None
        loss = F.cross_entropy(x, t)
        loss.backward()
        return loss

    comp = tg.compile(step)
    for t in ([0, 1, 2, 1, 0], [2, 2, 0, 1, 1], [1, 0, 0, 2, 2]):
        tt = tg.tensor(np.array(t))
        x.grad = None  # (the guard on .grad's presence: the same entry each call)
        lc, gc_ = comp(x, tt).detach().numpy(), x.grad.numpy().copy()
        le = step(x, tt).detach().numpy()
        np.testing.assert_array_equal(lc, le)
        np.testing.assert_array_equal(gc_, x.grad.numpy())
    assert comp.n_hits == 2 and not comp.breaks


def test_layer_norm_batch_norm_embedding():
    w, ln_w, ln_b, bn_w, bn_b = _leaves(7, (10, 6), (6,), (6,), (3,), (3,))
    idx = tg.tensor(np.array([[1, 4, 4, 9], [0, 1, 2, 4]]))
    (img,) = _leaves(8, (4, 3, 2, 2))

    def body(w, ln_w, ln_b, bn_w, bn_b, idx, img):
        e = F.embedding(idx, w)
        h = F.layer_norm(e, (6,), ln_w, ln_b)
        b = F.batch_norm(img, None, None, bn_w, bn_b, training=True)
        return (h * h).sum() + (b * img).sum()

    _check(body, [w, ln_w, ln_b, bn_w, bn_b], extra=[idx, img],
           op_names=("embedding_backward", "layer_norm", "batch_norm"))


def test_integer_tensor_indices_and_in_place_writes_are_traced():
    """``x[i]``, ``x[j, j % 4]`` and ``z[i] = v`` with integer index tensors: the index is an
    input of the node (read each call, nothing frozen), the rules (index_backward, index_put's)
    traced; an in-place op on an intermediate in grad mode (``z[i] = v``, ``relu_``) rebinds
    the tensor to the op's result. New indices each call: compiled == eager bitwise."""
    x, w = _leaves(9, (5, 4), (5, 4))

    def step(x, w, i, j):
        x.grad = w.grad = None
        y = x[i] * 2 + x[i, 1:3].sum() + x[j, j % 4].sum()
        z = w * 1.0
        z[i] = y[:, :1] * 3
        z.relu_()
        loss = (y * y).sum() + (z * z).sum()
        loss.backward()
        return loss

    rng = np.random.default_rng(0)
    idx = [(tg.tensor(rng.integers(0, 5, 4)), tg.tensor(rng.integers(0, 5, 4)))
           for _ in range(4)]
    names = [n.name for n in tracer.trace(step, x, w, *idx[0]).nodes]
    assert not [n for n in names if n.startswith("vjp_")], names
    assert {"index", "index_backward", "index_put"} <= set(names)
    comp = tg.compile(step)
    for i, j in idx:
        lc = comp(x, w, i, j).detach().numpy()
        gc_ = x.grad.numpy().copy(), w.grad.numpy().copy()
        le = step(x, w, i, j).detach().numpy()
        np.testing.assert_array_equal(lc, le)
        np.testing.assert_array_equal(gc_[0], x.grad.numpy())
        np.testing.assert_array_equal(gc_[1], w.grad.numpy())
    assert not comp.breaks and comp.n_hits == 3 and len(comp.entries) == 1


def test_boolean_mask_index_still_breaks_exactly():
    """A mask's result shape depends on the data: a graph break, the call eager (exact)."""
    (x,) = _leaves(10, (6,))

    def f(x, m):
        return (x[m] * 2).sum()

    comp = tg.compile(f)
    for k in range(3):
        m = tg.tensor(np.arange(6) % (k + 2) == 0)
        assert comp(x, m).item() == f(x, m).item()
    assert comp.breaks and not comp.entries


def test_attention_dropout_mask_is_drawn_each_call_and_its_rule_traced():
    """Attention's dropout mask is a random node (same stream as eager); the op's ``keep``
    param and the rule's saved one are that node's value, read each call."""
    runs = []
    for compiled in (False, True):
        tg.manual_seed(0)
        q, k, v = _leaves(12, (2, 2, 5, 4), (2, 2, 5, 4), (2, 2, 5, 4))

        def step(q, k, v):
            q.grad = k.grad = v.grad = None
            out = F.scaled_dot_product_attention(q, k, v, dropout_p=0.3, is_causal=True)
            loss = (out * out).sum()
            loss.backward()
            return loss

        call = tg.compile(step) if compiled else step
        out = [(call(q, k, v).detach().numpy().copy(), q.grad.numpy().copy(),
                v.grad.numpy().copy()) for _ in range(4)]
        runs.append((out, call))
    for (le, qe, ve), (lc, qc, vc) in zip(runs[0][0], runs[1][0]):
        np.testing.assert_array_equal(lc, le)
        np.testing.assert_array_equal(qc, qe)
        np.testing.assert_array_equal(vc, ve)
    comp = runs[1][1]
    assert not comp.breaks and comp.n_hits == 4 - len(comp.entries) and len(comp.entries) <= 2
    names = [n.name for e in comp.entries for n in e.graph.nodes]
    assert "dropout_mask" in names and not [n for n in names if n.startswith("vjp_")]


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_nll_loss_and_weighted_smoothed_spatial_cross_entropy_are_traced(dtype):
    """``F.nll_loss`` and ``F.cross_entropy`` off the fused fast path (class weights, label
    smoothing, ignore_index, spatial targets): the target distribution and the weight sum are
    one node built from the targets at run time; new targets each call, bitwise eager."""
    (x,) = _leaves(13, (4, 3, 2, 2), dtype=dtype)
    w = tg.tensor(np.array([0.5, 2.0, 1.5], dtype=dtype))

    def step(x, t):
        x.grad = None
        a = F.nll_loss(F.log_softmax(x, 1), t, weight=w, ignore_index=1)
        b = F.cross_entropy(x, t, weight=w, label_smoothing=0.2, reduction="sum")
        loss = a + b
        loss.backward()
        return loss

    targets = [tg.tensor(np.random.default_rng(k).integers(0, 3, (4, 2, 2))) for k in range(4)]
    names = [n.name for n in tracer.trace(step, x, targets[0]).nodes]
    assert {"nll_loss_targets", "cross_entropy_targets", "nll_loss",
            "softmax_cross_entropy"} <= set(names)
    assert not [n for n in names if n.startswith("vjp_")]
    comp = tg.compile(step)
    for t in targets:
        lc = comp(x, t).detach().numpy()
        gc_ = x.grad.numpy().copy()
        le = step(x, t).detach().numpy()
        np.testing.assert_array_equal(lc, le)
        np.testing.assert_array_equal(gc_, x.grad.numpy())
    assert not comp.breaks and comp.n_hits == 3


def test_forward_pieces_with_index_tensors_replay_compiled():
    """A forward-only function split by a read, indexing with an argument's slices: the
    pieces replay (the slice of the argument is real at once, so the index's bounds check
    reads real values), equal to eager with new indices each call."""
    table = tg.tensor(np.random.default_rng(14).standard_normal((10, 4)))

    def f(i):
        h = table[i] * 2
        s = h.sum().item()
        return h * s + table[i[:2]].sum()

    comp = tg.compile(f)
    rng = np.random.default_rng(15)
    for _ in range(4):
        i = tg.tensor(rng.integers(0, 10, 5))
        np.testing.assert_array_equal(comp(i).numpy(), f(i).numpy())
    (e,) = comp.entries
    assert type(e).__name__ == "SplitEntry" and e.n_replays == 3 and not e.n_fallbacks


# --- numba kernels against eager (the char-GPT step's drift) ---------------------------
# Each numba kernel computes eager's arithmetic in eager's order: the cross-entropy's row sums
# in numpy's pairwise order (its exp and log left to numpy), float64 erf as scipy's Cephes
# code when eager uses scipy, exp/log/tanh groups left to numpy where numpy has its own loops.
@pytest.fixture
def _numba(monkeypatch):
    pytest.importorskip("numba")
    monkeypatch.setenv("TAPEGRAD_COMPILE_KERNELS", "numba")
    monkeypatch.delenv("TAPEGRAD_COMPILE_LIBM", raising=False)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_numba_compiled_gpt_step_gradients_equal_eager(_numba, dtype):
    """One char-GPT training step (forward, cross-entropy, backward) compiled with the numba
    kernels, float64 and float32 (gelu_backward's exp numpy's own): the loss and every
    parameter's gradient are eager's bitwise, signs of zeros included (the issue's bound
    is 1e-13 relative; before, the cross-entropy's sequential row sums, math.erf and libm's
    exp in gelu_backward left 4e-16..7e-16, which 100 AdamW steps grew to ~2e-11)."""
    from tapegrad.bench import models as M

    state, batches = M.initial_state("gpt"), M.make_data("gpt", 2)

    def make():
        S = M.Step(tg, "gpt", state, batches, dtype)

        def step(x, y):
            loss = S.F.cross_entropy(S.model(x).view(-1, S.vocab), y)
            S.opt.zero_grad()
            loss.backward()
            return loss
        return S, step

    eager, estep = make()
    comp, cstep = make()
    compiled = tg.compile(cstep)
    bits = np.uint64 if dtype == np.float64 else np.uint32
    for _ in range(4):  # a trace per guard set (no .grad, then .grad), then the code twice
        x, y = eager._batch()
        comp._batch()
        le, lc = estep(x, y).item(), compiled(x, y).item()
        assert lc == le
        ge = dict(eager.model.named_parameters())
        for name, p in comp.model.named_parameters():
            np.testing.assert_array_equal(p.grad.numpy().view(bits),
                                          ge[name].grad.numpy().view(bits), err_msg=name)
    assert not compiled.breaks and len(compiled.entries) == 2 and compiled.n_hits == 2
    names = [n.name for e in compiled.entries for n in e.graph.nodes]
    assert "cross_entropy_fused" in names and names.count("gelu_with_cdf") == 4 and \
        names.count("gelu_backward_from_cdf") == 4  # 2 entries x 2 layers (kernels_gelu)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("C,ignored", [(5, False), (65, True), (300, True)])
def test_numba_cross_entropy_kernel_is_eager_bitwise(_numba, dtype, C, ignored):
    """The fused cross-entropy (loss, logits gradient, the bias gradient's column sums) with
    numba: eager's values bitwise, rows of more than 128 classes (numpy's pairwise halves)
    and ignored rows included."""
    rng = np.random.default_rng(C)
    w, b = (tg.tensor((rng.standard_normal(s) * 2).astype(dtype), requires_grad=True)
            for s in ((C, 8), (C,)))

    def step(x, t):
        w.grad = b.grad = None
        loss = F.cross_entropy(F.linear(x, w, b), t, ignore_index=1 if ignored else -100)
        loss.backward()
        return loss

    comp = tg.compile(step)
    for k in range(3):
        x = tg.tensor(rng.standard_normal((40, 8)).astype(dtype))
        t = tg.tensor(rng.integers(0, C, 40))
        w.grad = b.grad = None  # (as at the trace: one guard set)
        lc = comp(x, t).detach().numpy()
        gw, gb = w.grad.numpy().copy(), b.grad.numpy().copy()
        le = step(x, t).detach().numpy()
        np.testing.assert_array_equal(lc, le)
        np.testing.assert_array_equal(gw, w.grad.numpy())
        np.testing.assert_array_equal(gb, b.grad.numpy())
    names = [n.name for n in comp.entries[0].graph.nodes]
    assert "cross_entropy_fused" in names
    assert not comp.breaks and comp.n_hits == 2


def test_numba_pairwise_sum_is_numpys(_numba):
    """The kernels' row sum adds in numpy's pairwise order (add.reduce over a contiguous
    axis), for every length kind: < 8, one block of 8 accumulators, halves above 128."""
    import sys

    from tapegrad.compiler import kernels

    mod = sys.modules[kernels.cross_entropy().py_func.__module__]
    rng = np.random.default_rng(16)
    for dtype in (np.float64, np.float32):
        for n in list(range(0, 140)) + [255, 256, 257, 1000, 4097, 70001]:
            a = rng.standard_normal(n).astype(dtype)
            assert mod.pairwise_sum(a, 0, n) == np.add.reduce(a), (dtype, n)


def test_numba_float64_erf_is_eagers():
    """kernels.erf64 (one element of ops.error_function.erf64, operation for operation, both
    formulas computed and one selected) fed numpy's exp by ``outside_call`` equals eager's
    erf bitwise, special values included."""
    pytest.importorskip("numba")
    import math

    from numba import njit

    from tapegrad.compiler import kernels
    from tapegrad.ops.error_function import erf64

    ns = {"njit": njit, "math": math, "np": np}
    exec(kernels.erf64_source() + "\n\n@njit\ndef run(a, e, out):\n"  # noqa: S102
         "    for i in range(a.size):\n        out[i] = erf64(a[i], e[i])\n", ns)
    rng = np.random.default_rng(17)
    special_values = [0.0, -0.0, 1.0, -1.0, np.nextafter(1.0, 2.0), np.nextafter(1.0, 0.0),
                      6.0, -6.0, np.nextafter(6.0, 0.0), 8.0, 26.6, 27.0, 40.0, np.inf,
                      -np.inf, 1e-300, 5e-324, -5e-324, 1e200, -1e200, np.nan]
    a = np.concatenate([rng.standard_normal(200_000) * s for s in (0.3, 1, 3, 10)] +
                       [np.array(special_values)])
    e = kernels.outside_call("erf_exp", a, np.empty_like(a))
    out = np.empty_like(a)
    ns["run"](a, e, out)
    want = erf64(a)
    assert np.array_equal(np.isnan(out), np.isnan(want)) and np.isnan(out[-1])
    np.testing.assert_array_equal(out[:-1].view(np.int64), want[:-1].view(np.int64))
