"""``tapegrad.backends.openmp`` as ``torch.backends.openmp``."""


def is_available() -> bool:
    """As ``torch.backends.openmp.is_available()``: False (tapegrad itself does not use
    OpenMP; numpy's BLAS may)."""
    return False
