"""``tapegrad.utils``: checkpointing and data loading."""
from tapegrad.utils import checkpoint  # noqa: F401,E402
