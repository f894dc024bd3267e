"""tapegrad.viz: the tape node by node (issue 12)."""
import shutil

import numpy as np
import pytest

import tapegrad
import tapegrad.nn.functional as F
from tapegrad import viz


def _graph():
    rng = np.random.default_rng(0)
    x = tapegrad.tensor(rng.standard_normal((8, 4)))
    w = tapegrad.tensor(rng.standard_normal((3, 4)), requires_grad=True)
    b = tapegrad.tensor(rng.standard_normal(3), requires_grad=True)
    return F.linear(x, w, b).relu().sum()


def test_nodes_carry_the_numbers():
    rows = {r["op"]: r for r in viz.nodes(_graph())}
    lin, relu = rows["linear"], rows["relu"]
    assert (lin["grad_fn"], lin["shape"], lin["dtype"]) == ("LinearBackward", (8, 3), "float64")
    assert lin["flops"] == 2 * 8 * 3 * 4
    assert lin["saved_bytes"] == 8 * 4 * 8  # only x: w's gradient reads x, x wants none
    assert relu["saved_bytes"] == 8 * 3 * 8 and relu["flops"] == 24
    assert relu["intensity"] == pytest.approx(24 / (2 * 24 * 8))
    assert relu["inputs"] == [lin["id"]]
    assert sum(r["op"] == "leaf" for r in viz.nodes(_graph())) == 2


def test_table_and_dot(tmp_path):
    text = viz.table(_graph())
    for word in ("LinearBackward", "ReluBackward", "SumBackward", "AccumulateGrad", "(8, 3)"):
        assert word in text
    dot = viz.to_dot(_graph(), str(tmp_path / "g.dot"))
    assert dot.startswith("digraph") and dot.count("->") == 4
    assert open(tmp_path / "g.dot").read() == dot


def test_render(tmp_path):
    path = str(tmp_path / "g.svg")
    if shutil.which("dot") is None:
        with pytest.raises(RuntimeError, match="dot"):
            viz.render(_graph(), path)
        assert (tmp_path / "g.dot").exists()
    else:
        assert open(viz.render(_graph(), path)).read().lstrip().startswith("<")
