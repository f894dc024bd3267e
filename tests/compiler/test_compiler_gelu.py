"""Compiled GELU and exp/log/tanh groups with numba, bitwise eager's.

Where numba's exp/log/tanh (the C library's) are not numpy's ufuncs on this machine
(``kernels.libm_exact``), a fused group whose only such call is gelu_backward's
``exp((-0.5 * x) * x)`` or ``exp``/``log``/``tanh`` of one of its full-shape operands gets that
value from numpy before the kernel (``kernels.outside``) and does the rest in one numba pass:
eager's bits, float64 and float32.
"""
import numpy as np
import pytest

import tapegrad as tg
import tapegrad.nn.functional as F
from helpers import graph_inputs, graph_node
from tapegrad.compiler import codegen, kernels, kernels_gelu, passes
from tapegrad.compiler.ir import Graph


@pytest.fixture
def _numba(monkeypatch):
    pytest.importorskip("numba")
    monkeypatch.setenv("TAPEGRAD_COMPILE_KERNELS", "numba")
    monkeypatch.delenv("TAPEGRAD_COMPILE_LIBM", raising=False)


_node = graph_node  # (tests/helpers.py)


_inputs = graph_inputs  # (tests/helpers.py)


def _same_bits(a, w):
    """Equal as IEEE bit patterns (signs of zeros included); NaN where the other is NaN."""
    a, w = np.asarray(a), np.asarray(w)
    assert a.dtype == w.dtype and a.shape == w.shape
    nan = np.isnan(w)
    assert np.array_equal(np.isnan(a), nan)
    it = np.int64 if a.dtype == np.float64 else np.int32
    return np.array_equal(a[~nan].view(it), w[~nan].view(it))


def _values(shape, dtype, seed):
    """Normal values times 3 with the edge cases written in: signed zeros, infinities, NaN,
    a subnormal, exp's underflow (|x| 40) and x*x's overflow (1e20, 1e200)."""
    x = (np.random.default_rng(seed).standard_normal(shape) * 3).astype(dtype)
    tiny = np.finfo(dtype).smallest_subnormal
    edge = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, tiny, -tiny, 40.0, -40.0, 1e20,
                     -1e20, 1e200 if dtype == np.float64 else 3e38], dtype)
    x.reshape(-1)[:edge.size] = edge
    return x


def _run(g, arrs):
    out = passes.fuse(g)
    src, run = codegen.generate(out)
    with np.errstate(all="ignore"):
        got = run(arrs, [None] * len(g.outputs), [])
        want = passes.evaluate(g, arrs)[0]
    return out, src, got, want


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("shape", [(64, 33), (4, 8, 40), (1000,)])
def test_gelu_forward_backward_chain_numba_is_eager_bitwise(_numba, dtype, shape):
    """GELU's forward (with a bias add) and gelu_backward (gradient scaled, a bias added):
    one numba kernel each; gelu_backward's exp is numpy's (before the kernel) where numba's
    libm exp differs from it; every value eager's bit for bit, edge values included."""
    g = Graph()
    x, gr, b = _inputs(g, [(shape, dtype), (shape, dtype), (shape[-1:], dtype)])
    ap = {"approximate": "none"}
    fwd = _node(g, "gelu", [_node(g, "add", [x, b])], **ap)
    bwd = _node(g, "add", [_node(g, "gelu_backward", [_node(g, "mul", [gr, 0.5]), x], **ap), b])
    g.outputs = [fwd, bwd]
    arrs = [_values(shape, dtype, 0), _values(shape, dtype, 1)[::-1].copy(),
            (np.random.default_rng(2).standard_normal(shape[-1:])).astype(dtype)]
    out, src, got, want = _run(g, arrs)
    # float64: erf64 reads numpy's exp of its argument, so the bias add before GELU is not
    # in GELU's kernel (its argument must be a group input)
    first = [["gelu"]] if dtype == np.float64 else [["add", "gelu"]]
    assert [[m.name for m in n.meta["nodes"]] for n in out.nodes if n.name == "fused"] == \
        first + [["mul", "gelu_backward", "add"]]
    assert src.count("@njit(error_model") == 2  # both groups are numba kernels
    assert src.count("outside_call('gelu_erf_exp', ") == (2 if dtype == np.float64 else 0)
    outside = "outside_call('gelu_exp', " in src
    assert outside == (not kernels.libm_exact("exp", dtype))
    if outside:
        assert "np.exp(" not in src.split("# mul -> gelu_backward -> add")[0].split(
            "def k_")[-1]  # the kernel itself calls no exp
    for a, w in zip(got, want):
        assert _same_bits(a, w)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("fn", ["exp", "log", "tanh"])
def test_libm_call_of_an_operand_is_numpys_before_the_kernel(_numba, dtype, fn):
    """``fn(x) * y + 1``: numpy computes fn(x) (its own SIMD loop where numba's libm differs)
    and the kernel the rest; bitwise eager's. Where numba's call is numpy's the kernel calls
    it itself."""
    g = Graph()
    x, y = _inputs(g, [((50, 70), dtype), ((50, 70), dtype)])
    g.outputs = [_node(g, "add", [_node(g, "mul", [_node(g, fn, [x]), y]), 1.0])]
    xs = _values((50, 70), dtype, 3)
    if fn == "log":
        xs = np.abs(xs)
    arrs = [xs, _values((50, 70), dtype, 4)]
    out, src, got, want = _run(g, arrs)
    assert [m.name for m in out.nodes[0].meta["nodes"]] == [fn, "mul", "add"]
    assert src.count("@njit(error_model") == 1
    assert (f"outside_call('{fn}', " in src) == (not kernels.libm_exact(fn, dtype))
    assert _same_bits(got[0], want[0])


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_exp_of_an_intermediate_stays_numpys_ufunc_chain(_numba, dtype):
    """gelu_backward of a value computed inside the group (x + b) and exp of an intermediate:
    nothing to hand the kernel, so where numba's exp is not numpy's the group stays numpy's
    ufunc steps (float64 gelu_backward: its argument is made a group input, so it is a
    kernel of its own); eager's values either way."""
    g = Graph()
    x, gr, b = _inputs(g, [((30, 20), dtype), ((30, 20), dtype), ((20,), dtype)])
    ap = {"approximate": "none"}
    gb = _node(g, "gelu_backward", [gr, _node(g, "add", [x, b])], **ap)
    ex = _node(g, "exp", [_node(g, "neg", [x])])
    g.outputs = [gb, _node(g, "mul", [ex, gr])]
    arrs = [_values((30, 20), dtype, 5), _values((30, 20), dtype, 6),
            np.linspace(-1, 1, 20).astype(dtype)]
    out, src, got, want = _run(g, arrs)
    libm = kernels.libm_exact("exp", dtype)
    if dtype == np.float64:  # erf64's argument must be a group input: the add is cut off
        fused = [[m.name for m in n.meta["nodes"]] for n in out.nodes if n.name == "fused"]
        assert ["gelu_backward"] in fused and "add" in [n.name for n in out.nodes]
        assert src.count("outside_call(") == 1 + (not libm)  # its erf's exp, its own exp
        assert src.count("@njit(error_model") == 1 + libm
    else:
        assert "outside_call(" not in src
        assert src.count("@njit(error_model") == 2 * libm
    for a, w in zip(got, want):
        if kernels.libm_exact("exp", dtype):  # numba's exp (probed equal on 4096 values)
            np.testing.assert_allclose(a, w, rtol=4 * np.finfo(dtype).eps)
        else:
            assert _same_bits(a, w)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_compiled_gelu_mlp_step_gradients_are_eager_bitwise(_numba, dtype):
    """tapegrad.compile of linear -> GELU -> linear -> loss, backward: the compiled loss and
    gradients equal eager's bit for bit over three calls (trace, then the generated code)."""
    rng = np.random.default_rng(7)
    w1, b1, w2 = (tg.tensor(rng.standard_normal(s).astype(dtype) * 0.5, requires_grad=True)
                  for s in ((48, 16), (48,), (5, 48)))

    def step(x):
        w1.grad = b1.grad = w2.grad = None
        loss = (F.linear(F.gelu(F.linear(x, w1, b1)), w2) ** 2).mean()
        loss.backward()
        return loss

    comp = tg.compile(step)
    for k in range(3):
        x = tg.tensor((rng.standard_normal((6, 10, 16)) * 2).astype(dtype))
        w1.grad = b1.grad = w2.grad = None  # (as at the trace: one guard set)
        lc = comp(x).detach().numpy()
        gc = [p.grad.numpy().copy() for p in (w1, b1, w2)]
        le = step(x).detach().numpy()
        assert _same_bits(lc, le), k
        for a, p in zip(gc, (w1, b1, w2)):
            assert _same_bits(a, p.grad.numpy()), k
    assert not comp.breaks and comp.n_hits == 2


@pytest.mark.parametrize("kernels_", ["numba", "numpy"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_gelu_and_its_gradient_share_one_erf(monkeypatch, kernels_, dtype):
    """share_gelu_erf: gelu(x) and gelu_backward(g, x) of the same x become gelu_with_cdf
    (the result and 1 + erf(x / sqrt 2)) and gelu_backward_from_cdf reading it; a
    gelu_backward of another value, and the tanh form, are left alone. Eager's bits, edge
    values included, with the numba kernels and without."""
    if kernels_ == "numba":
        pytest.importorskip("numba")
    monkeypatch.setenv("TAPEGRAD_COMPILE_KERNELS", kernels_)
    shape = (16, 8, 40)
    g = Graph()
    x, gr, y = _inputs(g, [(shape, dtype), (shape, dtype), (shape, dtype)])
    ap, tanh = {"approximate": "none"}, {"approximate": "tanh"}
    fwd = _node(g, "gelu", [x], **ap)
    bwd = _node(g, "gelu_backward", [gr, x], **ap)
    other = _node(g, "gelu_backward", [gr, y], **ap)  # no forward of y: stays
    t_fwd = _node(g, "gelu", [y], **tanh)
    t_bwd = _node(g, "gelu_backward", [gr, y], **tanh)
    g.outputs = [fwd, bwd, other, t_fwd, t_bwd]
    out = passes.optimize(g)
    names = [n.name for n in out.nodes]
    assert names.count("gelu_with_cdf") == 1 and names.count("gelu_backward_from_cdf") == 1
    shared = next(n for n in out.nodes if n.name == "gelu_with_cdf")
    reader = next(n for n in out.nodes if n.name == "gelu_backward_from_cdf")
    assert reader.inputs[2] is shared.outputs[1] and reader.inputs[1] is x
    arrs = [_values(shape, dtype, 7), _values(shape, dtype, 8)[::-1].copy(),
            _values(shape, dtype, 9)]
    src, run = codegen.generate(out)
    assert ("gelu_with_cdf_kernel" in src) == (kernels_ == "numba")
    with np.errstate(all="ignore"):
        got = run(arrs, [None] * len(g.outputs), [])
        want = passes.evaluate(g, arrs)[0]
    for a, w in zip(got, want):
        assert _same_bits(a, w)


def test_gelu_erf_is_shared_only_with_rules_after_the_forward():
    """A gelu_backward of x before gelu(x) in the graph cannot read the forward's erf: it
    stays; one after it is rewritten; a second forward of the same x takes no rule twice."""
    shape = (8, 5)
    dtype = np.float64
    g = Graph()
    x, gr = _inputs(g, [(shape, dtype), (shape, dtype)])
    ap = {"approximate": "none"}
    early = _node(g, "gelu_backward", [gr, x], **ap)
    f1 = _node(g, "gelu", [x], **ap)
    late = _node(g, "gelu_backward", [gr, x], **ap)
    f2 = _node(g, "gelu", [x], **ap)
    g.outputs = [early, f1, late, f2]
    out = kernels_gelu.share_gelu_erf(g)
    assert [n.name for n in out.nodes] == ["gelu_backward", "gelu_with_cdf",
                                           "gelu_backward_from_cdf", "gelu"]
    arrs = [_values(shape, dtype, 3), _values(shape, dtype, 4)]
    with np.errstate(all="ignore"):
        got = passes.evaluate(out, arrs)[0]
        want = passes.evaluate(g, arrs)[0]
    for a, w in zip(got, want):
        assert _same_bits(a, w)
