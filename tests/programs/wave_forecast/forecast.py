"""Forecast a mixture of two sine waves with an LSTMCell, fitted by L-BFGS.

waves.pt holds a numpy array (series x steps) saved with torch.save. Training teaches the
model one-step-ahead changes; evaluation lets it read the first part of each held-out
series and then run free, feeding its own forecasts back in.
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
    def __init__(self, memory=12):
        super().__init__()
        self.memory = memory
        self.cell = nn.LSTMCell(1, memory)
        self.change = nn.Linear(memory, 1)

    def read(self, series):
        """One-step forecasts for every step of ``series`` (batch x steps), and the state."""
        state = (series.new_zeros(series.size(0), self.memory),) * 2
        forecasts = []
        for column in series.split(1, dim=1):
            state = self.cell(column, state)
            forecasts.append(column + self.change(state[0]))
        return torch.cat(forecasts, dim=1), state

    def run_free(self, last, state, steps):
        forecasts = []
        for _ in range(steps):
            state = self.cell(last, state)
            last = last + self.change(state[0])
            forecasts.append(last)
        return torch.cat(forecasts, dim=1)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--shown", type=int, default=20, help="steps read before running free")
    parser.add_argument("--plot", default="forecast.png")
    args = parser.parse_args()

    waves = torch.load("waves.pt", weights_only=False)
    assert isinstance(waves, np.ndarray) and waves.ndim == 2
    train, held_out = torch.from_numpy(waves[2:]), torch.from_numpy(waves[:2])
    model = Forecaster().double()
    mse = nn.MSELoss()
    optimizer = optim.LBFGS(model.parameters(), lr=0.5, max_iter=6, history_size=10)
    for round_ in range(args.rounds):
        def closure():
            optimizer.zero_grad()
            forecasts, _ = model.read(train[:, :-1])
            loss = mse(forecasts, train[:, 1:])
            loss.backward()
            return loss

        fitted = optimizer.step(closure)
        with torch.no_grad():
            known, state = model.read(held_out[:, :args.shown])
            future = model.run_free(known[:, -1:], state, held_out.size(1) - args.shown - 1)
            error = mse(future, held_out[:, args.shown + 1:])
        print(f"round {round_}: fit {fitted.item():.5f}, free-running error {error.item():.5f}")

    figure, axes = plt.subplots(figsize=(8, 3))
    steps = np.arange(held_out.size(1))
    for truth, guess, colour in zip(held_out.numpy(), future.numpy(), ("tab:blue", "tab:red")):
        axes.plot(steps, truth, color=colour, alpha=0.4)
        axes.plot(steps[args.shown + 1:], guess, color=colour, linestyle="--")
    figure.savefig(args.plot)
    plt.close(figure)


if __name__ == "__main__":
    main()
