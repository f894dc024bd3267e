"""``nn.Parameter``: a leaf Tensor that a Module registers as a learnable parameter."""
from tapegrad.tensor import Tensor


class Parameter(Tensor):
    """As ``torch.nn.Parameter(data, requires_grad=True)``; shares ``data``'s storage."""

    __slots__ = ()

    def __new__(cls, data=None, requires_grad=True):
        from tapegrad.backend import xp

        p = object.__new__(cls)
        if data is None:
            p._data = xp.empty((0,), dtype=xp.float32)
            p._version = [0]
        else:
            p._data = data._data if isinstance(data, Tensor) else xp.asarray(data)
            p._version = data._version if isinstance(data, Tensor) else [0]
        p.grad = None
        p.grad_fn = None
        p._hooks = None
        p._requires_grad = False
        p.requires_grad = requires_grad
        return p

    def __init__(self, data=None, requires_grad=True):
        pass

    def __repr__(self):
        return "Parameter containing:\n" + super().__repr__()

    def __reduce_ex__(self, protocol):
        return (Parameter, (Tensor(self._data), self._requires_grad))
