# A plain PyTorch script: a tiny transformer block language model with AdamW and clipping.
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.ln1 = nn.LayerNorm(dim)
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.ln2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))

    def forward(self, x, mask):
        h = self.ln1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class TinyLM(nn.Module):
    def __init__(self, vocab, dim=16, heads=2, block=8):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.pos = nn.Parameter(torch.zeros(1, block, dim))
        self.block = Block(dim, heads)
        self.head = nn.Linear(dim, vocab)

    def forward(self, idx):
        t = idx.shape[1]
        mask = torch.triu(torch.ones(t, t, dtype=torch.bool), diagonal=1)
        x = self.emb(idx) + self.pos[:, :t]
        return self.head(self.block(x, mask))


torch.set_default_dtype(torch.float64)
model = TinyLM(vocab=11)
model.load_state_dict({k: torch.tensor(v) for k, v in INIT.items()})
opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 5)
                                          * 0.5 * (1 + math.cos(math.pi * s / 25)))
idx = torch.tensor(DATA["idx"])
for step in range(25):
    logits = model(idx[:, :-1])
    loss = F.cross_entropy(logits.reshape(-1, 11), idx[:, 1:].reshape(-1))
    opt.zero_grad()
    loss.backward()
    nn.utils.clip_grad_norm_(model.parameters(), 0.5)
    opt.step()
    sched.step()
    LOSSES.append(loss.item())
