"""Train TinyGPT on token files; any setting can be overridden as --name=value.

Reads data/train.bin and data/val.bin (uint16 token ids) and data/vocab.json; writes
run/checkpoint.pt with the model, the optimizer state and the settings.
"""
import ast
import dataclasses
import json
import os
import sys
from contextlib import nullcontext

import numpy as np
import torch

from model import Shape, TinyGPT, learning_rate


@dataclasses.dataclass
class Settings:
    batch: int = 12
    context: int = 32
    layers: int = 4
    heads: int = 4
    width: int = 64
    dropout: float = 0.0
    steps: int = 200
    accumulate: int = 4
    peak_lr: float = 6e-4
    floor_lr: float = 6e-5
    warmup: int = 20
    decay_until: int = 200
    weight_decay: float = 0.1
    clip: float = 1.0
    eval_every: int = 50
    eval_batches: int = 10
    device: str = "cpu"
    precision: str = "float32"
    out: str = "run"


def parse(arguments):
    kinds = {field.name: field.type for field in dataclasses.fields(Settings)}
    chosen = {}
    for argument in arguments:
        name, equals, text = argument.lstrip("-").partition("=")
        if name not in kinds or not equals:
            raise SystemExit(f"expected --name=value with name in {sorted(kinds)}: {argument}")
        chosen[name] = text if kinds[name] is str else kinds[name](ast.literal_eval(text))
    return Settings(**chosen)


s = parse(sys.argv[1:])
torch.backends.cuda.matmul.allow_tf32 = True
torch.backends.cudnn.allow_tf32 = True
on_gpu = s.device.startswith("cuda")
precision = getattr(torch, s.precision)
autocast = torch.autocast("cuda", dtype=precision) if on_gpu else nullcontext()

with open(os.path.join("data", "vocab.json")) as f:
    vocab_size = len(json.load(f))
streams = {split: np.memmap(os.path.join("data", f"{split}.bin"), dtype=np.uint16, mode="r")
           for split in ("train", "val")}


def sample(split):
    tokens = streams[split]
    offsets = torch.randint(len(tokens) - s.context, (s.batch,)).tolist()
    windows = torch.stack([torch.from_numpy(tokens[o:o + s.context + 1].astype(np.int64))
                           for o in offsets]).to(s.device)
    return windows[:, :-1], windows[:, 1:]


@torch.no_grad()
def evaluate(model):
    model.eval()
    result = {}
    for split in streams:
        values = []
        for _ in range(s.eval_batches):
            with autocast:
                values.append(model(*sample(split))[1].item())
        result[split] = sum(values) / len(values)
    model.train()
    return result


model = TinyGPT(Shape(vocab_size, s.context, s.layers, s.heads, s.width, s.dropout))
model.to(s.device)
optimizer = model.optimizer(s.weight_decay, s.peak_lr, (0.9, 0.95), "cuda" if on_gpu else "cpu")
scaler = torch.cuda.amp.GradScaler(enabled=(s.precision == "float16"))
os.makedirs(s.out, exist_ok=True)
checkpoint = os.path.join(s.out, "checkpoint.pt")

for step in range(s.steps + 1):
    rate = learning_rate(step, s.peak_lr, s.floor_lr, s.warmup, s.decay_until)
    for group in optimizer.param_groups:
        group["lr"] = rate
    if step % s.eval_every == 0:
        losses = evaluate(model)
        print(f"step {step}: train {losses['train']:.4f} val {losses['val']:.4f}")
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                    "settings": dataclasses.asdict(s), "step": step}, checkpoint)
    total = 0.0
    for _ in range(s.accumulate):  # one optimizer step from several small batches
        with autocast:
            _, loss = model(*sample("train"))
        scaler.scale(loss / s.accumulate).backward()
        total += loss.item() / s.accumulate
    if s.clip:
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), s.clip)
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
    print(f"step {step}: lr {rate:.2e} loss {total:.4f}")

state = torch.load(checkpoint, map_location=s.device)
model.load_state_dict(state["model"])
optimizer.load_state_dict(state["optimizer"])
print(f"checkpoint of step {state['step']}: val {evaluate(model)['val']:.4f}")
