"""The checkpointing table: peak memory and time with and without gradient checkpointing.

The same as ``python -m tapegrad bench checkpoint [options]``; the code lives in
``tapegrad.bench.checkpoint`` so that the installed CLI and the demo can run it.
"""
import sys

from tapegrad.bench.checkpoint import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
