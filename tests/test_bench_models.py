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
    assert "max_pool2d_indices (tapegrad/ops/nn.py:" in text  # numpy work no op records


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
