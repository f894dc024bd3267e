"""Per-op dispatch cost: tapegrad's tape vs PyTorch vs raw numpy, with a PNG plot.

The same as ``python -m tapegrad bench dispatch [options]``; the code lives in
``tapegrad.bench.dispatch`` so that the installed CLI can run it.
"""
import sys

from tapegrad.bench.dispatch import main

if __name__ == "__main__":
    main(sys.argv[1:])
