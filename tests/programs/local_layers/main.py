"""Greedy layer-by-layer training with a contrastive energy, no end-to-end backward pass.

A sample is shown to the network with a label written into its first features. Each layer
is trained on its own so that, example by example, the correctly labelled copy has more
energy (mean squared activation) than a copy carrying a wrong label. To classify, every
label is tried and the one with the most energy, summed over layers, wins.
"""
import argparse

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

CLASSES, FEATURES, MARK = 4, 16, 3.0


def clusters(count, seed):
    rng = np.random.default_rng(seed)
    centres = np.random.default_rng(99).normal(0, 1.5, (CLASSES, FEATURES))
    labels = rng.integers(0, CLASSES, count)
    points = centres[labels] + rng.normal(0, 1.0, (count, FEATURES))
    return torch.from_numpy(points), torch.from_numpy(labels)


def with_label(points, labels):
    marked = points.clone()
    marked[:, :CLASSES] *= 0.0
    marked[range(len(labels)), labels] = MARK
    return marked


class ContrastiveLinear(nn.Linear):
    """A Linear layer that owns its optimizer and trains itself on (right, wrong) pairs."""

    margin = 0.5

    def forward(self, x):
        return F.relu(super().forward(F.normalize(x, dim=1)))

    def energy(self, x):
        return self.forward(x).pow(2).mean(dim=1)

    def fit(self, right, wrong, epochs, batch, lr, log_every):
        optimizer = torch.optim.Adam(self.parameters(), lr=lr)
        for epoch in range(epochs):
            for chunk in torch.randperm(len(right)).split(batch):
                gap = self.energy(right[chunk]) - self.energy(wrong[chunk])
                loss = F.relu(self.margin - gap).mean()
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
            if epoch % log_every == 0:
                print(f"  epoch {epoch}: hinge {loss.item():.4f}")
        with torch.no_grad():
            return self.forward(right), self.forward(wrong)


class GreedyStack(nn.Module):
    def __init__(self, widths):
        super().__init__()
        self.layers = nn.ModuleList(ContrastiveLinear(a, b) for a, b in zip(widths, widths[1:]))

    def train(self, mode=True, *, right=None, wrong=None, **fit_options):
        """Module.train(mode) as usual; given data, fit the layers one after another."""
        if right is None:
            return super().train(mode)
        for depth, layer in enumerate(self.layers):
            print(f"layer {depth}")
            right, wrong = layer.fit(right, wrong, **fit_options)
        return self

    def classify(self, points):
        totals = []
        for label in range(CLASSES):
            h = with_label(points, torch.full((len(points),), label, dtype=torch.long))
            energies = []
            for layer in self.layers:
                energies.append(layer.energy(h))
                h = layer(h)
            totals.append(sum(energies))
        return torch.stack(totals, dim=1).argmax(dim=1)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--count", type=int, default=1000)
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--log-every", type=int, default=10)
    args = parser.parse_args()

    points, labels = clusters(args.count, 0)
    wrong_labels = (labels + torch.randint(1, CLASSES, labels.shape)) % CLASSES
    stack = GreedyStack([FEATURES, 32, 24])
    stack.train(right=with_label(points, labels), wrong=with_label(points, wrong_labels),
                epochs=args.epochs, batch=args.batch, lr=0.01, log_every=args.log_every)
    stack.eval()
    with torch.no_grad():
        seen = stack.classify(points).eq(labels).float().mean().item()
        test_points, test_labels = clusters(args.count // 4, 1)
        unseen = stack.classify(test_points).eq(test_labels).float().mean().item()
    print(f"accuracy: {seen:.3f} on training points, {unseen:.3f} on new points")


if __name__ == "__main__":
    main()
