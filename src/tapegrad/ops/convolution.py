"""Convolution: conv2d and its two partial derivatives.

conv2d, conv2d_input and conv2d_weight are the three partial derivatives of one trilinear
form, so each one's rule is the other two and the family closes on itself (second
derivatives come from recording the rules). Higher-level convolutions (1d, transposed,
3d through 2d) are built on these in ``nn.functional``.
"""
from tapegrad.backend import array_module
from tapegrad.ops.registry import op, xp
from tapegrad.ops import registry as _registry
from tapegrad.ops.linalg import blas_matmul

_sliding = xp.lib.stride_tricks.sliding_window_view
_numel = _registry.numel
_contraction = _registry.contraction_cost


# --- convolution -------------------------------------------------------------------------
# Parameters: stride (sh, sw), padding ((top, bottom), (left, right)), dilation (dh, dw),
# groups. Patches are strided views (no copy) and the contraction one batched matmul.
def _patches(x, kernel, stride, padding, dilation, fill=0):
    """(N, C, OH, OW, KH, KW) view of the padded input's receptive fields."""
    if any(p for pair in padding for p in pair):
        x = xp.pad(x, ((0, 0), (0, 0)) + tuple(padding), constant_values=fill)
    (kh, kw), (dh, dw), (sh, sw) = kernel, dilation, stride
    win = _sliding(x, ((kh - 1) * dh + 1, (kw - 1) * dw + 1), axis=(2, 3))
    return win[:, :, ::sh, ::sw, ::dh, ::dw]


def _columns(x, kernel, stride, padding, dilation, groups, out_size=None):
    """im2col, channels last: (N*OH*OW, G, C/G*KH*KW) and the output size (the leading
    ``out_size`` windows when given).

    The input is copied once into a zero-padded (N, H, W, C) buffer; the patch copy then reads
    runs of contiguous memory (4x faster than gathering patches from NCHW).
    """
    n, c, h, w = x.shape
    (pt, pb), (pl, pr) = padding
    buf = array_module(x).zeros((n, h + pt + pb, w + pl + pr, c), dtype=x.dtype)
    buf[:, pt:pt + h, pl:pl + w] = x.transpose(0, 2, 3, 1)
    (kh, kw), (dh, dw), (sh, sw) = kernel, dilation, stride
    win = _sliding(buf, ((kh - 1) * dh + 1, (kw - 1) * dw + 1), axis=(1, 2))
    win = win[:, ::sh, ::sw, :, ::dh, ::dw]  # (N, OH, OW, C, KH, KW)
    if out_size is not None:
        win = win[:, :out_size[0], :out_size[1]]
    oh, ow = win.shape[1:3]
    # every size spelled out: numpy cannot infer a -1 from an empty batch
    return win.reshape(n * oh * ow, groups, c // groups * kh * kw), (oh, ow)


def _col2im(cols, size, kernel, stride, padding, dilation):
    """Sum (N, OH, OW, C, KH, KW) patch values back onto an (N, C, H, W) image."""
    n, oh, ow, c, kh, kw = cols.shape
    (pt, pb), (pl, pr) = padding
    (dh, dw), (sh, sw) = dilation, stride
    hp, wp = size[0] + pt + pb, size[1] + pl + pr
    img = array_module(cols).zeros((n, hp, wp, c), dtype=cols.dtype)
    for i in range(kh):  # a loop over kernel offsets; every pixel is one strided add
        for j in range(kw):
            img[:, i * dh:i * dh + sh * (oh - 1) + 1:sh,
                j * dw:j * dw + sw * (ow - 1) + 1:sw] += cols[..., i, j]
    img = img[:, pt:hp - pb, pl:wp - pr].transpose(0, 3, 1, 2)
    return array_module(img).ascontiguousarray(img)


def _grouped(a, groups):
    """(G, rows, cols) batches from (rows, G, cols); a plain matrix when there is one group."""
    return a[:, 0] if groups == 1 else a.transpose(1, 0, 2)


@op(flops=2, needs=True, fused=True)
def conv2d(x, w, stride, padding, dilation, groups, out_size=None):
    """Cross-correlation of (N, C, H, W) with (O, C/groups, KH, KW) as ``F.conv2d``.

    ``out_size`` keeps only the leading output rows/columns (the adjoint of a
    conv_transpose2d whose output_padding reaches past the last stride)."""
    n = x.shape[0]
    o = w.shape[0]
    cols, (oh, ow) = _columns(x, w.shape[2:], stride, padding, dilation, groups, out_size)
    wmat = w.reshape(groups, o // groups, -1).transpose(0, 2, 1)  # (G, K, O/G)
    out = blas_matmul(_grouped(cols, groups), wmat[0] if groups == 1 else wmat)
    if groups > 1:
        out = out.transpose(1, 0, 2)  # (N*P, G, O/G)
    return array_module(out).ascontiguousarray(out.reshape(n, oh, ow, o).transpose(0, 3, 1, 2))


@conv2d.grad
def _(g, out, x, w, stride, padding, dilation, groups, out_size=None, needs=(True, True)):
    p = dict(stride=stride, padding=padding, dilation=dilation, groups=groups)
    gx = conv2d_input(g, w, size=x.shape[2:], **p) if needs[0] else None
    gw = conv2d_weight(x, g, kernel=w.shape[2:], **p) if needs[1] else None
    return gx, gw


@conv2d.jvp
def _(t, out, x, w, stride, padding, dilation, groups, out_size=None):
    p = dict(stride=stride, padding=padding, dilation=dilation, groups=groups,
             out_size=out_size)
    r = conv2d(t[0], w, **p) if t[0] is not None else None
    if t[1] is not None:
        r = conv2d(x, t[1], **p) if r is None else r + conv2d(x, t[1], **p)
    return r


@op(flops=2, needs=True, fused=True)
def conv2d_input(g, w, size, stride, padding, dilation, groups):
    """conv2d's gradient for its input (``conv_transpose2d``): col2im of ``g`` times ``w``."""
    n, o, oh, ow = g.shape
    _, cg, kh, kw = w.shape
    og = o // groups
    gmat = g.transpose(0, 2, 3, 1).reshape(-1, groups, og)  # (N*P, G, O/G)
    wmat = w.reshape(groups, og, -1)  # (G, O/G, K)
    cols = blas_matmul(_grouped(gmat, groups), wmat[0] if groups == 1 else wmat)
    if groups > 1:
        cols = cols.transpose(1, 0, 2)  # (N*P, G, K)
    cols = cols.reshape(n, oh, ow, groups * cg, kh, kw)
    return _col2im(cols, size, (kh, kw), stride, padding, dilation)


@conv2d_input.grad
def _(gg, out, g, w, size, stride, padding, dilation, groups, needs=(True, True)):
    p = dict(stride=stride, padding=padding, dilation=dilation, groups=groups)
    dg = conv2d(gg, w, out_size=g.shape[2:], **p) if needs[0] else None
    dw = conv2d_weight(gg, g, kernel=w.shape[2:], **p) if needs[1] else None
    return dg, dw


@conv2d_input.jvp
def _(t, out, g, w, size, stride, padding, dilation, groups):
    p = dict(size=size, stride=stride, padding=padding, dilation=dilation, groups=groups)
    r = conv2d_input(t[0], w, **p) if t[0] is not None else None  # bilinear in (g, w)
    if t[1] is not None:
        r = conv2d_input(g, t[1], **p) if r is None else r + conv2d_input(g, t[1], **p)
    return r


@op(flops=2, needs=True, fused=True)
def conv2d_weight(x, g, kernel, stride, padding, dilation, groups):
    """conv2d's gradient for its weight: patches of ``x`` contracted with ``g``."""
    o = g.shape[1]
    og = o // groups
    cols, _ = _columns(x, kernel, stride, padding, dilation, groups, g.shape[2:])  # (N*P, G, K)
    gmat = g.transpose(1, 0, 2, 3).reshape(groups, og, -1)  # (G, O/G, N*P)
    gw = blas_matmul(gmat, cols[:, 0] if groups == 1 else cols.transpose(1, 0, 2))
    return gw.reshape(o, x.shape[1] // groups, *kernel)


@conv2d_weight.grad
def _(gg, out, x, g, kernel, stride, padding, dilation, groups, needs=(True, True)):
    p = dict(stride=stride, padding=padding, dilation=dilation, groups=groups)
    dx = conv2d_input(g, gg, size=x.shape[2:], **p) if needs[0] else None
    dg = conv2d(x, gg, out_size=g.shape[2:], **p) if needs[1] else None
    return dx, dg


@conv2d_weight.jvp
def _(t, out, x, g, kernel, stride, padding, dilation, groups):
    p = dict(kernel=kernel, stride=stride, padding=padding, dilation=dilation, groups=groups)
    r = conv2d_weight(t[0], g, **p) if t[0] is not None else None  # bilinear in (x, g)
    if t[1] is not None:
        r = conv2d_weight(x, t[1], **p) if r is None else r + conv2d_weight(x, t[1], **p)
    return r


# each is one GEMM over im2col patches: 2 * (output positions) * (one filter's taps), the
# filter's taps being (C/groups) * KH * KW; the two gradients are the same-size products
conv2d.costs(_contraction(lambda a, out: 2 * _numel(out) * _numel(a[1]) // a[1].shape[0]))
conv2d_input.costs(_contraction(lambda a, out: 2 * _numel(a[0]) * _numel(a[1]) // a[1].shape[0]))
conv2d_weight.costs(_contraction(lambda a, out: 2 * _numel(a[1]) * _numel(out) // out.shape[0]))
