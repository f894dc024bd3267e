"""Model training steps: the digits CNN and the character GPT, tapegrad vs PyTorch.

One full training step of each example model, written once against PyTorch's API
(``tapegrad.examples.digits_cnn`` and ``tapegrad.examples.char_gpt``): forward, loss,
``zero_grad``, backward, (GPT: ``clip_grad_norm_``), optimizer step, (GPT: scheduler step),
``loss.item()``. The CNN trains with Adam on batches of 64 digits; the GPT (2 layers, width
64, 4 heads) with AdamW, gradient clipping and a warm-up + cosine schedule on batches of
16 x 32 characters. tapegrad and PyTorch start from the same initial weights and see the same
batches in the same order; their losses over the first steps are checked to agree before any
timing. Both run in one process, interleaved round by round; the figure is the median
milliseconds per step, in float64 and float32, and "speed vs torch" is PyTorch's time over
tapegrad's (> 1: tapegrad is faster).

``--profile`` adds where each library's step goes: every phase of the step timed on its own
(median per step), and tapegrad's recorded ops ranked by time, forward and backward apart
(measured through the op watchers of ``tapegrad.autograd.engine.WATCH``), and a cProfile of
tapegrad's step for what no op records (numpy work on raw arrays, modules' Python).
"""
import argparse
import os
import statistics
import time

import numpy as np

import tapegrad
from tapegrad.autograd.engine import add_watcher, remove_watcher
from tapegrad.bench import harness as H
from tapegrad.examples import char_gpt, digits_cnn
from tapegrad.examples.common import to_torch_state

MODELS = ("cnn", "gpt")
DTYPES = (np.float64, np.float32)
PHASES = {"cnn": ("forward", "loss", "zero_grad", "backward", "optimizer", "item"),
          "gpt": ("forward", "loss", "zero_grad", "backward", "clip_grad_norm_", "optimizer",
                  "scheduler", "item")}


# --- data ----------------------------------------------------------------------------------
def cnn_data(n_batches, batch=64, seed=0):
    """``n_batches`` batches of digits (images (batch, 1, 8, 8) in [0, 1], labels)."""
    (x, y), _ = digits_cnn.load_data(seed)
    rng = np.random.default_rng(seed + 1)
    idx = [rng.choice(len(x), size=batch, replace=False) for _ in range(n_batches)]
    return [(x[i], y[i]) for i in idx]


_TEXT = {}


def gpt_data(n_batches, batch=16, block=32, seed=0):
    """The vocabulary size and ``n_batches`` (inputs, targets) batches of character indices."""
    if "data" not in _TEXT:
        text = char_gpt.load_text()
        stoi = {c: i for i, c in enumerate(sorted(set(text)))}
        _TEXT["data"] = np.array([stoi[c] for c in text], dtype=np.int64), len(stoi)
    data, vocab = _TEXT["data"]
    rng = np.random.default_rng(seed + 1)
    out = []
    for _ in range(n_batches):
        offsets = rng.integers(0, len(data) - block - 1, size=batch)
        out.append((np.stack([data[o:o + block] for o in offsets]),
                    np.stack([data[o + 1:o + block + 1] for o in offsets])))
    return vocab, out


# --- one training step, the same code for both libraries -----------------------------------
class Step:
    """One model's training step in library ``T`` from ``state`` (tapegrad tensors).

    Calling it runs the next step on the next batch (cycling) and returns the loss as a float;
    ``phased()`` runs the same step with each phase timed (returns {phase: seconds}).
    """

    def __init__(self, T, model, state, batches, dtype, seed=0):
        self.T, self.kind = T, model
        np_dtype = np.dtype(dtype)
        if model == "cnn":
            net = digits_cnn.build(T)
        else:
            self.vocab = state["tok.weight"].shape[0]
            net = char_gpt.build(T, self.vocab)
        net.load_state_dict(state if T is tapegrad else to_torch_state(state))
        if np_dtype == np.float32:
            net.float()
        self.model = net
        if model == "cnn":
            self.opt = T.optim.Adam(net.parameters(), lr=3e-3)
            self.sched = None
            self.batches = [(T.tensor(x.astype(np_dtype)), T.tensor(y)) for x, y in batches]
        else:
            # the example's optimizer and schedule: 1000 planned steps, 100 of warm-up
            self.opt, self.sched = char_gpt.make_optimizer(T, net, 1000, 100)
            self.batches = [(T.tensor(x), T.tensor(y).view(-1)) for x, y in batches]
        self.F = T.nn.functional
        self.clip = T.nn.utils.clip_grad_norm_
        self.i = 0

    def _batch(self):
        b = self.batches[self.i % len(self.batches)]
        self.i += 1
        return b

    def __call__(self):
        x, y = self._batch()
        out = self.model(x)
        if self.kind == "cnn":
            loss = self.F.cross_entropy(out, y)
        else:
            loss = self.F.cross_entropy(out.view(-1, self.vocab), y)
        self.opt.zero_grad()
        loss.backward()
        if self.kind == "gpt":
            self.clip(self.model.parameters(), 1.0)
        self.opt.step()
        if self.sched is not None:
            self.sched.step()
        return loss.item()

    def phased(self):
        """The same step as ``__call__``, each phase timed with ``time.perf_counter``."""
        clock = time.perf_counter
        x, y = self._batch()
        t = {}
        t0 = clock()
        out = self.model(x)
        t1 = clock()
        if self.kind == "cnn":
            loss = self.F.cross_entropy(out, y)
        else:
            loss = self.F.cross_entropy(out.view(-1, self.vocab), y)
        t2 = clock()
        self.opt.zero_grad()
        t3 = clock()
        loss.backward()
        t4 = clock()
        t["forward"], t["loss"], t["zero_grad"], t["backward"] = t1 - t0, t2 - t1, t3 - t2, t4 - t3
        if self.kind == "gpt":
            self.clip(self.model.parameters(), 1.0)
            t5 = clock()
            t["clip_grad_norm_"] = t5 - t4
            t4 = t5
        self.opt.step()
        t5 = clock()
        t["optimizer"] = t5 - t4
        if self.sched is not None:
            self.sched.step()
            t6 = clock()
            t["scheduler"] = t6 - t5
            t5 = t6
        loss.item()
        t["item"] = clock() - t5
        return t


def initial_state(model, seed=0):
    """tapegrad's freshly initialised float64 weights for ``model`` ('cnn' or 'gpt')."""
    tapegrad.manual_seed(seed)
    if model == "cnn":
        net = digits_cnn.build(tapegrad)
    else:
        net = char_gpt.build(tapegrad, gpt_data(0)[0])
    return {k: v.detach().clone() for k, v in net.state_dict().items()}


def make_data(model, n_batches, seed=0):
    return cnn_data(n_batches, seed=seed) if model == "cnn" else gpt_data(n_batches, seed=seed)[1]


def agreement(model, dtype, torch, steps=3, seed=0):
    """The losses of ``steps`` fresh training steps in each library, and their largest
    relative difference (same initial weights, same batches)."""
    state, batches = initial_state(model, seed), make_data(model, steps, seed)
    ours = Step(tapegrad, model, state, batches, dtype)
    ref = Step(torch, model, state, batches, dtype)
    a = [ours() for _ in range(steps)]
    b = [ref() for _ in range(steps)]
    diff = max(abs(x - y) / max(abs(y), 1e-300) for x, y in zip(a, b))
    return a, b, diff


# --- timing --------------------------------------------------------------------------------
def measure(threads, torch, models=MODELS, dtypes=DTYPES, rounds=7, min_time=0.05,
            n_batches=16, seed=0):
    """Median seconds per step for each (model, dtype); PyTorch at its best thread count."""
    rows = []
    for model in models:
        state, batches = initial_state(model, seed), make_data(model, n_batches, seed)
        for dtype in dtypes:
            row = {"model": model, "dtype": np.dtype(dtype).name}
            if torch is not None:
                _, _, row["loss_diff"] = agreement(model, dtype, torch, seed=seed)
            cases = {"tapegrad": [H.Case("tapegrad", Step(tapegrad, model, state, batches,
                                                           dtype))]}
            if torch is not None:
                cases["torch"] = H.torch_cases(
                    "torch", lambda: Step(torch, model, state, batches, dtype), threads,
                    threads.blas)
            flat = [c for group in cases.values() for c in group]
            H.interleave(flat, threads, rounds=rounds, min_time=min_time, warmup=2)
            row["per_step"] = {lib: H.median(H.best(g)) for lib, g in cases.items()}
            row["spread"] = {lib: H.spread(H.best(g)) for lib, g in cases.items()}
            row["torch_threads"] = H.best(cases["torch"]).torch_threads if torch else None
            rows.append(row)
    return rows


def report(rows, torch):
    headers = ["model", "dtype", "tapegrad ms/step", "spread"]
    if torch is not None:
        headers += ["torch ms/step", "spread", "torch threads", "tapegrad speed vs torch",
                    "loss rel. diff (3 steps)"]
    table = []
    for r in rows:
        m, s = r["per_step"], r["spread"]
        row = [MODEL_NAMES[r["model"]], r["dtype"], H.fmt_ms(m["tapegrad"]).strip(),
               f"{s['tapegrad']:.0%}"]
        if torch is not None:
            row += [H.fmt_ms(m["torch"]).strip(), f"{s['torch']:.0%}", str(r["torch_threads"]),
                    f"{m['torch'] / m['tapegrad']:.2f}x", f"{r['loss_diff']:.1e}"]
        table.append(row)
    return H.table(table, headers)


MODEL_NAMES = {"cnn": "digits CNN (Adam, batch 64)",
               "gpt": "char GPT (AdamW+clip+sched, 16x32)"}


# --- profile -------------------------------------------------------------------------------
class OpTimer:
    """An op watcher (see ``tapegrad.autograd.engine.WATCH``): wall time and calls per op,
    forward (top-level dispatches; ops called inside an op count towards it) and backward
    (each node's gradient rule)."""

    def __init__(self):
        self.forward, self.backward = {}, {}
        self._t = None

    def __enter__(self):
        add_watcher(self)
        return self

    def __exit__(self, *exc):
        remove_watcher(self)

    def before_op(self, op):
        self._t = time.perf_counter()

    def after_op(self, op, args, out):
        _add(self.forward, op.name, time.perf_counter() - self._t)

    def before_backward(self, node):
        self._t = time.perf_counter()

    def after_backward(self, node, grads):
        _add(self.backward, node.op.name, time.perf_counter() - self._t)


def _add(table, name, dt):
    total, calls = table.get(name, (0.0, 0))
    table[name] = (total + dt, calls + 1)


def phases(threads, torch, model, dtype, steps=30, seed=0):
    """Median seconds of each phase of the step, per library (PyTorch at one thread and at
    the full count, the faster total kept), steps interleaved library by library."""
    state, batches = initial_state(model, seed), make_data(model, 16, seed)
    libs = {"tapegrad": [(Step(tapegrad, model, state, batches, dtype), None)]}
    if torch is not None:
        counts = [1] if threads.blas == 1 else [1, threads.blas]
        libs["torch"] = [(Step(torch, model, state, batches, dtype), n) for n in counts]
    samples = {(lib, n): [] for lib, group in libs.items() for _, n in group}
    for step, n in (s for group in libs.values() for s in group):  # warm-up
        with _threads(threads, n):
            step.phased()
    for _ in range(steps):
        for lib, group in libs.items():
            for step, n in group:
                with _threads(threads, n):
                    samples[(lib, n)].append(step.phased())
    result = {}
    for lib, group in libs.items():
        best = None
        for _, n in group:
            med = {p: statistics.median(s[p] for s in samples[(lib, n)])
                   for p in PHASES[model]}
            total = statistics.median(sum(s.values()) for s in samples[(lib, n)])
            if best is None or total < best[1]:
                best = (med, total, n)
        result[lib] = best
    return result


def _threads(threads, n):
    import contextlib

    return contextlib.nullcontext() if n is None else threads.torch_threads(n)


def op_profile(model, dtype, steps=30, seed=0):
    """tapegrad's per-op time over ``steps`` steps (after one warm-up), per step."""
    state, batches = initial_state(model, seed), make_data(model, 16, seed)
    step = Step(tapegrad, model, state, batches, dtype)
    step()
    timer = OpTimer()
    t0 = time.perf_counter()
    with timer:
        for _ in range(steps):
            step()
    watched = (time.perf_counter() - t0) / steps
    return timer, watched, steps


def phase_report(result, model):
    headers = ["phase", "tapegrad ms"]
    has_torch = "torch" in result
    if has_torch:
        headers += [f"torch ms (@{result['torch'][2]})", "tapegrad - torch ms"]
    rows = []
    for p in PHASES[model] + ("step (sum)",):
        if p == "step (sum)":
            ours = sum(result["tapegrad"][0].values())
            ref = sum(result["torch"][0].values()) if has_torch else None
        else:
            ours = result["tapegrad"][0][p]
            ref = result["torch"][0][p] if has_torch else None
        row = [p, f"{ours * 1e3:.3f}"]
        if has_torch:
            row += [f"{ref * 1e3:.3f}", f"{(ours - ref) * 1e3:+.3f}"]
        rows.append(row)
    return H.table(rows, headers)


def op_report(timer, watched, steps, top=12):
    lines = []
    fwd = sum(t for t, _ in timer.forward.values()) / steps
    bwd = sum(t for t, _ in timer.backward.values()) / steps
    lines.append(f"watched step {watched * 1e3:.2f} ms (the watcher adds its own cost): "
                 f"recorded ops' forward {fwd * 1e3:.2f} ms, gradient rules {bwd * 1e3:.2f} ms, "
                 f"the rest (modules' Python, tape walk, optimizer, clipping) "
                 f"{(watched - fwd - bwd) * 1e3:.2f} ms")
    for title, table in (("forward", timer.forward), ("backward rule", timer.backward)):
        ranked = sorted(table.items(), key=lambda kv: -kv[1][0])[:top]
        rows = [[name, f"{c / steps:g}", f"{t / steps * 1e3:.3f}", f"{t / c * 1e6:.1f}"]
                for name, (t, c) in ranked]
        lines.append("")
        lines.append(f"top {len(rows)} ops by {title} time, per step:")
        lines.append(H.table(rows, ["op", "calls", "ms", "us/call"]))
    return "\n".join(lines)


def function_profile(model, dtype, steps=30, top=12, seed=0):
    """cProfile of tapegrad's step: the ``top`` functions by own time, in ms per step.

    This sees what the op watchers cannot: numpy calls made outside any recorded op (index
    computations on raw arrays, im2col copies) and the Python of modules and the tape."""
    import cProfile
    import pstats

    state, batches = initial_state(model, seed), make_data(model, 16, seed)
    step = Step(tapegrad, model, state, batches, dtype)
    step()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(steps):
        step()
    prof.disable()
    stats = pstats.Stats(prof).stats  # (file, line, name) -> (calls, ncalls, tottime, cum, ...)
    total = sum(v[2] for v in stats.values())
    ranked = sorted(stats.items(), key=lambda kv: -kv[1][2])[:top]
    rows = []
    for (path, line, name), (_, ncalls, tottime, cumtime, _) in ranked:
        where = name if path == "~" else f"{name} ({_short(path)}:{line})"
        rows.append([where, f"{ncalls / steps:g}", f"{tottime / steps * 1e3:.3f}",
                     f"{cumtime / steps * 1e3:.3f}"])
    return (f"cProfile, {steps} steps (profiled step {total / steps * 1e3:.2f} ms; profiling "
            f"inflates Python-heavy code): top {len(rows)} functions by own time, per step\n"
            + H.table(rows, ["function", "calls", "own ms", "cumulative ms"]))


def _short(path):
    parts = path.replace(os.sep, "/").split("/")
    if "tapegrad" in parts:
        return "/".join(parts[len(parts) - 1 - parts[::-1].index("tapegrad"):])
    return parts[-1]


# --- command line --------------------------------------------------------------------------
def main(argv=None):
    p = argparse.ArgumentParser(prog="tapegrad bench models", description=__doc__.split("\n")[0])
    p.add_argument("--model", choices=("all",) + MODELS, default="all")
    p.add_argument("--dtype", choices=("all", "float64", "float32"), default="all")
    p.add_argument("--threads", type=int, default=os.cpu_count(),
                   help="numpy BLAS threads (and PyTorch's second thread count)")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--quick", action="store_true", help="2 rounds of a few steps (smoke test)")
    p.add_argument("--no-torch", action="store_true", help="leave PyTorch out")
    p.add_argument("--profile", action="store_true",
                   help="also time each phase of the step, rank tapegrad's ops by time (op "
                        "watchers) and its functions by own time (cProfile)")
    args = p.parse_args(argv)
    torch = None if args.no_torch else H.import_torch()
    models = MODELS if args.model == "all" else (args.model,)
    dtypes = DTYPES if args.dtype == "all" else (np.dtype(args.dtype).type,)
    with H.Threads(args.threads, torch) as threads:
        H.out(H.header(threads, torch, "model training steps"))
        rows = measure(threads, torch, models, dtypes, rounds=2 if args.quick else args.rounds,
                       min_time=0 if args.quick else 0.05)
        H.out()
        H.out("median milliseconds per training step (forward, loss, backward, optimizer); "
              "speed vs torch = torch time / tapegrad time; spread = interquartile range / "
              "median")
        H.out(report(rows, torch))
        if args.profile:
            steps = 3 if args.quick else 30
            for model in models:
                for dtype in dtypes:
                    name = f"{MODEL_NAMES[model]}, {np.dtype(dtype).name}"
                    H.out()
                    H.out(f"-- where the step goes: {name} --")
                    H.out(f"each phase timed on its own, median over {steps} interleaved steps")
                    H.out(phase_report(phases(threads, torch, model, dtype, steps), model))
                    H.out()
                    H.out(op_report(*op_profile(model, dtype, steps)))
                    H.out()
                    H.out(function_profile(model, dtype, steps))
    return rows


if __name__ == "__main__":
    main()
