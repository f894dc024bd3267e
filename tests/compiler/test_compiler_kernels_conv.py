"""compiler/kernels_conv.py (convolution and max-pool numba kernels): each kernel against its
op's numpy forward (the gradients' ops for conv2d_input/conv2d_weight/max_pool2d_backward) on
random geometries in float32 and float64, factories declining what they do not compute (the
op's forward then runs), and the compiled digits-CNN training step (numba backend) against
eager over 100 steps."""
import math

import numpy as np
import pytest

pytest.importorskip("numba")

import tapegrad  # noqa: E402
from tapegrad.compiler import kernels_conv, op_kernels  # noqa: E402
from tapegrad.compiler.ir import Node, Value  # noqa: E402
from tapegrad.ops import nn as N  # noqa: E402

DTYPES = [np.float64, np.float32]


def _node(name, inputs, params, out_shape, dtype=None):
    vals = [Value(f"in{i}", a.shape, a.dtype) for i, a in enumerate(inputs)]
    dtype = inputs[0].dtype if dtype is None else dtype
    return Node(None, name, vals, params, [Value("out", tuple(out_shape), np.dtype(dtype))])


def _kernel(name, inputs, params, out_shape):
    fn = op_kernels.lookup(_node(name, inputs, params, out_shape))
    assert fn is not None, name
    return fn


def _close(got, want, dtype):
    """float64 within 1e-12 of eager, float32 within float32 rounding (summation order)."""
    assert got.dtype == want.dtype == dtype and got.shape == want.shape
    assert got.flags.c_contiguous
    scale = max(1.0, float(np.abs(want).max(initial=0.0)))
    tol = 1e-12 if dtype == np.float64 else 2e-5
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol * scale)


def _out(n, k, pad, s, d):
    return (n + pad - d * (k - 1) - 1) // s + 1


# N, C, H, W, O, (KH, KW), stride, ((top, bottom), (left, right)), dilation
CONVS = [
    (64, 1, 8, 8, 16, (3, 3), (1, 1), ((1, 1), (1, 1)), (1, 1)),  # the digits CNN's conv1
    (64, 16, 4, 4, 32, (3, 3), (1, 1), ((1, 1), (1, 1)), (1, 1)),  # and its conv2
    (3, 5, 9, 7, 4, (3, 2), (2, 1), ((1, 0), (2, 1)), (1, 1)),  # odd sizes, asymmetric
    (2, 3, 11, 10, 6, (3, 3), (2, 3), ((0, 0), (0, 0)), (2, 1)),  # dilation, floor rows
    (1, 2, 5, 5, 3, (5, 5), (1, 1), ((2, 2), (2, 2)), (1, 1)),  # batch 1, kernel = image
    (0, 3, 6, 6, 4, (3, 3), (1, 1), ((1, 1), (1, 1)), (1, 1)),  # an empty batch
    (2, 4, 7, 6, 5, (1, 1), (3, 2), ((1, 0), (0, 0)), (1, 1)),  # 1x1, strided, padded
    (2, 3, 7, 6, 4, (2, 2), (2, 2), ((0, 0), (0, 0)), (1, 1)),  # kernel = stride: no overlap
    (2, 3, 6, 7, 4, (3, 2), (1, 1), ((2, 0), (1, 1)), (2, 1)),  # stride 1, dilated, asymmetric
]


def _conv_case(case, dtype, seed):
    n, c, h, w, o, (kh, kw), stride, padding, dilation = case
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, c, h, w)).astype(dtype)
    wt = rng.standard_normal((o, c, kh, kw)).astype(dtype)
    oh = _out(h, kh, sum(padding[0]), stride[0], dilation[0])
    ow = _out(w, kw, sum(padding[1]), stride[1], dilation[1])
    g = rng.standard_normal((n, o, oh, ow)).astype(dtype)
    p = dict(stride=stride, padding=padding, dilation=dilation, groups=1)
    return x, wt, g, p


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", range(len(CONVS)))
def test_conv_kernels_match_eager_forward_and_gradients(dtype, case):
    x, w, g, p = _conv_case(CONVS[case], dtype, case)
    fwd = _kernel("conv2d", [x, w], p, g.shape)
    _close(fwd(x, w, **p), N.conv2d.forward(x, w, **p), dtype)
    gx = _kernel("conv2d_input", [g, w], dict(p, size=x.shape[2:]), x.shape)
    _close(gx(g, w, size=x.shape[2:], **p), N.conv2d_input.forward(g, w, size=x.shape[2:], **p),
           dtype)
    gw = _kernel("conv2d_weight", [x, g], dict(p, kernel=w.shape[2:]), w.shape)
    _close(gw(x, g, kernel=w.shape[2:], **p),
           N.conv2d_weight.forward(x, g, kernel=w.shape[2:], **p), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_conv_kernel_out_size_and_non_contiguous_operands(dtype):
    """conv2d with ``out_size`` (conv_transpose2d's adjoint keeps the leading rows) and
    operands that are transposed views."""
    x, w, _, p = _conv_case((3, 4, 9, 8, 5, (3, 3), (2, 2), ((1, 1), (1, 1)), (1, 1)), dtype, 7)
    p = dict(p, out_size=(4, 3))
    fwd = _kernel("conv2d", [x, w], p, (3, 5, 4, 3))
    _close(fwd(x, w, **p), N.conv2d.forward(x, w, **p), dtype)
    xt = np.ascontiguousarray(x.transpose(0, 1, 3, 2)).transpose(0, 1, 3, 2)  # F-ish strides
    assert not xt.flags.c_contiguous
    _close(fwd(xt, w, **p), N.conv2d.forward(x, w, **p), dtype)
    g = np.random.default_rng(1).standard_normal((5, 3, 4, 3)).astype(dtype).transpose(1, 0, 2, 3)
    q = {k: v for k, v in p.items() if k != "out_size"}
    gw = _kernel("conv2d_weight", [x, g], dict(q, kernel=(3, 3)), w.shape)
    _close(gw(x, g, kernel=(3, 3), **q), N.conv2d_weight.forward(x, g, kernel=(3, 3), **q),
           dtype)
    gx = _kernel("conv2d_input", [g, w], dict(q, size=(9, 8)), x.shape)
    _close(gx(g, w, size=(9, 8), **q), N.conv2d_input.forward(g, w, size=(9, 8), **q), dtype)


# N, C, H, W, kernel, stride, padding, dilation, ceil_mode
POOLS = [
    (64, 16, 8, 8, (2, 2), (2, 2), (0, 0), (1, 1), False),  # the digits CNN's pools
    (64, 32, 4, 4, (2, 2), (2, 2), (0, 0), (1, 1), False),
    (2, 3, 7, 9, (3, 2), (2, 2), (1, 1), (1, 1), False),  # padding, odd sizes
    (2, 3, 7, 7, (2, 2), (2, 2), (0, 0), (1, 1), True),  # ceil mode: last windows overhang
    (1, 2, 9, 8, (3, 3), (1, 2), (1, 0), (2, 1), False),  # overlapping, dilated
    (3, 2, 5, 5, (3, 3), (2, 2), (1, 1), (1, 1), True),
    (0, 2, 4, 4, (2, 2), (2, 2), (0, 0), (1, 1), False),  # an empty batch
    (2, 1, 7, 6, (2, 2), (2, 2), (0, 0), (1, 1), False),  # floor: a row of no window
]


def _pool_params(case):
    n, c, h, w, kernel, stride, padding, dilation, ceil = case
    out = []
    for size, k, s, pad, d in zip((h, w), kernel, stride, padding, dilation):
        span = size + 2 * pad - d * (k - 1) - 1
        o = (-(-span // s) if ceil else span // s) + 1
        if ceil and (o - 1) * s >= size + pad:  # PyTorch: the last window starts inside
            o -= 1
        out.append(o)
    return dict(kernel=kernel, stride=stride, padding=padding, dilation=dilation,
                out_size=tuple(out))


def _pool_inputs(case, dtype, seed):
    n, c, h, w = case[:4]
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, c, h, w)).astype(dtype)
    if x.size:
        x[..., 0, :] = np.maximum(x[..., 0, :], 0)  # ties (zeros) in the first rows
        x.reshape(-1)[rng.integers(0, x.size, 5)] = np.nan  # NaN wins, the first one
        x.reshape(-1)[rng.integers(0, x.size, 5)] = -np.inf
        x.reshape(-1)[rng.integers(0, x.size, 3)] = np.inf
        x[0, 0] = -np.inf  # a whole plane of -inf: every window's first in-bounds element
        x[0, -1, 1::2] = 1.0  # exact ties across a window
    return x


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", range(len(POOLS)))
def test_pool_kernels_are_eager_exactly(dtype, case):
    x = _pool_inputs(POOLS[case], dtype, case)
    p = _pool_params(POOLS[case])
    out_shape = x.shape[:2] + p["out_size"]
    got = _kernel("max_pool2d_indices", [x], p, out_shape)(x, **p)
    want = N.max_pool2d_indices.forward(x, **p)
    assert got.dtype == want.dtype == np.int64 and np.array_equal(got, want)
    vals = _kernel("max_pool2d", [x, want], {}, out_shape)(x, want)
    assert vals.dtype == dtype
    np.testing.assert_array_equal(vals, N.max_pool2d.forward(x, want))  # NaN == NaN here
    g = np.random.default_rng(case).standard_normal(out_shape).astype(dtype)
    back = _kernel("max_pool2d_backward", [g, want], {"size": x.shape}, x.shape)
    got_b, want_b = back(g, want, size=x.shape), N.max_pool2d_backward.forward(g, want, x.shape)
    assert got_b.dtype == dtype and np.array_equal(got_b, want_b)  # overlaps add in order


def test_pool_indices_agree_with_pytorch_on_nan_and_ties():
    torch = pytest.importorskip("torch")
    x = _pool_inputs(POOLS[4], np.float64, 3)
    # (not the all -inf plane: with padding and dilation eager clips a padded row to row 0,
    # outside the window, where PyTorch takes the window's first in-bounds element)
    x[0, 0] = np.random.default_rng(4).standard_normal(x.shape[2:])
    p = _pool_params(POOLS[4])
    got = _kernel("max_pool2d_indices", [x], p, x.shape[:2] + p["out_size"])(x, **p)
    _, want = torch.nn.functional.max_pool2d(torch.tensor(x), p["kernel"], p["stride"],
                                             p["padding"], p["dilation"], return_indices=True)
    assert np.array_equal(got, want.numpy())



@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(64, 16, 8, 8), (64, 32, 4, 4), (3, 5, 7, 9), (2, 3, 20, 20),
                                   (2, 3, 1, 1), (1, 4, 13, 11), (0, 3, 4, 4)])
def test_bias_gradient_kernel_is_eager_bitwise(dtype, shape):
    """sum_to (N, C, H, W) -> (1, C, 1, 1), numpy's pairwise sums per plane in numpy's order
    (bitwise here; the recursion above 128 elements included)."""
    from tapegrad.ops.movement import sum_to

    g = np.random.default_rng(sum(shape)).standard_normal(shape).astype(dtype) * 3 + 0.25
    params = {"shape": (1, shape[1], 1, 1)}
    got = _kernel("sum_to", [g], params, params["shape"])(g, **params)
    want = sum_to.forward(g, **params)
    assert got.dtype == want.dtype == dtype and got.shape == want.shape
    assert np.array_equal(got, want)

def test_factories_decline_what_they_do_not_compute():
    x = np.ones((2, 4, 5, 5))
    w = np.ones((6, 2, 3, 3))
    p = dict(stride=(1, 1), padding=((1, 1), (1, 1)), dilation=(1, 1), groups=2)
    assert op_kernels.lookup(_node("conv2d", [x, w], p, (2, 6, 5, 5))) is None  # groups
    # 1x1 with no padding: eager's per-example product (no im2col) is the faster, and its
    # bits are what the compiled step must reproduce
    p0 = dict(p, padding=((0, 0), (0, 0)), groups=1, stride=(2, 2))
    w11, g11 = np.ones((6, 4, 1, 1)), np.ones((2, 6, 3, 3))
    assert op_kernels.lookup(_node("conv2d", [x, w11], p0, (2, 6, 3, 3))) is None
    assert op_kernels.lookup(_node("conv2d_input", [g11, w11], dict(p0, size=(5, 5)),
                                   x.shape)) is None
    assert op_kernels.lookup(_node("conv2d_weight", [x, g11], dict(p0, kernel=(1, 1)),
                                   w11.shape)) is None
    # a stride-1 input gradient whose forward padding passed the kernel's reach: eager crops
    # the gradient first
    g = np.ones((2, 6, 9, 7))
    p3 = dict(p, padding=((3, 3), (2, 2)), groups=1)
    w1 = np.ones((6, 4, 3, 3))
    assert op_kernels.lookup(_node("conv2d_input", [g, w1], dict(p3, size=(5, 5)),
                                   x.shape)) is None
    assert op_kernels.lookup(_node("conv2d", [x, w1], p3, g.shape)) is not None
    p1 = dict(p, groups=1)
    w1 = np.ones((6, 4, 3, 3))
    assert op_kernels.lookup(_node("conv2d", [x, w1.astype(np.float32)], p1,
                                   (2, 6, 5, 5))) is None  # mixed dtypes
    xi = x.astype(np.int64)
    assert op_kernels.lookup(_node("conv2d", [xi, w1.astype(np.int64)], p1,
                                   (2, 6, 5, 5))) is None  # integers
    assert op_kernels.lookup(_node("conv2d", [x.astype(np.float16), w1.astype(np.float16)], p1,
                                   (2, 6, 5, 5))) is None  # half precision
    pp = dict(kernel=(2, 2), stride=(2, 2), padding=(0, 0), dilation=(1, 1), out_size=(2, 2))
    assert op_kernels.lookup(_node("max_pool2d_indices", [xi], pp, (2, 4, 2, 2),
                                   np.int64)) is None
    assert op_kernels.lookup(_node("max_pool2d_indices", [x[0]], pp, (4, 2, 2),
                                   np.int64)) is None  # not (N, C, H, W)
    idx32 = np.zeros((2, 4, 2, 2), np.int32)  # window indices that are not eager's int64
    assert op_kernels.lookup(_node("max_pool2d", [x, idx32], {}, (2, 4, 2, 2))) is None
    assert op_kernels.lookup(_node("max_pool2d_backward", [np.ones((2, 4, 2, 2)), idx32],
                                   {"size": x.shape}, x.shape)) is None
    for shape in [(1, 4, 5, 1), (4, 1, 1), (1, 1, 1, 1), (2, 4, 1, 1)]:  # not a bias's
        assert op_kernels.lookup(_node("sum_to", [x], {"shape": shape}, shape)) is None
    assert op_kernels.lookup(_node("sum_to", [xi], {"shape": (1, 4, 1, 1)},
                                   (1, 4, 1, 1))) is None


def _losses(build, data, steps, compiled, lr=1e-2):
    tapegrad.manual_seed(0)
    model = build()
    opt = tapegrad.optim.Adam(model.parameters(), lr=lr)
    F = tapegrad.nn.functional

    def step(x, y):
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss.item()

    fn = tapegrad.compile(step) if compiled else step
    return [fn(*data[i % len(data)]) for i in range(steps)], fn


def test_declined_grouped_conv_compiles_correctly(monkeypatch):
    """A grouped convolution's nodes run their ops' forwards in the compiled step (the pool
    after it still takes its kernel); losses agree with eager."""
    monkeypatch.setenv("TAPEGRAD_COMPILE_KERNELS", "numba")
    nn = tapegrad.nn

    def build():
        return nn.Sequential(nn.Conv2d(4, 6, 3, padding=1, groups=2), nn.ReLU(),
                             nn.MaxPool2d(2), nn.Flatten(), nn.Linear(6 * 3 * 3, 3)).double()

    rng = np.random.default_rng(0)
    data = [(tapegrad.tensor(rng.standard_normal((5, 4, 6, 7))), tapegrad.tensor(
        rng.integers(0, 3, 5))) for _ in range(3)]
    want, _ = _losses(build, data, 12, False)
    got, fn = _losses(build, data, 12, True)
    src = fn.entries[-1].source
    assert "max_pool2d_indices_kernel" in src and "conv2d_kernel" not in src
    assert "conv2d_weight(" in src  # the op's forward
    rel = max(abs(a - b) / abs(b) for a, b in zip(got, want))
    assert rel <= 1e-12, rel


def _cnn_losses(dtype, n_steps, compiled):
    from tapegrad.bench import models as M
    from tapegrad.bench.compile import _model_step

    state, batches = M.initial_state("cnn"), M.make_data("cnn", 8)
    S = M.Step(tapegrad, "cnn", state, batches, dtype)
    if not compiled:
        return [S() for _ in range(n_steps)], None
    fn = tapegrad.compile(_model_step(S))
    return [fn(*S._batch()) for _ in range(n_steps)], fn


@pytest.mark.parametrize("dtype", DTYPES)
def test_compiled_cnn_step_with_conv_kernels_matches_eager_over_100_steps(monkeypatch, dtype):
    monkeypatch.setenv("TAPEGRAD_COMPILE_KERNELS", "numba")
    want, _ = _cnn_losses(dtype, 100, compiled=False)
    got, fn = _cnn_losses(dtype, 100, compiled=True)
    src = fn.entries[-1].source
    for name in ("conv2d_kernel", "conv2d_input_kernel", "conv2d_weight_kernel",
                 "max_pool2d_indices_kernel", "max_pool2d_kernel", "max_pool2d_backward_kernel",
                 "sum_to_kernel"):
        assert name in src, name
    assert fn.n_hits >= 98 and not fn.breaks
    assert all(math.isfinite(v) for v in got)
    assert len(set(got)) > 90  # each call's own loss, not a value kept from the trace
    rel = max(abs(a - b) / abs(b) for a, b in zip(got, want))
    assert rel <= (1e-12 if dtype == np.float64 else 1e-4), rel
    assert want[-1] < want[0] - 1.0  # it trains


def test_numpy_backend_does_not_use_the_kernels(monkeypatch):
    monkeypatch.setenv("TAPEGRAD_COMPILE_KERNELS", "numpy")
    want, _ = _cnn_losses(np.float64, 6, compiled=False)
    got, fn = _cnn_losses(np.float64, 6, compiled=True)
    src = fn.entries[-1].source
    assert "conv2d_kernel" not in src and "max_pool2d_indices_kernel" not in src
    assert got == want  # numpy's kernels: eager's computation, bitwise


def test_kernel_sources_are_specialised_per_geometry():
    """Two geometries, two kernels; the same geometry again, the same compiled function."""
    x = np.ones((2, 3, 6, 6))
    w = np.ones((4, 3, 3, 3))
    p = dict(stride=(1, 1), padding=((1, 1), (1, 1)), dilation=(1, 1), groups=1)
    g1 = kernels_conv._conv_geom(_node("conv2d", [x, w], p, (2, 4, 6, 6)), x.shape, w.shape,
                                 (6, 6))
    g2 = kernels_conv._conv_geom(_node("conv2d", [x, w], dict(p, stride=(2, 2)), (2, 4, 3, 3)),
                                 x.shape, w.shape, (3, 3))
    a, = kernels_conv._conv_kernels(g1, 4, "patches")
    b, = kernels_conv._conv_kernels(g2, 4, "patches")
    c, = kernels_conv._conv_kernels(g1, 4, "patches")
    assert a is c and a is not b
    assert a(x).shape == (72, 27) and b(x).shape == (18, 27)  # (N*OH*OW, C*KH*KW)


@pytest.mark.parametrize("dtype", DTYPES)
def test_weight_gradient_reuses_the_forward_patches_of_the_same_array_only(dtype):
    """conv2d_weight of the value a conv2d read earlier in the graph takes that call's patches
    (once); another array, or a second call without a conv2d before it, computes its own."""
    x, w, g, p = _conv_case(CONVS[2], dtype, 11)
    xv = Value("x", x.shape, x.dtype)
    fwd_node = Node(None, "conv2d", [xv, Value("w", w.shape, w.dtype)], p,
                    [Value("y", g.shape, x.dtype)])
    wp = dict(p, kernel=w.shape[2:])
    wgt_node = Node(None, "conv2d_weight", [xv, Value("g", g.shape, g.dtype)], wp,
                    [Value("gw", w.shape, x.dtype)])
    fwd, wgt = op_kernels.lookup(fwd_node), op_kernels.lookup(wgt_node)
    want = N.conv2d_weight.forward(x, g, **wp)
    fwd(x, w, **p)
    _close(wgt(x, g, **wp), want, dtype)  # the forward's patches
    x2 = x * 2
    fwd(x, w, **p)
    _close(wgt(x2, g, **wp), N.conv2d_weight.forward(x2, g, **wp), dtype)  # not x's patches
    fwd(x2, w, **p)
    _close(wgt(x2, g, **wp), N.conv2d_weight.forward(x2, g, **wp), dtype)
    x2 *= 3  # the same array, written after its forward: no conv2d ran in between
    _close(wgt(x2, g, **wp), N.conv2d_weight.forward(x2, g, **wp), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_pool_values_come_from_the_indices_pass_for_the_same_arrays_only(dtype):
    """max_pool2d after its graph's max_pool2d_indices returns the maxima that pass found
    (eager's gather, bitwise); for another input (double backward's gather of a gradient at
    the same indices) it gathers."""
    case = POOLS[2]
    x = _pool_inputs(case, dtype, 5)
    p = _pool_params(case)
    out_shape = x.shape[:2] + p["out_size"]
    xv = Value("x", x.shape, x.dtype)
    iv = Value("i", out_shape, np.int64)
    ind = op_kernels.lookup(Node(None, "max_pool2d_indices", [xv], p, [iv]))
    gat = op_kernels.lookup(Node(None, "max_pool2d", [xv, iv], {},
                                 [Value("v", out_shape, x.dtype)]))
    idx = ind(x, **p)
    vals = gat(x, idx)
    np.testing.assert_array_equal(vals, N.max_pool2d.forward(x, idx))
    assert gat(x, idx) is not vals  # taken once; the second call gathers
    np.testing.assert_array_equal(gat(x, idx), vals)
    gg = np.random.default_rng(0).standard_normal(x.shape).astype(dtype)
    ind(x, **p)
    np.testing.assert_array_equal(gat(gg, idx), N.max_pool2d.forward(gg, idx))


def test_a_producer_without_consumer_keeps_nothing():
    """An inference graph (conv2d, pooling, no gradient nodes after them) holds no patches
    or maxima between calls."""
    x, w, g, p = _conv_case(CONVS[2], np.float64, 3)
    xv = Value("x", x.shape, x.dtype)
    fwd = op_kernels.lookup(Node(None, "conv2d", [xv, Value("w", w.shape, w.dtype)], p,
                                 [Value("y", g.shape, x.dtype)]))
    _close(fwd(x, w, **p), N.conv2d.forward(x, w, **p), np.float64)
    assert kernels_conv._SHARED[id(xv)][3][0] is None
    pp = _pool_params(POOLS[2])
    xp = _pool_inputs(POOLS[2], np.float64, 1)
    iv = Value("i", xp.shape[:2] + pp["out_size"], np.int64)
    ind = op_kernels.lookup(Node(None, "max_pool2d_indices", [Value("x", xp.shape, xp.dtype)],
                                 pp, [iv]))
    np.testing.assert_array_equal(ind(xp, **pp), N.max_pool2d_indices.forward(xp, **pp))
    assert kernels_conv._SHARED[id(iv)][3][0] is None


@pytest.mark.parametrize("dtype", DTYPES)
def test_bias_gradient_kernel_of_a_strided_gradient_is_eager_bitwise(dtype):
    """A gradient that reaches the bias through a transpose (a patch embedding's
    ``flatten(2).transpose(1, 2)``) is strided: numpy sums it in its memory order."""
    from tapegrad.ops.movement import sum_to

    rows = np.random.default_rng(5).standard_normal((16, 16, 48)).astype(dtype)
    g = rows.transpose(0, 2, 1).reshape(16, 48, 4, 4)  # a view, not C-contiguous
    assert not g.flags.c_contiguous
    params = {"shape": (1, 48, 1, 1)}
    got = _kernel("sum_to", [g], params, params["shape"])(g, **params)
    assert np.array_equal(got, sum_to.forward(g, **params))


def test_compiled_patch_embedding_step_is_eager_bitwise(monkeypatch):
    monkeypatch.setenv("TAPEGRAD_COMPILE_KERNELS", "numba")
    rng = np.random.default_rng(0)
    x = tapegrad.tensor(rng.standard_normal((16, 3, 16, 16)))
    w = tapegrad.tensor(rng.standard_normal((16, 16, 48)))

    def run(compiled):
        tapegrad.manual_seed(0)
        conv = tapegrad.nn.Conv2d(3, 48, 4, stride=4).double()
        opt = tapegrad.optim.SGD(conv.parameters(), lr=0.01)

        def step(x, w):
            opt.zero_grad()
            loss = (conv(x).flatten(2).transpose(1, 2) * w).sum()
            loss.backward()
            opt.step()
            return loss

        step = tapegrad.compile(step) if compiled else step
        losses = [float(step(x, w)) for _ in range(5)]  # calls 3-5 run generated code
        return losses, conv.weight.detach().numpy(), conv.bias.detach().numpy()

    for a, b in zip(run(False), run(True)):
        assert np.array_equal(a, b)
