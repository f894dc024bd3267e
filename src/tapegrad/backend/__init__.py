"""The array backend: the one place that imports the array module.

Ops take ``xp`` from here, so a GPU backend is a new file, not a second copy of every op.
"""
from tapegrad.backend.numpy_backend import (xp, DEVICE, reduce_axis, release_memory,
                                            keeps_freed_memory)

__all__ = ["xp", "DEVICE", "reduce_axis", "release_memory", "keeps_freed_memory"]
