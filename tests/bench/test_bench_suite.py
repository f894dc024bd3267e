"""``tapegrad bench suite``: every suite model trains under tapegrad as it does under PyTorch
from the same weights, and the CLI runs a model end to end and prints its table. No timing
is asserted."""
import argparse
import json

import numpy as np
import pytest
import torch

import tapegrad
from tapegrad.bench import suite
from tapegrad.bench.suite_models import SPECS

# float64, two full steps (forward, loss, backward, optimizer) from identical weights. The two
# libraries round every op to within an ulp (1.1e-16) but sum in different orders (BLAS
# blocking, pairwise vs sequential reductions), so an op's result may differ by ~n * 1.1e-16
# relative, n the reduction length (<= a few thousand here): ~1e-13, carried through a few
# dozen ops forward and back, twice. Parameters are compared against the model's largest
# weight (``suite.max_rel_diff``): Adam turns a gradient that is rounding noise (a key bias)
# into a move of lr * noise / eps, ~1e-11 at most here. 1e-10 leaves that margin; a wrong
# gradient rule or op moves losses and weights by far more (>= 1e-4 relative).
RTOL = 1e-10


@pytest.mark.parametrize("name", list(SPECS))
def test_eager_step_matches_torch(name):
    ours = suite.run_steps(tapegrad, name, "float64", 2)
    ref = suite.run_steps(torch, name, "float64", 2)
    assert suite.max_rel_diff(*ours, *ref) <= RTOL, name
    assert ours[0][1] != ours[0][0]  # the first step moved the weights
    init = suite.initial_state(name)
    moved = [k for k, v in ours[1].items() if not np.array_equal(v, init[k])]
    assert moved, f"{name}: no parameter changed"


# Every suite model's step traces to one graph without breaks: library code (layers, losses)
# computes through ops, so tapegrad.compile never falls back to eager for these families.
@pytest.mark.parametrize("name", list(SPECS))
def test_compiles_to_one_graph(name):
    step, _, _, inputs = suite.make_step(tapegrad, name, "float64")
    ex = tapegrad.compiler.explain(step)(*inputs)
    assert (ex.graph_count, ex.graph_break_count) == (1, 0), [b.reason for b in ex.break_reasons]


@pytest.mark.parametrize("name", ["seq2seq_transformer", "resnet_bn", "mobilenet_dw",
                                  "mlp_elu_layernorm"])
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_compiled_step_is_bitwise_eager(name, dtype):
    # (the models whose layers -- a causal-mask check, adaptive pooling, relu6, huber_loss --
    # used to run eagerly under compile: four steps, so generated code runs twice)
    eager = suite.run_steps(tapegrad, name, dtype, 4)
    compiled = suite.run_steps(tapegrad, name, dtype, 4, wrap=tapegrad.compile)
    assert eager[0] == compiled[0]
    for k, v in eager[1].items():
        assert np.array_equal(v, compiled[1][k]), k


def test_vit_compiled_step_is_bitwise_eager():
    # the patch embedding's bias gradient reaches the conv through flatten(2).transpose(1, 2):
    # a strided sum that the compiled step must add in eager's order
    eager = suite.run_steps(tapegrad, "vit_mha", "float64", 5)
    compiled = suite.run_steps(tapegrad, "vit_mha", "float64", 5, wrap=tapegrad.compile)
    assert eager[0] == compiled[0]
    for k, v in eager[1].items():
        assert np.array_equal(v, compiled[1][k]), k


def test_max_rel_diff_is_relative_to_the_model_scale():
    a = {"w": np.array([1.0, 2.0]), "key_bias": np.array([1e-12])}
    b = {"w": np.array([1.0, 2.0]), "key_bias": np.array([2e-12])}
    # 1e-12 apart on a model whose largest weight is 2: 5e-13, not 50% of the key bias
    assert suite.max_rel_diff([1.0], a, [1.0], b) == pytest.approx(5e-13)
    assert suite.max_rel_diff([1.0], a, [2.0], b) == pytest.approx(0.5)


def test_rows_report_worker_errors_and_geomeans_skip_them():
    ok = {"model": "m", "dtype": "float64", "graphs": 1, "breaks": 0, "bitwise": True,
          "compiled_rel_diff": 0.0, "compile_warm_s": 0.1, "compile_cold_s": 1.0,
          "tapegrad eager": 0.004, "tapegrad compiled": 0.002, "PyTorch eager": 0.008,
          "torch_threads": 1, "torch_rel_diff": 1e-16}
    bad = {"model": "n", "dtype": "float32", "error": "worker exit 1: boom"}
    rows = suite.rows_of([ok, bad])
    assert rows[0][:4] == ["m", "float64", "1/0", "bitwise"]
    assert rows[0][5:8] == ["4.00", "2.00", "8.00 (1)"]
    assert rows[0][9:12] == ["4.00x", "2.00x", "2.00x"]
    assert rows[1][-1] == "worker exit 1: boom"
    g = suite.geomeans([ok, bad])
    assert g["tapegrad compiled vs PyTorch eager"] == (pytest.approx(4.0), 1)
    # each library's figure with the thread count that gave it
    ok.update({"tapegrad eager threads": 2, "tapegrad compiled threads": 1})
    assert suite.rows_of([ok])[0][5:8] == ["4.00 (2)", "2.00 (1)", "8.00 (1)"]


def test_cli_quick_runs_one_model(tmp_path, capsys):
    out_json = tmp_path / "suite.json"
    assert suite.main(["--quick", "--models", "gcn_dense", "--dtype", "float64",
                       "--json", str(out_json)]) == 0
    out = capsys.readouterr().out
    assert "| model | dtype | graphs/breaks |" in out
    row = next(line for line in out.splitlines() if line.startswith("| gcn_dense | float64"))
    assert "error" not in row
    assert "geometric mean, tapegrad compiled vs PyTorch eager" in out
    (res,) = json.loads(out_json.read_text())
    assert (res["graphs"], res["breaks"]) == (1, 0)
    assert res["compiled_rel_diff"] <= RTOL
    for key in ("tapegrad eager", "tapegrad compiled", "PyTorch eager"):
        assert res[key] > 0
    # tapegrad timed unpinned (the BLAS's default count) and at one thread, as PyTorch is
    default = tapegrad.get_num_threads()
    assert res["tapegrad eager threads"] in {default, 1}
    assert res["tapegrad compiled threads"] in {default, 1}
    assert f"numpy's BLAS default ({default};" in out


def test_worker_times_tapegrad_at_the_default_count_and_at_one(monkeypatch):
    """The worker's tapegrad cases: numpy's BLAS left at its default count and at one (the
    default's count is read before anything pins it); ``--threads N`` times N alone."""
    seen = []
    real = suite.harness.blas_cases

    def record(label, make_fn, counts):
        seen.append((label, list(counts)))
        return real(label, make_fn, counts)

    monkeypatch.setattr(suite.harness, "blas_cases", record)
    monkeypatch.setattr(suite.harness, "interleave", lambda cases, *a, **k: [
        c.times.extend([1e-3, 1e-3]) for c in cases])
    default = tapegrad.get_num_threads()
    args = argparse.Namespace(
        worker=("gcn_dense", "float64"), quick=True, no_torch=True, inductor=False,
        threads=None, rounds=1, min_time=0.0)
    suite.worker(args)
    assert seen == [("tapegrad eager", [default, 1]), ("tapegrad compiled", [default, 1])]
    seen.clear()
    args.threads = 3
    suite.worker(args)
    assert seen == [("tapegrad eager", [3]), ("tapegrad compiled", [3])]
    assert tapegrad.get_num_threads() == default  # the pin is undone on leaving


def test_cli_rejects_unknown_model():
    with pytest.raises(SystemExit):
        suite.main(["--models", "no_such_model"])
