"""dtype objects, the default dtype, tensor() inference and low-precision floats vs torch."""
import pickle

import numpy as np
import pytest
import torch

import tapegrad
from helpers import assert_close

NAMES = ["bool", "uint8", "int8", "int16", "int32", "int64", "float16", "bfloat16", "float32",
         "float64"]


def name(d):
    return str(d).split(".")[-1]


@pytest.mark.parametrize("n", NAMES)
def test_dtype_objects(n):
    d = getattr(tapegrad, n)
    assert repr(d) == f"tapegrad.{n}" and name(d) == name(getattr(torch, n))
    assert d.is_floating_point == getattr(torch, n).is_floating_point
    assert d.itemsize == getattr(torch, n).itemsize
    assert pickle.loads(pickle.dumps(d)) is d
    assert tapegrad.zeros(1, dtype=d).dtype is d


def test_aliases():
    assert tapegrad.float is tapegrad.float32 and tapegrad.double is tapegrad.float64
    assert tapegrad.half is tapegrad.float16 and tapegrad.long is tapegrad.int64
    assert tapegrad.int is tapegrad.int32


@pytest.mark.parametrize("a", NAMES)
@pytest.mark.parametrize("b", NAMES)
def test_promote_types_matches_torch(a, b):
    ours = tapegrad.promote_types(getattr(tapegrad, a), getattr(tapegrad, b))
    assert name(ours) == name(torch.promote_types(getattr(torch, a), getattr(torch, b)))


def test_default_dtype():
    assert tapegrad.get_default_dtype() is tapegrad.float32
    tapegrad.set_default_dtype(tapegrad.float64)
    try:
        assert tapegrad.tensor([1.5]).dtype is tapegrad.float64
        assert tapegrad.tensor([1, 2]).dtype is tapegrad.int64
        assert (tapegrad.tensor([1, 2]) / 2).dtype is tapegrad.float64
    finally:
        tapegrad.set_default_dtype(tapegrad.float32)
    assert tapegrad.tensor([1.5]).dtype is tapegrad.float32
    with pytest.raises(TypeError, match="floating-point"):
        tapegrad.set_default_dtype(tapegrad.int64)


@pytest.mark.parametrize("data", [
    [1, 2.0], [True, False], [1, True], 3.5, 7, True, [], [[1, 2], [3, 4]],
    [[1.0, 2.0], [3.0, 4.0]], np.float64(1.5), np.float32(1.5), np.int32(3),
    [np.float32(1.5)], [np.int32(1)], [np.float64(1.0), 2.0], [1.0, np.float64(2.0)],
    np.array([1, 2], dtype=np.int32), np.array([1.0], dtype=np.float32),
    np.array([1, 2], dtype=np.uint8), np.array([True]), np.arange(3.0), (1, 2), ((1.5,),),
], ids=repr)
def test_tensor_inference_matches_torch(data):
    ours, theirs = tapegrad.tensor(data), torch.tensor(data)
    assert name(ours.dtype) == name(theirs.dtype)
    assert tuple(ours.shape) == tuple(theirs.shape)
    np.testing.assert_array_equal(ours.numpy(), theirs.numpy())


def test_tensor_with_dtype_casts_once():
    # 0.1 must not be rounded through float32 on the way to float64
    assert tapegrad.tensor([0.1], dtype=tapegrad.float64).item() == 0.1
    assert tapegrad.tensor([1.9, -1.9], dtype=tapegrad.int64).tolist() == \
        torch.tensor([1.9, -1.9], dtype=torch.int64).tolist()


def test_unsupported_data_raises():
    with pytest.raises(ValueError, match="too many dimensions 'str'"):  # as PyTorch
        tapegrad.tensor(["a"])
    with pytest.raises(TypeError, match="not supported"):
        tapegrad.tensor(np.array([1], dtype=np.uint16))
    with pytest.raises(TypeError, match="not a dtype"):
        tapegrad.zeros(2, dtype="complex256")


@pytest.mark.parametrize("n", ["int64", "int32", "bool", "uint8"])
def test_requires_grad_on_integer_tensors_raises(n):
    with pytest.raises(RuntimeError, match="only Tensors of floating point"):
        tapegrad.tensor([1, 0], dtype=getattr(tapegrad, n), requires_grad=True)
    with pytest.raises(RuntimeError, match="only Tensors of floating point"):
        tapegrad.zeros(2, dtype=getattr(tapegrad, n)).requires_grad_()


LOW = ["float16", pytest.param("bfloat16")]
A = np.array([[0.5, -1.25, 2.0], [1.5, 0.75, -3.0]])
B = np.array([1.1, -0.4, 2.5])


def _low(n):
    ta, tb = getattr(tapegrad, n), getattr(torch, n)
    return (tapegrad.tensor(A, dtype=ta), tapegrad.tensor(B, dtype=ta),
            torch.tensor(A, dtype=tb), torch.tensor(B, dtype=tb))


@pytest.mark.parametrize("n", LOW)
def test_low_precision_arithmetic_matches_torch(n):
    x, y, tx, ty = _low(n)
    for f in (lambda u, v: u + v, lambda u, v: u * v, lambda u, v: u - v, lambda u, v: u / v,
              lambda u, v: u.abs()):
        ours, theirs = f(x, y), f(tx, ty)
        assert name(ours.dtype) == n
        np.testing.assert_array_equal(ours.float().numpy(), theirs.float().numpy())
    # mixed with float32 promotes to float32; the two 16-bit types promote to float32
    assert (x + tapegrad.ones(3)).dtype is tapegrad.float32
    other = tapegrad.bfloat16 if n == "float16" else tapegrad.float16
    assert (x + tapegrad.ones(3, dtype=other)).dtype is tapegrad.float32
    assert x.is_floating_point() and x.sum().dtype is x.dtype


@pytest.mark.parametrize("n", ["float16", "bfloat16"])
def test_low_precision_float_functions_match_torch(n):
    x, y, tx, ty = _low(n)
    for f in (lambda u: (u * 2).exp(), lambda u: u.abs().sqrt(), lambda u: u.tanh(),
              lambda u: u * 0.5 + 1):
        ours, theirs = f(x), f(tx)
        assert name(ours.dtype) == n
        np.testing.assert_allclose(ours.float().numpy(), theirs.float().numpy(),
                                   rtol=2 ** -7)


@pytest.mark.parametrize("n", ["float16", "bfloat16"])
def test_low_precision_gradients(n):
    grads = []
    for T in (tapegrad, torch):
        x = T.tensor(B, dtype=getattr(T, n), requires_grad=True)
        ((x * x).sum() * 3).backward()
        assert name(x.grad.dtype) == n
        grads.append(x.grad.float().numpy())
    np.testing.assert_array_equal(grads[0], grads[1])


def test_bfloat16_can_require_grad():
    x = tapegrad.ones(2, dtype=tapegrad.bfloat16, requires_grad=True)
    assert x.requires_grad and x.is_floating_point()


def test_casts_match_torch():
    a = np.array([-2.7, -0.5, 0.0, 0.49, 1.5, 3.99, 255.5])
    for src in ("float64", "float32"):
        x, tx = tapegrad.tensor(a, dtype=getattr(tapegrad, src)), torch.tensor(
            a, dtype=getattr(torch, src))
        for dst in ("int64", "int32", "bool", "float16", "bfloat16", "float32"):
            ours = x.to(getattr(tapegrad, dst))
            theirs = tx.to(getattr(torch, dst))
            assert name(ours.dtype) == dst
            assert_close(ours.float() if dst == "bfloat16" else ours,
                         theirs.float() if dst == "bfloat16" else theirs)
