"""Creation factories and Tensor conversions against PyTorch."""
import numpy as np
import pytest
import torch

import tapegrad
from helpers import assert_close, check_op


def same(a, b):
    """Same dtype name, shape and values (exactly) as the torch tensor."""
    assert str(a.dtype).split(".")[-1] == str(b.dtype).split(".")[-1], (a.dtype, b.dtype)
    assert tuple(a.shape) == tuple(b.shape)
    np.testing.assert_array_equal(a.numpy(), b.numpy())


@pytest.mark.parametrize("name", ["zeros", "ones", "empty"])
@pytest.mark.parametrize("args,kwargs", [((2, 3), {}), (((2, 3),), {}), (([4],), {}),
                                         ((2,), {"dtype": "int64"}), (((),), {}),
                                         ((0, 3), {"dtype": "float64"})])
def test_filled_factories(name, args, kwargs):
    kw_tg = {k: getattr(tapegrad, v) for k, v in kwargs.items()}
    kw_th = {k: getattr(torch, v) for k, v in kwargs.items()}
    a, b = getattr(tapegrad, name)(*args, **kw_tg), getattr(torch, name)(*args, **kw_th)
    assert a.dtype.name == str(b.dtype).split(".")[-1] and tuple(a.shape) == tuple(b.shape)
    if name != "empty":
        same(a, b)


def test_requires_grad_and_device():
    assert tapegrad.zeros(2, requires_grad=True).requires_grad
    assert tapegrad.ones(2, device="cpu").device == tapegrad.device("cpu")  # never == "cpu"
    assert tapegrad.ones(2, device=tapegrad.tensor(1.0).device).shape == (2,)
    with pytest.raises(RuntimeError, match="cpu only"):
        tapegrad.zeros(2, device="cuda")
    with pytest.raises(RuntimeError, match="floating point"):
        tapegrad.zeros(2, dtype=tapegrad.int64, requires_grad=True)
    with pytest.raises(RuntimeError, match="negative dimension"):
        tapegrad.zeros(2, -1)
    with pytest.raises(TypeError, match="sequence of ints"):
        tapegrad.ones(2.5)


def test_default_dtype_is_respected():
    tapegrad.set_default_dtype(tapegrad.float64)
    try:
        for t in (tapegrad.zeros(2), tapegrad.ones(2), tapegrad.full((2,), 1.5),
                  tapegrad.arange(0.0, 1.0, 0.5), tapegrad.linspace(0, 1, 3), tapegrad.eye(2),
                  tapegrad.tensor([1.0]), tapegrad.rand(2), tapegrad.randn(2)):
            assert t.dtype == tapegrad.float64
    finally:
        tapegrad.set_default_dtype(tapegrad.float32)
    assert tapegrad.zeros(2).dtype == tapegrad.float32


@pytest.mark.parametrize("value", [1, 1.5, True, -3])
def test_full_dtype_follows_value(value):
    same(tapegrad.full((2, 2), value), torch.full((2, 2), value))
    same(tapegrad.full(3, value, dtype=tapegrad.float64),
         torch.full((3,), value, dtype=torch.float64))


@pytest.mark.parametrize("args", [(5,), (2, 9), (0.0, 1.0, 0.1), (1, 2.5, 0.5), (10, 0, -3),
                                  (-1.5, 2.25, 0.25), (0, 1, 0.3), (3, 3), (0.5,), (1, 10, 4),
                                  (0.1, 0.9, 0.2)])
def test_arange_matches_torch(args):
    same(tapegrad.arange(*args), torch.arange(*args))
    same(tapegrad.arange(*args, dtype=tapegrad.float64), torch.arange(*args, dtype=torch.float64))


@pytest.mark.parametrize("args", [(0, 5, 1.5), (0.5, 4), (-2.5, 3, 1), (10, 0, -3),
                                  (7, -3, -2.5), (0, 7, 2)])
@pytest.mark.parametrize("dtype", ["int64", "int32"])
def test_arange_integer_dtype_with_float_bounds(args, dtype):
    same(tapegrad.arange(*args, dtype=getattr(tapegrad, dtype)),
         torch.arange(*args, dtype=getattr(torch, dtype)))


def test_arange_errors_and_dtype():
    same(tapegrad.arange(5, dtype=tapegrad.float32), torch.arange(5, dtype=torch.float32))
    same(tapegrad.arange(tapegrad.tensor(4)), torch.arange(torch.tensor(4)))
    with pytest.raises(RuntimeError, match="step must be nonzero"):
        tapegrad.arange(0, 5, 0)
    with pytest.raises(RuntimeError, match="inconsistent with step sign"):
        tapegrad.arange(0, 5, -1)


@pytest.mark.parametrize("args", [(0, 1, 5), (-3.0, 7.0, 11), (1, 2, 1), (0, 1, 0), (2, -2, 4),
                                  (0.1, 0.7, 7)])
def test_linspace_matches_torch(args):
    same(tapegrad.linspace(*args, dtype=tapegrad.float64), torch.linspace(*args,
                                                                          dtype=torch.float64))
    assert_close(tapegrad.linspace(*args), torch.linspace(*args), rtol=1e-6)


def test_eye_and_like():
    same(tapegrad.eye(3), torch.eye(3))
    same(tapegrad.eye(2, 4, dtype=tapegrad.int64), torch.eye(2, 4, dtype=torch.int64))
    x, y = tapegrad.arange(6).reshape(2, 3), torch.arange(6).reshape(2, 3)
    same(tapegrad.zeros_like(x), torch.zeros_like(y))
    same(tapegrad.ones_like(x, dtype=tapegrad.float64), torch.ones_like(y, dtype=torch.float64))
    same(tapegrad.full_like(x, 7.9), torch.full_like(y, 7.9))  # x's dtype: truncated to 7
    assert tapegrad.empty_like(x).shape == (2, 3) and tapegrad.empty_like(x).dtype == x.dtype
    assert tapegrad.zeros_like(tapegrad.ones(2), requires_grad=True).requires_grad


def test_from_numpy_shares_memory():
    a = np.zeros(3)
    t = tapegrad.from_numpy(a)
    t.add_(1)
    np.testing.assert_array_equal(a, [1, 1, 1])
    a[0] = 5
    assert t[0].item() == 5
    assert t.dtype == tapegrad.float64
    with pytest.raises(TypeError, match="can't convert"):
        tapegrad.from_numpy(np.array(["a"]))
    with pytest.raises(TypeError, match="expected np.ndarray"):
        tapegrad.from_numpy([1, 2])


def test_as_tensor():
    a = np.arange(3)
    t = tapegrad.as_tensor(a)
    a[1] = 9
    assert t.tolist() == [0, 9, 2]
    c = tapegrad.as_tensor(a, dtype=tapegrad.float32)
    a[1] = 1
    assert c.tolist() == [0.0, 9.0, 2.0] and c.dtype == tapegrad.float32
    x = tapegrad.ones(2)
    assert tapegrad.as_tensor(x) is x
    assert tapegrad.as_tensor([1.5, 2]).dtype == tapegrad.float32


def test_tensor_factory_copies():
    a = np.ones(2)
    t = tapegrad.tensor(a)
    a[0] = 3
    assert t.tolist() == [1.0, 1.0]


# --- conversions ---------------------------------------------------------------------------
def test_to_dtype_is_differentiable():
    check_op(lambda T, x: (x.to(T.float64) * x).sum(), [(2, 3)])
    for T in (tapegrad, torch):
        x = T.tensor([[1.5, -2.0, 0.25]], dtype=T.float64, requires_grad=True)
        y = x.to(T.float32)
        assert y.grad_fn is not None and y.dtype == T.float32
        (y * T.tensor([1.0, 2.0, 3.0])).sum().backward()
        assert x.grad.dtype == T.float64 and x.grad.tolist() == [[1.0, 2.0, 3.0]]


def test_to_overloads():
    x = tapegrad.ones(2, 3)
    assert x.to(tapegrad.float32) is x and x.to("cpu") is x
    assert x.to(tapegrad.float64).dtype == tapegrad.float64
    assert x.to(tapegrad.zeros(1, dtype=tapegrad.int64)).dtype == tapegrad.int64
    assert x.to(device="cpu", dtype=tapegrad.float16).dtype == tapegrad.float16
    c = x.to(tapegrad.float32, copy=True)
    assert c is not x
    c.add_(1)
    assert x.sum().item() == 6
    with pytest.raises(RuntimeError, match="cpu only"):
        x.to("cuda")
    with pytest.raises(RuntimeError, match="cpu only"):
        x.cuda()


def test_cast_methods_match_torch():
    data = [[1.7, -2.2, 0.0], [3.5, -0.5, 9.9]]
    a, b = tapegrad.tensor(data, dtype=tapegrad.float64), torch.tensor(data, dtype=torch.float64)
    for m in ("float", "double", "half", "long", "int", "bool", "short", "byte"):
        if m == "byte":
            a2, b2 = a.abs(), b.abs()
            same(getattr(a2, m)(), getattr(b2, m)())
            continue
        same(getattr(a, m)(), getattr(b, m)())
    assert a.type() == "torch.DoubleTensor" and a.long().type() == "torch.LongTensor"
    assert a.type(tapegrad.float32).dtype == tapegrad.float32
    assert a.type("torch.IntTensor").dtype == tapegrad.int32


def test_clone_and_contiguous():
    check_op(lambda T, x: x.clone() * x, [(2, 3)])
    x = tapegrad.tensor(np.arange(6.0).reshape(2, 3))
    c = x.clone()
    c.add_(1)
    assert x.sum().item() == 15
    t = x.T
    assert not t.is_contiguous() and t.contiguous().is_contiguous()
    assert x.contiguous() is x
    check_op(lambda T, x: x.mT.contiguous() * 2, [(2, 3)])
    assert tapegrad.clone(x).tolist() == x.tolist()


def test_dlpack_roundtrip():
    x = tapegrad.arange(6.0).reshape(2, 3)
    y = tapegrad.from_dlpack(x.numpy())
    y.add_(1)
    assert x.sum().item() == 21
    th = torch.from_dlpack(x)
    th.add_(1)
    assert x.sum().item() == 27
    back = tapegrad.from_dlpack(torch.ones(3))
    assert back.dtype == tapegrad.float32 and back.tolist() == [1.0, 1.0, 1.0]
    assert x.__dlpack_device__() == (1, 0)
    with pytest.raises(RuntimeError, match="require gradient"):
        tapegrad.ones(2, requires_grad=True).__dlpack__()


def test_new_factories():
    x = tapegrad.ones(2, dtype=tapegrad.float64)
    for t in (x.new_zeros(3), x.new_ones((2, 2)), x.new_full((2,), 3), x.new_empty(4),
              x.new_tensor([1, 2])):
        assert t.dtype == tapegrad.float64
    assert x.new_tensor([1, 2], dtype=tapegrad.int64).dtype == tapegrad.int64
    assert x.new_zeros(2, 3).shape == (2, 3) and x.new_full((2,), 3).tolist() == [3.0, 3.0]


def test_item_tolist_is_floating_point():
    assert tapegrad.tensor([[1, 2]]).tolist() == [[1, 2]]
    assert tapegrad.tensor(2.5).item() == 2.5
    assert tapegrad.ones(1).is_floating_point() and not tapegrad.arange(2).is_floating_point()
    with pytest.raises(RuntimeError, match="cannot be converted"):
        tapegrad.ones(2).item()


def _rng_array(shape, scale=1.0):
    return np.random.default_rng(0).standard_normal(shape) * scale


@pytest.mark.parametrize("array", [
    _rng_array((3, 12)), _rng_array((2, 2, 3), 1000), _rng_array(2000), _rng_array((40, 40)),
    _rng_array((5, 300)), _rng_array((2, 50, 3)), _rng_array(12, 1e-6),
    np.arange(30.0).reshape(3, 10) * 1e6, np.array([0.0, np.nan, np.inf, -1.0]),
    np.random.default_rng(1).integers(0, 100000, (3, 30)),
], ids=lambda a: f"{a.dtype}{a.shape}")
def test_repr_layout_matches_torch(array):
    """Line wrapping, summarisation (``...``) and number style as PyTorch's printer."""
    assert repr(tapegrad.tensor(array)).replace("tapegrad.", "torch.") == \
        repr(torch.tensor(array))


@pytest.mark.parametrize("make", [
    lambda T: T.tensor([1.0, 2.0]),
    lambda T: T.tensor([1.5, -2.25, 3.125]),
    lambda T: T.tensor([1e-5, 1e5]),
    lambda T: T.tensor([[1.0, 2.0], [3.0, 4.0]], dtype=T.float64),
    lambda T: T.tensor([1.0e9, 1.0]),
    lambda T: T.tensor(3),
    lambda T: T.tensor(2.5),
    lambda T: T.tensor([True, False]),
    lambda T: T.zeros(2, 3, dtype=T.int32),
    lambda T: T.tensor([], dtype=T.int64),
    lambda T: T.tensor([]),
    lambda T: T.zeros(0, 3),
    lambda T: T.tensor([float("nan"), 1.5, float("inf")]),
    lambda T: T.tensor(2.5, dtype=T.float16),
    lambda T: T.tensor([1.5, 2.0], requires_grad=True),
    lambda T: T.tensor([1.5, 2.0], requires_grad=True) * 2,
    lambda T: T.arange(12.0).reshape(3, 4),
    lambda T: T.tensor([0.1, 123.4567]),
])
def test_repr_matches_torch(make):
    ours = repr(make(tapegrad)).replace("tapegrad.", "torch.")
    theirs = repr(make(torch))
    theirs = theirs.replace("Backward0", "Backward")
    assert ours == theirs
