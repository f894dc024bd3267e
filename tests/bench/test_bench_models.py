"""The model training-step benchmark (``tapegrad bench models``): a few steps of its own code,
tapegrad's losses against PyTorch's from the same weights and batches; no timing asserted."""
import numpy as np
import pytest
import torch

import tapegrad
from tapegrad.bench import harness as H
from tapegrad.bench import models
from helpers import check_op


@pytest.mark.parametrize("model", ["cnn", "gpt"])
@pytest.mark.parametrize("dtype,rtol", [(np.float64, 1e-12), (np.float32, 1e-5)])
def test_step_losses_agree_with_torch(model, dtype, rtol):
    ours, ref, diff = models.agreement(model, dtype, torch, steps=2)
    assert len(ours) == len(ref) == 2
    np.testing.assert_allclose(ours, ref, rtol=rtol)
    assert diff <= rtol
    assert ours[1] != ours[0]  # the optimizer step moved the weights


def test_step_updates_same_weights_in_both_libraries():
    state, batches = models.initial_state("cnn"), models.make_data("cnn", 2)
    ours = models.Step(tapegrad, "cnn", state, batches, np.float64)
    ref = models.Step(torch, "cnn", state, batches, np.float64)
    ours(), ref()
    for (name, a), (_, b) in zip(ours.model.state_dict().items(),
                                 ref.model.state_dict().items()):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-11, atol=1e-14, err_msg=name)


def test_float32_model_keeps_tied_weights():
    state = models.initial_state("gpt")
    step = models.Step(tapegrad, "gpt", state, models.make_data("gpt", 1), np.float32)
    assert step.model.head.weight is step.model.tok.weight
    assert step.model.tok.weight.dtype == tapegrad.float32


def test_phases_and_op_profile_cover_the_step():
    with H.Threads(1, torch) as threads:
        result = models.phases(threads, torch, "gpt", np.float64, steps=1)
    assert set(result) == {"tapegrad", "torch"}
    assert set(result["tapegrad"][0]) == set(models.PHASES["gpt"])
    assert all(t >= 0 for t in result["tapegrad"][0].values())
    timer, watched, steps = models.op_profile("cnn", np.float64, steps=1)
    assert {"conv2d", "linear", "max_pool2d"} <= set(timer.forward) | set(timer.backward)
    assert not tapegrad.autograd.engine.WATCH  # the watcher is removed afterwards
    text = models.op_report(timer, watched, steps)
    assert "top" in text and "linear" in text
    text = models.function_profile("cnn", np.float64, steps=1, top=40)
    # the convolution family's functions (which of them ranks in the top 40 depends on the
    # kernels chosen for these shapes) and numpy's methods are both visible
    assert "(tapegrad/ops/convolution.py:" in text and "<method 'reshape'" in text


def test_main_quick_prints_the_table(capsys):
    rows = models.main(["--quick", "--model", "cnn", "--dtype", "float32", "--threads", "1"])
    out = capsys.readouterr().out
    assert "digits CNN" in out and "speed vs torch" in out
    assert len(rows) == 1 and rows[0]["per_step"]["tapegrad"] > 0
    assert rows[0]["loss_diff"] < 1e-5


def test_cli_runs_bench_models(capsys):
    from tapegrad import bench, cli

    assert "models" in bench.BENCHMARKS
    assert cli.main(["bench", "models", "--quick", "--model", "gpt", "--dtype", "float64",
                     "--threads", "1", "--no-torch"]) == 0
    out = capsys.readouterr().out
    assert "char GPT" in out and "torch ms/step" not in out


# linear's batched path (input of 3 or more dims: one 2-D GEMM), found by this benchmark
def test_linear_batched_input_matches_torch():
    check_op(lambda T, x, w, b: T.nn.functional.linear(x, w, b), [(2, 2, 3), (4, 3), (4,)])
    check_op(lambda T, x, w, b: T.nn.functional.linear(x, w, b), [(2, 1, 2, 3), (2, 3), (2,)])


def test_linear_batched_input_empty_and_noncontiguous():
    x = np.random.default_rng(0).standard_normal((3, 0, 4))
    w = np.ones((5, 4))
    out = tapegrad.nn.functional.linear(tapegrad.tensor(x), tapegrad.tensor(w))
    assert tuple(out.shape) == (3, 0, 5)
    xt = np.random.default_rng(1).standard_normal((4, 3, 2)).transpose(2, 1, 0)  # (2, 3, 4)
    got = tapegrad.nn.functional.linear(tapegrad.tensor(xt), tapegrad.tensor(w))
    ref = torch.nn.functional.linear(torch.tensor(xt), torch.tensor(w))
    np.testing.assert_allclose(got.numpy(), ref.numpy(), rtol=1e-12)


# max_pool2d's window arg-max when stride = kernel (the CNN's pools), found by this benchmark
@pytest.mark.parametrize("shape,kernel", [((3, 4, 8, 8), 2), ((2, 3, 5, 7), 2),
                                          ((1, 2, 6, 9), 3), ((2, 1, 4, 6), (2, 3))])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_max_pool2d_tiled_windows_match_torch(shape, kernel, dtype):
    rng = np.random.default_rng(0)
    x = (np.round(rng.standard_normal(shape) * 2) / 2).astype(dtype)  # many ties
    x.flat[::5] = -np.inf
    for arr in (x, np.asfortranarray(x)):
        a, ia = tapegrad.nn.functional.max_pool2d(tapegrad.tensor(arr), kernel,
                                                   return_indices=True)
        b, ib = torch.nn.functional.max_pool2d(torch.tensor(arr), kernel, return_indices=True)
        np.testing.assert_array_equal(ia.numpy(), ib.numpy())
        np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_max_pool2d_tiled_gradients_match_torch():
    check_op(lambda T, x: T.nn.functional.max_pool2d(x, 2), [(2, 3, 4, 6)])
    check_op(lambda T, x: T.nn.functional.max_pool2d(x, (2, 3)), [(1, 2, 5, 7)])


def _first_argmax_indices(x, k):
    """Reference: per window, PyTorch's rule (the first maximum; a NaN wins, of several the
    last) as a flat h * W + w index, by explicit loops."""
    n, c, h, w = x.shape
    out = np.zeros((n, c, h // k, w // k), dtype=np.int64)
    for idx in np.ndindex(out.shape):
        b, ch, r, q = idx
        win = x[b, ch, r * k:(r + 1) * k, q * k:(q + 1) * k].reshape(-1)
        nan = np.flatnonzero(win != win)
        j = int(nan[-1]) if nan.size else int(np.argmax(win))
        out[idx] = (r * k + j // k) * w + q * k + j % k
    return out


def test_max_pool2d_tiled_nan_int_and_empty():
    """As the general path and PyTorch: the first maximum, the last NaN of a window wins;
    integer inputs and an empty batch work."""
    from tapegrad.ops import nn as N

    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 3, 4, 5))
    x.flat[::3] = np.nan
    x.flat[1::7] = np.nan
    for arr, k in ((x, 2), (rng.integers(0, 3, (2, 2, 6, 7)), 3), (np.ones((0, 2, 4, 4)), 2)):
        o = (arr.shape[2] // k, arr.shape[3] // k)
        got = N.max_pool2d_indices(arr, kernel=(k, k), stride=(k, k), padding=(0, 0),
                                   dilation=(1, 1), out_size=o)
        assert got.dtype == np.int64
        np.testing.assert_array_equal(got, _first_argmax_indices(arr, k))
