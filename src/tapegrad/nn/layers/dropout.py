"""``Dropout`` (as in ``torch.nn``): active in training mode, the identity in eval mode."""
from tapegrad.nn import functional as F
from tapegrad.nn.module import Module

__all__ = ["Dropout", "Dropout1d", "Dropout2d", "Dropout3d"]


class Dropout(Module):
    """As ``torch.nn.Dropout(p=0.5, inplace=False)``: zero each element with probability ``p``
    and scale the rest by ``1/(1-p)`` while ``training``."""

    def __init__(self, p: float = 0.5, inplace: bool = False):
        super().__init__()
        if p < 0 or p > 1:
            raise ValueError(f"dropout probability has to be between 0 and 1, but got {p}")
        self.p = p
        self.inplace = inplace

    def forward(self, input):
        return F.dropout(input, self.p, self.training, self.inplace)

    def extra_repr(self) -> str:
        return f"p={self.p}, inplace={self.inplace}"



class Dropout1d(Dropout):
    """As ``torch.nn.Dropout1d``: ``F.dropout1d``, whole channels of (N, C, L) or (C, L)."""

    def forward(self, input):
        return F.dropout1d(input, self.p, self.training, self.inplace)


class Dropout2d(Dropout):
    """As ``torch.nn.Dropout2d``: ``F.dropout2d``, whole channels of (N, C, H, W) (other ranks
    as PyTorch: channels are dimension 1, with its deprecation warning)."""

    def forward(self, input):
        return F.dropout2d(input, self.p, self.training, self.inplace)


class Dropout3d(Dropout):
    """As ``torch.nn.Dropout3d``: ``F.dropout3d``, whole channels of (N, C, D, H, W) or
    (C, D, H, W)."""

    def forward(self, input):
        return F.dropout3d(input, self.p, self.training, self.inplace)
