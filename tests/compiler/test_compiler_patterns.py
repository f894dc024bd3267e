"""compiler.patterns: patterns traced from functions, matched by structure in a graph."""
import numpy as np
import pytest

import tapegrad
from tapegrad.compiler import kernels_norm_softmax, passes, patterns
from tapegrad.compiler.ir import evaluate
from tapegrad.compiler.tracer import trace

CLEAN = [("simplify", passes.simplify), ("cse", passes.cse), ("dce", passes.dce)]


def _graph(fn, *arrays):
    g = trace(fn, *[tapegrad.tensor(a) for a in arrays])
    return passes.optimize(g, CLEAN)


def _scaled_shift(x, y):
    """The pattern: (x - y) * 2.5 + 0.125, with 2.5 a symbol."""
    return (x - y) * 2.5 + 0.125


def _examples(rank):
    shape = (3,) * (rank - 1) + (7,)
    return [([tapegrad.ones(shape), tapegrad.ones(shape)], {"k": 2.5})]


def _pattern(guard=lambda b: True):
    return patterns.Pattern("scaled_shift", _scaled_shift, _examples,
                            params=lambda b: {"k": b["k"]}, guard=guard)


def _arrays(shape=(4, 5), seed=0):
    r = np.random.default_rng(seed)
    return r.standard_normal(shape), r.standard_normal(shape)


def test_a_pattern_matches_any_value_and_binds_its_symbols():
    def f(a, b):
        return ((a.exp() - b) * 3.0 + 0.125).sum()

    a, b = _arrays()
    g = _graph(f, a, b)
    out = _pattern().rewrite(g)
    fused = [n for n in out.nodes if n.name == "scaled_shift"]
    assert len(fused) == 1 and fused[0].params == {"k": 3.0}
    assert [m.name for m in fused[0].meta["nodes"]] == ["sub", "mul", "add"]
    assert len(out.nodes) == len(g.nodes) - 2
    # the fused node's reference implementation runs the matched nodes: the same bits
    (want,), _ = evaluate(g, [a, b])
    (got,), _ = evaluate(out, [a, b])
    assert got.tobytes() == want.tobytes()


def test_literals_that_are_not_symbols_must_be_equal():
    a, b = _arrays()
    g = _graph(lambda a, b: (a - b) * 3.0 + 0.25, a, b)  # 0.25 is not the pattern's 0.125
    assert _pattern().rewrite(g) is g


def test_a_symbol_binds_once_for_all_its_occurrences():
    def pat(x, y):
        return (x - y) * 2.5 + 2.5

    def ex(rank):
        return [([tapegrad.ones((3, 7)), tapegrad.ones((3, 7))], {"k": 2.5})]

    p = patterns.Pattern("twice", pat, ex)
    a, b = _arrays()
    assert p.rewrite(_graph(lambda a, b: (a - b) * 3.0 + 4.0, a, b)).count("twice") == 0
    assert p.rewrite(_graph(lambda a, b: (a - b) * 3.0 + 3.0, a, b)).count("twice") == 1


def test_no_match_when_an_intermediate_is_read_outside():
    def f(a, b):
        d = a - b
        return (d * 3.0 + 0.125).sum() + d.sum()  # d is read outside the pattern

    g = _graph(f, *_arrays())
    assert _pattern().rewrite(g).count("scaled_shift") == 0


def test_the_guard_can_refuse_a_match():
    a, b = _arrays()
    g = _graph(lambda a, b: (a - b) * 3.0 + 0.125, a, b)
    assert _pattern(guard=lambda bound: bound["k"] > 5).rewrite(g) is g
    assert _pattern(guard=lambda bound: bound["k"] < 5).rewrite(g).count("scaled_shift") == 1


def test_the_pattern_is_specialised_per_rank():
    p = _pattern()
    for shape in [(6,), (2, 3, 4), (2, 1, 3, 5)]:
        a, b = _arrays(shape)
        g = _graph(lambda a, b: (a - b) * 3.0 + 0.125, a, b)
        assert p.rewrite(g).count("scaled_shift") == 1
    assert set(p._traced) >= {1, 3, 4}


def test_two_matches_in_one_graph():
    def f(a, b):
        return (a - b) * 3.0 + 0.125, (b - a) * 4.0 + 0.125

    g = _graph(f, *_arrays())
    assert _pattern().rewrite(g).count("scaled_shift") == 2


def test_operand_order_is_part_of_the_structure():
    a, b = _arrays()
    g = _graph(lambda a, b: 3.0 * (a - b) + 0.125, a, b)  # mul(3.0, d): not mul(d, 2.5)
    assert _pattern().rewrite(g) is g


@pytest.mark.parametrize("shape", [(5, 9), (2, 4, 6)])
def test_layer_norm_and_softmax_rules_fuse_from_their_own_rules(shape):
    """The LayerNorm and softmax gradient passes are patterns traced from the ops' rules:
    a step through either op gets its fused node, at any rank and row length."""
    r = np.random.default_rng(1)
    x = tapegrad.tensor(r.standard_normal(shape), requires_grad=True)
    w = tapegrad.tensor(r.standard_normal(shape[-1:]), requires_grad=True)
    b = tapegrad.tensor(r.standard_normal(shape[-1:]), requires_grad=True)

    def step(x, w, b):
        y = tapegrad.nn.functional.layer_norm(x, shape[-1:], w, b, eps=1e-3)
        s = tapegrad.softmax(y * 1.5, dim=-1)
        (s * s).sum().backward()
        return s

    g = trace(step, x, w, b)
    g = passes.optimize(g, CLEAN)
    assert kernels_norm_softmax.fuse_layer_norm_backward(g).count("layer_norm_backward") == 1
    assert kernels_norm_softmax.fuse_softmax_backward(g).count("softmax_backward") == 1
    fused = kernels_norm_softmax.fuse_layer_norm_backward(g)
    node = next(n for n in fused.nodes if n.name == "layer_norm_backward")
    assert node.params == {"axes": (len(shape) - 1,), "eps": 1e-3}
    assert len(node.outputs) == 3  # the bias's gradient too


def test_the_ir_s_reader_and_producer_index():
    """``ir.readers``/``ir.producers``: the one index the fusing passes match against."""
    from tapegrad.compiler import ir

    a, b = _arrays()
    g = _graph(lambda a, b: ((a * a) - b, b.exp()), a, b)
    x, y = (v for v, _ in g.inputs)
    mul, sub, exp = g.nodes
    readers, made = ir.readers(g), ir.producers(g)
    assert readers[id(x)] == [mul]  # mul(x, x) reads x once
    assert readers[id(y)] == [sub, exp]
    assert readers[id(sub.outputs[0])] == [ir.OUTSIDE] == readers[id(exp.outputs[0])]
    assert made[id(mul.outputs[0])] is mul and id(x) not in made
