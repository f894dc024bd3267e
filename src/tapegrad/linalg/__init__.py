"""``tapegrad.linalg``: PyTorch's ``torch.linalg`` namespace.

    import tapegrad as torch
    L = torch.linalg.cholesky(A @ A.mT + torch.eye(3))
    U, S, Vh = torch.linalg.svd(A, full_matrices=False)

Every function takes batches (leading dims) and is differentiable where PyTorch's is, with
PyTorch's gradient formulas (the ops and their rules live in ``tapegrad.ops.decompositions``).
Also here: the top-level matrix functions (``tapegrad.det``, ``inverse``, ``trace``, ``kron``,
``cdist``...) listed in ``TOPLEVEL``.
"""
import builtins
import collections
import math
import operator
import warnings

from tapegrad import dtypes, creation as _C
from tapegrad.ops import registry as _registry
from tapegrad.ops import decompositions as _D
from tapegrad.ops import reduce as _R, movement as _M, selection as _S, elementwise as _E
from tapegrad.ops.decompositions import LinAlgError, check_matrix
from tapegrad.ops.linalg import matmul
from tapegrad.ops.registry import xp

__all__ = ["LinAlgError", "norm", "vector_norm", "matrix_norm", "solve", "solve_triangular",
           "inv", "det", "slogdet", "cholesky", "qr", "svd", "svdvals", "eigh", "eigvalsh",
           "pinv", "matrix_rank", "lstsq", "cross", "matrix_power", "multi_dot", "vecdot",
           "diagonal", "matmul"]

_slogdet_result = collections.namedtuple("slogdet", ["sign", "logabsdet"])
_qr_result = collections.namedtuple("qr", ["Q", "R"])
_svd_result = collections.namedtuple("svd", ["U", "S", "Vh"])
_eigh_result = collections.namedtuple("eigh", ["eigenvalues", "eigenvectors"])
_lstsq_result = collections.namedtuple("lstsq", ["solution", "residuals", "rank",
                                                 "singular_values"])
_torch_svd_result = collections.namedtuple("svd", ["U", "S", "V"])


def _tensor(x, name):
    if not isinstance(x, _registry.Tensor):
        raise TypeError(f"{name}(): argument 'A' must be Tensor, not {type(x).__name__}")
    return x


def _unsqueeze(x, dim):
    return _M.unsqueeze(x, dim)


def _broadcast_batch(name, a, b):
    """``a`` and ``b`` (matrices) with their batch dims broadcast together."""
    try:
        batch = xp.broadcast_shapes(tuple(a.shape[:-2]), tuple(b.shape[:-2]))
    except ValueError:
        raise RuntimeError(f"{name}: the batch dims of A {tuple(a.shape)} and B "
                           f"{tuple(b.shape)} cannot be broadcast together") from None
    if tuple(a.shape[:-2]) != batch:
        a = _M.broadcast_to(a, batch + tuple(a.shape[-2:]))
    if tuple(b.shape[:-2]) != batch:
        b = _M.broadcast_to(b, batch + tuple(b.shape[-2:]))
    return a, b


def _same_float(name, a, b):
    dt = dtypes.result_type(a, b)
    if a.dtype is not dt:
        a = _E.to_dtype(a, dtype=dt)
    if b.dtype is not dt:
        b = _E.to_dtype(b, dtype=dt)
    if a._data.dtype.kind in "iub":
        raise RuntimeError(f"{name}: Expected a floating point or complex tensor as input. Got "
                           f"{_D._torch_name(a.dtype)}")
    return a, b


def _solve_operands(name, a, b, left):
    """``a`` and matrix ``b`` of a solve (``a x = b``, or ``x a = b`` unless ``left``) checked
    for compatible sizes, with their batch dims broadcast together."""
    if (b.shape[-2] if left else b.shape[-1]) != a.shape[-1]:
        raise RuntimeError(f"{name}: Incompatible shapes of A and B for the equation "
                           f"{'AX = B' if left else 'XA = B'} ({a.shape[-2]}x{a.shape[-1]} and "
                           f"{b.shape[-2]}x{b.shape[-1]})")
    return _broadcast_batch(name, a, b)


def _is_vector_rhs(a, b):
    return b.ndim == 1 or (b.ndim == a.ndim - 1 and tuple(b.shape) == tuple(a.shape[:-1]))


# --- norms -------------------------------------------------------------------------------
def vector_norm(x, ord=2, dim=None, keepdim=False, *, dtype=None):
    """As ``torch.linalg.vector_norm``: ``sum(|x|^ord) ** (1/ord)`` over ``dim`` (all dims
    by default); ``ord`` may be any number, ``inf``, ``-inf`` or 0."""
    if isinstance(ord, str):
        raise RuntimeError(f"linalg.vector_norm: ord must be a number, got {ord!r}")
    return _R.norm(x, p=ord, dim=dim, keepdim=keepdim, dtype=dtype)


def _matrix_dims(name, A, dim):
    dim = tuple(dim) if not isinstance(dim, int) else (dim,)
    if len(dim) != 2:
        raise RuntimeError(f"{name}: dim must be a 2-tuple. Got " + " ".join(map(str, dim)))
    if A.ndim < 2:
        raise RuntimeError(f"{name}: The input tensor A must have at least 2 dimensions.")
    d0, d1 = (_M._dim(d, A.ndim, name) for d in dim)
    if d0 == d1:
        raise RuntimeError(f"{name}: dims must be different. Got ({dim[0]}, {dim[1]})")
    return d0, d1


def matrix_norm(A, ord="fro", dim=(-2, -1), keepdim=False, *, dtype=None):
    """As ``torch.linalg.matrix_norm``: ``ord`` in 'fro', 'nuc', 1, -1, 2, -2, inf, -inf, over
    the two dims ``dim`` (batched over the others)."""
    name = "linalg.matrix_norm"
    d0, d1 = _matrix_dims(name, A, dim)
    if dtype is not None:
        A = _E.to_dtype(A, dtype=dtypes.to_dtype(dtype))
    if A._data.dtype.kind in "iub":
        raise RuntimeError(f"{name}: Expected a floating point or complex tensor as input. Got "
                           f"{_D._torch_name(A.dtype)}")
    if ord == "fro":
        return _R.norm(A, p=2, dim=(d0, d1), keepdim=keepdim)
    if isinstance(ord, str) and ord != "nuc" or not isinstance(ord, str) and \
            ord not in (1, -1, 2, -2, math.inf, -math.inf):
        raise RuntimeError(f"{name}: Order {ord} not supported.")
    if ord == "nuc" or ord in (2, -2):
        if A._data.size == 0 and ord != "nuc" or ord == -2 and 0 in A.shape:
            raise RuntimeError(f"{name}: The ord={ord} norm of an empty matrix is not defined "
                               f"(input shape {tuple(A.shape)})")
        rest = [d for d in range(A.ndim) if d not in (d0, d1)]
        moved = _M.permute(A, dims=tuple(rest) + (d0, d1))
        s = svdvals(moved)
        out = _R.sum(s, -1) if ord == "nuc" else _R.amax(s, -1) if ord == 2 else _R.amin(s, -1)
    else:
        # 1: the largest column sum of |A| (sum over d0, extreme over d1); inf: rows
        over, across = (d0, d1) if ord in (1, -1) else (d1, d0)
        sums = _R.sum(_E.abs(A), over, keepdim=True)
        extreme = _R.amax if ord > 0 else _R.amin
        out = extreme(sums, across, keepdim=True)
        return out if keepdim else _M.squeeze(out, dim=(d0, d1))
    if keepdim:
        for d in sorted((d0, d1)):
            out = _unsqueeze(out, d)
    return out


def norm(A, ord=None, dim=None, keepdim=False, *, dtype=None):
    """As ``torch.linalg.norm``: a vector norm when ``dim`` is an int (or ``A`` is 1-D), a
    matrix norm when ``dim`` is a 2-tuple (or ``A`` is 2-D and ``ord`` is given); with neither
    ``ord`` nor ``dim`` the 2-norm of the flattened input."""
    if dim is not None:
        dims = (dim,) if isinstance(dim, int) else tuple(dim)
        if len(dims) == 1:
            return vector_norm(A, 2 if ord is None else ord, dims, keepdim, dtype=dtype)
        if len(dims) == 2:
            if ord is None:
                return vector_norm(A, 2, dims, keepdim, dtype=dtype)
            return matrix_norm(A, ord, dims, keepdim, dtype=dtype)
        raise RuntimeError(f"linalg.norm: If dim is specified, it must be of length 1 or 2. Got "
                           f"{list(dims)}")
    if ord is None:
        return vector_norm(A, 2, None, keepdim, dtype=dtype)
    if A.ndim == 1:
        return vector_norm(A, ord, None, keepdim, dtype=dtype)
    if A.ndim == 2:
        return matrix_norm(A, ord, (-2, -1), keepdim, dtype=dtype)
    raise RuntimeError(f"linalg.norm: If dim is not specified but ord is, the input must be 1D "
                       f"or 2D. Got {A.ndim}D.")


# --- solves and inverses -----------------------------------------------------------------
def solve(A, B, *, left=True):
    """As ``torch.linalg.solve``: ``X`` with ``A X = B`` (``X A = B`` with ``left=False``).
    ``B`` is a vector when it is 1-D or has ``A``'s shape without its last dim. A singular
    ``A`` raises ``LinAlgError``."""
    name = "linalg.solve"
    check_matrix(name, A)
    A, B = _same_float(name, A, B)
    vector = left and _is_vector_rhs(A, B)
    if vector:
        B = _unsqueeze(B, -1)
    if B.ndim < 2:
        raise RuntimeError(f"{name}: The input tensor B must have at least 2 dimensions.")
    A, B = _solve_operands(name, A, B, left)
    if left:
        X = _D.solve_op(A, B)
    else:
        X = _D.solve_op(A.mT, B.mT).mT
    return _M.squeeze(X, -1) if vector else X


def solve_triangular(A, B, *, upper, left=True, unitriangular=False):
    """As ``torch.linalg.solve_triangular``: ``X`` with ``A X = B`` (or ``X A = B``) reading
    only the ``upper`` or lower triangle of ``A`` (its diagonal as ones if
    ``unitriangular``). ``B`` must be a batch of matrices."""
    name = "linalg.solve_triangular"
    check_matrix(name, A)
    if B.ndim < 2:
        raise RuntimeError(f"{name}: The input tensor B must have at least 2 dimensions.")
    A, B = _same_float(name, A, B)
    A, B = _solve_operands(name, A, B, left)
    if left:
        return _D.solve_triangular_op(A, B, upper=upper, unitriangular=unitriangular)
    return _D.solve_triangular_op(A.mT, B.mT, upper=not upper, unitriangular=unitriangular).mT


def inv(A):
    """As ``torch.linalg.inv``: the inverse of each square matrix; singular ones raise
    ``LinAlgError`` naming the zero pivot."""
    check_matrix("linalg.inv", _tensor(A, "linalg.inv"))
    return _D.inv_op(A)


def det(A):
    """As ``torch.linalg.det``: determinants of a batch of square matrices (differentiable
    also at singular matrices, through the SVD)."""
    check_matrix("linalg.det", _tensor(A, "linalg.det"))
    return _D.det_op(A)


def slogdet(A):
    """As ``torch.linalg.slogdet``: ``(sign, logabsdet)`` with ``det = sign * exp(logabsdet)``."""
    check_matrix("linalg.slogdet", _tensor(A, "linalg.slogdet"))
    return _slogdet_result(_D.slogdet_sign_op(A), _D.logabsdet_op(A))


def cholesky(A, *, upper=False):
    """As ``torch.linalg.cholesky``: ``L`` lower triangular with ``A = L L^T`` (``U`` with
    ``A = U^T U`` if ``upper``); reads the lower triangle of ``A``. A matrix that is not
    positive-definite raises ``LinAlgError`` naming the failing leading minor."""
    check_matrix("linalg.cholesky", _tensor(A, "linalg.cholesky"))
    return _D.cholesky_op(A, upper=bool(upper))


# --- decompositions ----------------------------------------------------------------------
def qr(A, mode="reduced"):
    """As ``torch.linalg.qr``: ``(Q, R)`` with modes 'reduced', 'complete' and 'r' (Q empty;
    not differentiable, as in PyTorch)."""
    if mode not in _D._QR_MODES:
        raise RuntimeError(f"qr received unrecognized mode '{mode}' but expected one of "
                           "'reduced' (default), 'r', or 'complete'")
    check_matrix("linalg.qr", _tensor(A, "linalg.qr"), square=False)
    if mode == "r":
        packed = _D.qr_op(A, mode="reduced")
        _, R = _D._unpack(packed, _D._qr_shapes(A.shape, "reduced"))
        if R.requires_grad:
            R = _qr_r_only(R)
        return _qr_result(_registry.Tensor._make(xp.zeros((0,), A._data.dtype)), R)
    packed = _D.qr_op(A, mode=mode)
    return _qr_result(*_D._unpack(packed, _D._qr_shapes(A.shape, mode)))


@_registry.op(saves="none", name="linalg_qr_r")
def _qr_r_only(r):
    """R of mode='r': its backward raises PyTorch's error (Q was not computed)."""
    return r


@_qr_r_only.grad
def _(g, out, r):
    raise RuntimeError("The derivative of linalg.qr depends on Q, which is not computed when "
                       "mode='r'. Please use linalg.qr(A, mode='reduced') if you are going to "
                       "differentiate through linalg.qr.")


@_qr_r_only.jvp
def _(t, out, r):
    raise RuntimeError("The derivative of linalg.qr depends on Q, which is not computed when "
                       "mode='r'. Please use linalg.qr(A, mode='reduced') if you are going to "
                       "differentiate through linalg.qr.")


def svd(A, full_matrices=True, *, driver=None):
    """As ``torch.linalg.svd``: ``(U, S, Vh)`` with ``A = U diag(S) Vh``, singular values
    descending; ``full_matrices=False`` gives the reduced factors."""
    check_matrix("linalg.svd", _tensor(A, "linalg.svd"), square=False)
    if driver is not None:
        raise RuntimeError("linalg.svd: keyword argument `driver=` is only supported on CUDA "
                           "inputs with cuSOLVER backend.")
    packed = _D.svd_op(A, full_matrices=bool(full_matrices))
    return _svd_result(*_D._svd_factors(packed, A.shape, bool(full_matrices)))


def svdvals(A, *, driver=None):
    """As ``torch.linalg.svdvals``: the singular values, descending."""
    check_matrix("linalg.svdvals", _tensor(A, "linalg.svdvals"), square=False)
    return _D._svd_factors(_D.svd_op(A, full_matrices=False), A.shape, False)[1]


def eigh(A, UPLO="L"):
    """As ``torch.linalg.eigh``: ascending eigenvalues and orthonormal eigenvectors of a
    symmetric matrix, reading its lower (``UPLO='L'``) or upper triangle."""
    check_matrix("linalg.eigh", _tensor(A, "linalg.eigh"))
    if UPLO not in ("L", "U"):
        raise RuntimeError(f"linalg.eigh: Expected UPLO argument to be 'L' or 'U', but got "
                           f"{UPLO}")
    packed = _D.eigh_op(A, upper=UPLO == "U")
    return _eigh_result(*_D._eigh_factors(packed, A.shape[-1]))


def eigvalsh(A, UPLO="L"):
    """As ``torch.linalg.eigvalsh``: the eigenvalues of a symmetric matrix, ascending."""
    return eigh(A, UPLO).eigenvalues


def _tolerance(value):
    if isinstance(value, _registry.Tensor):
        if value.numel() != 1:
            raise NotImplementedError("linalg: tensor tolerances with more than one element are "
                                      "not supported by tapegrad (pass a number)")
        return float(value.item())
    return None if value is None else float(value)


def pinv(A, *, atol=None, rtol=None, hermitian=False):
    """As ``torch.linalg.pinv``: the pseudo-inverse, dropping singular values below
    ``max(atol, rtol * largest)`` (PyTorch's defaults)."""
    check_matrix("linalg.pinv", _tensor(A, "linalg.pinv"), square=bool(hermitian))
    return _D.pinv_op(A, atol=_tolerance(atol), rtol=_tolerance(rtol), hermitian=bool(hermitian))


def matrix_rank(A, *, atol=None, rtol=None, hermitian=False):
    """As ``torch.linalg.matrix_rank``: the number of singular values above
    ``max(atol, rtol * largest)`` (int64, no gradient)."""
    check_matrix("linalg.matrix_rank", _tensor(A, "linalg.matrix_rank"),
                 square=bool(hermitian))
    a = A._data
    m, n = a.shape[-2], a.shape[-1]
    s = xp.abs(xp.linalg.eigvalsh(a)) if hermitian else xp.linalg.svd(a, compute_uv=False)
    atol, rtol = _tolerance(atol), _tolerance(rtol)
    if rtol is None:
        rtol = 0.0 if atol is not None and atol > 0 else max(m, n) * xp.finfo(a.dtype).eps
    smax = s.max(axis=-1, keepdims=True) if s.shape[-1] else xp.zeros(s.shape[:-1] + (1,))
    tol = xp.maximum(0.0 if atol is None else atol, rtol * smax)
    return _registry.Tensor._make(xp.asarray((s > tol).sum(axis=-1), dtype=xp.int64))


_LSTSQ_DRIVERS = ("gels", "gelsy", "gelsd", "gelss")


def lstsq(A, B, rcond=None, *, driver=None):
    """As ``torch.linalg.lstsq`` on the CPU: ``(solution, residuals, rank, singular_values)``;
    which of the last three are filled depends on ``driver`` as in PyTorch (default
    'gelsy': the rank only). The solution is differentiable (through the pseudo-inverse)."""
    name = "linalg.lstsq"
    check_matrix(name, A, square=False)
    driver = "gelsy" if driver is None else driver
    if driver not in _LSTSQ_DRIVERS:
        raise RuntimeError(f"torch.linalg.lstsq: parameter `driver` should be one of "
                           f"{_LSTSQ_DRIVERS}")
    A, B = _same_float(name, A, B)
    vector = B.ndim == A.ndim - 1
    if vector:
        B = _unsqueeze(B, -1)
    if B.shape[-2] != A.shape[-2]:
        raise RuntimeError(f"{name}: input.size(-2) should match other.size(-2) (shapes "
                           f"{tuple(A.shape)} and {tuple(B.shape)})")
    A, B = _broadcast_batch(name, A, B)
    X = _D.lstsq_op(A, B, rcond=None if rcond is None else float(rcond))
    m, n = A.shape[-2], A.shape[-1]
    a = A._data
    batched = getattr(a, "value", None) is not None  # under tapegrad.func.vmap: read the
    if batched:  # physical batch, as PyTorch's kernel (the residuals' choice is the batch's)
        from tapegrad.func._vmap import physical_array, rebatch

        a = physical_array(A)
    dt = a.dtype
    s = xp.linalg.svd(a, compute_uv=False) if a.size else xp.zeros(a.shape[:-2] + (0,), dt)
    eps_rcond = xp.finfo(dt).eps * max(m, n) if rcond is None else float(rcond)
    smax = s.max(axis=-1, keepdims=True) if s.shape[-1] else xp.zeros(s.shape[:-1] + (1,), dt)
    rank = (s > eps_rcond * smax).sum(axis=-1).astype(xp.int64)
    empty = _registry.Tensor._make(xp.zeros((0,), dt))
    made = (lambda arr: rebatch(arr, A)) if batched else _registry.Tensor._make
    if driver == "gels":
        rank_t = _registry.Tensor._make(xp.zeros((0,), xp.int64))
    else:
        rank_t = made(xp.asarray(rank))
    sv = made(s) if driver in ("gelsd", "gelss") else empty
    residuals = empty
    if driver != "gelsy" and m > n and bool((rank == n).all()):
        r = matmul(A, X) - B
        residuals = _R.sum(r * r, -2)
        if vector:
            residuals = _M.squeeze(residuals, -1)
    return _lstsq_result(_M.squeeze(X, -1) if vector else X, residuals, rank_t, sv)


# --- products ----------------------------------------------------------------------------
def cross(input, other, *, dim=-1):
    """As ``torch.linalg.cross``: the 3-vector cross product along ``dim`` (broadcasting)."""
    name = "linalg.cross"
    if input.ndim != other.ndim:
        raise RuntimeError(f"{name}: inputs must have the same number of dimensions (got "
                           f"{input.ndim} and {other.ndim})")
    d = _M._dim(dim, input.ndim, name)
    if input.shape[d] != 3 or other.shape[d] != 3:
        raise RuntimeError(f"{name}: inputs dimension {dim} must have length 3. Got "
                           f"{input.shape[d]} and {other.shape[d]}")
    dt = dtypes.result_type(input, other)
    input, other = (x if x.dtype is dt else _E.to_dtype(x, dtype=dt) for x in (input, other))
    if tuple(input.shape) != tuple(other.shape):
        input, other = _M.broadcast_tensors(input, other)
    return _D.cross_op(input, other, dim=d)


def matrix_power(A, n):
    """As ``torch.linalg.matrix_power``: ``A`` to the integer power ``n`` by repeated squaring
    (``n < 0`` inverts first; ``n = 0`` gives the identity)."""
    _check_square_any("linalg.matrix_power", _tensor(A, "linalg.matrix_power"))
    n = operator.index(n)
    if n == 0:  # the identity, recorded with a zero gradient as PyTorch's copy_ records it
        eye = xp.broadcast_to(xp.eye(A.shape[-1], dtype=A._data.dtype), A.shape)
        return _E.where(xp.ones(A.shape, bool), eye, A)
    if n < 0:
        A = inv(A)
        n = -n
    if n == 1:
        return _C.clone(A)
    if n == 2:
        return matmul(A, A)
    if n == 3:
        return matmul(matmul(A, A), A)
    z = result = None
    while n > 0:
        bit, n = n % 2, n // 2
        z = A if z is None else matmul(z, z)
        if bit:
            result = z if result is None else matmul(result, z)
    return result


def _check_square_any(name, A):
    if A.ndim < 2:
        raise RuntimeError(f"{name}: The input tensor A must have at least 2 dimensions.")
    if A.shape[-1] != A.shape[-2]:
        raise RuntimeError(f"{name}: A must be batches of square matrices, but they are "
                           f"{A.shape[-2]} by {A.shape[-1]} matrices")


def multi_dot(tensors):
    """As ``torch.linalg.multi_dot``: the chain product in the cheapest order; the first and
    last may be 1-D (a row and a column vector)."""
    tensors = list(tensors)
    if len(tensors) < 2:
        raise RuntimeError(f"multi_dot(): expected at least 2 tensors but got {len(tensors)}")
    first, last = tensors[0].ndim, tensors[-1].ndim
    for i, t in enumerate(tensors):
        want = (1, 2) if i in (0, len(tensors) - 1) else (2,)
        if t.ndim not in want:
            where = "first" if i == 0 else "last" if i == len(tensors) - 1 else None
            raise RuntimeError(
                f"multi_dot(): the {where} tensor must be 1D or 2D but got {t.ndim}D"
                if where else f"multi_dot(): tensor {i} must be 2D but got {t.ndim}D")
    dt = tensors[0].dtype
    for t in tensors[1:]:
        if t.dtype is not dt:
            raise RuntimeError(f"multi_dot(): all tensors must have be the same dtype but tensor "
                               f"0 is {dt} and tensor {tensors.index(t)} {t.dtype}")
    mats = list(tensors)
    if first == 1:
        mats[0] = _unsqueeze(mats[0], 0)
    if last == 1:
        mats[-1] = _unsqueeze(mats[-1], -1)
    for i in range(len(mats) - 1):
        if mats[i].shape[1] != mats[i + 1].shape[0]:
            raise RuntimeError(f"multi_dot(): tensors {i} and {i + 1} with shapes "
                               f"{tuple(tensors[i].shape)} and {tuple(tensors[i + 1].shape)} "
                               "cannot be multiplied")
    out = _chain(mats)
    if first == 1:
        out = _M.squeeze(out, 0)
    if last == 1:
        out = _M.squeeze(out, -1)
    return out


def _chain(mats):
    n = len(mats)
    if n == 2:
        return matmul(mats[0], mats[1])
    p = [mats[0].shape[0]] + [m.shape[1] for m in mats]
    if n == 3:  # PyTorch's two-way comparison
        a, b, c, d = p
        if a * c * (b + d) > b * d * (a + c):
            return matmul(mats[0], matmul(mats[1], mats[2]))
        return matmul(matmul(mats[0], mats[1]), mats[2])
    cost = [[0] * n for _ in range(n)]
    split = [[0] * n for _ in range(n)]
    for length in range(1, n):
        for i in range(n - length):
            j = i + length
            cost[i][j] = None
            for k in range(i, j):
                q = cost[i][k] + cost[k + 1][j] + p[i] * p[k + 1] * p[j + 1]
                if cost[i][j] is None or q < cost[i][j]:
                    cost[i][j], split[i][j] = q, k

    def product(i, j):
        if i == j:
            return mats[i]
        k = split[i][j]
        return matmul(product(i, k), product(k + 1, j))

    return product(0, n - 1)


def vecdot(x, y, *, dim=-1):
    """As ``torch.linalg.vecdot``: ``sum(x * y, dim)`` with broadcasting."""
    prod = _E.mul(x, y)
    return _R.sum(prod, _M._dim(dim, prod.ndim, "linalg.vecdot"))


def diagonal(A, *, offset=0, dim1=-2, dim2=-1):
    """As ``torch.linalg.diagonal``: ``torch.diagonal`` with the last two dims by default."""
    return _S.diagonal(A, offset, dim1, dim2)


# --- top-level matrix functions (tapegrad.det, tapegrad.trace, ...) -----------------------
def _det(input):
    """As ``torch.det``: ``torch.linalg.det``."""
    return det(input)


def inverse(input):
    """As ``torch.inverse``: ``torch.linalg.inv``."""
    return inv(input)


def _cholesky(input, upper=False):
    """As ``torch.cholesky`` (deprecated in PyTorch for ``torch.linalg.cholesky``)."""
    warnings.warn("torch.cholesky is deprecated in favor of torch.linalg.cholesky and will be "
                  "removed in a future PyTorch release.", UserWarning, stacklevel=2)
    return cholesky(input, upper=upper)


def logdet(input):
    """As ``torch.logdet``: ``log(det(A))`` (nan for a negative determinant, -inf for 0)."""
    sign, logabs = slogdet(input)
    nan = xp.asarray(math.nan, dtype=input._data.dtype)
    return _E.where(sign < 0, nan, logabs)


def _slogdet(input):
    """As ``torch.slogdet``: ``torch.linalg.slogdet``."""
    return slogdet(input)


def trace(input):
    """As ``torch.trace``: the sum of the main diagonal of a 2-D tensor."""
    if input.ndim != 2:
        raise RuntimeError(f"trace: expected a matrix, but got tensor with dim {input.ndim}")
    return _R.sum(_S.diagonal(input, 0, 0, 1))


def kron(input, other):
    """As ``torch.kron``: the Kronecker product (dims padded on the left to match)."""
    nd = builtins.max(input.ndim, other.ndim)
    a_shape = (1,) * (nd - input.ndim) + tuple(input.shape)
    b_shape = (1,) * (nd - other.ndim) + tuple(other.shape)
    a = _M.reshape(input, [d for n in a_shape for d in (n, 1)])
    b = _M.reshape(other, [d for n in b_shape for d in (1, n)])
    return _M.reshape(_E.mul(a, b), [x * y for x, y in zip(a_shape, b_shape)])


_CDIST_MODES = ("use_mm_for_euclid_dist_if_necessary", "use_mm_for_euclid_dist",
                "donot_use_mm_for_euclid_dist")


def cdist(x1, x2, p=2.0, compute_mode="use_mm_for_euclid_dist_if_necessary"):
    """As ``torch.cdist``: the ``p``-norm distance between each row of ``x1`` (..., P, M) and
    each row of ``x2`` (..., R, M). Euclidean distances between more than 25 rows use
    PyTorch's matrix-product formula (as its default ``compute_mode``)."""
    for i, x in enumerate((x1, x2), 1):
        if x.ndim < 2:
            raise RuntimeError(f"cdist only supports at least 2D tensors, X{i} got: {x.ndim}D")
        if x._data.dtype.kind in "iub":
            raise RuntimeError(f"cdist only supports floating-point dtypes, X{i} got: "
                               f"{_D._torch_name(x.dtype)}")
    if x1.shape[-1] != x2.shape[-1]:
        raise RuntimeError(f"X1 and X2 must have the same number of columns. X1: "
                           f"{x1.shape[-1]} X2: {x2.shape[-1]}")
    if p < 0:
        raise RuntimeError("cdist only supports non-negative p values")
    if compute_mode not in _CDIST_MODES:
        raise ValueError(f"{compute_mode} is not a valid value for compute_mode")
    x1, x2 = _same_float("cdist", x1, x2)
    x1, x2 = _broadcast_batch("cdist", x1, x2)
    rows1, rows2 = x1.shape[-2], x2.shape[-2]
    use_mm = p == 2 and (compute_mode == "use_mm_for_euclid_dist" or
                         compute_mode == _CDIST_MODES[0] and (rows1 > 25 or rows2 > 25))
    if use_mm:
        n1 = _R.sum(x1 * x1, -1, keepdim=True)
        n2 = _R.sum(x2 * x2, -1, keepdim=True)
        ones1 = _registry.Tensor._make(xp.ones(tuple(n1.shape), x1._data.dtype))
        ones2 = _registry.Tensor._make(xp.ones(tuple(n2.shape), x2._data.dtype))
        left = _M.cat([x1 * -2, n1, ones1], -1)
        right = _M.cat([x2, ones2, n2], -1)
        squared = matmul(left, right.mT)
        return _E.sqrt(_E.clamp_min(squared, 1e-30))
    diff = _unsqueeze(x1, -2) - _unsqueeze(x2, -3)
    return _R.norm(diff, p=p, dim=-1)


def pinverse(input, rcond=1e-15):
    """As ``torch.pinverse``: ``torch.linalg.pinv(input, rtol=rcond)``."""
    return pinv(input, rtol=rcond)


def _matrix_power(input, n):
    return matrix_power(input, n)


def _cross(input, other, dim=None):
    """As ``torch.cross``: with ``dim=None`` the first dim of size 3 (PyTorch warns)."""
    if dim is None:
        shape = xp.broadcast_shapes(tuple(input.shape), tuple(other.shape))
        dims = [i for i, n in enumerate(shape) if n == 3]
        if not dims:
            raise RuntimeError(f"no dimension of size 3 in input (shapes {tuple(input.shape)} "
                               f"and {tuple(other.shape)})")
        warnings.warn("Using torch.cross without specifying the dim arg is deprecated.\n"
                      "Please either pass the dim explicitly or simply use torch.linalg.cross."
                      "\nThe default value of dim will change to agree with that of "
                      "linalg.cross in a future release.", UserWarning, stacklevel=2)
        dim = dims[0] - len(shape)
    return cross(input, other, dim=dim)


def _torch_svd(input, some=True, compute_uv=True):
    """As ``torch.svd``: ``(U, S, V)`` (V, not Vh; reduced unless ``some=False``)."""
    U, S, Vh = svd(input, full_matrices=not some)
    if not compute_uv:
        zeros = xp.zeros
        m, n = input.shape[-2], input.shape[-1]
        dt = input._data.dtype
        make = _registry.Tensor._make
        return _torch_svd_result(make(zeros(tuple(input.shape[:-2]) + (m, m), dt)),
                                 S.detach(),
                                 make(zeros(tuple(input.shape[:-2]) + (n, n), dt)))
    return _torch_svd_result(U, S, Vh.mT)


def _torch_qr(input, some=True):
    """As ``torch.qr``: ``torch.linalg.qr`` with mode 'reduced' (``some``) or 'complete'."""
    return qr(input, mode="reduced" if some else "complete")


def chain_matmul(*matrices):
    """As ``torch.chain_matmul`` (deprecated in PyTorch): ``torch.linalg.multi_dot``."""
    if len(matrices) == 1:
        return matrices[0]
    return multi_dot(matrices)


TOPLEVEL = {"det": _det, "inverse": inverse, "cholesky": _cholesky, "logdet": logdet,
            "slogdet": _slogdet, "trace": trace, "kron": kron, "cdist": cdist,
            "pinverse": pinverse, "matrix_power": _matrix_power, "cross": _cross,
            "svd": _torch_svd, "qr": _torch_qr, "chain_matmul": chain_matmul}
# Tensor methods PyTorch has for these (x.det(), x.inverse(), x.trace()...)
TENSOR_METHODS = {"det": _det, "inverse": inverse, "cholesky": _cholesky, "logdet": logdet,
                  "slogdet": _slogdet, "trace": trace, "kron": kron, "pinverse": pinverse,
                  "matrix_power": _matrix_power, "cross": _cross, "svd": _torch_svd,
                  "qr": _torch_qr}
for _name, _fn in TENSOR_METHODS.items():
    setattr(_registry.Tensor, _name, _fn)
