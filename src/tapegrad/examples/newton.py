"""Newton's method on a small model: the Hessian by ``func.hessian``, Newton-CG by ``func.hvp``.

    python -m tapegrad.examples.newton [--steps 8]

The model is an L2-regularised logistic regression on cubic features of the two-class
spiral (a convex loss in 10 weights). Newton's step ``w -= H^-1 g`` uses the full Hessian
(``hessian``, i.e. ``jacfwd(jacrev(loss))``); Newton-CG solves ``H d = g`` by conjugate
gradients using only Hessian-vector products (``hvp``, forward-over-reverse: the Hessian is
never formed). Both converge quadratically, to the same weights, in a handful of steps, where
gradient descent at the largest stable step is still far away after many more.
"""
import argparse
import time

import numpy as np

import tapegrad
from tapegrad import func
from tapegrad.bench.spiral import spiral_data


def features(X):
    x, y = X[:, 0], X[:, 1]
    cols = [np.ones_like(x), x, y, x * x, x * y, y * y, x ** 3, x * x * y, x * y * y, y ** 3]
    return np.stack(cols, axis=1)


def make_loss(A, labels, lam=1e-2):
    a, t = tapegrad.tensor(A), tapegrad.tensor(labels.astype(np.float64))

    def loss(w):
        z = a @ w
        # mean of log(1 + exp(z)) - t z, stably, plus lam/2 |w|^2
        return (tapegrad.nn.functional.softplus(z) - t * z).mean() + 0.5 * lam * (w * w).sum()

    return loss


def newton(loss, w, steps, log):
    hist = []
    for _ in range(steps):
        g = func.grad(loss)(w)
        h = func.hessian(loss)(w)
        w = (w - tapegrad.linalg.solve(h, g)).detach()
        hist.append((float(loss(w)), float(func.grad(loss)(w).norm())))
        log(f"  newton     loss {hist[-1][0]:.12f}  |grad| {hist[-1][1]:.3e}")
    return w, hist


def conjugate_gradient(matvec, b, iters, tol=1e-12):
    x = tapegrad.zeros_like(b)
    r = b.clone()
    p = r.clone()
    rr = float((r * r).sum())
    for _ in range(iters):
        ap = matvec(p)
        alpha = rr / float((p * ap).sum())
        x = x + alpha * p
        r = r - alpha * ap
        rr_new = float((r * r).sum())
        if rr_new ** 0.5 < tol:
            break
        p = r + (rr_new / rr) * p
        rr = rr_new
    return x


def newton_cg(loss, w, steps, log):
    hist = []
    for _ in range(steps):
        g = func.grad(loss)(w)

        def hv(v):
            return func.hvp(loss, (w,), (v,))[1]

        d = conjugate_gradient(hv, g, iters=2 * w.shape[0])
        w = (w - d).detach()
        hist.append((float(loss(w)), float(func.grad(loss)(w).norm())))
        log(f"  newton-cg  loss {hist[-1][0]:.12f}  |grad| {hist[-1][1]:.3e}")
    return w, hist


def gradient_descent(loss, w, steps, lr):
    for _ in range(steps):
        w = (w - lr * func.grad(loss)(w)).detach()
    return w, float(func.grad(loss)(w).norm())


def run(steps=8, gd_steps=200, seed=0, log=print):
    X, y = spiral_data(256, 2, seed=seed)
    A = features(X / np.abs(X).max())
    loss = make_loss(A, y)
    w0 = tapegrad.zeros(A.shape[1], dtype=tapegrad.float64)
    t0 = time.perf_counter()
    log("Newton (func.hessian):")
    w_newton, hist_newton = newton(loss, w0, steps, log)
    log("Newton-CG (func.hvp):")
    w_cg, hist_cg = newton_cg(loss, w0, steps, log)
    seconds = time.perf_counter() - t0
    # the largest stable gradient-descent step is 2 / lambda_max(H); take 1 / lambda_max
    lam_max = float(np.linalg.eigvalsh(func.hessian(loss)(w0).numpy()).max())
    _, gd_grad = gradient_descent(loss, w0, gd_steps, 1.0 / lam_max)
    # the Hessian against PyTorch's, at the start (when installed)
    hess_diff = None
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a test dependency
        pass
    else:
        ta, tt = torch.tensor(A), torch.tensor(y.astype(np.float64))

        def tloss(w):
            z = ta @ w
            return (torch.nn.functional.softplus(z) - tt * z).mean() + 0.5e-2 * (w * w).sum()

        want = torch.func.hessian(tloss)(torch.zeros(A.shape[1], dtype=torch.float64))
        hess_diff = float(np.max(np.abs(func.hessian(loss)(w0).numpy() - want.numpy())))
    return {"newton": hist_newton, "newton_cg": hist_cg,
            "weights_diff": float((w_newton - w_cg).abs().max()), "gd_grad_norm": gd_grad,
            "gd_steps": gd_steps, "hessian_vs_torch": hess_diff, "seconds": seconds}


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m tapegrad.examples.newton",
                                description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--gd-steps", type=int, default=200)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    r = run(a.steps, a.gd_steps, a.seed)
    extra = "" if r["hessian_vs_torch"] is None else \
        f"; Hessian vs torch.func.hessian {r['hessian_vs_torch']:.1e}"
    print(f"Newton: |grad| {r['newton'][-1][1]:.1e} after {a.steps} steps (Newton-CG "
          f"{r['newton_cg'][-1][1]:.1e}, same weights to {r['weights_diff']:.1e}), "
          f"{r['seconds']:.2f} s; gradient descent: |grad| {r['gd_grad_norm']:.1e} after "
          f"{r['gd_steps']} steps{extra}")
    return r


if __name__ == "__main__":
    main()
