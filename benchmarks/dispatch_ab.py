"""Per-op dispatch cost of one checkout, for A/B comparisons run in separate processes.

    .venv/bin/python benchmarks/dispatch_ab.py /path/to/checkout   # e.g. a git worktree

Prints the best of 7 x 20000 calls of an 8x8 float32 ``mul``, recorded (an input requires
grad) and unrecorded. Alternate two checkouts' runs so machine load hits both alike.
"""
import sys
import timeit

sys.path.insert(0, sys.argv[1] + "/src")
import tapegrad as tg  # noqa: E402

a = tg.randn(8, 8, requires_grad=True)
b = tg.randn(8, 8)
c = tg.randn(8, 8)
recorded = min(timeit.repeat(lambda: a * b, number=20000, repeat=7)) / 20000 * 1e6
plain = min(timeit.repeat(lambda: c * b, number=20000, repeat=7)) / 20000 * 1e6
print(f"{sys.argv[1]}: recorded mul {recorded:.3f} us, unrecorded {plain:.3f} us")
