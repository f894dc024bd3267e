"""In-place ops: values, dtype rules, views, the version counter and history rebasing."""
import numpy as np
import pytest
import torch

import tapegrad
from helpers import assert_close, check_torch, make_inputs

A = np.array([[0.5, -1.25, 2.0], [1.5, 0.75, -0.3]])
B = np.array([1.1, -0.4, 2.5])
POS = np.array([[0.7, 1.3, 2.2], [0.4, 1.9, 0.9]])

# (name, fn(T, x, y) mutating x) — every op runs on a fresh x in both libraries
INPLACE = [
    ("add_", lambda T, x, y: x.add_(y)),
    ("add_alpha", lambda T, x, y: x.add_(y, alpha=-0.3)),
    ("sub_", lambda T, x, y: x.sub_(y, alpha=2)),
    ("mul_", lambda T, x, y: x.mul_(y)),
    ("div_", lambda T, x, y: x.div_(y)),
    ("scalar_add", lambda T, x, y: x.add_(0.1)),
    ("scalar_mul", lambda T, x, y: x.mul_(3)),
    ("pow_", lambda T, x, y: x.abs_().pow_(1.5)),
    ("pow_tensor", lambda T, x, y: x.abs_().pow_(y.abs())),
    ("iadd", lambda T, x, y: x.__iadd__(y)),
    ("isub", lambda T, x, y: x.__isub__(2.5)),
    ("imul", lambda T, x, y: x.__imul__(y)),
    ("itruediv", lambda T, x, y: x.__itruediv__(y)),
    ("clamp_", lambda T, x, y: x.clamp_(-0.5, 1.0)),
    ("clamp_min", lambda T, x, y: x.clamp_(min=0.2)),
    ("clamp_tensor", lambda T, x, y: x.clamp_(max=y)),
    ("zero_", lambda T, x, y: x.zero_()),
    ("fill_", lambda T, x, y: x.fill_(2.5)),
    ("copy_", lambda T, x, y: x.copy_(y)),
    ("exp_", lambda T, x, y: x.exp_()),
    ("log_", lambda T, x, y: x.abs_().log_()),
    ("sqrt_", lambda T, x, y: x.abs_().sqrt_()),
    ("tanh_", lambda T, x, y: x.tanh_()),
    ("sigmoid_", lambda T, x, y: x.sigmoid_()),
    ("relu_", lambda T, x, y: x.relu_()),
    ("neg_", lambda T, x, y: x.neg_()),
    ("addcmul_", lambda T, x, y: x.addcmul_(y, y * 2, value=0.5)),
    ("addcdiv_", lambda T, x, y: x.addcdiv_(y, y * y + 1, value=-2)),
    ("lerp_", lambda T, x, y: x.lerp_(y, 0.3)),
    ("lerp_far", lambda T, x, y: x.lerp_(y, 0.9)),
    ("masked_fill_", lambda T, x, y: x.masked_fill_(y > 0, -1.0)),
    ("sin_", lambda T, x, y: x.sin_()),
    ("cos_", lambda T, x, y: x.cos_()),
    ("erf_", lambda T, x, y: x.erf_()),
    ("square_", lambda T, x, y: x.square_()),
    ("reciprocal_", lambda T, x, y: x.reciprocal_()),
    ("rsqrt_", lambda T, x, y: x.abs_().rsqrt_()),
    ("log1p_", lambda T, x, y: x.abs_().log1p_()),
    ("expm1_", lambda T, x, y: x.expm1_()),
    ("floor_", lambda T, x, y: x.floor_()),
    ("round_", lambda T, x, y: x.mul_(3).round_()),
    ("sign_", lambda T, x, y: x.sign_()),
    ("remainder_", lambda T, x, y: x.remainder_(0.7)),
    ("imod", lambda T, x, y: x.__imod__(y)),
]


@pytest.mark.parametrize("name,fn", INPLACE, ids=[n for n, _ in INPLACE])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_values_match_torch_without_grad(name, fn, dtype):
    a, b = A.astype(dtype), B.astype(dtype)
    x, y = tapegrad.tensor(a), tapegrad.tensor(b)
    tx, ty = torch.tensor(a), torch.tensor(b)
    out = fn(tapegrad, x, y)
    fn(torch, tx, ty)
    assert out is x and x.dtype.name == str(tx.dtype).split(".")[-1]
    assert_close(x, tx, rtol=1e-12 if dtype == np.float64 else 1e-6)


@pytest.mark.parametrize("name,fn", INPLACE, ids=[n for n, _ in INPLACE])
def test_gradients_match_torch_through_inplace(name, fn):
    """In grad mode the op rebases a non-leaf's history: values and grads agree with torch."""

    def f(T, x, y):
        z = x * 1.5  # a non-leaf to modify
        fn(T, z, y)
        return z * x

    check_torch(f, [A, B])
    check_torch(f, [A, B], dtype=np.float32, rtol=2e-5)


def test_integer_and_bool_inplace_match_torch():
    for T in (tapegrad, torch):
        i = T.tensor([5, -6, 7])
        i //= 2
        i %= 3
        i.bitwise_xor_(T.tensor([1, 1, 0]))
        i.fmod_(2)
        i |= 4
        i &= 6
        b = T.tensor([True, False, True])
        b.logical_not_()
        b ^= T.tensor([True, True, False])
        if T is tapegrad:
            ours = (i.tolist(), b.tolist())
        else:
            assert ours == (i.tolist(), b.tolist())
    with pytest.raises(RuntimeError, match="can't be cast"):
        tapegrad.tensor([1, 2]).sin_()


def test_scatter_add_inplace_matches_torch():
    def f(T, x, y):
        z = x * 1
        z.scatter_add_(1, T.tensor([[0, 2, 0], [1, 1, 2]]), y.expand(2, 3) * 2)
        return z

    check_torch(f, [A, B])


def test_rebased_history_gradcheck():
    def f(x, y):
        z = x * 2
        z.mul_(y)
        z.add_(y, alpha=0.5)
        z.tanh_()  # saves its output (z itself): nothing may modify z after this
        return z

    xs = [tapegrad.tensor(a, requires_grad=True) for a in make_inputs([(2, 3), (3,)])]
    assert tapegrad.autograd.gradcheck(f, xs)
    assert tapegrad.autograd.gradgradcheck(f, xs)


def test_grad_fn_and_version_after_inplace():
    x = tapegrad.tensor([1.0, 2.0], requires_grad=True)
    y = x * 2
    assert y._version[0] == 0
    y.add_(1)
    assert y.grad_fn.name() == "AddBackward" and y.requires_grad and y._version[0] == 1
    y.mul_(y.detach())
    assert y._version[0] == 2
    z = tapegrad.ones(2)
    z.add_(x)  # an operand that requires grad makes the target require grad
    assert z.requires_grad and not z.is_leaf
    z.sum().backward()
    assert x.grad.tolist() == [1.0, 1.0]


def test_leaf_requiring_grad_raises_outside_no_grad():
    w = tapegrad.ones(3, requires_grad=True)
    for op in (lambda: w.add_(1), lambda: w.zero_(), lambda: w.copy_(tapegrad.zeros(3)),
               lambda: w.__imul__(2), lambda: w.__setitem__(0, 5.0), lambda: w.relu_()):
        with pytest.raises(RuntimeError, match="a leaf Variable that requires grad is being "
                                               "used in an in-place operation"):
            op()
    with tapegrad.no_grad():
        w.mul_(2).add_(1)
        w[0] = 7.0
    assert w.tolist() == [7.0, 3.0, 3.0] and w.is_leaf and w.requires_grad and w._version[0] == 3


def test_modified_saved_tensor_raises_at_backward():
    x = tapegrad.tensor([1.0, 2.0, 3.0], requires_grad=True)
    y = x.exp()
    y.add_(1)  # exp saved its output
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()
    a = x * 2
    b = (a * a).sum()
    a.mul_(2)  # mul saved a
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        b.backward()
    # torch agrees on both
    tx = torch.tensor([1.0, 2.0, 3.0], requires_grad=True)
    ty = tx.exp()
    ty.add_(1)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        ty.sum().backward()


def test_modifying_unsaved_input_is_fine():
    x = tapegrad.tensor([1.0, 2.0], requires_grad=True)
    a = x * 1
    b = a + 3  # add saves nothing
    a.mul_(10)
    (b.sum() + a.sum()).backward()
    assert x.grad.tolist() == [11.0, 11.0]


def test_inplace_on_saved_output_of_rebased_op_raises():
    x = tapegrad.tensor([0.5, 1.0], requires_grad=True)
    y = x * 1
    y.exp_()  # the rebased exp saved its output: y itself
    y.mul_(2)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()


def test_views_share_storage_and_version():
    x = tapegrad.zeros(2, 3)
    v = x[0]
    t = x.T
    v.add_(1)
    assert x.tolist() == [[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]]
    assert x._version[0] == v._version[0] == t._version[0] == 1
    t.mul_(3)
    assert x.tolist()[0] == [3.0, 3.0, 3.0]
    d = x.detach()
    d.zero_()
    assert x.sum().item() == 0 and x._version[0] == 3
    x.data.fill_(4)  # .data has its own version counter (PyTorch's semantics)
    assert x.sum().item() == 24 and x._version[0] == 3


def test_detached_view_change_is_seen_by_backward():
    x = tapegrad.tensor([1.0, 2.0], requires_grad=True)
    y = x * 1
    z = y * y
    y.detach().zero_()  # shares y's version: the saved y is stale
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        z.sum().backward()


def test_inplace_on_view_in_graph_rewrites_the_base():
    # PyTorch's semantics (CopySlices); tests/autograd/test_inplace_views.py checks them in depth
    def f(T, x):
        y = x * 2
        y[0].add_(1)
        y.T.mul_(2)
        base = T.zeros(2, 3)
        base[0].copy_(x[0])
        return y * base + y

    check_torch(f, [A])
    x = tapegrad.ones(2, 3, requires_grad=True)
    # index assignment on the base
    base = tapegrad.zeros(2, 3)
    base[0] = x[0] * 3
    base.sum().backward()
    assert x.grad.tolist() == [[3.0, 3.0, 3.0], [0.0, 0.0, 0.0]]
    # a view of a temporary nobody else holds is its own storage: assignment works
    out = tapegrad.zeros(6).reshape(2, 3)
    out[1] = x[1] * 2
    x.grad = None
    out.sum().backward()
    assert x.grad.tolist() == [[0.0, 0.0, 0.0], [2.0, 2.0, 2.0]]
    # and views without grad involvement stay plain writes, even in grad mode
    plain = tapegrad.zeros(3)
    plain[1:].add_(2)
    assert plain.tolist() == [0.0, 2.0, 2.0]


def test_no_grad_inplace_is_a_direct_write():
    p = tapegrad.ones(1000, requires_grad=True)
    buf = p._data
    with tapegrad.no_grad():
        p.add_(tapegrad.ones(1000), alpha=-0.1)
        p.mul_(0.5).addcdiv_(tapegrad.ones(1000), tapegrad.full((1000,), 2.0), value=0.2)
        p.clamp_(0.0, 1.0).sqrt_()
    assert p._data is buf and p.is_leaf and p.grad_fn is None
    np.testing.assert_allclose(p.numpy(force=True), np.sqrt(0.9 * 0.5 + 0.1), rtol=1e-6)


def test_dtype_rules_match_torch():
    for T in (tapegrad, torch):
        i = T.tensor([1, 2, 3])
        with pytest.raises(RuntimeError, match="can't be cast to the desired output type Long"):
            i.add_(1.5)
        with pytest.raises(RuntimeError, match="can't be cast"):
            i.div_(2)
        with pytest.raises(RuntimeError, match="can't be cast"):
            i.mul_(T.tensor([0.5, 1.0, 2.0]))
        with pytest.raises(RuntimeError, match="can't be cast"):
            T.tensor([True, False]).add_(1)
        with pytest.raises(RuntimeError, match="can't be cast"):
            i.exp_()
        i.mul_(2)
        assert i.tolist() == [2, 4, 6]
        f = T.tensor([1.0, 2.0])
        f.add_(T.tensor([1, 2]))  # int into float: allowed
        f.add_(T.tensor([0.1, 0.2], dtype=T.float64))  # computed in float64, stored float32
        assert str(f.dtype).endswith("float32")
    a = tapegrad.tensor([1.0, 2.0])
    a.add_(tapegrad.tensor([0.1, 0.2], dtype=tapegrad.float64))
    b = torch.tensor([1.0, 2.0])
    b.add_(torch.tensor([0.1, 0.2], dtype=torch.float64))
    assert a.tolist() == b.tolist()


def test_shape_errors():
    with pytest.raises(RuntimeError, match=r"output with shape \[3\] doesn't match the "
                                           r"broadcast shape \[2, 3\]"):
        tapegrad.ones(3).add_(tapegrad.ones(2, 3))
    x = tapegrad.ones(2, requires_grad=True) * 1
    with pytest.raises(RuntimeError, match="doesn't match the broadcast shape"):
        x.mul_(tapegrad.ones(3, 2))
    with pytest.raises(RuntimeError, match="cannot be broadcast"):
        tapegrad.ones(3).copy_(tapegrad.ones(2))
    with pytest.raises(RuntimeError, match="0-dimension"):
        tapegrad.ones(3).fill_(tapegrad.ones(2))
    with pytest.raises(RuntimeError, match="at least one"):
        tapegrad.ones(3).clamp_()
    with pytest.raises(RuntimeError, match=r"add_: shapes \(3,\) and \(2,\) cannot be "):
        tapegrad.ones(3).add_(tapegrad.ones(2))
    with pytest.raises(RuntimeError, match="pow_: Integers to negative integer powers"):
        tapegrad.tensor([2, 3]).pow_(-1)


def test_copy_broadcasts_and_casts():
    for T in (tapegrad, torch):
        x = T.zeros(2, 3, dtype=T.int64)
        x.copy_(T.tensor([1.7, -2.2, 3.0]))
        assert x.tolist() == [[1, -2, 3], [1, -2, 3]]
    src = tapegrad.tensor([1.0, 2.0, 3.0], dtype=tapegrad.float64, requires_grad=True)
    dst = tapegrad.zeros(2, 3)
    dst.copy_(src)
    assert dst.requires_grad and dst.dtype == tapegrad.float32
    (dst * tapegrad.tensor([[1.0], [2.0]])).sum().backward()
    assert src.grad.dtype == tapegrad.float64 and src.grad.tolist() == [3.0, 3.0, 3.0]


def test_fill_and_zero_keep_requires_grad_on_non_leaf():
    x = tapegrad.tensor([1.0, 2.0], requires_grad=True)
    for T, xx in ((tapegrad, x), (torch, torch.tensor([1.0, 2.0], requires_grad=True))):
        y = xx * 3
        y.zero_()
        assert y.requires_grad
        (y + xx).sum().backward()
        assert xx.grad.tolist() == [1.0, 1.0]


def test_setitem_without_grad():
    for T in (tapegrad, torch):
        x = T.zeros(3, 4)
        x[0] = 1.0
        x[1, 1:3] = T.tensor([5.0, 6.0])
        x[x > 5.5] = -1.0
        x[T.tensor([2, 2]), T.tensor([0, 3])] = 9.0
        x[..., -1] += 0.5
        if T is tapegrad:
            ours = x.tolist()
        else:
            assert ours == x.tolist()
    i = tapegrad.zeros(3, dtype=tapegrad.int64)
    i[0] = 2.9  # cast to the tensor's dtype, as PyTorch
    assert i.tolist() == [2, 0, 0]
    v0 = i._version[0]
    i[1:] = tapegrad.tensor([4, 5])
    assert i._version[0] == v0 + 1
    with pytest.raises(RuntimeError, match="cannot assign"):
        i[0:2] = tapegrad.tensor([1, 2, 3])
    with pytest.raises(IndexError):
        i[5] = 1


@pytest.mark.parametrize("index", [
    1, (slice(None), 0), (0, slice(1, 3)), "mask", "ints", (Ellipsis, -1),
])
def test_setitem_gradients_match_torch(index):
    def f(T, x, v):
        idx = index
        if index == "mask":
            idx = x > 0
        elif index == "ints":
            idx = (slice(None), T.tensor([0, 2]))
        y = x * 2
        shape = y[idx].shape
        y[idx] = v.reshape(-1)[: int(np.prod(shape))].reshape(shape) * 3
        return y

    check_torch(f, [A, np.arange(1.0, 7.0) / 7])


def test_iadd_on_index_of_graph_tensor():
    def f(T, x):
        y = x * 1
        y[:, 0] += 1  # in-place on the view y[:, 0], then y[:, 0] = that view
        return y * y

    check_torch(f, [A])
    x = tapegrad.ones(2, 3, requires_grad=True)
    z = x * 1
    z[:, 0] = z[:, 0] + 1  # the supported spelling
    z.sum().backward()
    assert x.grad.tolist() == [[1.0, 1.0, 1.0]] * 2


def test_retain_grad_follows_inplace():
    x = tapegrad.tensor([1.0, 2.0], requires_grad=True)
    tx = torch.tensor([1.0, 2.0], requires_grad=True)
    for T, xx in ((tapegrad, x), (torch, tx)):
        y = xx * 2
        y.retain_grad()
        y.mul_(3)
        (y * y).sum().backward()
        if T is tapegrad:
            ours = y.grad.tolist()
        else:
            assert ours == y.grad.tolist()
    assert x.grad.tolist() == tx.grad.tolist()


def test_inplace_samplers_on_non_leaf_in_grad_mode():
    x = tapegrad.ones(3, requires_grad=True)
    y = x * 2
    y.normal_()
    assert y.requires_grad
    (y * 1).sum().backward()
    assert x.grad is None or not x.grad.numpy().any()
