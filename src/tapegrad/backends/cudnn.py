"""``tapegrad.backends.cudnn`` as ``torch.backends.cudnn`` without CUDA: settable flags with
PyTorch's defaults that have no effect here (tapegrad does not use cuDNN).

>>> tapegrad.backends.cudnn.benchmark = True     # accepted; nothing changes
"""
import contextlib

enabled = True          # torch.backends.cudnn.enabled
benchmark = False       # torch.backends.cudnn.benchmark
benchmark_limit = None  # torch.backends.cudnn.benchmark_limit (None on a CPU build)
deterministic = False   # torch.backends.cudnn.deterministic
allow_tf32 = True       # torch.backends.cudnn.allow_tf32


def is_available() -> bool:
    """As ``torch.backends.cudnn.is_available()``: False (no cuDNN)."""
    return False


def version():
    """As ``torch.backends.cudnn.version()``: None without cuDNN."""
    return None


@contextlib.contextmanager
def flags(enabled=False, benchmark=False, benchmark_limit=10, deterministic=False,
          allow_tf32=True):
    """As ``torch.backends.cudnn.flags(...)``: set the flags inside the block, restore after."""
    g = globals()
    names = ("enabled", "benchmark", "deterministic", "allow_tf32")
    old = {n: g[n] for n in names}
    g.update(enabled=enabled, benchmark=benchmark, deterministic=deterministic,
             allow_tf32=allow_tf32)
    try:
        yield
    finally:
        g.update(old)
