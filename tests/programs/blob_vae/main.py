"""A variational autoencoder for 10x10 images of soft blobs at random places."""
import argparse

import numpy as np
import torch
import torch.utils.data
from torch import nn, optim
from torch.nn import functional as F

SIDE, LATENT = 10, 3


def blobs(count, seed):
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:SIDE, 0:SIDE]
    cy, cx = rng.uniform(2, SIDE - 2, (2, count, 1, 1))
    spread = rng.uniform(1.0, 2.5, (count, 1, 1))
    pictures = np.exp(-((y - cy) ** 2 + (x - cx) ** 2) / spread ** 2)
    return torch.from_numpy(pictures.reshape(count, SIDE * SIDE))


class Autoencoder(nn.Module):
    def __init__(self, hidden=32):
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(SIDE * SIDE, hidden), nn.Softplus(),
                                     nn.Linear(hidden, 2 * LATENT))
        self.decoder = nn.Sequential(nn.Linear(LATENT, hidden), nn.Softplus(),
                                     nn.Linear(hidden, SIDE * SIDE), nn.Sigmoid())

    def forward(self, pictures):
        centre, log_variance = self.encoder(pictures).chunk(2, dim=1)
        spread = (0.5 * log_variance).exp()
        code = centre + spread * torch.randn_like(spread)
        return self.decoder(code), centre, log_variance


def negative_elbo(rebuilt, pictures, centre, log_variance):
    """Bernoulli reconstruction loss plus KL(q(z|x) || N(0, I)), both summed over the batch."""
    rebuild = F.binary_cross_entropy(rebuilt, pictures, reduction="sum")
    kl = 0.5 * (centre.pow(2) + log_variance.exp() - 1.0 - log_variance).sum()
    return rebuild + kl


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--count", type=int, default=1024)
    args = parser.parse_args()

    pictures = torch.utils.data.TensorDataset(blobs(args.count, 0))
    loader = torch.utils.data.DataLoader(pictures, batch_size=args.batch_size, shuffle=True)
    unseen = blobs(args.count // 4, 1)
    vae = Autoencoder()
    optimizer = optim.Adam(vae.parameters(), lr=3e-3)
    for epoch in range(args.epochs):
        vae.train()
        total = 0.0
        for (batch,) in loader:
            rebuilt, centre, log_variance = vae(batch)
            loss = negative_elbo(rebuilt, batch, centre, log_variance)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            total += loss.item()
        vae.eval()
        with torch.no_grad():
            rebuilt, centre, log_variance = vae(unseen)
            held_out = negative_elbo(rebuilt, unseen, centre, log_variance)
            imagined = vae.decoder(torch.randn(4, LATENT))
        print(f"epoch {epoch}: {total / args.count:.3f} per picture, "
              f"{held_out.item() / len(unseen):.3f} unseen, imagined mass "
              f"{imagined.sum(1).mean().item():.2f}")


if __name__ == "__main__":
    main()
