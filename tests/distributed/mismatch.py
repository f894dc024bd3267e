"""Worker (run by tests/test_distributed_checks.py under mpiexec -n 2): ranks that disagree on a
collective. ``all`` runs every case in one job, catching each error (a mismatch drops the
collective on every rank, so the group stays usable) and printing ``rank R: case: message``;
``uncaught`` lets one mismatch end the job; ``off`` and ``off-on-one-rank`` run with
TAPEGRAD_DISTRIBUTED_DEBUG=OFF on both ranks or on rank 1 only."""
import datetime
import os
import sys

import tapegrad
import tapegrad.distributed as dist
from tapegrad.distributed import ReduceOp

mode = sys.argv[1]
rank = int(os.environ["PMI_RANK"])
if mode == "off" or (mode == "off-on-one-rank" and rank == 1):
    os.environ["TAPEGRAD_DISTRIBUTED_DEBUG"] = "off"
dist.init_process_group(backend="mpi", timeout=datetime.timedelta(seconds=60))
f32, f64 = tapegrad.float32, tapegrad.float64


def n(k, dtype=f64):
    """Rank 0 gets k elements, rank 1 k + 2."""
    return tapegrad.ones(k + 2 * rank, dtype=dtype)


def all_reduce_async():
    dist.all_reduce(n(3), async_op=True).wait()


def gather():
    dist.gather(n(3), [n(3), n(3)] if rank == 0 else None, dst=0)


def scatter():
    dist.scatter(n(3), [n(3), n(3)] if rank == 1 else None, src=1)


def send_recv():
    if rank == 0:
        dist.send(tapegrad.ones(3, dtype=f64), dst=1)
    else:
        dist.recv(tapegrad.zeros(5, dtype=f64), src=0)


cases = {
    "all_reduce shapes": lambda: dist.all_reduce(n(3)),
    "all_reduce dtypes": lambda: dist.all_reduce(tapegrad.ones(3, dtype=(f32, f64)[rank])),
    "all_reduce ops": lambda: dist.all_reduce(tapegrad.ones(3), op=(ReduceOp.SUM,
                                                                   ReduceOp.MAX)[rank]),
    "all_reduce async": all_reduce_async,
    "reduce": lambda: dist.reduce(n(3), dst=0),
    "reduce roots": lambda: dist.reduce(tapegrad.ones(3), dst=rank),
    "broadcast": lambda: dist.broadcast(n(3), src=0),
    "broadcast large": lambda: dist.broadcast(tapegrad.ones(3 + 200_000 * rank), src=0),
    "broadcast roots": lambda: dist.broadcast(tapegrad.ones(3), src=rank),
    "all_gather": lambda: dist.all_gather([n(3), n(3)], n(3)),
    # each rank's output is right for its own input: only the ranks together disagree
    "all_gather_into_tensor": lambda: dist.all_gather_into_tensor(
        tapegrad.ones(2 * (3 + rank)), tapegrad.ones(3 + rank)),
    "reduce_scatter_tensor": lambda: dist.reduce_scatter_tensor(
        tapegrad.ones(3 + rank), tapegrad.ones(2 * (3 + rank))),
    "gather": gather,
    "scatter": scatter,
    "different collectives": lambda: (dist.all_reduce(tapegrad.ones(3)) if rank == 0 else
                                      dist.broadcast(tapegrad.ones(3), src=0)),
    "barrier against all_reduce": lambda: (dist.barrier() if rank == 0 else
                                           dist.all_reduce(tapegrad.ones(3))),
    "broadcast_object_list": lambda: dist.broadcast_object_list([1, 2] + [3] * rank, src=0),
    "send/recv": send_recv,
}

if mode == "all":
    for name, call in cases.items():
        try:
            call()
        except dist.DistError as e:
            said = str(e)
        else:
            said = "no error"
        t = tapegrad.ones(4) * (rank + 1)  # the group still works after each mismatch
        dist.all_reduce(t)
        assert t.tolist() == [3.0] * 4, (name, t)
        everyone = [None, None]
        dist.all_gather_object(everyone, said)  # rank 0 prints: MPI interleaves ranks' lines
        if rank == 0:
            print("\n".join(f"rank {r}: {name}: {s}" for r, s in enumerate(everyone)), flush=True)
    print(f"rank {rank}: all cases done", flush=True)
elif mode == "uncaught":
    cases["all_reduce shapes"]()
elif mode == "off":
    t = tapegrad.ones(3, 2) if rank == 0 else tapegrad.ones(6)  # same bytes: MPI cannot tell
    dist.all_reduce(t)
    print(f"rank {rank}: unchecked all_reduce {t.sum().item():g}", flush=True)
    cases["broadcast"]()
dist.destroy_process_group()
print(f"rank {rank}: unexpectedly finished" if mode != "all" else f"rank {rank}: finished")
