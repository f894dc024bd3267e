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

Before every collective the ranks exchange a small fixed-size record of what they are calling
(the collective, its root and reduction, each tensor's dtype and shape; one non-blocking
allgather on a communicator of its own), and MPI is handed the collective only once every
rank's record has come and they agree: MPI given disagreeing buffers returns wrong data,
hangs or aborts. Where they differ every rank raises :class:`DistError` naming the collective
and each rank's shapes and dtypes (``all_reduce: rank 0 has float64 (3,), rank 1 has float64
(5,)``), drops that collective and can go on. An ``async_op=True`` collective returns at once;
it is handed to MPI, in call order, by the next collective or ``Work`` call that finds the
records in. ``TAPEGRAD_DISTRIBUTED_DEBUG=OFF`` (read by ``init_process_group`` and
``new_group``, the same on every rank) turns the check off; unset, ``INFO`` or ``DETAIL``
(PyTorch's names) keep it on.

MPI is initialised on the first ``init_process_group`` (importing ``mpi4py.MPI`` does it), not
on ``import tapegrad``. Tensors are written in place (their version counter moves, as any
in-place write); non-contiguous tensors and dtypes MPI has no reduction for (float16,
bfloat16, bool) go through a contiguous staging buffer.
"""
import array
import collections
import copy
import datetime
import importlib.util
import os
import pickle
import sys
import time
import traceback
import zlib

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
        self.check_comm = None  # where the ranks agree on each collective (None: off)
        self.pending = collections.deque()  # Works waiting for that agreement, in call order

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
    pg = ProcessGroup(world.Dup(), range(world.Get_size()), seconds, group_name or "0")
    pg.check_comm = _check_comm(pg, "init_process_group")
    _state.world = pg
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
            _free(group)
        return
    pg = _world("destroy_process_group")
    _start_pending(pg)
    for g in [*_state.groups, pg]:
        _free(g)
    _state.failure_comm.Free()
    _state.groups = []
    _state.world = _state.failure_comm = None
    if sys.excepthook is _excepthook:
        sys.excepthook = _state.excepthook or sys.__excepthook__
    from tapegrad.distributed.run import mark_done  # run.py runs as __main__ under the launcher

    mark_done()  # this rank may now end without failing the job


def _free(pg):
    pg.comm.Free()
    if pg.check_comm is not None:
        pg.check_comm.Free()


def _check_comm(pg, what):
    """The communicator of ``pg``'s agreement records, or None where
    ``TAPEGRAD_DISTRIBUTED_DEBUG=OFF``; every rank of ``pg`` must choose alike."""
    on = os.environ.get("TAPEGRAD_DISTRIBUTED_DEBUG", "").strip().upper() != "OFF"
    flags = xp.empty(pg.size(), xp.int64)
    _wait_requests([pg.comm.Iallgather(xp.array([on], xp.int64), flags)], what, pg)
    if flags.min() != flags.max():
        off = [pg.ranks[r] for r in range(pg.size()) if not flags[r]]
        raise DistError(f"{what}: TAPEGRAD_DISTRIBUTED_DEBUG=OFF on ranks {off} only: set it "
                        "alike on every rank (the collectives' agreement check is on or off "
                        "for all of them)")
    return pg.comm.Dup() if on else None


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
    _start_pending(world)
    comm = world.comm.Split(0 if me in members else MPI.UNDEFINED, me)
    if comm == MPI.COMM_NULL:
        return GroupMember.NON_GROUP_MEMBER
    pg = ProcessGroup(comm, members, _seconds(timeout) or world.timeout,
                      str(len(_state.groups) + 1))
    pg.check_comm = _check_comm(pg, "new_group")
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


# A wait polls without sleeping this long first: a peer a few microseconds late (the usual
# case) then costs no sleep, whose wake-up on a loaded machine took hundreds of microseconds.
_SPIN_S = 2e-4


def _wait_requests(requests, what, pg, statuses=None):
    """Complete ``requests``, polling; raise on a failed peer or past the group's timeout."""
    MPI = _MPI
    try:
        if MPI.Request.Testall(requests, statuses):
            return
        if statuses is None:  # where MPI writes a failed request's error
            statuses = [MPI.Status() for _ in requests]
        start = time.monotonic()
        while not MPI.Request.Testall(requests, statuses):
            waited = time.monotonic() - start
            if waited < _SPIN_S:
                continue
            _check_failure(what)
            if waited > pg.timeout:
                raise DistBackendError(
                    f"{what}: timed out after {pg.timeout:g} s on rank {pg.ranks[pg.rank()]} "
                    f"(group of {pg.size()} ranks {pg.ranks}): another rank did not join the "
                    "collective")
            time.sleep(min(1e-3, waited / 4))  # back off: a long wait leaves the CPU to others
    except MPI.Exception as e:
        raise _mpi_failure(e, what, pg, statuses) from None


def _mpi_failure(e, what, pg, statuses=None):
    """MPI's error, with the failed request's own error where MPI put it in a status."""
    MPI = _MPI
    codes = [s.Get_error() for s in statuses or ()]
    code = next((c for c in codes if c not in (MPI.SUCCESS, MPI.ERR_PENDING)),
                e.Get_error_code())
    hint = "" if pg.check_comm is not None else (
        " (the ranks' tensors may differ in size: TAPEGRAD_DISTRIBUTED_DEBUG=OFF turned off "
        "the check that names them)")
    return DistBackendError(f"{what}: MPI failed on rank {pg.ranks[pg.rank()]}: "
                            f"{' '.join(MPI.Get_error_string(code).split())}{hint}")


# --- agreement: each collective's record, compared across the ranks before its result is used --
_KINDS = {name: code for code, name in enumerate((
    "all_reduce", "reduce", "broadcast", "all_gather", "all_gather_into_tensor",
    "reduce_scatter_tensor", "gather", "scatter", "barrier", "all_gather_object",
    "broadcast_object_list"))}
_DIMS = 8  # shape entries per tensor; a longer shape folds the rest into the last one (a crc)
_RECORD = 4 + 2 * (2 + _DIMS)  # kind, root, op, count; two tensors of dtype, ndim, shape
_PADS = [(-1,) * n for n in range(_RECORD + 1)]
_EMPTY_RECORD = array.array("q", _PADS[_RECORD])
_DTYPE_CODES = {}


def _dtype_code(dtype):
    code = _DTYPE_CODES.get(dtype)
    if code is None:
        code = _DTYPE_CODES[dtype] = zlib.crc32(dtype.name.encode())
    return code


class _Agreement:
    """This rank's record of one collective and the request that gathers every rank's."""

    __slots__ = ("request", "records", "what", "fields")

    def __init__(self, pg, what, tensors, root, op, count, fields):
        record = [_KINDS[what], root, op, count]
        for t in tensors:
            shape = t._data.shape
            if len(shape) > _DIMS:
                shape = (*shape[:_DIMS - 1], zlib.crc32(repr(shape[_DIMS - 1:]).encode()))
            record += (_dtype_code(t.dtype), t._data.ndim, *shape, *_PADS[_DIMS - len(shape)])
        record += _PADS[_RECORD - len(record)]
        self.records = _EMPTY_RECORD * pg.size()
        self.request = pg.check_comm.Iallgather(array.array("q", record), self.records)
        self.what = what
        self.fields = fields


def _announce(pg, what, tensors=(), root=-1, op=None, count=-1, roles=("",), root_name=None):
    """Start the exchange of this rank's record for ``what`` (None where the check is off).
    ``roles`` name the tensors in a message; ``root_name`` is ``"src"`` or ``"dst"``."""
    if pg.check_comm is None:
        return None

    def fields():  # what a message says of this rank, only built on a mismatch
        out = [("called", what)]
        if tensors:
            out.append(("tensors", " and ".join(f"{role}{t.dtype.name} {tuple(t._data.shape)}"
                                                for role, t in zip(roles, tensors))))
        if root_name:
            out.append(("root", f"{root_name}={pg.ranks[root]}"))
        if op is not None:
            out.append(("op", f"op {op.name}"))
        if count >= 0:
            out.append(("count", f"{count} objects"))
        return out

    return _Agreement(pg, what, tensors, root, -1 if op is None else op.value, count, fields)


def _settle(agreement, pg):
    """Wait for every rank's record; raise on every rank when any differs."""
    _wait_requests([agreement.request], agreement.what, pg)
    records = agreement.records
    if records == records[:_RECORD] * pg.size():
        return
    # Every rank sees the same records, so every rank takes this path: exchange the words.
    what = agreement.what
    everyone = _exchange_objects(pg.check_comm, agreement.fields(), what, pg)
    names = [name for name, _ in everyone[0]]
    same_call = all([n for n, _ in f] == names and f[0] == everyone[0][0] for f in everyone)
    if same_call:
        differ = [i for i, _ in enumerate(names) if len({f[i][1] for f in everyone}) > 1] or \
            list(range(1, len(names)))
        says = [" with ".join(f[i][1] for i in differ) for f in everyone]
        head = f"{what}: "
    else:
        says = [f"{f[0][1]}({', '.join(text for _, text in f[1:])})" for f in everyone]
        head = f"{what}: the ranks called different collectives: "
    groups = {}
    for r, text in enumerate(says):
        groups.setdefault(text, []).append(pg.ranks[r])
    parts = [f"rank {ranks[0]} has {text}" if len(ranks) == 1 else
             f"ranks {', '.join(map(str, ranks))} have {text}" for text, ranks in groups.items()]
    if not same_call:
        parts = [p.replace(" has ", " called ").replace(" have ", " called ") for p in parts]
    raise DistError(head + ", ".join(parts) + "; every rank must call the same collectives in "
                    "the same order, with tensors of one shape and dtype")


def _settle_now(pg, what, **record):
    """Agree on a collective that has no Work (an object collective) before it starts, after
    starting the pending ones before it."""
    _start_pending(pg)
    agreement = _announce(pg, what, **record)
    if agreement is not None:
        _settle(agreement, pg)


def _exchange_objects(comm, obj, what, pg):
    """Every rank's ``obj`` (pickled), in rank order, on ``comm``."""
    data = _pickle(obj)
    sizes = xp.empty(pg.size(), xp.int64)
    _wait_requests([comm.Iallgather(xp.array([data.size], xp.int64), sizes)], what, pg)
    recv = xp.empty(int(sizes.sum()), xp.uint8)
    offsets = xp.concatenate([[0], xp.cumsum(sizes)[:-1]])
    _wait_requests([comm.Iallgatherv(data, [recv, (sizes, offsets), _MPI.BYTE])], what, pg)
    return [pickle.loads(recv[offsets[r]:offsets[r] + sizes[r]].tobytes())
            for r in range(pg.size())]


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
    the MPI requests (within the group's timeout) and finishes the result in the tensors.

    A collective whose ranks have not yet agreed on it (see ``_announce``) holds ``start``
    instead of requests: it is started, in call order, once every rank's record has come."""

    def __init__(self, requests, finish, what, pg, outputs=(), agreement=None, start=None):
        self._agreement = agreement
        self._start = start
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
                pg = copy.copy(pg)
                pg.timeout = _seconds(timeout)
            if self._start is not None:
                _start_agreed(pg, until=self)
            _wait_requests(self._requests, self._what, pg, self._statuses)
            self._complete()
        return True

    def is_completed(self) -> bool:
        """True once the operation finished (the result is then in the tensors)."""
        if self._done:
            return True
        if self._start is not None:
            _start_agreed(self._pg)
            if self._start is not None:
                return False
        try:
            if _MPI.Request.Testall(self._requests, self._statuses):
                self._complete()
        except _MPI.Exception as e:
            raise _mpi_failure(e, self._what, self._pg, self._statuses) from None
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


def _start_agreed(pg, until=None):
    """Start ``pg``'s pending collectives, oldest first, whose records every rank has sent
    (MPI needs one order of collectives on every rank); with ``until``, wait for the records
    up to that Work. A mismatch raises here, before MPI sees the disagreeing buffers."""
    pending = pg.pending
    while pending:
        work = pending[0]
        if until is None and not _MPI.Request.Testall([work._agreement.request]):
            return
        pending.popleft()  # a mismatch drops it on every rank: the group stays usable
        _settle(work._agreement, pg)
        work._agreement = None
        work._requests = work._start()
        work._start = None
        if work is until:
            return


def _start_pending(pg):
    """Start every pending collective of ``pg`` (before a blocking call on its communicator)."""
    if pg.pending:
        _start_agreed(pg, until=pg.pending[-1])


def _issue(start, finish, what, pg, async_op, outputs=(), agreement=None):
    """A Work for the collective that ``start()`` begins (it returns the MPI requests): at
    once, or once the ranks agree when ``agreement`` is given; waited for unless async."""
    if agreement is None:
        work = Work(start(), finish, what, pg, outputs)
    else:
        work = Work(None, finish, what, pg, outputs, agreement, start)
        pg.pending.append(work)
        if async_op:
            _start_agreed(pg)  # what has come in so far
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
    agreement = _announce(pg, what, (tensor,), op=op)
    buf, back = _staging(tensor, op)
    start = lambda: [pg.comm.Iallreduce(_MPI.IN_PLACE, buf, mpi_op)]  # noqa: E731
    return _issue(start, lambda: _finish_reduction(tensor, buf, back, op, pg), what, pg,
                  async_op, [tensor], agreement)


def reduce(tensor, dst=None, op=ReduceOp.SUM, group=None, async_op=False, group_dst=None):
    """As ``torch.distributed.reduce``: the reduction lands in ``tensor`` on rank ``dst``."""
    what = "reduce"
    _check_tensor(tensor, what)
    pg = _group(group, what)
    if pg is None:
        return None
    root = _root_or_group_rank(pg, dst, group_dst, what, "dst")
    mpi_op = _mpi_op(op, tensor, what)
    agreement = _announce(pg, what, (tensor,), root, op, root_name="dst")
    buf, back = _staging(tensor, op)
    mine = pg.rank() == root

    def start():
        if mine:
            return [pg.comm.Ireduce(_MPI.IN_PLACE, buf, mpi_op, root)]
        return [pg.comm.Ireduce(buf, None, mpi_op, root)]

    def finish():
        if mine:
            _finish_reduction(tensor, buf, back, op, pg)

    return _issue(start, finish, what, pg, async_op, [tensor], agreement)


def broadcast(tensor, src=None, group=None, async_op=False, group_src=None):
    """As ``torch.distributed.broadcast``: ``tensor`` on every rank becomes rank ``src``'s."""
    what = "broadcast"
    _check_tensor(tensor, what)
    pg = _group(group, what)
    if pg is None:
        return None
    root = _root_or_group_rank(pg, src, group_src, what, "src")
    agreement = _announce(pg, what, (tensor,), root, root_name="src")
    buf, back = _staging(tensor)
    mine = pg.rank() == root
    return _issue(lambda: [pg.comm.Ibcast(buf, root)],
                  None if mine else lambda: _write_back(tensor, back), what, pg, async_op,
                  [tensor], agreement)


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
    agreement = _announce(pg, what, (tensor,))
    send, _ = _staging(tensor)
    recv = xp.empty((pg.size(), send.size), xp.uint8)
    return _issue(lambda: [pg.comm.Iallgather(send, recv)],
                  lambda: _unpack_rows(recv, tensor_list, tensor), what, pg, async_op,
                  tensor_list, agreement)


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
    agreement = _announce(pg, what, (input_tensor, output_tensor),
                          roles=("input ", "output "))
    send, _ = _staging(input_tensor)
    recv, back = _staging(output_tensor)
    return _issue(lambda: [pg.comm.Iallgather(send, recv)],
                  lambda: _write_back(output_tensor, back), what, pg, async_op,
                  [output_tensor], agreement)


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
    agreement = _announce(pg, what, (input, output), op=op, roles=("input ", "output "))
    send, _ = _staging(input, op)
    recv, back = _staging(output, op)
    start = lambda: [pg.comm.Ireduce_scatter_block(send, recv, mpi_op)]  # noqa: E731
    return _issue(start, lambda: _finish_reduction(output, recv, back, op, pg), what, pg,
                  async_op, [output], agreement)


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
    agreement = _announce(pg, what, (tensor,), root, root_name="dst")
    send, _ = _staging(tensor)
    recv = xp.empty((pg.size(), send.size), xp.uint8) if mine else None

    def finish():
        if mine:
            _unpack_rows(recv, gather_list, tensor)

    return _issue(lambda: [pg.comm.Igather(send, recv, root)], finish, what, pg, async_op,
                  gather_list or [], agreement)


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
    agreement = _announce(pg, what, (tensor,), root, root_name="src")
    send = None
    if mine:
        send = xp.stack([xp.ascontiguousarray(t._data).reshape(-1).view(xp.uint8)
                         for t in scatter_list])
    recv, back = _staging(tensor)
    return _issue(lambda: [pg.comm.Iscatter(send, recv, root)],
                  lambda: _write_back(tensor, back), what, pg, async_op, [tensor], agreement)


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
        work._source = pg.ranks[status.Get_source()]
        got = status.Get_count(_MPI.BYTE)
        if got != buf.nbytes:  # a larger message is MPI's truncation error, raised in wait
            raise DistError(f"{what}: rank {pg.ranks[pg.rank()]} received {got} bytes from "
                            f"rank {work._source} into a {tensor.dtype.name} "
                            f"{tuple(tensor.shape)} of {buf.nbytes} bytes: the ranks' tensors "
                            "must agree in shape and dtype")
        _write_back(tensor, back)

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
    agreement = _announce(pg, "barrier")
    return _issue(lambda: [pg.comm.Ibarrier()], None, "barrier", pg, async_op, (), agreement)


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
    _settle_now(pg, what)
    object_list[:] = _exchange_objects(pg.comm, obj, what, pg)


def broadcast_object_list(object_list, src=None, group=None, device=None, group_src=None):
    """As ``torch.distributed.broadcast_object_list``: ``object_list`` on every rank becomes
    rank ``src``'s (same length everywhere)."""
    what = "broadcast_object_list"
    pg = _group(group, what)
    if pg is None:
        return None
    root = _root_or_group_rank(pg, src, group_src, what, "src")
    _settle_now(pg, what, root=root, count=len(object_list), root_name="src")
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
