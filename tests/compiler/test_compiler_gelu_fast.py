"""The float32 GELU forward's short erf fit and the gradient's column sums
(compiler/kernels_gelu.py).

Forward: lanes with u*u <= 4 (u = x / sqrt 2) take ``ERF32_SHORT`` (degree 15), the others
``ERF32_MID`` (degree 21, erf on 2 < |u| <= 4, +-1 beyond); rounded to float32 and through
``1 + erf`` the results must be eager's bit for bit. Every float32 bit pattern was checked
offline (0 differences; the previous one-fit kernel, erf32 on every lane: 19); here a stride
through the range, normal data, the fit's boundary, the edge values, and the inputs where
erf32's rounding was not eager's.

Backward: the next layer's bias gradient ``sum(reshape(gelu_backward(...)), dims=(0,))``
comes out of ``gelu_backward_from_cdf`` itself (rows added as they are written), eager's bits
in float32 and float64, with and without numba.
"""
import numpy as np
import pytest

import tapegrad as tg
import tapegrad.nn.functional as F
from helpers import graph_inputs, graph_node
from tapegrad.compiler import codegen, kernels, kernels_gelu, passes
from tapegrad.compiler.ir import Graph
from tapegrad.ops.error_function import erf64

_node = graph_node  # (tests/helpers.py)


@pytest.fixture
def _numba(monkeypatch):
    pytest.importorskip("numba")
    monkeypatch.setenv("TAPEGRAD_COMPILE_KERNELS", "numba")


def _same(a, b):
    """Bitwise equal (signed zeros included), NaN where the other is NaN."""
    a, b = np.asarray(a), np.asarray(b)
    assert a.dtype == b.dtype and a.shape == b.shape
    nan = np.isnan(b)
    it = np.int64 if a.dtype == np.float64 else np.int32
    return np.array_equal(np.isnan(a), nan) and np.array_equal(a[~nan].view(it),
                                                               b[~nan].view(it))


def _forward_kernel(shape):
    """The float32 forward kernel for an input of ``shape`` (its factory sees a node)."""
    node = type("Node", (), {"inputs": [Graph().new_value(shape, np.float32)]})()
    return kernels_gelu.gelu_with_cdf_factory(node)


def _stride_sample(step):
    """Every ``step``-th float32 bit pattern (both signs: subnormals, zeros, infinities and
    NaNs among them), then the patterns 1 .. step-1 above the first (the smallest)."""
    bits = np.arange(0, 1 << 32, step, dtype=np.uint64)
    bits = np.concatenate([bits, np.arange(1, step, dtype=np.uint64)])
    return bits.astype(np.uint32).view(np.float32)


def _boundary():
    """Every float32 x whose u = x * sqrt(1/2) lies near the short fit's end (|u| = 2,
    |x| = 2.83), both signs."""
    lo, hi = np.float32(2.8274), np.float32(2.8295)
    b = np.arange(lo.view(np.uint32), hi.view(np.uint32), dtype=np.uint32).view(np.float32)
    return np.concatenate([b, -b])


EDGE = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan, 1e-45, -1e-45, 1.1754942e-38,
                 -1.1754942e-38, 3.4028235e38, -3.4028235e38, 2.828427, -2.828427,
                 2.8284273, -2.8284273, 5.656854, -5.656854, 40.0, -40.0], np.float32)


def test_short_fit_forward_is_eager_on_the_float32_range(_numba):
    """The float32 forward kernel's (out, w) against eager's on 2.1e6 bit patterns spread
    over the whole float32 range, normal data (the char-GPT's spread and 3x it), the short
    fit's boundary, the edge values and the tail of a length that is no multiple of the
    block: bitwise, and the same as the previous one-fit kernel's (``erf32`` everywhere),
    which differs from eager's only at ``ERF32_MISSES``."""
    rng = np.random.default_rng(0)
    x = np.concatenate([_stride_sample(1 << 11), _boundary(), EDGE,
                        (rng.standard_normal(300_000) * 0.88).astype(np.float32),
                        (rng.standard_normal(300_000) * 3).astype(np.float32)])
    x = x[:(x.size // kernels_gelu.BLOCK32 - 1) * kernels_gelu.BLOCK32 + 7]  # a tail of 7
    assert x.size % kernels_gelu.BLOCK32 == 7
    rng.shuffle(x)  # short and wide lanes in the same blocks
    x[-7:] = EDGE[:7]
    with np.errstate(all="ignore"):
        out, w, pa = _forward_kernel(x.shape)(x)
        ref_out, ref_w, ref_pa = kernels_gelu.gelu_with_cdf(x)
    assert _same(out, ref_out) and _same(w, ref_w) and _same(pa, ref_pa)
    old = _one_fit_kernel()
    o2, w2 = np.empty_like(x), np.empty_like(x)
    old(x, o2, w2)
    assert _same(o2, out) and _same(w2, w)  # (none of ERF32_MISSES among them)


# every float32 x where the previous kernel's GELU (erf32 on every lane) was not eager's (out
# or w; found by benchmarks/gelu_float32_all_inputs.py over all 2^32 bit patterns)
ERF32_MISSES = np.array([
    0.3520428240299225, 0.41955673694610596, 0.41955676674842834, 1.118728518486023,
    2.456002950668335, 5.253776550292969, 5.347034454345703, -0.3520428240299225,
    -0.41955673694610596, -0.41955676674842834, -1.118728518486023, -1.204898715019226,
    -2.456002950668335, -3.2033684253692627, -3.203368663787842, -5.047753810882568,
    -5.253776550292969, -5.347034454345703, -5.542593955993652], np.float32)


def test_forward_is_eager_where_erf32_was_not(_numba):
    """At the 19 inputs where erf32's float32 rounding made the previous kernel's GELU differ
    from eager's (lanes of both fits), the kernel's is eager's."""
    x = np.concatenate([ERF32_MISSES, np.zeros(13, np.float32)])  # two blocks, both flagged
    out, w, pa = _forward_kernel(x.shape)(x)
    ref_out, ref_w, ref_pa = kernels_gelu.gelu_with_cdf(x)
    assert _same(out, ref_out) and _same(w, ref_w) and _same(pa, ref_pa)
    old = _one_fit_kernel()
    o2, w2 = np.empty_like(x), np.empty_like(x)
    old(x, o2, w2)
    assert not _same(w2, ref_w)  # (the inputs do tell the two apart)


def _one_fit_kernel():
    """The previous float32 forward: erf32 (degree 23 over |u| <= 4) on every lane."""
    return kernels.load("gelu_one_fit_float32", kernels_gelu._src(
        ["def gelu_one_fit_float32(x, out, w):", "    for i in range(x.size):",
         "        xi = x[i]", f"        u = xi * np.float32({kernels_gelu._SQRT1_2!r})",
         "        wi = np.float32(1.0) + np.float32(erf32(np.float64(u)))",
         "        w[i] = wi", "        out[i] = (xi * np.float32(0.5)) * wi"],
        kernels.erf32_source(), ', fastmath={"contract"}'))


def test_short_fit_forward_any_layout(_numba):
    """A transposed (non-contiguous) input, a 3-D one, fewer lanes than a block, none."""
    rng = np.random.default_rng(1)
    for x in ((rng.standard_normal((40, 24)) * 2).astype(np.float32).T,
              (rng.standard_normal((3, 5, 7)) * 2).astype(np.float32),
              np.array([2.9, -0.3, 5.0], np.float32), np.zeros((0, 4), np.float32)):
        out, w, pa = _forward_kernel(x.shape)(x)
        ref_out, ref_w, ref_pa = kernels_gelu.gelu_with_cdf(x)
        assert _same(out, ref_out) and _same(w, ref_w) and _same(pa, ref_pa)


def test_short_fit_erf_against_eager(_numba):
    """erf itself (before ``1 + erf``): the two fits against eager's float64 erf rounded to
    float32 on a stride over every bit pattern (infinities included), and every float32 u
    around the fits' meeting point (|u| = 2) and ERF32_MID's clamp (|u| = 4). On all 2^31
    float32 u > 2 ERF32_MID's rounding is eager's; of the 1.07e9 in [0, 2] the short fit's
    differs at three (1 ulp; erf32 at 263), listed here: there ``1 + erf`` rounds them to the
    same float32, so GELU's results are eager's."""
    near = [np.arange(np.float32(c - 1e-4).view(np.uint32), np.float32(c + 1e-4).view(
        np.uint32), dtype=np.uint32).view(np.float32) for c in (2.0, 4.0)]
    u = np.concatenate([_stride_sample(1 << 10)] + near + [-v for v in near])
    u = u[~np.isnan(u)]
    got = kernels_gelu.erf_float32(u)
    assert _same(got, erf64(u).astype(np.float32))
    rare = np.array([5.204742592468392e-06, 0.00018398030078969896, 0.0003662518283817917],
                    np.float32)
    for s in (1, -1):
        v = rare * np.float32(s)
        got, ref = kernels_gelu.erf_float32(v), erf64(v).astype(np.float32)
        assert np.all(np.abs(got.view(np.int32) - ref.view(np.int32)) == 1)
        assert _same(np.float32(1) + got, np.float32(1) + ref)
        x = v / np.float32(kernels_gelu._SQRT1_2)  # GELU inputs near these u
        out, w, pa = _forward_kernel(x.shape)(x)
        assert _same(out, kernels_gelu.gelu_with_cdf(x)[0])


def test_fits_accuracy_in_float64(_numba):
    """The fits themselves (float64, before rounding) against eager's float64 erf (Cephes,
    ~1e-16 from erf): the short one within 2e-15 relative over [-2, 2] (tiny arguments and
    signed zeros included), the other within 3e-16 absolute (float64's rounding near 1) over
    2 < |u| <= 4 and +-1 beyond: the margins that make their float32 roundings eager's."""
    u = np.concatenate([np.linspace(-2, 2, 400_001), np.geomspace(1e-300, 2, 20_001),
                        -np.geomspace(1e-300, 2, 20_001), [0.0, -0.0, 2.0, -2.0]])
    got, ref = kernels_gelu.erf_fits_float64(u), erf64(u)
    nz = ref != 0
    assert np.max(np.abs(got[nz] - ref[nz]) / np.abs(ref[nz])) < 2e-15
    assert _same(got[~nz], ref[~nz])  # signed zeros
    u = np.linspace(2, 4, 200_001)[1:]
    u = np.concatenate([u, -u, [4.5, 7.0, 1e30, np.inf, -np.inf]])
    got, ref = kernels_gelu.erf_fits_float64(u), erf64(u)
    assert np.max(np.abs(got[:-5] - ref[:-5])) < 3e-16
    assert np.array_equal(np.float32(got[-5:]), np.float32([1, 1, 1, 1, -1]))


_inputs = graph_inputs  # (tests/helpers.py)


def _values(shape, dtype, seed, scale=2.0):
    x = (np.random.default_rng(seed).standard_normal(shape) * scale).astype(dtype)
    x.reshape(-1)[:6] = [0.0, -0.0, 3.0, -3.0, 1e-30, 7.5]
    return x


@pytest.mark.parametrize("kernels_", ["numba", "numpy"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape", [(6, 50, 33), (300, 20)])
def test_gradient_takes_the_bias_gradient_sums(monkeypatch, kernels_, dtype, shape):
    """``gelu_backward`` followed by its column sums (through a (-1, C) reshape of a 3-D
    gradient, or directly of a 2-D one; twice: both taken) becomes one
    ``gelu_backward_from_cdf`` returning them; a sum over the other axis stays. Eager's bits
    (the sums add rows in order into 0.0, as numpy's axis-0 reduction: a column of -0.0 sums
    to 0.0)."""
    if kernels_ == "numba":
        pytest.importorskip("numba")
    monkeypatch.setenv("TAPEGRAD_COMPILE_KERNELS", kernels_)
    g = Graph()
    x, gr = _inputs(g, [(shape, dtype), (shape, dtype)])
    ap = {"approximate": "none"}
    fwd = _node(g, "gelu", [x], **ap)
    bwd = _node(g, "gelu_backward", [gr, x], **ap)
    flat = _node(g, "reshape", [bwd], shape=(-1, shape[-1])) if len(shape) == 3 else bwd
    s1 = _node(g, "sum", [flat], dims=(0,))
    s2 = _node(g, "sum", [flat], dims=(0,))
    other = _node(g, "sum", [flat], dims=(1,))
    g.outputs = [fwd, bwd, s1, s2, other]
    out = passes.optimize(g)
    reader = next(n for n in out.nodes if n.name == "gelu_backward_from_cdf")
    sums = [n for n in out.nodes if n.name == "sum"]
    assert [n.params["dims"] for n in sums] == [(1,)]  # the row sums stay
    assert len(reader.outputs) >= 2 and {id(v) for v in reader.outputs[1:]} <= {id(s1), id(s2)}
    xa = _values(shape, dtype, 3)
    ga = _values(shape, dtype, 4, 0.5)
    ga[..., 5] = -0.0  # a column of -0.0 gradients: its sum is 0.0 (numpy's)
    xa[..., 5] = 1.0
    src, run = codegen.generate(out)
    assert ("gelu_backward_from_cdf_kernel" in src) == (kernels_ == "numba")
    with np.errstate(all="ignore"):
        got = run([xa, ga], [None] * len(g.outputs), [])
        want = passes.evaluate(g, [xa, ga])[0]
    for a, w in zip(got, want):
        assert _same(a, w)
    assert not np.signbit(want[2][5]) and want[2][5] == 0 and np.signbit(want[1][..., 5]).all()


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_compiled_mlp_bias_gradient_from_the_gelu_kernel(_numba, dtype):
    """tapegrad.compile of linear -> GELU -> linear -> loss, backward: the first linear's
    bias gradient is a sum the GELU gradient node returns; loss and gradients equal eager's
    bit for bit over three calls."""
    rng = np.random.default_rng(11)
    w1, b1, w2, b2 = (tg.tensor(rng.standard_normal(s).astype(dtype) * 0.5,
                                requires_grad=True) for s in ((64, 16), (64,), (5, 64), (5,)))
    params = (w1, b1, w2, b2)

    def step(x):
        for p in params:
            p.grad = None
        loss = (F.linear(F.gelu(F.linear(x, w1, b1)), w2, b2) ** 2).mean()
        loss.backward()
        return loss

    comp = tg.compile(step)
    for k in range(3):
        x = tg.tensor((rng.standard_normal((4, 12, 16)) * 2).astype(dtype))
        for p in params:
            p.grad = None  # (as at the trace: one guard set)
        lc = comp(x).detach().numpy()
        gc = [p.grad.numpy().copy() for p in params]
        le = step(x).detach().numpy()
        assert _same(lc, le), k
        for a, p in zip(gc, params):
            assert _same(a, p.grad.numpy()), k
    src = comp.entries[-1].source
    line = next(s for s in src.splitlines() if "gelu_backward_from_cdf_kernel" in s)
    assert line.split("=")[0].count(",") == 2  # the gradient and one column sum
    assert not comp.breaks and comp.n_hits == 2
