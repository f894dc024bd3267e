"""compiler/kernels.py "chan" operands: a fused pointwise kernel reads a (1, C, 1, 1)-style
bias (or its zero-stride ``broadcast_to`` view) one value per row, never reshaping it to
(rows, columns) (which copies a broadcast view every call); results stay eager's bitwise."""
import re

import numpy as np
import pytest

pytest.importorskip("numba")

import tapegrad  # noqa: E402
from tapegrad.compiler import kernels  # noqa: E402
from tapegrad.compiler.ir import Node, Value  # noqa: E402

F = tapegrad.nn.functional


def _bcast(src_shape, out_shape):
    b = Value("b", src_shape, np.float32)
    n = Node(None, "broadcast_to", [b], {"shape": out_shape},
             [Value("bb", out_shape, np.float32)])
    v = n.outputs[0]
    v.producer = n
    return v


def test_operand_kinds():
    out = (64, 16, 8, 8)
    assert kernels.operand_kind(_bcast((1, 16, 1, 1), out), out) == "chan"
    assert kernels.chan_axis(_bcast((1, 16, 1, 1), out), out) == 1
    assert kernels.chan_axis(_bcast((16, 1, 1), out), out) == 1
    assert kernels.chan_axis(_bcast((1, 1, 8, 1), out), out) == 2
    assert kernels.chan_axis(Value("b", (1, 16, 1, 1), np.float32), out) == 1
    assert kernels.operand_kind(Value("b", (16, 1, 1), np.float32), out) == "chan"
    # not one leading axis: the last axis (a row), two axes, a mismatched size, 2-D results
    assert kernels.operand_kind(_bcast((1, 1, 1, 8), out), out) == "full"
    assert kernels.operand_kind(Value("b", (8,), np.float32), out) == "row"
    assert kernels.operand_kind(_bcast((1, 16, 8, 1), out), out) == "full"
    assert kernels.operand_kind(Value("b", (1, 16, 8, 1), np.float32), out) is None
    assert kernels.chan_axis(Value("b", (1, 4, 1, 1), np.float32), out) is None
    assert kernels.operand_kind(_bcast((64, 1), (64, 8)), (64, 8)) == "full"
    assert kernels.operand_kind(Value("x", out, np.float32), out) == "full"


def _fused_calls(src):
    """The numba kernel calls inside the fused wrappers of a generated source."""
    return re.findall(r"^\s+k_[0-9a-f]+\((.*)\)$", src, re.M)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_conv_bias_relu_step_makes_no_bias_copy_and_is_bitwise_eager(monkeypatch, dtype):
    monkeypatch.setenv("TAPEGRAD_COMPILE_KERNELS", "numba")
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal((6, 3, 9, 7)).astype(dtype) for _ in range(3)]
    w0 = rng.standard_normal((5, 3, 3, 3)).astype(dtype)
    b0 = rng.standard_normal(5).astype(dtype)

    def run(compiled):
        w = tapegrad.tensor(w0.copy(), requires_grad=True)
        b = tapegrad.tensor(b0.copy(), requires_grad=True)

        def step(x):
            y = F.relu(F.conv2d(x, w, b, padding=1))
            loss = (y * y).sum()
            w.grad = b.grad = None
            loss.backward()
            return y.detach(), w.grad, b.grad

        fn = tapegrad.compile(step) if compiled else step
        outs = [fn(tapegrad.tensor(x)) for x in xs]
        return [[t.numpy().copy() for t in o] for o in outs], fn

    want, _ = run(False)
    got, fn = run(True)
    for g, e in zip(got, want):
        for a, b in zip(g, e):
            assert a.dtype == b.dtype == dtype
            np.testing.assert_array_equal(a, b)
    src = fn.entries[-1].source
    assert "broadcast_to(" in src  # eager's bias view: add -> relu reads it per channel
    calls = [c for c in _fused_calls(src) if "[0, :, 0, 0]" in c]
    assert calls, src
    for c in calls:
        bias = [p for p in c.split(", ") if p.startswith("x") and "[0" in p]
        assert len(bias) == 1 and ".reshape" not in bias[0]
        # elementwise only: rows of one (example, channel) plane each, 9 * 7 long
        assert c.endswith("o.reshape(30, 63), 1"), c


@pytest.mark.parametrize("shape,bshape", [((4, 5, 6, 3), (1, 5, 1, 1)),
                                          ((4, 5, 6, 3), (6, 1)),
                                          ((2, 3, 4, 5, 6), (3, 1, 1, 1)),
                                          ((7, 3, 2), (7, 1, 1))])
def test_chan_axes_bitwise_eager(monkeypatch, shape, bshape):
    """Each leading axis, explicit (1, C, 1, 1) operands and broadcast views alike."""
    monkeypatch.setenv("TAPEGRAD_COMPILE_KERNELS", "numba")
    rng = np.random.default_rng(1)
    b = tapegrad.tensor(rng.standard_normal(bshape).astype(np.float32))

    def f(x):
        return F.relu(x + b) * 2.0

    fn = tapegrad.compile(f)
    for _ in range(3):
        x = tapegrad.tensor(rng.standard_normal(shape).astype(np.float32))
        np.testing.assert_array_equal(fn(x).numpy(), f(x).numpy())
    src = fn.entries[-1].source
    assert any("[" in c and ":" in c for c in _fused_calls(src)), src
