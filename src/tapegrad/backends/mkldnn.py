"""``tapegrad.backends.mkldnn`` as ``torch.backends.mkldnn``: tapegrad does not use oneDNN;
``enabled`` is a settable flag with no effect."""

enabled = True


def is_available() -> bool:
    """As ``torch.backends.mkldnn.is_available()``: False (tapegrad's cpu kernels are numpy's)."""
    return False
