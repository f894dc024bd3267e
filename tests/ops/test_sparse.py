"""Sparse COO tensors against PyTorch: values and gradients (check_op), coalescing and merge
rules, printing, errors, and a 2-layer GCN trained for 30 steps from the same weights."""
import numpy as np
import pytest
import torch

import tapegrad
from helpers import check_op, assert_close

pytestmark = [pytest.mark.filterwarnings("ignore:Sparse invariant checks"),
              pytest.mark.filterwarnings("ignore:Sparse CSR tensor support")]

# duplicates at (1, 2) and (3, 0); rows unsorted: an uncoalesced 5 x 4 matrix
IDX = np.array([[1, 0, 1, 3, 4, 3, 2], [2, 1, 2, 0, 3, 0, 2]])
NNZ = IDX.shape[1]


def sp(T, v, idx=IDX, size=(5, 4)):
    return T.sparse_coo_tensor(idx, v, size)


# --- values and gradients: fn(T, *inputs) run with tapegrad and torch -------------------------
OPS = [
    ("sparse.mm", lambda T, i, v, d: T.sparse.mm(sp(T, v, i), d), [IDX, (NNZ,), (4, 3)]),
    ("mm", lambda T, i, v, d: T.mm(sp(T, v, i), d), [IDX, (NNZ,), (4, 3)]),
    ("spmm", lambda T, i, v, d: T.spmm(sp(T, v, i), d), [IDX, (NNZ,), (4, 3)]),
    ("matmul", lambda T, i, v, d: T.matmul(sp(T, v, i), d), [IDX, (NNZ,), (4, 3)]),
    ("@", lambda T, i, v, d: sp(T, v, i) @ d, [IDX, (NNZ,), (4, 3)]),
    ("matmul-vector", lambda T, i, v, d: T.matmul(sp(T, v, i), d), [IDX, (NNZ,), (4,)]),
    ("dense@sparse", lambda T, i, v, d: d @ sp(T, v, i), [IDX, (NNZ,), (2, 5)]),
    ("mm(dense,sparse)", lambda T, i, v, d: T.mm(d, sp(T, v, i)), [IDX, (NNZ,), (2, 5)]),
    ("sparse.mm(t)", lambda T, i, v, d: T.sparse.mm(sp(T, v, i).t(), d), [IDX, (NNZ,), (5, 2)]),
    ("transpose", lambda T, i, v, d: T.sparse.mm(sp(T, v, i).transpose(1, 0), d),
     [IDX, (NNZ,), (5, 2)]),
    ("to_dense", lambda T, i, v: sp(T, v, i).to_dense(), [IDX, (NNZ,)]),
    ("coalesce.values", lambda T, i, v: sp(T, v, i).coalesce().values(), [IDX, (NNZ,)]),
    ("sparse.sum", lambda T, i, v: T.sparse.sum(sp(T, v, i)), [IDX, (NNZ,)]),
    ("sparse.sum(dim=1)", lambda T, i, v: T.sparse.sum(sp(T, v, i), dim=1).to_dense(),
     [IDX, (NNZ,)]),
    ("sparse.sum(dim=0)", lambda T, i, v: T.sparse.sum(sp(T, v, i), 0).values(), [IDX, (NNZ,)]),
    ("sparse.sum(dim=(0,1))", lambda T, i, v: T.sparse.sum(sp(T, v, i), (0, 1)), [IDX, (NNZ,)]),
    ("Tensor.sum", lambda T, i, v: sp(T, v, i).sum(), [IDX, (NNZ,)]),
    ("mul-scalar", lambda T, i, v: (sp(T, v, i) * 2.5).to_dense(), [IDX, (NNZ,)]),
    ("rmul-scalar", lambda T, i, v: (-3 * sp(T, v, i)).coalesce().values(), [IDX, (NNZ,)]),
    ("div-scalar", lambda T, i, v: (sp(T, v, i) / 4).to_dense(), [IDX, (NNZ,)]),
    ("neg", lambda T, i, v: (-sp(T, v, i)).to_dense(), [IDX, (NNZ,)]),
    ("add", lambda T, i, v, w: (sp(T, v, i) + sp(T, w, T.flip(i, [1]))).to_dense(),
     [IDX, (NNZ,), (NNZ,)]),
    ("sub-coalesced", lambda T, i, v, w: (sp(T, v, i).coalesce() - sp(T, w, i).coalesce())
     .values(), [IDX, (NNZ,), (NNZ,)]),
    ("dense+sparse", lambda T, i, v, d: d + sp(T, v, i), [IDX, (NNZ,), (5, 4)]),
    ("dense-sparse", lambda T, i, v, d: d - sp(T, v, i), [IDX, (NNZ,), (5, 4)]),
    ("sparse@sparse", lambda T, i, v, w: T.sparse.mm(sp(T, v, i), sp(T, w, i).t()).to_dense(),
     [IDX, (NNZ,), (NNZ,)]),
    ("to_sparse", lambda T, x, m, d: T.sparse.mm((x * m).to_sparse(), d),
     [(4, 5), (np.arange(20).reshape(4, 5) % 3 == 0).astype(np.float64), (5, 2)]),
    ("double", lambda T, i, v, d: T.sparse.mm(sp(T, v, i).double(), d.double()),
     [IDX, (NNZ,), (4, 3)]),
]


@pytest.mark.parametrize("name,fn,specs", OPS, ids=[o[0] for o in OPS])
def test_values_and_gradients(name, fn, specs):
    """float64 values and gradients at 1e-12, float32, gradcheck and gradgradcheck."""
    if name == "to_sparse":  # the mask is a constant: wrap it so it never requires grad
        mask = specs[1]
        check_op(lambda T, x, d: fn(T, x, T.tensor(mask, dtype=x.dtype), d),
                 [specs[0], specs[2]])
        return
    check_op(fn, specs)


def test_sparse_times_dense():
    """sparse * dense (same shape) is sparse; PyTorch's gradient for the dense operand is
    sparse, tapegrad's dense: compare it densified."""
    v = _pair()
    d = np.random.default_rng(2).standard_normal((5, 4))
    w = np.random.default_rng(3).standard_normal((5, 4))
    res = []
    for T in (tapegrad, torch):
        vv, dd = T.tensor(v, requires_grad=True), T.tensor(d, requires_grad=True)
        prod = T.sparse_coo_tensor(T.tensor(IDX), vv, (5, 4)) * dd
        assert prod.is_sparse and not prod.is_coalesced()
        (prod.to_dense() * T.tensor(w)).sum().backward()
        res.append((prod._values(), vv.grad, dd.grad.to_dense()))
    for a, b in zip(*res):
        assert_close(a, b)


def test_hybrid_values_to_dense_and_sum():
    """Values with a dense dim (nnz, 3): construction, coalesce, to_dense and sums."""
    check_op(lambda T, i, v: sp(T, v, i, size=(5, 4, 3)).to_dense(), [IDX, (NNZ, 3)])
    check_op(lambda T, i, v: T.sparse.sum(sp(T, v, i, size=(5, 4, 3)), dim=(1, 2)).to_dense(),
             [IDX, (NNZ, 3)])
    check_op(lambda T, i, v: T.sparse.sum(sp(T, v, i, size=(5, 4, 3)), dim=2).coalesce()
             .values(), [IDX, (NNZ, 3)])


# --- a sparse leaf that requires grad ---------------------------------------------------------
def _pair(idx=IDX, seed=0, dtype=np.float64):
    rng = np.random.default_rng(seed)
    v = rng.standard_normal(idx.shape[1]).astype(dtype)
    return v


def test_sparse_mm_gradient_of_a_sparse_leaf():
    """torch.sparse.mm gives a leaf a sparse, coalesced gradient at its own entries."""
    v = _pair()
    d = np.random.default_rng(1).standard_normal((4, 3))
    grads = []
    for T in (tapegrad, torch):
        s = T.sparse_coo_tensor(T.tensor(IDX), T.tensor(v), (5, 4), requires_grad=True)
        assert s.is_leaf and s.requires_grad and s.grad is None
        assert not s._values().requires_grad  # _values() is detached, as in PyTorch
        dd = T.tensor(d, requires_grad=True)
        T.sparse.mm(s, dd).sum().backward()
        grads.append((s.grad, dd.grad))
    (g, gd), (tg, tgd) = grads
    assert g.is_sparse  # PyTorch flags it uncoalesced here (sorted, unique all the same)
    np.testing.assert_array_equal(g._indices().numpy(), tg._indices().numpy())
    assert_close(g._values(), tg._values())
    assert_close(gd, tgd)


def test_leaf_gradient_through_to_dense_and_sum():
    v = _pair(seed=3)
    w = np.arange(20.0).reshape(5, 4)
    out = []
    for T in (tapegrad, torch):
        s = T.sparse_coo_tensor(T.tensor(IDX), T.tensor(v), (5, 4), requires_grad=True)
        (s.to_dense() * T.tensor(w)).sum().backward()
        out.append(s.grad)
        s.grad = None
        assert s.grad is None
    np.testing.assert_array_equal(out[0]._indices().numpy(), out[1]._indices().numpy())
    assert_close(out[0]._values(), out[1]._values())


def test_values_built_from_a_tensor_that_requires_grad():
    """The values tensor gets the gradient at each entry's position (duplicates equal)."""
    v = _pair(seed=4)
    d = np.random.default_rng(5).standard_normal((4, 2))
    grads = []
    for T in (tapegrad, torch):
        vv = T.tensor(v, requires_grad=True)
        s = T.sparse_coo_tensor(T.tensor(IDX), vv, (5, 4))
        assert s.requires_grad and not s.is_leaf
        assert type(s.grad_fn).__name__.startswith("SparseCooTensorWithDimsAndTensorsBackward") \
            or s.grad_fn.name() == "SparseCooTensorWithDimsAndTensorsBackward"
        T.mm(s, T.tensor(d)).pow(2).sum().backward()
        grads.append(vv.grad)
    assert_close(grads[0], grads[1])


# --- coalescing and merging ---------------------------------------------------------------------
def _random_coo(rng, n, shape):
    idx = np.stack([rng.integers(0, m, n) for m in shape])
    return idx, rng.standard_normal(n)


def _same(a, b):
    assert a.is_sparse and b.is_sparse
    assert tuple(a.shape) == tuple(b.shape)
    assert a._nnz() == b._nnz(), (a._nnz(), b._nnz())
    assert a.is_coalesced() == b.is_coalesced()
    np.testing.assert_array_equal(a._indices().numpy(), b._indices().numpy())
    assert_close(a._values(), b._values())


@pytest.mark.parametrize("seed", range(4))
def test_coalesce_sums_duplicates_and_sorts(seed):
    rng = np.random.default_rng(seed)
    idx, v = _random_coo(rng, 40, (4, 5, 3))
    a = tapegrad.sparse_coo_tensor(idx, v, (4, 5, 3))
    b = torch.sparse_coo_tensor(torch.tensor(idx), torch.tensor(v), (4, 5, 3))
    _same(a, b)
    _same(a.coalesce(), b.coalesce())
    assert a.coalesce().coalesce()._nnz() == b.coalesce()._nnz()
    c = a.coalesce()
    assert c.coalesce() is c
    np.testing.assert_array_equal(c.indices().numpy(), b.coalesce().indices().numpy())
    assert_close(c.values(), b.coalesce().values())


@pytest.mark.parametrize("ca,cb", [(False, False), (False, True), (True, False), (True, True)])
def test_add_merges_as_pytorch(ca, cb):
    """sparse + sparse: PyTorch's merge of the two entry lists, coalesced only when both are."""
    rng = np.random.default_rng(7)
    out = []
    for T in (tapegrad, torch):
        rng = np.random.default_rng(7)
        ia, va = _random_coo(rng, 12, (3, 4))
        ib, vb = _random_coo(rng, 9, (3, 4))
        a = T.sparse_coo_tensor(T.tensor(ia), T.tensor(va), (3, 4))
        b = T.sparse_coo_tensor(T.tensor(ib), T.tensor(vb), (3, 4))
        a = a.coalesce() if ca else a
        b = b.coalesce() if cb else b
        out.append((a + b, a - b, b + a, a + a))
    for x, y in zip(*out):
        _same(x, y)


def test_coalesced_flags_and_structure_of_results():
    v = _pair()
    for T in (tapegrad, torch):
        s = T.sparse_coo_tensor(T.tensor(IDX), T.tensor(v), (5, 4))
        c = s.coalesce()
        flags = [s.is_coalesced(), c.is_coalesced(), c.t().is_coalesced(),
                 c.transpose(0, 0).is_coalesced(), (c * 2).is_coalesced(),
                 (s * 2).is_coalesced(), s.detach().is_coalesced(),
                 T.tensor([[0, 1.0], [2, 0]]).to_sparse().is_coalesced(),
                 T.sparse_coo_tensor([[0], [1]], [1.0], (2, 2)).is_coalesced(),
                 T.sparse.sum(s, 1).is_coalesced()]
        if T is tapegrad:
            mine = flags
        else:
            assert mine == flags
    a = tapegrad.sparse_coo_tensor(IDX, v, (5, 4))
    b = torch.sparse_coo_tensor(torch.tensor(IDX), torch.tensor(v), (5, 4))
    _same(a.t(), b.t())
    _same(a * 3, b * 3)
    _same(tapegrad.sparse.sum(a, 0), torch.sparse.sum(b, 0))
    _same(tapegrad.sparse.mm(a, a.t()), torch.sparse.mm(b, b.t()))
    x = np.array([[0, 1.5, 0], [0, 0, 0], [-2, 0, 3]])
    _same(tapegrad.tensor(x).to_sparse(), torch.tensor(x).to_sparse())
    _same(tapegrad.zeros(2, 3).to_sparse(), torch.zeros(2, 3).to_sparse())


def test_layout_attributes():
    s = tapegrad.sparse_coo_tensor(IDX, _pair(), (5, 4))
    d = tapegrad.ones(2, 2)
    assert s.layout is tapegrad.sparse_coo and d.layout is tapegrad.strided
    assert repr(tapegrad.sparse_coo) == "tapegrad.sparse_coo"
    assert repr(tapegrad.strided) == "tapegrad.strided"
    assert isinstance(s, tapegrad.Tensor) and s.is_sparse and not d.is_sparse
    assert d.to_dense() is d and s.to_sparse() is s
    assert s.shape == (5, 4) and s.dim() == 2 and s.numel() == 20 and len(s) == 5
    assert s.dtype is tapegrad.float64 and s.sparse_dim() == 2 and s.dense_dim() == 0
    assert s._nnz() == NNZ
    t = torch.sparse_coo_tensor(torch.tensor(IDX), torch.tensor(_pair()), (5, 4))
    assert s.to(tapegrad.float32).dtype is tapegrad.float32
    assert str(s.float().dtype).split(".")[-1] == str(t.float().dtype).split(".")[-1]
    # size inferred from the indices (and the values' dense dims)
    inferred = tapegrad.sparse_coo_tensor([[0, 2], [1, 0]], [[1.0, 2.0], [3.0, 4.0]])
    assert inferred.shape == tuple(torch.sparse_coo_tensor([[0, 2], [1, 0]],
                                                           [[1.0, 2.0], [3.0, 4.0]]).shape)


# --- printing -----------------------------------------------------------------------------------
def _torch_repr(t):
    return repr(t).replace("torch.", "tapegrad.").replace("Backward0>", "Backward>")


@pytest.mark.parametrize("case", ["float64", "float32", "int", "empty", "coalesced", "hybrid",
                                  "requires_grad", "grad_fn", "wide"])
def test_printing_as_pytorch(case):
    v = np.array([1.0, 2.5, -3.0, 4.0, 5.0, 6.0, 7.0])
    built = []
    for T in (tapegrad, torch):
        if case == "float64":
            s = T.sparse_coo_tensor(T.tensor(IDX), T.tensor(v), (5, 4))
        elif case == "float32":
            s = T.sparse_coo_tensor(T.tensor(IDX), T.tensor(v, dtype=T.float32), (5, 4))
        elif case == "int":
            s = T.sparse_coo_tensor(T.tensor(IDX), T.tensor([1, 2, 3, 4, 5, 6, 7]), (5, 4))
        elif case == "empty":
            s = T.zeros(3, 4).to_sparse()
        elif case == "coalesced":
            s = T.sparse_coo_tensor(T.tensor(IDX), T.tensor(v * 1e-5), (5, 4)).coalesce()
        elif case == "hybrid":
            s = T.sparse_coo_tensor(T.tensor(IDX), T.tensor(np.arange(14.0).reshape(7, 2)),
                                    (5, 4, 2))
        elif case == "requires_grad":
            s = T.sparse_coo_tensor(T.tensor(IDX), T.tensor(v, dtype=T.float32), (5, 4),
                                    requires_grad=True)
        elif case == "grad_fn":
            s = T.sparse_coo_tensor(T.tensor(IDX), T.tensor(v, requires_grad=True), (5, 4))
        else:
            n = 40
            s = T.sparse_coo_tensor(T.tensor(np.stack([np.arange(n), np.arange(n)[::-1]])),
                                    T.tensor(np.linspace(-1, 1, n)), (n, n))
        built.append(s)
    assert repr(built[0]) == _torch_repr(built[1])
    assert str(built[0]) == repr(built[0])


# --- errors -------------------------------------------------------------------------------------
def test_uncoalesced_indices_and_values_raise_as_pytorch():
    s = tapegrad.sparse_coo_tensor(IDX, _pair(), (5, 4))
    with pytest.raises(RuntimeError, match="Cannot get indices on an uncoalesced tensor"):
        s.indices()
    with pytest.raises(RuntimeError, match="Cannot get values on an uncoalesced tensor"):
        s.values()
    assert s._indices().shape == (2, NNZ) and s._values().shape == (NNZ,)


REFUSED = [
    ("exp", lambda T, s: T.exp(s)),
    ("cos", lambda T, s: s.cos()),
    ("sigmoid", lambda T, s: T.sigmoid(s)),
    ("reshape", lambda T, s: s.reshape(20)),
    ("softmax", lambda T, s: T.softmax(s, 1)),
    ("flip", lambda T, s: T.flip(s, [0])),
    ("cumsum", lambda T, s: T.cumsum(s, 0)),
]


@pytest.mark.parametrize("name,fn", REFUSED, ids=[r[0] for r in REFUSED])
def test_ops_without_sparse_support_raise_naming_op_and_layout(name, fn):
    s = tapegrad.sparse_coo_tensor(IDX, _pair(), (5, 4))
    with pytest.raises(RuntimeError) as info:
        fn(tapegrad, s)
    msg = str(info.value)
    assert "sparse_coo" in msg and name in msg, msg
    # PyTorch refuses these too
    t = torch.sparse_coo_tensor(torch.tensor(IDX), torch.tensor(_pair()), (5, 4))
    with pytest.raises((RuntimeError, NotImplementedError)):
        fn(torch, t)


NOT_YET = [  # PyTorch has sparse kernels for these; tapegrad refuses (docs/differences.md)
    ("relu", lambda s: tapegrad.relu(s)),
    ("mul", lambda s: s * s),
    ("getitem", lambda s: s[0]),
    ("cat", lambda s: tapegrad.cat([s, s])),
]


@pytest.mark.parametrize("name,fn", NOT_YET, ids=[r[0] for r in NOT_YET])
def test_sparse_ops_tapegrad_lacks_raise_clearly(name, fn):
    s = tapegrad.sparse_coo_tensor(IDX, _pair(), (5, 4))
    with pytest.raises(RuntimeError) as info:
        fn(s)
    msg = str(info.value)
    assert "sparse_coo" in msg and name in msg, msg


def test_errors_name_the_op_and_shapes():
    s = tapegrad.sparse_coo_tensor(IDX, _pair(), (5, 4))
    with pytest.raises(RuntimeError, match=r"mm: shapes \(5, 4\) \(sparse_coo\) and \(3, 2\)"):
        tapegrad.sparse.mm(s, tapegrad.ones(3, 2, dtype=tapegrad.float64))
    with pytest.raises(RuntimeError, match="same dtype"):
        tapegrad.mm(s, tapegrad.ones(4, 2))
    with pytest.raises(RuntimeError, match="add.sparse, dense. is not supported"):
        s + tapegrad.ones(5, 4, dtype=tapegrad.float64)
    with pytest.raises(RuntimeError, match="same size"):
        s + s.t()
    with pytest.raises(RuntimeError, match="same nnz"):
        tapegrad.sparse_coo_tensor(IDX, [1.0, 2.0], (5, 4))
    with pytest.raises(RuntimeError, match="len.size. == sparse_dim . dense_dim"):
        tapegrad.sparse_coo_tensor(IDX, _pair(), (5,))
    with pytest.raises(RuntimeError, match="size is inconsistent with indices"):
        tapegrad.sparse_coo_tensor(IDX, _pair(), (3, 4))
    with pytest.raises(TypeError, match="Sparse layout tensor to numpy"):
        s.numpy()
    with pytest.raises(RuntimeError, match="mul_: in-place"):
        s.mul_(2)
    with pytest.raises(RuntimeError, match="backward"):
        s.backward()
    leaf = tapegrad.sparse_coo_tensor(IDX, _pair(), (5, 4), requires_grad=True)
    with pytest.raises(RuntimeError, match="mm: the sparse_coo leaf"):
        tapegrad.mm(leaf, tapegrad.ones(4, 2, dtype=tapegrad.float64))
    with tapegrad.no_grad():  # no gradient wanted: the product is fine
        tapegrad.mm(leaf, tapegrad.ones(4, 2, dtype=tapegrad.float64))


# --- a 2-layer GCN (Kipf & Welling) trained for 30 steps --------------------------------------
def _normalized_adjacency(rng, n, p):
    a = (rng.random((n, n)) < p).astype(np.float64)
    a = np.triu(a, 1)
    a = a + a.T + np.eye(n)
    deg = a.sum(1)
    norm = a / np.sqrt(deg)[:, None] / np.sqrt(deg)[None, :]
    idx = np.stack(np.nonzero(norm))
    return idx, norm[tuple(idx)]


def _gcn_run(T, idx, vals, n, feats, labels, train, weights, steps=30):
    adj = T.sparse_coo_tensor(T.tensor(idx), T.tensor(vals), (n, n)).coalesce()
    x = T.tensor(feats)
    y = T.tensor(labels)
    params = [T.nn.Parameter(T.tensor(w)) for w in weights]
    w1, b1, w2, b2 = params
    opt = T.optim.Adam(params, lr=0.01, weight_decay=5e-4)
    mask = T.tensor(train)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        h = T.relu(T.spmm(adj, x @ w1) + b1)
        out = T.sparse.mm(adj, h @ w2) + b2
        loss = T.nn.functional.cross_entropy(out[mask], y[mask])
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, [p.detach().numpy().copy() for p in params], out.detach().numpy()


def test_gcn_trajectory_matches_pytorch():
    rng = np.random.default_rng(0)
    n, f, hidden, classes = 40, 12, 16, 3
    idx, vals = _normalized_adjacency(rng, n, 0.1)
    feats = rng.standard_normal((n, f))
    labels = rng.integers(0, classes, n)
    train = np.zeros(n, dtype=bool)
    train[:25] = True
    s1, s2 = 1 / np.sqrt(hidden), 1 / np.sqrt(classes)
    weights = [rng.uniform(-s1, s1, (f, hidden)), rng.uniform(-s1, s1, hidden),
               rng.uniform(-s2, s2, (hidden, classes)), rng.uniform(-s2, s2, classes)]
    ours = _gcn_run(tapegrad, idx, vals, n, feats, labels, train, weights)
    theirs = _gcn_run(torch, idx, vals, n, feats, labels, train, weights)
    np.testing.assert_allclose(ours[0], theirs[0], rtol=1e-12)
    assert ours[0][-1] < ours[0][0] - 0.05  # it learns
    for a, b in zip(ours[1], theirs[1]):
        np.testing.assert_allclose(a, b, rtol=1e-11, atol=1e-13)
    np.testing.assert_allclose(ours[2], theirs[2], rtol=1e-11, atol=1e-13)
