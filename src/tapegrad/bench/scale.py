"""The large, memory-bound step: spiral MLP at H=2048, batch 4096.

The step streams ~0.8 GB (float64) of activations and gradients through ~0.1 GFLOP of
matmuls, so it is bound by memory traffic and by the kernel's cost of handing out fresh
pages (a freshly allocated 64 MB array is zeroed page by page on first touch). Reported:
milliseconds per step with the process's user and system CPU time per step (os.times),
for tapegrad as users write it (``F.relu(F.linear(...))``), tapegrad with the fused
``F.linear_relu``, the hand-written numpy step and PyTorch (at its best thread count),
all interleaved round by round; the step against the machine's copy bandwidth; and the
measurements behind each change to the large-array path: a diamond's gradient sums added
in place, transposed matmul operands passed to BLAS as views, and whether a second thread
speeds up a memory-bound elementwise pass on this machine.
"""
import argparse
import cProfile
import functools
import io
import os
import pstats
import time
import tracemalloc
from concurrent.futures import ThreadPoolExecutor

import numpy as np

import tapegrad
from tapegrad.bench import harness as H
from tapegrad.bench.mlp import PASSES
from tapegrad.bench.spiral import MLPTrainer, NumpyTrainer, init_params, spiral_data

HIDDEN, BATCH = 2048, 4096


def allocator_line():
    """What the backend did to glibc's allocator at import (see backend.keep_freed_memory)."""
    from tapegrad.backend import numpy_backend

    if numpy_backend.ALLOCATOR_TUNED:
        return ("malloc: freed blocks kept for reuse (tapegrad's default; run with "
                "TAPEGRAD_KEEP_FREED_MEMORY=0 for glibc's defaults)")
    return "malloc: glibc defaults (TAPEGRAD_KEEP_FREED_MEMORY=0, or not glibc)"


class FusedMLPTrainer(MLPTrainer):
    """``MLPTrainer`` with each hidden layer as one fused ``F.linear_relu`` node."""

    def forward(self):
        F, h, params = self.F, self.X, self.params
        for k in range(0, len(params) - 2, 2):
            h = F.linear_relu(h, params[k], params[k + 1])
        return F.linear(h, params[-2], params[-1])


class _Timed:
    """Wraps a runner: each call also records the process's user and system CPU seconds."""

    def __init__(self, fn):
        self.fn = fn
        self.cpu = []

    def __call__(self):
        t0 = os.times()
        self.fn()
        t1 = os.times()
        self.cpu.append((t1.user - t0.user, t1.system - t0.system))


def _blas_cases(label, make_runner, threads):
    """A numpy-BLAS contestant at one thread and at the full count, like PyTorch's cases."""
    counts = [1] if threads.blas == 1 else [1, threads.blas]
    cases = []
    for n in counts:
        run = make_runner()

        def fn(run=run, n=n):
            threads.set_blas(n)
            try:
                run()
            finally:
                threads.set_blas(threads.blas)
        case = H.Case(f"{label}@{n}", _Timed(fn))
        case.blas_threads = n
        cases.append(case)
    return cases


def measure_step(threads, torch, dtype, steps=3, rounds=7, hidden=HIDDEN, batch=BATCH):
    """Per-step wall, user and sys time of each contestant (medians over rounds), each at
    its best of one and ``threads.blas`` threads."""
    X, y = spiral_data(batch, dtype=dtype)
    params = init_params((2, hidden, 3), seed=1, dtype=dtype)

    def runner(make):
        return lambda: (lambda trainer: lambda: trainer.run(steps))(make())

    groups = {
        "tapegrad relu(linear)": _blas_cases(
            "tapegrad", runner(lambda: MLPTrainer(tapegrad, params, X, y)), threads),
        "tapegrad linear_relu": _blas_cases(
            "fused", runner(lambda: FusedMLPTrainer(tapegrad, params, X, y)), threads),
        "numpy by hand": _blas_cases("numpy", runner(lambda: NumpyTrainer(params, X, y)),
                                     threads),
    }
    if torch is not None:
        groups["torch"] = H.torch_cases(
            "torch", lambda: _Timed(runner(lambda: MLPTrainer(torch, params, X, y))()),
            threads, threads.blas)
    flat = [c for g in groups.values() for c in g]
    H.interleave(flat, threads, rounds=rounds, min_time=0)
    result = {}
    for name, group in groups.items():
        case = H.best(group)
        cpu = np.array(case.fn.cpu[-rounds:])
        result[name] = {"wall": H.median(case) / steps,
                        "user": float(cpu[:, 0].mean()) / steps,
                        "sys": float(cpu[:, 1].mean()) / steps,
                        "threads": case.torch_threads or getattr(case, "blas_threads", None),
                        "all": {c.label: H.median(c) / steps for c in group}}
    return result


def step_table(results, bandwidth, hidden=HIDDEN, batch=BATCH):
    rows = []
    for dtype, res in results.items():
        traffic = PASSES * batch * hidden * np.dtype(dtype).itemsize
        bound = traffic / (bandwidth * 1e9)
        ref = res.get("torch")
        for name, r in res.items():
            rows.append([name, str(r["threads"]), dtype,
                         H.fmt_ms(r["wall"]).strip(), H.fmt_ms(r["user"]).strip(),
                         H.fmt_ms(r["sys"]).strip(), f"{bound / r['wall']:.1%}",
                         f"{ref['wall'] / r['wall']:.2f}x" if ref else "-"])
    return H.table(rows, [f"step (H={hidden}, batch {batch})", "best threads", "dtype",
                          "ms/step", "user ms", "sys ms", "of bandwidth bound",
                          "speed vs torch"])


# --- the diamond: in-place accumulation of a node's gradient contributions -----------------
def diamond(T, x, g):
    """``t = exp(x)`` read by four products: four (batch, H) contributions reach exp's node."""
    t = x.exp()
    y = t * 2.0 + t * 3.0 + t * 4.0 + t * 5.0
    y.backward(g)
    x.grad = None


def _allocating_run_backward():
    """The engine's ``run_backward`` with in-place accumulation switched off (every diamond
    contribution allocates a fresh sum, as before the change): the baseline it is timed
    against. Built from the current source, so it differs from it in that one point only."""
    import inspect
    import textwrap

    from tapegrad.autograd import engine

    src = textwrap.dedent(inspect.getsource(engine.run_backward))
    patched = src.replace("if parent in owned:", "if False:").replace(
        "owned.add(parent)", "pass")
    if patched.count("if False:") != 1 or "owned.add(parent)" in patched:
        return None  # the engine changed shape: no baseline to build
    namespace = dict(vars(engine))
    exec(compile(patched, engine.__file__, "exec"), namespace)
    return namespace["run_backward"]


def _with_engine(run_backward, fn):
    """``fn`` with ``run_backward`` swapped in where tensor.backward and autograd find it."""
    import tapegrad.autograd as autograd
    from tapegrad.autograd import engine

    def call():
        current = engine.run_backward, autograd.run_backward
        engine.run_backward = autograd.run_backward = run_backward
        try:
            fn()
        finally:
            engine.run_backward, autograd.run_backward = current
    return call


def measure_diamond(threads, torch, rounds=7, shape=(BATCH, HIDDEN)):
    """Forward+backward of ``diamond``: in-place sums, allocating sums (before), PyTorch."""
    rng = np.random.default_rng(0)
    x, g = rng.standard_normal(shape), rng.standard_normal(shape)

    def case(T):
        return functools.partial(diamond, T, T.tensor(x, requires_grad=True), T.tensor(g))

    cases = [H.Case("tapegrad, in-place sums", case(tapegrad))]
    baseline = _allocating_run_backward()
    if baseline is not None:
        cases.append(H.Case("tapegrad, allocating sums (before)",
                            _with_engine(baseline, case(tapegrad))))
    torch_cases = []
    if torch is not None:
        torch_cases = H.torch_cases("torch", lambda: case(torch), threads, threads.blas)
    H.interleave(cases + torch_cases, threads, rounds=rounds, min_time=0)
    out = {c.label: (H.median(c), _peak(c.fn)) for c in cases}
    if torch_cases:
        out["torch"] = (H.median(H.best(torch_cases)), None)
    return out


def _peak(fn):
    """Peak bytes numpy allocated during one call of ``fn`` (tracemalloc sees array buffers)."""
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


# --- transposed matmul operands: views, never copies ------------------------------------
def transposed_matmul(shape=(BATCH, HIDDEN), rounds=7):
    """Peak bytes allocated by ``matmul(g.T, h)`` (the weight gradient's product) and its time,
    against the same product with the transpose copied first."""
    from tapegrad.ops.linalg import matmul

    rng = np.random.default_rng(0)
    g = rng.standard_normal((shape[0], 3))
    h = rng.standard_normal(shape)
    a = rng.standard_normal(shape)
    rows = []
    for label, fn in ((f"matmul(g.T, h): g {g.shape}, h {h.shape}", lambda: matmul(g.T, h)),
                      (f"matmul(a.T, g): a {a.shape}", lambda: matmul(a.T, g)),
                      ("copy, then matmul: a.T copied", lambda: matmul(np.ascontiguousarray(a.T),
                                                                       g))):
        fn()
        tracemalloc.start()
        fn()
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        times = []
        for _ in range(rounds):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        rows.append([label, f"{peak / 2**20:.2f}", H.fmt_ms(float(np.median(times))).strip()])
    return H.table(rows, ["product (float64)", "peak MiB allocated", "ms"])


# --- does a second thread speed up a memory-bound elementwise pass? ----------------------
def threaded_elementwise(rounds=9, shape=(BATCH, HIDDEN)):
    """In-place bias + ReLU and the ReLU-mask product on (4096, 2048) float64, one thread vs
    row halves on two threads (numpy releases the GIL; the results are bitwise the same)."""
    rng = np.random.default_rng(0)
    z = rng.standard_normal(shape)
    b = rng.standard_normal(shape[1])
    gh = rng.standard_normal(shape)
    h = np.maximum(z, 0)
    pool = ThreadPoolExecutor(2)

    def bias_relu(lo, hi):
        s = z[lo:hi]
        np.add(s, b, out=s)
        np.maximum(s, 0, out=s)

    def mask(lo, hi):
        np.multiply(gh[lo:hi], h[lo:hi] > 0, out=gh[lo:hi])

    def two(fn):
        half = shape[0] // 2
        futures = [pool.submit(fn, 0, half), pool.submit(fn, half, shape[0])]
        for f in futures:
            f.result()

    cases = [H.Case("bias+relu, 1 thread", lambda: bias_relu(0, shape[0])),
             H.Case("bias+relu, 2 threads", lambda: two(bias_relu)),
             H.Case("relu mask product, 1 thread", lambda: mask(0, shape[0])),
             H.Case("relu mask product, 2 threads", lambda: two(mask))]
    try:
        H.interleave(cases, None, rounds=rounds, min_time=0)
    finally:
        pool.shutdown()
    return H.table([[c.label, H.fmt_ms(H.median(c)).strip()] for c in cases],
                   [f"in-place pass over {shape} float64", "ms"])


def profile_step(dtype=np.float64, steps=5, top=12):
    """cProfile of the fused tapegrad step: where the time goes, by function."""
    X, y = spiral_data(BATCH, dtype=dtype)
    trainer = FusedMLPTrainer(tapegrad, init_params((2, HIDDEN, 3), seed=1, dtype=dtype), X, y)
    trainer.run(1)
    prof = cProfile.Profile()
    prof.enable()
    trainer.run(steps)
    prof.disable()
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(top)
    return buf.getvalue()


def main(argv=None):
    p = argparse.ArgumentParser(prog="tapegrad bench scale", description=__doc__.split("\n")[0])
    p.add_argument("--threads", type=int, default=os.cpu_count(),
                   help="numpy BLAS threads (and PyTorch's second thread count)")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--quick", action="store_true", help="H=256, batch 512, 2 rounds (smoke test)")
    p.add_argument("--no-torch", action="store_true", help="leave PyTorch out")
    p.add_argument("--profile", action="store_true",
                   help="also print a cProfile of the fused float64 step")
    args = p.parse_args(argv)
    malloc = allocator_line()
    torch = None if args.no_torch else H.import_torch()
    hidden, batch = (256, 512) if args.quick else (HIDDEN, BATCH)
    rounds = 2 if args.quick else args.rounds
    with H.Threads(args.threads, torch) as threads:
        H.out(H.header(threads, torch, f"scale: spiral MLP step at H={hidden}, batch {batch}"))
        H.out(malloc)
        bandwidth = H.copy_bandwidth(32 if args.quick else 256)
        H.out(f"memory bandwidth (numpy copy, read + write, best of 7): {bandwidth:.1f} GB/s; "
              f"traffic model: {PASSES} passes over a (batch, H) array per step")
        results = {np.dtype(dt).name: measure_step(threads, torch, dt, rounds=rounds,
                                                   hidden=hidden, batch=batch)
                   for dt in (np.float64, np.float32)}
        H.out()
        H.out(f"ms/step: medians of {rounds} interleaved rounds of 3 steps; user/sys: os.times "
              "of the whole process (all threads) per step, averaged over the rounds (10 ms "
              "clock ticks)")
        H.out(step_table(results, bandwidth, hidden, batch))
        H.out()
        shape = (batch, hidden)
        d = measure_diamond(threads, torch, rounds=rounds, shape=shape)
        H.out(f"diamond (exp read by four products, {shape} float64, forward+backward), "
              f"medians of {rounds} interleaved rounds:")
        for k, (t, peak) in d.items():
            H.out(f"  {k:36s} {t * 1e3:8.2f} ms" + (
                f"   peak {peak / 2**20:7.1f} MiB allocated" if peak is not None else ""))
        H.out()
        H.out(transposed_matmul(shape, rounds=rounds))
        H.out()
        H.out(threaded_elementwise(rounds=rounds, shape=shape))
        if args.profile:
            H.out()
            H.out(profile_step())
    return results


if __name__ == "__main__":
    main()
