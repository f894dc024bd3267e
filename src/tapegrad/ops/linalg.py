"""Linear algebra: matmul in all its forms (1-D, 2-D, batched with broadcasting), einsum.

mm, bmm, dot and outer are checked front ends over matmul and mul. Both expensive rules take
``needs=`` and compute only the gradients some input wants.
"""
import functools

from tapegrad.ops import registry as _registry
from tapegrad.ops.registry import op, xp
from tapegrad.backend.blas import matmul as blas_matmul  # xp.matmul, small ones on 1 thread
from tapegrad.ops.movement import sum_to, broadcast_to_op, reshape_op as reshape
from tapegrad.ops.indexing import index_op
from tapegrad.ops import elementwise as _E
from tapegrad.amp.autocast_mode import autocast_composite  # PyTorch's autocast lists


def _matmul_shapes_error(a, b):
    return RuntimeError(
        f"matmul: shapes {tuple(a.shape)} and {tuple(b.shape)} cannot be multiplied "
        f"({a.shape[-1]} != {b.shape[-2] if b.ndim > 1 else b.shape[0]})")


def _batch_error(a, b):
    """The broadcast failure of matmul's batch dims, in PyTorch's terms, or None."""
    batch_a, batch_b = tuple(a.shape[:-2]), tuple(b.shape[:-2])
    n = max(len(batch_a), len(batch_b))
    padded = zip((1,) * (n - len(batch_a)) + batch_a, (1,) * (n - len(batch_b)) + batch_b)
    for i, (x, y) in enumerate(padded):
        if x != y and x != 1 and y != 1:
            return RuntimeError(
                f"matmul: shapes {tuple(a.shape)} and {tuple(b.shape)} cannot be multiplied: "
                f"batch dims {batch_a} and {batch_b} do not broadcast (the size of tensor a "
                f"({x}) must match the size of tensor b ({y}) at non-singleton dimension {i})")
    return None


@op(flops=2, needs=True, uses=((1,), (0,)))
def matmul(a, b):
    """As ``torch.matmul``: 1-D, 2-D and batched (broadcast) matrix products."""
    if a.ndim == 0 or b.ndim == 0:
        raise RuntimeError("matmul: both arguments to matmul need to be at least 1D, but "
                           f"they are {a.ndim}D and {b.ndim}D")
    if a.shape[-1] != (b.shape[-2] if b.ndim > 1 else b.shape[0]):
        raise _matmul_shapes_error(a, b)
    if a.dtype != b.dtype:
        raise RuntimeError(f"matmul: expected both operands to have the same dtype, but got "
                           f"{a.dtype} and {b.dtype} (shapes {tuple(a.shape)} and "
                           f"{tuple(b.shape)})")
    try:
        return blas_matmul(a, b)
    except ValueError:  # batch dims that do not broadcast: say so instead of numpy's wording
        error = _batch_error(a, b)
        if error is None:
            raise
        raise error from None


@matmul.grad(traces=True)
def _(g, out, a, b, needs=(True, True)):
    if a.ndim == 1 and b.ndim == 1:
        return (g * b if needs[0] else None), (g * a if needs[1] else None)
    # lift 1-D operands to matrices, take the batched 2-D rule, then drop the lifted dims.
    # An operand whose partner wants no gradient was not saved (uses=): only its shape is
    a_shape = (1, a.shape[0]) if a.ndim == 1 else tuple(a.shape)
    b_shape = (b.shape[0], 1) if b.ndim == 1 else tuple(b.shape)
    if a.ndim == 1:
        g = reshape(g, shape=g.shape[:-1] + (1,) + g.shape[-1:])
    elif b.ndim == 1:
        g = reshape(g, shape=g.shape + (1,))
    ga = gb = None
    if needs[0]:
        b2 = reshape(b, shape=b_shape) if b.ndim == 1 else b
        ga = _unlift(matmul(g, b2.mT), a_shape, tuple(a.shape))
    if needs[1]:
        a2 = reshape(a, shape=a_shape) if a.ndim == 1 else a
        gb = _unlift(matmul(a2.mT, g), b_shape, tuple(b.shape))
    return ga, gb


@matmul.jvp
def _(t, out, a, b):
    ta, tb = t
    return (matmul(ta, b) if ta is not None else 0) + (matmul(a, tb) if tb is not None else 0)


_sparse = None  # (sparse tensor class, its product), set by accept_sparse


class _MatmulOp(_registry.Op):
    """matmul's record once a sparse_coo tensor exists: a call with a sparse operand goes to
    tapegrad.sparse (that product is not this op's forward); dense calls go on to dispatch
    unchanged."""

    __slots__ = ()

    def __call__(self, *args, **params):
        if _sparse is not None and len(args) == 2 and (
                type(args[0]) is _sparse[0] or type(args[1]) is _sparse[0]):
            return _sparse[1](*args, name="matmul")
        return _registry.Op.__call__(self, *args, **params)


def accept_sparse(sparse_class, product):
    """Route matmul calls with a ``sparse_class`` operand to ``product``. tapegrad.sparse calls
    this when it makes its first sparse tensor, so dense-only programs pay no extra call."""
    global _sparse
    _sparse = (sparse_class, product)
    matmul.__class__ = _MatmulOp


@matmul.costs
def _(arrays, out, params):
    # one multiply-add per (output element, contracted index): 2*M*N*K, times the batch
    a = arrays[0]
    return (2 * _registry.numel(out) * a.shape[-1], _registry.read_bytes(arrays),
            _registry.written_bytes(out))


def _unlift(grad, lifted, shape):
    if tuple(grad.shape) != lifted:
        grad = sum_to(grad, shape=lifted)  # batch dims the operand was broadcast over
    return reshape(grad, shape=shape) if lifted != shape else grad


# --- einsum ------------------------------------------------------------------------------
_LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"


@op(flops=2, needs=True, name="einsum")
def einsum_op(arrays, equation):
    """``xp.einsum`` on an explicit equation whose operands have no repeated subscripts."""
    if arrays and arrays[0].dtype.kind == "V":  # bfloat16: numpy's einsum has no loop for it
        return einsum_op.forward([a.astype(xp.float32) for a in arrays],
                                 equation).astype(arrays[0].dtype)
    return xp.einsum(equation, *arrays, optimize=len(arrays) > 2 or _work(equation, arrays) > 32768)


@einsum_op.costs
def _(arrays, out, params):
    # contracted left to right: each step multiplies over the union of its two terms' letters
    # (a multiply-add, 2 FLOPs, where a letter is summed away; else 1); one operand: its sums
    operands = arrays[0]
    inputs, output = _split_equation(params["equation"])
    sizes = {}
    for term, a in zip(inputs, operands):
        sizes.update(zip(term, a.shape))
    flops, current = 0, set(inputs[0])
    if len(inputs) == 1 and current - set(output):
        flops = _registry.numel(operands[0])
    for i in range(1, len(inputs)):
        union = current | set(inputs[i])
        later = set(output).union(*inputs[i + 1:])
        n = 1
        for c in union:
            n *= sizes[c]
        flops += n * (2 if union - later else 1)
        current = union & later
    return flops, _registry.read_bytes(arrays), _registry.written_bytes(out)


def _work(equation, arrays):
    # the naive loop's length: above a few thousand, numpy's BLAS-backed path (which costs
    # ~40 us to plan) is the faster one
    sizes = {}
    for term, a in zip(_split_equation(equation)[0], arrays):
        sizes.update(zip(term, a.shape))
    n = 1
    for m in sizes.values():
        n *= m
    return n


@einsum_op.grad
def _(g, out, *operands, equation, needs=None):
    inputs, output = _split_equation(equation)
    grads = []
    for i, a in enumerate(operands):
        if needs is not None and not needs[i]:
            grads.append(None)
            continue
        others = [g] + [b for j, b in enumerate(operands) if j != i]
        subs = [output] + [s for j, s in enumerate(inputs) if j != i]
        seen = set("".join(subs))
        target = "".join(c for c in inputs[i] if c in seen)
        r = einsum_op(others, equation=",".join(subs) + "->" + target)
        # letters only this operand has were summed away: put them back as broadcast dims;
        # letters it holds at size 1 against a larger size elsewhere are summed down
        shape = tuple(a.shape)
        if target != inputs[i]:
            it = iter(r.shape)
            r = reshape(r, shape=tuple(next(it) if c in seen else 1 for c in inputs[i]))
        if tuple(r.shape) != shape:
            small = tuple(1 if n == 1 else m for n, m in zip(shape, r.shape))
            if small != tuple(r.shape):
                r = sum_to(r, shape=small)
            if small != shape:
                r = broadcast_to_op(r, shape=shape)
        grads.append(r)
    return tuple(grads)


@einsum_op.jvp
def _(t, out, *operands, equation):
    # multilinear: one product per operand with a tangent, that operand replaced by it
    total = None
    for i, ti in enumerate(t):
        if ti is not None:
            term = einsum_op([ti if j == i else a for j, a in enumerate(operands)],
                             equation=equation)
            total = term if total is None else total + term
    return total


@functools.lru_cache(maxsize=512)
def _split_equation(equation):
    lhs, output = equation.split("->")
    return lhs.split(","), output


def _einsum_error(msg):
    return RuntimeError(f"einsum(): {msg}")


def _sublist_equation(args):
    """torch.einsum(op1, [0, 1], op2, [1, 2], [0, 2]): the sublist form as an equation."""
    def letters(sub):
        out = []
        for s in sub:
            if s is Ellipsis:
                out.append("...")
            elif isinstance(s, int) and 0 <= s < 52:
                out.append(_LETTERS[s])
            else:
                raise _einsum_error(f"subscript in subscript list is not within the valid "
                                    f"range [0, 52), got {s!r}")
        return "".join(out)

    operands, subs = list(args[0::2]), list(args[1::2])
    if len(subs) > len(operands):
        raise _einsum_error("the sublist form takes operand, sublist pairs and an optional "
                            "output sublist")
    equation = ",".join(letters(s) for s in subs[:len(operands)])
    if len(args) % 2:
        equation += "->" + letters(args[-1])
        operands = operands[:-1]
    return equation, operands


@functools.lru_cache(maxsize=512)
def _parse(equation, shapes):
    """The equation with ellipses as letters, diagonals taken out: (explicit equation,
    per operand the repeated-subscript pattern or None)."""
    eq = equation.replace(" ", "")
    if "->" in eq:
        lhs, out = eq.split("->", 1)
        if "->" in out:
            raise _einsum_error("only one '->' is allowed in the equation")
    else:
        lhs, out = eq, None
    terms = lhs.split(",")
    if len(terms) != len(shapes):
        raise _einsum_error(f"{'fewer' if len(terms) > len(shapes) else 'more'} operands were "
                            f"provided than specified in the equation ({len(shapes)} operands, "
                            f"{len(terms)} in '{equation}')")
    for term in terms + ([out] if out is not None else []):
        bad = [c for c in term.replace("...", "") if c not in _LETTERS]
        if bad or term.count("...") > 1 or "." in term.replace("...", ""):
            raise _einsum_error(f"invalid subscript given in '{equation}' (subscripts are "
                                "letters a-z, A-Z and at most one '...' per term)")
    used = set(lhs.replace(".", "") + (out or "").replace(".", ""))
    free = [c for c in _LETTERS if c not in used]
    ell_dims = 0
    for i, (term, shape) in enumerate(zip(terms, shapes)):
        n = len(term.replace("...", ""))
        if "..." in term:
            if n > len(shape):
                raise _einsum_error(f"the number of subscripts in the equation ({n}) is more "
                                    f"than the number of dimensions ({len(shape)}) for operand {i}")
            ell_dims = max(ell_dims, len(shape) - n)
        elif n != len(shape):
            raise _einsum_error(f"the number of subscripts in the equation ({n}) does not match "
                                f"the number of dimensions ({len(shape)}) for operand {i} and no "
                                "ellipsis was given")
    if ell_dims > len(free):
        raise _einsum_error("too many dimensions for the letters left to name them")
    ell = "".join(free[:ell_dims])
    expanded = []
    for term, shape in zip(terms, shapes):
        if "..." in term:
            k = len(shape) - len(term.replace("...", ""))
            term = term.replace("...", ell[ell_dims - k:])
        expanded.append(term)
    counts = {}
    for term in expanded:
        for c in term:
            counts[c] = counts.get(c, 0) + 1
    if out is None:
        out = ell + "".join(sorted(c for c, k in counts.items() if k == 1 and c not in ell))
    else:
        if "..." in out:
            out = out.replace("...", ell)
        for c in out:
            if c not in counts:
                raise _einsum_error(f"output subscript {c} does not appear in the equation for "
                                    "any input operand")
            if out.count(c) > 1:
                raise _einsum_error(f"output subscript {c} appears more than once in the output")
    sizes = {}
    diagonals = []
    for i, (term, shape) in enumerate(zip(expanded, shapes)):
        unique = "".join(dict.fromkeys(term))
        if unique != term:
            for c in unique:
                ns = [n for t, n in zip(term, shape) if t == c]
                if len(set(ns)) > 1:
                    raise _einsum_error(f"subscript {c} is repeated for operand {i} but the "
                                        f"sizes don't match, {' != '.join(map(str, ns))}")
            diagonals.append((term, unique))
        else:
            diagonals.append(None)
        for c, n in zip(term, shape):
            if c in sizes and n != sizes[c] and n != 1 and sizes[c] != 1:
                raise _einsum_error(f"subscript {c} has size {n} for operand {i} which does not "
                                    f"broadcast with previously seen size {sizes[c]}")
            if sizes.get(c, 1) == 1:
                sizes[c] = n
    terms = [d[1] if d else t for d, t in zip(diagonals, expanded)]
    return ",".join(terms) + "->" + out, tuple(diagonals)


def _diagonal(x, term, unique):
    """``x`` with repeated subscripts (``'iij'``) reduced to one dim each (``'ij'``): an
    advanced index, so the gradient lands on the diagonal."""
    k = len(unique)
    sizes = dict(zip(term, x.shape))
    grids = {c: xp.arange(sizes[c]).reshape((1,) * j + (-1,) + (1,) * (k - j - 1))
             for j, c in enumerate(unique)}
    return index_op(x, index=tuple(grids[c] for c in term) + (Ellipsis,), accumulate=False)


@autocast_composite
def einsum(equation, *operands):
    """As ``torch.einsum``: ``einsum('bij,bjk->bik', a, b)``, implicit output (``'ij,jk'``),
    ``...`` broadcasting, repeated subscripts (``'ii->i'``), operands as a list, and the
    sublist form ``einsum(a, [0, 1], b, [1, 2], [0, 2])``. All operands share one dtype."""
    if not isinstance(equation, str):
        equation, operands = _sublist_equation((equation,) + operands)
    elif len(operands) == 1 and isinstance(operands[0], (list, tuple)):
        operands = tuple(operands[0])
    Tensor = _registry.Tensor
    for i, x in enumerate(operands):
        if not isinstance(x, Tensor):
            raise TypeError(f"einsum(): operand {i} must be a Tensor, not {type(x).__name__}")
    if operands and any(x.dtype is not operands[0].dtype for x in operands):
        raise RuntimeError("einsum(): expected all operands to have the same dtype, got " +
                           ", ".join(str(x.dtype) for x in operands))
    explicit, diagonals = _parse(equation, tuple(tuple(x.shape) for x in operands))
    operands = [x if d is None else _diagonal(x, *d) for x, d in zip(operands, diagonals)]
    return einsum_op(operands, equation=explicit)


# --- matmul front ends -------------------------------------------------------------------
def _same_dtype(name, a, b):
    if a.dtype is not b.dtype:
        raise RuntimeError(f"{name}: expected both operands to have the same dtype, but got "
                           f"{a.dtype} and {b.dtype}")


@autocast_composite
def mm(input, mat2):
    """As ``torch.mm``: the product of two 2-D matrices (no broadcasting)."""
    if _sparse is not None and (type(input) is _sparse[0] or type(mat2) is _sparse[0]):
        return _sparse[1](input, mat2, name="mm")
    if input.ndim != 2 or mat2.ndim != 2:
        raise RuntimeError(f"mm: expected 2-D matrices, got shapes {tuple(input.shape)} and "
                           f"{tuple(mat2.shape)}")
    if input.shape[1] != mat2.shape[0]:
        raise RuntimeError(f"mm: mat1 and mat2 shapes cannot be multiplied "
                           f"({input.shape[0]}x{input.shape[1]} and "
                           f"{mat2.shape[0]}x{mat2.shape[1]})")
    _same_dtype("mm", input, mat2)
    return matmul(input, mat2)


@autocast_composite
def bmm(input, mat2):
    """As ``torch.bmm``: batched products of 3-D tensors with equal batch sizes."""
    if input.ndim != 3 or mat2.ndim != 3:
        raise RuntimeError(f"bmm: expected 3-D tensors, got shapes {tuple(input.shape)} and "
                           f"{tuple(mat2.shape)}")
    if input.shape[0] != mat2.shape[0] or input.shape[2] != mat2.shape[1]:
        raise RuntimeError(f"bmm: Expected size for first two dimensions of batch2 tensor to be: "
                           f"[{input.shape[0]}, {input.shape[2]}] but got: "
                           f"[{mat2.shape[0]}, {mat2.shape[1]}] (shapes {tuple(input.shape)} "
                           f"and {tuple(mat2.shape)})")
    _same_dtype("bmm", input, mat2)
    return matmul(input, mat2)


@autocast_composite
def dot(input, tensor):
    """As ``torch.dot``: the inner product of two 1-D tensors of equal length and dtype."""
    if input.ndim != 1 or tensor.ndim != 1:
        raise RuntimeError(f"dot: 1D tensors expected, but got {input.ndim}D and "
                           f"{tensor.ndim}D tensors")
    if input.shape[0] != tensor.shape[0]:
        raise RuntimeError(f"dot: inconsistent tensor size, expected tensors of the same "
                           f"number of elements, but got {input.shape[0]} and "
                           f"{tensor.shape[0]} elements")
    _same_dtype("dot", input, tensor)
    return matmul(input, tensor)


@autocast_composite
def outer(input, vec2):
    """As ``torch.outer``: ``out[i, j] = input[i] * vec2[j]`` (dtypes promote)."""
    if input.ndim != 1 or vec2.ndim != 1:
        raise RuntimeError(f"outer: expected 1-D arguments, but got {input.ndim}-D and "
                           f"{vec2.ndim}-D")
    return _E.mul(reshape(input, shape=(input.shape[0], 1)), vec2)


ger = outer


__all__ = ["matmul", "mm", "bmm", "einsum", "outer", "ger", "dot"]
TENSOR_METHODS = ["matmul", "mm", "bmm", "outer", "ger", "dot"]
