"""BLAS-bound: one 1024-wide Linear layer, batch 1024, forward and backward; and the BLAS
thread rule's measurements.

``out = F.linear(x, W, b)`` then ``out.backward(g)`` with ``x``, ``W`` and ``b`` requiring
grad: three (1024, 1024, 1024) matmuls, 6.4 GFLOP per step. Compared with PyTorch (same
code) and with numpy doing the same three matmuls by hand, and reported as a fraction of
numpy's own square-matmul rate (the BLAS peak tapegrad can reach).

The thread rule (``tapegrad.backend.blas.runs_serial``: one BLAS thread or the count set, per
product, by a cost model; docs/performance.md, "BLAS threads"):

  --sweep        numpy's matmul at 1 and at 2 threads over a grid of (m, k, n), float32 and
                 float64, each count in its own process, the processes alternating round by
                 round; each shape in batches of >= 50 ms, each batch with the CPU load other
                 processes put on the machine meanwhile (/proc/stat less this process's own
                 time), so that the other core's free and busy moments are told apart;
                 against the model's prediction and decision. ``--load`` adds a busy loop.
  --step         the H=2048, batch 4096 spiral step (``bench scale``'s, float64 and float32)
                 under the rule, at one thread, and with every product threaded, fresh
                 processes in turn.
  --elementwise  numpy's (one-thread) elementwise ops against numba loops (``prange``) at
                 one thread and at every core, by size, the latter split by whether the
                 other core was free (needs numba).
"""
import argparse
import functools
import importlib
import json
import os
import statistics
import subprocess
import sys
import time

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
    p = argparse.ArgumentParser(prog="tapegrad bench blas", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", type=int, default=os.cpu_count(),
                   help="numpy BLAS threads (and PyTorch's second thread count)")
    p.add_argument("--rounds", type=int, default=None,
                   help="rounds (default 9; --sweep: 3 process pairs; --step: 5)")
    p.add_argument("--quick", action="store_true", help="width 128, few rounds (smoke test); "
                   "with --sweep: a few shapes, one round")
    p.add_argument("--no-torch", action="store_true", help="leave PyTorch out")
    p.add_argument("--sweep", action="store_true",
                   help="matmul at 1 and 2 threads over a grid of shapes, each count in its own "
                        "process, against the thread rule's model")
    p.add_argument("--dtype", choices=("float32", "float64", "both"), default="both",
                   help="--sweep's dtypes")
    p.add_argument("--load", action="store_true",
                   help="--sweep/--step: one busy-loop process running while timing")
    p.add_argument("--step", action="store_true",
                   help="the H=2048, batch 4096 spiral step at the default count under the thread "
                        "rule, at one thread, and with every product threaded, fresh processes")
    p.add_argument("--elementwise", action="store_true",
                   help="numpy's one-thread elementwise ops against numba loops on one and on "
                        "every core, by size")
    p.add_argument("--json", default=None, metavar="PATH",
                   help="--sweep: also write the raw timings to PATH")
    p.add_argument("--child", nargs=2, metavar=("THREADS", "DTYPE"), help=argparse.SUPPRESS)
    p.add_argument("--step-child", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(sweep_child(int(args.child[0]), args.child[1], args.quick)))
        return 0
    if args.step_child is not None:
        print(json.dumps(step_child(args.step_child)))
        return 0
    for on, run in ((args.sweep, sweep), (args.step, step), (args.elementwise, elementwise)):
        if on:
            run(args)
            return 0
    if args.rounds is None:
        args.rounds = 9
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


# --- the thread rule's measurements: matmul at one and two threads by shape -----------------
# Square-ish products sweep the work at a few MB; the skinny ones (a side of 2 or 3, as a
# narrow network's first and last layers and their weight gradients) sweep the bytes moved at
# little work; the rest are layers of the model suite and of small models.
SWEEP_SHAPES = ([(n, n, n) for n in (96, 128, 192, 256, 384, 512, 768, 1024)]
                + [(64, 784, 256), (128, 512, 512), (256, 64, 512), (256, 512, 512),
                   (256, 512, 10), (512, 10, 256), (512, 256, 512), (1024, 256, 256)]
                + [(m, 2, n) for m, n in ((1024, 512), (2048, 1024), (4096, 2048), (8192, 4096))]
                + [(m, k, 3) for m, k in ((1024, 512), (2048, 1024), (4096, 2048), (8192, 4096))]
                + [(2, k, n) for k, n in ((1024, 512), (4096, 2048))])
QUICK_SWEEP_SHAPES = [(128, 128, 128), (512, 512, 512), (1024, 2, 512)]
CELL_SECONDS = 0.05  # one timed batch of calls of a shape (5 clock ticks of load per core)
FREE_BATCHES, MAX_BATCHES = 3, 12
FREE_CORES = 0.5  # others' load below which the second core counts as free
# others' load below which one thread had its core to itself: the other core's worth, plus
# about half a clock tick of the batch's counting error
OWN_CORE = 1.1


def _cpu_jiffies():
    """(busy, total) clock ticks of the whole machine since boot (Linux), or None."""
    try:
        with open("/proc/stat") as f:
            ticks = [int(t) for t in f.readline().split()[1:9]]
    except (OSError, ValueError):
        return None
    return sum(ticks) - ticks[3] - ticks[4], sum(ticks)


class OthersLoad:
    """Cores other processes kept busy during a span: the machine's busy ticks less this
    process's own CPU time (all its threads, OpenBLAS's spinning workers included)."""

    def __init__(self):
        self.tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        self.start()

    def start(self):
        self._t, self._own, self._jiffies = time.perf_counter(), _own_cpu(), _cpu_jiffies()

    def cores(self):
        now = _cpu_jiffies()
        if now is None or self._jiffies is None:
            return float("nan")
        wall = time.perf_counter() - self._t
        busy = (now[0] - self._jiffies[0]) / self.tick - (_own_cpu() - self._own)
        return max(busy, 0.0) / max(wall, 1e-9)


def _own_cpu():
    t = os.times()
    return t.user + t.system


def sweep_child(threads, dtype, quick=False):
    """{"m x k x n": [[seconds per call, cores others kept busy], ...]} at ``threads`` BLAS
    threads (numpy's own matmul: the thread count alone differs between the processes).

    Each shape is timed in batches of >= CELL_SECONDS, each batch with the load other
    processes put on the machine meanwhile, until FREE_BATCHES batches found the second
    core free or MAX_BATCHES were taken: on a shared machine this catches the moments when
    the other core is free as well as those when it is not."""
    tapegrad.set_num_threads(threads)
    out = {}
    for m, k, n in QUICK_SWEEP_SHAPES if quick else SWEEP_SHAPES:
        rng = np.random.default_rng(0)
        a = rng.standard_normal((m, k)).astype(dtype)
        b = rng.standard_normal((k, n)).astype(dtype)
        np.matmul(a, b)
        samples = []
        while len(samples) < MAX_BATCHES \
                and sum(c < FREE_CORES for _, c in samples) < FREE_BATCHES:
            # a batch ends on time, not on a count calibrated beforehand: one product can
            # take 100x longer when the other core turns busy
            load = OthersLoad()
            calls, t0 = 0, time.perf_counter()
            while True:
                np.matmul(a, b)
                calls += 1
                elapsed = time.perf_counter() - t0
                if elapsed >= CELL_SECONDS:
                    break
            samples.append([elapsed / calls, load.cores()])
        out[f"{m}x{k}x{n}"] = samples
    return out


def _busy_loop(on):
    return subprocess.Popen([sys.executable, "-c", "while True: pass"]) if on else None


def _stop(proc):
    if proc is not None:
        proc.kill()
        proc.wait()


def _uptime():
    load = os.getloadavg() if hasattr(os, "getloadavg") else (float("nan"),) * 3
    return f"{load[0]:.2f} {load[1]:.2f} {load[2]:.2f}"


def sweep(args):
    """Both counts in fresh processes, alternating, ``rounds`` pairs per dtype; per shape the
    medians over rounds, the cores other processes kept busy, and the rule's prediction."""
    from tapegrad.backend import blas

    rounds = args.rounds or (1 if args.quick else 3)
    dtypes = ("float32", "float64") if args.dtype == "both" else (args.dtype,)
    H.out(f"== matmul at 1 and 2 BLAS threads ({blas.LIBRARY and blas.LIBRARY.path}) ==")
    H.out(f"{os.cpu_count()} CPUs {H.cpu_model()}; added load: "
          f"{'one busy loop' if args.load else 'none'}; {rounds} rounds, each count in its own "
          f"process, alternating; each shape in batches of >= {CELL_SECONDS * 1e3:.0f} ms until "
          f"{FREE_BATCHES} found the other core free or {MAX_BATCHES} were taken")
    busy = _busy_loop(args.load)
    results = {}  # (dtype, threads) -> list of per-process dicts
    try:
        for r in range(rounds):
            for dtype in dtypes:
                for threads in ((1, 2) if r % 2 == 0 else (2, 1)):
                    start = _uptime()
                    p = subprocess.run([sys.executable, "-m", "tapegrad.bench.blas", "--child",
                                        str(threads), dtype] + (["--quick"] if args.quick else []),
                                       capture_output=True, text=True, check=True)
                    results.setdefault((dtype, threads), []).append(json.loads(p.stdout))
                    if args.json:
                        with open(args.json, "w") as f:
                            json.dump({f"{d} {t}": v for (d, t), v in results.items()}, f)
                    H.out(f"  round {r + 1} {dtype} {threads} thread(s): load average {start}")
    finally:
        _stop(busy)
    H.out(f"load average at the end: {_uptime()}")
    rows = sweep_rows(results, dtypes)
    H.out()
    H.out(f"us per call, medians over the batches of all rounds (in brackets: how many): one "
          f"thread where other processes left it its core (used under {OWN_CORE:g} "
          f"cores), two threads where they used under {FREE_CORES:g} of a core (other core "
          f"free) or more (busy); speed-up = 1-thread time / 2-thread time; model: "
          f"backend.blas.one_thread_seconds, and the rule (1: switched to one thread; count: "
          f"the count set)")
    H.out(H.table(rows, SWEEP_HEADERS))
    return rows


SWEEP_HEADERS = ["dtype", "m x k x n", "MFLOP", "MB", "1 thread", "2 threads, other core free",
                 "speed-up", "2 threads, other core busy", "speed-up", "model 1 thread",
                 "model speed-up", "rule"]


def _median(samples, keep):
    """(median seconds, count) of the batches whose others' load passes ``keep``."""
    times = [t for t, c in samples if keep(c)]
    return (statistics.median(times) if times else None), len(times)


def sweep_rows(results, dtypes):
    """The sweep's table rows from ``{(dtype, threads): [per-process {shape: [s, cores]}]}``."""
    from tapegrad.backend import blas

    def us(t):
        return "-" if t is None else f"{t * 1e6:.0f}"

    def ratio(a, b):
        return "-" if a is None or b is None else f"{a / b:.2f}x"

    rows = []
    for dtype in dtypes:
        itemsize = np.dtype(dtype).itemsize
        for key in results[(dtype, 1)][0]:
            m, k, n = map(int, key.split("x"))
            one = [x for run in results[(dtype, 1)] for x in run[key]]
            two = [x for run in results[(dtype, 2)] for x in run[key]]
            # one thread is undisturbed while the others leave it its core; two threads have
            # the second core free while the others use under FREE_CORES of one
            t1, _ = _median(one, lambda c: c < OWN_CORE)
            free, n_free = _median(two, lambda c: c < FREE_CORES)
            busy, n_busy = _median(two, lambda c: not c < FREE_CORES)
            p1 = blas.one_thread_seconds(m, k, n, itemsize)
            p2 = blas.two_thread_seconds(m, k, n, itemsize)
            rows.append([dtype, key, f"{2 * m * k * n / 1e6:.1f}",
                         f"{(m * k + k * n + m * n) * itemsize / 1e6:.1f}", us(t1),
                         f"{us(free)} ({n_free})", ratio(t1, free),
                         f"{us(busy)} ({n_busy})", ratio(t1, busy),
                         us(p1), ratio(p1, p2),
                         "1" if blas.runs_serial(m, k, n, itemsize) else "count"])
    return rows


# --- the rule on a whole step: the H=2048, batch 4096 spiral step -----------------------------
STEP_POLICIES = {
    "rule": "the default count, tapegrad's per-product rule",
    "one": "tapegrad.set_num_threads(1)",
    "every": "the default count for every product (the rule's thread cost set to 0)",
}


def step_child(policy, steps=3, rounds=7):
    """{dtype: ms per step} of the scale step (spiral MLP, H=2048, batch 4096,
    ``F.relu(F.linear(...))``) under ``policy``, median of ``rounds`` runs of ``steps``."""
    from tapegrad.backend import blas
    from tapegrad.bench.scale import BATCH, HIDDEN
    from tapegrad.bench.spiral import MLPTrainer, init_params, spiral_data

    if policy == "one":
        tapegrad.set_num_threads(1)
    elif policy == "every":
        blas.THREAD_COST = 0.0
    out = {}
    for dtype in (np.float64, np.float32):
        X, y = spiral_data(BATCH, dtype=dtype)
        trainer = MLPTrainer(tapegrad, init_params((2, HIDDEN, 3), seed=1, dtype=dtype), X, y)
        trainer.run(2)
        times = []
        load = OthersLoad()
        for _ in range(rounds):
            t0 = time.perf_counter()
            trainer.run(steps)
            times.append((time.perf_counter() - t0) / steps * 1e3)
        out[np.dtype(dtype).name] = [statistics.median(times), load.cores()]
    return out


def step(args):
    """The scale step under each policy, fresh processes, ``rounds`` rounds in turn."""
    rounds = args.rounds or 5
    H.out("== the H=2048, batch 4096 spiral step (bench scale's) under each BLAS thread "
          "policy ==")
    for name, what in STEP_POLICIES.items():
        H.out(f"  {name}: {what}")
    busy = _busy_loop(args.load)
    runs = {name: [] for name in STEP_POLICIES}
    try:
        for r in range(rounds):
            order = list(STEP_POLICIES) if r % 2 == 0 else list(reversed(STEP_POLICIES))
            for name in order:
                start = _uptime()
                p = subprocess.run([sys.executable, "-m", "tapegrad.bench.blas", "--step-child",
                                    name], capture_output=True, text=True, check=True)
                runs[name].append(json.loads(p.stdout))
                H.out(f"  round {r + 1} {name}: load average {start}: " + ", ".join(
                    f"{d} {ms:.1f} ms (others {c:.2f} cores)"
                    for d, (ms, c) in runs[name][-1].items()))
    finally:
        _stop(busy)
    rows = []
    for dtype in ("float64", "float32"):
        rows.append([dtype] + [f"{statistics.median(run[dtype][0] for run in runs[name]):.1f}"
                               for name in STEP_POLICIES])
    H.out()
    H.out(f"ms per step, median over {rounds} processes of each (each: median of 7 runs of 3 "
          f"steps); added load: {'one busy loop' if args.load else 'none'}")
    H.out(H.table(rows, ["dtype"] + list(STEP_POLICIES)))
    return rows


# --- large elementwise work: numpy's one thread against numba loops on every core -----------
class _Loops:
    """A scalar function of one or three arguments as numba loops over flat arrays, on one
    thread (``range``) and on every core (``prange``), beside ``numpy_fn``, the same function
    in numpy: what a parallel elementwise backend would run."""

    def __init__(self, scalar, numpy_fn, nin):
        import numba

        self.numpy_fn, self.nin = numpy_fn, nin
        f = numba.njit(inline="always")(scalar)
        prange = numba.prange  # a closure variable numba resolves to prange itself
        if nin == 1:
            def on_all(out, a):
                for i in prange(out.size):
                    out[i] = f(a[i])

            def on_one(out, a):
                for i in range(out.size):
                    out[i] = f(a[i])
        else:
            def on_all(out, a, b, c):
                for i in prange(out.size):
                    out[i] = f(a[i], b[i], c[i])

            def on_one(out, a, b, c):
                for i in range(out.size):
                    out[i] = f(a[i], b[i], c[i])
        self.loops = [numba.njit(parallel=True)(on_all), numba.njit(on_one)]

    def parallel(self, *arrays, out, threads=True):
        self.loops[0 if threads else 1](out.reshape(-1), *(a.reshape(-1) for a in arrays))
        return out


def _elementwise_ops():
    import math

    return {
        "a * b + c": _Loops(lambda a, b, c: a * b + c, lambda a, b, c: a * b + c, 3),
        "relu": _Loops(lambda x: x if x > 0 else 0.0 * x, lambda x: np.maximum(x, 0), 1),
        "silu": _Loops(lambda x: x / (1.0 + math.exp(-x)), lambda x: x / (1.0 + np.exp(-x)), 1),
        "tanh": _Loops(lambda x: math.tanh(x), np.tanh, 1),
    }


ELEMENTWISE_SIZES = [1 << p for p in (16, 18, 20, 22, 24)]


def _timed_batch(fn):
    """[seconds per call, cores other processes used] of a batch of >= CELL_SECONDS."""
    load = OthersLoad()
    calls, t0 = 0, time.perf_counter()
    while True:
        fn()
        calls += 1
        elapsed = time.perf_counter() - t0
        if elapsed >= CELL_SECONDS:
            return [elapsed / calls, load.cores()]


def elementwise(args):
    """us per call of each op by size: numpy, numba's loop on one thread, on every core (the
    last split by whether the other core was free), rounds in turn until FREE_BATCHES rounds
    found the other core free or MAX_BATCHES were taken."""
    import numba

    sizes = ELEMENTWISE_SIZES[:2] if args.quick else ELEMENTWISE_SIZES
    dtypes = ("float32", "float64") if args.dtype == "both" else (args.dtype,)
    H.out(f"== elementwise: numpy (one thread) vs numba loops (1 and "
          f"{numba.get_num_threads()} threads) ==")
    H.out(f"load average at the start: {_uptime()}")
    busy = _busy_loop(args.load)
    rows = []
    try:
        for dtype in dtypes:
            for name, op in _elementwise_ops().items():
                for size in sizes:
                    rng = np.random.default_rng(0)
                    arrays = [rng.standard_normal(size).astype(dtype) for _ in range(op.nin)]
                    out = np.empty_like(arrays[0])
                    fns = {"numpy": lambda op=op, a=arrays: op.numpy_fn(*a),
                           "numba 1": lambda op=op, a=arrays, o=out: op.parallel(
                               *a, out=o, threads=False),
                           "numba all": lambda op=op, a=arrays, o=out: op.parallel(*a, out=o)}
                    for fn in fns.values():
                        fn()
                    samples = {k: [] for k in fns}
                    while len(samples["numba all"]) < MAX_BATCHES and sum(
                            c < FREE_CORES for _, c in samples["numba all"]) < FREE_BATCHES:
                        for k, fn in fns.items():
                            samples[k].append(_timed_batch(fn))
                    t_np, _ = _median(samples["numpy"], lambda c: c < OWN_CORE)
                    t_1, _ = _median(samples["numba 1"], lambda c: c < OWN_CORE)
                    free, n_free = _median(samples["numba all"], lambda c: c < FREE_CORES)
                    hit, n_busy = _median(samples["numba all"], lambda c: not c < FREE_CORES)

                    def us(t):
                        return "-" if t is None else f"{t * 1e6:.0f}"

                    def ratio(a, b):
                        return "-" if a is None or b is None else f"{a / b:.2f}x"

                    rows.append([dtype, name, f"{size:,}", us(t_np), us(t_1),
                                 f"{us(free)} ({n_free})", ratio(t_np, free),
                                 f"{us(hit)} ({n_busy})", ratio(t_np, hit)])
                    H.out("  " + "  ".join(rows[-1]))
    finally:
        _stop(busy)
    H.out(f"load average at the end: {_uptime()}; numba threading layer "
          f"{numba.threading_layer()}")
    H.out()
    H.out(f"us per call, medians over batches of >= {CELL_SECONDS * 1e3:.0f} ms: numpy and the "
          f"one-thread loop where others left them their core, the loop on every core where "
          f"the others used under {FREE_CORES:g} of a core (free) or more (busy); added load: "
          f"{'one busy loop' if args.load else 'none'}")
    H.out(H.table(rows, ["dtype", "op", "elements", "numpy us", "numba 1 thread us",
                         "numba all threads, free", "vs numpy", "numba all threads, busy",
                         "vs numpy"]))
    return rows

if __name__ == "__main__":
    sys.exit(main())
