"""RNN, LSTM and GRU against PyTorch: torch's weights loaded by name (so the gate order must
be PyTorch's), outputs, final states and all gradients compared in float64 and float32."""
import numpy as np
import pytest
import torch

import tapegrad
from helpers import TESTS
import tapegrad.nn as tnn
from test_layers import check, compare, randn, tg_state

CONFIGS = [
    dict(),
    dict(num_layers=2),
    dict(bidirectional=True),
    dict(num_layers=2, bidirectional=True, batch_first=True),
    dict(bias=False),
    dict(batch_first=True),
]


def run(with_state):
    def call(m, x, *state):
        if not state:
            return m(x)
        if isinstance(m, (torch.nn.LSTM, tnn.LSTM)):
            return m(x, tuple(state))
        return m(x, state[0])

    return call


def states(cls, cfg, batch, hidden=4, proj=0):
    layers = cfg.get("num_layers", 1) * (2 if cfg.get("bidirectional") else 1)
    h = randn(layers, batch, proj or hidden, seed=11)
    if cls == "LSTM":
        return [h, randn(layers, batch, hidden, seed=12)]
    return [h]


@pytest.mark.parametrize("cls", ["RNN", "LSTM", "GRU"])
@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: "-".join(f"{k}={v}" for k, v in c.items())
                         or "default")
def test_recurrent_matches_torch(cls, cfg):
    shape = (2, 4, 3) if cfg.get("batch_first") else (4, 2, 3)
    make = lambda nn: getattr(nn, cls)(3, 4, **cfg)  # noqa: E731
    check(make, [randn(*shape)], call=run(False))
    check(make, [randn(*shape)] + states(cls, cfg, 2), call=run(True))


@pytest.mark.parametrize("cls", ["RNN", "LSTM", "GRU"])
def test_recurrent_unbatched(cls):
    make = lambda nn: getattr(nn, cls)(3, 4, num_layers=2)  # noqa: E731
    compare(make, [randn(5, 3)], call=run(False))
    compare(make, [randn(5, 3)] + [s[:, 0] for s in states(cls, dict(num_layers=2), 1)],
            call=run(True))


@pytest.mark.filterwarnings("ignore:LSTM with projections is not supported with oneDNN")
def test_rnn_relu_and_lstm_projection():
    check(lambda nn: nn.RNN(3, 4, nonlinearity="relu", num_layers=2), [randn(4, 2, 3)],
          call=run(False))
    check(lambda nn: nn.RNN(3, 4, 2, "relu"), [randn(4, 2, 3)], call=run(False))
    cfg = dict(num_layers=2, bidirectional=True)
    make = lambda nn: nn.LSTM(3, 4, proj_size=2, **cfg)  # noqa: E731
    check(make, [randn(4, 2, 3)], call=run(False))
    check(make, [randn(4, 2, 3)] + states("LSTM", cfg, 2, proj=2), call=run(True))


def test_state_dict_names_gate_order_and_init():
    for cls, gates in (("RNN", 1), ("LSTM", 4), ("GRU", 3)):
        th = getattr(torch.nn, cls)(3, 5, num_layers=2, bidirectional=True)
        tg = getattr(tnn, cls)(3, 5, num_layers=2, bidirectional=True)
        assert list(tg.state_dict()) == list(th.state_dict())
        assert tg.weight_ih_l1_reverse.shape == (gates * 5, 10)
        for p in tg.parameters():  # U(-1/sqrt(hidden), 1/sqrt(hidden))
            assert np.all(np.abs(p._data) <= 1 / np.sqrt(5))
        assert repr(tg) == repr(th)
        assert [[n for n in names] for names in tg._all_weights] == th._all_weights
    lstm = tnn.LSTM(2, 3)
    assert [w.shape for w in lstm.all_weights[0]] == [(12, 2), (12, 3), (12,), (12,)]


def test_dropout_between_layers_only_in_training():
    th = torch.nn.LSTM(3, 4, num_layers=2, dropout=0.5).double()
    tg = tnn.LSTM(3, 4, num_layers=2, dropout=0.5).double()
    tg.load_state_dict(tg_state(th))
    x = randn(5, 2, 3)
    th.eval()
    tg.eval()
    out_th, _ = th(torch.tensor(x))
    out_tg, _ = tg(tapegrad.tensor(x))
    np.testing.assert_allclose(out_tg._data, out_th.detach().numpy(), rtol=1e-12, atol=1e-14)
    tg.train()
    tapegrad.manual_seed(0)
    a, _ = tg(tapegrad.tensor(x))
    tapegrad.manual_seed(1)
    b, _ = tg(tapegrad.tensor(x))
    assert not np.allclose(a._data, b._data)  # dropout acts between the layers
    with pytest.warns(UserWarning, match="num_layers greater than 1"):
        tnn.GRU(3, 4, dropout=0.2)


def test_recurrent_errors():
    lstm = tnn.LSTM(3, 4)
    with pytest.raises(RuntimeError, match="input.size\\(-1\\) must be equal to input_size"):
        lstm(tapegrad.randn(5, 2, 4))
    with pytest.raises(ValueError, match="Expected input to be 2D or 3D"):
        lstm(tapegrad.randn(5))
    with pytest.raises(RuntimeError, match="Expected hidden\\[0\\] size \\(1, 2, 4\\)"):
        lstm(tapegrad.randn(5, 2, 3), (tapegrad.zeros(1, 3, 4), tapegrad.zeros(1, 2, 4)))
    with pytest.raises(ValueError, match="does not match weight dtype"):
        lstm(tapegrad.randn(5, 2, 3, dtype=tapegrad.float64))
    gru = tnn.GRU(3, 4)
    with pytest.raises(RuntimeError, match="hx should also be 3-D"):
        gru(tapegrad.randn(5, 2, 3), tapegrad.zeros(2, 4))
    with pytest.raises(ValueError, match="Unknown nonlinearity"):
        tnn.RNN(3, 4, nonlinearity="gelu")
    with pytest.raises(ValueError, match="proj_size argument is only supported for LSTM"):
        tnn.GRU(3, 4, proj_size=2)
    with pytest.raises(ValueError, match="proj_size has to be smaller"):
        tnn.LSTM(3, 4, proj_size=4)
    with pytest.raises(ValueError, match="hidden_size must be greater than zero"):
        tnn.RNN(3, 0)


@pytest.mark.filterwarnings("ignore:LSTM with projections is not supported with oneDNN")
@pytest.mark.parametrize("shape", [(1, 1, 3), (1, 3, 3), (6, 1, 3)], ids=str)
def test_one_step_and_batch_of_one(shape):
    for cls, kw in (("RNN", {}), ("GRU", {}), ("LSTM", {}), ("LSTM", {"proj_size": 2})):
        cfg = dict(num_layers=2, bidirectional=True, **kw)
        make = lambda nn: getattr(nn, cls)(3, 4, **cfg)  # noqa: E731,B023
        check(make, [randn(*shape)], call=run(False))
        check(make, [randn(*shape)] + states(cls, cfg, shape[1], proj=kw.get("proj_size", 0)),
              call=run(True))


@pytest.mark.filterwarnings("ignore:LSTM with projections is not supported with oneDNN")
def test_projected_lstm_unbatched_and_second_order():
    make = lambda nn: nn.LSTM(3, 4, proj_size=2, batch_first=True)  # noqa: E731
    compare(make, [randn(5, 3)], call=run(False))
    m = tnn.LSTM(2, 3, proj_size=2).double()
    x = tapegrad.tensor(randn(3, 2, 2), requires_grad=True)
    assert tapegrad.autograd.gradgradcheck(lambda x: m(x)[0], [x])


def test_layers_and_cells_stay_on_the_device():
    # the default zero states are made on the input's device, and the fused ops reach the
    # device's array module (tests/fake_device.py: a stand-in that rejects host arrays)
    import os
    import sys

    sys.path.insert(0, os.path.join(TESTS, "gpu"))
    import fake_device

    b = fake_device.install()
    try:
        for cls in ("LSTM", "GRU", "RNN"):
            tapegrad.manual_seed(0)
            m = getattr(tnn, cls)(3, 4, num_layers=2, bidirectional=True).double()
            x = tapegrad.tensor(randn(5, 2, 3))
            ref, _ = m(x)
            ref.sum().backward()
            want = m.weight_hh_l0.grad.numpy().copy()
            m.zero_grad()
            m = m.to("cuda")
            out, _ = m(x.to("cuda"))
            out.sum().backward()
            assert type(out._data) is fake_device.FakeArray
            np.testing.assert_array_equal(out.cpu().detach().numpy(), ref.detach().numpy())
            np.testing.assert_array_equal(m.weight_hh_l0.grad.cpu().numpy(), want)
        for cls in ("LSTMCell", "GRUCell", "RNNCell"):
            cell = getattr(tnn, cls)(3, 4).double().to("cuda")
            y = cell(tapegrad.tensor(randn(2, 3)).to("cuda"))
            y = y[0] if isinstance(y, tuple) else y
            y.sum().backward()
            assert type(y._data) is type(cell.weight_ih.grad._data) is fake_device.FakeArray
    finally:
        fake_device.uninstall(b)
