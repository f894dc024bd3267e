"""Worker (run by tests/distributed/test_distributed.py under mpiexec -n 2): DistributedDataParallel
and ZeroRedundancyOptimizer against one process training on the ranks' batches together.

Every rank also trains the single-process reference (batch 2b = the ranks' batches of b,
concatenated in rank order), so each rank checks its own replica after every step.
"""
import datetime
import os
import sys

import numpy as np

import tapegrad
import tapegrad.distributed as dist
import tapegrad.nn as nn
import tapegrad.nn.functional as F
from tapegrad.distributed.optim import ZeroRedundancyOptimizer
from tapegrad.nn.parallel import DistributedDataParallel as DDP
from tapegrad.utils.data import TensorDataset
from tapegrad.utils.data.distributed import DistributedSampler

dist.init_process_group(backend="mpi", timeout=datetime.timedelta(seconds=30))
rank, size = dist.get_rank(), dist.get_world_size()
B, STEPS, RTOL = 4, 50, 1e-12
results = []


def net(seed):
    tapegrad.manual_seed(seed)
    return nn.Sequential(nn.Linear(5, 16), nn.Tanh(), nn.Linear(16, 16), nn.GELU(),
                         nn.Linear(16, 3)).double()


def batch(step, r, micro=0):
    g = np.random.default_rng(1000 * step + 10 * r + micro)
    return g.standard_normal((B, 5)), g.integers(0, 3, B)


def both(step, micro=0):
    xs, ys = zip(*(batch(step, r, micro) for r in range(size)))
    return np.concatenate(xs), np.concatenate(ys)


def close(model, ref, what):
    worst = 0.0
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        a, b = p.detach().numpy(), q.detach().numpy()
        err = np.max(np.abs(a - b) / (np.abs(b) + 1e-300 + np.abs(b).max()))
        worst = max(worst, err)
        assert err <= RTOL, f"{what}: {name} differs by {err:.3g} on rank {rank}"
    return worst


def loss_of(model, x, y):
    return F.cross_entropy(model(tapegrad.tensor(x)), tapegrad.tensor(y))


def train(accumulate, optim="sgd", bucket_cap_mb=None):
    ref = net(0)
    model = net(0 if rank == 0 else 7)  # rank 1 starts elsewhere: DDP broadcasts rank 0's
    ddp = DDP(model, bucket_cap_mb=bucket_cap_mb)
    close(model, ref, "after construction")
    if optim == "sgd":
        opt = tapegrad.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
        ref_opt = tapegrad.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    else:
        opt = ZeroRedundancyOptimizer(ddp.parameters(), optimizer_class=tapegrad.optim.Adam,
                                      lr=0.01)
        ref_opt = tapegrad.optim.Adam(ref.parameters(), lr=0.01)
    worst = 0.0
    for step in range(STEPS):
        opt.zero_grad()
        ref_opt.zero_grad()
        for micro in range(accumulate):
            x, y = batch(step, rank, micro)
            if micro < accumulate - 1:
                with ddp.no_sync():
                    loss_of(ddp, x, y).backward()
            else:
                loss_of(ddp, x, y).backward()
            loss_of(ref, *both(step, micro)).backward()
        opt.step()
        ref_opt.step()
        worst = max(worst, close(model, ref, f"step {step} (accumulate={accumulate}, {optim})"))
    return ddp, opt, ref_opt, worst


_, _, _, worst = train(1)
results.append(f"ddp 50 steps: worst relative difference {worst:.2e}")
ddp, _, _, worst = train(3)
results.append(f"ddp no_sync x3: {worst:.2e}")
assert ddp.comm_stats["steps"] == STEPS, ddp.comm_stats  # one reduction per step, not per micro
ddp, _, _, worst = train(1, bucket_cap_mb=0.0001)  # 105 bytes: a bucket per parameter
assert len(ddp._buckets) == 5, len(ddp._buckets)  # b3 (24 B) shares with W3
results.append(f"ddp small buckets ({len(ddp._buckets)}): {worst:.2e}")

# ZeRO: sharded Adam equals plain Adam; the consolidated state equals the plain one
ddp, zero, ref_opt, worst = train(1, optim="zero")
results.append(f"zero adam: {worst:.2e}")
mine = sum(len(g["params"]) for g in zero.optim.param_groups)
counts = [None] * size
dist.all_gather_object(counts, mine)
assert sum(counts) == len(list(ddp.parameters())) and all(counts), counts
zero.consolidate_state_dict(to=0)
if rank == 0:
    full, want = zero.state_dict(), ref_opt.state_dict()
    assert sorted(full["state"]) == sorted(want["state"]), (full["state"].keys(),)
    for k, st in want["state"].items():
        for name, v in st.items():
            np.testing.assert_allclose(np.asarray(full["state"][k][name]), np.asarray(v),
                                       rtol=1e-12, atol=0, err_msg=f"state {k}.{name}")
    payload = [full]
else:
    try:
        zero.state_dict()
    except RuntimeError as e:
        assert "consolidate_state_dict(to=1)" in str(e)
    payload = [None]
dist.broadcast_object_list(payload, src=0)
fresh = ZeroRedundancyOptimizer(ddp.parameters(), optimizer_class=tapegrad.optim.Adam, lr=0.01)
fresh.load_state_dict(payload[0])
assert len(fresh.optim.state) == mine

# find_unused_parameters: a layer used on rank 0 only, and one used nowhere


class Branchy(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(3, 2).double()
        self.only0 = nn.Linear(3, 2).double()
        self.never = nn.Linear(3, 2).double()

    def forward(self, x, use):
        y = self.a(x)
        return y + self.only0(x) if use else y


tapegrad.manual_seed(3)
model = DDP(Branchy(), find_unused_parameters=True)
x = tapegrad.tensor(np.random.default_rng(rank).standard_normal((4, 3)))
model(x, rank == 0).sum().backward()
gw = model.module.only0.weight.grad  # rank 0's gradient and rank 1's zeros, averaged
want = np.tile(np.random.default_rng(0).standard_normal((4, 3)).sum(0), (2, 1)) / size
np.testing.assert_allclose(gw.numpy(), want, rtol=1e-12)
assert model.module.never.weight.grad is None and model.module.never.bias.grad is None
all_a = sum(np.random.default_rng(r).standard_normal((4, 3)).sum(0) for r in range(size)) / size
np.testing.assert_allclose(model.module.a.weight.grad.numpy(), np.tile(all_a, (2, 1)), rtol=1e-12)
model(x, rank == 0).sum().backward()  # a second iteration works as well
results.append("find_unused_parameters: ok")

# without find_unused_parameters, an unused parameter is an error at the next forward
tapegrad.manual_seed(3)
model = DDP(Branchy())
model(x, True).sum().backward()
try:
    model(x, True)
except RuntimeError as e:
    assert "Expected to have finished reduction" in str(e) and "never.weight" in str(e), e
else:
    raise AssertionError("no error for an unused parameter")

# buffers: rank 0's broadcast at construction and before every forward that syncs


class Normed(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 4).double()
        self.bn = nn.BatchNorm1d(4).double()

    def forward(self, x):
        return self.bn(self.lin(x))


tapegrad.manual_seed(4)
m = Normed()
if rank == 1:
    m.bn.running_mean.fill_(5.0)
model = DDP(m)
prev0 = np.zeros(4)  # rank 0's running_mean, broadcast at construction (rank 1 had 5.0)
for step in range(3):
    xb = tapegrad.tensor(np.random.default_rng(50 + 10 * step + rank).standard_normal((6, 3)))
    model(xb).sum().backward()
    with tapegrad.no_grad():
        h = m.lin(xb).numpy()
    # synced before this forward: every rank started from rank 0's value after the last one
    np.testing.assert_allclose(m.bn.running_mean.numpy(), 0.9 * prev0 + 0.1 * h.mean(0),
                               rtol=1e-12)
    got = [None] * size
    dist.all_gather_object(got, m.bn.running_mean.numpy().copy())
    assert not np.array_equal(got[0], got[1])  # rank-local statistics until the next forward
    prev0 = got[0]
results.append("buffers: ok")

# DistributedSampler with the process group's rank and size: the ranks partition the permutation
ds = TensorDataset(tapegrad.arange(11))
sampler = DistributedSampler(ds, shuffle=True, seed=5)
sampler.set_epoch(2)
mine = list(sampler)
every = [None] * size
dist.all_gather_object(every, mine)
assert len(mine) == 6 and sorted(sum(every, [])).count(mine[0]) >= 1
merged = [every[i % size][i // size] for i in range(6 * size)]
assert sorted(set(merged)) == list(range(11)) and len(merged) == 12, merged
assert merged[11] == merged[0]  # padded with the permutation's head

# saving from rank 0, loading on every rank
path = sys.argv[1]
if rank == 0:
    tapegrad.save(model.state_dict(), path)
dist.barrier()
loaded = tapegrad.load(path)
assert list(loaded) == list(model.state_dict()) and all(k.startswith("module.") for k in loaded)

dist.barrier()
dist.destroy_process_group()
if rank == 0:
    print("\n".join(results))
print(f"rank {rank}: ddp checks passed")
