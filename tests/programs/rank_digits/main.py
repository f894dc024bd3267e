"""Learn to replace each digit of a sequence by its rank within the sequence.

Example (length 5): 7 2 9 2 4 -> 3 0 4 1 2 (ties ranked left to right). The model reads the
digits, then writes the ranks one at a time, as a causal language model.
"""
import pickle

import torch
from torch.utils.data import Dataset

import loop
from blocks import Ranker

LENGTH, DIGITS = 5, 6


def ranks(digits):
    return torch.sort(torch.sort(digits, stable=True).indices, stable=True).indices


class RankingTask(Dataset):
    """Digit strings with enough distinct digits, split between train and test by hash."""

    def __init__(self, part, pool=64, size=4000):
        self.size, self.strings = size, []
        while len(self.strings) < pool:
            digits = torch.randint(DIGITS, size=(LENGTH,), dtype=torch.long)
            enough = torch.unique(digits).numel() >= LENGTH - 2
            test = hash(pickle.dumps(digits.tolist())) % 5 == 0
            if enough and test == (part == "test"):
                self.strings.append(digits)

    def __len__(self):
        return self.size

    def __getitem__(self, index):
        digits = self.strings[index % len(self.strings)]
        answer = ranks(digits)
        inputs = torch.cat((digits, answer[:-1]))
        targets = torch.full_like(inputs, -1)  # only the answer's positions are scored
        targets[LENGTH - 1:] = answer
        return inputs, targets


def solved(model, task, count):
    right = 0
    for digits in task.strings[:count]:
        written = model.continue_greedily(digits.unsqueeze(0), LENGTH)[0, LENGTH:]
        right += int(torch.equal(written, ranks(digits)))
    return right / count


if __name__ == "__main__":
    import argparse
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--width", type=int, default=48)
    parser.add_argument("--pool", type=int, default=300)
    parser.add_argument("--checks", type=int, default=50)
    args = parser.parse_args()

    train_task, test_task = RankingTask("train", args.pool), RankingTask("test", args.pool // 4)
    model = Ranker(DIGITS, 2 * LENGTH - 1, width=args.width)

    def report(step, loss):
        if step % 5 == 0:
            print(f"step {step}: loss {loss.item():.4f}")

    loop.train(model, train_task, args.steps, batch=args.batch, after_step=[report])
    model.eval()
    print(f"solved: {solved(model, train_task, args.checks):.2f} of training strings, "
          f"{solved(model, test_task, args.checks):.2f} of test strings")
