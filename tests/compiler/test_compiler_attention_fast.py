"""compiler/kernels_attention.py: attention's forward with its compact exp (one (T, S) mask),
its output written through a (B, T, H, E) layout, the fused softmax gradient and the q/k/v
concatenation, each bitwise eager's (float32 and float64), and the compiled steps that use
them against eager."""
import numpy as np
import pytest

pytest.importorskip("numba")

import tapegrad  # noqa: E402
from tapegrad.compiler import kernels_attention as KA, kernels_norm_softmax  # noqa: E402
from tapegrad.compiler.ir import Node, Value  # noqa: E402
from tapegrad.ops import nn as N  # noqa: E402

DTYPES = [np.float64, np.float32]


def _bits(a):
    a = np.ascontiguousarray(a)
    return a.view(np.int64 if a.dtype == np.float64 else np.int32)


def _same(got, want):
    """Equal values, NaN where eager has NaN, and equal bits where eager's are finite."""
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got, want)
    fin = np.isfinite(want)
    np.testing.assert_array_equal(_bits(got[fin]), _bits(want[fin]))


def _node(name, ins, params, outs):
    vals = [Value(f"in{i}", a.shape, np.dtype(a.dtype)) if isinstance(a, np.ndarray) else a
            for i, a in enumerate(ins)]
    return Node(None, name, vals, params,
                [Value(f"out{i}", tuple(s), np.dtype(ins[0].dtype)) for i, s in enumerate(outs)])


def _qkv(rng, dtype, B, H, T, S, D, E):
    """q, k, v as the GPT makes them: permuted views of (B, T|S, H D) projections."""
    def heads(L, W):
        x = rng.standard_normal((B, L, H * W)).astype(dtype)
        return x.reshape(B, L, H, W).transpose(0, 2, 1, 3)
    return heads(T, D), heads(S, D), heads(S, E)


def _mask(kind, rng, dtype, T, S):
    if kind == "causal":
        return np.triu(np.full((T, S), -np.inf), 1).astype(dtype)
    if kind == "causal4":  # (1, 1, T, S)
        return np.triu(np.full((T, S), -np.inf), 1).astype(dtype)[None, None]
    if kind == "holes":  # -inf inside the rows too, not only a suffix; some rows unmasked
        m = np.where(rng.random((T, S)) < 0.4, -np.inf, 0.0)
        m[:, 0] = 0.0
        return m.astype(dtype)
    if kind == "finite":
        return rng.standard_normal((T, S)).astype(dtype)
    if kind == "cols":  # (S,): broadcast over the rows
        m = rng.standard_normal(S)
        m[-1] = -np.inf
        return m.astype(dtype)
    return None


def _fast(ins, params, probs, dtype, out_shape, p_shape):
    name = "scaled_dot_product_attention" + ("_probs" if probs else "")
    outs = [out_shape, p_shape] if probs else [out_shape]
    return KA.attention_forward(_node(name, ins, params, outs), probs)


def _eager_probs(q, k, bias, scale):
    s = np.matmul(q, np.swapaxes(k, -1, -2)) * scale
    if bias is not None:
        s = s + bias
    return N.softmax.forward(s.astype(q.dtype, copy=False), -1)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mask", ["causal", "causal4", "holes", "finite", "cols", "none"])
@pytest.mark.parametrize("dims", [(16, 4, 32, 32, 16, 16), (2, 3, 5, 7, 4, 6),
                                  (1, 1, 1, 1, 1, 1), (2, 2, 9, 40, 3, 5), (1, 2, 3, 3, 8, 8)])
def test_attention_forward_is_eager_bitwise(dtype, mask, dims):
    B, H, T, S, D, E = dims
    rng = np.random.default_rng(sum(dims))
    q, k, v = _qkv(rng, dtype, B, H, T, S, D, E)
    if mask in ("causal", "causal4") and T != S:
        mask = "finite"
    bias = _mask(mask, rng, dtype, T, S)
    ins = [q, k, v] + ([bias] if bias is not None else [])
    params = {"scale": 0.37, "keep": None}
    want = N.scaled_dot_product_attention.forward(*ins, **params)
    for probs in (False, True):
        fn = _fast(ins, params, probs, dtype, (B, H, T, E), (B, H, T, S))
        assert fn is not None
        for _ in range(2):  # the kernel's scratch reused
            got = fn(*ins, **params)
            out, p = got if probs else (got, None)
            _same(out, want)
            if probs:
                _same(p, _eager_probs(q, k, bias, dtype(0.37) if dtype == np.float32
                                      else 0.37))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mask", ["causal", "none", "holes"])
def test_attention_forward_nan_inf_and_fully_masked_rows_as_eager(dtype, mask):
    rng = np.random.default_rng(5)
    B, H, T, D = 2, 3, 9, 5
    q, k, v = _qkv(rng, dtype, B, H, T, T, D, D)
    q, k = q.copy(), k.copy()
    q[0, 1, 2, 3] = np.nan  # a NaN row of scores
    q[1, 2, 4, 0] = np.inf  # +-inf scores: inf - inf = NaN
    q[1, 0, 5, :] = 1e30 if dtype == np.float64 else 1e20  # overflow to +inf: the max
    k[1, 1, 7, 1] = -1e300 if dtype == np.float64 else -1e38  # -inf in a masked position
    bias = _mask(mask, rng, dtype, T, T)
    if bias is not None:
        bias[3, :] = -np.inf  # a fully masked row: -inf - -inf = NaN, as eager
    ins = [q, k, v] + ([bias] if bias is not None else [])
    params = {"scale": 0.4, "keep": None}
    fn = _fast(ins, params, True, dtype, (B, H, T, D), (B, H, T, T))
    assert fn is not None
    out, p = fn(*ins, **params)
    with np.errstate(invalid="ignore", over="ignore"):
        want = N.scaled_dot_product_attention.forward(*ins, **params)
        want_p = _eager_probs(q, k, bias, dtype(0.4) if dtype == np.float32 else 0.4)
    assert np.isnan(want).any() and np.isfinite(want).any()
    _same(out, want)
    _same(p, want_p)


@pytest.mark.parametrize("dtype", DTYPES)
def test_attention_output_is_written_in_heads_last_layout(dtype):
    """out is a (B, H, T, E) view of a C-contiguous (B, T, H, E) buffer: the model's
    permute(0, 2, 1, 3) and reshape to (B, T, H E) are views, no copy."""
    rng = np.random.default_rng(0)
    q, k, v = _qkv(rng, dtype, 4, 2, 8, 8, 4, 4)
    bias = _mask("causal", rng, dtype, 8, 8)
    fn = _fast([q, k, v, bias], {"scale": 0.5, "keep": None}, False, dtype, (4, 2, 8, 4),
               None)
    out = fn(q, k, v, bias, scale=0.5)
    t = out.transpose(0, 2, 1, 3)
    assert t.flags.c_contiguous
    flat = t.reshape(4, 8, 8)
    assert np.shares_memory(flat, out)


def test_attention_forward_declines_what_it_does_not_compute():
    rng = np.random.default_rng(1)
    q, k, v = _qkv(rng, np.float64, 2, 3, 4, 4, 5, 5)
    f = _fast
    # a bias that varies across batch entries or heads: kernels_norm_softmax's kernel
    per_batch = rng.standard_normal((2, 1, 4, 4))
    assert f([q, k, v, per_batch], {"scale": 1.0, "keep": None}, True, np.float64,
             (2, 3, 4, 5), (2, 3, 4, 4)) is None
    assert kernels_norm_softmax.attention_probs_factory(_node(
        "scaled_dot_product_attention_probs", [q, k, v, per_batch],
        {"scale": 1.0, "keep": None}, [(2, 3, 4, 5), (2, 3, 4, 4)])) is not None
    assert f([q, k, v], {"scale": 1.0, "keep": np.ones((2, 3, 4, 4))}, True, np.float64,
             (2, 3, 4, 5), (2, 3, 4, 4)) is None  # dropout
    assert f([q, k, v.astype(np.float32)], {"scale": 1.0, "keep": None}, True, np.float64,
             (2, 3, 4, 5), (2, 3, 4, 4)) is None  # mixed dtypes
    assert f([q[0], k[0], v[0]], {"scale": 1.0, "keep": None}, True, np.float64,
             (3, 4, 5), (3, 4, 4)) is None  # 3-D
    assert f([q, k, v, 0.5], {"scale": 1.0, "keep": None}, True, np.float64,
             (2, 3, 4, 5), (2, 3, 4, 4)) is None  # a literal bias


def _gpt_attention_step(dtype, seed=0, T=8, bias=False):
    """A causal self-attention block as the char GPT's (qkv projection split into heads,
    attention, heads merged, output projection), its loss and its gradients (``bias``: the
    qkv projection has one, whose gradient is the column sums of the concatenation)."""
    rng = np.random.default_rng(seed)
    B, H, D = 3, 2, 4
    C = H * D
    x = tapegrad.tensor(rng.standard_normal((B, T, C)).astype(dtype), requires_grad=True)
    w = tapegrad.tensor(rng.standard_normal((3 * C, C)).astype(dtype) * 0.5,
                        requires_grad=True)
    wo = tapegrad.tensor(rng.standard_normal((C, C)).astype(dtype) * 0.5, requires_grad=True)
    tgt = tapegrad.tensor(rng.standard_normal((B, T, C)).astype(dtype))
    b = tapegrad.tensor(rng.standard_normal(3 * C).astype(dtype), requires_grad=True)
    F = tapegrad.nn.functional
    leaves = (x, w, wo) + ((b,) if bias else ())

    def step():
        for t in leaves:
            t.grad = None
        qkv = F.linear(x, w, b) if bias else F.linear(x, w)
        q, k, v = qkv.split(C, dim=2)
        q, k, v = (z.view(B, T, H, D).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        loss = ((F.linear(y, wo) - tgt) ** 2).mean()
        loss.backward()
        return loss

    return step, leaves


def _compiled_equals_eager(calls, **kw):
    """``calls`` calls of the attention block eagerly and compiled (``_gpt_attention_step(
    **kw)`` each, from the same values): loss and gradients bitwise equal at every call.
    Returns the compiled function."""
    step, leaves = _gpt_attention_step(**kw)
    eager = []
    for _ in range(calls):
        loss = step()
        eager.append([loss.detach().numpy().copy()] + [t.grad.numpy().copy() for t in leaves])
    step2, leaves2 = _gpt_attention_step(**kw)
    comp = tapegrad.compile(step2)
    for i in range(calls):
        loss = comp()
        got = [loss.detach().numpy()] + [t.grad.numpy() for t in leaves2]
        for a, b in zip(got, eager[i]):
            np.testing.assert_array_equal(_bits(a), _bits(b))
    return comp


@pytest.mark.parametrize("dtype", DTYPES)
def test_compiled_attention_block_is_eager_bitwise(monkeypatch, dtype):
    monkeypatch.setenv("TAPEGRAD_COMPILE_KERNELS", "numba")
    comp = _compiled_equals_eager(3, dtype=dtype)
    names = {getattr(fn, "__name__", "") for fn in comp.entries[-1].run.__globals__.values()}
    assert "attention_probs_fast" in names


@pytest.mark.parametrize("backend", ["numpy", "numba"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_gradient_products_written_into_the_concatenation(monkeypatch, backend, dtype):
    """attention's q/k/v gradient products become one concatenate_products node (its numpy
    body on the numpy backend, BLAS into the slices on numba's): the step's values and
    gradients are eager's bits either way."""
    monkeypatch.setenv("TAPEGRAD_COMPILE_KERNELS", backend)
    comp = _compiled_equals_eager(2, dtype=dtype, seed=3, T=6)
    e = comp.entries[-1]
    nodes = [n for n in e.graph.nodes if n.name == "concatenate_products"]
    assert len(nodes) == 1 and not any(n.name in ("concatenate_gradients", "softmax_backward")
                                       for n in e.graph.nodes)
    # the softmax gradient and its product g v^T joined the node (nothing else reads them)
    assert [m.name for m in nodes[0].meta["program"]].count("matmul") == 4
    assert any(m.name == "softmax_backward" for m in nodes[0].meta["program"])
    assert ("concatenate_products_kernel(" in e.source) == (backend == "numba")


@pytest.mark.parametrize("backend", ["numpy", "numba"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_qkv_bias_gradient_comes_out_of_the_concatenation(monkeypatch, backend, dtype):
    """The qkv projection's bias gradient (the column sums of the concatenated q/k/v
    gradient) is a second output of concatenate_products, added row by row in the kernel's
    last pass (numpy's axis-0 order, into 0.0): no sum node is left, eager's bits."""
    monkeypatch.setenv("TAPEGRAD_COMPILE_KERNELS", backend)
    comp = _compiled_equals_eager(2, dtype=dtype, seed=5, T=7, bias=True)
    g = comp.entries[-1].graph
    (node,) = [n for n in g.nodes if n.name == "concatenate_products"]
    assert len(node.outputs) == 2 and len(node.meta["sums"]) == 1
    assert not any(n.name == "sum" and n.inputs[0].producer is not None and
                   n.inputs[0].producer.inputs[0] is node.outputs[0] for n in g.nodes)
    if backend == "numba":
        fn = KA.concatenate_products_factory(node)
        rng = np.random.default_rng(2)
        arrays = [rng.standard_normal(a.shape).astype(dtype) for a in node.inputs]
        got, want = fn(*arrays), node.impl(*arrays)
        assert len(got) == len(want) == 2
        for a, b in zip(got, want):
            _same(a, b)


@pytest.mark.parametrize("dtype", DTYPES)
def test_gradient_products_kernel_matches_its_body_with_zeros_and_nans(monkeypatch, dtype):
    """The kernel against the node's numpy body (eager's matmuls, then the concatenation
    and + 0.0) on operands giving -0.0 (a zero row times negatives: + 0.0 makes it +0.0),
    NaN and inf products."""
    monkeypatch.setenv("TAPEGRAD_COMPILE_KERNELS", "numba")
    step, _ = _gpt_attention_step(dtype, seed=4, T=5)
    comp = tapegrad.compile(step)
    comp()
    comp()
    node = next(n for n in comp.entries[-1].graph.nodes if n.name == "concatenate_products")
    fn = KA.concatenate_products_factory(node)
    assert fn is not None
    rng = np.random.default_rng(9)
    arrays = []
    for i, a in enumerate(node.inputs):
        x = rng.standard_normal(a.shape).astype(dtype)
        if i == 0:
            x[..., 0, :] = 0.0  # a zero row: products -0.0 against negatives
        arrays.append(x)
    arrays[1][...] = -np.abs(arrays[1])
    arrays[2][0, 0, 1, 1] = np.nan
    arrays[4][1, 1, 2, 0] = np.inf
    with np.errstate(invalid="ignore"):
        want = node.impl(*arrays)
        got = fn(*arrays)
    _same(got, want)
    assert not np.signbit(got[got == 0]).any()
    # probabilities that are not C-contiguous: numpy sums their rows in another order, so
    # the node's own ops run (eager's bits)
    i = next(i for i, a in enumerate(node.inputs) if a.shape[-1] == a.shape[-2] == 5)
    arrays[i] = np.asfortranarray(arrays[i])
    with np.errstate(invalid="ignore"):
        _same(fn(*arrays), node.impl(*arrays))


def test_gradient_products_kernel_declines_a_slice_it_cannot_view():
    """A product whose slice, seen in its shape, is not a view of the output, or is one BLAS
    cannot store through (numpy's matmul would run its own loop there, not eager's BLAS
    call): no kernel (the body runs)."""
    dt = np.dtype(np.float64)

    def node(xshape, dims, out_shape, cuts):
        a, b = Value("a", (xshape[0], 3), dt), Value("b", (3, xshape[1]), dt)
        mm = Node(None, "matmul", [a, b], {}, [Value("x", xshape, dt)])
        return Node(None, "concatenate_products", [a, b] * 3, {},
                    [Value("out", out_shape, dt)],
                    meta={"chains": [None if dims is None else (None, dims)] * 3,
                          "cuts": cuts, "products": [mm] * 3, "nodes": [mm]})

    cols = [(1, 0, 4), (1, 4, 8), (1, 8, 12)]
    f = KA.concatenate_products_factory
    assert f(node((2, 4), None, (2, 12), cols)) is not None  # rows of 4 at a stride of 12
    assert f(node((4, 2), (1, 0), (2, 12), cols)) is None  # columns at a stride of 12
    narrow = [(1, 0, 2), (1, 2, 4), (1, 4, 6)]
    assert f(node((2, 4), None, (4, 6), narrow)) is None  # (4, 2) as (2, 4): a copy


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(16, 4, 32, 32), (3, 1), (4, 7), (5, 8), (2, 3, 9),
                                   (2, 130), (2, 300), (7, 40)])
def test_softmax_backward_kernel_is_eager_bitwise(dtype, shape):
    """``p * (g - sum(g * p))`` with numpy's pairwise row sum (the products' 8 running sums
    as vector lanes for rows of 8..128), -0.0, NaN and inf included; strided inputs."""
    rng = np.random.default_rng(sum(shape))
    g = rng.standard_normal(shape).astype(dtype)
    p = rng.random(shape).astype(dtype)
    flat = g.reshape(-1)
    flat[::7] = -0.0
    if g.size > 20:
        flat[3] = np.nan
        flat[11] = np.inf
    node = _node("softmax_backward", [g, p], {}, [shape])

    def rule(ga, pa):  # eager's: the traced rule's ops (the node's body)
        return pa * (ga - np.add.reduce(ga * pa, axis=-1, keepdims=True))

    node.impl = rule
    fn = KA.softmax_backward(node)
    assert fn is not None and kernels_norm_softmax.softmax_backward_factory(node) is not None
    with np.errstate(invalid="ignore"):
        _same(fn(g, p), rule(g, p))
        # not C-contiguous: numpy sums such rows in another order, so the node's own ops
        gt, pt = np.asfortranarray(g), np.asfortranarray(p)
        _same(fn(gt, pt), rule(gt, pt))
        _same(fn(g, pt), rule(g, pt))


def test_gradient_products_only_where_blas_matmul_is_one_np_matmul(monkeypatch):
    """Absorbed products are called as np.matmul(..., out=): only where backend.blas.matmul
    would make that very call (not a stack times a matrix, which it may run as one 2-D GEMM;
    not inside its thread switch; float32/float64 only)."""
    from tapegrad.backend import blas

    f32, f64 = np.dtype(np.float32), np.dtype(np.float64)
    assert KA._blas_direct(Value("a", (4, 3, 5, 6), f32), Value("b", (4, 3, 6, 7), f32))
    assert not KA._blas_direct(Value("a", (4, 5, 6), f32), Value("b", (6, 7), f32))
    assert not KA._blas_direct(Value("a", (5, 6), f32), Value("b", (6, 7), f64))
    assert not KA._blas_direct(Value("a", (5, 6), np.dtype(np.int64)),
                               Value("b", (6, 7), np.dtype(np.int64)))
    if blas.LIBRARY is not None:
        monkeypatch.setattr(blas, "OPENBLAS_SERIAL_WORK", 10)
        monkeypatch.setattr(blas, "SERIAL_WORK", 10 ** 9)
        assert not KA._blas_direct(Value("a", (2, 5, 6), f32), Value("b", (2, 6, 7), f32))
