"""``Flatten`` and ``Unflatten`` (as in ``torch.nn``)."""
import math

from tapegrad.nn.functional import _dim
from tapegrad.nn.module import Module

__all__ = ["Flatten", "Unflatten"]


class Flatten(Module):
    """As ``torch.nn.Flatten(start_dim=1, end_dim=-1)``: merge dims start..end into one."""

    def __init__(self, start_dim: int = 1, end_dim: int = -1):
        super().__init__()
        self.start_dim = start_dim
        self.end_dim = end_dim

    def forward(self, input):
        shape = tuple(input.shape)
        if not shape:
            return input.reshape(1)
        start = _dim(self.start_dim, len(shape), "flatten")
        end = _dim(self.end_dim, len(shape), "flatten")
        if start > end:
            raise RuntimeError("flatten() has invalid args: start_dim cannot come after end_dim")
        return input.reshape(shape[:start] + (math.prod(shape[start:end + 1]),) + shape[end + 1:])

    def extra_repr(self) -> str:
        return f"start_dim={self.start_dim}, end_dim={self.end_dim}"


class Unflatten(Module):
    """As ``torch.nn.Unflatten(dim, unflattened_size)``: split dim ``dim`` into a shape."""

    def __init__(self, dim: int, unflattened_size):
        super().__init__()
        if not isinstance(unflattened_size, (tuple, list)):
            raise TypeError("unflattened_size must be a tuple of ints, but found type "
                            f"{type(unflattened_size).__name__}")
        for idx, elem in enumerate(unflattened_size):
            if not isinstance(elem, int):
                raise TypeError("unflattened_size must be tuple of ints, but found element of "
                                f"type {type(elem).__name__} at pos {idx}")
        self.dim = dim
        self.unflattened_size = unflattened_size

    def forward(self, input):
        shape = tuple(input.shape)
        d = _dim(self.dim, len(shape), "unflatten")
        sizes = list(self.unflattened_size)
        if sizes.count(-1) > 1:
            raise RuntimeError("unflatten: only one dimension can be inferred")
        known = math.prod(s for s in sizes if s != -1)
        if -1 in sizes:
            if known == 0 or shape[d] % known:
                raise RuntimeError(f"unflatten: provided sizes {tuple(sizes)} don't multiply up "
                                   f"to the size of dim {self.dim} ({shape[d]}) in the input "
                                   f"tensor of shape {shape}")
            sizes[sizes.index(-1)] = shape[d] // known
        elif known != shape[d]:
            raise RuntimeError(f"unflatten: provided sizes {tuple(sizes)} don't multiply up to "
                               f"the size of dim {self.dim} ({shape[d]}) in the input tensor of "
                               f"shape {shape}")
        return input.reshape(shape[:d] + tuple(sizes) + shape[d + 1:])

    def extra_repr(self) -> str:
        return f"dim={self.dim}, unflattened_size={self.unflattened_size}"
