"""A small causal transformer with its attention written out in tensor operations."""
import math

import torch
import torch.nn as nn
from torch.nn import functional as F


class TanhGELU(nn.Module):
    """GELU by its tanh approximation, written as pointwise operations."""

    def forward(self, x):
        inner = math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))
        return 0.5 * x * (1.0 + torch.tanh(inner))


class CausalAttention(nn.Module):
    def __init__(self, width, heads, span, dropout):
        super().__init__()
        self.heads, self.size = heads, width // heads
        self.qkv = nn.Linear(width, 3 * width)
        self.merge = nn.Linear(width, width)
        self.merge.residual = True  # initialised smaller: it adds onto the residual stream
        self.forget = nn.Dropout(dropout)
        self.register_buffer("visible", torch.ones(span, span).tril().view(1, 1, span, span))

    def forward(self, x):
        batch, steps, _ = x.shape
        heads = self.qkv(x).view(batch, steps, 3, self.heads, self.size).permute(2, 0, 3, 1, 4)
        q, k, v = heads[0], heads[1], heads[2]
        scores = q.matmul(k.transpose(-1, -2)) * self.size ** -0.5
        scores = scores.masked_fill(self.visible[..., :steps, :steps] == 0, float("-inf"))
        mixed = self.forget(scores.softmax(dim=-1)).matmul(v)
        return self.merge(mixed.transpose(1, 2).reshape(batch, steps, -1))


class Block(nn.Module):
    def __init__(self, width, heads, span, dropout):
        super().__init__()
        self.before_attention = nn.LayerNorm(width)
        self.attention = CausalAttention(width, heads, span, dropout)
        self.before_mlp = nn.LayerNorm(width)
        self.mlp = nn.ModuleDict({"up": nn.Linear(width, 4 * width), "gelu": TanhGELU(),
                                  "down": nn.Linear(4 * width, width),
                                  "dropout": nn.Dropout(dropout)})
        self.mlp["down"].residual = True

    def forward(self, x):
        x = x + self.attention(self.before_attention(x))
        h = self.before_mlp(x)
        for layer in self.mlp.values():
            h = layer(h)
        return x + h


def initialise(module, depth):
    """N(0, 0.02) weights, zero biases; layers feeding the residual stream scaled by depth."""
    if isinstance(module, (nn.Linear, nn.Embedding)):
        scale = 1.0 / math.sqrt(2 * depth) if getattr(module, "residual", False) else 1.0
        nn.init.normal_(module.weight, mean=0.0, std=0.02 * scale)
    if isinstance(module, nn.Linear) and module.bias is not None:
        nn.init.zeros_(module.bias)


class Ranker(nn.Module):
    def __init__(self, vocab, span, width=48, heads=3, depth=3, dropout=0.1):
        super().__init__()
        self.span = span
        self.symbols = nn.Embedding(vocab, width)
        self.positions = nn.Embedding(span, width)
        self.blocks = nn.Sequential(*[Block(width, heads, span, dropout) for _ in range(depth)])
        self.final_norm = nn.LayerNorm(width)
        self.logits = nn.Linear(width, vocab, bias=False)
        self.apply(lambda module: initialise(module, depth))

    def forward(self, ids, targets=None):
        where = torch.arange(ids.size(1)).unsqueeze(0)
        h = self.blocks(self.symbols(ids) + self.positions(where))
        logits = self.logits(self.final_norm(h))
        if targets is None:
            return logits, None
        scored = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=-1)
        return logits, scored

    def optimizer(self, lr, weight_decay):
        """AdamW that decays the weights of Linear layers and nothing else."""
        decayed = {id(m.weight) for _, m in self.named_modules() if isinstance(m, nn.Linear)}
        groups = {True: [], False: []}
        for _, p in self.named_parameters():
            groups[id(p) in decayed].append(p)
        return torch.optim.AdamW([{"params": groups[True], "weight_decay": weight_decay},
                                  {"params": groups[False], "weight_decay": 0.0}],
                                 lr=lr, betas=(0.9, 0.95))

    @torch.no_grad()
    def continue_greedily(self, ids, count):
        for _ in range(count):
            logits, _ = self(ids[:, -self.span:])
            ids = torch.cat((ids, logits[:, -1].topk(1, dim=-1).indices), dim=1)
        return ids
