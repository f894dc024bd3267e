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


class Buffer(Tensor):
    """As ``torch.nn.Buffer(data, persistent=True)``: assigned to a Module attribute, it is
    registered as a buffer (state that is not a parameter). Shares ``data``'s storage."""

    __slots__ = ("persistent",)

    def __new__(cls, data=None, *, persistent=True):
        from tapegrad.backend import xp

        b = object.__new__(cls)
        if data is None:
            b._data = xp.empty((0,), dtype=xp.float32)
            b._version = [0]
        else:
            b._data = data._data if isinstance(data, Tensor) else xp.asarray(data)
            b._version = data._version if isinstance(data, Tensor) else [0]
        b.grad = None
        b.grad_fn = None
        b._hooks = None
        b._requires_grad = False
        b.requires_grad = isinstance(data, Tensor) and data.requires_grad
        b.persistent = persistent
        return b

    def __init__(self, data=None, *, persistent=True):
        pass

    def __reduce_ex__(self, protocol):
        return (_rebuild_buffer, (Tensor(self._data), self.persistent))


def _rebuild_buffer(data, persistent):
    return Buffer(data, persistent=persistent)
