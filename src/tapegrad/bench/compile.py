"""``tapegrad bench compile``: the spiral training step compiled vs eager vs PyTorch eager.

The whole step (zero_grad, forward, ``loss.backward()``, ``optimizer.step()``) of the
spiral MLP (2 -> H -> 3, float64, SGD) is compiled with ``tapegrad.compile`` and timed
against the same step run eagerly by tapegrad and by PyTorch, interleaved in one process;
ratios are PyTorch eager / contestant (higher is faster). Compile time is reported cold
(first call: trace, passes, code generation, including running the step once) and warm
(a second compiled function of the same step, with the modules already imported).

Side by side, in the same run: the same step (same weights, data and arithmetic) under
``torch.compile`` (forward and backward by ``torch.func.grad_and_value`` and the SGD update in
one compiled function) and under ``jax.jit``, each checked against PyTorch eager's losses
before it is timed, with its compile times; the hand-fused numba step is the floor. A
contestant that is not installed (``pip install tapegrad[bench]`` adds JAX) is reported as
such and the rest still run.
"""
import argparse
import os
import sys
import time

import numpy as np

from tapegrad.bench import harness
from tapegrad.bench.spiral import init_params, spiral_data


def _model(T, sizes, dtype="float64"):
    ps = init_params(sizes)
    layers = []
    for k in range(0, len(ps), 2):
        lin = T.nn.Linear(ps[k].shape[1], ps[k].shape[0]).to(getattr(T, dtype))
        with T.no_grad():
            lin.weight.copy_(T.tensor(ps[k]).to(getattr(T, dtype)))
            lin.bias.copy_(T.tensor(ps[k + 1]).to(getattr(T, dtype)))
        layers += [lin, T.nn.ReLU()]
    return T.nn.Sequential(*layers[:-1])


def make_step(T, sizes=(2, 32, 3), batch=512, lr=0.5, dtype="float64"):
    """``(step, model)``: one SGD step of the spiral MLP in library ``T`` (tapegrad or torch)."""
    X, y = spiral_data(batch)
    Xt, yt = T.tensor(X).to(getattr(T, dtype)), T.tensor(y)
    model = _model(T, sizes, dtype)
    opt = T.optim.SGD(model.parameters(), lr=lr)
    F = T.nn.functional

    def step(x, t):
        opt.zero_grad()
        loss = F.cross_entropy(model(x), t)
        loss.backward()
        opt.step()
        return loss

    return step, model, (Xt, yt)


# --- a hand-fused numba step: the whole step in one loop nest, no activation materialised --
HAND_FUSED = '''import numpy as np
from numba import njit


@njit(error_model="numpy", cache=True)
def hand_fused_step(X, y, W1T, b1, W2, b2, lr, dW1T, db1, dW2, db2, h, dh):
    # W1T, dW1T: (D, H) so every inner loop runs along contiguous H; 3 classes unrolled
    N, D = X.shape
    H = W1T.shape[1]
    dW1T[:] = 0.0
    db1[:] = 0.0
    dW2[:] = 0.0
    db2[:] = 0.0
    w0, w1, w2 = W2[0], W2[1], W2[2]
    loss = 0.0
    for i in range(N):  # one sample at a time: its activations stay in cache
        for k in range(H):
            h[k] = b1[k]
        for d in range(D):
            xd = X[i, d]
            wd = W1T[d]
            for k in range(H):
                h[k] += xd * wd[k]
        z0, z1, z2 = b2[0], b2[1], b2[2]
        for k in range(H):
            hk = h[k] if h[k] > 0 else 0.0
            h[k] = hk
            z0 += hk * w0[k]
            z1 += hk * w1[k]
            z2 += hk * w2[k]
        m = max(z0, max(z1, z2))
        e0, e1, e2 = np.exp(z0 - m), np.exp(z1 - m), np.exp(z2 - m)
        se = e0 + e1 + e2
        t = y[i]
        loss += np.log(se) - ((z0 if t == 0 else z1 if t == 1 else z2) - m)
        g0 = (e0 / se - (1.0 if t == 0 else 0.0)) / N
        g1 = (e1 / se - (1.0 if t == 1 else 0.0)) / N
        g2 = (e2 / se - (1.0 if t == 2 else 0.0)) / N
        db2[0] += g0
        db2[1] += g1
        db2[2] += g2
        for k in range(H):
            hk = h[k]
            dW2[0, k] += g0 * hk
            dW2[1, k] += g1 * hk
            dW2[2, k] += g2 * hk
            dk = (g0 * w0[k] + g1 * w1[k] + g2 * w2[k]) if hk > 0 else 0.0
            dh[k] = dk
            db1[k] += dk
        for d in range(D):
            xd = X[i, d]
            gd = dW1T[d]
            for k in range(H):
                gd[k] += dh[k] * xd
    W1T -= lr * dW1T
    b1 -= lr * db1
    W2 -= lr * dW2
    b2 -= lr * db2
    return loss / N
'''


def hand_fused(sizes, batch, dtype, lr=0.5):
    """``step()`` running the hand-fused numba step on the spiral data (3 classes), or None
    without numba."""
    try:
        from tapegrad.compiler import kernels
        fn = kernels.load("hand_fused_step", HAND_FUSED)
    except ImportError:
        return None
    X, y = spiral_data(batch, dtype=dtype)
    W1, b1, W2, b2 = [np.ascontiguousarray(p, dtype=dtype) for p in init_params(sizes)]
    W1T = np.ascontiguousarray(W1.T)
    grads = [np.empty_like(p) for p in (W1T, b1, W2, b2)]
    h, dh = np.empty(sizes[1], dtype), np.empty(sizes[1], dtype)
    return lambda: fn(X, y, W1T, b1, W2, b2, lr, *grads, h, dh)


# --- the same step under the other compilers: JAX jit and torch.compile -------------------
XLA_ONE_THREAD = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
_JAX_PINNED = []  # the CPU XLA's thread pool was pinned to, once import_jax pinned it


def import_jax(threads=1):
    """JAX with float64 enabled, or None when it is not installed.

    At one thread, XLA_FLAGS gets ``XLA_ONE_THREAD`` before JAX is first imported and XLA's
    thread pool is made while the process is pinned to one CPU (jaxlib 0.10 ignores the eigen
    flag: its CPU runtime has its own pool, measured at ~1.9 CPUs of CPU time per wall second
    on a 2-CPU machine; pinned, <= 1): the pool's threads keep that one CPU.
    """
    pin = threads == 1 and "jax" not in sys.modules and hasattr(os, "sched_setaffinity")
    if threads == 1 and "jax" not in sys.modules:
        flags = os.environ.get("XLA_FLAGS", "")
        os.environ["XLA_FLAGS"] = (flags + " " + XLA_ONE_THREAD).strip()
    try:
        import jax
    except ImportError:
        return None
    jax.config.update("jax_enable_x64", True)
    if pin:
        cpus = os.sched_getaffinity(0)
        os.sched_setaffinity(0, {min(cpus)})
        try:
            jax.jit(lambda a: a + 1)(jax.numpy.zeros(3)).block_until_ready()
            _JAX_PINNED.append(min(cpus))
        finally:
            os.sched_setaffinity(0, cpus)
    return jax


def _mlp_loss(relu, linear, cross_entropy):
    """``loss(params, x, t)``: the spiral MLP (Linear, ReLU, ..., Linear) and its mean
    cross-entropy, params ``[W1, b1, W2, b2, ...]`` as ``init_params`` gives them."""
    def loss(params, x, t):
        for k in range(0, len(params), 2):
            if k:
                x = relu(x)
            x = linear(x, params[k], params[k + 1])
        return cross_entropy(x, t)

    return loss


def jax_step(jax, sizes, batch, dtype, lr=0.5):
    """``(step, state)``: the spiral SGD step as one ``jax.jit`` function of (params, x, y)
    returning (new params, loss); ``step()`` advances ``state`` (the params) one step and
    waits for the result."""
    jnp = jax.numpy

    def cross_entropy(z, t):
        return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(z), t[:, None], axis=1))

    loss = _mlp_loss(jax.nn.relu, lambda x, w, b: x @ w.T + b, cross_entropy)

    def sgd(params, x, t):
        value, grads = jax.value_and_grad(loss)(params, x, t)
        return [p - lr * g for p, g in zip(params, grads)], value

    fn = jax.jit(sgd)
    X, y = spiral_data(batch, dtype=dtype)
    data = (jnp.asarray(X), jnp.asarray(y))
    state = [[jnp.asarray(p) for p in init_params(sizes, dtype=dtype)]]

    def step():
        state[0], value = jax.block_until_ready(fn(state[0], *data))
        return float(value)

    return step, state


def torch_compiled_step(torch, sizes, batch, dtype, lr=0.5, compile=True):
    """``(step, state)``: the spiral SGD step as one function, forward and backward by
    ``torch.func.grad_and_value`` and the SGD update, under ``torch.compile`` (or eager with
    ``compile=False``); ``step()`` advances ``state`` (the params) one step."""
    F = torch.nn.functional
    loss = _mlp_loss(torch.relu, F.linear, F.cross_entropy)

    def sgd(params, x, t):
        grads, value = torch.func.grad_and_value(loss)(params, x, t)
        return [p - lr * g for p, g in zip(params, grads)], value

    fn = torch.compile(sgd) if compile else sgd
    X, y = spiral_data(batch, dtype=dtype)
    data = (torch.tensor(X), torch.tensor(y))
    state = [[torch.tensor(p) for p in init_params(sizes, dtype=dtype)]]

    def step():
        state[0], value = fn(state[0], *data)
        return value.item()

    return step, state


def _timed(fn):
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _first_steps(step, n=3):
    return [float(step()) for _ in range(n)]


def _rel_diff(a, b):
    return max(abs(x - y) / max(abs(y), 1e-300) for x, y in zip(a, b))


def other_compilers(args, torch, jax, threads, sizes, want):
    """``[(label, step or None, note)]`` for torch.compile and JAX jit, each checked against
    ``want`` (PyTorch eager's losses over the first steps, tapegrad eager's without PyTorch)
    before it is timed; ``note`` says why a contestant is missing, else its compile times and
    agreement."""
    dt, tol = args.dtype, 1e-9 if args.dtype == "float64" else 1e-4
    ref = "PyTorch eager" if torch is not None else "tapegrad eager"
    found = []
    if torch is None:
        found.append(("torch.compile", None, "not installed"))
    else:
        try:
            with threads.torch_threads(1):  # inductor bakes its thread count into the kernels
                step, _ = torch_compiled_step(torch, sizes, args.batch, dt)
                cold = _timed(step)
                torch._dynamo.reset()
                step, _ = torch_compiled_step(torch, sizes, args.batch, dt)
                warm = _timed(step)
                torch._dynamo.reset()
                from torch._inductor import config as inductor_config
                with inductor_config.patch(fx_graph_cache=False):
                    step, _ = torch_compiled_step(torch, sizes, args.batch, dt)
                    fresh = _timed(step)
                check, _ = torch_compiled_step(torch, sizes, args.batch, dt)
                diff = _rel_diff(_first_steps(check), want)
        except Exception as e:  # noqa: BLE001 - the bench reports why and carries on
            found.append(("torch.compile", None, f"failed: {type(e).__name__}: "
                                                 f"{str(e).splitlines()[0][:200]}"))
        else:
            ok = "agree" if diff <= tol else "DIFFER"
            found.append(("torch.compile", step if diff <= tol else None,
                          f"first calls (compile + one step): cold {cold:.2f} s (first in this "
                          f"process; inductor's disk cache may hold it), warm {warm * 1e3:.0f} ms "
                          f"(recompiled after dynamo.reset, caches on), warm without the FX graph "
                          f"cache {fresh:.2f} s; losses over 3 steps {ok} with {ref} "
                          f"(max relative difference {diff:.1e})"))
    if jax is None:
        found.append(("JAX jit", None, "not installed"))
    else:
        step, _ = jax_step(jax, sizes, args.batch, dt)
        cold = _timed(step)
        step, _ = jax_step(jax, sizes, args.batch, dt)  # a new function: traced, compiled
        warm = _timed(step)
        diff = _rel_diff(_first_steps(jax_step(jax, sizes, args.batch, dt)[0]), want)
        ok = "agree" if diff <= tol else "DIFFER"
        found.append(("JAX jit", step if diff <= tol else None,
                      f"first calls (compile + one step): cold {cold:.2f} s (first jit in this "
                      f"process), warm {warm * 1e3:.0f} ms (a new jitted function); losses over "
                      f"3 steps {ok} "
                      f"with {ref} (max relative difference {diff:.1e}); jax "
                      f"{jax.__version__}, XLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r}"
                      + (f", XLA's thread pool pinned to CPU {_JAX_PINNED[0]}" if _JAX_PINNED
                         else "")))
    return found


def inplace_check(torch, sizes, batch, dtype, steps=6):
    """torch.compile of the in-place step (``make_step``: zero_grad, backward, opt.step in one
    compiled function) against the same step eager: ``(compile seconds, first step whose loss
    differs by more than 1e-12 relative, or None, eager losses, compiled losses)``."""
    eager, _, data = make_step(torch, sizes, batch, dtype=dtype)
    raw, _, cdata = make_step(torch, sizes, batch, dtype=dtype)
    comp = torch.compile(raw)
    t0 = time.perf_counter()
    b = [comp(*cdata).item()]
    seconds = time.perf_counter() - t0
    b += [comp(*cdata).item() for _ in range(steps - 1)]
    a = [eager(*data).item() for _ in range(steps)]
    bad = [i + 1 for i, (x, y) in enumerate(zip(a, b)) if abs(x - y) > 1e-12 * abs(x)]
    return seconds, (bad[0] if bad else None), a, b


# --- a chain of k pointwise ops ----------------------------------------------------------
def pointwise_chain(k):
    """``x -> k pointwise ops`` (mul, add, relu, sub in turn), no grad."""
    def chain(x):
        for i in range(k):
            r = i % 4
            x = x * 1.0001 if r == 0 else x + 0.5 if r == 1 else x.relu() if r == 2 \
                else x - 0.25
        return x

    return chain


def run_pointwise(args, tapegrad, torch, threads):
    import numpy as _np

    dt = getattr(tapegrad, args.dtype)
    harness.out(harness.header(threads, torch, f"pointwise chains on {args.numel} {args.dtype} "
                                               "elements: eager vs compiled"))
    rows = []
    x = tapegrad.tensor(_np.random.default_rng(0).standard_normal(args.numel)).to(dt)
    for k in args.k:
        fn = pointwise_chain(k)
        comp = tapegrad.compile(fn)
        got, want = comp(x), comp(x)  # the trace, then generated code
        want = fn(x)
        tol = 0 if tapegrad.compiler.kernels.backend() == "numpy" else 1e-6
        assert _np.allclose(got.numpy(), want.numpy(), rtol=tol, atol=0), "chain differs"
        cases = [harness.Case(f"k={k} compiled", lambda: comp(x)),
                 harness.Case(f"k={k} eager", lambda: fn(x))]
        if torch is not None:
            tx = torch.tensor(x.numpy())
            cases.append(harness.Case(f"k={k} PyTorch eager@1", lambda: fn(tx), torch_threads=1))
        harness.interleave(cases, threads, rounds=args.rounds_)
        e = harness.median(cases[1])
        for c in cases:
            rows.append([c.label, harness.fmt_us(harness.median(c)),
                         f"{e / harness.median(c):.2f}x", f"{harness.spread(c):.0%}"])
    harness.out(harness.table(rows, ["chain", "us/call", "vs tapegrad eager", "spread"]))
    harness.out(f"kernels: {tapegrad.compiler.kernels.backend()}")


# the rows of the spiral step's table, in this order
ORDER = ("PyTorch eager", "torch.compile", "JAX jit", "tapegrad eager", "tapegrad compiled",
         "hand-fused numba step")


def _model_step(S):
    """``step(x, y)``: the training step of ``bench.models.Step`` ``S`` on one batch, ending
    in ``loss.item()`` after the optimizer (and scheduler) step (compiled whole: TailEntry)."""
    F, clip, kind = S.F, S.clip, S.kind

    def step(x, y):
        out = S.model(x)
        loss = F.cross_entropy(out if kind == "cnn" else out.view(-1, S.vocab), y)
        S.opt.zero_grad()
        loss.backward()
        if kind == "gpt":
            clip(S.model.parameters(), 1.0)
        S.opt.step()
        if S.sched is not None:
            S.sched.step()
        return loss.item()

    return step


def run_model(args, tapegrad, torch, threads):
    """The digits-CNN or char-GPT training step (``bench.models``): compiled vs tapegrad
    eager vs PyTorch eager, from the same weights on the same batches."""
    from tapegrad.bench import models as M

    kind, dt = args.model, np.dtype(args.dtype)
    harness.out(harness.header(threads, torch, f"compiled {M.MODEL_NAMES[kind]} training "
                                               f"step, {dt.name}"))
    state, batches = M.initial_state(kind), M.make_data(kind, 8)
    eager = M.Step(tapegrad, kind, state, batches, dt)
    comp = M.Step(tapegrad, kind, state, batches, dt)
    t0 = time.perf_counter()
    compiled = tapegrad.compile(_model_step(comp))
    compiled(*comp._batch())
    cold = time.perf_counter() - t0
    t0 = time.perf_counter()
    compiled(*comp._batch())  # the second guard set (gradients present at the call)
    cold2 = time.perf_counter() - t0
    # agreement: fresh copies, same batches, a few steps each way
    ref = M.Step(tapegrad, kind, state, batches, dt)
    chk = M.Step(tapegrad, kind, state, batches, dt)
    cchk = tapegrad.compile(_model_step(chk))
    a = [ref() for _ in range(4)]
    b = [cchk(*chk._batch()) for _ in range(4)]
    diff = max(abs(x - y) / max(abs(x), 1e-300) for x, y in zip(a, b))
    cases = [harness.Case("tapegrad compiled", lambda: compiled(*comp._batch())),
             harness.Case("tapegrad eager", eager)]
    n_own = len(cases)
    if torch is not None:
        cases += harness.torch_cases("PyTorch eager",
                                     lambda: M.Step(torch, kind, state, batches, dt),
                                     threads, args.threads)
    harness.interleave(cases, threads, rounds=args.rounds_, min_time=0.05, warmup=2)
    ref_case = harness.best(cases[n_own:]) if torch is not None else None
    rows = []
    for c in cases[:n_own] + ([ref_case] if ref_case is not None else []):
        rows.append([c.label, harness.fmt_ms(harness.median(c)),
                     f"{harness.median(cases[1]) / harness.median(c):.2f}x",
                     f"{harness.median(ref_case) / harness.median(c):.2f}x"
                     if ref_case is not None else "-", f"{harness.spread(c):.0%}"])
    harness.out(harness.table(rows, ["step", "ms/step", "vs tapegrad eager",
                                     "vs PyTorch eager", "spread"]))
    speed_eager = harness.median(cases[1]) / harness.median(cases[0])
    verdict = f"target >= 1.5x tapegrad eager: {'met' if speed_eager >= 1.5 else 'not met'}"
    if ref_case is not None:
        speed_torch = harness.median(ref_case) / harness.median(cases[0])
        verdict += f"; >= 1.2x PyTorch eager: {'met' if speed_torch >= 1.2 else 'not met'}"
    harness.out(verdict)
    harness.out(f"compiled vs eager losses over 4 steps: max relative difference {diff:.1e}")
    harness.out(f"compile time: first call {cold * 1e3:.0f} ms, second guard set "
                f"{cold2 * 1e3:.0f} ms; kernels: {tapegrad.compiler.kernels.backend()}")
    e = compiled.entries[-1]
    opaque = sorted({n.name for n in e.graph.nodes if n.name.startswith("vjp_")})
    harness.out(f"graph: {type(e).__name__}, {len(e.graph.nodes)} traced nodes, opaque rules: "
                f"{', '.join(opaque) or 'none'}; " + ", ".join(
                    f"{name} {x}->{y}" for name, x, y in e.log))
    fell = sum(getattr(x, "n_fallbacks", 0) for x in compiled.entries)
    harness.out(f"cache: {len(compiled.entries)} graphs, {compiled.n_hits} hits of "
                f"{compiled.n_calls} calls, breaks: {len(compiled.breaks)}, calls rerun "
                f"eagerly: {fell}")
    return 0


def main(argv=None):
    p = argparse.ArgumentParser(prog="tapegrad bench compile", description=__doc__)
    p.add_argument("--hidden", type=int, default=32)
    p.add_argument("--batch", type=int, default=512)
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--quick", action="store_true", help="5 rounds")
    p.add_argument("--no-torch", action="store_true")
    p.add_argument("--inplace-check", action="store_true",
                   help="also torch.compile the in-place step (module, loss.backward(), "
                        "optimizer.step()) and compare its losses with eager")
    p.add_argument("--dtype", default="float64", choices=("float64", "float32"))
    p.add_argument("--mode", default="step", choices=("step", "pointwise"),
                   help="step: the spiral training step; pointwise: chains of k ops")
    p.add_argument("--k", type=int, nargs="+", default=[4, 8], help="pointwise chain lengths")
    p.add_argument("--numel", type=int, default=1 << 20, help="pointwise chain elements")
    p.add_argument("--model", choices=("cnn", "gpt"), default=None,
                   help="a model's training step instead of the spiral step: the digits CNN "
                        "(Adam) or the char GPT (AdamW, clipping, schedule)")
    args = p.parse_args(argv)
    import tapegrad

    torch = None if args.no_torch else harness.import_torch()
    rounds = 5 if args.quick else args.rounds
    args.rounds_ = rounds
    sizes = (2, args.hidden, 3)
    dt = args.dtype
    with harness.Threads(args.threads, torch) as threads:
        if args.mode == "pointwise":
            run_pointwise(args, tapegrad, torch, threads)
            return 0
        if args.model is not None:
            return run_model(args, tapegrad, torch, threads)
        harness.out(harness.header(threads, torch, f"compiled spiral step, 2->{args.hidden}->3, "
                                                   f"batch {args.batch}, {dt}, SGD"))
        eager, _, data = make_step(tapegrad, sizes, args.batch, dtype=dt)
        raw, model, cdata = make_step(tapegrad, sizes, args.batch, dtype=dt)
        t0 = time.perf_counter()
        compiled = tapegrad.compile(raw)
        compiled(*cdata)
        cold = time.perf_counter() - t0
        t0 = time.perf_counter()
        compiled(*cdata)  # the second graph (gradients present at the call)
        cold2 = time.perf_counter() - t0
        t0 = time.perf_counter()
        compiled(*cdata)  # the first run of generated code (numba JIT, or its disk cache)
        first_run = time.perf_counter() - t0
        raw2, _, cdata2 = make_step(tapegrad, sizes, args.batch, dtype=dt)
        compiled2 = tapegrad.compile(raw2)
        t0 = time.perf_counter()
        compiled2(*cdata2)
        warm = time.perf_counter() - t0
        t0 = time.perf_counter()
        compiled2(*cdata2)
        second = time.perf_counter() - t0
        cases = [harness.Case("tapegrad compiled", lambda: compiled(*cdata)),
                 harness.Case("tapegrad eager", lambda: eager(*data))]
        missing = {}  # label -> why it is not timed
        hand = hand_fused(sizes, args.batch, dt)
        if hand is not None:
            hand()
            cases.append(harness.Case("hand-fused numba step", hand))
        else:
            missing["hand-fused numba step"] = "numba not installed"
        # the reference losses every other compiler must reproduce before it is timed
        first, _, first_data = make_step(torch or tapegrad, sizes, args.batch, dtype=dt)
        want = _first_steps(lambda: first(*first_data).item())
        jax = import_jax(args.threads)
        notes = []
        for label, step, note in other_compilers(args, torch, jax, threads, sizes, want):
            notes.append(f"{label}: {note}")
            if step is None:
                missing[label] = note.split(";")[0]
            else:  # torch.compile's kernels were generated for one thread
                cases.append(harness.Case(label, step, torch_threads=1 if torch and
                                          label == "torch.compile" else None))
        n_own = len(cases)
        if torch is not None:
            tstep, _, tdata = make_step(torch, sizes, args.batch, dtype=dt)
            cases += harness.torch_cases("PyTorch eager", lambda: (lambda: tstep(*tdata)),
                                         threads, args.threads)
        else:
            missing["PyTorch eager"] = "not installed"
        harness.interleave(cases, threads, rounds=rounds)
        ref = harness.best(cases[n_own:]) if torch is not None else cases[1]
        by_label = {c.label: c for c in cases[:n_own]}
        if torch is not None:
            by_label["PyTorch eager"] = ref
        rows = []
        fmt, unit = ((harness.fmt_ms, "ms") if harness.median(ref) > 0.01
                     else (harness.fmt_us, "us"))
        for label in ORDER:
            c = by_label.get(label)
            if c is None:
                rows.append([label, "-", "-", "-", missing.get(label, "not run")])
                continue
            rows.append([c.label, fmt(harness.median(c)),
                         f"{harness.median(ref) / harness.median(c):.2f}x",
                         f"{harness.spread(c):.0%}", ""])
        harness.out(harness.table(rows, ["step", f"{unit}/step", f"vs {ref.label}", "spread",
                                         "note"]))
        for line in notes:
            harness.out(line)
        if args.inplace_check and torch is not None:
            with threads.torch_threads(1):
                secs, bad, a, b = inplace_check(torch, sizes, args.batch, dt)
            harness.out(f"torch.compile of the in-place step (zero_grad, backward, opt.step): "
                        f"first call {secs:.2f} s; losses over {len(a)} steps vs eager: "
                        + ("agree to 1e-12" if bad is None else f"differ from step {bad}")
                        + f" (max relative difference {_rel_diff(b, a):.1e})")
        harness.out(f"compile time: cold {cold * 1e3:.1f} ms (first call: trace + passes + "
                    f"codegen + the eager step itself), warm {warm * 1e3:.1f} ms (a new "
                    f"compiled function, modules imported), second guard set "
                    f"{cold2 * 1e3:.1f} ms, first run of generated code {first_run * 1e3:.1f} "
                    f"ms, a new function's second guard set {second * 1e3:.1f} ms")
        harness.out(f"kernels: {tapegrad.compiler.kernels.backend()}")
        e = compiled.entries[-1]
        harness.out("graph: " + ", ".join(f"{name} {a}->{b}" for name, a, b in e.log)
                    + f"; fused kernels: {e.graph.count('fused')}")
        hit = compiled.n_hits
        harness.out(f"cache: {len(compiled.entries)} graphs, {hit} hits of "
                    f"{compiled.n_calls} calls")
    return 0


if __name__ == "__main__":
    main()
