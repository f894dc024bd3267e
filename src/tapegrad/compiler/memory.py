"""Memory planning: liveness, buffer reuse, in-place updates and preallocated outputs.

``plan(graph)`` decides where each kernel writes (codegen.py emits the calls):

- **aliases**: an op not known to return a fresh array (a view such as ``permute``, a vjp
  rule that may hand back its input) is taken to alias every input, so a value's *roots*
  are the fresh arrays it may share memory with.
- **escaping** roots reach an output, a write-back, or an effect node: their arrays leave
  the call and must be fresh each time.
- **liveness**: a root's last use is the last node that reads any value aliasing it.
- **in-place**: a fused kernel whose result is written back into a tensor's array (the SGD
  update ``p - lr * g``) and which reads that tensor's value for the last time writes
  straight into it (``out=p``), so the write-back is no copy.
- **slots**: the other non-escaping results of fused kernels and small matmuls get
  preallocated buffers kept across calls (``out=``); a slot is reused by a later value of
  the same shape and dtype once every value aliasing its occupant is dead.
- **owned**: an escaping value made fresh by this call (a fresh op's, or a kernel node's in
  ``FRESH_KERNELS``: the clipped gradients) and stored once becomes a ``.grad`` without a
  copy.
- **recycled**: a kernel's result returned to the caller reuses the array it returned last
  time when nothing holds that array any more (its reference count says so: the caller
  dropped the tensor and every view of it), saving a fresh allocation's page faults (a
  4 MB result costs ~110 us of them here), as PyTorch's caching allocator does.

A planned function is not reentrant (its slots are shared by calls): calling it again from
inside itself or from two threads at once needs a second compiled function.
"""
import os

from tapegrad.compiler.ir import Value

RECYCLE = os.environ.get("TAPEGRAD_COMPILE_RECYCLE", "1") != "0"  # 0: measure without it

# ops whose result is a new array that shares memory with no input; so is any op whose
# forward is one numpy ufunc call (its lowering's ``ufunc``: ``fresh``)
FRESH = frozenset({
    "fused", "matmul", "linear", "sum", "mean", "cross_entropy_index", "softmax",
    "log_softmax", "full", "ce_fused"})
# nodes with their own numpy body and kernel whose outputs are new arrays either way (both
# ``nn.utils._clip_arrays`` and kernels_optim's clip kernels return fresh clipped gradients;
# the fused clip + optimizer step's other outputs, its parameters, are never stored as a
# ``.grad``): stored once as a ``.grad``, such an output needs no copy
FRESH_KERNELS = {"clip_grad_norm", "clip_grad_norm_optimizer_step"}
SMALL_MATMUL = 4 * 65536  # backend.blas: products up to this size call numpy's matmul directly


class Plan:
    def __init__(self):
        self.out = {}  # id(Value) -> ("inplace", input Value) | ("slot", k)
        self.slots = []  # (shape, dtype) per slot
        self.owned = set()  # id(Value): fresh this call, stored once -> no copy on write-back
        self.recycled = []  # (shape, dtype) of returned results whose last array is reused


def is_fresh(n):
    """Whether op node ``n`` returns a new array sharing memory with no input: its name is in
    ``FRESH``, or its forward is one numpy ufunc call (its lowering's ``ufunc``)."""
    if n.impl is not None:
        return False
    if n.name in FRESH:
        return True
    low = n.op.lowering if n.op is not None else None
    return low is not None and low.ufunc is not None


def small_matmul(n):
    if n.name != "matmul" or len(n.inputs) != 2:
        return False
    a, b = n.inputs
    return (isinstance(a, Value) and isinstance(b, Value) and a.dtype == b.dtype
            and a.dtype.kind == "f" and len(a.shape) == 2 and len(b.shape) == 2
            and a.shape[0] * a.shape[1] * b.shape[1] <= SMALL_MATMUL)


def plan(graph):
    """The buffer plan of ``graph`` (see the module docstring)."""
    p = Plan()
    roots = {}  # id(Value) -> frozenset of root ids
    for v, _ in graph.inputs:
        roots[id(v)] = frozenset([id(v)])
    for v in graph.consts:
        roots[id(v)] = frozenset([id(v)])
    for n in graph.nodes:
        if is_fresh(n) or n.name in ("fused", "full",
                                                             "cross_entropy_fused"):
            for v in n.outputs:
                roots[id(v)] = frozenset([id(v)])
        else:
            r = frozenset().union(*[roots.get(id(a), frozenset()) for a in n.values_in()])
            for v in n.outputs:
                roots[id(v)] = r | {id(v)}
    escaping = set()
    stored = {}
    for v in [v for v in graph.outputs if isinstance(v, Value)] + \
            [v for _, _, _, v in graph.writes if v is not None]:
        escaping |= roots[id(v)]
        stored[id(v)] = stored.get(id(v), 0) + 1
    for n in graph.nodes:
        if n.effect:
            for a in n.values_in():
                escaping |= roots[id(a)]
    last = {}
    for i, n in enumerate(graph.nodes):
        for a in n.values_in():
            for r in roots[id(a)]:
                last[r] = i
    written = {id(v): t for kind, t, _, v in graph.writes if kind == "data" and v is not None}
    input_of = {id(t): v for v, src in graph.inputs if src.kind == "ref" for t in [src.ref]}
    free = {}  # (shape, dtype) -> [slot]
    busy = []  # (last use, slot key, slot)
    for i, n in enumerate(graph.nodes):
        for item in [b for b in busy if b[0] < i]:
            busy.remove(item)
            free.setdefault(item[1], []).append(item[2])
        if n.name == "fused" and len(n.outputs) >= 1:
            v = n.outputs[0]
            t = written.get(id(v))
            pv = input_of.get(id(t)) if t is not None else None
            if pv is not None and any(a is pv for a in n.inputs) and pv.shape == v.shape \
                    and pv.dtype == v.dtype and last.get(id(pv)) == i \
                    and not any(id(pv) in roots[id(o)] for o in graph.outputs
                                if isinstance(o, Value)) and \
                    sum(1 for _, _, _, w in graph.writes if w is v) == 1:
                p.out[id(v)] = ("inplace", pv)
                continue
        if n.name == "fused" or small_matmul(n):
            v = n.outputs[0]
            if id(v) in escaping or not v.shape:
                continue
            key = (v.shape, v.dtype.str)
            if free.get(key):
                k = free[key].pop()
            else:
                k = len(p.slots)
                p.slots.append((v.shape, v.dtype))
            p.out[id(v)] = ("slot", k)
            busy.append((last.get(id(v), i), key, k))
    outputs = [v for v in graph.outputs if isinstance(v, Value)]
    for n in graph.nodes:
        v = n.outputs[0] if n.name == "fused" and n.outputs else None
        if RECYCLE and v is not None and id(v) not in p.out and outputs.count(v) == 1 and \
                stored.get(id(v)) == 1 and v.shape and roots[id(v)] == {id(v)}:
            p.out[id(v)] = ("recycle", len(p.recycled))
            p.recycled.append((v.shape, v.dtype))
    for n in graph.nodes:
        fresh = n.name in ("fused", "full", "cross_entropy_fused") or is_fresh(n) or \
            n.name in FRESH_KERNELS
        for v in n.outputs:
            if fresh and stored.get(id(v)) == 1 and id(v) not in p.out:
                p.owned.add(id(v))
    return p
