"""Softmax cross-entropy with class indices, fused: the loss, the logits' gradient and (when
read) the gradient's column sums, bitwise eager's.

Eager (``ops.nn.cross_entropy_index`` and ``cross_entropy_index_backward``) computes per row
``s = x - max(x)``, ``lse = log(sum(exp(s)))``, the loss ``sum(lse - s[t]) / count`` and the
gradient ``(exp(s) / sum(exp(s)) * keep - onehot) * (g * scale)``. The generated code's node
``cross_entropy_fused`` runs the same operations as three numba passes around numpy's own
``exp`` and ``log`` (numba's C-library ones differ from numpy's SIMD loops in the last bit):

1. ``ce_shift``: the targets checked, each row's max (numpy's value: max is exact in any
   order; taken on the floats' bits as ordered integers, which vectorise; a row holding a NaN
   takes it, as ``np.maximum``), ``s = x - max`` into the buffer that becomes the gradient,
   and the target's ``s[i, t[i]]`` set aside; returns the valid rows' count.
2. numpy's ``exp`` of that buffer, in place.
3. ``ce_grad``: each row's sum in numpy's pairwise order (``kernels.PAIRWISE``), the row turned
   into its gradient in place (a division and a multiply an element, the target's element
   apart) and the column sums (rows added in order from 0, as numpy's ``add.reduce`` over
   axis 0).
4. numpy's ``log`` of the row sums, then ``ce_loss``: the per-row losses (0 for ignored
   rows) summed in numpy's pairwise order.

This replaces numpy's ``maximum.reduce`` over short rows (slow: ~0.7 ns an element), the
broadcast subtraction's and ``exp``'s separate temporaries and a gradient loop that did not
vectorise (a branch per element). Without numba the node runs eager's two calls
(``passes._cross_entropy_impl``).

Tried and dropped: one numba call for everything, 16 rows at a time in an L1 buffer, calling
numpy's own exp and log C loops through function pointers read from the ufunc objects (the
same bits): the kernel was no faster than the three passes (58 us on (512, 95) float32) and
numba's dispatch on ctypes-function arguments added ~20 us a call; in the char-GPT step it
took 0.14 ms against the three passes' 0.09 ms.
"""
import sys

import numpy as np

from tapegrad.compiler import kernels, op_kernels

SOURCE = '''import numpy as np
from numba import njit


''' + kernels.PAIRWISE + '''

@njit(error_model="numpy", cache=True)
def check_targets(t, ignore_index, C):
    # the valid rows' count, or -1 - i for the first row i whose target is out of range
    count = 0
    for i in range(t.shape[0]):
        ti = t[i]
        if ti != ignore_index:
            if ti < 0 or ti >= C:
                return -1 - i
            count += 1
    return count


@njit(error_model="numpy", cache=True, inline="always")
def shift_row(row, bits, out, mask, top, mval, mbits):
    # out = row - max(row). The max is taken on integer keys (bits: the row's as signed
    # integers; key = bits, its magnitude bits flipped when negative, orders as the floats
    # do, -0 below +0): integer maxima vectorise, float ones do not here (numba's select is
    # not IEEE max). A NaN (a key above +inf's, ``top``, or below -inf's) is the max, as
    # np.maximum's. Returns nothing; the max's sign of zero never reaches a result bit
    C = row.shape[0]
    b = bits[0]
    hi = b ^ (mask if b < 0 else 0)
    lo = hi
    for j in range(1, C):
        b = bits[j]
        k = b ^ (mask if b < 0 else 0)
        hi = k if k > hi else hi
        lo = k if k < lo else lo
    mbits[0] = hi ^ (mask if hi < 0 else 0)  # the key's float, through a one-element view
    m = mval[0]
    if hi > top or lo < -1 - top:  # a NaN in the row
        for j in range(C):
            if row[j] != row[j]:
                m = row[j]
                break
    for j in range(C):
        out[j] = row[j] - m


@njit(error_model="numpy", cache=True)
def ce_shift(x, xi, mask, top, t, ignore_index, s, st):
    # s = x - rowmax(x), st[i] = s[i, t[i]] (0 for an ignored row); returns check_targets'
    N, C = x.shape
    count = check_targets(t, ignore_index, C)
    if count < 0:
        return count
    zero = x.dtype.type(0)
    mval = np.empty(1, x.dtype)
    mbits = mval.view(xi.dtype)
    for i in range(N):
        shift_row(x[i], xi[i], s[i], mask, top, mval, mbits)
        ti = t[i]
        st[i] = s[i, ti] if ti != ignore_index else zero
    return count


@njit(error_model="numpy", cache=True, inline="always")
def grad_row(row, s, ti, ignore_index, gs, zero, one):
    # row = eager's ((row / s) * keep - onehot) * gs, in place: keep = 1 for a valid row
    # (q * 1 is q), 0 for an ignored one (q * 0 - 0 is q * 0); one branch-free loop, then the
    # target's element from its value kept before it
    k = one if ti != ignore_index else zero
    et = row[ti] if ti != ignore_index else zero
    for j in range(row.shape[0]):
        row[j] = ((row[j] / s) * k) * gs
    if ti != ignore_index:
        row[ti] = ((et / s) - one) * gs


@njit(error_model="numpy", cache=True)
def ce_grad(e, t, ignore_index, gs, se, red, n_red):
    # each row's sum (kept for the loss), then the row turned into its gradient in place (one
    # buffer from x - max to the gradient: half the fresh memory a call writes); then the
    # column sums. The two row loops differ only in the sum: a branch between them inside one
    # loop keeps LLVM from vectorising either (2x slower)
    N, C = e.shape
    zero = e.dtype.type(0)
    one = e.dtype.type(1)
    if C <= 128:  # one block: pairwise_block inlined (pairwise_sum's own call costs)
        for i in range(N):
            s = pairwise_block(e[i], 0, C)
            se[i] = s
            grad_row(e[i], s, t[i], ignore_index, gs, zero, one)
    else:
        for i in range(N):
            s = pairwise_sum(e[i], 0, C)
            se[i] = s
            grad_row(e[i], s, t[i], ignore_index, gs, zero, one)
    for j in range(n_red):  # numpy's add.reduce over axis 0: from 0, the rows in order
        red[j] = zero
    if n_red:
        for i in range(N):
            row = e[i]
            for j in range(C):
                red[j] += row[j]


@njit(error_model="numpy", cache=True)
def ce_loss(lse, st, t, ignore_index):
    # eager's losses (lse - s[t], 0 where ignored) summed as numpy's add.reduce (0 + pairwise)
    N = lse.shape[0]
    zero = lse.dtype.type(0)
    for i in range(N):
        st[i] = (lse[i] - st[i]) if t[i] != ignore_index else zero
    return zero + pairwise_sum(st, 0, N)

'''


_BITS = {4: np.int32, 8: np.int64}
_MASK = {k: v(np.iinfo(v).max) for k, v in _BITS.items()}
_TOP = {4: np.array(np.inf, np.float32).view(np.int32)[()],  # +inf's key (its bits)
        8: np.array(np.inf, np.float64).view(np.int64)[()]}


def _kernels():
    """``(ce_shift, ce_grad, ce_loss)``, compiled (or loaded from numba's cache) once."""
    mod = sys.modules[cross_entropy().py_func.__module__]
    return mod.ce_shift, mod.ce_grad, mod.ce_loss


def cross_entropy():
    """The gradient kernel (its module also holds the others and ``pairwise_sum``)."""
    return kernels.load("ce_grad", SOURCE)


def _reference(x, t, g, ignore_index, mean, with_sum):
    """Eager's two calls: an empty batch or class axis (numpy's own errors and values),
    strided logits (numpy reduces those in its iterator's order, not row by row)."""
    from tapegrad.ops.nn import cross_entropy_index, cross_entropy_index_backward

    loss = cross_entropy_index.forward(x, t, ignore_index=ignore_index, mean=mean)
    grad = cross_entropy_index_backward.forward(g, x, t, ignore_index=ignore_index, mean=mean)
    if with_sum:
        return np.asarray(loss), grad, np.add.reduce(grad, axis=0)
    return np.asarray(loss), grad


def _out_of_range(x, t, ignore_index):
    """Eager's IndexError for the targets (the graph's ``check_index`` node has already
    raised it where the targets come from the call: this is the kernel's own guard)."""
    from tapegrad.nn.functional import _target_message
    from tapegrad.ops.indexing import check_index

    check_index.forward(t, x.shape[1], _target_message("cross_entropy", x.shape[1]),
                        "IndexError", ignore_index)


def cross_entropy_call(with_sum):
    """The generated code's ``cross_entropy_fused(x, t, g, ignore_index, mean)``: the loss (a
    0-d array), the logits' gradient and, ``with_sum``, its column sums; eager's bits, and
    eager's IndexError for a target out of range."""
    shift, grad_kernel, loss_kernel = _kernels()

    def cross_entropy_fused(x, t, g, ignore_index=-100, mean=True):
        n, c = x.shape
        if n == 0 or c == 0 or x.dtype.kind != "f" or x.dtype.itemsize < 4 \
                or not x.flags.c_contiguous:  # (numpy's sums of strided rows: its own order)
            return _reference(x, t, g, ignore_index, mean, with_sum)
        dt = x.dtype.type
        size = x.dtype.itemsize
        grad = np.empty((n, c), x.dtype)  # x - max, then exp, then the gradient
        st = np.empty(n, x.dtype)
        count = shift(x, x.view(_BITS[size]), _MASK[size], _TOP[size], t, ignore_index, grad,
                      st)
        if count < 0:
            _out_of_range(x, t, ignore_index)
        np.exp(grad, out=grad)
        scale = ((1.0 / count) if count else 0.0) if mean else 1.0
        se = np.empty(n, x.dtype)
        red = np.empty(c if with_sum else 0, x.dtype)
        grad_kernel(grad, t, ignore_index, dt(g) * dt(scale), se, red, red.shape[0])
        np.log(se, out=se)
        total = dt(loss_kernel(se, st, t, ignore_index))
        if not mean:
            loss = total
        else:
            loss = total / count if count else np.full((), np.nan, x.dtype)
        if with_sum:
            return np.asarray(loss), grad, red
        return np.asarray(loss), grad

    return cross_entropy_fused


# --- linear over a stack of rows: numpy's stacked product against W.T made contiguous -------
# Eager's ``linear(x, w, b)`` on x (..., R, K) is one 2-D GEMM of all rows against w.T (a
# transposed view; backend.blas.matmul). For the char GPT's shapes (16 x 32 rows, K and N of
# 64..256, the vocabulary's 95) numpy's stacked product against w.T copied contiguous (one
# small GEMM per leading index) takes 0.75-0.9x the time (float32 (512, 64) x (64, 95): 80 ->
# 60 us; (64, 192): 138 -> 122 us; float64 alike), with the same bits: each output element is
# the same K-term dot product, accumulated alike. That holds for the BLAS kernels these shapes
# take, not for every shape (one row per index goes to GEMV; some tiny products to other
# kernels): each shape is probed once on random operands, and the stacked form is used only
# where its bits were eager's, and only where it was faster (per-index rows 4..32, K and N up
# to 256) and eager's GEMM runs on one thread too (OpenBLAS's own small-product bound, or
# ``backend.blas.runs_serial``: a product two threads would speed up stays eager's).
_stacked_same = {}  # (x shape, w shape, dtype name) -> the stacked product is eager's here


def _stacked_is_eagers(xs, ws, dtype):
    from tapegrad.backend import blas

    key = (xs, ws, dtype.name)
    same = _stacked_same.get(key)
    if same is None:
        rng = np.random.default_rng(len(xs) + sum(xs) + sum(ws))
        same = True
        for scale in (1.0, 1e3):
            x = (rng.standard_normal(xs) * scale).astype(dtype)
            w = rng.standard_normal(ws).astype(dtype)
            a, b = blas.matmul(x, w.T), blas.matmul(x, np.ascontiguousarray(w.T))
            same = same and a.dtype == b.dtype and np.array_equal(
                a.view(_BITS[dtype.itemsize]), b.view(_BITS[dtype.itemsize]))
        _stacked_same[key] = same
    return same


def linear_stacked(x, w, b=None):
    """``linear(x, w, b)`` (ops.nn's: ``x @ w.T``, then ``+= b``) as numpy's stacked product
    against ``w.T`` made contiguous. A strided ``x`` runs eager's linear (the shape's probe
    used contiguous operands only)."""
    from tapegrad.backend import blas

    if not x.flags.c_contiguous:
        from tapegrad.ops.nn import linear

        return linear.forward(x, w) if b is None else linear.forward(x, w, b)
    out = blas.matmul(x, np.ascontiguousarray(w.T))
    if b is not None:
        out += b
    return out


@op_kernels.register("linear")
def _linear_factory(node):
    from tapegrad.backend import blas
    from tapegrad.compiler.ir import Value

    ins = node.inputs
    if node.op is None or node.params or len(ins) not in (2, 3) or len(node.outputs) != 1 \
            or not all(isinstance(v, Value) for v in ins):
        return None
    x, w = ins[0], ins[1]
    dt = x.dtype
    if dt not in (np.dtype(np.float32), np.dtype(np.float64)) or w.dtype != dt \
            or len(x.shape) < 3 or len(w.shape) != 2 or x.shape[-1] != w.shape[1] \
            or (len(ins) == 3 and (ins[2].dtype != dt or tuple(ins[2].shape) != (w.shape[0],))):
        return None
    rows, k, n = x.shape[-2], w.shape[1], w.shape[0]
    total = int(np.prod(x.shape[:-1], dtype=np.int64)) * k * n
    m = total // (k * n) if k * n else 0
    one_thread = total <= blas.OPENBLAS_SERIAL_WORK or blas.runs_serial(m, k, n, dt.itemsize)
    if not (4 <= rows <= 32 and k <= 256 and n <= 256 and one_thread) \
            or tuple(node.outputs[0].shape) != tuple(x.shape[:-1]) + (n,) \
            or not _stacked_is_eagers(tuple(x.shape), tuple(w.shape), dt):
        return None
    return linear_stacked
