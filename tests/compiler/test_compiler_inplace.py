"""In-place writes inside ``tapegrad.compile`` (graph breaks that should not be).

``x[1:3] = v``, ``x[idx] = 0.5`` (an index tensor or a list), ``x[mask] = v`` (as ``where``),
``masked_fill_``, ``scatter_``, ``index_add_/index_copy_/index_fill_``, ``fill_``/``zero_``
and ``x[1:3] += v`` on traced tensors are functionalised by the tracer (the
out-of-place op on the traced value, written back into the tensor, its views replayed): the
compiled function has no graph break and gives eager's values and gradients. Boolean-mask
*reads* (``x[mask]``: a data-dependent shape) stay breaks, reported with their source line.

Each case is written once against a module (``tapegrad`` or ``torch``): eager tapegrad is
checked against PyTorch, then three compiled calls (new data each call; the later two run the
generated code) against eager tapegrad, bitwise with the numpy kernels.
"""
import numpy as np
import pytest
import torch

import tapegrad as tg
from tapegrad.compiler import explain, tracer


@pytest.fixture(autouse=True)
def _numpy_kernels(monkeypatch):
    monkeypatch.setenv("TAPEGRAD_COMPILE_KERNELS", "numpy")


def _data(seed):
    rng = np.random.default_rng(seed)
    return {"x": rng.standard_normal((5, 4)), "v": rng.standard_normal((2, 4)),
            "w": rng.standard_normal((5, 4)), "s": rng.standard_normal(()),
            "row": rng.standard_normal(4),
            "mask": rng.random((5, 4)) > 0.5, "rows": rng.random(5) > 0.4,
            "idx": rng.permutation(5)[:2], "src": rng.standard_normal((2, 4)),
            "sidx": np.stack([rng.permutation(5)[:4], rng.permutation(5)[:4]])}


def _args(M, data, grads, names):
    """The named inputs as ``M`` tensors; float ones in ``grads`` require grad."""
    out = []
    for n in names:
        a = data[n]
        t = M.tensor(a.copy() if a.dtype != np.int64 else a.copy())
        if n in grads:
            t.requires_grad_(True)
        out.append(t)
    return out


def _run(fn, M, data, grads, names):
    """``fn(M)(*args)`` with backward taken inside; returns (loss, grads, arrays of args)."""
    args = _args(M, data, grads, names)
    loss = fn(M)(*args)
    leaves = [a for a, n in zip(args, names) if n in grads]
    return (loss.detach().numpy().copy(), [p.grad.numpy().copy() for p in leaves],
            [a.detach().numpy().copy() for a in args])


def _refill_and_run(step, args, data, grads, names):
    """``step(*args)`` on the same tensors refilled with ``data``, their ``.grad`` reset."""
    with tg.no_grad():
        for a, n in zip(args, names):
            a.copy_(tg.tensor(data[n]))
    for a in args:
        a.grad = None
    loss = step(*args)
    leaves = [a for a, n in zip(args, names) if n in grads]
    return (loss.detach().numpy().copy(), [p.grad.numpy().copy() for p in leaves],
            [a.detach().numpy().copy() for a in args])


def _step(body):
    def make(M):
        def step(*args):
            loss = body(M, *args)
            loss.backward()
            return loss
        return step
    return make


# --- the cases: body(M, *args) returns a loss --------------------------------------------
def slice_set(M, x, v):
    y = x * 2
    y[1:3] = v
    return (y.sin() * y).sum()


def slice_set_strided(M, x, v):
    y = x.sin()
    y[0:4:2, 1:] = v[:, :3] * 3
    return (y * y).sum()


def slice_set_stale_view(M, x, v):
    y = x * 2
    a = y[0:2]  # a view made before the write: its history is replayed from the new base
    y[1:3] = v
    return (a * a).sum() + (y.sin()).sum()


def int_tensor_set_scalar(M, x, idx):
    y = x * 1.5
    y[idx] = 0.5
    return (y ** 2).sum()


def int_tensor_set_value(M, x, idx, v):
    y = x.sin() * 2
    y[idx] = v * v
    return (y * x).sum()


def list_set_scalar(M, x):
    y = x * 1.5
    y[[0, 2]] = 0.5
    y[[1, -1], [3, 0]] = -2.0
    return (y ** 2).sum()


def mask_set_scalar(M, x, mask):
    y = x * 3
    y[mask] = 0.25
    return (y * x).sum()


def mask_set_rows(M, x, rows, row):
    y = x.sin()
    y[rows] = row * 2  # a mask over dim 0, a value broadcast to each chosen row
    return (y * x).sum()


def masked_fill_inplace(M, x, mask, s):
    y = x + 1
    y.masked_fill_(mask, -1.0)
    z = x * 2
    z.masked_fill_(~mask, s)  # a 0-d tensor value: it gets a gradient
    return (y * x + z).sum()


def scatter_inplace(M, x, sidx, src):
    y = x + 1
    y.scatter_(0, sidx, src * 2)
    z = x * x
    z.scatter_(1, sidx.t()[:, :2] % 4, 0.5)
    return (y * x).sum() + z.sum()


def untracked_set(M, x, w, idx):
    buf = x * 1  # no grad: a plain write, functionalised
    buf[1:3] = 0.0
    buf[idx] = 7.0
    buf[buf > 1] = 1.0
    return (buf * w).sum()


def index_ops_inplace(M, x, idx, v):
    y = x * 2
    y.index_add_(0, idx, v * 3)
    z = x.sin()
    z.index_copy_(0, idx, v)
    z.index_fill_(1, idx % 4, -1.0)
    return (y * z).sum()


def fill_and_augmented(M, x, v):
    y = x * 2
    y[0].zero_()  # a view filled with a number in grad mode
    y[1:3] += v  # the view's in-place add, then __setitem__ of the view into itself
    z = x.detach() * 1
    z.fill_(0.5)  # no grad: a plain write, functionalised
    return (y * y).sum() + (z * x).sum()


CASES = [
    (slice_set, ("x", "v"), ("x", "v"), "copy_slices"),
    (slice_set_strided, ("x", "v"), ("x", "v"), "copy_slices"),
    (slice_set_stale_view, ("x", "v"), ("x", "v"), "copy_slices"),
    (int_tensor_set_scalar, ("x", "idx"), ("x",), "index_put"),
    (int_tensor_set_value, ("x", "idx", "v"), ("x", "v"), "index_put"),
    (list_set_scalar, ("x",), ("x",), "index_put"),
    (mask_set_scalar, ("x", "mask"), ("x",), "where"),
    (mask_set_rows, ("x", "rows", "row"), ("x", "row"), "where"),
    (masked_fill_inplace, ("x", "mask", "s"), ("x", "s"), "where"),
    (scatter_inplace, ("x", "sidx", "src"), ("x", "src"), "index_put"),
    (untracked_set, ("x", "w", "idx"), ("w",), "index_put"),
    (index_ops_inplace, ("x", "idx", "v"), ("x", "v"), "index_put"),
    (fill_and_augmented, ("x", "v"), ("x", "v"), "copy_slices"),
]


@pytest.mark.parametrize("body,names,grads,node", CASES, ids=[c[0].__name__ for c in CASES])
def test_inplace_write_is_captured(body, names, grads, node):
    fn = _step(body)
    # eager tapegrad is PyTorch
    for seed in range(2):
        got, want = _run(fn, tg, _data(seed), grads, names), _run(fn, torch, _data(seed),
                                                                   grads, names)
        np.testing.assert_allclose(got[0], want[0], rtol=1e-12, atol=1e-12)
        for g, w in zip(got[1], want[1]):
            np.testing.assert_allclose(g, w, rtol=1e-12, atol=1e-12)
    # one graph, no break, the functional op in it
    out = explain(fn(tg))(*_args(tg, _data(0), grads, names))
    assert out.graph_break_count == 0, [(b.reason, b.where) for b in out.break_reasons]
    assert out.graph_count == 1
    nodes = [n.name for n in tracer.trace(fn(tg), *_args(tg, _data(0), grads, names)).nodes]
    assert node in nodes, nodes
    # compiled == eager, bitwise, on new data each call (the same leaves: .grad written)
    eager = [_run(fn, tg, _data(10 + k), grads, names) for k in range(3)]
    comp = tg.compile(fn(tg))
    args = _args(tg, _data(10), grads, names)
    for k in range(3):
        got = _refill_and_run(comp, args, _data(10 + k), grads, names)
        np.testing.assert_array_equal(got[0], eager[k][0])
        for g, w in zip(got[1], eager[k][1]):
            np.testing.assert_array_equal(g, w)
        for a, b in zip(got[2], eager[k][2]):
            np.testing.assert_array_equal(a, b)
    assert not comp.breaks, [(b.reason, b.where) for b in comp.breaks]
    assert comp.n_hits == 2 and len(comp.entries) == 1


def _state_step(state):
    """A closure's buffer, read and then written (slice, index list) without grad."""
    def step(x, w):
        decay = state * 0.5
        state[1:3] = x[0:2].detach() * 2
        state[[0, 4]] = -1.0
        loss = (state * w).sum() + (decay * w).sum()
        loss.backward()
        return loss
    return step


@pytest.mark.parametrize("as_argument", [False, True])
def test_write_into_state_outside_the_call_is_written_back(as_argument):
    """A tensor made before the call (a closure's buffer read before it is written, or an
    argument), written with a slice and an index list in grad mode without grad: the
    compiled call writes the same values back into it."""
    def run(fn, state, data, w):
        with tg.no_grad():
            state.copy_(tg.tensor(np.tile(data["v"], (3, 1))[:5]))
            w.copy_(tg.tensor(data["w"]))
        w.grad = None
        loss = fn(tg.tensor(data["x"]), w, state)
        return loss.detach().numpy().copy(), w.grad.numpy().copy(), state.numpy().copy()

    se, sc = tg.zeros(5, 4, dtype=tg.float64), tg.zeros(5, 4, dtype=tg.float64)
    we, wc = (tg.zeros(5, 4, dtype=tg.float64, requires_grad=True) for _ in range(2))
    if as_argument:
        eager_fn = lambda x, w, s: _state_step(s)(x, w)  # noqa: E731
        comp = tg.compile(eager_fn)
    else:
        closure, closure_c = _state_step(se), tg.compile(_state_step(sc))
        eager_fn = lambda x, w, s: closure(x, w)  # noqa: E731
        comp_fn = lambda x, w, s: closure_c(x, w)  # noqa: E731
    for k in range(3):
        want = run(eager_fn, se, _data(20 + k), we)
        got = run(comp if as_argument else comp_fn, sc, _data(20 + k), wc)
        for a, b in zip(got, want):
            np.testing.assert_array_equal(a, b)
    c = comp if as_argument else closure_c
    assert not c.breaks, [(b.reason, b.where) for b in c.breaks]
    assert c.n_hits == 2


def _mask_read(M, x, mask):
    return (x[mask] ** 2).sum()


def _mask_set_data_shaped(M, x, mask, v):
    y = x * 2
    y[mask] = v  # v has one value per True element: a data-dependent shape
    return (y * y).sum()


def test_boolean_mask_reads_stay_breaks_with_their_source_line():
    fn = _step(_mask_read)
    data = _data(3)
    out = explain(fn(tg))(*_args(tg, data, ("x",), ("x", "mask")))
    assert out.graph_break_count == 1
    (brk,) = out.break_reasons
    assert "boolean-mask index" in brk.reason and "index" in brk.reason
    assert __file__ in brk.where and "x[mask]" in brk.where
    comp = tg.compile(fn(tg))
    args = _args(tg, _data(30), ("x",), ("x", "mask"))
    for k in range(3):  # compiled pieces around the break: exact results
        data = _data(30 + k)
        got = _refill_and_run(comp, args, data, ("x",), ("x", "mask"))
        want = _run(fn, tg, data, ("x",), ("x", "mask"))
        np.testing.assert_array_equal(got[0], want[0])
        np.testing.assert_array_equal(got[1][0], want[1][0])


def test_mask_write_of_a_data_shaped_value_stays_a_break():
    fn = _step(_mask_set_data_shaped)
    data = _data(4)
    data["v"] = np.arange(float(data["mask"].sum()))
    out = explain(fn(tg))(*_args(tg, data, ("x", "v"), ("x", "mask", "v")))
    assert out.graph_break_count == 1
    (brk,) = out.break_reasons
    assert "boolean-mask index" in brk.reason
    assert __file__ in brk.where and "y[mask] = v" in brk.where
    got = _run(fn, tg, data, ("x", "v"), ("x", "mask", "v"))
    want = _run(fn, torch, data, ("x", "v"), ("x", "mask", "v"))
    np.testing.assert_allclose(got[0], want[0], rtol=1e-12)
    for g, w in zip(got[1], want[1]):
        np.testing.assert_allclose(g, w, rtol=1e-12, atol=1e-12)


def test_a_bad_write_raises_eagers_error_under_compile():
    """A value that does not fit the indexed shape: the compiled call raises eager's error."""
    def f(x):
        y = x * 1
        y[1:3] = tg.ones(3, dtype=tg.float64)
        return y

    with pytest.raises(RuntimeError) as eager:
        f(tg.ones(5, 4, dtype=tg.float64))
    with pytest.raises(RuntimeError) as compiled:
        tg.compile(f)(tg.ones(5, 4, dtype=tg.float64))
    assert str(compiled.value) == str(eager.value)
    assert "__setitem__: cannot assign a value of shape (3,)" in str(eager.value)
