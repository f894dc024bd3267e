"""Process groups and collectives on MPI (``torch.distributed.distributed_c10d``).

Every collective is a non-blocking MPI call (``Iallreduce``, ``Ibcast`` ...) wrapped in a
:class:`Work` handle; ``async_op=False`` is the same call followed by ``wait()``. Waiting
polls the request, so it can also watch two things no blocking MPI call can:

- the group's timeout (``init_process_group(timeout=...)``): past it, ``wait`` raises
  :class:`DistBackendError` naming the op, the rank and the group size;
- a failure notice: when a rank dies of an uncaught exception, the hook installed by
  ``init_process_group`` tells every other rank (on a communicator of its own) and then aborts
  the MPI job, so a rank waiting in a collective raises an error naming the failed rank and
  its exception, and a rank busy computing is ended by the abort. No rank hangs.

MPI is initialised on the first ``init_process_group`` (importing ``mpi4py.MPI`` does it), not
on ``import tapegrad``. Tensors are written in place (their version counter moves, as any
in-place write); non-contiguous tensors and dtypes MPI has no reduction for (float16,
bfloat16, bool) go through a contiguous staging buffer.
"""
import datetime
import importlib.util
import os
import pickle
import sys
import time
import traceback

from tapegrad.backend import xp
from tapegrad.tensor import Tensor

_MPI = None  # the mpi4py.MPI module, imported on init (importing it initialises MPI)
_FAILURE_TAG = 7001
_REPORTED_TAG = 7002  # "I printed why I stop": the failed rank waits for these before aborting
default_pg_timeout = datetime.timedelta(minutes=30)


def is_available() -> bool:
    """As ``torch.distributed.is_available()``: True when ``mpi4py`` can be imported."""
    return importlib.util.find_spec("mpi4py") is not None


def is_mpi_available() -> bool:
    return is_available()


def is_gloo_available() -> bool:
    return False


def is_nccl_available() -> bool:
    return False


def is_torchelastic_launched() -> bool:
    """True inside a process started by ``python -m tapegrad.distributed.run``."""
    return os.environ.get("TAPEGRAD_DISTRIBUTED_RUN") == "1"


class DistError(RuntimeError):
    """As ``torch.distributed.DistError``."""


class DistBackendError(DistError):
    """As ``torch.distributed.DistBackendError``: the backend failed (a timeout, a peer gone)."""


class RankFailedError(DistBackendError):
    """Another rank died of an exception while this one waited on a collective."""

    def __init__(self, message, failed_rank):
        super().__init__(message)
        self.failed_rank = failed_rank


for _cls in (DistError, DistBackendError, RankFailedError):
    _cls.__module__ = "tapegrad.distributed"


class RedOpType:
    """One reduction (``ReduceOp.SUM`` ...); compares equal to its name's ``ReduceOp`` member."""

    __slots__ = ("name", "value")

    def __init__(self, name, value):
        self.name, self.value = name, value

    def __repr__(self):
        return f"<RedOpType.{self.name}: {self.value}>"

    def __eq__(self, other):
        return isinstance(other, RedOpType) and other.value == self.value

    def __hash__(self):
        return hash(self.value)


class ReduceOp:
    """As ``torch.distributed.ReduceOp``: ``SUM``, ``AVG``, ``PRODUCT``, ``MIN``, ``MAX``,
    ``BAND``, ``BOR``, ``BXOR``."""

    SUM = RedOpType("SUM", 0)
    AVG = RedOpType("AVG", 1)
    PRODUCT = RedOpType("PRODUCT", 2)
    MIN = RedOpType("MIN", 3)
    MAX = RedOpType("MAX", 4)
    BAND = RedOpType("BAND", 5)
    BOR = RedOpType("BOR", 6)
    BXOR = RedOpType("BXOR", 7)
    RedOpType = RedOpType


class Backend(str):
    """As ``torch.distributed.Backend``: the backend's name; tapegrad has ``"mpi"``."""

    UNDEFINED = "undefined"
    MPI = "mpi"
    GLOO = "gloo"
    NCCL = "nccl"

    def __new__(cls, name):
        return str.__new__(cls, name.lower())


class ProcessGroup:
    """A set of ranks and the MPI communicator they talk on (``torch.distributed.ProcessGroup``).

    ``ranks`` are global ranks, in group-rank order.
    """

    def __init__(self, comm, ranks, timeout, name):
        self.comm = comm
        self.ranks = list(ranks)
        self.timeout = timeout
        self.group_name = name

    def rank(self) -> int:
        return self.comm.Get_rank()

    def size(self) -> int:
        return self.comm.Get_size()

    def name(self) -> str:
        return "mpi"

    def __repr__(self):
        return f"ProcessGroup(mpi, ranks={self.ranks})"


class GroupMember:
    """As ``torch.distributed.GroupMember``: ``WORLD`` (None: the default group) and the marker
    returned by ``new_group`` on ranks outside the new group."""

    WORLD = None
    NON_GROUP_MEMBER = object()


class group:
    """As ``torch.distributed.group``: ``group.WORLD`` is the default process group."""

    WORLD = None


class _State:
    world = None        # the default ProcessGroup
    failure_comm = None  # where a dying rank tells the others
    excepthook = None   # the hook we replaced
    groups = []


_state = _State()


def _mpi():
    global _MPI
    if _MPI is None:
        if not is_available():
            raise RuntimeError("init_process_group: tapegrad's distributed backend needs mpi4py "
                               "and an MPI library: pip install 'tapegrad[distributed]'")
        from mpi4py import MPI

        _MPI = MPI
    return _MPI


def _seconds(timeout):
    if timeout is None:
        return None
    if isinstance(timeout, datetime.timedelta):
        return timeout.total_seconds()
    return float(timeout)


def init_process_group(backend=None, init_method=None, timeout=None, world_size=-1, rank=-1,
                       store=None, group_name="", pg_options=None, device_id=None) -> None:
    """As ``torch.distributed.init_process_group``, on MPI: the ranks are the processes that
    ``mpiexec`` (or ``python -m tapegrad.distributed.run``) started.

    >>> dist.init_process_group(backend="mpi", timeout=datetime.timedelta(seconds=60))

    ``backend`` may be ``"mpi"``, None, or ``"gloo"`` (PyTorch's CPU backend, served by MPI
    here); ``world_size`` and ``rank`` may be given, and must then match MPI's.
    """
    if _state.world is not None:
        raise ValueError("trying to initialize the default process group twice!")
    name = str(backend or "mpi").lower()
    if name.startswith("cpu:"):
        name = name[4:]
    if name not in ("mpi", "gloo"):
        raise RuntimeError(f"init_process_group: backend {backend!r} is not available in "
                           "tapegrad; its distributed backend is 'mpi' ('gloo' is accepted as "
                           "an alias for CPU scripts)")
    MPI = _mpi()
    world = MPI.COMM_WORLD
    for what, given, actual in (("world_size", world_size, world.Get_size()),
                                ("rank", rank, world.Get_rank())):
        if given is not None and given != -1 and int(given) != actual:
            raise ValueError(f"init_process_group: {what}={given} was given, but MPI started "
                             f"this process with {what} {actual} (mpiexec -n sets both)")
    seconds = _seconds(timeout) or _seconds(os.environ.get("TAPEGRAD_DIST_TIMEOUT")) or \
        default_pg_timeout.total_seconds()
    _state.failure_comm = world.Dup()
    _state.world = ProcessGroup(world.Dup(), range(world.Get_size()), seconds,
                                group_name or "0")
    _state.excepthook = sys.excepthook
    sys.excepthook = _excepthook


def is_initialized() -> bool:
    """As ``torch.distributed.is_initialized()``."""
    return _state.world is not None


def destroy_process_group(group=None) -> None:
    """As ``torch.distributed.destroy_process_group``: without ``group``, end the default group
    and every group made from it (MPI itself is finalised when the process exits)."""
    if group is not None and group is not GroupMember.NON_GROUP_MEMBER and \
            group is not _state.world:
        if group in _state.groups:
            _state.groups.remove(group)
            group.comm.Free()
        return
    pg = _world("destroy_process_group")
    for g in _state.groups:
        g.comm.Free()
    pg.comm.Free()
    _state.failure_comm.Free()
    _state.groups = []
    _state.world = _state.failure_comm = None
    if sys.excepthook is _excepthook:
        sys.excepthook = _state.excepthook or sys.__excepthook__


def _world(what):
    if _state.world is None:
        raise ValueError("Default process group has not been initialized, please make sure to "
                         f"call init_process_group. ({what})")
    return _state.world


def _group(group, what):
    """The ProcessGroup for ``group=`` (None: the default one); None off the group."""
    world = _world(what)
    if group is None:
        return world
    if group is GroupMember.NON_GROUP_MEMBER:
        return None
    if not isinstance(group, ProcessGroup):
        raise TypeError(f"{what}: group must be a ProcessGroup from new_group (or None), got "
                        f"{type(group).__name__}")
    return group


def get_rank(group=None) -> int:
    """As ``torch.distributed.get_rank(group=None)``: this process's rank (-1 off the group)."""
    pg = _group(group, "get_rank")
    return -1 if pg is None else pg.rank()


def get_world_size(group=None) -> int:
    """As ``torch.distributed.get_world_size(group=None)`` (-1 off the group)."""
    pg = _group(group, "get_world_size")
    return -1 if pg is None else pg.size()


def get_backend(group=None) -> str:
    _group(group, "get_backend")
    return Backend.MPI


def get_global_rank(group, group_rank: int) -> int:
    """As ``torch.distributed.get_global_rank``: the global rank of ``group_rank``."""
    pg = _group(group, "get_global_rank")
    if not 0 <= group_rank < len(pg.ranks):
        raise ValueError(f"get_global_rank: group rank {group_rank} is not part of the group "
                         f"of size {len(pg.ranks)}")
    return pg.ranks[group_rank]


def get_group_rank(group, global_rank: int) -> int:
    """As ``torch.distributed.get_group_rank``: the rank in ``group`` of ``global_rank``."""
    pg = _group(group, "get_group_rank")
    if global_rank not in pg.ranks:
        raise ValueError(f"get_group_rank: global rank {global_rank} is not part of the group "
                         f"{pg.ranks}")
    return pg.ranks.index(global_rank)


def get_process_group_ranks(group) -> list:
    return list(_group(group, "get_process_group_ranks").ranks)


def new_group(ranks=None, timeout=None, backend=None, pg_options=None, use_local_synchronization=False,
              group_desc=None, device_id=None):
    """As ``torch.distributed.new_group(ranks)``: every rank calls it; ranks outside ``ranks``
    get ``GroupMember.NON_GROUP_MEMBER``."""
    world = _world("new_group")
    members = sorted(set(range(world.size()) if ranks is None else ranks))
    for r in members:
        if not 0 <= r < world.size():
            raise ValueError(f"new_group: rank {r} is not in the world of size {world.size()}")
    MPI = _mpi()
    me = world.rank()
    comm = world.comm.Split(0 if me in members else MPI.UNDEFINED, me)
    if comm == MPI.COMM_NULL:
        return GroupMember.NON_GROUP_MEMBER
    pg = ProcessGroup(comm, members, _seconds(timeout) or world.timeout,
                      str(len(_state.groups) + 1))
    _state.groups.append(pg)
    return pg


# --- waiting: timeouts and failure notices ---------------------------------------------------
def _check_failure(what):
    MPI = _MPI
    comm = _state.failure_comm
    if comm is None:
        return
    status = MPI.Status()
    if comm.Iprobe(MPI.ANY_SOURCE, _FAILURE_TAG, status):
        buf = bytearray(status.Get_count(MPI.BYTE))
        comm.Recv([buf, MPI.BYTE], status.Get_source(), _FAILURE_TAG)
        src = status.Get_source()
        raise RankFailedError(f"{what}: rank {src} failed: {buf.decode(errors='replace')}", src)


def _wait_requests(requests, what, pg, statuses=None):
    """Complete ``requests``, polling; raise on a failed peer or past the group's timeout."""
    MPI = _MPI
    if MPI.Request.Testall(requests, statuses):
        return
    deadline = time.monotonic() + pg.timeout
    polls = 0
    while not MPI.Request.Testall(requests, statuses):
        polls += 1
        if polls < 64:
            continue
        _check_failure(what)
        if time.monotonic() > deadline:
            raise DistBackendError(
                f"{what}: timed out after {pg.timeout:g} s on rank {get_rank()} (group of "
                f"{pg.size()} ranks {pg.ranks}): another rank did not join the collective")
        time.sleep(min(1e-3, 2e-6 * polls))


def _excepthook(exc_type, exc, tb):
    """Installed by init_process_group: report, tell the other ranks, abort the MPI job."""
    hook = _state.excepthook or sys.__excepthook__
    comm = _state.failure_comm
    if comm is None or _MPI is None:
        return hook(exc_type, exc, tb)
    me = comm.Get_rank()
    sys.stderr.write(f"[rank {me}] ")
    sys.stderr.flush()
    hook(exc_type, exc, tb)
    if isinstance(exc, RankFailedError):
        sys.stderr.write(f"tapegrad.distributed: rank {me} stops because rank "
                         f"{exc.failed_rank} failed\n")
        sys.stderr.flush()
        comm.Isend([b"", _MPI.BYTE], exc.failed_rank, _REPORTED_TAG)
        # the failed rank ends the job once every rank has reported: an abort from here could
        # kill the launcher's forwarding of what this rank just wrote; abort ourselves only if
        # that does not come (bounded)
        time.sleep(10.0)
    else:
        text = "".join(traceback.format_exception_only(exc_type, exc)).strip()
        text = text if len(text) <= 300 else text[:300] + " ..."
        sys.stderr.write(f"tapegrad.distributed: rank {me} failed with {text}\n"
                         f"tapegrad.distributed: aborting all {comm.Get_size()} ranks\n")
        message = text.encode()
        requests = [comm.Isend([message, _MPI.BYTE], r, _FAILURE_TAG)
                    for r in range(comm.Get_size()) if r != me]
        # Wait (bounded) until every rank waiting on a collective has printed why it stops:
        # aborting at once would kill them mid-report on a loaded machine.
        deadline = time.monotonic() + 5.0
        while requests and not _MPI.Request.Testall(requests) and time.monotonic() < deadline:
            time.sleep(1e-3)
        waiting = comm.Get_size() - 1
        while waiting and time.monotonic() < deadline:
            if comm.Iprobe(_MPI.ANY_SOURCE, _REPORTED_TAG):
                comm.Recv([bytearray(0), _MPI.BYTE], _MPI.ANY_SOURCE, _REPORTED_TAG)
                waiting -= 1
            else:
                time.sleep(1e-3)
        time.sleep(0.5)  # the launcher forwards what the reporting ranks wrote before the abort
    sys.stderr.flush()
    sys.stdout.flush()
    _MPI.COMM_WORLD.Abort(1)


# --- buffers ---------------------------------------------------------------------------------
_REDUCIBLE = frozenset("bBhHiIlLqQfdgFDG")  # dtype chars MPI reduces natively


def _check_tensor(t, what, name="tensor"):
    if not isinstance(t, Tensor):
        raise TypeError(f"{what}: {name} must be a tapegrad Tensor, got {type(t).__name__}")
    return t


def _staging(t, reduce_op=None):
    """(buffer MPI reads/writes, write-back or None). Reductions need a type MPI can reduce:
    float16/bfloat16 are reduced in float32, bool in uint8; data movement sends bytes."""
    a = t._data
    if reduce_op is None:
        if a.flags.c_contiguous:
            return a.reshape(-1).view(xp.uint8), None
        buf = xp.ascontiguousarray(a)
        return buf.reshape(-1).view(xp.uint8), buf
    if a.dtype.char in _REDUCIBLE and a.flags.c_contiguous:
        return a.reshape(-1), None
    if a.dtype.char in _REDUCIBLE:
        buf = xp.ascontiguousarray(a).reshape(-1)
    elif a.dtype == xp.bool_:
        buf = a.astype(xp.uint8).reshape(-1)
    elif a.dtype.itemsize == 2:  # float16, bfloat16 (ml_dtypes)
        buf = a.astype(xp.float32).reshape(-1)
    else:
        raise TypeError(f"all_reduce: MPI cannot reduce tensors of dtype {t.dtype}")
    return buf, buf


def _write_back(t, buf):
    if buf is not None:
        t._data[...] = buf.reshape(t._data.shape).astype(t._data.dtype, copy=False)
    t._version[0] += 1


def _finish_reduction(t, buf, back, op, pg):
    """After a reduction into ``buf`` (``t``'s staging): the mean for ``AVG``, then ``t``."""
    if op == ReduceOp.AVG:
        buf[...] /= pg.size()
    _write_back(t, back)


def _mpi_op(op, t, what):
    MPI = _MPI
    if not isinstance(op, RedOpType):
        raise TypeError(f"{what}: op must be a ReduceOp member, got {op!r}")
    boolean = t._data.dtype == xp.bool_
    if op == ReduceOp.AVG and t._data.dtype.kind not in "fc":
        raise TypeError(f"{what}: ReduceOp.AVG needs a floating-point tensor, got {t.dtype}")
    if boolean:  # PyTorch: SUM and MAX are a logical or, PRODUCT and MIN a logical and
        return MPI.MAX if op in (ReduceOp.SUM, ReduceOp.MAX, ReduceOp.BOR) else \
            MPI.MIN if op in (ReduceOp.PRODUCT, ReduceOp.MIN, ReduceOp.BAND) else MPI.BXOR
    if op in (ReduceOp.BAND, ReduceOp.BOR, ReduceOp.BXOR) and t._data.dtype.kind not in "iu":
        raise TypeError(f"{what}: {op.name} needs an integer or bool tensor, got {t.dtype}")
    return {0: MPI.SUM, 1: MPI.SUM, 2: MPI.PROD, 3: MPI.MIN, 4: MPI.MAX, 5: MPI.BAND,
            6: MPI.BOR, 7: MPI.BXOR}[op.value]


class Work:
    """As ``torch.distributed.Work``: the handle ``async_op=True`` returns. ``wait()`` completes
    the MPI requests (within the group's timeout) and finishes the result in the tensors."""

    def __init__(self, requests, finish, what, pg, outputs=()):
        self._requests = requests
        self._finish = finish
        self._what = what
        self._pg = pg
        self._outputs = list(outputs)
        self._done = False
        self._source = None
        self._statuses = None

    def _complete(self):
        if not self._done:
            self._done = True
            if self._finish is not None:
                self._finish()

    def wait(self, timeout=None) -> bool:
        if not self._done:
            pg = self._pg
            if timeout is not None:
                pg = ProcessGroup(pg.comm, pg.ranks, _seconds(timeout), pg.group_name)
            _wait_requests(self._requests, self._what, pg, self._statuses)
            self._complete()
        return True

    def is_completed(self) -> bool:
        """True once the operation finished (the result is then in the tensors)."""
        if not self._done and _MPI.Request.Testall(self._requests, self._statuses):
            self._complete()
        return self._done

    def is_success(self) -> bool:
        return self.is_completed()

    def result(self) -> list:
        self.wait()
        return self._outputs

    def _source_rank(self) -> int:
        self.wait()
        return self._source

    def __repr__(self):
        return f"<Work {self._what} {'completed' if self._done else 'pending'}>"


def _issue(requests, finish, what, pg, async_op, outputs=()):
    work = Work(requests, finish, what, pg, outputs)
    if async_op:
        return work
    work.wait()
    return None


def _root(pg, rank, what, name):
    """A global rank ``rank`` as a rank of ``pg``."""
    if rank not in pg.ranks:
        raise ValueError(f"{what}: {name}={rank} is not a rank of the group {pg.ranks}")
    return pg.ranks.index(rank)


def _root_or_group_rank(pg, rank, group_rank, what, name):
    """The root as a rank of ``pg``: ``group_rank`` when given, else the global ``rank``
    (None: 0)."""
    if group_rank is not None:
        return group_rank
    return _root(pg, 0 if rank is None else rank, what, name)


def _same(what, t, ref, name):
    if tuple(t.shape) != tuple(ref.shape) or t.dtype != ref.dtype:
        raise ValueError(f"{what}: {name} has shape {tuple(t.shape)} and dtype {t.dtype}, "
                         f"expected shape {tuple(ref.shape)} and dtype {ref.dtype} as the input")


def _check_root_list(what, tensors, name, side, role, ref, pg, root):
    """gather's gather_list / scatter's scatter_list: on the root, one tensor per rank like
    ``ref``; on the other ranks, none."""
    if pg.rank() == root:
        if tensors is None or len(tensors) != pg.size():
            raise ValueError(f"{what}: the {side} rank needs a {name} of {pg.size()} tensors")
        for t in tensors:
            _same(what, _check_tensor(t, what, f"each of {name}"), ref, role)
    elif tensors:
        raise ValueError(f"{what}: {name} must be given on the {side} rank only "
                         f"(rank {pg.rank()} is not {root})")


def _unpack_rows(recv, tensors, ref):
    """Row r of the gathered bytes ``recv`` (rank r's ``ref``) into ``tensors[r]``."""
    for r, t in enumerate(tensors):
        t._data[...] = recv[r].view(ref._data.dtype).reshape(t._data.shape)
        t._version[0] += 1


# --- collectives -----------------------------------------------------------------------------
def all_reduce(tensor, op=ReduceOp.SUM, group=None, async_op=False):
    """As ``torch.distributed.all_reduce``: every rank's ``tensor`` becomes the reduction of
    all of them (``op`` is ``ReduceOp.SUM``, ``AVG``, ``PRODUCT``, ``MIN``, ``MAX`` ...).

    >>> t = tapegrad.ones(3) * (dist.get_rank() + 1)
    >>> dist.all_reduce(t)          # 1 + 2 on two ranks: [3., 3., 3.]
    """
    what = "all_reduce"
    _check_tensor(tensor, what)
    pg = _group(group, what)
    if pg is None:
        return None
    mpi_op = _mpi_op(op, tensor, what)
    buf, back = _staging(tensor, op)
    request = pg.comm.Iallreduce(_MPI.IN_PLACE, buf, mpi_op)

    return _issue([request], lambda: _finish_reduction(tensor, buf, back, op, pg), what, pg,
                  async_op, [tensor])


def reduce(tensor, dst=None, op=ReduceOp.SUM, group=None, async_op=False, group_dst=None):
    """As ``torch.distributed.reduce``: the reduction lands in ``tensor`` on rank ``dst``."""
    what = "reduce"
    _check_tensor(tensor, what)
    pg = _group(group, what)
    if pg is None:
        return None
    root = _root_or_group_rank(pg, dst, group_dst, what, "dst")
    mpi_op = _mpi_op(op, tensor, what)
    buf, back = _staging(tensor, op)
    mine = pg.rank() == root
    if mine:
        request = pg.comm.Ireduce(_MPI.IN_PLACE, buf, mpi_op, root)
    else:
        request = pg.comm.Ireduce(buf, None, mpi_op, root)

    def finish():
        if mine:
            _finish_reduction(tensor, buf, back, op, pg)

    return _issue([request], finish, what, pg, async_op, [tensor])


def broadcast(tensor, src=None, group=None, async_op=False, group_src=None):
    """As ``torch.distributed.broadcast``: ``tensor`` on every rank becomes rank ``src``'s."""
    what = "broadcast"
    _check_tensor(tensor, what)
    pg = _group(group, what)
    if pg is None:
        return None
    root = _root_or_group_rank(pg, src, group_src, what, "src")
    buf, back = _staging(tensor)
    request = pg.comm.Ibcast(buf, root)
    mine = pg.rank() == root
    return _issue([request], None if mine else lambda: _write_back(tensor, back), what, pg,
                  async_op, [tensor])


def all_gather(tensor_list, tensor, group=None, async_op=False):
    """As ``torch.distributed.all_gather``: ``tensor_list[r]`` becomes rank r's ``tensor``."""
    what = "all_gather"
    _check_tensor(tensor, what)
    pg = _group(group, what)
    if pg is None:
        return None
    if len(tensor_list) != pg.size():
        raise ValueError(f"{what}: tensor_list has {len(tensor_list)} tensors, expected one per "
                         f"rank ({pg.size()})")
    for t in tensor_list:
        _same(what, _check_tensor(t, what, "each of tensor_list"), tensor, "an output")
    send, _ = _staging(tensor)
    recv = xp.empty((pg.size(), send.size), xp.uint8)
    request = pg.comm.Iallgather(send, recv)

    return _issue([request], lambda: _unpack_rows(recv, tensor_list, tensor), what, pg,
                  async_op, tensor_list)


def all_gather_into_tensor(output_tensor, input_tensor, group=None, async_op=False):
    """As ``torch.distributed.all_gather_into_tensor``: the ranks' inputs, in rank order, fill
    ``output_tensor`` (shape ``(size * n, ...)`` concatenated or ``(size, n, ...)`` stacked)."""
    what = "all_gather_into_tensor"
    _check_tensor(output_tensor, what, "output_tensor")
    _check_tensor(input_tensor, what, "input_tensor")
    pg = _group(group, what)
    if pg is None:
        return None
    if output_tensor.dtype != input_tensor.dtype or \
            output_tensor.numel() != pg.size() * input_tensor.numel():
        raise ValueError(f"{what}: output_tensor of shape {tuple(output_tensor.shape)} and dtype "
                         f"{output_tensor.dtype} must hold {pg.size()} x the input's "
                         f"{input_tensor.numel()} elements of dtype {input_tensor.dtype}")
    send, _ = _staging(input_tensor)
    recv, back = _staging(output_tensor)
    request = pg.comm.Iallgather(send, recv)
    return _issue([request], lambda: _write_back(output_tensor, back), what, pg, async_op,
                  [output_tensor])


def reduce_scatter_tensor(output, input, op=ReduceOp.SUM, group=None, async_op=False):
    """As ``torch.distributed.reduce_scatter_tensor``: the ranks' ``input`` are reduced and
    rank r keeps the r-th of ``size`` equal chunks (along dim 0) in ``output``."""
    what = "reduce_scatter_tensor"
    _check_tensor(output, what, "output")
    _check_tensor(input, what, "input")
    pg = _group(group, what)
    if pg is None:
        return None
    if output.dtype != input.dtype or input.numel() != pg.size() * output.numel():
        raise ValueError(f"{what}: input of shape {tuple(input.shape)} and dtype {input.dtype} "
                         f"must hold {pg.size()} x the output's {output.numel()} elements "
                         f"(shape {tuple(output.shape)}, dtype {output.dtype})")
    mpi_op = _mpi_op(op, input, what)
    send, _ = _staging(input, op)
    recv, back = _staging(output, op)
    request = pg.comm.Ireduce_scatter_block(send, recv, mpi_op)

    return _issue([request], lambda: _finish_reduction(output, recv, back, op, pg), what, pg,
                  async_op, [output])


def gather(tensor, gather_list=None, dst=None, group=None, async_op=False, group_dst=None):
    """As ``torch.distributed.gather``: on rank ``dst``, ``gather_list[r]`` becomes rank r's
    ``tensor`` (the other ranks pass no list)."""
    what = "gather"
    _check_tensor(tensor, what)
    pg = _group(group, what)
    if pg is None:
        return None
    root = _root_or_group_rank(pg, dst, group_dst, what, "dst")
    mine = pg.rank() == root
    _check_root_list(what, gather_list, "gather_list", "destination", "an output", tensor, pg,
                     root)
    send, _ = _staging(tensor)
    recv = xp.empty((pg.size(), send.size), xp.uint8) if mine else None
    request = pg.comm.Igather(send, recv, root)

    def finish():
        if mine:
            _unpack_rows(recv, gather_list, tensor)

    return _issue([request], finish, what, pg, async_op, gather_list or [])


def scatter(tensor, scatter_list=None, src=None, group=None, async_op=False, group_src=None):
    """As ``torch.distributed.scatter``: rank r's ``tensor`` becomes ``scatter_list[r]`` of
    rank ``src`` (the other ranks pass no list)."""
    what = "scatter"
    _check_tensor(tensor, what)
    pg = _group(group, what)
    if pg is None:
        return None
    root = _root_or_group_rank(pg, src, group_src, what, "src")
    mine = pg.rank() == root
    _check_root_list(what, scatter_list, "scatter_list", "source", "an input", tensor, pg, root)
    send = None
    if mine:
        send = xp.stack([xp.ascontiguousarray(t._data).reshape(-1).view(xp.uint8)
                         for t in scatter_list])
    recv, back = _staging(tensor)
    request = pg.comm.Iscatter(send, recv, root)
    return _issue([request], lambda: _write_back(tensor, back), what, pg, async_op, [tensor])


def isend(tensor, dst=None, group=None, tag=0, group_dst=None):
    """As ``torch.distributed.isend``: send ``tensor`` to rank ``dst``; returns a Work."""
    what = "isend"
    _check_tensor(tensor, what)
    pg = _group(group, what)
    if pg is None:
        return None
    peer = group_dst if group_dst is not None else _root(pg, dst, what, "dst")
    if peer == pg.rank():
        raise ValueError(f"{what}: rank {pg.rank()} cannot send to itself")
    buf = xp.ascontiguousarray(tensor._data).reshape(-1).view(xp.uint8)
    return Work([pg.comm.Isend(buf, peer, tag)], None, what, pg)


def irecv(tensor, src=None, group=None, tag=0, group_src=None):
    """As ``torch.distributed.irecv``: receive into ``tensor`` from ``src`` (None: any rank);
    returns a Work."""
    what = "irecv"
    _check_tensor(tensor, what)
    pg = _group(group, what)
    if pg is None:
        return None
    peer = group_src if group_src is not None else (
        _MPI.ANY_SOURCE if src is None else _root(pg, src, what, "src"))
    buf, back = _staging(tensor)
    status = _MPI.Status()
    work = Work([pg.comm.Irecv(buf, peer, tag)], None, what, pg, [tensor])
    work._statuses = [status]

    def finish():
        _write_back(tensor, back)
        work._source = pg.ranks[status.Get_source()]

    work._finish = finish
    return work


def send(tensor, dst=None, group=None, tag=0, group_dst=None) -> None:
    """As ``torch.distributed.send`` (blocking, within the group's timeout)."""
    isend(tensor, dst, group, tag, group_dst).wait()


def recv(tensor, src=None, group=None, tag=0, group_src=None) -> int:
    """As ``torch.distributed.recv``: returns the sender's rank."""
    work = irecv(tensor, src, group, tag, group_src)
    work.wait()
    return work._source


def barrier(group=None, async_op=False, device_ids=None):
    """As ``torch.distributed.barrier`` (within the group's timeout)."""
    pg = _group(group, "barrier")
    if pg is None:
        return None
    return _issue([pg.comm.Ibarrier()], None, "barrier", pg, async_op)


# --- Python objects (pickled) ----------------------------------------------------------------
def _pickle(obj):
    return xp.frombuffer(pickle.dumps(obj), xp.uint8)


def all_gather_object(object_list, obj, group=None) -> None:
    """As ``torch.distributed.all_gather_object``: ``object_list[r]`` becomes rank r's ``obj``."""
    what = "all_gather_object"
    pg = _group(group, what)
    if pg is None:
        return None
    if len(object_list) != pg.size():
        raise ValueError(f"{what}: object_list has {len(object_list)} entries, expected one per "
                         f"rank ({pg.size()})")
    data = _pickle(obj)
    sizes = xp.empty(pg.size(), xp.int64)
    _wait_requests([pg.comm.Iallgather(xp.array([data.size], xp.int64), sizes)], what, pg)
    recv = xp.empty(int(sizes.sum()), xp.uint8)
    offsets = xp.concatenate([[0], xp.cumsum(sizes)[:-1]])
    _wait_requests([pg.comm.Iallgatherv(data, [recv, (sizes, offsets), _MPI.BYTE])], what, pg)
    for r in range(pg.size()):
        object_list[r] = pickle.loads(recv[offsets[r]:offsets[r] + sizes[r]].tobytes())


def broadcast_object_list(object_list, src=None, group=None, device=None, group_src=None):
    """As ``torch.distributed.broadcast_object_list``: ``object_list`` on every rank becomes
    rank ``src``'s (same length everywhere)."""
    what = "broadcast_object_list"
    pg = _group(group, what)
    if pg is None:
        return None
    root = _root_or_group_rank(pg, src, group_src, what, "src")
    mine = pg.rank() == root
    data = _pickle(list(object_list)) if mine else None
    size = xp.array([data.size if mine else 0], xp.int64)
    _wait_requests([pg.comm.Ibcast(size, root)], what, pg)
    buf = data.copy() if mine else xp.empty(int(size[0]), xp.uint8)
    _wait_requests([pg.comm.Ibcast(buf, root)], what, pg)
    if not mine:
        objects = pickle.loads(buf.tobytes())
        if len(objects) != len(object_list):
            raise ValueError(f"{what}: rank {root} sent {len(objects)} objects, this rank's "
                             f"object_list has {len(object_list)}")
        object_list[:] = objects
