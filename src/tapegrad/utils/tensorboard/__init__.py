"""As ``torch.utils.tensorboard``: ``SummaryWriter`` on the optional ``tensorboard`` package.

Importing works without tensorboard; constructing a ``SummaryWriter`` then raises an
ImportError that says ``pip install tensorboard``.
"""
from tapegrad.utils.tensorboard.writer import SummaryWriter  # noqa: F401

__all__ = ["SummaryWriter"]
