"""Timing harness: thread control, interleaved medians, machine facts.

Every benchmark times its contestants (tapegrad, PyTorch, raw numpy) in one process, one
run of each in turn per round, so that a burst of load on a shared machine hits all of them
alike; the figure reported is the median over rounds. Thread counts are set explicitly:
numpy's BLAS through threadpoolctl (it never touches PyTorch's MKL/OpenMP), PyTorch through
``torch.set_num_threads``. PyTorch is reported at its best: each of its timings is taken at
one thread and at the full thread count, interleaved, and the faster median is kept (with the
thread count that won printed), so a ratio never flatters tapegrad by catching PyTorch's
OpenMP workers asleep. A case can set numpy's BLAS count for itself as well
(``Case.blas_threads``, ``blas_cases``): ``bench suite`` times tapegrad so, at its default
count and at one, as it times PyTorch.
"""
import contextlib
import gc
import os
import platform
import statistics
import sys
import time

import numpy as np


# --- libraries ---------------------------------------------------------------------------
def import_torch():
    """PyTorch, or None when it is not installed (the benchmarks then run without it)."""
    try:
        import torch
    except ImportError:
        return None
    return torch


class Threads:
    """Sets numpy's BLAS threads (threadpoolctl) and PyTorch's intra-op threads.

    ``blas=None`` leaves numpy's BLAS at the count it has (its default: what a user gets).
    A context manager: on exit numpy's BLAS gets back the thread count it had before.
    """

    def __init__(self, blas, torch_module=None):
        self.blas = blas
        self.torch = torch_module
        self._controller = None
        try:
            from threadpoolctl import ThreadpoolController
        except ImportError:
            self._controller = None
        else:
            controller = ThreadpoolController()
            # numpy's own BLAS only: PyTorch's MKL/OpenMP are set by torch.set_num_threads
            numpy_dir = os.path.dirname(np.__file__)
            site = os.path.dirname(numpy_dir)
            self._libs = [lib for lib in controller.lib_controllers
                          if lib.user_api == "blas" and lib.filepath.startswith(site)
                          and "numpy" in lib.filepath]
            self._controller = controller
        self._before = [lib.num_threads for lib in self._libs] if self._controller else []
        if blas is not None:
            self.set_blas(blas)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.restore()

    def restore(self):
        if self._controller is not None:
            for lib, n in zip(self._libs, self._before):
                lib.set_num_threads(n)

    @property
    def has_threadpoolctl(self):
        return self._controller is not None

    def set_blas(self, n):
        if self._controller is not None:
            for lib in self._libs:
                lib.set_num_threads(n)

    def blas_count(self):
        """numpy's BLAS thread count now (None without threadpoolctl or a BLAS)."""
        return self._libs[0].num_threads if self._controller is not None and self._libs \
            else None

    @contextlib.contextmanager
    def blas_threads(self, n):
        """numpy's BLAS at ``n`` threads inside, its count before restored after."""
        before = self.blas_count()
        if before is None or before == n:
            yield
            return
        self.set_blas(n)
        try:
            yield
        finally:
            self.set_blas(before)

    def blas_description(self):
        if self._controller is None:
            return "numpy BLAS threads: not controlled (threadpoolctl missing)"
        libs = ", ".join(f"{lib.internal_api} {lib.version} ({lib.num_threads} threads)"
                         for lib in self._libs)
        return f"numpy BLAS: {libs or 'none found'}"

    @contextlib.contextmanager
    def torch_threads(self, n):
        if self.torch is None:
            yield
            return
        before = self.torch.get_num_threads()
        self.torch.set_num_threads(n)
        try:
            yield
        finally:
            self.torch.set_num_threads(before)


# --- timing ------------------------------------------------------------------------------
class Case:
    """One contestant: ``fn()`` runs the workload once; ``torch_threads`` is PyTorch's count,
    ``blas_threads`` numpy's BLAS count while it runs (None: each left as it is)."""

    def __init__(self, label, fn, torch_threads=None, blas_threads=None):
        self.label = label
        self.fn = fn
        self.torch_threads = torch_threads
        self.blas_threads = blas_threads
        self.number = 1
        self.times = []  # seconds per call, one entry per round


def _calibrate(fn, min_time):
    """How many calls make one timed batch last at least ``min_time`` seconds."""
    number = 1
    while True:
        t0 = time.perf_counter()
        for _ in range(number):
            fn()
        elapsed = time.perf_counter() - t0
        if elapsed >= min_time or number >= 1 << 20:
            return number
        number = max(number * 2, int(number * min_time / max(elapsed, 1e-9)) + 1)


def interleave(cases, threads, rounds=15, min_time=0.005, warmup=1):
    """Time every case once per round, in turn; each ``Case.times`` gets ``rounds`` entries.

    A round of one case calls it ``number`` times back to back (calibrated so the batch lasts
    ``min_time`` seconds) and records the mean per call; medians over rounds are reported.
    """
    for case in cases:
        with _case_threads(threads, case):
            for _ in range(warmup):
                case.fn()
            case.number = _calibrate(case.fn, min_time) if min_time else 1
    for _ in range(rounds):
        gc.collect()  # once per round; the garbage collector stays on while timing
        for case in cases:
            with _case_threads(threads, case):
                fn, number = case.fn, case.number
                t0 = time.perf_counter()
                for _ in range(number):
                    fn()
                case.times.append((time.perf_counter() - t0) / number)
    return cases


@contextlib.contextmanager
def _case_threads(threads, case):
    """The case's PyTorch and numpy BLAS thread counts while it runs."""
    with contextlib.ExitStack() as stack:
        if case.torch_threads is not None:
            stack.enter_context(threads.torch_threads(case.torch_threads))
        if getattr(case, "blas_threads", None) is not None:
            stack.enter_context(threads.blas_threads(case.blas_threads))
        yield


def median(case):
    return statistics.median(case.times)


def spread(case):
    """Interquartile range over the median: how noisy the rounds were."""
    if len(case.times) < 4:
        return 0.0
    q = statistics.quantiles(case.times, n=4)
    return (q[2] - q[0]) / statistics.median(case.times)


def torch_cases(label, make_fn, threads, blas_threads):
    """PyTorch at one thread and at ``blas_threads`` (if more): the best is reported."""
    counts = [1] if blas_threads == 1 else [1, blas_threads]
    return [Case(f"{label}@{n}", make_fn(), torch_threads=n) for n in counts]


def best(cases):
    """The case with the smallest median (PyTorch's best thread count)."""
    return min(cases, key=median)


def blas_cases(label, make_fn, counts):
    """One case per numpy BLAS thread count in ``counts`` (duplicates dropped), labelled
    ``label@n``: a library at its default count and at one, the best reported."""
    return [Case(f"{label}@{n}", make_fn(), blas_threads=n) for n in dict.fromkeys(counts)]


# --- machine -----------------------------------------------------------------------------
def copy_bandwidth(mbytes=256, repeats=7):
    """Memory bandwidth in GB/s: the fastest of ``repeats`` numpy copies of a large array,
    counting read + write (the machine's bound, so the best run, not the median)."""
    n = mbytes * (1 << 20) // 8
    src = np.ones(n)
    dst = np.empty_like(src)
    np.copyto(dst, src)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        times.append(time.perf_counter() - t0)
    return 2 * src.nbytes / min(times) / 1e9


def matmul_gflops(n, dtype, repeats=7):
    """numpy's own (n, n) @ (n, n) peak in GFLOP/s: the fastest of ``repeats``."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, n)).astype(dtype)
    b = rng.standard_normal((n, n)).astype(dtype)
    a @ b
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        a @ b
        times.append(time.perf_counter() - t0)
    return 2 * n ** 3 / min(times) / 1e9


def cpu_model():
    """The processor's name (Linux: /proc/cpuinfo), or platform's guess elsewhere."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def header(threads, torch_module, title):
    """The lines every benchmark prints first: what ran where, with how many threads."""
    import tapegrad

    load = os.getloadavg() if hasattr(os, "getloadavg") else ("?",) * 3
    lines = [f"== {title} ==",
             (f"machine: {platform.machine()} {cpu_model()}, "
              f"{os.cpu_count()} logical CPUs, load average {load[0]:.2f} {load[1]:.2f} "
              f"{load[2]:.2f}"),
             (f"python {platform.python_version()}, numpy {np.__version__}, "
              f"tapegrad {tapegrad.__version__}, "
              + (f"torch {torch_module.__version__}" if torch_module else "torch not installed")),
             f"threads: {threads.blas_description()}"]
    if torch_module is not None:
        policy = os.environ.get("OMP_WAIT_POLICY", "unset (libgomp default)")
        counts = "(1)" if threads.blas == 1 else f"(1) and ({threads.blas}), best median reported"
        lines.append(f"threads: PyTorch timed at torch.set_num_threads{counts}; "
                     f"OMP_WAIT_POLICY={policy}")
    lines.append("timing: contestants interleaved round by round in one process; "
                 "figures are medians over rounds")
    return "\n".join(lines)


def fmt_us(seconds):
    return f"{seconds * 1e6:9.1f}"


def fmt_ms(seconds):
    return f"{seconds * 1e3:9.2f}"


def table(rows, headers):
    """A plain-text table with right-aligned columns (the first left-aligned)."""
    cols = list(zip(*([headers] + rows)))
    widths = [max(len(str(c)) for c in col) for col in cols]
    out = []
    for k, row in enumerate([headers] + rows):
        cells = [str(c).ljust(w) if i == 0 else str(c).rjust(w)
                 for i, (c, w) in enumerate(zip(row, widths))]
        out.append("  ".join(cells).rstrip())
        if k == 0:
            out.append("  ".join("-" * w for w in widths))
    return "\n".join(out)


def out(text=""):
    print(text)
    sys.stdout.flush()
