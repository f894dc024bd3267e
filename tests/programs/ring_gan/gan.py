"""A small convolutional GAN that learns 16x16 pictures of rings.

After each epoch the networks and both optimizers are checkpointed. With --replay, the
program finally rewinds to the first checkpoint and trains the second epoch again.
"""
import argparse

import numpy as np
import torch
import torch.backends.cudnn as cudnn
import torch.nn as nn
import torch.nn.parallel
import torch.optim as optim
from torch.utils.data import DataLoader, TensorDataset

NOISE = 6


def rings(count, seed):
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[-1:1:16j, -1:1:16j]
    radius = rng.uniform(0.3, 0.8, (count, 1, 1))
    picture = np.exp(-((np.hypot(x, y) - radius) / 0.12) ** 2)
    return torch.from_numpy(picture * 2 - 1).unsqueeze(1)  # in [-1, 1], like a Tanh output


def initialise(module):
    kind = type(module).__name__
    if "Conv" in kind:
        nn.init.normal_(module.weight, 0.0, 0.02)
    elif "BatchNorm" in kind:
        nn.init.normal_(module.weight, 1.0, 0.02)
        nn.init.zeros_(module.bias)


def painter(width):
    return nn.Sequential(
        nn.ConvTranspose2d(NOISE, 2 * width, 4, 1, 0, bias=False),  # 1 -> 4
        nn.BatchNorm2d(2 * width), nn.ReLU(True),
        nn.ConvTranspose2d(2 * width, width, 4, 2, 1, bias=False),  # 4 -> 8
        nn.BatchNorm2d(width), nn.ReLU(True),
        nn.ConvTranspose2d(width, 1, 4, 2, 1, bias=False), nn.Tanh())  # 8 -> 16


def critic(width):
    return nn.Sequential(
        nn.Conv2d(1, width, 4, 2, 1, bias=False), nn.LeakyReLU(0.2, inplace=True),  # 16 -> 8
        nn.Conv2d(width, 2 * width, 4, 2, 1, bias=False), nn.BatchNorm2d(2 * width),
        nn.LeakyReLU(0.2, inplace=True),  # 8 -> 4
        nn.Conv2d(2 * width, 1, 4, 1, 0, bias=False), nn.Sigmoid(), nn.Flatten(0))


def epoch(data, gen, disc, opt_gen, opt_disc, criterion, number):
    for step, (real,) in enumerate(data):
        count = real.size(0)
        believed = torch.full((count,), 0.9, dtype=real.dtype)  # one-sided label smoothing
        doubted = torch.empty_like(believed).fill_(0.0)
        fake = gen(torch.randn(count, NOISE, 1, 1))

        opt_disc.zero_grad()
        judge_loss = criterion(disc(real), believed) + criterion(disc(fake.detach()), doubted)
        judge_loss.backward()
        opt_disc.step()

        opt_gen.zero_grad()
        fool_loss = criterion(disc(fake), believed.fill_(1.0))
        fool_loss.backward()
        opt_gen.step()
        print(f"[{number}/{step}] judge {judge_loss.item():.3f} fool {fool_loss.item():.3f}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--count", type=int, default=256)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--width", type=int, default=8)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--replay", action="store_true")
    args = parser.parse_args()

    cudnn.benchmark = True
    data = DataLoader(TensorDataset(rings(args.count, 0)), batch_size=args.batch, shuffle=True)
    gen, disc = painter(args.width), critic(args.width)
    gen.apply(initialise)
    disc.apply(initialise)
    criterion = nn.BCELoss()
    opt_gen = optim.Adam(gen.parameters(), lr=2e-3, betas=(0.5, 0.999))
    opt_disc = optim.Adam(disc.parameters(), lr=2e-3, betas=(0.5, 0.999))
    for number in range(args.epochs):
        epoch(data, gen, disc, opt_gen, opt_disc, criterion, number)
        torch.save({"epoch": number, "gen": gen.state_dict(), "disc": disc.state_dict(),
                    "opt_gen": opt_gen.state_dict(), "opt_disc": opt_disc.state_dict()},
                   f"checkpoint_{number}.pt")

    if args.replay:
        saved = torch.load("checkpoint_0.pt")
        gen.load_state_dict(saved["gen"])
        disc.load_state_dict(saved["disc"])
        opt_gen = optim.Adam(gen.parameters())
        opt_disc = optim.Adam(disc.parameters())
        opt_gen.load_state_dict(saved["opt_gen"])
        opt_disc.load_state_dict(saved["opt_disc"])
        epoch(data, gen, disc, opt_gen, opt_disc, criterion, saved["epoch"] + 1)
    with torch.no_grad():
        gen.eval()
        print("mean fake pixel", gen(torch.randn(4, NOISE, 1, 1)).mean().item())


if __name__ == "__main__":
    main()
