"""Communication figures for docs/performance.md (a few seconds):

    python -m tapegrad.distributed.run --nproc-per-node 2 -m tapegrad.distributed.bench
    python -m tapegrad.distributed.run --nproc-per-node 2 -m tapegrad.distributed.bench --check

1. ``all_reduce`` time against message size, fitted to the ring model
   ``t = latency + 2 (p - 1) / p * bytes / bandwidth``;
2. DDP on MLPs of growing size: bytes all-reduced per step, step time, the all-reduce time of
   those bytes on its own, and the part of it left waiting after backward (the rest is hidden
   behind backward by the bucketed hooks);
3. the cost of the ranks' agreement check: a one-element ``all_reduce`` on the default group
   (checked) and on a group made with ``TAPEGRAD_DISTRIBUTED_DEBUG=OFF``, interleaved.
"""
import os
import sys
import time

import numpy as np

import tapegrad
import tapegrad.distributed as dist
import tapegrad.nn as nn
from tapegrad.nn.parallel import DistributedDataParallel


def allreduce_seconds(numel, repeat):
    t = tapegrad.zeros(numel, dtype=tapegrad.float64)
    dist.all_reduce(t)
    times = []
    for _ in range(repeat):
        dist.barrier()
        start = time.perf_counter()
        dist.all_reduce(t)
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def check_cost(repeat=1000):
    """Median seconds of a one-float64 all_reduce with the agreement check and without."""
    before = os.environ.get("TAPEGRAD_DISTRIBUTED_DEBUG")
    os.environ["TAPEGRAD_DISTRIBUTED_DEBUG"] = "OFF"
    unchecked = dist.new_group()
    if before is None:
        del os.environ["TAPEGRAD_DISTRIBUTED_DEBUG"]
    else:
        os.environ["TAPEGRAD_DISTRIBUTED_DEBUG"] = before
    t = tapegrad.zeros(1, dtype=tapegrad.float64)
    times = {None: [], unchecked: []}
    for _ in range(repeat):
        for group in times:
            dist.barrier()  # both ranks start together: the time is the call's, not the lag
            start = time.perf_counter()
            dist.all_reduce(t, group=group)
            times[group].append(time.perf_counter() - start)
    dist.destroy_process_group(unchecked)
    return float(np.median(times[None])), float(np.median(times[unchecked]))


def main():
    dist.init_process_group(backend="mpi")
    rank, p = dist.get_rank(), dist.get_world_size()
    say = print if rank == 0 else (lambda *a, **k: None)
    if "--check" in sys.argv[1:]:  # only the agreement check's cost
        report_check_cost(say)
        dist.destroy_process_group()
        return
    say(f"ranks {p}")
    say("all_reduce (float64)   bytes      median ms")
    sizes, times = [], []
    for numel in (1, 128, 8192, 131072, 1 << 20, 1 << 22):
        s = allreduce_seconds(numel, 30 if numel < 1 << 20 else 8)
        sizes.append(numel * 8)
        times.append(s)
        say(f"{numel * 8:>30d} {s * 1e3:10.3f}")
    factor = 2 * (p - 1) / p
    slope, _ = np.polyfit(factor * np.array(sizes[-3:]), times[-3:], 1)
    latency = min(times[:2])  # the median of tiny messages also holds the other rank's lag
    say(f"ring model: latency {latency * 1e6:.0f} us, bandwidth {1 / slope / 1e9:.2f} GB/s")
    say("\nDDP MLP (batch 32/rank)  params   bytes/step  step ms  allreduce ms  waited ms  hidden")
    for width in (64, 256, 1024):
        tapegrad.manual_seed(0)
        model = nn.Sequential(*[m for _ in range(4) for m in (nn.Linear(width, width), nn.Tanh())],
                              nn.Linear(width, 10)).double()
        ddp = DistributedDataParallel(model, bucket_cap_mb=1)
        x = tapegrad.randn(32, width, dtype=tapegrad.float64)
        y = tapegrad.randint(0, 10, (32,))
        steps = 20
        for i in range(steps + 3):
            if i == 3:
                dist.barrier()
                start = time.perf_counter()
                ddp.comm_stats.update(bytes=0, exposed_wait_s=0.0, steps=0, allreduce_calls=0)
            ddp.zero_grad()
            nn.functional.cross_entropy(ddp(x), y).backward()
        step = (time.perf_counter() - start) / steps
        stats = ddp.comm_stats
        nbytes = stats["bytes"] / stats["steps"]
        alone = allreduce_seconds(int(nbytes // 8), 8)
        waited = stats["exposed_wait_s"] / stats["steps"]
        params = sum(q.numel() for q in model.parameters())
        say(f"{width:>24d} {params:8d} {nbytes:12.0f} {step * 1e3:8.2f} {alone * 1e3:12.3f} "
            f"{waited * 1e3:10.3f}  {max(0.0, 1 - waited / alone) * 100:5.0f}%")
    say("")
    report_check_cost(say)
    dist.destroy_process_group()


def report_check_cost(say):
    checked, unchecked = check_cost()
    say(f"all_reduce of one float64: {checked * 1e6:.1f} us with the agreement check, "
        f"{unchecked * 1e6:.1f} us without (median of 1000, interleaved)")


if __name__ == "__main__":
    main()
