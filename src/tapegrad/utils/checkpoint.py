"""Gradient checkpointing: keep a segment's inputs, recompute its activations in backward.

    y = checkpoint(block, x)                  # as torch.utils.checkpoint.checkpoint
    y = checkpoint_sequential(layers, 4, x)   # as torch.utils.checkpoint.checkpoint_sequential

How it sits on the tape: the segment runs once, recorded as usual, so its Nodes are the very
Nodes an unchecked run records (same ops, same parents, same order of gradient sums). As
each op of the segment is recorded, the segment's *frame* (an op watcher) drops what the
Node saved for backward and marks the Node ``recompute = frame``; the activations are freed
as soon as the segment moves on. When backward first unpacks one of those Nodes, the frame
reruns the segment from its stored inputs (grad on, tapegrad's RNG state rewound, so
dropout draws the same masks) and hands each recorded Node the values its fresh twin saved.
Gradients are therefore the same bits as without checkpointing, closure parameters and
``autograd.grad`` work, and with ``create_graph=True`` the refilled values carry the
recomputed graph, so higher-order gradients flow through the segment.
"""
import math
import weakref

from tapegrad.autograd.engine import WATCH
from tapegrad.autograd.grad_mode import state as grad_state
from tapegrad.tensor import Tensor

_frames = []  # the segments being run, innermost last: only the innermost watches ops


def _rng():
    """tapegrad's (get_rng_state, set_rng_state), or None while the package has no RNG."""
    import tapegrad.random as random

    get = getattr(random, "get_rng_state", None)
    put = getattr(random, "set_rng_state", None)
    return (get, put) if get is not None and put is not None else None


class _Frame:
    """One checkpointed segment: strips the Nodes its forward records, refills them on demand."""

    def __init__(self, fn, args, kwargs, rng_state):
        self.fn, self.args, self.kwargs, self.rng_state = fn, args, kwargs, rng_state
        self.nodes = []  # weak references to the Nodes the forward recorded, in order
        self.fresh = None  # while recomputing: the Nodes the rerun records

    def before_op(self, op):
        pass

    def after_op(self, op, args, out):
        if _frames[-1] is not self:
            return
        node = getattr(out, "grad_fn", None)
        if node is None or node.op is not op:
            return
        if self.fresh is not None:
            self.fresh.append(node)
            return
        self.nodes.append(weakref.ref(node))
        if op.save_inputs or op.save_out:
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
        rng = _rng() if self.rng_state is not None else None
        current = rng[0]() if rng is not None else None
        if rng is not None:
            rng[1](self.rng_state)
        prev = grad_state.enabled
        grad_state.enabled = True
        _frames.append(self)
        WATCH.append(self)
        try:
            self.fn(*self.args, **self.kwargs)
        finally:
            WATCH.remove(self)
            _frames.pop()
            grad_state.enabled = prev
            self.fresh = None
            if rng is not None:
                rng[1](current)
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


def _reattach(a, recorded):
    if recorded is None:
        return a.detach()
    node = recorded.get(id(a.grad_fn)) if a.grad_fn is not None else None
    if node is None:
        return a  # an input of the segment (or made by a nested segment): as it is
    t = Tensor._make(a._data, grad_fn=node)
    t._version = a._version
    return t


def checkpoint(function, *args, use_reentrant=None, preserve_rng_state=True, **kwargs):
    """As ``torch.utils.checkpoint.checkpoint``: run ``function(*args, **kwargs)`` keeping
    only its inputs; its activations are recomputed when backward needs them.

    Gradients are bitwise those of ``function(*args)`` without checkpointing. Both values of
    ``use_reentrant`` run the same tape-based implementation (it supports ``autograd.grad``,
    ``create_graph`` and closure parameters, which PyTorch's reentrant variant does not).

    >>> y = checkpoint(lambda h: (h @ w).relu(), x)
    """
    if not grad_state.enabled:
        return function(*args, **kwargs)
    rng_state = None
    if preserve_rng_state:
        rng = _rng()
        rng_state = rng[0]() if rng is not None else None
    frame = _Frame(function, args, kwargs, rng_state)
    _frames.append(frame)
    WATCH.append(frame)
    try:
        return function(*args, **kwargs)
    finally:
        WATCH.remove(frame)
        _frames.pop()


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


__all__ = ["checkpoint", "checkpoint_sequential"]
