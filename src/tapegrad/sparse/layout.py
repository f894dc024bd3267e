"""Tensor layouts, as ``torch.layout``: ``strided`` (dense) and ``sparse_coo``."""


class layout:
    """As ``torch.layout``: how a tensor stores its elements (``t.layout``)."""

    __slots__ = ("name",)

    def __init__(self, name):
        self.name = name

    def __repr__(self):
        return f"tapegrad.{self.name}"

    def __reduce__(self):
        return (_by_name, (self.name,))


def _by_name(name):
    return _LAYOUTS[name]


strided = layout("strided")
sparse_coo = layout("sparse_coo")
_LAYOUTS = {"strided": strided, "sparse_coo": sparse_coo}
