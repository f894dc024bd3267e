"""tapegrad.func against torch.func: each transform and their compositions, float64, 1e-12."""
import warnings

import numpy as np
import pytest
import torch
import torch.func as tf

import tapegrad
import tapegrad.func as gf
from helpers import assert_close

RNG = np.random.default_rng(0)
X = RNG.standard_normal((3, 4))
V = RNG.standard_normal((3, 4))
W = RNG.standard_normal((4, 5))
B = RNG.standard_normal(5)
XB = RNG.standard_normal((6, 4))
YB = RNG.standard_normal((6, 5))


def pair(a):
    return tapegrad.tensor(a), torch.tensor(a)


def close_tree(a, b, rtol=1e-12, what="value"):
    if isinstance(b, (tuple, list)):
        assert isinstance(a, (tuple, list)) and len(a) == len(b), what
        for x, y in zip(a, b):
            close_tree(x, y, rtol, what)
    elif isinstance(b, dict):
        assert set(a) == set(b)
        for k in b:
            close_tree(a[k], b[k], rtol, f"{what}[{k}]")
    else:
        assert not getattr(a, "requires_grad", False), f"{what}: result requires grad"
        assert_close(a, b, rtol=rtol, what=what)


def scalar_fn(T):
    w = T.tensor(W)
    return lambda x: (T.tanh(x @ w).sin() * x.sum(-1, keepdim=True).exp()).sum() ** 2


def vector_fn(T):
    w = T.tensor(W)
    return lambda x: T.softmax(T.tanh(x @ w), dim=-1) * x.mean()


def mlp_loss(T):
    def loss(w, b, x, y):
        h = T.tanh(x @ w + b)
        return ((h - y) ** 2).mean()

    return loss


# --- single transforms ---------------------------------------------------------------------
def test_grad_and_value_and_argnums_and_aux():
    ga, ta = pair(X)
    g = gf.grad(scalar_fn(tapegrad))(ga)
    close_tree(g, tf.grad(scalar_fn(torch))(ta))
    lib = [(tapegrad, gf), (torch, tf)]
    res = []
    for T, F in lib:
        w, b, x, y = (T.tensor(a) for a in (W, B, XB, YB))
        res.append(F.grad_and_value(mlp_loss(T), argnums=(0, 1))(w, b, x, y))
    close_tree(res[0], res[1])
    res = []
    for T, F in lib:
        x = T.tensor(X)
        res.append(F.grad(lambda x: ((x ** 3).sum(), x.cos()), has_aux=True)(x))
    close_tree(res[0], res[1])


def test_grad_errors():
    x = tapegrad.tensor(X)
    with pytest.raises(RuntimeError, match="scalar Tensor"):
        gf.grad(lambda x: x * 2)(x)
    with pytest.raises(RuntimeError, match="argnums"):
        gf.grad(lambda x: x.sum(), argnums=3)(x)
    with pytest.raises(RuntimeError, match="tuple: \\(output, aux\\)"):
        gf.grad(lambda x: x.sum(), has_aux=True)(x)


def test_vjp_and_jvp_and_linearize():
    ga, ta = pair(X)
    gv, tv = pair(V)
    out_a, fn_a = gf.vjp(vector_fn(tapegrad), ga)
    out_b, fn_b = tf.vjp(vector_fn(torch), ta)
    ct = RNG.standard_normal(tuple(out_b.shape))
    close_tree(out_a, out_b)
    close_tree(fn_a(tapegrad.tensor(ct)), fn_b(torch.tensor(ct)))
    close_tree(gf.jvp(vector_fn(tapegrad), (ga,), (gv,)), tf.jvp(vector_fn(torch), (ta,), (tv,)))
    out_a, lin = gf.linearize(vector_fn(tapegrad), ga)
    out_b, lin_b = tf.linearize(vector_fn(torch), ta)
    close_tree(lin(gv), lin_b(tv))


def test_jacrev_jacfwd_hessian():
    ga, ta = pair(X[0])
    for gt, tt in [(gf.jacrev, tf.jacrev), (gf.jacfwd, tf.jacfwd)]:
        close_tree(gt(vector_fn(tapegrad))(ga), tt(vector_fn(torch))(ta))
    close_tree(gf.hessian(scalar_fn(tapegrad))(ga), tf.hessian(scalar_fn(torch))(ta), 1e-11)
    res = []
    for T, F in [(tapegrad, gf), (torch, tf)]:
        w, b, x, y = (T.tensor(a) for a in (W, B, XB, YB))
        res.append(F.jacrev(mlp_loss(T), argnums=(0, 1))(w, b, x, y))
    close_tree(res[0], res[1])


def test_hvp_forward_over_reverse():
    ga, ta = pair(X)
    gv, tv = pair(V)
    g, hv = gf.hvp(scalar_fn(tapegrad), (ga,), (gv,))
    g_ref, hv_ref = tf.jvp(tf.grad(scalar_fn(torch)), (ta,), (tv,))
    close_tree(g, g_ref)
    close_tree(hv, hv_ref, 1e-11)


# --- compositions --------------------------------------------------------------------------
def test_grad_of_grad():
    ga, ta = pair(X)
    f = lambda F, T: F.grad(lambda x: F.grad(scalar_fn(T))(x).sin().sum())  # noqa: E731
    close_tree(f(gf, tapegrad)(ga), f(tf, torch)(ta), 1e-11)


def test_jvp_of_grad():
    ga, ta = pair(X)
    gv, tv = pair(V)
    close_tree(gf.jvp(gf.grad(scalar_fn(tapegrad)), (ga,), (gv,)),
               tf.jvp(tf.grad(scalar_fn(torch)), (ta,), (tv,)), 1e-11)


def test_jacfwd_of_jacrev():
    ga, ta = pair(X[1])
    close_tree(gf.jacfwd(gf.jacrev(scalar_fn(tapegrad)))(ga),
               tf.jacfwd(tf.jacrev(scalar_fn(torch)))(ta), 1e-11)


def test_grad_of_jvp_reverse_over_forward():
    ga, ta = pair(X)
    gv, tv = pair(V)
    f = lambda F, T, v: F.grad(lambda x: F.jvp(vector_fn(T), (x,), (v,))[1].pow(2).sum())  # noqa
    close_tree(f(gf, tapegrad, gv)(ga), f(tf, torch, tv)(ta), 1e-11)


def test_vmap_of_grad_per_sample_gradients_match_the_loop_and_torch():
    res = []
    for T, F in [(tapegrad, gf), (torch, tf)]:
        w, b, x, y = (T.tensor(a) for a in (W, B, XB, YB))
        res.append(F.vmap(F.grad(mlp_loss(T), argnums=(0, 1)), in_dims=(None, None, 0, 0))(
            w, b, x, y))
    close_tree(res[0], res[1])
    w, b = tapegrad.tensor(W), tapegrad.tensor(B)
    for i in range(XB.shape[0]):
        gw, gb = gf.grad(mlp_loss(tapegrad), argnums=(0, 1))(
            w, b, tapegrad.tensor(XB[i]), tapegrad.tensor(YB[i]))
        assert_close(res[0][0][i], gw)
        assert_close(res[0][1][i], gb)


def test_vmap_of_jvp_and_nested_vmap():
    ga, ta = pair(X)
    gv, tv = pair(V)
    f = lambda F, T: F.vmap(lambda x, v: F.jvp(vector_fn(T), (x,), (v,)))  # noqa: E731
    close_tree(f(gf, tapegrad)(ga, gv), f(tf, torch)(ta, tv))
    m = RNG.standard_normal((2, 3, 4))
    gm, tm = pair(m)
    nested = lambda F, T: F.vmap(F.vmap(lambda r: (r * r.sum()).sin(), in_dims=1),  # noqa
                                 in_dims=0, out_dims=1)
    close_tree(nested(gf, tapegrad)(gm), nested(tf, torch)(tm))


def test_vmap_in_dims_out_dims_and_chunk_size():
    ga, ta = pair(X)
    gw, tw = pair(W)
    for kw in [dict(in_dims=(1, None)), dict(in_dims=(1, None), out_dims=1),
               dict(in_dims=(1, None), chunk_size=2)]:
        close_tree(gf.vmap(lambda c, w: c @ w[:3], **kw)(ga, gw),
                   tf.vmap(lambda c, w: c @ w[:3], **kw)(ta, tw))
    with pytest.raises(ValueError, match="same size"):
        gf.vmap(lambda a, b: a + b)(ga, tapegrad.tensor(XB))
    with pytest.raises(RuntimeError, match="data"):
        gf.vmap(lambda a: a.sum().item())(ga)
    for read in (lambda a: a.numpy(), np.asarray):  # PyTorch: "Cannot access data pointer"
        with pytest.raises(RuntimeError, match="data"):
            gf.vmap(lambda a: tapegrad.tensor(read(a)))(ga)
        with pytest.raises(RuntimeError, match="data pointer"):
            tf.vmap(lambda a: torch.tensor(read(a)))(ta)


def test_vmap_fallback_warns_naming_the_op():
    from tapegrad.ops.registry import Op

    def fwd(a):  # an op with no batch rule (not registered: REGISTRY stays as is)
        return xp_inv(a)

    xp_inv = np.linalg.inv
    inv = Op(fwd, "test_inv_without_batch_rule", 1, "out", False, False, True, False, False,
             False)
    x = tapegrad.tensor(RNG.standard_normal((2, 3, 3)) + 3 * np.eye(3))
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        got = gf.vmap(inv)(x)
    assert any("test_inv_without_batch_rule" in str(m.message) for m in w)
    close_tree(got, torch.func.vmap(torch.linalg.inv)(torch.tensor(x.numpy())))


def test_functional_call_and_stack_module_state():
    tapegrad.manual_seed(0)
    models = [tapegrad.nn.Linear(4, 3).double() for _ in range(3)]
    params, buffers = gf.stack_module_state(models)
    assert params["weight"].shape == (3, 3, 4)
    x = tapegrad.tensor(XB)
    base = models[0]

    def run(p, b, x):
        return gf.functional_call(base, (p, b), (x,))

    out = gf.vmap(run, in_dims=(0, 0, None))(params, buffers, x)
    for i, m in enumerate(models):
        assert_close(out[i], m(x).detach())
    p = {k: v.detach() for k, v in base.named_parameters()}
    g = gf.grad(lambda p: gf.functional_call(base, p, x).pow(2).sum())(p)
    ref = torch.nn.Linear(4, 3).double()
    ref.load_state_dict({k: torch.tensor(v.numpy()) for k, v in p.items()})
    tg = tf.grad(lambda q: tf.functional_call(ref, q, torch.tensor(XB)).pow(2).sum())(
        dict(ref.named_parameters()))
    close_tree(g, tg)


def test_autograd_functional_against_torch():
    ga, ta = pair(X[0])
    gv, tv = pair(V[0])
    A, Tt = tapegrad.autograd.functional, torch.autograd.functional
    close_tree(A.jacobian(vector_fn(tapegrad), ga), Tt.jacobian(vector_fn(torch), ta))
    close_tree(A.jacobian(vector_fn(tapegrad), ga, strategy="forward-mode"),
               Tt.jacobian(vector_fn(torch), ta))
    close_tree(A.hessian(scalar_fn(tapegrad), ga), Tt.hessian(scalar_fn(torch), ta), 1e-11)
    for name in ("hvp", "vhp"):
        close_tree(getattr(A, name)(scalar_fn(tapegrad), ga, gv),
                   getattr(Tt, name)(scalar_fn(torch), ta, tv), 1e-11)
    ct = RNG.standard_normal(5)
    close_tree(A.vjp(vector_fn(tapegrad), ga, tapegrad.tensor(ct)),
               Tt.vjp(vector_fn(torch), ta, torch.tensor(ct)))
    close_tree(A.jvp(vector_fn(tapegrad), ga, gv), Tt.jvp(vector_fn(torch), ta, tv))


def test_check_grads_passes_and_catches_a_wrong_rule():
    x = tapegrad.tensor(X[0])
    gf.check_grads(lambda x: (x.sin() * x).sum() * x, (x,), order=2)

    class Wrong(tapegrad.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x * x

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            return 3 * g * x  # should be 2 g x

    with pytest.raises(AssertionError, match="reverse mode"):
        gf.check_grads(lambda x: Wrong.apply(x), (x,), order=1, modes=("rev",))


def test_rule_coverage_lists():
    """Which ops have a written or derived rule; the rest fall back (listed here)."""
    from tapegrad.ops.registry import REGISTRY

    jvp_fallback = set(gf.jvp_fallback_ops())
    for name in ("mul", "exp", "sum", "reshape", "matmul", "linear", "softmax",
                 "log_softmax", "conv2d", "max", "max_dim", "logsumexp", "cat", "getitem"):
        assert name not in jvp_fallback, name
    batched = set(gf.batch_rule_ops())
    for name in ("mul", "exp", "sum", "mean", "reshape", "permute", "broadcast_to", "sum_to",
                 "getitem", "cat", "stack", "matmul", "linear", "softmax", "log_softmax",
                 "layer_norm", "max", "max_dim"):
        assert name in batched, name
    diff = [n for n, o in REGISTRY.items() if o.differentiable]
    assert len(batched & set(diff)) > len(diff) // 2


def test_every_registered_op_has_a_forward_rule():
    """A written JVP rule (@op.jvp) or a derived one (pointwise/linear) for every op: none
    takes the reverse-mode fallback."""
    assert gf.jvp_fallback_ops() == []


def test_jvp_fallback_warns_naming_the_op():
    from tapegrad.ops.registry import Op

    def fwd(a):  # an op with a gradient rule only (not registered: REGISTRY stays as is)
        return a * a * a

    cube = Op(fwd, "test_cube_without_jvp", 3, "inputs", False, False, True, False, False,
              False)
    cube.grad(lambda g, out, a: g * 3 * a * a)
    x, v = tapegrad.tensor(X), tapegrad.tensor(V)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        _, t = gf.jvp(cube, (x,), (v,))
    assert any("test_cube_without_jvp" in str(m.message) for m in w)
    assert_close(t, torch.tensor(3 * X * X * V))


def test_jvp_through_in_place_ops_matches_torch():
    def f(T):
        def run(x):
            y = x * 2
            y[1:].mul_(x[1:].exp())
            y.T[0].add_(x[:, 1])
            return y.sin()
        return run

    ga, ta = pair(X)
    gv, tv = pair(V)
    close_tree(gf.jvp(f(tapegrad), (ga,), (gv,)), tf.jvp(f(torch), (ta,), (tv,)))


RANDOM_FNS = {
    "rand": lambda T, x: x * 0 + T.rand(4, dtype=x.dtype),
    "randn_like": lambda T, x: x * 0 + T.randn_like(x),
    "randint": lambda T, x: x * 0 + T.randint(0, 1000, (4,)).to(x.dtype),
    "normal": lambda T, x: x * 0 + T.normal(0.0, 1.0, size=(4,), dtype=x.dtype),
    "bernoulli": lambda T, x: T.bernoulli(x * 0 + 0.5),
    "bernoulli_unbatched": lambda T, x: x * 0 + T.bernoulli(T.full((4,), 0.5, dtype=x.dtype)),
    "dropout": lambda T, x: T.nn.functional.dropout(x * 0 + 1, 0.5),
}


def _random_behaviour(lib, vmap, fn, randomness):
    x = lib.zeros(16, 4, dtype=lib.float64)
    try:
        out = vmap(lambda x: fn(lib, x), randomness=randomness)(x)
    except RuntimeError as e:
        return "error: " + ("randomness error mode" if "randomness error mode" in str(e)
                            else "same randomness with a batched" if "same randomness" in str(e)
                            else str(e))
    o = out.numpy()
    assert o.shape == (16, 4)
    return "rows equal" if (o == o[:1]).all() else "rows differ"


@pytest.mark.parametrize("randomness", ["error", "same", "different"])
@pytest.mark.parametrize("name", list(RANDOM_FNS))
def test_vmap_randomness_as_torch(name, randomness):
    """Random ops are seen by the vmap level: 'error' refuses them, 'same' draws once for the
    batch (refused for a batched input to bernoulli), 'different' draws per example."""
    fn = RANDOM_FNS[name]
    got = _random_behaviour(tapegrad, gf.vmap, fn, randomness)
    want = _random_behaviour(torch, tf.vmap, fn, randomness)
    assert got == want, (got, want)


def test_vmap_randomness_nested_and_seeded():
    inner = gf.vmap(lambda x: x * 0 + tapegrad.rand(()), randomness="same")
    out = gf.vmap(inner, randomness="different")(tapegrad.zeros(3, 5)).numpy()
    assert (out == out[:, :1]).all() and len(set(out[:, 0])) == 3
    inner = gf.vmap(lambda x: x * 0 + tapegrad.rand(()), randomness="different")
    out = gf.vmap(inner, randomness="same")(tapegrad.zeros(3, 5)).numpy()
    assert (out == out[:1]).all() and len(set(out[0])) == 5
    # the draws come from tapegrad's stream: reproducible under manual_seed
    f = gf.vmap(lambda x: tapegrad.nn.functional.dropout(x + 1, 0.5), randomness="different")
    tapegrad.manual_seed(3)
    a = f(tapegrad.zeros(8, 10)).numpy()
    tapegrad.manual_seed(3)
    assert (f(tapegrad.zeros(8, 10)).numpy() == a).all()
    assert set(np.unique(a)) <= {0.0, 2.0} and 0.2 < (a == 0).mean() < 0.8


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_vmap_grad_cross_entropy_class_indices(reduction):
    """cross_entropy with batched class indices (its batch rules; ignore_index rows, and an
    example whose rows are all ignored: nan for 'mean', as PyTorch)."""
    x = RNG.standard_normal((4, 5, 3))
    t = RNG.integers(0, 3, (4, 5))
    t[1, 2] = -100
    t[3] = -100
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no loop fallback

        def f(T, fn):
            def loss(x, t):
                return T.nn.functional.cross_entropy(x, t, reduction=reduction)
            return fn.vmap(fn.grad_and_value(loss), in_dims=(0, 0))

        got = f(tapegrad, gf)(tapegrad.tensor(x), tapegrad.tensor(t))
    want = f(torch, tf)(torch.tensor(x), torch.tensor(t))
    for a, b in zip(got, want):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-12, atol=1e-15)


def test_vmap_grad_max_pool2d_has_batch_rules():
    x = RNG.standard_normal((3, 2, 2, 5, 5))

    def f(T, fn):
        return fn.vmap(fn.grad_and_value(
            lambda x: (T.nn.functional.max_pool2d(x, 2, stride=1) ** 2).sum()))

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no loop fallback
        got = f(tapegrad, gf)(tapegrad.tensor(x))
    close_tree(got, f(torch, tf)(torch.tensor(x)))


# --- batch rules: every op has one; each checked with mixed in_dims against torch.func.vmap ------
def test_every_registered_op_has_a_batch_rule():
    """Every op runs under vmap by its batch rule (written or derived), none by the loop over
    the batch; ops whose output shape depends on the values have a rule that refuses them, as
    torch.func.vmap does (tested below)."""
    from tapegrad.ops.registry import REGISTRY

    batched = set(gf.batch_rule_ops())
    assert sorted(n for n in REGISTRY if n not in batched) == []


def _spd(n):
    a = RNG.standard_normal((n, n))
    return a @ a.T + n * np.eye(n)


def _F(T):
    return T.nn.functional


_IDX = np.array([[0, 4, 2], [1, 1, 3]])
_SIDX = np.array([[0, 1, 0, 2, 1], [2, 2, 0, 1, 0], [1, 0, 0, 0, 2]])
_XT = RNG.standard_normal((4, 5))
_XT[1, 2] = _XT[1, 3]  # a tie
_BATCH_ROWS = {
    "sort": (lambda T, a: tuple(T.sort(a, dim=0, descending=True)), [_XT]),
    "argsort": (lambda T, a: T.argsort(a, dim=1), [_XT]),
    "topk": (lambda T, a: tuple(T.topk(a, 2, dim=-1, largest=False)), [_XT]),
    "kthvalue": (lambda T, a: tuple(T.kthvalue(a, 2, dim=1, keepdim=True)), [_XT]),
    "median_dim": (lambda T, a: tuple(T.median(a, dim=0)), [_XT]),
    "median": (lambda T, a: a.median(), [_XT]),
    "mode": (lambda T, a: tuple(T.mode(T.round(a), dim=1)), [_XT]),
    "cummax": (lambda T, a: tuple(T.cummax(a, dim=1)), [_XT]),
    "cumprod": (lambda T, a: T.cumprod(a, 1), [_XT]),
    "logcumsumexp": (lambda T, a: T.logcumsumexp(a, 0), [_XT]),
    "all": (lambda T, a: (a > 0).all(1), [_XT]),
    "any": (lambda T, a: (a > 0).any(), [_XT]),
    "binary_cross_entropy": (lambda T, a, t: _F(T).binary_cross_entropy(T.sigmoid(a),
                                                                         T.sigmoid(t)), [X, V]),
    "nll_loss": (lambda T, a: _F(T).nll_loss(T.log_softmax(a, 1), T.tensor([1, 0, 3])), [X]),
    "cross_entropy_probs": (lambda T, a, t: _F(T).cross_entropy(a, T.softmax(t, 1)), [X, V]),
    "linear_relu": (lambda T, x, w, b: T.relu(_F(T).linear(x, w, b)), [X, W.T, B]),
    "cholesky": (lambda T, a: T.linalg.cholesky(a), [_spd(3)]),
    "slogdet": (lambda T, a: tuple(T.linalg.slogdet(a)), [_spd(3)]),
    "eigh": (lambda T, a: T.linalg.eigh(a)[0], [_spd(3)]),
    "pinv": (lambda T, a: T.linalg.pinv(a), [X]),
    "qr": (lambda T, a: tuple(T.linalg.qr(a)), [X]),
    "svdvals": (lambda T, a: T.linalg.svdvals(a), [X]),
    "solve": (lambda T, a, b: T.linalg.solve(a, b), [_spd(3), X[:, :2]]),
    "solve_triangular": (lambda T, a, b: T.linalg.solve_triangular(a, b, upper=True),
                         [_spd(3), X[:, :2]]),
    "lstsq_gelsd": (lambda T, a, b: tuple(T.linalg.lstsq(a, b, driver="gelsd")),
                    [XB[:5, :3], XB[:5, 3:]]),
    "cross": (lambda T, a, b: T.linalg.cross(a, b), [X[:, :3], V[:, :3]]),
    "diag_embed": (lambda T, a: T.diag_embed(a, offset=1, dim1=0, dim2=2), [X]),
    "setitem_advanced": (lambda T, a, v: _setitem(a * 1, (T.tensor([0, 2]),), v), [X, V[0]]),
    "scatter_reduce": (lambda T, a, s: a.scatter_reduce(1, T.tensor(_SIDX), s, reduce="amax",
                                                        include_self=False), [_XT[:3], X @ W]),
    "einsum": (lambda T, a, b, c: T.einsum("ij,jk,k->i", a, b, c), [X, W, B]),
    "embedding": (lambda T, w: _F(T).embedding(T.tensor(_IDX), w), [XB[:5, :3]]),
    "layer_norm": (lambda T, x, w, b: _F(T).layer_norm(x, (4,), w, b), [X, V[0], V[1]]),
    "batch_norm": (lambda T, x, w, b: _F(T).batch_norm(x, None, None, w, b, training=True),
                   [X, V[0], V[1]]),
    "conv2d_groups": (lambda T, x, w: _F(T).conv2d(x, w, groups=2, stride=2, padding=1),
                      [RNG.standard_normal((2, 4, 5, 5)), RNG.standard_normal((6, 2, 3, 3))]),
    "avg_pool2d": (lambda T, x: _F(T).avg_pool2d(x, 2, padding=1, count_include_pad=False),
                   [RNG.standard_normal((2, 3, 5, 5))]),
    "sdpa_float_mask": (lambda T, q, k, v, m: _F(T).scaled_dot_product_attention(q, k, v,
                                                                                   attn_mask=m),
                        [RNG.standard_normal((2, 2)), RNG.standard_normal((3, 2)),
                         RNG.standard_normal((3, 2)), np.where(np.eye(2, 3) > 0, -np.inf, 0.5)]),
    "inplace_on_views": (lambda T, x, r: _views_inplace(x, r), [X, V[0]]),
    "quantile": (lambda T, a: T.quantile(a, T.tensor([0.2, 0.7], dtype=a.dtype), dim=1,
                                         keepdim=True), [_XT]),
    "nanquantile_nan": (lambda T, a: T.nanquantile(a, 0.4, dim=0, interpolation="midpoint"),
                        [np.where(np.eye(4, 5) > 0, np.nan, _XT)]),
    "histc": (lambda T, a: T.histc(a, bins=5), [_XT]),
    "searchsorted": (lambda T, s, v: T.searchsorted(T.sort(s, dim=-1)[0], v, right=True),
                     [_XT, _XT]),
}
_NO_GRAD = ("all", "any", "argsort", "nanquantile_nan", "histc", "searchsorted")


def _setitem(a, key, v):
    a[key] = v
    return a


def _views_inplace(x, r):
    y = x * 2
    y[1:].mul_(r)
    y[:, ::3].zero_()
    y.T[1].add_(r[:3])
    return y * x


def _with_grad(fn):
    """The gradient of a scalar of ``fn``'s float outputs w.r.t. its first input."""
    def g(T, *xs):
        def loss(a):
            outs = fn(T, a, *xs[1:])
            outs = outs if isinstance(outs, tuple) else (outs,)
            return sum((o * o).sum() for o in outs if o.dtype.is_floating_point)

        return T.func.grad(loss)(xs[0])

    return g


def _in_dims(n):
    """Every input batched at 0, each in turn at dim 1 with the others unbatched."""
    return [(0,) * n] + [tuple(1 if j == i else None for j in range(n)) for i in range(n)]


@pytest.mark.parametrize("name", list(_BATCH_ROWS))
def test_batch_rules_against_torch_func_vmap(name):
    fn, arrays = _BATCH_ROWS[name]
    rng = np.random.default_rng(5)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="vmap: there is no batching rule")
        for dims in _in_dims(len(arrays)):
            args = [np.stack([a] + [a + 0.1 * rng.standard_normal(a.shape) for _ in range(2)],
                             axis=d) if d is not None else a for a, d in zip(arrays, dims)]
            for f in (fn, _with_grad(fn)) if name not in _NO_GRAD else (fn,):
                if f is not fn and name in ("inplace_on_views", "setitem_advanced"):
                    continue  # in-place on a batched tensor that requires grad: refused (below)
                try:
                    got = gf.vmap(lambda *xs: f(tapegrad, *xs), in_dims=dims)(
                        *[tapegrad.tensor(a) for a in args])
                except RuntimeError:  # refused: only where torch.func.vmap refuses it too
                    with pytest.raises(RuntimeError):
                        tf.vmap(lambda *xs: f(torch, *xs), in_dims=dims)(
                            *[torch.tensor(a) for a in args])
                    continue
                want = tf.vmap(lambda *xs: f(torch, *xs), in_dims=dims)(
                    *[torch.tensor(a) for a in args])
                close_tree(got, want, rtol=1e-10, what=f"{name} in_dims={dims}")


def test_vmap_refuses_as_torch_where_the_shape_depends_on_the_values():
    x = RNG.standard_normal((3, 5))
    for fn in (lambda T, a: T.unique(a), lambda T, a: T.bincount(T.round(a * a).long()),
               lambda T, a: T.nonzero(a > 0)):
        for T, vmap in ((tapegrad, gf.vmap), (torch, tf.vmap)):
            with pytest.raises(RuntimeError):
                vmap(lambda a: fn(T, a))(T.tensor(x))
    # an unbatched tensor written with a batched value: refused, as PyTorch
    for T, vmap in ((tapegrad, gf.vmap), (torch, tf.vmap)):
        with pytest.raises(RuntimeError, match="vmapped over"):
            vmap(lambda a: T.zeros(5, dtype=a.dtype).copy_(a))(T.tensor(x))


def test_vmap_inplace_on_a_batched_tensor_that_requires_grad_raises():
    def f(x):
        y = x * 2
        y[1:].mul_(x[0])
        return (y * y).sum()

    with pytest.raises(RuntimeError, match="in-place op on a batched tensor"):
        gf.vmap(gf.grad(f))(tapegrad.tensor(RNG.standard_normal((3, 4))))
    with pytest.raises(RuntimeError, match="in-place op on a batched tensor"):
        gf.grad(lambda xb: gf.vmap(lambda x: (x * 2).mul_(x))(xb).sum())(
            tapegrad.tensor(RNG.standard_normal((3, 4))))


def test_sparse_and_scatter_rules_match_the_loop():
    idx = np.array([[0, 1, 1, 2, 0], [1, 0, 2, 2, 1]])
    vals, dense = RNG.standard_normal((3, 5)), RNG.standard_normal((3, 4, 2))

    def spmm(v, d):
        return tapegrad.sparse.mm(tapegrad.sparse_coo_tensor(tapegrad.tensor(idx), v, (3, 4)), d)

    def to_dense(v):
        return tapegrad.sparse_coo_tensor(tapegrad.tensor(idx), v, (3, 3)).coalesce().to_dense()

    for f, args in ((spmm, (vals, dense)), (to_dense, (vals,)),
                    (gf.grad(lambda v, d: (spmm(v, d) ** 2).sum(), argnums=(0, 1)),
                     (vals, dense))):
        with warnings.catch_warnings():
            warnings.filterwarnings("error", message="vmap: there is no batching rule")
            got = gf.vmap(f)(*[tapegrad.tensor(a) for a in args])
        each = [f(*[tapegrad.tensor(a[i]) for a in args]) for i in range(3)]
        if isinstance(got, tuple):
            for k, g in enumerate(got):
                assert_close(g, np.stack([e[k].numpy() for e in each]))
        else:
            assert_close(got, np.stack([e.numpy() for e in each]))


def test_vmap_repr_of_a_batched_tensor_shows_the_physical_values():
    seen = []
    gf.vmap(lambda x: seen.append(repr(x)) or x * 2, in_dims=1)(tapegrad.tensor(X))
    assert seen[0].startswith("BatchedTensor(bdim=1, value=\ntensor([[") and "0.1257" in seen[0]
