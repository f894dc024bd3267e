"""Value checks in compiled graphs: a check that reads a tensor's values and raises in eager
(a negative variance, a probability outside [0, 1], a distribution's constraint) is a
``check_values`` node, so every compiled call checks its own values, not only the traced one.
``passes.dce`` keeps such a node by the op record's ``check`` flag."""
import numpy as np
import pytest

import tapegrad as tg
import tapegrad.nn.functional as F
from tapegrad.compiler import passes, trace
from tapegrad.compiler.ir import Graph, Input, Node
from tapegrad.distributions import (Bernoulli, Categorical, Exponential, Geometric, Normal,
                                    Poisson)
from tapegrad.func import vmap
from tapegrad.ops.indexing import check_index, check_values
from tapegrad.ops.registry import Op
from helpers import error_of




def _t(*v):
    return tg.tensor(list(v))


def _gnll(x, t, v):
    return F.gaussian_nll_loss(x, t, v)


def _bce(x, t):
    return F.binary_cross_entropy(x, t)


def _normal(loc, scale, x):
    return Normal(loc, scale).log_prob(x).sum()


def _bernoulli(p, x):
    return Bernoulli(probs=p).log_prob(x).sum()


def _categorical(p, x):
    return Categorical(probs=p).log_prob(x).sum()


def _exponential(rate, x):
    return Exponential(rate).log_prob(x).sum()


def _poisson(rate, x):
    return Poisson(rate).log_prob(x).sum()


def _geometric(p, x):
    return Geometric(probs=p).log_prob(x).sum()


# name -> (fn, valid args, invalid args, the predicate its graph checks)
CASES = {
    "gaussian_nll var": (_gnll, (_t(.1, .5), _t(0., 1.), _t(1., 2.)),
                         (_t(.1, .5), _t(0., 1.), _t(1., -2.)), "nonnegative"),
    "bce input": (_bce, (_t(.2, .7), _t(0., 1.)), (_t(1.5, .7), _t(0., 1.)), "unit_interval"),
    "bce target": (_bce, (_t(.2, .7), _t(0., 1.)), (_t(.2, .7), _t(0., -.5)), "unit_interval"),
    "Normal scale": (_normal, (_t(0., 1.), _t(1., 2.), _t(.5, .5)),
                     (_t(0., 1.), _t(1., -2.), _t(.5, .5)), "positive"),
    "Bernoulli probs": (_bernoulli, (_t(.3, .6), _t(0., 1.)), (_t(.3, 1.6), _t(0., 1.)),
                        "unit_interval"),
    "Bernoulli support": (_bernoulli, (_t(.3, .6), _t(0., 1.)), (_t(.3, .6), _t(0., .5)),
                          "boolean"),
    "Categorical probs": (_categorical, (tg.tensor([[.3, .7]]), tg.tensor([1])),
                          (tg.tensor([[-.1, .8]]), tg.tensor([1])), "simplex"),
    "Exponential rate": (_exponential, (_t(1., 2.), _t(.5, .5)), (_t(1., 0.), _t(.5, .5)),
                         "positive"),
    "Poisson support": (_poisson, (_t(1., 2.), _t(0., 3.)), (_t(1., 2.), _t(0., 2.5)),
                        "nonnegative_integer"),
    # (its message shows only the failing entries)
    "Geometric probs": (_geometric, (_t(.3, .6), _t(0., 2.)), (_t(.5, 0.), _t(0., 2.)),
                        "positive"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_compiled_call_checks_its_own_values(case):
    fn, good, bad, _ = CASES[case]
    compiled = tg.compile(fn)
    for _ in range(3):  # traced, then replayed
        assert np.allclose(compiled(*good).numpy(), fn(*good).numpy(), rtol=1e-6)
    want = error_of(fn, *bad)
    assert want is not None, case  # eager rejects it
    assert error_of(compiled, *bad) == want, case  # same type and message
    assert np.allclose(compiled(*good).numpy(), fn(*good).numpy(), rtol=1e-6)


@pytest.mark.parametrize("case", list(CASES))
def test_first_compiled_call_with_bad_values_raises_as_eager(case):
    # the tracing call: the check op's own error, not dispatch's wrapping of it
    fn, good, bad, _ = CASES[case]
    compiled = tg.compile(fn)
    assert error_of(compiled, *bad) == error_of(fn, *bad)
    assert np.allclose(compiled(*good).numpy(), fn(*good).numpy(), rtol=1e-6)


@pytest.mark.parametrize("case", list(CASES))
def test_graph_holds_the_check_node(case):
    fn, good, _, predicate = CASES[case]
    text = str(trace(fn, *good))
    assert "check_values(" in text and repr(predicate) in text, text


def test_nan_passes_where_eager_lets_it():
    # gaussian_nll_loss and binary_cross_entropy let nan through (as PyTorch's checks)
    nan = float("nan")
    for fn, args in ((_gnll, (_t(.1, .5), _t(0., 1.), _t(1., nan))),
                     (_bce, (_t(.2, nan), _t(0., 1.)))):
        compiled = tg.compile(fn)
        for _ in range(3):
            assert error_of(compiled, *args) is None and error_of(fn, *args) is None


def test_gradient_flows_through_the_checked_variance():
    rng = np.random.default_rng(0)
    x, t, v = rng.standard_normal(4), rng.standard_normal(4), rng.uniform(.5, 2, 4)

    def grads(f):
        var = tg.tensor(v, requires_grad=True)
        f(tg.tensor(x), tg.tensor(t), var).backward()
        return var.grad.numpy()

    compiled = tg.compile(_gnll)
    want = grads(_gnll)
    for _ in range(3):  # the check's rule is the identity: bit-equal to eager
        assert np.array_equal(grads(compiled), want)


def test_check_ops_carry_the_check_flag():
    assert check_index.check and check_values.check
    assert not tg.ops.registry.REGISTRY["exp"].check


def test_dce_keeps_a_flagged_node_nothing_reads():
    """The flag, not the op's identity, keeps the node: an unregistered op with it stays, the
    same op without it goes."""
    def ident(x):
        return x

    flagged = Op(ident, "probe_check", 0, "none", False, False, False, False, False, False,
                 check=True)
    plain = Op(ident, "probe_plain", 0, "none", False, False, False, False, False, False)
    g = Graph()
    x = g.new_value((4,), np.float64, "x")
    g.inputs.append((x, Input("array", index=0)))
    for o in (flagged, plain):
        g.nodes.append(Node(o, o.name, [x], {}, [g.new_value((4,), np.float64)]))
    out = g.new_value((4,), np.float64)
    g.nodes.append(Node(tg.ops.registry.REGISTRY["exp"], "exp", [x], {}, [out]))
    g.outputs = [out]
    assert [n.name for n in passes.dce(g).nodes] == ["probe_check", "exp"]


def test_check_values_under_vmap_checks_every_example():
    def f(v):
        return F.gaussian_nll_loss(tg.zeros(3), tg.ones(3), v)

    good = tg.tensor(np.ones((4, 3)))
    assert vmap(f)(good).shape == (4,)
    bad = np.ones((4, 3))
    bad[2, 1] = -1.0  # one bad entry in one example
    with pytest.raises(ValueError, match="var has negative entry"):
        vmap(f)(tg.tensor(bad))


@pytest.mark.parametrize("in_dims", [0, 1])
def test_check_values_batch_rule(in_dims):
    """The op's batch rule (what a traced vmap runs): every example checked; a simplex is
    each example's last-dim vector wherever the batch dim is."""
    ok = np.array([[.2, .8], [.5, .5], [1., 0.]])  # 3 examples of 2 probabilities

    def f(p):
        return check_values(p, predicate="simplex", message="bad simplex")

    arr = ok if in_dims == 0 else ok.T
    out = vmap(f, in_dims=in_dims)(tg.tensor(arr))
    assert np.array_equal(out.numpy(), ok)
    wrong = ok.copy()
    wrong[1] = [.5, .6]
    arr = wrong if in_dims == 0 else wrong.T
    with pytest.raises(ValueError, match="^bad simplex$"):
        vmap(f, in_dims=in_dims)(tg.tensor(arr))


def test_compiled_vmap_checks_every_example_of_each_call():
    def f(v):
        return F.gaussian_nll_loss(tg.zeros(3), tg.ones(3), v)

    compiled = tg.compile(vmap(f))
    good = tg.tensor(np.ones((4, 3)))
    for _ in range(3):
        assert np.array_equal(compiled(good).numpy(), vmap(f)(good).numpy())
    assert "check_values(" in str(trace(vmap(f), good))
    bad = np.ones((4, 3))
    bad[2, 1] = -1.0
    assert error_of(compiled, tg.tensor(bad)) == error_of(vmap(f), tg.tensor(bad)) is not None
