"""Eager timings of the normalisation, pooling and activation ops at the model suite's sizes,
and the eager training step of the suite models that use them (docs/performance.md,
"Normalisation, pooling and activation ops")::

    python benchmarks/norm_act_ops.py                 # every op, float32 and float64
    python benchmarks/norm_act_ops.py silu batch_norm # ops whose label contains a word
    OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 python benchmarks/norm_act_ops.py --models
                                                      # eager CPU ms/step of the suite models

An op's forward is the call with its inputs requiring grad (the node recorded); its backward
is ``backward()`` from it, each timed alone. Each figure is the minimum over rounds of the
mean of a batch of calls (the machine is shared: the minimum is the least disturbed round).
To compare two trees, run the script once per tree with ``PYTHONPATH=<tree>/src``.
"""
import argparse
import time

import numpy as np

import tapegrad as T

F = T.nn.functional

CASES = [
    ("sigmoid", lambda x: T.sigmoid(x), [(256, 512)]),
    ("silu", lambda x: F.silu(x), [(256, 512)]),
    ("leaky_relu(0.1)", lambda x: F.leaky_relu(x, 0.1), [(256, 512)]),
    ("where(x > 0, x, y)", lambda x, y: T.where(x > 0, x, y), [(256, 512), (256, 512)]),
    ("relu6", lambda x: F.relu6(x), [(16, 32, 16, 16)]),
    ("batch_norm", lambda x, w, b: F.batch_norm(x, None, None, w, b, training=True),
     [(16, 16, 16, 16), (16,), (16,)]),
    ("batch_norm", lambda x, w, b: F.batch_norm(x, None, None, w, b, training=True),
     [(16, 32, 8, 8), (32,), (32,)]),
    ("group_norm(4)", lambda x, w, b: F.group_norm(x, 4, w, b), [(8, 16, 8, 8), (16,), (16,)]),
    ("max_pool2d(2)", lambda x: F.max_pool2d(x, 2), [(8, 8, 16, 16)]),
    ("adaptive_avg_pool2d(1)", lambda x: F.adaptive_avg_pool2d(x, 1), [(16, 32, 8, 8)]),
]

MODELS = ("resnet_bn", "mobilenet_dw", "mlp_wide_silu", "unet")
# a step's CPU time (BLAS pinned to one thread by the environment: OMP_NUM_THREADS=1 ...):
# on a shared machine the wall clock also counts the time other jobs hold the core
CLOCK = time.process_time


def time_op(fn, shapes, dtype, reps=20, rounds=15):
    """(forward ms, backward ms) of ``fn`` on standard normal inputs of ``shapes``: each call
    timed alone (the backward's graph is built outside its timing)."""
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal(s).astype(dtype) for s in shapes]
    probe = fn(*[T.tensor(a) for a in arrays])
    g = T.tensor(rng.standard_normal(tuple(probe.shape)).astype(dtype))
    fwd, bwd = [], []
    clock = time.perf_counter
    for _ in range(rounds):
        tf = tb = 0.0
        for _ in range(reps):
            xs = [T.tensor(a, requires_grad=True) for a in arrays]
            t0 = clock()
            y = fn(*xs)
            t1 = clock()
            y.backward(g)
            t2 = clock()
            tf += t1 - t0
            tb += t2 - t1
        fwd.append(tf / reps)
        bwd.append(tb / reps)
    return 1e3 * min(fwd), 1e3 * min(bwd)


def time_model(name, dtype, steps=5, rounds=7):
    """Eager ms per training step (zero_grad, loss, backward, optimizer step)."""
    from tapegrad.bench import suite_models

    T.set_default_dtype(getattr(T, dtype))
    try:
        spec = suite_models.SPECS[name]
        net = spec.build(T)
        batch = [T.tensor(b) if b.dtype.kind in "iu" else T.tensor(b.astype(dtype))
                 for b in spec.batch(np.random.default_rng(0))]
        opt = spec.optimizer(T, net.parameters())

        def step():
            opt.zero_grad()
            spec.loss(T, net, *batch).backward()
            opt.step()

        for _ in range(3):
            step()
        times = []
        for _ in range(rounds):
            t0 = CLOCK()
            for _ in range(steps):
                step()
            times.append((CLOCK() - t0) / steps)
        return 1e3 * min(times)
    finally:
        T.set_default_dtype(T.float32)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("only", nargs="*", help="ops whose label contains one of these words")
    p.add_argument("--models", action="store_true", help="the suite models' eager steps")
    args = p.parse_args(argv)
    for dtype in ("float32", "float64"):
        if args.models:
            for name in MODELS:
                print(f"{name:24s} {dtype:8s} {time_model(name, dtype):7.2f} ms/step", flush=True)
            continue
        for label, fn, shapes in CASES:
            if args.only and not any(w in label for w in args.only):
                continue
            fwd, bwd = time_op(fn, shapes, dtype)
            print(f"{label:24s} {str(shapes[0]):18s} {dtype:8s} forward {fwd:7.3f} ms  "
                  f"backward {bwd:7.3f} ms", flush=True)


if __name__ == "__main__":
    main()
