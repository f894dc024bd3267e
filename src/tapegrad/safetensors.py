"""``tapegrad.safetensors``: safetensors files of named tensors, interoperable with PyTorch's.

    tapegrad.safetensors.save_file(model.state_dict(), "model.safetensors")
    state = tapegrad.safetensors.load_file("model.safetensors")

The same functions as ``tapegrad.io.save_file``/``load_file`` (see there).
"""
from tapegrad.io import load_file, save_file

__all__ = ["save_file", "load_file"]
