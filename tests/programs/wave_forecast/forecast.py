"""Forecast a sum of two sine waves with an LSTMCell, fitted by L-BFGS.

waves.pt holds a numpy array of shape (series, steps) saved with torch.save. The model
predicts each next value as a change from the current one, and keeps predicting past the
end of the data by feeding its output back.
"""
import argparse

import matplotlib
import numpy as np
import torch
import torch.nn as nn
import torch.optim as optim

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the file backend)


class Forecaster(nn.Module):
    def __init__(self, hidden=12):
        super().__init__()
        self.hidden = hidden
        self.cell = nn.LSTMCell(1, hidden)
        self.step = nn.Linear(hidden, 1)

    def forward(self, series, extra=0):
        batch = series.size(0)
        h = torch.zeros(batch, self.hidden, dtype=series.dtype)
        c = torch.zeros(batch, self.hidden, dtype=series.dtype)
        outputs = []
        for value in series.split(1, dim=1):
            h, c = self.cell(value, (h, c))
            outputs.append(value + self.step(h))
        for _ in range(extra):
            h, c = self.cell(outputs[-1], (h, c))
            outputs.append(outputs[-1] + self.step(h))
        return torch.cat(outputs, dim=1)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--ahead", type=int, default=30)
    parser.add_argument("--plot", default="forecast.png")
    args = parser.parse_args()

    waves = torch.load("waves.pt", weights_only=False)
    assert isinstance(waves, np.ndarray)
    split = waves.shape[0] - 2
    train_in = torch.from_numpy(waves[:split, :-1])
    train_out = torch.from_numpy(waves[:split, 1:])
    test_in = torch.from_numpy(waves[split:, :-1])
    test_out = torch.from_numpy(waves[split:, 1:])

    model = Forecaster().double()
    loss_fn = nn.MSELoss()
    optimizer = optim.LBFGS(model.parameters(), lr=0.5, max_iter=6)
    for step in range(args.steps):
        def closure():
            optimizer.zero_grad()
            loss = loss_fn(model(train_in), train_out)
            loss.backward()
            return loss

        final = optimizer.step(closure)
        with torch.no_grad():
            guess = model(test_in, extra=args.ahead)
            test_loss = loss_fn(guess[:, :-args.ahead], test_out)
        print(f"step {step}: train {final.item():.5f} test {test_loss.item():.5f}")

    figure, axes = plt.subplots(figsize=(8, 3))
    known = test_in.size(1)
    for row, color in zip(guess.detach().numpy(), "rb"):
        axes.plot(np.arange(known), row[:known], color, linewidth=1.5)
        axes.plot(np.arange(known, known + args.ahead), row[known:], color + ":", linewidth=1.5)
    figure.savefig(args.plot)
    plt.close(figure)


if __name__ == "__main__":
    main()
