"""Spell words backwards with a GRU encoder and an additive-attention GRU decoder.

pairs.txt holds one word per line, accents and all; words are folded to plain ASCII first.
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

START, STOP = 0, 1


def plain(word: str) -> str:
    decomposed = unicodedata.normalize("NFD", word.strip().lower())
    return "".join(c for c in decomposed if unicodedata.category(c) != "Mn")


class Letters:
    def __init__(self, words: list[str]):
        self.symbols = ["<", ">"] + sorted({c for w in words for c in w})
        self.code = {c: i for i, c in enumerate(self.symbols)}

    def encode(self, word: str, width: int) -> np.ndarray:
        ids = np.full(width, STOP, dtype=np.int32)
        ids[:len(word)] = [self.code[c] for c in word]
        return ids

    def decode(self, ids) -> str:
        out = []
        for i in ids:
            if i == STOP:
                break
            out.append(self.symbols[i])
        return "".join(out)


class Reader(nn.Module):
    def __init__(self, vocab, hidden):
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden)
        self.rnn = nn.GRU(hidden, hidden, batch_first=True)

    def forward(self, ids):
        return self.rnn(self.embed(ids))


class AdditiveAttention(nn.Module):
    def __init__(self, hidden):
        super().__init__()
        self.query, self.key, self.score = (nn.Linear(hidden, hidden), nn.Linear(hidden, hidden),
                                            nn.Linear(hidden, 1))

    def forward(self, query, keys):  # query: (batch, 1, hidden), keys: (batch, time, hidden)
        energy = self.score(torch.tanh(self.query(query) + self.key(keys)))
        weights = F.softmax(energy.squeeze(2).unsqueeze(1), dim=-1)
        return torch.bmm(weights, keys), weights


class Writer(nn.Module):
    def __init__(self, vocab, hidden, width):
        super().__init__()
        self.width = width
        self.embed = nn.Embedding(vocab, hidden)
        self.attention = AdditiveAttention(hidden)
        self.rnn = nn.GRU(2 * hidden, hidden, batch_first=True)
        self.out = nn.Linear(hidden, vocab)

    def step(self, ids, state, keys):
        query = state.permute(1, 0, 2)
        context, weights = self.attention(query, keys)
        output, state = self.rnn(torch.cat((self.embed(ids), context), dim=2), state)
        return self.out(output), state, weights

    def forward(self, keys, state, targets=None, teacher=0.5):
        ids = torch.empty(keys.size(0), 1, dtype=torch.long).fill_(START)
        outputs, attentions = [], []
        for t in range(self.width):
            output, state, weights = self.step(ids, state, keys)
            outputs.append(output)
            attentions.append(weights)
            if targets is not None and random.random() < teacher:
                ids = targets[:, t].unsqueeze(1)
            else:
                _, best = output.topk(1)
                ids = best.squeeze(-1).detach()
        scores = F.log_softmax(torch.cat(outputs, dim=1), dim=-1)
        return scores, torch.cat(attentions, dim=1)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--teacher", type=float, default=0.5)
    parser.add_argument("--show", type=int, default=5)
    args = parser.parse_args()

    with open("pairs.txt", encoding="utf-8") as f:
        words = [plain(line) for line in f if line.strip()]
    letters = Letters(words)
    width = max(len(w) for w in words) + 1
    sources = np.stack([letters.encode(w, width) for w in words])
    targets = np.stack([letters.encode(w[::-1], width) for w in words])
    data = TensorDataset(torch.LongTensor(sources), torch.LongTensor(targets))
    loader = DataLoader(data, sampler=RandomSampler(data), batch_size=args.batch)

    reader = Reader(len(letters.symbols), args.hidden)
    writer = Writer(len(letters.symbols), args.hidden, width)
    read_opt, write_opt = (optim.Adam(m.parameters(), lr=1e-2) for m in (reader, writer))
    criterion = nn.NLLLoss()
    for epoch in range(args.epochs):
        total = 0.0
        for source, target in loader:
            read_opt.zero_grad()
            write_opt.zero_grad()
            keys, state = reader(source)
            scores, _ = writer(keys, state, target, args.teacher)
            loss = criterion(scores.view(-1, scores.size(-1)), target.view(-1))
            loss.backward()
            read_opt.step()
            write_opt.step()
            total += loss.item()
        print(f"epoch {epoch}: {total / len(loader):.4f}")

    with torch.no_grad():
        for word in random.sample(words, args.show):
            keys, state = reader(torch.LongTensor(letters.encode(word, width)).unsqueeze(0))
            scores, attention = writer(keys, state)
            print(word, "->", letters.decode(scores.argmax(-1)[0].tolist()))
    figure, axes = plt.subplots()
    axes.matshow(attention[0].numpy(), cmap="bone")
    figure.savefig("attention.png")
    plt.close(figure)


if __name__ == "__main__":
    main()
