"""tapegrad.linalg and the top-level matrix functions against PyTorch: values and gradients
(float64 at 1e-12, float32), gradcheck and gradgradcheck, one table row per case; then the
errors. Losses over singular and eigenvectors are sign-invariant (squares), since their signs
are LAPACK's choice."""
import math
import warnings

import numpy as np
import pytest
import torch

import tapegrad
from helpers import check_op, check_torch, make_inputs


def eye(T, n, x):
    return T.eye(n, dtype=x.dtype)


def spd(T, x):
    """A well-conditioned symmetric positive-definite matrix from ``x`` (batched)."""
    return x @ x.mT + eye(T, x.shape[-1], x)


def wellcond(T, x):
    return x + 3 * eye(T, x.shape[-1], x)


def sym(T, x):
    return x + x.mT


def _singular_batch():
    a = make_inputs([(2, 3, 3)], seed=5)[0]
    a[:, 2] = a[:, 0] - 2 * a[:, 1]  # rank 2: the gradient (the cofactors) is not zero
    return a


CASES = [
    # norms
    ("vector_norm", lambda T, x: T.linalg.vector_norm(x), [(3, 4)]),
    ("vector_norm_ord3_dim", lambda T, x: T.linalg.vector_norm(x, 3, dim=1, keepdim=True),
     [(3, 4)]),
    ("vector_norm_inf", lambda T, x: T.linalg.vector_norm(x, math.inf, dim=(0, 2)), [(2, 3, 4)]),
    ("matrix_norm_fro", lambda T, x: T.linalg.matrix_norm(x), [(2, 3, 4)]),
    ("matrix_norm_nuc", lambda T, x: T.linalg.matrix_norm(x, "nuc"), [(2, 3, 4)]),
    ("matrix_norm_2", lambda T, x: T.linalg.matrix_norm(x, 2), [(2, 4, 3)]),
    ("matrix_norm_-2", lambda T, x: T.linalg.matrix_norm(x, -2), [(2, 4, 3)]),
    ("matrix_norm_1", lambda T, x: T.linalg.matrix_norm(x, 1), [(2, 3, 4)]),
    ("matrix_norm_-1", lambda T, x: T.linalg.matrix_norm(x, -1), [(2, 3, 4)]),
    ("matrix_norm_inf", lambda T, x: T.linalg.matrix_norm(x, math.inf), [(2, 3, 4)]),
    ("matrix_norm_-inf", lambda T, x: T.linalg.matrix_norm(x, -math.inf), [(2, 3, 4)]),
    ("matrix_norm_dims_keepdim", lambda T, x: T.linalg.matrix_norm(x, 1, dim=(2, 0),
                                                                   keepdim=True), [(3, 2, 4)]),
    ("matrix_norm_nuc_dims_keepdim", lambda T, x: T.linalg.matrix_norm(x, "nuc", dim=(0, 2),
                                                                       keepdim=True),
     [(3, 2, 4)]),
    ("norm_default", lambda T, x: T.linalg.norm(x), [(2, 3, 4)]),
    ("norm_2d_ord", lambda T, x: T.linalg.norm(x, -1), [(3, 4)]),
    ("norm_1d_ord", lambda T, x: T.linalg.norm(x, 3), [(5,)]),
    ("norm_dim_int", lambda T, x: T.linalg.norm(x, 1, dim=-1), [(3, 4)]),
    ("norm_dim_pair", lambda T, x: T.linalg.norm(x, "nuc", dim=(-2, -1)), [(2, 3, 4)]),
    ("torch_norm_nuc", lambda T, x: T.norm(x, "nuc"), [(3, 4)]),
    ("torch_norm_fro_dims", lambda T, x: T.norm(x, "fro", dim=(0, 1)), [(2, 3, 4)]),
    # solves and inverses
    ("solve", lambda T, a, b: T.linalg.solve(wellcond(T, a), b), [(2, 4, 4), (2, 4, 3)]),
    ("solve_vector", lambda T, a, b: T.linalg.solve(wellcond(T, a), b), [(2, 4, 4), (2, 4)]),
    ("solve_broadcast", lambda T, a, b: T.linalg.solve(wellcond(T, a), b), [(2, 1, 3, 3),
                                                                            (4, 3, 2)]),
    ("solve_right", lambda T, a, b: T.linalg.solve(wellcond(T, a), b, left=False),
     [(4, 4), (2, 4)]),
    ("solve_triangular_upper", lambda T, a, b: T.linalg.solve_triangular(
        wellcond(T, a), b, upper=True), [(2, 4, 4), (2, 4, 3)]),
    ("solve_triangular_lower_right_unit", lambda T, a, b: T.linalg.solve_triangular(
        a, b, upper=False, left=False, unitriangular=True), [(3, 3), (2, 3)]),
    ("inv", lambda T, a: T.linalg.inv(wellcond(T, a)), [(2, 4, 4)]),
    ("inverse", lambda T, a: T.inverse(wellcond(T, a)), [(3, 3)]),
    ("det", lambda T, a: T.linalg.det(a), [(2, 4, 4)]),
    ("det_toplevel", lambda T, a: T.det(a), [(3, 3)]),
    # + 1: the determinant itself is 0 up to LAPACK's rounding; the gradient is the point
    ("det_singular", lambda T, a: T.linalg.det(a) + 1, [_singular_batch()]),
    ("slogdet", lambda T, a: T.linalg.slogdet(a), [(2, 4, 4)]),
    ("slogdet_toplevel", lambda T, a: T.slogdet(a), [(3, 3)]),
    ("logdet", lambda T, a: T.logdet(spd(T, a)), [(2, 3, 3)]),
    ("cholesky", lambda T, a: T.linalg.cholesky(spd(T, a)), [(2, 4, 4)]),
    ("cholesky_upper", lambda T, a: T.linalg.cholesky(spd(T, a), upper=True), [(3, 3)]),
    ("pinv_tall", lambda T, a: T.linalg.pinv(a), [(2, 5, 3)]),
    ("pinv_wide", lambda T, a: T.linalg.pinv(a), [(3, 5)]),
    ("pinv_hermitian", lambda T, a: T.linalg.pinv(spd(T, a), hermitian=True), [(3, 3)]),
    ("pinverse", lambda T, a: T.pinverse(a), [(4, 3)]),
    ("lstsq", lambda T, a, b: T.linalg.lstsq(a, b).solution, [(2, 5, 3), (2, 5, 2)]),
    ("lstsq_vector", lambda T, a, b: T.linalg.lstsq(a, b).solution, [(5, 3), (5,)]),
    ("lstsq_gelsd", lambda T, a, b: T.linalg.lstsq(a, b, driver="gelsd")[:2], [(5, 3), (5, 2)]),
    # decompositions (sign-invariant losses)
    ("qr_reduced_tall", lambda T, a: T.linalg.qr(a), [(2, 5, 3)]),
    ("qr_reduced_wide", lambda T, a: T.linalg.qr(a), [(3, 5)]),
    ("qr_complete_square", lambda T, a: T.linalg.qr(a, mode="complete"), [(4, 4)]),
    ("qr_complete_wide", lambda T, a: T.linalg.qr(a, mode="complete"), [(3, 4)]),
    ("svd_reduced_tall", lambda T, a: _svd_loss(T.linalg.svd(a, full_matrices=False)),
     [(2, 5, 3)]),
    ("svd_reduced_wide", lambda T, a: _svd_loss(T.linalg.svd(a, full_matrices=False)),
     [(3, 5)]),
    ("svd_full_tall", lambda T, a: _svd_loss(T.linalg.svd(a), k=3), [(5, 3)]),
    ("svd_square", lambda T, a: _svd_loss(T.linalg.svd(a)), [(2, 4, 4)]),
    ("svd_toplevel", lambda T, a: _svd_v_loss(T.svd(a)), [(5, 3)]),
    ("svdvals", lambda T, a: T.linalg.svdvals(a), [(2, 4, 3)]),
    ("eigh", lambda T, a: _eigh_loss(T.linalg.eigh(sym(T, a))), [(2, 4, 4)]),
    ("eigh_upper", lambda T, a: _eigh_loss(T.linalg.eigh(sym(T, a), UPLO="U")), [(3, 3)]),
    ("eigvalsh", lambda T, a: T.linalg.eigvalsh(sym(T, a)), [(2, 4, 4)]),
    # products
    ("cross", lambda T, a, b: T.linalg.cross(a, b), [(4, 3), (4, 3)]),
    ("cross_dim_broadcast", lambda T, a, b: T.linalg.cross(a, b, dim=0), [(3, 1, 2), (3, 4, 1)]),
    ("cross_toplevel", lambda T, a, b: T.cross(a, b, dim=1), [(2, 3), (2, 3)]),
    ("matrix_power_0", lambda T, a: T.linalg.matrix_power(a, 0), [(2, 3, 3)]),
    ("matrix_power_1", lambda T, a: T.linalg.matrix_power(a, 1), [(3, 3)]),
    ("matrix_power_5", lambda T, a: T.linalg.matrix_power(a, 5), [(2, 3, 3)]),
    ("matrix_power_-3", lambda T, a: T.linalg.matrix_power(wellcond(T, a), -3), [(3, 3)]),
    ("multi_dot_2", lambda T, a, b: T.linalg.multi_dot([a, b]), [(3, 4), (4, 2)]),
    ("multi_dot_3_vectors", lambda T, a, b, c: T.linalg.multi_dot([a, b, c]),
     [(4,), (4, 5), (5,)]),
    ("multi_dot_5", lambda T, a, b, c, d, e: T.linalg.multi_dot([a, b, c, d, e]),
     [(2, 6), (6, 1), (1, 5), (5, 3), (3, 4)]),
    ("vecdot", lambda T, a, b: T.linalg.vecdot(a, b), [(2, 3, 4), (3, 4)]),
    ("vecdot_dim", lambda T, a, b: T.linalg.vecdot(a, b, dim=0), [(3, 4), (3, 1)]),
    ("diagonal", lambda T, a: T.linalg.diagonal(a), [(2, 3, 4)]),
    ("diagonal_offset", lambda T, a: T.linalg.diagonal(a, offset=-1, dim1=0, dim2=2),
     [(4, 2, 3)]),
    ("linalg_matmul", lambda T, a, b: T.linalg.matmul(a, b), [(2, 3, 4), (4, 2)]),
    ("trace", lambda T, a: T.trace(a), [(3, 4)]),
    ("trace_method", lambda T, a: a.trace(), [(4, 4)]),
    ("kron", lambda T, a, b: T.kron(a, b), [(2, 3), (4, 2)]),
    ("kron_ndims", lambda T, a, b: T.kron(a, b), [(2, 1, 3), (2, 2)]),
    ("outer", lambda T, a, b: T.outer(a, b), [(3,), (4,)]),
    ("cdist_p2", lambda T, a, b: T.cdist(a, b), [(2, 4, 3), (2, 5, 3)]),
    ("cdist_p1", lambda T, a, b: T.cdist(a, b, p=1), [(4, 3), (5, 3)]),
    ("cdist_p3", lambda T, a, b: T.cdist(a, b, p=3), [(4, 3), (5, 3)]),
    ("cdist_inf", lambda T, a, b: T.cdist(a, b, p=math.inf), [(4, 3), (5, 3)]),
    ("cdist_mm", lambda T, a, b: T.cdist(a, b), [(30, 3), (4, 3)]),
    ("cdist_broadcast", lambda T, a, b: T.cdist(a, b), [(2, 1, 4, 3), (3, 5, 3)]),
]

# float32 LAPACK rounding in these is amplified past 2e-5 by the conditioning of the test
# matrices (PyTorch and numpy call different LAPACK builds)
NO_FLOAT32 = {"matrix_power_5", "matrix_power_-3", "det_singular", "svd_full_tall",
              "svd_reduced_tall", "svd_reduced_wide", "svd_square", "svd_toplevel", "eigh",
              "eigh_upper", "pinv_tall", "pinv_wide", "pinv_hermitian", "pinverse",
              "lstsq", "lstsq_vector", "lstsq_gelsd", "qr_reduced_tall", "qr_reduced_wide",
              "qr_complete_square", "qr_complete_wide", "solve_triangular_lower_right_unit",
              "cdist_mm", "matrix_norm_-2", "logdet", "cholesky", "cholesky_upper"}
# second order through PyTorch's own formulas is exact only where the first order is smooth
# det_singular: gradgradcheck's finite differences leave the singular point, where the
# solve-based first derivative loses ~1e-10 to conditioning; test_det_singular_second_order
# compares the second derivative at the singular point with PyTorch instead
NO_SECOND = {"det_singular", "cdist_inf", "matrix_norm_1", "matrix_norm_-1", "matrix_norm_inf",
             "matrix_norm_-inf", "norm_2d_ord", "norm_dim_int", "vector_norm_inf",
             "cdist_p1", "matrix_norm_dims_keepdim"}


def _svd_loss(usv, k=None):
    U, S, Vh = usv
    if k is not None:  # the extra columns of a full U are any basis of the complement
        U, Vh = U[..., :, :k], Vh[..., :k, :]
    return S, U * U, Vh * Vh


def _svd_v_loss(usv):
    U, S, V = usv
    return S, U * U, V * V


def _eigh_loss(wv):
    w, V = wv
    return w, V * V


@pytest.mark.parametrize("name,fn,specs", CASES, ids=[c[0] for c in CASES])
def test_linalg(name, fn, specs):
    check_op(fn, specs, float32=name not in NO_FLOAT32, second_order=name not in NO_SECOND)


# --- non-differentiable results -------------------------------------------------------
def test_matrix_rank():
    a = make_inputs([(3, 5, 4)])[0]
    a[1] = a[1, :, :1] @ a[1, :1, :]  # rank 1
    a[2, :, 3] = a[2, :, 0] + a[2, :, 1]  # rank 3
    for kwargs in ({}, {"atol": 1e-3}, {"rtol": 0.5}, {"atol": 0.1, "rtol": 0.2}):
        check_torch(lambda T, x: T.linalg.matrix_rank(x, **kwargs), [a], grad=False)
    check_torch(lambda T, x: T.linalg.matrix_rank(x + x.mT, hermitian=True),
                [a[:, :4, :]], grad=False)


def test_lstsq_outputs_by_driver():
    a, b = make_inputs([(2, 5, 3), (2, 5, 2)])
    for driver in ("gels", "gelsy", "gelsd", "gelss"):
        tg = tapegrad.linalg.lstsq(tapegrad.tensor(a), tapegrad.tensor(b), driver=driver)
        th = torch.linalg.lstsq(torch.tensor(a), torch.tensor(b), driver=driver)
        for x, y in zip(tg, th):
            assert tuple(x.shape) == tuple(y.shape), driver
            assert str(x.dtype).split(".")[-1] == str(y.dtype).split(".")[-1]
            np.testing.assert_allclose(x.numpy(), y.numpy(), rtol=1e-10, atol=1e-12)


def test_eigh_reads_one_triangle():
    # the gradient is PyTorch's symmetric one (it assumes a symmetric input), so only the
    # comparison with PyTorch applies, not gradcheck
    a = make_inputs([(2, 4, 4)])[0]
    check_torch(lambda T, x: _eigh_loss(T.linalg.eigh(x)), [a])
    check_torch(lambda T, x: _eigh_loss(T.linalg.eigh(x, UPLO="U")), [a])
    check_torch(lambda T, x: T.linalg.eigvalsh(x, UPLO="U"), [a])


def test_qr_mode_r():
    a = make_inputs([(4, 3)])[0]
    tq, tr = tapegrad.linalg.qr(tapegrad.tensor(a, requires_grad=True), mode="r")
    q, r = torch.linalg.qr(torch.tensor(a), mode="r")
    assert tuple(tq.shape) == tuple(q.shape) == (0,)
    np.testing.assert_allclose(tr.detach().numpy(), r.numpy(), rtol=1e-12)
    with pytest.raises(RuntimeError, match="mode='r'"):
        tr.sum().backward()


def test_qr_complete_tall_has_no_gradient():
    x = tapegrad.tensor(make_inputs([(4, 3)])[0], requires_grad=True)
    q, r = tapegrad.linalg.qr(x, mode="complete")
    with pytest.raises(RuntimeError, match="not differentiable when mode='complete'"):
        q.sum().backward()


def test_namedtuple_fields():
    a = tapegrad.tensor(make_inputs([(3, 3)])[0])
    assert tapegrad.linalg.svd(a).Vh.shape == (3, 3)
    assert tapegrad.linalg.eigh(a).eigenvectors.shape == (3, 3)
    assert tapegrad.linalg.slogdet(a).logabsdet.shape == ()
    assert tapegrad.linalg.qr(a).R.shape == (3, 3)


def test_tensor_methods_and_deprecated_cholesky():
    a = make_inputs([(3, 3)])[0]
    s = a @ a.T + np.eye(3)
    check_torch(lambda T, x: (x.det(), x.inverse(), x.logdet(), x.pinverse(),
                              x.matrix_power(2), x.kron(x)), [s])
    with pytest.warns(UserWarning, match="torch.cholesky is deprecated"):
        tapegrad.cholesky(tapegrad.tensor(s))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        check_torch(lambda T, x: T.cholesky(x, upper=True), [s])


def test_logdet_negative_is_nan():
    a = np.diag([1.0, -2.0, 3.0])
    check_torch(lambda T, x: (T.logdet(x), *T.linalg.slogdet(x)), [a], grad=False)


def test_det_mixed_singular_batch():
    a = make_inputs([(3, 3, 3)])[0]
    a[1, 2] = a[1, 0] * 2  # singular
    check_torch(lambda T, x: T.linalg.det(x), [a])


def test_det_singular_second_order():
    a = _singular_batch()
    v = make_inputs([(2, 3, 3)], seed=3)[0]
    results = []
    for lib in (tapegrad, torch):
        x = lib.tensor(a, requires_grad=True)
        (g,) = lib.autograd.grad(lib.linalg.det(x).sum(), x, create_graph=True)
        (h,) = lib.autograd.grad((g * lib.tensor(v)).sum(), x)
        results.append(h.detach().numpy())
    np.testing.assert_allclose(results[0], results[1], rtol=1e-10, atol=1e-12)


def test_second_order_det_and_solve():
    a, b = make_inputs([(3, 3), (3, 2)])
    check_op(lambda T, x, y: T.linalg.det(x) * T.linalg.solve(wellcond(T, x), y).sum(),
             [a, b], float32=False)


# --- errors, as PyTorch's -------------------------------------------------------------
def _errors(fn, arrays, dtype=None):
    def run(lib):
        ts = [lib.tensor(a) if dtype is None else lib.tensor(a, dtype=getattr(lib, dtype))
              for a in arrays]
        with pytest.raises(Exception) as info:
            fn(lib, *ts)
        return info.value

    e_tg, e_th = run(tapegrad), run(torch)
    return e_tg, e_th


def _singular():
    z = np.zeros((3, 3))
    z[0, 0] = 1
    return z


@pytest.mark.parametrize("fn,arrays", [
    (lambda T, a: T.linalg.inv(a), [_singular()]),
    (lambda T, a: T.linalg.inv(a), [np.stack([np.eye(3), _singular()])]),
    (lambda T, a: T.linalg.solve(a, a[0]), [_singular()]),
    (lambda T, a: T.linalg.solve(a, a[..., 0]), [np.stack([np.eye(3), _singular()])]),
    (lambda T, a: T.linalg.cholesky(a), [-np.eye(3)]),
    (lambda T, a: T.linalg.cholesky(a), [np.stack([np.eye(3), np.diag([1.0, -1, 1])])]),
    (lambda T, a: T.linalg.matrix_power(a, -1), [_singular()]),
], ids=["inv", "inv_batch", "solve", "solve_batch", "cholesky", "cholesky_batch",
        "matrix_power"])
def test_linalg_error_message(fn, arrays):
    e_tg, e_th = _errors(fn, arrays)
    assert isinstance(e_tg, tapegrad.linalg.LinAlgError)
    assert isinstance(e_tg, RuntimeError)
    assert str(e_tg) == str(e_th)


@pytest.mark.parametrize("fn,arrays,dtype", [
    (lambda T, a: T.linalg.inv(a), [np.ones((3, 4))], None),
    (lambda T, a: T.linalg.inv(a), [np.ones(4)], None),
    (lambda T, a: T.linalg.inv(a), [np.ones((3, 3))], "long"),
    (lambda T, a: T.linalg.det(a), [np.ones((3, 4))], None),
    (lambda T, a: T.linalg.eigh(a), [np.ones((3, 4))], None),
    (lambda T, a: T.linalg.cholesky(a), [np.ones((2, 3, 4))], None),
    (lambda T, a: T.linalg.svd(a), [np.ones(3)], None),
    (lambda T, a: T.linalg.qr(a), [np.ones(3)], None),
    (lambda T, a, b: T.linalg.solve(a, b), [np.eye(3), np.ones(4)], None),
    (lambda T, a, b: T.linalg.solve_triangular(a, b, upper=True), [np.eye(3), np.ones(3)],
     None),
    (lambda T, a, b: T.linalg.cross(a, b), [np.ones((3, 2)), np.ones((3, 2))], None),
    (lambda T, a: T.trace(a), [np.ones((3, 3, 3))], None),
    (lambda T, a: T.linalg.qr(a, mode="x"), [np.ones((3, 3))], None),
    (lambda T, a: T.linalg.matrix_norm(a, "fro", dim=(0, 1, 2)), [np.ones((2, 3, 3))], None),
    (lambda T, a: T.linalg.multi_dot([a]), [np.ones((3, 3))], None),
    (lambda T, a, b: T.cdist(a, b), [np.ones((3, 2)), np.ones((3, 4))], None),
], ids=["inv_nonsquare", "inv_1d", "inv_long", "det_nonsquare", "eigh_nonsquare",
        "cholesky_nonsquare", "svd_1d", "qr_1d", "solve_shapes", "solve_triangular_vector",
        "cross_length", "trace_3d", "qr_mode", "matrix_norm_dims", "multi_dot_one", "cdist_cols"])
def test_error_same_as_torch(fn, arrays, dtype):
    e_tg, e_th = _errors(fn, arrays, dtype)
    assert isinstance(e_tg, type(e_th).__mro__[1] if type(e_th).__name__.startswith("_") else
                      type(e_th))
    assert str(e_th) in str(e_tg)
