"""numpy matmul at 1 and 2 BLAS threads, by size, each count in a fresh process.

Chooses the bounds below which tapegrad runs a product single-threaded
(``tapegrad.backend.blas.SERIAL_WORK`` in multiply-adds, ``SERIAL_BYTES`` in bytes moved);
the figures are in docs/performance.md, "BLAS threads". The square-ish shapes sweep the work
at a few MB; the skinny ones (a width of 2 or 3, as a narrow network's first and last layers
and their gradients) sweep the bytes moved at little work. ``--load`` puts a busy loop on the machine while timing (as another user's job
would)::

    python benchmarks/blas_threads_sweep.py            # both counts, no added load
    python benchmarks/blas_threads_sweep.py --load     # both counts, one busy loop running
    python benchmarks/blas_threads_sweep.py --step 3   # the scale step, with/without bytes rule

``--step R`` times ``tapegrad bench scale``'s step (spiral MLP, H=2048, batch 4096, float64,
``F.relu(F.linear(...))``) at the default thread count in fresh processes, R rounds
alternating the default policy with ``TAPEGRAD_BLAS_SERIAL_BYTES`` set past any product (the
work bound alone).
"""
import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

SHAPES = [(64, 256, 256), (64, 784, 256), (128, 512, 512), (256, 256, 256),
          (256, 512, 512), (512, 512, 512), (512, 1024, 1024), (1024, 1024, 1024)]
# (m, k, n) with k or n tiny: memory-bound, MB moved grows 4x a row at a few FLOPs per byte
SKINNY = [(m, 2, n) for m, n in ((512, 256), (1024, 512), (2048, 1024), (4096, 2048),
                                 (8192, 4096))] \
    + [(m, k, 3) for m, k in ((512, 256), (1024, 512), (2048, 1024), (4096, 2048),
                              (8192, 4096))]


def _bytes(m, k, n, itemsize):
    return (m * k + k * n + m * n) * itemsize


def child(threads, dtype, budget):
    import tapegrad

    tapegrad.set_num_threads(threads)
    from tapegrad.backend import blas

    out = {}
    for m, k, n in SHAPES + SKINNY:
        a = np.ones((m, k), dtype)
        b = np.ones((k, n), dtype)
        np.matmul(a, b)
        # ~20 GFLOP/s or ~5 GB/s, whichever is slower, to size a batch of ``budget`` seconds
        guess = max(2 * m * n * k / 20e9, _bytes(m, k, n, a.itemsize) / 5e9, 2e-6)
        reps = max(3, int(budget / guess))
        times = []
        for _ in range(5):
            t0 = time.perf_counter()
            for _ in range(reps):
                np.matmul(a, b)
            times.append((time.perf_counter() - t0) / reps)
        out[f"{m}x{k}x{n}"] = (sorted(times)[2], _bytes(m, k, n, a.itemsize))
    # the switch itself: the serial path's extra cost on a product just above OpenBLAS's own
    # single-thread limit, both at one thread so only the switch differs
    a, b = np.ones((64, 64), dtype), np.ones((64, 128), dtype)
    saved, blas.SERIAL_WORK = blas.SERIAL_WORK, 1 << 40
    tapegrad.set_num_threads(threads)
    for fn, key in ((np.matmul, "raw 64x64x128"), (blas.matmul, "switched 64x64x128")):
        times = []
        for _ in range(7):
            t0 = time.perf_counter()
            for _ in range(2000):
                fn(a, b)
            times.append((time.perf_counter() - t0) / 2000)
        out[key] = (sorted(times)[3], 0)
    blas.SERIAL_WORK = saved
    return out


def step_child(steps=3, rounds=7):
    """ms per step of the scale step in this process, median of ``rounds`` runs of ``steps``."""
    import tapegrad
    from tapegrad.bench.scale import BATCH, HIDDEN
    from tapegrad.bench.spiral import MLPTrainer, init_params, spiral_data

    X, y = spiral_data(BATCH, dtype=np.float64)
    trainer = MLPTrainer(tapegrad, init_params((2, HIDDEN, 3), seed=1, dtype=np.float64), X, y)
    trainer.run(2)
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        trainer.run(steps)
        times.append((time.perf_counter() - t0) / steps * 1e3)
    return sorted(times)[rounds // 2]


def step(rounds):
    policies = {"work and bytes (default)": {},
                "work only": {"TAPEGRAD_BLAS_SERIAL_BYTES": str(1 << 62)}}
    print("| round | policy | loadavg at start | ms/step |")
    print("|---:|---|---:|---:|")
    for r in range(rounds):
        for name, env in (policies.items() if r % 2 == 0 else reversed(policies.items())):
            load = os.getloadavg()[0]
            out = subprocess.run([sys.executable, __file__, "--step-child"],
                                 env={**os.environ, **env}, capture_output=True, text=True,
                                 check=True)
            print(f"| {r + 1} | {name} | {load:.2f} | {float(out.stdout):.1f} |", flush=True)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--load", action="store_true", help="one busy-loop process while timing")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--budget", type=float, default=0.02, help="seconds per timed batch")
    p.add_argument("--step", type=int, default=None, metavar="ROUNDS",
                   help="time the scale step under both policies instead")
    p.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--step-child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.step_child:
        print(step_child())
        return
    if args.step is not None:
        step(args.step)
        return
    if args.child is not None:
        print(json.dumps(child(args.child, args.dtype, args.budget)))
        return
    load = None
    if args.load:
        load = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        results = {}
        for threads in (1, 2):
            start = os.getloadavg()[0]
            r = subprocess.run([sys.executable, __file__, "--child", str(threads), "--dtype",
                                args.dtype, "--budget", str(args.budget)],
                               capture_output=True, text=True, check=True)
            results[threads] = (json.loads(r.stdout), start)
    finally:
        if load is not None:
            load.kill()
            load.wait()
    print(f"{args.dtype}, load: {'one busy loop' if args.load else 'none added'}; "
          f"loadavg at start: 1 thread {results[1][1]:.2f}, 2 threads {results[2][1]:.2f}")
    print("| m x k x n | MB moved | 1 thread us | 2 threads us | 2 threads speed-up |")
    print("|---|---:|---:|---:|---:|")
    for key in results[1][0]:
        (t1, nbytes), (t2, _) = results[1][0][key], results[2][0][key]
        print(f"| {key} | {nbytes / 1e6:.1f} | {t1 * 1e6:.1f} | {t2 * 1e6:.1f} | {t1 / t2:.2f}x |")


if __name__ == "__main__":
    main(sys.argv[1:])
