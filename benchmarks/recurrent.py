"""Recurrent models, eager: one training step each, tapegrad vs PyTorch (one thread) in
interleaved rounds inside one process, so both see the same machine load.

- the suite models with recurrent layers (``tapegrad.bench.suite_models``): ``lstm_tagger``
  (embedding, 2-layer ``LSTM``), ``gru_seq2seq_attn`` (``GRU`` encoder and decoder),
  ``mpnn_edges`` (message passing with a ``GRUCell``);
- ``lstmcell_loop``: an ``LSTMCell`` (32 -> 64) stepped 30 times over a batch of 16, the sum
  of its hidden states as the loss.

Per (model, dtype): the minimum and median over rounds of each library's ms per step, and
``ratio`` = PyTorch's minimum / tapegrad's (1.0: parity, higher: tapegrad faster).

    python benchmarks/recurrent.py [--models lstm_tagger,lstmcell_loop] [--rounds 15]
"""
import argparse
import statistics
import time

import numpy as np
import torch

import tapegrad
from tapegrad.bench import suite

MODELS = ("lstm_tagger", "gru_seq2seq_attn", "mpnn_edges", "lstmcell_loop")


def _cell_loop(lib, dtype, steps=30, batch=16, inputs=32, hidden=64):
    lib.manual_seed(0)
    cell = lib.nn.LSTMCell(inputs, hidden).to(getattr(lib, dtype))
    x = lib.tensor(np.random.default_rng(0).standard_normal((steps, batch, inputs))
                   .astype(dtype))

    def step():
        h, c = cell(x[0])
        loss = h.sum()
        for t in range(1, steps):
            h, c = cell(x[t], (h, c))
            loss = loss + h.sum()
        loss.backward()

    return step


def _case(lib, name, dtype):
    if name == "lstmcell_loop":
        return _cell_loop(lib, dtype)
    step, _, _, inputs = suite.make_step(lib, name, dtype)
    return lambda: step(*inputs)


def _ms(fn, n):
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t0) / n * 1e3


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--steps", type=int, default=5, help="steps per round")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    print(f"{'model':17s} {'dtype':8s} {'tapegrad min/med':>17s} {'PyTorch min/med':>17s} ratio")
    for name in args.models.split(","):
        for dtype in ("float32", "float64"):
            ours, theirs = _case(tapegrad, name, dtype), _case(torch, name, dtype)
            for f in (ours, theirs, ours, theirs):
                f()
            a, b = [], []
            for _ in range(args.rounds):
                a.append(_ms(ours, args.steps))
                b.append(_ms(theirs, args.steps))
            print(f"{name:17s} {dtype:8s} {min(a):8.2f}/{statistics.median(a):8.2f} "
                  f"{min(b):8.2f}/{statistics.median(b):8.2f} {min(b) / min(a):5.2f}",
                  flush=True)


if __name__ == "__main__":
    main()
