"""Tensor.__getitem__ (basic, integer-array, boolean-mask, mixed) and index_put vs PyTorch."""
import warnings

import numpy as np
import pytest
import torch

import tapegrad
from tapegrad.ops import movement
from helpers import check_op, check_torch, make_inputs


def _t(T, a):
    return T.tensor(np.asarray(a))


MASK = np.array([[True, False, True, True], [False, False, True, False],
                 [True, True, False, False]])

# (name, index builder(T) -> index, input shape)
GETITEM = [
    ("int", lambda T: 1, (3, 4)),
    ("int_neg", lambda T: -1, (3, 4)),
    ("int_pair", lambda T: (1, -2), (3, 4)),
    ("int_3d", lambda T: (0, 2, 1), (2, 3, 2)),
    ("slice", lambda T: slice(1, 3), (3, 4)),
    ("slice_step", lambda T: (slice(None), slice(None, None, 2)), (3, 4)),
    ("slice_step_start", lambda T: (slice(1, None, 2), slice(3, 0, 1)), (4, 4)),
    ("slice_neg_bounds", lambda T: (slice(-2, None), slice(-3, -1)), (3, 4)),
    ("slice_out_of_range", lambda T: slice(1, 10), (3, 4)),
    ("int_slice", lambda T: (slice(None), 1), (3, 4)),
    ("none", lambda T: None, (3, 4)),
    ("none_middle", lambda T: (slice(None), None, 2), (3, 4)),
    ("ellipsis", lambda T: (Ellipsis, 1), (2, 3, 2)),
    ("ellipsis_middle", lambda T: (0, Ellipsis, 1), (2, 3, 2)),
    ("ellipsis_none", lambda T: (1, Ellipsis, None), (3, 4)),
    ("empty_tuple", lambda T: (), (3, 4)),
    ("scalar_tensor_int", lambda T: _t(T, 2), (3, 4)),
    ("list", lambda T: [2, 0, 2, 1], (3, 4)),
    ("list_neg", lambda T: [-1, 0, -3], (3, 4)),
    ("tensor", lambda T: _t(T, [0, 2, 0]), (3, 4)),
    ("tensor_int32", lambda T: T.tensor([1, 1], dtype=T.int32), (3, 4)),
    ("ndarray", lambda T: np.array([1, -1]), (3, 4)),
    ("tensor_2d", lambda T: _t(T, [[0, 1], [2, 0]]), (3, 4)),
    ("array_second_dim", lambda T: (slice(None), _t(T, [3, 0, 3])), (3, 4)),
    ("arrays_paired", lambda T: (_t(T, [0, 2, 2]), _t(T, [1, 1, -1])), (3, 4)),
    ("arrays_broadcast", lambda T: (_t(T, [[0], [2]]), _t(T, [1, 3, 1])), (3, 4)),
    ("arrays_separated", lambda T: (_t(T, [0, 1]), slice(None), _t(T, [1, 0])), (2, 3, 2)),
    ("array_and_int", lambda T: (1, slice(None), _t(T, [1, 0, 1])), (2, 3, 2)),
    ("array_slice_mix", lambda T: (slice(1, None), [0, 2, 2]), (3, 4)),
    ("array_none_ellipsis", lambda T: (None, _t(T, [1, 0]), Ellipsis, 1), (2, 3, 2)),
    ("int_between_arrays", lambda T: (_t(T, [1, 0]), 0, _t(T, [1, 1])), (2, 3, 2)),
    ("int_mask", lambda T: (0, slice(None), _t(T, [True, False])), (2, 3, 2)),
    ("int_none_array_step", lambda T: (1, None, [2, 0], slice(None, None, 2)), (2, 3, 4)),
    ("array_int_none", lambda T: ([1], 2, slice(None), None), (2, 3, 4)),
    ("int_2d_array_slice", lambda T: (1, _t(T, [[0], [2]]), slice(1, 3)), (2, 3, 4)),
    ("empty_list", lambda T: [], (3, 4)),
    ("mask", lambda T: _t(T, MASK), (3, 4)),
    ("mask_rows", lambda T: _t(T, [True, False, True]), (3, 4)),
    ("mask_list", lambda T: [True, False, True], (3, 4)),
    ("mask_second_dim", lambda T: (slice(None), _t(T, [False, True, True, False])), (3, 4)),
    ("mask_and_int", lambda T: (_t(T, [True, False, True]), 1), (3, 4)),
    ("mask_and_array", lambda T: (_t(T, [True, False, True]), _t(T, [3, 0])), (3, 4)),
    ("mask_all_false", lambda T: _t(T, np.zeros((3, 4), bool)), (3, 4)),
    ("mask_3d_leading", lambda T: _t(T, [[True, False, True], [False, True, True]]), (2, 3, 2)),
    ("bool_true", lambda T: True, (3, 4)),
    ("bool_false", lambda T: (False,), (3, 4)),
    ("tuple_in_tuple", lambda T: ((0, 2), 1), (3, 4)),
]


@pytest.mark.parametrize("make_index,shape", [c[1:] for c in GETITEM],
                         ids=[c[0] for c in GETITEM])
def test_getitem_matches_torch(make_index, shape):
    check_op(lambda T, x: x[make_index(T)], [shape])


def test_repeated_indices_accumulate_like_add_at():
    x = tapegrad.tensor([1.0, 2.0, 3.0], dtype=tapegrad.float64, requires_grad=True)
    x[[0, 0, 2, 0]].sum().backward()
    assert x.grad.tolist() == [3.0, 0.0, 1.0]
    y = tapegrad.zeros(2, 3, dtype=tapegrad.float64, requires_grad=True)
    y[[1, 1], [2, 2]].sum().backward()
    expected = np.zeros((2, 3))
    np.add.at(expected, ([1, 1], [2, 2]), 1.0)
    np.testing.assert_array_equal(y.grad.numpy(), expected)


def test_mask_from_comparison_and_diamonds():
    check_op(lambda T, x: x[x > 0].sum() + x[0] * x[1], [(3, 4)])
    check_op(lambda T, x: x[0] + x[1] + x[:, 1].sum(), [(3, 4)])
    check_op(lambda T, x: x[[0, 0]] * x[0], [(3, 4)])


def test_nested_indexing_chain():
    check_op(lambda T, x: x[1:][:, [0, 2]][0] * x[..., 0].sum(), [(3, 4)])


def test_list_of_lists_is_a_tuple_as_in_torch():
    def f(T, x):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return x[[[0, 2], [1, 3]]]

    check_op(f, [(3, 4)])
    with pytest.warns(UserWarning, match="non-tuple sequence"):
        tapegrad.zeros(3, 4)[[[0, 2], [1, 3]]]


def test_basic_indexing_gives_views_and_advanced_copies():
    x = tapegrad.zeros(3, 4)
    for v in (x[0], x[:, 1], x[1:, ::2], x[None], x[..., 0], x[()], x[0, 0]):
        assert v._version is x._version
        v._data[...] = 1.0 if v.ndim else 1.0  # writes reach x: the same storage
    assert x._data.sum() > 0
    y = tapegrad.zeros(3, 4)
    for c in (y[[0, 1]], y[y > -1], y[:, [1]], y[tapegrad.tensor([0])]):
        assert c._version is not y._version
        c._data[...] = 1.0
    assert y._data.sum() == 0


def test_result_is_always_an_array():
    x = tapegrad.arange(12.0).reshape(3, 4)
    for index in [(1, 2), (tapegrad.tensor(1), tapegrad.tensor(2)), (np.array(1), 2)]:
        r = x[index]
        assert r.shape == () and isinstance(r._data, np.ndarray) and r.item() == 6.0


def test_int_tensors_index_without_grad():
    x = tapegrad.arange(12).reshape(3, 4)
    t = torch.arange(12).reshape(3, 4)
    for index in [(1,), (slice(None), [0, 3]), (t > 5,)]:
        ti = index
        gi = tuple(tapegrad.tensor(i.numpy()) if isinstance(i, torch.Tensor) else i
                   for i in index)
        assert x[gi].tolist() == t[ti].tolist()


def test_iteration_stops_at_the_end():
    x = tapegrad.arange(6.0).reshape(3, 2)
    assert [r.tolist() for r in x] == [[0.0, 1.0], [2.0, 3.0], [4.0, 5.0]]


# --- errors ---------------------------------------------------------------------------------
ERRORS = [
    (lambda T: 3, IndexError, "index 3 is out of bounds for dimension 0 with size 3"),
    (lambda T: -4, IndexError, "index -4 is out of bounds for dimension 0 with size 3"),
    (lambda T: (0, 4), IndexError, "index 4 is out of bounds for dimension 1 with size 4"),
    (lambda T: (Ellipsis, -5), IndexError, "index -5 is out of bounds for dimension 1 with "
     "size 4"),
    (lambda T: _t(T, [0, 3]), IndexError, "index 3 is out of bounds for dimension 0 with size 3"),
    (lambda T: (slice(None), _t(T, [[1], [-7]])), IndexError, "index -7 is out of bounds for "
     "dimension \\d with size 4"),
    (lambda T: [0, 5], IndexError, "index 5 is out of bounds for dimension 0 with size 3"),
    (lambda T: (None, 0, [4]), IndexError, "index 4 is out of bounds for dimension \\d with "
     "size 4"),
    (lambda T: slice(None, None, -1), ValueError, "step must be greater than zero"),
    (lambda T: (slice(None), slice(None, None, 0)), ValueError, "slice step cannot be zero"),
    (lambda T: (0, 0, 0), IndexError, "too many indices for tensor of dimension 2"),
    (lambda T: _t(T, [True, False]), IndexError, "The shape of the mask \\[2\\] at index 0 does "
     "not match the shape of the indexed tensor \\[3, 4\\] at index 0"),
    (lambda T: (slice(None), _t(T, [True, False])), IndexError, "The shape of the mask \\[2\\] "
     "at index 0 does not match the shape of the indexed tensor \\[3, 4\\] at index 1"),
    (lambda T: T.tensor([0.0]), IndexError, "tensors used as indices must be long, int, byte or "
     "bool"),
    (lambda T: 1.5, IndexError, "only integers, slices"),
    (lambda T: ([0, 1], [0, 1, 2]), IndexError, "shape mismatch: indexing tensors could not be "
     "broadcast together with shapes \\[2\\], \\[3\\]"),
    (lambda T: (_t(T, [True, False, True]), [0, 1, 2]), IndexError, "shape mismatch"),
]


@pytest.mark.parametrize("make_index,exc,match", ERRORS)
def test_getitem_errors_match_torch(make_index, exc, match):
    with pytest.raises(exc, match=match):
        torch.zeros(3, 4)[make_index(torch)]
    with pytest.raises(exc, match=match):
        tapegrad.zeros(3, 4)[make_index(tapegrad)]


def test_array_index_errors_name_the_dim():
    x = tapegrad.zeros(3, 4)
    with pytest.raises(IndexError, match="index -7 is out of bounds for dimension 1 with size 4"):
        x[:, tapegrad.tensor([[1], [-7]])]
    with pytest.raises(IndexError, match="index 4 is out of bounds for dimension 1 with size 4"):
        x[None, 0, [4]]
    with pytest.raises(IndexError, match="index 9 is out of bounds for dimension 2 with size 4"):
        tapegrad.zeros(2, 3, 4)[[0], ..., [9]]
    # PyTorch accepts a second Ellipsis (and a str as a sequence); tapegrad raises clearly
    with pytest.raises(IndexError, match="single ellipsis"):
        x[..., ...]
    with pytest.raises(IndexError, match="only integers, slices"):
        x["a"]


def test_0d_indexing_errors():
    with pytest.raises(IndexError, match="invalid index of a 0-dim tensor"):
        torch.tensor(1.0)[0]
    with pytest.raises(IndexError, match="invalid index of a 0-dim tensor"):
        tapegrad.tensor(1.0)[0]
    assert tapegrad.tensor(1.0)[None].shape == (1,)
    assert tapegrad.tensor(1.0)[...].shape == ()


# --- index_put: out-of-place a[index] = v ---------------------------------------------------
def _put(index, accumulate=False):
    def fn(T, a, v):
        if T is torch:
            if accumulate:
                ix = index(T) if isinstance(index(T), tuple) else (index(T),)
                return torch.index_put(a, ix, v, accumulate=True)
            out = a.clone()
            out[index(T)] = v
            return out
        return movement.index_put(a, v, index=index(T), accumulate=accumulate)
    return fn


PUTS = [
    ("int_row", lambda T: 1, [(3, 4), (4,)]),
    ("slice_broadcast_v", lambda T: (slice(None), slice(1, 3)), [(3, 4), (1, 2)]),
    ("step_scalar_v", lambda T: (slice(None, None, 2),), [(3, 4), ()]),
    ("v_leading_ones", lambda T: 0, [(3, 4), (1, 1, 4)]),
    ("int_array", lambda T: _t(T, [2, 0]), [(3, 4), (2, 4)]),
    ("int_array_broadcast_v", lambda T: _t(T, [2, 0]), [(3, 4), (4,)]),
    ("paired_arrays", lambda T: (_t(T, [0, 2]), _t(T, [3, -1])), [(3, 4), (2,)]),
    ("mask", lambda T: _t(T, MASK), [(3, 4), (6,)]),
    ("mask_scalar_v", lambda T: _t(T, MASK), [(3, 4), (1,)]),
    ("mask_rows", lambda T: _t(T, [True, False, True]), [(3, 4), (1, 4)]),
    ("mixed", lambda T: (slice(1, None), _t(T, [0, 3])), [(3, 4), (2, 2)]),
    ("int_then_array", lambda T: (1, slice(None), _t(T, [1, 0])), [(2, 3, 2), (3, 2)]),
    ("int_between_arrays", lambda T: (_t(T, [1, 0]), 0, _t(T, [1, 1])), [(2, 3, 2), (2,)]),
]


@pytest.mark.parametrize("index,specs", [c[1:] for c in PUTS], ids=[c[0] for c in PUTS])
def test_index_put_matches_torch(index, specs):
    check_op(_put(index), specs)


@pytest.mark.parametrize("index,specs", [
    (lambda T: (_t(T, [0, 2, 0, 0]),), [(3, 4), (4, 4)]),
    (lambda T: (_t(T, [1, 1]), _t(T, [2, 2])), [(3, 4), (2,)]),
    (lambda T: (_t(T, [2, 2]),), [(3, 4), (4,)]),
], ids=["rows_repeated", "elements_repeated", "broadcast_repeated"])
def test_index_put_accumulate_matches_torch(index, specs):
    check_op(_put(index, accumulate=True), specs)


def test_index_put_casts_values_and_their_gradient():
    a, v = make_inputs([(3, 4), (4,)])

    def fn(T, a, v):
        v32 = v.float()
        if T is torch:
            out = a.clone()
            out[1] = v32
            return out * v32.sum()
        return movement.index_put(a, v32, index=1) * v32.sum()

    check_torch(fn, [a, v], rtol=1e-6)
    out = movement.index_put(tapegrad.zeros(2, 2, dtype=tapegrad.int64), 2.7, index=(0, 1))
    assert out.dtype is tapegrad.int64 and out.tolist() == [[0, 2], [0, 0]]
    out = movement.index_put(tapegrad.zeros(3), [1.0, 2.0], index=[0, 2])
    assert out.tolist() == [1.0, 0.0, 2.0]


def test_index_put_leaves_input_alone():
    a = tapegrad.zeros(2, 3)
    out = movement.index_put(a, 1.0, index=(slice(None), 1))
    assert a._data.sum() == 0 and out._data.sum() == 2
    assert out._version is not a._version


def test_index_put_errors():
    a = tapegrad.zeros(3, 4)
    with pytest.raises(IndexError, match="index 3 is out of bounds for dimension 0 with size 3"):
        movement.index_put(a, 1.0, index=3)
    with pytest.raises(RuntimeError, match="index_put.*broadcast"):
        movement.index_put(a, tapegrad.zeros(3), index=0)


def _random_index(rng, shape):
    """A random mixture of every index kind that fits ``shape``."""
    items, d, ellipsis = [], 0, False
    for _ in range(rng.integers(1, 5)):
        n = shape[min(d, len(shape) - 1)]
        k = rng.integers(7)
        if k == 0:
            it, used = int(rng.integers(-n, n)), 1
        elif k == 1:
            it = slice(rng.choice([None, 0, 1]), rng.choice([None, -1, n]),
                       rng.choice([None, 1, 2]))
            used = 1
        elif k == 2:
            it, used = None, 0
        elif k == 3:
            it, used = rng.integers(-n, n, size=rng.integers(1, 4)).tolist(), 1
        elif k == 4:
            it, used = rng.random(n) < 0.5, 1
        elif k == 5:
            it, used = rng.integers(0, n, size=(2, 1)), 1
        else:
            if ellipsis:
                continue
            it, used, ellipsis = Ellipsis, 0, True
        if d + used > len(shape):
            break
        items.append(it)
        d += used
    return tuple(items)


def test_random_index_mixtures_match_torch():
    """Values, gradients and index_put writes for random mixtures of index kinds."""
    rng = np.random.default_rng(0)
    base = rng.standard_normal((3, 4, 2))
    checked = 0
    for _ in range(400):
        index = _random_index(rng, base.shape)
        t_index = tuple(torch.tensor(i) if isinstance(i, np.ndarray) else i for i in index)
        g_index = tuple(tapegrad.tensor(i) if isinstance(i, np.ndarray) else i for i in index)
        tx = torch.tensor(base, requires_grad=True)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                expected = tx[t_index]
            except (IndexError, RuntimeError):
                with pytest.raises((IndexError, RuntimeError)):
                    tapegrad.tensor(base)[g_index]
                continue
        if expected.numel() == 0:
            continue  # PyTorch skips bounds checks for empty results; tapegrad raises
        gx = tapegrad.tensor(base, requires_grad=True)
        got = gx[g_index]
        np.testing.assert_array_equal(got.detach().numpy(), expected.detach().numpy(),
                                      err_msg=str(index))
        w = rng.standard_normal(tuple(expected.shape))
        (expected * torch.tensor(w)).sum().backward()
        (got * tapegrad.tensor(w)).sum().backward()
        np.testing.assert_allclose(gx.grad.numpy(), tx.grad.numpy(), rtol=1e-12,
                                   err_msg=str(index))
        out = torch.tensor(base)
        out[t_index] = torch.tensor(w)
        put = movement.index_put(tapegrad.tensor(base), tapegrad.tensor(w), index=g_index)
        np.testing.assert_array_equal(put.numpy(), out.numpy(), err_msg=str(index))
        checked += 1
    assert checked > 200
