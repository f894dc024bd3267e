"""Error wording: each case raises PyTorch's exception type, and the message
names the op and carries PyTorch's information (shapes, lengths, sizes, bytes)."""
import re

import numpy as np
import pytest
import torch

import tapegrad


def _both(fn):
    """Run ``fn(torch)`` and ``fn(tapegrad)``; both must raise the same exception type."""
    with pytest.raises(Exception) as theirs:
        fn(torch)
    with pytest.raises(type(theirs.value)) as mine:
        fn(tapegrad)
    assert type(mine.value) is type(theirs.value)
    return str(theirs.value), str(mine.value)


# --- matmul and its front ends -----------------------------------------------------------
MATMUL = [
    ("batched", lambda T: T.ones(2, 3, 4) @ T.ones(2, 5, 6), "matmul", ["(2, 3, 4)", "(2, 5, 6)",
                                                                       "4 != 5"]),
    ("batch-broadcast", lambda T: T.ones(2, 3, 4) @ T.ones(3, 4, 6), "matmul",
     ["(2, 3, 4)", "(3, 4, 6)", "size of tensor a (2) must match the size of tensor b (3) at "
      "non-singleton dimension 0"]),
    ("batch-broadcast-4d", lambda T: T.matmul(T.ones(5, 2, 3, 4), T.ones(3, 4, 6)), "matmul",
     ["(5, 2, 3, 4)", "(3, 4, 6)", "non-singleton dimension 1"]),
    ("1d-2d", lambda T: T.ones(4) @ T.ones(5, 6), "matmul", ["(4,)", "(5, 6)", "4 != 5"]),
    ("2d-1d", lambda T: T.ones(3, 4) @ T.ones(5), "matmul", ["(3, 4)", "(5,)", "4 != 5"]),
    ("1d-1d", lambda T: T.matmul(T.ones(4), T.ones(5)), "matmul", ["(4,)", "(5,)"]),
    ("3d-1d", lambda T: T.ones(2, 3, 4) @ T.ones(5), "matmul", ["(2, 3, 4)", "(5,)"]),
    ("1d-3d", lambda T: T.ones(4) @ T.ones(2, 5, 6), "matmul", ["(4,)", "(2, 5, 6)"]),
    ("mm", lambda T: T.mm(T.ones(3, 4), T.ones(5, 6)), "mm", ["3x4 and 5x6"]),
    ("bmm", lambda T: T.bmm(T.ones(2, 3, 4), T.ones(2, 5, 6)), "bmm",
     ["(2, 3, 4)", "(2, 5, 6)", "[2, 4]", "[2, 5]"]),
    ("bmm-batch", lambda T: T.bmm(T.ones(2, 3, 4), T.ones(3, 4, 6)), "bmm",
     ["(2, 3, 4)", "(3, 4, 6)"]),
    ("dot", lambda T: T.dot(T.ones(3), T.ones(4)), "dot", ["3 and 4"]),
    ("einsum", lambda T: T.einsum("ij,jk->ik", T.ones(3, 4), T.ones(5, 6)), "einsum",
     ["subscript j has size 5", "size 4"]),
    ("einsum-batch", lambda T: T.einsum("bij,bjk->bik", T.ones(2, 3, 4), T.ones(3, 4, 6)),
     "einsum", ["subscript b has size 3"]),
    ("linear", lambda T: T.nn.functional.linear(T.ones(3, 4), T.ones(6, 5)), "linear",
     ["(3, 4)", "4 != 5"]),
    ("linear-1d", lambda T: T.nn.functional.linear(T.ones(4), T.ones(6, 5)), "linear",
     ["(4,)"]),
    ("linear-3d", lambda T: T.nn.functional.linear(T.ones(2, 3, 4), T.ones(6, 5)), "linear",
     ["(2, 3, 4)"]),
]


@pytest.mark.parametrize("fn,op,parts", [c[1:] for c in MATMUL], ids=[c[0] for c in MATMUL])
def test_matmul_family(fn, op, parts):
    _, mine = _both(fn)
    assert mine.startswith(op), mine
    for part in parts:
        assert part in mine, (part, mine)
    assert "numpy" not in mine and "remapped" not in mine and "gufunc" not in mine


def test_matmul_batch_error_under_autograd():
    a = tapegrad.ones(2, 3, 4, requires_grad=True)
    with pytest.raises(RuntimeError, match=r"matmul: shapes \(2, 3, 4\) and \(3, 4, 6\)"):
        a @ tapegrad.ones(3, 4, 6)


# --- nested lists: ragged, non-numeric, overflowing --------------------------------------
NESTED = [
    ("ragged", [[1, 2], [3]], {}),
    ("ragged-longer", [[1], [3, 4]], {}),
    ("ragged-empty-row", [[1], []], {}),
    ("ragged-deep", [[[1, 2], [3, 4]], [[1, 2], [3]]], {}),
    ("ragged-third-row", [[1, 2], [3, 4], [5]], {}),
    ("ragged-tuple", ((1.0, 2.0), (3.0,)), {}),
    ("ragged-bool", [[True], [False, True]], {}),
    ("ragged-float-dtype", [[1, 2], [3]], dict(dtype="float64")),
    ("ragged-int-dtype", [[1], [2, 3]], dict(dtype="int64")),
    ("scalar-then-list", [1, [2]], {}),
    ("float-then-list", [1.0, [2.0]], {}),
    ("list-then-scalar", [[2], 1], {}),
    ("arrays-ragged", [np.ones(2), np.ones(3)], {}),
    ("arrays-ragged-deep", [np.ones((2, 2)), np.ones((2, 3))], {}),
    ("array-and-list", [np.ones(2), [1, 2, 3]], {}),
    ("str-in-list", ["a"], {}),
    ("str-top", "a", {}),
    ("bytes-top", b"ab", {}),
    ("str-nested", [["a"]], {}),
    ("str-after-number", [1, "a"], {}),
    ("str-row", [[1], ["a"]], {}),
    ("bytes-in-list", [b"a"], {}),
    ("str-float-dtype", [1, "a"], dict(dtype="float32")),
    ("none", [None], {}),
    ("none-top", None, {}),
    ("none-after-number", [1.0, None], {}),
    ("none-first-then-str", [None, "a"], {}),
    ("none-nested", [[1, None]], {}),
    ("none-float-dtype", [None], dict(dtype="float32")),
    ("none-int-dtype", [None], dict(dtype="int64")),
    ("dict", {1: 2}, {}),
    ("dict-in-list", [{1: 2}], {}),
    ("set", {1, 2}, {}),
    ("object", [object()], {}),
    ("int-overflow", [2 ** 70], {}),
    ("int-overflow-top", 2 ** 70, {}),
    ("int-underflow", [-2 ** 63 - 1], {}),
    ("object-array", np.array([1, "a"], dtype=object), {}),
    ("str-array", np.array(["a"]), {}),
]


def _dtype(T, kw):
    return {k: getattr(T, v) for k, v in kw.items()}


@pytest.mark.parametrize("factory", ["tensor", "as_tensor"])
@pytest.mark.parametrize("data,kw", [c[1:] for c in NESTED], ids=[c[0] for c in NESTED])
def test_nested_data_errors(factory, data, kw):
    theirs, mine = _both(lambda T: getattr(T, factory)(data, **_dtype(T, kw)))
    if not isinstance(data, np.ndarray):
        assert mine.startswith("tensor(")
        # PyTorch's own words are kept ("expected sequence of length 2 at dim 1 (got 1)" ...)
        assert theirs.split(" (Triggered")[0].removeprefix("new(): ") in mine, (theirs, mine)


@pytest.mark.parametrize("data", [[[1, 2], [3]], [None], ["a"], [1, [2]]],
                         ids=["ragged", "none", "str", "scalar-then-list"])
@pytest.mark.parametrize("path", ["Tensor", "FloatTensor", "new_tensor"])
def test_nested_data_errors_legacy_paths(data, path):
    def make(T):
        if path == "new_tensor":
            return T.ones(2).new_tensor(data)
        return getattr(T, path)(data)
    _both(make)


@pytest.mark.parametrize("data,kw", [
    ([[], [1]], {}), ([[], [1]], dict(dtype="int64")), ([2 ** 70], dict(dtype="float64")),
    ([[2 ** 70], [1.5]], {}), ([np.float64(1.5), 2], {}), ([[1, 2], [3, 4]], {}),
])
def test_irregular_data_that_converts(data, kw):
    mine = tapegrad.tensor(data, **_dtype(tapegrad, kw))
    theirs = torch.tensor(data, **_dtype(torch, kw))
    assert str(mine.dtype).split(".")[-1] == str(theirs.dtype).split(".")[-1]
    np.testing.assert_array_equal(mine.numpy(), theirs.numpy())


def test_complex_data_names_the_gap():
    with pytest.raises(TypeError, match=r"tensor\(\): complex numbers are not supported"):
        tapegrad.tensor([1 + 2j])


# --- impossible sizes ------------------------------------------------------------------------
SIZES = [
    ("empty-2**62", lambda T: T.empty(2 ** 62), "empty"),
    ("zeros-2**40-squared", lambda T: T.zeros(2 ** 40, 2 ** 40), "zeros"),
    ("zeros-overflow-before-0", lambda T: T.zeros(2 ** 40, 2 ** 40, 0), "zeros"),
    ("ones-cubed", lambda T: T.ones(2 ** 32, 2 ** 32, 2 ** 32), "ones"),
    ("full-2**62", lambda T: T.full((2 ** 62,), 1.0), "full"),
    ("randn-2**62", lambda T: T.randn(2 ** 62), "randn"),
    ("rand-2**62", lambda T: T.rand(2 ** 62, dtype=T.float64), "rand"),
    ("randint-2**62", lambda T: T.randint(0, 5, (2 ** 62,)), "randint"),
    ("randperm-2**62", lambda T: T.randperm(2 ** 62), "randperm"),
    ("arange-2**62", lambda T: T.arange(2 ** 62), "arange"),
    ("arange-float-2**62", lambda T: T.arange(0.0, 2.0 ** 62), "arange"),
    ("arange-1e19", lambda T: T.arange(0, 1e19, 1.0), "arange"),
    ("linspace-2**62", lambda T: T.linspace(0, 1, 2 ** 62), "linspace"),
    ("eye-2**31", lambda T: T.eye(2 ** 31), "eye"),
    ("new_zeros-2**62", lambda T: T.ones(1).new_zeros(2 ** 62), "zeros"),
    ("empty-int8-2**62", lambda T: T.empty(2 ** 62, dtype=T.int8), "empty"),  # no overflow
]


@pytest.mark.parametrize("fn,name", [c[1:] for c in SIZES], ids=[c[0] for c in SIZES])
def test_impossible_sizes(fn, name):
    _, mine = _both(fn)
    assert mine.startswith(name + ":"), mine
    assert "bytes" in mine and re.search(r"sizes=\[\d+", mine), mine


def test_allocation_failure_names_the_bytes():
    with pytest.raises(RuntimeError, match=r"empty: can't allocate memory: you tried to allocate "
                                           r"4611686018427387904 bytes"):
        tapegrad.empty(2 ** 62, dtype=tapegrad.int8)


@pytest.mark.parametrize("fn,name", [
    (lambda T: T.ones(-1), "ones"), (lambda T: T.zeros(2, -3), "zeros"),
    (lambda T: T.randn(-1), "randn"), (lambda T: T.full((-1,), 1.0), "full"),
    (lambda T: T.empty(2 ** 63), "empty"), (lambda T: T.zeros(3, 2 ** 64), "zeros"),
])
def test_negative_and_unrepresentable_sizes(fn, name):
    theirs, mine = _both(fn)
    assert mine.startswith(name), mine
    if "Overflow" in theirs:
        assert "Overflow when unpacking long long" in mine
    else:
        assert re.search(r"negative dimension -\d: \[", mine), mine


def test_zero_sized_dims():
    for T in (torch, tapegrad):
        assert tuple(T.zeros(0, 2 ** 20).shape) == (0, 2 ** 20)
        assert tuple(T.empty(2 ** 40, 0).shape) == (2 ** 40, 0)
    # PyTorch makes these; numpy's strides cannot hold them (docs/differences.md)
    with pytest.raises(RuntimeError,
                       match=r"zeros: an empty tensor with sizes=\[0, 4611686018427387904\]"):
        tapegrad.zeros(0, 2 ** 62)


@pytest.mark.parametrize("dtype", ["int64", "int32", "bool"])
@pytest.mark.parametrize("name, call", [
    ("layer_norm", lambda F, x: F.layer_norm(x, (3,))),
    ("rms_norm", lambda F, x: F.rms_norm(x, (3,))),
    ("batch_norm", lambda F, x: F.batch_norm(x, None, None, training=True)),
    ("instance_norm", lambda F, x: F.instance_norm(x)),
    ("group_norm", lambda F, x: F.group_norm(x, 2)),
])
def test_normalisations_refuse_non_floating_input(name, call, dtype):
    """As PyTorch: NotImplementedError naming the kernel and the scalar type (no silent
    float result, no integer result)."""
    x = np.ones((2, 4, 3), dtype=dtype)
    with pytest.raises(NotImplementedError) as want:
        call(torch.nn.functional, torch.tensor(x))
    with pytest.raises(NotImplementedError) as got:
        call(tapegrad.nn.functional, tapegrad.tensor(x))
    assert str(got.value) == f"{name}: {want.value}"
