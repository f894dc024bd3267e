"""``tapegrad.profiler``: where time and memory go."""
