"""``tapegrad.profiler``: where time and memory go."""
from tapegrad.profiler.memory import memory, MemoryTracker, OpMemory, storage_bytes
from tapegrad.profiler.timing import (profile, record_function, ProfilerActivity, EventList,
                                      FunctionEvent, FunctionEventAvg)

__all__ = ["memory", "MemoryTracker", "OpMemory", "storage_bytes", "profile",
           "record_function", "ProfilerActivity", "EventList", "FunctionEvent",
           "FunctionEventAvg"]
