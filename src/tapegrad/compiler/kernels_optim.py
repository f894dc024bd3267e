"""Hand-written numba kernels of a training step's optimizer and gradient clipping
(op_kernels.py), and the graph pass that joins the two.

* ``optimizer_step`` of Adam/AdamW (not AMSGrad, capturable or differentiable): numba calls
  over chunks of 8 parameters (each element read and written once instead of eager's dozen
  numpy passes), the parameters, state and groups checked into a plan (``_AdamPlan``) kept
  while they stay the same objects. The plan holds the parameters' and state's arrays and
  passes them by address (a table: numba unboxes an array object ~0.1 us, 4 per parameter
  each call otherwise); the gradients go as tuples of flat views.
* ``clip_grad_norm`` (2-norm): numba calls over chunks of 8 gradients: their norms, the total
  and coefficient, the scaled copies, without eager's wrappers and copies.
* ``clip_grad_norm_optimizer_step``: the pass ``fuse_clip_optimizer_step`` (run from
  passes.PASSES) makes one node of a ``clip_grad_norm`` and the Adam/AdamW ``optimizer_step``
  that reads its clipped gradients. Its kernel computes the norms and the coefficient, then
  scales each gradient inside the Adam pass, writing the clipped gradient (for ``.grad``) as
  it goes: the clip's own scaling pass goes, and each gradient is read twice instead of four
  times. Its numpy body runs the two nodes' own bodies (eager's code).

The norms are numpy's pairwise sum of the squares (eager's ``(a * a).sum()``) without an array
of squares: numpy's recursion for a given length (halves, the left one a multiple of 8,
blocks of at most 128 summed with 8 accumulators) is the same each call, so its leaves and
additions are precomputed per gradient size as a postfix program (``_program``) that one
loop walks (numba's cache cannot load recursive functions); a block's 8 accumulators are the
lanes of 256-bit vectors (``kernels.LANES``' ``prod_block8`` of a with itself: numba's LLVM vectorises no
chain of scalar sums, and lane by lane the operations are the scalar code's).

Every kernel is bitwise eager's, float32 and float64: the same IEEE operations in the same
order (Python-float hyperparameters rounded once to the parameter's dtype, as numpy's weak
scalars are). A kernel taking a tuple of arrays compiles once per tuple length and LLVM's
time grows with it (a 28-tuple, the char GPT's: 5.5 s for the Adam kernel and 4.3 s for the
clip; 8: ~1 s), while numba's call costs the same per array: hence chunks of ``CHUNK``.
"""
import operator
from itertools import chain

import numpy as np

from tapegrad.compiler import kernels, op_kernels, passes
from tapegrad.compiler.ir import Value

_FLOATS = kernels.FLOATS
_data_of = operator.attrgetter("_data")
_size_of = operator.attrgetter("size")
CHUNK = 8
FUSED = "clip_grad_norm_optimizer_step"


def _program(n):
    """numpy's pairwise summation of ``n`` elements as postfix tokens: a leaf's length (a
    block of at most 128 consecutive elements, in order), or -1 (add the last two sums)."""
    out, todo = [], [n]
    while todo:
        m = todo.pop()
        if m < 0:
            out.append(-1)
        elif m <= 128:
            out.append(m)
        else:
            m2 = m // 2
            m2 -= m2 % 8
            todo += [-1, m - m2, m2]  # the left half first, then the right, then the join
    return out


def _address(a):
    """The address of a (C-contiguous) array's first element."""
    return a.__array_interface__["data"][0]


def _programs(sizes):
    """One int64 array of the programs of ``sizes`` and where each starts (len + 1)."""
    progs = [_program(int(s)) for s in sizes]
    starts = np.cumsum([0] + [len(p) for p in progs]).astype(np.int64)
    return np.array(list(chain.from_iterable(progs)), np.int64), starts


_K = {}


def _kernels():
    """The numba functions, compiled (or loaded from numba's cache) on first use."""
    if not _K:
        import sys

        mod = sys.modules[kernels.load("adam_params", SOURCE).py_func.__module__]
        for name in ("adam_params", "step_count", "clip_norms", "clip_coef", "clip_scale"):
            _K[name] = getattr(mod, name)
    return _K


SOURCE = '''import numpy as np
from numba import carray, njit, types
from numba.core import cgutils
from numba.extending import intrinsic
from llvmlite import ir


''' + kernels.LANES + '''

@njit(error_model="numpy", cache=True)
def sumsq(a, prog, lo, hi, vals):
    """np.add.reduce(a * a) of a flat C-contiguous array: the postfix program prog[lo:hi] of
    its length (a leaf: the next block's sum; -1: the last two sums added); vals: a stack.
    A block of 8 or more: 8 accumulators (prod_block8 of a with a), then its remainder; every block
    starts at a multiple of 8 (each split's left part is one)."""
    zero = a.dtype.type(0)
    row = 0
    nv = 0
    for j in range(lo, hi):
        t = prog[j]
        if t < 0:
            vals[nv - 2] = vals[nv - 2] + vals[nv - 1]
            nv -= 1
            continue
        if t < 8:
            res = zero
            for i in range(row * 8, row * 8 + t):
                res += a[i] * a[i]
        else:
            nb = t // 8
            res = prod_block8(a, a, row * 8, nb * 8)
            for i in range((row + nb) * 8, row * 8 + t):
                res += a[i] * a[i]
        vals[nv] = res
        row += t // 8
        nv += 1
    return vals[0]


@njit(error_model="numpy", cache=True)
def adam_update(p, g, m, v, c, flags, out, coef, scale, inplace):
    """One Adam/AdamW step over flat (C-contiguous) param, grad and moments, in eager's
    order of operations (optim/adam.py): each element read and written once. ``c``: the
    hyperparameters in the param's dtype (one array: numba's dispatch is per argument).
    ``scale``: the gradient is first multiplied by coef (clip_grad_norm_'s ``g *= coef``)
    and that clipped gradient written to ``out`` (``inplace``: back into g, as eager's
    in-place clip; a flag, not out aliasing g, so LLVM's alias checks still vectorise)."""
    decay, wd, w1, one_m_w1, beta2, w2, bc2s, eps, neg_step = \\
        c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7], c[8]
    w1_low, maximize, decay_mode = flags[0] != 0, flags[1] != 0, flags[2]
    for i in range(p.shape[0]):
        gi = g[i]
        if scale:
            gi = gi * coef
            if inplace:
                g[i] = gi
            else:
                out[i] = gi
        if maximize:
            gi = -gi
        pi = p[i]
        if decay_mode == 1:  # AdamW's decoupled decay
            pi = pi * decay
        elif decay_mode == 2:  # Adam's, into the gradient
            gi = gi + wd * pi
        mi = m[i]
        if w1_low:  # lerp_, PyTorch's two-sided formula
            mi = mi + w1 * (gi - mi)
        else:
            mi = gi - (gi - mi) * one_m_w1
        vi = v[i] * beta2
        vi = vi + (gi * w2) * gi
        d = np.sqrt(vi) / bc2s + eps
        p[i] = pi + (mi * neg_step) / d
        m[i] = mi
        v[i] = vi


@intrinsic
def address_as(typingctx, like, addr):
    """A pointer to like's dtype at the integer address addr."""
    if not isinstance(like, types.Array) or not isinstance(addr, types.Integer):
        return None
    ptr = types.CPointer(like.dtype)

    def codegen(context, builder, signature, args):
        return builder.inttoptr(args[1], context.get_value_type(ptr))

    return ptr(like, addr), codegen


@njit(error_model="numpy", cache=True)
def adam_params(k, at, table, gs, outs, rows, c, flags, coef, scale, inpl, like, slike):
    """One Adam/AdamW step of parameters at .. at + k - 1 (the first k of a chunk: tuples
    of CHUNK flat C-contiguous gradients, padded; sizes checked by the caller). table[j]:
    parameter j's array, exp_avg, exp_avg_sq and 0-d step addresses and its size (arrays
    of like's dtype, C-contiguous, kept alive and checked by the caller's plan; the step
    of slike's dtype): each step += 1 in its own dtype (eager's ``step_t += 1``), then
    adam_update with the constants of the parameter's group and new step, c[rows[j]],
    flags[rows[j]] (``scale``: each gradient times coef[()] first, written to outs[i], or
    back into it where inpl[j])."""
    for i in range(k):
        s = carray(address_as(slike, table[at + i, 3]), 1)
        s[0] = s[0] + s.dtype.type(1)
    f = coef[()]
    for i in range(k):
        j = at + i
        n = table[j, 4]
        r = rows[j]
        adam_update(carray(address_as(like, table[j, 0]), n), gs[i],
                    carray(address_as(like, table[j, 1]), n),
                    carray(address_as(like, table[j, 2]), n), c[r], flags[r], outs[i], f,
                    scale, inpl[j] != 0)


@njit(error_model="numpy", cache=True)
def step_count(table, slike):
    """The parameters' common step count (table[j, 3]: 0-d steps of slike's dtype) as a
    float64, NaN where they differ (or one is NaN)."""
    s0 = carray(address_as(slike, table[0, 3]), 1)[0]
    for j in range(1, table.shape[0]):
        if carray(address_as(slike, table[j, 3]), 1)[0] != s0:
            return np.nan
    return np.float64(s0)


@njit(error_model="numpy", cache=True)
def clip_norms(k, gs, prog, starts, sizes, at, norms, vals):
    """norms[at + i] = the 2-norm of the first k gradients of a chunk (flat C-contiguous,
    padded): the square root of numpy's pairwise sum of its squares, as eager's
    ``sqrt((a * a).sum())``; gradient j's program: prog[starts[j]:starts[j + 1]], made for
    sizes[j] elements. Returns False (nothing summed) where a gradient has another size."""
    for i in range(k):
        if gs[i].shape[0] != sizes[at + i]:
            return False
    for i in range(k):
        j = at + i
        norms[j] = np.sqrt(sumsq(gs[i], prog, starts[j], starts[j + 1], vals))
    return True


@njit(error_model="numpy", cache=True)
def clip_coef(norms, prog, max_norm, tiny, total, coef, vals):
    """total[()] = the 2-norm of the norms (as eager's norm of their stack; prog: the
    program of their count); coef[()] = min(max_norm / (total + tiny), 1) (numpy's
    minimum: NaN wins)."""
    t = np.sqrt(sumsq(norms, prog, 0, prog.shape[0], vals))
    total[()] = t
    c = max_norm / (t + tiny)
    one = norms.dtype.type(1)
    if not (c <= one or c != c):
        c = one
    coef[()] = c


@njit(error_model="numpy", cache=True)
def clip_scale(k, gs, outs, coef):
    """outs[i] = gs[i] * coef for the first k gradients of a chunk."""
    c = coef[()]
    for i in range(k):
        g = gs[i]
        o = outs[i]
        for j in range(g.shape[0]):
            o[j] = g[j] * c
'''


# --- Adam/AdamW ------------------------------------------------------------------------------
def _adam_optimizer(node):
    """The node's Adam/AdamW optimizer and its parameter count, or (None, 0) where the
    kernel does not serve it (another optimizer, parameters and gradients of other dtypes
    or shapes)."""
    from tapegrad.optim.adam import Adam
    from tapegrad.optim.adamw import AdamW

    opt = (node.meta or {}).get("optimizer") if isinstance(node.meta, dict) else None
    if type(opt) not in (Adam, AdamW) or node.impl is None or len(node.inputs) % 2:
        return None, 0
    n = len(node.inputs) // 2
    for a, gv in zip(node.inputs[:n], node.inputs[n:]):
        if not isinstance(a, Value) or not isinstance(gv, Value) or \
                np.dtype(a.dtype) not in _FLOATS or gv.dtype != a.dtype or gv.shape != a.shape:
            return None, 0
    return opt, n


def _constants(group, step):
    """Parameter-dtype constants and flags of ``adam_update`` for one group and step:
    eager's Python-float arithmetic (optim/adam.py), rounded once to the dtype as numpy's
    weak scalars are."""
    beta1, beta2 = group["betas"]
    lr, wd = group["lr"], group["weight_decay"]
    step_size = lr / (1 - beta1 ** step)
    bc2s = (1 - beta2 ** step) ** 0.5
    w1 = 1 - beta1
    mode = 0 if wd == 0 else 1 if group.get("decoupled_weight_decay") else 2
    return ([1 - lr * wd, wd, w1, 1 - w1, beta2, 1 - beta2, bc2s, group["eps"], -step_size],
            [abs(w1) < 0.5, group["maximize"], mode])


class _AdamPlan:
    """A call's parameters, state and groups, checked once (the kernel's conditions) and
    kept while they stay the same objects; the parameters in buckets of one dtype
    (parameter's, step's), each one numba call per chunk: the parameters' and state's
    arrays by address (a table built here: numba unboxes no array object for them; the
    plan holds the arrays, valid() checks they are still the ones), the gradients as
    tuples of flat views."""

    def __init__(self, opt, arrays):
        self.opt = opt
        owner = {id(p._data): (p, gi) for gi, g in enumerate(opt.param_groups)
                 for p in g["params"]}
        self.ok = False
        entries, members = [], {}
        for i, a in enumerate(arrays):
            hit = owner.get(id(a))
            if hit is None or hit[0]._data is not a:
                return
            p, gi = hit
            st = opt.state.get(p)
            if not st or set(st) != {"step", "exp_avg", "exp_avg_sq"}:
                return
            m, v, s = st["exp_avg"]._data, st["exp_avg_sq"]._data, st["step"]._data
            if a.dtype not in _FLOATS or not all(
                    x.dtype == a.dtype and x.flags.c_contiguous and x.shape == a.shape
                    for x in (a, m, v)) or s.shape != () or s.dtype not in _FLOATS:
                return
            entries.append((st, m, v, s))
            members.setdefault((a.dtype, s.dtype), []).append((i, gi, p))
        self.arrays, self.groups = tuple(arrays), list(opt.param_groups)
        # what valid() compares by identity, in C loops: the arrays of every state entry's
        # tensors, in the state's order (an entry, a tensor or its array replaced, or an
        # entry added, changes them; what the kernel updates is these arrays)
        try:
            self.datas = self._datas()
        except AttributeError:  # (a state value without an array: not Adam's state)
            return
        self.params = [p for ms in members.values() for _, _, p in ms]
        self.sizes = [a.size for a in arrays]
        self.buckets = []
        for (dt, sdt), ms in members.items():
            idx = [i for i, _, _ in ms]
            used = sorted({gi for _, gi, _ in ms})  # its groups: a row of constants each
            local = [used.index(gi) for _, gi, _ in ms]
            pad = np.empty(0, dt)
            table = np.array([[_address(arrays[i])] + [_address(x) for x in entries[i][1:]]
                              + [arrays[i].size] for i in idx], np.int64).reshape(-1, 5)
            steps = [entries[i][3] for i in idx]
            spans = [(at, min(CHUNK, len(idx) - at)) for at in range(0, len(idx), CHUNK)]
            self.buckets.append((dt, sdt, idx, pad, table, spans, steps,
                                 [self.groups[gi] for gi in used], local,
                                 np.array(local, np.int64), np.empty(0, sdt)))
        self.whole = len(self.buckets) == 1  # one bucket, the call's order
        self.noinplace = {len(b[2]): np.zeros(len(b[2]), np.int8) for b in self.buckets}
        self.ok = True

    def _datas(self):
        return list(map(_data_of, chain.from_iterable(map(dict.values,
                                                           self.opt.state.values()))))

    def valid(self, arrays):
        """The same parameter arrays, groups (options the kernel serves) and state arrays
        (no Tensor hashing: one pass over the state's values, ~100 objects a char-GPT
        step, each touched once)."""
        if not self.ok or not all(map(operator.is_, arrays, self.arrays)):
            return False
        groups = self.opt.param_groups
        if len(groups) != len(self.groups) or not all(
                map(operator.is_, groups, self.groups)) or any(
                g["amsgrad"] or g.get("capturable") or g.get("differentiable")
                for g in groups):
            return False
        try:
            now = self._datas()
        except AttributeError:
            return False
        return len(now) == len(self.datas) and all(map(operator.is_, now, self.datas))

    def step(self, grads, outs=None, coef=None, inplace=None):
        """The Adam/AdamW step with these flat gradients (in the call's parameter order);
        ``outs`` (flat, the same order) and a 0-d ``coef``: each gradient times coef
        first, written to its out (``inplace``, int8 per parameter in the call's order: 1
        where the out is the gradient itself, written back into it)."""
        update, count = _kernels()["adam_params"], _kernels()["step_count"]
        scale = outs is not None
        for dt, sdt, idx, pad, addrs, spans, steps, groups, local, rows, slike in \
                self.buckets:
            inpl = self.noinplace[len(idx)] if inplace is None else \
                inplace if self.whole else inplace[idx]
            gs = grads if self.whole else [grads[i] for i in idx]
            os_ = (outs if self.whole else [outs[i] for i in idx]) if scale else gs
            # the counts after eager's ``step_t += 1`` (in the step's dtype): the kernel
            # makes the same increment
            first = count(addrs, slike)
            if first == first:  # one step count (the usual case)
                table = [_constants(g, float(sdt.type(first + 1.0))) for g in groups]
            else:
                old = list(map(float, steps))
                keys = {}
                rows = np.array([keys.setdefault((gi, s), len(keys))
                                 for gi, s in zip(local, old)], np.int64)
                table = [_constants(groups[gi], float(sdt.type(s + 1.0))) for gi, s in keys]
            c = np.array([t[0] for t in table], dt)
            flags = np.array([t[1] for t in table], np.int8)
            f = coef if scale else np.ones((), dt)
            for at, k in spans:
                g8 = tuple(gs[at:at + CHUNK]) + (pad,) * (CHUNK - k)
                o8 = tuple(os_[at:at + CHUNK]) + (pad,) * (CHUNK - k) if scale else g8
                update(k, at, addrs, g8, o8, rows, c, flags, f, scale, inpl, pad, slike)
        for p in self.params:
            p._version[0] += 1


@op_kernels.register("optimizer_step")
def adam_factory(node):
    """Adam/AdamW (not AMSGrad, capturable or differentiable) as numba calls over chunks
    of parameters (a loop each) instead of eager's dozen numpy passes: bitwise eager's (the
    same IEEE operations, Python-float hyperparameters rounded to the parameter's dtype as
    numpy does). A call whose parameters, state or options the kernel does not serve (a
    parameter without state yet, a non-contiguous array, another dtype) runs the node's own
    step."""
    opt, n = _adam_optimizer(node)
    if opt is None:
        return None
    _kernels()
    impl = node.impl
    plan = [None]

    def optimizer_step_kernel(*arrays, optimizer=None):
        pl = plan[0]
        if pl is None or not pl.valid(arrays[:n]):
            pl = plan[0] = _AdamPlan(opt, arrays[:n])
            if not pl.valid(arrays[:n]):
                return impl(*arrays, optimizer=optimizer)
        grads = arrays[n:]
        if not all(map(operator.eq, map(_size_of, grads), pl.sizes)):
            return impl(*arrays, optimizer=optimizer)  # (eager's error)
        # (ravel: a flat view, or a C-order copy of a strided gradient)
        pl.step([g.ravel() for g in grads])
        return pl.arrays

    return optimizer_step_kernel


# --- clip_grad_norm_ ---------------------------------------------------------------------
class _Clip:
    """clip_grad_norm_'s kernel parts for gradients of these Values (2-norm, no error on a
    non-finite norm, one float dtype), or ``ok`` False."""

    def __init__(self, node):
        p = node.params
        grads = node.inputs
        self.ok = False
        if p.get("norm_type") != 2.0 or p.get("error_if_nonfinite") or not grads or \
                not all(isinstance(g, Value) for g in grads):
            return
        dts = {np.dtype(g.dtype) for g in grads}
        dt = dts.pop() if len(dts) == 1 else None
        if dt is None or dt not in _FLOATS:  # (np.dtype(None) is float64: == None holds)
            return
        self.dt, self.tiny = dt, dt.type(1e-6)
        self.shapes = [tuple(g.shape) for g in grads]
        self.sizes = np.array([int(np.prod(s, dtype=np.int64)) for s in self.shapes],
                              np.int64)
        self.prog, self.starts = _programs(self.sizes)
        self.nprog = np.array(_program(len(grads)), np.int64)
        self.pad = np.empty(0, dt)
        self.spans = [(at, min(CHUNK, len(grads) - at)) for at in range(0, len(grads), CHUNK)]
        self.vals = np.empty(64, dt)  # the pairwise sums' stack (depth <= log2(size) + 2)
        self.ok = True

    def chunk(self, arrays, at, k):
        return tuple(arrays[at:at + k]) + (self.pad,) * (CHUNK - k)

    def coefficient(self, flat, max_norm):
        """(total, coef) as 0-d arrays: each flat gradient's norm, their norm, the clip
        coefficient; None where a gradient does not have its traced size."""
        K = _kernels()
        norms_of = K["clip_norms"]
        dt, vals, prog, starts, sizes = self.dt, self.vals, self.prog, self.starts, self.sizes
        if len(flat) != len(sizes):
            return None
        norms = np.empty(len(flat), dt)
        for at, k in self.spans:
            if not norms_of(k, self.chunk(flat, at, k), prog, starts, sizes, at, norms, vals):
                return None
        total, coef = np.empty((), dt), np.empty((), dt)
        K["clip_coef"](norms, self.nprog, dt.type(max_norm), self.tiny, total, coef, vals)
        return total, coef


@op_kernels.register("clip_grad_norm")
def clip_grad_norm_factory(node):
    """clip_grad_norm_ (2-norm, no error on a non-finite norm) over gradients of one float
    dtype as numba calls over chunks, without eager's Tensor wrappers, copies and abs:
    each gradient's sum of squares (numpy's pairwise sum of the raveled squares, as
    eager's), the total, the coefficient and one multiply per gradient: bitwise eager's."""
    from tapegrad.nn.utils import _clip_arrays as eager

    cl = _Clip(node)
    if not cl.ok:
        return None
    scale = _kernels()["clip_scale"]
    dt, shapes, spans, chunk = cl.dt, cl.shapes, cl.spans, cl.chunk

    def clip_grad_norm_kernel(*grads, max_norm, norm_type, error_if_nonfinite):
        # numba calls over chunks of flat C-contiguous views (ravel copies a strided
        # gradient in C order, the order eager's ravel sums in): the norms, the total and
        # coefficient, the scaled copies
        flat = [g.ravel() for g in grads]
        got = cl.coefficient(flat, max_norm)
        if got is None:  # (not the traced sizes: eager's code, and its error)
            return eager(*grads, max_norm=max_norm, norm_type=norm_type,
                         error_if_nonfinite=error_if_nonfinite)
        total, coef = got
        outs = [np.empty(s, dt) for s in shapes]
        oflat = [o.ravel() for o in outs]
        for at, k in spans:
            scale(k, chunk(flat, at, k), chunk(oflat, at, k), coef)
        return (total, *outs)

    return clip_grad_norm_kernel


# --- clip_grad_norm_ and the Adam/AdamW step that reads its clipped gradients: one node ----
def _fused_parts(clip, step, perm):
    """The fused node's numpy body and its value-check view (passes._observed): the clip's
    own body, then the step's on the clipped gradients (eager's code, in eager's order)."""
    from tapegrad.compiler.ir import call_node

    nc = len(clip.inputs)

    def run_clip(arrays):
        return call_node(clip, arrays[:nc])

    def clip_grad_norm_optimizer_step(*arrays, optimizer=None, **clip_params):
        clipped = run_clip(arrays)
        done = call_node(step, list(arrays[nc:]) + [clipped[1 + j] for j in perm])
        return tuple(clipped) + tuple(done)

    def observe(args):
        """(outputs, arrays the step consumes) without running the step: the clip's
        results, then the parameters as they are (as passes._observed treats effects)."""
        clipped = run_clip(args)
        params = list(args[nc:])
        consumed = params + [clipped[1 + j] for j in perm]
        return list(clipped) + [np.array(a) for a in params], consumed

    clip_grad_norm_optimizer_step.__name__ = FUSED
    return clip_grad_norm_optimizer_step, observe


def fuse_clip_optimizer_step(graph):
    """A graph pass: a ``clip_grad_norm`` whose clipped gradients are the gradients an
    Adam/AdamW ``optimizer_step`` reads becomes, with that step, one effect node
    ``clip_grad_norm_optimizer_step`` at the step's place (inputs: the clip's gradients,
    then the step's parameters; outputs: the clip's, then the step's), where nothing in
    between reads the clipped gradients or has an effect. Its kernel scales each gradient
    inside the Adam pass; its numpy body runs the two nodes' bodies. ``meta["inplace"]``:
    the gradients the kernel may clip in place, as eager's ``g *= coef`` does (a new array
    of a fresh op, memory.FRESH, that only the clip reads: nothing else sees it)."""
    from tapegrad.compiler import memory
    from tapegrad.compiler.ir import Node

    producer = {id(v): (n, i) for n in graph.nodes for i, v in enumerate(n.outputs)}
    readers = {}
    for m in graph.nodes:
        for a in m.inputs:
            if isinstance(a, Value):
                readers.setdefault(id(a), []).append(m)
    seen = {id(v) for v in graph.outputs if isinstance(v, Value)}
    seen |= {id(v) for *_, v in graph.writes if v is not None}
    pos = {id(n): i for i, n in enumerate(graph.nodes)}
    replace, drop = {}, set()
    for step in graph.nodes:
        if step.name != "optimizer_step" or not step.effect:
            continue
        opt, n = _adam_optimizer(step)
        if opt is None or n == 0:
            continue
        grads = step.inputs[n:]
        hits = [producer.get(id(g)) for g in grads]
        if any(h is None for h in hits):
            continue
        clip = hits[0][0]
        if clip.name != "clip_grad_norm" or clip.effect or id(clip) in drop or \
                any(h[0] is not clip or h[1] == 0 for h in hits) or \
                len({h[1] for h in hits}) != n or \
                not all(isinstance(a, Value) for a in clip.inputs) or \
                any(id(a) in {id(v) for v in clip.outputs} for a in step.inputs[:n]):
            continue
        made = {id(v) for v in clip.outputs}
        between = graph.nodes[pos[id(clip)] + 1:pos[id(step)]]
        if pos[id(clip)] > pos[id(step)] or any(
                m.effect or any(isinstance(a, Value) and id(a) in made for a in m.inputs)
                for m in between):
            continue
        perm = [h[1] - 1 for h in hits]
        inplace = []
        for j, v in enumerate(clip.inputs):
            made_by = producer.get(id(v), (None, 0))[0]
            inplace.append(j in perm and made_by is not None and made_by.op is not None and
                           memory.is_fresh(made_by) and
                           readers.get(id(v)) == [clip] and id(v) not in seen and
                           v.dtype == clip.outputs[1 + j].dtype)
        impl, observe = _fused_parts(clip, step, perm)
        replace[id(step)] = Node(
            None, FUSED, list(clip.inputs) + list(step.inputs[:n]),
            dict(clip.params, optimizer=step.params.get("optimizer")),
            list(clip.outputs) + list(step.outputs), effect=True, impl=impl,
            meta={"optimizer": opt, "clip": clip, "step": step, "perm": perm,
                  "inplace": inplace, "observe": observe})
        drop.add(id(clip))
    return passes.replace_nodes(graph, replace, drop)


@op_kernels.register(FUSED)
def clip_optimizer_step_factory(node):
    """The fused clip and Adam/AdamW step (``fuse_clip_optimizer_step``) where both parts
    have their kernels (the same conditions; one switched off switches this off): the
    norms and the coefficient, then the Adam pass scaling each gradient first and writing
    the clipped gradient; a gradient the step does not read is scaled on its own. A
    gradient the pass found private (``meta["inplace"]``) that is a whole C-contiguous
    writeable array owning its data is clipped in place, as eager's ``g *= coef``: no new
    array, no second stream of writes. A call the Adam plan does not serve runs the clip
    kernel, then the node's own step."""
    meta = node.meta if isinstance(node.meta, dict) else {}
    clip, step, perm = meta.get("clip"), meta.get("step"), meta.get("perm")
    if clip is None or step is None or perm is None:
        return None
    clip_kernel, step_kernel = op_kernels.lookup(clip), op_kernels.lookup(step)
    if clip_kernel is None or step_kernel is None:
        return None
    opt, n = _adam_optimizer(step)
    cl = _Clip(clip)
    if opt is None or not cl.ok:
        return None
    from tapegrad.nn.utils import _clip_arrays as eager

    scale = _kernels()["clip_scale"]
    nc = len(clip.inputs)
    dt, shapes, chunk = cl.dt, cl.shapes, cl.chunk
    rest = [j for j in range(nc) if j not in set(perm)]  # scaled on their own
    # (C-level picks: the step's gradients in its order; 1-D outputs are their flat views)
    pick = operator.itemgetter(*perm) if len(perm) > 1 else lambda a: (a[perm[0]],)
    one_d = [len(s) == 1 for s in shapes]
    rest_spans = [(at, min(CHUNK, len(rest) - at)) for at in range(0, len(rest), CHUNK)]
    cand = [j for j, ok in enumerate(meta.get("inplace") or ()) if ok and j in set(perm)]
    flags_of = {}  # the in-place set -> int8 flags in the step's order
    impl = node.impl
    plan = [None]

    def private(a):
        return type(a) is np.ndarray and a.base is None and a.dtype == dt and \
            a.flags.c_contiguous and a.flags.writeable

    def clip_grad_norm_optimizer_step_kernel(*arrays, max_norm, norm_type,
                                             error_if_nonfinite, optimizer=None):
        params = arrays[nc:]
        pl = plan[0]
        if pl is None or not pl.valid(params):
            pl = plan[0] = _AdamPlan(opt, params)
            if not pl.valid(params):
                clipped = clip_kernel(*arrays[:nc], max_norm=max_norm, norm_type=norm_type,
                                      error_if_nonfinite=error_if_nonfinite)
                done = step_kernel(*params, *[clipped[1 + j] for j in perm],
                                   optimizer=optimizer)
                return (*clipped, *done)
        flat = [g.ravel() for g in arrays[:nc]]
        got = cl.coefficient(flat, max_norm)
        if got is None:  # (not the traced sizes: eager's code, and its error)
            clipped = eager(*arrays[:nc], max_norm=max_norm, norm_type=norm_type,
                            error_if_nonfinite=error_if_nonfinite)
            return (*clipped, *impl_step(params, clipped, optimizer))
        total, coef = got
        ok = frozenset(j for j in cand if private(arrays[j]))
        if ok:
            outs = [arrays[j] if j in ok else np.empty(s, dt) for j, s in enumerate(shapes)]
            oflat = [flat[j] if j in ok else o if one_d[j] else o.ravel()
                     for j, o in enumerate(outs)]
        else:
            outs = [np.empty(s, dt) for s in shapes]
            oflat = [o if d else o.ravel() for o, d in zip(outs, one_d)]
        flags = flags_of.get(ok)
        if flags is None:
            flags = flags_of[ok] = np.array([j in ok for j in perm], np.int8)
        pl.step(pick(flat), pick(oflat), coef, flags)
        if rest:
            rf, ro = [flat[j] for j in rest], [oflat[j] for j in rest]
            for at, k in rest_spans:
                scale(k, chunk(rf, at, k), chunk(ro, at, k), coef)
        return (total, *outs, *pl.arrays)

    def impl_step(params, clipped, optimizer):
        from tapegrad.compiler.ir import call_node

        return call_node(step, list(params) + [clipped[1 + j] for j in perm])

    return clip_grad_norm_optimizer_step_kernel
