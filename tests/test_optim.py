"""Optimizers against PyTorch: 50-step float64 trajectories on a small MLP with two groups."""
import copy
import warnings

import numpy as np
import pytest
import torch

import tapegrad
from tapegrad import optim

RTOL = 1e-13
STEPS = 50


def _data(seed=0):
    rng = np.random.default_rng(seed)
    shapes = {"w1": (3, 5), "b1": (5,), "w2": (5, 2), "b2": (2,)}
    init = {k: rng.standard_normal(s) * 0.5 for k, s in shapes.items()}
    x = rng.standard_normal((8, 3))
    y = rng.standard_normal((8, 2))
    return init, x, y


def _loss(T, params, x, y):
    w1, b1, w2, b2 = params
    h = T.tanh(T.matmul(x, w1) + b1)
    r = T.matmul(h, w2) + b2 - y
    return (r * r).sum() * (1.0 / 8)


def _run(T, opt_cls, groups_kw, kw, steps=STEPS, set_to_none=True, closure=False):
    init, x, y = _data()
    params = [T.tensor(init[k].copy(), dtype=T.float64, requires_grad=True)
              for k in ("w1", "b1", "w2", "b2")]
    xt, yt = T.tensor(x, dtype=T.float64), T.tensor(y, dtype=T.float64)
    groups = [dict(params=params[:2], **groups_kw[0]), dict(params=params[2:], **groups_kw[1])]
    opt = opt_cls(groups, **kw)
    losses = []
    for _ in range(steps):
        opt.zero_grad(set_to_none=set_to_none)
        if closure:
            def fn():
                opt.zero_grad()
                loss = _loss(T, params, xt, yt)
                loss.backward()
                return loss
            losses.append(float(opt.step(fn).detach()))
        else:
            loss = _loss(T, params, xt, yt)
            loss.backward()
            opt.step()
            losses.append(float(loss.detach()))
    return np.array(losses), [p.detach().numpy().copy() for p in params], opt


CASES = [
    ("SGD", [dict(lr=0.1), dict(lr=0.05, weight_decay=0.1)], {}),
    ("SGD", [dict(momentum=0.9, nesterov=True), dict(momentum=0.5, dampening=0.3)],
     dict(lr=0.05, weight_decay=0.01)),
    ("SGD", [dict(momentum=0.9), dict(maximize=True, lr=-0.0 + 0.01)], dict(lr=0.05)),
    ("Adam", [dict(lr=0.01), dict(lr=0.02, amsgrad=True, weight_decay=0.1)], {}),
    ("Adam", [dict(betas=(0.8, 0.9)), dict(eps=1e-3, decoupled_weight_decay=True,
                                           weight_decay=0.2)], dict(lr=0.03)),
    ("Adam", [dict(maximize=True), dict(amsgrad=True)], dict(lr=0.01)),
    ("AdamW", [dict(lr=0.01), dict(lr=0.03, amsgrad=True, weight_decay=0.5)], {}),
    ("RMSprop", [dict(lr=0.01), dict(lr=0.005, centered=True, momentum=0.9,
                                     weight_decay=0.1)], {}),
    # a small lr keeps RMSprop off its sign-like regime near the minimum, where g / sqrt(v)
    # amplifies last-ulp differences (PyTorch's kernels fuse multiply-adds; numpy rounds twice)
    ("RMSprop", [dict(alpha=0.9, momentum=0.5), dict(centered=True, eps=1e-4)],
     dict(lr=0.002, maximize=True)),
    ("Adagrad", [dict(lr=0.1, lr_decay=0.01), dict(lr=0.05, weight_decay=0.1)],
     dict(initial_accumulator_value=0.1)),
    ("Adagrad", [dict(eps=1e-5), dict(maximize=True)], dict(lr=0.05)),
    ("Adamax", [dict(lr=0.02), dict(lr=0.01, weight_decay=0.1, betas=(0.8, 0.99))], {}),
    ("NAdam", [dict(lr=0.02), dict(lr=0.01, weight_decay=0.1, momentum_decay=0.01)], {}),
    ("NAdam", [dict(decoupled_weight_decay=True, weight_decay=0.3), dict(maximize=True)],
     dict(lr=0.01)),
    ("RAdam", [dict(lr=0.02), dict(lr=0.01, weight_decay=0.1)], {}),
    ("RAdam", [dict(decoupled_weight_decay=True, weight_decay=0.3), dict(betas=(0.5, 0.6))],
     dict(lr=0.01)),
]


def _assert_close(a, b, what):
    a, b = np.asarray(a), np.asarray(b)
    err = np.max(np.abs(a - b) / np.maximum(np.abs(b), 1e-3))
    assert err < RTOL, f"{what}: relative error {err:.3g}"


@pytest.mark.parametrize("name,groups,kw", CASES, ids=[c[0] for c in CASES])
def test_trajectory_matches_torch(name, groups, kw):
    tg_losses, tg_params, _ = _run(tapegrad, getattr(optim, name), groups, kw)
    th_losses, th_params, _ = _run(torch, getattr(torch.optim, name), groups,
                                   dict(kw, foreach=False))
    _assert_close(tg_losses, th_losses, f"{name} losses")
    for a, b in zip(tg_params, th_params):
        _assert_close(a, b, f"{name} parameters")
    assert tg_losses[-1] != tg_losses[0]  # the optimizer moved


@pytest.mark.parametrize("name,groups,kw", CASES, ids=[c[0] for c in CASES])
def test_foreach_flat_batch_is_bit_identical(name, groups, kw):
    loop = _run(tapegrad, getattr(optim, name), groups, dict(kw, foreach=False), steps=10)
    flat = _run(tapegrad, getattr(optim, name), groups, dict(kw, foreach=True), steps=10)
    assert np.array_equal(loop[0], flat[0])
    for a, b in zip(loop[1], flat[1]):
        assert np.array_equal(a, b)
