"""``DistributedDataParallel``: one model replica per rank, gradients averaged during backward.

At construction the parameter shapes are checked across ranks and rank 0's parameters and
buffers are broadcast. The parameters are grouped into buckets (reverse registration order, the
order backward tends to finish them; 1 MiB first, then ``bucket_cap_mb``). Each parameter has a
post-accumulate-grad hook: when backward has finished its gradient, the hook copies it into its
bucket, and a full bucket starts a non-blocking all-reduce at once, while backward goes on with
the layers below. The hook of the last parameter waits for the buckets and writes the averaged
gradients back into ``.grad``. After the first iteration the buckets are rebuilt in the order
the gradients actually arrived (as PyTorch does), agreed from rank 0.
"""
import contextlib
import time
import warnings

from tapegrad import distributed as dist
from tapegrad.autograd.engine import leaves_below
from tapegrad.autograd.grad_mode import no_grad, state as grad_state
from tapegrad.backend import xp
from tapegrad.nn.module import Module
from tapegrad.tensor import Tensor

_DEFAULT_FIRST_BUCKET_BYTES = 1024 * 1024
_DEFAULT_BUCKET_CAP_MB = 25
_BROADCAST_BUCKET_BYTES = 250 * 1024 * 1024


def _find_tensors(obj):
    """The Tensors in a (nested) forward output."""
    if isinstance(obj, Tensor):
        return [obj]
    if isinstance(obj, (list, tuple)):
        return [t for o in obj for t in _find_tensors(o)]
    if isinstance(obj, dict):
        return [t for o in obj.values() for t in _find_tensors(o)]
    return []


def _broadcast_coalesced(tensors, pg, src, bucket_bytes=_BROADCAST_BUCKET_BYTES):
    """Broadcast ``tensors`` from ``src``, packed into flat buffers per dtype."""
    by_dtype = {}
    for t in tensors:
        by_dtype.setdefault(t._data.dtype, []).append(t)
    for group in by_dtype.values():
        chunk, size = [], 0
        for t in group + [None]:
            if t is not None and (not chunk or size + t._data.nbytes <= bucket_bytes):
                chunk.append(t)
                size += t._data.nbytes
                continue
            flat = Tensor._make(xp.concatenate([c._data.reshape(-1) for c in chunk]))
            dist.broadcast(flat, src=pg.ranks[src], group=pg)
            offset = 0
            for c in chunk:
                n = c._data.size
                c._data[...] = flat._data[offset:offset + n].reshape(c._data.shape)
                offset += n
            chunk, size = ([t], t._data.nbytes) if t is not None else ([], 0)


def _bucket_assignment(params, limits):
    """Lists of parameter indices, in ``params`` order, filled up to the byte ``limits`` (the
    last limit repeats), one open bucket per dtype (PyTorch's compute_bucket_assignment_by_size)."""
    buckets, open_, limit_index = [], {}, {}
    for i, p in params:
        key = p._data.dtype
        entry = open_.setdefault(key, [[], 0])
        entry[0].append(i)
        entry[1] += p._data.nbytes
        k = limit_index.get(key, 0)
        if entry[1] >= limits[min(k, len(limits) - 1)]:
            buckets.append(entry[0])
            del open_[key]
            limit_index[key] = k + 1
    buckets.extend(e[0] for e in open_.values() if e[0])
    return buckets


class _Bucket:
    __slots__ = ("indices", "offsets", "buffer", "pending", "work", "dtype")

    def __init__(self, indices, params):
        self.indices = indices
        self.offsets, n = [], 0
        for i in indices:
            self.offsets.append(n)
            n += params[i]._data.size
        self.dtype = params[indices[0]]._data.dtype
        self.buffer = xp.zeros(n, self.dtype)
        self.pending = len(indices)
        self.work = None


class DistributedDataParallel(Module):
    """As ``torch.nn.parallel.DistributedDataParallel(module)``: data-parallel training on the
    ranks of ``process_group`` (default: every rank).

    >>> dist.init_process_group(backend="mpi")
    >>> model = DistributedDataParallel(Net().double())    # rank 0's weights everywhere
    >>> loss_fn(model(x_of_this_rank), y).backward()          # .grad averaged over the ranks
    >>> with model.no_sync():                                # accumulate without talking
    ...     loss_fn(model(x2), y2).backward()
    """

    def __init__(self, module, device_ids=None, output_device=None, dim=0, broadcast_buffers=None,
                 init_sync=True, process_group=None, bucket_cap_mb=None,
                 find_unused_parameters=False, check_reduction=False,
                 gradient_as_bucket_view=False, static_graph=False,
                 delay_all_reduce_named_params=None, param_to_hook_all_reduce=None,
                 mixed_precision=None, device_mesh=None, skip_all_reduce_unused_params=False,
                 bucket_cap_mb_list=None, batched_grad_copy=False, forward_sync_buffers=None):
        super().__init__()
        for name, value in (("delay_all_reduce_named_params", delay_all_reduce_named_params),
                            ("param_to_hook_all_reduce", param_to_hook_all_reduce),
                            ("mixed_precision", mixed_precision), ("device_mesh", device_mesh),
                            ("bucket_cap_mb_list", bucket_cap_mb_list)):
            if value is not None:
                raise NotImplementedError(f"DistributedDataParallel: {name} is not supported by "
                                          "tapegrad (see docs/differences.md)")
        self.process_group = process_group if process_group is not None else \
            dist.distributed_c10d._world("DistributedDataParallel")
        self.parameters_to_ignore = set(getattr(module, "_ddp_params_and_buffers_to_ignore", ()))
        self._module_parameters = [p for n, p in module.named_parameters()
                                   if n not in self.parameters_to_ignore]
        if not any(p.requires_grad for p in self._module_parameters):
            raise RuntimeError("DistributedDataParallel is not needed when a module doesn't have "
                               "any parameter that requires a gradient.")
        if device_ids or output_device is not None:
            devices = {str(p.device) for p in self._module_parameters}
            raise ValueError(
                "DistributedDataParallel device_ids and output_device arguments only work with "
                "single-device/multiple-device GPU modules or CPU modules, but got device_ids "
                f"{device_ids}, output_device {output_device}, and module parameters {devices}.")
        if check_reduction:
            warnings.warn("The `check_reduction` argument in `DistributedDataParallel` module is "
                          "deprecated. Please avoid using it.", FutureWarning, stacklevel=2)
        self.device_ids = self.output_device = None
        self.dim = dim
        self.module = module
        if forward_sync_buffers is not None:
            self.forward_sync_buffers, init_sync_buffers = forward_sync_buffers, True
        else:
            self.forward_sync_buffers = init_sync_buffers = \
                True if broadcast_buffers is None else broadcast_buffers
        self.find_unused_parameters = find_unused_parameters
        self.require_backward_grad_sync = True
        self.require_forward_param_sync = True
        self.gradient_as_bucket_view = gradient_as_bucket_view
        self.static_graph = static_graph
        self.bucket_bytes_cap = int((_DEFAULT_BUCKET_CAP_MB if bucket_cap_mb is None
                                     else bucket_cap_mb) * 1024 * 1024)
        first = _DEFAULT_FIRST_BUCKET_BYTES if bucket_cap_mb is None else self.bucket_bytes_cap
        self._bucket_limits = [first, self.bucket_bytes_cap]
        self._params = [p for p in self._module_parameters if p.requires_grad]
        self._world_size = self.process_group.size()
        if init_sync:
            self._verify_params_across_processes()
            with no_grad():
                states = list(self._module_parameters)
                if init_sync_buffers:
                    states += self._module_buffers()
                _broadcast_coalesced(states, self.process_group, 0)
        self._index = {id(p): i for i, p in enumerate(self._params)}
        self._build_buckets(reversed(range(len(self._params))))
        # rebuilt once in arrival order unless the graph may change (PyTorch's rule)
        self._has_rebuilt_buckets = not (static_graph or not find_unused_parameters)
        self._ready = [False] * len(self._params)
        self._arrival = []
        self._syncing = False      # this backward reduces (set by forward)
        self._started = False      # a hook of this backward has run
        self._finished = True
        self._unused = []
        self._used = xp.zeros(len(self._params), xp.int32)
        self.comm_stats = {"bytes": 0, "allreduce_calls": 0, "exposed_wait_s": 0.0,
                           "steps": 0}
        self._accum_grad_hooks = [p.register_post_accumulate_grad_hook(self._grad_ready)
                                  for p in self._params]

    # --- construction ------------------------------------------------------------------------
    def _module_buffers(self):
        return [b for n, b in self.module.named_buffers() if n not in self.parameters_to_ignore]

    def _verify_params_across_processes(self):
        """Every rank raises, naming the first disagreement, when the models differ."""
        pg = self.process_group
        mine = [(n, tuple(p.shape), str(p.dtype)) for n, p in self.module.named_parameters()
                if n not in self.parameters_to_ignore]
        everyone = [None] * pg.size()
        dist.all_gather_object(everyone, mine, group=pg)
        for r, theirs in enumerate(everyone):
            if len(theirs) != len(everyone[0]):
                raise RuntimeError(
                    f"DistributedDataParallel: DDP expects same model across all ranks, but rank "
                    f"{r} has {len(theirs)} params, while rank 0 has inconsistent "
                    f"{len(everyone[0])} params.")
            for i, (a, b) in enumerate(zip(everyone[0], theirs)):
                if a[1:] != b[1:]:
                    raise RuntimeError(
                        f"DistributedDataParallel: params[{i}] ({b[0]}) has shape {b[1]} and "
                        f"dtype {b[2]} on rank {r} but shape {a[1]} and dtype {a[2]} on rank 0: "
                        "DDP expects the same model on every rank")

    def _build_buckets(self, order):
        order = list(order)
        assignment = _bucket_assignment([(i, self._params[i]) for i in order],
                                        self._bucket_limits)
        self._buckets = [_Bucket(ix, self._params) for ix in assignment]
        self._where = {}
        for b, bucket in enumerate(self._buckets):
            for k, i in enumerate(bucket.indices):
                self._where[i] = (b, bucket.offsets[k])
        self._next_bucket = 0

    def _rebuild_buckets(self):
        """Once, after the first iteration: buckets in the order gradients arrived (rank 0's)."""
        self._has_rebuilt_buckets = True
        seen = set(self._arrival)
        order = self._arrival + [i for i in reversed(range(len(self._params))) if i not in seen]
        agreed = [order]
        dist.broadcast_object_list(agreed, src=self.process_group.ranks[0],
                                   group=self.process_group)
        self._build_buckets(agreed[0])

    # --- forward -------------------------------------------------------------------------------
    def will_sync_module_buffers(self):
        return self.require_forward_param_sync and self.forward_sync_buffers and \
            len(self._module_buffers()) > 0

    @property
    def broadcast_buffers(self):
        return self.forward_sync_buffers

    @broadcast_buffers.setter
    def broadcast_buffers(self, value):
        self.forward_sync_buffers = value

    def forward(self, *inputs, **kwargs):
        grad_on = grad_state.enabled
        if grad_on and self.require_backward_grad_sync:
            if self._started and not self._finished:
                raise RuntimeError(
                    "Expected to have finished reduction in the prior iteration before starting "
                    "a new one. This error indicates that your module has parameters that were "
                    "not used in producing loss. You can enable unused parameter detection by "
                    "passing the keyword argument `find_unused_parameters=True` to "
                    "`torch.nn.parallel.DistributedDataParallel`, and by making sure all "
                    "`forward` function outputs participate in calculating loss. Parameters "
                    "that were not ready: " + ", ".join(self._not_ready_names()))
            if not self._has_rebuilt_buckets and self._arrival:
                self._rebuild_buckets()
        if self.will_sync_module_buffers():
            with no_grad():
                _broadcast_coalesced(self._module_buffers(), self.process_group, 0)
        output = self.module(*inputs, **kwargs)
        if grad_on and self.require_backward_grad_sync:
            self.require_forward_param_sync = True
            self._prepare_for_backward(output)
        else:
            self.require_forward_param_sync = False
            self._syncing = False
        return output

    def _not_ready_names(self):
        names = {id(p): n for n, p in self.module.named_parameters()}
        return [names.get(id(self._params[i]), str(i)) for bucket in self._buckets
                for k, i in enumerate(bucket.indices) if self._ready[i] is False]

    def _prepare_for_backward(self, output):
        self._syncing = True
        self._started = False
        self._finished = False
        self._next_bucket = 0
        self._ready = [False] * len(self._params)
        self._used[...] = 0
        for bucket in self._buckets:
            bucket.pending = len(bucket.indices)
            bucket.work = None
        self._unused = []
        if self.find_unused_parameters and not self.static_graph:
            outputs = _find_tensors(output)
            reached = {id(t) for t in outputs if t.grad_fn is None and t.requires_grad}
            reached.update(id(leaf) for _, leaf in leaves_below(outputs))
            self._unused = [i for i, p in enumerate(self._params) if id(p) not in reached]

    # --- backward: the gradient hooks ------------------------------------------------------------
    def _grad_ready(self, param):
        if not self._syncing:
            return
        if not self._started:
            self._started = True
            for i in self._unused:  # unused here: zeros in the bucket, ready at once
                self._mark_ready(i, None)
        i = self._index[id(param)]
        self._used[i] = 1
        self._mark_ready(i, param.grad)

    def _mark_ready(self, i, grad):
        if self._ready[i]:
            raise RuntimeError(
                f"DistributedDataParallel: expected to mark a variable ready only once; "
                f"parameter {i} of shape {tuple(self._params[i].shape)} was marked twice in this "
                "iteration (a parameter used in two backward passes of one forward?)")
        self._ready[i] = True
        if not self._has_rebuilt_buckets:
            self._arrival.append(i)
        b, offset = self._where[i]
        bucket = self._buckets[b]
        n = self._params[i]._data.size
        if grad is None:
            bucket.buffer[offset:offset + n] = 0
        else:
            bucket.buffer[offset:offset + n] = grad._data.reshape(-1)
        bucket.pending -= 1
        for other in self._buckets[:self._next_bucket]:  # let MPI progress what is in flight
            if other.work is not None:
                other.work.is_completed()
        while self._next_bucket < len(self._buckets) and \
                self._buckets[self._next_bucket].pending == 0:
            self._launch(self._buckets[self._next_bucket])
            self._next_bucket += 1
        if self._next_bucket == len(self._buckets):
            self._finalize()

    def _launch(self, bucket):
        bucket.buffer /= self._world_size
        bucket.work = dist.all_reduce(Tensor._make(bucket.buffer), group=self.process_group,
                                      async_op=True)
        self.comm_stats["bytes"] += bucket.buffer.nbytes
        self.comm_stats["allreduce_calls"] += 1

    def _finalize(self):
        start = time.perf_counter()
        used = None
        if self.find_unused_parameters:
            used = Tensor._make(self._used.copy())
            dist.all_reduce(used, op=dist.ReduceOp.MAX, group=self.process_group)
            used = used._data
        for bucket in self._buckets:
            bucket.work.wait()
        self.comm_stats["exposed_wait_s"] += time.perf_counter() - start
        self.comm_stats["steps"] += 1
        for bucket in self._buckets:
            for i, offset in zip(bucket.indices, bucket.offsets):
                if used is not None and not used[i]:
                    continue  # unused on every rank: .grad stays as it was, as in PyTorch
                p = self._params[i]
                value = bucket.buffer[offset:offset + p._data.size].reshape(p._data.shape)
                if p._grad is None:
                    p._grad = Tensor._make(value.copy())
                else:
                    p._grad._data[...] = value
        self._finished = True
        self._syncing = False

    # --- user API -------------------------------------------------------------------------------
    @contextlib.contextmanager
    def no_sync(self):
        """As ``DistributedDataParallel.no_sync()``: backward passes of forwards run inside
        accumulate ``.grad`` locally; the first synced backward after it reduces the sum."""
        old = self.require_backward_grad_sync
        self.require_backward_grad_sync = False
        try:
            yield
        finally:
            self.require_backward_grad_sync = old

    def train(self, mode=True):
        super().train(mode)
        return self
