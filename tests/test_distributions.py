"""tapegrad.distributions against torch.distributions.

Values and gradients of log_prob, entropy, cdf, icdf, moments and KL are compared with PyTorch
at 1e-12 in float64 on given values (``check_torch``); the special-function and matrix ops are
checked three ways (``check_op``). Samples come from tapegrad's own generator, so they are
tested statistically with fixed seeds: each tolerance is a few standard errors of the estimate
(a wrong scale or shift is many standard errors away).
"""
import math
import re

import numpy as np
import pytest
import torch

import tapegrad
import tapegrad.distributions as D
from tapegrad.distributions import _math as M
from helpers import check_op, check_torch

rng = np.random.default_rng(0)


def pos(*shape, low=0.5, high=3.0):
    return rng.uniform(low, high, size=shape)


def real(*shape):
    return rng.standard_normal(shape)


def unit(*shape):
    return rng.uniform(0.05, 0.95, size=shape)


def simplex(*shape):
    p = rng.uniform(0.1, 1.0, size=shape)
    return p / p.sum(-1, keepdims=True)


def spd(n, batch=()):
    a = rng.standard_normal(batch + (n, n))
    return a @ np.swapaxes(a, -1, -2) + n * np.eye(n)


def lower(n, batch=()):
    return np.tril(rng.standard_normal(batch + (n, n)), -1) + np.diag(rng.uniform(0.5, 2, n))


def _special(name):
    def fn(T, *xs):
        if T is torch:
            return {"lgamma": torch.lgamma, "digamma": torch.digamma, "erfinv": torch.erfinv,
                    "xlogy": torch.xlogy}[name](*xs)
        return {"lgamma": tapegrad.lgamma, "digamma": tapegrad.digamma,
                "erfinv": tapegrad.erfinv, "xlogy": tapegrad.xlogy}[name](*xs)
    return fn


# --- the ops the distributions need -------------------------------------------------------
@pytest.mark.parametrize("name,low,high", [("lgamma", 0.1, 8.0), ("digamma", 0.2, 12.0),
                                           ("erfinv", -0.95, 0.95)])
def test_special_ops(name, low, high):
    check_op(_special(name), [(4, 5)], low=low, high=high)


def test_special_negative_arguments_and_poles():
    x = np.array([-3.7, -2.5, -0.3, 1e-3, 25.0, 1e6, 0.5, 7.25])
    for name in ("lgamma", "digamma"):
        check_torch(_special(name), [x], grad=False)
        poles = np.array([0.0, -2.0, -0.0])
        np.testing.assert_array_equal(getattr(tapegrad, name)(tapegrad.tensor(poles)).numpy(),
                                      getattr(torch, name)(torch.tensor(poles)).numpy())
    root = 1.4616321449683622  # digamma's zero: agree to a few ulp of the summed terms
    assert abs(tapegrad.digamma(tapegrad.tensor([root], dtype=tapegrad.float64)).item()) < 1e-15
    check_torch(_special("erfinv"), [np.array([0.0, 1e-10, -0.99, 0.5])], grad=False)
    edges = np.array([-1.0, 1.0, 1.5])
    np.testing.assert_array_equal(tapegrad.erfinv(tapegrad.tensor(edges)).numpy(),
                                  torch.erfinv(torch.tensor(edges)).numpy())
    # within 1e-6 of +-1, Newton on erf (not erfc) leaves ~1e-13 relative
    check_torch(_special("erfinv"), [np.array([0.999999, -0.9999999])], grad=False, rtol=1e-11)


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_polygamma(n):
    check_op(lambda T, x: T.polygamma(n, x), [(3, 4)],
             low=0.3, high=9.0, second_order=n < 3)
    x = np.array([-2.5, -0.3, 0.7, 15.0, 100.0] if n == 1 else [0.2, 0.7, 15.0, 100.0])
    check_torch(lambda T, x: T.polygamma(n, x), [x],
                grad=False, rtol=1e-11)


def test_xlogy_zero_and_gradients():
    a = np.array([0.0, 0.0, 1.5, -2.0, 3.0])
    b = np.array([0.0, 2.0, 0.5, 3.0, 1.2])
    check_torch(_special("xlogy"), [a, b])


def test_cholesky():
    check_op(lambda T, a: T.linalg.cholesky(
        a @ a.mT + 4 * (torch if T is torch else tapegrad).eye(4, dtype=a.dtype)), [(2, 4, 4)])


@pytest.mark.parametrize("upper", [False, True])
def test_solve_triangular(upper):
    def fn(T, a, b):
        lib = torch if T is torch else tapegrad
        tri = (a.triu() if upper else a.tril()) + 3 * lib.eye(3, dtype=a.dtype)
        return T.linalg.solve_triangular(tri, b, upper=upper)
    check_op(fn, [(2, 3, 3), (2, 3, 2)])
    check_op(fn, [(3, 3), (2, 3, 4)], float32=False)  # batch dims broadcast


def test_cholesky_not_positive_definite():
    with pytest.raises(RuntimeError, match="cholesky.*not positive-definite"):
        tapegrad.linalg.cholesky(tapegrad.tensor([[1.0, 2.0], [2.0, 1.0]], dtype=tapegrad.float64))


def test_gamma_reparameterisation_gradient_against_inverse_cdf():
    """dx/dalpha at fixed quantile, by central differences of scipy's inverse CDF."""
    special = pytest.importorskip("scipy.special")
    alpha = np.array([0.3, 0.8, 1.0, 2.5, 7.0, 30.0, 0.3, 2.5, 30.0])
    x = np.array([0.05, 0.4, 1.3, 2.0, 9.0, 25.0, 1e-3, 6.0, 40.0])
    u = special.gammainc(alpha, x)
    h = 1e-6 * alpha
    expected = (special.gammaincinv(alpha + h, u) - special.gammaincinv(alpha - h, u)) / (2 * h)
    np.testing.assert_allclose(M._gamma_reparam_grad(x, alpha), expected, rtol=1e-6)


# --- log_prob / cdf / icdf / entropy / moments against PyTorch ----------------------------
def _call(what, *value_arg):
    def fn(d):
        if what in ("log_prob", "cdf", "icdf"):
            return getattr(d, what)(*value_arg)
        if what == "entropy":
            return d.entropy()
        return getattr(d, what)
    return fn


# name -> (constructor(T, *params), param arrays, value array or None, what to check)
CASES = {
    "Normal": (lambda T, l, s: T.distributions.Normal(l, s), [real(3, 4), pos(3, 4)],
               real(2, 3, 4), ["log_prob", "cdf", "entropy", "mean", "mode", "stddev",
                               "variance"]),
    "Uniform": (lambda T, lo, hi: T.distributions.Uniform(lo, lo + hi), [real(5), pos(5)],
                None, ["entropy", "mean", "stddev", "variance"]),
    "Exponential": (lambda T, r: T.distributions.Exponential(r), [pos(4)], pos(3, 4),
                    ["log_prob", "cdf", "entropy", "mean", "mode", "stddev", "variance"]),
    "Laplace": (lambda T, l, s: T.distributions.Laplace(l, s), [real(4), pos(4)], real(2, 4),
                ["log_prob", "cdf", "entropy", "mean", "mode", "stddev", "variance"]),
    "Gamma": (lambda T, c, r: T.distributions.Gamma(c, r), [pos(4), pos(4)], pos(2, 4),
              ["log_prob", "entropy", "mean", "mode", "variance"]),
    "Chi2": (lambda T, df: T.distributions.Chi2(df), [pos(4, high=6)], pos(2, 4),
             ["log_prob", "entropy", "mean", "variance"]),
    "Beta": (lambda T, a, b: T.distributions.Beta(a, b), [pos(4), pos(4)], unit(2, 4),
             ["log_prob", "entropy", "mean", "variance"]),
    "Dirichlet": (lambda T, c: T.distributions.Dirichlet(c), [pos(2, 4)], simplex(3, 2, 4),
                  ["log_prob", "entropy", "mean", "variance"]),
    "StudentT": (lambda T, df, l, s: T.distributions.StudentT(df, l, s),
                 [pos(5, low=2.5, high=9), real(5), pos(5)], real(3, 5),
                 ["log_prob", "entropy", "mean", "mode", "variance"]),
    "LogNormal": (lambda T, l, s: T.distributions.LogNormal(l, s), [real(4), pos(4)],
                  pos(2, 4), ["log_prob", "cdf", "entropy", "mean", "mode", "variance"]),
    "Bernoulli": (lambda T, p: T.distributions.Bernoulli(probs=p), [unit(5)],
                  np.array([0.0, 1.0, 1.0, 0.0, 1.0]),
                  ["log_prob", "entropy", "mean", "variance"]),
    "BernoulliLogits": (lambda T, lg: T.distributions.Bernoulli(logits=lg), [real(5)],
                        np.array([0.0, 1.0, 1.0, 0.0, 1.0]), ["log_prob", "entropy", "mean"]),
    "Binomial": (lambda T, p: T.distributions.Binomial(6, probs=p), [unit(4)],
                 np.array([0.0, 3.0, 6.0, 2.0]), ["log_prob", "entropy", "mean", "variance"]),
    "Geometric": (lambda T, p: T.distributions.Geometric(probs=p), [unit(4)],
                  np.array([0.0, 3.0, 7.0, 1.0]), ["log_prob", "entropy", "mean", "variance"]),
    "Poisson": (lambda T, r: T.distributions.Poisson(r), [pos(4)],
                np.array([0.0, 3.0, 7.0, 1.0]), ["log_prob", "mean", "variance"]),
    "Categorical": (lambda T, p: T.distributions.Categorical(probs=p), [simplex(3, 5)],
                    np.array([[0, 4, 2], [1, 1, 3]]), ["log_prob", "entropy"]),
    "CategoricalLogits": (lambda T, lg: T.distributions.Categorical(logits=lg), [real(3, 5)],
                          np.array([0, 4, 2]), ["log_prob", "entropy", "probs"]),
    "OneHotCategorical": (lambda T, lg: T.distributions.OneHotCategorical(logits=lg),
                          [real(3, 4)], np.eye(4)[[0, 3, 1]],
                          ["log_prob", "entropy", "mean", "variance"]),
    "MVN_scale_tril": (lambda T, l, L: T.distributions.MultivariateNormal(l, scale_tril=L),
                       [real(2, 3), lower(3)], real(4, 2, 3),
                       ["log_prob", "entropy", "variance", "covariance_matrix",
                        "precision_matrix"]),
    "MVN_covariance": (lambda T, l, C: T.distributions.MultivariateNormal(
        l, covariance_matrix=(C + C.mT) / 2), [real(3), spd(3)], real(5, 3),
        ["log_prob", "entropy", "scale_tril", "precision_matrix"]),
    "MVN_precision": (lambda T, l, P: T.distributions.MultivariateNormal(
        l, precision_matrix=(P + P.mT) / 2), [real(2, 3), spd(3, (2,))], real(2, 3),
        ["log_prob", "entropy", "scale_tril", "covariance_matrix"]),
    "Independent": (lambda T, l, s: T.distributions.Independent(T.distributions.Normal(l, s),
                                                                1),
                    [real(3, 4), pos(3, 4)], real(2, 3, 4), ["log_prob", "entropy", "mean"]),
    "AffineExp": (lambda T, l, s, a, b: T.distributions.TransformedDistribution(
        T.distributions.Normal(l, s), [T.distributions.transforms.AffineTransform(a, b),
                                       T.distributions.transforms.ExpTransform()]),
        [real(4), pos(4), real(4), pos(4)], pos(3, 4), ["log_prob", "cdf"]),
    "Sigmoid": (lambda T, l, s: T.distributions.TransformedDistribution(
        T.distributions.Normal(l, s), T.distributions.transforms.SigmoidTransform()),
        [real(4), pos(4)], unit(3, 4), ["log_prob", "cdf"]),
    "Tanh": (lambda T, l, s: T.distributions.TransformedDistribution(
        T.distributions.Normal(l, s), [T.distributions.transforms.TanhTransform()]),
        [real(4), pos(4)], 0.9 * (2 * unit(3, 4) - 1), ["log_prob", "cdf"]),
    "NegativeAffine": (lambda T, l, s: T.distributions.TransformedDistribution(
        T.distributions.Normal(l, s), T.distributions.transforms.AffineTransform(1.0, -2.0)),
        [real(4), pos(4)], real(3, 4), ["log_prob", "cdf"]),
    "RelaxedBernoulli": (lambda T, t, p: T.distributions.RelaxedBernoulli(t, probs=p),
                         [pos(4), unit(4)], unit(2, 4), ["log_prob"]),
    "RelaxedOneHot": (lambda T, t, lg: T.distributions.RelaxedOneHotCategorical(t, logits=lg),
                      [np.array(0.7), real(3, 4)], simplex(2, 3, 4), ["log_prob"]),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_against_torch(name):
    make, params, value, checks = CASES[name]
    for what in checks:
        if what in ("log_prob", "cdf"):
            def fn(T, *ps, what=what):
                return getattr(make(T, *ps), what)(
                    T.tensor(value, dtype=T.float64) if value.dtype.kind == "f"
                    else T.tensor(value))
        else:
            def fn(T, *ps, what=what):
                return _call(what)(make(T, *ps))
        check_torch(fn, [np.asarray(p, dtype=np.float64) for p in params])


@pytest.mark.parametrize("name,make,param", [
    ("Normal", lambda T, l: T.distributions.Normal(l, T.tensor(0.7, dtype=T.float64)), real(6)),
    ("Laplace", lambda T, l: T.distributions.Laplace(l, T.tensor(1.3, dtype=T.float64)),
     real(6)),
    ("Exponential", lambda T, r: T.distributions.Exponential(r), pos(6)),
    ("Uniform", lambda T, lo: T.distributions.Uniform(lo, lo + 2.0), real(6)),
])
def test_icdf(name, make, param):
    q = np.linspace(0.05, 0.95, 6)
    check_torch(lambda T, p, q: make(T, p).icdf(q), [param, q])


@pytest.mark.parametrize("name,p,q", [
    ("normal", lambda T, a, b: T.distributions.Normal(a, b), [real(4), pos(4)]),
    ("bernoulli", lambda T, a: T.distributions.Bernoulli(probs=a), [unit(4)]),
    ("categorical", lambda T, a: T.distributions.Categorical(logits=a), [real(3, 5)]),
    ("onehot", lambda T, a: T.distributions.OneHotCategorical(probs=a), [simplex(3, 5)]),
    ("mvn", lambda T, a, L: T.distributions.MultivariateNormal(a, scale_tril=L),
     [real(2, 3), lower(3, (2,))]),
    ("beta", lambda T, a, b: T.distributions.Beta(a, b), [pos(4), pos(4)]),
    ("gamma", lambda T, a, b: T.distributions.Gamma(a, b), [pos(4), pos(4)]),
    ("dirichlet", lambda T, a: T.distributions.Dirichlet(a), [pos(3, 4)]),
    ("exponential", lambda T, a: T.distributions.Exponential(a), [pos(4)]),
    ("laplace", lambda T, a, b: T.distributions.Laplace(a, b), [real(4), pos(4)]),
    ("poisson", lambda T, a: T.distributions.Poisson(a), [pos(4)]),
    ("geometric", lambda T, a: T.distributions.Geometric(probs=a), [unit(4)]),
    ("binomial", lambda T, a: T.distributions.Binomial(5, probs=a), [unit(4)]),
    ("independent", lambda T, a, b: T.distributions.Independent(
        T.distributions.Normal(a, b), 1), [real(2, 3), pos(2, 3)]),
    ("lognormal", lambda T, a, b: T.distributions.LogNormal(a, b), [real(4), pos(4)]),
])
def test_kl_divergence(name, p, q):
    p_params = [np.asarray(a, dtype=np.float64) for a in q]
    q_params = [np.asarray(b, dtype=np.float64) for b in
                [real(*a.shape) if name in ("normal", "laplace", "lognormal", "mvn",
                                            "independent") and i == 0
                 else (pos(*a.shape) if name not in ("bernoulli", "geometric", "binomial",
                                                     "onehot", "categorical")
                       else (simplex(*a.shape) if name == "onehot" else
                             real(*a.shape) if name == "categorical" else unit(*a.shape)))
                 for i, a in enumerate(p_params)]]
    if name == "mvn":
        q_params[1] = lower(3)
    n = len(p_params)
    check_torch(lambda T, *xs: T.distributions.kl_divergence(p(T, *xs[:n]), p(T, *xs[n:])),
                p_params + q_params)


def test_kl_uniform_support_and_infinities():
    def fn(T, a, b):
        return T.distributions.kl_divergence(T.distributions.Uniform(a, a + 1.0),
                                             T.distributions.Uniform(b - 1.0, b + 2.0))
    check_torch(fn, [np.array([0.0, 0.5, -3.0]), np.array([0.0, 2.0, -3.0])])
    p = D.Categorical(probs=tapegrad.tensor([0.5, 0.5, 0.0]))
    q = D.Categorical(probs=tapegrad.tensor([0.0, 0.5, 0.5]))
    tp = torch.distributions.Categorical(probs=torch.tensor([0.5, 0.5, 0.0]))
    tq = torch.distributions.Categorical(probs=torch.tensor([0.0, 0.5, 0.5]))
    assert D.kl_divergence(p, q).item() == torch.distributions.kl_divergence(tp, tq).item()


def test_register_kl_and_dispatch():
    class MyNormal(D.Normal):
        pass

    p, q = MyNormal(0.0, 1.0), MyNormal(1.0, 2.0)
    base = D.kl_divergence(p, q).item()
    assert base == pytest.approx(math.log(2) + (1 + 1) / 8 - 0.5, rel=1e-6)

    @D.register_kl(MyNormal, MyNormal)
    def _kl(p, q):
        return tapegrad.tensor(-1.0)

    assert D.kl_divergence(p, q).item() == -1.0
    assert D.kl_divergence(D.Normal(0.0, 1.0), q).item() == base  # the general pair
    with pytest.raises(NotImplementedError, match="No KL.*Normal and q type Gamma"):
        D.kl_divergence(D.Normal(0.0, 1.0), D.Gamma(1.0, 1.0))
    with pytest.raises(TypeError, match="Distribution subclass"):
        D.register_kl(int, D.Normal)


# --- shapes, expand, enumerate_support ----------------------------------------------------
SHAPE_CASES = [
    lambda T: T.distributions.Normal(T.zeros(3, 1), T.ones(2)),
    lambda T: T.distributions.Gamma(T.ones(2) * 2, 1.0),
    lambda T: T.distributions.Dirichlet(T.ones(2, 3)),
    lambda T: T.distributions.Beta(T.ones(2), T.ones(2)),
    lambda T: T.distributions.Categorical(logits=T.zeros(2, 4)),
    lambda T: T.distributions.OneHotCategorical(logits=T.zeros(2, 4)),
    lambda T: T.distributions.Bernoulli(logits=T.zeros(3)),
    lambda T: T.distributions.Binomial(4, probs=T.ones(3) / 2),
    lambda T: T.distributions.Poisson(T.ones(3)),
    lambda T: T.distributions.Geometric(probs=T.ones(3) / 2),
    lambda T: T.distributions.StudentT(T.ones(3) * 4),
    lambda T: T.distributions.MultivariateNormal(T.zeros(2, 3), T.eye(3)),
    lambda T: T.distributions.Independent(T.distributions.Normal(T.zeros(2, 3), 1.0), 1),
    lambda T: T.distributions.LogNormal(T.zeros(3), 1.0),
    lambda T: T.distributions.Uniform(T.zeros(3), 1.0),
    lambda T: T.distributions.Laplace(0.0, 1.0),
    lambda T: T.distributions.Exponential(T.ones(1)),
    lambda T: T.distributions.RelaxedBernoulli(T.tensor(0.5), logits=T.zeros(3)),
    lambda T: T.distributions.RelaxedOneHotCategorical(T.tensor(0.5), logits=T.zeros(2, 3)),
]


@pytest.mark.parametrize("i", range(len(SHAPE_CASES)))
def test_shapes_and_expand(i):
    ours, theirs = SHAPE_CASES[i](tapegrad), SHAPE_CASES[i](torch)
    assert ours.batch_shape == tuple(theirs.batch_shape)
    assert ours.event_shape == tuple(theirs.event_shape)
    assert ours.has_rsample == theirs.has_rsample
    assert ours.support.event_dim == theirs.support.event_dim
    assert repr(ours.support) == repr(theirs.support)
    for sample_shape in [(), (5,), (2, 3)]:
        assert ours.sample(sample_shape).shape == tuple(theirs.sample(sample_shape).shape)
        x = theirs.sample(sample_shape)
        assert tuple(ours.log_prob(tapegrad.tensor(x.numpy())).shape) == \
            tuple(theirs.log_prob(x).shape)
        if ours.has_rsample:
            assert ours.rsample(sample_shape).shape == tuple(theirs.rsample(sample_shape).shape)
    new_batch = (4,) + tuple(theirs.batch_shape)
    e_ours, e_theirs = ours.expand(new_batch), theirs.expand(new_batch)
    assert type(e_ours) is type(ours)
    assert e_ours.batch_shape == tuple(e_theirs.batch_shape)
    assert e_ours.event_shape == tuple(e_theirs.event_shape)
    assert e_ours.sample((2,)).shape == tuple(e_theirs.sample((2,)).shape)
    x = e_theirs.sample()
    np.testing.assert_allclose(e_ours.log_prob(tapegrad.tensor(x.numpy())).numpy(),
                               e_theirs.log_prob(x).numpy(), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("make", [
    lambda T: T.distributions.Bernoulli(probs=T.tensor([0.2, 0.7])),
    lambda T: T.distributions.Binomial(3, probs=T.tensor([0.2, 0.7])),
    lambda T: T.distributions.Categorical(probs=T.tensor([[0.2, 0.8], [0.5, 0.5]])),
    lambda T: T.distributions.OneHotCategorical(probs=T.tensor([[0.2, 0.8, 0.0]])),
])
@pytest.mark.parametrize("expand", [True, False])
def test_enumerate_support(make, expand):
    ours = make(tapegrad).enumerate_support(expand)
    theirs = make(torch).enumerate_support(expand)
    np.testing.assert_array_equal(ours.numpy(), theirs.numpy())
    assert str(ours.dtype).split(".")[-1] == str(theirs.dtype).split(".")[-1]


def test_modes_with_nan_and_corners():
    for make in [lambda T: T.distributions.Bernoulli(probs=T.tensor([0.2, 0.5, 0.9])),
                 lambda T: T.distributions.Dirichlet(T.tensor([[0.5, 0.7, 0.2], [2., 3., 4.]])),
                 lambda T: T.distributions.Beta(T.tensor([0.5, 2.0]), T.tensor([0.7, 3.0])),
                 lambda T: T.distributions.StudentT(T.tensor([0.5, 1.5, 3.0])),
                 lambda T: T.distributions.Categorical(logits=T.tensor([[0., 2., 1.]])),
                 lambda T: T.distributions.OneHotCategorical(logits=T.tensor([[0., 2., 1.]])),
                 lambda T: T.distributions.Binomial(5, probs=T.tensor([0.3, 0.99])),
                 lambda T: T.distributions.Gamma(T.tensor([0.5, 3.0]), 2.0)]:
        ours, theirs = make(tapegrad), make(torch)
        for what in ("mode", "mean", "variance"):
            try:
                expected = getattr(theirs, what)
            except NotImplementedError:
                continue
            np.testing.assert_allclose(getattr(ours, what).numpy(), expected.numpy(),
                                       rtol=1e-6, err_msg=what)


# --- validation ---------------------------------------------------------------------------
def _head(message):
    """The part of PyTorch's message before the parameter printout (tensor reprs differ)."""
    message = message.split("but found invalid values")[0]
    return re.sub(r"torch\.Size\(\[([^\]]*)\]\)", lambda m: f"({m.group(1)}"
                  + ("," if m.group(1) and "," not in m.group(1) else "") + ")", message)


@pytest.mark.parametrize("make", [
    lambda T: T.distributions.Normal(T.zeros(2), T.tensor([1.0, -1.0])),
    lambda T: T.distributions.Bernoulli(probs=T.tensor([0.5, 1.5])),
    lambda T: T.distributions.Categorical(probs=T.tensor([0.5, -0.5])),
    lambda T: T.distributions.Gamma(T.tensor([1.0]), T.tensor([0.0])),
    lambda T: T.distributions.Dirichlet(T.tensor([1.0, -1.0])),
    lambda T: T.distributions.MultivariateNormal(T.zeros(2), scale_tril=T.tensor([[1., 1.],
                                                                                   [0., 1.]])),
    lambda T: T.distributions.MultivariateNormal(T.zeros(2), T.tensor([[1., 2.], [2., 1.]])),
    lambda T: T.distributions.Poisson(T.tensor([-1.0])),
    lambda T: T.distributions.Uniform(T.tensor([1.0]), T.tensor([0.0])),
    lambda T: T.distributions.Geometric(probs=T.tensor([0.0, 0.5])),
    lambda T: T.distributions.Binomial(T.tensor([2.5]), probs=T.tensor([0.5])),
    lambda T: T.distributions.Categorical(probs=T.tensor(0.5)),
    lambda T: T.distributions.Bernoulli(),
    lambda T: T.distributions.MultivariateNormal(T.zeros(2)),
    lambda T: T.distributions.Independent(T.distributions.Normal(T.zeros(2), 1.0), 2),
])
def test_argument_validation_as_pytorch(make):
    with pytest.raises(ValueError) as theirs:
        make(torch)
    with pytest.raises(ValueError) as ours:
        make(tapegrad)
    assert _head(str(ours.value)) == _head(str(theirs.value))


@pytest.mark.parametrize("make,value", [
    (lambda T: T.distributions.Normal(T.zeros(3), 1.0), [0.0, float("nan"), 1.0]),
    (lambda T: T.distributions.Exponential(T.ones(3)), [0.0, -1.0, 1.0]),
    (lambda T: T.distributions.Bernoulli(probs=T.ones(3) / 2), [0.0, 0.5, 1.0]),
    (lambda T: T.distributions.Beta(T.ones(3), T.ones(3)), [0.0, 1.5, 1.0]),
    (lambda T: T.distributions.Categorical(logits=T.zeros(3, 4)), [0, 4, 1]),
    (lambda T: T.distributions.Normal(T.zeros(3), 1.0), [0.0, 1.0]),
    (lambda T: T.distributions.MultivariateNormal(T.zeros(3), T.eye(3)), [[0.0, 1.0]]),
    (lambda T: T.distributions.Dirichlet(T.ones(3)), [0.5, 0.6, 0.1]),
    (lambda T: T.distributions.Uniform(0.0, 1.0), [1.5]),
])
def test_sample_validation_as_pytorch(make, value):
    with pytest.raises(ValueError) as theirs:
        make(torch).log_prob(torch.tensor(value))
    with pytest.raises(ValueError) as ours:
        make(tapegrad).log_prob(tapegrad.tensor(value))
    assert _head(str(ours.value)) == _head(str(theirs.value))
    with pytest.raises(ValueError, match="must be a Tensor"):
        make(tapegrad).log_prob(value)


def test_validation_off():
    d = D.Normal(tapegrad.zeros(2), tapegrad.tensor([1.0, -1.0]), validate_args=False)
    assert d.log_prob(tapegrad.zeros(2)).shape == (2,)
    D.Distribution.set_default_validate_args(False)
    try:
        D.Normal(0.0, -1.0).log_prob(tapegrad.tensor(float("nan")))
    finally:
        D.Distribution.set_default_validate_args(True)
    with pytest.raises(ValueError):
        D.Normal(0.0, -1.0)


# --- sampling: moments and reparameterised gradients (tapegrad's own stream) --------------
N = 200_000


def _moments(d, n=N):
    x = d.sample((n,)).numpy().astype(np.float64)
    return x, x.mean(0), x.var(0)


@pytest.mark.parametrize("make", [
    lambda: D.Normal(tapegrad.tensor([0.5, -2.0], dtype=tapegrad.float64),
                     tapegrad.tensor([1.5, 0.3], dtype=tapegrad.float64)),
    lambda: D.Uniform(tapegrad.tensor([-1.0, 2.0]), tapegrad.tensor([3.0, 2.5])),
    lambda: D.Exponential(tapegrad.tensor([0.5, 4.0])),
    lambda: D.Laplace(tapegrad.tensor([1.0, -1.0]), tapegrad.tensor([0.5, 2.0])),
    lambda: D.Gamma(tapegrad.tensor([0.3, 1.0, 5.0]), tapegrad.tensor([1.0, 2.0, 0.5])),
    lambda: D.Beta(tapegrad.tensor([0.5, 2.0]), tapegrad.tensor([0.5, 5.0])),
    lambda: D.Dirichlet(tapegrad.tensor([0.5, 2.0, 3.0])),
    lambda: D.StudentT(tapegrad.tensor([5.0, 9.0]), tapegrad.tensor([1.0, 0.0]),
                       tapegrad.tensor([2.0, 0.5])),
    lambda: D.LogNormal(tapegrad.tensor([0.0, 0.5]), tapegrad.tensor([0.25, 0.5])),
    lambda: D.Bernoulli(probs=tapegrad.tensor([0.1, 0.5, 0.85])),
    lambda: D.Binomial(tapegrad.tensor([10.0, 3.0]), probs=tapegrad.tensor([0.3, 0.9])),
    lambda: D.Poisson(tapegrad.tensor([0.5, 4.0, 30.0])),
    lambda: D.Geometric(probs=tapegrad.tensor([0.2, 0.7])),
    lambda: D.OneHotCategorical(probs=tapegrad.tensor([0.1, 0.2, 0.7])),
    lambda: D.MultivariateNormal(tapegrad.tensor([1.0, -1.0]),
                                 tapegrad.tensor([[2.0, 0.8], [0.8, 1.0]])),
])
def test_sample_moments(make):
    tapegrad.manual_seed(1234)
    d = make()
    x, mean, var = _moments(d)
    expected_mean = d.mean.numpy()
    expected_var = d.variance.numpy()
    se_mean = np.sqrt(expected_var / N)
    assert np.all(np.abs(mean - expected_mean) < 5 * se_mean + 1e-12), (mean, expected_mean)
    # the variance of a sample variance is ~ (m4 - var^2)/N; 5 of those standard errors
    m4 = ((x - x.mean(0)) ** 4).mean(0)
    se_var = np.sqrt(np.maximum(m4 - var ** 2, 0) / N)
    assert np.all(np.abs(var - expected_var) < 5 * se_var + 1e-12), (var, expected_var)
    assert bool(d.support.check(tapegrad.tensor(x.astype(np.float32))).all())


def test_categorical_frequencies_and_mvn_covariance():
    tapegrad.manual_seed(7)
    p = np.array([0.1, 0.2, 0.3, 0.4])
    counts = np.bincount(D.Categorical(probs=tapegrad.tensor(p)).sample((N,)).numpy(),
                         minlength=4)
    assert np.all(np.abs(counts / N - p) < 5 * np.sqrt(p * (1 - p) / N))
    cov = np.array([[2.0, 0.8], [0.8, 1.0]])
    x = D.MultivariateNormal(tapegrad.zeros(2, dtype=tapegrad.float64),
                             tapegrad.tensor(cov)).sample((N,)).numpy()
    c = np.cov(x.T)
    assert abs(c[0, 1] - 0.8) < 5 * np.sqrt((2.0 * 1.0 + 0.8 ** 2) / N)


def test_rsample_gradients_reach_parameters():
    tapegrad.manual_seed(3)
    f64 = tapegrad.float64
    loc = tapegrad.tensor([0.5, -1.0], dtype=f64, requires_grad=True)
    scale = tapegrad.tensor([2.0, 0.5], dtype=f64, requires_grad=True)
    x = D.Normal(loc, scale).rsample((1000,))
    x.sum().backward()
    np.testing.assert_allclose(loc.grad.numpy(), [1000, 1000])
    eps = (x.detach() - loc.detach()) / scale.detach()
    np.testing.assert_allclose(scale.grad.numpy(), eps.sum(0).numpy(), rtol=1e-12)
    # implicit reparameterisation: d E[x] / d alpha = 1 / rate for Gamma(alpha, rate)
    alpha = tapegrad.tensor([0.4, 2.0, 9.0], dtype=f64, requires_grad=True)
    rate = tapegrad.tensor([1.0, 2.0, 0.5], dtype=f64, requires_grad=True)
    D.Gamma(alpha, rate).rsample((N,)).mean(0).sum().backward()
    np.testing.assert_allclose(alpha.grad.numpy(), 1 / rate.detach().numpy(), rtol=0.02)
    np.testing.assert_allclose(rate.grad.numpy(), -(alpha / rate ** 2).detach().numpy(),
                               rtol=0.02)
    # Beta: d E[x] / d a = b / (a + b)^2
    a = tapegrad.tensor(2.0, dtype=f64, requires_grad=True)
    b = tapegrad.tensor(3.0, dtype=f64, requires_grad=True)
    D.Beta(a, b).rsample((N,)).mean().backward()
    assert a.grad.item() == pytest.approx(3.0 / 25.0, rel=0.03)
    assert b.grad.item() == pytest.approx(-2.0 / 25.0, rel=0.03)
    # MVN: E[d/dL (L eps)] of a linear functional is zero; d/dloc sums to the count
    mloc = tapegrad.zeros(2, dtype=f64, requires_grad=True)
    L = tapegrad.tensor([[1.0, 0.0], [0.5, 2.0]], dtype=f64, requires_grad=True)
    D.MultivariateNormal(mloc, scale_tril=L).rsample((10,)).sum().backward()
    np.testing.assert_allclose(mloc.grad.numpy(), [10, 10])
    np.testing.assert_array_equal(L.grad.numpy()[0], L.grad.numpy()[1])  # d(L eps)/dL_ij
    # StudentT and relaxed distributions are reparameterised too
    df = tapegrad.tensor(4.0, dtype=f64, requires_grad=True)
    D.StudentT(df).rsample((100,)).pow(2).mean().backward()
    assert df.grad is not None and math.isfinite(df.grad.item())
    t = tapegrad.tensor(0.5, dtype=f64, requires_grad=True)
    logits = tapegrad.zeros(3, dtype=f64, requires_grad=True)
    y = D.RelaxedOneHotCategorical(t, logits=logits).rsample((4,))
    np.testing.assert_allclose(y.sum(-1).detach().numpy(), np.ones(4), rtol=1e-12)
    (y * tapegrad.tensor([1.0, 2.0, 3.0], dtype=f64)).sum().backward()
    assert logits.grad is not None and t.grad is not None


def test_sample_has_no_graph_and_seed_reproduces():
    loc = tapegrad.zeros(3, requires_grad=True)
    d = D.Normal(loc, 1.0)
    assert not d.sample((2,)).requires_grad
    assert d.rsample((2,)).requires_grad
    tapegrad.manual_seed(11)
    a = d.sample((4,)).numpy()
    tapegrad.manual_seed(11)
    np.testing.assert_array_equal(a, d.sample((4,)).numpy())


def test_transform_cache_and_inverse():
    t = D.transforms.TanhTransform(cache_size=1)
    x = tapegrad.tensor([30.0, 0.3], dtype=tapegrad.float64)
    y = t(x)
    assert t.inv(y) is x  # the cached pair: atanh(1.0) would be inf
    a = D.AffineTransform(1.0, -2.0)
    assert a.sign == -1 and a.inv.sign == -1
    z = tapegrad.tensor([0.5, 2.0], dtype=tapegrad.float64)
    np.testing.assert_allclose(a.inv(a(z)).numpy(), z.numpy(), rtol=1e-15)
    np.testing.assert_allclose(a.inv.log_abs_det_jacobian(a(z), z).numpy(), -math.log(2.0))
    assert D.ExpTransform() == D.ExpTransform() and a != D.ExpTransform()


def test_lazy_parameters_and_repr():
    d = D.Bernoulli(logits=tapegrad.tensor([0.0, 1.0]))
    assert "probs" not in d.__dict__
    np.testing.assert_allclose(d.probs.numpy(), torch.sigmoid(torch.tensor([0.0, 1.0])))
    assert "probs" in d.__dict__
    assert repr(D.Normal(0.0, 1.0)) == "Normal(loc: 0.0, scale: 1.0)" or \
        repr(D.Normal(0.0, 1.0)).startswith("Normal(loc: tensor(0.")
    assert repr(D.Normal(tapegrad.zeros(2), 1.0)) == "Normal(loc: (2,), scale: (2,))"
