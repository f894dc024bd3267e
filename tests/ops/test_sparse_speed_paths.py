"""The planned row sums of repeated sparse @ dense products (``sparse.coo._Passes``): the same
bits as the one-shot bincount path, forward and backward, and PyTorch's values."""
import gc
import weakref

import numpy as np
import pytest
import torch

import tapegrad as tg
from tapegrad.sparse import coo


def _graph(rng, n, edges, dtype):
    """A random symmetric graph with self loops (every row has entries, some many)."""
    src, dst = rng.integers(0, n, edges), rng.integers(0, n, edges)
    rows = np.concatenate([src, dst, np.arange(n)])
    cols = np.concatenate([dst, src, np.arange(n)])
    vals = rng.standard_normal(rows.shape[0]).astype(dtype)
    return np.stack([rows, cols]), vals


def _bits(a):
    a = np.ascontiguousarray(a)
    return a.view(np.uint64 if a.itemsize == 8 else np.uint32)


def _step(adj, x, gout, values_grad):
    """One product and its backward: (out, dx, dvalues or None)."""
    y = tg.sparse.mm(adj, x)
    y.backward(gout)
    dv = adj.grad.coalesce()._values().numpy().copy() if values_grad else None
    out = (y.detach().numpy().copy(), x.grad.numpy().copy(), dv)
    x.grad = None
    if values_grad:
        adj.grad = None
    return out


def _refused(*args, **kwargs):
    raise AssertionError("a planned product took the bincount path")


def _planned(adj):
    rows, cols = coo._products(adj)
    return [coo._PASSES[id(v)] for v in (rows, cols)]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("values_grad", [False, True])
def test_planned_products_are_bitwise_the_bincount_ones(dtype, values_grad, monkeypatch):
    rng = np.random.default_rng(0)
    n, width = 600, 32
    index, vals = _graph(rng, n, 3000, dtype)
    vals[index[0] == 3] = -0.0  # a row of -0.0s sums to +0.0 from bincount's 0.0 start
    index[:, 5] = (7, 9)
    vals[5] = np.inf  # inf and nan propagate the same way on both paths
    x_np = rng.standard_normal((n, width)).astype(dtype)
    gout = tg.tensor(rng.standard_normal((n, width)).astype(dtype))

    def fresh():
        adj = tg.sparse_coo_tensor(tg.tensor(index), tg.tensor(vals), (n, n)).coalesce()
        if values_grad:
            adj = adj.detach().requires_grad_(True)
        return adj

    x = tg.tensor(x_np, requires_grad=True)
    reference = _step(fresh(), x, gout, values_grad)  # a matrix used once: bincount
    adj = fresh()
    results = [_step(adj, x, gout, values_grad) for _ in range(2)]
    assert all(p.order is not None for p in _planned(adj))
    with monkeypatch.context() as m:  # planned now: no product falls back to bincount
        m.setattr(coo, "index_backward", _refused)
        results.append(_step(adj, x, gout, values_grad))
    for got in results:
        for a, b in zip(got, reference):
            if b is not None:
                np.testing.assert_array_equal(_bits(a), _bits(b))


def test_planned_vector_products_and_torch_values(monkeypatch):
    """A matrix with few entries per row and many rows plans one-column products too; its
    float64 sums agree with PyTorch's to rounding (1e-12: two terms a row, each product and
    sum rounding at 2**-53 relative, over values of order 1)."""
    rng = np.random.default_rng(1)
    n = 20000
    rows = np.concatenate([np.arange(n), np.arange(n)])
    cols = np.concatenate([rng.permutation(n), rng.permutation(n)])  # two a column too
    vals = rng.standard_normal(2 * n)
    index = np.stack([rows, cols])
    adj = tg.sparse_coo_tensor(tg.tensor(index), tg.tensor(vals), (n, n)).coalesce()
    v = rng.standard_normal(n)
    x = tg.tensor(v, requires_grad=True)
    outs = []
    for k in range(3):
        with monkeypatch.context() as m:
            if k == 2:  # planned by now (and two passes a row: worth it even one column wide)
                m.setattr(coo, "index_backward", _refused)
            y = tg.sparse.mm(adj, x.reshape(n, 1)).reshape(n)
            y.sum().backward()
        outs.append((y.detach().numpy(), x.grad.numpy().copy()))
        x.grad = None
    tadj = torch.sparse_coo_tensor(torch.tensor(index), torch.tensor(vals), (n, n),
                                   check_invariants=True).coalesce()
    tx = torch.tensor(v, requires_grad=True)
    ty = torch.sparse.mm(tadj, tx.reshape(n, 1)).reshape(n)
    ty.sum().backward()
    for out, grad in outs:
        np.testing.assert_array_equal(out, outs[0][0])
        np.testing.assert_allclose(out, ty.detach().numpy(), rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(grad, tx.grad.numpy(), rtol=1e-12, atol=1e-12)


def test_plans_are_dropped_with_their_matrix():
    rng = np.random.default_rng(2)
    index, vals = _graph(rng, 300, 1000, np.float64)
    adj = tg.sparse_coo_tensor(tg.tensor(index), tg.tensor(vals), (300, 300)).coalesce()
    x = tg.tensor(rng.standard_normal((300, 64)))
    for _ in range(2):
        tg.sparse.mm(adj, x)
    views = [weakref.ref(v) for v in coo._products(adj)]
    keys = [id(v()) for v in views]
    assert all(k in coo._PASSES for k in keys)
    del adj
    gc.collect()
    assert all(v() is None for v in views)  # the registry keeps no view alive
    assert not any(k in coo._PASSES for k in keys)
