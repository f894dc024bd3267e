"""vmap: a ``DispatchMode`` that runs each op once on the whole batch.

A batched value is a plain Tensor whose array is a ``BatchedArray``: a zero-stride (no
memory) array of the *logical* per-example shape and dtype, which carries the physical Tensor
(``value``), the batch dim in it (``bdim``) and its level. User code sees logical shapes;
any op on such a Tensor comes to its level's ``interpret``, which calls the op's batch rule on
the physical values (``@op.batch``; derived for pointwise ops; else a loop over the batch
with a warning naming the op). Because the batch is carried by the array, a Tensor that
re-wraps it (a gradient rule's saved output, ``detach()``) stays batched.

Reverse mode inside vmap (``vmap(grad(f))``) is recorded at the logical level: the level
records a Node whose inputs are the logical Tensors, and the gradient rules, run as ops on
Tensors, are batched in turn. A physical op whose only operands requiring grad are leaves
made by such a transform inside the level runs untaped (``VmapLevel.inner``): nothing reads a
physical tape there; an outer transform's leaves keep it. Nested vmaps are levels on the
stack: an inner level's physical value is the outer level's logical one.

The placeholder holds no values: computing on it (a ufunc, ``np.nonzero``) raises, as reading
it does. Code that picks something from the values in Python (sort's order, a gradient rule's
mask) reads the physical batch (``host``/``physical_array``) and batches the result again
(``like``/``rebatch``). An in-place op on a batched tensor (``inplace``) computes out of place
and writes into the physical storage, which the physical values of its views share.
"""
import functools
import warnings

from tapegrad.autograd.engine import DispatchMode, Node
from tapegrad.autograd.grad_mode import state as grad_state
from tapegrad.backend import xp
from tapegrad.dtypes import FLOAT_NP
from tapegrad.func import _tree
from tapegrad.ops import registry
from tapegrad.ops.registry import REGISTRY


class BatchedArray(xp.ndarray):
    """The logical view of a batched value (see the module docstring). Reading its values
    (``item``, ``bool``, ``tolist``, ``numpy()``, ``np.asarray``) raises, as in PyTorch's vmap."""

    def _no_data(self, *a, **k):
        raise RuntimeError("vmap: It looks like you're attempting to use a Tensor's data "
                           "(.item(), bool(), .tolist(), .numpy()) inside of a function being "
                           "vmapped; this is not supported (the per-example values are not "
                           "materialised in Python)")

    item = tolist = __bool__ = __float__ = __int__ = __index__ = refuse_host_read = _no_data

    # computing on the placeholder (a ufunc, np.nonzero, np.sort...) would give every example
    # zeros' answer silently: refuse, as reading it does (code that must read the values uses
    # ops, or host()/physical_array() for the physical batch)
    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        self._no_data()

    def __array_function__(self, func, types, args, kwargs):
        if func in _SHAPE_ONLY:
            return super().__array_function__(func, types, args, kwargs)
        self._no_data()


_SHAPE_ONLY = {xp.shape, xp.ndim, xp.size, xp.result_type, xp.may_share_memory,
               xp.shares_memory, xp.can_cast, xp.min_scalar_type}


def _Tensor():
    from tapegrad.tensor import Tensor

    return Tensor


_new_array = xp.ndarray.__new__


def wrap(value, bdim, level):
    """The logical Tensor of physical ``value`` batched along ``bdim`` at ``level``."""
    shape = value._data.shape
    logical = shape[:bdim] + shape[bdim + 1:]
    dtype = value._data.dtype
    # what broadcast_to(zeros((), dtype), logical) gives (zero strides over one fresh zero,
    # read-only), made directly: this runs for every op's result under vmap
    arr = _new_array(BatchedArray, logical, dtype, xp.zeros((), dtype), 0, (0,) * len(logical))
    arr.flags.writeable = False
    arr.value, arr.bdim, arr.level = value, bdim, level
    return registry.Tensor._make(arr)


def unwrap(t, level):
    """``(physical, bdim)`` of ``t`` at ``level``; ``(t, None)`` when not batched there."""
    d = getattr(t, "_data", None)
    if type(d) is BatchedArray and getattr(d, "level", None) is level:
        return d.value, d.bdim
    return t, None


def is_batched(t):
    return type(getattr(t, "_data", None)) is BatchedArray


def physical_array(t):
    """The array behind ``t`` with every vmap level's batch dim in front (outermost first), for
    code that must read a batched tensor's values as PyTorch's kernels see the whole physical
    batch (a decision for the batch, values for ``rebatch``)."""
    d = t._data
    while type(d) is BatchedArray:
        t = move_to_front(d.value, d.bdim)
        d = t._data
    return d


def rebatch(array, like):
    """The logical Tensor of ``array`` laid out as ``physical_array(like)`` (the same leading
    batch dims, outermost first): values computed on the physical batch, batched again."""
    levels = []
    d = like._data
    while type(d) is BatchedArray:
        levels.append(d.level)
        d = d.value._data
    t = registry.Tensor._make(array)
    for level in reversed(levels):
        t = wrap(t, 0, level)
    return t


def host(t):
    """What a rule may read of ``t``'s values as an array: its array, or under vmap the
    physical batch (``physical_array``); results shaped like it come back through ``like``."""
    if type(getattr(t, "_data", None)) is BatchedArray:
        return physical_array(t)
    return getattr(t, "_data", t)


def like(array, t):
    """``array`` computed from ``host(t)``, as what the rule would have had unbatched: the
    array itself, or under vmap a Tensor batched as ``t`` (a ``where`` condition, a mask)."""
    if type(getattr(t, "_data", None)) is BatchedArray:
        return rebatch(array, t)
    return array


def any_batched(t, operands):
    """Whether an in-place op on ``t`` with ``operands`` meets a vmap value (inplace.py asks,
    under a DispatchMode only)."""
    return is_batched(t) or any(is_batched(o) for o in operands)


# --- in-place ops on batched values ----------------------------------------------------------
def inplace(t, name, fn, args, kwargs):
    """``t.<name>(*args)`` where ``t`` or an operand is batched: ``fn(t, *args)`` out of place
    (batched by the rules), then written into the physical storage of ``t``, which its views'
    physical values share (view rules give numpy views), as PyTorch's vmap writes in place."""
    from tapegrad.autograd.grad_mode import no_grad
    from tapegrad.inplace import _inplace_result

    if grad_state.enabled and any(getattr(o, "_requires_grad", False)
                                  for o in (t,) + tuple(args) + tuple(kwargs.values())):
        raise RuntimeError(f"vmap: {name}: an in-place op on a batched tensor that requires "
                           "grad is not supported inside vmap (use the out-of-place op)")
    with no_grad():
        result = _inplace_result(t, name, fn(t, *args, **kwargs))
    _write_batched(t, result, name)
    t._version[0] += 1
    return t


def _write_batched(dst, src, name):
    """Copy logical ``src`` into logical ``dst`` (broadcasting), level by level down to the
    arrays: at each level both move their batch dim to the front (views of ``dst``'s)."""
    d = dst._data
    if type(d) is not BatchedArray:
        if is_batched(src):
            raise RuntimeError(
                f"vmap: {name}(self, *extra_args) is not possible because there exists a Tensor "
                "`other` in extra_args that has more elements than `self`. This happened due to "
                "`other` being vmapped over but `self` not being vmapped over in a vmap. Please "
                f"try to use out-of-place operators instead of {name}.")
        from tapegrad.func._forward import carries_tangent

        if grad_state.enabled and (dst._requires_grad or getattr(src, "_requires_grad", False)) \
                or carries_tangent(dst, (src,)):
            raise RuntimeError(f"vmap: {name}: an in-place op on a batched tensor whose values "
                               "are differentiated by a transform outside vmap (grad, jvp) is "
                               "not supported (use the out-of-place op)")
        try:
            xp.copyto(d, src._data, casting="unsafe")
        except ValueError as e:
            raise RuntimeError(f"vmap: {name}: cannot write into the batched tensor's storage "
                               f"(shape {tuple(d.shape)}): {e}") from None
        return
    level = d.level
    nd = dst.dim()
    s, sb = unwrap(src, level)
    if sb is None:
        s = REGISTRY["reshape"](s, shape=(1,) * (nd - s.dim() + 1) + tuple(s.shape))
    else:
        s = move_to_front(s, sb)
        s = pad_after_batch(s, nd - (s.dim() - 1))
    _write_batched(move_to_front(d.value, d.bdim), s, name)


# --- physical helpers ----------------------------------------------------------------------
def move_to_front(t, bdim):
    if bdim == 0:
        return t
    n = t.dim()
    dims = (bdim,) + tuple(d for d in range(n) if d != bdim)
    return REGISTRY["permute"](t, dims=dims)


def pad_after_batch(t, k):
    """Insert ``k`` size-1 dims after the (front) batch dim."""
    if k <= 0:
        return t
    shape = tuple(t.shape)
    return REGISTRY["reshape"](t, shape=shape[:1] + (1,) * k + shape[1:])


def expand_batch(t, size):
    """An unbatched physical value with a front batch dim of ``size`` (a broadcast view)."""
    shape = tuple(t.shape)
    r = REGISTRY["reshape"](t, shape=(1,) + shape)
    return REGISTRY["broadcast_to"](r, shape=(size,) + shape)


def _front(args, bdims, size):
    """Every tensor arg with its batch at the front (unbatched ones expanded)."""
    out = []
    for a, b in zip(args, bdims):
        if b is not None:
            out.append(move_to_front(a, b))
        elif hasattr(a, "_data"):
            out.append(expand_batch(a, size))
        else:
            out.append(a)
    return out


def logical_ndim(a, b):
    return a.dim() - (b is not None)


# --- the level -----------------------------------------------------------------------------
_WARNED = set()
DEFERRED = {}  # op name -> installer of its batch rule, for ops registered after _batching


def _prepared(op, flat):
    """Whether elementwise ``op``'s operands need no promotion or broadcast (what dispatch's
    fast path checks: two Tensors of one dtype and shape; or one floating Tensor)."""
    T = registry.Tensor
    if len(flat) == 2:
        a, b = flat
        return (isinstance(a, T) and isinstance(b, T) and a._data.dtype is b._data.dtype
                and a._data.shape == b._data.shape
                and not (op.float_only and a._data.dtype.kind in "biu"))
    if len(flat) == 1:
        a = flat[0]
        return isinstance(a, T) and a._data.dtype in FLOAT_NP
    return False


class VmapLevel(DispatchMode):
    def __init__(self, size, randomness="error"):
        self.size = size
        self.randomness = randomness
        # id -> leaf: the handles that a reverse transform running inside this level made
        # (func._transforms._enter). Their gradients come from the logical tape this level
        # records; a physical op whose only operands requiring grad are such leaves needs no
        # tape of its own (see _tapeless)
        self.inner = {}

    def _tapeless(self, phys, params):
        """Whether the physical op on ``phys`` can run without recording: some operand requires
        grad, and every such one is a leaf of a transform inside this level."""
        inner = self.inner
        seen = False
        for p in phys:
            if getattr(p, "_requires_grad", False):
                if inner.get(id(p)) is not p:
                    return False
                seen = True
        for p in params.values():
            if getattr(p, "_requires_grad", False):
                if inner.get(id(p)) is not p:
                    return False
                seen = True
        return seen

    def interpret(self, op, args, params):
        T = registry.Tensor
        listed = bool(args) and type(args[0]) is list
        flat = args[0] if listed else args
        # one pass: each operand's physical value and batch dim at this level (unwrap inlined)
        phys, bdims = [], []
        hit = False
        for a in flat:
            d = getattr(a, "_data", None)
            if type(d) is BatchedArray and getattr(d, "level", None) is self:
                phys.append(d.value)
                bdims.append(d.bdim)
                hit = True
            else:
                phys.append(a)
                bdims.append(None)
        if not hit and not any(unwrap(v, self)[1] is not None for v in params.values()):
            return op(*args, **params)
        if op.elementwise and not listed and not _prepared(op, flat):
            # promote and broadcast as dispatch would, at the logical level (through us)
            st = grad_state
            modes = st.modes
            st.modes = modes + [self]
            try:
                flat = registry._prepare_elementwise(op, list(flat))
            finally:
                st.modes = modes
            phys, bdims = [], []
            for a in flat:
                p, b = unwrap(a, self)
                phys.append(p)
                bdims.append(b)
        pparams = params
        pbdims = {}
        for k, v in params.items():
            p, b = unwrap(v, self)
            if b is not None:
                pbdims[k] = b
                pparams = dict(pparams)
                pparams[k] = p
        rule = op.batch_rule
        if rule is None and op.name in DEFERRED:  # an op registered after _batching (linalg)
            DEFERRED.pop(op.name)(op)
            rule = op.batch_rule
        if rule is None and op.pointwise and not pbdims:
            rule = _pointwise_rule(op)
        st = grad_state
        if self.inner and st.enabled and self._tapeless(phys, pparams):
            st.enabled = False  # the logical Node below is the tape
            try:
                out, obd = self._physical(op, listed, rule, phys, bdims, pparams, pbdims)
            finally:
                st.enabled = True
        else:
            out, obd = self._physical(op, listed, rule, phys, bdims, pparams, pbdims)
        result = wrap(out, obd, self)
        if grad_state.enabled and op.differentiable and result._data.dtype in FLOAT_NP:
            for a in flat:
                if isinstance(a, T) and a._requires_grad:
                    result._requires_grad = True
                    result.grad_fn = Node(op, list(flat) if listed else flat, result, params)
                    break
        return result

    def _physical(self, op, listed, rule, phys, bdims, pparams, pbdims):
        """``(out, bdim)``: the op on the physical values, by its rule or a loop."""
        if rule is not None and not pbdims:
            res = rule(phys, bdims, **pparams)
            if res is not NotImplemented:
                return res
        elif rule is not None and getattr(rule, "batched_params", False):
            res = rule(phys, bdims, pbdims=pbdims, **pparams)
            if res is not NotImplemented:
                return res
        return self._loop(op, listed, phys, bdims, pparams, pbdims)

    def _loop(self, op, listed, phys, bdims, params, pbdims):
        if op.name not in _WARNED:
            _WARNED.add(op.name)
            warnings.warn(f"vmap: there is no batching rule for {op.name}; falling back to a "
                          "Python loop over the batch (slow)", stacklevel=4)
        getitem = REGISTRY["getitem"]
        outs = []
        for i in range(self.size):
            def pick(a, b):
                if b is None:
                    return a
                return getitem(a, index=(slice(None),) * b + (i,))
            args = [pick(a, b) for a, b in zip(phys, bdims)]
            ps = dict(params)
            for k, b in pbdims.items():
                ps[k] = pick(params[k], b)
                if not is_batched(ps[k]):
                    ps[k] = ps[k]._data  # a forward takes its params as arrays
            outs.append(op(args, **ps) if listed else op(*args, **ps))
        return REGISTRY["stack"](outs, dim=0), 0


def _pointwise_rule(op):
    # an elementwise op broadcasts its operands through broadcast_to when it dispatches; other
    # pointwise ops (gelu_backward(g, x)) take operands of one shape, so an unbatched one is
    # expanded to the batch here: left to numpy's broadcasting, a physical node recorded for
    # an outer transform would give it a gradient of the batched shape
    expand = not op.elementwise

    def rule(args, bdims, **params):
        nds = [logical_ndim(a, b) for a, b in zip(args, bdims) if hasattr(a, "_data")]
        r = max(nds)
        batched = [i for i, b in enumerate(bdims) if b is not None]
        if len(batched) == 1 and logical_ndim(args[batched[0]], bdims[batched[0]]) == r \
                and bdims[batched[0]] == 0 and not (expand and len(nds) > 1):
            return op(*args, **params), 0
        size = args[batched[0]].shape[bdims[batched[0]]]
        new = []
        for a, b in zip(args, bdims):
            if b is None:
                if expand and hasattr(a, "_data"):
                    a = pad_after_batch(expand_batch(a, size), r - a.dim())
                new.append(a)
            else:
                a = move_to_front(a, b)
                new.append(pad_after_batch(a, r - logical_ndim(a, 0)))
        return op(*new, **params), 0

    return rule


# --- random ops ----------------------------------------------------------------------------
def random_draw(name, shape, draw, inputs=()):
    """A random op (``rand``, ``randn``, ``bernoulli``, dropout's mask...) under the open vmap
    levels, as torch.func's ``randomness``: ``draw(shape) -> array`` makes the values; each
    level, innermost first, raises ('error'), leaves the draw unbatched ('same': one draw shared
    by the batch; an error when an input is batched there, as PyTorch) or draws one per
    example ('different'). Returns None when no vmap level is open."""
    levels = [m for m in grad_state.modes if isinstance(m, VmapLevel)]
    if not levels:
        return None
    return _draw(name, levels, tuple(shape), draw, inputs)


def _draw(name, levels, shape, draw, inputs):
    if not levels:
        return registry.Tensor._make(draw(shape))
    level, rest = levels[-1], levels[:-1]
    if level.randomness == "error":
        raise RuntimeError(f"vmap: called random operation ({name}) while in randomness error "
                           "mode. Please either use the 'same' or 'different' randomness flags "
                           "on vmap or perform the randomness operation out of vmap")
    if level.randomness == "same":
        if any(unwrap(t, level)[1] is not None for t in inputs):
            raise RuntimeError(f"vmap: {name}: Vmap does not currently support same randomness "
                               "with a batched tensor input (as PyTorch)")
        return _draw(name, rest, shape, draw, inputs)
    return wrap(_draw(name, rest, (level.size,) + shape, draw, inputs), 0, level)


# --- vmap ----------------------------------------------------------------------------------
def vmap(func, in_dims=0, out_dims=0, randomness="error", *, chunk_size=None):
    """As ``torch.func.vmap``: ``func`` mapped over a batch dim of its inputs, each op run
    once on the whole batch.

    >>> vmap(torch.dot)(x, y)                     # x, y: (B, n) -> (B,)
    >>> vmap(grad(loss), in_dims=(None, 0, 0))(params, xs, ys)   # per-sample gradients
    """
    if randomness not in ("error", "different", "same"):
        raise RuntimeError(f"vmap: only allowed to pass 'error', 'different' or 'same' for "
                           f"randomness, got {randomness}")
    if chunk_size is not None and (not isinstance(chunk_size, int) or chunk_size < 1):
        raise ValueError(f"vmap: chunk_size should be None or greater than 0. (got "
                         f"{chunk_size})")

    @functools.wraps(func)
    def wrapped(*args, **kwargs):
        return _vmap_call(func, in_dims, out_dims, randomness, chunk_size, args, kwargs)

    return wrapped


def _batch_size(leaves, dims):
    T = _Tensor()
    size = None
    for x, d in zip(leaves, dims):
        if d is None:
            continue
        if not isinstance(x, T):
            raise ValueError(f"vmap: Got in_dim={d} for an input but the input is of type "
                             f"{type(x).__name__}. We cannot vmap over non-Tensor arguments, "
                             "please use None as the respective in_dim")
        if not isinstance(d, int):
            raise ValueError(f"vmap: in_dim must be an int or None, got {d!r}")
        n = x.dim()
        if not -n <= d < n:
            raise ValueError(f"vmap: Got in_dim={d} for some input, but that input is a Tensor "
                             f"of dimensionality {n} so expected in_dim to satisfy "
                             f"-{n} <= in_dim < {n}.")
        s = x.shape[d % n]
        if size is not None and s != size:
            raise ValueError(f"vmap: Expected all tensors to have the same size in the mapped "
                             f"dimension, got sizes {size} and {s} for the mapped dimension")
        size = s
    if size is None:
        raise ValueError("vmap: at least one input must be batched (in_dims all None)")
    return size


def _vmap_call(func, in_dims, out_dims, randomness, chunk_size, args, kwargs):
    if not isinstance(in_dims, (int, tuple)) and in_dims is not None:
        raise ValueError(f"vmap: expected in_dims to be int or a (potentially nested) tuple "
                         f"matching the structure of inputs, got: {type(in_dims)}.")
    if isinstance(in_dims, tuple) and len(in_dims) != len(args):
        raise ValueError(f"vmap: in_dims is not compatible with the structure of `inputs`. "
                         f"in_dims has structure {len(in_dims)} but inputs has "
                         f"{len(args)}.")
    leaves, spec = _tree.flatten(args)
    dims = _tree.broadcast_prefix(in_dims, args, "vmap")
    size = _batch_size(leaves, dims)
    if chunk_size is not None and chunk_size < size:
        return _chunked(func, in_dims, out_dims, randomness, chunk_size, leaves, spec, dims,
                        size, kwargs)
    level = VmapLevel(size, randomness)
    with level:
        wrapped = [wrap(x, d % x.dim(), level) if d is not None else x
                   for x, d in zip(leaves, dims)]
        out = func(*_tree.unflatten(wrapped, spec), **kwargs)
    return _unwrap_out(out, out_dims, level, size)


def _unwrap_out(out, out_dims, level, size):
    T = _Tensor()
    outs, spec = _tree.flatten(out)
    odims = _tree.broadcast_prefix(out_dims, out, "vmap (out_dims)")
    res, check = [], []
    for o, d in zip(outs, odims):
        if not isinstance(o, T):
            raise ValueError(f"vmap: `{getattr(o, '__name__', o)}` must only return Tensors, "
                             f"got type {type(o).__name__}. Did you mean to set out_dims= to "
                             "None for output?")
        p, b = unwrap(o, level)
        if d is None:
            if b is not None:
                raise ValueError("vmap: out_dims=None for an output that is batched (it "
                                 "depends on a mapped input)")
            res.append(p)
            continue
        if b is None:
            p = expand_batch(p, size)
            b = 0
        n = p.dim()
        d = d % n
        if b != d:
            dims = [i for i in range(n) if i != b]
            dims.insert(d, b)
            p = REGISTRY["permute"](p, dims=tuple(dims))
        if p._requires_grad:
            check.append(len(res))
        res.append(p)
    if check:
        # a result whose graph reaches no leaf of a transform still running leaves detached:
        # one walk over all of them, each asked on its own only when some graph does reach one
        from tapegrad.func._transforms import _reaches_outer

        if _reaches_outer([res[i] for i in check], ()):
            check = [i for i in check if not _reaches_outer([res[i]], ())]
        for i in check:
            res[i] = res[i].detach()
    return _tree.unflatten(res, spec)


def _chunked(func, in_dims, out_dims, randomness, chunk_size, leaves, spec, dims, size, kw):
    getitem = REGISTRY["getitem"]
    parts = []
    for start in range(0, size, chunk_size):
        sl = slice(start, min(start + chunk_size, size))
        chunk = [getitem(x, index=(slice(None),) * (d % x.dim()) + (sl,)) if d is not None else x
                 for x, d in zip(leaves, dims)]
        cdims = _tree.unflatten(dims, spec)
        parts.append(_vmap_call(func, cdims, out_dims, randomness, None,
                                tuple(_tree.unflatten(chunk, spec)), kw))
    first, ospec = _tree.flatten(parts[0])
    per = [_tree.flatten(p)[0] for p in parts]
    odims = _tree.broadcast_prefix(out_dims, parts[0], "vmap (out_dims)")
    from tapegrad.ops.movement import cat

    out = [cat([p[i] for p in per], dim=odims[i]) for i in range(len(first))]
    return _tree.unflatten(out, ospec)
