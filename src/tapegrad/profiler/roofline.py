"""The roofline (E3): which profiled ops are memory-bound, compute-bound or overhead-bound.

    with tapegrad.profiler.profile() as prof:
        trainer.step()
    prof.roofline()              # the table; a log-log plot in roofline.png (matplotlib)

    python -m tapegrad profile --calibrate        # (re)measure this machine's ceilings
    python -m tapegrad profile --example spiral   # the table of a spiral MLP step
    python -m tapegrad profile script.py [ARGS]   # ... of a whole script

**Ceilings** are measured, not looked up: ``calibrate()`` times numpy's matmul (the peak
GFLOP/s per float dtype), a copy and an add of arrays far larger than the caches (GB/s,
fresh outputs, as ops allocate them), and tapegrad's dispatch of an add on 1-element
tensors (the fixed cost of one op call). They are cached in
``$XDG_CACHE_HOME/tapegrad/roofline.json`` (``~/.cache`` by default), keyed by machine, and
re-measured when that key changes or on ``--calibrate``.

**Per op** (one row per name and dtype, summed over calls): FLOPs and bytes from the op
record (``Op.cost``), arithmetic intensity = FLOPs / byte, achieved GFLOP/s and GB/s. The
roof time of a call is ``max(flops / peak, bytes / bandwidth)`` (the memory roof is the
better of copy and add bandwidth). An op is

* **overhead-bound** when its roof time is below one op's fixed dispatch cost: its time is
  far above both roofs and is Python (dispatch, recording, numpy's call overhead);
* else **memory-bound** when its intensity is below the ridge point (peak / bandwidth),
* else **compute-bound**;

and ``x roof`` says how far above its roof it runs (measured time / roof time; 1.0 is on
the roof). Gradient rules are rows too (``MatmulBackward``...), with estimated FLOPs (see
``tapegrad.profiler.timing``).
"""
import json
import math
import os
import platform
import statistics
import time

import numpy as np

_FLOAT_DTYPES = ("float32", "float64")


# --- ceilings ---------------------------------------------------------------------------
def cache_path():
    """Where the calibration is cached: ``$XDG_CACHE_HOME/tapegrad/roofline.json``."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "tapegrad", "roofline.json")


def _machine():
    from tapegrad.backend import blas

    threads = getattr(blas, "num_threads", None)
    return {"node": platform.node(), "machine": platform.machine(), "cpus": os.cpu_count(),
            "numpy": np.__version__, "blas_threads": threads() if callable(threads) else None}


class Ceilings:
    """A machine's roofs: ``matmul_gflops`` per dtype name, ``copy_gbs``, ``add_gbs``,
    ``dispatch_us`` (one tapegrad op call on 1-element tensors)."""

    def __init__(self, matmul_gflops, copy_gbs, add_gbs, dispatch_us, machine=None,
                 measured=None):
        self.matmul_gflops = dict(matmul_gflops)
        self.copy_gbs, self.add_gbs, self.dispatch_us = copy_gbs, add_gbs, dispatch_us
        self.machine = machine or _machine()
        self.measured = measured or time.strftime("%Y-%m-%d %H:%M:%S")

    @property
    def bandwidth_gbs(self):
        return max(self.copy_gbs, self.add_gbs)

    def peak_gflops(self, dtype):
        return self.matmul_gflops.get(str(dtype), self.matmul_gflops["float64"])

    def ridge(self, dtype="float64"):
        """The intensity (FLOP/byte) where the two roofs meet."""
        return self.peak_gflops(dtype) / self.bandwidth_gbs

    def to_dict(self):
        return {"matmul_gflops": self.matmul_gflops, "copy_gbs": self.copy_gbs,
                "add_gbs": self.add_gbs, "dispatch_us": self.dispatch_us,
                "machine": self.machine, "measured": self.measured}

    def __repr__(self):
        peaks = ", ".join(f"{k} {v:.1f}" for k, v in self.matmul_gflops.items())
        return (f"Ceilings(matmul GFLOP/s: {peaks}; copy {self.copy_gbs:.1f} GB/s, add "
                f"{self.add_gbs:.1f} GB/s; dispatch {self.dispatch_us:.2f} us)")


def _best(fn, repeats):
    fn()  # warm: first touch of pages, BLAS threads spun up
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def calibrate(quick=False, save=True, path=None, verbose=False) -> Ceilings:
    """Measure this machine's ceilings (best of several runs) and cache them."""
    import tapegrad

    n, repeats = (512, 3) if quick else (1024, 5)
    peaks = {}
    for name in _FLOAT_DTYPES:
        a = np.random.default_rng(0).standard_normal((n, n)).astype(name)
        peaks[name] = 2 * n ** 3 / _best(lambda: a @ a, repeats) / 1e9
    size = (1 << 22) if quick else (1 << 24)  # 32 or 128 MiB of float64: past the caches
    x, y = np.ones(size), np.full(size, 2.0)
    copy = 2 * x.nbytes / _best(x.copy, repeats) / 1e9
    add = 3 * x.nbytes / _best(lambda: x + y, repeats) / 1e9
    del x, y
    a, b = tapegrad.ones(1), tapegrad.ones(1)
    calls = 200 if quick else 1000
    runs = []
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(calls):
            a + b
        runs.append((time.perf_counter() - t) / calls)
    ceilings = Ceilings(peaks, copy, add, statistics.median(runs) * 1e6)
    if verbose:
        print(ceilings)
    if save:
        path = path or cache_path()
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            json.dump(ceilings.to_dict(), f, indent=1)
    return ceilings


def load_ceilings(path=None, calibrate_if_missing=True, quick=False):
    """The cached ceilings of this machine; measured (and cached) if none fit it."""
    path = path or cache_path()
    try:
        with open(path) as f:
            d = json.load(f)
        if d.get("machine") == _machine():
            return Ceilings(d["matmul_gflops"], d["copy_gbs"], d["add_gbs"], d["dispatch_us"],
                            d["machine"], d.get("measured"))
    except (OSError, ValueError, KeyError):
        pass
    if not calibrate_if_missing:
        return None
    return calibrate(quick=quick, path=path)


# --- rows ----------------------------------------------------------------------------------
class RooflineRow:
    """One op (name and dtype) on the roofline, summed over its calls."""

    __slots__ = ("name", "dtype", "calls", "seconds", "flops", "bytes", "roof_seconds",
                 "bound", "peak_gflops")

    def __init__(self, name, dtype):
        self.name, self.dtype = name, dtype
        self.calls, self.seconds, self.flops, self.bytes = 0, 0.0, 0, 0

    intensity = property(lambda self: self.flops / self.bytes if self.bytes else math.inf)
    gflops = property(lambda self: self.flops / self.seconds / 1e9 if self.seconds else 0.0)
    gbs = property(lambda self: self.bytes / self.seconds / 1e9 if self.seconds else 0.0)
    distance = property(lambda self: self.seconds / self.roof_seconds
                        if self.roof_seconds else math.inf)

    def __repr__(self):
        return (f"RooflineRow({self.name!r}, {self.dtype}, {self.bound}, calls={self.calls}, "
                f"{self.distance:.1f}x roof)")


def classify(flops, nbytes, seconds, calls, ceilings, dtype="float64"):
    """(bound, roof seconds) of ``calls`` calls moving ``nbytes`` and doing ``flops``."""
    peak = ceilings.peak_gflops(dtype) * 1e9
    bandwidth = ceilings.bandwidth_gbs * 1e9
    compute, memory = flops / peak, nbytes / bandwidth
    roof = max(compute, memory)
    if roof / max(calls, 1) < ceilings.dispatch_us * 1e-6:
        return "overhead-bound", roof
    return ("memory-bound" if memory >= compute else "compute-bound"), roof


class Roofline:
    """The rows of a profile on this machine's roofline; ``str()`` is the table."""

    def __init__(self, rows, ceilings, plot_path=None):
        self.rows, self.ceilings, self.plot_path = rows, ceilings, plot_path

    def row(self, name, dtype=None):
        for r in self.rows:
            if r.name == name and (dtype is None or r.dtype == dtype):
                return r
        raise KeyError(f"roofline: no op {name!r} in the profile")

    def table(self, row_limit=25):
        c = self.ceilings
        peaks = ", ".join(f"{k} {v:.1f} GFLOP/s" for k, v in c.matmul_gflops.items())
        head = (f"roofs: matmul {peaks}; memory {c.bandwidth_gbs:.1f} GB/s (copy "
                f"{c.copy_gbs:.1f}, add {c.add_gbs:.1f}); ridge {c.ridge('float64'):.2f} "
                f"FLOP/B (float64); one op's dispatch {c.dispatch_us:.1f} us")
        cols = ["op", "dtype", "calls", "time", "us/call", "MFLOP", "MB", "FLOP/B", "GFLOP/s",
                "GB/s", "bound", "x roof"]
        lines = []
        for r in self.rows[:row_limit]:
            lines.append([r.name, r.dtype, str(r.calls), f"{r.seconds * 1e3:.3f} ms",
                          f"{r.seconds / r.calls * 1e6:.1f}", f"{r.flops / 1e6:.3f}",
                          f"{r.bytes / 1e6:.3f}",
                          "inf" if math.isinf(r.intensity) else f"{r.intensity:.2f}",
                          f"{r.gflops:.2f}", f"{r.gbs:.2f}", r.bound,
                          "inf" if math.isinf(r.distance) else f"{r.distance:.1f}"])
        widths = [max(len(h), *(len(x[i]) for x in lines)) if lines else len(h)
                  for i, h in enumerate(cols)]
        fmt = lambda x: "  ".join(  # noqa: E731
            s.ljust(w) if i in (0, 1, 10) else s.rjust(w)
            for i, (s, w) in enumerate(zip(x, widths)))
        total = sum(r.seconds for r in self.rows)
        by_bound = {}
        for r in self.rows:
            by_bound[r.bound] = by_bound.get(r.bound, 0.0) + r.seconds
        share = ", ".join(f"{b} {t / total:.0%}" for b, t in sorted(by_bound.items()))
        return "\n".join([head, fmt(cols), "  ".join("-" * w for w in widths)]
                         + [fmt(x) for x in lines]
                         + [f"time by bound: {share}" if total else "no timed ops"])

    __str__ = table

    def plot(self, path="roofline.png"):
        """Save the log-log roofline: both roofs, the ridge point, each op as a point sized
        by its time. Needs matplotlib (``pip install tapegrad[plot]``)."""
        try:
            import matplotlib
            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError:
            raise ImportError("roofline: the plot needs matplotlib: pip install 'tapegrad[plot]' "
                              "(or pip install matplotlib); pass plot=False for the table "
                              "only") from None
        c = self.ceilings
        bw = c.bandwidth_gbs
        pts = [r for r in self.rows if r.flops and r.bytes and r.seconds]
        lo = min([r.intensity for r in pts] + [c.ridge("float32") / 100, 1e-2])
        hi = max([r.intensity for r in pts] + [c.ridge("float32") * 100])
        fig, ax = plt.subplots(figsize=(8, 5.5))
        xs = np.logspace(math.log10(lo / 2), math.log10(hi * 2), 200)
        for name, peak in sorted(c.matmul_gflops.items()):
            ax.plot(xs, np.minimum(peak, xs * bw), label=f"roof {name} ({peak:.0f} GFLOP/s, "
                    f"{bw:.0f} GB/s)")
            ridge = peak / bw
            ax.plot([ridge], [peak], "k^")
            ax.annotate(f"ridge {ridge:.1f} FLOP/B", (ridge, peak), textcoords="offset points",
                        xytext=(5, -12), fontsize=8)
        total = sum(r.seconds for r in pts) or 1.0
        for r in pts:
            color = {"compute-bound": "tab:red", "memory-bound": "tab:blue"}.get(r.bound,
                                                                                  "tab:gray")
            ax.scatter([r.intensity], [r.gflops], s=20 + 800 * r.seconds / total, c=color,
                       alpha=0.6, edgecolors="k")
            ax.annotate(r.name, (r.intensity, r.gflops), fontsize=7, xytext=(4, 4),
                        textcoords="offset points")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("arithmetic intensity (FLOP/byte)")
        ax.set_ylabel("achieved GFLOP/s")
        ax.set_title("tapegrad roofline (red compute-, blue memory-, grey overhead-bound)")
        ax.legend(fontsize=8, loc="lower right")
        ax.grid(True, which="both", alpha=0.3)
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)
        self.plot_path = path
        return path


def rows_of(events, ceilings):
    """Roofline rows of profiled events (ops and gradient rules), slowest first."""
    groups = {}
    for e in events:
        if e.kind == "user":
            continue
        dtype = next((d for d in (e.dtypes or ()) if d in _FLOAT_DTYPES),
                     (e.dtypes or ["-"])[0])
        row = groups.get((e.name, dtype))
        if row is None:
            row = groups[(e.name, dtype)] = RooflineRow(e.name, dtype)
        row.calls += 1
        row.seconds += e.self_cpu_time_total * 1e-6
        row.flops += e.flops
        row.bytes += e.bytes_read + e.bytes_written
    for row in groups.values():
        row.peak_gflops = ceilings.peak_gflops(row.dtype)
        row.bound, row.roof_seconds = classify(row.flops, row.bytes, row.seconds, row.calls,
                                               ceilings, row.dtype)
    return sorted(groups.values(), key=lambda r: -r.seconds)


def roofline(prof, ceilings=None, plot="roofline.png", show=True, row_limit=25):
    """The roofline of a finished ``profile``: prints the table (``show``), saves the plot
    at ``plot`` (None or False: no plot) and returns a ``Roofline``."""
    ceilings = ceilings or load_ceilings()
    result = Roofline(rows_of(prof.events(), ceilings), ceilings)
    if show:
        print(result.table(row_limit))
    if plot:
        result.plot(plot)
        if show:
            print(f"roofline plot: {plot}")
    return result


# --- command line -------------------------------------------------------------------------
def _example(name, steps):
    """A workload to profile: a callable running ``steps`` training steps."""
    import tapegrad

    if name == "spiral":
        from tapegrad.bench.spiral import MLPTrainer, init_params, spiral_data

        X, y = spiral_data(512)
        trainer = MLPTrainer(tapegrad, init_params((2, 32, 3), seed=1), X, y)
        return lambda: [trainer.step() for _ in range(steps)]
    if name == "char_gpt":
        from tapegrad.examples.char_gpt import build

        vocab, block, batch = 65, 32, 16
        model = build(tapegrad, vocab, block)
        opt = tapegrad.optim.AdamW(model.parameters(), lr=3e-3)
        rng = np.random.default_rng(0)

        def run():
            for _ in range(steps):
                xb = rng.integers(0, vocab, size=(batch, block + 1))
                logits = model(tapegrad.tensor(xb[:, :-1]))
                loss = tapegrad.nn.functional.cross_entropy(
                    logits.view(-1, vocab), tapegrad.tensor(xb[:, 1:]).reshape(-1))
                opt.zero_grad()
                loss.backward()
                opt.step()
        return run
    raise ValueError(f"profile: unknown example {name!r}; choose from spiral, char_gpt")


def main(argv=None):
    """``python -m tapegrad profile``: the roofline table of a script or an example."""
    import argparse
    import runpy
    import sys

    from tapegrad.profiler.timing import profile

    p = argparse.ArgumentParser(prog="tapegrad profile", description=main.__doc__)
    p.add_argument("script", nargs="?", help="a Python script to run under the profiler")
    p.add_argument("args", nargs=argparse.REMAINDER, help="the script's arguments")
    p.add_argument("--example", choices=("spiral", "char_gpt"), help="profile a built-in step")
    p.add_argument("--steps", type=int, default=5, help="training steps of --example (5)")
    p.add_argument("--calibrate", action="store_true",
                   help="(re)measure this machine's ceilings and cache them")
    p.add_argument("--quick", action="store_true", help="a smaller, faster calibration")
    p.add_argument("--sort", default="self_cpu_time_total", help="the op table's sort key")
    p.add_argument("--rows", type=int, default=15, help="rows of each table (15)")
    p.add_argument("--trace", help="also write a Chrome trace (JSON) here")
    p.add_argument("--plot", default=None, help="save the roofline plot here (PNG)")
    args = p.parse_args(argv)
    if args.calibrate:
        c = calibrate(quick=args.quick)
        print(f"{c}\ncached in {cache_path()}")
        if not args.script and not args.example:
            return 0
    if bool(args.script) == bool(args.example):
        p.error("give a script or --example (one of them)")
    ceilings = load_ceilings(quick=args.quick)
    if args.example:
        work = _example(args.example, args.steps)
        work()  # warm: first calls allocate and fill caches
    else:
        def work():
            saved = sys.argv
            sys.argv = [args.script] + args.args
            try:
                runpy.run_path(args.script, run_name="__main__")
            finally:
                sys.argv = saved
    with profile(record_shapes=False, with_flops=True) as prof:
        work()
    print(prof.key_averages().table(sort_by=args.sort, row_limit=args.rows))
    print()
    roofline(prof, ceilings, plot=args.plot, row_limit=args.rows)
    if args.trace:
        prof.export_chrome_trace(args.trace)
        print(f"chrome trace: {args.trace}")
    return 0


__all__ = ["calibrate", "load_ceilings", "cache_path", "Ceilings", "classify", "roofline",
           "Roofline", "RooflineRow", "rows_of", "main"]
