"""A decoder-only transformer with tied input and output embeddings."""
import inspect
import math
from dataclasses import dataclass

import torch
import torch.nn as nn
from torch.nn import functional as F


@dataclass
class Shape:
    vocab: int = 64
    context: int = 32
    layers: int = 4
    heads: int = 4
    width: int = 64
    dropout: float = 0.0
    bias: bool = False


class CausalSelfAttention(nn.Module):
    def __init__(self, shape):
        super().__init__()
        self.heads, self.dropout = shape.heads, shape.dropout
        self.qkv = nn.Linear(shape.width, 3 * shape.width, bias=shape.bias)
        self.out = nn.Linear(shape.width, shape.width, bias=shape.bias)
        self.out_dropout = nn.Dropout(shape.dropout)

    def forward(self, x):
        batch, steps, width = x.shape
        q, k, v = (t.view(batch, steps, self.heads, -1).transpose(1, 2)
                   for t in self.qkv(x).split(width, dim=2))
        p = self.dropout if self.training else 0.0
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
        return self.out_dropout(self.out(y.transpose(1, 2).reshape(batch, steps, width)))


class Layer(nn.Module):
    def __init__(self, shape):
        super().__init__()
        self.norm_attention = nn.LayerNorm(shape.width, bias=shape.bias)
        self.attention = CausalSelfAttention(shape)
        self.norm_mlp = nn.LayerNorm(shape.width, bias=shape.bias)
        self.mlp = nn.Sequential(nn.Linear(shape.width, 4 * shape.width, bias=shape.bias),
                                 nn.GELU(approximate="tanh"),
                                 nn.Linear(4 * shape.width, shape.width, bias=shape.bias),
                                 nn.Dropout(shape.dropout))

    def forward(self, x):
        x = x + self.attention(self.norm_attention(x))
        return x + self.mlp(self.norm_mlp(x))


class TinyGPT(nn.Module):
    def __init__(self, shape):
        super().__init__()
        self.shape = shape
        self.tokens = nn.Embedding(shape.vocab, shape.width)
        self.places = nn.Embedding(shape.context, shape.width)
        self.dropout = nn.Dropout(shape.dropout)
        self.layers = nn.ModuleList(Layer(shape) for _ in range(shape.layers))
        self.norm = nn.LayerNorm(shape.width, bias=shape.bias)
        self.unembed = nn.Linear(shape.width, shape.vocab, bias=False)
        self.tokens.weight = self.unembed.weight

    def forward(self, ids, targets=None):
        places = torch.arange(ids.size(1), device=ids.device)
        x = self.dropout(self.tokens(ids) + self.places(places))
        for layer in self.layers:
            x = layer(x)
        logits = self.unembed(self.norm(x))
        if targets is None:
            return logits, None
        return logits, F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1))

    def optimizer(self, weight_decay, lr, betas, device_type):
        """AdamW decaying matrices (weights, embeddings) but not vectors (norms)."""
        matrices, vectors = [], []
        for p in self.parameters():
            if p.requires_grad:
                (matrices if p.dim() >= 2 else vectors).append(p)
        options = dict(lr=lr, betas=betas)
        if device_type == "cuda" and "fused" in inspect.signature(torch.optim.AdamW).parameters:
            options["fused"] = True
        return torch.optim.AdamW([dict(params=matrices, weight_decay=weight_decay),
                                  dict(params=vectors, weight_decay=0.0)], **options)


def learning_rate(step, peak, floor, warmup, decay_until):
    """Linear warm-up to ``peak``, half a cosine down to ``floor``, then ``floor``."""
    if step >= warmup:
        done = min(1.0, (step - warmup) / (decay_until - warmup))
        return floor + (peak - floor) * (1.0 + math.cos(math.pi * done)) / 2.0
    return peak * (step + 1) / (warmup + 1)
