"""``tapegrad.backends`` as ``torch.backends``: the flags programs set for cuDNN, CUDA
matmuls and MPS, with PyTorch's defaults.

They are accepted and remembered so that ported programs run, but they change nothing:
tapegrad computes on the cpu with numpy (see docs/differences.md). Not to be confused with
``tapegrad.backend``, the array-module seam.
"""
from tapegrad.backends import cudnn, cuda, mps, mkldnn, openmp  # noqa: F401
