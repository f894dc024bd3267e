"""tapegrad.compile is never silently wrong: index range checks run in the compiled graph on
each call's indices (numpy would wrap a negative index around where eager raises), and a
compiled training step is eager's numbers (bitwise where the kernels sum in eager's order,
within the analysed bound where a kernel documents another order)."""
import numpy as np
import pytest

import tapegrad as tg
import tapegrad.nn.functional as F
from helpers import error_of




def _gather(x, i):
    return tg.gather(x, 0, i).sum()


def _index_select(x, i):
    return tg.index_select(x, 0, i).sum()


def _index_select_dim1(x, i):
    return tg.index_select(x, 1, i).sum()


def _scatter_add(x, i):
    return tg.scatter_add(x, 0, i, tg.ones(2, 4)).sum()


def _take_along_dim(x, i):
    return tg.take_along_dim(x, i.reshape(-1)).sum()


def _embedding(x, i):
    return F.embedding(i, x).sum()


def _scatter(x, i):
    return tg.scatter(x, 0, i, tg.ones(2, 4)).sum()


def _scatter_reduce(x, i):
    return tg.scatter_reduce(x, 0, i, tg.ones(2, 4), "amax").sum()


def _index_add(x, i):
    return x.index_add(0, i, tg.ones(3, 4)).sum()


def _index_copy(x, i):
    return x.index_copy(0, i, tg.ones(3, 4)).sum()


def _index_fill(x, i):
    return x.index_fill(0, i, 2.0).sum()


def _take(x, i):
    return tg.take(x, i).sum()


def _cross_entropy(x, i):
    return F.cross_entropy(x, i)


def _nll_loss(x, i):
    return F.nll_loss(F.log_softmax(x, dim=1), i)


# (fn, input shape, valid index, position of the entry made bad, the dim's size, whether
# indices in [-n, 0) are valid: then -n - 1 and -n - 4 are the bad negative ones)
_GRID = [[0, 1, 2, 3], [4, 0, 1, 2]]
CASES = {
    "gather": (_gather, (5, 4), _GRID, (1, 0), 5, False),
    "scatter_add": (_scatter_add, (5, 4), _GRID, (1, 0), 5, False),
    "scatter": (_scatter, (5, 4), _GRID, (1, 0), 5, False),
    "scatter_reduce": (_scatter_reduce, (5, 4), _GRID, (1, 0), 5, False),
    "take_along_dim": (_take_along_dim, (5, 4), _GRID, (1, 0), 20, False),
    "index_select": (_index_select, (5, 4), [0, 2, 1], (1,), 5, False),
    "index_select_dim1": (_index_select_dim1, (5, 4), [0, 2, 1], (1,), 4, False),
    "index_add": (_index_add, (5, 4), [0, 2, 1], (1,), 5, False),
    "index_copy": (_index_copy, (5, 4), [0, 2, 1], (1,), 5, False),
    "index_fill": (_index_fill, (5, 4), [0, 2, 1], (1,), 5, True),
    "take": (_take, (5, 4), [0, 19, 3], (1,), 20, True),
    "embedding": (_embedding, (5, 3), [[0, 2], [1, 4]], (1, 0), 5, False),
    "cross_entropy": (_cross_entropy, (3, 5), [0, 4, 2], (1,), 5, False),
    "nll_loss": (_nll_loss, (3, 5), [0, 4, 2], (1,), 5, False),
}


def _with(valid, at, value):
    a = np.array(valid, dtype=np.int64)
    a[at] = value
    return tg.tensor(a)


@pytest.mark.parametrize("backward", [False, True], ids=["forward", "backward_only"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_compiled_index_ops_raise_eagers_error_on_out_of_range_indices(case, backward):
    fn, shape, valid, at, n, negative = CASES[case]
    x = tg.randn(*shape, requires_grad=True)

    def step(x, i):
        loss = fn(x, i)
        if backward:  # nothing returned: the forward's own nodes are dead code
            loss.backward()
            return None
        return loss

    compiled = tg.compile(step)
    good = tg.tensor(np.array(valid, dtype=np.int64))
    for _ in range(2):
        compiled(x, good)
    for bad in ((-n - 1, -n - 4) if negative else (-1, -3)) + (n, n + 7):
        i = _with(valid, at, bad)
        want = error_of(step, x, i)
        assert want is not None, (case, bad)  # eager raises (as PyTorch)
        assert error_of(compiled, x, i) == want, (case, bad)
    if negative and not backward:  # a valid negative index counts from the end, as eager
        i = _with(valid, at, -1)
        assert compiled(x, i).item() == step(x, i).item()
    x.grad = None
    assert error_of(compiled, x, good) is None  # valid indices still run after the errors
    if backward:
        eager_x = tg.tensor(x.detach().numpy(), requires_grad=True)
        step(eager_x, good)
        assert np.array_equal(x.grad.numpy(), eager_x.grad.numpy())


def test_compiled_graph_reads_the_indices_after_their_check():
    x = tg.randn(5, 4, requires_grad=True)
    from tapegrad.compiler import trace

    graph = trace(_gather, x, tg.tensor(_GRID))
    text = str(graph)
    check = text.index("check_index(")
    assert check < text.index(" index(")


@pytest.mark.parametrize("bad", [[0, -1, 2], [0, -3, 9], [3, 0, 1], [0, 1, 40]])
def test_compiled_one_hot_checks_each_calls_classes(bad):
    """A given class count is checked on each call's values (negatives first, as eager and
    PyTorch); the traced call's valid classes say nothing about a later call's."""
    def fn(i):
        return F.one_hot(i, 3) * 2

    compiled = tg.compile(fn)
    good = tg.tensor([0, 2, 1])
    for _ in range(3):  # the first calls trace; the later ones run the graph
        assert np.array_equal(compiled(good).numpy(), fn(good).numpy())
    want = error_of(fn, tg.tensor(bad))
    assert want is not None and want[0] is RuntimeError
    assert error_of(compiled, tg.tensor(bad)) == want
    assert np.array_equal(compiled(good).numpy(), fn(good).numpy())


def test_compiled_cross_entropy_ignores_ignore_index_only():
    x = tg.randn(4, 5, requires_grad=True)

    def step(x, t):
        loss = F.cross_entropy(x, t, ignore_index=-100)
        loss.backward()
        return loss

    compiled = tg.compile(step)
    compiled(x, tg.tensor([0, 1, 2, 3]))
    got = compiled(x, tg.tensor([0, -100, 2, 3]))
    ex = tg.tensor(x.detach().numpy(), requires_grad=True)
    want = step(ex, tg.tensor([0, -100, 2, 3]))
    assert got.item() == want.item()
    for t in ([0, -1, 2, 3], [0, -3, 2, 3], [0, 5, 2, 3], [0, -100, 5, -1]):
        want = error_of(step, ex, tg.tensor(t))
        assert want is not None and want[0] is IndexError
        assert error_of(compiled, x, tg.tensor(t)) == want


def test_compiled_gpt_step_with_kernels_raises_on_bad_tokens_and_targets(monkeypatch):
    """The char GPT's step under the numba kernels (its embedding gathers and scatters and
    its cross-entropy are hand kernels there): bad tokens or targets raise eager's error."""
    pytest.importorskip("numba")
    monkeypatch.setenv("TAPEGRAD_COMPILE_KERNELS", "numba")
    from tapegrad.bench import models as M
    from tapegrad.bench.compile import _model_step

    state, batches = M.initial_state("gpt"), M.make_data("gpt", 2)
    S = M.Step(tg, "gpt", state, batches, np.float64)
    fn = tg.compile(_model_step(S))
    x, y = S.batches[0]
    fn(x, y)
    fn(x, y)
    src = fn.entries[-1].source
    assert "residual_layer_norm" in src and "cross_entropy_fused" in src  # the kernels fire
    before = {k: v.detach().numpy().copy() for k, v in S.model.state_dict().items()}
    V = S.vocab
    for bad in (-1, -3, V):
        for which in ("tokens", "targets"):
            tokens, targets = batches[0][0].copy(), batches[0][1].copy()
            (tokens if which == "tokens" else targets).reshape(-1)[5] = bad
            eager = M.Step(tg, "gpt", state, [(tokens, targets)], np.float64)
            args = eager.batches[0]
            want = error_of(eager)
            assert want is not None and want[0] is IndexError, (which, bad)
            assert error_of(fn, *args) == want, (which, bad)
    after = S.model.state_dict()
    for k, v in before.items():  # the failed calls changed no parameter
        assert np.array_equal(after[k].numpy(), v), k


# --- compiled steps are eager's numbers -----------------------------------------------------
_REORDERED = "reordered sums"  # codegen's note on a kernel whose products are not eager's bits


def _exact_where_reordered(monkeypatch, fn):
    """Where this machine's BLAS blocks a product the kernels reorder (the note in the
    source), the bitwise comparison runs with ``TAPEGRAD_COMPILE_EXACT=1``; the reordered
    kernel's bound is tested on its own (test_reordered_contraction_within_its_bound)."""
    if _REORDERED in fn.entries[-1].source:
        monkeypatch.setenv("TAPEGRAD_COMPILE_EXACT", "1")
        return True
    return False


def _mlp_steps(act, opt_name, compiled, steps=5):
    tg.manual_seed(0)
    mid = {"relu": [tg.nn.ReLU()], "tanh": [tg.nn.Tanh()], "none": []}[act]
    model = tg.nn.Sequential(tg.nn.Linear(2, 128), *mid, tg.nn.Linear(128, 3)).double()
    params = list(model.parameters())
    opt = tg.optim.SGD(params, lr=0.1) if opt_name == "sgd" else tg.optim.Adam(params, lr=1e-2)
    rng = np.random.default_rng(0)
    x, t = tg.tensor(rng.standard_normal((64, 2))), tg.tensor(rng.standard_normal((64, 3)))

    def step(x, t):
        opt.zero_grad()
        loss = F.mse_loss(model(x), t)
        loss.backward()
        opt.step()
        return loss

    fn = tg.compile(step) if compiled else step
    out = []
    for _ in range(steps):
        loss = fn(x, t)
        out.append([loss.detach().numpy().copy()] + [p.grad.numpy().copy() for p in params]
                   + [p.detach().numpy().copy() for p in params])
    return out, fn


def _assert_bitwise(got, want):
    for step, (a, b) in enumerate(zip(got, want)):
        for k, (x, y) in enumerate(zip(a, b)):
            assert x.dtype == y.dtype and x.shape == y.shape
            assert np.array_equal(x.view(np.uint64), y.view(np.uint64)), (step, k)


@pytest.mark.parametrize("opt_name", ["sgd", "adam"])
@pytest.mark.parametrize("act", ["none", "relu", "tanh"])
def test_linear_mse_step_compiled_is_eager_bitwise(monkeypatch, act, opt_name):
    """Linear(2, 128) -> [act] -> Linear(128, 3) -> mse, float64: the numba kernels' small
    matmuls (x @ W1.T, 2 terms; g @ W2, 3 terms) and contractions over the 64 rows (the weight
    gradients) are the BLAS's fma chains, so the compiled step is eager's bits: gradients,
    parameters and loss, 5 steps (3 compiled)."""
    pytest.importorskip("numba")
    monkeypatch.setenv("TAPEGRAD_COMPILE_KERNELS", "numba")
    want, _ = _mlp_steps(act, opt_name, compiled=False)
    got, fn = _mlp_steps(act, opt_name, compiled=True)
    src = fn.entries[-1].source
    assert "= fma(" in src and "-> matmul" in src  # fused products: the case at stake
    if _exact_where_reordered(monkeypatch, fn):
        got, fn = _mlp_steps(act, opt_name, compiled=True)
    _assert_bitwise(got, want)


def _spiral_losses(compiled, steps=20):
    from tapegrad.bench.spiral import spiral_data
    from tapegrad.examples import spiral

    X, y = spiral_data(512, 3, seed=0)
    tg.manual_seed(0)
    model = spiral.build(tg)
    opt = tg.optim.SGD(model.parameters(), lr=0.5)
    loss_fn = tg.nn.CrossEntropyLoss()

    def step(x, t):
        loss = loss_fn(model(x), t)
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss

    fn = tg.compile(step) if compiled else step
    xb, yb = tg.tensor(X), tg.tensor(y)
    losses = [fn(xb, yb).detach().numpy().copy() for _ in range(steps)]
    return [losses + [p.detach().numpy().copy() for p in model.parameters()]], fn


@pytest.mark.parametrize("backend", ["numba", "numpy"])
def test_spiral_example_20_steps_compiled_is_eager_bitwise(monkeypatch, backend):
    """The spiral example (examples/spiral.py: 2 -> 32 -> 3, ReLU, cross-entropy, SGD at 0.5,
    512 points): 20 compiled steps give eager's losses and parameters, bit for bit."""
    if backend == "numba":
        pytest.importorskip("numba")
    monkeypatch.setenv("TAPEGRAD_COMPILE_KERNELS", backend)
    want, _ = _spiral_losses(compiled=False)
    got, fn = _spiral_losses(compiled=True)
    if backend == "numba":
        assert "= fma(" in fn.entries[-1].source
        if _exact_where_reordered(monkeypatch, fn):
            got, fn = _spiral_losses(compiled=True)
    _assert_bitwise(got, want)


def test_reordered_contraction_within_its_bound(monkeypatch):
    """A contraction the BLAS blocks (4096 rows: OpenBLAS splits the sum; this shape is
    probed): the kernel's fma chain over the rows and eager's blocked dgemm are two orders of
    the same n = 4096 products, each within gamma_n * sum_i |a_i b_i| of the exact sum
    (gamma_n = n u / (1 - n u), u = 2**-53), so they differ by at most twice that; with
    TAPEGRAD_COMPILE_EXACT=1 the product is eager's own call (bitwise)."""
    pytest.importorskip("numba")
    monkeypatch.setenv("TAPEGRAD_COMPILE_KERNELS", "numba")
    rng = np.random.default_rng(5)
    R, C = 4096, 256
    a, b = tg.tensor(rng.standard_normal((R, C))), tg.tensor(rng.standard_normal((R, C)))
    x = tg.tensor(rng.standard_normal((R, 2)))

    def f(a, b, x):
        h = (a * b).relu()
        return h.T @ x, h.sum(0)

    want = [t.numpy() for t in f(a, b, x)]
    fn = tg.compile(f)
    for _ in range(2):
        got = [t.numpy() for t in fn(a, b, x)]
    assert "= fma(" in fn.entries[-1].source  # the contraction is the kernel's
    h = np.maximum(a.numpy() * b.numpy(), 0)
    u = np.finfo(np.float64).eps / 2
    gamma = R * u / (1 - R * u)
    bound = 2 * gamma * (np.abs(h).T @ np.abs(x.numpy()))
    assert np.all(np.abs(got[0] - want[0]) <= bound)
    assert np.array_equal(got[1], want[1])  # the column sums: rows in order, as numpy
    monkeypatch.setenv("TAPEGRAD_COMPILE_EXACT", "1")
    exact = tg.compile(f)
    for _ in range(2):
        got = [t.numpy() for t in exact(a, b, x)]
    assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1])
