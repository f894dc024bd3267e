"""The checkpointing table: peak memory and time of a deep ReLU MLP training step, with and
without gradient checkpointing (``tapegrad bench checkpoint``, ``benchmarks/checkpoint.py``).

Width 192, batch 256, float32, depths 16, 64 and 144; checkpointed runs use
``checkpoint_sequential`` with round(sqrt(depth)) segments. Peak memory is measured by
``tapegrad.profiler.memory`` (tracemalloc: numpy's own allocations plus the tape's Python
objects) over one step, above the model's steady state (parameters and persistent gradient
buffers). Matmuls are counted by wrapping the registered op. Time is the median of
interleaved untracked steps. A PNG plot of peak memory vs depth is written next to the table.
"""
import argparse
import math
import os
import statistics
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

from tapegrad.profiler import storage_bytes  # noqa: E402
from tapegrad.profiler.workload import DeepMLP, count_matmuls, measure_step  # noqa: E402

DEPTHS = (16, 64, 144)


def _time_steps(model, segments_list, repeats):
    """Median seconds per step for each mode, the modes interleaved to share machine noise."""
    times = {s: [] for s in segments_list}
    for _ in range(repeats):
        for s in segments_list:
            t0 = time.perf_counter()
            model.step(s)
            times[s].append(time.perf_counter() - t0)
    return {s: statistics.median(v) for s, v in times.items()}


def run(depths=DEPTHS, width=192, batch=256, repeats=7):
    rows = []
    for depth in depths:
        segments = max(1, round(math.sqrt(depth)))
        model = DeepMLP(depth, width, batch)
        plain_mem = measure_step(model, None).peak_bytes
        ckpt_mem = measure_step(model, segments).peak_bytes
        plain_mm = count_matmuls(model, None)
        ckpt_mm = count_matmuls(model, segments)
        times = _time_steps(model, [None, segments], repeats)
        state = storage_bytes(model.weights)
        rows.append(dict(depth=depth, segments=segments, plain_mem=plain_mem, ckpt_mem=ckpt_mem,
                         state=state["parameters"] + state["gradients"],
                         plain_mm=plain_mm, ckpt_mm=ckpt_mm, plain_s=times[None],
                         ckpt_s=times[segments]))
    return rows


def table(rows):
    head = (f"{'depth':>5} {'segments':>8} {'peak plain':>11} {'peak ckpt':>10} {'saving':>7} "
            f"{'matmuls plain':>13} {'matmuls ckpt':>12} {'step plain':>10} {'step ckpt':>10} "
            f"{'time ratio':>10} {'model state':>11}")
    lines = [head]
    for r in rows:
        lines.append(
            f"{r['depth']:>5} {r['segments']:>8} {r['plain_mem'] / 2**20:>7.2f} MiB "
            f"{r['ckpt_mem'] / 2**20:>6.2f} MiB {r['plain_mem'] / r['ckpt_mem']:>6.2f}x "
            f"{r['plain_mm']:>13} {r['ckpt_mm']:>12} {r['plain_s'] * 1e3:>7.1f} ms "
            f"{r['ckpt_s'] * 1e3:>7.1f} ms {r['ckpt_s'] / r['plain_s']:>9.2f}x "
            f"{r['state'] / 2**20:>7.2f} MiB")
    return "\n".join(lines)


def plot(rows, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    depths = [r["depth"] for r in rows]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(depths, [r["plain_mem"] / 2**20 for r in rows], "o-", label="no checkpointing")
    ax.plot(depths, [r["ckpt_mem"] / 2**20 for r in rows], "s-",
            label="checkpoint_sequential, sqrt(depth) segments")
    ax.set_xlabel("depth (ReLU layers, width 192, batch 256)")
    ax.set_ylabel("measured peak memory of a step (MiB)")
    ax.set_title("tapegrad: activation memory vs depth")
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None):
    p = argparse.ArgumentParser(prog="tapegrad bench checkpoint", description=__doc__.split(
        "\n\n")[0])
    p.add_argument("--depths", type=int, nargs="+", default=list(DEPTHS))
    p.add_argument("--repeats", type=int, default=7, help="timed steps per mode (median)")
    p.add_argument("--quick", action="store_true", help="depths 16 and 64, 3 repeats")
    p.add_argument("--plot", default="checkpoint_memory.png", help="PNG path ('' for none)")
    args = p.parse_args(argv)
    depths, repeats = (args.depths, args.repeats) if not args.quick else ((16, 64), 3)
    print("checkpointing: deep ReLU MLP, width 192, batch 256, float32. peak = measured bytes "
          "of one training step above the model state (parameters + gradient buffers, held "
          "throughout and listed last)")
    rows = run(depths, repeats=repeats)
    print(table(rows))
    if args.plot:
        plot(rows, args.plot)
        print(f"plot: {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
