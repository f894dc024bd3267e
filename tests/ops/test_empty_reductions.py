"""Reductions over empty extents (and with no degrees of freedom left) against PyTorch.

Every case runs with numpy's RuntimeWarnings as errors: PyTorch returns nan/-inf/0 quietly,
so tapegrad must too, in the forward and in the gradient rules (also with create_graph).
"""
import math
import warnings

import numpy as np
import pytest
import torch

import tapegrad
from helpers import assert_close, check_torch

pytestmark = pytest.mark.filterwarnings("error::RuntimeWarning")

SHAPES = [(0,), (0, 3), (3, 0), (2, 0, 4)]


def _dims(shape):
    return [None] + list(range(len(shape))) + [-1]


def _kw(dim, **extra):
    return extra if dim is None else dict(dim=dim, **extra)


def _cases():
    for shape in SHAPES:
        for dim in _dims(shape):
            for keepdim in (False, True):
                if dim is None and keepdim:
                    continue
                kw = _kw(dim) if dim is None else _kw(dim, keepdim=keepdim)
                yield "sum", shape, kw
                yield "mean", shape, kw
                yield "var", shape, kw
                yield "std", shape, kw
                yield "var", shape, dict(kw, correction=0)
                yield "std", shape, dict(kw, correction=2)
                yield "norm", shape, kw
                yield "norm", shape, dict(kw, p=2)
                yield "norm", shape, dict(kw, p=1)
                yield "norm", shape, dict(kw, p=3)
                yield "norm", shape, dict(kw, p=0.5)
                if dim is not None:
                    yield "logsumexp", shape, kw
                    yield "prod", shape, kw
                    yield "cumsum", shape, dict(dim=dim)
        yield "prod", shape, {}
        if len(shape) > 1:
            yield "mean", shape, dict(dim=(0, -1))
            yield "var", shape, dict(dim=(0, -1), keepdim=True)


def _call(T, name, x, kw):
    return getattr(T, name)(x, **kw)


@pytest.mark.parametrize("name,shape,kw", list(_cases()))
def test_empty_reduction_matches_torch(name, shape, kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # var/std's dof warning: tested below
        check_torch(lambda T, x: _call(T, name, x, kw), [np.ones(shape)])


@pytest.mark.parametrize("name,shape,kw", [
    ("mean", (0, 3), dict(dim=0, dtype=torch.float64)),
    ("mean", (0, 3), dict(dim=1, keepdim=True)),
    ("sum", (0, 3), dict(dim=0, dtype=torch.float32)),
])
def test_empty_reduction_with_dtype(name, shape, kw):
    def fn(T, x):
        k = dict(kw)
        if "dtype" in k:
            k["dtype"] = getattr(T, str(k["dtype"]).split(".")[-1])
        return getattr(T, name)(x, **k)
    check_torch(fn, [np.ones(shape, dtype=np.float32)], rtol=1e-6)


# --- var/std with N <= correction: inf or nan, PyTorch's gradient rule and its warning ------
NO_DOF = [
    ((1,), {}), ((1,), dict(dim=0)), ((2,), dict(correction=2)), ((2,), dict(correction=3)),
    ((2, 3), dict(dim=0, correction=2)), ((2, 3), dict(dim=1, correction=3)),
    ((2, 3), dict(dim=1, correction=5)), ((2, 3), dict(correction=6)),
    ((2, 3), dict(correction=7, dim=(0, 1))), ((), {}), ((), dict(dim=0)),
]


@pytest.mark.parametrize("name", ["var", "std"])
@pytest.mark.parametrize("shape,kw", NO_DOF)
def test_no_degrees_of_freedom(name, shape, kw):
    rng = np.random.default_rng(3)
    for x in (rng.standard_normal(shape), np.full(shape, 1.5)):  # inf, and nan (all equal)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            check_torch(lambda T, a: getattr(T, name)(a, **kw), [x])


@pytest.mark.parametrize("name", ["var", "std"])
@pytest.mark.parametrize("shape,kw,warns", [
    ((0, 3), {}, True), ((3, 0), dict(dim=0), True), ((1,), {}, True),
    ((2, 3), dict(dim=1, correction=2), False), ((4,), {}, False),
])
def test_dof_warning_as_torch(name, shape, kw, warns):
    caught = {}
    for T in (torch, tapegrad):
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            getattr(T, name)(T.ones(*shape, dtype=T.float64), **kw)
        caught[T] = [str(m.message) for m in w if issubclass(m.category, UserWarning)]
    assert bool(caught[torch]) == warns
    assert len(caught[tapegrad]) == len(caught[torch])
    for mine, theirs in zip(caught[tapegrad], caught[torch]):
        assert theirs.split(" (Triggered")[0] in mine


# --- second order through the empty and no-dof rules stays quiet -----------------------------
@pytest.mark.parametrize("name,shape,kw", [
    ("mean", (0, 3), dict(dim=0)), ("var", (0, 3), dict(dim=0)), ("std", (0,), {}),
    ("var", (1,), {}), ("var", (2, 3), dict(dim=1, correction=5)),  # (inf - inf sums warn in numpy)
    ("logsumexp", (0, 3), dict(dim=0)), ("norm", (0, 3), dict(dim=0)),
])
def test_double_backward_quiet(name, shape, kw):
    x_np = np.random.default_rng(0).standard_normal(shape)
    results = []
    for T in (torch, tapegrad):
        x = T.tensor(x_np, requires_grad=True)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            y = getattr(T, name)(x, **kw)
            (g,) = T.autograd.grad(y.sum(), x, create_graph=True)
            out = [y, g]
            if g.requires_grad:
                (gg,) = T.autograd.grad((g * g).sum(), x, allow_unused=True)
                out.append(gg if gg is not None else T.zeros_like(x))
        results.append(out)
    for a, b in zip(results[1], results[0]):
        assert_close(a, b)


# --- ops without an identity: PyTorch's errors, and the empty extents they do allow --------
@pytest.mark.parametrize("name,shape,kw", [
    ("amax", (0, 3), {}), ("amax", (0, 3), dict(dim=0)), ("amax", (3, 0), dict(dim=-1)),
    ("amin", (3, 0), dict(dim=(0, 1))), ("amin", (0,), dict(dim=0)),
    ("max", (0, 3), {}), ("max", (0, 3), dict(dim=0)), ("min", (3, 0), dict(dim=1)),
    ("argmax", (0, 3), {}), ("argmax", (0, 3), dict(dim=0)), ("argmin", (3, 0), dict(dim=-1)),
    ("norm", (0, 3), dict(p=math.inf)), ("norm", (0, 3), dict(p=-math.inf, dim=0)),
    ("norm", (3, 0), dict(p=-1, dim=-1)), ("norm", (0,), dict(p=-0.5)),
])
def test_no_identity_raises_as_torch(name, shape, kw):
    with pytest.raises(Exception) as theirs:
        getattr(torch, name)(torch.ones(*shape), **kw)
    with pytest.raises(type(theirs.value)) as mine:
        getattr(tapegrad, name)(tapegrad.ones(*shape), **kw)
    assert name in str(mine.value)
    if "norm" in name:
        assert "cannot compute the" in str(mine.value) and str(shape) in str(mine.value)


@pytest.mark.parametrize("name,shape,kw", [
    ("amax", (3, 0), dict(dim=0)), ("amin", (0, 3), dict(dim=1, keepdim=True)),
    ("max", (3, 0), dict(dim=0)), ("min", (0, 3), dict(dim=-1)),
    ("argmax", (3, 0), dict(dim=0)), ("argmin", (0, 3), dict(dim=1)),
    ("norm", (0, 3), dict(p=math.inf, dim=1)), ("norm", (3, 0), dict(p=-1, dim=0)),
    ("logsumexp", (0, 3), dict(dim=1)),
])
def test_empty_output_allowed(name, shape, kw):
    check_torch(lambda T, x: getattr(T, name)(x, **kw), [np.ones(shape)])


@pytest.mark.parametrize("shape", [(3,), (0, 3)])
def test_norm_p0_has_no_gradient(shape):
    for T in (torch, tapegrad):
        x = T.ones(*shape, dtype=T.float64, requires_grad=True)
        T.norm(x, p=0).backward()
        assert x.grad is None, T.__name__


@pytest.mark.parametrize("name", ["all", "any"])
@pytest.mark.parametrize("shape,kw", [((0, 3), {}), ((0, 3), dict(dim=0)), ((3, 0), dict(dim=1))])
def test_logical_empty(name, shape, kw):
    check_torch(lambda T, x: getattr(T, name)(x, **kw), [np.ones(shape)], grad=False)
