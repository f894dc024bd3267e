"""compiler/kernels_loss.py: the fused softmax cross-entropy's numba passes (loss, logits
gradient, the gradient's column sums) against eager's ``cross_entropy_index`` and its backward,
bit for bit, special values included; its errors; and a compiled tied-head language-model step
against eager."""
import numpy as np
import pytest

pytest.importorskip("numba")

import tapegrad as tg  # noqa: E402
import tapegrad.nn.functional as F  # noqa: E402
from tapegrad.compiler import kernels, kernels_loss  # noqa: E402
from tapegrad.ops.nn import cross_entropy_index, cross_entropy_index_backward  # noqa: E402

DTYPES = [np.float64, np.float32]


def _eager(x, t, g, ignore_index, mean):
    loss = cross_entropy_index.forward(x, t, ignore_index=ignore_index, mean=mean)
    grad = cross_entropy_index_backward.forward(g, x, t, ignore_index=ignore_index, mean=mean)
    return np.asarray(loss), grad, np.add.reduce(grad, axis=0)


def _bits(a):
    a = np.ascontiguousarray(a).reshape(-1)
    return a.view(np.uint32 if a.dtype == np.float32 else np.uint64)


def _same(got, want):
    assert len(got) == len(want)
    for k, (a, b) in enumerate(zip(got, want)):
        assert a.dtype == b.dtype and a.shape == b.shape, (k, a.dtype, b.dtype, a.shape, b.shape)
        nan = np.isnan(b)
        np.testing.assert_array_equal(np.isnan(a), nan, err_msg=f"output {k}")
        np.testing.assert_array_equal(_bits(np.where(nan, 0, a)), _bits(np.where(nan, 0, b)),
                                      err_msg=f"output {k}")


def _check(x, t, g, ignore_index=-100, mean=True):
    want = _eager(x, t, g, ignore_index, mean)
    for with_sum in (False, True):
        got = kernels_loss.cross_entropy_call(with_sum)(x, t, g, ignore_index=ignore_index,
                                                        mean=mean)
        _same(got, want if with_sum else want[:2])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("C", [1, 5, 8, 16, 31, 32, 33, 95, 128, 129, 300])
@pytest.mark.parametrize("ignored", [False, True])
def test_kernel_is_eager_bitwise(dtype, C, ignored):
    """Rows of every length kind (below 8, one pairwise block, halves above 128; the max's
    16-lane loop and its tail), ignored rows, sum and mean, a gradient scale that is not 1
    (negative: -0.0 elements) and logits far apart (exp underflows to 0)."""
    rng = np.random.default_rng(C + 1000 * ignored)
    n = 37
    for spread in (1.0, 40.0, 200.0):
        x = (rng.standard_normal((n, C)) * spread).astype(dtype)
        t = rng.integers(0, C, n)
        ii = -100
        if ignored:
            ii = int(t[0])
            t[::3] = ii
        for g in (np.ones((), dtype), np.asarray(-0.37, dtype)):
            for mean in (True, False):
                _check(x, t, g, ii, mean)


@pytest.mark.parametrize("dtype", DTYPES)
def test_kernel_special_values_as_eager(dtype):
    """+-inf, NaN of either sign, signed zeros and subnormals in the logits: the row max is
    numpy's (a NaN taken, -0.0 and 0.0 alike in what follows), so are every result bit."""
    C = 40
    rng = np.random.default_rng(5)
    x = rng.standard_normal((14, C)).astype(dtype)
    neg_nan = -np.abs(np.array(np.nan, dtype))
    x[0, 3] = np.inf
    x[1, :] = -np.inf
    x[2, 7] = np.nan
    x[3, 30] = neg_nan  # a NaN with its sign bit set (x86's default NaN)
    x[4, :] = -0.0
    x[5, :] = 0.0
    x[5, ::2] = -0.0
    x[6, :] = -np.abs(x[6])
    x[6, 11] = -0.0
    x[7, :] = np.finfo(dtype).tiny / 8  # subnormals
    x[8, 0] = np.finfo(dtype).max
    x[8, 1] = -np.finfo(dtype).max
    x[9, 5] = np.inf
    x[9, 6] = np.inf
    x[10, 0] = neg_nan
    x[11, C - 1] = np.nan  # in the max loop's tail
    x[12, 16] = -np.inf
    t = rng.integers(0, C, 14)
    t[0], t[9], t[12] = 3, 5, 16  # the target at the inf
    with np.errstate(all="ignore"):  # (eager's numpy warns of inf - inf and max - -max)
        for mean in (True, False):
            _check(x, t, np.ones((), dtype), -100, mean)


@pytest.mark.parametrize("dtype", DTYPES)
def test_kernel_all_rows_ignored_and_non_contiguous_logits(dtype):
    """Every row ignored: the mean loss is NaN and the gradient 0 (as eager); logits that are
    a transposed view are read as eager reads them."""
    rng = np.random.default_rng(6)
    x = rng.standard_normal((9, 6)).astype(dtype)
    t = np.full(9, 2)
    for mean in (True, False):
        _check(x, t, np.ones((), dtype), 2, mean)
    xt = rng.standard_normal((11, 20)).astype(dtype).T  # (20, 11), F-ordered
    _check(xt, rng.integers(0, 11, 20), np.ones((), dtype))
    _check(x, rng.integers(0, 6, 9).astype(np.int32), np.ones((), dtype))  # int32 targets


@pytest.mark.parametrize("dtype", DTYPES)
def test_kernel_empty_batch_as_eager(dtype):
    """No rows: eager's own values (the mean is NaN, the sum 0, an empty gradient)."""
    x = np.zeros((0, 7), dtype)
    t = np.zeros(0, np.int64)
    for mean in (True, False):
        _check(x, t, np.ones((), dtype), -100, mean)


@pytest.mark.parametrize("bad", [7, -1, 100])
def test_kernel_target_out_of_range_raises_eagers_error(bad):
    x = np.zeros((5, 7), np.float32)
    t = np.array([0, 1, bad, 3, 4])
    with pytest.raises(IndexError, match=rf"^cross_entropy: Target {bad} is out of bounds "
                                         r"\(7 classes\)$"):
        kernels_loss.cross_entropy_call(False)(x, t, np.ones((), np.float32))
    # an ignored row's target may be anything
    t[2] = -100
    _check(x, t, np.ones((), np.float32))


def test_the_generated_code_takes_kernels_loss():
    """kernels.cross_entropy_call / cross_entropy are this module's (the kernel's module also
    holds numpy's pairwise sum, which other tests read)."""
    import sys

    mod = sys.modules[kernels.cross_entropy().py_func.__module__]
    assert mod.ce_grad is kernels.cross_entropy() and hasattr(mod, "pairwise_sum")
    fused = kernels.cross_entropy_call(True)
    assert fused.__code__ is kernels_loss.cross_entropy_call(True).__code__


@pytest.mark.parametrize("n", list(range(0, 129)) + [129, 256, 1000])
def test_inlined_pairwise_block_is_numpys(n):
    """kernels.PAIRWISE's pairwise_block, inlined into a caller's row loop (where it
    vectorises), sums as numpy's add.reduce for every length up to a block (and
    pairwise_sum's halves above it in the gradient kernel)."""
    import sys

    mod = sys.modules[kernels_loss.cross_entropy().py_func.__module__]
    rng = np.random.default_rng(n)
    for dtype in DTYPES:
        a = (rng.standard_normal((3, n)) * 10).astype(dtype)
        e = np.abs(a)
        se = np.empty(3, dtype)
        want = np.add.reduce(e, axis=1)
        mod.ce_grad(e, np.zeros(3, np.int64) if n else np.full(3, -100), -100, dtype(1), se,
                    np.empty(0, dtype), 0)  # (e becomes the gradient)
        np.testing.assert_array_equal(se, want)
        if n <= 128:
            assert mod.pairwise_block(a[1], 0, n) == np.add.reduce(a[1])


def _lm_step(dtype, vocab=23, dim=16, ignore=False):
    """A tied-embedding language-model head (the char GPT's: embedding, LayerNorm, the head
    ``linear(h, emb.weight)``), cross-entropy over (batch * block) rows, SGD."""
    rng = np.random.default_rng(7)
    emb = tg.tensor((rng.standard_normal((vocab, dim)) * 0.5).astype(dtype), requires_grad=True)
    w1 = tg.tensor((rng.standard_normal((dim, dim)) * 0.3).astype(dtype), requires_grad=True)
    b1 = tg.tensor(np.zeros(dim, dtype), requires_grad=True)
    params = [emb, w1, b1]
    opt = tg.optim.SGD(params, lr=0.1)

    def step(x, y):
        h = F.embedding(x, emb)
        h = F.layer_norm(h + F.gelu(F.linear(h, w1, b1)), (dim,))
        logits = F.linear(h, emb)
        loss = F.cross_entropy(logits.view(-1, vocab), y.view(-1),
                               ignore_index=0 if ignore else -100)
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss

    return step, params


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("ignore", [False, True])
def test_compiled_tied_head_step_is_eager_bitwise(monkeypatch, dtype, ignore):
    monkeypatch.setenv("TAPEGRAD_COMPILE_KERNELS", "numba")
    vocab = 23
    rng = np.random.default_rng(8)
    batches = [tuple(tg.tensor(rng.integers(0, vocab, (4, 8))) for _ in "xy") for _ in range(5)]
    estep, eparams = _lm_step(dtype, vocab, ignore=ignore)
    cstep, cparams = _lm_step(dtype, vocab, ignore=ignore)
    comp = tg.compile(cstep)
    for x, y in batches:
        le, lc = estep(x, y).detach().numpy(), comp(x, y).detach().numpy()
        assert lc.dtype == le.dtype == dtype
        np.testing.assert_array_equal(_bits(lc), _bits(le))
        for pe, pc in zip(eparams, cparams):
            np.testing.assert_array_equal(_bits(pc.detach().numpy()), _bits(pe.detach().numpy()))
    names = [n.name for e in comp.entries for n in e.graph.nodes]
    assert "cross_entropy_fused" in names and "cross_entropy_index" not in names
    assert not comp.breaks


def _linear_node(xs, ws, dtype, bias):
    from tapegrad.compiler.ir import Node, Value
    from tapegrad.ops.nn import linear

    dt = np.dtype(dtype)
    vals = [Value("x", xs, dt), Value("w", ws, dt)] + ([Value("b", (ws[0],), dt)] if bias else [])
    return Node(linear, "linear", vals, {}, [Value("out", xs[:-1] + (ws[0],), dt)])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("xs,ws", [((16, 32, 64), (95, 64)), ((16, 32, 64), (192, 64)),
                                   ((16, 32, 64), (256, 64)), ((16, 32, 256), (64, 256)),
                                   ((4, 2, 8, 64), (64, 64))])
@pytest.mark.parametrize("bias", [False, True])
def test_linear_over_a_stack_of_rows_is_eager_bitwise(dtype, xs, ws, bias):
    """The char GPT's linears (the LM head's (16, 32, 64) x (95, 64) among them): the kernel
    (numpy's stacked product against w.T made contiguous) serves them, with eager's bits."""
    from tapegrad.compiler import op_kernels
    from tapegrad.ops.nn import linear

    fn = op_kernels.lookup(_linear_node(xs, ws, dtype, bias))
    assert fn is kernels_loss.linear_stacked
    rng = np.random.default_rng(sum(xs) + sum(ws))
    for scale in (1.0, 30.0):
        x = (rng.standard_normal(xs) * scale).astype(dtype)
        w = rng.standard_normal(ws).astype(dtype)
        args = (x, w) + ((rng.standard_normal(ws[0]).astype(dtype),) if bias else ())
        got, want = fn(*args), linear.forward(*args)
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_array_equal(_bits(got), _bits(want))
    # strided activations (the same shape, another layout): eager's bits too
    xt = np.swapaxes(rng.standard_normal(xs[:-3] + (xs[-2], xs[-3], xs[-1])).astype(dtype),
                     -3, -2)
    got, want = fn(xt, *args[1:]), linear.forward(xt, *args[1:])
    np.testing.assert_array_equal(_bits(got), _bits(want))


@pytest.mark.parametrize("xs,ws,dtype", [
    ((512, 1, 64), (64, 64), np.float32),     # one row per index (numpy takes GEMV)
    ((2, 256, 512), (512, 512), np.float32),  # large: the single GEMM is faster
    ((512, 64), (95, 64), np.float32),        # 2-D already
    ((16, 32, 64), (95, 64), np.float16),
])
def test_linear_kernel_declines_other_shapes(xs, ws, dtype):
    from tapegrad.compiler import op_kernels

    assert op_kernels.lookup(_linear_node(xs, ws, dtype, False)) is None


def test_linear_kernel_declines_where_the_probe_finds_other_bits(monkeypatch):
    """The probe compares the two forms' bits on random operands of the node's shape; where
    they differ in one bit (here: the stacked form's made to) the node keeps eager's linear."""
    from tapegrad.backend import blas
    from tapegrad.compiler import op_kernels

    real = blas.matmul

    def off_by_one_ulp(a, b):
        out = real(a, b)
        return np.nextafter(out, np.inf) if b.flags.c_contiguous else out

    monkeypatch.setattr(blas, "matmul", off_by_one_ulp)
    monkeypatch.setattr(kernels_loss, "_stacked_same", {})
    node = _linear_node((16, 32, 64), (95, 64), np.float32, False)
    assert op_kernels.lookup(node) is None
    monkeypatch.setattr(blas, "matmul", real)
    monkeypatch.setattr(kernels_loss, "_stacked_same", {})
    assert op_kernels.lookup(node) is kernels_loss.linear_stacked
