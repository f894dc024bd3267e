"""Matrix functions and decompositions behind ``tapegrad.linalg``: solves, inverse,
determinants, Cholesky, QR, SVD, eigh, pseudo-inverse and least squares.

Each op runs LAPACK through ``xp.linalg`` over any leading batch dims. Decompositions with
several outputs (``svd``, ``eigh``, ``qr``) are one op whose output packs the factors along
its last dim; the public functions read the factors back out with views, so the tape holds
one node per decomposition and its rule sees the gradients of all factors at once (zeros for
factors nobody used). The rules are PyTorch's (``FunctionsManual.cpp``), written with
registered ops only, so they run on arrays and, with ``create_graph``, record their own graph.
"""
import math

from tapegrad.ops import registry as _registry
from tapegrad.ops.registry import op, xp
from tapegrad.ops.linalg import matmul
from tapegrad.ops.movement import reshape_op as reshape, tril_op as tril, triu_op as triu, \
    constant_pad
from tapegrad.ops.selection import diagonal_op, diag_embed_op
from tapegrad.ops.elementwise import where_op, zeros_like_grad
from tapegrad.ops import reduce as _R


class LinAlgError(RuntimeError):
    """As ``torch.linalg.LinAlgError``: a singular or non positive-definite input."""


# --- argument checks, in PyTorch's words ---------------------------------------------------
def check_matrix(name, A, square=True, what="A"):
    """Raise PyTorch's error unless ``A`` is a batch of (square) float matrices."""
    if A.ndim < 2:
        raise RuntimeError(f"{name}: The input tensor {what} must have at least 2 dimensions.")
    if A._data.dtype.kind in "iub":
        raise RuntimeError(f"{name}: Expected a floating point or complex tensor as input. "
                           f"Got {_torch_name(A.dtype)}")
    if square and A.shape[-1] != A.shape[-2]:
        raise RuntimeError(f"{name}: {what} must be batches of square matrices, but they are "
                           f"{A.shape[-2]} by {A.shape[-1]} matrices")


def _torch_name(dt):
    name = str(dt).split(".")[-1]
    return {"int64": "Long", "int32": "Int", "int16": "Short", "int8": "Char", "uint8": "Byte",
            "bool": "Bool"}.get(name, name)


def _batch_prefix(a, bad):
    """PyTorch's ``(Batch element i): `` for the first failing matrix of a batch."""
    if a.ndim == 2:
        return ""
    return f"(Batch element {int(xp.flatnonzero(bad.reshape(-1))[0])}): "


def _first_zero_pivot(m):
    """The 1-based index of LAPACK getrf's first exactly zero pivot of one matrix, or 0."""
    u = m.astype(xp.float64).copy()
    n = u.shape[0]
    for k in range(n):
        p = k + int(xp.argmax(xp.abs(u[k:, k])))
        if u[p, k] == 0:
            return k + 1
        u[[k, p]] = u[[p, k]]
        u[k + 1:] -= xp.outer(u[k + 1:, k] / u[k, k], u[k])
    return 0


def _singular(a):
    """Per matrix of the batch: is it singular (LU meets an exact zero pivot)?"""
    flat = a.reshape((-1,) + a.shape[-2:])
    return xp.array([_first_zero_pivot(m) > 0 for m in flat]).reshape(a.shape[:-2])


def _raise_singular(name, a, solver=False):
    bad = _singular(a)
    if not bad.any():  # LAPACK refused for another reason (nan...): say what numpy said
        bad = xp.ones(a.shape[:-2], bool)
    prefix = _batch_prefix(a, bad)
    if solver:
        raise LinAlgError(f"torch.linalg.solve: {prefix}The solver failed because the input "
                          "matrix is singular.")
    pivot = _first_zero_pivot(a.reshape((-1,) + a.shape[-2:])[int(xp.flatnonzero(bad)[0])]) \
        if a.ndim > 2 else _first_zero_pivot(a)
    raise LinAlgError(f"{name}: {prefix}The diagonal element {max(pivot, 1)} is zero, the "
                      "inversion could not be completed because the input matrix is singular.")


def _eye_like(a):
    n = a.shape[-1]
    return xp.broadcast_to(xp.eye(n, dtype=a.dtype), a.shape)


def _diag(v):
    """A batch of diagonal matrices from the last dim of ``v`` (registered op)."""
    n = v.shape[-1]
    nd = v.ndim
    return diag_embed_op(v, shape=tuple(v.shape) + (n,), offset=0, dim1=nd - 1, dim2=nd)


def _unsqueeze(x, dim):
    shape = list(x.shape)
    shape.insert(dim % (len(shape) + 1), 1)
    return reshape(x, shape=tuple(shape))


# --- solve, inverse ----------------------------------------------------------------------
@op(flops=2, saves="both", needs=True, name="linalg_solve")
def solve_op(a, b):
    """``X`` with ``A X = B`` for batches of square ``A`` and matrix ``B`` (equal batch dims)."""
    try:
        return xp.linalg.solve(a, b)
    except xp.linalg.LinAlgError:
        _raise_singular("linalg.solve", a, solver=True)


@solve_op.grad
def _(g, out, a, b, needs=(True, True)):
    gb = solve_op(a.mT, g)
    return (-matmul(gb, out.mT) if needs[0] else None), (gb if needs[1] else None)


def _tangent_sum(*terms):
    r = None
    for x in terms:
        if x is not None:
            r = x if r is None else r + x
    return r


@solve_op.jvp
def _(t, out, a, b):
    # dX = A^-1 (dB - dA X)
    rhs = _tangent_sum(t[1], -matmul(t[0], out) if t[0] is not None else None)
    return None if rhs is None else solve_op(a, rhs)


@op(flops=2, saves="both", needs=True, name="linalg_solve_triangular")
def solve_triangular_op(a, b, upper, unitriangular=False):
    """``X`` with ``A X = B``, ``A`` read as upper or lower triangular (batched, left side)."""
    t = xp.triu(a) if upper else xp.tril(a)
    if unitriangular:
        t = t.copy()
        xp.einsum("...ii->...i", t)[...] = 1
    return _triangular_solve(t, b, upper)


def _triangular_solve(t, b, upper):
    try:
        from scipy.linalg import solve_triangular as scipy_solve
    except ImportError:  # a general solve of the triangle: same result, rounding aside
        scipy_solve = None
    if scipy_solve is not None and t.ndim == 2:
        return scipy_solve(t, b, lower=not upper, check_finite=False).astype(b.dtype)
    with xp.errstate(divide="ignore", invalid="ignore"):
        try:
            return xp.linalg.solve(t, b)
        except xp.linalg.LinAlgError:  # a zero on the diagonal: IEEE results, as LAPACK trtrs
            out = xp.empty(xp.broadcast_shapes(t.shape[:-2], b.shape[:-2]) + b.shape[-2:],
                           b.dtype)
            tt = xp.broadcast_to(t, out.shape[:-2] + t.shape[-2:])
            bb = xp.broadcast_to(b, out.shape)
            for i in xp.ndindex(out.shape[:-2]):
                out[i] = _substitute(tt[i], bb[i], upper)
            return out


def _substitute(t, b, upper):
    n = t.shape[0]
    x = xp.zeros_like(b)
    order = range(n - 1, -1, -1) if upper else range(n)
    for i in order:
        x[i] = (b[i] - t[i] @ x) / t[i, i]
    return x


@solve_triangular_op.grad
def _(g, out, a, b, upper, unitriangular=False, needs=(True, True)):
    gb = solve_triangular_op(a.mT, g, upper=not upper, unitriangular=unitriangular)
    ga = None
    if needs[0]:
        ga = -matmul(gb, out.mT)
        k = 1 if unitriangular else 0
        ga = triu(ga, diagonal=k) if upper else tril(ga, diagonal=-k)
    return ga, (gb if needs[1] else None)


@solve_triangular_op.jvp
def _(t, out, a, b, upper, unitriangular=False):
    # dX = T^-1 (dB - dT X), dT the tangent's triangle (no diagonal when unitriangular)
    ta = t[0]
    if ta is not None:
        k = 1 if unitriangular else 0
        ta = triu(ta, diagonal=k) if upper else tril(ta, diagonal=-k)
        ta = -matmul(ta, out)
    rhs = _tangent_sum(t[1], ta)
    if rhs is None:
        return None
    return solve_triangular_op(a, rhs, upper=upper, unitriangular=unitriangular)


@op(flops=2, saves="out", name="linalg_inv")
def inv_op(a):
    try:
        return xp.linalg.inv(a)
    except xp.linalg.LinAlgError:
        _raise_singular("linalg.inv", a)


@inv_op.grad
def _(g, out, a):
    return -matmul(out.mT, matmul(g, out.mT))


@inv_op.jvp
def _(t, out, a):
    return -matmul(out, matmul(t[0], out))


# --- determinants ------------------------------------------------------------------------
@op(flops=2, saves="both", name="linalg_det")
def det_op(a):
    return xp.asarray(xp.linalg.det(a), dtype=a.dtype)


def _data(x):
    return x._data if isinstance(x, _registry.Tensor) else x


@det_op.grad
def _(g, out, a):
    # PyTorch's linalg_det_backward: through a solve for invertible matrices, through the
    # SVD (det U det Vh prod S, whose product rule needs no division) for singular ones
    if a.shape[-1] == 0:
        return a * 0
    from tapegrad.func._vmap import host, like  # under vmap: the physical batch's values

    eps = xp.finfo(_data(a).dtype).eps
    singular = xp.abs(host(out)) < 100 * eps
    n = a.shape[-1]
    d = _diag(_unsqueeze(g * out, -1) * xp.ones(n, dtype=_data(a).dtype))

    def nonsingular(m):
        return solve_op(m.mT, d)

    def through_svd(m):
        u, s, vh = _svd_factors(svd_op(m, full_matrices=False), m.shape, False)
        alpha = det_op(u) * det_op(vh) * g
        last = s.ndim - 1
        exclusive = _R._exclusive_prod_recorded(s, last) if isinstance(s, _registry.Tensor) \
            else _R._exclusive_prod(s, last)
        return matmul(u * _unsqueeze(_unsqueeze(alpha, -1) * exclusive, -2), vh)

    if not singular.any():
        return nonsingular(a)
    if singular.all():
        return through_svd(a)
    mask = like(singular[..., None, None], out)
    eye = _eye_like(_data(a))
    distinct = eye * xp.arange(1, a.shape[-1] + 1, dtype=eye.dtype)
    return where_op(mask, through_svd(where_op(mask, a, distinct)),
                    nonsingular(where_op(mask, eye, a)))


def _scalar_per_matrix_jvp(o, t, out, a, **params):
    """J t for an op with one scalar per matrix: ``<d out / dA, dA>`` over the last two dims,
    the derivative being the gradient rule at g = 1 (exact for singular matrices too)."""
    ones = _registry.Tensor._make(xp.ones(tuple(out.shape), _data(out).dtype))
    d = o.rule(ones, out, a, **params)
    return _R.sum_op(d * t[0], dims=(a.ndim - 2, a.ndim - 1))


@det_op.jvp
def _(t, out, a):
    # det(A) tr(A^-1 dA) for invertible A
    return _scalar_per_matrix_jvp(det_op, t, out, a)


@op(flops=2, name="linalg_slogdet_sign")
def slogdet_sign_op(a):
    return xp.linalg.slogdet(a)[0].astype(a.dtype, copy=False)


@slogdet_sign_op.grad
def _(g, out, a):
    return zeros_like_grad(a)  # a real sign is piecewise constant (PyTorch records it too)


@slogdet_sign_op.jvp
def _(t, out, a):
    return out * 0  # piecewise constant: a zero tangent, as PyTorch's


@op(flops=2, name="linalg_slogdet")
def logabsdet_op(a):
    return xp.linalg.slogdet(a)[1].astype(a.dtype, copy=False)


@logabsdet_op.grad
def _(g, out, a):
    n = a.shape[-1]
    return solve_op(a.mT, _diag(_unsqueeze(g, -1) * xp.ones(n, dtype=_data(a).dtype)))


@logabsdet_op.jvp
def _(t, out, a):
    # tr(A^-1 dA)
    return _scalar_per_matrix_jvp(logabsdet_op, t, out, a)


# --- Cholesky ----------------------------------------------------------------------------
def _not_positive_definite(name, a):
    flat = a.reshape((-1,) + a.shape[-2:])
    for i, m in enumerate(flat):
        for k in range(1, m.shape[-1] + 1):
            try:
                xp.linalg.cholesky(m[:k, :k])
            except xp.linalg.LinAlgError:
                prefix = f"(Batch element {i}): " if a.ndim > 2 else ""
                raise LinAlgError(f"{name}: {prefix}The factorization could not be completed "
                                  "because the input is not positive-definite (the leading "
                                  f"minor of order {k} is not positive-definite).") from None
    raise LinAlgError(f"{name}: The factorization could not be completed because the input is "
                      "not positive-definite.")


@op(flops=1, saves="out", name="linalg_cholesky")
def cholesky_op(a, upper=False):
    # LAPACK reads only the lower triangle, as PyTorch's (lower) factorization does
    lower = xp.tril(a) + xp.swapaxes(xp.tril(a, -1), -1, -2)
    try:
        factor = xp.linalg.cholesky(lower)
    except xp.linalg.LinAlgError:
        _not_positive_definite("linalg.cholesky", lower)
    return xp.swapaxes(factor, -1, -2).copy() if upper else factor


@cholesky_op.grad
def _(g, out, a, upper=False):
    factor, g = (out.mT, g.mT) if upper else (out, g)
    ga = tril(matmul(factor.mT, g))
    ga = (ga + tril(ga, diagonal=-1).mT) * 0.5
    ga = solve_triangular_op(factor.mT, ga, upper=True)
    # X L = G  <=>  L^T X^T = G^T
    return solve_triangular_op(factor.mT, ga.mT, upper=True).mT


@cholesky_op.jvp
def _(t, out, a, upper=False):
    # dL = L phi(L^-1 dA L^-T), phi: the lower triangle with the diagonal halved; dA read
    # from its lower triangle, as the forward reads A
    factor = out.mT if upper else out
    ta = tril(t[0]) + tril(t[0], diagonal=-1).mT
    y = solve_triangular_op(factor, ta, upper=False)
    z = solve_triangular_op(factor, y.mT, upper=False)  # L^-1 dA L^-T (dA symmetric)
    phi = tril(z) - _diag(diagonal_op(z, offset=0, dim1=z.ndim - 2, dim2=z.ndim - 1) * 0.5)
    dl = matmul(factor, phi)
    return dl.mT if upper else dl


# --- packed decompositions ---------------------------------------------------------------
def _pack(arrays):
    batch = arrays[0].shape[:-2] if arrays[0].ndim >= 2 else ()
    parts = [x.reshape(batch + (-1,)) for x in arrays]
    return xp.concatenate(parts, axis=-1)


def _unpack(packed, shapes):
    """The factors of ``shapes`` (without batch dims) from ``packed`` (array or Tensor)."""
    batch = tuple(packed.shape[:-1])
    out, start = [], 0
    for s in shapes:
        size = math.prod(s)
        out.append(reshape(packed[..., start:start + size], shape=batch + tuple(s)))
        start += size
    return out


def _svd_shapes(shape, full_matrices):
    m, n = shape[-2], shape[-1]
    k = min(m, n)
    return ((m, m if full_matrices else k), (k,), (n if full_matrices else k, n))


def _svd_factors(packed, shape, full_matrices):
    return _unpack(packed, _svd_shapes(shape, full_matrices))


@op(flops=10, saves="both", name="linalg_svd")
def svd_op(a, full_matrices=False):
    """U, S and Vh of ``a`` packed along the last dim (see ``_svd_factors``)."""
    if a.size == 0:
        u, s, vh = (xp.zeros(a.shape[:-2] + sh, a.dtype) for sh in
                    _svd_shapes(a.shape, full_matrices))
        k = min(a.shape[-2:])
        u[..., :k, :k] = xp.eye(k) if k else 0
        return _pack([u, s[..., None, :], vh])
    u, s, vh = xp.linalg.svd(a, full_matrices=full_matrices)
    return _pack([u, s[..., None, :], vh])


@svd_op.grad
def _(g, out, a, full_matrices=False):
    u, s, vh = _svd_factors(out, a.shape, full_matrices)
    gu, gs, gvh = _svd_factors(g, a.shape, full_matrices)
    m, n = a.shape[-2], a.shape[-1]
    k = min(m, n)
    if full_matrices and m != n:  # the extra columns/rows carry nothing about A
        u, gu = u[..., :, :k], gu[..., :, :k]
        vh, gvh = vh[..., :k, :], gvh[..., :k, :]
    from tapegrad.func._vmap import host  # under vmap: the decision for the physical batch

    if not host(gu).any() and not host(gvh).any():  # svdvals, norms: PyTorch's short rule
        return matmul(u * _unsqueeze(gs, -2), vh)
    return _svd_backward(gu, gs, gvh, u, s, vh, m, n)


def _svd_backward(gu, gs, gvh, u, s, vh, m, n):
    uhgu = matmul(u.mT, gu)
    uhgu = uhgu - uhgu.mT
    vhgv = matmul(vh, gvh.mT)
    vhgv = vhgv - vhgv.mT
    s2 = s * s
    e = _unsqueeze(s2, -2) - _unsqueeze(s2, -1) + _eye_of(s)
    ga = (uhgu * _unsqueeze(s, -2) + _unsqueeze(s, -1) * vhgv) / e + _diag(gs)
    if m > n:
        ga = matmul(u, ga)
        gu_sinv = gu / _unsqueeze(s, -2)
        ga = ga + gu_sinv - matmul(u, matmul(u.mT, gu_sinv))
        return matmul(ga, vh)
    if m < n:
        ga = matmul(ga, vh)
        sinv_gvh = gvh / _unsqueeze(s, -1)
        ga = ga + sinv_gvh - matmul(matmul(sinv_gvh, vh.mT), vh)
        return matmul(u, ga)
    return matmul(u, matmul(ga, vh))


def _zero_diag(x):
    return x - _diag(diagonal_op(x, offset=0, dim1=x.ndim - 2, dim2=x.ndim - 1))


def _svd_jvp_tall(da, u, s, vh):
    """dU, dS, dVh of the reduced SVD of a tall (m >= n) matrix: with dP = U^T dA V,
    dS = diag(dP), dU = U Om_U + (dA V - U dP) S^-1, dVh = -Om_V Vh, where
    Om_U = (dP S + S dP^T) / E, Om_V = (S dP + dP^T S) / E, E_ij = s_j^2 - s_i^2."""
    v = vh.mT
    dav = matmul(da, v)
    dp = matmul(u.mT, dav)
    ds = diagonal_op(dp, offset=0, dim1=dp.ndim - 2, dim2=dp.ndim - 1)
    s2 = s * s
    e = _unsqueeze(s2, -2) - _unsqueeze(s2, -1) + _eye_of(s)
    row, col = _unsqueeze(s, -1), _unsqueeze(s, -2)
    om_u = _zero_diag((dp * col + row * dp.mT) / e)
    om_v = _zero_diag((row * dp + dp.mT * col) / e)
    du = matmul(u, om_u) + (dav - matmul(u, dp)) / col
    dvh = -matmul(om_v, vh)
    return du, ds, dvh


@svd_op.jvp
def _(t, out, a, full_matrices=False):
    u, s, vh = _svd_factors(out, a.shape, full_matrices)
    m, n = a.shape[-2], a.shape[-1]
    k = min(m, n)
    if full_matrices and m != n:  # as PyTorch: the extra columns/rows get a zero tangent
        u, vh = u[..., :, :k], vh[..., :k, :]
    if m >= n:
        du, ds, dvh = _svd_jvp_tall(t[0], u, s, vh)
    else:  # A^T = V S U^T is tall
        dv, ds, duh = _svd_jvp_tall(t[0].mT, vh.mT, s, u.mT)
        du, dvh = duh.mT, dv.mT
    if full_matrices and m != n:
        batch = ((0, 0),) * (a.ndim - 2)
        if m > n:
            du = constant_pad(du, widths=batch + ((0, 0), (0, m - k)))
        else:
            dvh = constant_pad(dvh, widths=batch + ((0, n - k), (0, 0)))
    return _pack_tangent([du, _unsqueeze(ds, -2), dvh])


def _pack_tangent(parts):
    """The recorded counterpart of ``_pack``: the factors' tangents along the last dim."""
    from tapegrad.ops.movement import cat

    batch = tuple(parts[0].shape[:-2])
    return cat([reshape(x, shape=batch + (-1,)) for x in parts], dim=len(batch))


def _eye_of(v):
    """The identity matching the last dim of ``v`` (a constant array)."""
    return xp.eye(v.shape[-1], dtype=_data(v).dtype)


@op(flops=10, saves="out", name="linalg_eigh")
def eigh_op(a, upper=False):
    """Eigenvalues (ascending) and eigenvectors of symmetric ``a``, packed: (..., n + n*n)."""
    w, v = xp.linalg.eigh(a, UPLO="U" if upper else "L")
    return _pack([w[..., None, :], v])


def _eigh_factors(packed, n):
    return _unpack(packed, ((n,), (n, n)))


@eigh_op.grad
def _(g, out, a, upper=False):
    n = a.shape[-1]
    w, v = _eigh_factors(out, n)
    gw, gv = _eigh_factors(g, n)
    from tapegrad.func._vmap import host  # under vmap: the decision for the physical batch

    if not host(gv).any():  # eigenvalues only: PyTorch's short rule (no 1 / (w_j - w_i))
        return matmul(v * _unsqueeze(gw, -2), v.mT)
    vhgv = matmul(v.mT, gv)
    vhgv = (vhgv - vhgv.mT) * 0.5
    e = _unsqueeze(w, -2) - _unsqueeze(w, -1) + _eye_of(w)
    ga = vhgv / e
    # the diagonal of vhgv is zero (skew), so gA's diagonal is gw's
    ga = ga - _diag(diagonal_op(ga, offset=0, dim1=ga.ndim - 2, dim2=ga.ndim - 1)) + _diag(gw)
    return matmul(v, matmul(ga, v.mT))


@eigh_op.jvp
def _(t, out, a, upper=False):
    # as PyTorch's linalg_eig_jvp (hermitian): dP = V^T dA V, dw = diag(dP),
    # dV = V (dP / E) with E_ij = w_j - w_i and a zero diagonal
    n = a.shape[-1]
    w, v = _eigh_factors(out, n)
    dp = matmul(v.mT, matmul(t[0], v))
    dw = diagonal_op(dp, offset=0, dim1=dp.ndim - 2, dim2=dp.ndim - 1)
    e = _unsqueeze(w, -2) - _unsqueeze(w, -1) + _eye_of(w)
    dv = matmul(v, _zero_diag(dp / e))
    return _pack_tangent([_unsqueeze(dw, -2), dv])


_QR_MODES = ("reduced", "complete", "r")


def _qr_shapes(shape, mode):
    m, n = shape[-2], shape[-1]
    k = m if mode == "complete" else min(m, n)
    return ((m, k), (k, n))


@op(flops=10, saves="out", name="linalg_qr")
def qr_op(a, mode="reduced"):
    """Q and R of ``a`` packed along the last dim (mode 'reduced' or 'complete')."""
    q, r = xp.linalg.qr(a, mode=mode)
    return _pack([q, r])


@qr_op.grad
def _(g, out, a, mode="reduced"):
    m, n = a.shape[-2], a.shape[-1]
    if mode == "complete" and m > n:
        raise RuntimeError("linalg.qr: The QR decomposition is not differentiable when "
                           f"mode='complete' and nrows > ncols (input shape {tuple(a.shape)}).")
    q, r = _unpack(out, _qr_shapes(a.shape, mode))
    gq, gr = _unpack(g, _qr_shapes(a.shape, mode))
    ga = matmul(gr, r.mT) - matmul(q.mT, gq)
    if m >= n:
        sym = triu(ga)
        sym = sym + sym.mT
        sym = sym - _diag(diagonal_op(sym, offset=0, dim1=sym.ndim - 2, dim2=sym.ndim - 1) * 0.5)
        ga = matmul(q, sym) + gq
        # X R^T = gA  <=>  R X^T = gA^T
        return solve_triangular_op(r, ga.mT, upper=True).mT
    x = -ga
    skew = tril(x - x.mT)
    ga = matmul(q, skew)
    r1 = r[..., :, :m]
    ga = solve_triangular_op(r1, ga.mT, upper=True).mT
    ga = constant_pad(ga, widths=((0, 0),) * (ga.ndim - 1) + ((0, n - m),))
    return ga + matmul(q, gr)


def _qr_jvp_square(da, q, r):
    """dQ, dR of A = Q R (m >= n, R square invertible): C = Q^T dA R^-1,
    Om = tril(C, -1) - tril(C, -1)^T, dR = (C - Om) R, dQ = dA R^-1 - Q (C - Om)."""
    # X R = dA  <=>  R^T X^T = dA^T
    da_rinv = solve_triangular_op(r.mT, da.mT, upper=False).mT
    c = matmul(q.mT, da_rinv)
    low = tril(c, diagonal=-1)
    up = c - (low - low.mT)
    return da_rinv - matmul(q, up), matmul(up, r)


@qr_op.jvp
def _(t, out, a, mode="reduced"):
    m, n = a.shape[-2], a.shape[-1]
    if mode == "complete" and m > n:
        raise RuntimeError("linalg.qr: The QR decomposition is not differentiable when "
                           f"mode='complete' and nrows > ncols (input shape {tuple(a.shape)}).")
    q, r = _unpack(out, _qr_shapes(a.shape, mode))
    if m >= n:
        dq, dr = _qr_jvp_square(t[0], q, r)
        return _pack_tangent([dq, dr])
    # wide: A = Q [R1 R2] with A1 = Q R1 square; dR2 = Q^T (dA2 - dQ R2)
    da1, da2 = t[0][..., :, :m], t[0][..., :, m:]
    r1, r2 = r[..., :, :m], r[..., :, m:]
    dq, dr1 = _qr_jvp_square(da1, q, r1)
    dr2 = matmul(q.mT, da2 - matmul(dq, r2))
    from tapegrad.ops.movement import cat

    return _pack_tangent([dq, cat([dr1, dr2], dim=r.ndim - 1)])


# --- pseudo-inverse and least squares ----------------------------------------------------
@op(flops=10, saves="both", name="linalg_pinv")
def pinv_op(a, atol=None, rtol=None, hermitian=False):
    """As ``torch.linalg.pinv`` with float tolerances (None: PyTorch's defaults)."""
    m, n = a.shape[-2], a.shape[-1]
    if a.size == 0:
        return xp.zeros(a.shape[:-2] + (n, m), a.dtype)
    if hermitian:
        w, v = xp.linalg.eigh(a)
        s = xp.abs(w)
    else:
        u, s, vh = xp.linalg.svd(a, full_matrices=False)
    smax = s.max(axis=-1, keepdims=True)
    eps = xp.finfo(a.dtype).eps
    if rtol is None:
        rtol = 0.0 if atol is not None and atol > 0 else max(m, n) * eps
    tol = xp.maximum(0.0 if atol is None else atol, rtol * smax)
    if hermitian:
        inv_w = xp.where(s > tol, 1 / xp.where(s > tol, w, 1), 0).astype(a.dtype)
        return (v * inv_w[..., None, :]) @ xp.swapaxes(v, -1, -2)
    inv_s = xp.where(s > tol, 1 / xp.where(s > tol, s, 1), 0).astype(a.dtype)
    return xp.swapaxes(vh, -1, -2) @ (inv_s[..., :, None] * xp.swapaxes(u, -1, -2))


@pinv_op.grad
def _(g, out, a, atol=None, rtol=None, hermitian=False):
    return _pinv_backward(g, out, a)


def _pinv_backward(g, p, a):
    m, n = a.shape[-2], a.shape[-1]
    ph, gh = p.mT, g.mT
    if m <= n:
        k = matmul(gh, p)
        k_ph = matmul(k, ph)
        return -matmul(p, k).mT + k_ph - matmul(matmul(a, p), k_ph) + \
            matmul(matmul(ph, p), gh - matmul(k, a))
    k = matmul(p, gh)
    ph_k = matmul(ph, k)
    return -matmul(k, p).mT + matmul(matmul(gh - matmul(a, k), p), ph) + ph_k - \
        matmul(matmul(ph_k, p), a)


def _pinv_jvp(p, a, da):
    # dP = -P dA P + P P^T dA^T (I - A P) + (I - P A) dA^T P^T P
    dah = da.mT
    return (-matmul(p, matmul(da, p)) + matmul(matmul(p, p.mT), dah - matmul(dah, matmul(a, p)))
            + matmul(dah - matmul(p, matmul(a, dah)), matmul(p.mT, p)))


@pinv_op.jvp
def _(t, out, a, atol=None, rtol=None, hermitian=False):
    return _pinv_jvp(out, a, t[0])


@op(flops=10, saves="inputs", needs=True, name="linalg_lstsq")
def lstsq_op(a, b, rcond=None):
    """The least-squares solution of ``A X = B`` (matrix ``B``, equal batch dims)."""
    m, n = a.shape[-2], a.shape[-1]
    out = xp.empty(a.shape[:-2] + (n, b.shape[-1]), a.dtype)
    if rcond is None:
        rcond = xp.finfo(a.dtype).eps * max(m, n)
    for i in xp.ndindex(a.shape[:-2]):
        out[i] = xp.linalg.lstsq(a[i], b[i], rcond=rcond)[0]
    return out


@lstsq_op.grad
def _(g, out, a, b, rcond=None, needs=(True, True)):
    p = pinv_op(a)
    ga = _pinv_backward(matmul(g, b.mT), p, a) if needs[0] else None
    return ga, (matmul(p.mT, g) if needs[1] else None)


@lstsq_op.jvp
def _(t, out, a, b, rcond=None):
    # X = pinv(A) B: dX = dpinv(A) B + pinv(A) dB
    p = pinv_op(a) if t[0] is not None or t[1] is not None else None
    return _tangent_sum(matmul(_pinv_jvp(p, a, t[0]), b) if t[0] is not None else None,
                        matmul(p, t[1]) if t[1] is not None else None)


# --- cross product ---------------------------------------------------------------------
@op(flops=3, needs=True, uses=((1,), (0,)), name="linalg_cross")
def cross_op(a, b, dim):
    return xp.cross(a, b, axis=dim)


@cross_op.grad
def _(g, out, a, b, dim, needs=(True, True)):
    return (cross_op(b, g, dim=dim) if needs[0] else None), \
        (cross_op(g, a, dim=dim) if needs[1] else None)


@cross_op.jvp
def _(t, out, a, b, dim):
    return _tangent_sum(cross_op(t[0], b, dim=dim) if t[0] is not None else None,
                        cross_op(a, t[1], dim=dim) if t[1] is not None else None)
