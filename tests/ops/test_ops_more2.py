"""Scans, order statistics and more ops against PyTorch: counting, index writes,
builders and pointwise ops. One ``check_op`` row per differentiable op (values and gradients
at 1e-12 in float64, float32, gradcheck, second order); ops without a gradient and the
choices among ties are compared with ``check_torch``; error cases raise in both."""
import inspect

import numpy as np
import pytest
import torch

import tapegrad
from helpers import check_op, check_torch, make_inputs

# the selections below pick indices from the data in Python: they are not vmap-safe (see
# docs/differences.md), so where check_op also checks vmap and forward mode, those are off
_DATA_DEPENDENT = {"vmap": False, "forward": False} if "vmap" in inspect.signature(
    check_op).parameters else {}
_NO_FORWARD = {"forward": False} if _DATA_DEPENDENT else {}

ZEROS = np.array([[1.5, 0.0, 2.0, -1.0, 0.0, 3.0], [0.5, 2.0, -1.5, 1.2, 0.7, 0.0]])
TIES = np.array([[1.5, 0.5, 1.5, 2.0, 0.5, 0.5], [3.0, 1.0, 1.0, 3.0, 2.0, 2.0]])
IDX = np.array([[0, 2, 0, 1], [1, 1, 3, 0]])


def _nan_above(T, x, level):
    return T.where(x > level, float("nan"), x)


# (name, fn(T, *inputs), input specs, check_op keywords)
OPS = [
    # scans and differences
    ("cumprod", lambda T, x: T.cumprod(x, 1) + x.cumprod(0), [(3, 4)], {}),
    ("cumprod zeros", lambda T, x: (T.cumprod(x, -1), T.cumprod(x, 0)), [ZEROS],
     _NO_FORWARD),  # torch.func's second-order jvp is off here: test_cumprod_zeros_forward
    ("cummax", lambda T, x: tuple(T.cummax(x, 1)) + tuple(x.cummax(0)), [(3, 5)],
     _DATA_DEPENDENT),
    ("cummin", lambda T, x: tuple(T.cummin(x, -1)), [(4, 3)], _DATA_DEPENDENT),
    ("logcumsumexp", lambda T, x: (T.logcumsumexp(x * 30, 1), x.logcumsumexp(0)), [(3, 5)],
     _NO_FORWARD),
    ("diff", lambda T, x, p, a: (T.diff(x, 2, 0, prepend=p, append=a), x.diff()),
     [(4, 3), (1, 3), (2, 3)], {}),
    ("gradient", lambda T, x: T.gradient(x) + T.gradient(x, spacing=2.0, dim=1, edge_order=2),
     [(4, 5)], {}),
    ("gradient coordinates", lambda T, x: T.gradient(
        x, spacing=(T.tensor([0.0, 1.0, 1.5, 3.5]), T.tensor([0.0, 1.0, 1.5, 3.5, 4.0])))
     + T.gradient(x, spacing=[T.tensor([0.0, 1.0, 1.5, 3.5])], dim=0, edge_order=2),
     [(4, 5)], {}),
    ("gradient spacings", lambda T, x: T.gradient(x, spacing=[0.5, 3], dim=(1, 0)), [(4, 5)],
     {}),
    ("trapezoid", lambda T, y: (T.trapezoid(y), T.trapezoid(y, dx=0.5, dim=0),
                                T.trapz(y, dx=2)), [(4, 5)], {}),
    ("trapezoid x", lambda T, y, x: (T.trapezoid(y, x), T.trapz(y, x[:4], dim=0)),
     [(4, 5), (5,)], {}),
    ("cumulative_trapezoid", lambda T, y, x: (T.cumulative_trapezoid(y, x, dim=0),
                                              T.cumulative_trapezoid(y, dx=2)),
     [(4, 5), (4, 1)], {}),
    # order statistics
    ("median", lambda T, x: (T.median(x), x.nanmedian()), [(3, 4)], {}),
    ("median dim", lambda T, x: tuple(T.median(x, 1)) + tuple(x.median(0, keepdim=True)),
     [(3, 4)], _DATA_DEPENDENT),
    ("nanmedian", lambda T, x: tuple(T.nanmedian(_nan_above(T, x, 0.8), 1))
     + (T.nanmedian(_nan_above(T, x, 0.8)),), [(3, 5)], _DATA_DEPENDENT),
    ("kthvalue", lambda T, x: tuple(T.kthvalue(x, 2, 1)) + tuple(x.kthvalue(3, 0, True)),
     [(3, 4)], _DATA_DEPENDENT),
    ("quantile", lambda T, x: (T.quantile(x, 0.3), x.quantile(
        T.tensor([0.1, 0.5, 1.0], dtype=x.dtype), dim=1, keepdim=True)), [(3, 5)],
     _DATA_DEPENDENT),
    ("quantile interpolation", lambda T, x: tuple(
        T.quantile(x, T.tensor([0.2, 0.25, 0.5, 0.7], dtype=x.dtype), dim=0, interpolation=m)
        for m in ("lower", "higher", "midpoint", "nearest")), [(5, 3)], _DATA_DEPENDENT),
    ("nanquantile", lambda T, x: (T.nanquantile(_nan_above(T, x, 0.5), 0.4, dim=1),
                                  x.nanquantile(0.75, keepdim=True)), [(4, 5)],
     _DATA_DEPENDENT),
    ("msort", lambda T, x: T.msort(x), [(4, 3)], _DATA_DEPENDENT),
    ("cov", lambda T, x: (T.cov(x), T.cov(x, correction=0), x[0].cov()), [(3, 6)], {}),
    ("cov weights", lambda T, x, a: T.cov(x, fweights=T.tensor([1, 2, 0, 3, 1, 1]),
                                          aweights=a.abs() + 0.1), [(3, 6), (6,)],
     _DATA_DEPENDENT),
    ("corrcoef", lambda T, x: (T.corrcoef(x), x[:2].corrcoef()), [(3, 6)], {}),
    # index writes
    ("put", lambda T, x, s: (T.put(x, T.tensor([0, -1, 5]), s),
                             x.put(T.tensor([[1, 1], [2, 1]]), s.repeat(2)[:4].reshape(2, 2),
                                   accumulate=True)), [(3, 4), (3,)], {}),
    ("masked_scatter", lambda T, x, m, s: T.masked_scatter(x, m > 0, s), [(3, 4), (4,), (14,)],
     _DATA_DEPENDENT),
    ("scatter_reduce sum", lambda T, x, s: T.scatter_reduce(x, 1, T.tensor(IDX), s, "sum")
     + x.scatter_reduce(1, T.tensor(IDX), s, "sum", include_self=False), [(2, 5), (2, 4)], {}),
    ("scatter_reduce mean", lambda T, x, s: T.scatter_reduce(x, 1, T.tensor(IDX), s, "mean")
     + x.scatter_reduce(1, T.tensor(IDX), s, "mean", include_self=False), [(2, 5), (2, 4)], {}),
    ("scatter_reduce prod", lambda T, x, s: T.scatter_reduce(x, 1, T.tensor(IDX), s, "prod")
     + x.scatter_reduce(1, T.tensor(IDX), s, "prod", include_self=False), [(2, 5), (2, 4)],
     _NO_FORWARD),  # torch.func gives zero tangents for scatter_reduce(prod)
    ("scatter_reduce prod zeros", lambda T, x, s: T.scatter_reduce(
        x, 0, T.tensor([[0, 1, 0, 1, 0, 1], [1, 1, 0, 0, 1, 1]]), s, "prod"),
     [ZEROS[:, ::-1].copy(), ZEROS], _NO_FORWARD),
    ("scatter_reduce amax", lambda T, x, s: T.scatter_reduce(x, 1, T.tensor(IDX), s, "amax")
     + x.scatter_reduce(1, T.tensor(IDX), s, "amax", include_self=False), [(2, 5), (2, 4)], {}),
    ("scatter_reduce amin", lambda T, x, s: T.scatter_reduce(x, 0, T.tensor([[1, 0], [1, 1]]),
                                                             s, "amin"), [(2, 2), (2, 2)], {}),
    ("index_reduce", lambda T, x, s: tuple(
        T.index_reduce(x, 0, T.tensor([2, 0, 2]), s, r) for r in ("prod", "mean", "amax"))
     + (x.index_reduce(1, T.tensor([1, 1]), s[:, :2] * 1, "amin",
                       include_self=False),), [(3, 4), (3, 4)], {}),
    ("renorm", lambda T, x: (T.renorm(x, 2, 0, 1.0), x.renorm(1, 1, 2.0),
                             T.renorm(x, float("inf"), -1, 0.5)), [(3, 4)], {}),
    # builders
    ("block_diag", lambda T, a, b, c: T.block_diag(a, b, c, T.tensor(2.0, dtype=a.dtype)),
     [(2, 3), (3,), (1, 2)], {}),
    ("cartesian_prod", lambda T, a, b, c: (T.cartesian_prod(a, b, c), T.cartesian_prod(a)),
     [(2,), (3,), (2,)], {}),
    ("combinations", lambda T, a: (T.combinations(a), T.combinations(a, 3),
                                   T.combinations(a, 2, with_replacement=True)), [(4,)], {}),
    ("movedim", lambda T, x: (T.movedim(x, 0, -1), x.moveaxis((0, 2), (2, 0)),
                              T.movedim(x, [1], [0]), x.ravel()), [(2, 3, 4)], {}),
    # pointwise
    ("fmax fmin", lambda T, a, b: (T.fmax(a, _nan_above(T, b, 1.0)), a.fmin(b)), [(3, 4), (4,)],
     {}),
    ("float_power", lambda T, a, b: (T.float_power(a.abs() + 0.5, b), a.float_power(2),
                                     T.float_power(2, b)), [(3, 4), (3, 4)], {}),
    ("sgn rsub", lambda T, a, b: (T.sgn(a) * b, T.rsub(a, b, alpha=2), a.sgn() + T.rsub(a, 3)),
     [(3, 4), (4,)], dict(away_from=0.0)),
]


@pytest.mark.parametrize("name, fn, specs, kw", OPS, ids=lambda v: v
                         if isinstance(v, str) else "")
def test_op(name, fn, specs, kw):
    check_op(fn, specs, **kw)


def test_cumprod_zeros_forward():
    """With zeros in the input, cumprod's second-order forward derivative equals the exact one
    (products multiplied out); PyTorch 2.13's cumprod_jvp differs there."""
    rng = np.random.default_rng(5)
    t1, t2 = rng.standard_normal(ZEROS.shape), rng.standard_normal(ZEROS.shape)

    def by_products(T, x):
        out = [x[:, 0]]
        for j in range(1, x.shape[1]):
            out.append(out[-1] * x[:, j])
        return T.stack(out, 1)

    def second(T, jvp, f):
        inner = lambda x: jvp(f, (x,), (T.tensor(t1),))[1]  # noqa: E731
        return jvp(inner, (T.tensor(ZEROS),), (T.tensor(t2),))[1]

    T = tapegrad
    got = second(T, T.func.jvp, lambda x: T.cumprod(x, -1))
    want = second(torch, torch.func.jvp, lambda x: by_products(torch, x))
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-12, atol=1e-12)
    first = T.func.jvp(lambda x: T.cumprod(x, -1), (T.tensor(ZEROS),), (T.tensor(t1),))[1]
    ref = torch.func.jvp(lambda x: torch.cumprod(x, -1), (torch.tensor(ZEROS),),
                         (torch.tensor(t1),))[1]
    np.testing.assert_allclose(first.numpy(), ref.numpy(), rtol=1e-12, atol=1e-12)


def test_vander():
    """Values as PyTorch; PyTorch 2.13's vander backward raises (it writes its result in
    place), tapegrad's is the cumulative product's: checked by gradcheck, zeros included."""
    x = np.array([0.7, -1.3, 2.0])
    check_torch(lambda T, a: (T.vander(a), T.vander(a, 4, True), T.vander(a, 1), T.vander(a, 0),
                              T.vander(T.tensor([1, 2, 3]), 3)), [x], grad=False)
    for v in (x, x * np.array([1.0, 0.0, 1.0])):
        a = tapegrad.tensor(v, requires_grad=True)
        for f in (lambda t: tapegrad.vander(t, 4), lambda t: tapegrad.vander(t, increasing=True)):
            assert tapegrad.autograd.gradcheck(f, (a,))
            assert tapegrad.autograd.gradgradcheck(f, (a,))


def test_float32_variants():
    x = make_inputs([(3, 5)])[0]
    check_torch(lambda T, a: (T.cumprod(a, 1), T.logcumsumexp(a, 1), *T.cummax(a, 0),
                              T.quantile(a, 0.3, dim=1), *T.median(a, 1)), [x],
                dtype=np.float32, rtol=2e-6)


# --- ties, NaN and PyTorch's index choices ------------------------------------------------
def test_ties_pick_pytorchs_indices():
    """With ties the gradient goes to the entry PyTorch picks (so gradients are compared with
    torch's, not with central differences, which are undefined there)."""
    check_torch(lambda T, x: (*T.median(x, 1), *T.kthvalue(x, 4, 1), *T.kthvalue(x, 2, 1),
                              *T.mode(x, 1), *T.cummax(x, 1), *T.cummin(x, 1), T.median(x)),
                [TIES])


def test_kthvalue_and_median_index_choice_random():
    rng = np.random.default_rng(0)
    for n in (2, 3, 5, 8, 17, 40):
        x = rng.integers(0, 4, (6, n)).astype(np.float64)
        x[rng.random(x.shape) < 0.05] = np.nan
        for k in (1, (n + 1) // 2, n):
            check_torch(lambda T, a: (*T.kthvalue(a, k, 1), *T.median(a, 1),
                                      *T.nanmedian(a, 1)), [x], grad=False)
    small = rng.integers(0, 3, (12, 12)).astype(np.float64)  # PyTorch's mode: up to 16 entries
    check_torch(lambda T, a: tuple(T.mode(a, 1)) + tuple(T.mode(a, 0)), [small], grad=False)


def test_nan_handling():
    x = np.array([[1.0, 3, 3, 2, np.nan, 5, np.nan], [2, 2, 1, 1, 0, 4, 4],
                  [np.nan, np.nan, 1, np.nan, np.nan, 2, np.nan]])
    check_torch(lambda T, a: (*T.cummax(a, 1), *T.cummin(a, 1), *T.median(a, 1),
                              *T.nanmedian(a, 1), T.median(a), T.nanmedian(a[:2]),
                              T.quantile(a, 0.5, dim=1), T.nanquantile(a, 0.5, dim=1)), [x],
                grad=False)


def test_integer_and_bool_inputs():
    a = np.array([[1, 3, 3, 2], [2, 2, 1, 1]])
    check_torch(lambda T, x: (*T.cummax(x, 1), *T.cummin(x, 1), T.cumprod(x, 1), T.diff(x),
                              T.median(x), *T.median(x, 1), *T.mode(x, 1), *T.kthvalue(x, 2, 1),
                              T.vander(x[0]), T.cov(x), T.fmax(x, x.flip(1)), T.signbit(x - 2)),
                [a], grad=False)
    b = np.array([True, False, False, True])
    check_torch(lambda T, x: (T.diff(x), T.cumprod(x, 0), *T.cummax(x, 0), T.signbit(x)), [b],
                grad=False)


# --- ops without a gradient --------------------------------------------------------------
def test_counting_ops():
    x = np.array([0.1, 2.5, -1.0, 3.3, 2.5, 0.0, 7.0, 1.2])
    check_torch(lambda T, a: (T.histc(a), T.histc(a, bins=4, min=0, max=3),
                              T.histc(a.float(), 7), a.histc(3, 2.5, 2.5)), [x], grad=False)
    i, w = np.array([2, 0, 3, 2, 5]), np.array([0.5, 1, 2, 3, 4.0])
    check_torch(lambda T, a, b: (T.bincount(a), a.bincount(b), T.bincount(a, b.float(), 10),
                                 T.bincount(a, minlength=2), T.bincount(a, a),
                                 T.bincount(a[:0])), [i, w], grad=False)


def test_searchsorted_and_bucketize():
    s, v = np.array([1.0, 2, 2, 4, 7]), np.array([[0.0, 2, 2.5], [7, 8, 1]])
    check_torch(lambda T, a, b: (T.searchsorted(a, b), T.searchsorted(a, b, right=True),
                                 T.searchsorted(a, b, side="right", out_int32=True),
                                 T.bucketize(b, a), T.bucketize(b, a, right=True),
                                 T.searchsorted(a, 2.0), T.bucketize(2.0, a)), [s, v],
                grad=False)
    rows = np.array([[1.0, 2, 2, 4], [0, 1, 5, 6]])
    order = np.array([[3, 1, 0, 2], [1, 0, 3, 2]])
    check_torch(lambda T, a, b, o: (T.searchsorted(a, b[:, :2]), T.searchsorted(
        a.gather(1, o.argsort(1)), b[:, :2], sorter=o)), [rows, v, order], grad=False)


def test_unique():
    u = np.array([[3.0, 1, 2], [3, 1, 2], [1, 1, 1], [3, 1, 2]])
    check_torch(lambda T, a: (*T.unique(a, return_inverse=True, return_counts=True),
                              T.unique(a), a.unique(sorted=False),
                              *T.unique(a, dim=0, return_inverse=True, return_counts=True),
                              *T.unique(a, dim=1, return_counts=True)), [u], grad=False)
    check_torch(lambda T, a: T.unique(a, return_counts=True), [np.array([3.0, np.nan, np.nan,
                                                                         1])], grad=False)
    check_torch(lambda T, a: (*T.unique_consecutive(a, return_inverse=True, return_counts=True),
                              a.flatten().unique_consecutive(),
                              *T.unique_consecutive(a, dim=0, return_inverse=True,
                                                    return_counts=True)), [u], grad=False)
    check_torch(lambda T, a: T.unique(a), [np.array([True, False, True])], grad=False)


@pytest.mark.parametrize("call", [
    lambda T, x: T.unique(x).sum().backward(),
    lambda T, x: T.unique_consecutive(x).sum().backward(),
    lambda T, x: T.bincount(T.tensor([1, 1]), x[:2]).sum().backward(),
])
def test_no_derivative(call):
    for T in (torch, tapegrad):
        x = T.tensor([1.0, 1.0, 2.0], requires_grad=True)
        with pytest.raises((RuntimeError, NotImplementedError)):
            call(T, x)


def test_shifts_and_signbit():
    a = np.array([1, -8, 5, 127])
    b = np.array([1, 70, 63, -1])
    check_torch(lambda T, x, y: (x << 1, 1 << x[:3].abs(), x >> 1, 5 >> x[:3].abs(), x << y,
                                 x >> y, T.bitwise_left_shift(x, 2),
                                 T.bitwise_right_shift(x.int(), y.int())), [a, b], grad=False)
    check_torch(lambda T, x: (T.signbit(x), x.signbit()),
                [np.array([-0.0, 0.0, -1.0, np.nan, -np.nan, np.inf])], grad=False)
    check_torch(lambda T, x: (T.bitwise_left_shift(x.to(T.uint8), 3),
                              T.bitwise_right_shift(x.to(T.uint8), 9)), [np.array([1, 200])],
                grad=False)


def test_inplace_variants():
    arrays = make_inputs([(3, 4), (3, 4)])
    check_torch(lambda T, a, b: (a * 1).cumprod_(1) + b, arrays)
    check_torch(lambda T, a, b: (a * 1).cumsum_(0) + b, arrays)
    check_torch(lambda T, a, b: (a * 1).put_(T.tensor([1, -2]), b[0, :2] * 1), arrays)
    check_torch(lambda T, a, b: (a * 1).masked_scatter_(b > 0, a.flip(0) * 1), arrays)
    check_torch(lambda T, a, b: (a * 1).scatter_reduce_(0, T.tensor([[2, 0, 0, 1]]), b[:1] * 1,
                                                        "amax"), arrays)
    check_torch(lambda T, a, b: (a * 1).index_reduce_(1, T.tensor([0, 3]), b[:, :2] * 1,
                                                      "mean"), arrays)
    check_torch(lambda T, a, b: (a * 1).renorm_(2, 0, 0.5), arrays)
    check_torch(lambda T, a, b: ((a * 1).sgn_(), (a * 1).tril_(), (a * 1).triu_(1),
                                 (a * 1).true_divide_(b), (a * 1).erfc_()), arrays)
    check_torch(lambda T, a, b: (a * 1).float_power_(2) + b, arrays)
    check_torch(lambda T, a, b: ((a > 0).logical_and_(b > 0), (a > 0).logical_or_(b > 0),
                                 (a > 0).logical_xor_(b > 0), (a > 0).bitwise_not_()), arrays,
                grad=False)
    for T in (torch, tapegrad):
        x = T.tensor([1, 2, 3])
        x <<= 2
        x >>= T.tensor([1, 0, 1])
        assert x.tolist() == [2, 8, 6]
        with pytest.raises(RuntimeError, match="float_power_"):
            T.ones(2).float_power_(2)


# --- errors, as PyTorch -------------------------------------------------------------------
@pytest.mark.parametrize("call", [
    lambda T, x: T.put(x, T.tensor([12]), T.tensor([1.0], dtype=T.float64)),
    lambda T, x: T.put(x, T.tensor([-13]), T.tensor([1.0], dtype=T.float64)),
    lambda T, x: x.put_(T.tensor([0, 1]), T.tensor([1.0], dtype=T.float64)),
    lambda T, x: T.scatter_reduce(x, 1, T.tensor([[4]]), x, "sum"),
    lambda T, x: T.scatter_reduce(x, 1, T.tensor([[-1]]), x, "amax"),
    lambda T, x: T.scatter_reduce(x, 1, T.tensor([[0]]), x.float(), "sum"),
    lambda T, x: T.index_reduce(x, 0, T.tensor([3]), x[:1], "prod"),
    lambda T, x: T.index_reduce(x, 0, T.tensor([0]), x[:1], "sum"),
    lambda T, x: T.masked_scatter(x, x >= 0, x[:2]),
    lambda T, x: T.masked_scatter(x, T.ones(3, 4, dtype=T.bool), x[:2]),
    lambda T, x: T.kthvalue(x, 5),
    lambda T, x: T.kthvalue(x, 0),
    lambda T, x: T.median(x[:, :0], 1),
    lambda T, x: T.mode(x[:, :0], 1),
    lambda T, x: T.quantile(x, 1.5),
    lambda T, x: T.quantile(x[:0], 0.5),
    lambda T, x: T.quantile(x, T.tensor([0.5])),
    lambda T, x: T.quantile(x, 0.5, interpolation="cubic"),
    lambda T, x: T.quantile(x.long(), 0.5),
    lambda T, x: T.histc(x.long()),
    lambda T, x: T.histc(x, min=3, max=1),
    lambda T, x: T.histc(x, min=0, max=float("inf")),
    lambda T, x: T.bincount(T.tensor([-1, 2])),
    lambda T, x: T.bincount(x),
    lambda T, x: T.bincount(T.tensor([1]), minlength=-1),
    lambda T, x: T.searchsorted(T.tensor([1.0, 2]), T.tensor([1.0]), side="left", right=True),
    lambda T, x: T.searchsorted(x, T.tensor([1.0, 2.0], dtype=T.float64)),
    lambda T, x: T.bucketize(T.tensor([1.0]), x),
    lambda T, x: T.renorm(x[0], 2, 0, 1.0),
    lambda T, x: T.renorm(x, -1, 0, 1.0),
    lambda T, x: T.block_diag(x[None]),
    lambda T, x: T.combinations(x),
    lambda T, x: T.combinations(x[0], -1),
    lambda T, x: T.cartesian_prod(x),
    lambda T, x: T.vander(x),
    lambda T, x: T.vander(x[0], -1),
    lambda T, x: T.movedim(x, (0, 1), (0,)),
    lambda T, x: T.movedim(x, (0, 0), (0, 1)),
    lambda T, x: T.movedim(x, 2, 0),
    lambda T, x: T.diff(T.tensor(1.0)),
    lambda T, x: T.diff(x, -1),
    lambda T, x: T.diff(x, prepend=x[0]),
    lambda T, x: T.gradient(x, edge_order=3),
    lambda T, x: T.gradient(x[:, :2], edge_order=2),
    lambda T, x: T.gradient(x, spacing=[1.0, 2.0, 3.0]),
    lambda T, x: T.cov(x[None]),
    lambda T, x: T.cov(x, fweights=T.tensor([1.0, 2, 3, 4])),
    lambda T, x: T.cov(x, aweights=T.tensor([1, 2, 3, 4])),
    lambda T, x: T.cov(x, fweights=T.tensor([1, -2, 3, 4])),
    lambda T, x: T.corrcoef(x[None]),
    lambda T, x: T.logcumsumexp(x.long(), 0),
    lambda T, x: T.cumprod(x, 2),
    lambda T, x: T.bitwise_left_shift(x, 1),
    lambda T, x: T.tensor([1]) << 1.5,
])
def test_errors_as_pytorch(call):
    x = np.arange(12.0).reshape(3, 4)
    for T in (torch, tapegrad):
        with pytest.raises((IndexError, RuntimeError, NotImplementedError, TypeError)):
            call(T, T.tensor(x))
