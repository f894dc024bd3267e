"""utils.data: datasets, samplers, DataLoader batching/ordering/collation, random_split."""
import collections

import numpy as np
import pytest
import torch

import tapegrad
from tapegrad.utils.data import (DataLoader, Dataset, IterableDataset, Subset, TensorDataset,
                                 default_collate, random_split)


def _xy(n=10):
    x = tapegrad.tensor(np.arange(n * 3, dtype=np.float64).reshape(n, 3))
    y = tapegrad.tensor(np.arange(n))
    return x, y


def test_tensor_dataset_indexing_and_size_mismatch():
    x, y = _xy()
    ds = TensorDataset(x, y)
    assert len(ds) == 10
    xi, yi = ds[4]
    assert xi.tolist() == [12.0, 13.0, 14.0] and yi.item() == 4
    with pytest.raises(ValueError, match=r"size mismatch.*\(10, 3\), \(9,\)"):
        TensorDataset(x, tapegrad.tensor(np.arange(9)))
    with pytest.raises(AssertionError):  # what PyTorch's assert raises, too
        TensorDataset(x, tapegrad.tensor(np.arange(9)))


@pytest.mark.parametrize("batch_size,drop_last", [(3, False), (3, True), (5, False), (1, True),
                                                  (12, False)])
def test_sequential_batches_match_torch(batch_size, drop_last):
    x, y = _xy()
    ours = DataLoader(TensorDataset(x, y), batch_size=batch_size, drop_last=drop_last)
    theirs = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(torch.tensor(x.numpy()), torch.tensor(y.numpy())),
        batch_size=batch_size, drop_last=drop_last)
    assert len(ours) == len(theirs)
    got, want = list(ours), list(theirs)
    assert len(got) == len(want)
    for (gx, gy), (wx, wy) in zip(got, want):
        assert isinstance(gx, tapegrad.Tensor) and gx.dtype == tapegrad.float64
        assert gy.dtype == tapegrad.int64
        np.testing.assert_array_equal(gx.numpy(), wx.numpy())
        np.testing.assert_array_equal(gy.numpy(), wy.numpy())


class _Squares(Dataset):
    def __len__(self):
        return 7

    def __getitem__(self, i):
        return {"i": i, "sq": float(i * i), "v": np.full(2, i, dtype=np.float32),
                "t": tapegrad.tensor([i, -i]), "name": f"s{i}"}


def test_default_collate_of_dicts_numbers_numpy_and_strings_matches_torch():
    ours = list(DataLoader(_Squares(), batch_size=3))
    theirs = torch.utils.data.default_collate([
        {k: (torch.tensor(v.numpy()) if isinstance(v, tapegrad.Tensor) else v)
         for k, v in _Squares()[i].items()} for i in range(3)])
    b = ours[0]
    assert set(b) == set(theirs)
    for k in ("i", "sq", "v", "t"):
        assert str(b[k].dtype).split(".")[-1] == str(theirs[k].dtype).split(".")[-1], k
        np.testing.assert_array_equal(b[k].numpy(), theirs[k].numpy())
    assert b["name"] == theirs["name"] == ["s0", "s1", "s2"]
    assert [len(x["i"]) for x in ours] == [3, 3, 1]


def test_default_collate_tuples_namedtuples_and_errors():
    Point = collections.namedtuple("Point", "x y")
    out = default_collate([Point(1, 2.0), Point(3, 4.0)])
    assert isinstance(out, Point) and out.x.tolist() == [1, 3] and out.y.tolist() == [2.0, 4.0]
    out = default_collate([(1, [2, 3]), (4, [5, 6])])
    assert isinstance(out, list) and out[0].tolist() == [1, 4]
    assert [t.tolist() for t in out[1]] == [[2, 5], [3, 6]]
    with pytest.raises(RuntimeError, match="equal size"):
        default_collate([[1, 2], [3]])
    with pytest.raises(RuntimeError, match="stack expects each tensor to be equal size"):
        default_collate([tapegrad.tensor([1.0]), tapegrad.tensor([1.0, 2.0])])
    with pytest.raises(TypeError, match="found object"):
        default_collate([object(), object()])


def test_shuffle_is_a_permutation_reproducible_with_a_generator():
    x, y = _xy(23)
    ds = TensorDataset(x, y)

    def epoch(loader):
        return [int(v) for _, yb in loader for v in yb.tolist()]

    g = tapegrad.Generator().manual_seed(7)
    loader = DataLoader(ds, batch_size=4, shuffle=True, generator=g)
    e1, e2 = epoch(loader), epoch(loader)
    assert sorted(e1) == sorted(e2) == list(range(23))
    assert e1 != e2 and e1 != list(range(23))  # a fresh permutation each epoch
    g2 = tapegrad.Generator().manual_seed(7)
    again = DataLoader(ds, batch_size=4, shuffle=True, generator=g2)
    assert epoch(again) == e1 and epoch(again) == e2
    tapegrad.manual_seed(3)
    a = epoch(DataLoader(ds, batch_size=5, shuffle=True))
    tapegrad.manual_seed(3)
    assert epoch(DataLoader(ds, batch_size=5, shuffle=True)) == a
    # batches carry matching rows of x and y
    for xb, yb in DataLoader(ds, batch_size=4, shuffle=True, generator=g):
        np.testing.assert_array_equal(xb.numpy()[:, 0], yb.numpy() * 3.0)


def test_collate_fn_batch_size_none_and_custom_samplers():
    x, y = _xy(6)
    ds = TensorDataset(x, y)
    loader = DataLoader(ds, batch_size=4, collate_fn=lambda batch: len(batch))
    assert list(loader) == [4, 2]
    single = list(DataLoader(ds, batch_size=None))
    assert len(single) == 6 and single[2][1].item() == 2
    loader = DataLoader(ds, batch_sampler=[[5, 0], [1, 2, 3]])
    assert [b[1].tolist() for b in loader] == [[5, 0], [1, 2, 3]]
    loader = DataLoader(ds, sampler=[4, 3, 2], batch_size=2)
    assert [b[1].tolist() for b in loader] == [[4, 3], [2]]


def test_loader_argument_errors():
    x, y = _xy()
    ds = TensorDataset(x, y)
    with pytest.raises(ValueError, match="mutually exclusive with shuffle"):
        DataLoader(ds, sampler=[0, 1], shuffle=True)
    with pytest.raises(ValueError, match="batch_sampler option is mutually exclusive"):
        DataLoader(ds, batch_sampler=[[0]], batch_size=2)
    with pytest.raises(ValueError, match="mutually exclusive with drop_last"):
        DataLoader(ds, batch_size=None, drop_last=True)
    with pytest.raises(ValueError, match="batch_size should be a positive integer"):
        DataLoader(ds, batch_size=0)


class _Stream(IterableDataset):
    def __iter__(self):
        return iter(range(7))

    def __len__(self):
        return 7


def test_iterable_dataset_batches():
    assert [b.tolist() for b in DataLoader(_Stream(), batch_size=3)] == [[0, 1, 2], [3, 4, 5],
                                                                         [6]]
    assert len(DataLoader(_Stream(), batch_size=3, drop_last=True)) == 2
    with pytest.raises(ValueError, match="expected unspecified shuffle"):
        DataLoader(_Stream(), shuffle=True)


def test_random_split_lengths_fractions_and_generator():
    x, y = _xy(10)
    ds = TensorDataset(x, y)
    a, b = random_split(ds, [7, 3], generator=tapegrad.Generator().manual_seed(0))
    assert isinstance(a, Subset) and len(a) == 7 and len(b) == 3
    got = sorted([a[i][1].item() for i in range(7)] + [b[i][1].item() for i in range(3)])
    assert got == list(range(10))
    a2, b2 = random_split(ds, [7, 3], generator=tapegrad.Generator().manual_seed(0))
    assert a2.indices == a.indices and b2.indices == b.indices
    # fractions: floors then the remainder dealt round-robin, as PyTorch
    parts = random_split(ds, [0.33, 0.33, 0.34], generator=tapegrad.Generator().manual_seed(1))
    want = torch.utils.data.random_split(range(10), [0.33, 0.33, 0.34])
    assert [len(p) for p in parts] == [len(w) for w in want] == [4, 3, 3]
    with pytest.raises(ValueError, match="Sum of input lengths"):
        random_split(ds, [5, 4])
    with pytest.raises(ValueError, match="Fraction at index 1 is not between 0 and 1"):
        random_split(ds, [0.5, 1.5, -1.0])
    with pytest.warns(UserWarning, match="Length of split at index 1 is 0"):
        random_split(ds, [1.0, 0.0])
    batches = list(DataLoader(a, batch_size=4))
    assert [len(bt[1]) for bt in batches] == [4, 3]
    assert [v for bt in batches for v in bt[1].tolist()] == [ds[i][1].item() for i in a.indices]


def test_tensor_dataset_fast_path_equals_per_sample_collation():
    x, y = _xy(11)
    ds = TensorDataset(x, y)
    g1, g2 = tapegrad.Generator().manual_seed(4), tapegrad.Generator().manual_seed(4)
    fast = list(DataLoader(ds, batch_size=4, shuffle=True, generator=g1))
    slow = list(DataLoader(ds, batch_size=4, shuffle=True, generator=g2,
                           collate_fn=lambda b: default_collate(b)))
    assert len(fast) == len(slow) == 3
    for bf, bs in zip(fast, slow):
        assert type(bf) is type(bs) is list
        for tf, ts in zip(bf, bs):
            assert tf.dtype == ts.dtype and tf.shape == ts.shape
            np.testing.assert_array_equal(tf.numpy(), ts.numpy())
