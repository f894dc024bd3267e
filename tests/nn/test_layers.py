"""Every layer against PyTorch: the torch layer's weights are loaded into the tapegrad layer
(state dict through numpy), then outputs, input gradients and every parameter gradient are
compared (float64 at 1e-12, float32 at its rounding)."""
from collections import OrderedDict

import numpy as np
import pytest
import torch

import tapegrad
import tapegrad.nn as tnn
from helpers import assert_close, make_inputs

RTOL = 1e-12


def tg_state(module):
    return OrderedDict((k, tapegrad.tensor(v.detach().numpy())) for k, v in
                       module.state_dict().items())


def _flat(out):
    if isinstance(out, (tuple, list)):
        return [t for o in out for t in _flat(o)]
    return [] if out is None else [out]


def _wrap(lib, arrays, dtype):
    out = []
    for a in arrays:
        if not isinstance(a, np.ndarray):
            out.append(a)
            continue
        if a.dtype == np.float64 and dtype is not None:
            a = a.astype(dtype)
        grad = a.dtype.kind == "f"
        out.append(torch.tensor(a, requires_grad=grad) if lib is torch else
                   tapegrad.tensor(a, requires_grad=grad))
    return out


def compare(make, arrays, *, call=None, train=True, rtol=RTOL, dtype=np.float64, seed=3,
            grad=True):
    """Build ``make(nn)`` in both frameworks, load torch's weights, compare everything.

    ``arrays``: numpy inputs (float arrays get requires_grad). ``call(module, *inputs)``
    defaults to ``module(*inputs)``. Returns the two modules (for further checks).
    """
    th, tg = make(torch.nn), make(tnn)
    if dtype == np.float64:
        th.double()
        tg.double()
    assert list(tg.state_dict()) == list(th.state_dict())
    tg.load_state_dict(tg_state(th))
    th.train(train)
    tg.train(train)
    call = call or (lambda m, *xs: m(*xs))
    xs_th, xs_tg = _wrap(torch, arrays, dtype), _wrap(tapegrad, arrays, dtype)
    out_th, out_tg = _flat(call(th, *xs_th)), _flat(call(tg, *xs_tg))
    assert len(out_th) == len(out_tg)
    for a, b in zip(out_tg, out_th):
        assert str(a.dtype).split(".")[-1] == str(b.dtype).split(".")[-1]
        assert_close(a, b, rtol=rtol, what="output")
    for (name, a), (_, b) in zip(tg.state_dict().items(), th.state_dict().items()):
        assert_close(a, b, rtol=rtol, what=f"state {name} after forward")
    if not grad:
        return th, tg
    rng = np.random.default_rng(seed)
    pairs = [(a, b) for a, b in zip(out_tg, out_th) if b.requires_grad]
    seeds = [rng.standard_normal(tuple(b.shape)).astype(b.detach().numpy().dtype)
             for _, b in pairs]
    tapegrad.autograd.backward([a for a, _ in pairs], [tapegrad.tensor(s) for s in seeds])
    torch.autograd.backward([b for _, b in pairs], [torch.tensor(s) for s in seeds])
    for i, (a, b) in enumerate(zip(xs_tg, xs_th)):
        if isinstance(b, torch.Tensor) and b.requires_grad and b.grad is not None:
            assert_close(a.grad, b.grad, rtol=rtol, what=f"gradient of input {i}")
    th_params = dict(th.named_parameters())
    for name, p in tg.named_parameters():
        q = th_params[name]
        if q.grad is None:
            assert p.grad is None or not np.any(p.grad._data), name
        else:
            assert p.grad is not None, f"no gradient for {name}"
            assert_close(p.grad, q.grad, rtol=rtol, what=f"gradient of {name}")
    return th, tg


def check(make, arrays, **kw):
    """float64 at 1e-12 and float32 at rounding."""
    compare(make, arrays, **kw)
    compare(make, arrays, dtype=np.float32, rtol=2e-5, **kw)


def randn(*shape, seed=0, away_from=None):
    return make_inputs([shape], seed=seed, away_from=away_from)[0]


def labels(n, classes, seed=0):
    return np.random.default_rng(seed).integers(0, classes, n).astype(np.int64)


# --- linear family ------------------------------------------------------------------------
def test_identity():
    check(lambda nn: nn.Identity(3, unused=True), [randn(2, 3)])


@pytest.mark.parametrize("bias", [True, False])
def test_linear(bias):
    check(lambda nn: nn.Linear(3, 4, bias=bias), [randn(2, 5, 3)])
    check(lambda nn: nn.Linear(3, 4, bias=bias), [randn(3)])


def test_linear_shape_error():
    with pytest.raises(RuntimeError, match="3"):
        tnn.Linear(3, 4)(tapegrad.randn(2, 5))


@pytest.mark.parametrize("bias", [True, False])
def test_bilinear(bias):
    check(lambda nn: nn.Bilinear(3, 4, 5, bias=bias), [randn(6, 3), randn(6, 4, seed=1)])
    check(lambda nn: nn.Bilinear(2, 3, 2), [randn(2, 3, 2), randn(2, 3, 3, seed=1)])
    with pytest.raises(RuntimeError, match="bilinear"):
        tnn.Bilinear(3, 4, 5)(tapegrad.randn(6, 3), tapegrad.randn(6, 3))


# --- convolutions ------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs", [
    dict(), dict(stride=2, padding=1), dict(dilation=2, padding=2, bias=False),
    dict(groups=2), dict(padding="same", dilation=2), dict(padding="valid")])
def test_conv1d(kwargs):
    check(lambda nn: nn.Conv1d(4, 6, 3, **kwargs), [randn(2, 4, 9)])


@pytest.mark.parametrize("kwargs", [
    dict(), dict(stride=2, padding=1), dict(kernel_size=(2, 3), stride=(1, 2), padding=(1, 0)),
    dict(dilation=2, bias=False), dict(groups=2, padding=1), dict(padding="same"),
    dict(kernel_size=(2, 4), padding="same")])
@pytest.mark.filterwarnings("ignore:Using padding='same' with even kernel")
def test_conv2d(kwargs):
    kwargs = {"kernel_size": 3, **kwargs}
    check(lambda nn: nn.Conv2d(4, 6, **kwargs), [randn(2, 4, 6, 7)])


@pytest.mark.parametrize("mode", ["reflect", "replicate", "circular"])
def test_conv_padding_modes(mode):
    check(lambda nn: nn.Conv2d(2, 3, 3, padding=1, padding_mode=mode), [randn(1, 2, 5, 6)])
    check(lambda nn: nn.Conv1d(2, 3, 3, padding=2, dilation=2, padding_mode=mode),
          [randn(1, 2, 7)])
    check(lambda nn: nn.Conv1d(2, 3, 3, padding="same", padding_mode=mode), [randn(1, 2, 7)])


def test_conv2d_unbatched():
    check(lambda nn: nn.Conv2d(2, 3, 3, padding=1), [randn(2, 5, 5)])


@pytest.mark.parametrize("kwargs", [
    dict(), dict(stride=2, padding=1, output_padding=1), dict(groups=2, bias=False),
    dict(dilation=2, stride=2)])
def test_conv_transpose2d(kwargs):
    check(lambda nn: nn.ConvTranspose2d(4, 6, 3, **kwargs), [randn(2, 4, 4, 5)])


def test_conv_transpose2d_output_size():
    check(lambda nn: nn.ConvTranspose2d(2, 3, 3, stride=2, padding=1), [randn(1, 2, 4, 4)],
          call=lambda m, x: m(x, output_size=[8, 8]))
    with pytest.raises(ValueError, match="valid sizes range"):
        tnn.ConvTranspose2d(2, 3, 3, stride=2, padding=1)(tapegrad.randn(1, 2, 4, 4),
                                                         output_size=[12, 12])


def test_conv_errors():
    with pytest.raises(ValueError, match="divisible by groups"):
        tnn.Conv2d(3, 4, 3, groups=2)
    with pytest.raises(ValueError, match="strided"):
        tnn.Conv2d(2, 2, 3, stride=2, padding="same")
    with pytest.raises(ValueError, match="padding_mode"):
        tnn.Conv2d(2, 2, 3, padding_mode="mirror")
    with pytest.raises(ValueError, match="zeros"):
        tnn.ConvTranspose2d(2, 2, 3, padding_mode="reflect")


# --- pooling, reshaping -------------------------------------------------------------------
@pytest.mark.parametrize("kwargs", [
    dict(kernel_size=2), dict(kernel_size=3, stride=2, padding=1),
    dict(kernel_size=2, ceil_mode=True), dict(kernel_size=(2, 3), stride=1, dilation=(1, 2))])
def test_max_pool2d(kwargs):
    check(lambda nn: nn.MaxPool2d(**kwargs), [randn(2, 3, 7, 7)])


def test_max_pool2d_return_indices():
    check(lambda nn: nn.MaxPool2d(2, return_indices=True), [randn(1, 2, 4, 6)])


@pytest.mark.parametrize("kwargs", [
    dict(kernel_size=2), dict(kernel_size=3, stride=2, padding=1),
    dict(kernel_size=3, stride=2, padding=1, count_include_pad=False),
    dict(kernel_size=2, ceil_mode=True), dict(kernel_size=2, divisor_override=3)])
def test_avg_pool2d(kwargs):
    check(lambda nn: nn.AvgPool2d(**kwargs), [randn(2, 3, 7, 7)])


@pytest.mark.parametrize("size", [1, (2, 3), (None, 2), 5])
def test_adaptive_avg_pool2d(size):
    check(lambda nn: nn.AdaptiveAvgPool2d(size), [randn(2, 3, 5, 7)])


@pytest.mark.parametrize("args", [(), (0, 2), (1, 2), (-2, -1)])
def test_flatten(args):
    check(lambda nn: nn.Flatten(*args), [randn(2, 3, 4, 2)])


@pytest.mark.parametrize("dim,size", [(1, (2, 3)), (-1, (2, -1)), (0, [1, 2])])
def test_unflatten(dim, size):
    arr = randn(2, 6) if dim != -1 else randn(3, 2, 4)
    check(lambda nn: nn.Unflatten(dim, size), [arr])


def test_flatten_unflatten_errors():
    with pytest.raises(TypeError, match="tuple of ints"):
        tnn.Unflatten(1, 6)
    with pytest.raises(RuntimeError, match="multiply up"):
        tnn.Unflatten(1, (4, 2))(tapegrad.randn(2, 6))
    with pytest.raises(IndexError, match="out of range"):
        tnn.Flatten(3)(tapegrad.randn(2, 6))


# --- embedding ---------------------------------------------------------------------------
def test_embedding():
    idx = np.array([[1, 4, 4], [0, 9, 1]], dtype=np.int64)
    check(lambda nn: nn.Embedding(10, 3), [idx])
    _, tg = compare(lambda nn: nn.Embedding(10, 3, padding_idx=4), [idx])
    assert not np.any(tg.weight.grad._data[4])
    for kwargs in [dict(max_norm=1.0), dict(max_norm=0.5, norm_type=1.0),
                   dict(scale_grad_by_freq=True, padding_idx=1)]:
        compare(lambda nn: nn.Embedding(10, 3, **kwargs), [idx])  # max_norm renorms in place
    emb = tnn.Embedding(5, 2, padding_idx=-1)
    assert emb.padding_idx == 4 and not np.any(emb.weight._data[4])
    with pytest.raises(AssertionError, match="Padding_idx"):
        tnn.Embedding(5, 2, padding_idx=5)


def test_embedding_from_pretrained():
    w = tapegrad.tensor(np.arange(6.0).reshape(3, 2))
    emb = tnn.Embedding.from_pretrained(w)
    assert not emb.weight.requires_grad and emb.weight._data is w._data
    assert emb(tapegrad.tensor([2, 0])).tolist() == [[4.0, 5.0], [0.0, 1.0]]
    assert tnn.Embedding.from_pretrained(w, freeze=False).weight.requires_grad


# --- normalisation -----------------------------------------------------------------------
@pytest.mark.parametrize("kwargs", [dict(), dict(elementwise_affine=False), dict(bias=False),
                                    dict(eps=1e-3)])
def test_layer_norm(kwargs):
    check(lambda nn: nn.LayerNorm(4, **kwargs), [randn(2, 3, 4)])
    check(lambda nn: nn.LayerNorm((3, 4), **kwargs), [randn(2, 3, 4)])


@pytest.mark.parametrize("kwargs", [dict(), dict(eps=1e-6), dict(elementwise_affine=False)])
def test_rms_norm(kwargs):
    check(lambda nn: nn.RMSNorm(4, **kwargs), [randn(2, 3, 4)])
    check(lambda nn: nn.RMSNorm([3, 4], **kwargs), [randn(2, 3, 4)])


@pytest.mark.parametrize("kwargs", [dict(), dict(affine=False), dict(eps=1e-3)])
def test_group_norm(kwargs):
    check(lambda nn: nn.GroupNorm(2, 4, **kwargs), [randn(2, 4, 3, 3)])
    check(lambda nn: nn.GroupNorm(4, 4, **kwargs), [randn(3, 4, 5)])
    with pytest.raises(ValueError, match="divisible"):
        tnn.GroupNorm(3, 4)


@pytest.mark.parametrize("kwargs", [dict(), dict(momentum=None), dict(affine=False),
                                    dict(track_running_stats=False), dict(momentum=0.3),
                                    dict(bias=False)])
def test_batch_norm_train_and_eval(kwargs):
    def steps(m, x):
        outs = [m(x), m(x * 2 + 1)]  # two steps: running stats and num_batches_tracked move
        m.eval()
        outs.append(m(x))
        m.train()
        return outs

    check(lambda nn: nn.BatchNorm1d(3, **kwargs), [randn(4, 3)], call=steps)
    check(lambda nn: nn.BatchNorm1d(3, **kwargs), [randn(4, 3, 5)], call=steps)
    check(lambda nn: nn.BatchNorm2d(3, **kwargs), [randn(2, 3, 4, 4)], call=steps)


def test_batch_norm_eval_mode_uses_running_stats():
    check(lambda nn: nn.BatchNorm2d(3), [randn(2, 3, 4, 4)], train=False)
    bn = tnn.BatchNorm1d(3)
    bn(tapegrad.randn(5, 3))
    assert bn.num_batches_tracked.item() == 1
    bn.eval()
    bn(tapegrad.randn(5, 3))
    assert bn.num_batches_tracked.item() == 1  # eval mode leaves the buffers alone
    bn.reset_running_stats()
    assert bn.num_batches_tracked.item() == 0 and np.all(bn.running_var._data == 1)


def test_batch_norm_input_checks():
    with pytest.raises(ValueError, match="expected 4D input"):
        tnn.BatchNorm2d(3)(tapegrad.randn(2, 3, 4))
    with pytest.raises(ValueError, match="expected 2D or 3D input"):
        tnn.BatchNorm1d(3)(tapegrad.randn(2, 3, 4, 4))


# --- dropout -----------------------------------------------------------------------------
def test_dropout_train_and_eval():
    tapegrad.manual_seed(0)
    drop = tnn.Dropout(0.25)
    x = tapegrad.ones(200, 100, requires_grad=True)
    y = drop(x)
    kept = y._data != 0
    assert abs(kept.mean() - 0.75) < 0.01
    np.testing.assert_allclose(y._data[kept], 1 / 0.75)
    y.sum().backward()
    np.testing.assert_allclose(x.grad._data, np.where(kept, 1 / 0.75, 0.0))
    drop.eval()
    assert drop(x)._data is x._data or np.array_equal(drop(x)._data, x._data)
    drop.train()
    assert not np.any(tnn.Dropout(1.0)(x)._data)
    np.testing.assert_array_equal(tnn.Dropout(0.0)(x)._data, x._data)
    seq = tnn.Sequential(tnn.Linear(100, 100), tnn.Dropout(0.5))
    seq.eval()
    assert_close(seq(x), seq[0](x))
    with pytest.raises(ValueError, match="between 0 and 1"):
        tnn.Dropout(1.5)


# --- activations -------------------------------------------------------------------------
@pytest.mark.parametrize("name,args", [
    ("ReLU", ()), ("LeakyReLU", ()), ("LeakyReLU", (0.2,)), ("GELU", ()), ("GELU", ("tanh",)),
    ("SiLU", ()), ("Tanh", ()), ("Sigmoid", ()), ("Softmax", (1,)), ("Softmax", (-1,)),
    ("LogSoftmax", (1,)), ("LogSoftmax", (0,)), ("ELU", ()), ("ELU", (0.5,)), ("Softplus", ()),
    ("Softplus", (2.0, 1.0))])
def test_activations(name, args):
    check(lambda nn: getattr(nn, name)(*args), [randn(3, 4, 2, away_from=0.0)])


def test_activation_reprs():
    for name, args in [("ELU", (0.5, True)), ("Softplus", (2.0, 5.0)), ("LeakyReLU", (0.1, True)),
                       ("SiLU", (True,)), ("GELU", ("tanh",)), ("Softmax", ())]:
        assert repr(getattr(tnn, name)(*args)) == repr(getattr(torch.nn, name)(*args))


# --- losses ------------------------------------------------------------------------------
def test_cross_entropy_and_nll_losses():
    x, y = randn(5, 4), labels(5, 4)
    w = np.array([0.5, 1.0, 2.0, 1.5])
    y_ignored = y.copy()
    y_ignored[1] = 2
    for kwargs in [dict(), dict(reduction="sum"), dict(reduction="none"),
                   dict(ignore_index=2), dict(label_smoothing=0.1)]:
        check(lambda nn: nn.CrossEntropyLoss(**kwargs), [x, y_ignored])
        check(lambda nn: nn.NLLLoss(**{k: v for k, v in kwargs.items()
                                       if k != "label_smoothing"}), [x, y_ignored])

    def weighted(nn, cls):
        lib = torch if nn is torch.nn else tapegrad
        return getattr(nn, cls)(weight=lib.tensor(w))

    compare(lambda nn: weighted(nn, "CrossEntropyLoss"), [x, y])
    compare(lambda nn: weighted(nn, "NLLLoss"), [x, y])
    probs = np.abs(randn(5, 4, seed=2))
    check(lambda nn: nn.CrossEntropyLoss(), [x, probs / probs.sum(1, keepdims=True)])
    check(lambda nn: nn.CrossEntropyLoss(), [randn(2, 4, 3), labels(6, 4).reshape(2, 3)])


@pytest.mark.parametrize("name", ["MSELoss", "L1Loss", "SmoothL1Loss"])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_regression_losses(name, reduction):
    check(lambda nn: getattr(nn, name)(reduction=reduction),
          [randn(3, 4), randn(3, 4, seed=5)])


def test_smooth_l1_beta_and_bce():
    check(lambda nn: nn.SmoothL1Loss(beta=0.5), [randn(3, 4), randn(3, 4, seed=5)])
    p = 1 / (1 + np.exp(-randn(3, 4)))
    t = np.random.default_rng(1).uniform(size=(3, 4))
    check(lambda nn: nn.BCELoss(), [p, t])


def test_bce_with_logits_loss():
    x = randn(3, 4)
    t = np.random.default_rng(1).uniform(size=(3, 4))
    check(lambda nn: nn.BCEWithLogitsLoss(), [x, t])
    check(lambda nn: nn.BCEWithLogitsLoss(reduction="none"), [x, t])

    def weighted(nn):
        lib = torch if nn is torch.nn else tapegrad
        return nn.BCEWithLogitsLoss(weight=lib.tensor(np.array([1.0, 2.0, 0.5, 1.0])),
                                    pos_weight=lib.tensor(np.array([3.0, 1.0, 1.0, 0.2])))

    th, tg = compare(weighted, [x, t])
    assert list(tg.state_dict()) == ["weight", "pos_weight"]


def test_legacy_loss_reduction_args():
    with pytest.warns(UserWarning, match="deprecated"):
        assert tnn.MSELoss(size_average=False).reduction == "sum"
    with pytest.warns(UserWarning):
        assert tnn.L1Loss(reduce=False).reduction == "none"


# --- attention ---------------------------------------------------------------------------
def _mha_call(need_weights=True, average=True, masks=None, cross=False, is_causal=False):
    def call(m, q, kv=None, *mask_arrays):
        lib = torch if isinstance(q, torch.Tensor) else tapegrad
        kw = {}
        for name, arr in zip(masks or (), mask_arrays):
            kw[name] = arr if isinstance(arr, (torch.Tensor, tapegrad.Tensor)) else \
                lib.tensor(arr)
        k = kv if cross else q
        return m(q, k, k, need_weights=need_weights, average_attn_weights=average,
                 is_causal=is_causal, **kw)

    return call


@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("need_weights,average", [(True, True), (True, False), (False, True)])
def test_multihead_attention_self(batch_first, need_weights, average):
    check(lambda nn: nn.MultiheadAttention(6, 2, batch_first=batch_first),
          [randn(4, 3, 6), randn(5, 3, 6, seed=1)],
          call=_mha_call(need_weights, average))


@pytest.mark.parametrize("need_weights", [True, False])
def test_multihead_attention_masks(need_weights):
    q, kv = randn(4, 2, 6), randn(5, 2, 6, seed=1)
    causal = np.triu(np.ones((4, 4), dtype=bool), 1)
    padding = np.zeros((2, 5), dtype=bool)
    padding[0, 3:] = True
    float_mask = randn(2 * 2, 4, 5, seed=7)
    make = lambda nn: nn.MultiheadAttention(6, 2)  # noqa: E731
    check(make, [q, kv, causal], call=_mha_call(need_weights, masks=["attn_mask"]))
    check(make, [q, kv, padding], call=_mha_call(need_weights, masks=["key_padding_mask"],
                                                 cross=True))
    with pytest.warns(UserWarning, match="mismatched key_padding_mask"):
        mha = tnn.MultiheadAttention(6, 2).double()
        mha(*[tapegrad.tensor(a) for a in (q, kv, kv)], key_padding_mask=tapegrad.tensor(padding),
            attn_mask=tapegrad.tensor(float_mask))
    check(make, [q, kv, padding.astype(np.float64) * -1e9, float_mask],
          call=_mha_call(need_weights, masks=["key_padding_mask", "attn_mask"], cross=True))
    check(make, [q, kv, causal], call=_mha_call(need_weights, masks=["attn_mask"],
                                                is_causal=True))


@pytest.mark.parametrize("kwargs", [dict(kdim=3, vdim=5), dict(bias=False),
                                    dict(add_bias_kv=True), dict(add_zero_attn=True)])
def test_multihead_attention_variants(kwargs):
    kd, vd = kwargs.get("kdim", 6), kwargs.get("vdim", 6)

    def call(m, q, k, v):
        return m(q, k, v)

    check(lambda nn: nn.MultiheadAttention(6, 3, **kwargs),
          [randn(4, 2, 6), randn(5, 2, kd, seed=1), randn(5, 2, vd, seed=2)], call=call)


def test_multihead_attention_unbatched_and_errors():
    check(lambda nn: nn.MultiheadAttention(4, 2), [randn(3, 4)], call=_mha_call())
    with pytest.raises(AssertionError, match="divisible"):
        tnn.MultiheadAttention(5, 2)
    m = tnn.MultiheadAttention(4, 2)
    with pytest.raises(RuntimeError, match="2D attn_mask"):
        m(tapegrad.randn(3, 1, 4), tapegrad.randn(3, 1, 4), tapegrad.randn(3, 1, 4),
          attn_mask=tapegrad.zeros(2, 2))
    with pytest.raises(AssertionError, match="3-D"):
        m(tapegrad.randn(3, 1, 4), tapegrad.randn(3, 4), tapegrad.randn(3, 4))
    with pytest.raises(RuntimeError, match="is_causal"):
        x = tapegrad.randn(3, 1, 4)
        m(x, x, x, is_causal=True)


def test_multihead_attention_dropout_train_vs_eval():
    m = tnn.MultiheadAttention(4, 2, dropout=0.5)
    x = tapegrad.randn(3, 2, 4)
    m.eval()
    a, wa = m(x, x, x)
    b, wb = m(x, x, x)
    assert_close(a, b, rtol=0)
    assert_close(wa.sum(-1), tapegrad.ones(2, 3), rtol=1e-6)
    m.train()
    tapegrad.manual_seed(1)
    _, w_train = m(x, x, x, average_attn_weights=False)
    assert np.any(w_train._data == 0)  # dropped attention weights


# --- first and second order through the composite layers ---------------------------------
def _first(out):
    return out[0] if isinstance(out, tuple) else out


GRAD_CASES = [
    ("bilinear", lambda: tnn.Bilinear(2, 3, 2), [(2, 2), (2, 3)], {}),
    ("mha-weights", lambda: tnn.MultiheadAttention(4, 2), [(2, 1, 4)] * 3, {}),
    ("mha-sdpa", lambda: tnn.MultiheadAttention(4, 2), [(2, 1, 4)] * 3,
     {"need_weights": False}),
    ("lstm", lambda: tnn.LSTM(2, 2, num_layers=2), [(3, 1, 2)], {}),
    ("gru", lambda: tnn.GRU(2, 2, bidirectional=True), [(3, 1, 2)], {}),
    ("rnn", lambda: tnn.RNN(2, 3), [(3, 2, 2)], {}),
    ("batchnorm", lambda: tnn.BatchNorm1d(2), [(3, 2)], {}),
    ("conv2d", lambda: tnn.Conv2d(1, 2, 2), [(1, 1, 3, 3)], {}),
]


@pytest.mark.parametrize("name,make,shapes,kwargs", GRAD_CASES, ids=[c[0] for c in GRAD_CASES])
def test_gradcheck_and_gradgradcheck_through_layers(name, make, shapes, kwargs):
    """Central differences agree with the tape, to first and second order (create_graph
    through every op the layer is built from)."""
    tapegrad.manual_seed(0)
    m = make().double()
    inputs = [tapegrad.tensor(a, requires_grad=True) for a in make_inputs(shapes, seed=4)]

    def fn(*xs):
        return _first(m(*xs, **kwargs))

    assert tapegrad.autograd.gradcheck(fn, inputs)
    assert tapegrad.autograd.gradgradcheck(fn, inputs)
