"""Common layers trace into one compiled graph: each is put in a small training step (forward,
loss, backward, SGD with momentum) under ``tapegrad.compile``. The step is one graph with no
break (``tapegrad.compiler.explain``), and compiled and eager runs from the same weights give
bitwise the same losses and weights over four steps (the first two calls trace, the later
ones run the generated code), in float64 and float32. The layers rewritten onto ops are also
checked eagerly against PyTorch (values and gradients)."""
import numpy as np
import pytest
import torch
from helpers import check_op, check_torch

import tapegrad
import tapegrad.nn.functional as F
from tapegrad import nn

STEPS = 4


class _Net(nn.Module):
    """A linear or conv front end, the layer under test, a linear head."""

    def __init__(self, body, conv=None, features=8):
        super().__init__()
        self.front = nn.Conv2d(2, 4, 3) if conv == "2d" else \
            nn.Conv1d(2, 4, 3) if conv == "1d" else nn.Linear(6, 8)
        self.body = body
        self.head = nn.Linear(features, 3)

    def forward(self, x):
        y = self.body(self.front(x))
        return self.head(y.reshape(y.shape[0], -1))


def _run(make, x, y, loss_fn, dtype, wrap):
    tapegrad.manual_seed(0)
    net = make()
    net = net.to(getattr(tapegrad, dtype))
    opt = tapegrad.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    x, y = tapegrad.tensor(x.astype(dtype)), tapegrad.tensor(
        y.astype(dtype) if y.dtype.kind == "f" else y)

    def step(x, y):
        opt.zero_grad()
        loss = loss_fn(net(x), y)
        loss.backward()
        opt.step()
        return loss

    step = wrap(step) if wrap else step
    losses = [step(x, y).detach().numpy().copy() for _ in range(STEPS)]
    return losses, {k: v.detach().numpy().copy() for k, v in net.state_dict().items()}, step, (x, y)


def _mse(out, y):
    return F.mse_loss(out, y)


rng = np.random.default_rng(0)
X_FLAT = rng.standard_normal((5, 6)) * 3  # wide enough that relu6/hardtanh clip both ways
X_IMG = rng.standard_normal((3, 2, 7, 9))
X_SEQ = rng.standard_normal((3, 2, 11))
Y = rng.standard_normal((5, 3))
Y3 = rng.standard_normal((3, 3))
LABELS = np.array([0, 2, 1, 2, 0])

# name: (model factory, input, target, loss)
CASES = {
    "relu6": (lambda: _Net(nn.Sequential(nn.ReLU(), _Lambda(F.relu6))), X_FLAT, Y, _mse),
    "hardtanh": (lambda: _Net(_Lambda(lambda t: F.hardtanh(t, -0.5, 0.75))), X_FLAT, Y, _mse),
    "relu6_inplace": (lambda: _Net(_Lambda(lambda t: F.relu6(t, inplace=True))), X_FLAT, Y,
                      _mse),
    "hardswish": (lambda: _Net(_Lambda(F.hardswish)), X_FLAT, Y, _mse),
    "hardsigmoid": (lambda: _Net(_Lambda(F.hardsigmoid)), X_FLAT, Y, _mse),
    "adaptive_avg_pool2d": (lambda: _Net(nn.AdaptiveAvgPool2d((2, 3)), "2d", 24), X_IMG, Y3,
                            _mse),
    "adaptive_avg_pool1d": (lambda: _Net(_Lambda(lambda t: F.adaptive_avg_pool1d(t, 4)), "1d",
                                         16), X_SEQ, Y3, _mse),
    "interpolate_bilinear": (lambda: _Net(_Lambda(lambda t: F.interpolate(
        t, size=(3, 4), mode="bilinear")), "2d", 48), X_IMG, Y3, _mse),
    "interpolate_nearest": (lambda: _Net(_Lambda(lambda t: F.interpolate(
        t, size=(3, 4), mode="nearest")), "2d", 48), X_IMG, Y3, _mse),
    "unfold_fold": (lambda: _Net(_Lambda(lambda t: F.fold(F.unfold(t, 2), (5, 7), 2)), "2d",
                                 140), X_IMG, Y3, _mse),
    "pad_reflect": (lambda: _Net(_Lambda(lambda t: F.pad(t, (1, 2, 2, 1), mode="reflect")), "2d",
                                 320), X_IMG, Y3, _mse),
    "pad_replicate": (lambda: _Net(_Lambda(lambda t: F.pad(t, (1, 2, 2, 1), mode="replicate")),
                                   "2d", 320), X_IMG, Y3, _mse),
    "pad_circular": (lambda: _Net(_Lambda(lambda t: F.pad(t, (1, 2, 2, 1), mode="circular")),
                                  "2d", 320), X_IMG, Y3, _mse),
    "normalize_inf": (lambda: _Net(_Lambda(lambda t: F.normalize(t, p=float("inf")))), X_FLAT,
                      Y, _mse),
    "batch_norm_cumulative": (lambda: _Net(nn.BatchNorm1d(8, momentum=None)), X_FLAT, Y, _mse),
    "dropout2d": (lambda: _Net(nn.Dropout2d(0.5), "2d", 140), X_IMG, Y3, _mse),
    "softsign": (lambda: _Net(_Lambda(F.softsign)), X_FLAT, Y, _mse),
    "huber_loss": (lambda: _Net(nn.ELU()), X_FLAT, Y * 4,
                   lambda o, t: F.huber_loss(o, t, delta=0.5)),
    "smooth_l1_loss": (lambda: _Net(nn.ELU()), X_FLAT, Y * 4,
                       lambda o, t: F.smooth_l1_loss(o, t, beta=0.5)),
    "l1_loss": (lambda: _Net(nn.Tanh()), X_FLAT, Y, F.l1_loss),
    "cross_entropy_general": (lambda: _Net(nn.Tanh()), X_FLAT, LABELS,
                              lambda o, t: F.cross_entropy(o, t, label_smoothing=0.1,
                                                           ignore_index=2)),
    "one_hot": (lambda: _Net(nn.Tanh()), X_FLAT, LABELS,
                lambda o, t: F.mse_loss(o, F.one_hot(t, 3).to(o.dtype))),
    "cosine_similarity": (lambda: _Net(nn.Tanh()), X_FLAT, Y,  # a row of y clamped by eps
                          lambda o, t: (1 - F.cosine_similarity(o, t * _ZERO_ROW)).mean()),
    "kl_div": (lambda: _Net(nn.Tanh()), X_FLAT, Y,
               lambda o, t: F.kl_div(F.log_softmax(o, 1), F.softmax(t, 1),
                                     reduction="batchmean")),
    "gaussian_nll_loss": (lambda: _Net(nn.Tanh()), X_FLAT, Y,  # var 0 is clamped to eps
                          lambda o, t: F.gaussian_nll_loss(o, t, (o * _ZERO_ROW).square()) +
                          F.gaussian_nll_loss(o, t, 0.5)),
    "poisson_nll_loss": (lambda: _Net(nn.Tanh()), X_FLAT, np.abs(Y) * 3,
                         lambda o, t: F.poisson_nll_loss(o, t, full=True)),
}
_ZERO_ROW = tapegrad.tensor(np.array([[1.0], [0.0], [1.0], [1.0], [1.0]]))


class _Lambda(nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, x):
        return self.fn(x)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("name", list(CASES))
def test_layer_step_is_one_graph_and_bitwise_eager(name, dtype):
    make, x, y, loss_fn = CASES[name]
    eager = _run(make, x, y, loss_fn, dtype, None)
    compiled = _run(make, x, y, loss_fn, dtype, tapegrad.compile)
    for k, (a, b) in enumerate(zip(eager[0], compiled[0])):
        assert np.array_equal(a, b, equal_nan=True), (k, a, b)
    for k, v in eager[1].items():
        assert np.array_equal(v, compiled[1][k]), k
    assert eager[0][0] != eager[0][-1]  # the steps trained
    # a fresh step (same layers) traced once more under explain: one graph, no break
    _, _, step, inputs = _run(make, x, y, loss_fn, dtype, None)
    ex = tapegrad.compiler.explain(step)(*inputs)
    assert (ex.graph_count, ex.graph_break_count) == (1, 0), [b.reason for b in ex.break_reasons]


class _Seq2Seq(nn.Module):
    def __init__(self):
        super().__init__()
        layer = nn.TransformerDecoderLayer(8, 2, dim_feedforward=16, dropout=0.0)
        self.decoder = nn.TransformerDecoder(layer, 1)
        self.head = nn.Linear(8, 3)
        self.register_buffer("causal", nn.Transformer.generate_square_subsequent_mask(6))

    def forward(self, tgt, memory):
        # a mask without tgt_is_causal: eager compares it with a causal one (values read);
        # the trace takes the mask as given, which computes the same numbers
        return self.head(self.decoder(tgt, memory, tgt_mask=self.causal[:5, :5]))


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_transformer_decoder_mask_is_one_graph_and_bitwise_eager(dtype):
    tgt, memory = rng.standard_normal((5, 2, 8)), rng.standard_normal((4, 2, 8))

    def run(wrap):
        tapegrad.manual_seed(0)
        net = _Seq2Seq().to(getattr(tapegrad, dtype))
        opt = tapegrad.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
        t, m = tapegrad.tensor(tgt.astype(dtype)), tapegrad.tensor(memory.astype(dtype))

        def step(t, m):
            opt.zero_grad()
            loss = net(t, m).square().mean()
            loss.backward()
            opt.step()
            return loss

        step = wrap(step) if wrap else step
        return [step(t, m).item() for _ in range(STEPS)], net.state_dict(), step, (t, m)

    eager, compiled = run(None), run(tapegrad.compile)
    assert eager[0] == compiled[0]
    for k, v in eager[1].items():
        assert np.array_equal(v.numpy(), compiled[1][k].numpy()), k
    ex = tapegrad.compiler.explain(run(None)[2])(*run(None)[3])
    assert (ex.graph_count, ex.graph_break_count) == (1, 0), [b.reason for b in ex.break_reasons]


# --- the layers rewritten onto ops, eagerly against PyTorch -------------------------------
@pytest.mark.parametrize("bounds", [(-1.0, 1.0), (0.0, 6.0), (-0.25, 0.5)])
def test_hardtanh_against_torch(bounds):
    lo, hi = bounds
    check_op(lambda T, x: T.nn.functional.hardtanh(x, lo, hi), [(4, 5)], away_from=[lo, hi],
             low=lo - 2, high=hi + 2)


def test_hardtanh_gradient_is_zero_on_the_bounds():
    # PyTorch's hardtanh_backward passes the gradient strictly inside (min_val, max_val):
    # 0 on the bounds themselves, unlike clamp's gradient
    x = np.array([-1.0, 0.0, 3.0, 6.0, 7.0, -0.0])
    check_torch(lambda T, t: T.nn.functional.relu6(t), [x])
    check_torch(lambda T, t: T.nn.functional.hardtanh(t, -1.0, 3.0), [x])
    check_torch(lambda T, t: T.nn.functional.hardswish(t), [np.array([-3.0, 0.0, 3.0, 1.5])])


def test_hardtanh_integer_input_keeps_dtype():
    x = np.array([-3, 0, 2, 9])
    got = F.relu6(tapegrad.tensor(x))
    want = torch.nn.functional.relu6(torch.tensor(x))
    assert got.dtype == tapegrad.int64
    np.testing.assert_array_equal(got.numpy(), want.numpy())


def test_abs_based_losses_against_torch():
    rng_ = np.random.default_rng(5)
    a, b = rng_.standard_normal((4, 3)), rng_.standard_normal((4, 3))
    b[0, 0] = a[0, 0]  # d == 0: the gradient there is 0 (sign), as PyTorch's
    for fn in (lambda T, x, t: T.nn.functional.l1_loss(x, t),
               lambda T, x, t: T.nn.functional.huber_loss(x, t, delta=0.7),
               lambda T, x, t: T.nn.functional.smooth_l1_loss(x, t, beta=0.7),
               lambda T, x, t: T.nn.functional.softsign(x - t)):
        check_torch(fn, [a, b])


# --- class-index losses with every target ignored ---------------------------------------
ALL_IGNORED = [
    ("weight", (4, 3), {"weight": np.array([0.5, 1.0, 2.0])}),
    ("label_smoothing", (4, 3), {"label_smoothing": 0.2}),
    ("spatial", (4, 3, 2), {}),
]


@pytest.mark.parametrize("loss", ["cross_entropy", "nll_loss"])
@pytest.mark.parametrize("case", ALL_IGNORED, ids=[c[0] for c in ALL_IGNORED])
@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_all_targets_ignored_gives_zero_gradient(loss, case, reduction):
    # PyTorch: the mean over no counted target is nan, its gradient is 0 (not nan)
    _, shape, kw = case
    if loss == "nll_loss" and "label_smoothing" in kw:
        pytest.skip("nll_loss has no label smoothing")
    x = np.random.default_rng(7).standard_normal(shape)
    t = np.full((shape[0],) + shape[2:], 1, dtype=np.int64)

    def fn(T, x):
        extra = {k: (T.tensor(v) if isinstance(v, np.ndarray) else v) for k, v in kw.items()}
        return getattr(T.nn.functional, loss)(x, T.tensor(t), ignore_index=1,
                                              reduction=reduction, **extra)

    ours = tapegrad.tensor(x, requires_grad=True)
    theirs = torch.tensor(x, requires_grad=True)
    a, b = fn(tapegrad, ours), fn(torch, theirs)
    np.testing.assert_array_equal(a.detach().numpy(), b.detach().numpy())  # nan == nan
    a.backward()
    b.backward()
    np.testing.assert_array_equal(ours.grad.numpy(), theirs.grad.numpy())
    assert not np.isnan(ours.grad.numpy()).any()


@pytest.mark.parametrize("loss", ["cross_entropy", "nll_loss"])
def test_all_targets_ignored_compiled_matches_eager(loss):
    # the traced path divides by the weight sum read at run time: nan loss, zero gradient
    x = np.random.default_rng(8).standard_normal((4, 3, 2))
    w = tapegrad.tensor([0.5, 1.0, 2.0])

    def step(x, t):
        out = getattr(F, loss)(x, t, weight=w, ignore_index=1)
        out.backward()
        return out

    results = []
    for wrap in (None, tapegrad.compile):
        f = wrap(step) if wrap else step
        for fill in (1, 1, 1, 0):  # all ignored three times (traced twice), then counted
            xt = tapegrad.tensor(x, requires_grad=True)
            out = f(xt, tapegrad.tensor(np.full((4, 2), fill, dtype=np.int64)))
            results.append((out.detach().numpy().copy(), xt.grad.numpy().copy()))
    half = len(results) // 2
    for (a, ga), (b, gb) in zip(results[:half], results[half:]):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(ga, gb)
    assert np.isnan(results[0][0]) and not np.isnan(results[0][1]).any()
    assert not np.isnan(results[3][0])


def test_compiled_vmap_cross_entropy_is_one_graph():
    # the one-hot's class range is built from the class count alone: a graph constant
    from tapegrad.func import vmap

    rng_ = np.random.default_rng(9)
    f = vmap(lambda a, b: F.cross_entropy(a, b, ignore_index=2))
    x = tapegrad.tensor(rng_.standard_normal((3, 4, 5)))
    ex = tapegrad.compiler.explain(f)(x, tapegrad.tensor(rng_.integers(0, 5, (3, 4))))
    assert (ex.graph_count, ex.graph_break_count) == (1, 0), [b.reason for b in ex.break_reasons]
    compiled = tapegrad.compile(f)
    for _ in range(3):  # new targets each call: read at run time, never frozen
        t = tapegrad.tensor(rng_.integers(0, 5, (3, 4)))
        np.testing.assert_array_equal(compiled(x, t).numpy(), f(x, t).numpy())


def test_one_hot_inferred_classes_is_a_break_under_compile():
    # num_classes=-1: the result's shape depends on the values, so the trace must not freeze it
    f = tapegrad.compile(lambda t: F.one_hot(t) * 2)
    ex = tapegrad.compiler.explain(lambda t: F.one_hot(t) * 2)(tapegrad.tensor([0, 2]))
    assert ex.graph_break_count >= 1
    for t in ([0, 2], [0, 2], [1, 4], [3, 0, 1]):
        want = torch.nn.functional.one_hot(torch.tensor(t)) * 2
        np.testing.assert_array_equal(f(tapegrad.tensor(t)).numpy(), want.numpy())


def test_one_hot_against_torch():
    t = np.array([[0, 3], [2, 1]])
    for n in (-1, 5):
        got = F.one_hot(tapegrad.tensor(t), n)
        want = torch.nn.functional.one_hot(torch.tensor(t), n)
        assert got.dtype == tapegrad.int64
        np.testing.assert_array_equal(got.numpy(), want.numpy())


def test_poisson_nll_full_target_gradient_against_torch():
    # Stirling's term depends on the target: a target that requires grad gets its gradient
    x = np.random.default_rng(4).standard_normal((3, 4))
    t = np.abs(np.random.default_rng(5).standard_normal((3, 4))) * 3
    check_torch(lambda T, a, b: T.nn.functional.poisson_nll_loss(a, b, full=True), [x, t])


def test_inf_norm_gradient_ties_against_torch():
    # the largest |x| tied within a row: PyTorch splits the gradient evenly among the ties
    x = np.array([[1.0, -3.0, 3.0, 2.0], [0.5, 0.2, -0.1, 0.3], [2.0, -2.0, 2.0, 1.0]])
    check_torch(lambda T, t: T.nn.functional.normalize(t, p=float("inf")), [x])
    check_torch(lambda T, a, b: T.nn.functional.pairwise_distance(a, b, p=float("inf")),
                [x, x[::-1].copy()])
