"""``tapegrad.distributed`` as ``torch.distributed``, on MPI (mpi4py and an MPI library).

    # python -m tapegrad.distributed.run --nproc-per-node 2 train.py   (or mpiexec -n 2 ...)
    import tapegrad.distributed as dist
    dist.init_process_group(backend="mpi")
    t = tapegrad.ones(3) * dist.get_rank()
    dist.all_reduce(t)                       # every rank: 0 + 1 + ...

``is_available()`` is True when ``mpi4py`` is installed (``pip install 'tapegrad[distributed]'``
brings it and the ``mpich`` library). Importing tapegrad never initialises MPI; the first
``init_process_group`` does. See ``distributed_c10d`` for timeouts and failure handling.
"""
from tapegrad.distributed.distributed_c10d import (  # noqa: F401
    Backend, DistBackendError, DistError, GroupMember, ProcessGroup, RankFailedError, ReduceOp,
    Work, all_gather, all_gather_into_tensor, all_gather_object, all_reduce, barrier, broadcast,
    broadcast_object_list, default_pg_timeout, destroy_process_group, gather, get_backend,
    get_global_rank, get_group_rank, get_process_group_ranks, get_rank, get_world_size, group,
    init_process_group, irecv, is_available, is_gloo_available, is_initialized,
    is_mpi_available, is_nccl_available, is_torchelastic_launched, isend, new_group, recv,
    reduce, reduce_scatter_tensor, scatter, send)

__all__ = [
    "Backend", "DistBackendError", "DistError", "GroupMember", "ProcessGroup", "ReduceOp",
    "Work", "all_gather", "all_gather_into_tensor", "all_gather_object", "all_reduce", "barrier",
    "broadcast", "broadcast_object_list", "destroy_process_group", "gather", "get_backend",
    "get_global_rank", "get_group_rank", "get_process_group_ranks", "get_rank",
    "get_world_size", "group", "init_process_group", "irecv", "is_available",
    "is_initialized", "is_mpi_available", "isend", "new_group", "recv", "reduce",
    "reduce_scatter_tensor", "scatter", "send"]
