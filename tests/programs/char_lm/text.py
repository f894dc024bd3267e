"""Text files as tensors of character ids, cut into rows and windows."""
import os

import torch

SPLITS = ("train", "valid", "test")
LINE_END = "|"


class Texts:
    """train.txt, valid.txt and test.txt of a folder; the alphabet is every character seen."""

    def __init__(self, folder):
        raw = {}
        for split in SPLITS:
            with open(os.path.join(folder, f"{split}.txt"), encoding="utf8") as f:
                raw[split] = f.read().replace("\n", LINE_END)
        self.alphabet = sorted(set("".join(raw.values())))
        code = {c: i for i, c in enumerate(self.alphabet)}
        for split in SPLITS:
            setattr(self, split, torch.tensor([code[c] for c in raw[split]], dtype=torch.int64))


def into_rows(ids, rows):
    """Cut a stream of ids into ``rows`` equal rows (batch first), dropping the remainder."""
    usable = ids.size(0) // rows * rows
    return ids.narrow(0, 0, usable).view(rows, -1)


def windows(data, length):
    """(input, target) column windows over batch-first rows; targets are shifted by one."""
    for start in range(0, data.size(1) - 1, length):
        stop = min(start + length, data.size(1) - 1)
        yield data[:, start:stop], data[:, start + 1:stop + 1]
