"""More ops against PyTorch: one table row per op, checked three ways by
``check_op`` (values and gradients at 1e-12 in float64, float32, gradcheck, second order)."""
import numpy as np
import pytest
import torch

import tapegrad
from helpers import check_op, check_torch, make_inputs

# (name, fn(T, *inputs), input specs, check_op keywords)
UNARY = [
    ("tan", lambda T, x: T.tan(x), [(3, 4)], dict(low=-1.2, high=1.2)),
    ("asin", lambda T, x: T.asin(x), [(3, 4)], dict(low=-0.9, high=0.9)),
    ("acos", lambda T, x: T.acos(x), [(3, 4)], dict(low=-0.9, high=0.9)),
    ("atan", lambda T, x: T.atan(x), [(3, 4)], {}),
    ("sinh", lambda T, x: T.sinh(x), [(3, 4)], {}),
    ("cosh", lambda T, x: T.cosh(x), [(3, 4)], {}),
    ("asinh", lambda T, x: T.asinh(x), [(3, 4)], {}),
    ("acosh", lambda T, x: T.acosh(x), [(3, 4)], dict(low=1.2, high=4.0)),
    ("atanh", lambda T, x: T.atanh(x), [(3, 4)], dict(low=-0.9, high=0.9)),
    ("arcsin method", lambda T, x: x.arcsin() + x.arctan() + x.arcsinh(), [(5,)],
     dict(low=-0.9, high=0.9)),
    ("log2", lambda T, x: T.log2(x), [(3, 4)], dict(low=0.2, high=3.0)),
    ("log10", lambda T, x: x.log10(), [(3, 4)], dict(low=0.2, high=3.0)),
    ("exp2", lambda T, x: T.exp2(x), [(3, 4)], {}),
    ("deg2rad", lambda T, x: T.deg2rad(x) + x.rad2deg(), [(3, 4)], {}),
    ("frac", lambda T, x: T.frac(x * 3), [(3, 4)], dict(away_from=np.arange(-9, 10) / 3)),
    ("nan_to_num", lambda T, x: T.nan_to_num(T.log(x), nan=0.5, posinf=2.0), [(4, 5)], {}),
    ("nan_to_num default", lambda T, x: T.nan_to_num(T.log(x)) + x.nan_to_num(), [(4, 5)], {}),
]
BINARY = [
    ("atan2", lambda T, y, x: T.atan2(y, x), [(3, 4), (4,)], {}),
    ("arctan2 method", lambda T, y, x: y.arctan2(x), [(3, 1), (1, 4)], {}),
    ("hypot", lambda T, a, b: T.hypot(a, b), [(3, 4), (3, 4)], {}),
    ("logaddexp", lambda T, a, b: T.logaddexp(a, b * 30), [(3, 4), (4,)], {}),
    ("logaddexp2", lambda T, a, b: a.logaddexp2(b), [(3, 4), (3, 4)], {}),
    ("xlogy", lambda T, a, b: T.xlogy(a, b), [(3, 4), (4,)], dict(low=0.1, high=2.0)),
    ("xlogy zeros", lambda T, a, b: T.xlogy(T.relu(a), b * b + 0.5), [(3, 4), (3, 4)],
     dict(away_from=0.0)),
    ("xlogy scalar", lambda T, b: T.xlogy(2.0, b), [(5,)], dict(low=0.1, high=2.0)),
    ("copysign", lambda T, a, b: T.copysign(a, b), [(3, 4), (4,)], dict(away_from=0.0)),
    ("lerp scalar", lambda T, a, b: T.lerp(a, b, 0.3) + a.lerp(b, 0.8), [(3, 4), (4,)], {}),
    ("lerp tensor", lambda T, a, b, w: T.lerp(a, b, w), [(3, 4), (3, 4), (3, 4)], {}),
    ("addcmul", lambda T, a, b, c: T.addcmul(a, b, c, value=0.5) + a.addcmul(b, c),
     [(3, 4), (3, 1), (4,)], {}),
    ("addcdiv", lambda T, a, b, c: T.addcdiv(a, b, c, value=-2) + a.addcdiv(b, c),
     [(3, 4), (3, 4), (4,)], dict(low=0.5, high=2.0)),
]


@pytest.mark.parametrize("name, fn, specs, kw", UNARY + BINARY, ids=lambda v: v
                         if isinstance(v, str) else "")
def test_op(name, fn, specs, kw):
    check_op(fn, specs, **kw)


def test_integer_inputs_become_float():
    for name in ("tan", "asin", "atan", "sinh", "log2", "log10", "exp2", "deg2rad"):
        a = np.array([0, 1, 2], dtype=np.int64) if name != "asin" else np.array([0, 1])
        check_torch(lambda T, x: getattr(T, name)(x), [a], grad=False, rtol=2e-7)
    check_torch(lambda T, x, y: T.atan2(x, y), [np.array([1, -2]), np.array([3, 4])], grad=False,
                rtol=2e-7)
    check_torch(lambda T, x, y: T.copysign(x, y), [np.array([1, -2]), np.array([-3, 4])],
                grad=False)


def test_heaviside():
    x = np.array([-1.5, 0.0, 2.0, np.nan, 0.0])
    v = np.array([0.5, 0.25, 0.5, 0.5, 7.0])
    check_torch(lambda T, a, b: T.heaviside(a, b), [x, v], grad=False)
    check_torch(lambda T, a, b: a.heaviside(b), [np.array([[-2, 0, 3]]), np.array([5])],
                grad=False)
    for T in (torch, tapegrad):
        with pytest.raises((RuntimeError, TypeError), match="different dtypes"):
            T.heaviside(T.tensor([1.0]), T.tensor([1.0], dtype=T.float64))
        with pytest.raises(RuntimeError, match="heaviside"):
            a = T.tensor([1.0, 0.0], requires_grad=True)
            T.heaviside(a, T.tensor([0.5])).sum().backward()


def test_nan_to_num_values():
    x = np.array([np.nan, np.inf, -np.inf, 1.5], dtype=np.float32)
    check_torch(lambda T, a: T.nan_to_num(a), [x], grad=False)
    check_torch(lambda T, a: a.nan_to_num(neginf=-1.0), [x.astype(np.float64)], grad=False)
    check_torch(lambda T, a: T.nan_to_num(a), [np.array([1, 2])], grad=False)


def test_inplace_variants():
    arrays = make_inputs([(3, 4), (3, 4)], low=0.1, high=0.9)
    for name in ("asin", "atan", "sinh", "tanh", "log2", "frac", "exp2", "nan_to_num"):
        check_torch(lambda T, a: getattr(a * 1, name + "_")(), arrays[:1])
    for name in ("atan2", "hypot", "xlogy", "copysign"):
        check_torch(lambda T, a, b: getattr(a * 1, name + "_")(b.abs() + 0.1), arrays)


def test_addcdiv_integer_division_refused():
    for T in (torch, tapegrad):
        with pytest.raises(RuntimeError, match="addcdiv"):
            T.addcdiv(T.zeros(2), T.tensor([1, 2]), T.tensor([3, 4]))


def test_frac_of_integers_refused():
    for T in (torch, tapegrad):
        with pytest.raises(RuntimeError):
            T.frac(T.tensor([1, 2]))


# --- reductions, products, index ops (composites of registered ops) -------------------------
def _idx(*values):
    return np.array(values, dtype=np.int64)


COMPOSITE = [
    ("nansum", lambda T, x: T.nansum(T.where(x > 1.0, float("nan"), x), 1), [(3, 4)], {}),
    ("nanmean", lambda T, x: x.masked_fill(x > 1.0, float("nan")).nanmean((0,), True),
     [(3, 4)], {}),
    ("std_mean", lambda T, x: T.std_mean(x, 1), [(3, 4)], {}),
    ("var_mean", lambda T, x: T.var_mean(x, (0, 1), correction=0), [(3, 4)], {}),
    ("aminmax", lambda T, x: T.aminmax(x, dim=0), [(3, 4)], {}),
    ("aminmax all", lambda T, x: tuple(x.aminmax()), [(3, 4)], {}),
    ("addmm", lambda T, a, b, c: T.addmm(a, b, c, beta=0.5, alpha=2) + a.addmm(b, c),
     [(3, 5), (3, 4), (4, 5)], {}),
    ("addmm broadcast", lambda T, a, b, c: T.addmm(a, b, c), [(5,), (3, 4), (4, 5)], {}),
    ("addmm beta 0", lambda T, a, b, c: T.addmm(a, b, c, beta=0), [(3, 5), (3, 4), (4, 5)], {}),
    ("baddbmm", lambda T, a, b, c: T.baddbmm(a, b, c, alpha=-1.5),
     [(2, 3, 5), (2, 3, 4), (2, 4, 5)], {}),
    ("addmv", lambda T, a, m, v: T.addmv(a, m, v, beta=2), [(3,), (3, 4), (4,)], {}),
    ("addr", lambda T, a, u, v: a.addr(u, v, alpha=3), [(3, 4), (3,), (4,)], {}),
    ("tensordot 2", lambda T, a, b: T.tensordot(a, b), [(2, 3, 4), (3, 4, 5)], {}),
    ("tensordot pairs", lambda T, a, b: T.tensordot(a, b, dims=([0, 2], [2, 0])),
     [(2, 3, 4), (4, 5, 2)], {}),
    ("tensordot 0", lambda T, a, b: T.tensordot(a, b, 0), [(2, 3), (4,)], {}),
    ("meshgrid ij", lambda T, a, b: T.meshgrid(a, b, indexing="ij"), [(3,), (4,)], {}),
    ("meshgrid xy", lambda T, a, b, c: T.meshgrid([a, b, c], indexing="xy"),
     [(3,), (4,), (2,)], {}),
    ("rot90", lambda T, x: (T.rot90(x), x.rot90(2, (1, 2)), T.rot90(x, -1, (2, 0)),
                            T.rot90(x, 4)), [(2, 3, 4)], {}),
    ("masked_select", lambda T, x, y: T.masked_select(x, y > 0.2), [(3, 4), (4,)], {}),
    ("take", lambda T, x: T.take(x, T.tensor([[0, -1], [5, 5]])), [(3, 4)], {}),
    ("index_add", lambda T, x, s: T.index_add(x, 1, T.tensor([0, 2, 0]), s, alpha=2),
     [(3, 4), (3, 3)], {}),
    ("index_add method", lambda T, x, s: x.index_add(0, T.tensor([2, 1]), s),
     [(3, 4), (2, 4)], {}),
    ("index_copy", lambda T, x, s: T.index_copy(x, 0, T.tensor([2, 0]), s), [(3, 4), (2, 4)],
     {}),
    ("index_fill", lambda T, x: T.index_fill(x, 1, T.tensor([1, -1]), -2.0), [(3, 4)], {}),
    ("index_fill tensor value", lambda T, x, v: x.index_fill(0, T.tensor([1]), v.sum()),
     [(3, 4), (2,)], {}),
    ("scatter src", lambda T, x, s: T.scatter(x, 1, T.tensor([[2, 0], [1, 3], [0, 1]]), s),
     [(3, 4), (3, 2)], {}),
    ("scatter value", lambda T, x: x.scatter(0, T.tensor([[2, 0, 1, 0]]), 1.5), [(3, 4)], {}),
    ("scatter add", lambda T, x, s: T.scatter(x, 0, T.tensor([[2, 0, 2, 0], [2, 1, 1, 1]]), s,
                                              reduce="add"), [(3, 4), (2, 4)], dict(grad=False)),
]


@pytest.mark.parametrize("name, fn, specs, kw", COMPOSITE, ids=lambda v: v
                         if isinstance(v, str) else "")
def test_composite(name, fn, specs, kw):
    check_op(fn, specs, **kw)


def test_inplace_index_ops():
    arrays = make_inputs([(3, 4), (2, 4)])
    check_torch(lambda T, x, s: (x * 1).index_add_(0, T.tensor([2, 2]), s), arrays)
    check_torch(lambda T, x, s: (x * 1).index_copy_(0, T.tensor([2, 0]), s), arrays)
    check_torch(lambda T, x, s: (x * 1).scatter_(1, T.tensor([[3, 0, 1, 2]]), s[:1]), arrays)
    check_torch(lambda T, x, s: (x * 1).index_fill_(1, T.tensor([0]), 7.0) + s.sum(), arrays)
    check_torch(lambda T, x, s: (x[:2, :3] * 1).addmm_(s, x.T[:, :3] * 1), arrays)


@pytest.mark.parametrize("call", [
    lambda T, x: T.index_add(x, 0, T.tensor([3]), T.ones(1, 4, dtype=T.float64)),
    lambda T, x: T.index_add(x, 0, T.tensor([-4]), T.ones(1, 4, dtype=T.float64)),
    lambda T, x: T.index_copy(x, 1, T.tensor([4]), T.ones(3, 1, dtype=T.float64)),
    lambda T, x: T.index_fill(x, 1, T.tensor([9]), 1.0),
    lambda T, x: T.index_fill(x, 1, T.tensor([-5]), 1.0),
    lambda T, x: T.index_copy(x, 0, T.tensor([-1]), T.ones(1, 4, dtype=T.float64)),
    lambda T, x: T.scatter(x, 0, T.tensor([[3]]), 1.0),
    lambda T, x: T.scatter(x, 1, T.tensor([[-1]]), 1.0),
    lambda T, x: T.take(x, T.tensor([12])),
    lambda T, x: T.take(x, T.tensor([-13])),
])
def test_out_of_range_indices_raise(call):
    x = np.zeros((3, 4))
    for T in (torch, tapegrad):
        with pytest.raises((IndexError, RuntimeError)):
            call(T, T.tensor(x))


def test_scatter_reduce_has_no_derivative():
    for T in (torch, tapegrad):
        x = T.zeros(3, requires_grad=True)
        with pytest.raises(RuntimeError, match="not implemented"):
            T.scatter(x, 0, T.tensor([1]), T.ones(1), reduce="add").sum().backward()


def test_no_gradient_functions():
    x = np.array([[0.0, 1.5, 0.0], [2.0, np.nan, -1.0]])
    y = x + np.array([[0.0, 1e-9, 0.0], [1e-3, np.nan, 0.0]])
    check_torch(lambda T, a: (T.count_nonzero(a), a.count_nonzero(1), T.count_nonzero(a, (0, 1))),
                [x], grad=False)
    check_torch(lambda T, a, b: (T.isclose(a, b), a.isclose(b, rtol=0, atol=1e-2,
                                                            equal_nan=True)), [x, y], grad=False)
    for T in (torch, tapegrad):
        a, b = T.tensor(x), T.tensor(y)
        assert T.allclose(a, a, equal_nan=True) and not T.allclose(a, b)
        assert T.equal(a[:, :1], a[:, :1]) and not T.equal(a, a)  # NaN != NaN
        assert not T.equal(a, a[:1])
    check_torch(lambda T, a: (T.nonzero(a), T.argwhere(a), *T.nonzero(a, as_tuple=True)),
                [x], grad=False)
    check_torch(lambda T: (T.tril_indices(3, 4), T.triu_indices(4, 3, 1),
                           T.tril_indices(3, 3, -1, dtype=T.int32), T.triu_indices(0, 3)), [],
                grad=False)
