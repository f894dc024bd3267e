"""The nn modules real PyTorch programs use beyond the core set: Transformer (and its encoder,
decoder and layers), the recurrent cells, instance norm, the padding modules, pixel shuffle and
upsampling. Each is built in both frameworks, torch's weights are loaded into tapegrad's (state
dict through numpy, so names and shapes must match), then outputs, input gradients and every
parameter gradient are compared (float64 at 1e-12, float32 at its rounding)."""
import warnings

import numpy as np
import pytest
import torch

import tapegrad
import tapegrad.nn as tnn
from helpers import assert_close, check_op
from test_layers import check, compare, randn, tg_state

# float causal masks with bool padding masks, as programs write them: both libraries warn
pytestmark = pytest.mark.filterwarnings("ignore:Support for mismatched")


def lib(module):
    """The framework a module belongs to (so one ``call`` builds masks for either)."""
    return torch if isinstance(module, torch.nn.Module) else tapegrad


def quiet(make):
    """``make`` with PyTorch's (and tapegrad's) nested-tensor warning silenced."""
    def build(nn):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return make(nn)
    return build


# --- Transformer ------------------------------------------------------------------------
def transformer(batch_first=False, norm_first=False, activation="relu", **kw):
    return quiet(lambda nn: nn.Transformer(
        d_model=8, nhead=2, num_encoder_layers=2, num_decoder_layers=2, dim_feedforward=12,
        dropout=0.0, activation=activation, batch_first=batch_first, norm_first=norm_first,
        **kw))


def seq(length, batch, batch_first, seed):
    return randn(*((batch, length, 8) if batch_first else (length, batch, 8)), seed=seed)


def padding_mask(batch, length, seed):
    """Bool key-padding mask (True = padded), each row keeping at least its first position."""
    m = np.random.default_rng(seed).random((batch, length)) < 0.3
    m[:, 0] = False
    return m


def masked_call(src_len=5, tgt_len=4, batch=3, causal=True, padding=True, memory_mask=False):
    kpm_src, kpm_tgt = padding_mask(batch, src_len, 7), padding_mask(batch, tgt_len, 8)

    def call(m, src, tgt):
        T = lib(m)
        kw = {}
        if causal:
            kw["tgt_mask"] = m.generate_square_subsequent_mask(tgt_len, dtype=src.dtype)
        if padding:
            kw["src_key_padding_mask"] = T.tensor(kpm_src)
            kw["tgt_key_padding_mask"] = T.tensor(kpm_tgt)
            kw["memory_key_padding_mask"] = T.tensor(kpm_src)
        if memory_mask:  # a float additive mask, as programs build them
            mm = np.where(np.arange(src_len)[None] > np.arange(tgt_len)[:, None] + 1, -1e9, 0.0)
            kw["memory_mask"] = T.tensor(mm, dtype=src.dtype)
        return m(src, tgt, **kw)

    return call


@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("train", [True, False])
def test_transformer_matches_torch(batch_first, norm_first, train):
    make = transformer(batch_first, norm_first)
    arrays = [seq(5, 3, batch_first, 1), seq(4, 3, batch_first, 2)]
    check(make, arrays, train=train)
    check(make, arrays, train=train, call=masked_call())
    compare(make, arrays, train=train, call=masked_call(causal=False, memory_mask=True))


@pytest.mark.parametrize("activation", ["gelu", "relu-module", "callable"])
def test_transformer_activations_and_bias(activation):
    def act(nn):
        if activation == "relu-module":
            return nn.ReLU()
        if activation == "callable":
            return (torch if nn is torch.nn else tapegrad).tanh
        return "gelu"

    make = quiet(lambda nn: nn.Transformer(8, 2, 1, 1, 12, 0.0, act(nn), bias=False))
    th, tg = compare(make, [seq(5, 2, False, 1), seq(3, 2, False, 2)], call=masked_call(5, 3, 2))
    assert repr(tg) == repr(th)


def test_transformer_unbatched_and_eval_without_grad():
    make = transformer(batch_first=True)
    th, tg = compare(make, [randn(5, 8, seed=1), randn(4, 8, seed=2)])
    src, tgt = randn(3, 5, 8, seed=3), randn(3, 4, 8, seed=4)
    th.eval()
    tg.eval()
    with torch.no_grad(), tapegrad.no_grad():  # PyTorch takes its fused inference path here
        out_th = th(torch.tensor(src), torch.tensor(tgt),
                    tgt_mask=th.generate_square_subsequent_mask(4, dtype=torch.float64))
        out_tg = tg(tapegrad.tensor(src), tapegrad.tensor(tgt),
                    tgt_mask=tg.generate_square_subsequent_mask(4, dtype=tapegrad.float64))
    assert_close(out_tg, out_th)


def test_transformer_state_dict_repr_and_init():
    th, tg = transformer()(torch.nn), transformer()(tnn)
    assert list(tg.state_dict()) == list(th.state_dict())
    assert [tuple(v.shape) for v in tg.state_dict().values()] == \
        [tuple(v.shape) for v in th.state_dict().values()]
    assert repr(tg) == repr(th)
    # xavier_uniform_ on every matrix, zero attention biases, LayerNorms at 1/0
    for name, p in tg.named_parameters():
        a = p.detach().numpy()
        if a.ndim > 1:
            fan_out, fan_in = a.shape
            bound = np.sqrt(6.0 / (fan_in + fan_out))
            assert np.all(np.abs(a) <= bound) and a.std() > bound / 4, name
        elif "in_proj_bias" in name or "out_proj.bias" in name:
            assert not a.any(), name
        elif "norm" in name:
            assert np.all(a == (1.0 if name.endswith("weight") else 0.0)), name
    assert tg.d_model == 8 and tg.nhead == 2 and tg.batch_first is False


def test_transformer_dropout_dtype_and_custom_parts():
    m = quiet(lambda nn: nn.Transformer(8, 2, 1, 1, 12, dtype=tapegrad.float64))(tnn)
    assert m.encoder.layers[0].dropout.p == 0.1  # the default
    assert all(p.dtype == tapegrad.float64 for p in m.parameters())
    src = tapegrad.randn(5, 2, 8, dtype=tapegrad.float64)
    tgt = tapegrad.randn(3, 2, 8, dtype=tapegrad.float64)
    assert not np.array_equal(m(src, tgt).detach().numpy(), m(src, tgt).detach().numpy())
    m.eval()
    np.testing.assert_array_equal(m(src, tgt).detach().numpy(), m(src, tgt).detach().numpy())
    # custom_encoder / custom_decoder replace the stacks
    make = lambda nn: nn.Transformer(  # noqa: E731
        8, 2, custom_encoder=quiet(lambda nn: encoder(nn))(nn),
        custom_decoder=nn.TransformerDecoder(nn.TransformerDecoderLayer(8, 2, 12, 0.0), 1))
    th, tg = compare(make, [seq(5, 2, False, 1), seq(3, 2, False, 2)], call=masked_call(5, 3, 2))
    assert repr(tg) == repr(th)


def test_generate_square_subsequent_mask():
    for dtype in (None, "float64", "bool"):
        kw = {} if dtype is None else {"dtype": getattr(tapegrad, dtype)}
        tkw = {} if dtype is None else {"dtype": getattr(torch, dtype)}
        a = tnn.Transformer.generate_square_subsequent_mask(4, **kw)
        b = torch.nn.Transformer.generate_square_subsequent_mask(4, **tkw)
        assert str(a.dtype).split(".")[-1] == str(b.dtype).split(".")[-1]
        np.testing.assert_array_equal(a.numpy(), b.numpy())


def encoder(nn, norm_first=False, batch_first=False, norm=True, **kw):
    layer = nn.TransformerEncoderLayer(8, 2, 12, dropout=0.0, batch_first=batch_first,
                                       norm_first=norm_first)
    return nn.TransformerEncoder(layer, 3, nn.LayerNorm(8) if norm else None, **kw)


@pytest.mark.parametrize("norm_first", [False, True])
def test_encoder_masks_and_causal_detection(norm_first):
    make = quiet(lambda nn: encoder(nn, norm_first, enable_nested_tensor=False))
    kpm = padding_mask(2, 6, 3)

    def call(kind):
        def run(m, x):
            T = lib(m)
            causal = T.nn.Transformer.generate_square_subsequent_mask(6, dtype=x.dtype)
            if kind == "causal-float":  # detected as causal: PyTorch switches to is_causal
                return m(x, mask=causal)
            if kind == "causal-bool":
                return m(x, mask=T.triu(T.ones(6, 6, dtype=T.bool), diagonal=1))
            if kind == "causal-hint":
                return m(x, mask=causal, is_causal=True, src_key_padding_mask=T.tensor(kpm))
            if kind == "float-padding":
                return m(x, src_key_padding_mask=T.tensor(np.where(kpm, -np.inf, 0.0)))
            return m(x, src_key_padding_mask=T.tensor(kpm))
        return run

    for kind in ("causal-float", "causal-bool", "causal-hint", "float-padding", "padding"):
        compare(make, [randn(6, 2, 8, seed=1)], call=call(kind))
    check(quiet(lambda nn: encoder(nn, norm_first, batch_first=True, norm=False)),
          [randn(2, 6, 8, seed=2)])


def test_encoder_is_causal_needs_a_mask_and_mismatched_masks_warn():
    enc = quiet(lambda nn: encoder(nn))(tnn).double()
    x = tapegrad.tensor(randn(4, 2, 8))
    with pytest.raises(RuntimeError, match="Need attn_mask if specifying the is_causal hint"):
        enc(x, is_causal=True)
    with pytest.warns(UserWarning, match="Support for mismatched src_key_padding_mask and mask"):
        enc(x, mask=tapegrad.zeros(4, 4, dtype=tapegrad.float64),
            src_key_padding_mask=tapegrad.zeros(2, 4, dtype=tapegrad.bool))
    with pytest.raises(AssertionError, match="only bool and floating types of mask"):
        enc(x, mask=tapegrad.zeros(4, 4, dtype=tapegrad.int64))


def test_encoder_nested_tensor_flag_and_warning():
    for nn in (torch.nn, tnn):
        with pytest.warns(UserWarning, match="self_attn.batch_first was not True"):
            e = encoder(nn)
        assert e.use_nested_tensor is False and e.enable_nested_tensor is True
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            e = encoder(nn, batch_first=True)
            assert e.use_nested_tensor is True
            assert encoder(nn, enable_nested_tensor=False).use_nested_tensor is False


@pytest.mark.parametrize("kpm", [[[0, 0, 1, 1], [0, 0, 0, 1], [0, 0, 0, 0]],
                                 [[0, 1, 0, 1], [0, 0, 0, 1], [1, 0, 0, 0]]],
                         ids=["left-aligned", "not-left-aligned"])
@pytest.mark.parametrize("variant", ["norm", "no-norm", "odd-heads", "with-mask", "transformer",
                                     "layer"])
def test_inference_with_padding_matches_torch_nested_path(kpm, variant):
    """In eval mode without grad PyTorch's encoder runs left-aligned padded batches as nested
    tensors and returns zeros at the padded positions; tapegrad's output agrees everywhere
    (and with PyTorch's fused encoder-layer kernel, which a lone layer takes)."""
    kpm = np.array(kpm, dtype=bool)

    def make(nn):
        if variant == "transformer":
            return transformer(batch_first=True)(nn)
        heads = 1 if variant == "odd-heads" else 2
        layer = nn.TransformerEncoderLayer(8, heads, 12, dropout=0.0, batch_first=True)
        if variant == "layer":  # PyTorch's fused encoder-layer kernel
            return layer
        return nn.TransformerEncoder(layer, 2, None if variant == "no-norm" else nn.LayerNorm(8))

    th, tg = quiet(make)(torch.nn), quiet(make)(tnn)
    th.double().eval()
    tg.double().eval()
    tg.load_state_dict(tg_state(th))
    x, y = randn(3, 4, 8, seed=1), randn(3, 2, 8, seed=2)
    outs = []
    for T, m in ((torch, th), (tapegrad, tg)):
        with T.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch: "nested tensors are in prototype stage"
            if variant == "transformer":
                outs.append(m(T.tensor(x), T.tensor(y), src_key_padding_mask=T.tensor(kpm),
                              memory_key_padding_mask=T.tensor(kpm)))
            elif variant == "with-mask":
                outs.append(m(T.tensor(x), mask=T.zeros(4, 4, dtype=T.bool),
                              src_key_padding_mask=T.tensor(kpm)))
            else:
                outs.append(m(T.tensor(x), src_key_padding_mask=T.tensor(kpm)))
    assert_close(outs[1], outs[0])


@pytest.mark.parametrize("norm_first", [False, True])
def test_decoder_alone(norm_first):
    def make(nn):
        layer = nn.TransformerDecoderLayer(8, 2, 12, dropout=0.0, norm_first=norm_first,
                                           activation="gelu", batch_first=True)
        return nn.TransformerDecoder(layer, 2)

    def call(m, tgt, memory):
        T = lib(m)
        mask = T.triu(T.ones(4, 4, dtype=T.bool), diagonal=1)
        return m(tgt, memory, tgt_mask=mask, tgt_is_causal=True,
                 memory_key_padding_mask=T.tensor(padding_mask(2, 5, 1)))

    arrays = [randn(2, 4, 8, seed=1), randn(2, 5, 8, seed=2)]
    check(make, arrays)
    check(make, arrays, call=call)


def test_transformer_errors():
    m = transformer()(tnn)
    with pytest.raises(RuntimeError, match="the batch number of src and tgt must be equal"):
        m(tapegrad.zeros(5, 3, 8), tapegrad.zeros(4, 2, 8))
    with pytest.raises(RuntimeError, match="the feature number of src and tgt must be equal"):
        m(tapegrad.zeros(5, 3, 8), tapegrad.zeros(4, 3, 6))
    with pytest.raises(RuntimeError, match="activation should be relu/gelu, not tanh"):
        tnn.TransformerEncoderLayer(8, 2, activation="tanh")


def test_transformer_training_trajectory_matches_torch():
    """Ten Adam steps of a small seq2seq model: parameters and losses follow torch's."""
    make = transformer(batch_first=True, norm_first=False)
    th, tg = make(torch.nn), make(tnn)
    th.double()
    tg.double()
    tg.load_state_dict(tg_state(th))
    src, tgt, target = randn(3, 5, 8, seed=1), randn(3, 4, 8, seed=2), randn(3, 4, 8, seed=3)
    kpm = padding_mask(3, 5, 4)
    losses = {}
    for T, m in ((torch, th), (tapegrad, tg)):
        opt = T.optim.Adam(m.parameters(), lr=1e-2)
        mask = m.generate_square_subsequent_mask(4, dtype=T.float64)
        losses[T] = []
        for _ in range(10):
            opt.zero_grad()
            out = m(T.tensor(src), T.tensor(tgt), tgt_mask=mask,
                    src_key_padding_mask=T.tensor(kpm), memory_key_padding_mask=T.tensor(kpm))
            loss = ((out - T.tensor(target)) ** 2).mean()
            loss.backward()
            opt.step()
            losses[T].append(loss.item())
    np.testing.assert_allclose(losses[tapegrad], losses[torch], rtol=1e-10)
    assert losses[torch][-1] < losses[torch][0]
    th_params = dict(th.named_parameters())
    for name, p in tg.named_parameters():
        # absolute: the key third of in_proj_bias has an exactly zero true gradient (softmax
        # ignores a per-query shift), so both libraries move it by rounding noise (~1e-11)
        assert_close(p, th_params[name], rtol=1e-9, atol=1e-9, what=name)


class Seq2Seq(object):
    """A user model written against ``torch.nn``: subclasses ``nn.Transformer``, adds
    embeddings and a head, and overrides ``forward``; built for either framework."""

    @staticmethod
    def build(nn):
        class Model(nn.Transformer):
            def __init__(self, vocab, d_model):
                super().__init__(d_model=d_model, nhead=2, num_encoder_layers=1,
                                 num_decoder_layers=1, dim_feedforward=16, dropout=0.0,
                                 batch_first=True)
                self.embed = nn.Embedding(vocab, d_model)
                self.head = nn.Linear(d_model, vocab)

            def forward(self, src, tgt):
                mask = self.generate_square_subsequent_mask(tgt.shape[1],
                                                            dtype=self.head.weight.dtype)
                out = super().forward(self.embed(src), self.embed(tgt), tgt_mask=mask)
                return self.head(out)

        return Model(11, 8)


def test_user_subclass_of_transformer():
    src = np.random.default_rng(0).integers(0, 11, (2, 6))
    tgt = np.random.default_rng(1).integers(0, 11, (2, 4))
    th, tg = quiet(Seq2Seq.build)(torch.nn), quiet(Seq2Seq.build)(tnn)
    assert list(tg.state_dict()) == list(th.state_dict())
    compare(quiet(Seq2Seq.build), [src, tgt])
    assert isinstance(tg, tnn.Transformer) and "Model(" in repr(tg)


# --- recurrent cells --------------------------------------------------------------------
CELLS = [("RNNCell", {}), ("RNNCell", {"nonlinearity": "relu"}), ("RNNCell", {"bias": False}),
         ("LSTMCell", {}), ("LSTMCell", {"bias": False}), ("GRUCell", {}),
         ("GRUCell", {"bias": False})]


def cell_call(m, x, *state):
    if not state:
        return m(x)
    return m(x, tuple(state)) if "LSTM" in type(m).__name__ else m(x, state[0])


@pytest.mark.parametrize("cls,kw", CELLS, ids=lambda c: str(c))
def test_cells_match_torch(cls, kw):
    make = lambda nn: getattr(nn, cls)(3, 4, **kw)  # noqa: E731
    states = [randn(2, 4, seed=5)] + ([randn(2, 4, seed=6)] if cls == "LSTMCell" else [])
    check(make, [randn(2, 3, seed=1)], call=cell_call)
    check(make, [randn(2, 3, seed=1)] + states, call=cell_call)
    compare(make, [randn(3, seed=2)] + [s[0] for s in states], call=cell_call)  # unbatched
    compare(make, [randn(3, seed=2)], call=cell_call)
    th, tg = make(torch.nn), make(tnn)
    assert list(tg.state_dict()) == list(th.state_dict())
    assert repr(tg) == repr(th)
    bound = 1 / np.sqrt(4)
    assert all(np.all(np.abs(p.detach().numpy()) <= bound) for p in tg.parameters())


def test_cell_unrolled_matches_sequence_layer():
    """A GRUCell stepped over time gives torch's GRUCell loop, gradients included."""
    xs = randn(5, 2, 3, seed=3)

    def call(m, x):
        h = None
        outs = []
        for t in range(x.shape[0]):
            h = m(x[t], h)
            outs.append(h)
        return lib(m).stack(outs)

    check(lambda nn: nn.GRUCell(3, 4), [xs], call=call)


def test_cell_errors():
    cell = tnn.GRUCell(3, 4)
    x = tapegrad.zeros(2, 3)
    with pytest.raises(ValueError, match="GRUCell: Expected input to be 1D or 2D, got 3D"):
        cell(tapegrad.zeros(1, 2, 3))
    with pytest.raises(RuntimeError, match="input has inconsistent input_size: got 5 expected 3"):
        cell(tapegrad.zeros(2, 5))
    with pytest.raises(RuntimeError, match="Input batch size 2 doesn't match hidden0 batch"):
        cell(x, tapegrad.zeros(3, 4))
    with pytest.raises(RuntimeError, match="hidden0 has inconsistent hidden_size: got 5"):
        cell(x, tapegrad.zeros(2, 5))
    with pytest.raises(RuntimeError, match="hidden1 has inconsistent hidden_size: got 5"):
        tnn.LSTMCell(3, 4)(x, (tapegrad.zeros(2, 4), tapegrad.zeros(2, 5)))
    with pytest.raises(ValueError, match=r"LSTMCell: Expected hx\[1\] to be 1D or 2D"):
        tnn.LSTMCell(3, 4)(x, (tapegrad.zeros(2, 4), tapegrad.zeros(1, 2, 4)))
    rnn = tnn.RNNCell(3, 4)
    rnn.nonlinearity = "gelu"
    with pytest.raises(RuntimeError, match="Unknown nonlinearity: gelu"):
        rnn(x)


@pytest.mark.parametrize("cls", ["RNN", "LSTM", "GRU"])
def test_flatten_parameters_is_a_no_op(cls):
    m = getattr(tnn, cls)(3, 4)
    before = {k: v.numpy().copy() for k, v in m.state_dict().items()}
    params = list(m.parameters())
    assert m.flatten_parameters() is None
    assert list(m.parameters()) == params  # the same Parameter objects
    assert all(np.array_equal(v.numpy(), before[k]) for k, v in m.state_dict().items())


# --- instance norm ----------------------------------------------------------------------
INSTANCE = [(1, (2, 3, 5)), (2, (2, 3, 4, 5)), (3, (2, 3, 3, 2, 4))]
INSTANCE_KW = [{}, {"affine": True}, {"track_running_stats": True},
               {"affine": True, "track_running_stats": True, "momentum": 0.3},
               {"affine": True, "bias": False}, {"track_running_stats": True, "momentum": None}]


@pytest.mark.parametrize("dims,shape", INSTANCE)
@pytest.mark.parametrize("kw", INSTANCE_KW, ids=str)
def test_instance_norm(dims, shape, kw):
    make = lambda nn: getattr(nn, f"InstanceNorm{dims}d")(3, **kw)  # noqa: E731
    th, tg = compare(make, [randn(*shape, seed=1)])  # train: running stats are compared too
    assert repr(tg) == repr(th)
    check(make, [randn(*shape, seed=2)], train=False)
    compare(make, [randn(*shape[1:], seed=4)])  # unbatched


def test_instance_norm_eval_uses_running_stats_after_training():
    th = torch.nn.InstanceNorm2d(3, track_running_stats=True).double()
    tg = tnn.InstanceNorm2d(3, track_running_stats=True).double()
    for seed in range(3):
        x = randn(2, 3, 4, 4, seed=seed) * 2 + 1
        th(torch.tensor(x))
        tg(tapegrad.tensor(x))
    th.eval()
    tg.eval()
    x = randn(2, 3, 4, 4, seed=9)
    assert_close(tg(tapegrad.tensor(x)), th(torch.tensor(x)))
    for (name, a), (_, b) in zip(tg.state_dict().items(), th.state_dict().items()):
        assert_close(a, b, what=name)


def test_instance_norm_checks():
    with pytest.raises(ValueError, match=r"expected 3D or 4D input \(got 2D input\)"):
        tnn.InstanceNorm2d(3)(tapegrad.zeros(3, 4))
    with pytest.raises(ValueError, match=r"expected input's size at dim=1 to match num_features"):
        tnn.InstanceNorm1d(3, affine=True)(tapegrad.zeros(2, 4, 5))
    with pytest.warns(UserWarning, match="input's size at dim=0 does not match num_features"):
        tnn.InstanceNorm1d(3)(tapegrad.randn(4, 5))
    m = tnn.InstanceNorm1d(3)
    state = {"running_mean": tapegrad.zeros(3), "running_var": tapegrad.ones(3)}
    with pytest.raises(RuntimeError, match="Unexpected running stats buffer"):
        m.load_state_dict(state)


# --- padding ----------------------------------------------------------------------------
PADS = [("ReflectionPad", 2), ("ReplicationPad", 3), ("CircularPad", 2), ("ZeroPad", 2),
        ("ConstantPad", 2)]


@pytest.mark.parametrize("family,pad", PADS)
@pytest.mark.parametrize("dims", [1, 2, 3])
def test_padding_modules(family, pad, dims):
    extra = (1.5,) if family == "ConstantPad" else ()
    widths = (2, 1, 0, 2, 1, 1)[:2 * dims]
    spatial = (4, 3, 5)[:dims]
    for padding in (pad, widths):
        make = lambda nn: getattr(nn, f"{family}{dims}d")(padding, *extra)  # noqa: E731
        th, tg = compare(make, [randn(2, 3, *spatial, seed=dims)])
        assert repr(tg) == repr(th)
        compare(make, [randn(3, *spatial, seed=dims + 1)])  # no batch dim
    if family == "ConstantPad":  # negative widths crop
        compare(lambda nn: getattr(nn, f"ConstantPad{dims}d")(-1, 0.5),
                [randn(2, *spatial, seed=4)])


def test_padding_errors():
    with pytest.raises(RuntimeError, match="Padding size should be less than the corresponding"):
        tnn.ReflectionPad1d(4)(tapegrad.zeros(1, 2, 4))
    with pytest.raises(ValueError, match=r"expected 4D or 5D input \(got 3D input\)"):
        tnn.CircularPad3d(1)(tapegrad.zeros(2, 3, 4))
    with pytest.raises(NotImplementedError, match="pad: Padding size 4 is not supported"):
        tnn.ReplicationPad2d(1)(tapegrad.zeros(4, 4))


# --- pixel shuffle and upsampling -------------------------------------------------------
def test_pixel_shuffle_functional():
    check_op(lambda T, x: T.nn.functional.pixel_shuffle(x, 2), [(2, 8, 3, 2)])
    check_op(lambda T, x: T.nn.functional.pixel_shuffle(x, 3), [(18, 2, 1)])
    check_op(lambda T, x: T.nn.functional.pixel_unshuffle(x, 2), [(2, 2, 4, 6)])
    check_op(lambda T, x: T.nn.functional.pixel_unshuffle(x, 2), [(2, 1, 3, 4, 2)])


@pytest.mark.parametrize("cls,r,shape", [("PixelShuffle", 2, (2, 8, 3, 2)),
                                         ("PixelShuffle", 3, (9, 2, 2)),
                                         ("PixelUnshuffle", 2, (2, 3, 4, 6))])
def test_pixel_shuffle_modules(cls, r, shape):
    th, tg = compare(lambda nn: getattr(nn, cls)(r), [randn(*shape)])
    assert repr(tg) == repr(th)


def test_pixel_shuffle_round_trip_and_error():
    x = tapegrad.tensor(randn(2, 8, 3, 5))
    np.testing.assert_array_equal(tnn.PixelUnshuffle(2)(tnn.PixelShuffle(2)(x)).numpy(),
                                  x.numpy())
    with pytest.raises(RuntimeError, match="pixel_shuffle"):
        tnn.PixelShuffle(2)(tapegrad.zeros(1, 6, 2, 2))


UPSAMPLE = [
    ((2, 3, 5), dict(scale_factor=2)),
    ((2, 3, 5), dict(size=7, mode="linear")),
    ((2, 3, 4, 5), dict(scale_factor=2, mode="bilinear")),
    ((2, 3, 4, 5), dict(scale_factor=(1.5, 2), mode="bilinear", align_corners=True)),
    ((2, 3, 4, 5), dict(size=(3, 7), mode="nearest")),
    ((2, 3, 4, 5), dict(scale_factor=1.7, mode="nearest-exact")),
    ((2, 3, 4, 5), dict(scale_factor=0.5, mode="area")),
    ((1, 2, 3, 2, 4), dict(scale_factor=2, mode="trilinear")),
    ((1, 2, 3, 2, 4), dict(size=(4, 3, 5))),
    ((2, 3, 4, 5), dict(scale_factor=1.5, mode="bilinear", recompute_scale_factor=True)),
]


@pytest.mark.parametrize("shape,kw", UPSAMPLE, ids=str)
def test_upsample(shape, kw):
    th, tg = compare(lambda nn: nn.Upsample(**kw), [randn(*shape)])
    assert repr(tg) == repr(th)


@pytest.mark.parametrize("cls", ["UpsamplingNearest2d", "UpsamplingBilinear2d"])
@pytest.mark.parametrize("kw", [dict(scale_factor=2), dict(size=(5, 7))], ids=str)
def test_upsampling_2d(cls, kw):
    th, tg = check(lambda nn: getattr(nn, cls)(**kw), [randn(2, 3, 3, 4)]) or \
        compare(lambda nn: getattr(nn, cls)(**kw), [randn(2, 3, 3, 4)])
    assert repr(tg) == repr(th)
    assert tg.align_corners == th.align_corners and tg.mode == th.mode
