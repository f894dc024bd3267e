"""Character models with one interface: model(ids, state) -> (log-probs, state)."""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class RecurrentModel(nn.Module):
    """Embedding, a stack of LSTM or GRU layers (batch first), and a readout."""

    def __init__(self, cell, vocab, width, layers, dropout=0.0, tie=False):
        super().__init__()
        self.cell = cell
        self.embed = nn.Embedding(vocab, width)
        self.rnn = getattr(nn, cell)(width, width, layers, batch_first=True)
        self.dropout = nn.Dropout(dropout)
        self.readout = nn.Linear(width, vocab)
        if tie:  # one matrix both looks characters up and scores them
            self.readout.weight = self.embed.weight

    def start(self, rows):
        zeros = self.readout.bias.new_zeros(self.rnn.num_layers, rows, self.rnn.hidden_size)
        return (zeros, torch.zeros_like(zeros)) if self.cell == "LSTM" else zeros

    @staticmethod
    def carry(state):
        """The state for the next window, cut off from the graph of this one."""
        return tuple(s.detach() for s in state) if isinstance(state, tuple) else state.detach()

    def forward(self, ids, state):
        h, state = self.rnn(self.dropout(self.embed(ids)), state)
        return F.log_softmax(self.readout(self.dropout(h)), dim=-1), state


def sinusoids(steps, width):
    """(steps, 1, width): sin and cos of position / 10000^(2i/width), interleaved."""
    where = torch.arange(steps).unsqueeze(1)
    rates = torch.pow(10000.0, -torch.arange(0, width, 2) / width)
    return torch.stack((torch.sin(where * rates), torch.cos(where * rates)), dim=-1) \
        .flatten(1).unsqueeze(1)


class AttentionModel(nn.Transformer):
    """The encoder stack of nn.Transformer, causally masked, scored against the embedding."""

    def __init__(self, vocab, width, heads, hidden, layers, dropout=0.0, longest=512):
        super().__init__(d_model=width, nhead=heads, num_encoder_layers=layers,
                         num_decoder_layers=1, dim_feedforward=hidden, dropout=dropout)
        del self.decoder  # never used: its parameters would get no gradient
        self.embed = nn.Embedding(vocab, width)
        self.register_buffer("where", sinusoids(longest, width))

    def start(self, rows):
        return None

    @staticmethod
    def carry(state):
        return state

    def forward(self, ids, state=None):
        steps = ids.t()  # (time, rows): nn.Transformer is sequence-first unless told otherwise
        x = self.embed(steps) * math.sqrt(self.d_model) + self.where[:steps.size(0)]
        mask = self.generate_square_subsequent_mask(steps.size(0))
        h = self.encoder(x, mask=mask)
        logits = h @ self.embed.weight.t()
        return F.log_softmax(logits, dim=-1).transpose(0, 1), None
