"""Model training steps: the digits CNN (Adam, batch 64) and the character GPT (AdamW, clipping,
schedule, batch 16 x 32), tapegrad vs PyTorch, float64 and float32.

The same as ``python -m tapegrad bench models [options]`` (``--profile`` for where the step's
time goes); the code lives in ``tapegrad.bench.models`` so that the installed CLI can run it.
"""
import sys

from tapegrad.bench.models import main

if __name__ == "__main__":
    main(sys.argv[1:])
