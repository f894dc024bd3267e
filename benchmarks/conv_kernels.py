"""Convolution kernels: conv2d and its two gradients at the model suite's layer shapes, and
the suite's CNN training steps, tapegrad eager against PyTorch eager.

The figures in docs/performance.md, "Convolution kernels", come from this script::

    OPENBLAS_NUM_THREADS=1 python benchmarks/conv_kernels.py ops --dtype float32
    OPENBLAS_NUM_THREADS=1 python benchmarks/conv_kernels.py steps

Times are the calling thread's CPU time (``time.thread_time``), the best of 7 rounds, with
the BLAS and PyTorch at one thread: on a shared machine wall time measures the other users
as much as the code, and one thread keeps all the work on the timed thread. ``--paths``
times each op's alternatives at each shape (the rules in ``ops.convolution`` were derived
from these).
"""
import argparse
import time

import numpy as np

# name, N, C, H, W, O, kernel, stride, padding, groups: every convolution of the suite's
# cnn_plain, resnet_bn, mobilenet_dw and unet (unet's ConvTranspose2d aside)
SHAPES = [
    ("cnn_plain conv1", 32, 3, 16, 16, 16, 3, 1, 1, 1),
    ("cnn_plain conv2", 32, 16, 8, 8, 32, 3, 1, 1, 1),
    ("resnet stem", 16, 3, 16, 16, 16, 3, 1, 1, 1),
    ("resnet 16-16", 16, 16, 16, 16, 16, 3, 1, 1, 1),
    ("resnet 16-32 s2", 16, 16, 16, 16, 32, 3, 2, 1, 1),
    ("resnet 32-32", 16, 32, 8, 8, 32, 3, 1, 1, 1),
    ("resnet 1x1 s2", 16, 16, 16, 16, 32, 1, 2, 0, 1),
    ("mobilenet dw16 s2", 16, 16, 16, 16, 16, 3, 2, 1, 16),
    ("mobilenet pw16-32", 16, 16, 8, 8, 32, 1, 1, 0, 1),
    ("mobilenet dw32", 16, 32, 8, 8, 32, 3, 1, 1, 32),
    ("mobilenet pw32-48", 16, 32, 8, 8, 48, 1, 1, 0, 1),
    ("mobilenet dw48 s2", 16, 48, 8, 8, 48, 3, 2, 1, 48),
    ("mobilenet pw48", 16, 48, 4, 4, 48, 1, 1, 0, 1),
    ("unet 1-8", 8, 1, 16, 16, 8, 3, 1, 1, 1),
    ("unet 8-8", 8, 8, 16, 16, 8, 3, 1, 1, 1),
    ("unet 16-32", 8, 16, 4, 4, 32, 3, 1, 1, 1),
    ("unet 32-16", 8, 32, 8, 8, 16, 3, 1, 1, 1),
    ("unet 16-8", 8, 16, 16, 16, 8, 3, 1, 1, 1),
    ("unet out 1x1", 8, 8, 16, 16, 1, 1, 1, 0, 1),
]
MODELS = ["cnn_plain", "resnet_bn", "mobilenet_dw", "unet"]


def best_us(fn, rounds=7, budget=0.02):
    """Best thread CPU time of ``fn()`` in microseconds."""
    fn()
    t0 = time.thread_time()
    fn()
    n = max(1, min(200, int(budget / max(time.thread_time() - t0, 1e-6))))
    times = []
    for _ in range(rounds):
        t0 = time.thread_time()
        for _ in range(n):
            fn()
        times.append((time.thread_time() - t0) / n)
    return min(times) * 1e6


def _operands(shape, dtype, rng):
    _, n, c, h, w, o, k, s, p, g = shape
    x = rng.standard_normal((n, c, h, w)).astype(dtype)
    wt = rng.standard_normal((o, c // g, k, k)).astype(dtype)
    oh, ow = (h + 2 * p - k) // s + 1, (w + 2 * p - k) // s + 1
    gy = rng.standard_normal((n, o, oh, ow)).astype(dtype)
    params = dict(stride=(s, s), padding=((p, p), (p, p)), dilation=(1, 1), groups=g)
    return x, wt, gy, params


def ops(dtype):
    import torch

    from tapegrad.ops import convolution as conv

    torch.set_num_threads(1)
    rng = np.random.default_rng(0)
    print(f"microseconds, {dtype}: tapegrad conv2d, conv2d_input, conv2d_weight | PyTorch "
          "conv2d, convolution_backward (both gradients)")
    print("| layer | conv2d | conv2d_input | conv2d_weight | PyTorch fwd | PyTorch bwd |")
    print("|---|---:|---:|---:|---:|---:|")
    for shape in SHAPES:
        x, w, g, p = _operands(shape, dtype, rng)
        k, s, pad, groups = shape[6:]
        tx, tw, tg = torch.from_numpy(x), torch.from_numpy(w), torch.from_numpy(g)
        row = [best_us(lambda: conv.conv2d.forward(x, w, **p)),
               best_us(lambda: conv.conv2d_input.forward(g, w, size=x.shape[2:], **p)),
               best_us(lambda: conv.conv2d_weight.forward(x, g, kernel=(k, k), **p)),
               best_us(lambda: torch.nn.functional.conv2d(tx, tw, stride=s, padding=pad,
                                                          groups=groups)),
               best_us(lambda: torch.ops.aten.convolution_backward(
                   tg, tx, tw, None, [s, s], [pad, pad], [1, 1], False, [0, 0], groups,
                   [True, True, False]))]
        print(f"| {shape[0]} | " + " | ".join(f"{v:.0f}" for v in row) + " |")


def paths(dtype):
    """Each op's alternatives where ``ops.convolution`` chooses between them."""
    from tapegrad.ops import convolution as conv

    rng = np.random.default_rng(0)
    print(f"microseconds, {dtype}")
    print("| layer | input grad: correlation | input grad: col2im | depthwise: loops | "
          "depthwise: GEMM |")
    print("|---|---:|---:|---:|---:|")
    for shape in SHAPES:
        x, w, g, p = _operands(shape, dtype, rng)
        size = x.shape[2:]
        cells = ["-"] * 4
        if conv._pointwise(w.shape[2:], p["padding"], p["groups"]):
            continue
        if p["stride"] == (1, 1) and p["groups"] == 1:
            cells[0] = best_us(lambda: conv._unit_stride_input_grad(
                g, w, size, p["padding"], p["dilation"], p["groups"]))
            saved = conv._by_correlation
            conv._by_correlation = lambda *a: False
            try:
                cells[1] = best_us(lambda: conv.conv2d_input.forward(g, w, size=size, **p))
            finally:
                conv._by_correlation = saved
        if p["groups"] > 1:
            saved = conv._loops
            try:
                conv._loops = None
                cells[2] = best_us(lambda: conv.conv2d.forward(x, w, **p))
                conv._loops = False
                cells[3] = best_us(lambda: conv.conv2d.forward(x, w, **p))
            finally:
                conv._loops = saved
        print(f"| {shape[0]} | " + " | ".join(
            c if isinstance(c, str) else f"{c:.0f}" for c in cells) + " |")


def steps():
    import torch

    import tapegrad
    from tapegrad.bench import suite

    torch.set_num_threads(1)
    print("ms a training step (eager), thread CPU time")
    print("| model | dtype | tapegrad | PyTorch |")
    print("|---|---|---:|---:|")
    for name in MODELS:
        for dtype in ("float32", "float64"):
            row = []
            for lib in (tapegrad, torch):
                step, _, _, inputs = suite.make_step(lib, name, dtype)
                for _ in range(3):
                    step(*inputs)
                row.append(best_us(lambda: step(*inputs), budget=0.1) / 1e3)
            print(f"| {name} | {dtype} | {row[0]:.2f} | {row[1]:.2f} |", flush=True)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("what", choices=["ops", "paths", "steps"])
    ap.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    args = ap.parse_args(argv)
    if args.what == "steps":
        steps()
    else:
        (ops if args.what == "ops" else paths)(np.dtype(args.dtype))


if __name__ == "__main__":
    main()
