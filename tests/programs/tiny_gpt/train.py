"""Train TinyGPT on token files; settings are overridden as --name=value.

Reads data/train.bin and data/val.bin (uint16 token ids) and data/vocab.json; writes
run/checkpoint.pt with the model, the optimizer state and the settings.
"""
import ast
import json
import os
import sys
from contextlib import nullcontext

import numpy as np
import torch

from model import Shape, TinyGPT, cosine_rate

settings = dict(batch=12, context=32, layers=4, heads=4, width=64, dropout=0.0, steps=200,
                accumulate=4, peak_lr=6e-4, floor_lr=6e-5, warmup=20, decay_until=200,
                weight_decay=0.1, clip=1.0, eval_every=50, eval_batches=10, device="cpu",
                precision="float32", out="run")
for argument in sys.argv[1:]:
    name, _, text = argument.removeprefix("--").partition("=")
    if name not in settings:
        raise SystemExit(f"unknown setting {name}")
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        value = text
    settings[name] = type(settings[name])(value)
s = type("Settings", (), settings)

torch.backends.cuda.matmul.allow_tf32 = True
torch.backends.cudnn.allow_tf32 = True
device_type = "cuda" if "cuda" in s.device else "cpu"
amp_dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16,
             "float16": torch.float16}[s.precision]
autocast = (nullcontext() if device_type == "cpu"
            else torch.amp.autocast(device_type=device_type, dtype=amp_dtype))

with open(os.path.join("data", "vocab.json")) as f:
    vocab = len(json.load(f))


def batch_of(split):
    tokens = np.memmap(os.path.join("data", f"{split}.bin"), dtype=np.uint16, mode="r")
    starts = torch.randint(len(tokens) - s.context, (s.batch,))
    x = torch.stack([torch.from_numpy(tokens[i:i + s.context].astype(np.int64))
                     for i in starts.tolist()])
    y = torch.stack([torch.from_numpy(tokens[i + 1:i + 1 + s.context].astype(np.int64))
                     for i in starts.tolist()])
    return x.to(s.device), y.to(s.device)


@torch.no_grad()
def estimate(model):
    model.eval()
    means = {}
    for split in ("train", "val"):
        losses = torch.zeros(s.eval_batches)
        for k in range(s.eval_batches):
            with autocast:
                _, loss = model(*batch_of(split))
            losses[k] = loss.item()
        means[split] = losses.mean().item()
    model.train()
    return means


model = TinyGPT(Shape(vocab, s.context, s.layers, s.heads, s.width, s.dropout)).to(s.device)
optimizer = model.optimizer(s.weight_decay, s.peak_lr, (0.9, 0.95), device_type)
scaler = torch.cuda.amp.GradScaler(enabled=(s.precision == "float16"))
os.makedirs(s.out, exist_ok=True)

x, y = batch_of("train")
for step in range(s.steps + 1):
    for group in optimizer.param_groups:
        group["lr"] = cosine_rate(step, s.peak_lr, s.floor_lr, s.warmup, s.decay_until)
    if step % s.eval_every == 0:
        means = estimate(model)
        print(f"step {step}: train {means['train']:.4f} val {means['val']:.4f}")
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                    "settings": settings, "step": step}, os.path.join(s.out, "checkpoint.pt"))
    for micro in range(s.accumulate):
        with autocast:
            _, loss = model(x, y)
            loss = loss / s.accumulate
        x, y = batch_of("train")  # the next batch while this one's backward runs
        scaler.scale(loss).backward()
    if s.clip > 0:
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), s.clip)
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
    print(f"step {step}: loss {loss.item() * s.accumulate:.4f}")

saved = torch.load(os.path.join(s.out, "checkpoint.pt"), map_location=s.device)
model.load_state_dict(saved["model"])
optimizer.load_state_dict(saved["optimizer"])
print(f"checkpoint of step {saved['step']}: val {estimate(model)['val']:.4f}")
