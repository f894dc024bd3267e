"""Spell words backwards: a GRU reads the word, an attending GRU cell writes it reversed.

words.txt holds one word per line, accents and all; words are folded to plain ASCII first.
"""
from __future__ import annotations

import argparse
import random
import unicodedata

import matplotlib
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import optim
from torch.utils.data import DataLoader, RandomSampler, TensorDataset

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

GO, END = 0, 1


def ascii_fold(word: str) -> str:
    return "".join(c for c in unicodedata.normalize("NFKD", word.strip().lower())
                   if not unicodedata.combining(c))


def spell(word: str, alphabet: str, slots: int) -> np.ndarray:
    codes = [alphabet.index(c) + 2 for c in word] + [END] * (slots - len(word))
    return np.array(codes, dtype=np.int32)


def unspell(codes: list[int], alphabet: str) -> str:
    letters = []
    for code in codes:
        if code == END:
            break
        letters.append(alphabet[code - 2] if code > END else "?")
    return "".join(letters)


class Speller(nn.Module):
    def __init__(self, symbols: int, size: int, slots: int):
        super().__init__()
        self.slots = slots
        self.letters_in = nn.Embedding(symbols, size)
        self.reader = nn.GRU(size, size, batch_first=True)
        self.letters_out = nn.Embedding(symbols, size)
        self.writer = nn.GRUCell(2 * size, size)
        self.compare = nn.Linear(size, size, bias=False)  # bilinear attention scores
        self.choose = nn.Linear(2 * size, symbols)

    def attend(self, memory, state):
        scores = torch.bmm(self.compare(memory), state.unsqueeze(2)).squeeze(2)
        weights = F.softmax(scores, dim=1)
        summary = torch.bmm(memory.permute(0, 2, 1), weights.unsqueeze(2)).squeeze(2)
        return summary, weights

    def forward(self, codes, answer=None, teaching=0.0):
        memory, last = self.reader(self.letters_in(codes))
        state = last[0]
        previous = torch.empty(codes.size(0), dtype=torch.long).fill_(GO)
        summary, _ = self.attend(memory, state)
        steps, attention = [], []
        for slot in range(self.slots):
            state = self.writer(torch.cat((self.letters_out(previous), summary), 1), state)
            summary, weights = self.attend(memory, state)
            logits = self.choose(torch.cat((state, summary), 1))
            steps.append(F.log_softmax(logits, dim=1))
            attention.append(weights)
            if answer is not None and random.random() < teaching:
                previous = answer[:, slot]
            else:
                previous = logits.topk(1, dim=1)[1].squeeze(1).detach()
        return torch.stack(steps, 1), torch.stack(attention, 1)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--teaching", type=float, default=0.5)
    parser.add_argument("--show", type=int, default=5)
    args = parser.parse_args()

    with open("words.txt", encoding="utf-8") as f:
        words = [ascii_fold(line) for line in f if line.strip()]
    alphabet = "".join(sorted(set("".join(words))))
    slots = max(map(len, words)) + 1
    forward = torch.LongTensor(np.stack([spell(w, alphabet, slots) for w in words]))
    backward = torch.LongTensor(np.stack([spell(w[::-1], alphabet, slots) for w in words]))
    pairs = TensorDataset(forward, backward)
    batches = DataLoader(pairs, batch_size=args.batch, sampler=RandomSampler(pairs))

    model = Speller(len(alphabet) + 2, args.size, slots)
    reader_parts = ("letters_in.", "reader.")  # the encoder and the decoder learn at own rates
    reading = [p for n, p in model.named_parameters() if n.startswith(reader_parts)]
    writing = [p for n, p in model.named_parameters() if not n.startswith(reader_parts)]
    optimizers = [optim.Adam(reading, lr=1e-2), optim.Adam(writing, lr=5e-3)]
    nll = nn.NLLLoss()
    for epoch in range(args.epochs):
        seen = 0.0
        for codes, answer in batches:
            for optimizer in optimizers:
                optimizer.zero_grad()
            log_probs, _ = model(codes, answer, args.teaching)
            loss = nll(log_probs.flatten(0, 1), answer.flatten())
            loss.backward()
            for optimizer in optimizers:
                optimizer.step()
            seen += loss.item() * len(codes)
        print(f"epoch {epoch}: mean loss {seen / len(pairs):.4f}")

    model.eval()
    with torch.no_grad():
        for word in random.sample(words, args.show):
            codes = torch.LongTensor(spell(word, alphabet, slots)).unsqueeze(0)
            log_probs, attention = model(codes)
            print(f"{word} -> {unspell(log_probs.argmax(2)[0].tolist(), alphabet)}")
    figure, axes = plt.subplots()
    axes.matshow(attention[0].numpy(), cmap="viridis")
    figure.savefig("attention.png")
    plt.close(figure)


if __name__ == "__main__":
    main()
