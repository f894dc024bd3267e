"""compiler/kernels_residual.py: the residual sum fused into the LayerNorm reading it, the
LayerNorm gradient fused with the residual gradient's add and the sums of its result, and
their numba row kernels: each kernel against its node's reference (the replaced nodes, eager's
ops) and a compiled residual stack against eager, bitwise, float32 and float64."""
import re

import numpy as np
import pytest

pytest.importorskip("numba")

import tapegrad  # noqa: E402
from tapegrad.compiler import kernels_residual as KR  # noqa: E402
from tapegrad.compiler.ir import Node, Value  # noqa: E402
from tapegrad.ops import nn as N  # noqa: E402
from tapegrad.ops.registry import REGISTRY  # noqa: E402

DTYPES = [np.float64, np.float32]
SHAPES = [(16, 32, 64), (3, 5, 13), (2, 7, 8), (4, 200), (3, 3), (2, 2, 130)]


def _bits(a):
    a = np.ascontiguousarray(a)
    return a.view(np.uint32 if a.dtype == np.float32 else np.uint64)


def _v(name, shape, dt):
    return Value(name, tuple(shape), np.dtype(dt))


def _data(shape, dtype, seed):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(shape) * 3 + 1.5).astype(dtype)
    x.reshape(-1)[::7] = -0.0  # signed zeros in the sums
    return x


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("kind", ["full", "broadcast", "swap", "noaffine"])
def test_residual_layer_norm_kernel_is_eager_bitwise(dtype, shape, kind):
    C = shape[-1]
    a = _data(shape, dtype, sum(shape))
    b = _data(shape if kind != "broadcast" else shape[1:], dtype, 3)
    w = _data((C,), dtype, 4)
    bias = _data((C,), dtype, 5)
    ln = Node(REGISTRY["layer_norm"], "layer_norm", [_v("s", shape, dtype)] +
              ([] if kind == "noaffine" else [_v("w", (C,), dtype), _v("b", (C,), dtype)]),
              {"axes": (len(shape) - 1,), "eps": 1e-5, "param_shape": (C,)},
              [_v("y", shape, dtype)])
    first, second = (b, a) if kind == "swap" else (a, b)
    s_want = first + second  # eager's add (numpy's, broadcasting)
    ins = [first, second] + ([] if kind == "noaffine" else [w, bias])
    y_want = N.layer_norm.forward(s_want, *ins[2:], **ln.params)
    node = Node(None, "residual_layer_norm",
                [_v("a", a.shape, dtype), _v("b", b.shape, dtype)] + ln.inputs[1:],
                dict(ln.params, swap=kind == "swap"),
                [_v("s", shape, dtype), _v("y", shape, dtype)])
    fn = KR.residual_layer_norm_factory(node)
    assert fn is not None
    s, y = fn(a, b, *ins[2:], **node.params)
    assert s.dtype == y.dtype == dtype and s.shape == y.shape == tuple(shape)
    np.testing.assert_array_equal(_bits(s), _bits(s_want))
    np.testing.assert_array_equal(_bits(y), _bits(y_want))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_plain_layer_norm_call_is_eager_bitwise(dtype, shape):
    C = shape[-1]
    x, w, b = _data(shape, dtype, 1), _data((C,), dtype, 2), _data((C,), dtype, 3)
    for args in ((w, b), (w, None), (None, None)):
        got = KR.layer_norm_call(tuple(shape), np.dtype(dtype))(x, *args, 1e-5)
        want = N._norm_forward(x, *args, axes=(len(shape) - 1,), eps=1e-5, param_shape=(C,))
        np.testing.assert_array_equal(_bits(got), _bits(want))


def _ln_backward_node(g, x, w, with_gb):
    """kernels_norm_softmax's fused LayerNorm gradient node (its impl: eager's rule, op for op)."""
    from tapegrad.compiler.ir import call_node

    axes = (x.ndim - 1,)
    C = x.shape[-1]

    def impl(ga, xa, wa, axes, eps):
        gx, gw, gb = N._norm_rule(ga, None, xa, wa, wa, axes=axes, eps=eps,
                                  param_shape=(C,))
        return (gx, gw, gb) if with_gb else (gx, gw)

    outs = [_v("gx", x.shape, x.dtype), _v("gw", (C,), x.dtype)] + (
        [_v("gb", (C,), x.dtype)] if with_gb else [])
    n = Node(None, "layer_norm_backward", [_v("g", g.shape, g.dtype), _v("x", x.shape, x.dtype),
                                           _v("w", (C,), w.dtype)],
             {"axes": axes, "eps": 1e-5}, outs, impl=impl)
    assert call_node(n, [g, x, w])  # the reference runs
    return n


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("mode", [0, 1, 2])
@pytest.mark.parametrize("extra", ["sums", "none", "nogb"])
def test_residual_layer_norm_backward_kernel_is_eager_bitwise(dtype, shape, mode, extra):
    C = shape[-1]
    g, x, w = _data(shape, dtype, 7), _data(shape, dtype, 8), _data((C,), dtype, 9)
    r = _data(shape, dtype, 10)
    ln = _ln_backward_node(g, x, w, extra != "nogb")
    gx, gw, *gb = N._norm_rule(g, None, x, w, w, axes=(len(shape) - 1,), eps=1e-5,
                               param_shape=(C,))
    main = gx if mode == 0 else (r + gx if mode == 1 else gx + r)
    want = [main, gw] + (gb if extra != "nogb" else [])
    sums, tos = [], []
    if extra == "sums":
        flat = main.reshape(-1, C)
        want.append(REGISTRY["sum"].forward(flat, dims=(0,)))
        sums = [Node(REGISTRY["sum"], "sum", [_v("flat", flat.shape, dtype)], {"dims": (0,)},
                     [_v("cs", (C,), dtype)])]
        if len(shape) == 3:
            want.append(REGISTRY["sum_to"].forward(main, shape=shape[1:]))
            tos = [Node(REGISTRY["sum_to"], "sum_to", [_v("m", shape, dtype)],
                        {"shape": shape[1:]}, [_v("ps", shape[1:], dtype)])]
    outs = [_v("main", shape, dtype)] + ln.outputs[1:] + [m.outputs[0] for m in sums + tos]
    node = Node(None, "residual_layer_norm_backward", ln.inputs + (
        [_v("r", shape, dtype)] if mode else []), dict(ln.params, residual=mode), outs,
        meta={"with_gb": extra != "nogb", "sums": sums, "sum_to": tos})
    fn = KR.residual_layer_norm_backward_factory(node)
    if C == 1:
        assert fn is None
        return
    assert fn is not None
    got = fn(g, x, w, *([r] if mode else []), **node.params)
    assert len(got) == len(want)
    for a, b in zip(got, want):
        assert a.dtype == b.dtype == dtype and a.shape == b.shape
        np.testing.assert_array_equal(_bits(a), _bits(b))


@pytest.mark.parametrize("dtype", DTYPES)
def test_column_sums_of_negative_zero_columns_are_numpys(dtype):
    """numpy's axis-0 sums add the rows into 0.0: a column of g that is -0.0 in every row
    gives gb = +0.0 there (the kernel once started from the first row: -0.0)."""
    shape, C = (4, 8, 16), 16
    g, x, w = _data(shape, dtype, 7), _data(shape, dtype, 8), _data((C,), dtype, 9)
    g[..., 3] = -0.0
    r = _data(shape, dtype, 10)
    ln = _ln_backward_node(g, x, w, True)
    gx, gw, gb = N._norm_rule(g, None, x, w, w, axes=(2,), eps=1e-5, param_shape=(C,))
    assert _bits(gb)[3] == 0  # numpy's: +0.0
    main = gx + r
    flat = main.reshape(-1, C)
    sums = [Node(REGISTRY["sum"], "sum", [_v("flat", flat.shape, dtype)], {"dims": (0,)},
                 [_v("cs", (C,), dtype)])]
    tos = [Node(REGISTRY["sum_to"], "sum_to", [_v("m", shape, dtype)], {"shape": shape[1:]},
                [_v("ps", shape[1:], dtype)])]
    want = [main, gw, gb, REGISTRY["sum"].forward(flat, dims=(0,)),
            REGISTRY["sum_to"].forward(main, shape=shape[1:])]
    node = Node(None, "residual_layer_norm_backward", ln.inputs + [_v("r", shape, dtype)],
                dict(ln.params, residual=2), [_v("main", shape, dtype)] + ln.outputs[1:] +
                [sums[0].outputs[0], tos[0].outputs[0]],
                meta={"with_gb": True, "sums": sums, "sum_to": tos})
    got = KR.residual_layer_norm_backward_factory(node)(g, x, w, r, **node.params)
    assert len(got) == len(want)
    for a, b in zip(got, want):
        np.testing.assert_array_equal(_bits(a), _bits(b))


# --- the passes on a compiled residual stack ------------------------------------------------
def _stack(dtype, seed=0, embed=False):
    """Embedding + broadcast position rows, three LayerNorms each read from a residual sum,
    linears between them (GPT's residual stream): the gradient's adds, the linears' bias
    sums and the position embedding's sum_to. ``embed``: the rows are token and position
    embeddings (nn.Embedding, the GPT's): their tables' gradients are scattered from the
    last LayerNorm gradient (repeated tokens: rows added in order)."""
    rng = np.random.default_rng(seed)
    B, T, C = 3, 5, 12
    tapegrad.manual_seed(seed)
    x = tapegrad.tensor(rng.standard_normal((B, T, C)).astype(dtype), requires_grad=True)
    pos = tapegrad.tensor(rng.standard_normal((T, C)).astype(dtype), requires_grad=True)
    if embed:
        tok_emb, pos_emb = tapegrad.nn.Embedding(7, C), tapegrad.nn.Embedding(T, C)
        for m in (tok_emb, pos_emb):
            m.to(getattr(tapegrad, np.dtype(dtype).name))
        x, pos = tok_emb.weight, pos_emb.weight
        tokens = tapegrad.tensor(rng.integers(0, 7, (B, T)))  # an argument (a captured
        # integer tensor would be frozen into the graph: a graph break)
    lns = [tapegrad.nn.LayerNorm(C) for _ in range(3)]
    lins = [tapegrad.nn.Linear(C, C) for _ in range(3)]
    for m in lns + lins:
        m.to(getattr(tapegrad, np.dtype(dtype).name))
    for ln in lns:
        ln.weight.data = tapegrad.tensor(rng.standard_normal(C).astype(dtype))
        ln.bias.data = tapegrad.tensor(rng.standard_normal(C).astype(dtype))
    wout = tapegrad.tensor(rng.standard_normal((B, T, C)).astype(dtype))
    params = [x, pos] + [p for m in lns + lins for p in m.parameters()]

    def step(*tok):
        for p in params:
            p.grad = None
        if embed:
            h = tok_emb(tok[0]) + pos_emb(tapegrad.arange(T))
        else:
            h = x + pos
        h = h + lins[0](lns[0](h))
        h = h + lins[1](lns[1](h))
        loss = (lins[2](lns[2](h)) * wout).sum()
        loss.backward()
        return loss

    return step, params, ((tokens,) if embed else ())


@pytest.mark.parametrize("backend", ["numpy", "numba"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("embed", [False, True])
def test_compiled_residual_stack_is_eager_bitwise(monkeypatch, backend, dtype, embed):
    monkeypatch.setenv("TAPEGRAD_COMPILE_KERNELS", backend)
    step, params, args = _stack(dtype, embed=embed)
    eager = []
    for _ in range(2):
        loss = step(*args)
        eager.append([loss.detach().numpy().copy()] + [p.grad.numpy().copy() for p in params])
    comp = tapegrad.compile(step)
    for i in range(2):
        loss = comp(*args)
        got = [loss.detach().numpy()] + [p.grad.numpy() for p in params]
        for a, b in zip(got, eager[i]):
            assert a.dtype == b.dtype
            np.testing.assert_array_equal(_bits(a), _bits(b))
    body = comp.entries[-1].source.split("\ndef ")[-1]
    lines = body.splitlines()
    backward = [ln for ln in lines if "residual_layer_norm_backward" in ln]
    assert len(backward) == 3
    assert sum("residual_layer_norm" in ln for ln in lines) == 6
    assert sum("residual=1" in ln or "residual=2" in ln for ln in lines) == 2
    # the residual gradients' adds, the bias sums of the LayerNorms' gradients and the position
    # rows' sum_to are absorbed (the last linear's bias sum reads the loss's gradient)
    assert not [ln for ln in lines if "= add(" in ln or "sum_to(" in ln]
    assert len([ln for ln in lines if "= sum(" in ln]) == 1
    assert ("residual_layer_norm_kernel" in body) == (backend == "numba")
    # the two tables' scatters come out of the last LayerNorm gradient's node
    assert not [ln for ln in lines if "embedding_backward" in ln]
    # the tokens are read once their range is checked (``check_index``'s result)
    checked = [ln.split("=")[0].strip() for ln in lines if "check_index(a00" in ln]
    assert len(checked) == (1 if embed else 0)
    idx = checked[0] if embed else "a00"
    assert bool(re.search(rf"\b{idx}\b", backward[-1])) == embed
    # the token rows are gathered by the first residual LayerNorm's kernel
    assert sum("gather=True" in ln for ln in lines) == (1 if embed else 0)
    assert not [ln for ln in lines if "= embedding(" in ln and re.search(rf"\b{idx}\b", ln)]


@pytest.mark.parametrize("dtype", DTYPES)
def test_residual_layer_norm_gather_is_eager_bitwise_and_raises_out_of_range(dtype):
    """The first operand gathered from a table (the token embedding's w[idx], negative
    indices wrapping as numpy's): the same bits; an index out of range: eager's IndexError."""
    C, shape = 12, (3, 5, 12)
    tab, b = _data((7, C), dtype, 1), _data(shape, dtype, 2)
    w, bias = _data((C,), dtype, 3), _data((C,), dtype, 4)
    idx = np.random.default_rng(0).integers(-7, 7, shape[:2])
    params = {"axes": (2,), "eps": 1e-5, "param_shape": (C,), "swap": False, "gather": True}
    emb = Node(REGISTRY["embedding"], "embedding", [_v("t", tab.shape, dtype),
                                                    _v("i", idx.shape, idx.dtype)],
               {"padding_idx": None, "scale": None}, [_v("a", shape, dtype)])
    add = Node(REGISTRY["add"], "add", [emb.outputs[0], _v("b", shape, dtype)], {},
               [_v("s", shape, dtype)])
    ln = Node(REGISTRY["layer_norm"], "layer_norm", [add.outputs[0], _v("w", (C,), dtype),
                                                     _v("bb", (C,), dtype)],
              {"axes": (2,), "eps": 1e-5, "param_shape": (C,)}, [_v("y", shape, dtype)])
    node = Node(None, "residual_layer_norm", emb.inputs + [add.inputs[1]] + ln.inputs[1:],
                params, [add.outputs[0], ln.outputs[0]],
                impl=KR._residual_ln_impl(add, None, ln, emb))
    fn = KR.residual_layer_norm_factory(node)
    s_want = tab[idx] + b
    y_want = N.layer_norm.forward(s_want, w, bias, **ln.params)
    s_got, y_got = fn(tab, idx, b, w, bias, **params)
    np.testing.assert_array_equal(_bits(s_got), _bits(s_want))
    np.testing.assert_array_equal(_bits(y_got), _bits(y_want))
    idx[2, 4] = 7
    with pytest.raises(IndexError):
        fn(tab, idx, b, w, bias, **params)


@pytest.mark.parametrize("dtype", DTYPES)
def test_embedding_scatter_out_of_range_raises_eagers_error(dtype):
    """An index outside [-W, W): the kernel leaves the table to eager's op, which raises."""
    C, shape = 4, (2, 3, 4)
    g, x, w = _data(shape, dtype, 1), _data(shape, dtype, 2), _data((C,), dtype, 3)
    ln = _ln_backward_node(g, x, w, True)
    idx = np.array([[0, 1, 2], [5, 0, -6]])
    emb = Node(REGISTRY["embedding_backward"], "embedding_backward",
               [_v("m", shape, dtype), _v("idx", idx.shape, idx.dtype)],
               {"num_weights": 5, "padding_idx": None, "scale": None},
               [_v("t", (5, C), dtype)])
    node = Node(None, "residual_layer_norm_backward", ln.inputs + [emb.inputs[1]],
                dict(ln.params, residual=0), ln.outputs + emb.outputs,
                meta={"with_gb": True, "sums": [], "sum_to": [], "embeddings": [(emb, 0)]})
    fn = KR.residual_layer_norm_backward_factory(node)
    with pytest.raises(IndexError):
        N.embedding_backward.forward(g, idx, 5)
    with pytest.raises(IndexError):
        fn(g, x, w, idx, **node.params)
    idx[1] = [4, 0, -5]  # in range (-5 wraps, as numpy's add.at); row 0 twice
    got = fn(g, x, w, idx, **node.params)
    want = N.embedding_backward.forward(N._norm_rule(g, None, x, w, w, axes=(2,), eps=1e-5,
                                                     param_shape=(C,))[0], idx, 5)
    np.testing.assert_array_equal(_bits(got[-1]), _bits(want))


def test_residual_layer_norm_pass_leaves_other_adds():
    """An add whose operands differ in dtype, or a LayerNorm over two axes, stays as it is."""
    from tapegrad.compiler import passes
    from tapegrad.compiler.ir import Graph

    g = Graph()
    a = g.new_value((4, 6), np.float32)
    b = g.new_value((4, 6), np.float64)
    w = g.new_value((6,), np.float64)
    g.inputs = [(a, None), (b, None), (w, None)]
    s = g.new_value((4, 6), np.float64)
    g.nodes.append(Node(REGISTRY["add"], "add", [a, b], {}, [s]))
    y = g.new_value((4, 6), np.float64)
    g.nodes.append(Node(REGISTRY["layer_norm"], "layer_norm", [s, w],
                        {"axes": (1,), "eps": 1e-5, "param_shape": (6,)}, [y]))
    g.outputs = [y]
    out = passes.fuse_residual_layer_norm(g)
    assert [n.name for n in out.nodes] == ["add", "layer_norm"]
    g2 = Graph()
    c = g2.new_value((4, 6), np.float64)
    d = g2.new_value((4, 6), np.float64)
    g2.inputs = [(c, None), (d, None)]
    s2 = g2.new_value((4, 6), np.float64)
    g2.nodes.append(Node(REGISTRY["add"], "add", [c, d], {}, [s2]))
    y2 = g2.new_value((4, 6), np.float64)
    g2.nodes.append(Node(REGISTRY["layer_norm"], "layer_norm", [s2],
                         {"axes": (0, 1), "eps": 1e-5, "param_shape": (4, 6)}, [y2]))
    g2.outputs = [y2]
    assert [n.name for n in passes.fuse_residual_layer_norm(g2).nodes] == ["add", "layer_norm"]


@pytest.mark.parametrize("backend", ["numpy", "numba"])
def test_embedding_rows_added_to_themselves_stay_an_input(monkeypatch, backend):
    """add(e, e) of one embedding's rows read by a LayerNorm: the rows are both operands, so
    the embedding is not folded into the kernel's gather (its value is still read)."""
    monkeypatch.setenv("TAPEGRAD_COMPILE_KERNELS", backend)
    rng = np.random.default_rng(3)
    emb, ln = tapegrad.nn.Embedding(6, 8), tapegrad.nn.LayerNorm(8)
    tokens = tapegrad.tensor(rng.integers(0, 6, (2, 4)))

    def step(tok):
        emb.weight.grad = None
        e = emb(tok)
        loss = (ln(e + e) * 1.5).sum()
        loss.backward()
        return loss

    want = [step(tokens).item(), emb.weight.grad.numpy().copy()]
    comp = tapegrad.compile(step)
    for _ in range(2):
        got = [comp(tokens).item(), emb.weight.grad.numpy()]
    assert got[0] == want[0]
    np.testing.assert_array_equal(_bits(got[1]), _bits(want[1]))
    assert "gather=True" not in comp.entries[-1].source


@pytest.mark.parametrize("dtype", DTYPES)
def test_kernels_take_non_contiguous_inputs(dtype):
    """Transposed (Fortran-ordered) and strided inputs: the kernels read them as contiguous
    rows (a copy), the same bits as eager."""
    C = 16
    x = _data((C, 24), dtype, 1).T  # (24, 16), Fortran order
    g = _data((48, C), dtype, 2)[::2]
    w, b = _data((C,), dtype, 3), _data((C,), dtype, 4)
    got = KR.layer_norm_call((24, C), np.dtype(dtype))(x, w, b, 1e-5)
    want = N._norm_forward(x, w, b, axes=(1,), eps=1e-5, param_shape=(C,))
    np.testing.assert_array_equal(_bits(got), _bits(want))
    ln = _ln_backward_node(np.ascontiguousarray(g), np.ascontiguousarray(x), w, True)
    node = Node(None, "residual_layer_norm_backward", ln.inputs, dict(ln.params, residual=0),
                ln.outputs, meta={"with_gb": True, "sums": [], "sum_to": []},
                impl=KR._ln_backward_residual_impl(ln, None, [], [], []))
    got = KR.residual_layer_norm_backward_factory(node)(g, x, w, **node.params)
    want = N._norm_rule(g, None, x, w, w, axes=(1,), eps=1e-5, param_shape=(C,))
    for a, b_ in zip(got, want):
        np.testing.assert_array_equal(_bits(a), _bits(b_))
    # the fused forward: a strided operand of the residual add
    a2 = _data((C, 24), dtype, 5).T
    add = Node(REGISTRY["add"], "add", [_v("a", (24, C), dtype), _v("b", (24, C), dtype)], {},
               [_v("s", (24, C), dtype)])
    lnf = Node(REGISTRY["layer_norm"], "layer_norm", [add.outputs[0], _v("w", (C,), dtype),
                                                      _v("bb", (C,), dtype)],
               {"axes": (1,), "eps": 1e-5, "param_shape": (C,)}, [_v("y", (24, C), dtype)])
    params = dict(lnf.params, swap=False)
    fwd = Node(None, "residual_layer_norm", add.inputs + lnf.inputs[1:], params,
               [add.outputs[0], lnf.outputs[0]], impl=KR._residual_ln_impl(add, None, lnf, None))
    s_got, y_got = KR.residual_layer_norm_factory(fwd)(a2, g, w, b, **params)
    s_want = a2 + g
    np.testing.assert_array_equal(_bits(s_got), _bits(s_want))
    np.testing.assert_array_equal(_bits(y_got), _bits(N.layer_norm.forward(s_want, w, b,
                                                                           **lnf.params)))
