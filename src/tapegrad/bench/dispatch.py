"""Per-op dispatch cost: one op through tapegrad's tape vs PyTorch vs the bare numpy call.

Workloads: an elementwise multiply at 8x8 and square matmuls at 8, 32, 128 and 512, each
forward only (inputs require grad, so the op is recorded) and forward+backward (the op,
then ``out.backward(g)`` with a given upstream gradient, then the leaves' grads cleared).
numpy's "forward+backward" is the same arithmetic written by hand (``g @ b.T``, ``a.T @ g``).
The overhead of a framework is its time minus numpy's.
"""
import argparse
import functools
import os
import tempfile

import numpy as np

import tapegrad
from tapegrad.bench import harness as H

SIZES = (8, 32, 128, 512)
QUICK_SIZES = (8, 32)


def _inputs(kind, n, dtype):
    rng = np.random.default_rng(n)
    if kind == "mul":
        a, b, g = (rng.standard_normal((8, 8)).astype(dtype) for _ in range(3))
    else:
        a, b, g = (rng.standard_normal((n, n)).astype(dtype) for _ in range(3))
    return a, b, g


def numpy_case(kind, a, b, g, backward):
    if kind == "mul":
        if backward:
            def fn():
                a * b
                g * b
                g * a
        else:
            def fn():
                a * b
    else:
        if backward:
            def fn():
                a @ b
                g @ b.T
                a.T @ g
        else:
            def fn():
                a @ b
    return fn


def framework_case(T, kind, a, b, g, backward, record=True):
    """``T`` is tapegrad or torch; the same code times both."""
    A = T.tensor(a, requires_grad=record)
    B = T.tensor(b, requires_grad=record)
    G = T.tensor(g)
    if kind == "mul":
        if backward:
            def fn():
                (A * B).backward(G)
                A.grad = None
                B.grad = None
        else:
            def fn():
                A * B
    else:
        if backward:
            def fn():
                (A @ B).backward(G)
                A.grad = None
                B.grad = None
        else:
            def fn():
                A @ B
    return fn


def measure(threads, torch, sizes=SIZES, rounds=15, min_time=0.005, dtype=np.float64):
    """Rows ``(label, n, mode, {contestant: seconds})`` for every workload."""
    workloads = [("mul 8x8", "mul", 8)] + [(f"matmul {n}", "matmul", n) for n in sizes]
    results = []
    for label, kind, n in workloads:
        a, b, g = _inputs(kind, n, dtype)
        for mode, backward in (("forward", False), ("forward+backward", True)):
            cases = {"numpy": [H.Case("numpy", numpy_case(kind, a, b, g, backward))],
                     "tapegrad": [H.Case("tapegrad",
                                         framework_case(tapegrad, kind, a, b, g, backward))]}
            if not backward:
                cases["tapegrad (no grad)"] = [H.Case(
                    "tapegrad (no grad)",
                    framework_case(tapegrad, kind, a, b, g, False, record=False))]
            if torch is not None:
                cases["torch"] = H.torch_cases(
                    "torch", functools.partial(framework_case, torch, kind, a, b, g, backward),
                    threads, threads.blas)
                if not backward:
                    cases["torch (no grad)"] = H.torch_cases(
                        "torch (no grad)",
                        functools.partial(framework_case, torch, kind, a, b, g, False,
                                          record=False),
                        threads, threads.blas)
            flat = [c for group in cases.values() for c in group]
            H.interleave(flat, threads, rounds=rounds, min_time=min_time)
            medians = {}
            for name, group in cases.items():
                winner = H.best(group)
                medians[name] = H.median(winner)
                if winner.torch_threads is not None:
                    medians[name + " threads"] = winner.torch_threads
            results.append((label, n, mode, medians))
    return results


def report(results, torch):
    names = ["numpy", "tapegrad (no grad)", "tapegrad", "torch (no grad)", "torch"]
    short = {"tapegrad (no grad)": "tg no-grad", "tapegrad": "tapegrad",
             "torch (no grad)": "torch no-grad"}
    if torch is None:
        names = names[:3]
    rows = []
    for label, n, mode, m in results:
        row = [f"{label}, {mode}"]
        for name in names:
            row.append(H.fmt_us(m[name]).strip() if name in m else "-")
        row.append(H.fmt_us(m["tapegrad"] - m["numpy"]).strip())
        if torch is not None:
            row.append(H.fmt_us(m["torch"] - m["numpy"]).strip())
            row.append(f"{m['torch'] / m['tapegrad']:.2f}x")
            row.append(str(m["torch threads"]))
        rows.append(row)
    headers = ["workload (float64)"] + [short.get(n, n) for n in names] + ["tg - numpy"]
    if torch is not None:
        headers += ["torch - numpy", "tg speed vs torch", "torch thr"]
    return H.table(rows, headers)


def plot(results, torch, path):
    """Overhead over numpy (us) vs matmul size, forward and forward+backward, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, mode in zip(axes, ("forward", "forward+backward")):
        rows = [(n, m) for label, n, md, m in results if md == mode and label.startswith("mat")]
        ns = [n for n, _ in rows]
        libs = ["tapegrad"] + (["torch"] if torch is not None else [])
        for lib, style in zip(libs, ("o-", "s--")):
            ax.plot(ns, [(m[lib] - m["numpy"]) * 1e6 for _, m in rows], style, label=lib)
        mul = next(m for label, _, md, m in results if md == mode and label.startswith("mul"))
        for lib, marker in zip(libs, ("o", "s")):
            ax.plot([8], [(mul[lib] - mul["numpy"]) * 1e6], marker, mfc="none", ms=10,
                    label=f"{lib}: mul 8x8")
        ax.axhline(0, color="grey", lw=0.8)
        ax.set_yscale("symlog", linthresh=1.0)  # a few us at small n, ms at n=512
        ax.grid(True, which="major", alpha=0.3)
        ax.set_xscale("log", base=2)
        ax.set_xticks(ns, [str(n) for n in ns])
        ax.set_xlabel("square matmul size n")
        ax.set_ylabel("time over raw numpy per call (us, symlog)")
        ax.set_title(f"dispatch overhead, {mode} (float64)")
        ax.legend(fontsize=8)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def default_plot_path():
    return os.path.join(tempfile.gettempdir(), "tapegrad-bench", "dispatch_overhead.png")


def main(argv=None):
    p = argparse.ArgumentParser(prog="tapegrad bench dispatch", description=__doc__.split("\n")[0])
    p.add_argument("--threads", type=int, default=1,
                   help="numpy BLAS threads and PyTorch's second thread count (default 1: a "
                        "per-op cost is measured without thread wake-ups in it)")
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--quick", action="store_true", help="small sizes, few rounds (smoke test)")
    p.add_argument("--plot", default=None, help=f"PNG path (default {default_plot_path()})")
    p.add_argument("--no-torch", action="store_true", help="leave PyTorch out")
    args = p.parse_args(argv)
    torch = None if args.no_torch else H.import_torch()
    with H.Threads(args.threads, torch) as threads:
        return _run(args, torch, threads)


def _run(args, torch, threads):
    H.out(H.header(threads, torch, "per-op dispatch cost"))
    sizes = QUICK_SIZES if args.quick else SIZES
    rounds = 3 if args.quick else args.rounds
    results = measure(threads, torch, sizes=sizes, rounds=rounds,
                      min_time=0.001 if args.quick else 0.005)
    H.out()
    H.out("median time per call in microseconds; inputs require grad except in the no-grad "
          "columns;\n'x - numpy' is the framework's overhead over the bare numpy call; "
          "tg speed vs torch = torch time / tapegrad time")
    H.out(report(results, torch))
    path = plot(results, torch, args.plot or default_plot_path())
    H.out(f"\nplot written to {path}")
    return results
