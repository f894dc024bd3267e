"""The examples run end to end (few steps) and agree with PyTorch from the same weights."""
import os

import numpy as np
import pytest

from tapegrad.examples import char_gpt, common, digits_cnn, spiral


@pytest.fixture(autouse=True)
def _quiet_torch_threads():
    import torch

    torch.set_num_threads(1)


def _run_reference(monkeypatch, module, argv):
    seen = {}
    real = common.report_reference

    def spy(losses, ref, seconds, ref_seconds):
        seen["losses"], seen["ref"] = losses, ref
        return real(losses, ref, seconds, ref_seconds)

    monkeypatch.setattr(common, "report_reference", spy)
    module.main(argv)
    return np.array(seen["losses"]), np.array(seen["ref"])


@pytest.mark.parametrize("module, steps", [(spiral, 20), (digits_cnn, 4), (char_gpt, 3)])
def test_example_matches_pytorch(tmp_path, monkeypatch, capsys, module, steps):
    argv = ["--steps", str(steps), "--no-progress", "--reference", "torch",
            "--out", str(tmp_path)]
    losses, ref = _run_reference(monkeypatch, module, argv)
    assert len(losses) == steps and np.all(np.isfinite(losses))
    np.testing.assert_allclose(losses, ref, rtol=1e-12, atol=0)
    out = capsys.readouterr().out
    assert "largest loss difference" in out
    assert os.path.exists(tmp_path / "loss.png") and os.path.exists(tmp_path / "weights.tg")


def test_spiral_learns(tmp_path):
    losses = spiral.main(["--steps", "150", "--no-progress", "--out", str(tmp_path)])
    assert losses[-1] < 0.6 * losses[0]


def test_digits_cnn_reaches_97_percent_test_accuracy(tmp_path):
    test_acc = digits_cnn.main(["--no-progress", "--out", str(tmp_path)])  # default run, ~5 s
    assert test_acc >= 0.97
