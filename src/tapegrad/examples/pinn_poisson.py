"""A physics-informed network for the 1-D Poisson equation ``-u''(x) = pi^2 sin(pi x)``.

    python -m tapegrad.examples.pinn_poisson [--steps 1500] [--points 64]

On [0, 1] with ``u(0) = u(1) = 0`` the solution is ``sin(pi x)``. The network is
``u(x) = x (1 - x) N(x)`` (the boundary conditions hold by construction), N a 1-16-16-1 tanh
MLP; the loss is the mean squared residual ``u''(x) + pi^2 sin(pi x)`` at collocation points.
``u''`` is the second derivative of the network output with respect to its *input*:
``vmap(grad(grad(u, argnums=1), argnums=1))`` over the points, and training differentiates
that again with respect to the weights (``grad`` of a ``vmap`` of a ``grad`` of a ``grad``),
with Adam. The first step's second derivatives are checked against torch.func when PyTorch is
installed, and against central differences of the network.
"""
import argparse
import math
import time

import numpy as np

import tapegrad
from tapegrad import func


def init_params(seed, width=16):
    rng = np.random.default_rng(seed)

    def layer(i, o):
        bound = 1.0 / math.sqrt(i)
        return (tapegrad.tensor(rng.uniform(-bound, bound, (o, i))),
                tapegrad.tensor(rng.uniform(-bound, bound, (o,))))

    (w1, b1), (w2, b2), (w3, b3) = layer(1, width), layer(width, width), layer(width, 1)
    return {"w1": w1, "b1": b1, "w2": w2, "b2": b2, "w3": w3, "b3": b3}


def u(T, p, x):
    """The network at one point ``x`` (a 0-d tensor): ``x (1 - x) N(x)``."""
    F = T.nn.functional
    h = F.linear(x.reshape(1), p["w1"], p["b1"]).tanh()
    h = F.linear(h, p["w2"], p["b2"]).tanh()
    return x * (1 - x) * F.linear(h, p["w3"], p["b3"]).reshape(())


def u_xx(T, fn, p, xs):
    """d^2 u / dx^2 at each point: vmap over the points of grad(grad(u)) w.r.t. x."""
    d2 = fn.grad(fn.grad(lambda p, x: u(T, p, x), argnums=1), argnums=1)
    return fn.vmap(d2, in_dims=(None, 0))(p, xs)


def loss(T, fn, p, xs):
    f = math.pi ** 2 * (math.pi * xs).sin()
    return ((u_xx(T, fn, p, xs) + f) ** 2).mean()


def check_second_derivative(p, xs, eps=1e-4):
    """u'' by the transforms against central differences of u (and torch.func if present)."""
    got = u_xx(tapegrad, func, p, xs).numpy()
    x = xs.numpy()

    def at(v):
        return np.array([float(u(tapegrad, p, tapegrad.tensor(t))) for t in v])

    fd = (at(x + eps) - 2 * at(x) + at(x - eps)) / eps ** 2
    diffs = {"central differences": float(np.max(np.abs(got - fd)))}
    try:
        import torch
        import torch.func as tf
    except ImportError:  # pragma: no cover - torch is a test dependency
        return diffs
    tp = {k: torch.tensor(v.numpy()) for k, v in p.items()}
    want = u_xx(torch, tf, tp, torch.tensor(x)).numpy()
    diffs["torch.func"] = float(np.max(np.abs(got - want)))
    return diffs


def train(steps=1500, points=64, lr=1e-2, seed=0, log=print):
    params = init_params(seed)
    xs = tapegrad.tensor(np.linspace(0.0, 1.0, points + 2)[1:-1])
    checks = check_second_derivative(params, xs)
    grad_fn = func.grad_and_value(lambda p: loss(tapegrad, func, p, xs))
    m = {k: tapegrad.zeros_like(v) for k, v in params.items()}
    v = {k: tapegrad.zeros_like(v) for k, v in params.items()}
    b1, b2, eps = 0.9, 0.999, 1e-8
    losses = []
    t0 = time.perf_counter()
    for step in range(1, steps + 1):
        g, value = grad_fn(params)
        for k in params:  # Adam
            m[k] = b1 * m[k] + (1 - b1) * g[k]
            v[k] = b2 * v[k] + (1 - b2) * g[k] * g[k]
            mhat, vhat = m[k] / (1 - b1 ** step), v[k] / (1 - b2 ** step)
            params[k] = (params[k] - lr * mhat / (vhat.sqrt() + eps)).detach()
        losses.append(float(value))
        if step == 1 or step % 250 == 0 or step == steps:
            log(f"step {step:5d}  residual loss {losses[-1]:.3e}")
    seconds = time.perf_counter() - t0
    grid = np.linspace(0.0, 1.0, 201)
    pred = np.array([float(u(tapegrad, params, tapegrad.tensor(t))) for t in grid])
    err = float(np.max(np.abs(pred - np.sin(np.pi * grid))))
    return {"losses": losses, "max_error": err, "checks": checks, "seconds": seconds}


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m tapegrad.examples.pinn_poisson",
                                description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=1500)
    p.add_argument("--points", type=int, default=64)
    p.add_argument("--lr", type=float, default=1e-2)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    r = train(a.steps, a.points, a.lr, a.seed)
    checks = ", ".join(f"vs {k} {v:.1e}" for k, v in r["checks"].items())
    print(f"PINN, 1-D Poisson: {a.steps} Adam steps on {a.points} points — residual loss "
          f"{r['losses'][0]:.3e} -> {r['losses'][-1]:.3e}, max |u - sin(pi x)| "
          f"{r['max_error']:.2e}, {r['seconds']:.2f} s; u'' by vmap(grad(grad)): {checks}")
    return r


if __name__ == "__main__":
    main()
