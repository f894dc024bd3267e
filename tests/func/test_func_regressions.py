"""Gradient rules that must compose with forward mode and vmap (hessian, vmap(grad), ...),
the transforms' dtype checks, printing of huge views, Tensor's is_<device> flags and
spmm of dense matrices, each against PyTorch 2.13.

Values are float64 and compared at rtol 1e-12 (scaled to the largest entry): both libraries
evaluate the same closed forms (softmax, products, selections) in a few float64 operations,
so they agree to a few ulps; a wrong rule is off by O(1)."""
import tracemalloc
import warnings

import numpy as np
import pytest
import torch
import torch.func as tf
import torch.nn.functional as TF

import tapegrad
import tapegrad.func as gf
import tapegrad.nn.functional as GF
from helpers import assert_close

RNG = np.random.default_rng(7)
X = RNG.standard_normal((3, 4))
XZ = X.copy()
XZ[0, 0] = XZ[1, 2] = 0.0  # zeros: prod's and cumprod's zero-safe rules
XB = RNG.standard_normal((2, 3, 4))
TB = np.array([[1, 0, 3], [2, 2, 0]])  # class indices per example
T = TB[0]


def lib(M):
    """(module, func, functional) of torch or tapegrad."""
    return (torch, tf, TF) if M is torch else (tapegrad, gf, GF)


def losses(M):
    _, _, F = lib(M)
    t = M.tensor(T)
    return {
        "cross_entropy": lambda x: F.cross_entropy(x, t),
        "cross_entropy_sum": lambda x: F.cross_entropy(x, t, reduction="sum"),
        "cross_entropy_ignore": lambda x: F.cross_entropy(x, t, ignore_index=0),
        "cross_entropy_all_ignored": lambda x: F.cross_entropy(x, t * 0 + 2, ignore_index=2),
        "nll_log_softmax": lambda x: F.nll_loss(F.log_softmax(x, 1), t),
        "max_keepdim": lambda x: (x.max(1, keepdim=True)[0] ** 3).sum(),
        "max": lambda x: (x.max(0)[0] ** 3).sum(),
        "min_keepdim": lambda x: (x.min(1, keepdim=True)[0] ** 3).sum(),
        "amax_keepdim": lambda x: (x.amax(1, keepdim=True) ** 3).sum(),
        "amin_keepdim": lambda x: (x.amin(0, keepdim=True) ** 3).sum(),
        "median_keepdim": lambda x: (x.median(1, keepdim=True)[0] ** 3).sum(),
        "nanmedian_keepdim": lambda x: (x.nanmedian(1, keepdim=True)[0] ** 3).sum(),
        "kthvalue_keepdim": lambda x: (x.kthvalue(2, 1, keepdim=True)[0] ** 3).sum(),
        "kthvalue": lambda x: (x.kthvalue(2, 1)[0] ** 3).sum(),
        "mode_keepdim": lambda x: (x.mode(1, keepdim=True)[0] ** 3).sum(),
        "prod_dim": lambda x: x.prod(0).sum(),
        "prod_keepdim": lambda x: (x.prod(1, keepdim=True) ** 2).sum(),
        "prod_all": lambda x: x.prod(),
        "cumprod": lambda x: (x.cumprod(1) ** 2).sum(),
    }


SECOND_ORDER = {
    "hessian": lambda fn, f: fn.hessian(f),
    "jacfwd_jacrev": lambda fn, f: fn.jacfwd(fn.jacrev(f)),
    "jacrev_jacrev": lambda fn, f: fn.jacrev(fn.jacrev(f)),
    # each row of x its own example: the gradient rule runs on batched values
    "vmap_grad": lambda fn, f: fn.vmap(fn.grad(lambda r: f(r.reshape(1, -1).expand(3, -1)))),
}


def _run(M, transform, name, data):
    _, fn, _ = lib(M)
    x = M.tensor(data, dtype=M.float64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return SECOND_ORDER[transform](fn, losses(M)[name])(x)


@pytest.mark.parametrize("transform", sorted(SECOND_ORDER))
@pytest.mark.parametrize("name", sorted(losses(torch)))
@pytest.mark.parametrize("data", ["X", "XZ"])
def test_second_order_transforms_match_torch_func(transform, name, data):
    arr = {"X": X, "XZ": XZ}[data]
    if name.startswith("mode") and data == "XZ":
        pytest.skip("XZ's tied zeros: which of them mode picks is each library's own choice")
    expected = _run(torch, transform, name, arr)
    assert_close(_run(tapegrad, transform, name, arr), expected, rtol=1e-12,
                 what=f"{transform} of {name} on {data}")


BATCHED = {
    # class indices batched beside the logits: the rules build the one-hot from ops
    "vmap_hessian_cross_entropy": lambda M, fn, F: fn.vmap(
        fn.hessian(lambda x, t: F.cross_entropy(x, t))),
    "vmap_hessian_cross_entropy_ignore": lambda M, fn, F: fn.vmap(
        fn.hessian(lambda x, t: F.cross_entropy(x, t, ignore_index=2))),
    "vmap_jvp_grad_cross_entropy": lambda M, fn, F: fn.vmap(
        lambda x, t: fn.jvp(fn.grad(lambda x: F.cross_entropy(x, t)), (x,), (x * x,))[1]),
    # an index batched by an outer vmap reaching put_along / take_along_reduce inside an inner
    # one (it read the placeholder's zeros: silently wrong)
    "vmap_jacrev_grad_max": lambda M, fn, F: fn.vmap(fn.jacrev(fn.grad(
        lambda x, t: (x.max(1, keepdim=True)[0] ** 3).sum()))),
    "vmap_hessian_max": lambda M, fn, F: fn.vmap(fn.hessian(
        lambda x, t: (x.max(1, keepdim=True)[0] ** 3).sum())),
    "vmap_hessian_kthvalue": lambda M, fn, F: fn.vmap(fn.hessian(
        lambda x, t: (x.kthvalue(2, 1)[0] ** 3).sum())),
    "vmap_hessian_prod": lambda M, fn, F: fn.vmap(fn.hessian(lambda x, t: x.prod(1).sum())),
}


@pytest.mark.parametrize("name", sorted(BATCHED))
def test_nested_transforms_with_batched_inputs_match_torch_func(name):
    def run(M):
        m, fn, F = lib(M)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return BATCHED[name](m, fn, F)(M.tensor(XB, dtype=M.float64), M.tensor(TB))

    assert_close(run(tapegrad), run(torch), rtol=1e-12, what=name)


def test_vmap_grad_prod_with_zeros_in_some_examples():
    # one decision for the physical batch: examples without zeros take the zero-safe rule too
    def run(M):
        _, fn, _ = lib(M)
        return fn.vmap(fn.grad(lambda r: r.prod()))(M.tensor(XZ, dtype=M.float64))

    assert_close(run(tapegrad), run(torch), rtol=1e-12)


# --- integer inputs and outputs of the transforms -------------------------------------------
def test_jvp_refuses_integer_primals_and_tangents_as_torch():
    i, f = tapegrad.tensor([1, 2]), tapegrad.tensor([1.0, 2.0])
    ti, tf_ = torch.tensor([1, 2]), torch.tensor([1.0, 2.0])
    for prim, tang, tprim, ttang, what in ((i, i, ti, ti, "primal"), (f, i, tf_, ti, "tangent"),
                                          (i, f, ti, tf_, "primal")):
        with pytest.raises(ValueError, match=f"Expected {what} to be floating point or "
                                             "complex, but got: torch.int64"):
            tf.jvp(lambda x: x * 2, (tprim,), (ttang,))
        with pytest.raises(ValueError, match=rf"^jvp\(f, primals, tangents\): Expected {what} "
                                             r"to be floating point or complex, but got: "
                                             r"tapegrad.int64 \(shape \(2,\)\)"):
            gf.jvp(lambda x: x * 2, (prim,), (tang,))
    with pytest.raises(ValueError, match="^jacfwd: Expected primal .* tapegrad.int64"):
        gf.jacfwd(lambda x: x * 2)(i)
    with pytest.raises(ValueError, match="Expected primal .* tapegrad.int64"):
        gf.hessian(lambda x: (x * 2).sum())(i)
    # half precision stays differentiable
    out, t = gf.jvp(lambda x: x * 2, (f.half(),), (f.half(),))
    assert t.dtype == tapegrad.float16 and t.tolist() == [2.0, 4.0]


def test_vjp_and_jacrev_refuse_integer_outputs_as_torch():
    f, tf_ = tapegrad.tensor([1.0, 2.0]), torch.tensor([1.0, 2.0])
    msg = "All outputs of f must be floating-point or complex Tensors, got Tensor with dtype"
    with pytest.raises(RuntimeError, match=msg + " torch.int64"):
        tf.jacrev(lambda x: (x * 2).long())(tf_)
    for call in (lambda: gf.jacrev(lambda x: (x * 2).long())(f),
                 lambda: gf.vjp(lambda x: (x * 2).long(), f)):
        with pytest.raises(RuntimeError, match=r"^vjp\(f, \.\.\.\): " + msg
                           + r" tapegrad.int64 \(shape \(2,\)\)"):
            call()
    # as torch.func: grad of an integer-valued function is zeros, jacfwd's integer zeros
    assert tf.grad(lambda x: (x * 2).long().sum())(tf_).tolist() == \
        gf.grad(lambda x: (x * 2).long().sum())(f).tolist() == [0.0, 0.0]
    j = gf.jacfwd(lambda x: (x * 2).long())(f)
    assert j.dtype == tapegrad.int64 and j.tolist() == [[0, 0], [0, 0]]


# --- printing of views that are too big to copy ----------------------------------------------
def test_repr_of_a_huge_expanded_view_summarises_without_copying():
    for shape, base in (((2 ** 40,), (1,)), ((3, 2 ** 40), (3, 1)), ((2 ** 20, 5, 2 ** 20),
                                                                    (1, 5, 1))):
        values = np.arange(float(np.prod(base))).reshape(base) + 0.5
        ours = repr(tapegrad.tensor(values, dtype=tapegrad.float32).expand(*shape))
        theirs = repr(torch.tensor(values, dtype=torch.float32).expand(*shape))
        assert ours == theirs, (ours, theirs)
        assert "..." in ours


def test_repr_of_a_large_expanded_view_allocates_only_what_it_shows():
    t = tapegrad.tensor([1.5, -2.0]).reshape(2, 1).expand(2, 10 ** 8 // 2)
    tracemalloc.start()
    try:
        text = repr(t)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    # a copy would be 1e8 floats (hundreds of MB); the corners are a few dozen
    assert peak < 1_000_000, peak
    assert text == repr(torch.tensor([1.5, -2.0]).reshape(2, 1).expand(2, 10 ** 8 // 2))


@pytest.mark.parametrize("shape", [(2000,), (40, 40), (7, 200), (3, 4, 100), (1001,),
                                   (8, 8, 8, 8), (5,), (2, 3)])
def test_repr_matches_torch_around_the_summary_threshold(shape):
    n = int(np.prod(shape))
    a = RNG.standard_normal(shape) * np.logspace(-3, 3, n).reshape(shape)
    assert repr(tapegrad.tensor(a)) == repr(torch.tensor(a)).replace("torch.", "tapegrad.")
    b = np.arange(n).reshape(shape)
    assert repr(tapegrad.tensor(b)) == repr(torch.tensor(b))


# --- Tensor's is_<device> flags --------------------------------------------------------------
def test_tensor_has_every_is_flag_torch_tensor_has_with_its_value():
    t, g = torch.zeros(1), tapegrad.zeros(1)
    flags = [n for n in dir(t) if n.startswith("is_") and not callable(getattr(t, n))]
    assert "is_xpu" in flags and "is_mps" in flags
    for n in flags:
        assert getattr(g, n) == getattr(t, n), n
    s = tapegrad.zeros(2).to_sparse()
    assert s.is_sparse and not s.is_xpu and not s.is_sparse_csr and s.is_cpu


# --- spmm / sparse.mm of dense matrices ------------------------------------------------------
@pytest.mark.parametrize("name", ["spmm", "sparse.mm"])
def test_spmm_of_dense_matrices_is_their_product_as_torch(name):
    a, b = RNG.standard_normal((2, 3)), RNG.standard_normal((3, 4))

    def run(M):
        fn = M.spmm if name == "spmm" else M.sparse.mm
        x = M.tensor(a, requires_grad=True)
        y = M.tensor(b, requires_grad=True)
        out = fn(x, y)
        assert out.layout == M.strided
        (out * M.tensor(b[:2, :])).sum().backward()
        return out, x.grad, y.grad

    for ours, theirs in zip(run(tapegrad), run(torch)):
        assert_close(ours, theirs, rtol=1e-12)
    # a sparse second operand too (dense result)
    assert_close(tapegrad.spmm(tapegrad.tensor(a), tapegrad.tensor(b).to_sparse()),
                 torch.spmm(torch.tensor(a), torch.tensor(b).to_sparse()), rtol=1e-12)


def test_spmm_of_dense_matrices_names_itself_in_errors():
    a = tapegrad.randn(2, 3)
    with pytest.raises(RuntimeError, match=r"^spmm: shapes \(2, 3\) and \(4, 4\) cannot be "
                                           r"multiplied \(3 != 4\)"):
        tapegrad.spmm(a, tapegrad.randn(4, 4))
    with pytest.raises(RuntimeError, match=r"^sparse.mm: expected 2-D matrices, got shapes "
                                           r"\(2, 3\) and \(3,\)"):
        tapegrad.sparse.mm(a, tapegrad.randn(3))
    with pytest.raises(RuntimeError, match="^spmm: expected both operands to have the same "
                                           "dtype, but got tapegrad.float64 and "
                                           "tapegrad.float32"):
        tapegrad.spmm(a.double(), tapegrad.randn(3, 4))


# --- vmap's placeholder arrays ---------------------------------------------------------------
def test_broadcasting_a_batched_placeholder_raises_instead_of_giving_zeros():
    # np.broadcast_to of a batched tensor's array returned a plain array of the placeholder's
    # zeros: index code that broadcast a batched index selected entry 0 of every example
    seen = []

    def f(r):
        with pytest.raises(RuntimeError, match="vmap: It looks like you're attempting to use"):
            np.broadcast_to(r._data, (2,) + tuple(r.shape))
        seen.append(True)
        return r * 2

    out = gf.vmap(f)(tapegrad.tensor(X))
    assert seen and out.tolist() == (2 * X).tolist()


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_jacrev_of_jacrev_through_a_two_input_pointwise_rule(approximate):
    # gelu's gradient is the pointwise op gelu_backward(g, x): under the inner jacrev's vmap
    # only g is batched, and the physical node the outer jacrev differentiates must see x
    # expanded to the batch (numpy's broadcasting gave x a gradient of the batched shape)
    def run(M):
        _, fn, F = lib(M)
        f = lambda x: (F.gelu(x, approximate=approximate) ** 2).sum()  # noqa: E731
        x = M.tensor(X, dtype=M.float64)
        return fn.jacrev(fn.jacrev(f))(x), fn.vmap(fn.jacrev(fn.jacrev(f)))(x)

    for ours, theirs in zip(run(tapegrad), run(torch)):
        assert_close(ours, theirs, rtol=1e-12)


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_vmap_cross_entropy_with_batched_targets_runs_its_batch_rules(reduction):
    # example 1 ignores every row: its loss is nan, its gradient 0 (as PyTorch); targets
    # batched beside the logits, under two levels (vmap of jacrev), take the batch rules
    # built from ops, with no loop over the batch
    tb = np.array([[1, 0, 3], [2, 2, 2]])

    def run(M):
        _, fn, F = lib(M)
        f = lambda x, t: F.cross_entropy(x, t, ignore_index=2, reduction=reduction)  # noqa
        x, t = M.tensor(XB, dtype=M.float64), M.tensor(tb)
        return (fn.vmap(f)(x, t), fn.vmap(fn.grad(f))(x, t),
                fn.vmap(fn.jacrev(fn.grad(f)))(x, t))

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # vmap's loop fallback warns
        ours = run(tapegrad)
    for a, b in zip(ours, run(torch)):
        assert_close(a, b, rtol=1e-12, atol=1e-12)  # the values are O(1); the nan is matched


def test_vmap_grad_of_var_without_degrees_of_freedom():
    # one element per example: PyTorch's gradient is nan (inf where the element is off its
    # mean); the rule built its inf with numpy from the batched placeholder
    def run(M):
        _, fn, _ = lib(M)
        x = M.tensor([[1.5], [2.0]], dtype=M.float32)
        return fn.vmap(fn.grad(lambda r: r.var()))(x)

    ours, theirs = run(tapegrad), run(torch)
    assert ours.dtype == tapegrad.float32
    np.testing.assert_array_equal(ours.numpy(), theirs.numpy())


# --- gathers and class-index losses with indices batched by vmap ----------------------------
# The indices' placeholder holds no values: the gathers take the index Tensor as an op's param
# (batched by its rule) and the losses build their targets by ops. Values are picked, summed
# or differentiated in a few float64 operations on both sides: 1e-12 as above.
XG = RNG.standard_normal((3, 5, 4))
IG = RNG.integers(-5, 5, (3, 2, 4))  # take_along_dim wraps negative indices
IG1 = RNG.integers(0, 5, (3, 2, 1))  # broadcasts along dim 1; gathers a part of dim 1
IV = RNG.integers(0, 5, (3, 6))


def _gathers(M):
    return {
        "take_along_both": (lambda x, i: M.take_along_dim(x, i, dim=0), (XG, IG), (0, 0)),
        "take_along_index_only": (lambda x, i: M.take_along_dim(x, i, dim=0), (XG[0], IG),
                                  (None, 0)),
        "take_along_broadcast": (lambda x, i: M.take_along_dim(x, i, dim=0), (XG, IG1), (0, 0)),
        "take_along_flat": (lambda x, i: M.take_along_dim(x, i), (XG, IV * 3), (0, 0)),
        "take_along_dim1": (lambda x, i: M.take_along_dim(x, i, dim=-1), (XG[0], IG1[:, :1]),
                            (None, 0)),
        "gather_part": (lambda x, i: M.gather(x, 0, i), (XG, IG1), (0, 0)),
        "gather_index_only": (lambda x, i: M.gather(x, 1, i), (XG[0], IG % 4), (None, 0)),
        "index_select": (lambda x, i: M.index_select(x, 0, i), (XG, IV), (0, 0)),
        "index_select_index_only": (lambda x, i: M.index_select(x, 1, i), (XG[0], IV % 4),
                                    (None, 0)),
        "scatter_add_part": (lambda x, i: M.scatter_add(x, 0, i, x[:2, :1] ** 2), (XG, IG1),
                             (0, 0)),
    }


@pytest.mark.parametrize("name", list(_gathers(torch)))
def test_vmap_gathers_with_batched_indices(name):
    # numpy indexing with the placeholder read zeros (every example took index 0) or the
    # host read raised; PyTorch computes each example's gather
    def run(M):
        _, fn, _ = lib(M)
        f, (x, i), dims = _gathers(M)[name]
        x, i = M.tensor(x, dtype=M.float64), M.tensor(i)
        return (fn.vmap(f, in_dims=dims)(x, i),
                fn.vmap(fn.jacrev(f), in_dims=dims)(x, i),
                fn.vmap(fn.vmap(f, in_dims=dims), in_dims=(None, 0))(
                    x, M.stack([i, M.flip(i, (0,))])))

    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="vmap")  # no loop over the batch
        ours = run(tapegrad)
    for a, b in zip(ours, run(torch)):
        assert_close(a, b, rtol=1e-12)


@pytest.mark.parametrize("fname", ["gather", "index_select", "scatter_add", "take_along_flat"])
def test_vmap_gathers_batched_index_out_of_range_raises(fname):
    x = tapegrad.tensor(XG)
    bad = IG1.copy()
    bad[2, 1, 0] = 5  # one example's index past the end: the check reads the whole batch
    f = {"gather": lambda x, i: tapegrad.gather(x, 0, i),
         "index_select": lambda x, i: tapegrad.index_select(x, 0, i.reshape(-1)),
         "scatter_add": lambda x, i: tapegrad.scatter_add(x, 0, i, x[:2, :1]),
         "take_along_flat": lambda x, i: tapegrad.take_along_dim(x, i * 4)}[fname]
    with pytest.raises((IndexError, RuntimeError), match="out of (bounds|range)"):
        gf.vmap(f)(x, tapegrad.tensor(bad))


def _class_loss_cases():
    cases = []
    for shape in [(4, 5), (4, 5, 3), (5,)]:
        for reduction in ["none", "mean", "sum"]:
            cases.append(("nll_loss", shape, reduction, {}))
            cases.append(("nll_loss", shape, reduction, {"weight": True, "ignore_index": 1}))
            cases.append(("cross_entropy", shape, reduction, {"weight": True}))
            cases.append(("cross_entropy", shape, reduction,
                          {"label_smoothing": 0.2, "ignore_index": 1}))
            cases.append(("cross_entropy", shape, reduction,
                          {"weight": True, "label_smoothing": 0.1}))
    return cases


@pytest.mark.parametrize("fname,shape,reduction,kw", _class_loss_cases())
def test_vmap_class_index_losses_with_batched_targets(fname, shape, reduction, kw):
    # the general path (class weights, label smoothing, ignore_index, inputs above 2-D) read
    # the batched targets on the host; it builds the target distribution by ops now
    cdim = 0 if len(shape) == 1 else 1
    x = RNG.standard_normal((3,) + shape)
    t = RNG.integers(0, shape[cdim], (3,) + tuple(s for k, s in enumerate(shape) if k != cdim))
    w = RNG.random(shape[cdim]) + 0.5

    def run(M, looped=False):
        _, fn, F = lib(M)
        extra = dict(kw, reduction=reduction)
        if "weight" in extra:
            extra["weight"] = M.tensor(w)
        f = lambda x, t: getattr(F, fname)(x, t, **extra)  # noqa: E731
        xs, ts = M.tensor(x), M.tensor(t)
        if looped:  # torch.func.vmap cannot batch this form (a masked_select inside)
            return tuple(M.stack([g(xs[b], ts[b]) for b in range(3)])
                         for g in (f, fn.jacrev(f)))
        return fn.vmap(f)(xs, ts), fn.vmap(fn.jacrev(f))(xs, ts)

    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="vmap")  # no loop over the batch
        ours = run(tapegrad)
    try:
        theirs = run(torch)
    except RuntimeError as e:
        assert "masked_select" in str(e)
        theirs = run(torch, looped=True)
    for a, b in zip(ours, theirs):  # O(1) values (an example whose targets are all ignored:
        assert_close(a, b, rtol=1e-12, atol=1e-12)  # nan, its gradient 0): atol as rtol


@pytest.mark.parametrize("fname,kw", [("nll_loss", {"weight": True}),
                                      ("nll_loss", {"ignore_index": 2}),
                                      ("cross_entropy", {"label_smoothing": 0.1}),
                                      ("cross_entropy", {"weight": True, "ignore_index": -1})])
@pytest.mark.parametrize("bad", [5, -3])
def test_vmap_class_index_losses_bad_target_raises(fname, kw, bad):
    t = np.array([[[0, 1, 2], [2, 2, 1]], [[1, 1, 0], [4, 3, 2]]])  # (B, N, d), 5 classes
    t[1, 1, 2] = bad  # one example's target out of range (the ignore_index aside)
    if "weight" in kw:
        kw = dict(kw, weight=tapegrad.ones(5, dtype=tapegrad.float64))
    f = lambda x, t: getattr(GF, fname)(x, t, **kw)  # noqa: E731
    x = tapegrad.tensor(RNG.standard_normal((2, 2, 5, 3)))
    with pytest.raises(IndexError, match=f"Target {bad} is out of bounds"):
        gf.vmap(f)(x, tapegrad.tensor(t))
    with pytest.raises(IndexError, match=f"Target {bad} is out of bounds"):
        gf.vmap(gf.grad(f))(x, tapegrad.tensor(t))


def test_index_key_holding_a_batched_placeholder_raises_instead_of_reading_zeros():
    # index_add takes its index array from the Tensor's _data: under vmap the placeholder,
    # whose zeros numpy indexed with (every example added at row 0); the index ops' batch
    # rules refuse it as a read of batched values
    x = tapegrad.tensor(XG)
    with pytest.raises(RuntimeError, match="vmap: It looks like"):
        gf.vmap(lambda x, i: x.index_add(0, i, x[:2]))(x, tapegrad.tensor(IV[:, :2]))


def test_vmap_class_index_losses_with_batched_class_weights():
    # per-example class weights (targets shared): the weights are picked by ops too
    x, t = RNG.standard_normal((4, 5)), np.array([1, 0, 4, 4])
    w = RNG.random((3, 5)) + 0.5

    def run(M):
        _, fn, F = lib(M)
        f = lambda w: F.nll_loss(M.tensor(x), M.tensor(t), weight=w)  # noqa: E731
        return fn.vmap(f)(M.tensor(w))

    assert_close(run(tapegrad), run(torch), rtol=1e-12)
