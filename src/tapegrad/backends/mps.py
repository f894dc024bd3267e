"""``tapegrad.backends.mps`` as ``torch.backends.mps`` off Apple silicon: no MPS device."""


def is_available() -> bool:
    """As ``torch.backends.mps.is_available()``: False."""
    return False


def is_built() -> bool:
    """As ``torch.backends.mps.is_built()``: False (tapegrad has no MPS backend)."""
    return False
