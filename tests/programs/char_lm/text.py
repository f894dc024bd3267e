"""Character vocabulary and batching for the character language model."""
import os

import torch


class Alphabet:
    def __init__(self):
        self.symbols, self.index = [], {}

    def add(self, symbol):
        if symbol not in self.index:
            self.index[symbol] = len(self.symbols)
            self.symbols.append(symbol)
        return self.index[symbol]

    def __len__(self):
        return len(self.symbols)


class Texts:
    """train.txt, valid.txt and test.txt of a folder as tensors of character ids."""

    def __init__(self, folder):
        self.alphabet = Alphabet()
        self.train, self.valid, self.test = (
            self.encode(os.path.join(folder, f"{split}.txt"))
            for split in ("train", "valid", "test"))

    def encode(self, path):
        with open(path, encoding="utf8") as f:
            ids = [self.alphabet.add(c) for line in f for c in line.rstrip("\n") + "|"]
        return torch.tensor(ids, dtype=torch.int64)


def into_rows(ids, rows):
    """Cut a stream of ids into ``rows`` equal rows (batch first), dropping the remainder."""
    usable = ids.size(0) // rows * rows
    return ids.narrow(0, 0, usable).view(rows, -1).contiguous()


def windows(data, length):
    """(input, target) column windows over batch-first rows; targets are shifted by one."""
    for start in range(0, data.size(1) - 1, length):
        span = min(length, data.size(1) - 1 - start)
        yield data[:, start:start + span], data[:, start + 1:start + 1 + span]
