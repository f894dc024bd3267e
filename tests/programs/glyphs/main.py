"""Classify noisy 12x12 glyphs drawn from ten made-up templates.

Two models read the same images: a small CNN (--arch cnn) and an LSTM that reads one row
per step (--arch rows). The data are generated here, so the program needs no download.
"""
import argparse

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
from torch.optim.lr_scheduler import StepLR
from torch.utils.data import DataLoader, TensorDataset

SIDE, CLASSES = 12, 10


def glyph_set(count, seed):
    templates = np.random.default_rng(1234).random((CLASSES, SIDE, SIDE)) > 0.6
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, CLASSES, count)
    pixels = 0.8 * templates[labels] + rng.normal(0.0, 0.35, (count, SIDE, SIDE))
    return TensorDataset(torch.from_numpy(pixels).unsqueeze(1), torch.from_numpy(labels))


class ConvClassifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv_a = nn.Conv2d(1, 6, 3, padding=1)
        self.conv_b = nn.Conv2d(6, 10, 3)
        self.dropout = nn.Dropout(0.3)
        self.head = nn.Linear(10 * 4 * 4, CLASSES)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv_a(x)), 2)  # 12 -> 6
        x = F.relu(self.conv_b(x))  # 6 -> 4
        x = self.dropout(torch.flatten(x, 1))
        return F.log_softmax(self.head(x), dim=1)


class RowReader(nn.Module):
    def __init__(self, hidden=20):
        super().__init__()
        self.rnn = nn.LSTM(SIDE, hidden, batch_first=True)
        self.norm = nn.BatchNorm1d(hidden)
        self.dropout = nn.Dropout2d(0.2)  # on (batch, features): PyTorch drops single features
        self.head = nn.Linear(hidden, CLASSES)

    def forward(self, x):
        rows, _ = self.rnn(x.squeeze(1))
        last = self.dropout(self.norm(rows[:, -1]))
        return F.log_softmax(self.head(last), dim=1)


def sweep(model, loader, device, optimizer=None, log_every=0):
    """One pass over ``loader``: trains when given an optimizer. Mean loss and accuracy."""
    training = optimizer is not None
    model.train(training)
    loss_sum, hits = 0.0, 0
    for batch, (images, labels) in enumerate(loader):
        images, labels = images.to(device), labels.to(device)
        with torch.set_grad_enabled(training):
            log_probs = model(images)
            loss = F.nll_loss(log_probs, labels, reduction="sum")
        if training:
            optimizer.zero_grad()
            (loss / len(labels)).backward()
            optimizer.step()
        loss_sum += loss.item()
        picked = log_probs.argmax(dim=1, keepdim=True)
        hits += picked.eq(labels.view_as(picked)).sum().item()
        if log_every and batch % log_every == 0:
            print(f"  batch {batch}: {loss.item() / len(labels):.4f}")
    return loss_sum / len(loader.dataset), hits / len(loader.dataset)


def main():
    parser = argparse.ArgumentParser(description="glyph classifier")
    parser.add_argument("--arch", choices=["cnn", "rows"], default="cnn")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--lr", type=float, default=0.5)
    parser.add_argument("--gamma", type=float, default=0.8)
    parser.add_argument("--train-size", type=int, default=2000)
    parser.add_argument("--log-every", type=int, default=10)
    parser.add_argument("--no-accel", action="store_true")
    parser.add_argument("--save", default="")
    args = parser.parse_args()

    torch.backends.cudnn.deterministic = True
    if not args.no_accel and torch.accelerator.is_available():
        device = torch.accelerator.current_accelerator()
    elif torch.backends.mps.is_available():
        device = torch.device("mps")
    else:
        device = torch.device("cpu")

    train = DataLoader(glyph_set(args.train_size, 0), batch_size=args.batch_size, shuffle=True)
    test = DataLoader(glyph_set(args.train_size // 4, 1), batch_size=2 * args.batch_size)
    model = (ConvClassifier() if args.arch == "cnn" else RowReader()).to(device)
    optimizer = optim.Adadelta(model.parameters(), lr=args.lr)
    scheduler = StepLR(optimizer, step_size=1, gamma=args.gamma)
    for epoch in range(1, args.epochs + 1):
        fit_loss, fit_accuracy = sweep(model, train, device, optimizer, args.log_every)
        test_loss, test_accuracy = sweep(model, test, device)
        print(f"epoch {epoch}: train {fit_loss:.4f} ({fit_accuracy:.1%}), "
              f"test {test_loss:.4f} ({test_accuracy:.1%})")
        scheduler.step()
    if args.save:
        torch.save(model.state_dict(), args.save)


if __name__ == "__main__":
    main()
