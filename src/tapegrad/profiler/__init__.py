"""``tapegrad.profiler``: where time and memory go."""
from tapegrad.profiler.memory import memory, MemoryTracker, OpMemory, storage_bytes

__all__ = ["memory", "MemoryTracker", "OpMemory", "storage_bytes"]
