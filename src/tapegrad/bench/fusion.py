"""Fused ops against their unfused compositions.

Each fused op is timed forward + backward against the same function built from smaller
recorded ops, at sizes n in {8, 32, 128, 512} (batch = features = n), float64: the fused
op records one node where the composite records several, so fusion saves the composite's
extra per-op dispatch cost (fixed, ~2-3 us per recorded op plus its backward rule) and,
at large n, whatever extra passes over memory the composite makes. Then the optimizer
step: Adam over one flat buffer (``foreach`` default) vs parameter by parameter
(``foreach=False``), on 50 small parameters and on 4 large ones.
"""
import argparse
import math

import numpy as np

import tapegrad
import tapegrad.nn.functional as F
from tapegrad.bench import harness as H

SIZES = (8, 32, 128, 512)
QUICK_SIZES = (8, 32)
_SQRT1_2 = 1.0 / math.sqrt(2.0)


# --- the pairs: (fused, composite), each f(x, w, b, y, v) -> output to backward ------------
def _linear_fused(x, w, b, y, v):
    return F.linear(x, w, b)


def _linear_composite(x, w, b, y, v):
    return x @ w.T + b  # matmul, transpose view, broadcast add: three recorded ops


def _linear_relu_fused(x, w, b, y, v):
    return F.linear_relu(x, w, b)


def _linear_relu_composite(x, w, b, y, v):
    return F.relu(F.linear(x, w, b))


def _ce_fused(x, w, b, y, v):
    return F.cross_entropy(x, y)


def _ce_composite(x, w, b, y, v):
    # log_softmax from exp/sum/log (max subtracted, as a stable composite must), then nll
    # by gather; every step a recorded op
    s = x - x.max(dim=1, keepdim=True).values.detach()
    logp = s - s.exp().sum(dim=1, keepdim=True).log()
    return -logp.gather(1, y[:, None]).mean()


def _ln_fused(x, w, b, y, v):
    return F.layer_norm(x, (x.shape[-1],), v, b)


def _ln_composite(x, w, b, y, v):
    mean = x.mean(dim=-1, keepdim=True)
    xc = x - mean
    var = (xc * xc).mean(dim=-1, keepdim=True)
    return xc / (var + 1e-5).sqrt() * v + b


def _gelu_fused(x, w, b, y, v):
    return F.gelu(x)


def _gelu_composite(x, w, b, y, v):
    return x * 0.5 * (1 + tapegrad.erf(x * _SQRT1_2))


PAIRS = {
    "linear (fused bias) vs matmul + add": (_linear_fused, _linear_composite),
    "linear_relu vs relu(linear)": (_linear_relu_fused, _linear_relu_composite),
    "cross_entropy vs log_softmax composite + gather": (_ce_fused, _ce_composite),
    "layer_norm vs mean/var composite": (_ln_fused, _ln_composite),
    "gelu vs erf composite": (_gelu_fused, _gelu_composite),
}


def _inputs(n, seed=0):
    rng = np.random.default_rng(seed)
    x = tapegrad.tensor(rng.standard_normal((n, n)), requires_grad=True)
    w = tapegrad.tensor(rng.standard_normal((n, n)) / math.sqrt(n), requires_grad=True)
    b = tapegrad.tensor(rng.standard_normal(n), requires_grad=True)
    y = tapegrad.tensor(rng.integers(0, n, size=n))
    v = tapegrad.tensor(1 + 0.1 * rng.standard_normal(n), requires_grad=True)
    return x, w, b, y, v


def _step(fn, x, w, b, y, v, g):
    leaves = (x, w, b, v)

    def run():
        out = fn(x, w, b, y, v)
        out.backward(g if out.ndim else None)
        for t in leaves:
            t.grad = None
    return run


def agree(fused, composite, n=16):
    """max |fused - composite| over the output and the four gradients (a sanity check)."""
    worst = 0.0
    results = []
    for fn in (fused, composite):
        x, w, b, y, v = _inputs(n)
        out = fn(x, w, b, y, v)
        g = tapegrad.ones_like(out) if out.ndim else None
        out.backward(g)
        results.append([out.detach().numpy()] + [
            t.grad.numpy() if t.grad is not None else np.zeros(t.shape) for t in (x, w, b, v)])
    for a, c in zip(*results):
        scale = max(1.0, float(np.abs(c).max()))
        worst = max(worst, float(np.abs(a - c).max()) / scale)
    return worst


def measure_pairs(threads, sizes=SIZES, rounds=11):
    rows = []
    for name, (fused, composite) in PAIRS.items():
        for n in sizes:
            x, w, b, y, v = _inputs(n)
            out = fused(x, w, b, y, v)
            g = tapegrad.tensor(np.random.default_rng(1).standard_normal(tuple(out.shape)))
            cases = [H.Case("fused", _step(fused, x, w, b, y, v, g)),
                     H.Case("composite", _step(composite, x, w, b, y, v, g))]
            H.interleave(cases, threads, rounds=rounds, min_time=0.005)
            tf, tc = H.median(cases[0]), H.median(cases[1])
            rows.append({"pair": name, "n": n, "fused": tf, "composite": tc,
                         "saved": tc - tf, "speedup": tc / tf,
                         "spread": max(H.spread(cases[0]), H.spread(cases[1]))})
    return rows


def pairs_table(rows):
    table = [[r["pair"], str(r["n"]), H.fmt_us(r["fused"]).strip(),
              H.fmt_us(r["composite"]).strip(), H.fmt_us(r["saved"]).strip(),
              f"{r['speedup']:.2f}x", f"{r['spread']:.1%}"] for r in rows]
    return H.table(table, ["fused op vs composite (forward+backward)", "n", "fused us",
                           "composite us", "saved us", "fused speedup", "noise (IQR/median)"])


# --- the optimizer step ------------------------------------------------------------------
def _adam_case(shapes, foreach, flat_max_numel=None, seed=0):
    rng = np.random.default_rng(seed)
    params = [tapegrad.nn.Parameter(tapegrad.tensor(rng.standard_normal(s))) for s in shapes]
    for p in params:
        p.grad = tapegrad.tensor(rng.standard_normal(p.shape) * 1e-3)
    opt = tapegrad.optim.Adam(params, lr=1e-3, foreach=foreach)
    if flat_max_numel is not None:
        opt.flat_max_numel = flat_max_numel
    opt.step()  # state created outside the timing
    return opt.step


OPT_CONFIGS = [
    ("Adam, 50 params of 16x16", [(16, 16)] * 50),
    ("Adam, 4 params of 1024x1024", [(1024, 1024)] * 4),
]


def measure_optim(threads, rounds=11, configs=OPT_CONFIGS):
    rows = []
    for name, shapes in configs:
        # flat: one buffer for the whole group (the size threshold lifted for the large
        # params, to show what a concatenation costs there); per-param: foreach=False
        flat = H.Case("flat", _adam_case(shapes, None, flat_max_numel=1 << 62))
        each = H.Case("per-param", _adam_case(shapes, False))
        default = H.Case("default", _adam_case(shapes, None))
        H.interleave([flat, each, default], threads, rounds=rounds, min_time=0.005)
        rows.append([name, H.fmt_us(H.median(flat)).strip(), H.fmt_us(H.median(each)).strip(),
                     H.fmt_us(H.median(default)).strip(),
                     f"{H.median(each) / H.median(flat):.2f}x"])
    return H.table(rows, ["optimizer step", "one flat buffer us", "per-parameter us",
                          "default (flat up to 1024 elements) us", "flat speedup"])


def main(argv=None):
    p = argparse.ArgumentParser(prog="tapegrad bench fusion", description=__doc__.split("\n")[0])
    p.add_argument("--threads", type=int, default=1,
                   help="numpy BLAS threads (default 1: the per-op cost without thread wake-ups)")
    p.add_argument("--rounds", type=int, default=11)
    p.add_argument("--quick", action="store_true", help="sizes 8 and 32, 3 rounds (smoke test)")
    p.add_argument("--no-torch", action="store_true", help="accepted for 'bench all'; "
                   "this benchmark times tapegrad against itself")
    args = p.parse_args(argv)
    from tapegrad.bench.scale import allocator_line

    malloc = allocator_line()
    rounds = 3 if args.quick else args.rounds
    with H.Threads(args.threads) as threads:
        H.out(H.header(threads, None, "fused ops vs their unfused compositions"))
        H.out(malloc)
        H.out(f"float64; median microseconds per forward+backward over {rounds} interleaved "
              "rounds (fused and composite alternate); n = batch = features")
        for name, (fused, composite) in PAIRS.items():
            err = agree(fused, composite)
            H.out(f"  {name}: fused and composite agree to {err:.1e} (relative, n=16)")
        H.out()
        rows = measure_pairs(threads, QUICK_SIZES if args.quick else SIZES, rounds)
        H.out(pairs_table(rows))
        H.out()
        H.out("Adam step (float64), one flat buffer vs per-parameter updates; medians of "
              f"{rounds} interleaved rounds")
        configs = OPT_CONFIGS if not args.quick else [OPT_CONFIGS[0]]
        H.out(measure_optim(threads, rounds, configs))
    return rows


if __name__ == "__main__":
    main()
