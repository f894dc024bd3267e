"""Random number generation: ``manual_seed``, ``Generator``, ``rand``, ``randn`` ..."""

__all__ = []
