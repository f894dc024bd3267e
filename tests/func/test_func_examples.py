"""The function-transform examples in small mode: DP-SGD by vmap(grad), a PINN
with second derivatives w.r.t. the input, Newton's method with hessian/hvp."""
import subprocess
import sys

import numpy as np
import pytest
import torch

import tapegrad
from tapegrad.examples import dp_sgd, newton, pinn_poisson


def quiet(*a, **k):
    pass


def test_dp_sgd_per_sample_gradients_match_the_loop_and_torch_func():
    r = dp_sgd.train(steps=20, batch=32, log=quiet)
    assert r["max_diff_vs_loop"] < 1e-12
    assert r["losses"][-1] < r["losses"][0]
    # the per-sample gradients against torch.func.vmap(grad)
    model, params = dp_sgd.init_params(1)
    rng = np.random.default_rng(1)
    X, y = rng.standard_normal((16, 2)), rng.integers(0, 3, 16)
    got = dp_sgd.per_sample_grads(model, params, tapegrad.tensor(X), tapegrad.tensor(y))
    ref = torch.nn.Sequential(torch.nn.Linear(2, 32), torch.nn.ReLU(),
                              torch.nn.Linear(32, 3)).double()
    tp = {k: torch.tensor(v.numpy()) for k, v in params.items()}

    def loss_one(p, x, t):
        logits = torch.func.functional_call(ref, p, (x.unsqueeze(0),))
        return torch.nn.functional.cross_entropy(logits, t.unsqueeze(0))

    want = torch.func.vmap(torch.func.grad(loss_one), in_dims=(None, 0, 0))(
        tp, torch.tensor(X), torch.tensor(y))
    for k in want:
        np.testing.assert_allclose(got[k].numpy(), want[k].numpy(), rtol=1e-12, atol=1e-14)


def test_dp_sgd_private_gradient_clips_each_example():
    g = {"w": tapegrad.tensor(np.array([[3.0, 4.0], [0.3, 0.4]]))}
    tapegrad.manual_seed(0)
    out = dp_sgd.private_gradient(g, clip=1.0, noise=0.0, batch=2)["w"].numpy()
    np.testing.assert_allclose(out, (np.array([0.6, 0.8]) + np.array([0.3, 0.4])) / 2)


def test_pinn_second_derivatives_and_training():
    r = pinn_poisson.train(steps=40, points=16, log=quiet)
    assert r["checks"]["torch.func"] < 1e-12
    assert r["checks"]["central differences"] < 1e-5
    assert r["losses"][-1] < 0.1 * r["losses"][0]


def test_newton_converges_quadratically_and_cg_agrees():
    r = newton.run(steps=5, gd_steps=20, log=quiet)
    norms = [h[1] for h in r["newton"]]
    assert norms[-1] < 1e-10 and norms[3] < norms[2] ** 1.5  # quadratic convergence
    assert r["weights_diff"] < 1e-8
    assert r["hessian_vs_torch"] < 1e-12
    assert r["gd_grad_norm"] > 1e3 * norms[-1]


@pytest.mark.parametrize("name, args", [("dp_sgd", ["--steps", "5", "--batch", "16"]),
                                        ("pinn_poisson", ["--steps", "5", "--points", "8"]),
                                        ("newton", ["--steps", "3", "--gd-steps", "5"])])
def test_examples_run_as_modules(name, args):
    out = subprocess.run([sys.executable, "-W", "error::UserWarning", "-m",
                          f"tapegrad.examples.{name}", *args],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip()


def test_bench_func_quick():
    from tapegrad.bench import func as bench_func

    med, checks, with_torch = bench_func.run(batch=16, rounds=1)
    assert all(v < 1e-12 for v in checks.values()), checks
    text = bench_func.report(med, checks, with_torch, 16)
    assert "vmap(grad)" in text and "hvp/grad" in text
