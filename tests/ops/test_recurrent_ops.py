"""The fused recurrent ops (ops/recurrent.py): ``rnn_layer`` (one layer and direction over all
time steps) and ``rnn_cell`` against PyTorch's own layers and cells (values and gradients,
float64 at 1e-12, float32 at rounding), gradcheck, second order (through the composition),
forward mode, and against the step-by-step composition they replace."""
import numpy as np
import pytest
import torch

import tapegrad
from helpers import assert_close, check_op, check_torch, make_inputs
from tapegrad.ops.recurrent import (GATES, reference_cell, reference_layer, rnn_cell,
                                    rnn_layer)

# mode -> (torch layer class, kwargs); RNN_* are torch.nn.RNN with its nonlinearity
TORCH_LAYERS = {"LSTM": ("LSTM", {}), "GRU": ("GRU", {}),
                "RNN_TANH": ("RNN", {"nonlinearity": "tanh"}),
                "RNN_RELU": ("RNN", {"nonlinearity": "relu"})}
TORCH_CELLS = {"LSTM": ("LSTMCell", {}), "GRU": ("GRUCell", {}),
               "RNN_TANH": ("RNNCell", {"nonlinearity": "tanh"}),
               "RNN_RELU": ("RNNCell", {"nonlinearity": "relu"})}


def layer_specs(mode, steps, batch, inputs, hidden, proj=0, bias=True):
    """Shapes of (x, h0, [c0], w_ih, w_hh, [b_ih, b_hh], [w_hr])."""
    G = GATES[mode] * hidden
    state = proj or hidden
    specs = [(steps, batch, inputs), (batch, state)]
    specs += [(batch, hidden)] if mode == "LSTM" else []
    specs += [(G, inputs), (G, state)]
    specs += [(G,), (G,)] if bias else []
    specs += [(proj, hidden)] if proj else []
    return specs


def _unpack(mode, bias, proj, args):
    args = list(args)
    x, h0 = args.pop(0), args.pop(0)
    c0 = args.pop(0) if mode == "LSTM" else None
    w_ih, w_hh = args.pop(0), args.pop(0)
    b_ih, b_hh = (args.pop(0), args.pop(0)) if bias else (None, None)
    w_hr = args.pop(0) if proj else None
    return x, h0, c0, w_ih, w_hh, b_ih, b_hh, w_hr


def layer_fn(mode, reverse=False, bias=True, proj=False):
    """``fn(T, *inputs)``: the packed output of one layer in one direction. tapegrad: the input
    projection then ``rnn_layer``; torch: its nn layer run one step at a time (so each step's
    cell state can be read), through ``torch.func.functional_call``."""

    def fn(T, *args):
        x, h0, c0, w_ih, w_hh, b_ih, b_hh, w_hr = _unpack(mode, bias, proj, args)
        if T is tapegrad:
            xw = tapegrad.nn.functional.linear(x, w_ih, b_ih)
            return rnn_layer(xw, h0, c0, w_hh, b_hh, w_hr, mode=mode, reverse=reverse)
        cls, kw = TORCH_LAYERS[mode]
        hidden = w_hh.shape[0] // GATES[mode]
        if proj:
            kw = dict(kw, proj_size=w_hr.shape[0])
        module = getattr(torch.nn, cls)(x.shape[-1], hidden, bias=bias, dtype=x.dtype, **kw)
        params = {"weight_ih_l0": w_ih, "weight_hh_l0": w_hh}
        if bias:
            params.update(bias_ih_l0=b_ih, bias_hh_l0=b_hh)
        if proj:
            params["weight_hr_l0"] = w_hr
        steps = x.shape[0]
        hs, cs = [None] * steps, [None] * steps
        h, c = h0[None], None if c0 is None else c0[None]
        for t in (range(steps - 1, -1, -1) if reverse else range(steps)):
            state = (h, c) if c is not None else h
            _, state = torch.func.functional_call(module, params, (x[t:t + 1], state))
            h, c = state if c is not None else (state, None)
            hs[t], cs[t] = h[0], None if c is None else c[0]
        out = torch.stack(hs)
        return torch.cat([out, torch.stack(cs)], 2) if c0 is not None else out

    return fn


def cell_fn(mode, bias=True):
    def fn(T, *args):
        x, h, c, w_ih, w_hh, b_ih, b_hh, _ = _unpack(mode, bias, False, args)
        if T is tapegrad:
            return rnn_cell(x, h, c, w_ih, w_hh, b_ih, b_hh, mode=mode)
        cls, kw = TORCH_CELLS[mode]
        module = getattr(torch.nn, cls)(x.shape[-1], w_hh.shape[1], bias=bias, dtype=x.dtype,
                                        **kw)
        params = {"weight_ih": w_ih, "weight_hh": w_hh}
        if bias:
            params.update(bias_ih=b_ih, bias_hh=b_hh)
        out = torch.func.functional_call(module, params, (x, (h, c) if c is not None else h))
        return torch.cat(out, 1) if c is not None else out

    return fn


def cell_specs(mode, batch, inputs, hidden, bias=True):
    specs = layer_specs(mode, 1, batch, inputs, hidden, bias=bias)
    specs[0] = (batch, inputs)
    return specs


MODES = ["LSTM", "GRU", "RNN_TANH", "RNN_RELU"]


# --- the three-way check (torch, gradcheck, second order) plus forward mode ---------------
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("reverse", [False, True])
def test_layer_op_three_ways(mode, reverse):
    check_op(layer_fn(mode, reverse), layer_specs(mode, 3, 2, 3, 2), vmap=False)


def test_projected_lstm_layer_three_ways():
    for reverse in (False, True):
        check_op(layer_fn("LSTM", reverse, proj=True),
                 layer_specs("LSTM", 3, 2, 3, 3, proj=2), vmap=False)


@pytest.mark.parametrize("mode", MODES)
def test_cell_op_three_ways(mode):
    check_op(cell_fn(mode), cell_specs(mode, 2, 3, 2), vmap=False)
    check_op(cell_fn(mode, bias=False), cell_specs(mode, 2, 3, 2, bias=False), forward=False,
             vmap=False)


# --- torch agreement over many shapes (values and gradients) --------------------------------
SHAPES = [(1, 1, 1, 1), (1, 3, 2, 4), (4, 1, 3, 2), (5, 3, 4, 6), (7, 2, 5, 3)]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_layer_op_matches_torch_over_shapes(mode, shape):
    steps, batch, inputs, hidden = shape
    for reverse in (False, True):
        for bias in (True, False):
            specs = layer_specs(mode, steps, batch, inputs, hidden, bias=bias)
            arrays = make_inputs(specs, seed=steps + hidden)
            fn = layer_fn(mode, reverse, bias)
            check_torch(fn, arrays)
            check_torch(fn, arrays, rtol=2e-5, dtype=np.float32)


@pytest.mark.parametrize("shape", [(1, 1, 2, 3, 1), (4, 3, 2, 5, 3), (6, 2, 3, 4, 2)],
                         ids=lambda s: "x".join(map(str, s)))
def test_projected_lstm_matches_torch_over_shapes(shape):
    steps, batch, inputs, hidden, proj = shape
    for reverse in (False, True):
        arrays = make_inputs(layer_specs("LSTM", steps, batch, inputs, hidden, proj=proj))
        fn = layer_fn("LSTM", reverse, proj=True)
        check_torch(fn, arrays)
        check_torch(fn, arrays, rtol=2e-5, dtype=np.float32)


@pytest.mark.parametrize("mode", MODES)
def test_cell_op_matches_torch_over_shapes(mode):
    for batch, inputs, hidden in ((1, 1, 1), (3, 4, 5), (8, 2, 3)):
        arrays = make_inputs(cell_specs(mode, batch, inputs, hidden), seed=batch)
        check_torch(cell_fn(mode), arrays)
        check_torch(cell_fn(mode), arrays, rtol=2e-5, dtype=np.float32)


@pytest.mark.filterwarnings("error::RuntimeWarning")
def test_saturated_gates_stay_finite():
    # pre-activations far below -88 (float32) or -709 (float64): exp overflows to inf inside
    # the sigmoid and 1 / inf is the exact limit 0; no NaN, no warning, torch's values
    for dtype in (np.float64, np.float32):
        arrays = make_inputs(layer_specs("LSTM", 3, 2, 3, 2), seed=4)
        arrays[3] = arrays[3] * 1e3  # w_ih
        check_torch(layer_fn("LSTM"), arrays, rtol=1e-12 if dtype == np.float64 else 2e-5,
                    dtype=None if dtype == np.float64 else dtype)


# --- the fused ops against the composition they replace -------------------------------------
@pytest.mark.parametrize("mode", MODES)
def test_layer_op_matches_composition(mode):
    specs = layer_specs(mode, 6, 3, 4, 5, proj=3 if mode == "LSTM" else 0)
    arrays = make_inputs(specs, seed=7)
    x, h0, c0, w_ih, w_hh, b_ih, b_hh, w_hr = _unpack(mode, True, mode == "LSTM", arrays)
    xw = x @ w_ih.T + b_ih
    for reverse in (False, True):
        got, want = [], []
        for fn, out in ((rnn_layer, got), (reference_layer, want)):
            ts = [None if a is None else tapegrad.tensor(a, requires_grad=True)
                  for a in (xw, h0, c0, w_hh, b_hh, w_hr)]
            y = fn(*ts, mode=mode, reverse=reverse)
            (y * tapegrad.tensor(np.cos(np.arange(y.numel())).reshape(y.shape))).sum().backward()
            out += [y] + [t.grad for t in ts if t is not None]
        for a, b in zip(got, want):
            assert_close(a, b, rtol=1e-13)


def test_cell_op_matches_composition():
    for mode in MODES:
        arrays = make_inputs(cell_specs(mode, 3, 4, 5), seed=8)
        x, h, c, w_ih, w_hh, b_ih, b_hh, _ = _unpack(mode, True, False, arrays)
        ts = [None if a is None else tapegrad.tensor(a) for a in (x, h, c, w_ih, w_hh, b_ih,
                                                                   b_hh)]
        assert_close(rnn_cell(*ts, mode=mode), reference_cell(*ts, mode=mode), rtol=1e-14)


def test_third_order_through_the_layer_op():
    # the backward op's rule records the composition's second derivative: differentiable again
    arrays = make_inputs(layer_specs("GRU", 2, 1, 2, 2), seed=9)
    x, h0, _, w_ih, w_hh, b_ih, b_hh, _ = _unpack("GRU", True, False, arrays)
    xw = tapegrad.tensor(x @ w_ih.T + b_ih, requires_grad=True)
    rest = [tapegrad.tensor(a) for a in (h0, w_hh, b_hh)]
    ref = tapegrad.tensor(xw._data, requires_grad=True)

    def derivs(fn, t):
        y = fn(t, rest[0], None, rest[1], rest[2], None, mode="GRU")
        (g1,) = tapegrad.autograd.grad((y * y).sum(), t, create_graph=True)
        (g2,) = tapegrad.autograd.grad((g1 * g1).sum(), t, create_graph=True)
        (g3,) = tapegrad.autograd.grad((g2 * g2.sin()).sum(), t)
        return g1, g2, g3

    for a, b in zip(derivs(rnn_layer, xw), derivs(reference_layer, ref)):
        assert_close(a, b, rtol=1e-11)


# --- errors ----------------------------------------------------------------------------------
def test_layer_op_errors_name_the_op_and_shapes():
    xw, h0, w_hh = (tapegrad.randn(3, 2, 8, dtype=tapegrad.float64),
                    tapegrad.randn(2, 2, dtype=tapegrad.float64),
                    tapegrad.randn(8, 2, dtype=tapegrad.float64))
    with pytest.raises(RuntimeError,
                       match=r"rnn_layer: shapes do not fit a GRU layer.*\(3, 2, 8\)"):
        rnn_layer(xw, h0, None, w_hh, None, None, mode="GRU")
    with pytest.raises(RuntimeError, match="rnn_layer: c0 .* only for LSTM"):
        rnn_layer(xw[..., :2], h0, h0, w_hh[:2], None, None, mode="RNN_TANH")
    with pytest.raises(RuntimeError, match="rnn_layer: expected floating inputs of one dtype"):
        rnn_layer(xw, h0.float(), h0, w_hh, None, None, mode="LSTM")
    with pytest.raises(RuntimeError, match="rnn_layer: unknown mode 'LSTMX'"):
        rnn_layer(xw, h0, h0, w_hh, None, None, mode="LSTMX")
    with pytest.raises(RuntimeError, match="rnn_cell: expected x \\(B, I\\)"):
        rnn_cell(tapegrad.randn(2, 3), tapegrad.randn(2, 2), tapegrad.randn(2, 2),
                 tapegrad.randn(8, 4), tapegrad.randn(8, 2), None, None, mode="LSTM")


def test_layers_run_one_op_per_layer_and_direction():
    # the nn layers reach the fused op: one rnn_layer node per layer and direction, whatever
    # the sequence length (the step-by-step composition would add ~10 nodes per step)
    from tapegrad.autograd.engine import toposort

    for cls in ("LSTM", "GRU", "RNN"):
        m = getattr(tapegrad.nn, cls)(3, 4, num_layers=2, bidirectional=True)
        out, _ = m(tapegrad.randn(9, 2, 3))
        names = [n.op.name for n in toposort([out.grad_fn])]
        assert names.count("rnn_layer") == 4, (cls, names)
    cell = tapegrad.nn.LSTMCell(3, 4)
    h, _ = cell(tapegrad.randn(2, 3))
    assert h.grad_fn.parents[0].op.name == "rnn_cell"


# --- vmap: mapped elements fold into the RNN batch (shared weights) -------------------------
@pytest.mark.filterwarnings("error:vmap")  # a loop over the batch would warn
@pytest.mark.parametrize("mode", MODES)
def test_vmap_folds_into_the_batch_and_per_element_weight_grads(mode):
    V = 3
    specs = layer_specs(mode, 4, 2, 3, 5)
    arrays = make_inputs(specs, seed=11)
    x, h0, c0, w_ih, w_hh, b_ih, b_hh, _ = _unpack(mode, True, False, arrays)
    rng = np.random.default_rng(12)
    xws = rng.standard_normal((V,) + (x.shape[0], x.shape[1], w_ih.shape[0]))
    h0s = rng.standard_normal((V,) + h0.shape)
    w = [tapegrad.tensor(a) for a in (w_hh, b_hh)]
    c = None if c0 is None else tapegrad.tensor(c0)

    def layer(xw, h, w_hh, b_hh):
        return rnn_layer(xw, h, c, w_hh, b_hh, None, mode=mode, reverse=True)

    def loss(xw, h, w_hh, b_hh):
        y = layer(xw, h, w_hh, b_hh)
        return (y * y.sin()).sum()

    got = tapegrad.func.vmap(layer, in_dims=(0, 0, None, None))(
        tapegrad.tensor(xws), tapegrad.tensor(h0s), *w)
    grads = tapegrad.func.vmap(tapegrad.func.grad(loss, argnums=(0, 1, 2, 3)),
                               in_dims=(0, 0, None, None))(tapegrad.tensor(xws),
                                                           tapegrad.tensor(h0s), *w)
    for v in range(V):
        xv, hv = tapegrad.tensor(xws[v]), tapegrad.tensor(h0s[v])
        assert_close(got[v], layer(xv, hv, *w), rtol=1e-14)
        want = tapegrad.func.grad(loss, argnums=(0, 1, 2, 3))(xv, hv, *w)
        for a, b in zip(grads, want):
            assert_close(a[v], b, rtol=1e-12)


@pytest.mark.filterwarnings("error:vmap")
@pytest.mark.parametrize("mode", MODES)
def test_vmap_of_cell_and_its_per_element_grads(mode):
    V = 3
    arrays = make_inputs(cell_specs(mode, 2, 3, 4), seed=13)
    x, h, c, w_ih, w_hh, b_ih, b_hh, _ = _unpack(mode, True, False, arrays)
    rng = np.random.default_rng(14)
    xs = tapegrad.tensor(rng.standard_normal((V,) + x.shape))
    hs = tapegrad.tensor(rng.standard_normal((V,) + h.shape))
    ws = [tapegrad.tensor(a) for a in (w_ih, w_hh, b_ih, b_hh)]
    ct = None if c is None else tapegrad.tensor(c)

    def loss(x, h, w_ih, w_hh, b_ih, b_hh):
        y = rnn_cell(x, h, ct, w_ih, w_hh, b_ih, b_hh, mode=mode)
        return (y * y.cos()).sum()

    argnums = tuple(range(6))
    grads = tapegrad.func.vmap(tapegrad.func.grad(loss, argnums=argnums),
                               in_dims=(0, 0) + (None,) * 4)(xs, hs, *ws)
    for v in range(V):
        want = tapegrad.func.grad(loss, argnums=argnums)(xs[v], hs[v], *ws)
        for a, b in zip(grads, want):
            assert_close(a[v], b, rtol=1e-12)
