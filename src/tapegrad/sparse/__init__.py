"""Sparse COO tensors (``torch.sparse``): ``tapegrad.sparse_coo_tensor``, ``Tensor.to_sparse``,
``tapegrad.sparse.mm`` / ``sum`` / ``softmax``. See ``coo.py`` for the design."""
from tapegrad.sparse.layout import layout, strided, sparse_coo
from tapegrad.sparse.coo import (SparseCooTensor, sparse_coo_tensor, to_sparse,
                                 sparse_sum as sum, matmul as _matmul)


def mm(mat1, mat2):
    """As ``torch.sparse.mm``: sparse @ dense or dense @ sparse (dense result), sparse @ sparse
    (sparse result) or dense @ dense (``mm``), with gradients for both operands; a sparse
    leaf that requires grad gets a sparse gradient at its own entries, as in PyTorch.

    >>> tapegrad.sparse.mm(adjacency, features)
    """
    return _matmul(mat1, mat2, name="sparse.mm")


def spmm(input, mat2):
    """As ``torch.spmm``: ``torch.mm`` meant for a sparse operand (dense ones multiply as
    ``mm``)."""
    return _matmul(input, mat2, name="spmm")


__all__ = ["layout", "strided", "sparse_coo", "sparse_coo_tensor", "mm", "sum", "spmm",
           "SparseCooTensor", "to_sparse"]
