"""``tapegrad bench suite``: training steps of models the compiler was never tuned on.

Seventeen small models of the common families (``bench.suite_models``: transformers, CNNs,
recurrent nets, an MLP-Mixer, MLPs, a VAE, graph networks), each written once against a
``torch``-like module, so the same source trains under tapegrad and under PyTorch from the
same initial weights (tapegrad's initialisation, copied) on the same batch. A step is the
whole of training: ``zero_grad``, forward, loss, ``backward()``, optimizer step (SGD, Adam,
AdamW by model); it returns the loss.

For each model and dtype the suite reports what ``tapegrad.compile`` made of the step
(``explain``: graphs and graph breaks of one call; the compiled function's cache after the
checked steps), whether the compiled step equals the eager one over N steps from identical
weights (bitwise, else the largest relative difference over losses and final parameters),
the first-call compile time (trace, passes, code generation and one run) of a new compiled
function after the same step was compiled once in the process (numba's disk cache and the
generated modules warm; the process's first compile is given as "cold"), and the median
milliseconds per step of tapegrad eager, tapegrad compiled, PyTorch eager and, with
``--inductor``, ``torch.compile`` (inductor, of the model's forward and loss; backward and
optimizer eager, at one thread).

Threads: every library is timed as a user gets it and at its best. tapegrad eager and
compiled run at numpy's BLAS default count (tapegrad deciding per product whether a product
takes a second thread, ``backend.blas.runs_serial``) and with the BLAS at one thread;
PyTorch eager at its default ``torch.get_num_threads()`` and at one. Each figure is the
faster of the two, with the count that gave it in brackets. ``--threads N`` pins numpy's
BLAS at N for tapegrad instead.

Every (model, dtype) runs in its own process (``python -m tapegrad.bench.suite --worker``),
so a crash or a leak in one cannot touch the next, and what one model's compilation loaded
does not warm another's; inside it the contestants are timed by ``harness.interleave``, one
calibrated batch of steps each in turn, round after round, the median over rounds reported.
"""
import argparse
import json
import math
import os
import subprocess
import sys
import time

import numpy as np

from tapegrad.bench import harness
from tapegrad.bench.suite_models import SPECS

DTYPES = ("float32", "float64")
CHECK_STEPS = 5
# the first call traces and runs eagerly, the second traces again (gradients now exist at the
# call: a second guard set), the third is the first to run generated code
QUICK_CHECK_STEPS = 3


# --- one model's step, the same code for both libraries ------------------------------------
def initial_state(name, seed=0):
    """tapegrad's freshly initialised weights (and buffers) of suite model ``name``, as numpy
    arrays: the starting point of every library and dtype."""
    import tapegrad

    tapegrad.manual_seed(seed)
    net = SPECS[name].build(tapegrad)
    return {k: np.array(v.detach().numpy()) for k, v in net.state_dict().items()}


def batch_arrays(name, seed=0):
    """The model's one training batch as numpy arrays (floats float64)."""
    return SPECS[name].batch(np.random.default_rng(seed))


def _cast(a, dtype):
    return a.astype(dtype) if a.dtype.kind == "f" else a


def make_step(T, name, dtype, state=None, batch=None):
    """``(step, net, opt, inputs)`` of suite model ``name`` in library ``T`` at ``dtype``:
    ``step(*inputs)`` runs one training step and returns the loss tensor."""
    s = SPECS[name]
    state = initial_state(name) if state is None else state
    batch = batch_arrays(name) if batch is None else batch
    net = s.build(T).to(getattr(T, dtype))
    net.load_state_dict({k: T.tensor(_cast(v, dtype)) for k, v in state.items()})
    opt = s.optimizer(T, net.parameters())
    inputs = [T.tensor(_cast(a, dtype)) for a in batch]

    def step(*b):
        opt.zero_grad()
        loss = s.loss(T, net, *b)
        loss.backward()
        opt.step()
        return loss

    return step, net, opt, inputs


def final_state(net):
    """The net's parameters and buffers as float64 numpy arrays (for comparisons)."""
    return {k: np.array(v.detach().cpu().numpy() if hasattr(v, "cpu") else v.detach().numpy(),
                        dtype=np.float64) for k, v in net.state_dict().items()}


def max_rel_diff(a_losses, a_state, b_losses, b_state):
    """The largest difference between two runs: per loss |a - b| / |b|; per tensor
    max|a - b| over the largest magnitude of any tensor of ``b`` (the model's scale).

    Not per tensor: a parameter whose gradient is zero in exact arithmetic (an attention key
    bias; a bias feeding only a LayerNorm) gets rounding noise as its gradient, which Adam
    divides by its own size, so its moves are noise on the scale of ``lr * noise / eps`` and
    only meaningful against the weights around it.
    """
    worst = 0.0
    for x, y in zip(a_losses, b_losses):
        worst = max(worst, abs(x - y) / max(abs(y), 1e-300))
    scale = max((np.max(np.abs(y)) for y in b_state.values() if y.size), default=0.0)
    for k, y in b_state.items():
        if y.size:
            d = np.max(np.abs(a_state[k] - y))
            worst = max(worst, d / scale if scale > 0 else d)
    return worst


def run_steps(T, name, dtype, steps, wrap=None):
    """``(losses, final state)`` of ``steps`` steps from the initial weights; ``wrap`` (e.g.
    ``tapegrad.compile``) is applied to the step function first."""
    step, net, _, inputs = make_step(T, name, dtype)
    if wrap is not None:
        step = wrap(step)
    losses = [step(*inputs).item() for _ in range(steps)]
    return losses, final_state(net)


# --- the worker: one model at one dtype ------------------------------------------------------
def _inductor_cache():
    path = os.path.join(os.path.expanduser("~"), ".cache", "tapegrad", "inductor")
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", path)


def _compile_facts(tapegrad, name, dtype, eager, steps):
    """What ``tapegrad.compile`` makes of the step: graphs/breaks of one traced call, the
    cache after ``steps`` calls, compiled == ``eager`` (losses, state), compile times."""
    facts = {}
    step, _, _, inputs = make_step(tapegrad, name, dtype)
    t0 = time.perf_counter()
    ex = tapegrad.compiler.explain(step)(*inputs)
    facts["compile_cold_s"] = time.perf_counter() - t0
    facts["graphs"], facts["breaks"] = ex.graph_count, ex.graph_break_count
    facts["break_reasons"] = [str(b.reason).splitlines()[0][:160] for b in ex.break_reasons]
    step, _, _, inputs = make_step(tapegrad, name, dtype)
    compiled = tapegrad.compile(step)
    t0 = time.perf_counter()
    compiled(*inputs)
    facts["compile_warm_s"] = time.perf_counter() - t0
    eager_l, eager_s = eager
    holder = {}

    def wrap(fn):
        holder["c"] = tapegrad.compile(fn)
        return holder["c"]

    comp_l, comp_s = run_steps(tapegrad, name, dtype, steps, wrap=wrap)
    c = holder["c"]
    facts["cache_graphs"], facts["cache_breaks"] = len(c.entries), len(c.breaks)
    facts["eager_reruns"] = sum(getattr(e, "n_fallbacks", 0) for e in c.entries)
    facts["bitwise"] = (eager_l == comp_l
                        and all(np.array_equal(eager_s[k], comp_s[k]) for k in eager_s))
    facts["compiled_rel_diff"] = max_rel_diff(comp_l, comp_s, eager_l, eager_s)
    return facts, compiled


def worker(args):
    """Measure one model at one dtype; print one JSON line of results."""
    import tapegrad

    _inductor_cache()
    torch = None if args.no_torch else harness.import_torch()
    name, dtype = args.worker
    res = {"model": name, "dtype": dtype}
    torch_default = torch.get_num_threads() if torch is not None else 1
    # tapegrad as a user gets it (numpy's BLAS at its default count, tapegrad deciding per
    # product) and at one thread, as PyTorch below; --threads N times N alone
    blas_counts = [args.threads] if args.threads else [tapegrad.get_num_threads() or 1, 1]
    with harness.Threads(args.threads, torch) as threads:
        steps = QUICK_CHECK_STEPS if args.quick else CHECK_STEPS
        eager = run_steps(tapegrad, name, dtype, steps)
        res["check_steps"] = steps
        try:
            facts, compiled = _compile_facts(tapegrad, name, dtype, eager, steps)
            res.update(facts)
        except Exception as e:  # a compiler failure is a finding: report it, time the rest
            res["compile_error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"
            compiled = None

        def eager_step():
            step, _, _, inputs = make_step(tapegrad, name, dtype)
            return lambda: step(*inputs)

        def compiled_step():
            cstep, _, _, cinputs = make_step(tapegrad, name, dtype)
            cfn = tapegrad.compile(cstep)
            return lambda: cfn(*cinputs)

        own = {"tapegrad eager": harness.blas_cases("tapegrad eager", eager_step, blas_counts)}
        if compiled is not None:
            own["tapegrad compiled"] = harness.blas_cases("tapegrad compiled", compiled_step,
                                                          blas_counts)
        cases = [c for group in own.values() for c in group]
        n_own = len(cases)
        if torch is not None:
            if args.inductor:
                with threads.torch_threads(1):
                    res.update(_inductor_case(torch, name, dtype, cases, steps))
            counts = sorted({1, torch_default})

            def torch_step():
                tstep, _, _, tinputs = make_step(torch, name, dtype)
                return lambda: tstep(*tinputs)

            tcases = [harness.Case(f"PyTorch eager@{n}", torch_step(), torch_threads=n)
                      for n in counts]
            cases += tcases
            res["torch_rel_diff"] = max_rel_diff(*eager, *run_steps(torch, name, dtype, steps))
        harness.interleave(cases, threads, rounds=args.rounds, min_time=args.min_time,
                           warmup=2)
        for label, group in own.items():
            best = harness.best(group)
            res[label], res[label + " threads"] = harness.median(best), best.blas_threads
        for c in cases[n_own:]:
            if c.label.startswith("torch.compile"):
                res["torch.compile"] = harness.median(c)
        if torch is not None:
            best = harness.best(tcases)
            res["PyTorch eager"], res["torch_threads"] = harness.median(best), best.torch_threads
        res["spread"] = max(harness.spread(c) for c in cases)
        res["medians"] = {c.label: harness.median(c) for c in cases}  # every count timed
    print("RESULT " + json.dumps(res))
    sys.stdout.flush()
    return 0


def _inductor_case(torch, name, dtype, cases, steps):
    """torch.compile (inductor) of the model's forward and loss; its compile time and its
    agreement with PyTorch eager; appends its timing case."""
    s = SPECS[name]
    out = {}

    def compiled_run():
        _, net, opt, inputs = make_step(torch, name, dtype)
        loss_fn = torch.compile(lambda *b: s.loss(torch, net, *b))

        def cstep(*b):
            opt.zero_grad()
            loss = loss_fn(*b)
            loss.backward()
            opt.step()
            return loss

        return cstep, net, inputs

    try:
        cstep, net, inputs = compiled_run()
        t0 = time.perf_counter()
        losses = [cstep(*inputs).item()]
        out["inductor_compile_s"] = time.perf_counter() - t0
        losses += [cstep(*inputs).item() for _ in range(steps - 1)]
        ref_l, ref_s = run_steps(torch, name, dtype, steps)
        out["inductor_rel_diff"] = max_rel_diff(losses, final_state(net), ref_l, ref_s)
        tstep, _, tinputs = compiled_run()
        tstep(*tinputs)
        cases.append(harness.Case("torch.compile@1", lambda: tstep(*tinputs), torch_threads=1))
    except Exception as e:
        out["inductor_error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"
    return out


# --- the parent: one worker process per (model, dtype), then the table ---------------------
def _worker_argv(args, name, dtype):
    argv = [sys.executable, "-m", "tapegrad.bench.suite", "--worker", name, dtype,
            "--rounds", str(args.rounds), "--min-time", str(args.min_time)]
    if args.threads:
        argv += ["--threads", str(args.threads)]
    flags = [("--quick", args.quick), ("--inductor", args.inductor),
             ("--no-torch", args.no_torch)]
    return argv + [flag for flag, on in flags if on]


def run_worker(args, name, dtype):
    """The result dict of one worker process (``error`` set when it failed)."""
    t0 = time.perf_counter()
    try:
        p = subprocess.run(_worker_argv(args, name, dtype), capture_output=True, text=True,
                           timeout=args.timeout)
    except subprocess.TimeoutExpired:
        return {"model": name, "dtype": dtype, "error": f"timed out after {args.timeout} s"}
    for line in p.stdout.splitlines():
        if line.startswith("RESULT "):
            res = json.loads(line[len("RESULT "):])
            res["wall_s"] = time.perf_counter() - t0
            return res
    tail = (p.stderr.strip().splitlines() or ["no output"])[-1]
    return {"model": name, "dtype": dtype, "error": f"worker exit {p.returncode}: {tail[:300]}"}


def _ms(res, key):
    v = res.get(key)
    return "-" if v is None else f"{v * 1e3:.2f}"


def _ms_threads(res, key, threads_key):
    """Milliseconds with the thread count that gave them: ``5.20 (2)``."""
    count = res.get(threads_key)
    return _ms(res, key) if key not in res or count is None else f"{_ms(res, key)} ({count})"


def _ratio(res, num, den):
    a, b = res.get(num), res.get(den)
    return None if a is None or b is None else a / b


def _agreement(res):
    if "compile_error" in res:
        return "error"
    if "bitwise" not in res:
        return "-"
    return "bitwise" if res["bitwise"] else f"{res['compiled_rel_diff']:.1e}"


def rows_of(results):
    """The markdown table's rows, one per result."""
    rows = []
    for r in results:
        if "error" in r:
            rows.append([r["model"], r["dtype"]] + ["-"] * 11 + [r["error"]])
            continue
        graphs = "-" if "graphs" not in r else f"{r['graphs']}/{r['breaks']}"
        comp = "-" if "compile_warm_s" not in r else \
            f"{r['compile_warm_s']:.2f} ({r['compile_cold_s']:.2f})"
        torch_ms = _ms_threads(r, "PyTorch eager", "torch_threads")
        ratios = [_ratio(r, "PyTorch eager", "tapegrad compiled"),
                  _ratio(r, "tapegrad eager", "tapegrad compiled"),
                  _ratio(r, "PyTorch eager", "tapegrad eager")]
        note = r.get("compile_error") or r.get("inductor_error") or \
            "; ".join(r.get("break_reasons", [])[:1])
        rows.append([r["model"], r["dtype"], graphs, _agreement(r), comp,
                     _ms_threads(r, "tapegrad eager", "tapegrad eager threads"),
                     _ms_threads(r, "tapegrad compiled", "tapegrad compiled threads"), torch_ms,
                     _ms(r, "torch.compile"),
                     *["-" if x is None else f"{x:.2f}x" for x in ratios],
                     "-" if "torch_rel_diff" not in r else f"{r['torch_rel_diff']:.0e}",
                     note])
    return rows


HEADERS = ["model", "dtype", "graphs/breaks", "compiled == eager", "compile s (cold)",
           "tg eager ms (threads)", "tg compiled ms (threads)", "PyTorch eager ms (threads)",
           "torch.compile ms",
           "compiled vs PyTorch", "compiled vs tg eager", "tg eager vs PyTorch",
           "tg vs torch diff", "note"]


def markdown(rows, headers=HEADERS):
    out = ["| " + " | ".join(headers) + " |",
           "|" + "|".join("---" if i < 2 else "---:" for i in range(len(headers))) + "|"]
    out += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(out)


def geomean(values):
    values = [v for v in values if v is not None and v > 0]
    return math.exp(sum(map(math.log, values)) / len(values)) if values else None


def geomeans(results):
    """``{label: (geometric mean, count)}`` of the three speed ratios over the results."""
    pairs = {"tapegrad compiled vs PyTorch eager": ("PyTorch eager", "tapegrad compiled"),
             "tapegrad compiled vs tapegrad eager": ("tapegrad eager", "tapegrad compiled"),
             "tapegrad eager vs PyTorch eager": ("PyTorch eager", "tapegrad eager"),
             "tapegrad compiled vs torch.compile": ("torch.compile", "tapegrad compiled")}
    out = {}
    for label, (num, den) in pairs.items():
        vals = [_ratio(r, num, den) for r in results if "error" not in r]
        vals = [v for v in vals if v is not None]
        if vals:
            out[label] = (geomean(vals), len(vals))
    return out


def main(argv=None):
    p = argparse.ArgumentParser(prog="tapegrad bench suite", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default=None,
                   help=f"comma-separated subset of: {', '.join(SPECS)} (default: all)")
    p.add_argument("--dtype", choices=DTYPES + ("both",), default="both")
    p.add_argument("--quick", action="store_true",
                   help="smoke mode: 3 rounds of >= 5 ms batches (default 7 of >= 50 ms), "
                        f"{QUICK_CHECK_STEPS} checked steps")
    p.add_argument("--inductor", action="store_true",
                   help="also torch.compile (inductor; cold compiles take tens of seconds; "
                        "cached under ~/.cache/tapegrad/inductor)")
    p.add_argument("--rounds", type=int, default=None)
    p.add_argument("--min-time", type=float, default=None,
                   help="seconds each timed batch of steps lasts at least")
    p.add_argument("--threads", type=int, default=None,
                   help="pin numpy's BLAS at N threads for tapegrad (default: tapegrad timed at "
                        "the BLAS's default count, deciding per product, and at 1, the faster "
                        "reported)")
    p.add_argument("--no-torch", action="store_true")
    p.add_argument("--timeout", type=float, default=900, help="seconds per worker process")
    p.add_argument("--json", default=None, metavar="PATH",
                   help="also write the results (one dict per model and dtype) to PATH")
    p.add_argument("--list", action="store_true", help="list the models and exit")
    p.add_argument("--worker", nargs=2, metavar=("MODEL", "DTYPE"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.rounds is None:
        args.rounds = 3 if args.quick else 7
    if args.min_time is None:
        args.min_time = 0.005 if args.quick else 0.05
    if args.list:
        for name, s in SPECS.items():
            harness.out(f"{name:20s} {s.family:12s} {s.describe}")
        return 0
    if args.worker:
        return worker(args)
    names = list(SPECS) if not args.models else [m.strip() for m in args.models.split(",")]
    unknown = [m for m in names if m not in SPECS]
    if unknown:
        p.error(f"unknown model(s) {', '.join(unknown)}; choose from {', '.join(SPECS)}")
    dtypes = DTYPES if args.dtype == "both" else (args.dtype,)
    torch = None if args.no_torch else harness.import_torch()
    with harness.Threads(args.threads, torch) as threads:
        head = harness.header(threads, torch, "model suite: training steps of models the "
                                              "compiler was not tuned on")
    # the workers time PyTorch at one thread and at its default count, not at --threads
    harness.out("\n".join(line for line in head.splitlines()
                          if not line.startswith("threads: PyTorch")))
    if args.threads:
        harness.out(f"threads: tapegrad timed with numpy's BLAS pinned at {args.threads}")
    else:
        import tapegrad

        harness.out(f"threads: tapegrad eager and compiled timed at numpy's BLAS default "
                    f"({tapegrad.get_num_threads()}; tapegrad runs small products on one) and "
                    f"at 1, best median reported")
    if torch is not None:
        harness.out(f"threads: PyTorch eager timed at torch.set_num_threads(1) and at its "
                    f"default ({torch.get_num_threads()}), best median reported; "
                    f"torch.compile at 1")
    harness.out(f"one worker process per (model, dtype); in it contestants interleaved, "
                f"{args.rounds} rounds of >= {args.min_time * 1e3:.0f} ms batches; "
                f"compiled == eager over {QUICK_CHECK_STEPS if args.quick else CHECK_STEPS} steps")
    results = []
    for name in names:
        for dtype in dtypes:
            r = run_worker(args, name, dtype)
            results.append(r)
            harness.out(f"  {name} {dtype}: " + (r["error"] if "error" in r else
                        f"{r.get('wall_s', 0):.0f} s"))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    report(results)
    return 0


def report(results):
    """Print the markdown table, the geometric means and the models not in one graph."""
    harness.out()
    harness.out(markdown(rows_of(results)))
    harness.out()
    for label, (g, n) in geomeans(results).items():
        harness.out(f"geometric mean, {label}: {g:.2f}x over {n} (model, dtype) pairs")
    single = sorted({r["model"] for r in results
                     if r.get("graphs", 0) != 1 or r.get("breaks", 0) != 0 or "error" in r
                     or "compile_error" in r})
    harness.out("not compiled to one graph without breaks: " + (", ".join(single) or "none"))


if __name__ == "__main__":
    sys.exit(main())
