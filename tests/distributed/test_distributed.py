"""tapegrad.distributed on MPI: each worker script in tests/distributed runs under
``mpiexec -n 2`` (with a timeout) and checks its ranks against numpy or a one-process run;
the pieces that need no second process are checked here against PyTorch."""
import os
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

import tapegrad

pytest.importorskip("mpi4py")
from tapegrad.distributed.run import find_mpiexec  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
WORKERS = HERE  # the worker scripts beside this file


def mpirun(args, n=2, timeout=60, launcher=False):
    """Run ``args`` on ``n`` ranks; (exit status, stdout + stderr, seconds)."""
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    if launcher:
        cmd = [sys.executable, "-m", "tapegrad.distributed.run", "--nproc-per-node", str(n),
               *args]
    else:
        cmd = [find_mpiexec(), "-n", str(n), sys.executable, *args]
    start = time.monotonic()
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    return done.returncode, done.stdout + done.stderr, time.monotonic() - start


def test_collectives_against_numpy():
    rc, out, _ = mpirun([os.path.join(WORKERS, "collectives.py")])
    assert rc == 0, out
    assert "rank 0: 53 checks passed" in out and "rank 1: 53 checks passed" in out, out


def test_ddp_and_zero_match_one_process(tmp_path):
    rc, out, _ = mpirun([os.path.join(WORKERS, "ddp.py"), str(tmp_path / "state.tg")])
    assert rc == 0, out
    assert "rank 0: ddp checks passed" in out and "rank 1: ddp checks passed" in out, out
    for line in ("ddp 50 steps", "ddp no_sync x3", "ddp small buckets (5)", "zero adam",
                 "find_unused_parameters: ok", "buffers: ok"):
        assert line in out, out


@pytest.mark.parametrize("case, words", [
    ("raise", ["rank 1 failed with ValueError: boom on purpose",
               "all_reduce: rank 1 failed: ValueError: boom on purpose",
               "rank 0 stops because rank 1 failed"]),
    ("hang", ["all_reduce: timed out after 3 s on rank 0", "rank 0 failed with"]),
    ("exit", ["all_reduce: timed out after 3 s on rank 0"]),
    ("shapes", ["params[0] (weight) has shape (5, 3) and dtype tapegrad.float32 on rank 1 but "
                "shape (4, 3)", "rank 0 failed with RuntimeError",
                "rank 1 failed with RuntimeError"]),
])
def test_a_failing_rank_ends_every_rank(case, words):
    rc, out, seconds = mpirun([os.path.join(WORKERS, "faults.py"), case], timeout=40)
    assert rc != 0 and "unexpectedly finished" not in out, out
    assert seconds < 20, (seconds, out)  # the timeout in the worker is 3 s
    for w in words:
        assert w in out, (w, out)


def test_launcher_runs_the_example_and_a_failure_before_init():
    rc, out, _ = mpirun(["-m", "tapegrad.examples.ddp_digits", "--steps", "4", "--log-every",
                         "2", "--batch-size", "16"], launcher=True)
    assert rc == 0, out
    assert "step    4  loss" in out and "ranks 2  test accuracy" in out, out
    rc, out, seconds = mpirun([os.path.join(WORKERS, "faults.py"), "early"], launcher=True,
                              timeout=40)
    assert rc != 0 and seconds < 20, out
    assert "rank 1 failed with ValueError: rank 1 broke before init_process_group" in out, out


CASES = {  # mismatch.py's cases: what every rank must say
    "all_reduce shapes": "all_reduce: rank 0 has float64 (3,), rank 1 has float64 (5,); every "
                         "rank must call the same collectives in the same order, with tensors "
                         "of one shape and dtype",
    "all_reduce dtypes": "all_reduce: rank 0 has float32 (3,), rank 1 has float64 (3,);",
    "all_reduce ops": "all_reduce: rank 0 has op SUM, rank 1 has op MAX;",
    "all_reduce async": "all_reduce: rank 0 has float64 (3,), rank 1 has float64 (5,);",
    "reduce": "reduce: rank 0 has float64 (3,), rank 1 has float64 (5,);",
    "reduce roots": "reduce: rank 0 has dst=0, rank 1 has dst=1;",
    "broadcast": "broadcast: rank 0 has float64 (3,), rank 1 has float64 (5,);",
    "broadcast large": "broadcast: rank 0 has float32 (3,), rank 1 has float32 (200003,);",
    "broadcast roots": "broadcast: rank 0 has src=0, rank 1 has src=1;",
    "all_gather": "all_gather: rank 0 has float64 (3,), rank 1 has float64 (5,);",
    "all_gather_into_tensor": "all_gather_into_tensor: rank 0 has input float32 (3,) and output "
                              "float32 (6,), rank 1 has input float32 (4,) and output float32 "
                              "(8,);",
    "reduce_scatter_tensor": "reduce_scatter_tensor: rank 0 has input float32 (6,) and output "
                             "float32 (3,), rank 1 has input float32 (8,) and output float32 "
                             "(4,);",
    "gather": "gather: rank 0 has float64 (3,), rank 1 has float64 (5,);",
    "scatter": "scatter: rank 0 has float64 (3,), rank 1 has float64 (5,);",
    "different collectives": "the ranks called different collectives: rank 0 called "
                             "all_reduce(float32 (3,), op SUM), rank 1 called "
                             "broadcast(float32 (3,), src=0);",
    "barrier against all_reduce": "the ranks called different collectives: rank 0 called "
                                  "barrier(), rank 1 called all_reduce(float32 (3,), op SUM);",
    "broadcast_object_list": "broadcast_object_list: rank 0 has 2 objects, rank 1 has 3 "
                             "objects;",
}


def test_ranks_that_disagree_on_a_collective_all_raise_naming_it():
    rc, out, _ = mpirun([os.path.join(WORKERS, "mismatch.py"), "all"], timeout=300)
    assert rc == 0, out
    lines = out.splitlines()
    for rank in (0, 1):
        for case, message in CASES.items():
            said = [line for line in lines if line.startswith(f"rank {rank}: {case}: ")]
            assert len(said) == 1 and message in said[0], (rank, case, out)
        assert f"rank {rank}: all cases done" in out, out
    # point to point has no agreement: the receiver checks the size it got
    assert "rank 1: send/recv: irecv: rank 1 received 24 bytes from rank 0 into a float64 " \
           "(5,) of 40 bytes" in out, out


def test_an_uncaught_mismatch_ends_the_job():
    rc, out, seconds = mpirun([os.path.join(WORKERS, "mismatch.py"), "uncaught"], timeout=120)
    assert rc != 0 and "unexpectedly finished" not in out, out
    assert seconds < 60, (seconds, out)
    assert "rank 0 failed with tapegrad.distributed.DistError: all_reduce: rank 0 has float64 " \
           "(3,), rank 1 has float64 (5,)" in out or "rank 1 failed with tapegrad.distributed." \
           "DistError: all_reduce: rank 0 has float64 (3,), rank 1 has float64 (5,)" in out, out


def test_the_agreement_check_turns_off_on_every_rank_or_none():
    rc, out, _ = mpirun([os.path.join(WORKERS, "mismatch.py"), "off"], timeout=120)
    # unchecked, a (3, 2) against a (6,) all-reduces as six numbers on either rank
    assert "rank 0: unchecked all_reduce 12" in out and "rank 1: unchecked all_reduce 12" in out
    # and a size mismatch is left to MPI, whose failure still names the collective
    assert rc != 0 and "broadcast: MPI failed on rank" in out, out
    assert "TAPEGRAD_DISTRIBUTED_DEBUG=OFF turned off the check" in out, out
    rc, out, _ = mpirun([os.path.join(WORKERS, "mismatch.py"), "off-on-one-rank"], timeout=120)
    assert rc != 0 and "unexpectedly finished" not in out, out
    assert "init_process_group: TAPEGRAD_DISTRIBUTED_DEBUG=OFF on ranks [1] only" in out, out


def test_launcher_fails_a_job_whose_rank_ends_early():
    faults = os.path.join(WORKERS, "faults.py")
    rc, out, seconds = mpirun([faults, "osexit"], launcher=True, timeout=120)
    assert rc != 0 and "unexpectedly finished" not in out, out
    assert "tapegrad.distributed.run: rank 1 ended early: its process exited with status 0 " \
           "before its script finished" in out, out
    assert seconds < 60, (seconds, out)
    # a rank that leaves the group and ends normally is no failure, nor stops the others
    rc, out, _ = mpirun([faults, "leave"], launcher=True, timeout=120)
    assert rc == 0 and "rank 0: finished after rank 1 left" in out, out
    assert "ended early" not in out, out


@pytest.mark.parametrize("n, replicas, drop_last", [
    (10, 2, False), (11, 2, False), (11, 2, True), (3, 4, False), (7, 3, True), (1, 5, False),
    (12, 4, True), (13, 5, False)])
def test_distributed_sampler_partitions_as_torch(n, replicas, drop_last):
    from tapegrad.utils.data.distributed import DistributedSampler

    ds = list(range(n))
    for rank in range(replicas):
        ours = DistributedSampler(ds, replicas, rank, shuffle=False, drop_last=drop_last)
        theirs = torch.utils.data.distributed.DistributedSampler(
            ds, replicas, rank, shuffle=False, drop_last=drop_last)
        assert list(ours) == list(theirs) and len(ours) == len(theirs)
        assert ours.total_size == theirs.total_size


@pytest.mark.parametrize("n, replicas, drop_last", [(11, 2, False), (11, 3, True), (4, 3, False)])
def test_distributed_sampler_shuffle_partitions_the_padded_permutation(n, replicas, drop_last):
    from tapegrad.utils.data.distributed import DistributedSampler

    def shards(epoch, seed=0):
        out = []
        for rank in range(replicas):
            s = DistributedSampler(list(range(n)), replicas, rank, seed=seed,
                                   drop_last=drop_last)
            s.set_epoch(epoch)
            out.append(list(s))
        return out

    parts = shards(1)
    total = len(parts[0]) * replicas
    merged = [parts[i % replicas][i // replicas] for i in range(total)]
    perm = tapegrad.randperm(n, generator=tapegrad.Generator().manual_seed(1)).tolist()
    want = (perm * (total // n + 1))[:total] if not drop_last else perm[:total]
    assert merged == want
    assert shards(1) == parts and shards(2) != parts and shards(1, seed=3) != parts
    with pytest.raises(ValueError, match=r"Invalid rank 3, rank should be in the interval \[0, 2\]"):
        DistributedSampler([1], 3, 3)


def test_post_accumulate_grad_hook_matches_torch():
    def run(T):
        w = T.tensor([1.0, 2.0], dtype=T.float64, requires_grad=True)
        b = T.tensor([0.5], dtype=T.float64, requires_grad=True)
        log = []
        handle = w.register_post_accumulate_grad_hook(lambda p: log.append(("w", p.grad.tolist())))
        b.register_post_accumulate_grad_hook(lambda p: log.append(("b", p.grad.tolist())))
        ((w * 3).sum() + (w * w).sum() * b.sum() + (w.sin() * b).sum()).backward()  # w thrice
        (w * 2).sum().backward()
        handle.remove()
        (w * 2).sum().backward(inputs=[w])
        b.backward(T.tensor([1.0], dtype=T.float64))
        return log

    ours, theirs = run(tapegrad), run(torch)
    assert [k for k, _ in ours] == [k for k, _ in theirs]
    for (_, a), (_, b) in zip(ours, theirs):
        np.testing.assert_allclose(a, b, rtol=1e-12)
    with pytest.raises(RuntimeError, match="cannot be registered on non-leaf tensors"):
        (tapegrad.ones(1, requires_grad=True) * 2).register_post_accumulate_grad_hook(print)
    with pytest.raises(RuntimeError, match="doesn't require gradient"):
        tapegrad.ones(1).register_post_accumulate_grad_hook(print)


def test_launcher_command_line():
    from tapegrad.distributed import run

    args = run.parse_args(["--nproc-per-node", "4", "--nnodes", "2", "--hostfile", "hosts",
                           "train.py", "--lr", "0.1"])
    cmd = run.command(args)
    assert cmd[1:7] == ["-n", "8", "-f", "hosts", "-ppn", "4"]
    assert cmd[-4:] == ["--worker", "train.py", "--lr", "0.1"]
