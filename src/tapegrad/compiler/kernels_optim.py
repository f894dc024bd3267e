"""Hand-written numba kernels of a training step's optimizer and gradient clipping
(op_kernels.py), and the graph pass that joins the two.

* ``optimizer_step`` of Adam/AdamW (not AMSGrad, capturable or differentiable): numba calls
  over chunks of 8 parameters (tuples of flat views; each element read and written once
  instead of eager's dozen numpy passes), the parameters, state and groups checked into a
  plan (``_AdamPlan``) kept while they stay the same objects.
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
loop walks (numba's cache cannot load recursive functions).

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

_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))
_data_of = operator.attrgetter("_data")
_size_of = operator.attrgetter("size")
CHUNK = 8
FUSED = "clip_grad_norm_optimizer_step"


def _chunks(arrays, pad):
    """(start, count, tuple of CHUNK arrays) for each run of CHUNK arrays, the last
    padded with ``pad``."""
    out = []
    for at in range(0, len(arrays), CHUNK):
        part = tuple(arrays[at:at + CHUNK])
        out.append((at, len(part), part + (pad,) * (CHUNK - len(part))))
    return out


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
        for name in ("adam_params", "clip_norms", "clip_coef", "clip_scale"):
            _K[name] = getattr(mod, name)
    return _K


SOURCE = '''import numpy as np
from numba import njit


@njit(error_model="numpy", cache=True)
def sumsq_block(a, lo, n):
    """numpy's pairwise block of n <= 128 squares from a[lo]: 8 accumulators (the rows of a
    (n // 8, 8) view: constant column indices), joined pairwise, then the remainder."""
    if n < 8:
        res = a.dtype.type(0)
        for i in range(lo, lo + n):
            res += a[i] * a[i]
        return res
    nb = n // 8
    w = a[lo:lo + nb * 8].reshape((nb, 8))
    r = w[0]
    r0, r1, r2, r3 = r[0] * r[0], r[1] * r[1], r[2] * r[2], r[3] * r[3]
    r4, r5, r6, r7 = r[4] * r[4], r[5] * r[5], r[6] * r[6], r[7] * r[7]
    for b in range(1, nb):
        r = w[b]
        r0 += r[0] * r[0]
        r1 += r[1] * r[1]
        r2 += r[2] * r[2]
        r3 += r[3] * r[3]
        r4 += r[4] * r[4]
        r5 += r[5] * r[5]
        r6 += r[6] * r[6]
        r7 += r[7] * r[7]
    res = ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))
    for i in range(lo + nb * 8, lo + n):
        res += a[i] * a[i]
    return res


@njit(error_model="numpy", cache=True)
def sumsq(a, prog, lo, hi, vals):
    """np.add.reduce(a * a) of a flat C-contiguous array: the postfix program prog[lo:hi] of
    its length (a leaf: the next block's sum; -1: the last two sums added); vals: a stack."""
    pos = 0
    nv = 0
    for j in range(lo, hi):
        t = prog[j]
        if t >= 0:
            vals[nv] = sumsq_block(a, pos, t)
            pos += t
            nv += 1
        else:
            vals[nv - 2] = vals[nv - 2] + vals[nv - 1]
            nv -= 1
    return vals[0]


@njit(error_model="numpy", cache=True)
def adam_update(p, g, m, v, c, flags, out, coef, scale):
    """One Adam/AdamW step over flat (C-contiguous) param, grad and moments, in eager's
    order of operations (optim/adam.py): each element read and written once. ``c``: the
    hyperparameters in the param's dtype (one array: numba's dispatch is per argument).
    ``scale``: the gradient is first multiplied by coef (clip_grad_norm_'s ``g *= coef``)
    and that clipped gradient written to ``out``."""
    decay, wd, w1, one_m_w1, beta2, w2, bc2s, eps, neg_step = \\
        c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7], c[8]
    w1_low, maximize, decay_mode = flags[0] != 0, flags[1] != 0, flags[2]
    for i in range(p.shape[0]):
        gi = g[i]
        if scale:
            gi = gi * coef
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


@njit(error_model="numpy", cache=True)
def adam_params(k, ps, gs, ms, vs, steps, rows, c, flags, outs, coef, scale):
    """One Adam/AdamW step of the first k parameters of a chunk (tuples of CHUNK flat
    C-contiguous arrays of one dtype, padded; 0-d steps of one dtype; sizes checked by the
    caller): each step += 1 in its own dtype (eager's ``step_t += 1``), then adam_update
    with the constants of the parameter's group and new step, c[rows[i]], flags[rows[i]]
    (``scale``: each gradient times coef[()] first, written to outs[i])."""
    for i in range(k):
        s = steps[i]
        s[()] = s[()] + s.dtype.type(1)
    f = coef[()]
    for i in range(k):
        r = rows[i]
        adam_update(ps[i], gs[i], ms[i], vs[i], c[r], flags[r], outs[i], f, scale)


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
    (parameter's, step's), each one numba call per chunk over tuples of flat views."""

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
        self.state, self.values = opt.state, tuple(opt.state.values())
        # what valid() compares by identity, in C loops: the state dicts' tensors (in
        # their order) and those tensors' arrays
        self.sts = [st for st, *_ in entries]
        self.tensors = list(chain.from_iterable(map(dict.values, self.sts)))
        self.datas = list(map(_data_of, self.tensors))
        self.params = [p for ms in members.values() for _, _, p in ms]
        self.sizes = [a.size for a in arrays]
        self.buckets = []
        for (dt, sdt), ms in members.items():
            idx = [i for i, _, _ in ms]
            used = sorted({gi for _, gi, _ in ms})  # its groups: a row of constants each
            local = [used.index(gi) for _, gi, _ in ms]
            pad, pad0 = np.empty(0, dt), np.zeros((), sdt)
            flat = [_chunks([arrays[i].reshape(-1) for i in idx], pad)] + [
                _chunks([entries[i][k].reshape(-1) for i in idx], pad) for k in (1, 2)]
            steps = [entries[i][3] for i in idx]
            self.buckets.append((dt, sdt, idx, pad, list(zip(*flat, _chunks(steps, pad0))),
                                 steps, [self.groups[gi] for gi in used], local,
                                 np.array(local, np.int64)))
        self.whole = len(self.buckets) == 1  # one bucket, the call's order
        self.ok = True

    def valid(self, arrays):
        if not self.ok or not all(map(operator.is_, arrays, self.arrays)):
            return False
        opt = self.opt
        groups = opt.param_groups
        if len(groups) != len(self.groups) or any(
                g is not h for g, h in zip(groups, self.groups)) or any(
                g["amsgrad"] or g.get("capturable") or g.get("differentiable")
                for g in groups):
            return False
        state = opt.state  # the same entries (no Tensor hashing), tensors and arrays
        if state is not self.state or len(state) != len(self.values) or not all(
                map(operator.is_, state.values(), self.values)):
            return False
        now = list(chain.from_iterable(map(dict.values, self.sts)))
        return len(now) == len(self.tensors) and all(
            map(operator.is_, now, self.tensors)) and all(
            map(operator.is_, map(_data_of, now), self.datas))

    def step(self, grads, outs=None, coef=None):
        """The Adam/AdamW step with these flat gradients (in the call's parameter order);
        ``outs`` (flat, the same order) and a 0-d ``coef``: each gradient times coef
        first, written to its out."""
        update = _kernels()["adam_params"]
        scale = outs is not None
        for dt, sdt, idx, pad, chunks, steps, groups, local, rows in self.buckets:
            gs = grads if self.whole else [grads[i] for i in idx]
            os_ = (outs if self.whole else [outs[i] for i in idx]) if scale else gs
            # the counts after eager's ``step_t += 1`` (in the step's dtype): the kernel
            # makes the same increment
            old = list(map(float, steps))
            if old.count(old[0]) == len(old):  # one step count (the usual case)
                table = [_constants(g, float(sdt.type(old[0] + 1.0))) for g in groups]
            else:
                keys = {}
                rows = np.array([keys.setdefault((gi, s), len(keys))
                                 for gi, s in zip(local, old)], np.int64)
                table = [_constants(groups[gi], float(sdt.type(s + 1.0))) for gi, s in keys]
            c = np.array([t[0] for t in table], dt)
            flags = np.array([t[1] for t in table], np.int8)
            f = coef if scale else np.ones((), dt)
            for (at, k, ps), (_, _, ms), (_, _, vs), (_, _, st) in chunks:
                g8 = tuple(gs[at:at + CHUNK]) + (pad,) * (CHUNK - k)
                o8 = tuple(os_[at:at + CHUNK]) + (pad,) * (CHUNK - k) if scale else g8
                update(k, ps, g8, ms, vs, st, rows[at:at + CHUNK], c, flags, o8, f, scale)
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
