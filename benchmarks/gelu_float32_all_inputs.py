"""Every float32 input (all 2^32 bit patterns): the compiled float32 GELU forward
(compiler/kernels_gelu.py: ERF32_SHORT on |u| <= 2, ERF32_MID beyond)
and the previous one-fit kernel (erf32 on every lane) against eager's GELU (``gelu_with_cdf``,
``ops.nn.gelu``'s operations): ``out`` and ``w = 1 + erf(x / sqrt 2)`` compared as bits (NaN
as NaN). ~3 minutes of one core; prints the counts and the inputs that differ.

    .venv/bin/python benchmarks/gelu_float32_all_inputs.py [first_bits last_bits]
"""
import sys
import time

import numpy as np

from tapegrad.compiler import kernels, kernels_gelu as K
from tapegrad.compiler.ir import Graph

ONE_FIT = K._src(["def gelu_one_fit_float32(x, out, w):", "    for i in range(x.size):",
                  "        xi = x[i]", f"        u = xi * np.float32({K._SQRT1_2!r})",
                  "        wi = np.float32(1.0) + np.float32(erf32(np.float64(u)))",
                  "        w[i] = wi", "        out[i] = (xi * np.float32(0.5)) * wi"],
                 kernels.erf32_source(), ', fastmath={"contract"}')


def _differ(a, b):
    both_nan = np.isnan(a) & np.isnan(b)
    return np.flatnonzero((a.view(np.int32) != b.view(np.int32)) & ~both_nan)


def main(lo=0, hi=1 << 32, step=1 << 22):
    old = kernels.load("gelu_one_fit_float32", ONE_FIT)
    node = type("Node", (), {"inputs": [Graph().new_value((step,), np.float32)]})()
    new = K.gelu_with_cdf_factory(node)
    found = {k: [] for k in ("new out", "new w", "one-fit out", "one-fit w")}
    t0 = time.time()
    with np.errstate(all="ignore"):
        for a in range(lo, hi, step):
            x = np.arange(a, min(a + step, hi), dtype=np.uint64).astype(np.uint32)
            x = x.view(np.float32)
            ref_out, ref_w, _ = K.gelu_with_cdf(x)
            out, w, _ = new(x)
            o1, w1 = np.empty_like(x), np.empty_like(x)
            old(x, o1, w1)
            for key, got, ref in (("new out", out, ref_out), ("new w", w, ref_w),
                                  ("one-fit out", o1, ref_out), ("one-fit w", w1, ref_w)):
                found[key] += [float(v) for v in x[_differ(got, ref)]]
    print(f"bits {lo:#x}..{hi:#x}: {hi - lo} inputs, {time.time() - t0:.0f} s")
    for key, xs in found.items():
        print(f"{key}: {len(xs)} differ from eager's", xs)


if __name__ == "__main__":
    a = [int(v, 0) for v in sys.argv[1:3]]
    main(*a)
