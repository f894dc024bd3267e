"""Smoke tests of ``python -m tapegrad demo|bench``: reduced modes, a few seconds each.

Nothing here times anything: the benchmarks run in their quick modes and only their output
and side effects are checked.
"""
import sys

import numpy as np
import pytest

import tapegrad
from tapegrad import bench, cli
from tapegrad.bench import harness
from tapegrad.bench.spiral import MLPTrainer, NumpyTrainer, init_params, spiral_data


def test_help_and_unknown_command(capsys):
    assert cli.main(["--help"]) == 0
    assert "tapegrad demo" in capsys.readouterr().out
    assert cli.main([]) == 2
    assert cli.main(["frobnicate"]) == 2
    assert "unknown command 'frobnicate'" in capsys.readouterr().err


def test_bench_list_and_unknown_name(capsys):
    assert cli.main(["bench", "--list"]) == 0
    out = capsys.readouterr().out
    for name in ("dispatch", "mlp", "blas", "checkpoint"):
        assert name in out
    with pytest.raises(SystemExit):
        cli.main(["bench", "nope"])
    with pytest.raises(KeyError, match="unknown benchmark 'nope'"):
        bench.load("nope")


def test_memory_command(capsys):
    assert cli.main(["memory", "--depth", "2", "--width", "8", "--batch", "4"]) == 0
    assert "depth 2, width 8, batch 4" in capsys.readouterr().out


def test_demo_quick(capsys):
    assert cli.main(["demo", "--quick", "--threads", "1"]) == 0
    out = capsys.readouterr().out
    for section in "abcdef":
        assert f"\n({section}) " in out
    assert "every check agreed" in out
    assert "target <= 1e-15: met" in out
    assert "FAIL" not in out


def test_demo_without_torch(capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` now raises ImportError
    assert harness.import_torch() is None
    assert cli.main(["demo", "--quick", "--threads", "1"]) == 0
    out = capsys.readouterr().out
    assert "PyTorch is not installed" in out
    assert "torch us" not in out and "every check agreed" in out


def test_threads_are_restored():
    ctl = harness.Threads(1)
    assert ctl.has_threadpoolctl  # a test dependency (pyproject's test extra)
    before = ctl._before
    with harness.Threads(2):
        pass
    assert [lib.num_threads for lib in ctl._libs] == [1] * len(before)
    ctl.restore()
    assert [lib.num_threads for lib in ctl._libs] == before


def test_bench_dispatch_quick_writes_plot(capsys, tmp_path):
    path = tmp_path / "overhead.png"
    results = bench.load("dispatch").main(["--quick", "--threads", "1", "--plot", str(path)])
    out = capsys.readouterr().out
    assert f"plot written to {path}" in out
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    labels = {(label, mode) for label, _, mode, _ in results}
    assert ("mul 8x8", "forward") in labels and ("matmul 32", "forward+backward") in labels
    assert all(m["tapegrad"] > 0 and m["numpy"] > 0 for *_, m in results)


def test_bench_mlp_and_blas_quick(capsys):
    assert cli.main(["bench", "mlp", "--quick", "--threads", "1"]) == 0
    out = capsys.readouterr().out
    assert "tapegrad ms/step" in out and "float32" in out
    assert cli.main(["bench", "mlp", "--breakdown", "--quick", "--threads", "1"]) == 0
    assert "cross_entropy" in capsys.readouterr().out
    assert cli.main(["bench", "blas", "--quick", "--threads", "1"]) == 0
    assert "GFLOP/s" in capsys.readouterr().out


def test_numpy_baseline_is_the_same_computation():
    """The benchmark's hand-written numpy step does exactly what the tape does."""
    X, y = spiral_data(60)
    params = init_params((2, 8, 3), seed=3)
    tape, ref = MLPTrainer(tapegrad, params, X, y), NumpyTrainer(params, X, y)
    for _ in range(5):
        np.testing.assert_allclose(tape.step().item(), ref.step(), rtol=1e-12)
    for p, q in zip(tape.params, ref.params):
        np.testing.assert_allclose(p.detach().numpy(), q, rtol=1e-12, atol=1e-15)


def test_spiral_data_and_init():
    X, y = spiral_data(512)
    assert X.shape == (512, 2) and X.dtype == np.float64
    assert np.bincount(y).tolist() == [171, 171, 170]
    assert np.abs(X).max() <= 1.0 + 1e-12
    W1, b1, W2, _ = init_params((2, 32, 3))
    assert W1.shape == (32, 2) and b1.shape == (32,) and W2.shape == (3, 32)
    assert np.abs(W1).max() <= 1 / np.sqrt(2) and np.abs(W2).max() <= 1 / np.sqrt(32)
