"""``torch.onnx`` as far as tapegrad goes: the module imports (programs ``import torch.onnx``
at the top), ``is_in_onnx_export()`` answers False, and ``export`` raises, naming what to use
instead, since tapegrad has no ONNX exporter."""

__all__ = ["export", "is_in_onnx_export"]


def is_in_onnx_export() -> bool:
    """As ``torch.onnx.is_in_onnx_export()``: always False, tapegrad never exports."""
    return False


def export(model, args=(), f=None, *pargs, **kwargs):
    """``torch.onnx.export`` is not available: raises NotImplementedError."""
    raise NotImplementedError(
        f"onnx.export: tapegrad has no ONNX exporter (model {type(model).__name__}); save the "
        "state_dict with tapegrad.save and export it from PyTorch, which reads the same file")
