"""The H=2048, batch 4096 MLP step: user/sys time, bandwidth, the large-array changes.

The same as ``python -m tapegrad bench scale [options]``; the code lives in
``tapegrad.bench.scale`` so that the installed CLI can run it.
"""
import sys

from tapegrad.bench.scale import main

if __name__ == "__main__":
    main(sys.argv[1:])
