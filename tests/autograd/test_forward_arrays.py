"""Forward mode's array path (func/_forward.py): when nothing can record or watch the tangent
computation, an op's JVP rule runs on backend arrays right after the primal. Checked against
torch.func (float64, 1e-12), against tapegrad's Tensor path (forced by an open op watcher),
and for the cases that must keep the Tensor path: a tangent whose gradient an outer tape can
ask for (a closure over a requiring-grad tensor, a leaf made inside, a requiring-grad tangent,
forward_ad's dual tensors)."""
import numpy as np
import pytest
import torch
import torch.autograd.forward_ad as tfwd

import tapegrad
import tapegrad.autograd.forward_ad as gfwd
import tapegrad.func._forward as F
from tapegrad.autograd import engine
from helpers import assert_close

RNG = np.random.default_rng(17)
X = RNG.standard_normal((16, 2))
VX = RNG.standard_normal((16, 2))
Y = RNG.integers(0, 3, 16)
P = {"w1": RNG.standard_normal((8, 2)), "b1": RNG.standard_normal(8),
     "w2": RNG.standard_normal((3, 8)), "b2": RNG.standard_normal(3)}
V = {k: RNG.standard_normal(a.shape) for k, a in P.items()}


def mlp(lib, p, x):
    h = lib.nn.functional.relu(lib.nn.functional.linear(x, p["w1"], p["b1"]))
    return lib.nn.functional.linear(h, p["w2"], p["b2"]).tanh() * 2 + x.sum()


def loss(lib, p, x, y):
    return lib.nn.functional.cross_entropy(mlp(lib, p, x), y)


def tensors(lib, d):
    return {k: lib.tensor(a) for k, a in d.items()}


class _Count:
    """Counts the array path's calls and the Tensor path's (``jvp_of``)."""

    def __init__(self, monkeypatch):
        self.arrays = self.tensors = 0
        array_jvp, jvp_of = F._array_jvp, F.jvp_of

        def counted_arrays(*a, **k):
            r = array_jvp(*a, **k)
            if r is F._ON_TENSORS:
                self.tensors += 1
            else:
                self.arrays += 1
            return r

        def counted_tensors(*a, **k):
            self.tensors += 1
            return jvp_of(*a, **k)

        monkeypatch.setattr(F, "_array_jvp", counted_arrays)
        monkeypatch.setattr(F, "jvp_of", counted_tensors)


class _Watcher:  # an open op watcher: every tangent op must be seen, so the Tensor path runs
    def before_op(self, op):
        pass

    def after_op(self, op, args, out):
        pass

    def before_backward(self, node):
        pass

    def after_backward(self, node, grads):
        pass


def tensor_path(fn):
    w = _Watcher()
    engine.add_watcher(w)
    try:
        return fn()
    finally:
        engine.remove_watcher(w)


def test_jvp_all_weights_and_input_only_against_torch(monkeypatch):
    count = _Count(monkeypatch)
    p, v, x, vx = tensors(tapegrad, P), tensors(tapegrad, V), tapegrad.tensor(X), tapegrad.tensor(VX)
    tp, tv, tx, tvx = tensors(torch, P), tensors(torch, V), torch.tensor(X), torch.tensor(VX)
    out, t = tapegrad.func.jvp(lambda p: mlp(tapegrad, p, x), (p,), (v,))
    want_out, want_t = torch.func.jvp(lambda p: mlp(torch, p, tx), (tp,), (tv,))
    assert_close(out, want_out)
    assert_close(t, want_t, what="tangent (all weights)")
    _, t = tapegrad.func.jvp(lambda x: mlp(tapegrad, p, x), (x,), (vx,))
    _, want_t = torch.func.jvp(lambda x: mlp(torch, tp, x), (tx,), (tvx,))
    assert_close(t, want_t, what="tangent (input only)")
    assert count.arrays >= 8 and count.tensors == 0
    assert not t.requires_grad and t.grad_fn is None


def test_array_path_equals_tensor_path(monkeypatch):
    p, v = tensors(tapegrad, P), tensors(tapegrad, V)
    x, y = tapegrad.tensor(X), tapegrad.tensor(Y)

    def run():
        a = tapegrad.func.jvp(lambda p: mlp(tapegrad, p, x), (p,), (v,))[1]
        h = tapegrad.func.hvp(lambda p: loss(tapegrad, p, x, y), (p,), (v,))[1]
        return a, h

    count = _Count(monkeypatch)
    fast = run()
    assert count.arrays > 0 and count.tensors == 0
    count.arrays = 0
    slow = tensor_path(run)
    assert count.arrays == 0 and count.tensors > 0
    np.testing.assert_allclose(fast[0].numpy(), slow[0].numpy(), rtol=1e-14, atol=0)
    for k in P:
        np.testing.assert_allclose(fast[1][k].numpy(), slow[1][k].numpy(), rtol=1e-13,
                                   atol=1e-15)


def test_hvp_against_torch_on_arrays(monkeypatch):
    # forward over reverse: grad's tape inside the jvp is the level's own, so the tangents of
    # the backward pass still run on arrays
    count = _Count(monkeypatch)
    p, v = tensors(tapegrad, P), tensors(tapegrad, V)
    x, y = tapegrad.tensor(X), tapegrad.tensor(Y)
    tp, tv, tx, ty = tensors(torch, P), tensors(torch, V), torch.tensor(X), torch.tensor(Y)
    g, hv = tapegrad.func.hvp(lambda p: loss(tapegrad, p, x, y), (p,), (v,))
    tg, thv = torch.func.jvp(torch.func.grad(lambda p: loss(torch, p, tx, ty)), (tp,), (tv,))
    for k in P:
        assert_close(g[k], tg[k], what=f"grad {k}")
        assert_close(hv[k], thv[k], what=f"hvp {k}")
    assert count.arrays > 10 and count.tensors == 0


@pytest.mark.parametrize("first", ["tangent op", "plain op"])
def test_grad_of_jvp_through_a_closure(first):
    # w is closed over and requires grad: the tangent's graph must reach it (Tensor path),
    # whether the first op on w carries a tangent or not
    def make(lib, grad, jvp):
        x, vx = lib.tensor(X), lib.tensor(VX)

        def outer(w):
            def f(x):
                w2 = w * 2 if first == "plain op" else w
                return (x @ w2.T).tanh()

            return jvp(f, (x,), (vx,))[1].pow(2).sum()

        return grad(outer)(lib.tensor(P["w1"]))

    got = make(tapegrad, tapegrad.func.grad, tapegrad.func.jvp)
    want = make(torch, torch.func.grad, torch.func.jvp)
    assert_close(got, want, what="grad of a jvp's tangent w.r.t. a closed-over tensor")


def test_grad_of_jvp_of_the_primal_input():
    def make(lib, grad, jvp):
        vx = lib.tensor(VX)
        return grad(lambda x: jvp(lambda x: (x.sin() * x).exp(), (x,), (vx,))[1].sum())(
            lib.tensor(X))

    assert_close(make(tapegrad, tapegrad.func.grad, tapegrad.func.jvp),
                 make(torch, torch.func.grad, torch.func.jvp))


def test_requiring_grad_tangent_keeps_its_graph():
    for lib in (tapegrad, torch):
        x = lib.tensor(X)
        vx = lib.tensor(VX, requires_grad=True)
        t = (lib.func if lib is tapegrad else torch.func).jvp(
            lambda x: (x * x).sin(), (x,), (vx,))[1]
        t.sum().backward()
        if lib is tapegrad:
            got = vx.grad
        else:
            want = vx.grad
    assert_close(got, want, what="gradient of the tangent w.r.t. the tangent")


def test_leaf_made_inside_keeps_the_tensor_path():
    # a requiring-grad leaf made inside f and returned as aux: the tangent's graph reaches it,
    # as on the Tensor path
    def run():
        box = {}

        def f(x):
            w = tapegrad.tensor(P["w1"], requires_grad=True)
            box["w"] = w
            return (x @ w.T).tanh(), w

        _, t, w = tapegrad.func.jvp(f, (tapegrad.tensor(X),), (tapegrad.tensor(VX),),
                                    has_aux=True)
        t.sum().backward()
        return w.grad

    got = run()
    assert got is not None
    np.testing.assert_allclose(got.numpy(), tensor_path(run).numpy(), rtol=1e-14, atol=0)


def test_dual_level_tangent_backward_against_torch():
    grads = []
    for lib, fwd in ((tapegrad, gfwd), (torch, tfwd)):
        w = lib.tensor(P["w1"], requires_grad=True)
        with fwd.dual_level():
            x = fwd.make_dual(lib.tensor(X), lib.tensor(VX))
            t = fwd.unpack_dual((x @ w.T).tanh()).tangent
            t.pow(2).sum().backward()
        grads.append(w.grad)
    assert_close(grads[0], grads[1], what="gradient of an unpacked tangent")


def test_float32_tangents_on_arrays(monkeypatch):
    count = _Count(monkeypatch)
    p32 = {k: tapegrad.tensor(a, dtype=tapegrad.float32) for k, a in P.items()}
    v32 = {k: tapegrad.tensor(a, dtype=tapegrad.float32) for k, a in V.items()}
    x = tapegrad.tensor(X, dtype=tapegrad.float32)
    t = tapegrad.func.jvp(lambda p: mlp(tapegrad, p, x), (p32,), (v32,))[1]
    assert t.dtype == tapegrad.float32 and count.arrays > 0
    tp = {k: torch.tensor(a, dtype=torch.float32) for k, a in P.items()}
    tv = {k: torch.tensor(a, dtype=torch.float32) for k, a in V.items()}
    want = torch.func.jvp(lambda p: mlp(torch, p, torch.tensor(X, dtype=torch.float32)),
                          (tp,), (tv,))[1]
    np.testing.assert_allclose(t.numpy(), want.numpy(), rtol=1e-4, atol=1e-5)


def test_nested_and_batched_levels_keep_the_tensor_path():
    # jvp of jvp and jacfwd (vmap of jvp): the inner level has a mode below it, which must see
    # its tangent ops
    x = tapegrad.tensor(X[0])
    f = lambda x: (x.sin() * x.exp()).sum()  # noqa: E731
    ft = lambda x: (x.sin() * x.exp()).sum()  # noqa: E731
    v = tapegrad.tensor(VX[0])
    jj = tapegrad.func.jvp(lambda x: tapegrad.func.jvp(f, (x,), (v,))[1], (x,), (v,))[1]
    tjj = torch.func.jvp(lambda x: torch.func.jvp(ft, (x,), (torch.tensor(VX[0]),))[1],
                         (torch.tensor(X[0]),), (torch.tensor(VX[0]),))[1]
    assert_close(jj, tjj, what="second-order jvp")
    assert_close(tapegrad.func.jacfwd(tapegrad.func.jacrev(f))(x),
                 torch.func.jacfwd(torch.func.jacrev(ft))(torch.tensor(X[0])), what="hessian")


# each hand-written rule listed in ARRAY_RULES, run on arrays (asserted) against torch.func.jvp
def _rows():
    r = np.random.default_rng(23)
    a34, t34 = r.standard_normal((3, 4)), r.standard_normal((3, 4))
    pos, tpos = r.uniform(0.1, 0.9, (3, 4)), r.standard_normal((3, 4))
    img, timg = r.standard_normal((2, 3, 5, 5)), r.standard_normal((2, 3, 5, 5))
    w = r.standard_normal((4, 3, 3, 3))
    q, tq = r.standard_normal((2, 3, 4)), r.standard_normal((2, 3, 4))
    k, v = r.standard_normal((2, 5, 4)), r.standard_normal((2, 5, 4))
    table, idx = r.standard_normal((6, 3)), np.array([0, 2, 5, 2])
    return {
        "linear": (lambda L, x: L.nn.functional.linear(x, L.tensor(a34[:2])), a34, t34),
        "matmul": (lambda L, x: x @ L.tensor(a34.T), a34, t34),
        "einsum": (lambda L, x: L.einsum("ij,kj->ik", x, x), a34, t34),
        "softmax": (lambda L, x: L.softmax(x, dim=1), a34, t34),
        "log_softmax": (lambda L, x: L.log_softmax(x, dim=0), a34, t34),
        "softmax_cross_entropy": (lambda L, x: L.nn.functional.cross_entropy(
            x, L.tensor(pos).softmax(1)), a34, t34),
        "cross_entropy_index": (lambda L, x: L.nn.functional.cross_entropy(
            x, L.tensor(np.array([0, 3, 1]))), a34, t34),
        "layer_norm": (lambda L, x: L.nn.functional.layer_norm(x, (4,)), a34, t34),
        "embedding": (lambda L, x: L.nn.functional.embedding(L.tensor(idx), x), table,
                      r.standard_normal(table.shape)),
        "var": (lambda L, x: x.var(dim=1), a34, t34),
        "std": (lambda L, x: x.std(dim=0), a34, t34),
        "logsumexp": (lambda L, x: L.logsumexp(x, dim=1), a34, t34),
        "constant_pad_nd": (lambda L, x: L.nn.functional.pad(x, (1, 2)), a34, t34),
        "conv2d": (lambda L, x: L.nn.functional.conv2d(x, L.tensor(w), padding=1), img, timg),
        "amax": (lambda L, x: x.amax(dim=1), a34, t34),
        "max_dim": (lambda L, x: x.max(dim=0)[0], a34, t34),
        "max": (lambda L, x: x.max(), a34, t34),
        "prod": (lambda L, x: x.prod(dim=1), a34, t34),
        "norm": (lambda L, x: x.norm(dim=1), a34, t34),
        "binary_cross_entropy": (lambda L, x: L.nn.functional.binary_cross_entropy(
            x, L.tensor(pos[::-1].copy())), pos, tpos),
        "scaled_dot_product_attention": (
            lambda L, x: L.nn.functional.scaled_dot_product_attention(x, L.tensor(k),
                                                                      L.tensor(v)), q, tq),
    }


@pytest.mark.parametrize("name", list(_rows()))
def test_listed_rule_on_arrays_against_torch(name, monkeypatch):
    fn, x, t = _rows()[name]
    seen = []
    array_jvp = F._array_jvp

    def spy(op, *a, **k):
        r = array_jvp(op, *a, **k)
        seen.append((op.name, r is F._ON_TENSORS))
        return r

    monkeypatch.setattr(F, "_array_jvp", spy)
    out, got = tapegrad.func.jvp(lambda x: fn(tapegrad, x), (tapegrad.tensor(x),),
                                 (tapegrad.tensor(t),))
    want_out, want = torch.func.jvp(lambda x: fn(torch, x), (torch.tensor(x),),
                                    (torch.tensor(t),))
    assert_close(out, want_out)
    assert_close(got, want, what=f"{name}: tangent on arrays")
    assert (name, False) in seen, seen
    assert not any(on_tensors for _, on_tensors in seen), seen
