"""Recurrent and transformer character models with the same interface."""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class RecurrentModel(nn.Module):
    def __init__(self, cell, vocab, width, layers, dropout=0.0, tie=False):
        super().__init__()
        self.cell, self.width, self.layers = cell, width, layers
        self.embed = nn.Embedding(vocab, width)
        self.rnn = getattr(nn, cell)(width, width, layers, batch_first=True)
        self.dropout = nn.Dropout(dropout)
        self.readout = nn.Linear(width, vocab)
        if tie:
            self.readout.weight = self.embed.weight

    def start(self, batch):
        zeros = next(self.parameters()).new_zeros(self.layers, batch, self.width)
        return (zeros, zeros.clone()) if self.cell == "LSTM" else zeros

    def forward(self, ids, state):
        out, state = self.rnn(self.dropout(self.embed(ids)), state)
        return F.log_softmax(self.readout(self.dropout(out)), dim=-1), state


class SinusoidTable(nn.Module):
    def __init__(self, width, longest=256):
        super().__init__()
        position = torch.arange(longest).unsqueeze(1)
        frequency = torch.exp(torch.arange(0, width, 2) * (-math.log(1e4) / width))
        table = torch.zeros(longest, 1, width)
        table[:, 0, 0::2] = torch.sin(position * frequency)
        table[:, 0, 1::2] = torch.cos(position * frequency)
        self.register_buffer("table", table)

    def forward(self, x):  # x: (time, batch, width)
        return x + self.table[:x.size(0)]


class AttentionModel(nn.Transformer):
    """Only the encoder stack of nn.Transformer, with a causal float mask."""

    def __init__(self, vocab, width, heads, hidden, layers, dropout=0.0):
        super().__init__(d_model=width, nhead=heads, dim_feedforward=hidden,
                         num_encoder_layers=layers, num_decoder_layers=1, dropout=dropout)
        del self.decoder  # never used: its parameters would get no gradient
        self.cell = "Transformer"
        self.embed = nn.Embedding(vocab, width)
        self.positions = SinusoidTable(width)
        self.readout = nn.Linear(width, vocab)
        self.scale = math.sqrt(width)

    def start(self, batch):
        return None

    def forward(self, ids, state=None):
        steps = ids.t()  # nn.Transformer is sequence-first by default
        mask = self.generate_square_subsequent_mask(steps.size(0))
        h = self.encoder(self.positions(self.embed(steps) * self.scale), mask=mask)
        return F.log_softmax(self.readout(h), dim=-1).transpose(0, 1), None
