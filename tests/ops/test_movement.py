"""Shape ops against PyTorch: values, gradients (float64 and float32), gradcheck, second order."""
import numpy as np
import pytest
import torch

import tapegrad
from tapegrad.ops import movement
from helpers import check_op, check_torch, make_inputs


def _pad(T):
    return torch.nn.functional.pad if T is torch else movement.pad


def _idx(T, a):
    return T.tensor(np.asarray(a, dtype=np.int64))


# --- one table row per case: (name, fn(T, *xs), input specs) -----------------------------
CASES = [
    ("reshape_args", lambda T, x: x.reshape(2, -1) * 1.5, [(3, 4)]),
    ("reshape_tuple", lambda T, x: x.reshape((-1, 3)), [(3, 4)]),
    ("reshape_fn", lambda T, x: T.reshape(x, (12,)), [(3, 4)]),
    ("reshape_kw", lambda T, x: T.reshape(x, shape=(4, 3)), [(3, 4)]),
    ("reshape_of_transpose", lambda T, x: x.t().reshape(-1), [(3, 4)]),
    ("view", lambda T, x: x.view(4, 3), [(3, 4)]),
    ("flatten", lambda T, x: x.flatten(), [(2, 3, 2)]),
    ("flatten_start", lambda T, x: x.flatten(1), [(2, 3, 2)]),
    ("flatten_range", lambda T, x: T.flatten(x, 0, -2), [(2, 3, 2)]),
    ("flatten_0d", lambda T, x: x.sum().flatten(), [(2, 3)]),
    ("unflatten", lambda T, x: x.unflatten(1, (2, -1)), [(2, 6)]),
    ("unflatten_neg", lambda T, x: T.unflatten(x, -1, (3, 2)), [(2, 6)]),
    ("squeeze_all", lambda T, x: x.squeeze(), [(1, 3, 1, 2)]),
    ("squeeze_dim", lambda T, x: x.squeeze(2), [(1, 3, 1, 2)]),
    ("squeeze_neg", lambda T, x: T.squeeze(x, -3), [(1, 3, 1, 2)]),
    ("squeeze_tuple", lambda T, x: x.squeeze((0, 2, 3)), [(1, 3, 1, 2)]),
    ("squeeze_noop", lambda T, x: x.squeeze(1) * 2, [(1, 3, 1, 2)]),
    ("unsqueeze", lambda T, x: x.unsqueeze(0), [(2, 3)]),
    ("unsqueeze_end", lambda T, x: T.unsqueeze(x, 2), [(2, 3)]),
    ("unsqueeze_neg", lambda T, x: x.unsqueeze(-2), [(2, 3)]),
    ("transpose", lambda T, x: x.transpose(0, 2), [(2, 3, 2)]),
    ("transpose_neg", lambda T, x: T.transpose(x, -1, -2), [(2, 3, 2)]),
    ("swapaxes", lambda T, x: T.swapaxes(x, 0, 1), [(2, 3)]),
    ("permute", lambda T, x: x.permute(2, 0, 1), [(2, 3, 2)]),
    ("permute_tuple", lambda T, x: T.permute(x, (1, -1, 0)), [(2, 3, 2)]),
    ("t", lambda T, x: x.t(), [(2, 3)]),
    ("t_1d", lambda T, x: T.t(x) * 2, [(3,)]),
    ("T", lambda T, x: x.T, [(2, 3)]),
    ("mT", lambda T, x: x.mT, [(2, 2, 3)]),
    ("expand", lambda T, x: x.expand(2, 3, 4), [(3, 1)]),
    ("expand_keep", lambda T, x: x.expand(2, -1, 3), [(2, 1)]),
    ("expand_tuple", lambda T, x: x.expand((2, 3)), [(3,)]),
    ("expand_as", lambda T, x, y: x.expand_as(y) * y, [(3, 1), (2, 3, 4)]),
    ("broadcast_to", lambda T, x: T.broadcast_to(x, (2, 3, 4)), [(3, 1)]),
    ("broadcast_to_method", lambda T, x: x.broadcast_to((4, 3)), [(3,)]),
    ("broadcast_tensors", lambda T, x, y: T.broadcast_tensors(x, y), [(3, 1), (1, 4)]),
    ("repeat", lambda T, x: x.repeat(2, 3), [(2, 3)]),
    ("repeat_lead", lambda T, x: x.repeat(2, 1, 2), [(2, 3)]),
    ("repeat_tuple", lambda T, x: x.repeat((3,)), [(2,)]),
    ("tile", lambda T, x: T.tile(x, (2,)), [(2, 3)]),
    ("tile_lead", lambda T, x: x.tile(2, 1, 2), [(2, 3)]),
    ("cat0", lambda T, x, y: T.cat([x, y]), [(2, 3), (1, 3)]),
    ("cat1", lambda T, x, y: T.cat((x, y), dim=1), [(2, 3), (2, 2)]),
    ("cat_neg", lambda T, x, y, z: T.cat([x, y, z], -1), [(2, 1), (2, 2), (2, 3)]),
    ("cat_diamond", lambda T, x: T.cat([x, x * 2, x]), [(2, 3)]),
    ("cat_empty_legacy", lambda T, x: T.cat([x, T.zeros(0, dtype=x.dtype), x], 1), [(2, 3)]),
    ("concat", lambda T, x, y: T.concat([x, y], 0), [(2, 3), (1, 3)]),
    ("stack", lambda T, x, y: T.stack([x, y]), [(2, 3), (2, 3)]),
    ("stack_dim", lambda T, x, y: T.stack((x, y), 2), [(2, 3), (2, 3)]),
    ("stack_neg", lambda T, x, y: T.stack([x, y, x], dim=-2), [(2, 3), (2, 3)]),
    ("split_int", lambda T, x: T.split(x, 2), [(5, 2)]),
    ("split_list", lambda T, x: x.split([1, 3, 1], dim=1), [(2, 5)]),
    ("split_sum", lambda T, x: sum(p.sum() for p in x.split(2, 1)), [(2, 5)]),
    ("chunk", lambda T, x: x.chunk(3), [(5, 2)]),
    ("chunk_dim", lambda T, x: T.chunk(x, 2, dim=-1), [(2, 5)]),
    ("chunk_fewer", lambda T, x: T.chunk(x, 4), [(6,)]),
    ("unbind", lambda T, x: T.unbind(x), [(3, 2)]),
    ("unbind_dim", lambda T, x: x.unbind(1), [(3, 2)]),
    ("unbind_diamond", lambda T, x: x.unbind(0)[0] * x.unbind(0)[2], [(3, 2)]),
    ("flip", lambda T, x: T.flip(x, (0,)), [(3, 2)]),
    ("flip_many", lambda T, x: x.flip(0, -1), [(2, 3, 2)]),
    ("flip_kw", lambda T, x: T.flip(x, dims=[1]), [(2, 3)]),
    ("roll", lambda T, x: T.roll(x, 1, 0), [(3, 4)]),
    ("roll_neg", lambda T, x: x.roll(-2, dims=1), [(3, 4)]),
    ("roll_multi", lambda T, x: T.roll(x, (1, -1), (0, 1)), [(3, 4)]),
    ("roll_flat", lambda T, x: T.roll(x, 5), [(3, 4)]),
    ("gather0", lambda T, x: T.gather(x, 0, _idx(T, [[0, 2, 1, 0], [2, 2, 0, 1]])), [(3, 4)]),
    ("gather1", lambda T, x: x.gather(1, _idx(T, [[3, 3], [0, 1], [2, 2]])), [(3, 4)]),
    ("gather_small", lambda T, x: T.gather(x, -1, _idx(T, [[1], [0]])), [(3, 4)]),
    ("scatter_add", lambda T, x, s: T.scatter_add(x, 0, _idx(T, [[0, 2, 0], [0, 1, 2]]), s),
     [(3, 4), (2, 3)]),
    ("scatter_add_dim1", lambda T, x, s: x.scatter_add(1, _idx(T, [[3, 3], [0, 1], [1, 1]]), s),
     [(3, 4), (3, 2)]),
    ("index_select", lambda T, x: T.index_select(x, 0, _idx(T, [2, 0, 2])), [(3, 4)]),
    ("index_select_dim", lambda T, x: x.index_select(-1, _idx(T, [1, 1, 3])), [(3, 4)]),
    ("take_along_dim", lambda T, x: T.take_along_dim(x, _idx(T, [[1], [0], [3]]), 1), [(3, 4)]),
    ("take_along_dim_bcast", lambda T, x: T.take_along_dim(x, _idx(T, [[0, 2]]), 0),
     [(3, 2)]),
    ("take_along_dim_flat", lambda T, x: T.take_along_dim(x, _idx(T, [[5, 0], [11, 5]])),
     [(3, 4)]),
    ("take_along_dim_argmax", lambda T, x: T.take_along_dim(
        x, _idx(T, np.argsort(np.arange(12).reshape(3, 4) % 5, axis=1)), dim=1), [(3, 4)]),
    ("tril", lambda T, x: T.tril(x), [(3, 4)]),
    ("tril_diag", lambda T, x: x.tril(1), [(3, 4)]),
    ("tril_neg_batched", lambda T, x: T.tril(x, diagonal=-1), [(2, 3, 3)]),
    ("triu", lambda T, x: T.triu(x), [(3, 4)]),
    ("triu_diag", lambda T, x: x.triu(-1), [(4, 3)]),
    ("triu_batched", lambda T, x: T.triu(x, 2), [(2, 3, 4)]),
    ("pad_constant", lambda T, x: _pad(T)(x, (1, 2)), [(2, 3)]),
    ("pad_constant_2d", lambda T, x: _pad(T)(x, (1, 0, 2, 1), value=0.5), [(2, 3)]),
    ("pad_constant_all", lambda T, x: _pad(T)(x, [1, 1, 0, 1, 1, 0]), [(1, 2, 3)]),
    ("pad_constant_crop", lambda T, x: _pad(T)(x, (-1, 2, 1, -1)), [(2, 3)]),
    ("pad_reflect", lambda T, x: _pad(T)(x, (2, 1), mode="reflect"), [(2, 3)]),
    ("pad_reflect_2d", lambda T, x: _pad(T)(x, (1, 2, 1, 0), mode="reflect"), [(1, 3, 3)]),
    ("pad_reflect_crop", lambda T, x: _pad(T)(x, (-1, 2), mode="reflect"), [(1, 2, 3)]),
    ("pad_replicate", lambda T, x: _pad(T)(x, (3, 1), mode="replicate"), [(2, 3)]),
    ("pad_replicate_3d", lambda T, x: _pad(T)(x, (1, 0, 0, 1, 1, 1), mode="replicate"),
     [(1, 2, 2, 2)]),
    ("pad_circular", lambda T, x: _pad(T)(x, (3, 1), mode="circular"), [(1, 2, 3)]),
    ("pad_circular_2d", lambda T, x: _pad(T)(x, (1, 1, 2, 0), mode="circular"), [(1, 2, 3)]),
]


@pytest.mark.parametrize("fn,specs", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_matches_torch(fn, specs):
    check_op(fn, specs)


def test_cat_promotes_mixed_dtypes():
    # float32 inside: values and gradients against PyTorch (gradcheck needs float64 paths)
    check_torch(lambda T, x, y: T.cat([x, y.float()], 1), make_inputs([(2, 3), (2, 2)]))
    check_torch(lambda T, x, y: T.stack([x.float(), y]), make_inputs([(2, 3), (2, 3)]))
    check_torch(lambda T, x, y: T.cat([x.float(), y.float()], 1), make_inputs([(2, 3), (2, 2)]),
                rtol=1e-6)
    a = tapegrad.cat([tapegrad.tensor([1, 2]), tapegrad.tensor([0.5])])
    assert a.dtype is tapegrad.float32 and a.tolist() == [1.0, 2.0, 0.5]
    b = tapegrad.cat([tapegrad.tensor([True]), tapegrad.tensor([3], dtype=tapegrad.int32)])
    assert b.dtype is tapegrad.int32


def test_diamonds_accumulate():
    x = tapegrad.tensor([[1.0, 2.0], [3.0, 4.0]], dtype=tapegrad.float64, requires_grad=True)
    (tapegrad.cat([x, x]).sum() + tapegrad.stack([x, x, x]).sum()).backward()
    assert x.grad.tolist() == [[5.0, 5.0], [5.0, 5.0]]


def test_int_tensors_move_without_grad():
    x = tapegrad.arange(6).reshape(2, 3)
    assert x.flip(1).tolist() == [[2, 1, 0], [5, 4, 3]]
    assert tapegrad.roll(x, 1, 1).tolist() == [[2, 0, 1], [5, 3, 4]]
    assert x.repeat(1, 2).tolist() == [[0, 1, 2, 0, 1, 2], [3, 4, 5, 3, 4, 5]]
    assert movement.pad(x, (1, 1), value=2.7).tolist() == [[2, 0, 1, 2, 2], [2, 3, 4, 5, 2]]
    assert tapegrad.tril(x).dtype is tapegrad.int64


def test_views_share_the_version_counter():
    x = tapegrad.randn(2, 3, 4)
    for v in (x.reshape(6, 4), x.permute(2, 0, 1), x.transpose(0, 1), x.unsqueeze(1),
              x[:, 0].squeeze(), x.flatten(1), x.expand(2, 2, 3, 4), *x.split(1),
              *x.unbind(1), *x.chunk(2, 2)):
        assert v._version is x._version
    for c in (x.flip(0), tapegrad.roll(x, 1, 0), x.repeat(1, 1, 1), tapegrad.cat([x, x]),
              tapegrad.tril(x), movement.pad(x, (1, 1))):
        assert c._version is not x._version
    f = x.flip(0)
    f._data[...] = 0  # flip copies, as in PyTorch: the input is untouched
    assert np.all(x._data != 0)


def test_split_and_chunk_shapes_match_torch():
    t = torch.zeros(7, 3)
    x = tapegrad.zeros(7, 3)
    for args in [(3,), ([2, 5],), (7,), (10,), ([0, 7],)]:
        assert [p.shape for p in x.split(*args)] == [tuple(p.shape) for p in t.split(*args)]
    for n in (1, 2, 3, 4, 6, 7, 9):
        assert [p.shape for p in x.chunk(n)] == [tuple(p.shape) for p in t.chunk(n)]
    assert [p.shape for p in tapegrad.zeros(0, 2).chunk(3)] == [
        tuple(p.shape) for p in torch.zeros(0, 2).chunk(3)]


def test_squeeze_unsqueeze_0d():
    x = tapegrad.tensor(2.0)
    assert x.squeeze().shape == () and x.squeeze(0).shape == () and x.squeeze(-1).shape == ()
    assert x.unsqueeze(0).shape == (1,) and x.unsqueeze(-1).shape == (1,)
    assert x.flatten().shape == (1,)
    assert x.t().shape == () and x.transpose(0, -1).shape == () and x.T.shape == ()
    check_op(lambda T, x: x.sum().t() * x.sum().transpose(0, 0), [(2,)])


def test_index_arguments_accept_lists_and_arrays():
    x = tapegrad.arange(12.0).reshape(3, 4)
    assert tapegrad.gather(x, 1, [[0], [1], [2]]).tolist() == [[0.0], [5.0], [10.0]]
    assert tapegrad.index_select(x, 0, np.array([2])).tolist() == [[8.0, 9.0, 10.0, 11.0]]
    assert tapegrad.index_select(x, 1, tapegrad.tensor(3)).shape == (3, 1)
    t = torch.arange(12.0).reshape(3, 4)
    assert tapegrad.take_along_dim(x, tapegrad.tensor([[-1]]), 0).tolist() == \
        torch.take_along_dim(t, torch.tensor([[-1]]), 0).tolist()
    assert tapegrad.gather(tapegrad.tensor(5.0), 0, tapegrad.tensor(0)).item() == 5.0


def test_scatter_add_src_larger_than_index_gets_zero_gradient():
    # PyTorch raises in backward here ("invalid gradient"); tapegrad returns the gradient
    x = tapegrad.zeros(3, 4, dtype=tapegrad.float64, requires_grad=True)
    s = tapegrad.ones(3, 5, dtype=tapegrad.float64, requires_grad=True)
    out = tapegrad.scatter_add(x, 1, tapegrad.tensor([[0, 1], [2, 0]]), s)
    t = torch.scatter_add(torch.zeros(3, 4, dtype=torch.float64), 1,
                          torch.tensor([[0, 1], [2, 0]]), torch.ones(3, 5, dtype=torch.float64))
    np.testing.assert_array_equal(out.detach().numpy(), t.numpy())
    out.sum().backward()
    expected = np.zeros((3, 5))
    expected[:2, :2] = 1
    np.testing.assert_array_equal(s.grad.numpy(), expected)
    assert x.grad.tolist() == np.ones((3, 4)).tolist()


ERRORS = [
    (lambda T, x: x.reshape(5, -1), RuntimeError, "invalid for input of size 12"),
    (lambda T, x: x.reshape(-1, -1), RuntimeError, "only one dimension can be inferred"),
    (lambda T, x: x.flatten(1, 0), RuntimeError, "start_dim cannot come after end_dim"),
    (lambda T, x: x.flatten(2), IndexError, "out of range"),
    (lambda T, x: x.unflatten(1, (3, 2)), RuntimeError, "don't multiply up to the size"),
    (lambda T, x: x.squeeze(2), IndexError, "out of range"),
    (lambda T, x: x.unsqueeze(3), IndexError, "out of range"),
    (lambda T, x: x.transpose(0, 2), IndexError, "out of range"),
    (lambda T, x: x.permute(0), RuntimeError, "does not match the length of the desired "
     "ordering of dimensions"),
    (lambda T, x: x.permute(0, 0), RuntimeError, "appears multiple times|duplicate"),
    (lambda T, x: x.unsqueeze(0).t(), RuntimeError, "<= 2 dimensions"),
    (lambda T, x: x.expand(3, 5), RuntimeError, "must match the existing size"),
    (lambda T, x: x.expand(4), RuntimeError, "number of sizes provided"),
    (lambda T, x: x[:1].expand(3, -2), RuntimeError, "must match the existing size|negative"),
    (lambda T, x: x.expand(-1, 3, 4), RuntimeError, "leading, non-existing dimension"),
    (lambda T, x: T.broadcast_to(x, (3, 5)), RuntimeError, "must match the existing size"),
    (lambda T, x: x.repeat(2), RuntimeError, "can not be smaller"),
    (lambda T, x: T.cat([x, x.t()]), RuntimeError, "Sizes of tensors must match except in "
     "dimension 0. Expected size 4 but got size 3 for tensor number 1"),
    (lambda T, x: T.cat([x, x[0]]), RuntimeError, "same number of dimensions"),
    (lambda T, x: T.cat([x.sum(), x.sum()]), RuntimeError, "zero-dimensional"),
    (lambda T, x: T.cat([]), ValueError, "non-empty"),
    (lambda T, x: T.cat(x), TypeError, "tuple of Tensors"),
    (lambda T, x: T.cat([x, x], 2), IndexError, "out of range"),
    (lambda T, x: T.stack([x, x.t()]), RuntimeError, "stack expects each tensor to be equal "
     "size, but got \\[3, 4\\] at entry 0 and \\[4, 3\\] at entry 1"),
    (lambda T, x: T.split(x, [1, 1]), RuntimeError, "split_with_sizes expects split_sizes to "
     "sum exactly to 3"),
    (lambda T, x: x.chunk(0), RuntimeError, "greater than 0"),
    (lambda T, x: x.flip(0, 0), RuntimeError, "appears multiple times"),
    (lambda T, x: T.roll(x, (1, 2)), RuntimeError, "shifts and dimensions must align"),
    (lambda T, x: T.roll(x, 1, (0, 1)), RuntimeError, "shifts and dimensions must align"),
    (lambda T, x: T.gather(x, 0, _idx(T, [5])), RuntimeError, "same number of dimensions"),
    (lambda T, x: T.gather(x, 0, _idx(T, [[5]])), RuntimeError, "index 5 is out of bounds for "
     "dimension 0 with size 3"),
    (lambda T, x: T.gather(x, 0, _idx(T, [[-1]])), RuntimeError, "index -1 is out of bounds"),
    (lambda T, x: T.gather(x, 0, _idx(T, [[0] * 5])), RuntimeError, "Size does not match at "
     "dimension 1"),
    (lambda T, x: T.gather(x, 0, T.tensor([[0.0]])), RuntimeError, "int32/int64"),
    (lambda T, x: T.gather(x, 2, _idx(T, [[0]])), IndexError, "out of range"),
    (lambda T, x: T.scatter_add(x, 0, _idx(T, [[3]]), x), RuntimeError, "index 3 is out of "
     "bounds for dimension 0 with size 3"),
    (lambda T, x: T.scatter_add(x, 0, _idx(T, [[0]]), x.float() if T is torch else
                                x.to(T.float32)), RuntimeError, "dtype"),
    (lambda T, x: T.scatter_add(x, 0, _idx(T, [[1] * 5]), x), RuntimeError, "no larger"),
    (lambda T, x: T.index_select(x, 0, _idx(T, [3])), IndexError, "out of range"),
    (lambda T, x: T.index_select(x, 0, _idx(T, [[1]])), IndexError, "supposed to be a vector"),
    (lambda T, x: T.take_along_dim(x, _idx(T, [[[1]]]), 0), RuntimeError, "same number of "
     "dimensions"),
    (lambda T, x: T.take_along_dim(x, _idx(T, [[1, 2]]), 0), RuntimeError,
     "must match|cannot be broadcast"),
    (lambda T, x: T.tril(x[0]), RuntimeError, "at least 2 dimensions"),
    (lambda T, x: T.triu(x.sum()), RuntimeError, "at least 2 dimensions"),
    (lambda T, x: _pad(T)(x, (1,)), RuntimeError, "divisible by 2"),
    (lambda T, x: _pad(T)(x, (1,) * 6), RuntimeError, "two times the input dimension"),
    (lambda T, x: _pad(T)(x, (-3, -2)), RuntimeError, "negative|non-negative"),
    (lambda T, x: _pad(T)(x, (4, 0), mode="reflect"), RuntimeError, "should be less than"),
    (lambda T, x: _pad(T)(x[None], (5, 0), mode="circular"), RuntimeError,
     "wrapping around more than once"),
    (lambda T, x: _pad(T)(x[0], (1, 1), mode="reflect"), NotImplementedError, "Padding size 2"),
    (lambda T, x: _pad(T)(x, (1, 1, 1, 1), mode="replicate"), NotImplementedError, "Padding "
     "size 4"),
    (lambda T, x: _pad(T)(x, (1, 1), mode="reflect", value=1.0), RuntimeError,
     "doesn't take in value"),
    (lambda T, x: _pad(T)(x, (1, 1), mode="wrap"), NotImplementedError, "padding mode"),
]


@pytest.mark.parametrize("fn,exc,match", ERRORS)
def test_errors_match_torch(fn, exc, match):
    with pytest.raises(exc, match=match):
        fn(torch, torch.zeros(3, 4, dtype=torch.float64))
    with pytest.raises(exc, match=match):
        fn(tapegrad, tapegrad.zeros(3, 4, dtype=tapegrad.float64))


def test_errors_name_the_op():
    x = tapegrad.zeros(3, 4)
    for fn, name in [(lambda: x.reshape(5, -1), "reshape"), (lambda: x.flatten(1, 0), "flatten"),
                     (lambda: x.expand(3, 5), "expand"), (lambda: tapegrad.cat([x, x.t()]), "cat"),
                     (lambda: tapegrad.gather(x, 0, [[5]]), "gather"),
                     (lambda: movement.pad(x, (4, 4), mode="reflect"), "pad"),
                     (lambda: tapegrad.roll(x, (1, 2)), "roll"),
                     (lambda: tapegrad.tril(x[0]), "tril")]:
        with pytest.raises(Exception, match=name):
            fn()
