"""BLAS-bound: one 1024-wide Linear layer, batch 1024, forward and backward.

``out = F.linear(x, W, b)`` then ``out.backward(g)`` with ``x``, ``W`` and ``b`` requiring
grad: three (1024, 1024, 1024) matmuls, 6.4 GFLOP per step. Compared with PyTorch (same
code) and with numpy doing the same three matmuls by hand, and reported as a fraction of
numpy's own square-matmul rate (the BLAS peak tapegrad can reach).
"""
import argparse
import functools
import importlib
import os

import numpy as np

import tapegrad
from tapegrad.bench import harness as H

WIDTH = 1024
BATCH = 1024
QUICK_WIDTH = 128


def flops(batch, width):
    return 3 * 2 * batch * width * width


def framework_case(T, x, w, b, g):
    """The same step for ``T = tapegrad`` and ``T = torch``."""
    F = importlib.import_module(T.__name__ + ".nn.functional")
    X = T.tensor(x, requires_grad=True)
    W = T.tensor(w, requires_grad=True)
    B = T.tensor(b, requires_grad=True)
    G = T.tensor(g)

    def fn():
        F.linear(X, W, B).backward(G)
        X.grad = W.grad = B.grad = None
    return fn


def numpy_case(x, w, b, g):
    def fn():
        out = x @ w.T
        out += b
        g @ w
        g.T @ x
        g.sum(axis=0)
    return fn


def measure(threads, torch, width=WIDTH, batch=BATCH, rounds=9, dtypes=(np.float64, np.float32)):
    rows = []
    for dtype in dtypes:
        rng = np.random.default_rng(0)
        x, g = (rng.standard_normal((batch, width)).astype(dtype) for _ in range(2))
        w = rng.standard_normal((width, width)).astype(dtype)
        b = rng.standard_normal(width).astype(dtype)
        cases = {"tapegrad": [H.Case("tapegrad", framework_case(tapegrad, x, w, b, g))],
                 "numpy": [H.Case("numpy", numpy_case(x, w, b, g))]}
        if torch is not None:
            cases["torch"] = H.torch_cases(
                "torch", functools.partial(framework_case, torch, x, w, b, g), threads,
                threads.blas)
        flat = [c for group in cases.values() for c in group]
        H.interleave(flat, threads, rounds=rounds, min_time=0)
        times = {name: H.median(H.best(group)) for name, group in cases.items()}
        peak = H.matmul_gflops(width, dtype)
        torch_threads = H.best(cases["torch"]).torch_threads if torch is not None else None
        rows.append({"dtype": np.dtype(dtype).name, "times": times, "peak": peak,
                     "torch_threads": torch_threads})
    return rows


def report(rows, torch, width=WIDTH, batch=BATCH):
    work = flops(batch, width)
    headers = ["dtype", "numpy matmul peak GFLOP/s"]
    for name in ("tapegrad", "numpy") + (("torch",) if torch is not None else ()):
        headers += [f"{name} ms", f"{name} GFLOP/s"]
    headers += ["tapegrad % of peak"]
    if torch is not None:
        headers += ["torch threads", "tapegrad speed vs torch"]
    table = []
    for r in rows:
        t = r["times"]
        row = [r["dtype"], f"{r['peak']:.1f}"]
        for name in ("tapegrad", "numpy") + (("torch",) if torch is not None else ()):
            row += [H.fmt_ms(t[name]).strip(), f"{work / t[name] / 1e9:.1f}"]
        row.append(f"{work / t['tapegrad'] / 1e9 / r['peak']:.0%}")
        if torch is not None:
            row += [str(r["torch_threads"]), f"{t['torch'] / t['tapegrad']:.2f}x"]
        table.append(row)
    return H.table(table, headers)


def main(argv=None):
    p = argparse.ArgumentParser(prog="tapegrad bench blas", description=__doc__.split("\n")[0])
    p.add_argument("--threads", type=int, default=os.cpu_count(),
                   help="numpy BLAS threads (and PyTorch's second thread count)")
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--quick", action="store_true", help="width 128, few rounds (smoke test)")
    p.add_argument("--no-torch", action="store_true", help="leave PyTorch out")
    args = p.parse_args(argv)
    torch = None if args.no_torch else H.import_torch()
    with H.Threads(args.threads, torch) as threads:
        return _run(args, torch, threads)


def _run(args, torch, threads):
    H.out(H.header(threads, torch, "BLAS-bound Linear layer"))
    width = QUICK_WIDTH if args.quick else WIDTH
    batch = QUICK_WIDTH if args.quick else BATCH
    rows = measure(threads, torch, width=width, batch=batch,
                   rounds=2 if args.quick else args.rounds)
    H.out()
    H.out(f"Linear({width}, {width}) at batch {batch}, forward + backward "
          f"({flops(batch, width) / 1e9:.2f} GFLOP per step), median per step; "
          f"peak = numpy's own ({width}, {width}) @ ({width}, {width})")
    H.out(report(rows, torch, width, batch))
    return rows
