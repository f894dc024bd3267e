"""The "spiral" MLP: data, initial weights, and one training loop for tapegrad AND PyTorch.

The same ``MLPTrainer`` code runs with ``T = tapegrad`` or ``T = torch`` (that is the API
contract: ``import tapegrad as torch``), so both frameworks do exactly the same arithmetic
from exactly the same initial weights. ``NumpyTrainer`` is the hand-written numpy version
of the same step: the floor any numpy-based framework is measured against.
"""
import importlib
import itertools

import numpy as np


def spiral_data(n=512, classes=3, seed=0, dtype=np.float64):
    """``n`` points on ``classes`` interleaved 2-D spiral arms (rings of growing radius).

    Returns ``X`` of shape (n, 2) and integer labels ``y`` of shape (n,).
    """
    rng = np.random.default_rng(seed)
    X = np.empty((n, 2))
    y = np.empty(n, dtype=np.int64)
    for c, idx in enumerate(np.array_split(np.arange(n), classes)):
        m = len(idx)
        r = np.linspace(0.0, 1.0, m)
        t = np.linspace(c * 4.0, (c + 1) * 4.0, m) + 0.2 * rng.standard_normal(m)
        X[idx, 0] = r * np.sin(t)
        X[idx, 1] = r * np.cos(t)
        y[idx] = c
    return X.astype(dtype), y


def init_params(sizes=(2, 32, 3), seed=0, dtype=np.float64):
    """Weights and biases as PyTorch's ``nn.Linear`` draws them: U(-1/sqrt(fan_in), +...).

    Returns ``[W1, b1, W2, b2, ...]`` with each W of shape (out_features, in_features).
    """
    rng = np.random.default_rng(seed)
    params = []
    for fan_in, fan_out in itertools.pairwise(sizes):
        bound = 1.0 / np.sqrt(fan_in)
        params.append(rng.uniform(-bound, bound, size=(fan_out, fan_in)).astype(dtype))
        params.append(rng.uniform(-bound, bound, size=(fan_out,)).astype(dtype))
    return params


class MLPTrainer:
    """Full-batch SGD on a ReLU MLP with softmax cross-entropy, written once for both libraries.

    ``T`` is ``tapegrad`` or ``torch``; ``params`` the numpy arrays from ``init_params``.
    """

    def __init__(self, T, params, X, y, lr=0.5):
        self.T = T
        self.F = importlib.import_module(T.__name__ + ".nn.functional")
        self.params = [T.nn.Parameter(T.tensor(p)) for p in params]
        self.X = T.tensor(X)
        self.y = T.tensor(y)
        self.lr = lr

    def forward(self):
        """``F.linear`` (what ``nn.Linear`` calls in both libraries), ReLU between layers."""
        F, h, params = self.F, self.X, self.params
        for k in range(0, len(params) - 2, 2):
            h = F.relu(F.linear(h, params[k], params[k + 1]))
        return F.linear(h, params[-2], params[-1])

    def step(self):
        """One SGD step; returns the loss (a 0-d tensor) before the update."""
        loss = self.F.cross_entropy(self.forward(), self.y)
        loss.backward()
        with self.T.no_grad():
            for p in self.params:
                p.add_(p.grad, alpha=-self.lr)
                p.grad = None
        return loss

    def train(self, steps):
        """``steps`` SGD steps; returns the list of losses (floats), one per step."""
        return [self.step().item() for _ in range(steps)]

    def run(self, steps):
        """``steps`` SGD steps without reading the loss back (what the benchmarks time)."""
        for _ in range(steps):
            self.step()

    def accuracy(self):
        """Fraction of training points whose largest logit is their label."""
        with self.T.no_grad():
            logits = self.forward().numpy()
        return float((logits.argmax(axis=1) == self.y.numpy()).mean())


class NumpyTrainer:
    """The same MLP step hand-written in numpy: forward, backward and update, no tape."""

    def __init__(self, params, X, y, lr=0.5):
        self.params = [p.copy() for p in params]
        self.X = X
        self.y = y
        self.lr = lr
        self.rows = np.arange(len(y))

    def step(self):
        X, y, rows, lr = self.X, self.y, self.rows, self.lr
        W1, b1, W2, b2 = self.params
        z = X @ W1.T
        z += b1
        h = np.maximum(z, 0)
        logits = h @ W2.T
        logits += b2
        logits -= logits.max(axis=1, keepdims=True)
        e = np.exp(logits)
        s = e.sum(axis=1, keepdims=True)
        loss = np.log(s[:, 0]).mean() - logits[rows, y].mean()
        g = e / s
        g[rows, y] -= 1
        g /= len(y)
        gW2 = g.T @ h
        gb2 = g.sum(axis=0)
        gh = g @ W2
        gh *= z > 0
        gW1 = gh.T @ X
        gb1 = gh.sum(axis=0)
        for p, gp in zip(self.params, (gW1, gb1, gW2, gb2)):
            p -= lr * gp
        return loss

    def run(self, steps):
        for _ in range(steps):
            self.step()
