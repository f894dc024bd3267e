"""numba kernels for convolution and max-pooling nodes (registered in ``op_kernels``).

At small sizes (e.g. 8x8 and 4x4 images, 1-32 channels, batch 64) the arithmetic of a
convolution is small (4.7M multiply-adds: a 0.2 ms GEMM) and eager's layout work around its
GEMMs (im2col through sliding-window views, col2im, the max-pool's offset rows)
costs as much again. Each kernel here is numba source generated for one node's geometry
(channels, image and kernel sizes, stride, padding, dilation as constants, so LLVM unrolls
the short loops over taps and window positions; the batch size stays a run-time value) and
loaded through ``kernels.load`` (numba's disk cache keeps the machine code):

- ``conv2d``, ``conv2d_input`` (the input gradient), ``conv2d_weight`` (the weight
  gradient), groups 1, any stride, padding and dilation: eager's one BLAS GEMM each
  (``ops.convolution``), on the same operands in the same layouts (im2col rows
  (N*OH*OW, KH*KW*C), taps outermost; gradient rows (N*OH*OW, O) or channels (O, N*OH*OW);
  the tap-major weight); numba builds the patches from a zero-padded channels-last copy of
  one sample at a time, moves between NCHW and rows, and col2im adds the taps back in
  eager's order (its GEMM writes columns channels outermost, (N*OH*OW, C*KH*KW), as
  eager's does). Where eager takes the input gradient as the correlation of the gradient
  with the flipped kernel (``ops.convolution._by_correlation``), so does the kernel
  (patches of the gradient, no col2im). ``conv2d_weight`` takes the patches its graph's
  ``conv2d`` of the same array built in the same call (``_SHARED``) instead of building
  them again. Unpadded 1x1 kernels are declined: eager's per-example product, with no
  im2col, is faster than these kernels there.
- ``sum_to`` of a C-contiguous (N, C, H, W) gradient onto a (1, C, 1, 1) bias: numpy's
  pairwise sum of each plane, unrolled for the plane's size, added per channel in numpy's
  order (bitwise); a strided gradient takes the node's own op.
- ``max_pool2d_indices``: each window's maximum and its index in one pass (the first
  maximum; a NaN wins, and of several the last, as in PyTorch; a padded position reads as
  -inf; a window of only -inf keeps its first in-bounds position: eager's indices exactly,
  ceil mode included), and the maximum itself, which the graph's ``max_pool2d`` of the
  same arrays then returns instead of gathering again (``_SHARED``; other inputs are
  gathered);
  ``max_pool2d_backward`` the scatter-add, in eager's order.

Precision: the pooling kernels are bitwise eager. The convolutions hand BLAS the operands
eager hands it and add col2im's taps in eager's order, so they equal eager wherever BLAS
repeats itself on equal operands (measured bitwise at the digits CNN's sizes and on the model
suite's CNNs, whose compiled steps the suite tests hold to eager's bits; a tap that is a
copy in eager's no-overlap col2im is an add to zero here, which turns a -0.0 into +0.0); the
kernel tests hold them to 1e-12 (float64) and float32 rounding (float32). Every factory
returns None (the op's forward runs) for dtypes other than float32/float64, mixed dtypes,
groups > 1 or shapes it does not know.
Nothing runs in parallel (the kernels are meant for small batches on shared cores).
"""
import numpy as np

from tapegrad.backend.blas import matmul as blas_matmul
from tapegrad.compiler import kernels, op_kernels
from tapegrad.compiler.ir import Value
from tapegrad.ops.convolution import _by_correlation, _flipped, _pointwise, _tap_major

_FLOATS = kernels.FLOATS


def _floats(node, n_float):
    """The node's first ``n_float`` inputs and its first output share one float dtype."""
    vals = node.inputs[:n_float]
    if len(vals) < n_float or not all(isinstance(v, Value) for v in vals) or not node.outputs:
        return False
    dt = node.outputs[0].dtype
    return dt in _FLOATS and all(v.dtype == dt for v in vals)


# --- generated sources ---------------------------------------------------------------------
_HEAD = 'import numpy as np\nfrom numba import njit\n\n\n@njit(cache=True, error_model="numpy")\n'


def _load(fname, body, **consts):
    """The numba function ``fname`` of ``body`` (its constants substituted), compiled once."""
    return kernels.load(fname, _HEAD + body.format(**consts))


class _Geom:
    """A convolution's or pool's geometry: every size but the batch, as source constants."""

    def __init__(self, c, h, w, kh, kw, sh, sw, pt, pl, dh, dw, oh, ow):
        self.c, self.h, self.w, self.kh, self.kw = c, h, w, kh, kw
        self.sh, self.sw, self.pt, self.pl, self.dh, self.dw, self.oh, self.ow = \
            sh, sw, pt, pl, dh, dw, oh, ow
        # the zero-padded image every window fits in
        self.hp = max(h + pt, (oh - 1) * sh + (kh - 1) * dh + 1)
        self.wp = max(w + pl, (ow - 1) * sw + (kw - 1) * dw + 1)

    def key(self):
        return tuple(sorted(vars(self).items()))

    def consts(self):
        d = dict(vars(self))
        d.update(P=self.oh * self.ow, K=self.c * self.kh * self.kw, HW=self.h * self.w,
                 CPP=self.c * self.hp * self.wp)
        return {k.upper(): v for k, v in d.items()}


_PATCHES = '''def patches(x):
    # eager's im2col (N*P, K), taps outermost: row (n*OH + y)*OW + q, column (i*KW + j)*C + c
    # holds x[n, c, y*SH - PT + i*DH, q*SW - PL + j*DW], zero outside the image
    n_ = x.shape[0]
    xp = np.zeros({CPP}, x.dtype)  # one sample, zero padded, channels last (the border stays 0)
    xf = np.ascontiguousarray(x).ravel()
    cf = np.empty(n_ * {P} * {K}, x.dtype)
    for n in range(n_):
        for c in range({C}):
            for y in range({H}):
                src = ((n * {C} + c) * {H} + y) * {W}
                dst = ((y + {PT}) * {WP} + {PL}) * {C} + c
                for q in range({W}):
                    xp[dst + q * {C}] = xf[src + q]
        for y in range({OH}):
            for q in range({OW}):
                rb = ((n * {OH} + y) * {OW} + q) * {K}
                for i in range({KH}):
                    for j in range({KW}):
                        src = ((y * {SH} + i * {DH}) * {WP} + q * {SW} + j * {DW}) * {C}
                        dst = rb + (i * {KW} + j) * {C}
                        for c in range({C}):
                            cf[dst + c] = xp[src + c]
    return cf.reshape(n_ * {P}, {K})
'''

_COL2IM = '''def col2im(cols):
    # the adjoint of patches: (N*P, K) tap values summed onto a (N, C, H, W) image; each pixel
    # takes its taps in (i, j) order, as eager's col2im adds them
    n_ = cols.shape[0] // {P}
    cf = np.ascontiguousarray(cols).ravel()
    img = np.empty((n_, {C}, {H}, {W}), cols.dtype)
    f = img.reshape(n_ * {C} * {HW})
    xp = np.empty({CPP}, cols.dtype)  # one sample, padded
    for n in range(n_):
        xp[:] = 0
        for i in range({KH}):
            for j in range({KW}):
                for y in range({OH}):
                    for q in range({OW}):
                        rb = ((n * {OH} + y) * {OW} + q) * {K} + i * {KW} + j
                        db = (y * {SH} + i * {DH}) * {WP} + q * {SW} + j * {DW}
                        for c in range({C}):
                            xp[db + c * ({HP} * {WP})] += cf[rb + c * ({KH} * {KW})]
        for c in range({C}):
            for y in range({H}):
                src = (c * {HP} + y + {PT}) * {WP} + {PL}
                dst = ((n * {C} + c) * {H} + y) * {W}
                for q in range({W}):
                    f[dst + q] = xp[src + q]
    return img
'''

_TO_NCHW = '''def to_nchw(r):
    # (N*P, O) rows -> contiguous (N, O, OH, OW)
    n_ = r.shape[0] // {P}
    rf = np.ascontiguousarray(r).ravel()
    out = np.empty((n_, {O}, {OH}, {OW}), r.dtype)
    f = out.reshape(n_ * {O} * {P})
    for n in range(n_):
        for k in range({P}):
            src = (n * {P} + k) * {O}
            for o in range({O}):
                f[(n * {O} + o) * {P} + k] = rf[src + o]
    return out
'''

_TO_CHANNELS = '''def to_channels(g):
    # (N, O, OH, OW) -> contiguous (O, N*P)
    n_ = g.shape[0]
    np_ = n_ * {P}
    gf = np.ascontiguousarray(g).ravel()
    out = np.empty({O} * np_, g.dtype)
    for o in range({O}):
        for n in range(n_):
            src = (n * {O} + o) * {P}
            dst = o * np_ + n * {P}
            for k in range({P}):
                out[dst + k] = gf[src + k]
    return out.reshape({O}, np_)
'''

_TO_ROWS = '''def to_rows(g):
    # (N, O, OH, OW) -> contiguous (N*P, O)
    n_ = g.shape[0]
    gf = np.ascontiguousarray(g).ravel()
    out = np.empty(n_ * {P} * {O}, g.dtype)
    for n in range(n_):
        for o in range({O}):
            src = (n * {O} + o) * {P}
            for k in range({P}):
                out[(n * {P} + k) * {O} + o] = gf[src + k]
    return out.reshape(n_ * {P}, {O})
'''


def _conv_geom(node, x_shape, w_shape, out_hw):
    """The ``_Geom`` of a groups-1 convolution node (x: (N, C, H, W), w: (O, C, KH, KW),
    output positions ``out_hw``), or None."""
    p = node.params
    if p.get("groups", 1) != 1 or len(x_shape) != 4 or len(w_shape) != 4 or \
            _pointwise(w_shape[2:], p["padding"], 1):  # eager's per-example product, no im2col
        return None
    (sh, sw), ((pt, _), (pl, _)), (dh, dw) = p["stride"], p["padding"], p["dilation"]
    ints = (x_shape[1], x_shape[2], x_shape[3], w_shape[2], w_shape[3], sh, sw, pt, pl, dh, dw,
            out_hw[0], out_hw[1])
    return _Geom(*(int(v) for v in ints))


# What one kernel made that a later node of the same graph needs again: conv2d's patches of
# a value (its conv2d_weight contracts the same patches), max_pool2d_indices's window maxima
# (its max_pool2d gathers exactly them). Factories run in program order while codegen walks
# the graph, so a consumer's factory that finds its value here comes after the producer in
# every call: what the kernel finds is this call's, for these very arrays (checked by
# identity; a value is not written in place while a later node reads it).
_SHARED = {}  # id(Value) -> (Value, geometry key, source Value, [made or None])


def _share(value, geom, source=None):
    """A slot for what the kernel computing ``value`` makes (geometry ``geom``, read from
    ``source``) for a later consumer."""
    if len(_SHARED) > 256:  # graphs with no consumer (inference) leave theirs
        _SHARED.clear()
    slot = [None, False]  # [what the producer made, whether a consumer took the slot]
    _SHARED[id(value)] = (value, None if geom is None else geom.key(), source, slot)
    return slot


def _shared(value, geom, source=None):
    """The slot ``_share`` made for ``value`` with the same geometry and source, taken once;
    else a slot nothing fills (the consumer computes its own)."""
    entry = _SHARED.pop(id(value), None)
    if entry is None or entry[0] is not value or (
            geom is not None and entry[1] != geom.key()) or entry[2] is not source:
        return [None, False]
    entry[3][1] = True  # the producer keeps what it makes only now (no consumer: no memory)
    return entry[3]


def _conv_kernels(geom, o, *names):
    k = dict(geom.consts(), O=o)
    src = {"patches": _PATCHES, "col2im": _COL2IM, "to_nchw": _TO_NCHW,
           "to_channels": _TO_CHANNELS, "to_rows": _TO_ROWS}
    return [_load(nm, src[nm], **k) for nm in names]


@op_kernels.register("conv2d")
def _conv2d(node):
    if not _floats(node, 2):
        return None
    x, w = node.inputs[:2]
    out = node.outputs[0].shape  # out_size (when given) is already in it
    geom = _conv_geom(node, x.shape, w.shape, out[2:])
    if geom is None:
        return None
    o = int(w.shape[0])
    patches, to_nchw = _conv_kernels(geom, o, "patches", "to_nchw")
    shared = _share(x, geom)

    def conv2d(x, w, **_):
        cols = patches(x)
        if shared[1]:
            shared[0] = (x, cols)  # one item store: a thread reads the pair whole
        return to_nchw(blas_matmul(cols, _tap_major(w, 1)[0].T))

    return conv2d


@op_kernels.register("conv2d_input")
def _conv2d_input(node):
    if not _floats(node, 2):
        return None
    g, w = node.inputs[:2]
    size = tuple(node.params["size"])
    if _by_correlation(node.params["stride"], w.shape[1] * node.params.get("groups", 1),
                       w.shape[0]):
        return _unit_stride_input(node, g, w, size)
    geom = _conv_geom(node, (0, w.shape[1]) + size, w.shape, g.shape[2:])
    if geom is None:
        return None
    o, k = int(w.shape[0]), geom.c * geom.kh * geom.kw
    to_rows, col2im = _conv_kernels(geom, o, "to_rows", "col2im")

    def conv2d_input(g, w, **_):
        return col2im(blas_matmul(to_rows(g), w.reshape(o, k)))

    return conv2d_input


def _unit_stride_input(node, g, w, size):
    """Eager's stride-1 input gradient: the correlation of ``g`` with the flipped kernel
    (``ops.convolution._unit_stride_input_grad``), its patches built here; None where eager
    first crops ``g`` (padding past the kernel's reach)."""
    (kh, kw), (dh, dw) = w.shape[2:], node.params["dilation"]
    ((pt, _), (pl, _)), (oh, ow) = node.params["padding"], g.shape[2:]
    top, left = dh * (kh - 1) - pt, dw * (kw - 1) - pl
    pads = (top, size[0] + dh * (kh - 1) - top - oh, left, size[1] + dw * (kw - 1) - left - ow)
    if min(pads) < 0 or node.params.get("groups", 1) != 1 or \
            _pointwise(w.shape[2:], node.params["padding"], 1):
        return None
    c, o = int(w.shape[1]), int(w.shape[0])
    geom = _Geom(*(int(v) for v in (o, oh, ow, kh, kw, 1, 1, top, left, dh, dw) + size))
    patches, to_nchw = _conv_kernels(geom, c, "patches", "to_nchw")

    def conv2d_input(g, w, **_):
        return to_nchw(blas_matmul(patches(g), _tap_major(_flipped(w, 1), 1)[0].T))

    return conv2d_input


@op_kernels.register("conv2d_weight")
def _conv2d_weight(node):
    if not _floats(node, 2):
        return None
    x, g = node.inputs[:2]
    kh, kw = node.params["kernel"]
    o = int(g.shape[1])
    geom = _conv_geom(node, x.shape, (o, x.shape[1], kh, kw), g.shape[2:])
    if geom is None:
        return None
    patches, to_channels = _conv_kernels(geom, o, "patches", "to_channels")
    shape = (o, geom.kh, geom.kw, geom.c)  # taps outermost, as eager's columns
    shared = _shared(x, geom)

    def conv2d_weight(x, g, **_):
        pair = shared[0]
        if pair is not None and pair[0] is x:  # this call's conv2d of x made them
            shared[0] = None
            cols = pair[1]
        else:
            cols = patches(x)
        gw = blas_matmul(to_channels(g), cols).reshape(shape).transpose(0, 3, 1, 2)
        return np.ascontiguousarray(gw)

    return conv2d_weight


_BIAS_SUM = '''def bias_sum(g):
    # (N, C, H, W) -> (1, C, 1, 1): each (n, c) plane summed as numpy's pairwise_sum sums one
    # inner loop, added to its channel's total in (n, c) order, as numpy's add.reduce over
    # axes (0, 2, 3) walks a contiguous array (bitwise where numpy takes that walk)
    n_ = g.shape[0]
    gf = np.ascontiguousarray(g).ravel()
    zero = np.zeros(1, g.dtype)
    out = np.zeros((1, {C}, 1, 1), g.dtype)
    f = out.reshape({C})
    for n in range(n_):
        for c in range({C}):
            f[c] += {SUM}
    return out


@njit(cache=True, error_model="numpy")
def block(a, s, n, z):
    # numpy's pairwise_sum below its block size (128): eight running sums
    if n < 8:
        r = z[0]
        for i in range(n):
            r += a[s + i]
        return r
    r0, r1, r2, r3 = a[s], a[s + 1], a[s + 2], a[s + 3]
    r4, r5, r6, r7 = a[s + 4], a[s + 5], a[s + 6], a[s + 7]
    i = 8
    while i < n - n % 8:
        r0 += a[s + i]
        r1 += a[s + i + 1]
        r2 += a[s + i + 2]
        r3 += a[s + i + 3]
        r4 += a[s + i + 4]
        r5 += a[s + i + 5]
        r6 += a[s + i + 6]
        r7 += a[s + i + 7]
        i += 8
    r = ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))
    while i < n:
        r += a[s + i]
        i += 1
    return r
'''


def _pairwise(start, n):
    """The source of numpy's pairwise sum of ``gf[start:start + n]`` (its recursion unrolled
    for a constant ``n``)."""
    if n <= 128:
        return f"block(gf, {start}, {n}, zero)"
    half = n // 2
    half -= half % 8
    return f"({_pairwise(start, half)} + {_pairwise(f'{start} + {half}', n - half)})"


@op_kernels.register("sum_to")
def _sum_to(node):
    """A convolution's bias gradient: (N, C, H, W) summed to (1, C, 1, 1)."""
    if not _floats(node, 1):
        return None
    shape = node.inputs[0].shape
    if len(shape) != 4 or tuple(node.params.get("shape", ())) != (1, shape[1], 1, 1):
        return None
    c, hw = int(shape[1]), int(shape[2] * shape[3])
    body = _BIAS_SUM.replace("{SUM}", _pairwise(f"(n * {c} + c) * {hw}", hw))
    fn = _load("bias_sum", body, C=c)
    from tapegrad.ops.movement import sum_to as eager

    def sum_to(g, **params):
        # numpy sums a strided gradient (one reaching the bias through a transpose) in the
        # order of its memory layout, not plane by plane: eager's op gives eager's bits
        return fn(g) if g.flags.c_contiguous else eager.forward(g, **params)

    return sum_to


# --- max-pooling ---------------------------------------------------------------------------
_POOL_INDICES = '''def pool_indices(x):
    # flat (row*W + column) index of each window's maximum (the first maximum, the last NaN
    # if the window holds one) and the value there, in one pass
    planes = x.shape[0] * x.shape[1]
    xf = np.ascontiguousarray(x).ravel()
    idx = np.empty((x.shape[0], x.shape[1], {OH}, {OW}), np.int64)
    vals = np.empty((x.shape[0], x.shape[1], {OH}, {OW}), x.dtype)
    f = idx.reshape(planes * {P})
    fv = vals.reshape(planes * {P})
    ninf = -np.inf
    for m in range(planes):
        base = m * {HW}
        for y in range({OH}):
            for q in range({OW}):
{BODY}
                fv[m * {P} + y * {OW} + q] = xf[base + f[m * {P} + y * {OW} + q]]
    return idx, vals
'''


def _pool_body(g, inside):
    """The unrolled, branch-free window scan of ``_POOL_INDICES`` (the maximum's compare is
    unpredictable). Windows inside the image track the best tap's offset from the window's
    corner; others read a padded position as -inf, and a window of only -inf keeps its first
    in-bounds row and column, as eager does."""
    pad = " " * 16
    take = f"{pad}t = (v > b) | (v != v)"  # every NaN takes over: the last NaN wins
    out = f"{pad}f[m * {g.oh * g.ow} + y * {g.ow} + q] = "
    lines = []
    if inside:
        lines.append(f"{pad}r0 = y * {g.sh * g.w} + q * {g.sw}")
        for t in range(g.kh * g.kw):
            i, j = divmod(t, g.kw)
            off = i * g.dh * g.w + j * g.dw
            lines.append(f"{pad}v = xf[base + r0 + {off}]")
            if t == 0:
                lines.append(f"{pad}b = v\n{pad}k = 0")
            else:
                lines += [take, f"{pad}b = v if t else b", f"{pad}k = {off} if t else k"]
        lines.append(out + "r0 + k")
        return "\n".join(lines)
    for t in range(g.kh * g.kw):
        i, j = divmod(t, g.kw)
        r, c = f"(y * {g.sh} + {i * g.dh - g.pt})", f"(q * {g.sw} + {j * g.dw - g.pl})"
        lines.append(f"{pad}v = np.float64(xf[base + {r} * {g.w} + {c}]) "
                     f"if (0 <= {r} < {g.h} and 0 <= {c} < {g.w}) else ninf")
        if t == 0:
            lines.append(f"{pad}b = v\n{pad}br = {r}\n{pad}bc = {c}")
        else:
            lines += [take, f"{pad}b = v if t else b", f"{pad}br = {r} if t else br",
                      f"{pad}bc = {c} if t else bc"]
    # a window of only -inf keeps its first in-bounds row and column (stepping by the
    # dilation from its corner), as eager and PyTorch do
    r0, c0 = f"(y * {g.sh} - {g.pt})", f"(q * {g.sw} - {g.pl})"
    lines += [f"{pad}if not (0 <= br < {g.h} and 0 <= bc < {g.w}):",
              f"{pad}    br = {r0} + ((max(-{r0}, 0) + {g.dh - 1}) // {g.dh}) * {g.dh}",
              f"{pad}    bc = {c0} + ((max(-{c0}, 0) + {g.dw - 1}) // {g.dw}) * {g.dw}"]
    lines.append(out + f"br * {g.w} + bc")
    return "\n".join(lines)


_POOL_GATHER = '''def pool_gather(x, idx):
    planes = x.shape[0] * x.shape[1]
    xf = np.ascontiguousarray(x).ravel()
    jf = np.ascontiguousarray(idx).ravel()
    out = np.empty((x.shape[0], x.shape[1], {OH}, {OW}), x.dtype)
    f = out.reshape(planes * {P})
    for m in range(planes):
        for k in range({P}):
            f[m * {P} + k] = xf[m * {HW} + jf[m * {P} + k]]
    return out
'''

_POOL_SCATTER = '''def pool_scatter(g, idx):
    # adds in eager's order (plane by plane, positions in order), so repeated indices of
    # overlapping windows sum as eager's add.at does
    planes = g.shape[0] * g.shape[1]
    gf = np.ascontiguousarray(g).ravel()
    jf = np.ascontiguousarray(idx).ravel()
    out = np.zeros((g.shape[0], g.shape[1], {H}, {W}), g.dtype)
    f = out.reshape(planes * {HW})
    for m in range(planes):
        for k in range({P}):
            f[m * {HW} + jf[m * {P} + k]] += gf[m * {P} + k]
    return out
'''


@op_kernels.register("max_pool2d_indices")
def _max_pool2d_indices(node):
    x = node.inputs[0] if node.inputs else None
    if not isinstance(x, Value) or x.dtype not in _FLOATS or len(x.shape) != 4:
        return None
    p = node.params
    (kh, kw), (sh, sw), (ph, pw), (dh, dw), (oh, ow) = (
        p["kernel"], p["stride"], p["padding"], p["dilation"], p["out_size"])
    g = _Geom(*(int(v) for v in (1, x.shape[2], x.shape[3], kh, kw, sh, sw, ph, pw, dh, dw,
                                 oh, ow)))
    inside = g.pt == g.pl == 0 and (g.oh - 1) * g.sh + (g.kh - 1) * g.dh < g.h and \
        (g.ow - 1) * g.sw + (g.kw - 1) * g.dw < g.w
    fn = _load("pool_indices", _POOL_INDICES.replace("{BODY}", _pool_body(g, inside)),
               **g.consts())
    shared = _share(node.outputs[0], g, x)

    def max_pool2d_indices(x, **_):
        idx, vals = fn(x)
        if shared[1]:
            shared[0] = (idx, vals, x)  # this call's max_pool2d(x, idx): no second pass
        return idx

    return max_pool2d_indices


def _pool_geom(x_shape, out_shape, idx):
    """The planes' geometry of a gather or scatter at int64 window indices ``idx``, or None."""
    if len(x_shape) != 4 or len(out_shape) != 4 or not isinstance(idx, Value) or \
            idx.dtype != np.int64 or idx.shape != tuple(out_shape):
        return None
    return _Geom(1, int(x_shape[2]), int(x_shape[3]), 1, 1, 1, 1, 0, 0, 1, 1,
                 int(out_shape[2]), int(out_shape[3]))


@op_kernels.register("max_pool2d")
def _max_pool2d(node):
    if not _floats(node, 1) or len(node.inputs) != 2:
        return None
    g = _pool_geom(node.inputs[0].shape, node.outputs[0].shape, node.inputs[1])
    if g is None:
        return None
    fn = _load("pool_gather", _POOL_GATHER, **g.consts())
    shared = _shared(node.inputs[1], None, node.inputs[0])

    def max_pool2d(x, idx, **_):
        made = shared[0]
        if made is not None and made[0] is idx and made[2] is x:  # max_pool2d_indices's
            shared[0] = None
            return made[1]
        return fn(x, idx)

    return max_pool2d


@op_kernels.register("max_pool2d_backward")
def _max_pool2d_backward(node):
    size = node.params.get("size")
    if not _floats(node, 1) or size is None or len(node.inputs) != 2:
        return None
    g = _pool_geom(size, node.inputs[0].shape, node.inputs[1])
    if g is None:
        return None
    fn = _load("pool_scatter", _POOL_SCATTER, **g.consts())

    def max_pool2d_backward(g, idx, **_):
        return fn(g, idx)

    return max_pool2d_backward
