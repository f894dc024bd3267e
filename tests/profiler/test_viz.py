"""tapegrad.viz: the tape node by node."""
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


# --- compiled graphs (tapegrad.compiler's IR), before and after the passes ------------------
def _traced():
    from tapegrad import compiler

    rng = np.random.default_rng(1)
    x = tapegrad.tensor(rng.standard_normal((64, 16)))
    w = tapegrad.tensor(rng.standard_normal((32, 16)))
    b = tapegrad.tensor(rng.standard_normal(32))
    return compiler.trace(lambda x, w, b: ((F.linear(x, w, b).relu() * 2.0 + 1.0).tanh()).sum(),
                          x, w, b)


def test_compiled_graph_rows_before_the_passes():
    from tapegrad.ops.registry import REGISTRY

    rows = viz.nodes(_traced())
    ops = [r["op"] for r in rows]
    assert ops == ["input"] * 3 + ["linear", "relu", "mul", "add", "tanh", "sum"]
    by_op = {r["op"]: r for r in rows}
    assert [r["grad_fn"] for r in rows[:3]] == ["arg 0", "arg 1", "arg 2"]
    lin = by_op["linear"]
    assert lin["flops"] == 2 * 64 * 32 * 16 and lin["shape"] == (64, 32)
    assert lin["bytes"] == (64 * 16 + 32 * 16 + 32 + 64 * 32) * 8
    relu = by_op["relu"]
    assert relu["flops"] == REGISTRY["relu"].flops * 64 * 32
    assert relu["bytes"] == 2 * 64 * 32 * 8 and relu["inputs"] == [lin["id"]]
    assert by_op["sum"]["flops"] == 64 * 32


def test_compiled_graph_after_fusion_moves_fewer_bytes():
    from tapegrad.compiler import passes
    from tapegrad.ops.registry import REGISTRY

    before = viz.nodes(_traced())
    after = viz.nodes(passes.optimize(_traced()))
    fused = [r for r in after if r["op"].startswith("fused[")]
    assert len(fused) == 1
    k = fused[0]
    body = k["op"][len("fused["):-1].split(",")
    assert body == ["add", "relu", "mul", "add", "tanh"]  # the bias add split off linear
    n = 64 * 32
    assert k["flops"] == sum(REGISTRY[name].flops for name in body) * n
    # only what crosses the kernel: the matmul's result and the bias in, the result out
    assert k["bytes"] == (n + 32 + n) * 8
    pointwise = [r for r in before if r["op"] in ("relu", "mul", "add", "tanh")]
    assert k["intensity"] > max(r["intensity"] for r in pointwise)
    assert k["bytes"] < sum(r["bytes"] for r in pointwise)
    text = viz.compare(_traced())
    assert "before" in text and "after" in text and "fuse" in text and "fused[" in text
    line = next(x for x in text.splitlines() if x.startswith("after"))
    assert line.split()[2] == "1"  # one kernel


def test_compiled_graph_broadcast_operand_is_read_once_and_dot(tmp_path):
    from tapegrad import compiler

    x = tapegrad.tensor(np.ones((64, 32)))
    b = tapegrad.tensor(np.ones(32), requires_grad=True)
    g = compiler.trace(lambda x, b: (x + b).sum(), x, b)
    add = next(r for r in viz.nodes(g) if r["op"] == "add")
    assert add["bytes"] == (64 * 32 + 32 + 64 * 32) * 8
    dot = viz.to_dot(g, str(tmp_path / "g.dot"))
    assert dot.count("->") == sum(len(r["inputs"]) for r in viz.nodes(g))
    assert '"%' in dot  # SSA names are quoted DOT ids
    assert "broadcast_to" in viz.table(g)
