"""igamma / igammac (torch.igamma, torch.special.gammainc / gammaincc) and Gamma.cdf against
PyTorch: check_op rows for the values and the x-gradient (a held constant: its derivative is
not implemented, as in PyTorch), a wide grid of (a, x) in float64 and float32, the edge cases,
dtypes, the a-gradient error, in-place variants and forward mode."""
import numpy as np
import pytest
import torch

import tapegrad
from helpers import assert_close, check_op, check_torch

A34 = np.random.default_rng(7).uniform(0.3, 6.0, (3, 4))
A4 = np.array([0.05, 0.7, 2.5, 9.0])
A_MID = np.random.default_rng(8).uniform(25.0, 150.0, (3, 4))  # the asymptotic series
A_LARGE = np.array([250.0, 900.0, 3000.0, 12000.0])  # a > 200: the other asymptotic regime


def with_a(name, a, method=False):
    """``fn(T, x) = name(a, x)`` with ``a`` a constant of x's dtype (only x is differentiable)."""
    def fn(T, x):
        at = T.tensor(a).to(x.dtype)
        if method:
            return getattr(at, name)(x)
        return getattr(T, name)(at, x) if name.startswith("igamma") \
            else getattr(T.special, name)(at, x)
    return fn


def scaled_x(a, low, high):
    """x near a: x = a * u, u uniform in [low, high) (for the asymptotic regimes)."""
    def fn(T, u):
        at = T.tensor(a).to(u.dtype)
        return T.igamma(at, at * u), T.igammac(at, at * u)
    return fn


# forward="differences": PyTorch 2.13 has no forward-mode rule for igamma/igammac (tapegrad's
# is derived from the x-gradient), so the jvp is checked against central differences only
CASES = [
    ("igamma", with_a("igamma", A34), [(3, 4)], {"low": 0.1, "high": 8.0}),
    ("igammac", with_a("igammac", A34), [(3, 4)], {"low": 0.1, "high": 8.0}),
    ("gammainc_broadcast_a", with_a("gammainc", A4), [(3, 4)], {"low": 0.05, "high": 12.0}),
    ("gammaincc_broadcast_x", with_a("gammaincc", A34), [(3, 1)], {"low": 0.05, "high": 6.0}),
    ("method_igamma", with_a("igamma", A34, method=True), [(3, 4)], {"low": 1.2, "high": 9.0}),
    ("method_igammac", with_a("igammac", A4, method=True), [(4,)], {"low": 0.2, "high": 1.1}),
    # float32 below: the gradient exp((a-1) log x - x - lgamma(a)) of large a cancels ~|a log x|
    ("asymptotic_mid_a", scaled_x(A_MID, 0.8, 1.2), [(3, 4)],
     {"low": 0.8, "high": 1.2, "float32": False}),
    ("asymptotic_large_a", scaled_x(A_LARGE, 0.97, 1.03), [(2, 4)],
     {"low": 0.97, "high": 1.03, "float32": False}),
]


@pytest.mark.parametrize("name,fn,specs,options", CASES, ids=[c[0] for c in CASES])
def test_igamma_check_op(name, fn, specs, options):
    check_op(fn, specs, forward="differences", **options)


def test_asymptotic_float32_gradient():
    # float32 rounding of lgamma(a) ~ a log a (PyTorch's own float lgamma differs by an ulp or
    # two) moves the x-gradient by ~|a log a| float32 ulps: 1e-3 here
    u = np.random.default_rng(4).uniform(0.8, 1.2, (3, 4))
    check_torch(scaled_x(A_MID, 0.8, 1.2), [u], rtol=1e-3, dtype=np.float32)
    u = np.random.default_rng(5).uniform(0.97, 1.03, (2, 4))
    check_torch(scaled_x(A_LARGE, 0.97, 1.03), [u], rtol=1e-2, dtype=np.float32)


# --- the grid: a in [1e-3, 1e4], x in [0, 1e4] ----------------------------------------------
def grid(dtype):
    rng = np.random.default_rng(3)
    ga, gx = np.meshgrid(np.geomspace(1e-3, 1e4, 120),
                         np.concatenate([[0.0], np.geomspace(1e-4, 1e4, 119)]))
    a = np.concatenate([ga.ravel(), 10 ** rng.uniform(-3, 4, 20000)])
    x = np.concatenate([gx.ravel(), 10 ** rng.uniform(-3, 4, 19000), np.zeros(1000)])
    near = 10 ** rng.uniform(1, 4, 6000)  # x close to a: the asymptotic and Lanczos branches
    a = np.concatenate([a, near])
    x = np.concatenate([x, near * rng.uniform(0.7, 1.3, near.size)])
    n = -a.size % 16  # a multiple of PyTorch's 16-element vectorised step (no scalar tail)
    return np.pad(a, (0, n), constant_values=1.0).astype(dtype), \
        np.pad(x, (0, n), constant_values=1.0).astype(dtype)


def torch_single_thread(fn, *arrays):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one contiguous run: every element through the vectorised loop
    try:
        return fn(*(torch.from_numpy(a) for a in arrays)).numpy()
    finally:
        torch.set_num_threads(threads)


def relative_error(ours, theirs):
    ours, theirs = ours.astype(np.float64), theirs.astype(np.float64)
    with np.errstate(all="ignore"):
        err = np.abs(ours - theirs) / np.abs(theirs)
    err[(ours == theirs) | (np.isnan(ours) & np.isnan(theirs))] = 0.0
    return err


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("name", ["igamma", "igammac"])
def test_grid_against_torch(name, dtype):
    a, x = grid(dtype)
    ours = getattr(tapegrad, name)(tapegrad.tensor(a), tapegrad.tensor(x)).numpy()
    theirs = torch_single_thread(getattr(torch, name), a, x)
    assert ours.dtype == theirs.dtype
    np.testing.assert_array_equal(np.isnan(ours), np.isnan(theirs))
    err = relative_error(ours, theirs)
    # PyTorch's other kernels (AVX2, or none) round the exponent a*log(x) - x - lgamma(a)
    # another way: an ulp of each term becomes relative error through exp, so the bound scales
    # with their sizes (at a=1501, x=823 the terms are ~1e4: 1.8e-12 in float64, 1.2e-4 in
    # float32). Measured: at most 1.8 ulps of the terms with AVX2 kernels, 13.8 without
    # (igammac); 16 ulps, and never below the bar for small terms (float32: a few ulps)
    a64, x64 = a.astype(np.float64), x.astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.where(x64 > 0, np.abs(a64 * np.log(x64)), 0.0) + x64 + np.abs(
            torch.special.gammaln(torch.from_numpy(a64)).numpy()) + 1
    bound = np.maximum(1e-12 if dtype == np.float64 else 4e-6, 16 * np.finfo(dtype).eps * terms)
    normal = np.abs(theirs) > (1e-100 if dtype == np.float64 else 1e-20)
    worst = np.argmax((err / bound)[normal])
    assert np.all(err[normal] <= bound[normal]), \
        f"{name}: worst at a={a[normal][worst]}, x={x[normal][worst]}: relative error " \
        f"{err[normal][worst]:.3g}, bound {bound[normal][worst]:.3g}"
    if torch.backends.cpu.get_cpu_capability() == "AVX512":
        # the AVX-512 kernel's fused multiply-adds are reproduced: bit for bit
        assert err.max() == 0.0, f"{name}: {np.count_nonzero(err)} elements differ, worst " \
            f"{err.max():.3g} at a={a[np.argmax(err)]}, x={x[np.argmax(err)]}"


@pytest.mark.parametrize("name", ["igamma", "igammac"])
def test_grid_without_the_c_math_library(name, monkeypatch):
    # where ctypes cannot load the C library, numpy's exp/log/... and math.lgamma serve: an ulp
    # of lgamma(a) apart from the C library's moves exp(a log x - x - lgamma(a)) by |a log a|
    # ulps (docs/differences.md)
    from tapegrad.ops import special_functions
    monkeypatch.setattr(special_functions, "_LIBM", [{}])
    for dtype, tiny, rtol in ((np.float64, 1e-100, 5e-12), (np.float32, 1e-20, 3e-4)):
        a, x = grid(dtype)
        ours = getattr(tapegrad, name)(tapegrad.tensor(a), tapegrad.tensor(x)).numpy()
        theirs = torch_single_thread(getattr(torch, name), a, x)
        np.testing.assert_array_equal(np.isnan(ours), np.isnan(theirs))
        normal = np.abs(theirs) > tiny
        assert relative_error(ours[normal], theirs[normal]).max() < rtol


@pytest.mark.parametrize("name", ["gammainc", "gammaincc"])
def test_grid_against_scipy(name):
    special = pytest.importorskip("scipy.special")
    a, x = grid(np.float64)
    ours = getattr(tapegrad.special, name)(tapegrad.tensor(a), tapegrad.tensor(x)).numpy()
    expected = getattr(special, name)(a, x)
    keep = np.abs(expected) > 1e-100  # scipy's own rounding grows with -log(result)
    # PyTorch's asymptotic series (20 < a, x near a) divides by sqrt(2 pi a) with pi rounded to
    # float (c10::pi<float>), 1.4e-8 of that term: up to 2e-9 off scipy, and tapegrad with it
    assert relative_error(ours[keep], expected[keep]).max() < 5e-9


# --- edge cases, dtypes -----------------------------------------------------------------------
NAN, INF = float("nan"), float("inf")
EDGE_A = [0.0, 0.0, 0.0, 0.0, -1.0, 1.0, -0.5, INF, INF, INF, NAN, NAN, NAN, NAN, 2.0, 2.0,
          1e-300, 1e300, 1e-3, 5e5, 5e5, 1e5, 0.5, 3.0]
EDGE_X = [0.0, 1.0, INF, NAN, 1.0, -1.0, -0.5, INF, 1.0, 0.0, 0.0, INF, 1.0, NAN, INF, NAN,
          1.0, 1.0, 1e-300, 5e5, 5.001e5, 1e300, 1e-320, 1.1]


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("name", ["igamma", "igammac"])
def test_edge_cases(name, dtype):
    a, x = np.array(EDGE_A, dtype), np.array(EDGE_X, dtype)
    ours = getattr(tapegrad, name)(tapegrad.tensor(a), tapegrad.tensor(x)).numpy()
    theirs = getattr(torch, name)(torch.from_numpy(a), torch.from_numpy(x)).numpy()
    np.testing.assert_array_equal(np.isnan(ours), np.isnan(theirs))
    np.testing.assert_allclose(ours, theirs, rtol=1e-12 if dtype == np.float64 else 1e-6,
                               atol=0)


def test_empty_and_zero_dim():
    for shape_a, shape_x in [((0,), (0,)), ((), ()), ((), (3,)), ((2, 0), (1, 0))]:
        a = np.full(shape_a, 1.5)
        x = np.full(shape_x, 0.7)
        check_torch(lambda T, p, q: (T.igamma(p, q), T.igammac(p, q)), [a, x], grad=False)


@pytest.mark.parametrize("dta,dtx", [("int32", "float32"), ("int64", "float64"),
                                     ("float32", "float64"), ("float64", "int64"),
                                     ("bool", "float32"), ("float16", "float16"),
                                     ("bfloat16", "bfloat16"), ("float16", "float32"),
                                     ("bfloat16", "float64")])
def test_dtype_promotion(dta, dtx):
    a, x = [1.0, 2.0, 0.0, 7.0], [0.5, 3.0, 1.0, 6.5]
    ta = tapegrad.tensor(a).to(getattr(tapegrad, dta))
    tx = tapegrad.tensor(x).to(getattr(tapegrad, dtx))
    qa = torch.tensor(a).to(getattr(torch, dta))
    qx = torch.tensor(x).to(getattr(torch, dtx))
    for name in ("igamma", "igammac"):
        ours, theirs = getattr(tapegrad, name)(ta, tx), getattr(torch, name)(qa, qx)
        assert str(ours.dtype).split(".")[-1] == str(theirs.dtype).split(".")[-1]
        np.testing.assert_array_equal(ours.float().numpy(), theirs.float().numpy())


def test_zero_dim_tensor_takes_part_in_promotion_as_torch():
    a = tapegrad.tensor([1.0, 2.0])  # float32
    x = tapegrad.tensor(2.0, dtype=tapegrad.float64)  # 0-dim: does not raise the dtype
    theirs = torch.special.gammainc(torch.tensor([1.0, 2.0]), torch.tensor(2.0).double())
    assert str(tapegrad.special.gammainc(a, x).dtype) == str(theirs.dtype).replace("torch",
                                                                                 "tapegrad")


@pytest.mark.parametrize("name", ["igamma", "igammac"])
def test_errors(name):
    fn = getattr(tapegrad, name)
    with pytest.raises(RuntimeError, match=f"{name}.*not implemented for integer inputs"):
        fn(tapegrad.tensor([1, 2]), tapegrad.tensor([3, 4]))
    with pytest.raises(RuntimeError, match=name):
        fn(tapegrad.tensor([True]), tapegrad.tensor([False]))
    with pytest.raises(TypeError, match=f"{name}\\(\\): argument 'other' .* must be Tensor"):
        fn(tapegrad.tensor([1.0]), 2.0)
    with pytest.raises(TypeError, match="argument 'input'"):
        fn(1.0, tapegrad.tensor([2.0]))
    with pytest.raises(RuntimeError, match=f"{name}: shapes \\(2,\\) and \\(3,\\)"):
        fn(tapegrad.tensor([1.0, 2.0]), tapegrad.tensor([1.0, 2.0, 3.0]))


# --- gradients --------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["igamma", "igammac"])
def test_a_gradient_not_implemented(name):
    a = tapegrad.tensor([1.5, 2.0], dtype=tapegrad.float64, requires_grad=True)
    x = tapegrad.tensor([0.5, 3.0], dtype=tapegrad.float64, requires_grad=True)
    out = getattr(tapegrad, name)(a, x)
    ta = torch.tensor([1.5, 2.0], dtype=torch.float64, requires_grad=True)
    tout = getattr(torch, name)(ta, torch.tensor([0.5, 3.0], dtype=torch.float64))
    with pytest.raises(NotImplementedError) as theirs:
        tout.sum().backward()
    with pytest.raises(NotImplementedError) as ours:
        out.sum().backward(retain_graph=True)
    assert str(ours.value) == str(theirs.value) == \
        f"the derivative for '{name}: input' is not implemented."
    with pytest.raises(NotImplementedError, match=f"'{name}: input'"):
        tapegrad.func.jvp(lambda p: getattr(tapegrad, name)(p, x.detach()), (a.detach(),),
                          (tapegrad.ones_like(a),))


def test_gradient_formula_and_second_order_against_torch():
    a = np.array([0.3, 1.0, 4.0, 60.0, 500.0])
    x = np.array([0.2, 2.5, 3.0, 55.0, 510.0])

    def fn(T, x):
        at = T.tensor(a)
        y = T.igamma(at, x) * 2 - T.igammac(at, x)
        (g,) = T.autograd.grad(y.sum(), [x], create_graph=True)
        return g

    check_torch(fn, [x])


def test_forward_mode_is_the_x_derivative():
    a = tapegrad.tensor([0.5, 2.0, 30.0], dtype=tapegrad.float64)
    x = tapegrad.tensor([0.7, 1.0, 28.0], dtype=tapegrad.float64)
    t = tapegrad.tensor([1.0, -2.0, 0.5], dtype=tapegrad.float64)
    _, tangent = tapegrad.func.jvp(lambda q: tapegrad.igamma(a, q), (x,), (t,))
    (grad,) = tapegrad.autograd.grad(tapegrad.igamma(a, x.requires_grad_()), [x], t)
    assert_close(tangent, grad)
    _, tangent_c = tapegrad.func.jvp(lambda q: tapegrad.igammac(a, q), (x.detach(),), (t,))
    assert_close(tangent_c, -grad)
    assert not {"igamma", "igammac"} & set(tapegrad.func.jvp_fallback_ops())


# --- in place ---------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["igamma", "igammac"])
def test_inplace(name):
    a, x = np.array([0.5, 2.0, 7.0]), np.array([1.0, 0.3, 9.0])
    ours, theirs = tapegrad.tensor(a), torch.tensor(a)
    result = getattr(ours, name + "_")(tapegrad.tensor(x))
    getattr(theirs, name + "_")(torch.tensor(x))
    assert result is ours and ours._version[0] == 1
    assert_close(ours, theirs)
    # a float32 tensor keeps its dtype when x is float64 (as torch's in-place ops)
    f32 = tapegrad.tensor(a.astype(np.float32))
    getattr(f32, name + "_")(tapegrad.tensor(x))
    t32 = torch.tensor(a.astype(np.float32))
    getattr(t32, name + "_")(torch.tensor(x))
    assert f32.dtype == tapegrad.float32
    np.testing.assert_array_equal(f32.numpy(), t32.numpy())
    with pytest.raises(RuntimeError, match="can't be cast"):
        getattr(tapegrad.tensor([1, 2, 3]), name + "_")(tapegrad.tensor(x))


@pytest.mark.parametrize("name", ["igamma", "igammac"])
def test_inplace_autograd(name):
    # x <- igamma(x, y) in place on a non-leaf: y's gradient flows through the new history
    y = tapegrad.tensor([0.4, 2.0, 5.0], dtype=tapegrad.float64, requires_grad=True)
    ty = torch.tensor([0.4, 2.0, 5.0], dtype=torch.float64, requires_grad=True)
    base = tapegrad.tensor([1.5, 0.7, 3.0], dtype=tapegrad.float64)
    tbase = torch.tensor([1.5, 0.7, 3.0], dtype=torch.float64)
    z = y * 1.0
    getattr(z, name + "_")(y * 2)  # a := z, not requiring grad through a: only x's rule runs
    tz = ty * 1.0
    with pytest.raises(NotImplementedError):  # z carries y's history: the a-gradient is asked
        getattr(tz, name + "_")(ty * 2).sum().backward()
    with pytest.raises(NotImplementedError):
        z.sum().backward()
    w = base.clone()
    getattr(w, name + "_")(y * 2)
    tw = tbase.clone()
    getattr(tw, name + "_")(ty * 2)
    w.sum().backward()
    tw.sum().backward()
    assert_close(w, tw)
    assert_close(y.grad, ty.grad)
    # a leaf that requires grad cannot be written in place
    with pytest.raises(RuntimeError, match="leaf Variable that requires grad"):
        getattr(y, name + "_")(tapegrad.tensor([1.0, 1.0, 1.0], dtype=tapegrad.float64))


def test_inplace_change_of_a_saved_input_is_caught():
    a = tapegrad.tensor([1.5, 2.0], dtype=tapegrad.float64)
    x = tapegrad.tensor([0.5, 3.0], dtype=tapegrad.float64, requires_grad=True)
    out = tapegrad.igamma(a, x)  # x's gradient reads a
    a.add_(1.0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        out.sum().backward()


# --- distributions: Gamma.cdf, Chi2.cdf ------------------------------------------------------
def test_gamma_cdf_against_torch():
    c = np.array([0.3, 1.0, 2.5, 40.0, 300.0])
    r = np.array([2.0, 0.5, 1.0, 3.0, 0.25])
    v = np.array([0.05, 2.0, 2.5, 12.0, 1250.0])

    def fn(T, rate, value):
        return T.distributions.Gamma(T.tensor(c), rate).cdf(value)

    check_torch(fn, [r, v])
    # float32: the rate-gradient at concentration 300 cancels ~|c log c| float32 ulps
    check_torch(fn, [r, v], rtol=2e-4, dtype=np.float32)
    # broadcasting a batch of values against the parameters
    check_torch(fn, [r, np.abs(np.random.default_rng(0).standard_normal((3, 5))) * 4])


def test_chi2_cdf_against_torch():
    df = np.array([1.0, 3.0, 10.0, 80.0])
    v = np.array([0.5, 2.0, 12.0, 75.0])
    check_torch(lambda T, value: T.distributions.Chi2(T.tensor(df)).cdf(value), [v])
    check_torch(lambda T, value: T.distributions.Chi2(4.0).cdf(value), [v])


def test_gamma_cdf_concentration_gradient_and_validation():
    c = tapegrad.tensor([2.0], dtype=tapegrad.float64, requires_grad=True)
    d = tapegrad.distributions.Gamma(c, tapegrad.tensor([1.0], dtype=tapegrad.float64))
    with pytest.raises(NotImplementedError, match="'igamma: input'"):
        d.cdf(tapegrad.tensor([1.0], dtype=tapegrad.float64)).sum().backward()
    checked = tapegrad.distributions.Gamma(tapegrad.tensor([1.0]), tapegrad.tensor([1.0]),
                                           validate_args=True)
    with pytest.raises(ValueError, match="within the support"):
        checked.cdf(tapegrad.tensor([-1.0]))
    with pytest.raises(ValueError, match="must be a Tensor"):
        checked.cdf(2.0)
    unchecked = tapegrad.distributions.Gamma(tapegrad.tensor([1.0]), tapegrad.tensor([1.0]),
                                             validate_args=False)
    theirs = torch.distributions.Gamma(torch.tensor([1.0]), torch.tensor([1.0]),
                                       validate_args=False).cdf(torch.tensor([-1.0]))
    ours = unchecked.cdf(tapegrad.tensor([-1.0]))
    assert np.isnan(ours.numpy()).all() and np.isnan(theirs.numpy()).all()
