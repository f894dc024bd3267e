"""Guess which made-up word generator produced a word, with a hand-built recurrent cell.

words/<generator>.txt hold the examples; letters go in one-hot, one per step.
"""
import glob
import os
import random
import string

import torch
import torch.nn as nn

LETTERS = string.ascii_lowercase + "'"


def load_words():
    words = {}
    for path in sorted(glob.glob(os.path.join("words", "*.txt"))):
        with open(path) as f:
            words[os.path.splitext(os.path.basename(path))[0]] = f.read().split()
    return words


def one_hot(word):
    encoded = torch.zeros(len(word), 1, len(LETTERS))
    for position, letter in enumerate(word):
        encoded[position][0][LETTERS.index(letter)] = 1
    return encoded


class ElmanCell(nn.Module):
    def __init__(self, inputs, hidden, outputs):
        super().__init__()
        self.hidden = hidden
        self.update = nn.Linear(inputs + hidden, hidden)
        self.emit = nn.Linear(inputs + hidden, outputs)
        self.log_probs = nn.LogSoftmax(dim=1)

    def forward(self, letter, state):
        both = torch.cat((letter, state), 1)
        return self.log_probs(self.emit(both)), torch.tanh(self.update(both))

    def blank(self):
        return torch.zeros(1, self.hidden)


def read(cell, encoded):
    state = cell.blank()
    for step in range(encoded.size(0)):
        scores, state = cell(encoded[step], state)
    return scores


words = load_words()
origins = list(words)
cell = ElmanCell(len(LETTERS), 32, len(origins))
loss_fn = nn.NLLLoss()
rate = 0.01
total = 0.0
for iteration in range(1, 501):
    origin = random.choice(origins)
    word = random.choice(words[origin])
    cell.zero_grad()
    loss = loss_fn(read(cell, one_hot(word)), torch.tensor([origins.index(origin)]))
    loss.backward()
    for p in cell.parameters():
        p.data.add_(p.grad.data, alpha=-rate)
    total += loss.item()
    if iteration % 100 == 0:
        print(f"{iteration}: mean loss {total / 100:.4f}")
        total = 0.0

confusion = torch.zeros(len(origins), len(origins))
with torch.no_grad():
    for _ in range(100):
        origin = random.choice(origins)
        scores = read(cell, one_hot(random.choice(words[origin])))
        _, top = scores.topk(1)
        confusion[origins.index(origin)][top[0].item()] += 1
confusion = confusion / confusion.sum(1, keepdim=True)
for origin, row in zip(origins, confusion):
    print(f"{origin:>10}: " + " ".join(f"{v:.2f}" for v in row.tolist()))
print("right:", confusion.diag().mean().item())
