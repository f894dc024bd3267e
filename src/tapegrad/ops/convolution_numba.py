"""numba loops for depthwise convolutions (groups == input channels == output channels),
imported by ``ops.convolution`` only when numba is installed.

A depthwise filter has one input channel: as a GEMM per group its contraction is only KH*KW
long and each product a matrix-vector one, so im2col's copy costs several times the
arithmetic. Here each example is copied once into a zero-padded channels-last scratch image
and every loop runs over channels innermost: a contiguous run (16-48 values in the model
suite) that LLVM vectorises, where the image's own rows are too short (4-16 columns) to
amortise a loop. Each output adds its taps in (i, j) order; each weight-gradient entry sums
one example's products over rows and columns, then the examples' sums in order (so its
rounding grows with OH*OW + N, not N*OH*OW); one rounding per multiply and per add (numba
leaves LLVM's FMA contraction off). The orders differ from the GEMM path's, within the same
error bound.
"""
import numpy as np
from numba import njit


@njit(cache=True, error_model="numpy")
def _padded(xp, x, n, pt, pl):
    """Example ``n`` of NCHW ``x`` into the interior of the (HP, WP, C) scratch ``xp``."""
    c_, h, wd = x.shape[1], x.shape[2], x.shape[3]
    for y in range(h):
        for q in range(wd):
            for c in range(c_):
                xp[pt + y, pl + q, c] = x[n, c, y, q]


@njit(cache=True, error_model="numpy")
def depthwise(x, w, sh, sw, pt, pl, hp, wp, dh, dw, oh, ow):
    """(N, C, H, W) with (C, 1, KH, KW) -> (N, C, OH, OW)."""
    n_, c_ = x.shape[0], x.shape[1]
    kh, kw = w.shape[2], w.shape[3]
    taps = np.empty((kh, kw, c_), x.dtype)
    for c in range(c_):
        for i in range(kh):
            for j in range(kw):
                taps[i, j, c] = w[c, 0, i, j]
    out = np.empty((n_, c_, oh, ow), x.dtype)
    xp = np.zeros((hp, wp, c_), x.dtype)
    acc = np.empty(c_, x.dtype)
    for n in range(n_):
        _padded(xp, x, n, pt, pl)
        for y in range(oh):
            for q in range(ow):
                for i in range(kh):
                    for j in range(kw):
                        src = xp[y * sh + i * dh, q * sw + j * dw]
                        t = taps[i, j]
                        if i == 0 and j == 0:
                            for c in range(c_):
                                acc[c] = src[c] * t[c]
                        else:
                            for c in range(c_):
                                acc[c] += src[c] * t[c]
                for c in range(c_):
                    out[n, c, y, q] = acc[c]
    return out


@njit(cache=True, error_model="numpy")
def depthwise_input(g, w, h, wd, sh, sw, pt, pl, hp, wp, dh, dw):
    """The input gradient of ``depthwise``: (N, C, OH, OW) -> (N, C, H, W)."""
    n_, c_, oh, ow = g.shape
    kh, kw = w.shape[2], w.shape[3]
    taps = np.empty((kh, kw, c_), g.dtype)
    for c in range(c_):
        for i in range(kh):
            for j in range(kw):
                taps[i, j, c] = w[c, 0, i, j]
    out = np.empty((n_, c_, h, wd), g.dtype)
    xp = np.empty((hp, wp, c_), g.dtype)
    gy = np.empty(c_, g.dtype)
    for n in range(n_):
        xp[:] = 0
        for y in range(oh):
            for q in range(ow):
                for c in range(c_):
                    gy[c] = g[n, c, y, q]
                for i in range(kh):
                    for j in range(kw):
                        dst = xp[y * sh + i * dh, q * sw + j * dw]
                        t = taps[i, j]
                        for c in range(c_):
                            dst[c] += gy[c] * t[c]
        for y in range(h):
            for q in range(wd):
                for c in range(c_):
                    out[n, c, y, q] = xp[pt + y, pl + q, c]
    return out


@njit(cache=True, error_model="numpy")
def depthwise_weight(x, g, kh, kw, sh, sw, pt, pl, hp, wp, dh, dw):
    """The weight gradient of ``depthwise``: (N, C, H, W), (N, C, OH, OW) -> (C, 1, KH, KW)."""
    n_, c_ = x.shape[0], x.shape[1]
    oh, ow = g.shape[2], g.shape[3]
    acc = np.zeros((kh, kw, c_), x.dtype)
    part = np.empty((kh, kw, c_), x.dtype)  # one example's sums, then added to acc
    xp = np.zeros((hp, wp, c_), x.dtype)
    gy = np.empty(c_, x.dtype)
    for n in range(n_):
        _padded(xp, x, n, pt, pl)
        part[:] = 0
        for y in range(oh):
            for q in range(ow):
                for c in range(c_):
                    gy[c] = g[n, c, y, q]
                for i in range(kh):
                    for j in range(kw):
                        src = xp[y * sh + i * dh, q * sw + j * dw]
                        a = part[i, j]
                        for c in range(c_):
                            a[c] += gy[c] * src[c]
        acc += part
    out = np.empty((c_, 1, kh, kw), x.dtype)
    for c in range(c_):
        for i in range(kh):
            for j in range(kw):
                out[c, 0, i, j] = acc[i, j, c]
    return out
