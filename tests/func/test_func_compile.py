"""Function transforms composed with ``tapegrad.compile``, both ways:
``compile(vmap(grad(f)))`` (the transform traced into one graph) and ``vmap(grad(compile(f)))``
(the compiled function called under a transform: it runs eagerly and says why in ``breaks``,
which ``explain`` reports). Values against the uncompiled transform (1e-12, float64) and
torch.func, over repeated calls with new inputs (no frozen values)."""
import numpy as np
import pytest
import torch

import tapegrad
from tapegrad.func import grad, jacfwd, jacrev, jvp, vmap

_rng = np.random.default_rng(11)
W1N, B1N, W2N = _rng.standard_normal((3, 4)), _rng.standard_normal(4), _rng.standard_normal((4, 2))
W1, B1, W2 = tapegrad.tensor(W1N), tapegrad.tensor(B1N), tapegrad.tensor(W2N)
W1T, B1T, W2T = torch.tensor(W1N), torch.tensor(B1N), torch.tensor(W2N)


def loss(x):  # a small MLP's loss
    h = (x @ W1 + B1).tanh()
    return ((h @ W2) ** 2).sum()


def loss_t(x):
    h = torch.tanh(x @ W1T + B1T)
    return ((h @ W2T) ** 2).sum()


# name -> (transform of a tapegrad fn, transform of a torch fn, input shape)
CASES = {
    "vmap(grad)": (lambda g: vmap(grad(g)), lambda g: torch.func.vmap(torch.func.grad(g)),
                   (5, 3)),
    "grad(grad)": (lambda g: grad(lambda x: grad(g)(x).sum()),
                   lambda g: torch.func.grad(lambda x: torch.func.grad(g)(x).sum()), (3,)),
    "jacfwd(jacrev)": (lambda g: jacfwd(jacrev(g)),
                       lambda g: torch.func.jacfwd(torch.func.jacrev(g)), (3,)),
    "jvp(grad)": (lambda g: lambda x: jvp(grad(g), (x,), (x.cos(),))[1],
                  lambda g: lambda x: torch.func.jvp(torch.func.grad(g), (x,), (x.cos(),))[1],
                  (3,)),
    "vmap(jvp)": (lambda g: vmap(lambda x: jvp(g, (x,), (x.cos(),))[1]),
                  lambda g: torch.func.vmap(lambda x: torch.func.jvp(g, (x,), (x.cos(),))[1]),
                  (5, 3)),
}


def _check(fn, tg_transform, torch_transform, shape, seed):
    rng = np.random.default_rng(seed)
    for _ in range(3):  # new inputs each call: a replayed graph must not freeze values
        x = rng.standard_normal(shape)
        got = fn(tapegrad.tensor(x)).detach().numpy()
        eager = tg_transform(loss)(tapegrad.tensor(x)).detach().numpy()
        ref = torch_transform(loss_t)(torch.tensor(x)).numpy()
        np.testing.assert_allclose(got, eager, rtol=0, atol=1e-12)
        np.testing.assert_allclose(got, ref, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("name", list(CASES))
def test_compile_of_transform(name):
    tg_t, torch_t, shape = CASES[name]
    c = tapegrad.compile(tg_t(loss))
    _check(c, tg_t, torch_t, shape, 1)
    assert len(c.entries) == 1 and c.n_hits == 2  # one graph, replayed with new inputs
    assert not c.breaks


@pytest.mark.parametrize("name", list(CASES))
def test_transform_of_compiled(name):
    tg_t, torch_t, shape = CASES[name]
    c = tapegrad.compile(loss)
    _check(tg_t(c), tg_t, torch_t, shape, 2)
    # under jvp/vmap or grad-of-grad the compiled function runs eagerly and says why
    assert c.breaks and "runs eagerly" in c.breaks[0].reason
    assert not c.entries


def test_grad_of_compiled_still_compiles():
    c = tapegrad.compile(loss)
    rng = np.random.default_rng(3)
    for _ in range(3):
        x = rng.standard_normal(3)
        got = grad(c)(tapegrad.tensor(x)).numpy()
        np.testing.assert_allclose(got, grad(loss)(tapegrad.tensor(x)).numpy(), atol=1e-12)
        np.testing.assert_allclose(got, torch.func.grad(loss_t)(torch.tensor(x)).numpy(),
                                   atol=1e-12)
    assert len(c.entries) == 1 and c.n_hits == 2 and not c.breaks
    # outside a transform the same compiled function runs its graph
    c(tapegrad.tensor(rng.standard_normal(3)))
    assert not c.breaks


def test_explain_reports_transform_fallback():
    x = tapegrad.tensor(np.random.default_rng(4).standard_normal((5, 3)))
    out = tapegrad.compiler.explain(lambda x: vmap(grad(loss))(x))(x)
    assert out.graph_count == 1 and out.graph_break_count == 0
    c = tapegrad.compile(loss)
    vmap(grad(c))(x)
    assert "vmap" in c.breaks[0].reason and "test_func_compile.py" in c.breaks[0].where
