"""BLAS-bound 1024-wide Linear layer, batch 1024: tapegrad vs PyTorch vs numpy's matmul peak.

The same as ``python -m tapegrad bench blas [options]``; the code lives in
``tapegrad.bench.blas`` so that the installed CLI can run it.
"""
import sys

from tapegrad.bench.blas import main

if __name__ == "__main__":
    main(sys.argv[1:])
