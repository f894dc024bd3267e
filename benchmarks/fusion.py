"""Fused ops against their unfused compositions, and Adam over one flat buffer.

The same as ``python -m tapegrad bench fusion [options]``; the code lives in
``tapegrad.bench.fusion`` so that the installed CLI can run it.
"""
import sys

from tapegrad.bench.fusion import main

if __name__ == "__main__":
    main(sys.argv[1:])
