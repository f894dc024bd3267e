"""A character-level GPT trained on the Python standard library's docstrings.

    python -m tapegrad.examples.char_gpt [--steps 500] [--reference torch]

Causal self-attention, LayerNorm, a GELU MLP, token embedding tied to the output head,
AdamW with linear warm-up then cosine decay, gradient clipping. The text is collected at
run time from modules every Python ships, so it is there offline on every machine.
"""
import importlib
import inspect
import math

import numpy as np

import tapegrad
from tapegrad.examples import common

MODULES = ["json", "collections", "string", "textwrap", "argparse", "pathlib", "functools",
           "itertools", "re", "os", "inspect", "random", "statistics", "fractions"]


def load_text():
    parts = []
    for name in MODULES:
        module = importlib.import_module(name)
        for attr in sorted(dir(module)):
            if not attr.startswith("_"):
                doc = inspect.getdoc(getattr(module, attr))
                if doc:
                    parts.append(doc)
    return "\n\n".join(parts)


def build(T, vocab, block=32, dim=64, heads=4, layers=2):
    nn, F = T.nn, T.nn.functional

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1 = nn.LayerNorm(dim)
            self.qkv = nn.Linear(dim, 3 * dim)
            self.proj = nn.Linear(dim, dim)
            self.ln2 = nn.LayerNorm(dim)
            self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

        def forward(self, x):
            b, t, c = x.shape
            q, k, v = self.qkv(self.ln1(x)).split(dim, dim=2)
            q, k, v = (z.view(b, t, heads, c // heads).transpose(1, 2) for z in (q, k, v))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.proj(y.transpose(1, 2).reshape(b, t, c))
            return x + self.mlp(self.ln2(x))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.tok = nn.Embedding(vocab, dim)
            self.pos = nn.Embedding(block, dim)
            self.blocks = nn.Sequential(*[Block() for _ in range(layers)])
            self.ln_f = nn.LayerNorm(dim)
            self.head = nn.Linear(dim, vocab, bias=False)
            self.head.weight = self.tok.weight  # tied embedding / output weights
            nn.init.normal_(self.tok.weight, std=0.02)  # GPT-2's scale: logits start small
            nn.init.normal_(self.pos.weight, std=0.02)

        def forward(self, idx):
            t = idx.shape[1]
            x = self.tok(idx) + self.pos(T.arange(t, device=idx.device))
            return self.head(self.ln_f(self.blocks(x)))

    return GPT().double()


def make_optimizer(T, model, steps, warmup):
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = T.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                         {"params": no_decay, "weight_decay": 0.0}], lr=3e-3, betas=(0.9, 0.95))
    sched = T.optim.lr_scheduler.SequentialLR(
        opt, [T.optim.lr_scheduler.LinearLR(opt, start_factor=0.1, total_iters=warmup),
              T.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=max(steps - warmup, 1),
                                                     eta_min=3e-4)],
        milestones=[warmup])
    return opt, sched


def sample(T, model, stoi, itos, prompt, n, block, seed):
    """Temperature-0.8 sampling with numpy's RNG (the same draws for either library)."""
    rng = np.random.default_rng(seed)
    idx = [stoi[c] for c in prompt]
    with T.no_grad():
        for _ in range(n):
            logits = model(T.tensor([idx[-block:]]))[0, -1].numpy() / 0.8
            p = np.exp(logits - logits.max())
            idx.append(int(rng.choice(len(p), p=p / p.sum())))
    return "".join(itos[i] for i in idx)


def run(T, args, data, vocab, init_state=None):
    block, batch = 32, 16
    model = build(T, vocab, block)
    if init_state is not None:
        model.load_state_dict(init_state)
    warmup = max(args.steps // 10, 1)
    opt, sched = make_optimizer(T, model, args.steps, warmup)
    rng = np.random.default_rng(args.seed + 1)
    offsets = [rng.integers(0, len(data) - block - 1, size=batch) for _ in range(args.steps)]

    def step(T, model, i):
        xb = np.stack([data[o:o + block] for o in offsets[i]])
        yb = np.stack([data[o + 1:o + block + 1] for o in offsets[i]])
        logits = model(T.tensor(xb))
        loss = T.nn.functional.cross_entropy(logits.view(-1, vocab), T.tensor(yb).view(-1))
        opt.zero_grad()
        loss.backward()
        T.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        return loss.item()

    losses, seconds = common.train_loop(T, model, step, args.steps, f"gpt ({T.__name__})",
                                        args.no_progress)
    return model, losses, seconds


def main(argv=None):
    args = common.parse_args("char_gpt", __doc__.splitlines()[0], steps=500, argv=argv)
    text = load_text()
    chars = sorted(set(text))
    stoi = {c: i for i, c in enumerate(chars)}
    itos = {i: c for c, i in stoi.items()}
    data = np.array([stoi[c] for c in text], dtype=np.int64)
    print(f"text: {len(text):,} characters of docstrings from {len(MODULES)} stdlib modules, "
          f"vocabulary {len(chars)}")
    tapegrad.manual_seed(args.seed)
    init = build(tapegrad, len(chars)).state_dict()
    init = {k: v.clone() for k, v in init.items()}
    prompt = "Return the "
    tapegrad.manual_seed(args.seed)
    untrained = build(tapegrad, len(chars))
    untrained.load_state_dict(init)
    print("sample before training:\n  " + sample(tapegrad, untrained, stoi, itos, prompt, 120,
                                                  32, args.seed).replace("\n", "\n  "))
    model, losses, seconds = run(tapegrad, args, data, len(chars), init_state=init)
    print(f"char GPT: {args.steps} AdamW steps, batch 16 x 32 characters, float64 — loss "
          f"{losses[0]:.3f} -> {losses[-1]:.3f} (uniform guess: {math.log(len(chars)):.3f}), "
          f"{seconds:.1f} s")
    print("sample after training:\n  " + sample(tapegrad, model, stoi, itos, prompt, 200, 32,
                                                 args.seed).replace("\n", "\n  "))
    ref = None
    if args.reference == "torch":
        import torch

        _, ref, ref_seconds = run(torch, args, data, len(chars),
                                  init_state=common.to_torch_state(init))
        common.report_reference(losses, ref, seconds, ref_seconds)
    common.save_outputs(args.out, "char_gpt", losses, model, ref)
    return losses


if __name__ == "__main__":
    main()
