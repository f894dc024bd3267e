"""Programs made of small ops, eager: one training step each, tapegrad vs PyTorch.

- ``gcn``: a 2-layer GCN on a random sparse graph (2000 nodes, ~10k edges, 32 features,
  float32, ``sparse_coo_tensor`` + ``sparse.mm``/``spmm``, Adam);
- ``lstmcell``: an ``LSTMCell`` loop over 50 time steps (batch 16, hidden 51, float64, a
  sine-sequence predictor, Adam);
- ``lstm``: an ``LSTM`` over 28 steps of 28 features (batch 64, hidden 64, float32, row-by-row
  MNIST, Adam).

Each (library, program, thread setting) runs in its own process, so that neither library's
thread pools, allocator or import state colour the other's timing. PyTorch runs with one
thread and with its default count, and the better is reported.

    python benchmarks/small_ops.py [--rounds 7] [--programs gcn,lstmcell,lstm] [--profile gcn]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

PROGRAMS = ("gcn", "lstmcell", "lstm")


def _gcn(lib, sparse_mm):
    """A 2-layer GCN step: relu(A @ (X W1)) -> A @ (H W2) -> cross-entropy."""
    import numpy as np
    rng = np.random.default_rng(0)
    n, edges, feat, hidden, classes = 2000, 10000, 32, 32, 7
    src, dst = rng.integers(0, n, edges), rng.integers(0, n, edges)
    rows = np.concatenate([src, dst, np.arange(n)])  # symmetric, with self loops
    cols = np.concatenate([dst, src, np.arange(n)])
    deg = np.bincount(rows, minlength=n).astype(np.float32)
    vals = (1.0 / np.sqrt(deg[rows] * deg[cols])).astype(np.float32)
    adj = lib.sparse_coo_tensor(lib.tensor(np.stack([rows, cols])), lib.tensor(vals),
                                (n, n), check_invariants=True).coalesce()
    x = lib.tensor(rng.standard_normal((n, feat)).astype(np.float32))
    y = lib.tensor(rng.integers(0, classes, n))
    w1 = lib.nn.Linear(feat, hidden)
    w2 = lib.nn.Linear(hidden, classes)
    opt = lib.optim.Adam(list(w1.parameters()) + list(w2.parameters()), lr=0.01)

    def step():
        opt.zero_grad()
        h = lib.relu(sparse_mm(adj, w1(x)))
        out = lib.spmm(adj, w2(h))
        loss = lib.nn.functional.cross_entropy(out, y)
        loss.backward()
        opt.step()
        return loss
    return step


def _lstmcell(lib):
    """An LSTMCell sine predictor step: two stacked cells over 50 steps, then a Linear."""
    import numpy as np
    rng = np.random.default_rng(0)
    batch, steps, hidden = 16, 50, 51
    lib.manual_seed(0)
    phase = rng.integers(-4 * 20, 4 * 20, (batch, 1))
    data = np.sin((np.arange(steps + 1) + phase) / 20.0)
    inp, target = lib.tensor(data[:, :-1]), lib.tensor(data[:, 1:])
    cell1 = lib.nn.LSTMCell(1, hidden).double()
    cell2 = lib.nn.LSTMCell(hidden, hidden).double()
    head = lib.nn.Linear(hidden, 1).double()
    params = [*cell1.parameters(), *cell2.parameters(), *head.parameters()]
    opt = lib.optim.Adam(params, lr=0.01)

    def step():
        opt.zero_grad()
        h1 = c1 = h2 = c2 = lib.zeros(batch, hidden, dtype=lib.float64)
        outs = []
        for t in range(steps):
            h1, c1 = cell1(inp[:, t:t + 1], (h1, c1))
            h2, c2 = cell2(h1, (h2, c2))
            outs.append(head(h2))
        loss = lib.nn.functional.mse_loss(lib.cat(outs, dim=1), target)
        loss.backward()
        opt.step()
        return loss
    return step


def _lstm(lib):
    """A row-by-row MNIST step: LSTM over 28 rows of 28 pixels, last hidden -> 10 classes."""
    import numpy as np
    rng = np.random.default_rng(0)
    lib.manual_seed(0)
    batch, hidden = 64, 64
    x = lib.tensor(rng.random((batch, 28, 28)).astype(np.float32))
    y = lib.tensor(rng.integers(0, 10, batch))
    lstm = lib.nn.LSTM(28, hidden, batch_first=True)
    head = lib.nn.Linear(hidden, 10)
    opt = lib.optim.Adam([*lstm.parameters(), *head.parameters()], lr=1e-3)

    def step():
        opt.zero_grad()
        out, _ = lstm(x)
        loss = lib.nn.functional.cross_entropy(head(out[:, -1]), y)
        loss.backward()
        opt.step()
        return loss
    return step


def build(name, program):
    if name == "torch":
        import torch as lib
    else:
        import tapegrad as lib
    if program == "gcn":
        return _gcn(lib, lib.sparse.mm)
    return {"lstmcell": _lstmcell, "lstm": _lstm}[program](lib)


def time_step(step, rounds, min_time=0.2):
    """Median over ``rounds`` of the mean step time in a batch of steps lasting >= min_time."""
    step(), step()  # warm-up: lazy state (Adam's moments, caches)
    t0, n = time.perf_counter(), 0
    while time.perf_counter() - t0 < min_time / 2:
        step()
        n += 1
    per = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(n):
            step()
        per.append((time.perf_counter() - t0) / n)
    return statistics.median(per)


def child(args):
    if args.lib == "torch":
        import torch
        if args.threads:
            torch.set_num_threads(args.threads)
    step = build(args.lib, args.program)
    if args.profile:
        import cProfile
        import pstats
        step(), step()
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(5):
            step()
        prof.disable()
        pstats.Stats(prof).sort_stats("tottime").print_stats(25)
        return
    print(json.dumps({"seconds": time_step(step, args.rounds)}))


def run_child(lib, program, rounds, threads=0):
    cmd = [sys.executable, __file__, "--child", "--lib", lib, "--program", program,
           "--rounds", str(rounds), "--threads", str(threads)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=os.environ).stdout
    return json.loads(out.strip().splitlines()[-1])["seconds"]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--programs", default=",".join(PROGRAMS))
    p.add_argument("--profile", choices=PROGRAMS, help="cProfile tapegrad's step instead")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--lib", default="tapegrad", help=argparse.SUPPRESS)
    p.add_argument("--program", default="gcn", help=argparse.SUPPRESS)
    p.add_argument("--threads", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.profile:
        args.program, args.lib = args.profile, "tapegrad"
        return child(args)
    if args.child:
        return child(args)
    print(f"{'program':<10} {'tapegrad ms':>12} {'torch ms':>10} {'ratio':>7}")
    for program in args.programs.split(","):
        tg = run_child("tapegrad", program, args.rounds)
        th = min(run_child("torch", program, args.rounds, threads=1),
                 run_child("torch", program, args.rounds))
        print(f"{program:<10} {tg * 1e3:12.3f} {th * 1e3:10.3f} {tg / th:7.2f}x", flush=True)


if __name__ == "__main__":
    main()
