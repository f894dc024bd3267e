"""``tapegrad.distributed.optim`` as ``torch.distributed.optim``: ZeroRedundancyOptimizer."""
from tapegrad.distributed.optim.zero_redundancy_optimizer import ZeroRedundancyOptimizer

__all__ = ["ZeroRedundancyOptimizer"]
