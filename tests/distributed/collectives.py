"""Worker (run by tests/distributed/test_distributed.py under mpiexec -n 2): each collective on
tensors against a numpy reduction of every rank's input, sync and async."""
import datetime
import sys

import numpy as np

import tapegrad
import tapegrad.distributed as dist
from tapegrad.distributed import ReduceOp

dist.init_process_group(backend="mpi", timeout=datetime.timedelta(seconds=20))
rank, size = dist.get_rank(), dist.get_world_size()
checks = 0


def data(r, shape=(3, 4), dtype=np.float64):
    """Rank r's input: distinct, deterministic, known to every rank."""
    a = np.random.default_rng(100 + r).standard_normal(shape) + 2.0
    return a.astype(dtype)


def check(got, want, what, rtol=0.0):
    global checks
    got = got.numpy() if isinstance(got, tapegrad.Tensor) else got
    np.testing.assert_allclose(got, want, rtol=rtol, atol=0, err_msg=f"{what} on rank {rank}")
    checks += 1


everyone = np.stack([data(r) for r in range(size)])
reductions = {ReduceOp.SUM: everyone.sum(0), ReduceOp.AVG: everyone.sum(0) / size,
              ReduceOp.MAX: everyone.max(0), ReduceOp.MIN: everyone.min(0),
              ReduceOp.PRODUCT: everyone.prod(0)}
for async_op in (False, True):
    for op, want in reductions.items():
        t = tapegrad.tensor(data(rank))
        work = dist.all_reduce(t, op=op, async_op=async_op)
        if async_op:
            assert work.wait() is True and work.is_completed()
        else:
            assert work is None
        check(t, want, f"all_reduce {op}", rtol=1e-15)

    # integers, a non-contiguous view, float32
    t = tapegrad.tensor(np.arange(6, dtype=np.int64) * (rank + 1))
    w = dist.all_reduce(t, async_op=async_op)
    w and w.wait()
    check(t, np.arange(6) * sum(range(1, size + 1)), "all_reduce int64")
    base = tapegrad.tensor(data(rank, (4, 6)))
    view = base[:, ::2]
    w = dist.all_reduce(view, op=ReduceOp.MAX, async_op=async_op)
    w and w.wait()
    full = np.stack([data(r, (4, 6)) for r in range(size)])
    want = data(rank, (4, 6))
    want[:, ::2] = full.max(0)[:, ::2]
    check(base, want, "all_reduce of a strided view")
    t = tapegrad.tensor(data(rank, dtype=np.float32))
    w = dist.all_reduce(t, async_op=async_op)
    w and w.wait()
    check(t, np.stack([data(r, dtype=np.float32) for r in range(size)]).sum(0), "float32",
          rtol=1e-6)

    # broadcast from each root
    for src in range(size):
        t = tapegrad.tensor(data(rank))
        w = dist.broadcast(t, src=src, async_op=async_op)
        w and w.wait()
        check(t, data(src), f"broadcast from {src}")

    # all_gather, all_gather_into_tensor (concatenated and stacked)
    outs = [tapegrad.zeros(3, 4, dtype=tapegrad.float64) for _ in range(size)]
    w = dist.all_gather(outs, tapegrad.tensor(data(rank)), async_op=async_op)
    w and w.wait()
    for r in range(size):
        check(outs[r], data(r), "all_gather")
    cat = tapegrad.zeros(3 * size, 4, dtype=tapegrad.float64)
    w = dist.all_gather_into_tensor(cat, tapegrad.tensor(data(rank)), async_op=async_op)
    w and w.wait()
    check(cat, np.concatenate([data(r) for r in range(size)]), "all_gather_into_tensor")
    stacked = tapegrad.zeros(size, 3, 4, dtype=tapegrad.float64)
    w = dist.all_gather_into_tensor(stacked, tapegrad.tensor(data(rank)), async_op=async_op)
    w and w.wait()
    check(stacked, everyone, "all_gather_into_tensor stacked")

    # reduce_scatter_tensor: rank r keeps chunk r of the reduced input
    for op in (ReduceOp.SUM, ReduceOp.AVG, ReduceOp.MAX):
        inp = tapegrad.tensor(data(rank, (2 * size, 3)))
        out = tapegrad.zeros(2, 3, dtype=tapegrad.float64)
        w = dist.reduce_scatter_tensor(out, inp, op=op, async_op=async_op)
        w and w.wait()
        all_in = np.stack([data(r, (2 * size, 3)) for r in range(size)])
        red = {ReduceOp.SUM: all_in.sum(0), ReduceOp.AVG: all_in.sum(0) / size,
               ReduceOp.MAX: all_in.max(0)}[op]
        check(out, red[2 * rank:2 * rank + 2], f"reduce_scatter_tensor {op}", rtol=1e-15)

    # reduce to each root
    for dst in range(size):
        t = tapegrad.tensor(data(rank))
        w = dist.reduce(t, dst=dst, async_op=async_op)
        w and w.wait()
        check(t, everyone.sum(0) if rank == dst else data(rank), f"reduce to {dst}", rtol=1e-15)

    # gather and scatter through each root
    for root in range(size):
        glist = [tapegrad.zeros(3, 4, dtype=tapegrad.float64) for _ in range(size)] \
            if rank == root else None
        w = dist.gather(tapegrad.tensor(data(rank)), glist, dst=root, async_op=async_op)
        w and w.wait()
        if rank == root:
            for r in range(size):
                check(glist[r], data(r), "gather")
        slist = [tapegrad.tensor(data(10 + r)) for r in range(size)] if rank == root else None
        t = tapegrad.zeros(3, 4, dtype=tapegrad.float64)
        w = dist.scatter(t, slist, src=root, async_op=async_op)
        w and w.wait()
        check(t, data(10 + rank), "scatter")

    w = dist.barrier(async_op=async_op)
    w and w.wait()

# point to point: a ring, blocking and async
nxt, prv = (rank + 1) % size, (rank - 1) % size
t = tapegrad.zeros(3, 4, dtype=tapegrad.float64)
if rank % 2 == 0:
    dist.send(tapegrad.tensor(data(rank)), dst=nxt)
    src = dist.recv(t, src=prv)
else:
    src = dist.recv(t)
    dist.send(tapegrad.tensor(data(rank)), dst=nxt)
assert src == prv, (src, prv)
check(t, data(prv), "send/recv")
t = tapegrad.zeros(3, 4, dtype=tapegrad.float64)
works = [dist.isend(tapegrad.tensor(data(rank)), dst=nxt), dist.irecv(t, src=prv)]
for w in works:
    w.wait()
check(t, data(prv), "isend/irecv")

# overlapping async collectives complete in any wait order
ts = [tapegrad.tensor(data(rank, (50,)) * k) for k in range(1, 5)]
works = [dist.all_reduce(x, async_op=True) for x in ts]
for k, w in reversed(list(enumerate(works, 1))):
    w.wait()
    check(ts[k - 1], np.stack([data(r, (50,)) * k for r in range(size)]).sum(0), "overlap",
          rtol=1e-15)

# objects, a subgroup, errors that name the op
objs = [None] * size
dist.all_gather_object(objs, {"rank": rank, "name": "r" * (rank + 1)})
assert objs == [{"rank": r, "name": "r" * (r + 1)} for r in range(size)], objs
lst = [rank, "x"] if rank == 1 else [None, None]
dist.broadcast_object_list(lst, src=1)
assert lst == [1, "x"], lst
solo = dist.new_group([0])
assert (dist.get_world_size(solo) == 1) if rank == 0 else (dist.get_rank(solo) == -1)
t = tapegrad.tensor(data(rank))
dist.all_reduce(t, group=solo)
check(t, data(rank), "all_reduce on a group of one")
for bad, msg in ((lambda: dist.all_reduce(tapegrad.tensor([1, 2]), op=ReduceOp.AVG), "AVG"),
                 (lambda: dist.all_gather([tapegrad.zeros(2)], tapegrad.zeros(2)), "one per"),
                 (lambda: dist.broadcast(tapegrad.zeros(2), src=size), "src=")):
    try:
        bad()
    except (TypeError, ValueError) as e:
        assert msg in str(e) and str(e).split(":")[0] in ("all_reduce", "all_gather",
                                                           "broadcast"), e
    else:
        raise AssertionError(f"no error for {msg}")
dist.barrier()
dist.destroy_process_group()
assert not dist.is_initialized()
print(f"rank {rank}: {checks} checks passed")
