"""Learn to replace each digit of a sequence by its rank within the sequence.

Example (length 5): 7 2 9 2 4 -> 3 0 4 1 2 (ties ranked left to right). The model reads the
digits, then writes the ranks one at a time, as a causal language model.
"""
import pickle

import torch
from torch.utils.data import Dataset

from blocks import Ranker
from loop import Loop

LENGTH, DIGITS = 5, 6


class Ranks(Dataset):
    """Random digit strings, split into train/test by the hash of the string."""

    def __init__(self, part, size=4000):
        self.part, self.size = part, size

    def __len__(self):
        return self.size

    def __getitem__(self, index):
        while True:  # reject mostly-repeated strings, and strings of the other part
            digits = torch.randint(DIGITS, size=(LENGTH,), dtype=torch.long)
            if torch.unique(digits).numel() < LENGTH - 2:
                continue
            in_test = hash(pickle.dumps(digits.tolist())) % 5 == 0
            if in_test == (self.part == "test"):
                break
        _, order = torch.sort(digits, stable=True)
        _, ranks = torch.sort(order, stable=True)
        sequence = torch.cat((digits, ranks))
        x, y = sequence[:-1].clone(), sequence[1:].clone()
        y[:LENGTH - 1] = -1  # only the ranks are scored
        return x, y


def accuracy(model, dataset, count):
    right = 0
    for i in range(count):
        x, y = dataset[i]
        written = model.complete(x[:LENGTH].unsqueeze(0), LENGTH)[0, LENGTH:]
        right += int(torch.equal(written, y[LENGTH - 1:]))
    return right / count


if __name__ == "__main__":
    import argparse
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--width", type=int, default=48)
    parser.add_argument("--checks", type=int, default=50)
    args = parser.parse_args()

    train, test = Ranks("train"), Ranks("test")
    model = Ranker(DIGITS, 2 * LENGTH - 1, width=args.width)
    loop = Loop(model, train, batch=args.batch, steps=args.steps)

    def report(loop):
        if loop.step % 5 == 0:
            print(f"step {loop.step}: loss {loop.loss.item():.4f}")

    loop.on("step", report)
    loop.run()
    model.eval()
    print(f"train {accuracy(model, train, args.checks):.2f} "
          f"test {accuracy(model, test, args.checks):.2f}")
