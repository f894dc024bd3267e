"""Index bounds against PyTorch: no op that takes indices wraps around or clips silently.

Every case runs in PyTorch and in tapegrad. Where PyTorch raises, tapegrad raises the same
exception type with a message naming the op (where PyTorch's own message does not, as in
``x[idx]``, tapegrad keeps PyTorch's text) and the bad index or size; where PyTorch accepts
the indices (negative indices in ``x[idx]``, ``padding_idx=-1``, take_along_dim's modulo,
``ignore_index``), values and gradients agree in float64.
"""
import warnings

import numpy as np
import pytest
import torch

import tapegrad
from tapegrad.ops import movement
from helpers import check_torch, make_inputs


def F(T):
    return torch.nn.functional if T is torch else tapegrad.nn.functional


def I(T, a, dtype="int64"):  # noqa: E743 - an index tensor
    return T.tensor(np.asarray(a, dtype=dtype))


def X(T, shape=(3, 4)):
    return T.tensor(np.arange(float(np.prod(shape))).reshape(shape))


def _index_put(T, x, index, v, accumulate):
    if T is torch:
        return torch.index_put(x, index if isinstance(index, tuple) else (index,), v,
                               accumulate=accumulate)
    return movement.index_put(x, v, index, accumulate=accumulate)


def _setitem(x, index, v):
    x[index] = v
    return x


def _iadd(x, index, v):
    x[index] += v
    return x


# --- cases where PyTorch raises: (id, fn(T), exception type, tapegrad message regex) -------
RAISES = [
    # gather / scatter_add
    ("gather_neg", lambda T: T.gather(X(T), 1, I(T, [[-1], [0], [0]])), RuntimeError,
     r"gather\(\): index -1 is out of bounds for dimension 1 with size 4"),
    ("gather_big", lambda T: T.gather(X(T), 1, I(T, [[4], [0], [0]])), RuntimeError,
     r"gather\(\): index 4 is out of bounds for dimension 1 with size 4"),
    ("gather_dim0_neg", lambda T: T.gather(X(T), 0, I(T, [[0, -3, 0, 0]])), RuntimeError,
     r"gather\(\): index -3 is out of bounds for dimension 0 with size 3"),
    ("gather_method_neg", lambda T: X(T).gather(-1, I(T, [[0, -4]])), RuntimeError,
     r"gather\(\): index -4 is out of bounds for dimension 1 with size 4"),
    ("gather_empty_dim", lambda T: T.gather(T.zeros(3, 0), 1, I(T, [[0], [0], [0]])),
     RuntimeError, r"gather\(\): index 0 is out of bounds for dimension 1 with size 0"),
    ("gather_uint8", lambda T: T.gather(X(T), 1, I(T, [[1], [0], [1]], "uint8")), RuntimeError,
     r"gather\(\): Expected dtype int32/int64 for index"),
    ("gather_int16", lambda T: T.gather(X(T), 1, I(T, [[1], [0], [1]], "int16")), RuntimeError,
     r"gather\(\): Expected dtype int32/int64 for index"),
    ("scatter_add_neg", lambda T: T.scatter_add(X(T), 0, I(T, [[-1, 0, 0, 0]]), X(T)[:1]),
     RuntimeError, r"scatter_add\(\): index -1 is out of bounds for dimension 0 with size 3"),
    ("scatter_add_big", lambda T: T.scatter_add(X(T), 1, I(T, [[0, 4]] * 3), X(T)),
     RuntimeError, r"scatter_add\(\): index 4 is out of bounds for dimension 1 with size 4"),
    ("scatter_add_inplace_neg", lambda T: X(T).scatter_add_(0, I(T, [[0, -2]]), X(T)),
     RuntimeError, r"scatter_add\(\): index -2 is out of bounds for dimension 0 with size 3"),
    ("scatter_add_uint8", lambda T: T.scatter_add(X(T), 0, I(T, [[1, 0]], "uint8"), X(T)),
     RuntimeError, r"scatter_add\(\): Expected dtype int32/int64 for index"),
    # index_select
    ("index_select_neg", lambda T: T.index_select(X(T), 0, I(T, [0, -1])), IndexError,
     r"index_select\(\): index -1 is out of range for dimension 0 with size 3"),
    ("index_select_big", lambda T: X(T).index_select(0, I(T, [3])), IndexError,
     r"index_select\(\): index 3 is out of range for dimension 0 with size 3"),
    ("index_select_neg_int32", lambda T: T.index_select(X(T), -2, I(T, [-3], "int32")),
     IndexError, r"index_select\(\): index -3 is out of range for dimension 0 with size 3"),
    ("index_select_last_dim", lambda T: T.index_select(X(T, (2, 3, 4)), 2, I(T, [0, 4])),
     IndexError, r"index_select\(\): index 4 is out of range for dimension 2 with size 4"),
    # PyTorch's CPU kernel for dim 1, and for empty inputs, raises RuntimeError instead
    ("index_select_dim1_big", lambda T: X(T).index_select(1, I(T, [4])), RuntimeError,
     r"index_select\(\): index 4 is out of range for dimension 1 with size 4"),
    ("index_select_dim1_neg", lambda T: T.index_select(X(T, (2, 3, 4)), 1, I(T, [-1])),
     RuntimeError, r"index_select\(\): index -1 is out of range for dimension 1 with size 3"),
    ("index_select_empty_input", lambda T: T.index_select(T.zeros(0, 3, 4), 2, I(T, [9])),
     RuntimeError, r"index_select\(\): index 9 is out of range for dimension 2 with size 4"),
    ("index_select_1d_empty", lambda T: T.index_select(T.zeros(0), 0, I(T, [0])), IndexError,
     r"index_select\(\): index 0 is out of range for dimension 0 with size 0"),
    ("index_select_0d_neg", lambda T: T.index_select(T.tensor(5.0), 0, I(T, [-1])), IndexError,
     r"index_select\(\): index -1 is out of range for dimension 0 with size 1"),
    ("index_select_0d_big", lambda T: T.index_select(T.tensor(5.0), 0, I(T, [1])), IndexError,
     r"index_select\(\): index 1 is out of range for dimension 0 with size 1"),
    ("index_select_empty_dim", lambda T: T.index_select(T.zeros(0, 3), 0, I(T, [0])),
     RuntimeError, r"index_select\(\): self indexing axis dim should be positive .*size 0"),
    ("index_select_uint8", lambda T: T.index_select(X(T), 0, I(T, [1], "uint8")), RuntimeError,
     r"index_select\(\): Expected dtype int32/int64 for index"),
    # take_along_dim: without dim a flat gather (no negatives); with dim int64 only
    ("take_along_dim_flat_neg", lambda T: T.take_along_dim(X(T), I(T, [0, -1])), RuntimeError,
     r"take_along_dim\(\): index -1 is out of bounds for dimension 0 with size 12"),
    ("take_along_dim_flat_-12", lambda T: T.take_along_dim(X(T), I(T, [[-12]])), RuntimeError,
     r"take_along_dim\(\): index -12 is out of bounds for dimension 0 with size 12"),
    ("take_along_dim_flat_big", lambda T: T.take_along_dim(X(T), I(T, [12])), RuntimeError,
     r"take_along_dim\(\): index 12 is out of bounds for dimension 0 with size 12"),
    ("take_along_dim_int32", lambda T: T.take_along_dim(X(T), I(T, [[1]], "int32"), 1),
     RuntimeError, r"take_along_dim\(\): dtype of indices should be int64"),
    ("take_along_dim_empty_dim", lambda T: T.take_along_dim(T.zeros(3, 0), I(T, [[1]] * 3), 1),
     RuntimeError, r"take_along_dim\(\): ZeroDivisionError.*size 0 of dimension 1"),
    # advanced indexing on read (PyTorch's own messages)
    ("getitem_neg", lambda T: X(T)[I(T, [-4])], IndexError,
     r"index -4 is out of bounds for dimension 0 with size 3"),
    ("getitem_big", lambda T: X(T)[I(T, [0, 3])], IndexError,
     r"index 3 is out of bounds for dimension 0 with size 3"),
    ("getitem_list_neg", lambda T: X(T)[[-4, 0]], IndexError,
     r"index -4 is out of bounds for dimension 0 with size 3"),
    ("getitem_dim1_neg", lambda T: X(T)[:, I(T, [[1], [-5]])], IndexError,
     r"index -5 is out of bounds for dimension 1 with size 4"),
    ("getitem_int_and_array", lambda T: X(T)[1, I(T, [-5])], IndexError,
     r"index -5 is out of bounds for dimension \d with size 4"),
    ("getitem_two_arrays", lambda T: X(T)[I(T, [[0], [2]]), I(T, [-5])], IndexError,
     r"index -5 is out of bounds for dimension 1 with size 4"),
    ("getitem_mask_and_array", lambda T: X(T)[I(T, [True, False, True], "bool"), I(T, [4])],
     IndexError, r"index 4 is out of bounds for dimension 1 with size 4"),
    ("getitem_0d_tensor", lambda T: X(T)[I(T, -4)], IndexError,
     r"index -4 is out of bounds for dimension 0 with size 3"),
    ("getitem_int32_neg", lambda T: X(T)[I(T, [-4], "int32")], IndexError,
     r"index -4 is out of bounds for dimension 0 with size 3"),
    ("getitem_int16_tensor", lambda T: X(T)[I(T, [1], "int16")], IndexError,
     r"tensors used as indices must be long, int, byte or bool tensors"),
    ("setitem_int8_tensor", lambda T: _setitem(X(T), I(T, [1], "int8"), 1.0), IndexError,
     r"tensors used as indices must be long, int, byte or bool tensors"),
    ("getitem_empty_dim", lambda T: T.zeros(0, 3)[I(T, [0])], IndexError,
     r"index 0 is out of bounds for dimension 0 with size 0"),
    ("getitem_grad_neg", lambda T: X(T).requires_grad_()[I(T, [-4])], IndexError,
     r"index -4 is out of bounds for dimension 0 with size 3"),
    # advanced indexing on write
    ("setitem_neg", lambda T: _setitem(X(T), I(T, [-4]), 1.0), IndexError,
     r"index -4 is out of bounds for dimension 0 with size 3"),
    ("setitem_big", lambda T: _setitem(X(T), I(T, [3]), 1.0), IndexError,
     r"index 3 is out of bounds for dimension 0 with size 3"),
    ("setitem_dim1", lambda T: _setitem(X(T), (slice(None), I(T, [4])), 1.0), IndexError,
     r"index 4 is out of bounds for dimension \d with size 4"),
    ("setitem_int_and_list", lambda T: _setitem(X(T), (0, [-5]), 1.0), IndexError,
     r"index -5 is out of bounds for dimension \d with size 4"),
    ("setitem_0d_tensor", lambda T: _setitem(X(T), I(T, 3), 1.0), IndexError,
     r"index 3 is out of bounds for dimension 0 with size 3"),
    ("setitem_empty_dim", lambda T: _setitem(T.zeros(0, 3), I(T, [0]), 1.0), IndexError,
     r"index 0 is out of bounds for dimension 0 with size 0"),
    ("setitem_grad_neg", lambda T: _setitem(X(T).requires_grad_() * 1, I(T, [-4]), 1.0),
     IndexError, r"index -4 is out of bounds for dimension 0 with size 3"),
    ("setitem_value_grad_big", lambda T: _setitem(
        X(T), I(T, [3]), T.ones(4, dtype=T.float64, requires_grad=True)), IndexError,
     r"index 3 is out of bounds for dimension 0 with size 3"),
    ("iadd_neg", lambda T: _iadd(X(T), I(T, [-4]), 1.0), IndexError,
     r"index -4 is out of bounds for dimension 0 with size 3"),
    ("index_put_accumulate_neg", lambda T: _index_put(T, X(T), I(T, [-4]), T.tensor(1.0,
     dtype=T.float64), True), IndexError, r"index -4 is out of bounds for dimension 0 with size 3"),
    ("index_put_accumulate_big", lambda T: _index_put(T, X(T), (I(T, [0]), I(T, [4])),
     T.tensor(1.0, dtype=T.float64), True), IndexError,
     r"index 4 is out of bounds for dimension 1 with size 4"),
    ("index_put_neg", lambda T: _index_put(T, X(T), I(T, [-4, 0]), T.tensor(1.0,
     dtype=T.float64), False), IndexError, r"index -4 is out of bounds for dimension 0"),
    # masked ops: a mask is not an index
    ("masked_fill_int_mask", lambda T: T.masked_fill(X(T), I(T, [1, 0, 1, 0]), 1.0),
     RuntimeError, r"masked_fill.*only supports boolean masks"),
    ("masked_fill_uint8_mask", lambda T: T.masked_fill(X(T), I(T, [1, 0, 1, 0], "uint8"), 1.0),
     RuntimeError, r"masked_fill.*only supports boolean masks"),
    ("masked_fill_mask_shape", lambda T: T.masked_fill(X(T), I(T, [True, False], "bool"), 1.0),
     RuntimeError, r"\(2,\).*\(3, 4\)"),
    ("getitem_mask_shape", lambda T: X(T)[I(T, [True, False], "bool")], IndexError,
     r"The shape of the mask \[2\] at index 0 does not match"),
    # embedding: PyTorch never wraps a negative index (only padding_idx counts from the end)
    ("embedding_neg", lambda T: F(T).embedding(I(T, [0, -1]), X(T)), IndexError,
     r"embedding: index out of range in self \(index -1, weight has 3 rows\)"),
    ("embedding_most_neg", lambda T: F(T).embedding(I(T, [[-3]]), X(T)), IndexError,
     r"embedding: index out of range in self \(index -3, weight has 3 rows\)"),
    ("embedding_big", lambda T: F(T).embedding(I(T, [3]), X(T)), IndexError,
     r"embedding: index out of range in self \(index 3, weight has 3 rows\)"),
    ("embedding_neg_int32", lambda T: F(T).embedding(I(T, [-1], "int32"), X(T)), IndexError,
     r"embedding: index out of range in self \(index -1"),
    ("embedding_neg_padding", lambda T: F(T).embedding(I(T, [-1]), X(T), padding_idx=-1),
     IndexError, r"embedding: index out of range in self \(index -1"),
    ("embedding_neg_max_norm", lambda T: F(T).embedding(I(T, [-1]), X(T), max_norm=1.0),
     IndexError, r"embedding: index out of range in self \(index -1"),
    ("embedding_big_max_norm", lambda T: F(T).embedding(I(T, [3]), X(T), max_norm=1.0),
     IndexError, r"embedding: index out of range in self \(index 3"),
    ("embedding_neg_scale_grad", lambda T: F(T).embedding(I(T, [-1]), X(T),
                                                          scale_grad_by_freq=True),
     IndexError, r"embedding: index out of range in self \(index -1"),
    ("embedding_empty_weight", lambda T: F(T).embedding(I(T, [0]), T.zeros(0, 3)),
     RuntimeError, r"embedding: .*self indexing axis dim should be positive"),
    ("embedding_no_columns", lambda T: F(T).embedding(I(T, [-1]), T.zeros(3, 0)), RuntimeError,
     r"embedding: index out of range in self \(index -1, weight has 3 rows\)"),
    ("embedding_uint8", lambda T: F(T).embedding(I(T, [1], "uint8"), X(T)), RuntimeError,
     r"embedding: expected indices of dtype int64 \(Long\) or int32 \(Int\), got uint8"),
    ("embedding_float", lambda T: F(T).embedding(T.tensor([1.0]), X(T)), RuntimeError,
     r"embedding: expected indices of dtype int64"),
    ("embedding_padding_big", lambda T: F(T).embedding(I(T, [0]), X(T), padding_idx=3),
     AssertionError, r"embedding: Padding_idx must be within num_embeddings \(got 3 for 3 rows"),
    ("embedding_padding_neg", lambda T: F(T).embedding(I(T, [0]), X(T), padding_idx=-4),
     AssertionError, r"Padding_idx must be within num_embeddings \(got -4 for 3 rows"),
    ("Embedding_neg", lambda T: T.nn.Embedding(3, 2)(I(T, [-1])), IndexError,
     r"embedding: index out of range in self \(index -1, weight has 3 rows\)"),
    ("Embedding_padding_neg", lambda T: T.nn.Embedding(3, 2, padding_idx=-4), AssertionError,
     r"Padding_idx must be within num_embeddings"),
    # one_hot
    ("one_hot_neg", lambda T: F(T).one_hot(I(T, [-1, 0])), RuntimeError,
     r"one_hot: Class values must be non-negative\. \(got -1\)"),
    ("one_hot_neg_num_classes", lambda T: F(T).one_hot(I(T, [2, -3]), 4), RuntimeError,
     r"one_hot: Class values must be non-negative\. \(got -3\)"),
    ("one_hot_too_few", lambda T: F(T).one_hot(I(T, [3, 0]), 3), RuntimeError,
     r"one_hot: Class values must be smaller than num_classes\. \(got 3 with num_classes=3\)"),
    ("one_hot_zero_classes", lambda T: F(T).one_hot(I(T, [0]), 0), RuntimeError,
     r"one_hot: Class values must be smaller than num_classes"),
    ("one_hot_num_classes_-2", lambda T: F(T).one_hot(I(T, [0]), -2), RuntimeError,
     r"one_hot: Class values must be smaller than num_classes"),
    ("one_hot_empty", lambda T: F(T).one_hot(I(T, [])), RuntimeError,
     r"one_hot: Can not infer total number of classes from empty tensor"),
    ("one_hot_empty_zero", lambda T: F(T).one_hot(I(T, []), 0), RuntimeError,
     r"one_hot: Can not infer total number of classes from empty tensor"),
    ("one_hot_int32", lambda T: F(T).one_hot(I(T, [1], "int32")), RuntimeError,
     r"one_hot: one_hot is only applicable to index tensor of type LongTensor"),
    # class-index loss targets: only ignore_index may lie outside [0, C)
    ("cross_entropy_neg", lambda T: F(T).cross_entropy(X(T), I(T, [-1, 0, 1])), IndexError,
     r"cross_entropy: Target -1 is out of bounds \(4 classes\)"),
    ("cross_entropy_big", lambda T: F(T).cross_entropy(X(T), I(T, [4, 0, 1])), IndexError,
     r"cross_entropy: Target 4 is out of bounds \(4 classes\)"),
    ("cross_entropy_default_ignore_when_changed", lambda T: F(T).cross_entropy(
        X(T), I(T, [-100, 0, 1]), ignore_index=-1), IndexError,
     r"cross_entropy: Target -100 is out of bounds"),
    ("cross_entropy_neg_none", lambda T: F(T).cross_entropy(X(T), I(T, [0, -2, 1]),
                                                             reduction="none"),
     IndexError, r"cross_entropy: Target -2 is out of bounds"),
    ("cross_entropy_neg_weight", lambda T: F(T).cross_entropy(
        X(T), I(T, [-2, 0, 1]), weight=T.ones(4, dtype=T.float64)), IndexError,
     r"cross_entropy: Target -2 is out of bounds"),
    ("cross_entropy_neg_smoothing", lambda T: F(T).cross_entropy(
        X(T), I(T, [-2, 0, 1]), label_smoothing=0.1), IndexError,
     r"cross_entropy: Target -2 is out of bounds"),
    ("cross_entropy_1d_big", lambda T: F(T).cross_entropy(X(T)[0], I(T, 4)), IndexError,
     r"cross_entropy: Target 4 is out of bounds"),
    ("cross_entropy_spatial_neg", lambda T: F(T).cross_entropy(
        X(T, (2, 3, 2)), I(T, [[0, 1], [-1, 2]])), IndexError,
     r"cross_entropy: Target -1 is out of bounds \(3 classes\)"),
    ("cross_entropy_spatial_big", lambda T: F(T).cross_entropy(
        X(T, (2, 3, 2)), I(T, [[0, 1], [3, 2]])), IndexError,
     r"cross_entropy: Target 3 is out of bounds \(3 classes\)"),
    ("cross_entropy_int32_target", lambda T: F(T).cross_entropy(X(T), I(T, [3, 0, 1], "int32")),
     RuntimeError, r"cross_entropy: expected target dtype to be Long"),
    ("nll_loss_neg", lambda T: F(T).nll_loss(X(T), I(T, [-1, 0, 1])), IndexError,
     r"nll_loss: Target -1 is out of bounds \(4 classes\)"),
    ("nll_loss_big_none", lambda T: F(T).nll_loss(X(T), I(T, [4, 0, 1]), reduction="none"),
     IndexError, r"nll_loss: Target 4 is out of bounds"),
    ("nll_loss_1d_neg", lambda T: F(T).nll_loss(X(T)[0], I(T, -1)), IndexError,
     r"nll_loss: Target -1 is out of bounds"),
    ("nll_loss_int32_target", lambda T: F(T).nll_loss(X(T), I(T, [1, 0, 1], "int32")),
     RuntimeError, r"nll_loss: expected target dtype to be Long"),
    ("CrossEntropyLoss_neg", lambda T: T.nn.CrossEntropyLoss()(X(T), I(T, [0, 0, -1])),
     IndexError, r"cross_entropy: Target -1 is out of bounds"),
    ("NLLLoss_big", lambda T: T.nn.NLLLoss()(X(T), I(T, [0, 9, 1])), IndexError,
     r"nll_loss: Target 9 is out of bounds"),
]


@pytest.mark.parametrize("fn,exc,match", [c[1:] for c in RAISES], ids=[c[0] for c in RAISES])
def test_raises_as_torch(fn, exc, match):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(Exception) as theirs:
            fn(torch)
        assert type(theirs.value) is exc, f"PyTorch raised {theirs.value!r}"
        with pytest.raises(exc, match=match) as ours:
            fn(tapegrad)
    assert type(ours.value) is exc


# --- cases where PyTorch accepts the indices: values and float64 gradients agree ------------
ACCEPTS = [
    # (id, fn(T, x), input shape)
    ("getitem_neg", lambda T, x: x[I(T, [-3, -1, -1])], (3, 4)),
    ("getitem_neg_list", lambda T, x: x[[-1, 0, -3]], (3, 4)),
    ("getitem_neg_dim1", lambda T, x: x[:, I(T, [[-4], [3], [-1]])], (3, 4)),
    ("getitem_int_and_neg_array", lambda T, x: x[-1, I(T, [-4, 0])], (3, 4)),
    ("getitem_two_neg_arrays", lambda T, x: x[I(T, [[-3], [2]]), I(T, [-4, -1])], (3, 4)),
    ("getitem_neg_int32", lambda T, x: x[I(T, [-2, 1], "int32")], (3, 4)),
    ("getitem_numpy_int8_neg", lambda T, x: x[np.array([-1, 0, -3], np.int8)], (3, 4)),
    ("getitem_0d_int16_tensor", lambda T, x: x[:, I(T, -2, "int16")], (3, 4)),
    ("getitem_mask_and_neg", lambda T, x: x[I(T, [True, False, True], "bool"), I(T, [-1, 0])],
     (3, 4)),
    ("setitem_neg", lambda T, x: _setitem(x * 1, I(T, [-1, -3]), 7.0), (3, 4)),
    ("setitem_neg_dim1", lambda T, x: _setitem(x * 1, (slice(None), I(T, [-4])), 0.0), (3, 4)),
    ("iadd_neg_repeated", lambda T, x: _iadd(x * 1, I(T, [-1, -1, 0]), 2.0), (3, 4)),
    ("index_put_accumulate_neg", lambda T, x: _index_put(T, x, I(T, [-3, -3, 0]),
                                                         T.tensor(1.5, dtype=T.float64), True),
     (3, 4)),
    ("index_put_accumulate_neg_2d", lambda T, x: _index_put(
        T, x, (I(T, [-1, 2, 0]), I(T, [-4, -4, 3])), T.tensor([1.0, 2.0, 3.0],
                                                                dtype=T.float64), True), (3, 4)),
    ("take_along_dim_neg", lambda T, x: T.take_along_dim(x, I(T, [[-1], [0], [-4]]), 1), (3, 4)),
    # PyTorch 2.13 takes indices modulo the dim size when dim is given
    ("take_along_dim_wraps_beyond", lambda T, x: T.take_along_dim(
        x, I(T, [[4, -5], [100, -9], [7, 1]]), 1), (3, 4)),
    ("take_along_dim_bcast_neg", lambda T, x: T.take_along_dim(x, I(T, [[-1, 0, 4, -7]]), 0),
     (3, 4)),
    ("take_along_dim_flat", lambda T, x: T.take_along_dim(x, I(T, [[11, 0], [5, 5]])), (3, 4)),
    ("gather_valid", lambda T, x: T.gather(x, 1, I(T, [[3, 0], [1, 1], [0, 2]])), (3, 4)),
    ("scatter_add_valid", lambda T, x: T.scatter_add(x, 0, I(T, [[2, 0, 2, 1]]), x[:1] * 2),
     (3, 4)),
    ("index_select_valid", lambda T, x: T.index_select(x, 1, I(T, [3, 0, 3])), (3, 4)),
    ("index_select_empty", lambda T, x: T.index_select(x, 0, I(T, [])), (3, 4)),
    ("embedding_padding_neg", lambda T, w: F(T).embedding(I(T, [[0, 2], [2, 1]]), w,
                                                          padding_idx=-1), (3, 4)),
    ("embedding_padding_most_neg", lambda T, w: F(T).embedding(I(T, [0, 2, 0]), w,
                                                               padding_idx=-3), (3, 4)),
    ("embedding_int32", lambda T, w: F(T).embedding(I(T, [2, 0, 2], "int32"), w), (3, 4)),
    ("embedding_scale_grad", lambda T, w: F(T).embedding(I(T, [2, 0, 2]), w,
                                                         scale_grad_by_freq=True), (3, 4)),
    ("embedding_empty", lambda T, w: F(T).embedding(I(T, []), w), (3, 4)),
    ("cross_entropy_ignore_default", lambda T, x: F(T).cross_entropy(x, I(T, [-100, 0, 3])),
     (3, 4)),
    ("cross_entropy_ignore_neg", lambda T, x: F(T).cross_entropy(x, I(T, [-1, 0, 3]),
                                                                 ignore_index=-1), (3, 4)),
    ("cross_entropy_ignore_out_of_range", lambda T, x: F(T).cross_entropy(
        x, I(T, [7, 0, 3]), ignore_index=7, reduction="none"), (3, 4)),
    ("cross_entropy_ignore_smoothing", lambda T, x: F(T).cross_entropy(
        x, I(T, [-1, 0, 3]), ignore_index=-1, label_smoothing=0.2), (3, 4)),
    ("cross_entropy_uint8_target", lambda T, x: F(T).cross_entropy(x, I(T, [3, 0, 1], "uint8")),
     (3, 4)),
    ("cross_entropy_spatial_ignore", lambda T, x: F(T).cross_entropy(
        x, I(T, [[0, -5], [2, 1]]), ignore_index=-5), (2, 3, 2)),
    ("nll_loss_ignore_neg_weight", lambda T, x: F(T).nll_loss(
        x, I(T, [-2, 1, 3]), weight=T.tensor([1.0, 2.0, 3.0, 4.0], dtype=T.float64),
        ignore_index=-2), (3, 4)),
]


@pytest.mark.parametrize("fn,shape", [c[1:] for c in ACCEPTS], ids=[c[0] for c in ACCEPTS])
def test_accepts_as_torch(fn, shape):
    check_torch(fn, make_inputs([shape]))


def test_one_hot_values_match_torch():
    for idx, n in [([2, 0, 1], -1), ([[0], [3]], 5), ([], 3)]:
        ours = tapegrad.nn.functional.one_hot(I(tapegrad, idx), n)
        theirs = torch.nn.functional.one_hot(I(torch, idx), n)
        assert ours.dtype is tapegrad.int64
        np.testing.assert_array_equal(ours.numpy(), theirs.numpy())


def test_embedding_negative_index_trains_no_row():
    """The reported bug: a negative index used to wrap to the last row and train it."""
    emb = tapegrad.nn.Embedding(4, 2)
    before = emb.weight.detach().clone()
    opt = tapegrad.optim.SGD(emb.parameters(), lr=1.0)
    with pytest.raises(IndexError, match=r"index -1, weight has 4 rows"):
        emb(tapegrad.tensor([[1, -1]])).sum().backward()
    opt.step()
    assert emb.weight.grad is None
    np.testing.assert_array_equal(emb.weight.detach().numpy(), before.numpy())


def test_embedding_padding_neg_row_gets_no_gradient():
    w = tapegrad.tensor(np.arange(8.0).reshape(4, 2), requires_grad=True)
    tapegrad.nn.functional.embedding(tapegrad.tensor([3, 3, 0]), w, padding_idx=-1).sum() \
        .backward()
    np.testing.assert_array_equal(w.grad.numpy(), [[1, 1], [0, 0], [0, 0], [0, 0]])


def test_failed_max_norm_lookup_leaves_weight_untouched():
    w = tapegrad.tensor(np.arange(12.0).reshape(3, 4))
    before = w.numpy().copy()
    with pytest.raises(IndexError):
        tapegrad.nn.functional.embedding(tapegrad.tensor([0, -1]), w, max_norm=1.0)
    np.testing.assert_array_equal(w.numpy(), before)


def test_failed_setitem_leaves_tensor_untouched():
    x = X(tapegrad)
    with pytest.raises(IndexError):
        x[tapegrad.tensor([0, -4])] = 5.0
    np.testing.assert_array_equal(x.numpy(), X(tapegrad).numpy())
    assert x._version[0] == 0
