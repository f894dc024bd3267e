"""A Python value read from a tensor inside a compiled function (``int(t)``, ``.item()``,
``bool(t)``...) splits it into replayed pieces. A later call whose read gives another value
may make other tensors (a factory sized by it), other op params (a slice, a shape) or take
another branch: the replay must notice and run the call eagerly, never reuse the trace."""

import numpy as np
import pytest

import tapegrad as tg
from tapegrad.compiler import api

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
