"""``tapegrad.utils``: checkpointing and data loading."""
