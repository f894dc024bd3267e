"""``python -m tapegrad.distributed.run``: a ``torchrun``-like launcher on top of ``mpiexec``.

    python -m tapegrad.distributed.run --nproc-per-node 2 train.py --epochs 3
    python -m tapegrad.distributed.run --nproc-per-node 4 -m tapegrad.examples.ddp_digits
    python -m tapegrad.distributed.run --nnodes 2 --nproc-per-node 8 --hostfile hosts train.py

It starts ``nnodes * nproc_per_node`` processes with the ``mpiexec`` of the MPI library that
``mpi4py`` uses (the ``mpich`` wheel puts it beside the Python executable), each running the
script as ``__main__`` with torchrun's environment: ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``,
``LOCAL_WORLD_SIZE``, ``GROUP_RANK`` (node). The exit status is ``mpiexec``'s: non-zero when
any rank failed. Scripts also run under a plain ``mpiexec -n N python train.py``.

A rank that ends before it is done (``os._exit(0)`` mid-script, say) is a failure of the job:
MPI would stop the other ranks and still report success. So each rank runs in a child process
that its launched process watches; the child says it is done when its script returns (or
exits with status 0) or when it calls ``destroy_process_group``. A child that ends with
status 0 before saying so makes the watcher print which rank ended early and exit 1, which
fails the job. (A plain ``mpiexec`` has no watcher.)
"""
import argparse
import os
import runpy
import shutil
import signal
import subprocess
import sys
import time
import traceback


def find_mpiexec() -> str:
    """The ``mpiexec`` beside this Python (the mpich wheel's), else the one on PATH."""
    here = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    found = here if os.path.exists(here) else shutil.which("mpiexec")
    if found is None:
        raise RuntimeError("tapegrad.distributed.run: no mpiexec found beside "
                           f"{sys.executable} or on PATH; pip install 'tapegrad[distributed]' "
                           "(mpi4py and the mpich library)")
    return found


def parse_args(argv):
    p = argparse.ArgumentParser(prog="python -m tapegrad.distributed.run",
                                description="Start a training script on N ranks with mpiexec.")
    p.add_argument("--nproc-per-node", "--nproc_per_node", type=int, default=1,
                   help="processes per host (default 1)")
    p.add_argument("--nnodes", type=int, default=1, help="number of hosts (default 1)")
    p.add_argument("--hostfile", default=None,
                   help="mpiexec hostfile naming the hosts (one per line, 'host:slots')")
    p.add_argument("--mpiexec", default=None, help="the mpiexec to use")
    p.add_argument("--mpiexec-args", default="",
                   help="extra arguments for mpiexec, as one string")
    p.add_argument("-m", "--module", action="store_true",
                   help="run the script argument as a module (python -m)")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("script", help="the training script (or module with -m)")
    p.add_argument("script_args", nargs=argparse.REMAINDER)
    return p.parse_args(argv)


def _environment():
    """torchrun's variables from the ones MPICH's hydra (or Open MPI) gives each process."""
    env = os.environ
    rank = env.get("PMI_RANK", env.get("OMPI_COMM_WORLD_RANK", "0"))
    size = env.get("PMI_SIZE", env.get("OMPI_COMM_WORLD_SIZE", "1"))
    local = env.get("MPI_LOCALRANKID", env.get("OMPI_COMM_WORLD_LOCAL_RANK", "0"))
    local_size = env.get("MPI_LOCALNRANKS", env.get("OMPI_COMM_WORLD_LOCAL_SIZE", "1"))
    env.update(RANK=rank, WORLD_SIZE=size, LOCAL_RANK=local, LOCAL_WORLD_SIZE=local_size,
               GROUP_RANK=str(int(rank) // max(int(local_size), 1)),
               TAPEGRAD_DISTRIBUTED_RUN="1")
    return int(rank)


_DONE_FD = "TAPEGRAD_RUN_DONE_FD"  # "pid:fd": where the watched rank says it is done
_LEFT, _ENDED = b"d", b"e"  # destroy_process_group was called; the script ended


def mark_done(event=_LEFT) -> None:
    """Tell this rank's watcher that the rank may end without failing the job: it left the
    process group (``destroy_process_group``) or its script ended. No-op outside the
    launcher."""
    pid, _, fd = os.environ.get(_DONE_FD, "").partition(":")
    if pid == str(os.getpid()):  # not in a process the rank started: the fd is not theirs
        try:
            os.write(int(fd), event)
        except OSError:
            pass


def _watch(rank):
    """Fork: the child returns and runs the rank; this process waits for it and exits with
    its status, or 1 (naming the rank) when it ended with 0 before any ``mark_done``."""
    done_read, done_write = os.pipe()
    parent = os.getpid()
    child = os.fork()
    if child == 0:
        os.close(done_read)
        _end_with_parent(parent)
        os.environ[_DONE_FD] = f"{os.getpid()}:{done_write}"
        return
    os.close(done_write)

    def pass_on(number, frame):
        try:
            os.kill(child, number)
        except ProcessLookupError:
            pass

    # Ctrl-C reaches the child through its process group; a termination request sent to this
    # process alone is passed on
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, pass_on)
    status = os.waitstatus_to_exitcode(os.waitpid(child, 0)[1])
    os.set_blocking(done_read, False)  # processes the rank started may hold the pipe open
    try:
        said = os.read(done_read, 64)
    except BlockingIOError:
        said = b""
    if status == 0 and not said:
        sys.stderr.write(f"tapegrad.distributed.run: rank {rank} ended early: its process "
                         "exited with status 0 before its script finished (and before "
                         "destroy_process_group); the job fails\n")
        status = 1
    elif status == 0 and _ENDED not in said:
        # MPI was not finalised (os._exit after destroy_process_group): MPI stops the ranks
        # still running, which would otherwise end without a word
        sys.stderr.write(f"tapegrad.distributed.run: rank {rank} ended after "
                         "destroy_process_group but before its script finished, without "
                         "finalising MPI: MPI stops any rank still running\n")
    elif status < 0:
        sys.stderr.write(f"tapegrad.distributed.run: rank {rank} was killed by signal "
                         f"{signal.Signals(-status).name}\n")
        status = 128 - status
    sys.stderr.flush()
    os._exit(status)


def _end_with_parent(parent):
    """Have the kernel kill this process when the watcher dies (Linux), so that no rank
    outlives a job that MPI tore down."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # the watcher died before prctl
        os._exit(1)


def _worker(args):
    rank = _environment()
    if hasattr(os, "fork"):
        _watch(rank)

    # MPI starts here, so that a rank failing before init_process_group (which then installs
    # its own hook) can still abort the job: the others may be waiting in MPI's start-up
    from mpi4py import MPI

    def early_failure(exc_type, exc, tb):
        sys.stderr.write(f"[rank {rank}] ")
        traceback.print_exception(exc_type, exc, tb)
        text = "".join(traceback.format_exception_only(exc_type, exc)).strip()
        sys.stderr.write(f"tapegrad.distributed: rank {rank} failed with {text}\n"
                         "tapegrad.distributed: aborting all ranks\n")
        sys.stderr.flush()
        # let the launcher forward what was just written before the abort tears the job
        # down (on a loaded machine an immediate abort lost the report's last lines, as
        # init_process_group's own hook knows)
        time.sleep(1.0)
        MPI.COMM_WORLD.Abort(1)

    sys.excepthook = early_failure
    sys.argv = [args.script, *args.script_args]
    try:
        if args.module:
            runpy.run_module(args.script, run_name="__main__", alter_sys=True)
        else:
            sys.path.insert(0, os.path.dirname(os.path.abspath(args.script)))
            runpy.run_path(args.script, run_name="__main__")
    except SystemExit as e:
        if e.code in (None, 0):
            mark_done(_ENDED)
        raise
    mark_done(_ENDED)


def command(args) -> list:
    """The mpiexec command line for ``args``."""
    n = args.nnodes * args.nproc_per_node
    if n < 1:
        raise SystemExit("tapegrad.distributed.run: --nproc-per-node and --nnodes must be >= 1")
    cmd = [args.mpiexec or find_mpiexec(), "-n", str(n)]
    if args.hostfile:
        cmd += ["-f", args.hostfile, "-ppn", str(args.nproc_per_node)]
    cmd += args.mpiexec_args.split()
    cmd += [sys.executable, "-m", "tapegrad.distributed.run", "--worker"]
    if args.module:
        cmd.append("-m")
    return cmd + [args.script, *args.script_args]


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.worker:
        _worker(args)
        return 0
    return subprocess.call(command(args))


if __name__ == "__main__":
    sys.exit(main())
