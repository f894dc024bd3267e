"""``ZeroRedundancyOptimizer`` (ZeRO stage 1): each rank keeps the optimizer state of its
shard of the parameters only, steps that shard, and broadcasts it to the other ranks.

Parameters are partitioned as PyTorch does: per parameter group, largest first, each to the
rank holding the fewest elements so far. With the same gradients on every rank (DDP), the
parameters after ``step()`` equal those of the plain optimizer, and optimizer memory per rank
falls to about 1/world_size.
"""
import copy
from itertools import chain

from tapegrad import distributed as dist
from tapegrad.optim.optimizer import Optimizer


class ZeroRedundancyOptimizer(Optimizer):
    """As ``torch.distributed.optim.ZeroRedundancyOptimizer(params, optimizer_class, **defaults)``.

    >>> opt = ZeroRedundancyOptimizer(ddp.parameters(), optimizer_class=tapegrad.optim.Adam,
    ...                               lr=1e-3)
    >>> loss.backward(); opt.step()      # each rank updates its shard, then shares it
    """

    def __init__(self, params, optimizer_class, process_group=None,
                 parameters_as_bucket_view=False, overlap_with_ddp=False, **defaults):
        if overlap_with_ddp:
            raise NotImplementedError("ZeroRedundancyOptimizer: overlap_with_ddp=True is not "
                                      "supported by tapegrad (see docs/differences.md)")
        self.initialized = False
        params = list(params)
        if not params:
            raise ValueError("ZeroRedundancyOptimizer requires at least one parameter")
        Optimizer.__init__(self, params, defaults)
        self.process_group = process_group if process_group is not None else \
            dist.distributed_c10d._world("ZeroRedundancyOptimizer")
        self.world_size = self.process_group.size()
        self.rank = self.process_group.rank()
        self.global_rank = self.process_group.ranks[self.rank]
        self.parameters_as_bucket_view = parameters_as_bucket_view
        self._optim_defaults = defaults
        self._optim_constructor = optimizer_class
        self._partition_cache = []
        self._all_state_dicts = []
        self.optim = optimizer_class(self._partition_parameters()[self.rank], **defaults)
        self._sync_param_groups(self.optim.param_groups, self.param_groups)
        self.initialized = True

    # --- partition -------------------------------------------------------------------------
    def _partition_parameters(self):
        """For each rank, its param groups (copies of ours, holding its shard's params)."""
        if not self._partition_cache:
            self._partition_cache = [[] for _ in range(self.world_size)]
            sizes = [0] * self.world_size
            for group in self.param_groups:
                per_rank = [[] for _ in range(self.world_size)]
                for p in sorted(group["params"], key=lambda t: t.numel(), reverse=True):
                    r = sizes.index(min(sizes))
                    per_rank[r].append(p)
                    sizes[r] += p.numel()
                for r, shard in enumerate(per_rank):
                    g = copy.copy(group)
                    g["params"] = shard
                    self._partition_cache[r].append(g)
        return self._partition_cache

    @property
    def _param_to_rank(self):
        return {id(p): r for r, groups in enumerate(self._partition_parameters())
                for g in groups for p in g["params"]}

    @property
    def _index_to_param(self):
        return list(chain.from_iterable(g["params"] for g in self.param_groups))

    def add_param_group(self, param_group):
        """As ``Optimizer.add_param_group``; call it on every rank."""
        Optimizer.add_param_group(self, param_group)
        if getattr(self, "initialized", False):
            self._partition_cache = []
            groups = self._partition_parameters()[self.rank]
            self.optim.add_param_group(groups[-1])

    @staticmethod
    def _sync_param_groups(src, dst):
        for s, d in zip(src, dst):
            for k, v in s.items():
                if k != "params":
                    d[k] = v

    # --- step ------------------------------------------------------------------------------
    def step(self, closure=None, **kwargs):
        """Step this rank's shard with the local optimizer, then broadcast every shard from its
        owner (hyperparameters such as a scheduler's ``lr`` follow ``param_groups``)."""
        self._sync_param_groups(self.param_groups, self.optim.param_groups)
        loss = self.optim.step(closure=closure, **kwargs) if closure is not None else \
            self.optim.step(**kwargs)
        self._sync_param_groups(self.optim.param_groups, self.param_groups)
        works = []
        for r, groups in enumerate(self._partition_parameters()):
            for g in groups:
                works.extend(dist.broadcast(p, src=self.process_group.ranks[r],
                                            group=self.process_group, async_op=True)
                             for p in g["params"])
        for w in works:
            w.wait()
        return loss

    def zero_grad(self, set_to_none=True):
        Optimizer.zero_grad(self, set_to_none)

    # --- state -----------------------------------------------------------------------------
    def consolidate_state_dict(self, to=0):
        """Gather every rank's local optimizer state on rank ``to`` (call it on all ranks)."""
        self._sync_param_groups(self.param_groups, self.optim.param_groups)
        local = self.optim.state_dict()
        gathered = [None] * self.world_size
        dist.all_gather_object(gathered, local, group=self.process_group)
        self._all_state_dicts = gathered if self.rank == to else []

    def state_dict(self):
        """The whole optimizer's state, in the plain optimizer's layout (after
        ``consolidate_state_dict`` on this rank)."""
        if not self._all_state_dicts:
            raise RuntimeError(
                "Optimizer state has not been consolidated on this rank. Please call "
                f"`consolidate_state_dict(to={self.rank})` on all ranks beforehand if you meant "
                "to save the global state.")
        state_dict = Optimizer.state_dict(self)
        index = {id(p): i for i, p in enumerate(self._index_to_param)}
        for r, local in enumerate(self._all_state_dicts):
            for local_group, global_group in zip(local["param_groups"],
                                                 self._partition_parameters()[r]):
                for k, p in zip(local_group["params"], global_group["params"]):
                    if k in local["state"]:
                        state_dict["state"][index[id(p)]] = local["state"][k]
        state_dict["state"] = dict(sorted(state_dict["state"].items()))
        return state_dict

    def load_state_dict(self, state_dict):
        """Load the state of this rank's shard from a whole ``state_dict``."""
        owner = self._param_to_rank
        params = self._index_to_param
        local = {}
        for k, v in state_dict["state"].items():
            if owner[id(params[k])] == self.rank:
                local[params[k]] = v
        Optimizer.load_state_dict(self, {"state": {}, "param_groups":
                                         state_dict["param_groups"]})
        mine = {id(p) for g in self.optim.param_groups for p in g["params"]}
        index = {id(p): i for i, p in enumerate(chain.from_iterable(
            g["params"] for g in self.optim.param_groups))}
        local_sd = self.optim.state_dict()
        local_sd["state"] = {index[id(p)]: v for p, v in local.items() if id(p) in mine}
        self._sync_param_groups(self.param_groups, local_sd["param_groups"])
        self.optim.load_state_dict(local_sd)
        self.state.clear()
