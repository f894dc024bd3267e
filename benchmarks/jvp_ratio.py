"""Eager ``func.jvp`` against the forward on ``tapegrad bench func``'s spiral MLP (2->32->3,
float64, 512 points, params through ``func.functional_call``): forward, jvp with a tangent on
the input, jvp with a tangent on every weight, jvp of the identity (entry/exit alone) and the
tangent's own numpy arithmetic by hand (the floor), interleaved round by round; prints medians
(us) and the median per-round ratios as JSON. Run: ``.venv/bin/python benchmarks/jvp_ratio.py``."""
import json, statistics, time
import numpy as np
import tapegrad
from tapegrad.bench.func import model_and_params, NAMES
from tapegrad.bench.spiral import init_params, spiral_data
T = tapegrad; fn = tapegrad.func
X, y = spiral_data(512)
rng = np.random.default_rng(1)
rng.choice(len(X), size=256, replace=False)
shapes = {k: a.shape for k, a in zip(NAMES, init_params((2, 32, 3)))}
tangents = {k: rng.standard_normal(s) for k, s in shapes.items()}
tx = np.random.default_rng(2).standard_normal(X.shape)
model, params = model_and_params(T)
xf = T.tensor(X); vx = T.tensor(tx)
v = {k: T.tensor(tangents[k]) for k in params}
def out(p): return fn.functional_call(model, p, (xf,))
def out_x(x): return fn.functional_call(model, params, (x,))
fwd = lambda: out(params)
jw = lambda: fn.jvp(out, (params,), (v,))
jx = lambda: fn.jvp(out_x, (xf,), (vx,))
w1, b1, w2, b2 = (params[k].numpy() for k in NAMES)
tw1, tb1, tw2, tb2 = (v[k].numpy() for k in NAMES)
a = np.maximum(X @ w1.T + b1, 0)
def tan_x():
    return ((tx @ w1.T) * (a > 0)) @ w2.T
def tan_w():
    th = X @ tw1.T; th += tb1
    t = (th * (a > 0)) @ w2.T
    t += a @ tw2.T; t += tb2
    return t
cases = dict(fwd=fwd, jx=jx, jw=jw, idj=lambda: fn.jvp(lambda x: x, (xf,), (vx,)),
             tan_x=tan_x, tan_w=tan_w)
res = {k: [] for k in cases}
for k, f in cases.items():
    for _ in range(200): f()
for r in range(25):
    for k, f in cases.items():
        n = 150
        t0 = time.perf_counter()
        for _ in range(n): f()
        res[k].append((time.perf_counter() - t0) / n * 1e6)
med = {k: statistics.median(x) for k, x in res.items()}
med["jx/fwd"] = statistics.median(j / f for j, f in zip(res["jx"], res["fwd"]))
med["jw/fwd"] = statistics.median(j / f for j, f in zip(res["jw"], res["fwd"]))
print(json.dumps({k: round(v, 3) for k, v in med.items()}))
