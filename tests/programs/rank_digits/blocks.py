"""A transformer whose attention is written out: scores, a causal mask buffer, softmax."""
import math

import torch
import torch.nn as nn
from torch.nn import functional as F


class TanhGELU(nn.Module):
    def forward(self, x):
        return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


class MaskedAttention(nn.Module):
    def __init__(self, width, heads, span, dropout):
        super().__init__()
        self.heads = heads
        self.project_in = nn.Linear(width, 3 * width)
        self.project_out = nn.Linear(width, width)
        self.drop_scores = nn.Dropout(dropout)
        self.register_buffer("allowed", torch.tril(torch.ones(span, span)).view(1, 1, span, span))

    def forward(self, x):
        b, t, w = x.size()
        q, k, v = self.project_in(x).split(w, dim=2)
        q, k, v = (z.view(b, t, self.heads, w // self.heads).transpose(1, 2) for z in (q, k, v))
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(k.size(-1))
        scores = scores.masked_fill(self.allowed[:, :, :t, :t] == 0, float("-inf"))
        weights = self.drop_scores(F.softmax(scores, dim=-1))
        mixed = (weights @ v).transpose(1, 2).contiguous().view(b, t, w)
        return self.project_out(mixed)


class Block(nn.Module):
    def __init__(self, width, heads, span, dropout):
        super().__init__()
        self.norm_a = nn.LayerNorm(width)
        self.attention = MaskedAttention(width, heads, span, dropout)
        self.norm_b = nn.LayerNorm(width)
        self.feed = nn.ModuleDict(dict(widen=nn.Linear(width, 4 * width), act=TanhGELU(),
                                       narrow=nn.Linear(4 * width, width),
                                       drop=nn.Dropout(dropout)))
        f = self.feed
        self.feed_forward = lambda x: f.drop(f.narrow(f.act(f.widen(x))))

    def forward(self, x):
        x = x + self.attention(self.norm_a(x))
        return x + self.feed_forward(self.norm_b(x))


class Ranker(nn.Module):
    def __init__(self, vocab, span, width=48, heads=3, depth=3, dropout=0.1):
        super().__init__()
        self.span = span
        self.embed = nn.Embedding(vocab, width)
        self.place = nn.Embedding(span, width)
        self.blocks = nn.Sequential(*[Block(width, heads, span, dropout) for _ in range(depth)])
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab, bias=False)
        self.apply(self._initialise)
        for name, p in self.named_parameters():
            if name.endswith("project_out.weight"):  # residual branches: smaller at depth
                torch.nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * depth))

    @staticmethod
    def _initialise(module):
        if isinstance(module, (nn.Linear, nn.Embedding)):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            torch.nn.init.zeros_(module.bias)
        elif isinstance(module, nn.LayerNorm):
            torch.nn.init.ones_(module.weight)
            torch.nn.init.zeros_(module.bias)

    def forward(self, ids, targets=None):
        x = self.embed(ids) + self.place(torch.arange(ids.size(1)).unsqueeze(0))
        logits = self.head(self.norm(self.blocks(x)))
        loss = None
        if targets is not None:  # -1 marks positions that are not scored
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1),
                                   ignore_index=-1)
        return logits, loss

    def optimizer(self, lr, weight_decay):
        decay, keep = set(), set()
        for module_name, module in self.named_modules():
            for name, _ in module.named_parameters(recurse=False):
                full = f"{module_name}.{name}" if module_name else name
                if name == "weight" and isinstance(module, nn.Linear):
                    decay.add(full)
                else:
                    keep.add(full)
        params = dict(self.named_parameters())
        assert decay.isdisjoint(keep) and decay | keep == params.keys()
        groups = [{"params": [params[n] for n in sorted(decay)], "weight_decay": weight_decay},
                  {"params": [params[n] for n in sorted(keep)], "weight_decay": 0.0}]
        return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95))

    @torch.no_grad()
    def complete(self, ids, count):
        for _ in range(count):
            logits, _ = self(ids[:, -self.span:])
            _, best = torch.topk(logits[:, -1, :], k=1, dim=-1)
            ids = torch.cat((ids, best), dim=1)
        return ids
