"""Reductions against PyTorch: values, gradients (ties, zeros), gradcheck, second order."""
import math

import numpy as np
import pytest
import torch

import tapegrad
from helpers import check_op, check_torch

F = dict
INF = math.inf

ROWS = [
    ("sum-all", lambda T, x: x.sum(), [(2, 3)], F()),
    ("sum-dim", lambda T, x: T.sum(x, 1), [(2, 3)], F()),
    ("sum-dims-keepdim", lambda T, x: x.sum((0, 2), keepdim=True), [(2, 3, 2)], F()),
    ("sum-neg-dim", lambda T, x: x.sum(dim=-1), [(2, 3)], F()),
    ("sum-empty-dims", lambda T, x: x.sum(dim=()), [(2, 3)], F()),
    ("sum-dtype", lambda T, x: x.sum(1, dtype=T.float64), [(2, 3)], F()),
    ("sum-0dim", lambda T, x: x.sum(), [()], F()),
    ("mean-all", lambda T, x: T.mean(x), [(2, 3)], F()),
    ("mean-dim", lambda T, x: x.mean(0), [(2, 3)], F()),
    ("mean-dims-keepdim", lambda T, x: x.mean(dim=(1, 2), keepdim=True), [(2, 3, 2)], F()),
    ("var-all", lambda T, x: x.var(), [(2, 3)], F()),
    ("var-dim", lambda T, x: T.var(x, 1), [(2, 3)], F()),
    ("var-correction0", lambda T, x: x.var(0, correction=0, keepdim=True), [(3, 4)], F()),
    ("var-correction2", lambda T, x: x.var(dim=1, correction=2), [(2, 4)], F()),
    ("var-unbiased-false", lambda T, x: T.var(x, 1, False), [(2, 3)], F()),
    ("var-unbiased-positional", lambda T, x: x.var(False), [(2, 3)], F()),
    ("var-unbiased-kw", lambda T, x: x.var(dim=(0, 1), unbiased=True, keepdim=True),
     [(2, 3)], F()),
    ("std-all", lambda T, x: x.std(), [(2, 3)], F()),
    ("std-dim", lambda T, x: T.std(x, 0), [(3, 4)], F()),
    ("std-correction0-keepdim", lambda T, x: x.std(1, correction=0, keepdim=True), [(2, 3)],
     F()),
    ("std-unbiased", lambda T, x: T.std(x, dim=1, unbiased=False), [(2, 3)], F()),
    ("max-all", lambda T, x: x.max(), [(2, 3)], F()),
    ("min-all", lambda T, x: T.min(x), [(2, 3)], F()),
    ("max-dim", lambda T, x: T.max(x, 1), [(2, 3)], F()),
    ("max-dim-keepdim", lambda T, x: x.max(dim=0, keepdim=True), [(3, 4)], F()),
    ("min-dim", lambda T, x: x.min(-1), [(2, 3, 2)], F()),
    ("max-values", lambda T, x: x.max(1).values * 2, [(2, 3)], F()),
    ("min-indices-and-values", lambda T, x: list(T.min(x, 0, True)), [(3, 2)], F()),
    ("amax-all", lambda T, x: T.amax(x), [(2, 3)], F()),
    ("amax-dim", lambda T, x: x.amax(1), [(2, 3)], F()),
    ("amax-dims", lambda T, x: x.amax((0, 2), keepdim=True), [(2, 3, 2)], F()),
    ("amin-dim", lambda T, x: T.amin(x, -1), [(2, 3)], F()),
    ("prod-all", lambda T, x: x.prod(), [(2, 3)], F()),
    ("prod-dim", lambda T, x: T.prod(x, 1), [(2, 3)], F()),
    ("prod-dim-keepdim", lambda T, x: x.prod(0, keepdim=True), [(3, 2)], F()),
    ("prod-dtype", lambda T, x: x.prod(1, dtype=T.float64), [(2, 3)], F()),
    ("logsumexp", lambda T, x: T.logsumexp(x, 1), [(2, 3)], F()),
    ("logsumexp-dims-keepdim", lambda T, x: x.logsumexp((0, 1), keepdim=True), [(2, 3)], F()),
    ("norm", lambda T, x: x.norm(), [(2, 3)], F()),
    ("norm-fro", lambda T, x: T.norm(x, "fro", dim=(0, 1)), [(2, 3)], F()),
    ("norm-3d", lambda T, x: x.norm(), [(2, 3, 4)], F()),
    ("norm-fro-3d", lambda T, x: T.norm(x, "fro"), [(2, 3, 4)], F()),
    ("norm-dim", lambda T, x: T.norm(x, dim=1), [(2, 3)], F()),
    ("norm-p1", lambda T, x: x.norm(p=1, dim=0), [(2, 3)], F(away_from=0.0)),
    ("norm-p3-keepdim", lambda T, x: x.norm(3, 1, True), [(2, 3)], F(away_from=0.0)),
    ("norm-p1.5", lambda T, x: x.norm(1.5), [(2, 3)], F(away_from=0.0)),
    ("norm-p0.5", lambda T, x: x.norm(0.5, dim=1), [(2, 3)], F(away_from=0.0)),
    ("norm-inf", lambda T, x: x.norm(INF, dim=1), [(2, 3)], F()),
    ("norm-neg-inf", lambda T, x: T.norm(x, -INF), [(2, 3)], F()),
    ("norm-p0", lambda T, x: x.norm(0, dim=1) + x.sum(), [(2, 3)], F()),
    ("norm-dtype", lambda T, x: T.norm(x, 2, dim=1, dtype=T.float64), [(2, 3)], F()),
    ("cumsum", lambda T, x: x.cumsum(1), [(2, 3)], F()),
    ("cumsum-dim0", lambda T, x: T.cumsum(x, dim=0), [(3, 2)], F()),
    ("cumsum-neg-dim", lambda T, x: T.cumsum(x, -1), [(2, 2, 3)], F()),
    ("cumsum-dtype", lambda T, x: x.cumsum(0, dtype=T.float64), [(3,)], F()),
    # diamonds: an input reduced and used again
    ("diamond-mean-center", lambda T, x: (x - x.mean(1, keepdim=True)) ** 2, [(2, 3)], F()),
    ("diamond-softmax", lambda T, x: (x - T.logsumexp(x, 1, keepdim=True)).exp(), [(2, 3)],
     F()),
    ("diamond-normalize", lambda T, x: x / x.norm(dim=1, keepdim=True), [(2, 3)], F()),
    ("diamond-max-ratio", lambda T, x: x / x.abs().amax(), [(2, 3)], F(away_from=0.0)),
    ("diamond-std-prod", lambda T, x: x.std(0) * x.prod(0), [(3, 2)], F()),
    ("diamond-cumsum", lambda T, x: x.cumsum(1) * x, [(2, 3)], F()),
]


@pytest.mark.parametrize("fn, specs, opts", [r[1:] for r in ROWS], ids=[r[0] for r in ROWS])
def test_reduction_matches_torch(fn, specs, opts):
    check_op(fn, specs, **opts)


# --- ties, zeros and other special points -----------------------------------------------------
TIES = np.array([[1.0, 3.0, 3.0], [2.0, 2.0, 2.0]])
ZEROS_ONE = np.array([[1.5, 0.0, -2.0], [0.5, 3.0, -1.0]])
ZEROS_TWO = np.array([[0.0, 0.0, -2.0], [0.5, 0.0, -1.0]])

SPECIAL = [
    ("max-all-ties", lambda T, x: x.max(), [TIES]),
    ("min-all-ties", lambda T, x: x.min(), [TIES]),
    ("amax-ties", lambda T, x: x.amax(1), [TIES]),
    ("amin-ties-all", lambda T, x: x.amin(), [TIES]),
    ("max-dim-ties-first-index", lambda T, x: list(x.max(1)), [TIES]),
    ("min-dim-ties", lambda T, x: list(x.min(0)), [TIES]),
    ("max-nan", lambda T, x: x.max(), [np.array([1.0, np.nan, 3.0, np.nan])]),
    ("max-dim-nan", lambda T, x: list(x.max(0)), [np.array([1.0, np.nan, 3.0])]),
    ("norm-inf-ties", lambda T, x: x.norm(INF, dim=1), [np.array([[1.0, -3.0, 3.0]])]),
    ("norm-zero-vector", lambda T, x: x.norm(dim=1), [np.array([[0.0, 0.0], [3.0, 4.0]])]),
    ("norm-p3-zero-vector", lambda T, x: x.norm(3, dim=1), [np.array([[0.0, 0.0], [3.0, 4.0]])]),
    ("norm-p0.5-with-zero", lambda T, x: x.norm(0.5), [np.array([0.0, 1.0, 4.0])]),
    ("norm-p1-with-zero", lambda T, x: x.norm(1), [np.array([0.0, 1.0, -4.0])]),
    ("std-zero", lambda T, x: x.std(1), [np.array([[2.0, 2.0, 2.0], [1.0, 2.0, 4.0]])]),
    ("var-single-element", lambda T, x: x.var(1, correction=0), [np.array([[2.0], [3.0]])]),
    ("var-no-degrees-of-freedom", lambda T, x: x.var(1), [np.array([[2.0], [3.0]])]),
    ("std-negative-degrees-of-freedom", lambda T, x: x.std(1, correction=3),
     [np.array([[2.0, 1.0], [3.0, 5.0]])]),
    ("logsumexp-large", lambda T, x: T.logsumexp(x, 1),
     [np.array([[1000.0, 1000.0, -1000.0], [-1e4, 0.0, 3.0]])]),
    ("logsumexp-inf", lambda T, x: T.logsumexp(x, 1),
     [np.array([[-INF, -INF], [INF, 1.0], [-INF, 0.0]])]),
]


@pytest.mark.filterwarnings("ignore:.*degrees of freedom")  # both libraries warn; same values
@pytest.mark.parametrize("fn, arrays", [r[1:] for r in SPECIAL], ids=[r[0] for r in SPECIAL])
def test_special_points_match_torch(fn, arrays):
    with np.errstate(all="ignore"):
        check_torch(fn, arrays)
        check_torch(fn, arrays, rtol=2e-5, dtype=np.float32)


@pytest.mark.parametrize("x", [ZEROS_ONE, ZEROS_TWO, np.array([[0.0, 0.0], [0.0, 2.0]])],
                         ids=["one-zero", "two-zeros", "three-zeros"])
@pytest.mark.parametrize("form", ["all", "dim0", "dim1", "keepdim"])
def test_prod_with_zeros(x, form):
    fn = {"all": lambda T, a: a.prod(),
          "dim0": lambda T, a: a.prod(0),
          "dim1": lambda T, a: T.prod(a, 1),
          "keepdim": lambda T, a: a.prod(1, keepdim=True)}[form]
    check_op(fn, [x])  # values, gradients and second order (a polynomial: exact at zeros)


def test_prod_second_order_with_zeros_matches_torch():
    def hess_row(T, a):
        (g,) = T.autograd.grad(a.prod(), a, create_graph=True)
        return g

    for x in (ZEROS_ONE, ZEROS_TWO):
        check_torch(hess_row, [x])


# --- integer and bool inputs ------------------------------------------------------------------
INTS = np.array([[3, -1, 4], [1, 5, -9]], dtype=np.int64)
I32 = INTS.astype(np.int32)
U8 = np.array([[1, 0, 2], [3, 4, 5]], dtype=np.uint8)
B = np.array([[True, False, True], [True, True, True]])
X = np.array([[0.5, -1.0, 2.0], [0.0, 3.0, -4.0]])

INT_ROWS = [
    ("sum-int", lambda T, a: a.sum(), [I32]),
    ("sum-int-dim", lambda T, a: a.sum(1, keepdim=True), [I32]),
    ("sum-bool", lambda T, b: b.sum(0), [B]),
    ("sum-int-dtype", lambda T, a: a.sum(dtype=T.float32), [INTS]),
    ("mean-int-dtype", lambda T, a: a.mean(dtype=T.float64), [INTS]),
    ("max-int", lambda T, a: a.max(), [INTS]),
    ("max-int-dim", lambda T, a: list(a.max(1)), [INTS]),
    ("amin-int", lambda T, a: a.amin(0), [I32]),
    ("argmax", lambda T, x: x.argmax(), [X]),
    ("argmax-dim", lambda T, x: T.argmax(x, 1), [X]),
    ("argmax-keepdim", lambda T, x: x.argmax(0, keepdim=True), [X]),
    ("argmax-none-keepdim", lambda T, x: T.argmax(x, keepdim=True), [X]),
    ("argmin", lambda T, x: T.argmin(x), [X]),
    ("argmin-dim-int", lambda T, a: a.argmin(dim=-1), [INTS]),
    ("argmax-0dim", lambda T, x: T.argmax(x, 0), [np.array(2.0)]),
    ("prod-int", lambda T, a: a.prod(), [I32]),
    ("prod-bool", lambda T, b: b.prod(1), [B]),
    ("logsumexp-int", lambda T, a: T.logsumexp(a, 1), [INTS]),
    ("cumsum-int", lambda T, a: a.cumsum(1), [I32]),
    ("cumsum-bool", lambda T, b: T.cumsum(b, 0), [B]),
    ("all", lambda T, b: b.all(), [B]),
    ("all-dim", lambda T, b: T.all(b, 1), [B]),
    ("any-int-dim-keepdim", lambda T, a: a.any(0, keepdim=True), [INTS]),
    ("any-float", lambda T, x: T.any(x), [X]),
    ("all-float-dims", lambda T, x: x.all(dim=(0, 1)), [X]),
    ("all-uint8", lambda T, u: u.all(), [U8]),
    ("any-uint8-dim", lambda T, u: u.any(1), [U8]),
    ("max-0dim-dim", lambda T, x: list(T.max(x, 0)), [np.array(3.0)]),
    ("cumsum-0dim", lambda T, x: x.cumsum(0), [np.array(3.0)]),
]


@pytest.mark.parametrize("fn, arrays", [r[1:] for r in INT_ROWS], ids=[r[0] for r in INT_ROWS])
def test_integer_bool_and_index_results_match_torch(fn, arrays):
    check_torch(fn, arrays, rtol=2e-7)  # float32 results of integer inputs: float32 rounding


def test_max_with_dim_returns_named_values_and_indices():
    x = tapegrad.tensor([[1.0, 5.0, 2.0], [7.0, 0.0, 3.0]])
    out = x.max(1)
    values, indices = out
    assert out.values is values and out.indices is indices
    np.testing.assert_array_equal(values.numpy(), [5.0, 7.0])
    np.testing.assert_array_equal(indices.numpy(), [1, 0])
    assert indices.dtype == tapegrad.int64
    assert x.min(dim=0, keepdim=True).indices.shape == (1, 3)


def test_max_gradient_goes_to_the_returned_index_only():
    x = tapegrad.tensor([[2.0, 2.0, 1.0]], requires_grad=True)
    x.max(1).values.sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), [[1.0, 0.0, 0.0]])
    x.grad = None
    x.max().backward()  # full reduction: split evenly among ties
    np.testing.assert_array_equal(x.grad.numpy(), [[0.5, 0.5, 0.0]])


def test_grad_fn_names():
    x = tapegrad.tensor([[1.0, 2.0]], requires_grad=True)
    assert x.sum().grad_fn.name() == "SumBackward"
    assert x.mean().grad_fn.name() == "MeanBackward"
    assert x.max().grad_fn.name() == "MaxBackward"
    assert x.prod(1).grad_fn.name() == "ProdBackward"


def test_reductions_are_tensor_methods():
    x = tapegrad.tensor([[0.5, 1.5], [2.0, -1.0]], dtype=tapegrad.float64)
    tx = torch.tensor(x.numpy())
    for name in ["sum", "mean", "var", "std", "amax", "amin", "prod", "norm"]:
        np.testing.assert_allclose(getattr(x, name)().numpy(), getattr(tx, name)().numpy(),
                                   rtol=1e-12)
    for name in ["argmax", "argmin", "all", "any"]:
        np.testing.assert_array_equal(getattr(x, name)().numpy(), getattr(tx, name)().numpy())
    np.testing.assert_allclose(x.logsumexp(0).numpy(), tx.logsumexp(0).numpy(), rtol=1e-12)
    np.testing.assert_allclose(x.cumsum(0).numpy(), tx.cumsum(0).numpy(), rtol=1e-12)


def test_rules_run_without_recording():
    x = tapegrad.tensor(np.array([[0.5, 0.0, 2.0], [1.0, 3.0, -1.0]]), requires_grad=True)
    y = x.prod(1).sum() + x.std() + x.norm() + tapegrad.logsumexp(x, 1).sum() + x.amax()
    (g,) = tapegrad.autograd.grad(y, x)
    assert g.grad_fn is None and not g.requires_grad


# --- errors -------------------------------------------------------------------------------
def _t(data, **kw):
    return tapegrad.tensor(data, **kw)


ERRORS = [
    ("dim-out-of-range", lambda: _t([[1.0]]).sum(2), IndexError, r"sum: dimension out of range"),
    ("dim-repeated", lambda: _t([[1.0]]).mean((0, 0)), RuntimeError, "appears multiple times"),
    ("mean-int", lambda: _t([1, 2]).mean(), RuntimeError, "mean.*Long|mean.*int64"),
    ("var-int", lambda: _t([1, 2]).var(), RuntimeError, "var: std and var only"),
    ("std-both-args", lambda: _t([1.0, 2.0]).std(unbiased=True, correction=0), TypeError,
     "either unbiased= or correction="),
    ("max-empty", lambda: tapegrad.zeros(0).max(), RuntimeError, "max.*numel.. == 0"),
    ("max-dim-empty", lambda: tapegrad.zeros(2, 0).max(1), IndexError, "non-zero size"),
    ("argmax-empty", lambda: tapegrad.zeros(0).argmax(), IndexError, "argmax"),
    ("prod-tuple-dim", lambda: _t([[1.0]]).prod((0, 1)), TypeError, "prod.*dim must be an int"),
    ("norm-int", lambda: _t([1, 2]).norm(), RuntimeError, "floating point"),
    ("norm-nuc-3d", lambda: tapegrad.ones(2, 2, 2).norm("nuc"), RuntimeError,
     "matrix_norm: dim must be a 2-tuple"),  # as torch.norm (matrix norms: tests/test_linalg_ns)
    ("norm-fro-3dims", lambda: tapegrad.ones(2, 2, 2).norm("fro", dim=(0, 1, 2)), RuntimeError,
     "matrix_norm: dim must be a 2-tuple. Got 0 1 2"),
    ("logsumexp-no-dim", lambda: tapegrad.logsumexp(_t([1.0]), ()), RuntimeError,
     "at least one"),
    ("cumsum-dim", lambda: _t([1.0]).cumsum(1), IndexError, "cumsum: dimension out of range"),
]


@pytest.mark.parametrize("fn, exc, match", [r[1:] for r in ERRORS], ids=[r[0] for r in ERRORS])
def test_errors(fn, exc, match):
    with pytest.raises(exc, match=match):
        fn()


def test_backward_through_index_and_bool_results_raises():
    x = tapegrad.tensor([[1.0, -2.0]], requires_grad=True)
    for y in [x.argmax(), x.max(1).indices, x.all(), (x > 0).any(1), x.detach().long().sum()]:
        assert not y.requires_grad
        with pytest.raises(RuntimeError, match="does not require grad"):
            y.sum().backward() if y.ndim else y.backward()


def test_axes_normalisation():
    from tapegrad.ops.reduce import axes

    assert axes(None, 3) == (0, 1, 2)
    assert axes((), 2) == (0, 1)
    assert axes(-1, 3) == (2,)
    assert axes([2, -3], 3) == (0, 2)
    assert axes(0, 0) == () and axes(-1, 0) == ()
    with pytest.raises(IndexError, match="range of \\[-2, 1\\]"):
        axes(2, 2, "x")
