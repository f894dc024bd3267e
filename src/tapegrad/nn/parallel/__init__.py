"""``tapegrad.nn.parallel`` as ``torch.nn.parallel``.

``DataParallel`` behaves as PyTorch's does without GPUs: it wraps the module (state_dict keys
gain the ``module.`` prefix) and calls it directly. ``DistributedDataParallel`` (in
``distributed.py``) trains one replica per MPI rank.
"""
from tapegrad.nn.module import Module


class DataParallel(Module):
    """As ``torch.nn.DataParallel(module)`` on a machine without CUDA devices: ``forward``
    calls ``module`` itself (PyTorch does the same when no GPU is available)."""

    def __init__(self, module, device_ids=None, output_device=None, dim=0):
        super().__init__()
        self.module = module
        self.device_ids = []
        self.dim = dim
        self.output_device = None
        self.src_device_obj = None

    def forward(self, *inputs, **kwargs):
        return self.module(*inputs, **kwargs)


from tapegrad.nn.parallel.distributed import DistributedDataParallel  # noqa: E402


__all__ = ["DataParallel", "DistributedDataParallel"]
