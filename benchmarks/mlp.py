"""Spiral MLP training at hidden widths 32/256/2048, batch 512/4096: tapegrad vs PyTorch vs numpy.

The same as ``python -m tapegrad bench mlp [options]``; the code lives in
``tapegrad.bench.mlp`` so that the installed CLI can run it.
"""
import sys

from tapegrad.bench.mlp import main

if __name__ == "__main__":
    main(sys.argv[1:])
