"""One helper checks an op three ways: PyTorch values and gradients, gradcheck, second order.

    check_op(lambda T, x, y: T.mul(x, y), [(3, 4), (4,)])

``fn(T, *tensors)`` is written once and run with ``T = tapegrad`` and ``T = torch``. Inputs
are shapes (random float64 normals) or numpy arrays (integer arrays never require grad).
"""
import os

import numpy as np
import torch

import tapegrad

# the tests folder (test files live in its subfolders by the part of tapegrad they test)
TESTS = os.path.dirname(os.path.abspath(__file__))

RTOL = 1e-12


def make_inputs(specs, seed=0, low=None, high=None, away_from=None):
    """Random float64 arrays for shapes; arrays pass through. ``away_from`` nudges kinks."""
    rng = np.random.default_rng(seed)
    arrays = []
    for s in specs:
        if isinstance(s, np.ndarray):
            arrays.append(s)
            continue
        if isinstance(s, (int, float)) and not isinstance(s, bool):
            arrays.append(s)
            continue
        a = rng.uniform(low, high, size=s) if low is not None else rng.standard_normal(s)
        if away_from is not None:
            for k in np.atleast_1d(away_from):
                close = np.abs(a - k) < 0.1
                a = np.where(close, a + 0.2 * np.sign(a - k + 1e-3), a)
        arrays.append(np.asarray(a, dtype=np.float64))
    return arrays


def _wrap(lib, arrays, requires_grad, dtype=None):
    out = []
    for a in arrays:
        if not isinstance(a, np.ndarray):
            out.append(a)
            continue
        if dtype is not None and a.dtype == np.float64:
            a = a.astype(dtype)
        grad = requires_grad and a.dtype.kind == "f"
        if lib is torch:
            out.append(torch.tensor(a, requires_grad=grad))
        else:
            out.append(tapegrad.tensor(a, requires_grad=grad))
    return out


def _outputs(out):
    if isinstance(out, (tuple, list)):
        return list(out)
    return [out]


def to_numpy(t):
    if isinstance(t, torch.Tensor):
        if t._is_zerotensor():  # forward mode's zero tangent (slogdet's sign)
            return np.zeros(tuple(t.shape), dtype=str(t.dtype).split(".")[-1])
        return t.detach().numpy()
    return np.asarray(t.detach().numpy()) if isinstance(t, tapegrad.Tensor) else np.asarray(t)


def assert_close(actual, expected, rtol=RTOL, atol=None, what="value"):
    actual, expected = to_numpy(actual), to_numpy(expected)
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != {expected.shape}"
    if expected.dtype.kind in "biu":
        np.testing.assert_array_equal(actual, expected, err_msg=what)
        return
    if atol is None:
        scale = np.max(np.abs(expected)) if expected.size else 1.0
        atol = rtol * max(float(scale), 1e-300)
    np.testing.assert_allclose(actual, expected, rtol=rtol, atol=atol, err_msg=what)


def check_torch(fn, arrays, rtol=RTOL, dtype=None, grad=True, seed=1):
    """Values and gradients (for a random upstream gradient) agree with PyTorch."""
    tg_in = _wrap(tapegrad, arrays, grad, dtype)
    th_in = _wrap(torch, arrays, grad, dtype)
    tg_out = _outputs(fn(tapegrad, *tg_in))
    th_out = _outputs(fn(torch, *th_in))
    assert len(tg_out) == len(th_out)
    for a, b in zip(tg_out, th_out):
        assert str(a.dtype).split(".")[-1] == str(b.dtype).split(".")[-1], \
            f"dtype {a.dtype} != {b.dtype}"
        assert_close(a, b, rtol=rtol)
    if not grad:
        return
    rng = np.random.default_rng(seed)
    pairs = [(a, b) for a, b in zip(tg_out, th_out)
             if b.requires_grad and b.dtype.is_floating_point]
    if not pairs:
        return
    seeds = [rng.standard_normal(b.shape).astype(to_numpy(b).dtype) for _, b in pairs]
    tapegrad.autograd.backward([a for a, _ in pairs], [tapegrad.tensor(s) for s in seeds])
    torch.autograd.backward([b for _, b in pairs], [torch.tensor(s) for s in seeds])
    for i, (a, b) in enumerate(zip(tg_in, th_in)):
        if isinstance(b, torch.Tensor) and b.requires_grad:
            if b.grad is None:
                assert a.grad is None or not np.any(to_numpy(a.grad)), f"input {i}: grad"
                continue
            assert a.grad is not None, f"input {i}: tapegrad produced no gradient"
            assert a.grad.shape == a.shape and a.grad.dtype == a.dtype
            assert_close(a.grad, b.grad, rtol=rtol, what=f"gradient of input {i}")


def _check_op_three_ways(fn, specs, *, seed=0, low=None, high=None, away_from=None, grad=True,
                         second_order=True, float32=True, rtol=RTOL):
    """The three-way check: PyTorch (float64 and float32), gradcheck, gradgradcheck."""
    arrays = make_inputs(specs, seed, low, high, away_from)
    check_torch(fn, arrays, rtol=rtol, grad=grad)
    if float32:
        check_torch(fn, arrays, rtol=2e-5, dtype=np.float32, grad=grad)
    if not grad:
        return
    inputs = _wrap(tapegrad, arrays, True)

    def f(*xs):
        return fn(tapegrad, *xs)

    assert tapegrad.autograd.gradcheck(f, inputs)
    if second_order:
        assert tapegrad.autograd.gradgradcheck(f, inputs)


# --- forward mode and vmap (tapegrad.func) ---------------------------------------
def _float_positions(arrays):
    return [i for i, a in enumerate(arrays) if isinstance(a, np.ndarray) and a.dtype.kind == "f"]


def _partial(lib, fn, arrays, positions):
    base = _wrap(lib, arrays, False)

    def f(*xs):
        full = list(base)
        for i, x in zip(positions, xs):
            full[i] = x
        return tuple(o for o in _outputs(fn(lib, *full)) if o.dtype.is_floating_point)

    return f, tuple(base[i] for i in positions)


def check_forward(fn, arrays, rtol=RTOL, seed=2, second_order=True, eps=1e-6, oracle=True):
    """Forward mode: tapegrad.func.jvp against torch.func.jvp (float64, 1e-12) and against
    central differences; with ``second_order``, the jvp of the jvp against torch's.
    ``oracle=False``: torch's forward rule is known wrong here (scatter_reduce 'prod' gives a
    zero tangent): central differences only."""
    pos = _float_positions(arrays)
    if not pos:
        return
    rng = np.random.default_rng(seed)
    t1 = [rng.standard_normal(arrays[i].shape) for i in pos]
    t2 = [rng.standard_normal(arrays[i].shape) for i in pos]
    tg_f, tg_p = _partial(tapegrad, fn, arrays, pos)
    th_f, th_p = _partial(torch, fn, arrays, pos)
    tg_t = tuple(tapegrad.tensor(t) for t in t1)
    th_t = tuple(torch.tensor(t) for t in t1)
    out_a, jt_a = tapegrad.func.jvp(tg_f, tg_p, tg_t)
    try:  # torch has no forward rule for a few kernels (flash attention): differences only
        out_b, jt_b = torch.func.jvp(th_f, th_p, th_t) if oracle else (None, None)
    except NotImplementedError:
        jt_b = None
    if jt_b is None:
        second_order = False
    if jt_b is not None:
        assert len(jt_a) == len(jt_b)
        for k, (a, b) in enumerate(zip(jt_a, jt_b)):
            assert_close(a, b, rtol=rtol, what=f"jvp of output {k} vs torch.func.jvp")
    plus = tg_f(*[p + eps * t for p, t in zip(tg_p, tg_t)])
    minus = tg_f(*[p - eps * t for p, t in zip(tg_p, tg_t)])
    for k, (a, p, m) in enumerate(zip(jt_a, plus, minus)):
        fd = (to_numpy(p) - to_numpy(m)) / (2 * eps)
        scale = max(float(np.max(np.abs(fd))) if fd.size else 0.0, 1.0)
        np.testing.assert_allclose(to_numpy(a), fd, rtol=1e-5, atol=1e-6 * scale,
                                   err_msg=f"jvp of output {k} vs central differences")
    if not second_order:
        return

    def inner(jvp, f, t):
        return lambda *xs: jvp(f, xs, t)[1]

    s2 = tuple(tapegrad.tensor(t) for t in t2), tuple(torch.tensor(t) for t in t2)
    _, jj_a = tapegrad.func.jvp(inner(tapegrad.func.jvp, tg_f, tg_t), tg_p, s2[0])
    try:
        _, jj_b = torch.func.jvp(inner(torch.func.jvp, th_f, th_t), th_p, s2[1])
    except NotImplementedError:  # torch lacks a second-order forward rule (huber_loss)
        return
    for k, (a, b) in enumerate(zip(jj_a, jj_b)):
        try:
            assert_close(a, b, rtol=1e-10, what=f"second-order jvp of output {k} vs torch")
        except AssertionError:
            # torch's nested jvp is wrong for a few ops (layer_norm, linalg.solve, det): accept
            # a disagreement only where torch disagrees with central differences of its own
            # first-order jvp, and then hold tapegrad to central differences of its own
            fd_a = _central(lambda *xs: inner(tapegrad.func.jvp, tg_f, tg_t)(*xs)[k], tg_p,
                            s2[0], eps)
            fd_b = _central(lambda *xs: inner(torch.func.jvp, th_f, th_t)(*xs)[k], th_p,
                            s2[1], eps)
            scale = max(float(np.max(np.abs(fd_b))) if fd_b.size else 0.0, 1.0)
            if np.allclose(to_numpy(b), fd_b, rtol=1e-5, atol=1e-6 * scale):
                raise
            np.testing.assert_allclose(to_numpy(a), fd_a, rtol=1e-5, atol=1e-6 * scale,
                                       err_msg=f"second-order jvp of output {k} vs central "
                                               "differences (torch's own is off)")


def _central(f, primals, tangents, eps):
    plus = f(*[p + eps * t for p, t in zip(primals, tangents)])
    minus = f(*[p - eps * t for p, t in zip(primals, tangents)])
    return (to_numpy(plus) - to_numpy(minus)) / (2 * eps)


def check_vmap(fn, arrays, others=(), rtol=RTOL, seed=3, size=3):
    """vmap over a batch of float inputs (``arrays`` and the draws ``others``; integer inputs
    unbatched) against a loop over the batch."""
    pos = _float_positions(arrays)
    if not pos:
        return
    rng = np.random.default_rng(seed)
    others = list(others) or [[rng.standard_normal(a.shape) if i in pos else a
                               for i, a in enumerate(arrays)] for _ in range(size - 1)]
    size = 1 + len(others)
    batches = {i: np.stack([arrays[i]] + [o[i] for o in others]) for i in pos}
    base = _wrap(tapegrad, arrays, False)
    full = list(base)
    for i in pos:
        full[i] = tapegrad.tensor(batches[i])
    in_dims = tuple(0 if i in batches else None for i in range(len(arrays)))

    def f(*xs):
        return tuple(_outputs(fn(tapegrad, *xs)))

    try:
        got = tapegrad.func.vmap(f, in_dims=in_dims)(*full)
    except RuntimeError as e:
        # data-dependent code (a mask's nonzero, .item()): fine only where vmap refuses it (not
        # another error) and torch's vmap also refuses it
        if "vmap" not in str(e):
            raise
        th = _wrap(torch, arrays, False)
        for i in pos:
            th[i] = torch.tensor(batches[i])
        try:
            torch.func.vmap(lambda *xs: tuple(_outputs(fn(torch, *xs))), in_dims=in_dims)(*th)
        except RuntimeError:
            return
        raise
    for b in range(size):
        each = list(base)
        for i in pos:
            each[i] = tapegrad.tensor(batches[i][b])
        want = f(*each)
        for k, (g, w) in enumerate(zip(got, want)):
            assert_close(g[b], w, rtol=rtol, what=f"vmap output {k}, batch element {b}")


# Forward mode is checked on every row; TAPEGRAD_CHECK_FORWARD=0 turns it off (to time the
# rest); a row passes forward="differences" where torch's own forward rule is wrong (it is
# then checked against central differences only)
_FORWARD_DEFAULT = __import__("os").environ.get("TAPEGRAD_CHECK_FORWARD", "1") != "0"
# vmap is checked on every row (against a loop over the batch; a row whose function vmap
# refuses passes only where torch.func.vmap refuses it too); TAPEGRAD_CHECK_VMAP=subset checks
# a fixed quarter of the rows (chosen by a hash of the row's source location, the same rows
# every run; rows passing vmap=True too), =0 none (to time the rest)
_VMAP_DEFAULT = __import__("os").environ.get("TAPEGRAD_CHECK_VMAP", "1")


def _vmap_row(fn):
    if _VMAP_DEFAULT in ("0", "1"):
        return _VMAP_DEFAULT == "1"
    import zlib

    code = getattr(fn, "__code__", None)
    key = f"{code.co_filename.rsplit('/', 1)[-1]}:{code.co_firstlineno}" if code else repr(fn)
    return zlib.crc32(key.encode()) % 4 == 0


def check_op(fn, specs, *, forward=None, vmap=None, **kwargs):
    """The three-way check, plus forward mode (jvp vs torch.func.jvp and central differences,
    second order; on unless ``forward=False`` or TAPEGRAD_CHECK_FORWARD=0) and vmap (against a
    loop over the batch; on unless ``vmap=False`` or TAPEGRAD_CHECK_VMAP=0)."""
    if forward is None:
        forward = _FORWARD_DEFAULT
    if vmap is None:
        vmap = _vmap_row(fn)
    _check_op_three_ways(fn, specs, **kwargs)
    if not kwargs.get("grad", True):
        return
    seed = kwargs.get("seed", 0)
    draw = lambda s: make_inputs(specs, s, kwargs.get("low"), kwargs.get("high"),  # noqa: E731
                                 kwargs.get("away_from"))
    arrays = draw(seed)
    if forward:
        check_forward(fn, arrays, rtol=kwargs.get("rtol", RTOL),
                      second_order=kwargs.get("second_order", True),
                      oracle=forward != "differences")
    if vmap:
        check_vmap(fn, arrays, [draw(seed + 100 + k) for k in (1, 2)])


def state_to_torch(obj):
    """A (nested) state dict with tapegrad Tensors as the same structure of torch tensors."""
    if isinstance(obj, tapegrad.Tensor):
        return torch.tensor(np.asarray(obj._data))
    if isinstance(obj, dict):
        return {k: state_to_torch(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(state_to_torch(v) for v in obj)
    return obj


def state_to_tapegrad(obj):
    """The inverse of ``state_to_torch``: torch tensors become tapegrad Tensors (copied)."""
    if isinstance(obj, torch.Tensor):
        return tapegrad.tensor(obj.numpy().copy())
    if isinstance(obj, dict):
        return {k: state_to_tapegrad(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(state_to_tapegrad(v) for v in obj)
    return obj


def graph_node(g, name, ins, **params):
    """Append op ``name`` of ``ins`` (compiler IR Values or Python numbers) to the compiler
    graph ``g``; its output Value's shape and dtype are those of the op's forward on ones."""
    from tapegrad.compiler.ir import Node, Value
    from tapegrad.ops.registry import REGISTRY

    op = REGISTRY[name]
    arrays = [np.ones(a.shape, a.dtype) if isinstance(a, Value) else a for a in ins]
    out = np.asarray(op.forward(*arrays, **params))
    v = g.new_value(out.shape, out.dtype)
    g.nodes.append(Node(op, name, ins, params, [v]))
    return v


def graph_inputs(g, specs):
    """Append one array input Value to the compiler graph ``g`` for each ``(shape, dtype)``
    in ``specs`` (input ``i`` is the run's argument ``i``); returns the Values."""
    from tapegrad.compiler.ir import Input

    vs = []
    for i, (shape, dtype) in enumerate(specs):
        v = g.new_value(shape, dtype, f"a{i}")
        g.inputs.append((v, Input("array", index=i)))
        vs.append(v)
    return vs


def error_of(fn, *args):
    """``(type, message)`` of what ``fn(*args)`` raises, or None: for comparing two callables'
    errors exactly (eager against compiled)."""
    try:
        fn(*args)
    except Exception as e:  # noqa: BLE001 - the error itself is what is compared
        return type(e), str(e)
    return None


class BlasThreadRecorder:
    """Stands in for numpy inside ``backend.blas``: records the BLAS thread count at each
    call."""

    def __init__(self):
        self.seen = []

    def matmul(self, a, b):
        from tapegrad.backend import blas

        self.seen.append(blas.LIBRARY.get_num_threads())
        return np.matmul(a, b)
