"""In-place ops and views: the helpers behind ``Tensor.add_``/``copy_``/``x[i] = v``/...,
views (``view_of``: shared storage and version counter, the base and the chain of view ops),
and rebasing a tensor's history after an in-place op in grad mode (``_inplace``,
``_inplace_view``, stale views regenerated lazily). Split out of ``tensor.py``; the Tensor
methods that use these stay there."""
import weakref

from tapegrad import dtypes
from tapegrad.autograd.engine import WATCH  # non-empty while any DispatchMode is active
from tapegrad.autograd.grad_mode import state as grad_state
from tapegrad.backend import xp
from tapegrad.ops import registry
from tapegrad.tensor import Tensor, _TYPE_NAMES
from tapegrad.ops import elementwise as _E, movement as _M
from tapegrad.func import _forward as _F  # forward mode through in-place ops
from tapegrad.func import _vmap as _V  # vmap: in-place ops on batched values

_FLOAT_NP = dtypes.FLOAT_NP  # dtypes.is_floating's set, read directly on the fast paths
_new = object.__new__

# --- in-place machinery -------------------------------------------------------------------
# Outside grad mode (optimizers, init) an in-place op is a numpy operation on the buffer plus a
# version bump. In grad mode, when the tensor or an operand requires grad, it is the
# out-of-place op on a snapshot of the old value, whose result is copied into the buffer and
# whose Node the tensor takes over ("rebasing" its history); Nodes that saved the old tensor
# see its new version and raise at backward, as in PyTorch.

def _recorder():
    """The mode that records in-place writes without grad as their out-of-place ops (the
    compiler's tracer, while it captures), or None."""
    for m in reversed(grad_state.modes):
        record = getattr(m, "records_writes", None)
        if record is not None:
            return m if record() else None
    return None


def _tracked(t, operands):
    """Whether an in-place op takes the general path (``_inplace``): something requires grad
    or carries a tangent or a batch dimension, or the compiler records the write."""
    if WATCH and grad_state.modes and (_V.any_batched(t, operands) or
                                       _F.carries_tangent(t, operands) or _recorder()):
        return True
    return _needs_grad(t, operands)


def _differentiable(t, operands):
    """``_tracked`` without the compiler's recording: the write must rebase ``t``'s history."""
    if WATCH and grad_state.modes and (_V.any_batched(t, operands) or
                                       _F.carries_tangent(t, operands)):
        return True
    return _needs_grad(t, operands)


def _needs_grad(t, operands):
    if not grad_state.enabled:
        return False
    if t._requires_grad:
        return True
    for o in operands:
        if isinstance(o, Tensor) and o._requires_grad:
            return True
    return False


def _public(name):
    import tapegrad

    fn = getattr(tapegrad, name, None)
    if fn is None:
        raise RuntimeError(f"{name}_: the out-of-place tapegrad.{name} is not available")
    return fn


def _can_cast(src, dst):
    """PyTorch's canCast for in-place results: no float -> integer, no non-bool -> bool."""
    if dtypes.is_floating(src) and not dtypes.is_floating(dst):
        return False
    return not (dst is dtypes.bool_ and src is not dtypes.bool_)


def _cast_error(name, result, out):
    return RuntimeError(f"{name}: result type {_TYPE_NAMES.get(result.name, result.name)[:-6]}"
                        f" can't be cast to the desired output type "
                        f"{_TYPE_NAMES.get(out.name, out.name)[:-6]}")


def _check_float_result(t, name):
    if not dtypes.is_floating(t._data.dtype):
        raise _cast_error(name, dtypes.get_default_dtype(), t.dtype)


def _check_result(t, name, *operands):
    res = dtypes.result_type(t, *operands)
    if not _can_cast(res, t.dtype):
        raise _cast_error(name, res, t.dtype)


def _shape_error(name, t, shape):
    return RuntimeError(f"{name}: output with shape {list(t.shape)} doesn't match the "
                        f"broadcast shape {list(shape)}")


def _write(t, values, name):
    """Store ``values`` (an array that broadcasts to ``t``) into ``t``'s buffer; bump."""
    data = t._data
    if values.shape != data.shape:
        try:
            shape = xp.broadcast_shapes(values.shape, data.shape)
        except ValueError:
            shape = values.shape
        if shape != data.shape:
            raise _shape_error(name, t, shape)
    res = dtypes.from_numpy_dtype(values.dtype)
    if res.np != data.dtype and not _can_cast(res, t.dtype):
        raise _cast_error(name, res, t.dtype)
    xp.copyto(data, values, casting="unsafe")
    t._version[0] += 1
    return t


def _accumulate(t, values, name):
    """``t += values`` in place (``values`` broadcasts to ``t``); bump the version."""
    try:
        xp.add(t._data, values, out=t._data, casting="same_kind")
    except ValueError:
        raise _shape_error(name, t, xp.broadcast_shapes(t.shape, values.shape)) from None
    t._version[0] += 1
    return t


def _binary_inplace(t, name, ufunc, other, alpha, fn, float_only=False):
    if _tracked(t, (other,)):
        args = (other,) if alpha == 1 else (other, alpha)
        return _inplace(t, name, fn, args, {})
    data = t._data
    if isinstance(other, Tensor):
        od = other._data
        if od.dtype is data.dtype and not (float_only and data.dtype not in _FLOAT_NP):
            dt_np = data.dtype
        else:
            dt = dtypes.result_type(t, other)
            if float_only and not dtypes.is_floating(dt):
                dt = dtypes.get_default_dtype()
            if not _can_cast(dt, t.dtype):
                raise _cast_error(name, dt, t.dtype)
            dt_np = dt.np
            if od.dtype != dt_np:
                od = od.astype(dt_np)
    else:
        od = other
        if data.dtype in _FLOAT_NP:
            dt_np = data.dtype
        else:
            try:
                dt = dtypes.result_type(t, other)
            except TypeError:
                raise TypeError(f"{name}: expected a Tensor or a number, got "
                                f"{type(other).__name__}") from None
            if float_only and not dtypes.is_floating(dt):
                dt = dtypes.get_default_dtype()
            if not _can_cast(dt, t.dtype):
                raise _cast_error(name, dt, t.dtype)
            dt_np = dt.np
    if alpha != 1:
        od = od * alpha
    try:
        ufunc(data, od, out=data, dtype=dt_np, casting="unsafe")
    except ValueError as e:
        try:
            shape = xp.broadcast_shapes(data.shape, xp.shape(od))
        except ValueError:
            shape = None
        if shape is None:
            raise RuntimeError(f"{name}: shapes {tuple(data.shape)} and {xp.shape(od)} cannot "
                               "be broadcast together") from None
        if shape != data.shape:
            raise _shape_error(name, t, shape) from None
        raise RuntimeError(f"{name}: {e} (tensor {tuple(data.shape)} {t.dtype})") from None
    t._version[0] += 1
    return t


def _unary_inplace(t, name, ufunc, fn, float_only):
    if WATCH and grad_state.modes and (_V.is_batched(t) or _recorder()):
        return _inplace(t, name, fn, (), {})
    if grad_state.enabled and t._requires_grad or WATCH and grad_state.modes and \
            _F.carries_tangent(t):
        return _inplace(t, name, fn, (), {})
    if float_only and t._data.dtype not in _FLOAT_NP:
        raise _cast_error(name, dtypes.get_default_dtype(), t.dtype)
    ufunc(t._data, out=t._data)
    t._version[0] += 1
    return t


def _lerp(a, end, weight):
    # PyTorch's form: exact at both ends, from whichever end is nearer
    if isinstance(weight, (int, float)):
        return a + weight * (end - a) if abs(weight) < 0.5 else end - (end - a) * (1 - weight)
    return _E.where(abs(weight) < 0.5, a + weight * (end - a), end - (end - a) * (1 - weight))


def view_of(a, data, o, params):
    """The Tensor for ``data``, the output of view op ``o`` on ``a`` (called by dispatch).

    A view shares its base's storage and version counter. ``_view`` is ``(base, chain,
    nograd)``: the base (the non-view tensor whose storage it shares), the ``(view op,
    params)`` steps that make it from the base (``movement.replay_view``), and whether it was
    made under ``no_grad``. On a base, ``_view`` is a list of weak references to its views,
    to mark them stale when an in-place op changes its history. Non-view ops never come here."""
    ad = a._data
    b = data.base
    ab = ad.base
    if b is not ad and (b is None or b is not ab) and not xp.may_share_memory(data, ad):
        return Tensor._make(data)  # numpy copied (a reshape of a non-contiguous input): no view
    t = _new(Tensor)
    t._data = data
    t._grad = t.grad_fn = t._hooks = None
    t._requires_grad = False
    t._version = a._version
    info = None if ab is None else getattr(a, "_view", None)  # owners of memory are no views
    if type(info) is not tuple:
        base, chain = a, ((o, params),)
    else:
        base, chain = info[0], info[1] + ((o, params),)
    t._view = (base, chain, not grad_state.enabled)
    refs = getattr(base, "_view", None)
    if refs is None:
        refs = base._view = []
    refs.append(_weakref(t))
    n = len(refs)
    if n > 16 and n & (n - 1) == 0:  # at powers of 2: drop dead references
        refs[:] = [r for r in refs if r() is not None]
    return t


registry.view_of = view_of
_weakref = weakref.ref


class _StaleView(Tensor):
    """A view whose base's history changed (an in-place op in grad mode) after the view's
    ``grad_fn`` was made. ``_mark_views`` switches a view to this class; the first read of its
    ``grad_fn`` or ``requires_grad`` (as an op input, a backward root, an in-place target)
    regenerates its ``grad_fn`` by replaying its chain on the base, as PyTorch does lazily,
    and switches it back to Tensor. Only such views pay for the check."""

    __slots__ = ()

    @property
    def grad_fn(self):
        return _refresh_view(self)

    @grad_fn.setter
    def grad_fn(self, fn):
        self.__class__ = getattr(type(self), "_fresh_cls", Tensor)
        self.grad_fn = fn

    @property
    def _requires_grad(self):
        _refresh_view(self)
        return self._requires_grad

    @_requires_grad.setter
    def _requires_grad(self, value):
        _REQ_GRAD.__set__(self, value)

    def __reduce_ex__(self, protocol):
        _refresh_view(self)
        return self.__reduce_ex__(protocol)


_REQ_GRAD = Tensor.__dict__["_requires_grad"]  # the slot descriptor, under the property


def _mark_views(base, keep=None):
    """After ``base``'s history changed: its live views (but ``keep``) regenerate their
    ``grad_fn`` when next used. Dead references are dropped."""
    refs = getattr(base, "_view", None)
    if not refs or type(refs) is not list:
        return
    live = []
    for r in refs:
        v = r()
        if v is not None:
            live.append(r)
            if v is not keep:
                cls = type(v)
                if cls is Tensor:
                    v.__class__ = _StaleView
                elif cls is not _StaleView:  # the compiler's tracer's Tensor class
                    stale = getattr(cls, "_stale_cls", None)
                    if stale is not None:
                        v.__class__ = stale
    refs[:] = live


def _refresh_view(t):
    """Regenerate view ``t``'s ``grad_fn`` by replaying its chain on its base (grad mode)."""
    base, chain, nograd = t._view
    if nograd:
        raise RuntimeError(
            "A view was created in no_grad mode and its base or another view of its base has "
            "been modified inplace with grad mode enabled. Given that this use case is "
            "ambiguous and error-prone, it is forbidden. You can clarify your code by moving "
            "both the view and the inplace either both inside the no_grad block (if you don't "
            "want the inplace to be tracked) or both outside (if you want the inplace to be "
            "tracked).")
    prev = grad_state.enabled
    grad_state.enabled = True
    try:
        r = _M.replay_view(base, chain)
    finally:
        grad_state.enabled = prev
    t.__class__ = getattr(type(t), "_fresh_cls", Tensor)
    if grad_state.modes:
        _traced_alias(t, r)  # the compiler's tracer: the view stands for the replayed one
    old, fn = t.grad_fn, r.grad_fn
    t.grad_fn = fn
    t._requires_grad = r._requires_grad
    if old is not None and old.retained is not None and fn is not None:
        fn.retained, old.retained = old.retained, None  # retain_grad() follows the tensor
    return fn


def _inplace_result(t, name, result):
    """Check the out-of-place result of an in-place op on ``t``; cast it to ``t``'s dtype."""
    if not isinstance(result, Tensor):
        raise TypeError(f"{name}: the out-of-place op returned {type(result).__name__}")
    if result.shape != t.shape:
        raise _shape_error(name, t, result.shape)
    res = result.dtype
    if res.np != t._data.dtype:
        if not _can_cast(res, t.dtype):
            raise _cast_error(name, res, t.dtype)
        result = _E.to_dtype(result, dtype=t.dtype)
    return result


def _inplace_view(t, name, fn, args, kwargs):
    """In-place on a view in grad mode (PyTorch's semantics): the view's new value is computed
    out of place, then its base takes a ``copy_slices`` history (the old base with the view's
    region replaced by the new value) and the view a ``grad_fn`` replayed from the new base."""
    base, chain, nograd = t._view
    if nograd:
        raise RuntimeError(
            f"{name}: A view was created in no_grad mode and is being modified inplace with grad "
            "mode enabled. Given that this use case is ambiguous and error-prone, it is "
            "forbidden. You can clarify your code by moving both the view and the inplace "
            "either both inside the no_grad block (if you don't want the inplace to be tracked) "
            "or both outside (if you want the inplace to be tracked).")
    node = t.grad_fn  # refreshed if stale
    if t._requires_grad and base.grad_fn is None:
        raise RuntimeError(f"{name}: a view of a leaf Variable that requires grad is being used "
                           "in an in-place operation.")
    data = t._data
    for n, st in zip(data.shape, data.strides):
        if st == 0 and n > 1:
            raise RuntimeError(
                f"{name}: unsupported operation: more than one element of the written-to tensor "
                "refers to a single memory location. Please clone() the tensor before "
                f"performing the operation (an expanded view of shape {tuple(data.shape)}).")
    old = Tensor._make(data.copy(), grad_fn=node)
    old._requires_grad = t._requires_grad
    if grad_state.modes:
        _F.carry_tangent(t, old)
        _traced_alias(old, t)
    result = _inplace_result(t, name, fn(old, *args, **kwargs))
    bnode = base.grad_fn
    old_base = Tensor._make(base._data, grad_fn=bnode)  # copy_slices saves nothing
    old_base._requires_grad = base._requires_grad
    if grad_state.modes:
        _traced_alias(old_base, base)
    # writes the view's region of the base's own memory: no copy of the base
    new_base = _M.copy_slices(old_base, result, chain=chain, inplace=True)
    base._version[0] += 1  # shared with every view of the base
    if grad_state.modes:
        _F.restamp(base)  # forward mode: the base's tangent came from copy_slices
        _traced_alias(base, new_base)
    new = new_base.grad_fn
    base.grad_fn = new
    base._requires_grad = new_base._requires_grad
    if bnode is not None and bnode.retained is not None and new is not None:
        new.retained, bnode.retained = bnode.retained, None
    _mark_views(base, keep=t)
    vnode = result.grad_fn
    fn = _refresh_view(t)  # view_fn(new base); moves a retained grad over
    if vnode is not None and fn is not None and vnode.out is result._data:
        vnode.out = t._data  # the rebased op saved its output: make that the view itself
        vnode.out_version = (t._version, t._version[0])
    return t


def _traced_alias(dst, src):
    """Under the compiler's tracer (a mode with ``alias``), ``dst`` now stands for ``src``'s
    traced value (the copy of an in-place op's input, the tensor after the write)."""
    for m in reversed(grad_state.modes):
        if hasattr(m, "alias"):
            m.alias(dst, src)
            return


def _inplace(t, name, fn, args, kwargs):
    """The general in-place op: ``fn(t, *args, **kwargs)`` out of place, written back into
    ``t``'s buffer. In grad mode with something requiring grad, ``t`` takes over the result's
    Node; otherwise this is a plain write."""
    if WATCH and grad_state.modes and _V.any_batched(t, args + tuple(kwargs.values())):
        return _V.inplace(t, name, fn, args, kwargs)
    if not _differentiable(t, args + tuple(kwargs.values())):
        from tapegrad.autograd.grad_mode import no_grad

        if WATCH and grad_state.modes:
            mode = _recorder()  # the compiler: fn recorded out of place, t rebound to it
            if mode is not None:
                done = mode.record_write(t, name, fn, args, kwargs)
                if done is not None:
                    return done
        with no_grad():
            result = fn(t, *args, **kwargs)
        return _write(t, result._data, name)
    if t._data.base is not None and type(getattr(t, "_view", None)) is tuple:
        return _inplace_view(t, name, fn, args, kwargs)
    node = t.grad_fn
    if node is None and t._requires_grad:
        raise RuntimeError(f"{name}: a leaf Variable that requires grad is being used in an "
                           "in-place operation.")
    old = Tensor._make(t._data.copy(), grad_fn=node)
    old._requires_grad = t._requires_grad
    if grad_state.modes:
        _F.carry_tangent(t, old)
        _traced_alias(old, t)
    result = _inplace_result(t, name, fn(old, *args, **kwargs))
    xp.copyto(t._data, result._data, casting="unsafe")
    t._version[0] += 1
    if grad_state.modes:
        _F.carry_tangent(result, t)  # forward mode: t's tangent is the result's
        _traced_alias(t, result)
    new = result.grad_fn
    t.grad_fn = new
    t._requires_grad = result._requires_grad
    if new is not None:
        if new.out is result._data:  # the Node saved its output: make that ``t`` itself
            new.out = t._data
            new.out_version = (t._version, t._version[0])
        if node is not None and node.retained is not None:
            new.retained, node.retained = node.retained, None
    _mark_views(t)  # views of t regenerate their grad_fn from t's new history when next used
    return t


# --- watchers of in-place ops -------------------------------------------------------------
# In-place ops (``add_``, ``p -= lr * g``, ``copy_``...) and optimizers' per-parameter updates
# write into buffers without going through dispatch, so op watchers never see them. While a
# watcher that wants them is open (``watch_inplace(True)``; the op profiler), Tensor's in-place
# methods and every optimizer class's ``update`` are swapped for wrappers that tell this
# thread's watchers having ``before_inplace(name)`` / ``after_inplace(name, written, read)``
# (``written``: the arrays updated in place; ``read``: the operands); nested in-place calls and
# the ops they dispatch are inside the event, as ops inside a watched op. With no such watcher
# open, the plain methods are in place: no cost at all.
_NOT_INPLACE = {"requires_grad_", "detach_", "share_memory_", "retain_grad", "resize_",
                "resize_as_", "set_", "pin_memory_"}
_AUGMENTED = ("__iadd__", "__isub__", "__imul__", "__itruediv__", "__ipow__")
_swapped = {}  # (owner class, attribute) -> the original
_inplace_users = [0]
_inplace_lock = __import__("threading").Lock()


def _inplace_watchers():
    from tapegrad.autograd.engine import WATCH, watchers

    if not WATCH or grad_state.watching or grad_state.modes:
        return ()  # inside a watched op, or under a DispatchMode (the tracer) that interprets
    return [w for w in watchers() if hasattr(w, "after_inplace")]


def _told(name, run):
    """Run ``run()`` (returning ``(result, written, read)``) with the watchers told."""
    mine = _inplace_watchers()
    if not mine:
        return run()[0]
    for w in mine:
        w.before_inplace(name)
    grad_state.watching = True  # ops (and in-place calls) inside are part of this event
    try:
        out, written, read = run()
    finally:
        grad_state.watching = False
    for w in mine:
        w.after_inplace(name, written, read)
    return out


def _watched_method(name, method):
    overwrite = name in ("fill_", "zero_", "copy_", "normal_", "uniform_", "random_",
                         "exponential_", "geometric_", "cauchy_", "log_normal_", "bernoulli_")

    def watched(self, *args, **kwargs):
        def run():
            out = method(self, *args, **kwargs)
            read = [a._data if isinstance(a, Tensor) else a for a in args]
            return out, [self._data], read if overwrite else [self._data] + read
        return _told(name, run)

    watched.__name__, watched.__doc__, watched.__wrapped__ = name, method.__doc__, method
    return watched


def _watched_update(name, update):
    """``update``: an optimizer's pure per-parameter update (a staticmethod or a method)."""
    fn = update.__func__ if isinstance(update, staticmethod) else update

    def watched(*args):
        param, grad, state = args[-4:-1]

        def run():
            out = fn(*args)
            arrays = [v for v in state.values() if hasattr(v, "nbytes") and v.ndim]
            return out, [param] + arrays, [param, grad] + arrays
        return _told(name, run)

    watched.__name__, watched.__doc__, watched.__wrapped__ = "update", fn.__doc__, fn
    return staticmethod(watched) if isinstance(update, staticmethod) else watched


def _optimizer_classes():
    from tapegrad.optim.optimizer import Optimizer

    todo, seen = [Optimizer], []
    while todo:
        c = todo.pop()
        seen.append(c)
        todo.extend(c.__subclasses__())
    return seen


def watch_inplace(on):
    """Count one more (``on``) or one fewer user of the in-place watcher wrappers; the first
    installs them, the last removes them (see above)."""
    with _inplace_lock:
        _inplace_users[0] += 1 if on else -1
        if on and _inplace_users[0] == 1:
            names = [k for k, v in vars(Tensor).items() if k.endswith("_")
                     and not k.startswith("_") and callable(v) and k not in _NOT_INPLACE]
            for k in names + [k for k in _AUGMENTED if k in vars(Tensor)]:
                method = vars(Tensor)[k]
                label = {"__iadd__": "add_", "__isub__": "sub_", "__imul__": "mul_",
                         "__itruediv__": "div_", "__ipow__": "pow_"}.get(k, k)
                _swapped[(Tensor, k)] = method
                setattr(Tensor, k, _watched_method(label, method))
            for c in _optimizer_classes():
                update = vars(c).get("update")
                if callable(update) or isinstance(update, staticmethod):
                    _swapped[(c, "update")] = update
                    setattr(c, "update", _watched_update(f"{c.__name__}.update", update))
        elif not on and _inplace_users[0] == 0:
            for (owner, k), original in _swapped.items():
                setattr(owner, k, original)
            _swapped.clear()
