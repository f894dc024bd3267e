"""``tapegrad.utils``: checkpointing and data loading."""
from tapegrad.utils import checkpoint  # noqa: F401,E402
from tapegrad.utils import data  # noqa: F401,E402
