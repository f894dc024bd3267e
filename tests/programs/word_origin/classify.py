"""Guess which made-up word generator produced a word, with a recurrent net built by hand.

words/<generator>.txt hold the examples. Each letter enters as a one-hot row; the final
state is read out as log-probabilities over the generators.
"""
import glob
import os
import random
import string

import torch
import torch.nn as nn

ALPHABET = string.ascii_lowercase + "'"


def examples():
    found = {}
    for path in sorted(glob.glob(os.path.join("words", "*.txt"))):
        name = os.path.basename(path)[:-len(".txt")]
        with open(path) as f:
            found[name] = [w for w in f.read().split() if w]
    return found


def letters_of(word):
    rows = torch.zeros(len(word), len(ALPHABET))
    for i, letter in enumerate(word):
        rows[i][ALPHABET.index(letter)] = 1.0
    return rows


class TinyRecurrent(nn.Module):
    def __init__(self, letters, size, kinds):
        super().__init__()
        self.size = size
        self.from_letter = nn.Linear(letters, size)
        self.from_state = nn.Linear(size, size, bias=False)
        self.readout = nn.Sequential(nn.Linear(size, kinds), nn.LogSoftmax(dim=1))

    def forward(self, rows):
        state = torch.zeros(1, self.size)
        for row in rows:
            state = torch.tanh(self.from_letter(row.unsqueeze(0)) + self.from_state(state))
        return self.readout(state)


by_kind = examples()
kinds = sorted(by_kind)
net = TinyRecurrent(len(ALPHABET), 24, len(kinds))
nll = nn.NLLLoss()
step_size = 0.02
recent = []
for step in range(1, 401):
    kind = random.choice(kinds)
    word = random.choice(by_kind[kind])
    net.zero_grad()
    loss = nll(net(letters_of(word)), torch.tensor([kinds.index(kind)]))
    loss.backward()
    for p in net.parameters():
        p.data.sub_(step_size * p.grad.data)
    recent.append(loss.item())
    if step % 80 == 0:
        print(f"step {step}: mean loss of the last 80 {sum(recent[-80:]) / 80:.3f}")

counts = torch.zeros(len(kinds), len(kinds), dtype=torch.long)
with torch.no_grad():
    for kind in kinds:
        for word in random.sample(by_kind[kind], 10):
            _, guess = net(letters_of(word)).topk(1, dim=1)
            counts[kinds.index(kind)][guess.item()] += 1
for kind, row in zip(kinds, counts.tolist()):
    print(f"{kind:>12}: " + " ".join(f"{n:3d}" for n in row))
print(f"right {counts.diag().sum().item()} of {counts.sum().item()}")
