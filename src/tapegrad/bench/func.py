"""``tapegrad bench func``: the function transforms against their baselines.

1. Per-sample gradients of the spiral MLP (2 -> 32 -> 3, float64, cross-entropy), batch
   256: ``vmap(grad(loss_one))`` against the Python loop of one ``grad`` per example and
   against ``torch.func.vmap(torch.func.grad)`` (targets: >= 20x the loop, >= 1x torch.func).
2. ``jvp`` of the MLP's forward against the forward alone (target: <= 1.5x), two ways: a
   tangent for every weight, and the common directional derivative (a tangent for the input
   only); PyTorch's ratios; tapegrad's ``jvp`` under ``tapegrad.compile``, against the
   forward under ``tapegrad.compile`` (and against the eager forward); and the same
   arithmetic written by hand in numpy (the floor: what the tangent's own matmuls cost).
3. ``hvp`` (forward-over-reverse, ``jvp(grad(loss))``) against one gradient
   (target: <= 3x), and PyTorch's ratio (torch.func.jvp over torch.func.grad).

Contestants are interleaved round by round in one process; medians over rounds, with the
interquartile spread of each (``--part jvp`` times parts 2 and 3 only).
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


def numpy_fns(x, p, v, vx):
    """The MLP's forward and both jvps by hand in numpy: (forward, jvp every weight, jvp of
    the input), each returning (out, tangent) as the transforms do."""
    w1, b1, w2, b2 = (p[k] for k in NAMES)
    tw1, tb1, tw2, tb2 = (v[k] for k in NAMES)

    def forward():
        h = x @ w1.T
        h += b1
        a = np.maximum(h, 0)
        out = a @ w2.T
        out += b2
        return out, a

    def jvp_weights():
        out, a = forward()
        th = x @ tw1.T
        th += tb1
        t = (th * (a > 0)) @ w2.T
        t += a @ tw2.T
        t += tb2
        return out, t

    def jvp_input():
        out, a = forward()
        return out, ((vx @ w1.T) * (a > 0)) @ w2.T

    return forward, jvp_weights, jvp_input


def _max_diff(a, b):
    a = a.detach().numpy() if hasattr(a, "detach") else a
    b = b.detach().numpy() if hasattr(b, "detach") else b
    return float(np.max(np.abs(a - b)))


def run(batch=256, rounds=15, threads=None, parts=("vmap", "jvp")):
    torch = H.import_torch()
    X, y = spiral_data(512)
    rng = np.random.default_rng(1)
    idx = rng.choice(len(X), size=batch, replace=False)
    libs = [("tapegrad", tapegrad, tapegrad.func)]
    if torch is not None:
        import torch.func as tf

        libs.append(("torch", torch, tf))
    setups = {}
    shapes = {k: a.shape for k, a in zip(NAMES, init_params((2, 32, 3)))}
    tangents = {k: rng.standard_normal(shape) for k, shape in shapes.items()}  # one for both
    tangent_x = np.random.default_rng(2).standard_normal(X.shape)
    for name, T, fn in libs:
        model, params = model_and_params(T)
        xb, yb = T.tensor(X[idx]), T.tensor(y[idx])
        vmapped, loop = per_sample_fns(T, fn, model)
        xf, yf = T.tensor(X), T.tensor(y)
        out, loss = forward_fns(T, fn, model, xf, yf)
        v = {k: T.tensor(tangents[k]) for k in params}
        vx = T.tensor(tangent_x)

        def out_x(x, fn=fn, model=model, params=params):  # the input's directional derivative
            return fn.functional_call(model, params, (x,))

        setups[name] = dict(T=T, fn=fn, params=params, xb=xb, yb=yb, vmapped=vmapped,
                            loop=loop, out=out, loss=loss, v=v, xf=xf, vx=vx, out_x=out_x)
    checks = {}
    if "vmap" in parts:
        # the per-sample gradients agree (loop and torch.func) before anything is timed
        s = setups["tapegrad"]
        got = s["vmapped"](s["params"], s["xb"], s["yb"])
        ref = s["loop"](s["params"], s["xb"], s["yb"])
        checks["vmap(grad) vs loop"] = max(float((got[k] - ref[k]).abs().max()) for k in got)
        if torch is not None:
            t = setups["torch"]
            want = t["vmapped"](t["params"], t["xb"], t["yb"])
            checks["vmap(grad) vs torch.func"] = max(
                float(np.max(np.abs(got[k].numpy() - want[k].detach().numpy()))) for k in got)
    cases = {}
    for name, st in setups.items():
        p, v, xf, vx = st["params"], st["v"], st["xf"], st["vx"]
        fn, out, loss, out_x = st["fn"], st["out"], st["loss"], st["out_x"]
        if "vmap" in parts:
            cases[(name, "vmap(grad)")] = H.Case(
                f"{name} vmap(grad)", lambda st=st: st["vmapped"](st["params"], st["xb"],
                                                                  st["yb"]), 1)
        if "jvp" not in parts:
            continue
        cases[(name, "forward")] = H.Case(f"{name} forward", lambda out=out, p=p: out(p), 1)
        cases[(name, "jvp")] = H.Case(f"{name} jvp",
                                      lambda fn=fn, out=out, p=p, v=v: fn.jvp(out, (p,), (v,)), 1)
        cases[(name, "jvp input")] = H.Case(
            f"{name} jvp input", lambda fn=fn, f=out_x, x=xf, t=vx: fn.jvp(f, (x,), (t,)), 1)
        cases[(name, "grad")] = H.Case(f"{name} grad",
                                       lambda fn=fn, loss=loss, p=p: fn.grad(loss)(p), 1)
        cases[(name, "hvp")] = H.Case(f"{name} hvp",
                                      lambda fn=fn, loss=loss, p=p, v=v: _hvp(fn, loss, p, v), 1)
    if "jvp" in parts:
        s = setups["tapegrad"]
        fn, out, out_x = s["fn"], s["out"], s["out_x"]
        compiled = tapegrad.compile(lambda p, v: fn.jvp(out, (p,), (v,)))
        compiled_x = tapegrad.compile(lambda x, t: fn.jvp(out_x, (x,), (t,)))
        # the compiled forward each compiled jvp is set against (the same function, traced)
        compiled_fwd = tapegrad.compile(lambda p: out(p))
        compiled_fwd_x = tapegrad.compile(lambda x: out_x(x))
        eager = fn.jvp(out, (s["params"],), (s["v"],))[1]
        eager_x = fn.jvp(out_x, (s["xf"],), (s["vx"],))[1]
        forward = out(s["params"])
        for _ in range(2):  # the second call replays the traced graph
            checks["compile(jvp) vs jvp"] = _max_diff(compiled(s["params"], s["v"])[1], eager)
            checks["compile(jvp input) vs jvp"] = _max_diff(compiled_x(s["xf"], s["vx"])[1],
                                                            eager_x)
            checks["compile(forward) vs forward"] = max(
                _max_diff(compiled_fwd(s["params"]), forward),
                _max_diff(compiled_fwd_x(s["xf"]), forward))
        cases[("tapegrad", "compile jvp")] = H.Case(
            "tapegrad compile(jvp)", lambda: compiled(s["params"], s["v"]), 1)
        cases[("tapegrad", "compile jvp input")] = H.Case(
            "tapegrad compile(jvp input)", lambda: compiled_x(s["xf"], s["vx"]), 1)
        cases[("tapegrad", "compile forward")] = H.Case(
            "tapegrad compile(forward)", lambda: compiled_fwd(s["params"]), 1)
        cases[("tapegrad", "compile forward input")] = H.Case(
            "tapegrad compile(forward), input", lambda: compiled_fwd_x(s["xf"]), 1)
        arrays = {k: t.numpy() for k, t in s["params"].items()}
        tangents = {k: t.numpy() for k, t in s["v"].items()}
        np_forward, np_jvp, np_jvp_x = numpy_fns(X, arrays, tangents, s["vx"].numpy())
        checks["numpy jvp vs jvp"] = _max_diff(np_jvp()[1], eager)
        checks["numpy jvp input vs jvp"] = _max_diff(np_jvp_x()[1], eager_x)
        if torch is not None:
            t = setups["torch"]
            checks["jvp vs torch.func"] = _max_diff(
                eager, t["fn"].jvp(t["out"], (t["params"],), (t["v"],))[1])
            checks["jvp input vs torch.func"] = _max_diff(
                eager_x, t["fn"].jvp(t["out_x"], (t["xf"],), (t["vx"],))[1])
        cases[("numpy", "forward")] = H.Case("numpy forward", np_forward)
        cases[("numpy", "jvp")] = H.Case("numpy jvp", np_jvp)
        cases[("numpy", "jvp input")] = H.Case("numpy jvp input", np_jvp_x)
    if "vmap" in parts:
        s = setups["tapegrad"]
        cases[("tapegrad", "loop")] = H.Case("tapegrad loop",
                                             lambda: s["loop"](s["params"], s["xb"], s["yb"]))
        if torch is not None:
            t = setups["torch"]
            cases[("torch", "loop")] = H.Case("torch loop",
                                              lambda: t["loop"](t["params"], t["xb"], t["yb"]),
                                              1)
    with H.Threads(1 if threads is None else threads, torch) as th:
        H.interleave(list(cases.values()), th, rounds=rounds, min_time=0.01)
    med = {k: H.median(c) for k, c in cases.items()}
    med.update({("spread",) + k: H.spread(c)  # IQR / median, from 4 rounds on
                for k, c in cases.items() if len(c.times) >= 4})
    return med, checks, torch is not None


def _us(med, key):
    spread = med.get(("spread",) + key)
    text = H.fmt_us(med[key]).strip()
    return text if spread is None else f"{text} ±{spread * 50:.0f}%"  # half the IQR


def report(med, checks, with_torch, batch):
    lines = []
    if ("tapegrad", "vmap(grad)") in med:
        lines += _report_vmap(med, checks, with_torch, batch)
    else:
        lines.append("checks: " + ", ".join(f"{k} max |diff| {v:.1e}" for k, v in checks.items()))
        lines.append("")
    if ("tapegrad", "jvp") not in med:
        return "\n".join(lines)
    rows = []
    names = ("tapegrad", "numpy", "torch") if with_torch else ("tapegrad", "numpy")
    for name in names:
        label = {"numpy": "numpy by hand"}.get(name, name)
        for case, what in (("jvp", "every weight"), ("jvp input", "the input only")):
            for compiled in ((False, True) if name == "tapegrad" else (False,)):
                key = (name, "compile " + case if compiled else case)
                # compiled: against compile(forward) of the same function (and, last column,
                # against the eager forward); eager: against the eager forward
                fwd = (name, {"jvp": "compile forward", "jvp input": "compile forward input"}[
                    case] if compiled else "forward")
                rows.append([f"{label}{' compile(jvp)' if compiled else ''}, {what}",
                             f"{'compile ' if compiled else ''}{_us(med, fwd)}",
                             _us(med, key), f"{med[key] / med[fwd]:.2f}x",
                             f"{med[key] / med[(name, 'forward')]:.2f}x"])
    lines.append(H.table(rows, ["jvp, spiral MLP, 512 points: tangent for", "forward us",
                                "jvp us", "jvp/forward", "jvp/eager forward"]))
    lines.append("")
    rows = []
    for name in ("tapegrad", "torch") if with_torch else ("tapegrad",):
        rows.append([name, _us(med, (name, "grad")), _us(med, (name, "hvp")),
                     f"{med[(name, 'hvp')] / med[(name, 'grad')]:.2f}x"])
    lines.append(H.table(rows, ["hvp = jvp(grad(loss)), spiral MLP", "grad us", "hvp us",
                                "hvp/grad"]))
    return "\n".join(lines)


def _report_vmap(med, checks, with_torch, batch):
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
    return lines


def main(argv=None):
    p = argparse.ArgumentParser(prog="tapegrad bench func", description=__doc__.split("\n")[0])
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--quick", action="store_true", help="5 rounds")
    p.add_argument("--threads", type=int, default=1, help="BLAS (and PyTorch) threads")
    p.add_argument("--part", choices=("all", "vmap", "jvp"), default="all",
                   help="vmap: per-sample gradients only; jvp: jvp and hvp only")
    args = p.parse_args(argv)
    rounds = 5 if args.quick else args.rounds
    torch = H.import_torch()
    with H.Threads(args.threads, torch) as th:
        H.out(H.header(th, torch, "function transforms: vmap(grad), jvp, hvp"))
    parts = ("vmap", "jvp") if args.part == "all" else (args.part,)
    med, checks, with_torch = run(args.batch, rounds, args.threads, parts)
    H.out(report(med, checks, with_torch, args.batch))
    return med


if __name__ == "__main__":
    main()
