"""Worker (run by tests/distributed/test_distributed.py under mpiexec -n 2): one failure per run,
selected by argv[1]. Every case must end the whole job, non-zero, in bounded time, naming the
failed rank."""
import datetime
import os
import sys
import time

import tapegrad
import tapegrad.distributed as dist

case = sys.argv[1]
if case == "early" and os.environ.get("RANK") == "1":
    raise ValueError("rank 1 broke before init_process_group")
# the cases that must end by the failure notice get a timeout no loaded machine reaches; the
# cases that must end by the timeout get 3 s
patience = 3 if case in ("hang", "exit") else 60
dist.init_process_group(backend="mpi", timeout=datetime.timedelta(seconds=patience))
rank = dist.get_rank()
t = tapegrad.ones(4)
dist.all_reduce(t)
if case == "raise":
    if rank == 1:
        raise ValueError("boom on purpose")
    for _ in range(5):
        dist.all_reduce(t)  # rank 0 waits here until rank 1's failure notice arrives
elif case == "hang":
    if rank == 1:
        time.sleep(60)  # never joins: rank 0 times out
    dist.all_reduce(t)
elif case == "exit":
    if rank == 1:
        sys.exit(3)  # a clean exit of one rank: rank 0 times out
    dist.all_reduce(t)
elif case == "osexit":
    if rank == 1:
        os._exit(0)  # ends without a word: MPI stops rank 0, the launcher must fail the job
    dist.all_reduce(t)
elif case == "leave":
    dist.destroy_process_group()
    if rank == 0:
        time.sleep(2)  # rank 1 ends normally meanwhile, which must not stop this rank
        print("rank 0: finished after rank 1 left", flush=True)
    sys.exit(0)
elif case == "shapes":
    dist.barrier()
    model = tapegrad.nn.Linear(3, 4 + rank)
    tapegrad.nn.parallel.DistributedDataParallel(model)
print(f"rank {rank}: unexpectedly finished")
