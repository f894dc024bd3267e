"""``tapegrad.backends.cuda`` as ``torch.backends.cuda`` without CUDA: ``matmul.allow_tf32``
and the scaled-dot-product-attention switches, settable with PyTorch's defaults and no effect
here (tapegrad's matmuls run in numpy at full precision).

>>> tapegrad.backends.cuda.matmul.allow_tf32 = True     # accepted; nothing changes
"""


class _MatmulFlags:
    """``torch.backends.cuda.matmul``: flags for CUDA matmuls (no effect in tapegrad)."""

    def __init__(self):
        self.allow_tf32 = False
        self.allow_fp16_reduced_precision_reduction = True
        self.allow_bf16_reduced_precision_reduction = True

    def __repr__(self):
        return (f"matmul(allow_tf32={self.allow_tf32}, allow_fp16_reduced_precision_reduction="
                f"{self.allow_fp16_reduced_precision_reduction}, "
                f"allow_bf16_reduced_precision_reduction="
                f"{self.allow_bf16_reduced_precision_reduction})")


matmul = _MatmulFlags()
_sdp = {"flash": True, "mem_efficient": True, "math": True, "cudnn": True}


def is_built() -> bool:
    """As ``torch.backends.cuda.is_built()``: False (tapegrad has no CUDA backend)."""
    return False


def _sdp_pair(kind):
    def enabled() -> bool:
        return _sdp[kind]

    def enable(flag: bool) -> None:
        _sdp[kind] = bool(flag)

    enabled.__name__, enable.__name__ = f"{kind}_sdp_enabled", f"enable_{kind}_sdp"
    enabled.__doc__ = f"As ``torch.backends.cuda.{kind}_sdp_enabled()`` (no effect here)."
    enable.__doc__ = f"As ``torch.backends.cuda.enable_{kind}_sdp(flag)`` (no effect here)."
    return enabled, enable


flash_sdp_enabled, enable_flash_sdp = _sdp_pair("flash")
mem_efficient_sdp_enabled, enable_mem_efficient_sdp = _sdp_pair("mem_efficient")
math_sdp_enabled, enable_math_sdp = _sdp_pair("math")
cudnn_sdp_enabled, enable_cudnn_sdp = _sdp_pair("cudnn")
