"""Linear algebra: matmul in all its forms (1-D, 2-D, batched with broadcasting)."""
from tapegrad.ops.registry import op, xp
from tapegrad.ops.movement import sum_to, reshape_op as reshape


def _matmul_shapes_error(a, b):
    return RuntimeError(
        f"matmul: shapes {tuple(a.shape)} and {tuple(b.shape)} cannot be multiplied "
        f"({a.shape[-1]} != {b.shape[-2] if b.ndim > 1 else b.shape[0]})")


@op(flops=2, needs=True)
def matmul(a, b):
    """As ``torch.matmul``: 1-D, 2-D and batched (broadcast) matrix products."""
    if a.ndim == 0 or b.ndim == 0:
        raise RuntimeError("matmul: both arguments to matmul need to be at least 1D, but "
                           f"they are {a.ndim}D and {b.ndim}D")
    if a.shape[-1] != (b.shape[-2] if b.ndim > 1 else b.shape[0]):
        raise _matmul_shapes_error(a, b)
    return xp.matmul(a, b)


@matmul.grad
def _(g, out, a, b, needs=(True, True)):
    # lift 1-D operands to matrices, take the 2-D rule, then drop the lifted dims again
    a2 = reshape(a, shape=(1, a.shape[0])) if a.ndim == 1 else a
    b2 = reshape(b, shape=(b.shape[0], 1)) if b.ndim == 1 else b
    g2 = reshape(g, shape=a2.shape[:-1] + b2.shape[-1:]) if (a.ndim == 1 or b.ndim == 1) \
        else g
    if a.ndim == 1 and b.ndim > 1:
        g2 = reshape(g, shape=g.shape[:-1] + (1, b2.shape[-1]))
    ga = gb = None
    if needs[0]:
        ga = matmul(g2, b2.mT)
        ga = reshape(sum_to(ga, shape=a2.shape), shape=a.shape) if ga.shape != a.shape or \
            a.ndim == 1 else ga
    if needs[1]:
        gb = matmul(a2.mT, g2)
        gb = reshape(sum_to(gb, shape=b2.shape), shape=b.shape) if gb.shape != b.shape or \
            b.ndim == 1 else gb
    return ga, gb


__all__ = ["matmul"]
TENSOR_METHODS = ["matmul"]
