"""A small float32 Adam MLP, timed in its own process: the BLAS thread count's effect.

784 -> 256 -> 256 -> 10 with ReLU and cross-entropy, Adam at lr 1e-3, batch 64 (the
figures in docs/performance.md, "BLAS threads", come from this script). Each run is one
fresh process, so nothing another measurement left warm (a spinning BLAS worker, a cache)
flatters it::

    python benchmarks/adam_mlp_threads.py                  # tapegrad's default policy
    python benchmarks/adam_mlp_threads.py --threads 1      # BLAS pinned to 1 thread
    python benchmarks/adam_mlp_threads.py --threads 2 --load   # a busy loop on another core

``--load`` starts one busy-looping process for the duration of the timing (load on the
other core, as another user's job would put there) and stops it afterwards.
"""
import argparse
import os
import subprocess
import sys
import time

import numpy as np


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--threads", type=int, default=None,
                   help="tapegrad.set_num_threads(N) first (default: tapegrad's own policy)")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--repeats", type=int, default=5, help="timed runs of --steps; median kept")
    p.add_argument("--load", action="store_true", help="busy-loop process during the timing")
    args = p.parse_args(argv)

    import tapegrad as torch
    import tapegrad.nn as nn
    import tapegrad.nn.functional as F

    if args.threads is not None:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(784, args.width), nn.ReLU(),
                          nn.Linear(args.width, args.width), nn.ReLU(),
                          nn.Linear(args.width, 10))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    rng = np.random.default_rng(0)
    X = torch.tensor(rng.standard_normal((args.batch, 784)).astype(np.float32))
    y = torch.tensor(rng.integers(0, 10, args.batch))

    def run(steps):
        for _ in range(steps):
            opt.zero_grad()
            F.cross_entropy(model(X), y).backward()
            opt.step()

    run(20)  # warm-up
    load = None
    if args.load:
        load = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        time.sleep(0.3)
    try:
        times = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            run(args.steps)
            times.append((time.perf_counter() - t0) / args.steps)
    finally:
        if load is not None:
            load.kill()
            load.wait()
    times.sort()
    median = times[len(times) // 2]
    print(f"adam mlp 784-{args.width}-{args.width}-10 float32 batch {args.batch}: "
          f"{median * 1e3:.3f} ms/step (median of {args.repeats} x {args.steps} steps; "
          f"min {times[0] * 1e3:.3f}, max {times[-1] * 1e3:.3f}) | "
          f"num_threads {torch.get_num_threads()} | load {'busy loop' if load else 'none'} | "
          f"loadavg at start {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main(sys.argv[1:])
