"""tapegrad.special against torch.special: values and gradients (float64 at 1e-12, float32),
gradcheck and gradgradcheck, one table row per function; then the non-differentiable ones,
the top-level aliases and the errors."""
import math

import numpy as np
import pytest
import torch

import tapegrad
from tapegrad.ops import special_functions
from helpers import check_op, check_torch, make_inputs

S = "special"


def sp(name):
    return lambda T, *xs, **kw: getattr(T.special, name)(*xs, **kw)


# (name, fn, specs, options for check_op)
CASES = [
    ("erf", sp("erf"), [(3, 4)], {}),
    ("erfc", sp("erfc"), [(3, 4)], {}),
    ("erfinv", sp("erfinv"), [(3, 4)], {"low": -0.9, "high": 0.9}),
    ("expit", sp("expit"), [(3, 4)], {}),
    ("logit", sp("logit"), [(3, 4)], {"low": 0.05, "high": 0.95}),
    ("logit_eps", lambda T, x: T.special.logit(x, eps=0.2), [(3, 4)],
     {"low": 0.05, "high": 0.95, "away_from": [0.2, 0.8], "second_order": False}),
    ("xlogy", sp("xlogy"), [(3, 4), (4,)], {"low": 0.2, "high": 2.0}),
    ("xlog1py", sp("xlog1py"), [(3, 4), (3, 1)], {"low": -0.5, "high": 2.0}),
    ("gammaln", sp("gammaln"), [(3, 4)], {"low": 0.1, "high": 6.0}),
    ("digamma", sp("digamma"), [(3, 4)], {"low": 0.1, "high": 6.0}),
    ("psi", sp("psi"), [(5,)], {"low": 0.5, "high": 12.0}),
    ("polygamma_1", lambda T, x: T.special.polygamma(1, x), [(3, 4)], {"low": 0.3, "high": 5.0}),
    ("polygamma_3", lambda T, x: T.special.polygamma(3, x), [(3, 4)], {"low": 0.3, "high": 5.0}),
    ("multigammaln", lambda T, x: T.special.multigammaln(x, 3), [(3, 4)],
     {"low": 1.2, "high": 5.0}),
    ("i0", sp("i0"), [(3, 4)], {"low": -4.0, "high": 4.0}),
    ("i0e", sp("i0e"), [(3, 4)], {"low": -4.0, "high": 4.0, "away_from": 0.0}),
    ("i1", sp("i1"), [(3, 4)], {"low": -4.0, "high": 4.0}),
    ("i1e", sp("i1e"), [(3, 4)], {"low": -4.0, "high": 4.0, "away_from": 0.0}),
    ("ndtr", sp("ndtr"), [(3, 4)], {}),
    ("ndtri", sp("ndtri"), [(3, 4)], {"low": 0.05, "high": 0.95}),
    ("log_ndtr", sp("log_ndtr"), [(3, 4)], {"low": -6.0, "high": 3.0}),
    ("sinc", sp("sinc"), [(3, 4)], {"away_from": 0.0}),
    ("entr", sp("entr"), [(3, 4)], {"low": 0.1, "high": 3.0}),
    ("logsumexp", lambda T, x: T.special.logsumexp(x, 1), [(3, 4)], {}),
    ("logsumexp_dims_keepdim", lambda T, x: T.special.logsumexp(x, (0, 2), keepdim=True),
     [(2, 3, 4)], {}),
    ("softmax", lambda T, x: T.special.softmax(x, -1), [(3, 4)], {}),
    ("log_softmax", lambda T, x: T.special.log_softmax(x, 0), [(3, 4)], {}),
    ("round", sp("round"), [(3, 4)], {}),
    ("round_decimals", lambda T, x: T.special.round(x, decimals=2), [(3, 4)], {}),
    # forward=False: detach keeps the tangent in tapegrad's forward mode (docs/differences.md),
    # so x's (zero) tangent reaches zeta's first argument, whose derivative is not implemented
    ("zeta_q", lambda T, x, q: T.special.zeta(x.detach() * 0 + 3.0, q), [(3, 4), (3, 4)],
     {"low": 0.5, "high": 3.0, "forward": False}),
    ("zeta_number_x", lambda T, q: T.special.zeta(2.5, q), [(5,)], {"low": 0.5, "high": 3.0}),
    ("expm1", sp("expm1"), [(3, 4)], {}),
    ("exp2", sp("exp2"), [(3, 4)], {}),
    ("log1p", sp("log1p"), [(3, 4)], {"low": -0.5, "high": 2.0}),
    # top-level names and methods PyTorch has
    ("torch_lgamma", lambda T, x: T.lgamma(x), [(4,)], {"low": 0.5, "high": 4.0}),
    ("torch_mvlgamma", lambda T, x: T.mvlgamma(x, 2), [(4,)], {"low": 1.0, "high": 4.0}),
    ("method_digamma_erfinv", lambda T, x: (x.digamma(), x.erfinv(), x.polygamma(2)), [(4,)],
     {"low": 0.2, "high": 0.9}),
    ("method_i0_sinc_logit_erfc", lambda T, x: (x.i0(), x.sinc(), x.logit(), x.erfc()),
     [(4,)], {"low": 0.2, "high": 0.9}),
]

FLOAT32_LOOSE = {"polygamma_3", "zeta_q", "zeta_number_x", "log_ndtr", "multigammaln",
                 "method_digamma_erfinv"}


@pytest.mark.parametrize("name,fn,specs,options", CASES, ids=[c[0] for c in CASES])
def test_special(name, fn, specs, options):
    options = dict(options)
    if name in FLOAT32_LOOSE:  # float32: PyTorch's kernels round differently in float
        options["float32"] = False
    check_op(fn, specs, **options)


def test_zeta_float32_and_x_grad_not_implemented():
    x, q = make_inputs([(3,), (3,)], low=1.5, high=3.0)
    check_torch(lambda T, a, b: T.special.zeta(a, b), [x, q], rtol=1e-5, dtype=np.float32,
                grad=False)
    a = tapegrad.tensor(x, requires_grad=True)
    with pytest.raises(NotImplementedError, match="derivative for 'zeta' is not implemented"):
        tapegrad.special.zeta(a, tapegrad.tensor(q)).sum().backward()


@pytest.mark.parametrize("name", ["bessel_j0", "bessel_j1"])
def test_bessel_values_no_gradient(name):
    # small arguments away from the roots (where relative agreement is meaningful)
    x = np.array([0.3, 1.1, 1.9, 3.2])
    check_torch(lambda T, a: getattr(T.special, name)(a), [x], rtol=1e-10, grad=False)
    t = tapegrad.tensor(x, requires_grad=True)
    assert not getattr(tapegrad.special, name)(t).requires_grad  # as PyTorch


@pytest.mark.parametrize("name,order", [("bessel_j0", 0), ("bessel_j1", 1)])
def test_bessel_beyond_5_is_exact_where_torch_is_not(name, order):
    # PyTorch's kernel loses up to ~2e-7 (absolute) from x ~ 4 on (docs/differences.md);
    # tapegrad's (scipy's Cephes) agrees with mpmath's arbitrary precision to 1e-14
    mpmath = pytest.importorskip("mpmath")
    x = np.array([4.1, 4.9, 5.5, 6.1, 9.5, 14.0, 30.0, -7.3])
    got = getattr(tapegrad.special, name)(tapegrad.tensor(x)).numpy()
    exact = np.array([float(mpmath.besselj(order, v)) for v in x])
    np.testing.assert_allclose(got, exact, rtol=1e-14, atol=1e-16)
    theirs = getattr(torch.special, name)(torch.tensor(x)).numpy()
    np.testing.assert_allclose(got, theirs, rtol=0, atol=1e-6)


def test_edges_as_torch():
    x = np.array([-1.0, 0.0, 0.5, 1.0, 2.0, math.inf, -math.inf, math.nan])
    for name in ("entr", "logit", "erfinv", "ndtri", "sinc", "i0", "i0e", "i1", "i1e", "ndtr",
                 "log_ndtr", "erfc", "gammaln", "digamma"):
        got = sp(name)(tapegrad, tapegrad.tensor(x)).numpy()
        want = sp(name)(torch, torch.tensor(x)).numpy()
        np.testing.assert_allclose(got, want, rtol=1e-14, atol=0, err_msg=name)
    a, b = np.array([0.0, 0.0, 1.0, 2.0]), np.array([-1.0, math.nan, 0.0, -2.0])
    np.testing.assert_allclose(tapegrad.special.xlog1py(tapegrad.tensor(a),
                                                        tapegrad.tensor(b)).numpy(),
                               torch.special.xlog1py(torch.tensor(a), torch.tensor(b)).numpy(),
                               rtol=1e-14)


def test_gradients_at_zero():
    x = np.array([0.0, 1.0])
    for name in ("sinc", "i1", "i1e", "i0e"):
        check_torch(sp(name), [x])


def test_integer_inputs_become_float():
    for name in ("erfc", "i0", "sinc", "ndtr", "expit", "gammaln"):
        check_torch(lambda T, x: getattr(T.special, name)(x), [np.array([1, 2, 3])],
                    rtol=1e-6, grad=False)  # float32 results


def test_multigammaln_outside_domain_and_p():
    x = np.array([0.5, -0.7, 2.0])
    check_torch(lambda T, a: T.special.multigammaln(a, 3), [x], grad=False)
    for lib in (tapegrad, torch):
        with pytest.raises(RuntimeError, match="p has to be greater than or equal to 1"):
            lib.special.multigammaln(lib.tensor([1.0]), 0)


def test_without_scipy_the_scipy_functions_say_so(monkeypatch):
    monkeypatch.setattr(special_functions, "_scipy", None)
    x = tapegrad.tensor([0.3, 0.6], dtype=tapegrad.float64)
    for name in ("i0e", "i1", "i1e", "ndtri", "log_ndtr", "bessel_j0", "bessel_j1"):
        with pytest.raises(RuntimeError, match="scipy"):
            getattr(tapegrad.special, name)(x)
    # the numpy paths still agree with PyTorch
    t = torch.tensor([0.3, 0.6], dtype=torch.float64)
    for name in ("erfc", "ndtr", "i0", "sinc", "entr", "gammaln", "digamma", "erfinv"):
        np.testing.assert_allclose(getattr(tapegrad.special, name)(x).numpy(),
                                   getattr(torch.special, name)(t).numpy(), rtol=1e-13)
