"""Spiral MLP training (2 -> H -> 3, ReLU, softmax cross-entropy, full-batch SGD at lr 0.5).

Hidden width H in {32, 256, 2048} and batch in {512, 4096}, float64, plus float32 for the
largest; tapegrad and PyTorch run the very same ``MLPTrainer`` code from the same initial
weights, raw numpy runs the hand-written step. Reported: milliseconds per step (median over
rounds) and tapegrad's speed relative to PyTorch (PyTorch's time / tapegrad's time; > 1
means tapegrad is faster). The largest configuration is memory-bound, so it is also
reported against the machine's copy bandwidth.
"""
import argparse
import functools
import importlib
import os

import numpy as np

import tapegrad
from tapegrad.bench import harness as H
from tapegrad.bench.spiral import MLPTrainer, NumpyTrainer, init_params, spiral_data

CONFIGS = [(h, n, np.float64) for n in (512, 4096) for h in (32, 256, 2048)]
CONFIGS.append((2048, 4096, np.float32))
QUICK_CONFIGS = [(32, 512, np.float64), (64, 256, np.float32)]

# Minimum bytes one step streams at hidden width H and batch n: every (n, H) activation or
# gradient pass, counted for the unfused step (forward: matmul out, + bias, relu, read by the
# second matmul; backward: grad of h, relu mask read + grad read + write, bias-grad sum,
# weight-grad matmul read) = 12 passes over an (n, H) array.
PASSES = 12


def steps_for(hidden, batch, base=300):
    """Fewer steps for larger configs: the whole suite stays a few minutes long."""
    return max(3, min(base, int(base * 32 * 512 / (hidden * batch))))


def _runner(trainer, steps):
    return lambda: trainer.run(steps)


def _torch_runner(torch, params, X, y, steps):
    return _runner(MLPTrainer(torch, params, X, y), steps)


def measure(threads, torch, configs=CONFIGS, rounds=7, steps=None):
    rows = []
    for hidden, batch, dtype in configs:
        X, y = spiral_data(batch, dtype=dtype)
        params = init_params((2, hidden, 3), seed=1, dtype=dtype)
        k = steps or steps_for(hidden, batch)
        cases = {"tapegrad": [H.Case("tapegrad", _runner(MLPTrainer(tapegrad, params, X, y), k))],
                 "numpy": [H.Case("numpy", _runner(NumpyTrainer(params, X, y), k))]}
        if torch is not None:
            cases["torch"] = H.torch_cases(
                "torch", functools.partial(_torch_runner, torch, params, X, y, k), threads,
                threads.blas)
        flat = [c for group in cases.values() for c in group]
        H.interleave(flat, threads, rounds=rounds, min_time=0)
        per_step = {name: H.median(H.best(group)) / k for name, group in cases.items()}
        spread = {name: H.spread(H.best(group)) for name, group in cases.items()}
        torch_threads = H.best(cases["torch"]).torch_threads if torch is not None else None
        rows.append({"hidden": hidden, "batch": batch, "dtype": np.dtype(dtype).name,
                     "steps": k, "rounds": rounds, "per_step": per_step, "spread": spread,
                     "torch_threads": torch_threads})
    return rows


def report(rows, torch):
    headers = ["H", "batch", "dtype", "steps/run", "tapegrad ms/step", "numpy ms/step"]
    if torch is not None:
        headers += ["torch ms/step", "torch threads", "tapegrad speed vs torch"]
    table = []
    for r in rows:
        m = r["per_step"]
        row = [str(r["hidden"]), str(r["batch"]), r["dtype"], str(r["steps"]),
               f"{m['tapegrad'] * 1e3:.3f}", f"{m['numpy'] * 1e3:.3f}"]
        if torch is not None:
            row += [f"{m['torch'] * 1e3:.3f}", str(r["torch_threads"]),
                    f"{m['torch'] / m['tapegrad']:.2f}x"]
        table.append(row)
    return H.table(table, headers)


def bandwidth_report(rows, bandwidth):
    """The largest configs against the memory bound: PASSES x (batch, H) arrays per step."""
    lines = [f"memory bandwidth (numpy copy of 256 MB, read + write): {bandwidth:.1f} GB/s",
             (f"traffic model: {PASSES} passes over a (batch, H) array per step "
              "(the unfused step's activations and gradients)")]
    for r in rows:
        if r["hidden"] * r["batch"] < 2048 * 4096:
            continue
        itemsize = np.dtype(r["dtype"]).itemsize
        traffic = PASSES * r["batch"] * r["hidden"] * itemsize
        bound = traffic / (bandwidth * 1e9)
        lines.append(f"H={r['hidden']} batch={r['batch']} {r['dtype']}: {traffic / 1e9:.2f} GB "
                     f"per step, bandwidth bound {bound * 1e3:.1f} ms/step")
        for name, t in r["per_step"].items():
            lines.append(f"  {name:9s} {t * 1e3:8.1f} ms/step = {traffic / t / 1e9:5.1f} GB/s "
                         f"= {bound / t:5.1%} of the bound")
    return "\n".join(lines)


def _parts(T, hidden, batch, dtype):
    """The spiral step's pieces as separate workloads: each op's forward and its backward."""
    F = importlib.import_module(T.__name__ + ".nn.functional")
    X, y = spiral_data(batch, dtype=dtype)
    W1, b1, W2, b2 = (T.nn.Parameter(T.tensor(p))
                      for p in init_params((2, hidden, 3), seed=1, dtype=dtype))
    X, y = T.tensor(X), T.tensor(y)
    rng = np.random.default_rng(0)
    with T.no_grad():
        h = F.relu(F.linear(X, W1, b1))
        logits = F.linear(h, W2, b2)
    h = h.detach().requires_grad_()
    logits = logits.detach().requires_grad_()
    gh = T.tensor(rng.standard_normal(tuple(h.shape)).astype(dtype))
    gl = T.tensor(rng.standard_normal(tuple(logits.shape)).astype(dtype))
    params = [W1, b1, W2, b2]
    for p in params:
        p.grad = T.zeros_like(p)

    def linear1():
        F.linear(X, W1, b1).backward(gh)
        W1.grad = b1.grad = None

    def relu():
        F.relu(h).backward(gh)
        h.grad = None

    def linear2():
        F.linear(h, W2, b2).backward(gl)
        h.grad = W2.grad = b2.grad = None

    def cross_entropy():
        F.cross_entropy(logits, y).backward()
        logits.grad = None

    grads = [T.zeros_like(p) for p in params]

    def sgd():
        with T.no_grad():
            for p, g in zip(params, grads):
                p.add_(g, alpha=-0.0)

    return {"linear 2->H": linear1, "relu": relu, "linear H->3": linear2,
            "cross_entropy": cross_entropy, "SGD update (4 params)": sgd}


def breakdown(threads, torch, hidden=32, batch=512, dtype=np.float64, rounds=15):
    """Forward+backward of each piece of the spiral step: where tapegrad's time goes."""
    parts = {"tapegrad": _parts(tapegrad, hidden, batch, dtype)}
    if torch is not None:
        parts["torch"] = _parts(torch, hidden, batch, dtype)
    rows = []
    for name in parts["tapegrad"]:
        cases = {"tapegrad": [H.Case("tapegrad", parts["tapegrad"][name])]}
        if torch is not None:
            cases["torch"] = H.torch_cases("torch", lambda fn=parts["torch"][name]: fn,
                                           threads, threads.blas)
        flat = [c for group in cases.values() for c in group]
        H.interleave(flat, threads, rounds=rounds, min_time=0.005)
        t = {lib: H.median(H.best(group)) for lib, group in cases.items()}
        row = [name, H.fmt_us(t["tapegrad"]).strip()]
        if torch is not None:
            row += [H.fmt_us(t["torch"]).strip(), f"{t['torch'] / t['tapegrad']:.2f}x"]
        rows.append(row)
    headers = ["piece (forward + backward)", "tapegrad us"]
    if torch is not None:
        headers += ["torch us", "tapegrad speed vs torch"]
    return H.table(rows, headers)


def main(argv=None):
    p = argparse.ArgumentParser(prog="tapegrad bench mlp", description=__doc__.split("\n")[0])
    p.add_argument("--threads", type=int, default=os.cpu_count(),
                   help="numpy BLAS threads (and PyTorch's second thread count)")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--quick", action="store_true", help="small configs, few steps (smoke test)")
    p.add_argument("--no-torch", action="store_true", help="leave PyTorch out")
    p.add_argument("--breakdown", action="store_true",
                   help="time each piece of the H=32, batch 512 step instead (forward+backward)")
    args = p.parse_args(argv)
    torch = None if args.no_torch else H.import_torch()
    with H.Threads(args.threads, torch) as threads:
        if args.breakdown:
            H.out(H.header(threads, torch, "spiral MLP step, piece by piece"))
            H.out()
            H.out("H=32, batch 512, float64: median microseconds per call of each piece, "
                  "forward then backward (the SGD update: in-place add_ on 4 parameters)")
            H.out(breakdown(threads, torch, rounds=3 if args.quick else args.rounds * 2))
            return 0
        return _run(args, torch, threads)


def _run(args, torch, threads):
    H.out(H.header(threads, torch, "spiral MLP training"))
    configs = QUICK_CONFIGS if args.quick else CONFIGS
    rows = measure(threads, torch, configs=configs, rounds=2 if args.quick else args.rounds,
                   steps=3 if args.quick else None)
    H.out()
    H.out("median milliseconds per SGD step (forward, backward, update); "
          "speed vs torch = torch time / tapegrad time")
    H.out(report(rows, torch))
    if not args.quick:
        H.out()
        H.out(bandwidth_report(rows, H.copy_bandwidth()))
    return rows
