"""Pooling: max pooling as window indices plus a gather (and its scatter-add adjoint), and
average pooling with PyTorch's divisors."""
import math

from tapegrad.backend import array_module, add_at, on_device_of
from tapegrad.ops.registry import op, xp
from tapegrad.ops.convolution import _patches, _col2im


# --- pooling -----------------------------------------------------------------------------
@op(differentiable=False)
def max_pool2d_indices(x, kernel, stride, padding, dilation, out_size):
    """Flat (h * W + w) index of each window's maximum: the first one; a NaN wins, and of
    several NaNs the last (PyTorch's kernel replaces its best by every NaN it meets)."""
    n, c, h, w = x.shape
    (kh, kw), (sh, sw), (ph, pw), (dh, dw), (oh, ow) = kernel, stride, padding, dilation, out_size
    if (kh, kw) == (sh, sw) and dh == dw == 1 and ph == pw == 0 and oh * kh <= h and ow * kw <= w:
        return _tiled_max_indices(x, kh, kw, oh, ow)
    pads = ((ph, (oh - 1) * sh + (kh - 1) * dh + 1 - h - ph),
            (pw, (ow - 1) * sw + (kw - 1) * dw + 1 - w - pw))
    fill = xp.iinfo(x.dtype).min if x.dtype.kind in "iu" else -xp.inf  # (bfloat16: "V")
    crop = tuple((lo, max(hi, 0)) for lo, hi in pads)
    win = _patches(x, kernel, stride, crop, dilation, fill)[:, :, :oh, :ow]
    win = win.reshape(n, c, oh, ow, kh * kw)
    k = win.argmax(axis=-1)  # (the first NaN, where a window holds one)
    if x.dtype.kind not in "iu":
        nan = win != win
        if nan.any():
            last = kh * kw - 1 - nan[..., ::-1].argmax(axis=-1)
            k = xp.where(nan.any(axis=-1), last, k)
    r0 = xp.arange(oh)[:, None] * sh - ph  # each window's first row and column
    c0 = xp.arange(ow)[None, :] * sw - pw
    rows = r0 + (k // kw) * dh
    cols = c0 + (k % kw) * dw
    # a window of only -inf keeps its first in-bounds element, as PyTorch's kernel does (the
    # argmax then lands on padding): the first row/column at or after 0 in steps of dilation
    out = (rows < 0) | (rows >= h) | (cols < 0) | (cols >= w)
    if out.any():
        first_r = r0 + -(xp.minimum(r0, 0) // dh) * dh
        first_c = c0 + -(xp.minimum(c0, 0) // dw) * dw
        rows = xp.where(out, first_r, rows)
        cols = xp.where(out, first_c, cols)
    return rows * w + cols


def _tiled_max_indices(x, kh, kw, oh, ow):
    """max_pool2d_indices when the windows tile the input (stride = kernel, no padding or
    dilation): one copy puts each window offset in a contiguous row, then the window max and
    the first offset that reaches it are elementwise passes over those rows, instead of an
    argmax over a last axis of kh * kw (1.5-3x faster at the digits CNN's 2x2 pools)."""
    n, c, h, w = x.shape
    if (oh * kh, ow * kw) != (h, w):  # floor mode: the last rows/columns belong to no window
        x = x[:, :, :oh * kh, :ow * kw]
    m = array_module(x)
    rows = m.ascontiguousarray(x.reshape(n * c * oh, kh, ow, kw).transpose(1, 3, 0, 2))
    rows = rows.reshape(kh * kw, n * c * oh * ow)
    top = xp.max(rows, axis=0)  # NaN if the window holds one
    has_nan = bool((top != top).any())
    off = m.zeros(top.shape, dtype=xp.int64)
    hit = m.empty(top.shape, dtype=bool)
    for k in range(kh * kw - 1, -1, -1):  # backwards, so the first offset that hits wins
        xp.equal(rows[k], top, out=hit)
        off = xp.where(hit, (k // kw) * w + k % kw, off)
    if has_nan:  # of several NaNs the last wins, as in PyTorch's kernel
        for k in range(kh * kw):
            row = rows[k]
            off = xp.where(row != row, (k // kw) * w + k % kw, off)
    off = off.reshape(n, c, oh, ow)
    off += (m.arange(oh) * (kh * w))[:, None] + m.arange(ow) * kw
    return off


@op(fused=True, linear=True)
def max_pool2d(x, idx):
    """Gather each (N, C) plane of ``x`` at the flat indices ``idx`` (the window maxima)."""
    n, c, h, w = x.shape
    oh, ow = idx.shape[2:]
    flat = x.reshape(n, c, h * w)  # sizes spelled out: numpy infers no -1 for a batch of 0
    return xp.take_along_axis(flat, idx.reshape(n, c, oh * ow), axis=2).reshape(idx.shape)


@max_pool2d.grad(traces=True)
def _(g, out, x, idx):
    return max_pool2d_backward(g, idx, size=x.shape), None


@op(fused=True, linear=True)
def max_pool2d_backward(g, idx, size):
    """Scatter-add ``g`` to the argmax positions ``idx`` of an input of shape ``size``."""
    planes, area = size[0] * size[1], math.prod(size[2:])
    m = array_module(g)
    flat = idx.reshape(planes, math.prod(idx.shape[2:])) + m.arange(planes)[:, None] * area
    out = m.zeros(planes * area, dtype=g.dtype)
    add_at(out, flat.reshape(-1), g.reshape(-1))
    return out.reshape(size)


@max_pool2d_backward.grad(traces=True)
def _(gg, out, g, idx, size):
    return max_pool2d(gg, idx), None


def _avg_divisor(size, kernel, stride, padding, out_size, count_include_pad, divisor_override,
                 dtype):
    """(OH, OW) divisor of each window, as PyTorch's kernel computes it."""
    if divisor_override:
        return divisor_override
    counts = []
    for n, k, s, p, o in zip(size, kernel, stride, padding, out_size):
        start = xp.arange(o) * s - p
        end = xp.minimum(start + k, n + p)
        if count_include_pad:
            counts.append(end - start)
        else:
            counts.append(xp.minimum(end, n) - xp.maximum(start, 0))
    return (counts[0][:, None] * counts[1][None, :]).astype(dtype)


@op(flops=1, saves="none", fused=True, linear=True)
def avg_pool2d(x, kernel, stride, padding, out_size, count_include_pad=True,
               divisor_override=None):
    """Window sums over the zero-padded input divided by PyTorch's divisor."""
    (kh, kw), (sh, sw), (ph, pw), (oh, ow) = kernel, stride, padding, out_size
    h, w = x.shape[2:]
    pads = ((ph, max((oh - 1) * sh + kh - h - ph, 0)), (pw, max((ow - 1) * sw + kw - w - pw, 0)))
    win = _patches(x, kernel, stride, pads, (1, 1))[:, :, :oh, :ow]
    div = _avg_divisor((h, w), kernel, stride, padding, out_size, count_include_pad,
                       divisor_override, x.dtype)
    if isinstance(div, xp.ndarray):
        div = on_device_of(x, div)
    return win.sum(axis=(-2, -1)) / div


@avg_pool2d.grad(traces=True)
def _(g, out, x, **p):
    return avg_pool2d_backward(g, size=x.shape[2:], **p)


@op(flops=1, saves="none", fused=True, linear=True)
def avg_pool2d_backward(g, size, kernel, stride, padding, out_size, count_include_pad=True,
                        divisor_override=None):
    """Spread each window's gradient evenly back over the window (avg_pool2d's adjoint)."""
    (kh, kw), (sh, sw), (ph, pw), (oh, ow) = kernel, stride, padding, out_size
    div = _avg_divisor(size, kernel, stride, padding, out_size, count_include_pad,
                       divisor_override, g.dtype)
    if isinstance(div, xp.ndarray):
        div = on_device_of(g, div)
    share = (g / div).transpose(0, 2, 3, 1)[..., None, None]
    share = xp.broadcast_to(share, share.shape[:4] + (kh, kw))  # (N, OH, OW, C, KH, KW)
    pads = ((ph, max((oh - 1) * sh + kh - size[0] - ph, 0)),
            (pw, max((ow - 1) * sw + kw - size[1] - pw, 0)))
    return _col2im(share, size, kernel, stride, pads, (1, 1))


@avg_pool2d_backward.grad(traces=True)
def _(gg, out, g, size, **p):
    return avg_pool2d(gg, **p)
