"""tapegrad.compile is never silently wrong: index range checks run in the compiled graph on
each call's indices (numpy would wrap a negative index around where eager raises), and a
compiled training step is eager's numbers (bitwise where the kernels sum in eager's order,
within the analysed bound where a kernel documents another order)."""
import numpy as np
import pytest

import tapegrad as tg
import tapegrad.nn.functional as F


def _error(fn, *args):
    try:
        fn(*args)
    except Exception as e:  # noqa: BLE001 - the error itself is what is compared
        return type(e), str(e)
    return None


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


def _cross_entropy(x, i):
    return F.cross_entropy(x, i)


def _nll_loss(x, i):
    return F.nll_loss(F.log_softmax(x, dim=1), i)


# (fn, input shape, valid index, position of the entry made bad, the dim's size)
_GRID = [[0, 1, 2, 3], [4, 0, 1, 2]]
CASES = {
    "gather": (_gather, (5, 4), _GRID, (1, 0), 5),
    "scatter_add": (_scatter_add, (5, 4), _GRID, (1, 0), 5),
    "take_along_dim": (_take_along_dim, (5, 4), _GRID, (1, 0), 20),
    "index_select": (_index_select, (5, 4), [0, 2, 1], (1,), 5),
    "index_select_dim1": (_index_select_dim1, (5, 4), [0, 2, 1], (1,), 4),
    "embedding": (_embedding, (5, 3), [[0, 2], [1, 4]], (1, 0), 5),
    "cross_entropy": (_cross_entropy, (3, 5), [0, 4, 2], (1,), 5),
    "nll_loss": (_nll_loss, (3, 5), [0, 4, 2], (1,), 5),
}


def _with(valid, at, value):
    a = np.array(valid, dtype=np.int64)
    a[at] = value
    return tg.tensor(a)


@pytest.mark.parametrize("backward", [False, True], ids=["forward", "backward_only"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_compiled_index_ops_raise_eagers_error_on_out_of_range_indices(case, backward):
    fn, shape, valid, at, n = CASES[case]
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
    for bad in (-1, -3, n, n + 7):
        i = _with(valid, at, bad)
        want = _error(step, x, i)
        assert want is not None, (case, bad)  # eager raises (as PyTorch)
        assert _error(compiled, x, i) == want, (case, bad)
    x.grad = None
    assert _error(compiled, x, good) is None  # valid indices still run after the errors
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
        want = _error(step, ex, tg.tensor(t))
        assert want is not None and want[0] is IndexError
        assert _error(compiled, x, tg.tensor(t)) == want


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
            want = _error(eager)
            assert want is not None and want[0] is IndexError, (which, bad)
            assert _error(fn, *args) == want, (which, bad)
    after = S.model.state_dict()
    for k, v in before.items():  # the failed calls changed no parameter
        assert np.array_equal(after[k].numpy(), v), k
