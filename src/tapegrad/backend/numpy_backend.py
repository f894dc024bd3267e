"""numpy backend: the array module and the device facts the profiler needs."""
import numpy as xp


class Device:
    """A device, printed and compared as in PyTorch (``device(type='cpu')``)."""

    __slots__ = ("type", "index")

    def __init__(self, type: str = "cpu", index=None):
        if isinstance(type, Device):
            type, index = type.type, type.index
        if ":" in type:
            type, idx = type.split(":")
            index = int(idx)
        if type != "cpu":
            raise RuntimeError(f"device: tapegrad runs on 'cpu' only for now, got {type!r}")
        self.type = type
        self.index = index

    def __eq__(self, other):
        if isinstance(other, str):
            other = Device(other)
        return isinstance(other, Device) and other.type == self.type

    def __hash__(self):
        return hash(self.type)

    def __repr__(self):
        return f"device(type='{self.type}')"

    def __str__(self):
        return self.type


DEVICE = Device("cpu")
