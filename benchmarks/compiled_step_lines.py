"""Where a compiled training step's time goes: thread CPU time per line of the generated code
of the char-GPT (or digits-CNN) step that ``tapegrad bench compile --model ...`` times, grouped
into BLAS, GELU, attention, LayerNorm, ... and the part outside the generated code (the tail
replay: the step's Python rerun each call). Each line is wrapped in two ``time.thread_time``
calls, whose own cost (~0.2 ms a step for ~90 lines) lands outside the generated lines.

    ROWS=40 .venv/bin/python benchmarks/compiled_step_lines.py [float64|float32] [steps] [gpt|cnn]

prints the ROWS (default 30) dearest lines other than the BLAS calls, then the groups' totals.
"""
import collections
import os
import sys
import time

import numpy as np

import tapegrad
from tapegrad.bench import compile as B, harness, models as M

GROUPS = (("linear/matmul", (" linear(", " matmul(", " linear_kernel")), ("gelu", ("gelu",)),
          ("attention", ("attention",)), ("layer_norm", ("layer_norm",)),
          ("softmax", ("softmax",)), ("optimizer/clip", ("optimizer", "clip", "adam")),
          ("cross_entropy", ("cross_entropy",)),
          ("attention gradient (its 5 products inside)", ("concatenate_products",)),
          ("concat/embedding", ("concat", "embedding")))


def group(line):
    for name, keys in GROUPS:
        if any(k in line for k in keys):
            return name
    return "other"


def main(dtype="float64", steps=30, kind="gpt"):
    with harness.Threads(1, None):
        state, batches = M.initial_state(kind), M.make_data(kind, 8)
        S = M.Step(tapegrad, kind, state, batches, np.dtype(dtype))
        f = tapegrad.compile(B._model_step(S))
        for _ in range(3):
            f(*S._batch())
        e = f.entries[-1]
        ns = e.run.__globals__
        name = e.run.__name__
        lines = e.source[e.source.index(f"def {name}("):].splitlines()
        timed, spent = [lines[0]], [0.0] * len(lines)
        ns["_T"], ns["_pc"] = spent, time.thread_time
        for i, line in enumerate(lines[1:], 1):
            pad = line[:len(line) - len(line.lstrip())]
            if line.strip().startswith("return"):
                timed.append(line)
                continue
            timed += [f"{pad}_t0 = _pc()", line, f"{pad}_T[{i}] += _pc() - _t0"]
        exec("\n".join(timed), ns)  # noqa: S102 - the compiler's own generated source
        e.run = ns[name]
        for _ in range(3):
            f(*S._batch())
        spent[:] = [0.0] * len(lines)
        t0 = time.thread_time()
        for _ in range(steps):
            f(*S._batch())
        whole = (time.thread_time() - t0) / steps * 1e3
    rows = sorted(((t / steps * 1e3, line.strip()) for t, line in zip(spent, lines) if t),
                  reverse=True)
    inside = sum(t for t, _ in rows)
    print(f"{kind} {dtype}: whole call {whole:.2f} ms; generated lines {inside:.2f} ms")
    shown = [r for r in rows if group(r[1]) != "linear/matmul"]  # (the BLAS lines left out)
    for t, line in shown[:int(os.environ.get("ROWS", 30))]:
        print(f"{t:7.3f}  {line[:110]}")
    groups = collections.Counter()
    for t, line in rows:
        groups[group(line)] += t
    print(" | ".join(f"{k} {v:.2f}" for k, v in groups.most_common()) +
          f" | outside the generated code {whole - inside:.2f}")


if __name__ == "__main__":
    a = sys.argv[1:]
    main(a[0] if a else "float64", int(a[1]) if len(a) > 1 else 30, a[2] if len(a) > 2 else "gpt")
