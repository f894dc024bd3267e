"""Train each layer on its own, with no backward pass through the whole network.

Each layer learns to give high activity ("energy") to inputs carrying the right label and low
energy to inputs carrying a wrong one; the label is written into the first features.
Classification tries every label and picks the one with the most energy over all layers.
"""
import argparse

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

CLASSES, FEATURES = 4, 16


def clusters(count, seed):
    rng = np.random.default_rng(seed)
    centres = np.random.default_rng(99).normal(0, 1.5, (CLASSES, FEATURES))
    labels = rng.integers(0, CLASSES, count)
    points = centres[labels] + rng.normal(0, 1.0, (count, FEATURES))
    return torch.from_numpy(points), torch.from_numpy(labels)


def stamp(x, labels):
    """A copy of x with its first CLASSES features replaced by a one-hot label."""
    x_ = x.clone()
    x_[:, :CLASSES] *= 0.0
    x_[range(x.shape[0]), labels] = x.max()
    return x_


class LocalLayer(nn.Linear):
    def __init__(self, inputs, outputs, threshold=2.0, lr=0.02, epochs=50):
        super().__init__(inputs, outputs)
        self.threshold, self.epochs, self.lr = threshold, epochs, lr
        self.optimizer = None

    def forward(self, x):
        x = x / (x.norm(2, 1, keepdim=True) + 1e-4)
        return F.relu(torch.mm(x, self.weight.T) + self.bias.unsqueeze(0))

    def fit(self, good, bad, log_every):
        if self.optimizer is None:
            self.optimizer = torch.optim.Adam(self.parameters(), lr=self.lr)
        for epoch in range(self.epochs):
            energy_good = self.forward(good).pow(2).mean(1)
            energy_bad = self.forward(bad).pow(2).mean(1)
            margins = torch.cat([self.threshold - energy_good, energy_bad - self.threshold])
            loss = F.softplus(margins).mean()
            self.optimizer.zero_grad()
            loss.backward()
            self.optimizer.step()
            if epoch % log_every == 0:
                print(f"  epoch {epoch}: {loss.item():.4f}")
        return self.forward(good).detach(), self.forward(bad).detach()


class LocalNet(nn.Module):
    def __init__(self, sizes, epochs):
        super().__init__()
        self.layers = nn.ModuleList(LocalLayer(a, b, epochs=epochs)
                                    for a, b in zip(sizes, sizes[1:]))

    def predict(self, x):
        energies = []
        for label in range(CLASSES):
            h = stamp(x, torch.full((x.shape[0],), label, dtype=torch.long))
            per_layer = []
            for layer in self.layers:
                h = layer(h)
                per_layer.append(h.pow(2).mean(1))
            energies.append(sum(per_layer).unsqueeze(1))
        return torch.cat(energies, 1).argmax(1)

    def train(self, good=None, bad=None, log_every=10):
        if good is None:  # Module.train(): keep its meaning for mode switches
            return super().train()
        for number, layer in enumerate(self.layers):
            print(f"layer {number}")
            good, bad = layer.fit(good, bad, log_every)
        return self


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--count", type=int, default=1000)
    parser.add_argument("--epochs", type=int, default=50)
    parser.add_argument("--log-every", type=int, default=10)
    args = parser.parse_args()

    x, y = clusters(args.count, 0)
    wrong = (y + torch.randint(1, CLASSES, y.shape)) % CLASSES
    net = LocalNet([FEATURES, 32, 32], args.epochs)
    net.train(stamp(x, y), stamp(x, wrong), args.log_every)
    with torch.no_grad():
        train_error = 1.0 - net.predict(x).eq(y).float().mean().item()
        x_test, y_test = clusters(args.count // 4, 1)
        test_error = 1.0 - net.predict(x_test).eq(y_test).float().mean().item()
    print(f"train error {train_error:.3f}, test error {test_error:.3f}")


if __name__ == "__main__":
    main()
