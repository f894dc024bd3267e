"""Property tests: every binary (and ternary) elementwise op broadcasts as PyTorch does.

Hypothesis draws broadcastable shape pairs (up to 4 dims, sizes 1-3, leading dims dropped,
dims set to 1 on either side); values and gradients must agree with PyTorch (float64, 1e-12).
"""
import numpy as np
from hypothesis import given, settings, strategies as st

from helpers import check_torch

SETTINGS = settings(max_examples=25, deadline=None, derandomize=True)


@st.composite
def broadcastable_shapes(draw, n=2):
    """``n`` shapes that broadcast together: each drops leading dims and 1s out some dims."""
    full = draw(st.lists(st.integers(1, 3), min_size=0, max_size=4))
    shapes = []
    for _ in range(n):
        drop = draw(st.integers(0, len(full)))
        shape = [1 if draw(st.booleans()) else s for s in full[drop:]]
        shapes.append(tuple(shape))
    return shapes


def _arrays(shapes, seed, low=None, high=None, away_from_zero=()):
    rng = np.random.default_rng(seed)
    out = []
    for i, s in enumerate(shapes):
        a = rng.uniform(low, high, s) if low is not None else rng.standard_normal(s)
        if i in away_from_zero:
            a = np.where(np.abs(a) < 0.2, a + 0.4 * np.sign(a + 1e-3), a)
        out.append(np.asarray(a, dtype=np.float64))
    return out


BINARY = {
    "add": (lambda T, x, y: x + y, {}),
    "add-alpha": (lambda T, x, y: T.add(x, y, alpha=-1.5), {}),
    "sub": (lambda T, x, y: x - y, {}),
    "mul": (lambda T, x, y: x * y, {}),
    "div": (lambda T, x, y: x / y, dict(away_from_zero=(1,))),
    "pow": (lambda T, x, y: x**y, dict(low=0.5, high=2.0)),
    "maximum": (lambda T, x, y: T.maximum(x, y), {}),
    "minimum": (lambda T, x, y: T.minimum(x, y), {}),
    "remainder": (lambda T, x, y: T.remainder(x * 3, y), dict(away_from_zero=(1,))),
    "fmod": (lambda T, x, y: T.fmod(x * 3, y), dict(away_from_zero=(1,))),
    "div-floor": (lambda T, x, y: T.div(x * 3, y, rounding_mode="floor") + x * y,
                  dict(away_from_zero=(1,))),
    "div-trunc": (lambda T, x, y: T.div(x * 3, y, rounding_mode="trunc") + x * y,
                  dict(away_from_zero=(1,))),
    "clamp-min": (lambda T, x, y: T.clamp(x, min=y), {}),
    "clamp-max": (lambda T, x, y: T.clamp(x, max=y), {}),
    "where": (lambda T, x, y: T.where(x > y, x, y * 2), {}),
    "masked_fill": (lambda T, x, y: x.masked_fill(y > 0, 0.5) * y, {}),
    "comparisons": (lambda T, x, y: [(x < y), (x >= y), (x == y), (x != y)], {}),
    "logical": (lambda T, x, y: [T.logical_and(x > 0, y > 0), T.logical_or(x > 0, y)], {}),
    "bitwise": (lambda T, x, y: [(x > 0) & (y > 0), (x > 0) | (y < 0), (x > 0) ^ (y > 0)], {}),
}


def _binary_property(name):
    fn, opts = BINARY[name]

    @SETTINGS
    @given(shapes=broadcastable_shapes(), seed=st.integers(0, 2**16))
    def test(shapes, seed):
        with np.errstate(all="ignore"):
            check_torch(fn, _arrays(shapes, seed, **opts))

    test.__name__ = f"test_broadcast_{name.replace('-', '_')}"
    return test


for _name in BINARY:
    _t = _binary_property(_name)
    globals()[_t.__name__] = _t


@SETTINGS
@given(shapes=broadcastable_shapes(3), seed=st.integers(0, 2**16))
def test_broadcast_clamp_tensor_bounds(shapes, seed):
    import tapegrad

    # PyTorch's own clamp backward fails when ``x`` is smaller than the broadcast shape (an
    # in-place logical_and_ in clamp_backward_min_max), so its reference here is the
    # equivalent maximum/minimum composite (same values and gradients off ties)
    def fn(T, x, lo, hi):
        if T is tapegrad:
            return T.clamp(x, lo - 0.5, hi + 0.5)
        return T.minimum(T.maximum(x, lo - 0.5), hi + 0.5)

    check_torch(fn, _arrays(shapes, seed))


@SETTINGS
@given(shapes=broadcastable_shapes(3), seed=st.integers(0, 2**16))
def test_broadcast_where_three_ways(shapes, seed):
    c, a, b = _arrays(shapes, seed)
    check_torch(lambda T, c, a, b: T.where(c > 0, a, b), [c, a, b])


@SETTINGS
@given(shapes=broadcastable_shapes(), seed=st.integers(0, 2**16))
def test_broadcast_integer_ops_values(shapes, seed):
    rng = np.random.default_rng(seed)
    a = rng.integers(-9, 10, shapes[0])
    b = rng.integers(1, 5, shapes[1]) * rng.choice([-1, 1], shapes[1])
    check_torch(lambda T, a, b: [a // b, a % b, T.fmod(a, b), a * b, a & b, a / b,
                                 T.div(a, b, rounding_mode="trunc")], [a, b], rtol=2e-7)


@SETTINGS
@given(shapes=broadcastable_shapes())
def test_broadcast_error_names_op_and_shapes(shapes):
    import re

    import pytest

    import tapegrad

    a, b = np.ones(shapes[0] + (2,)), np.ones(shapes[1] + (3,))  # trailing 2 vs 3 never fit
    for name, fn in [("mul", lambda x, y: x * y), ("maximum", tapegrad.maximum),
                     ("remainder", lambda x, y: x % y)]:
        msg = re.escape(f"{name}: shapes {a.shape} and {b.shape} cannot be broadcast")
        with pytest.raises(RuntimeError, match=msg):
            fn(tapegrad.tensor(a, requires_grad=True), tapegrad.tensor(b))
