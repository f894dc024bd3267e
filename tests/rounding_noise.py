"""Tolerances for runs compared against PyTorch, from the run's own sensitivity to rounding.

An optimizer's trajectory amplifies last-ulp differences between tapegrad's and PyTorch's
kernels (fused multiply-adds, sqrt, tanh, BLAS reductions), by an amount that depends on the
run, and which entries differ depends on the CPU's SIMD paths. ``tolerance(run, error)``
measures the amplification: it reruns tapegrad with up to 1 ulp of random noise entering every
gradient and every update (``jitter``) and returns ``ulps`` times the largest error that
causes, so the bound says "as far apart as ``ulps`` ulps of rounding per step move this run".
"""
import numpy as np


def jitter(T, params, noise, grads=False, entrywise=False):
    """Add up to 1 ulp, at random, to each entry of every parameter (in place) or of every
    parameter's gradient (a new ``.grad``): 1 ulp of the entry itself for parameters (an
    update rounds each entry on its own) and for ``entrywise`` gradients, else 1 ulp of the
    gradient's largest entry (a reduction's rounding error scales with its largest terms).
    ``noise`` is a numpy Generator, or None for no noise."""
    if noise is None:
        return
    with T.no_grad():
        for p in params:
            a = (p.grad if grads else p).detach().numpy()
            ulp = np.spacing(np.max(np.abs(a)) if grads and not entrywise else np.abs(a))
            delta = T.tensor(ulp * noise.uniform(-1, 1, a.shape))
            if grads:
                p.grad = p.grad + delta
            else:
                p.add_(delta)


def tolerance(run, error, ulps, max_sensitivity):
    """``ulps`` times the largest ``error(noisy, clean)`` over three noisy runs.

    ``run(noise)`` returns the arrays to compare, passing ``noise`` on to ``jitter``. A run
    more sensitive than ``max_sensitivity`` amplifies rounding too much to be compared closely
    (change its settings rather than the bound): that fails here, so the tolerance stays tight.
    """
    clean = run(None)
    spread = max(error(a, b) for seed in range(3)
                 for a, b in zip(run(np.random.default_rng(seed)), clean))
    assert spread < max_sensitivity, f"ill-conditioned run: {spread:.3g} per ulp of noise"
    return ulps * spread
