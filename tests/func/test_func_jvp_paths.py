"""func.jvp's entry and exit (a tuple of Tensors, pytrees, one or several outputs, has_aux)
and its per-op paths (tangents on arrays when nothing watches, on Tensors under a watcher or
another mode), against torch.func.jvp in float64 at 1e-12 and against each other bitwise."""
import numpy as np
import pytest
import torch
import torch.func as tf

import tapegrad
import tapegrad.func as gf
from helpers import assert_close

RNG = np.random.default_rng(7)
X = RNG.standard_normal((5, 3))
VX = RNG.standard_normal((5, 3))
W = RNG.standard_normal((4, 3))
VW = RNG.standard_normal((4, 3))
B = RNG.standard_normal(4)
VB = RNG.standard_normal(4)


def lib_args(T):
    return T.tensor(X), T.tensor(VX), T.tensor(W), T.tensor(VW), T.tensor(B), T.tensor(VB)


def two_outputs(T):
    def f(x, w, b):  # the outer weight ``c`` is used without a tangent (no tangent op)
        c = T.tensor(W) * 2.0
        h = T.relu(T.nn.functional.linear(x, w, b)) * 0.5 + x.sum()
        return h, (h @ c).sin() + b.exp().sum()

    return f


def tree_fn(T):
    def f(p, x):
        h = T.tanh(T.nn.functional.linear(x, p["w"], p["b"]))
        return {"h": h, "s": (h * h).sum()}

    return f


def close(a, b, what):
    if isinstance(b, dict):
        assert set(a) == set(b), what
        for k in b:
            close(a[k], b[k], f"{what}[{k}]")
    elif isinstance(b, (tuple, list)):
        assert type(a) is type(b) and len(a) == len(b), what
        for i, (x, y) in enumerate(zip(a, b)):
            close(x, y, f"{what}[{i}]")
    else:
        assert not a.requires_grad, what
        assert_close(a, b, rtol=1e-12, what=what)


def test_tuple_of_tensors_several_outputs():
    x, vx, w, vw, b, vb = lib_args(tapegrad)
    tx, tvx, tw, tvw, tb, tvb = lib_args(torch)
    got = gf.jvp(two_outputs(tapegrad), (x, w, b), (vx, vw, vb))
    want = tf.jvp(two_outputs(torch), (tx, tw, tb), (tvx, tvw, tvb))
    close(got, want, "jvp")


def test_pytree_primals_and_outputs_and_aux():
    x, vx, w, vw, b, vb = lib_args(tapegrad)
    tx, tvx, tw, tvw, tb, tvb = lib_args(torch)

    def with_aux(T, f):
        return lambda p, x: (f(p, x), p["w"] * 3.0)

    got = gf.jvp(with_aux(tapegrad, tree_fn(tapegrad)), ({"w": w, "b": b}, x),
                 ({"w": vw, "b": vb}, vx), has_aux=True)
    want = tf.jvp(with_aux(torch, tree_fn(torch)), ({"w": tw, "b": tb}, tx),
                  ({"w": tvw, "b": tvb}, tvx), has_aux=True)
    close(got, want, "jvp with aux")


def test_identity_and_constant_outputs():
    x, vx = tapegrad.tensor(X), tapegrad.tensor(VX)
    out, t = gf.jvp(lambda x: x, (x,), (vx,))
    assert out is not x and t is not vx
    np.testing.assert_array_equal(out.numpy(), X)
    np.testing.assert_array_equal(t.numpy(), VX)
    out, t = gf.jvp(lambda x: tapegrad.tensor(W), (x,), (vx,))  # no path from x: zero
    np.testing.assert_array_equal(t.numpy(), np.zeros_like(W))


def test_errors_name_jvp():
    x, vx = tapegrad.tensor(X), tapegrad.tensor(VX)
    with pytest.raises(RuntimeError, match="jvp.*tuples"):
        gf.jvp(lambda x: x, x, (vx,))
    with pytest.raises(RuntimeError, match=r"jvp.*same shape, got \(5, 3\) and \(4, 3\)"):
        gf.jvp(lambda x: x, (x,), (tapegrad.tensor(W),))
    with pytest.raises(RuntimeError, match="jvp.*Expected f to return Tensors"):
        gf.jvp(lambda x: 3.0, (x,), (vx,))


@pytest.mark.parametrize("watched", ["anomaly", "checkpoint", "jvp of jvp"])
def test_watched_paths_give_the_same_bits(watched):
    """Under a watcher (anomaly mode, checkpointing) or another forward level below, the
    tangents are computed as ops on Tensors, not on the arrays: the same values, bit for bit."""
    x, vx, w, vw, b, vb = lib_args(tapegrad)
    f = two_outputs(tapegrad)
    plain = gf.jvp(f, (x, w, b), (vx, vw, vb))
    if watched == "anomaly":
        with tapegrad.autograd.detect_anomaly():
            other = gf.jvp(f, (x, w, b), (vx, vw, vb))
    elif watched == "checkpoint":
        from tapegrad.utils.checkpoint import checkpoint

        other = gf.jvp(lambda *a: checkpoint(f, *a, use_reentrant=False), (x, w, b),
                       (vx, vw, vb))
    else:  # the inner level has the outer one below it: its tangents are ops on Tensors
        plain = gf.jvp(lambda w: f(x, w, b), (w,), (vw,))
        other = gf.jvp(lambda x: gf.jvp(lambda w: f(x, w, b), (w,), (vw,)), (x,), (vx,))[0]
    for a, c in zip(plain, other):
        for u, v in zip(a, c):
            np.testing.assert_array_equal(u.numpy(), v.numpy())
