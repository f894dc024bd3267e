"""Datasets and the DataLoader (``torch.utils.data``): sampling, batching and collation.

Loading runs in the calling process: ``num_workers`` is accepted for compatibility and
gives the same batches in the same order as ``num_workers=0``. Shuffling draws from
tapegrad's RNG (``generator=`` or the default stream), so ``manual_seed`` and
``get_rng_state``/``Generator.get_state`` make it reproducible; the permutations are
tapegrad's own, not PyTorch's.
"""
import collections.abc
import itertools
import math
import warnings

from tapegrad.backend import xp
from tapegrad.random import randint, randperm
from tapegrad.tensor import Tensor

__all__ = ["Dataset", "IterableDataset", "TensorDataset", "ConcatDataset", "Subset",
           "random_split", "Sampler", "SequentialSampler", "RandomSampler", "BatchSampler",
           "DataLoader", "default_collate", "default_convert", "get_worker_info",
           "DistributedSampler"]


class Dataset:
    """As ``torch.utils.data.Dataset``: subclasses define ``__getitem__`` (and ``__len__``)."""

    def __getitem__(self, index):
        raise NotImplementedError(f"{type(self).__name__} must implement __getitem__")

    def __add__(self, other):
        return ConcatDataset([self, other])


class IterableDataset(Dataset):
    """As ``torch.utils.data.IterableDataset``: a stream of samples (define ``__iter__``)."""

    def __iter__(self):
        raise NotImplementedError(f"{type(self).__name__} must implement __iter__")


class _SizeMismatch(ValueError, AssertionError):
    """Raised by TensorDataset; an AssertionError too, as PyTorch's ``assert`` raises."""


class TensorDataset(Dataset):
    """As ``TensorDataset(*tensors)``: sample ``i`` is ``tuple(t[i] for t in tensors)``.

    >>> ds = TensorDataset(x, y)     # x.shape[0] == y.shape[0]
    """

    def __init__(self, *tensors):
        sizes = [t.shape[0] if t.ndim else None for t in tensors]
        if any(s is None or s != sizes[0] for s in sizes):
            shapes = ", ".join(str(tuple(t.shape)) for t in tensors)
            raise _SizeMismatch(f"TensorDataset: size mismatch between tensors: shapes {shapes} "
                                "must agree in their first dimension")
        self.tensors = tensors

    def __getitem__(self, index):
        return tuple(t[index] for t in self.tensors)

    def __len__(self):
        return self.tensors[0].shape[0]


class ConcatDataset(Dataset):
    """As ``ConcatDataset(datasets)``: the datasets one after another."""

    def __init__(self, datasets):
        self.datasets = list(datasets)
        if not self.datasets:
            raise ValueError("datasets should not be an empty iterable")
        for d in self.datasets:
            if isinstance(d, IterableDataset):
                raise ValueError("ConcatDataset does not support IterableDataset")
        self.cumulative_sizes = list(itertools.accumulate(len(d) for d in self.datasets))

    def __len__(self):
        return self.cumulative_sizes[-1]

    def __getitem__(self, idx):
        if idx < 0:
            if -idx > len(self):
                raise ValueError("absolute value of index should not exceed dataset length")
            idx = len(self) + idx
        i = next((k for k, c in enumerate(self.cumulative_sizes) if idx < c), None)
        if i is None:
            raise IndexError(f"ConcatDataset: index {idx} out of range for length {len(self)}")
        return self.datasets[i][idx - (self.cumulative_sizes[i - 1] if i else 0)]


class Subset(Dataset):
    """As ``Subset(dataset, indices)``: the samples of ``dataset`` at ``indices``."""

    def __init__(self, dataset, indices):
        self.dataset = dataset
        self.indices = indices

    def __getitem__(self, idx):
        if isinstance(idx, list):
            return self.dataset[[self.indices[i] for i in idx]]
        return self.dataset[self.indices[idx]]

    def __getitems__(self, indices):
        if callable(getattr(self.dataset, "__getitems__", None)):
            return self.dataset.__getitems__([self.indices[i] for i in indices])
        return [self.dataset[self.indices[i]] for i in indices]

    def __len__(self):
        return len(self.indices)


def random_split(dataset, lengths, generator=None):
    """As ``random_split(dataset, lengths, generator=None)``: disjoint random Subsets.

    ``lengths`` are sizes summing to ``len(dataset)``, or fractions summing to 1 (the
    remainder after flooring is dealt out one by one, as in PyTorch).

    >>> train, val = random_split(ds, [0.8, 0.2], generator=tapegrad.Generator().manual_seed(0))
    """
    lengths = list(lengths)
    if math.isclose(sum(lengths), 1) and sum(lengths) <= 1:
        sizes = []
        for i, frac in enumerate(lengths):
            if frac < 0 or frac > 1:
                raise ValueError(f"Fraction at index {i} is not between 0 and 1")
            sizes.append(int(math.floor(len(dataset) * frac)))
        for i in range(len(dataset) - sum(sizes)):
            sizes[i % len(sizes)] += 1
        lengths = sizes
        for i, n in enumerate(lengths):
            if n == 0:
                warnings.warn(f"Length of split at index {i} is 0. This might result in an "
                              "empty dataset.", stacklevel=2)
    if any(n < 0 for n in lengths):
        raise ValueError(f"random_split: lengths must be non-negative, got {lengths}")
    if sum(lengths) != len(dataset):
        raise ValueError("Sum of input lengths does not equal the length of the input dataset! "
                         f"({sum(lengths)} != {len(dataset)})")
    indices = randperm(sum(lengths), generator=generator).tolist()
    ends = list(itertools.accumulate(lengths))
    return [Subset(dataset, indices[end - n:end]) for end, n in zip(ends, lengths)]


# --- samplers --------------------------------------------------------------------------------
class Sampler:
    """As ``torch.utils.data.Sampler``: an iterable of dataset indices."""

    def __init__(self, data_source=None):
        pass

    def __iter__(self):
        raise NotImplementedError


class SequentialSampler(Sampler):
    """As ``SequentialSampler(data_source)``: ``0, 1, ..., len - 1``."""

    def __init__(self, data_source):
        self.data_source = data_source

    def __iter__(self):
        return iter(range(len(self.data_source)))

    def __len__(self):
        return len(self.data_source)


class RandomSampler(Sampler):
    """As ``RandomSampler(data_source, replacement=False, num_samples=None, generator=None)``:
    a fresh permutation (or draws with replacement) from tapegrad's RNG each epoch."""

    def __init__(self, data_source, replacement=False, num_samples=None, generator=None):
        self.data_source = data_source
        self.replacement = replacement
        self._num_samples = num_samples
        self.generator = generator
        if not isinstance(replacement, bool):
            raise TypeError("replacement should be a boolean value, but got replacement="
                            f"{replacement}")
        if not isinstance(self.num_samples, int) or self.num_samples <= 0:
            raise ValueError("num_samples should be a positive integer value, but got "
                             f"num_samples={self.num_samples}")

    @property
    def num_samples(self):
        return len(self.data_source) if self._num_samples is None else self._num_samples

    def __iter__(self):
        n = len(self.data_source)
        if self.replacement:  # drawn 32 at a time, as PyTorch (num_samples may be 1e10)
            for _ in range(self.num_samples // 32):
                yield from randint(0, n, (32,), generator=self.generator).tolist()
            yield from randint(0, n, (self.num_samples % 32,), generator=self.generator).tolist()
            return
        for _ in range(self.num_samples // n):
            yield from randperm(n, generator=self.generator).tolist()
        yield from randperm(n, generator=self.generator).tolist()[:self.num_samples % n]

    def __len__(self):
        return self.num_samples


class DistributedSampler(Sampler):
    """As ``torch.utils.data.distributed.DistributedSampler(dataset, num_replicas=None,
    rank=None, shuffle=True, seed=0, drop_last=False)``: rank ``rank`` of ``num_replicas``
    (default: the process group's) gets every ``num_replicas``-th index, from ``rank`` on, of
    the (shuffled) indices padded by repeating their head to a multiple of ``num_replicas``
    (or cut to one with ``drop_last``). Shuffling draws a permutation from a Generator seeded
    with ``seed + epoch`` (tapegrad's permutation, not PyTorch's): call ``set_epoch`` each epoch.

    >>> sampler = DistributedSampler(ds); loader = DataLoader(ds, batch_size=32, sampler=sampler)
    """

    def __init__(self, dataset, num_replicas=None, rank=None, shuffle=True, seed=0,
                 drop_last=False):
        if num_replicas is None or rank is None:
            from tapegrad import distributed as dist

            if not dist.is_available():
                raise RuntimeError("Requires distributed package to be available")
            num_replicas = dist.get_world_size() if num_replicas is None else num_replicas
            rank = dist.get_rank() if rank is None else rank
        if rank >= num_replicas or rank < 0:
            raise ValueError(f"Invalid rank {rank}, rank should be in the interval "
                             f"[0, {num_replicas - 1}]")
        self.dataset = dataset
        self.num_replicas = num_replicas
        self.rank = rank
        self.epoch = 0
        self.drop_last = drop_last
        if drop_last and len(dataset) % num_replicas != 0:
            self.num_samples = math.ceil((len(dataset) - num_replicas) / num_replicas)
        else:
            self.num_samples = math.ceil(len(dataset) / num_replicas)
        self.total_size = self.num_samples * num_replicas
        self.shuffle = shuffle
        self.seed = seed

    def __iter__(self):
        n = len(self.dataset)
        if self.shuffle:
            from tapegrad.random import Generator

            g = Generator().manual_seed(self.seed + self.epoch)
            indices = randperm(n, generator=g).tolist()
        else:
            indices = list(range(n))
        if not self.drop_last:
            padding = self.total_size - len(indices)
            if padding <= len(indices):
                indices += indices[:padding]
            else:
                indices += (indices * math.ceil(padding / len(indices)))[:padding]
        else:
            indices = indices[:self.total_size]
        return iter(indices[self.rank:self.total_size:self.num_replicas])

    def __len__(self):
        return self.num_samples

    def set_epoch(self, epoch: int) -> None:
        """Seed the next ``__iter__``'s shuffle with ``seed + epoch`` (the same on every rank)."""
        self.epoch = epoch


class BatchSampler(Sampler):
    """As ``BatchSampler(sampler, batch_size, drop_last)``: lists of indices."""

    def __init__(self, sampler, batch_size, drop_last):
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size <= 0:
            raise ValueError("batch_size should be a positive integer value, but got "
                             f"batch_size={batch_size}")
        if not isinstance(drop_last, bool):
            raise ValueError(f"drop_last should be a boolean value, but got drop_last={drop_last}")
        self.sampler, self.batch_size, self.drop_last = sampler, batch_size, drop_last

    def __iter__(self):
        it = iter(self.sampler)
        while True:
            batch = list(itertools.islice(it, self.batch_size))
            if not batch or (self.drop_last and len(batch) < self.batch_size):
                return
            yield batch

    def __len__(self):
        if self.drop_last:
            return len(self.sampler) // self.batch_size
        return (len(self.sampler) + self.batch_size - 1) // self.batch_size


# --- collation -------------------------------------------------------------------------------
def _stack(tensors):
    from tapegrad.ops.movement import stack

    if any(t.requires_grad for t in tensors):
        return stack(list(tensors), 0)
    first = tensors[0]
    for i, t in enumerate(tensors):
        if t.shape != first.shape:
            raise RuntimeError("stack expects each tensor to be equal size, but got "
                               f"{tuple(first.shape)} at entry 0 and {tuple(t.shape)} at entry "
                               f"{i}")
    return Tensor._make(xp.stack([t._data for t in tensors]))


def default_collate(batch):
    """As ``torch.utils.data.default_collate``: a list of samples to one batch.

    Tensors and numpy arrays are stacked along a new first dim; Python floats become a
    float64 tensor, ints an int64 tensor; dicts, namedtuples and sequences collate field
    by field (a tuple sample gives a list, as in PyTorch); strings stay a list.
    """
    elem = batch[0]
    if isinstance(elem, Tensor):
        return _stack(batch)
    if type(elem).__module__ == "numpy" and not isinstance(elem, (str, bytes)):
        if isinstance(elem, xp.ndarray):
            if elem.dtype.kind in "SaUO":
                raise TypeError("default_collate: batch must contain tensors, numpy arrays, "
                                f"numbers, dicts or lists; found numpy dtype {elem.dtype}")
            return _stack([Tensor._make(xp.asarray(b)) for b in batch])
        if elem.shape == ():
            return Tensor._make(xp.asarray(batch))
    if isinstance(elem, bool):
        return Tensor._make(xp.asarray(batch, dtype=xp.bool_))
    if isinstance(elem, float):
        return Tensor._make(xp.asarray(batch, dtype=xp.float64))
    if isinstance(elem, int):
        return Tensor._make(xp.asarray(batch, dtype=xp.int64))
    if isinstance(elem, (str, bytes)):
        return batch
    if isinstance(elem, collections.abc.Mapping):
        return type(elem)({k: default_collate([d[k] for d in batch]) for k in elem}) \
            if type(elem) is not dict else {k: default_collate([d[k] for d in batch])
                                            for k in elem}
    if isinstance(elem, tuple) and hasattr(elem, "_fields"):
        return type(elem)(*(default_collate(list(s)) for s in zip(*batch)))
    if isinstance(elem, collections.abc.Sequence):
        if any(len(s) != len(elem) for s in batch):
            raise RuntimeError("each element in list of batch should be of equal size")
        transposed = [list(s) for s in zip(*batch)]
        if isinstance(elem, tuple):
            return [default_collate(s) for s in transposed]
        try:
            return type(elem)([default_collate(s) for s in transposed])
        except TypeError:
            return [default_collate(s) for s in transposed]
    raise TypeError("default_collate: batch must contain tensors, numpy arrays, numbers, "
                    f"dicts or lists; found {type(elem).__name__}")


def default_convert(data):
    """As ``default_convert``: numpy arrays to tensors, recursively (no batching)."""
    if isinstance(data, xp.ndarray) and data.dtype.kind not in "SaUO":
        return Tensor._make(data)
    if isinstance(data, xp.generic):
        return Tensor._make(xp.asarray(data))
    if isinstance(data, collections.abc.Mapping):
        return {k: default_convert(v) for k, v in data.items()}
    if isinstance(data, tuple) and hasattr(data, "_fields"):
        return type(data)(*(default_convert(d) for d in data))
    if isinstance(data, tuple):
        return [default_convert(d) for d in data]
    if isinstance(data, list):
        return [default_convert(d) for d in data]
    return data


def get_worker_info():
    """As ``get_worker_info()``: always None, since tapegrad loads in the calling process."""
    return None


# --- the loader ------------------------------------------------------------------------------
class DataLoader:
    """As ``torch.utils.data.DataLoader(dataset, batch_size=1, shuffle=None, sampler=None,
    batch_sampler=None, num_workers=0, collate_fn=None, pin_memory=False, drop_last=False,
    timeout=0, worker_init_fn=None, generator=None)``.

    >>> loader = DataLoader(TensorDataset(x, y), batch_size=32, shuffle=True)
    >>> for xb, yb in loader: ...
    """

    def __init__(self, dataset, batch_size=1, shuffle=None, sampler=None, batch_sampler=None,
                 num_workers=0, collate_fn=None, pin_memory=False, drop_last=False, timeout=0,
                 worker_init_fn=None, multiprocessing_context=None, generator=None, *,
                 prefetch_factor=None, persistent_workers=False, pin_memory_device="",
                 in_order=True):
        if num_workers < 0:
            raise ValueError("num_workers option should be non-negative; use num_workers=0 to "
                             "disable multiprocessing.")
        if timeout < 0:
            raise ValueError("timeout option should be non-negative")
        self.dataset = dataset
        self.num_workers = num_workers
        self.pin_memory = pin_memory
        self.timeout = timeout
        self.worker_init_fn = worker_init_fn
        self.generator = generator
        self._iterable = isinstance(dataset, IterableDataset)
        if self._iterable:
            if shuffle not in (None, False):
                raise ValueError(f"DataLoader with IterableDataset: expected unspecified shuffle "
                                 f"option, but got shuffle={shuffle}")
            if sampler is not None:
                raise ValueError("DataLoader with IterableDataset: expected unspecified sampler "
                                 f"option, but got sampler={sampler}")
            if batch_sampler is not None:
                raise ValueError("DataLoader with IterableDataset: expected unspecified "
                                 f"batch_sampler option, but got batch_sampler={batch_sampler}")
        if sampler is not None and shuffle:
            raise ValueError("sampler option is mutually exclusive with shuffle")
        if batch_sampler is not None:
            if batch_size != 1 or shuffle or sampler is not None or drop_last:
                raise ValueError("batch_sampler option is mutually exclusive with batch_size, "
                                 "shuffle, sampler, and drop_last")
            batch_size = None
            drop_last = False
        elif batch_size is None and drop_last:
            raise ValueError("batch_size=None option disables auto-batching and is mutually "
                             "exclusive with drop_last")
        if sampler is None and not self._iterable:
            sampler = (RandomSampler(dataset, generator=generator) if shuffle
                       else SequentialSampler(dataset))
        if batch_size is not None and batch_sampler is None and not self._iterable:
            batch_sampler = BatchSampler(sampler, batch_size, drop_last)
        self.batch_size = batch_size
        self.drop_last = drop_last
        self.sampler = sampler
        self.batch_sampler = batch_sampler
        if collate_fn is None:
            collate_fn = default_collate if self._auto_collation else default_convert
        self.collate_fn = collate_fn

    @property
    def _auto_collation(self):
        return self.batch_sampler is not None or (self._iterable and self.batch_size is not None)

    def __len__(self):
        if self._iterable:
            n = len(self.dataset)
            if self.batch_size is not None:
                n = n // self.batch_size if self.drop_last else math.ceil(n / self.batch_size)
            return n
        return len(self.batch_sampler if self._auto_collation else self.sampler)

    def __iter__(self):
        if self._iterable:
            yield from self._iter_stream()
            return
        dataset, collate = self.dataset, self.collate_fn
        if not self._auto_collation:
            for i in self.sampler:
                yield collate(dataset[i])
            return
        fast = type(dataset) is TensorDataset and collate is default_collate
        getitems = getattr(dataset, "__getitems__", None)
        for indices in self.batch_sampler:
            if fast:  # the stacked samples, gathered in one indexing per tensor
                idx = xp.asarray(indices, dtype=xp.int64)
                yield [Tensor._make(t._data[idx]) if not t.requires_grad else
                       _stack([t[i] for i in indices]) for t in dataset.tensors]
            elif callable(getitems):
                yield collate(getitems(indices))
            else:
                yield collate([dataset[i] for i in indices])

    def _iter_stream(self):
        it = iter(self.dataset)
        if self.batch_size is None:
            for sample in it:
                yield self.collate_fn(sample)
            return
        while True:
            batch = list(itertools.islice(it, self.batch_size))
            if not batch or (self.drop_last and len(batch) < self.batch_size):
                return
            yield self.collate_fn(batch)
