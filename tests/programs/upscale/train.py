"""Train SubPixelNet on a folder of pictures; report PSNR on a held-out folder."""
import argparse
import math
import os

import torch
import torch.nn as nn
import torch.optim as optim
from torch.utils.data import DataLoader

from superres import LumaPairs, SubPixelNet


def mean_psnr(model, loader, loss_fn):
    """Peak signal-to-noise ratio in dB (pixels in [0, 1]), averaged over batches."""
    with torch.no_grad():
        ratios = [-10.0 * math.log10(loss_fn(model(small), full).item()) for small, full in loader]
    return sum(ratios) / len(ratios)


def main():
    parser = argparse.ArgumentParser(description="sub-pixel super-resolution")
    parser.add_argument("--pictures", default="pictures")
    parser.add_argument("--factor", type=int, default=3)
    parser.add_argument("--crop", type=int, default=64)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--lr", type=float, default=1e-3)
    args = parser.parse_args()

    train = DataLoader(LumaPairs(os.path.join(args.pictures, "train"), args.crop, args.factor),
                       batch_size=args.batch, shuffle=True)
    test = DataLoader(LumaPairs(os.path.join(args.pictures, "test"), args.crop, args.factor),
                      batch_size=args.batch)
    model = SubPixelNet(args.factor)
    loss_fn = nn.MSELoss()
    optimizer = optim.Adam(model.parameters(), lr=args.lr)
    for epoch in range(1, args.epochs + 1):
        for small, full in train:
            optimizer.zero_grad()
            loss = loss_fn(model(small), full)
            loss.backward()
            optimizer.step()
        print(f"epoch {epoch}: last loss {loss.item():.5f}, "
              f"test PSNR {mean_psnr(model, test, loss_fn):.2f} dB")
        torch.save(model, f"upscale_{epoch}.pth")
    restored = torch.load(f"upscale_{args.epochs}.pth", weights_only=False)
    print(f"restored model: PSNR {mean_psnr(restored, test, loss_fn):.2f} dB")


if __name__ == "__main__":
    main()
