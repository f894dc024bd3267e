"""A variational autoencoder for 10x10 images of soft blobs at random places."""
import argparse

import numpy as np
import torch
import torch.utils.data
from torch import nn, optim
from torch.nn import functional as F

PIXELS = 100


def blobs(count, seed):
    rng = np.random.default_rng(seed)
    grid = np.arange(10)
    centre = rng.uniform(2, 8, (count, 2, 1))
    width = rng.uniform(1.0, 2.5, (count, 1, 1))
    rows = np.exp(-((grid - centre[:, :1]) / width) ** 2)
    cols = np.exp(-((grid - centre[:, 1:]) / width) ** 2)
    return torch.from_numpy((rows.transpose(0, 2, 1) * cols).reshape(count, PIXELS))


class BlobVAE(nn.Module):
    def __init__(self, hidden=32, latent=3):
        super().__init__()
        self.encode_hidden = nn.Linear(PIXELS, hidden)
        self.to_mean = nn.Linear(hidden, latent)
        self.to_log_var = nn.Linear(hidden, latent)
        self.decoder = nn.Sequential(nn.Linear(latent, hidden), nn.ReLU(),
                                     nn.Linear(hidden, PIXELS), nn.Sigmoid())

    def encode(self, x):
        h = F.relu(self.encode_hidden(x))
        return self.to_mean(h), self.to_log_var(h)

    def sample(self, mean, log_var):
        return mean + torch.randn_like(mean) * torch.exp(0.5 * log_var)

    def forward(self, x):
        mean, log_var = self.encode(x)
        return self.decoder(self.sample(mean, log_var)), mean, log_var


def elbo_loss(rebuilt, x, mean, log_var):
    reconstruction = F.binary_cross_entropy(rebuilt, x, reduction="sum")
    divergence = -0.5 * torch.sum(1 + log_var - mean.pow(2) - log_var.exp())
    return reconstruction + divergence


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--count", type=int, default=1024)
    args = parser.parse_args()

    train = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(blobs(args.count, 0)),
                                        batch_size=args.batch_size, shuffle=True)
    held_out = blobs(args.count // 4, 1)
    model = BlobVAE()
    optimizer = optim.Adam(model.parameters(), lr=3e-3)
    for epoch in range(args.epochs):
        model.train()
        running = 0.0
        for (x,) in train:
            optimizer.zero_grad()
            rebuilt, mean, log_var = model(x)
            loss = elbo_loss(rebuilt, x, mean, log_var)
            loss.backward()
            running += loss.item()
            optimizer.step()
        model.eval()
        with torch.no_grad():
            rebuilt, mean, log_var = model(held_out)
            test_loss = elbo_loss(rebuilt, held_out, mean, log_var)
            dreams = model.decoder(torch.randn(4, 3))
        print(f"epoch {epoch}: train {running / args.count:.3f} "
              f"test {test_loss.item() / len(held_out):.3f} dream mass {dreams.sum().item():.2f}")


if __name__ == "__main__":
    main()
