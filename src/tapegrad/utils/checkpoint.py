"""Gradient checkpointing: keep a segment's inputs, recompute its activations in backward.

    y = checkpoint(block, x)                  # as torch.utils.checkpoint.checkpoint
    y = checkpoint_sequential(layers, 4, x)   # as torch.utils.checkpoint.checkpoint_sequential

How it sits on the tape: the segment runs once, recorded as usual, so its Nodes are the very
Nodes an unchecked run records (same ops, same parents, same order of gradient sums). The
segment's *frame* (an op watcher) notes each Node as it is recorded; when the segment
returns, it drops what those Nodes saved for backward and marks them ``recompute = frame``,
so the segment's activations are freed (peak memory is unchanged by waiting for the end:
backward holds one segment's activations at a time anyway, and a backward run inside the
segment still finds its values). When backward first unpacks one of those Nodes, the frame
reruns the segment from its stored inputs (grad on, tapegrad's RNG state rewound, so
dropout draws the same masks) and hands each recorded Node the values its fresh twin saved.
Gradients are therefore the same bits as without checkpointing, closure parameters and
``autograd.grad`` work, and with ``create_graph=True`` the refilled values are re-attached
to the recorded Nodes, so higher-order gradients flow through the segment, bit for bit too.

Selective checkpointing (``context_fn=partial(create_selective_checkpoint_contexts,
["matmul"])``) keeps the outputs of the ops the policy names and replays them during the
recomputation instead of running those ops again: store matmul outputs, recompute the cheap
elementwise ops around them.
"""
import contextlib
import enum
import functools
import math
import threading
import weakref

from tapegrad.autograd.engine import add_watcher, remove_watcher
from tapegrad.autograd.grad_mode import state as grad_state
from tapegrad.random import get_rng_state, set_rng_state
from tapegrad.tensor import Tensor

class _Frames(threading.local):
    def __init__(self):
        self.stack = []  # this thread's segments being run, innermost last: only it watches ops


_frames = _Frames()


class _Frame:
    """One checkpointed segment: strips the Nodes its forward records, refills them on demand."""

    def __init__(self, fn, args, kwargs, rng_state, recompute_context):
        self.fn, self.args, self.kwargs, self.rng_state = fn, args, kwargs, rng_state
        self.recompute_context = recompute_context
        self.nodes = []  # weak references to the Nodes the forward recorded, in order
        self.fresh = None  # while recomputing: the Nodes the rerun records

    def before_op(self, op):
        pass

    def after_op(self, op, args, out):
        if _frames.stack[-1] is not self:
            return
        node = getattr(out, "grad_fn", None)
        if node is None or node.op is not op:
            return
        if self.fresh is not None:
            self.fresh.append(node)
            return
        self.nodes.append(weakref.ref(node))

    def strip(self):
        """The segment has returned: drop what its Nodes saved; backward will recompute it."""
        for ref in self.nodes:
            node = ref()
            if node is not None and node.saved is not None and (
                    node.op.save_inputs or node.op.save_out):
                node.saved = node.out = None  # versions and out_version stay: in-place checks
                node.recompute = self

    def before_backward(self, node):
        pass

    def after_backward(self, node, grads):
        pass

    def refill(self):
        """Rerun the segment and give every stripped Node what its twin saved."""
        create_graph = grad_state.enabled  # run_backward sets grad mode to create_graph
        fresh = self.fresh = []
        current = None
        if self.rng_state is not None:  # replay the forward's random draws (dropout masks)
            current = get_rng_state()
            set_rng_state(self.rng_state)
        prev = grad_state.enabled
        grad_state.enabled = True
        _frames.stack.append(self)
        add_watcher(self)
        try:
            with self.recompute_context:
                self.fn(*self.args, **self.kwargs)
        finally:
            remove_watcher(self)
            _frames.stack.pop()
            grad_state.enabled = prev
            self.fresh = None
            if current is not None:
                set_rng_state(current)  # the caller's stream continues where it was
        if len(fresh) != len(self.nodes) or any(
                r() is not None and r().op is not f.op for r, f in zip(self.nodes, fresh)):
            recorded = [r().op.name if r() is not None else "?" for r in self.nodes]
            raise RuntimeError(
                "checkpoint: the recomputation recorded different ops than the forward "
                f"({len(fresh)} ops {[f.op.name for f in fresh][:8]}... against {len(recorded)} "
                f"ops {recorded[:8]}...): the checkpointed function must be deterministic in "
                "the ops it runs and in which of its inputs require grad")
        # with create_graph, a refilled value made inside the segment is re-attached to the
        # recorded Node that made it, so the gradient's graph is the unchecked one, node for node
        recorded = {id(f): r() for r, f in zip(self.nodes, fresh)} if create_graph else None
        for ref, twin in zip(self.nodes, fresh):
            node = ref()
            if node is None or node.recompute is not self:
                continue
            node.recompute = None
            saved = twin.saved
            if twin.op.save_inputs:
                saved = [_reattach(a, recorded) if isinstance(a, Tensor) else a for a in saved]
            node.saved = saved
            node.out = twin.out
        # every Node has its values now: let go of the inputs and any replay cache
        self.fn = self.args = self.kwargs = self.recompute_context = None


def _reattach(a, recorded):
    if recorded is None:
        return a.detach()
    node = recorded.get(id(a.grad_fn)) if a.grad_fn is not None else None
    if node is None:
        return a  # an input of the segment (or made by a nested segment): as it is
    t = Tensor._make(a._data, grad_fn=node)
    t._version = a._version
    return t


def _noop_context_fn():
    return contextlib.nullcontext(), contextlib.nullcontext()


def checkpoint(function, *args, use_reentrant=None, context_fn=_noop_context_fn,
               preserve_rng_state=True, **kwargs):
    """As ``torch.utils.checkpoint.checkpoint``: run ``function(*args, **kwargs)`` keeping
    only its inputs; its activations are recomputed when backward needs them.

    Gradients are bitwise those of ``function(*args)`` without checkpointing. Both values of
    ``use_reentrant`` run the same tape-based implementation (it supports ``autograd.grad``,
    ``create_graph`` and closure parameters, which PyTorch's reentrant variant does not).
    ``context_fn`` returns two context managers, entered around the forward and around the
    recomputation (see ``create_selective_checkpoint_contexts``).

    >>> y = checkpoint(lambda h: (h @ w).relu(), x)
    """
    if not grad_state.enabled:
        return function(*args, **kwargs)
    rng_state = get_rng_state() if preserve_rng_state else None
    forward_context, recompute_context = context_fn()
    frame = _Frame(function, args, kwargs, rng_state, recompute_context)
    _frames.stack.append(frame)
    add_watcher(frame)
    try:
        with forward_context:
            out = function(*args, **kwargs)
    finally:
        remove_watcher(frame)
        _frames.stack.pop()
    frame.strip()
    return out


class CheckpointPolicy(enum.Enum):
    """As ``torch.utils.checkpoint.CheckpointPolicy``: what a selective policy decides for an
    op call (tapegrad has no CPU offload: the ``*_CPU_OFFLOAD`` values save)."""

    MUST_SAVE = 0
    PREFER_SAVE = 1
    MUST_RECOMPUTE = 2
    PREFER_RECOMPUTE = 3
    MUST_CPU_OFFLOAD = 4
    PREFER_CPU_OFFLOAD = 5


class SelectiveCheckpointContext:
    """What a policy function receives first (as PyTorch's; ``is_recompute`` is False: the
    policy is consulted in the forward only)."""

    def __init__(self):
        self.is_recompute = False


def _op_name(o):
    return o if isinstance(o, str) else getattr(o, "name", None)


class _OpCache:
    """Outputs of the op calls a policy chose to keep, by (op name, top-level call index)."""

    def __init__(self, policy):
        self.policy = policy
        self.saved = {}  # (name, k) -> output array
        self.depth = 0  # > 0 inside a wrapped op's forward: nested calls are not counted


@contextlib.contextmanager
def _wrap_forwards(ops, make_wrapper):
    originals = [(o, o.forward) for o in ops]
    counts = {}
    try:
        for o, forward in originals:
            o.forward = make_wrapper(o, forward, counts)
        yield
    finally:
        for o, forward in reversed(originals):
            o.forward = forward


class _SaveContext:
    def __init__(self, cache):
        self.cache = cache
        self._cm = None

    def __enter__(self):
        from tapegrad.ops.registry import REGISTRY

        cache = self.cache
        policy = cache.policy
        if callable(policy):
            ops = list(REGISTRY.values())
        else:
            names = {_op_name(o) for o in policy}
            unknown = names - set(REGISTRY)
            if unknown:
                raise ValueError(f"create_selective_checkpoint_contexts: unknown ops "
                                 f"{sorted(unknown)}")
            ops = [REGISTRY[n] for n in names]
        ctx = SelectiveCheckpointContext()

        def make_wrapper(o, forward, counts):
            def save(*arrays, **params):
                if cache.depth:
                    return forward(*arrays, **params)
                k = counts[o.name] = counts.get(o.name, -1) + 1
                cache.depth += 1
                try:
                    out = forward(*arrays, **params)
                finally:
                    cache.depth -= 1
                keep = (policy(ctx, o, *arrays, **params) in _SAVE) if callable(policy) \
                    else True
                if keep:
                    cache.saved[o.name, k] = out
                return out

            return save

        self._cm = _wrap_forwards(ops, make_wrapper)
        self._cm.__enter__()
        return self

    def __exit__(self, *exc):
        return self._cm.__exit__(*exc)


class _ReplayContext:
    def __init__(self, cache):
        self.cache = cache
        self._cm = None

    def __enter__(self):
        from tapegrad.ops.registry import REGISTRY

        cache = self.cache
        ops = [REGISTRY[n] for n in {name for name, _ in cache.saved}]

        def make_wrapper(o, forward, counts):
            def replay(*arrays, **params):
                if cache.depth:
                    return forward(*arrays, **params)
                k = counts[o.name] = counts.get(o.name, -1) + 1
                out = cache.saved.get((o.name, k))
                if out is not None:
                    return out
                cache.depth += 1
                try:
                    return forward(*arrays, **params)
                finally:
                    cache.depth -= 1

            return replay

        self._cm = _wrap_forwards(ops, make_wrapper)
        self._cm.__enter__()
        return self

    def __exit__(self, *exc):
        return self._cm.__exit__(*exc)


_SAVE = (CheckpointPolicy.MUST_SAVE, CheckpointPolicy.PREFER_SAVE,
         CheckpointPolicy.MUST_CPU_OFFLOAD, CheckpointPolicy.PREFER_CPU_OFFLOAD, True)


def create_selective_checkpoint_contexts(policy_fn_or_list, allow_cache_entry_mutation=False):
    """As ``torch.utils.checkpoint.create_selective_checkpoint_contexts``: the two contexts
    for ``checkpoint(..., context_fn=partial(create_selective_checkpoint_contexts, policy))``.

    ``policy_fn_or_list``: ops to keep (Op objects such as ``tapegrad.matmul`` or registered
    names such as ``"matmul"``), or ``policy(ctx, op, *arrays, **params)`` returning a
    ``CheckpointPolicy`` (or a bool: keep). Kept outputs are replayed in the recomputation
    instead of running their op again; everything else is recomputed.

    >>> ctx = functools.partial(create_selective_checkpoint_contexts, ["matmul"])
    >>> y = checkpoint(block, x, context_fn=ctx)
    """
    if not callable(policy_fn_or_list):
        policy_fn_or_list = list(policy_fn_or_list)
    cache = _OpCache(policy_fn_or_list)
    return _SaveContext(cache), _ReplayContext(cache)


def selective(ops=("matmul",)):
    """A ``context_fn`` keeping the outputs of ``ops`` (default: matmul)."""
    return functools.partial(create_selective_checkpoint_contexts, list(ops))


def _run_range(functions, start, end):
    def forward(x):
        for f in functions[start:end]:
            x = f(x)
        return x

    return forward


def checkpoint_sequential(functions, segments=None, input=None, use_reentrant=None,
                          preserve_rng_state=True):
    """As ``torch.utils.checkpoint.checkpoint_sequential``: split a chain of functions (a list
    or an ``nn.Sequential``) into ``segments`` pieces and checkpoint all but the last.

    ``segments`` defaults to round(sqrt(depth)), which minimises peak memory for a uniform
    chain; ``checkpoint_sequential(layers, x)`` and ``(layers, input=x)`` are accepted too.

    >>> y = checkpoint_sequential(model, 4, x)
    """
    if isinstance(segments, Tensor) and input is None:
        segments, input = None, segments
    if input is None:
        raise TypeError("checkpoint_sequential: missing the input tensor")
    if hasattr(functions, "children"):
        functions = list(functions.children())
    functions = list(functions)
    depth = len(functions)
    if segments is None:
        segments = max(1, round(math.sqrt(depth)))
    if not isinstance(segments, int) or segments < 1:
        raise ValueError(f"checkpoint_sequential: segments must be a positive int, got "
                         f"{segments!r}")
    if depth == 0:
        return input
    size = max(1, depth // segments)
    start = 0
    for _ in range(segments - 1):
        if start + size >= depth:
            break
        input = checkpoint(_run_range(functions, start, start + size), input,
                           use_reentrant=use_reentrant, preserve_rng_state=preserve_rng_state)
        start += size
    return _run_range(functions, start, depth)(input)


__all__ = ["checkpoint", "checkpoint_sequential", "create_selective_checkpoint_contexts",
           "CheckpointPolicy", "SelectiveCheckpointContext", "selective"]
