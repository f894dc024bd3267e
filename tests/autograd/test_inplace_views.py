"""In-place ops on views, as in PyTorch: the base's history is rewritten (CopySlices), the
view's ``grad_fn`` is replayed from the base, and stale views regenerate theirs lazily."""
import numpy as np
import pytest
import torch

import tapegrad
from helpers import assert_close, check_op, check_torch

X = np.array([[0.5, -1.25, 2.0, 0.3], [1.5, 0.75, -0.3, -2.1], [0.9, -0.6, 1.1, 0.45]])
W = np.array([[1.3, -0.7, 0.2, 2.4], [-1.1, 0.6, 1.7, -0.35]])
Z = np.array([[0.2, -1.4, 0.8], [1.05, 0.35, -0.9], [-0.15, 2.2, 0.65], [0.55, -0.45, 1.6]])
S = np.array(1.35)
R = np.array([0.7, -1.9, 0.25, 1.15])

# (name, fn(T, *tensors), inputs): the function modifies views of intermediates in place
CASES = [
    ("iadd_column", lambda T, x: _iadd_column(x), [X]),
    ("rows_mul_", lambda T, x, w: _rows_mul(x, w), [X, W]),
    ("transpose_add_", lambda T, x, z: _transpose_add(x, z), [X, Z]),
    ("view_strided_zero_", lambda T, x: _strided_zero(x), [X]),
    ("getitem_getitem_copy_", lambda T, x, s: _copy_scalar(x, s), [X, S]),
    ("setitem_through_view", lambda T, x, r: _setitem_view(x, r), [X, R]),
    ("setitem_through_transpose", lambda T, x, z: _setitem_transpose(x, z), [X, Z]),
    ("reshape_view_mul_", lambda T, x: _reshape_mul(x), [X]),
    ("unsqueeze_view_sub_", lambda T, x, r: _unsqueeze_sub(x, r), [X, R]),
    ("permute_view_div_", lambda T, x, z: _permute_div(x, z), [X, Z]),
    ("chain_of_views", lambda T, x, r: _chain(x, r), [X, R]),
    ("exp_saves_output", lambda T, x: _exp_on_view(x), [X]),
    ("two_views_then_base", lambda T, x, r: _two_views(x, r), [X, R]),
    ("buffer_copy_", lambda T, x, r: _buffer_copy(T, x, r), [X, R]),
    ("vector_element_", lambda T, r: _vector_element(r), [R]),
    ("fortran_ordered_base", lambda T, z, r: _fortran_base(z, r), [Z, R]),
]


def _iadd_column(x):
    y = x * 2
    y[:, 0] += 1
    return y * y


def _rows_mul(x, w):
    y = x * 2
    y[1:].mul_(w)
    return y.sin()


def _transpose_add(x, z):
    y = x * 2
    y.T.add_(z)
    return y * x


def _strided_zero(x):
    y = x * 2
    y.view(-1)[::2].zero_()
    return y * x


def _copy_scalar(x, s):
    y = x * 2
    y[0][1].copy_(s)
    return y * y


def _setitem_view(x, r):
    y = x * 1
    v = y[1:]
    v[0] = r * r  # __setitem__ on a view
    v[1, 2:] = 0.5
    return y * x


def _setitem_transpose(x, z):
    y = x.sin()  # sin saves its input, not its output: y may be modified
    y.T[1:3] = z[1:3] * 2
    return y


def _reshape_mul(x):
    y = x + 1
    y.reshape(2, 6)[1].mul_(3)
    return y * y


def _unsqueeze_sub(x, r):
    y = x * 3
    y.unsqueeze(0)[:, 1].sub_(r * r)
    return y.cos()


def _permute_div(x, z):
    y = x * 1
    y.permute(1, 0)[1:].div_(z[1:] * z[1:] + 1)
    return y * x


def _chain(x, r):
    y = x.sin()
    y[1:].reshape(-1)[2:].reshape(2, 3).T[1:][0].mul_(r[:2])
    y.unsqueeze(1)[2, 0, ::3].add_(r[1:3])
    y.T[1:].T[0].permute(0)[::2].sub_(r[2])
    return y * y


def _exp_on_view(x):
    y = x * 0.5
    y[1].exp_()  # exp's rule reads its output: the view itself
    return y * 2


def _two_views(x, r):
    y = x * 1
    a, b = y[0], y[:, 1]
    a.mul_(r)
    b.add_(r[:3])
    y.mul_(y.detach() + 1)
    return a * b[0] + y.sum()


def _buffer_copy(T, x, r):
    buf = T.zeros(3, 4, dtype=x.dtype)
    buf[0].copy_(r)
    buf.T[2].add_(x[:, 1])
    return buf * x


def _vector_element(r):
    y = r * 1
    y[2].mul_(r[0])  # a 0-d view
    y[1].add_(y[3].detach())
    return y * r


def _fortran_base(z, r):
    y = z.T * 2  # numpy keeps the transposed layout: y's memory is in column order
    y.T.reshape(-1)[::2].mul_(r.repeat(3)[:6])  # a view only through y.T
    y.T.reshape(-1)[1::4].add_(1)
    return y * y


@pytest.mark.parametrize("name,fn,inputs", CASES, ids=[c[0] for c in CASES])
def test_inplace_on_view_matches_torch(name, fn, inputs):
    check_torch(fn, inputs)


@pytest.mark.parametrize("name,fn,inputs", [CASES[i] for i in (1, 3, 10, 13, 15)],
                         ids=[CASES[i][0] for i in (1, 3, 10, 13, 15)])
def test_inplace_on_view_gradcheck(name, fn, inputs):
    # float32 at rounding, gradcheck and gradgradcheck (the copy_slices rule is differentiable)
    check_op(fn, inputs)


def test_view_tracking_chains_to_one_base():
    y = tapegrad.tensor(X) * 1
    v = y[1:].reshape(-1)[2:].reshape(2, 3).T
    assert v._view[0] is y and len(v._view[1]) == 5
    assert v._version is y._version
    # replaying the chain on the base (or on an array) recreates the view
    np.testing.assert_array_equal(tapegrad.ops.movement.replay_view(X, v._view[1]), v.numpy())
    # a reshape numpy must copy is no view: it has its own storage and version counter
    c = y.T.reshape(-1)
    assert c._version is not y._version
    c.zero_()
    assert_close(y, X)


def test_base_and_view_grad_fns_after_inplace_on_view():
    x = tapegrad.tensor(X, requires_grad=True)
    y = x * 2
    v = y[0]
    v.add_(1)
    assert y.grad_fn.name() == "CopySlicesBackward"
    assert v.grad_fn.name() == "GetitemBackward"
    assert y.requires_grad and v.requires_grad and not v.is_leaf
    assert y._version[0] == v._version[0] == 1
    tx = torch.tensor(X, requires_grad=True)
    ty = tx * 2
    ty[0].add_(1)
    assert_close(y, ty)


def test_stale_view_regenerates_its_grad_fn():
    def f(T, x):
        y = x * 1
        v = y[0]
        w = y.T[1:]
        y.mul_(2)  # v and w see the new data and, when next used, the new history
        out = v.sum() * 3  # reads nothing saved: v may change afterwards
        y[1].add_(3)  # through another view: v's history is rewritten again
        return out + w.sum() + (v * 1).sum()

    check_torch(f, [X])

    x = tapegrad.tensor(X, requires_grad=True)
    y = x * 1
    v = y[0]
    old = v.grad_fn
    y.mul_(2)
    assert v.grad_fn is not old and v.grad_fn.next_functions[0][0] is y.grad_fn


def test_stale_view_used_as_backward_root():
    def f(T, x):
        y = x * 1
        v = y[2, 1:]
        y.pow_(2)
        return v

    check_torch(f, [X])


def test_view_of_buffer_that_starts_requiring_grad():
    for T in (tapegrad, torch):
        buf = T.zeros(3, 4, dtype=T.float64)
        v = buf[0]
        assert not v.requires_grad
        x = T.tensor(R, requires_grad=True)
        buf[1].copy_(x)  # buf now has history: so has its older view v
        assert buf.requires_grad and v.requires_grad and v.grad_fn is not None
        (v.sum() + buf[1].pow(2).sum()).backward()
        assert_close(x.grad, 2 * R)


def test_view_saved_before_base_changes_raises_at_backward():
    for T in (tapegrad, torch):
        x = T.tensor(X, requires_grad=True)
        y = x * 1
        v = y[0]
        out = v * v  # saves v
        y.add_(1)
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            out.sum().backward()


def test_view_saved_by_the_inplace_op_on_another_view_raises():
    for T in (tapegrad, torch):
        x = T.tensor(R, requires_grad=True)
        y = x * 1
        y[2].mul_(y[0])  # mul saved the view y[0], then the write bumped y's version
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            y.sum().backward()


def test_retain_grad_on_base_follows_inplace_on_view():
    grads = []
    for T in (tapegrad, torch):
        x = T.tensor(X, requires_grad=True)
        y = x * 2
        y.retain_grad()
        y[1].mul_(3)
        (y * y).sum().backward()
        grads.append((y.grad, x.grad))
    assert_close(grads[0][0], grads[1][0])
    assert_close(grads[0][1], grads[1][1])


def test_view_of_leaf_raises():
    x = tapegrad.tensor(X, requires_grad=True)
    for f in (lambda: x[0].add_(1), lambda: x.T.mul_(2), lambda: x.reshape(-1)[3].zero_(),
              lambda: x[1:][0].copy_(tapegrad.tensor(R))):
        with pytest.raises(RuntimeError, match="a view of a leaf Variable that requires grad is "
                                               "being used in an in-place operation"):
            f()
    with pytest.raises(RuntimeError, match="a leaf Variable that requires grad"):
        x.add_(1)
    assert x._version[0] == 0 and x.grad_fn is None
    with tapegrad.no_grad():  # allowed without grad mode, as in PyTorch
        x[0].add_(1)
    assert_close(x[0], X[0] + 1)
    assert x.grad_fn is None and x.requires_grad


def test_view_made_under_no_grad_then_modified_in_grad_mode_raises():
    x = tapegrad.tensor(R, requires_grad=True)
    buf = tapegrad.zeros(2, 4, dtype=tapegrad.float64)
    with tapegrad.no_grad():
        v = buf[0]
    with pytest.raises(RuntimeError, match="A view was created in no_grad mode"):
        v.copy_(x)
    v.copy_(tapegrad.tensor(R))  # nothing requires grad: a plain write
    assert_close(buf[0], R)


def test_expanded_view_raises():
    for T in (tapegrad, torch):
        x = T.tensor(X, requires_grad=True)
        y = x * 1
        for f in (lambda: y.expand(2, 3, 4).add_(1), lambda: y[:, :1].expand(3, 4).mul_(2),
                  lambda: y[0].broadcast_to((2, 4)).copy_(T.tensor(W))):
            with pytest.raises(RuntimeError, match="more than one element of the written-to "
                                                   "tensor refers to a single memory location"):
                f()


def test_expand_without_overlap_is_a_view():
    def f(T, x, r):
        y = x * 1
        y.unsqueeze(0).expand(1, 3, 4)[0, 1].mul_(r)
        return y * y

    check_torch(f, [X, R])


def test_no_grad_inplace_on_view_is_a_plain_write():
    for T in (tapegrad, torch):
        x = T.tensor(X, requires_grad=True)
        y = x * 2
        node = y.grad_fn
        with T.no_grad():
            y[0].mul_(3)
            y.T[1].add_(1)
        assert y.grad_fn is node and (y._version if T is torch else y._version[0]) == 2
        expected = X * 2
        expected[0] *= 3
        expected[:, 1] += 1
        assert_close(y, expected)
        (y * 1).sum().backward()  # y's own history is unchanged: d(2x)/dx
        assert_close(x.grad, np.full_like(X, 2.0))


def test_views_of_plain_tensors_stay_plain_writes():
    buf = tapegrad.zeros(3, 4)
    buf[1:].T[2].add_(2)
    buf.reshape(-1)[::5].fill_(1)
    expected = np.zeros((3, 4), np.float32)
    expected[1:, 2] += 2
    expected.reshape(-1)[::5] = 1
    np.testing.assert_array_equal(buf.numpy(), expected)
    assert buf.grad_fn is None and not buf.requires_grad


def test_integer_result_cast_and_shape_errors_on_view():
    x = tapegrad.tensor(X, requires_grad=True)
    y = x * 1
    with pytest.raises(RuntimeError, match="mul_"):
        y[0].mul_(tapegrad.tensor(W, requires_grad=True))  # (2, 4) does not fit (4,)
    assert y.grad_fn.name() == "MulBackward" and y._version[0] == 0


def test_views_are_plain_tensors_that_copy_and_pickle_as_owners():
    import copy
    import pickle

    y = tapegrad.tensor(X) * 1
    v = y.T[1:]
    assert type(v) is tapegrad.Tensor and type(y[0][1]) is tapegrad.Tensor
    for c in (copy.deepcopy(v), pickle.loads(pickle.dumps(v))):
        assert type(c) is tapegrad.Tensor and c.shape == (3, 3)
        c.zero_()  # its own storage
        assert_close(v, X.T[1:])
    x = tapegrad.tensor(X, requires_grad=True)
    y = x * 1
    w = y[0]
    y.mul_(2)  # w is stale until next used: copying it still gives a plain tensor
    c = copy.deepcopy(w.detach())
    assert type(c) is tapegrad.Tensor
    assert_close(c, 2 * X[0])
    assert w.requires_grad and type(w) is tapegrad.Tensor  # refreshed by the first read


def test_stale_view_refreshes_on_first_use():
    x = tapegrad.tensor(X, requires_grad=True)
    y = x * 1
    v = y[1]
    y.add_(1)
    assert type(v) is not tapegrad.Tensor  # marked stale
    assert v.requires_grad  # the first read regenerates the grad_fn from the new base
    assert type(v) is tapegrad.Tensor and v.grad_fn.next_functions[0][0] is y.grad_fn


def test_base_drops_references_to_dead_views():
    y = tapegrad.tensor(X) * 1
    keep = [y[0], y.T]
    for _ in range(300):
        y[1].sum()
    assert len(y._view) < 64
    assert all(r() is not None for r in y._view[:2]) and keep


def test_integer_views_share_storage_without_history():
    i = tapegrad.arange(12).reshape(3, 4)
    i.T[1].add_(5)
    i[2][::2] *= 2
    expected = np.arange(12).reshape(3, 4)
    expected[:, 1] += 5
    expected[2][::2] *= 2
    np.testing.assert_array_equal(i.numpy(), expected)


def test_inplace_on_a_detached_alias_rebases_only_the_alias():
    # detach(), .data and from_numpy give non-differentiable aliases: in PyTorch an in-place op
    # on one records the alias's own history and leaves the other tensor's history alone
    def f(T, x, r):
        y = x * 1
        d = y[0].detach()
        d.copy_(r * 2)  # writes y's memory
        return y * 1 + d.sum(), d

    check_torch(f, [X, R])
    arr = np.zeros((2, 4))
    for T in (tapegrad, torch):
        r = T.tensor(R, requires_grad=True)
        a = T.from_numpy(arr[1])  # a numpy view
        a.mul_(r)
        assert a.grad_fn is not None and a.requires_grad


def test_retain_grad_on_view_follows_inplace_on_it():
    for T in (tapegrad, torch):
        x = T.tensor(X, requires_grad=True)
        y = x * 2
        v = y[1:, 2]
        v.retain_grad()
        v.mul_(T.tensor(R[:2]))
        (y * y).sum().backward()  # v's new grad_fn is not on this path: no v.grad
        assert v.retains_grad and v.grad is None
    grads = []
    for T in (tapegrad, torch):
        x = T.tensor(X, requires_grad=True)
        y = x * 2
        v = y[1:, 2]
        v.retain_grad()
        y.mul_(3)  # the stale view keeps retaining, on its regenerated grad_fn
        (v * v).sum().backward()
        grads.append((v.grad, x.grad))
    assert_close(grads[0][0], grads[1][0])
    assert_close(grads[0][1], grads[1][1])


def test_no_grad_view_of_a_base_modified_in_grad_mode_raises_when_used():
    for T in (tapegrad, torch):
        x = T.tensor(X, requires_grad=True)
        y = x * 2
        with T.no_grad():
            v = y[0]
        y.add_(1)
        with pytest.raises(RuntimeError, match="its base or another view of its base has been "
                                               "modified inplace with grad mode enabled"):
            v.grad_fn
        w = T.zeros(3, 4, dtype=T.float64)
        with T.no_grad():
            u = w[0]
        w.add_(1)  # nothing requires grad: the view stays usable
        assert not u.requires_grad and u.grad_fn is None


def test_setitem_with_basic_index_is_a_copy_into_the_view():
    def f(T, x, v):
        y = x * 1
        y[0] = v.reshape(1, 1, 4)  # leading 1s dropped, as PyTorch
        y[1:, 1] = v[:2] * 3
        y[2, 2:] = 7
        y[..., 3] = y[:, 0] + 2  # the value is made from a view of the same base
        return y * y

    check_torch(f, [X, R])
    x = tapegrad.tensor(X, requires_grad=True)
    y = x * 1
    y[0] = 1.5
    assert y.grad_fn.name() == "CopySlicesBackward"
    y[tapegrad.tensor([0, 2])] = 2.5  # integer-array index: index_put, as PyTorch
    assert y.grad_fn.name() == "IndexPutBackward"
    with pytest.raises(RuntimeError, match=r"__setitem__: cannot assign a value of shape \(3,\) "
                                           r"to the indexed shape \(4,\)"):
        y[1] = tapegrad.ones(3, requires_grad=True)
    with pytest.raises(RuntimeError, match="a view of a leaf Variable"):
        x[0] = 1.0  # as PyTorch: setitem is an in-place op on the view x[0]
