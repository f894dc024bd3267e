"""A Python value read from a tensor inside a compiled function (``int(t)``, ``.item()``,
``bool(t)``...) splits it into replayed pieces. A later call whose read gives another value
may make other tensors (a factory sized by it), other op params (a slice, a shape) or take
another branch: the replay must notice and run the call eagerly, never reuse the trace."""

import numpy as np
import pytest

import tapegrad as tg
from tapegrad.compiler import api, replay

CALLS = ([1., 2.], [1., 2.], [1., 2.], [4., 1.])  # the 4th call reads another value
NEG_CALLS = ([1., 2.], [1., 2.], [1., 2.], [-4., 1.])


def _n(t):
    return int(t.max()) + 1


CASES = {
    "arange": (lambda t: tg.arange(_n(t)) * 2, CALLS),
    "arange_plus_input": (lambda t: (tg.arange(_n(t)) * t.sum()), CALLS),
    "zeros": (lambda t: tg.zeros(_n(t)) + t.sum(), CALLS),
    "full": (lambda t: tg.full((_n(t),), 1.0) * t.mean(), CALLS),
    # same shape, another value: a constant's values are compared, not only its shape
    "full_value": (lambda t: tg.full((2,), float(int(t.max()))) * t, CALLS),
    "arange_start": (lambda t: tg.arange(int(t.max()), int(t.max()) + 2) * t, CALLS),
    "eye": (lambda t: tg.eye(_n(t)) * t.sum(), CALLS),
    "linspace": (lambda t: tg.linspace(0, _n(t), 5) * t.sum(), CALLS),
    "new_full": (lambda t: t.new_full((_n(t),), 3.0) * t.sum(), CALLS),
    "item": (lambda t: tg.full((2,), t.max().item()) * t, CALLS),
    "repeat": (lambda t: (t * 2).repeat(_n(t)), CALLS),
    "slice": (lambda t: (tg.arange(8.) * t.sum())[:_n(t)], CALLS),
    "reshape": (lambda t: (tg.arange(12.) * t.sum()).reshape(_n(t) + 1, -1), CALLS),
    "branch": (lambda t: (t * 2).exp() if t.sum() > 0 else (t * 3).sin(), NEG_CALLS),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_value_read_that_changes_gives_eager_results(case):
    f, calls = CASES[case]
    c = tg.compile(f)
    for v in calls:
        want = f(tg.tensor(v)).numpy()
        got = c(tg.tensor(v)).numpy()
        assert got.shape == want.shape, (case, v)
        np.testing.assert_array_equal(got, want)  # the same ops on the same values: bitwise


def test_an_unchanged_read_still_replays():
    """The comparison keeps equal calls compiled: only the differing call runs eagerly."""
    f = CASES["arange_plus_input"][0]
    c = tg.compile(f)
    for v in CALLS:
        np.testing.assert_array_equal(c(tg.tensor(v)).numpy(), f(tg.tensor(v)).numpy())
    e, = c.entries
    assert isinstance(e, api.SplitEntry)
    assert e.n_replays == 3 and e.n_fallbacks == 1  # calls 2, 3 replayed; call 4 diverged


def _attention_calls():
    rng = np.random.default_rng(0)
    ok = np.zeros((3, 3))
    ok[0, 2] = -np.inf  # a partly masked row
    dead = ok.copy()
    dead[1, :] = -np.inf  # a fully masked row: its output is zeros, as PyTorch
    return rng.standard_normal((2, 3, 4)), (ok, ok, ok, dead, ok)


def test_attention_mask_with_a_fully_masked_row_later_is_decided_each_call():
    """The fully-masked-row fix of a float mask is decided from the mask given at each call,
    not frozen from the traced call's mask; values and the query's gradient equal eager's
    and PyTorch's."""
    import torch
    import tapegrad.nn.functional as F

    def f(q, mask):
        out = F.scaled_dot_product_attention(q, q * 0.5, q, attn_mask=mask)
        (out * out).sum().backward()
        return out.detach()

    c = tg.compile(f)
    qa, masks = _attention_calls()
    for m in masks:
        qe = tg.tensor(qa, requires_grad=True)
        qc = tg.tensor(qa, requires_grad=True)
        want, got = f(qe, tg.tensor(m)).numpy(), c(qc, tg.tensor(m)).numpy()
        assert not np.isnan(got).any()
        # float64: the compiled kernels sum the same few (<= 4) terms, maybe in another
        # order: a few ulps of the largest magnitude (~1) at most
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-13)
        np.testing.assert_allclose(qc.grad.numpy(), qe.grad.numpy(), rtol=0, atol=1e-12)
        qt = torch.tensor(qa, requires_grad=True)
        ref = torch.nn.functional.scaled_dot_product_attention(qt, qt * 0.5, qt,
                                                               attn_mask=torch.tensor(m))
        (ref * ref).sum().backward()
        np.testing.assert_allclose(got, ref.detach().numpy(), rtol=0, atol=1e-13)
        np.testing.assert_allclose(qc.grad.numpy(), qt.grad.numpy(), rtol=0, atol=1e-12)
    assert not c.breaks and all(e.n_fallbacks == 0 for e in c.entries
                                if hasattr(e, "n_fallbacks"))


def test_a_float_mask_under_the_compiler_keeps_the_attention_kernel_form():
    """The fully-masked-row fix is ops around the attention node, not its ``keep`` param
    (which the compiled attention kernels do not take): one graph, the node keeps no keep."""
    import tapegrad.nn.functional as F

    rng = np.random.default_rng(1)
    q = tg.tensor(rng.standard_normal((2, 2, 4, 8)).astype(np.float32))
    mask = tg.tensor(np.triu(np.full((4, 4), -np.inf, np.float32), 1))
    f = lambda q, m: F.scaled_dot_product_attention(q, q, q, attn_mask=m)  # noqa: E731
    c = tg.compile(f)
    for _ in range(2):
        got = c(q, mask).numpy()
    np.testing.assert_allclose(got, f(q, mask).numpy(), rtol=1e-5, atol=1e-6)  # float32 sums
    e, = c.entries
    assert not c.breaks
    att = [n for n in e.graph.nodes if n.name.startswith("scaled_dot_product_attention")]
    assert len(att) == 1 and att[0].params.get("keep") is None


def test_constants_compare_by_bits_whatever_their_layout():
    same = replay._same_const
    a = np.arange(12.).reshape(3, 4)
    assert same(a[:, ::2], np.ascontiguousarray(a[:, ::2]))  # a strided view, a copy
    assert not same(a[:, ::2], a[:, 1::2])
    assert same(a[0, ::2], np.array([0., 2.])) and not same(a[0, ::2], a[0, 1::2])  # 1-D
    assert not same(np.zeros(3), np.zeros(3, np.float32)) and not same(np.zeros(3), np.zeros(4))
    assert not same(np.array([0.0]), np.array([-0.0]))  # 1 / x tells them apart
    assert same(np.full(5, np.nan), np.full(5, np.nan))
    b = np.zeros((7, 5), bool)
    c = b.copy()
    c[6, 4] = True
    assert same(b, b.copy()) and not same(b, c)  # (35 bytes: not a multiple of 8)
