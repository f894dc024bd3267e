"""The GPU checks, run by ``tests/gpu/run.sh`` on a machine with a CUDA device.

1. the op battery (``battery.rows()``) on cuda against the cpu, float64 to 1e-12;
2. the spiral MLP and the digits CNN trained on the GPU: loss trajectories match the cpu's;
3. the H=2048 MLP step and the char-GPT step timed on the GPU against PyTorch CUDA (when the
   installed torch has CUDA), after checking their losses agree.

Prints one line per check and a summary; exits 1 if any check fails, 0 when all pass.
"""
import os
import sys
import time
import traceback

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.dirname(HERE)]

import tapegrad  # noqa: E402
import battery  # noqa: E402

FAILED = []


def check(name, ok, detail=""):
    print(f"{'ok  ' if ok else 'FAIL'} {name}{': ' + detail if detail else ''}", flush=True)
    if not ok:
        FAILED.append(name)


def op_battery():
    """Every row but the known ones (``battery.KNOWN``, failing on the fake device too) must
    agree; known rows that pass on the GPU are reported (the list can shrink)."""
    passed, failed, known, fixed = 0, [], 0, []
    for name, fn, specs, kw in battery.rows():
        try:
            battery.run(fn, specs, "cuda", kw)
            passed += 1
            if name in battery.KNOWN:
                fixed.append(name)
        except Exception as e:  # noqa: BLE001 - every row is reported
            if name in battery.KNOWN:
                known += 1
                continue
            failed.append(f"{name}: {type(e).__name__}: {str(e).splitlines()[0][:160]}")
    for f in failed:
        print("     ", f)
    if fixed:
        print("      known rows passing on the GPU:", ", ".join(fixed))
    check("op battery on cuda vs cpu (float64, 1e-12)", not failed,
          f"{passed} rows agree, {len(failed)} fail, {known} known failures skipped")


def _train(build, data, steps, dev, lr, opt="sgd"):
    """Losses of ``steps`` full steps of ``build(tapegrad)`` on ``dev`` from seed 0."""
    tapegrad.manual_seed(0)
    model = build(tapegrad)
    model.to(dev)
    o = (tapegrad.optim.SGD if opt == "sgd" else tapegrad.optim.Adam)(model.parameters(), lr=lr)
    losses = []
    for i in range(steps):
        x, y = data[i % len(data)]
        x, y = tapegrad.tensor(x).to(dev), tapegrad.tensor(y).to(dev)
        loss = tapegrad.nn.functional.cross_entropy(model(x), y)
        o.zero_grad()
        loss.backward()
        o.step()
        losses.append(loss.item())
    return np.array(losses)


def trajectories():
    from tapegrad.bench.spiral import spiral_data
    from tapegrad.examples import spiral

    X, y = spiral_data(512, 3, seed=0)
    cpu = _train(spiral.build, [(X, y)], 300, "cpu", 0.5)
    gpu = _train(spiral.build, [(X, y)], 300, "cuda", 0.5)
    d = float(np.max(np.abs(gpu - cpu) / np.abs(cpu)))
    check("spiral MLP trained on cuda: trajectory matches cpu", d < 1e-9,
          f"300 steps, loss {cpu[0]:.4f} -> {cpu[-1]:.4f}, max rel diff {d:.1e}")
    try:
        from tapegrad.examples import digits_cnn
        (xt, yt), _ = digits_cnn.load_data(0)
    except ImportError as e:
        check("digits CNN trained on cuda", False, f"cannot load the digits ({e})")
        return
    batches = [(xt[i:i + 64], yt[i:i + 64]) for i in range(0, 64 * 20, 64)]
    cpu = _train(digits_cnn.build, batches, 40, "cpu", 3e-3, "adam")
    gpu = _train(digits_cnn.build, batches, 40, "cuda", 3e-3, "adam")
    d = float(np.max(np.abs(gpu - cpu) / np.abs(cpu)))
    check("digits CNN trained on cuda: trajectory matches cpu", d < 1e-9,
          f"40 Adam steps, loss {cpu[0]:.4f} -> {cpu[-1]:.4f}, max rel diff {d:.1e}")


def _timed(step, sync, n=10):
    step()
    sync()
    best = []
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(n):
            step()
        sync()
        best.append((time.perf_counter() - t0) / n)
    return min(best)


def _mlp_step(T, dev, hidden=2048, batch=4096):
    from tapegrad.bench.spiral import spiral_data

    X, y = spiral_data(batch, 3, seed=0)
    tapegrad.manual_seed(1)
    state = tapegrad.nn.Sequential(tapegrad.nn.Linear(2, hidden), tapegrad.nn.ReLU(),
                                   tapegrad.nn.Linear(hidden, 3)).double().state_dict()
    model = T.nn.Sequential(T.nn.Linear(2, hidden), T.nn.ReLU(), T.nn.Linear(hidden, 3)).double()
    if T is not tapegrad:
        from tapegrad.examples.common import to_torch_state
        state = to_torch_state(state)
    model.load_state_dict(state)
    model.to(dev)
    opt = T.optim.SGD(model.parameters(), lr=0.5)
    x, t = T.tensor(X).to(dev), T.tensor(y).to(dev)

    def step():
        loss = T.nn.functional.cross_entropy(model(x), t)
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss

    return step


def _loss(step):
    for _ in range(2):
        step()
    r = step()
    return float(r.item() if hasattr(r, "item") else r)


def timings():
    try:
        import torch
        has_torch = torch.cuda.is_available()
    except ImportError:
        torch, has_torch = None, False
    from tapegrad.bench import models as M

    cases = [("H=2048 MLP step (batch 4096, float64)", lambda T, d: _mlp_step(T, d), 1e-9)]

    def gpt(T, d):
        state, batches = M.initial_state("gpt"), M.make_data("gpt", 4)
        s = M.Step(T, "gpt", state, batches, "float32")
        s.model.to(d)
        s.batches = [(x.to(d), y.to(d)) for x, y in s.batches]
        return s

    cases.append(("GPT step (char_gpt, float32)", gpt, 1e-4))
    for name, make, tol in cases:
        try:
            ours = make(tapegrad, "cuda")
            a = _loss(ours)
            c = _loss(make(tapegrad, "cpu"))
            d = abs(a - c) / abs(c)
            check(f"{name} on cuda: third loss matches cpu", d < tol,
                  f"{a:.8f} vs {c:.8f} (rel {d:.1e}, tolerance {tol:g})")
            t_ours = _timed(ours, tapegrad.cuda.synchronize)
            line = f"tapegrad {t_ours * 1e3:.2f} ms"
            if has_torch:
                ref = make(torch, "cuda")
                b = _loss(ref)
                t_ref = _timed(ref, torch.cuda.synchronize)
                line += (f", torch CUDA {t_ref * 1e3:.2f} ms ({t_ours / t_ref:.2f}x); "
                         f"third losses {a:.6f} vs {b:.6f}")
            else:
                line += " (torch has no CUDA here: no reference)"
            check(f"timed on cuda: {name}", True, line)
        except Exception as e:  # noqa: BLE001
            traceback.print_exc()
            check(f"timed on cuda: {name}", False, f"{type(e).__name__}: {e}")


def main():
    if os.environ.get("TAPEGRAD_FAKE_CUDA") == "1":  # a dry run of this script on the cpu
        import fake_device
        fake_device.install()
        print("dry run on the fake device (tests/fake_device.py)")
    elif not tapegrad.cuda.is_available():
        print("SKIP: tapegrad.cuda.is_available() is False (CuPy missing or no device)")
        return 0
    else:
        import cupy

        print(f"cupy {cupy.__version__}, {tapegrad.cuda.device_count()} device(s): "
              f"{cupy.cuda.runtime.getDeviceProperties(0)['name'].decode()}", flush=True)
    for part in (op_battery, trajectories, timings):
        try:
            part()
        except Exception as e:  # noqa: BLE001
            traceback.print_exc()
            check(part.__name__, False, f"{type(e).__name__}: {e}")
    print(f"{len(FAILED)} check(s) failed" if FAILED else "all GPU checks passed")
    return 1 if FAILED else 0


if __name__ == "__main__":
    sys.exit(main())
