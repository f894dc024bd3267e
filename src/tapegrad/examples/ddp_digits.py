"""The digits CNN trained data-parallel: DistributedDataParallel, DistributedSampler, MPI.

    python -m tapegrad.distributed.run --nproc-per-node 2 -m tapegrad.examples.ddp_digits
    python -m tapegrad.distributed.run --nproc-per-node 2 -m tapegrad.examples.ddp_digits \\
        --steps 300 --batch-size 32 --out runs/ddp_digits

Each rank reads its own share of every epoch (DistributedSampler) with ``--batch-size`` samples
per step, so the global batch is ``world_size * batch_size``; DDP averages the gradients during
backward. Rank 0 prints the loss averaged over the ranks, the test accuracy, the throughput and
what DDP communicated, and saves the weights (``--out``). Run with one process it is plain
training (the same script, ``--nproc-per-node 1``).
"""
import argparse
import os
import time

import tapegrad
import tapegrad.distributed as dist
from tapegrad.examples import digits_cnn
from tapegrad.nn.parallel import DistributedDataParallel
from tapegrad.utils.data import DataLoader, TensorDataset
from tapegrad.utils.data.distributed import DistributedSampler


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--batch-size", type=int, default=32, help="samples per rank and step")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--log-every", type=int, default=50)
    p.add_argument("--bucket-cap-mb", type=float, default=None, help="DDP bucket size (MiB)")
    p.add_argument("--out", default=None, help="folder for weights.tg (written by rank 0)")
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    dist.init_process_group(backend="mpi")
    rank, size = dist.get_rank(), dist.get_world_size()
    (x, y), (x_test, y_test) = digits_cnn.load_data(args.seed)
    tapegrad.manual_seed(args.seed + rank)  # rank-dependent on purpose: DDP syncs rank 0's
    model = DistributedDataParallel(digits_cnn.build(tapegrad), bucket_cap_mb=args.bucket_cap_mb)
    opt = tapegrad.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    data = TensorDataset(tapegrad.tensor(x), tapegrad.tensor(y))
    sampler = DistributedSampler(data, shuffle=True, seed=args.seed)
    loader = DataLoader(data, batch_size=args.batch_size, sampler=sampler, drop_last=True)
    step, epoch, logged = 0, 0, tapegrad.zeros(1, dtype=tapegrad.float64)
    dist.barrier()
    start = time.perf_counter()
    while step < args.steps:
        sampler.set_epoch(epoch)
        for xb, yb in loader:
            opt.zero_grad()
            loss = tapegrad.nn.functional.cross_entropy(model(xb), yb)
            loss.backward()
            opt.step()
            step += 1
            if step % args.log_every == 0 or step == args.steps:
                logged.fill_(loss.item())
                dist.all_reduce(logged, op=dist.ReduceOp.AVG)
                if rank == 0:
                    print(f"step {step:4d}  loss {logged.item():.4f}", flush=True)
            if step == args.steps:
                break
        epoch += 1
    seconds = time.perf_counter() - start
    with tapegrad.no_grad():
        pred = model.module(tapegrad.tensor(x_test)).argmax(1).numpy()
    stats = model.comm_stats
    if rank == 0:
        params = sum(p.numel() for p in model.parameters())
        print(f"ranks {size}  test accuracy {(pred == y_test).mean():.3f}")
        print(f"throughput {args.steps * args.batch_size * size / seconds:.0f} samples/s "
              f"({seconds / args.steps * 1e3:.1f} ms/step)")
        steps = max(stats["steps"], 1)
        print(f"all-reduced {stats['bytes'] / steps:.0f} bytes/step for {params} float64 "
              f"parameters, in {stats['allreduce_calls'] // steps} bucket(s); waiting after "
              f"backward {stats['exposed_wait_s'] / steps * 1e3:.2f} ms/step")
        if args.out:
            os.makedirs(args.out, exist_ok=True)
            tapegrad.save(model.module.state_dict(), os.path.join(args.out, "weights.tg"))
    dist.barrier()  # saved by rank 0 before any rank goes on (e.g. to load it)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
