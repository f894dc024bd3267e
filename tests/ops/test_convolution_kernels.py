"""ops/convolution.py's kernel choices, each against PyTorch: the im2col GEMM (groups 1 and
grouped), the 1x1 products with no im2col, the unit-stride input gradient as a correlation
with the flipped kernel, the no-overlap tiling (ConvTranspose2d(k, stride=k)), col2im, and the
numba depthwise loops and their numpy fallback. Forward and both gradients in float64 (1e-12
relative, as every op's PyTorch check) and float32, odd geometries, empty batches,
non-contiguous operands; second order through the rules (``check_op``)."""
import numpy as np
import pytest
import torch
from helpers import TESTS, check_op

import tapegrad
from tapegrad.ops import convolution as conv

# N, C, H, W, O, (KH, KW), stride, (pad_h, pad_w), dilation, groups -- and the path it takes
CASES = [
    ((2, 3, 7, 6, 4, (3, 3), (1, 1), (1, 1), (1, 1), 1), "gemm, unit stride"),
    ((2, 4, 9, 7, 6, (3, 2), (2, 1), (1, 0), (1, 1), 1), "gemm, asymmetric, strided"),
    ((2, 3, 11, 10, 5, (3, 3), (2, 3), (0, 2), (2, 1), 1), "gemm, dilated, floor rows"),
    ((2, 3, 6, 6, 4, (3, 3), (1, 1), (3, 2), (1, 1), 1), "padding past the kernel's reach"),
    ((2, 2, 6, 5, 8, (3, 2), (1, 1), (1, 0), (1, 2), 1), "unit stride, C <= O/4: col2im"),
    ((2, 4, 6, 5, 16, (3, 3), (1, 1), (2, 1), (1, 1), 2), "grouped, C <= O/4: col2im"),
    ((2, 6, 7, 7, 4, (3, 3), (1, 1), (1, 1), (1, 1), 2), "grouped gemm"),
    ((2, 6, 8, 7, 9, (3, 3), (2, 2), (1, 1), (1, 2), 3), "grouped, strided, dilated"),
    ((2, 5, 6, 7, 8, (1, 1), (1, 1), (0, 0), (1, 1), 1), "1x1"),
    ((3, 4, 7, 6, 3, (1, 1), (2, 3), (0, 0), (1, 1), 1), "1x1 strided, P < O"),
    ((2, 4, 5, 5, 2, (1, 1), (1, 1), (1, 0), (1, 1), 1), "1x1 padded: gemm"),
    ((2, 4, 6, 6, 4, (1, 1), (1, 1), (0, 0), (1, 1), 2), "1x1 grouped: gemm"),
    ((2, 5, 8, 7, 5, (3, 3), (1, 1), (1, 1), (1, 1), 5), "depthwise"),
    ((2, 4, 9, 8, 4, (3, 2), (2, 3), (1, 2), (2, 1), 4), "depthwise strided, dilated"),
    ((1, 3, 6, 6, 6, (3, 3), (1, 1), (1, 1), (1, 1), 3), "channel multiplier 2: gemm"),
    ((2, 3, 8, 6, 4, (2, 2), (2, 2), (0, 0), (1, 1), 1), "kernel = stride: tiling"),
    ((2, 4, 9, 9, 4, (2, 1), (3, 2), (1, 0), (1, 1), 2), "kernel < stride, grouped"),
    ((0, 3, 6, 6, 4, (3, 3), (1, 1), (1, 1), (1, 1), 1), "empty batch"),
    ((0, 4, 6, 6, 4, (3, 3), (2, 2), (1, 1), (1, 1), 4), "empty batch, depthwise"),
    ((0, 4, 6, 6, 3, (1, 1), (1, 1), (0, 0), (1, 1), 1), "empty batch, 1x1"),
]
DTYPES = [np.float64, np.float32]


def _torch_conv(case, x, w, g):
    stride, pad, dil, groups = case[6:]
    tx = torch.tensor(x, requires_grad=True)
    tw = torch.tensor(w, requires_grad=True)
    out = torch.nn.functional.conv2d(tx, tw, stride=stride, padding=pad, dilation=dil,
                                     groups=groups)
    out.backward(torch.tensor(g))
    return out.detach().numpy(), tx.grad.numpy(), tw.grad.numpy()


def _close(got, want, dtype):
    """float64: 1e-12 relative to the result's scale (the check every op meets); float32:
    a few units of float32 rounding of sums over at most a few hundred terms."""
    assert got.dtype == dtype and got.shape == want.shape
    assert got.flags.c_contiguous
    scale = max(1.0, float(np.abs(want).max(initial=0.0)))
    tol = 1e-12 if dtype == np.float64 else 1e-5
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol * scale)


def _ops(case, x, w, g):
    h, wd, _, k, stride, pad, dil, groups = case[2:]
    p = dict(stride=stride, padding=((pad[0], pad[0]), (pad[1], pad[1])), dilation=dil,
             groups=groups)
    return (conv.conv2d.forward(x, w, **p),
            conv.conv2d_input.forward(g, w, size=(h, wd), **p),
            conv.conv2d_weight.forward(x, g, kernel=k, **p))


def _arrays(case, dtype, seed=0):
    n, c, h, wd, o, (kh, kw), stride, pad, dil, groups = case
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, c, h, wd)).astype(dtype)
    w = rng.standard_normal((o, c // groups, kh, kw)).astype(dtype)
    oh = (h + 2 * pad[0] - dil[0] * (kh - 1) - 1) // stride[0] + 1
    ow = (wd + 2 * pad[1] - dil[1] * (kw - 1) - 1) // stride[1] + 1
    g = rng.standard_normal((n, o, oh, ow)).astype(dtype)
    return x, w, g


@pytest.fixture(params=["numba", "numpy"])
def loops(request, monkeypatch):
    """Each case with the numba depthwise loops (where numba imports) and without them."""
    if request.param == "numba":
        pytest.importorskip("numba")
        monkeypatch.setattr(conv, "_loops", None)
    else:
        monkeypatch.setattr(conv, "_loops", False)
    return request.param


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case,path", CASES, ids=[c[1] for c in CASES])
def test_forward_and_both_gradients_match_pytorch(case, path, dtype, loops):
    x, w, g = _arrays(case, dtype)
    for got, want in zip(_ops(case, x, w, g), _torch_conv(case, x, w, g)):
        _close(got, want, dtype)


@pytest.mark.parametrize("case,path", [CASES[1], CASES[5], CASES[6], CASES[11]],
                         ids=["gemm", "grouped", "1x1", "depthwise"])
def test_non_contiguous_operands(case, path, loops):
    x, w, g = _arrays(case, np.float64, seed=1)
    # the same values through transposed and sliced storage
    xt = np.ascontiguousarray(x.transpose(0, 1, 3, 2)).transpose(0, 1, 3, 2)
    wt = np.ascontiguousarray(np.repeat(w, 2, axis=3))[..., ::2]
    gt = np.ascontiguousarray(g.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)
    assert not (xt.flags.c_contiguous or wt.flags.c_contiguous or gt.flags.c_contiguous)
    for got, want in zip(_ops(case, xt, wt, gt), _torch_conv(case, x, w, g)):
        _close(got, want, np.float64)


def test_depthwise_loops_are_taken_only_for_one_channel_per_group(monkeypatch):
    pytest.importorskip("numba")
    monkeypatch.setattr(conv, "_loops", None)
    x, w = np.zeros((2, 4, 5, 5)), np.zeros((4, 1, 3, 3))
    assert conv._depthwise_loops(x, w, (4, 4), 4) is not None
    assert conv._depthwise_loops(x, w, (4, 8), 4) is None  # a channel multiplier
    assert conv._depthwise_loops(x, w, (4, 4), 2) is None
    assert conv._depthwise_loops(x.astype(np.float16), w.astype(np.float16), (4, 4), 4) is None
    monkeypatch.setattr(conv, "_loops", False)  # numba absent
    assert conv._depthwise_loops(x, w, (4, 4), 4) is None


def test_pointwise_rule():
    assert conv._pointwise((1, 1), ((0, 0), (0, 0)), 1)
    assert not conv._pointwise((1, 1), ((0, 1), (0, 0)), 1)
    assert not conv._pointwise((1, 1), ((0, 0), (0, 0)), 2)
    assert not conv._pointwise((1, 3), ((0, 0), (0, 0)), 1)


def F(T):
    return T.nn.functional


@pytest.mark.parametrize("kw,shapes", [
    (dict(padding=1), [(2, 3, 5, 4), (4, 3, 3, 3)]),
    (dict(stride=2, padding=(1, 0), dilation=(1, 2)), [(2, 2, 6, 7), (3, 2, 3, 2)]),
    (dict(groups=3, padding=1), [(2, 3, 5, 5), (3, 1, 3, 3)]),
    (dict(groups=3, stride=2, padding=1), [(1, 3, 5, 6), (3, 1, 3, 3)]),
    (dict(stride=2), [(2, 3, 5, 4), (4, 3, 1, 1)]),
    (dict(), [(2, 3, 3, 4), (2, 3, 1, 1)]),
], ids=["gemm", "strided dilated", "depthwise", "depthwise strided", "1x1 strided", "1x1"])
def test_gradcheck_and_second_order_through_the_rules(kw, shapes, loops):
    check_op(lambda T, x, w: F(T).conv2d(x, w, **kw), shapes)


@pytest.mark.parametrize("kw,shapes", [
    (dict(stride=2), [(2, 3, 3, 3), (3, 2, 2, 2)]),  # kernel = stride: tiling
    (dict(stride=3, groups=3), [(1, 3, 2, 3), (3, 1, 2, 3)]),  # kernel <= stride, grouped
    (dict(stride=1, padding=1), [(2, 3, 4, 4), (3, 2, 3, 3)]),  # unit stride: correlation
    (dict(stride=2, padding=1, output_padding=1), [(1, 2, 3, 3), (2, 3, 3, 3)]),  # col2im
    (dict(groups=4), [(1, 4, 3, 3), (4, 1, 3, 3)]),  # depthwise transpose
], ids=["tile", "tile grouped", "unit stride", "col2im", "depthwise"])
def test_conv_transpose2d_paths(kw, shapes, loops):
    check_op(lambda T, x, w: F(T).conv_transpose2d(x, w, **kw), shapes)


def test_conv1d_goes_through_the_same_paths(loops):
    check_op(lambda T, x, w: F(T).conv1d(x, w, groups=4, padding=2), [(2, 4, 7), (4, 1, 3)])
    check_op(lambda T, x, w: F(T).conv1d(x, w, stride=2), [(2, 4, 7), (5, 4, 1)])


@pytest.mark.parametrize("dtype", [tapegrad.float32, tapegrad.float64])
def test_module_step_depthwise_numba_and_numpy_agree(dtype, monkeypatch):
    """The depthwise loops and the GEMM path compute the same convolution (orders differ)."""
    pytest.importorskip("numba")
    rng = np.random.default_rng(3)
    x = tapegrad.tensor(rng.standard_normal((3, 6, 7, 7)), dtype=dtype, requires_grad=True)
    w = tapegrad.tensor(rng.standard_normal((6, 1, 3, 3)), dtype=dtype, requires_grad=True)
    results = []
    for state in (None, False):
        monkeypatch.setattr(conv, "_loops", state)
        x.grad = w.grad = None
        out = F(tapegrad).conv2d(x, w, padding=1, stride=2, groups=6)
        (out * out).sum().backward()
        results.append([np.asarray(t._data) for t in (out, x.grad, w.grad)])
    tol = 1e-12 if dtype == tapegrad.float64 else 1e-5
    for a, b in zip(*results):
        np.testing.assert_allclose(a, b, rtol=tol, atol=tol * max(1.0, np.abs(b).max()))


DEVICE_ROWS = [
    (dict(padding=1, stride=2), [(2, 3, 5, 5), (4, 3, 3, 3)]),  # gemm, strided col2im
    (dict(padding=1), [(2, 2, 5, 5), (8, 2, 3, 3)]),  # unit stride, C <= O/4: col2im
    (dict(stride=2), [(2, 4, 5, 5), (3, 4, 1, 1)]),  # 1x1
    (dict(padding=1, groups=3), [(2, 3, 5, 5), (3, 1, 3, 3)]),  # depthwise
    (dict(stride=2), [(2, 4, 6, 6), (4, 2, 2, 2), "transpose"]),  # tiling
]


@pytest.mark.parametrize("kw,specs", DEVICE_ROWS,
                         ids=["gemm", "col2im", "1x1", "depthwise", "tile"])
def test_every_path_keeps_device_arrays_on_their_device(kw, specs, loops):
    """Run on the stand-in device (tests/fake_device.py): a path that builds a host array
    for device data (a numba loop, ``as_strided``) fails here."""
    import os
    import sys

    sys.path.insert(0, os.path.join(TESTS, "gpu"))
    import battery
    import fake_device

    if specs[-1] == "transpose":
        def fn(T, x, w):
            return T.nn.functional.conv_transpose2d(x, w, **kw)
        specs = specs[:-1]
    else:
        def fn(T, x, w):
            return T.nn.functional.conv2d(x, w, **kw)
    b = fake_device.install()
    try:
        assert battery.run(fn, specs, "cuda") is not False
    finally:
        fake_device.uninstall(b)
