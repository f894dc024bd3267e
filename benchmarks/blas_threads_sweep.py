"""numpy matmul at 1 and 2 BLAS threads, by size, each count in a fresh process.

Chooses the grain size below which tapegrad runs a product single-threaded
(``tapegrad.backend.blas.SERIAL_WORK``); the figures are in docs/performance.md, "BLAS
threads". ``--load`` puts a busy loop on the machine while timing (as another user's job
would)::

    python benchmarks/blas_threads_sweep.py            # both counts, no added load
    python benchmarks/blas_threads_sweep.py --load     # both counts, one busy loop running
"""
import argparse
import json
import os
import subprocess
import sys
import time

SHAPES = [(64, 256, 256), (64, 784, 256), (128, 512, 512), (256, 256, 256),
          (256, 512, 512), (512, 512, 512), (512, 1024, 1024), (1024, 1024, 1024)]


def child(threads, dtype, budget):
    import numpy as np
    import tapegrad

    tapegrad.set_num_threads(threads)
    from tapegrad.backend import blas

    out = {}
    for m, k, n in SHAPES:
        a = np.ones((m, k), dtype)
        b = np.ones((k, n), dtype)
        np.matmul(a, b)
        reps = max(3, int(budget / max(2 * m * n * k / 20e9, 2e-6)))
        times = []
        for _ in range(5):
            t0 = time.perf_counter()
            for _ in range(reps):
                np.matmul(a, b)
            times.append((time.perf_counter() - t0) / reps)
        out[f"{m}x{k}x{n}"] = sorted(times)[2]
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
        out[key] = sorted(times)[3]
    blas.SERIAL_WORK = saved
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--load", action="store_true", help="one busy-loop process while timing")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--budget", type=float, default=0.02, help="seconds per timed batch")
    p.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
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
    print("| m x k x n | 1 thread us | 2 threads us | 2 threads speed-up |")
    print("|---|---:|---:|---:|")
    for key in results[1][0]:
        t1, t2 = results[1][0][key], results[2][0][key]
        print(f"| {key} | {t1 * 1e6:.1f} | {t2 * 1e6:.1f} | {t1 / t2:.2f}x |")


if __name__ == "__main__":
    main(sys.argv[1:])
