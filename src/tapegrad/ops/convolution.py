"""Convolution: conv2d and its two partial derivatives.

conv2d, conv2d_input and conv2d_weight are the three partial derivatives of one trilinear
form, so each one's rule is the other two and the family closes on itself (second
derivatives come from recording the rules). Higher-level convolutions (1d, transposed,
3d through 2d) are built on these in ``nn.functional``.

Each op picks its kernel by the product's shape (rules measured in docs/performance.md,
"Convolution kernels"):

- unpadded 1x1, one group: a product per example, ``(O, C) @ (N, C, P)``, reading the input
  (every stride-th pixel) in place: no im2col, and the result is NCHW as it comes;
- one input and one output channel per group (depthwise), float32/float64, numba installed:
  ``convolution_numba``'s direct loops;
- otherwise im2col rows, channels last with the taps outermost, times the tap-major weight
  in one GEMM (per group). The input gradient at stride 1 (unless the input has under a
  quarter of the output's channels) is the same correlation, of the output gradient with the
  flipped kernel; otherwise a GEMM and col2im, or one copy where no two taps meet (kernel
  within its stride, as ConvTranspose2d(k, stride=k)).
"""
from tapegrad.backend import array_module
from tapegrad.ops import registry as _registry
from tapegrad.ops.linalg import blas_matmul
from tapegrad.ops.registry import op, xp

_sliding = xp.lib.stride_tricks.sliding_window_view
_numel = _registry.numel
_contraction = _registry.contraction_cost


# --- convolution -------------------------------------------------------------------------
# Parameters: stride (sh, sw), padding ((top, bottom), (left, right)), dilation (dh, dw),
# groups.
def _patches(x, kernel, stride, padding, dilation, fill=0):
    """(N, C, OH, OW, KH, KW) view of the padded input's receptive fields."""
    if any(p for pair in padding for p in pair):
        x = xp.pad(x, ((0, 0), (0, 0)) + tuple(padding), constant_values=fill)
    (kh, kw), (dh, dw), (sh, sw) = kernel, dilation, stride
    win = _sliding(x, ((kh - 1) * dh + 1, (kw - 1) * dw + 1), axis=(2, 3))
    return win[:, :, ::sh, ::sw, ::dh, ::dw]


_loops = None  # ops.convolution_numba once imported; False where numba is absent


def _depthwise_loops(a, b, channels, groups):
    """The numba depthwise loops for a product of ``a`` and ``b`` with (input, output)
    ``channels``, or None (then the GEMM path runs).

    They serve one input and one output channel per group in float32/float64: there each
    group's GEMM is a matrix-vector product over only KH*KW taps, and the loops ran 3-8x
    faster than im2col + batched GEMM at the model suite's depthwise layers (docs/
    performance.md, "Convolution kernels")."""
    global _loops
    if groups == 1 or channels != (groups, groups) or a.dtype != b.dtype or \
            a.dtype.char not in "fd" or array_module(a) is not xp:  # host arrays only
        return None
    if _loops is None:
        try:
            from tapegrad.ops import convolution_numba as loops
        except ImportError:  # numba is the optional "compile" extra
            loops = False
        _loops = loops
    return _loops or None


def _scratch(size, kernel, out_size, stride, padding, dilation):
    """(HP, WP) of a padded image that holds the input and every window of the output (the
    numba loops index it unchecked)."""
    return tuple(max(s + lo + hi, (o - 1) * st + (k - 1) * d + 1) for s, k, o, st, (lo, hi), d
                 in zip(size, kernel, out_size, stride, padding, dilation))


def _pointwise(kernel, padding, groups):
    """A 1x1 kernel with no padding and one group: a plain product per example, no im2col."""
    return groups == 1 and tuple(kernel) == (1, 1) and not any(p for pair in padding for p in pair)


def _sampled(x, stride, out_size):
    """The (N, C, OH*OW) pixels a 1x1 kernel reads (every stride-th, the leading out_size)."""
    (sh, sw), (n, c) = stride, x.shape[:2]
    xs = x[:, :, ::sh, ::sw]
    if out_size is not None:
        xs = xs[:, :, :out_size[0], :out_size[1]]
    return xs.reshape(n, c, xs.shape[2] * xs.shape[3]), xs.shape[2:]


def _columns(x, kernel, stride, padding, dilation, groups, out_size=None):
    """im2col, channels last and taps outermost: (N*OH*OW, G, KH*KW*C/G) and the output size
    (the leading ``out_size`` windows when given).

    The input is copied once into a zero-padded (N, H, W, C) buffer; each patch row is then
    runs of contiguous channels (a whole kernel row of them, KW*C values, when groups == 1
    and the columns are not dilated), 2-6x faster to copy than the (C, KH, KW) order whose
    innermost run is KW values C apart.
    """
    n, c, h, w = x.shape
    (pt, pb), (pl, pr) = padding
    buf = array_module(x).zeros((n, h + pt + pb, w + pl + pr, c), dtype=x.dtype)
    buf[:, pt:pt + h, pl:pl + w] = x.transpose(0, 2, 3, 1)
    (kh, kw), (dh, dw), (sh, sw) = kernel, dilation, stride
    oh = (h + pt + pb - (kh - 1) * dh - 1) // sh + 1
    ow = (w + pl + pr - (kw - 1) * dw - 1) // sw + 1
    if out_size is not None:
        oh, ow = min(oh, out_size[0]), min(ow, out_size[1])
    win = _sliding(buf, ((kh - 1) * dh + 1, (kw - 1) * dw + 1), axis=(1, 2))
    win = win[:, :oh * sh:sh, :ow * sw:sw, :, ::dh, ::dw]  # (N, OH, OW, C, KH, KW)
    win = win.reshape(n, oh, ow, groups, c // groups, kh, kw).transpose(0, 1, 2, 3, 5, 6, 4)
    # every size spelled out: numpy cannot infer a -1 from an empty batch
    return win.reshape(n * oh * ow, groups, kh * kw * (c // groups)), (oh, ow)


def _tap_major(w, groups):
    """(G, O/G, KH*KW*C/G) rows of a (O, C/G, KH, KW) weight, taps outermost as ``_columns``."""
    o, cg, kh, kw = w.shape
    return w.transpose(0, 2, 3, 1).reshape(groups, o // groups, kh * kw * cg)


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


def _nchw(rows, n, oh, ow):
    """A contiguous (N, O, OH, OW) image of (N*OH*OW, O) rows."""
    out = rows.reshape(n, oh, ow, rows.shape[-1]).transpose(0, 3, 1, 2)
    return array_module(out).ascontiguousarray(out)


def _correlate(x, w, stride, padding, dilation, groups, out_size=None):
    """conv2d's forward on arrays: im2col rows times the tap-major weight, one GEMM (per
    group)."""
    n = x.shape[0]
    o = w.shape[0]
    cols, (oh, ow) = _columns(x, w.shape[2:], stride, padding, dilation, groups, out_size)
    wmat = _tap_major(w, groups).transpose(0, 2, 1)  # (G, K, O/G)
    out = blas_matmul(_grouped(cols, groups), wmat[0] if groups == 1 else wmat)
    if groups > 1:
        out = out.transpose(1, 0, 2).reshape(-1, o)  # (N*P, G, O/G) -> (N*P, O)
    return _nchw(out, n, oh, ow)


@op(flops=2, needs=True, fused=True)
def conv2d(x, w, stride, padding, dilation, groups, out_size=None):
    """Cross-correlation of (N, C, H, W) with (O, C/groups, KH, KW) as ``F.conv2d``.

    ``out_size`` keeps only the leading output rows/columns (the adjoint of a
    conv_transpose2d whose output_padding reaches past the last stride)."""
    if _pointwise(w.shape[2:], padding, groups):
        xs, (oh, ow) = _sampled(x, stride, out_size)
        out = blas_matmul(w.reshape(w.shape[:2]), xs)  # (O, C) @ (N, C, P): NCHW directly
        return out.reshape(x.shape[0], w.shape[0], oh, ow)
    loops = _depthwise_loops(x, w, (x.shape[1], w.shape[0]), groups)
    if loops is not None:
        out = [(s + lo + hi - (k - 1) * d - 1) // st + 1 for s, k, st, (lo, hi), d
               in zip(x.shape[2:], w.shape[2:], stride, padding, dilation)]
        if out_size is not None:
            out = [min(o, m) for o, m in zip(out, out_size)]
        hp, wp = _scratch(x.shape[2:], w.shape[2:], out, stride, padding, dilation)
        return loops.depthwise(xp.ascontiguousarray(x), xp.ascontiguousarray(w), stride[0],
                               stride[1], padding[0][0], padding[1][0], hp, wp, dilation[0],
                               dilation[1], out[0], out[1])
    return _correlate(x, w, stride, padding, dilation, groups, out_size)


@conv2d.grad(traces=True)
def _(g, out, x, w, stride, padding, dilation, groups, out_size=None, needs=(True, True)):
    p = dict(stride=stride, padding=padding, dilation=dilation, groups=groups)
    gx = conv2d_input(g, w, size=x.shape[2:], **p) if needs[0] else None
    gw = conv2d_weight(x, g, kernel=w.shape[2:], **p) if needs[1] else None
    return gx, gw


def _bilinear_jvp(f, t, a, b, **params):
    """The tangent of ``f(a, b, **params)``, bilinear in (a, b): ``f(ta, b) + f(a, tb)``,
    a term left out where its tangent is None. Each member of the conv family is one."""
    r = f(t[0], b, **params) if t[0] is not None else None
    if t[1] is not None:
        s = f(a, t[1], **params)
        r = s if r is None else r + s
    return r


@conv2d.jvp
def _(t, out, x, w, stride, padding, dilation, groups, out_size=None):
    return _bilinear_jvp(conv2d, t, x, w, stride=stride, padding=padding, dilation=dilation,
                         groups=groups, out_size=out_size)


def _flipped(w, groups):
    """The (C, O/G, KH, KW) weight whose correlation is ``w``'s transposed convolution."""
    o, cg, kh, kw = w.shape
    wt = w.reshape(groups, o // groups, cg, kh, kw).transpose(0, 2, 1, 3, 4)
    return wt.reshape(groups * cg, o // groups, kh, kw)[:, :, ::-1, ::-1]


def _unit_stride_input_grad(g, w, size, padding, dilation, groups):
    """conv2d_input at stride 1: the correlation of ``g`` with the flipped kernel, padded
    so that every input pixel sees each tap that reached it (cropped where the forward's
    padding passed the kernel's reach). Each tap's rows are then whole runs of the padded
    image, where col2im's adds would be runs of C/G values."""
    oh, ow = g.shape[2:]
    (kh, kw), (dh, dw) = w.shape[2:], dilation
    (pt, _), (pl, _) = padding
    top, left = dh * (kh - 1) - pt, dw * (kw - 1) - pl
    bottom = size[0] + dh * (kh - 1) - top - oh
    right = size[1] + dw * (kw - 1) - left - ow
    g = g[:, :, max(-top, 0):oh - max(-bottom, 0), max(-left, 0):ow - max(-right, 0)]
    pads = ((max(top, 0), max(bottom, 0)), (max(left, 0), max(right, 0)))
    return _correlate(g, _flipped(w, groups), (1, 1), pads, dilation, groups)


@op(flops=2, needs=True, fused=True)
def conv2d_input(g, w, size, stride, padding, dilation, groups):
    """conv2d's gradient for its input (``conv_transpose2d``): col2im of ``g`` times ``w``."""
    if _pointwise(w.shape[2:], padding, groups):
        n, c = g.shape[0], w.shape[1]
        rows = blas_matmul(w.reshape(w.shape[:2]).T,
                          g.reshape(n, g.shape[1], g.shape[2] * g.shape[3]))
        if tuple(stride) == (1, 1) and tuple(size) == g.shape[2:]:
            return rows.reshape(n, c, *size)
        out = array_module(g).zeros((n, c) + tuple(size), dtype=rows.dtype)
        out[:, :, ::stride[0], ::stride[1]][:, :, :g.shape[2], :g.shape[3]] = \
            rows.reshape(n, c, *g.shape[2:])
        return out
    loops = _depthwise_loops(g, w, (w.shape[1] * groups, w.shape[0]), groups)
    if loops is not None:
        hp, wp = _scratch(size, w.shape[2:], g.shape[2:], stride, padding, dilation)
        return loops.depthwise_input(xp.ascontiguousarray(g), xp.ascontiguousarray(w),
                                     size[0], size[1], stride[0], stride[1], padding[0][0],
                                     padding[1][0], hp, wp, dilation[0], dilation[1])
    n, o, oh, ow = g.shape
    _, cg, kh, kw = w.shape
    if _by_correlation(stride, cg * groups, o):
        return _unit_stride_input_grad(g, w, size, padding, dilation, groups)
    og = o // groups
    gmat = g.transpose(0, 2, 3, 1).reshape(n * oh * ow, groups, og)
    wmat = w.reshape(groups, og, cg * kh * kw)  # channels outermost: a view, no copy
    cols = blas_matmul(_grouped(gmat, groups), wmat[0] if groups == 1 else wmat)
    # (N, OH, OW, G, C/G, KH, KW) whatever the grouping
    cols = cols.reshape(n, oh, ow, 1, cg, kh, kw) if groups == 1 else \
        cols.reshape(groups, n, oh, ow, cg, kh, kw).transpose(1, 2, 3, 0, 4, 5, 6)
    (sh, sw), (dh, dw) = stride, dilation
    if kh * dh <= sh and kw * dw <= sw:
        return _tile(cols, size, stride, padding, dilation)
    cols = cols.reshape(n, oh, ow, groups * cg, kh, kw)
    return _col2im(cols, size, (kh, kw), stride, padding, dilation)


def _by_correlation(stride, channels, out_channels):
    """Whether conv2d_input runs as the correlation of ``g`` with the flipped kernel (stride 1
    with at least a quarter as many input as output channels): its im2col copies KH*KW*O
    values per output pixel, col2im's GEMM writes KH*KW*C and adds them back. Measured: the
    correlation 1.2-3.9x faster from C = O/2 up, col2im 1.3-2.9x faster from C = O/4 down
    (docs/performance.md, "Convolution kernels")."""
    return tuple(stride) == (1, 1) and 4 * channels > out_channels


def _tile(cols, size, stride, padding, dilation):
    """col2im where no two taps meet (each kernel's reach within its stride, as a
    ConvTranspose2d(k, stride=k)): one copy of (N, OH, OW, G, C/G, KH, KW) values into
    their pixels, no adds."""
    n, oh, ow, groups, cg, kh, kw = cols.shape
    (sh, sw), (dh, dw) = stride, dilation
    (pt, pb), (pl, pr) = padding
    hp, wp = max(size[0] + pt + pb, oh * sh), max(size[1] + pl + pr, ow * sw)
    img = array_module(cols).zeros((n, groups, cg, hp, wp), dtype=cols.dtype)
    cells = img[:, :, :, :oh * sh, :ow * sw].reshape(n, groups, cg, oh, sh, ow, sw)
    cells[:, :, :, :, :kh * dh:dh, :, :kw * dw:dw] = cols.transpose(0, 3, 4, 1, 5, 2, 6)
    img = img.reshape(n, groups * cg, hp, wp)[:, :, pt:pt + size[0], pl:pl + size[1]]
    return array_module(img).ascontiguousarray(img)


@conv2d_input.grad(traces=True)
def _(gg, out, g, w, size, stride, padding, dilation, groups, needs=(True, True)):
    p = dict(stride=stride, padding=padding, dilation=dilation, groups=groups)
    dg = conv2d(gg, w, out_size=g.shape[2:], **p) if needs[0] else None
    dw = conv2d_weight(gg, g, kernel=w.shape[2:], **p) if needs[1] else None
    return dg, dw


@conv2d_input.jvp
def _(t, out, g, w, size, stride, padding, dilation, groups):
    return _bilinear_jvp(conv2d_input, t, g, w, size=size, stride=stride, padding=padding,
                         dilation=dilation, groups=groups)


@op(flops=2, needs=True, fused=True)
def conv2d_weight(x, g, kernel, stride, padding, dilation, groups):
    """conv2d's gradient for its weight: patches of ``x`` contracted with ``g``."""
    if _pointwise(kernel, padding, groups):
        xs, _ = _sampled(x, stride, g.shape[2:])
        n, o, c, p = g.shape[0], g.shape[1], x.shape[1], xs.shape[2]
        if p >= o:  # per-example products summed: fewer copies, measured faster while P >= O
            gw = blas_matmul(g.reshape(n, o, p), xs.transpose(0, 2, 1)).sum(axis=0)
        else:
            gw = blas_matmul(g.transpose(1, 0, 2, 3).reshape(o, n * p),
                             xs.transpose(0, 2, 1).reshape(n * p, c))
        return gw.reshape(o, c, 1, 1)
    loops = _depthwise_loops(x, g, (x.shape[1], g.shape[1]), groups)
    if loops is not None:
        hp, wp = _scratch(x.shape[2:], kernel, g.shape[2:], stride, padding, dilation)
        return loops.depthwise_weight(xp.ascontiguousarray(x), xp.ascontiguousarray(g),
                                      kernel[0], kernel[1], stride[0], stride[1], padding[0][0],
                                      padding[1][0], hp, wp, dilation[0], dilation[1])
    o = g.shape[1]
    og = o // groups
    cg = x.shape[1] // groups
    cols, _ = _columns(x, kernel, stride, padding, dilation, groups, g.shape[2:])  # (N*P, G, K)
    gmat = g.transpose(1, 0, 2, 3).reshape(groups, og, -1)  # (G, O/G, N*P)
    gw = blas_matmul(gmat, cols[:, 0] if groups == 1 else cols.transpose(1, 0, 2))
    gw = gw.reshape(o, kernel[0], kernel[1], cg).transpose(0, 3, 1, 2)
    return array_module(gw).ascontiguousarray(gw)


@conv2d_weight.grad(traces=True)
def _(gg, out, x, g, kernel, stride, padding, dilation, groups, needs=(True, True)):
    p = dict(stride=stride, padding=padding, dilation=dilation, groups=groups)
    dx = conv2d_input(g, gg, size=x.shape[2:], **p) if needs[0] else None
    dg = conv2d(x, gg, out_size=g.shape[2:], **p) if needs[1] else None
    return dx, dg


@conv2d_weight.jvp
def _(t, out, x, g, kernel, stride, padding, dilation, groups):
    return _bilinear_jvp(conv2d_weight, t, x, g, kernel=kernel, stride=stride,
                         padding=padding, dilation=dilation, groups=groups)


# each is one GEMM over im2col patches: 2 * (output positions) * (one filter's taps), the
# filter's taps being (C/groups) * KH * KW; the two gradients are the same-size products
conv2d.costs(_contraction(lambda a, out: 2 * _numel(out) * _numel(a[1]) // a[1].shape[0]))
conv2d_input.costs(_contraction(lambda a, out: 2 * _numel(a[0]) * _numel(a[1]) // a[1].shape[0]))
conv2d_weight.costs(_contraction(lambda a, out: 2 * _numel(a[1]) * _numel(out) // out.shape[0]))
