"""``nn.Parameter``: a leaf Tensor that a Module registers as a learnable parameter."""
from tapegrad.tensor import Tensor


def _leaf_sharing(cls, data):
    """A new ``cls`` leaf (no grad, no hooks, not requiring grad yet) on ``data``'s storage
    and version counter; an empty float32 tensor when ``data`` is None."""
    from tapegrad.backend import xp

    t = object.__new__(cls)
    if data is None:
        t._data = xp.empty((0,), dtype=xp.float32)
        t._version = [0]
    else:
        t._data = data._data if isinstance(data, Tensor) else xp.asarray(data)
        t._version = data._version if isinstance(data, Tensor) else [0]
    t._grad = None
    t.grad_fn = None
    t._hooks = None
    t._requires_grad = False
    return t


class Parameter(Tensor):
    """As ``torch.nn.Parameter(data, requires_grad=True)``; shares ``data``'s storage."""

    __slots__ = ()

    def __new__(cls, data=None, requires_grad=True):
        p = _leaf_sharing(cls, data)
        p.requires_grad = requires_grad
        return p

    def __init__(self, data=None, requires_grad=True):
        pass

    def __repr__(self):
        return "Parameter containing:\n" + super().__repr__()

    def __reduce_ex__(self, protocol):
        return (Parameter, (Tensor._from_data(self._data), self._requires_grad))


class Buffer(Tensor):
    """As ``torch.nn.Buffer(data, persistent=True)``: assigned to a Module attribute, it is
    registered as a buffer (state that is not a parameter). Shares ``data``'s storage."""

    __slots__ = ("persistent",)

    def __new__(cls, data=None, *, persistent=True):
        b = _leaf_sharing(cls, data)
        b.requires_grad = isinstance(data, Tensor) and data.requires_grad
        b.persistent = persistent
        return b

    def __init__(self, data=None, *, persistent=True):
        pass

    def __reduce_ex__(self, protocol):
        return (_rebuild_buffer, (Tensor._from_data(self._data), self.persistent))


def _rebuild_buffer(data, persistent):
    return Buffer(data, persistent=persistent)
