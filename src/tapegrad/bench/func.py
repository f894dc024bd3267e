"""``tapegrad bench func``: the function transforms (issue 11) against their baselines.

1. Per-sample gradients of the spiral MLP (2 -> 32 -> 3, float64, cross-entropy), batch
   256: ``vmap(grad(loss_one))`` against the Python loop of one ``grad`` per example and
   against ``torch.func.vmap(torch.func.grad)`` (targets: >= 20x the loop, >= 1x torch.func).
2. ``jvp`` of the MLP's forward (a tangent for every weight) against the forward alone
   (target: <= 1.5x), and PyTorch's ratio.
3. ``hvp`` (forward-over-reverse, ``jvp(grad(loss))``) against one gradient
   (target: <= 3x), and PyTorch's ratio (torch.func.jvp over torch.func.grad).

Contestants are interleaved round by round in one process; medians over rounds.
"""
import argparse

import numpy as np

import tapegrad
from tapegrad.bench import harness as H
from tapegrad.bench.spiral import init_params, spiral_data

NAMES = ("0.weight", "0.bias", "2.weight", "2.bias")


def model_and_params(T, sizes=(2, 32, 3)):
    model = T.nn.Sequential(T.nn.Linear(sizes[0], sizes[1]), T.nn.ReLU(),
                            T.nn.Linear(sizes[1], sizes[2])).double()
    params = {k: T.tensor(v) for k, v in zip(NAMES, init_params(sizes))}
    return model, params


def per_sample_fns(T, fn, model):
    """(vmapped, loop): the batch's per-example gradients, ``{name: (B, *shape)}``."""
    def loss_one(p, x, y):
        logits = fn.functional_call(model, p, (x.unsqueeze(0),))
        return T.nn.functional.cross_entropy(logits, y.unsqueeze(0))

    g = fn.grad(loss_one)
    vmapped = fn.vmap(g, in_dims=(None, 0, 0))

    def loop(p, xb, yb):
        rows = [g(p, xb[i], yb[i]) for i in range(xb.shape[0])]
        return {k: T.stack([r[k] for r in rows]) for k in p}

    return vmapped, loop


def forward_fns(T, fn, model, xb, yb):
    def out(p):
        return fn.functional_call(model, p, (xb,))

    def loss(p):
        return T.nn.functional.cross_entropy(out(p), yb)

    return out, loss


def _hvp(fn, loss, p, v):
    return fn.jvp(fn.grad(loss), (p,), (v,))[1]


def run(batch=256, rounds=15, threads=None):
    torch = H.import_torch()
    X, y = spiral_data(512)
    rng = np.random.default_rng(1)
    idx = rng.choice(len(X), size=batch, replace=False)
    libs = [("tapegrad", tapegrad, tapegrad.func)]
    if torch is not None:
        import torch.func as tf

        libs.append(("torch", torch, tf))
    setups = {}
    for name, T, fn in libs:
        model, params = model_and_params(T)
        xb, yb = T.tensor(X[idx]), T.tensor(y[idx])
        vmapped, loop = per_sample_fns(T, fn, model)
        xf, yf = T.tensor(X), T.tensor(y)
        out, loss = forward_fns(T, fn, model, xf, yf)
        v = {k: T.tensor(rng.standard_normal(tuple(p.shape))) for k, p in params.items()}
        setups[name] = dict(T=T, fn=fn, params=params, xb=xb, yb=yb, vmapped=vmapped,
                            loop=loop, out=out, loss=loss, v=v)
    # the per-sample gradients agree (loop and torch.func) before anything is timed
    s = setups["tapegrad"]
    got = s["vmapped"](s["params"], s["xb"], s["yb"])
    ref = s["loop"](s["params"], s["xb"], s["yb"])
    checks = {"vmap(grad) vs loop": max(float((got[k] - ref[k]).abs().max()) for k in got)}
    if torch is not None:
        t = setups["torch"]
        want = t["vmapped"](t["params"], t["xb"], t["yb"])
        checks["vmap(grad) vs torch.func"] = max(
            float(np.max(np.abs(got[k].numpy() - want[k].detach().numpy()))) for k in got)
    cases = {}
    for name, st in setups.items():
        p, xb, yb, v = st["params"], st["xb"], st["yb"], st["v"]
        fn, out, loss = st["fn"], st["out"], st["loss"]
        cases[(name, "vmap(grad)")] = H.Case(f"{name} vmap(grad)",
                                             lambda st=st: st["vmapped"](st["params"], st["xb"],
                                                                         st["yb"]), 1)
        cases[(name, "forward")] = H.Case(f"{name} forward", lambda out=out, p=p: out(p), 1)
        cases[(name, "jvp")] = H.Case(f"{name} jvp",
                                      lambda fn=fn, out=out, p=p, v=v: fn.jvp(out, (p,), (v,)), 1)
        cases[(name, "grad")] = H.Case(f"{name} grad",
                                       lambda fn=fn, loss=loss, p=p: fn.grad(loss)(p), 1)
        cases[(name, "hvp")] = H.Case(f"{name} hvp",
                                      lambda fn=fn, loss=loss, p=p, v=v: _hvp(fn, loss, p, v), 1)
    s = setups["tapegrad"]
    cases[("tapegrad", "loop")] = H.Case("tapegrad loop", lambda: s["loop"](s["params"], s["xb"],
                                                                          s["yb"]))
    if torch is not None:
        t = setups["torch"]
        cases[("torch", "loop")] = H.Case("torch loop", lambda: t["loop"](t["params"], t["xb"],
                                                                        t["yb"]), 1)
    with H.Threads(1 if threads is None else threads, torch) as th:
        H.interleave(list(cases.values()), th, rounds=rounds, min_time=0.01)
    med = {k: H.median(c) for k, c in cases.items()}
    return med, checks, torch is not None


def report(med, checks, with_torch, batch):
    lines = []
    rows = [["tapegrad vmap(grad)", H.fmt_ms(med[("tapegrad", "vmap(grad)")]).strip(), "1.00x"],
            ["tapegrad Python loop", H.fmt_ms(med[("tapegrad", "loop")]).strip(),
             f"{med[('tapegrad', 'loop')] / med[('tapegrad', 'vmap(grad)')]:.1f}x slower"]]
    if with_torch:
        rows.append(["torch.func vmap(grad)", H.fmt_ms(med[("torch", "vmap(grad)")]).strip(),
                     f"{med[('torch', 'vmap(grad)')] / med[('tapegrad', 'vmap(grad)')]:.2f}x "
                     "tapegrad's time"])
        rows.append(["torch Python loop", H.fmt_ms(med[("torch", "loop")]).strip(),
                     f"{med[('torch', 'loop')] / med[('tapegrad', 'vmap(grad)')]:.1f}x "
                     "tapegrad's time"])
    lines.append(H.table(rows, [f"per-sample gradients, spiral MLP, batch {batch}", "ms",
                                "vs tapegrad vmap(grad)"]))
    lines.append("checks: " + ", ".join(f"{k} max |diff| {v:.1e}" for k, v in checks.items()))
    lines.append("")
    rows = []
    for name in ("tapegrad", "torch") if with_torch else ("tapegrad",):
        rows.append([name, H.fmt_us(med[(name, "forward")]).strip(),
                     H.fmt_us(med[(name, "jvp")]).strip(),
                     f"{med[(name, 'jvp')] / med[(name, 'forward')]:.2f}x",
                     H.fmt_us(med[(name, "grad")]).strip(), H.fmt_us(med[(name, "hvp")]).strip(),
                     f"{med[(name, 'hvp')] / med[(name, 'grad')]:.2f}x"])
    lines.append(H.table(rows, ["spiral MLP, 512 points", "forward us", "jvp us",
                                "jvp/forward", "grad us", "hvp us", "hvp/grad"]))
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(prog="tapegrad bench func", description=__doc__.split("\n")[0])
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--quick", action="store_true", help="5 rounds")
    p.add_argument("--threads", type=int, default=1, help="BLAS (and PyTorch) threads")
    args = p.parse_args(argv)
    rounds = 5 if args.quick else args.rounds
    torch = H.import_torch()
    with H.Threads(args.threads, torch) as th:
        H.out(H.header(th, torch, "function transforms: vmap(grad), jvp, hvp"))
    med, checks, with_torch = run(args.batch, rounds, args.threads)
    H.out(report(med, checks, with_torch, args.batch))
    return med


if __name__ == "__main__":
    main()
