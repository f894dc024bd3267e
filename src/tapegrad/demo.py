"""``python -m tapegrad demo``: the tape at work, checked against PyTorch, in one report.

(a) z = (x + y) * y and its gradients; (b) the diamond y = x * x, and what overwriting
instead of accumulating would have given; (c) a bias broadcast over 4 rows and its summed
gradient; (d) gradcheck over the core ops; (e) the spiral MLP trained by tapegrad and by
PyTorch from identical weights; (f) the dispatch-overhead table; (g) checkpointing; (h) the
roofline; (i) the compiler: the spiral step's graph before and after the passes, and compiled
vs eager vs PyTorch eager. Without PyTorch installed
the tapegrad half runs and the report says so.
"""
import argparse
import math
import time

import numpy as np

import tapegrad
import tapegrad.nn.functional as F
from tapegrad.bench import checkpoint, dispatch
from tapegrad.bench import harness as H
from tapegrad.bench.spiral import MLPTrainer, init_params, spiral_data

f64 = tapegrad.float64


def _title(text):
    H.out()
    H.out(text)
    H.out("-" * len(text))


def _scalar(value):
    return tapegrad.tensor(value, dtype=f64, requires_grad=True)


# --- (a) ---------------------------------------------------------------------------------
def chain_rule(torch):
    _title("(a) z = (x + y) * y: the chain rule on a tape")
    x, y = _scalar(2.0), _scalar(3.0)
    z = (x + y) * y
    z.backward()
    H.out(f"x = 2, y = 3:  z = {z.item():g}   tape: {z.grad_fn.name()} <- "
          f"({', '.join(_parents(z))})")
    H.out(f"dz/dx = {x.grad.item():g}   (analytically y = 3)")
    H.out(f"dz/dy = {y.grad.item():g}   (analytically (x + y) + y = x + 2y = 8: y is used twice, "
          "its two contributions add up)")
    ok = x.grad.item() == 3.0 and y.grad.item() == 8.0
    if torch is not None:
        tx = torch.tensor(2.0, dtype=torch.float64, requires_grad=True)
        ty = torch.tensor(3.0, dtype=torch.float64, requires_grad=True)
        ((tx + ty) * ty).backward()
        ok = ok and tx.grad.item() == x.grad.item() and ty.grad.item() == y.grad.item()
        H.out(f"PyTorch: dz/dx = {tx.grad.item():g}, dz/dy = {ty.grad.item():g}")
    H.out("agrees" if ok else "DISAGREES")
    return ok


def _parents(t):
    """The producers of ``t``'s inputs, by name (``grad_fn.next_functions``, as PyTorch)."""
    return [fn.name() if fn is not None else "leaf" for fn, _ in t.grad_fn.next_functions]


# --- (b) ---------------------------------------------------------------------------------
def diamond():
    _title("(b) the diamond y = x * x: gradients from two paths must be summed")
    x = _scalar(3.0)
    y = x * x
    y.backward()
    # each path alone: the gradient mul sends to its first input, and to its second
    first, = tapegrad.autograd.grad(x * x.detach(), [x])
    second, = tapegrad.autograd.grad(x.detach() * x, [x])
    H.out("x = 3: y = x * x reaches x by two paths (mul's first and second input)")
    H.out(f"path 1 sends {first.item():g}, path 2 sends {second.item():g}")
    H.out(f"accumulated (grad += ...): x.grad = {x.grad.item():g}  = dy/dx = 2x = 6  correct")
    H.out(f"overwritten (grad = ...):  x.grad would be {second.item():g}  (only the last path: "
          "half the true gradient)")
    return x.grad.item() == 6.0 and first.item() + second.item() == 6.0


# --- (c) ---------------------------------------------------------------------------------
def bias_broadcast():
    _title("(c) a bias broadcast over 4 rows: its gradient is summed over the rows")
    X = tapegrad.tensor(np.arange(12.0).reshape(4, 3), dtype=f64)
    b = tapegrad.tensor([0.1, 0.2, 0.3], dtype=f64, requires_grad=True)
    C = tapegrad.tensor(np.arange(1.0, 13.0).reshape(4, 3), dtype=f64)
    out = X + b  # b of shape (3,) broadcast to (4, 3)
    (out * C).sum().backward()
    expected = np.arange(1.0, 13.0).reshape(4, 3).sum(axis=0)
    H.out(f"out = X + b with X {tuple(X.shape)}, b {tuple(b.shape)}; loss = (out * C).sum(), "
          "C = [[1, 2, 3], ..., [10, 11, 12]]")
    H.out(f"upstream gradient dloss/dout = C has shape {tuple(C.shape)}; b.grad has shape "
          f"{tuple(b.grad.shape)}:")
    H.out(f"b.grad = {b.grad.numpy().tolist()}  = C summed over the 4 rows "
          f"{expected.tolist()}")
    return b.grad.shape == b.shape and np.array_equal(b.grad.numpy(), expected)


# --- (d) ---------------------------------------------------------------------------------
def _pos(shape):
    return lambda rng: rng.uniform(0.5, 2.0, size=shape)


def _normal(shape, away_from_zero=False):
    def make(rng):
        a = rng.standard_normal(shape)
        if away_from_zero:  # kinks (relu, abs) are nudged out of the difference's reach
            a = np.where(np.abs(a) < 0.1, a + 0.2 * np.sign(a + 1e-3), a)
        return a
    return make


def _labels(rng):
    return rng.integers(0, 4, size=3)


GRADCHECK_OPS = [
    ("add (broadcast)", lambda a, b: a + b, [_normal((3, 4)), _normal((4,))]),
    ("sub", lambda a, b: a - b, [_normal((2, 3)), _normal((2, 3))]),
    ("mul (broadcast)", lambda a, b: a * b, [_normal((3, 4)), _normal((3, 1))]),
    ("div", lambda a, b: a / b, [_normal((2, 3)), _pos((2, 3))]),
    ("neg", lambda a: -a, [_normal((2, 3))]),
    ("pow", lambda a, b: a ** b, [_pos((2, 3)), _normal((2, 3))]),
    ("exp", tapegrad.exp, [_normal((2, 3))]),
    ("log", tapegrad.log, [_pos((2, 3))]),
    ("sqrt", tapegrad.sqrt, [_pos((2, 3))]),
    ("tanh", tapegrad.tanh, [_normal((2, 3))]),
    ("sigmoid", tapegrad.sigmoid, [_normal((2, 3))]),
    ("relu", tapegrad.relu, [_normal((2, 3), away_from_zero=True)]),
    ("matmul", lambda a, b: a @ b, [_normal((2, 3)), _normal((3, 4))]),
    ("matmul (batched)", lambda a, b: a @ b, [_normal((2, 2, 3)), _normal((3, 2))]),
    ("sum(dim=1)", lambda a: a.sum(dim=1), [_normal((3, 4))]),
    ("reshape", lambda a: a.reshape(4, 3), [_normal((3, 4))]),
    ("transpose", lambda a: a.transpose(0, 1), [_normal((3, 4))]),
    ("cross_entropy", lambda a, y: F.cross_entropy(a, y), [_normal((3, 4)), _labels]),
]


def vjp_error(fn, inputs, eps=1e-6, seed=0):
    """Max |tape gradient - central difference| of ``sum(fn(*inputs) * v)``, random ``v``."""
    out = fn(*inputs)
    v = tapegrad.tensor(np.random.default_rng(seed).standard_normal(out.shape), dtype=f64)
    diff = [x for x in inputs if x.requires_grad]
    grads = tapegrad.autograd.grad([out], diff, grad_outputs=[v])
    worst = 0.0
    for x, g in zip(diff, grads):
        flat = x.detach().numpy().reshape(-1)  # shares x's storage: nudging it nudges x
        g = g.numpy().reshape(-1)
        for j in range(flat.size):
            orig = flat[j]
            with tapegrad.no_grad():
                flat[j] = orig + eps
                plus = float((fn(*inputs) * v).sum().item())
                flat[j] = orig - eps
                minus = float((fn(*inputs) * v).sum().item())
            flat[j] = orig
            worst = max(worst, abs((plus - minus) / (2 * eps) - g[j]))
    return worst


def gradcheck_table():
    _title("(d) gradcheck: tape gradients vs central differences (float64, eps 1e-6)")
    rng = np.random.default_rng(0)
    rows, ok = [], True
    for name, fn, makers in GRADCHECK_OPS:
        arrays = [m(rng) for m in makers]
        inputs = [tapegrad.tensor(a, dtype=f64, requires_grad=True) if a.dtype.kind == "f"
                  else tapegrad.tensor(a) for a in arrays]
        passed = tapegrad.autograd.gradcheck(fn, inputs, raise_exception=False)
        err = vjp_error(fn, inputs)
        ok = ok and passed
        shapes = ", ".join(str(tuple(a.shape)) for a in arrays)
        rows.append([name, shapes, "pass" if passed else "FAIL", f"{err:.1e}"])
    H.out(H.table(rows, ["op", "input shapes", "gradcheck", "max abs error of v^T J"]))
    return ok


# --- (e) ---------------------------------------------------------------------------------
def spiral(torch, threads, steps=300, repeats=3):
    _title(f"(e) the spiral MLP: 2 -> 32 -> 3, ReLU, cross-entropy, {steps} SGD steps "
           "at lr 0.5, float64")
    X, y = spiral_data(512)
    params = init_params((2, 32, 3), seed=1)
    H.out("512 points in 3 classes on 2-D spiral arms; both frameworks start from the same "
          "weights and run the same code\n(F.linear, F.relu, F.cross_entropy, in-place SGD: "
          "tapegrad.bench.spiral.MLPTrainer)")
    runs = {}
    libs = [("tapegrad", tapegrad)] + ([("torch", torch)] if torch is not None else [])
    for name, T in libs:
        trainer = MLPTrainer(T, params, X, y)
        losses = trainer.train(steps)
        runs[name] = (np.array(losses), trainer.accuracy())
    cases = {"tapegrad": [H.Case("tapegrad", lambda: MLPTrainer(tapegrad, params, X, y)
                                 .run(steps))]}
    if torch is not None:
        cases["torch"] = H.torch_cases(
            "torch", lambda: (lambda: MLPTrainer(torch, params, X, y).run(steps)),
            threads, threads.blas)
    flat = [c for group in cases.values() for c in group]
    H.interleave(flat, threads, rounds=repeats, min_time=0, warmup=0)
    times = {name: H.median(H.best(group)) for name, group in cases.items()}
    rows = []
    for name, _ in libs:
        losses, acc = runs[name]
        rows.append([name, f"{losses[0]:.6f}", f"{losses[-1]:.15f}", f"{acc:.1%}",
                     f"{times[name] * 1e3:.1f} ms", f"{times[name] / steps * 1e6:.0f} us"])
    H.out(H.table(rows, ["framework", "first loss", f"loss after {steps} steps",
                         "train accuracy", f"time ({steps} steps)", "per step"]))
    if torch is None:
        H.out("PyTorch is not installed: tapegrad's half only (pip install torch to compare)")
        return bool(np.isfinite(runs["tapegrad"][0]).all())
    diff = np.abs(runs["tapegrad"][0] - runs["torch"][0])
    H.out(f"max |loss difference| over the {steps} steps: {diff.max():.2e}  "
          f"(at step {int(diff.argmax()) + 1}; target <= 1e-15: "
          f"{'met' if diff.max() <= 1e-15 else 'NOT met'})")
    torch_threads = H.best(cases["torch"]).torch_threads
    H.out(f"speed: tapegrad runs at {times['torch'] / times['tapegrad']:.2f}x PyTorch's speed "
          f"(PyTorch's time / tapegrad's; medians of {repeats} interleaved runs, PyTorch at its "
          f"best thread count, {torch_threads})")
    return diff.max() <= 1e-12


# --- (f) ---------------------------------------------------------------------------------
def dispatch_table(torch, threads, sizes=dispatch.SIZES, rounds=9, min_time=0.003):
    _title("(f) dispatch overhead: square matmul, raw numpy vs tapegrad's tape vs PyTorch")
    results = [r for r in dispatch.measure(threads, torch, sizes=sizes, rounds=rounds,
                                           min_time=min_time)
               if r[0].startswith("matmul")]
    names = ["numpy", "tapegrad"] + (["torch"] if torch is not None else [])
    rows = []
    for label, n, mode, m in results:
        row = [str(n), mode] + [f"{m[k] * 1e6:.1f}" for k in names]
        row.append(f"{(m['tapegrad'] - m['numpy']) * 1e6:+.1f}")
        if torch is not None:
            row.append(f"{(m['torch'] - m['numpy']) * 1e6:+.1f}")
        rows.append(row)
    headers = ["n", "inputs require grad"] + [f"{k} us" for k in names] + ["tapegrad - numpy"]
    if torch is not None:
        headers.append("torch - numpy")
    H.out("median microseconds per call over many interleaved runs; 'forward+backward' is the "
          "matmul then out.backward(g)")
    H.out(H.table(rows, headers))
    if torch is None:
        H.out("PyTorch is not installed: its column is left out")
    return True


# --- (g) ---------------------------------------------------------------------------------
def checkpointing(depths=checkpoint.DEPTHS, repeats=3):
    """Memory traded for compute: a deep ReLU MLP with and without checkpoint_sequential."""
    _title("(g) checkpointing: activation memory traded for recomputation, measured")
    H.out("deep ReLU MLP, width 192, batch 256, float32; checkpoint_sequential with "
          "round(sqrt(depth)) segments; peak = bytes tapegrad.profiler.memory() measured over "
          "one training step above the model state (listed last); time = median step")
    rows = checkpoint.run(depths, repeats=repeats)
    H.out(checkpoint.table(rows))
    deepest = rows[-1]
    saving = deepest["plain_mem"] / deepest["ckpt_mem"]
    ratio = deepest["ckpt_s"] / deepest["plain_s"]
    H.out(f"depth {deepest['depth']}: {saving:.2f}x less peak memory for {ratio:.2f}x the time "
          "(target at depth 144: >= 5x for <= 1.4x)")
    exact = _checkpoint_is_exact()
    H.out("gradients with and without checkpointing: "
          + ("bitwise identical (float64)" if exact else "DIFFER"))
    return exact


# --- (h) ---------------------------------------------------------------------------------
def _gpt_step():
    """The char-GPT training step of ``roofline._example("char_gpt")`` as a function of its
    batch, so that the compiler can trace it."""
    from tapegrad.examples.char_gpt import build

    vocab, block, batch = 65, 32, 16
    tapegrad.manual_seed(0)
    model = build(tapegrad, vocab, block)
    opt = tapegrad.optim.AdamW(model.parameters(), lr=3e-3)
    xb = np.random.default_rng(0).integers(0, vocab, size=(batch, block + 1))
    args = (tapegrad.tensor(xb[:, :-1]), tapegrad.tensor(xb[:, 1:]).reshape(-1))

    def step(x, y):
        loss = tapegrad.nn.functional.cross_entropy(model(x).view(-1, vocab), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss
    return step, args


def _eager_roofline(name, work, steps, ceilings):
    from tapegrad.profiler import profile, roofline

    work()  # warm
    with profile(with_flops=True) as prof:
        work()
    result = roofline.roofline(prof, ceilings, plot=None, show=False)
    H.out(result.table(row_limit=12))
    flops = sum(r.flops for r in result.rows)
    top = result.rows[0]
    H.out(f"{name}: {flops / steps / 1e6:.2f} MFLOP per step; the most time goes to {top.name} "
          f"({top.bound}, {top.distance:.1f}x its roof time)")
    return result


def roofline_table(steps=5):
    """Where the spiral and the char-GPT steps' time goes: each op on this machine's roofline
    (E3), and how fusion moves the compiled steps' kernels on it."""
    from tapegrad import compiler
    from tapegrad.profiler import graph, roofline

    _title(f"(h) the roofline of the spiral and char-GPT steps ({steps} steps profiled; python "
           "-m tapegrad profile --example spiral|char_gpt)")
    ceilings = roofline.load_ceilings()
    spiral = _eager_roofline("spiral", roofline._example("spiral", steps), steps, ceilings)
    H.out("x roof < 1: the operands fit in cache, faster than the calibrated main-memory "
          "bandwidth")
    H.out()
    step, args = _gpt_step()
    gpt = _eager_roofline("char-GPT", lambda: [step(*args) for _ in range(steps)], steps,
                          ceilings)
    H.out()
    H.out("compiled (tapegrad.compiler.trace + passes; each graph run node by node, numpy "
          "kernels): every fused kernel unfused and fused on the roofline")
    X, y = spiral_data(512)
    trainer = MLPTrainer(tapegrad, init_params((2, 32, 3), seed=1), X, y)
    h = tapegrad.tensor(np.random.default_rng(0).standard_normal((512, 256)),
                        dtype=tapegrad.float32)
    ok = bool(spiral.rows) and bool(gpt.rows)
    moved, gained = [], False
    for name, fn, fargs in (("spiral step", trainer.step, ()), ("char-GPT step", step, args),
                            ("nanoGPT's new_gelu on (512, 256) float32", _new_gelu, (h,))):
        g = compiler.trace(fn, *fargs)
        kernels, compiled = graph.fusion(g, fargs, ceilings=ceilings, repeats=1)
        dedicated = sorted({n.name for n in compiler.passes.optimize(g).nodes
                            if n.op is None and n.name != "fused" and n.impl is not None})
        H.out(f"{name}: {len(g.nodes)} graph nodes, {len(kernels)} fused kernels" + (
            f"; dedicated kernel nodes: {', '.join(dedicated)}" if dedicated else ""))
        H.out(graph.fusion_table(kernels))
        # a kernel of several ops drops intermediates' bytes; the char-GPT's groups are the
        # dedicated nodes (layer norm, softmax and GELU with their gradients, cross-entropy)
        ok = ok and (bool(kernels) or bool(dedicated)) and all(
            k.fused_intensity >= k.unfused_intensity for k in kernels)
        gained = gained or any(k.fused_intensity > k.unfused_intensity for k in kernels)
        moved += [f"{k.name} in the {name} ({k.unfused_bound} -> {k.fused_bound})"
                  for k in kernels if k.moved]
    H.out(f"fusion keeps the FLOPs and drops the intermediates' bytes, so intensity rises; a "
          f"kernel changes bound when it crosses the ridge ({ceilings.ridge('float64'):.2f} "
          f"FLOP/B float64, {ceilings.ridge('float32'):.2f} float32 here) or a roof call's "
          "time passes one dispatch. Moved here: " + ("; ".join(dict.fromkeys(moved)) or "none"))
    return ok and gained


def _new_gelu(x):
    """nanoGPT's ``new_gelu``: the tanh GELU written out as pointwise ops, as GPT-2 ports do."""
    return (0.5 * x * (1.0 + tapegrad.tanh(math.sqrt(2.0 / math.pi)
                                           * (x + 0.044715 * tapegrad.pow(x, 3.0))))).sum()


# --- (i) ---------------------------------------------------------------------------------
def compiled_step(torch, threads, steps=20, rounds=5):
    """m8/m9: the spiral training step as one graph, its passes, and compiled vs eager."""
    from tapegrad.bench.compile import make_step
    from tapegrad.compiler import passes

    _title("(i) tapegrad.compile: the whole spiral step (forward, backward, SGD) as one graph")
    step, _, data = make_step(tapegrad)
    step(*data)  # gradients exist now: the steady-state graph (zero_grad clears them)
    graph = tapegrad.compiler.trace(step, *data)
    log = []
    opt = passes.optimize(graph, log=log)
    names = [n.name for n in graph.nodes]
    H.out(f"traced: {len(graph.nodes)} nodes ({len(set(names))} kinds: "
          f"{', '.join(sorted(set(names)))}), {len(graph.inputs)} inputs, "
          f"{len(graph.writes)} write-backs")
    H.out(H.table([[name, str(a), str(b), f"{b - a:+d}"] for name, a, b in log],
                  ["pass", "nodes before", "after", "change"]))
    dead = sum(a - b for name, a, b in log if name == "dce")
    kernels = [n for n in opt.nodes if n.name == "fused"]
    H.out(f"dead nodes removed: {dead}; fused kernels: {len(kernels)} ("
          + "; ".join(" -> ".join(m.name for m in k.meta["nodes"]) for k in kernels) + ")")
    H.out("the optimised graph (python -m tapegrad ... with TAPEGRAD_LOGS=graphs,code prints "
          "it and the generated source for any compiled function):")
    H.out("\n".join("  " + line for line in str(opt).splitlines()))
    # correctness: compiled and eager from the same weights give the same losses (bitwise
    # with the numpy kernels; numba's loop nests may reorder a sum: 1e-12)
    eager, _, edata = make_step(tapegrad)
    raw, _, cdata = make_step(tapegrad)
    compiled = tapegrad.compile(raw)
    pairs = [(eager(*edata).item(), compiled(*cdata).item()) for _ in range(steps)]
    worst = max(abs(a - b) / abs(a) for a, b in pairs)
    same = worst <= 1e-12 and not compiled.breaks and \
        compiled.n_hits == steps - len(compiled.entries)
    H.out(f"{steps} steps compiled vs eager: max relative loss difference {worst:.1e} "
          f"({'bitwise identical' if worst == 0 else 'target <= 1e-12: ' + ('met' if same else 'NOT met')})")
    cases = [H.Case("tapegrad compiled", lambda: compiled(*cdata)),
             H.Case("tapegrad eager", lambda: eager(*edata))]
    if torch is not None:
        tstep, _, tdata = make_step(torch)
        cases += H.torch_cases("PyTorch eager", lambda: (lambda: tstep(*tdata)), threads,
                               threads.blas)
    H.interleave(cases, threads, rounds=rounds)
    ref = H.best(cases[2:]) if torch is not None else cases[1]
    rows = [[c.label, H.fmt_us(H.median(c)), f"{H.median(ref) / H.median(c):.2f}x"]
            for c in cases[:2] + ([ref] if torch is not None else [])]
    H.out(H.table(rows, ["spiral step (2->32->3, batch 512, float64)", "us/step",
                         "vs " + ("PyTorch eager" if torch is not None else "tapegrad eager")]))
    H.out("python -m tapegrad bench compile adds torch.compile, JAX and a hand-fused step")
    return same


def _checkpoint_is_exact():
    from tapegrad.utils.checkpoint import checkpoint_sequential

    rng = np.random.default_rng(0)
    layers = [tapegrad.nn.Sequential(tapegrad.nn.Linear(8, 8), tapegrad.nn.ReLU()).double()
              for _ in range(9)]
    x = tapegrad.tensor(rng.standard_normal((4, 8)))
    grads = []
    for segments in (None, 3):
        for layer in layers:
            layer.zero_grad()
        h = x
        if segments is None:
            for layer in layers:
                h = layer(h)
        else:
            h = checkpoint_sequential(layers, segments, x)
        (h * h).sum().backward()
        grads.append([p.grad.numpy().copy() for layer in layers for p in layer.parameters()])
    return all(np.array_equal(a, b) for a, b in zip(*grads))


def main(argv=None):
    p = argparse.ArgumentParser(prog="tapegrad demo", description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true",
                   help="30 spiral steps and small matmuls: a few seconds (smoke test)")
    p.add_argument("--no-torch", action="store_true", help="run tapegrad's half only")
    p.add_argument("--threads", type=int, default=1,
                   help="numpy BLAS threads; PyTorch is timed at 1 and at this many (default 1)")
    args = p.parse_args(argv)
    torch = None if args.no_torch else H.import_torch()
    with H.Threads(args.threads, torch) as threads:
        return _run(args, torch, threads)


def _run(args, torch, threads):
    t0 = time.perf_counter()
    H.out(f"tapegrad {tapegrad.__version__} demo: a tape, not calculus")
    if torch is None:
        H.out("PyTorch is not installed (or --no-torch): the report shows tapegrad's half only")
    else:
        H.out(f"compared with PyTorch {torch.__version__} in the same process")
    H.out(H.header(threads, torch, "set-up").split("\n", 1)[1])
    results = {
        "a": chain_rule(torch),
        "b": diamond(),
        "c": bias_broadcast(),
        "d": gradcheck_table(),
        "e": spiral(torch, threads, steps=30 if args.quick else 300,
                    repeats=1 if args.quick else 3),
        "f": dispatch_table(torch, threads, sizes=(8, 32) if args.quick else dispatch.SIZES,
                            rounds=2 if args.quick else 7,
                            min_time=0.0005 if args.quick else 0.002),
        "g": checkpointing(depths=(16, 64) if args.quick else checkpoint.DEPTHS,
                           repeats=1 if args.quick else 3),
        "h": roofline_table(steps=2 if args.quick else 5),
        "i": compiled_step(torch, threads, steps=10 if args.quick else 20,
                           rounds=2 if args.quick else 5),
    }
    bad = [k for k, ok in results.items() if not ok]
    H.out()
    H.out(f"demo finished in {time.perf_counter() - t0:.1f} s: "
          + ("every check agreed" if not bad else f"checks FAILED in section(s) {', '.join(bad)}"))
    return 1 if bad else 0
