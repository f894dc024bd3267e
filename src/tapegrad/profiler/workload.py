"""A deep ReLU MLP training step, the workload of the memory table and of the checkpointing
benchmark (``tapegrad bench checkpoint``, ``tapegrad.profiler.workload.main``).

Every op runs through the framework: ``h = relu(h @ W_i)`` per layer, loss ``sum(h * h) / n``,
backward, then a plain SGD update. Gradient buffers are persistent and zeroed in place
(PyTorch's ``zero_grad(set_to_none=False)``), so a step's memory above the model's steady
state is activations and transients: exactly what checkpointing trades for compute.
"""
import argparse
import math

import tapegrad
from tapegrad.backend import xp
from tapegrad.profiler.memory import memory, storage_bytes, _fmt
from tapegrad.utils.checkpoint import checkpoint_sequential


class DeepMLP:
    """``depth`` bias-free ReLU layers of ``width`` on a fixed batch, He-initialised."""

    def __init__(self, depth, width=192, batch=256, dtype=tapegrad.float32, seed=0, lr=1e-3):
        rng = xp.random.default_rng(seed)
        scale = math.sqrt(2.0 / width)
        self.weights = [tapegrad.tensor(rng.standard_normal((width, width)) * scale,
                                        dtype=dtype, requires_grad=True) for _ in range(depth)]
        self.x = tapegrad.tensor(rng.standard_normal((batch, width)), dtype=dtype)
        self.lr = lr
        self.layers = [self._layer(w) for w in self.weights]

    @staticmethod
    def _layer(w):
        return lambda h: (h @ w).relu()

    def loss(self, segments=None):
        """Forward; ``segments``: None for plain, else checkpoint_sequential's segment count."""
        if segments is None:
            h = self.x
            for f in self.layers:
                h = f(h)
        else:
            h = checkpoint_sequential(self.layers, segments, self.x)
        return (h * h).sum() * (1.0 / h.numel())

    def zero_grad(self):
        for w in self.weights:
            if w.grad is not None:
                w.grad._data.fill(0)  # zero_grad(set_to_none=False): the buffer persists

    def step(self, segments=None):
        """One training step: forward, backward, SGD update. Returns the loss value."""
        self.zero_grad()
        loss = self.loss(segments)
        loss.backward()
        with tapegrad.no_grad():
            for w in self.weights:
                w._data -= self.lr * w.grad._data  # in place, as optim.SGD's foreach path
        return loss.item()


def count_matmuls(model, segments):
    """Matmuls one step executes (forward, recomputation and the backward rules'), counted by
    wrapping the registered op's forward for the duration of the step."""
    from tapegrad.ops.registry import REGISTRY

    op = REGISTRY["matmul"]
    forward = op.forward
    calls = [0]

    def counting(*args, **kwargs):
        calls[0] += 1
        return forward(*args, **kwargs)

    op.forward = counting
    try:
        model.step(segments)
    finally:
        op.forward = forward
    return calls[0]


def measure_step(model, segments):
    """Peak and live traced bytes of one step above the model's steady state, and the tracker."""
    model.step(segments)  # warm-up: gradient buffers exist from here on
    with memory() as m:
        model.step(segments)
    return m


def main(argv=None):
    """``tapegrad memory``: one training step of the deep MLP under the memory tracker."""
    p = argparse.ArgumentParser(prog="tapegrad memory",
                                description="Measured memory of one deep-MLP training step.")
    p.add_argument("--depth", type=int, default=32)
    p.add_argument("--width", type=int, default=192)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--checkpoint", type=int, nargs="?", const=0, default=None,
                   metavar="SEGMENTS", help="checkpoint the layers (default segments: "
                   "round(sqrt(depth)))")
    p.add_argument("--top", type=int, default=12, help="rows of the per-op table")
    args = p.parse_args(argv)
    segments = None if args.checkpoint is None else (args.checkpoint or
                                                     max(1, round(math.sqrt(args.depth))))
    model = DeepMLP(args.depth, args.width, args.batch)
    m = measure_step(model, segments)
    state = storage_bytes(model.weights)
    mode = "plain" if segments is None else f"checkpointed, {segments} segments"
    print(f"deep ReLU MLP: depth {args.depth}, width {args.width}, batch {args.batch}, "
          f"float32, {mode}")
    print(f"model state (parameters + gradient buffers, held before the step): "
          f"{_fmt(state['parameters'] + state['gradients'])}")
    print("one training step (forward, backward, SGD), above that state:")
    print(m.report(top=args.top))
    return 0


__all__ = ["DeepMLP", "count_matmuls", "measure_step", "main"]
