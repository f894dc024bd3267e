"""Optimizers against PyTorch: 50-step float64 trajectories on a small MLP with two groups."""
import copy

import numpy as np
import pytest
import torch

import tapegrad
from tapegrad import optim
from helpers import state_to_tapegrad as _to_tapegrad, state_to_torch as _to_torch
from rounding_noise import jitter as _jitter, tolerance

STEPS = 50
# PyTorch's float64 trajectories are not bit-reproducible from one CPU to another, so no
# tolerance can sit a few ulps above this machine's error. Given the same gradients, every
# case here matches PyTorch bit for bit when its kernels round as numpy does
# (ATEN_CPU_CAPABILITY=default) and take the same sqrt: the order of operations is PyTorch's.
# What differs, per step: PyTorch's AVX2/AVX-512 kernels fuse the multiply-add in lerp_,
# addcmul_ and add(alpha) where numpy rounds the product first (1 ulp), its float64 sqrt is
# not always correctly rounded (1 ulp, in about 1% of entries on an AMD EPYC), and the
# gradients come from other tanh and BLAS kernels (within 5 ulps of each gradient's largest
# entry over 300 random points of this MLP; which entries differ depends on the SIMD path).
# So each run's tolerance is NOISE_ULPS times its own sensitivity (rounding_noise.tolerance):
# how far it moves when 1 ulp of random noise enters every gradient and update at every step.
# Over numpy/OpenBLAS/ATen kernels from AVX-512 down to AVX (NPY_DISABLE_CPU_FEATURES,
# OPENBLAS_CORETYPE, ATEN_CPU_CAPABILITY), errors stayed below 1.1x that sensitivity; 16
# covers the 5-ulp gradient differences with 3x to spare.
NOISE_ULPS = 16
# A run more sensitive than this amplifies rounding too much to be compared closely: change
# its hyperparameters rather than the bound (which keeps every tolerance below 1.6e-11).
MAX_SENSITIVITY = 1e-12


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


def _run(T, opt_cls, groups_kw, kw, steps=STEPS, set_to_none=True, closure=False, noise=None):
    """Train the MLP; ``noise`` (a numpy Generator) jitters every gradient and update."""
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
                _jitter(T, params, noise, grads=True)
                return loss
            losses.append(float(opt.step(fn).detach()))
        else:
            loss = _loss(T, params, xt, yt)
            loss.backward()
            _jitter(T, params, noise, grads=True)
            opt.step()
            losses.append(float(loss.detach()))
        _jitter(T, params, noise)
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


def _error(a, b):
    a, b = np.asarray(a), np.asarray(b)
    return np.max(np.abs(a - b) / np.maximum(np.abs(b), 1e-3))


def _assert_close(a, b, what, rtol):
    err = _error(a, b)
    assert err < rtol, f"{what}: relative error {err:.3g} (tolerance {rtol:.3g})"


def _tolerance(run):
    return tolerance(run, _error, NOISE_ULPS, MAX_SENSITIVITY)


def _tapegrad_run(opt_cls, groups, kw, with_state=False, **run_kw):
    """``run(noise)`` for ``_tolerance``: tapegrad's losses and final parameters (and the
    optimizer's state)."""
    def run(noise):
        losses, params, opt = _run(tapegrad, opt_cls, groups, kw, noise=noise, **run_kw)
        state = [v.numpy() for s in opt.state.values() for v in s.values()]
        return [losses, *params, *(state if with_state else [])]
    return run


@pytest.mark.parametrize("name,groups,kw", CASES, ids=[c[0] for c in CASES])
def test_trajectory_matches_torch(name, groups, kw):
    tg_losses, tg_params, _ = _run(tapegrad, getattr(optim, name), groups, kw)
    th_losses, th_params, _ = _run(torch, getattr(torch.optim, name), groups,
                                   dict(kw, foreach=False))
    rtol = _tolerance(_tapegrad_run(getattr(optim, name), groups, kw))
    _assert_close(tg_losses, th_losses, f"{name} losses", rtol)
    for a, b in zip(tg_params, th_params):
        _assert_close(a, b, f"{name} parameters", rtol)
    assert tg_losses[-1] != tg_losses[0]  # the optimizer moved


def test_trajectory_tolerance_still_detects_a_tiny_change():
    # the most sensitive case's tolerance stays ~100x below what a momentum decay off by 1 part
    # in 1e9 does to its trajectory: a formula slip cannot hide under it
    name, groups, kw = CASES[13]
    theirs = _run(torch, torch.optim.NAdam, groups, dict(kw, foreach=False))
    ours = _run(tapegrad, optim.NAdam, groups, dict(kw, momentum_decay=4e-3 * (1 + 1e-9)))
    rtol = _tolerance(_tapegrad_run(optim.NAdam, groups, kw))
    assert max(_error(a, b) for a, b in zip([ours[0], *ours[1]], [theirs[0], *theirs[1]])) > \
        10 * rtol


@pytest.mark.parametrize("name,groups,kw", CASES, ids=[c[0] for c in CASES])
def test_foreach_flat_batch_is_bit_identical(name, groups, kw):
    loop = _run(tapegrad, getattr(optim, name), groups, dict(kw, foreach=False), steps=10)
    flat = _run(tapegrad, getattr(optim, name), groups, dict(kw, foreach=True), steps=10)
    assert np.array_equal(loop[0], flat[0])
    for a, b in zip(loop[1], flat[1]):
        assert np.array_equal(a, b)


def test_closure_and_zero_grad_without_set_to_none_match_torch():
    kw = dict(lr=0.05, momentum=0.9)
    groups = [dict(nesterov=True), dict(dampening=0.0)]
    run_kw = dict(steps=20, set_to_none=False, closure=True)
    a = _run(tapegrad, optim.SGD, groups, kw, **run_kw)
    b = _run(torch, torch.optim.SGD, groups, dict(kw, foreach=False), **run_kw)
    rtol = _tolerance(_tapegrad_run(optim.SGD, groups, kw, **run_kw))
    _assert_close(a[0], b[0], "losses", rtol)
    for x, y in zip(a[1], b[1]):
        _assert_close(x, y, "parameters", rtol)


@pytest.mark.parametrize("name,groups,kw", [CASES[1], CASES[3], CASES[8], CASES[9], CASES[13]],
                         ids=["SGD", "Adam", "RMSprop", "Adagrad", "NAdam"])
def test_state_dict_layout_and_interchange_with_torch(name, groups, kw):
    _, _, ours = _run(tapegrad, getattr(optim, name), groups, kw, steps=5)
    _, _, theirs = _run(torch, getattr(torch.optim, name), groups, dict(kw, foreach=False),
                        steps=5)
    sd, tsd = ours.state_dict(), theirs.state_dict()
    # five steps, then five more from the other library's state: bounded by a 10-step run
    rtol = _tolerance(_tapegrad_run(getattr(optim, name), groups, kw, with_state=True,
                                    steps=10))
    assert list(sd) == ["state", "param_groups"]
    assert list(sd["state"]) == list(tsd["state"]) == [0, 1, 2, 3]
    for i in sd["state"]:
        assert list(sd["state"][i]) == list(tsd["state"][i])
        for k, v in sd["state"][i].items():
            assert v.dtype.name == str(tsd["state"][i][k].dtype).split(".")[-1], k
            _assert_close(v.numpy(), tsd["state"][i][k].numpy(), f"state {i} {k}", rtol)
    for g, tg in zip(sd["param_groups"], tsd["param_groups"]):
        assert g["params"] == tg["params"]
        for k in g:
            assert k in tg, k
            if k not in ("foreach", "params"):
                assert g[k] == tg[k], k
    # torch's state dict drives a tapegrad optimizer and vice versa: both continue alike
    init, x, y = _data()
    tg_params = [tapegrad.tensor(p.detach().numpy().copy(), requires_grad=True)
                 for g in theirs.param_groups for p in g["params"]]
    th_params = [torch.tensor(p.detach().numpy().copy(), requires_grad=True) for p in tg_params]
    fresh = getattr(optim, name)([dict(params=tg_params[:2], **groups[0]),
                                  dict(params=tg_params[2:], **groups[1])], **kw)
    fresh.load_state_dict(_to_tapegrad(tsd))
    fresh_t = getattr(torch.optim, name)([dict(params=th_params[:2], **groups[0]),
                                          dict(params=th_params[2:], **groups[1])],
                                         **dict(kw, foreach=False))
    fresh_t.load_state_dict(_to_torch(sd))
    for T, params, opt in ((tapegrad, tg_params, fresh), (torch, th_params, fresh_t)):
        xt, yt = T.tensor(x, dtype=T.float64), T.tensor(y, dtype=T.float64)
        for _ in range(5):
            opt.zero_grad()
            _loss(T, params, xt, yt).backward()
            opt.step()
    for a, b in zip(tg_params, th_params):
        _assert_close(a.detach().numpy(), b.detach().numpy(), "continued parameters", rtol)


def test_state_dict_round_trip_continues_bit_identically():
    straight = _run(tapegrad, optim.Adam, CASES[3][1], {}, steps=30)
    init, x, y = _data()
    half = _run(tapegrad, optim.Adam, CASES[3][1], {}, steps=15)
    sd = copy.deepcopy(half[2].state_dict())
    params = [tapegrad.tensor(p, requires_grad=True) for p in half[1]]
    opt = optim.Adam([dict(params=params[:2], **CASES[3][1][0]),
                      dict(params=params[2:], **CASES[3][1][1])])
    opt.load_state_dict(sd)
    assert opt.state[params[0]]["exp_avg"] is not sd["state"][0]["exp_avg"]  # copied
    xt, yt = tapegrad.tensor(x), tapegrad.tensor(y)
    for _ in range(15):
        opt.zero_grad()
        _loss(tapegrad, params, xt, yt).backward()
        opt.step()
    for a, b in zip(params, straight[1]):
        assert np.array_equal(a.detach().numpy(), b)


def test_load_state_dict_errors_and_dtype_cast():
    p, q = (tapegrad.tensor(np.ones(2), requires_grad=True) for _ in range(2))
    opt = optim.Adam([p, q])
    (p * q).sum().backward()
    opt.step()
    sd = opt.state_dict()
    with pytest.raises(ValueError, match="different number of parameter groups"):
        optim.Adam([{"params": [p]}, {"params": [q]}]).load_state_dict(sd)
    with pytest.raises(ValueError, match="doesn't match the size"):
        optim.Adam([p]).load_state_dict({"state": {}, "param_groups": sd["param_groups"]})
    p32 = tapegrad.tensor(np.ones(2, dtype=np.float32), requires_grad=True)
    q32 = tapegrad.tensor(np.ones(2, dtype=np.float32), requires_grad=True)
    opt32 = optim.Adam([p32, q32])
    opt32.load_state_dict(sd)
    assert opt32.state[p32]["exp_avg"].dtype == tapegrad.float32
    assert opt32.state[p32]["step"].dtype == tapegrad.float32
    assert opt32.state[p32]["step"].item() == 1.0


def test_step_updates_in_place_without_recording():
    w = tapegrad.tensor(np.ones(3), requires_grad=True)
    keep = w
    opt = optim.SGD([w], lr=0.5)
    y = (w * w).sum()  # saves w for backward
    y.backward(retain_graph=True)
    version = w._version[0]
    opt.step()
    assert w is keep and w.is_leaf and w.grad_fn is None and w.requires_grad
    assert w.tolist() == [0.0, 0.0, 0.0] and w._version[0] == version + 1
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.backward()
    assert opt.step() is None
    assert opt.step(lambda: 3.0) == 3.0


def test_zero_grad():
    w = tapegrad.tensor(np.ones(3), requires_grad=True)
    opt = optim.SGD([w], lr=0.1)
    (w * 2).sum().backward()
    g = w.grad
    opt.zero_grad(set_to_none=False)
    assert w.grad is g and w.grad.tolist() == [0.0, 0.0, 0.0]
    opt.zero_grad()
    assert w.grad is None


def test_param_group_errors_as_torch():
    w = tapegrad.tensor(np.ones(3), requires_grad=True)
    v = tapegrad.tensor(np.ones(2), requires_grad=True)
    with pytest.raises(ValueError, match="empty parameter list"):
        optim.SGD([], lr=0.1)
    with pytest.raises(TypeError, match="iterable of Tensors or dicts"):
        optim.SGD(w, lr=0.1)
    with pytest.raises(ValueError, match="can't optimize a non-leaf Tensor"):
        optim.SGD([w * 2], lr=0.1)
    with pytest.raises(TypeError, match="optimizer can only optimize Tensors"):
        optim.SGD([w, 3.0], lr=0.1)
    with pytest.raises(TypeError, match="ordered collections"):
        optim.SGD([{"params": {w}}], lr=0.1)
    with pytest.raises(ValueError, match="more than one parameter group"):
        optim.SGD([{"params": [w, v]}, {"params": [v]}], lr=0.1)
    with pytest.raises(ValueError, match="duplicate parameters"):
        optim.SGD([w, v, w], lr=0.1)
    opt = optim.Adam([w], lr=0.1)
    with pytest.raises(ValueError, match="more than one parameter group"):
        opt.add_param_group({"params": w})
    opt.add_param_group({"params": v, "lr": 0.5})
    assert opt.param_groups[1]["lr"] == 0.5 and opt.param_groups[1]["betas"] == (0.9, 0.999)
    with pytest.raises(ValueError, match="Invalid learning rate: -1"):
        optim.Adam([w], lr=-1)
    with pytest.raises(ValueError, match="Invalid beta parameter at index 1: 1.0"):
        optim.Adam([w], betas=(0.9, 1.0))
    with pytest.raises(ValueError, match="Nesterov momentum requires"):
        optim.SGD([w], lr=0.1, nesterov=True)
    with pytest.raises(ValueError, match="Invalid momentum value"):
        optim.RMSprop([w], momentum=-0.1)
    with pytest.raises(NotImplementedError, match="fused"):
        optim.Adam([w], fused=True)
    with pytest.raises(TypeError, match="lr as a Python number"):
        optim.SGD([w], lr=tapegrad.tensor(0.1))
    named = optim.SGD([("w", w), ("v", v)], lr=0.1)
    assert named.param_groups[0]["param_names"] == ["w", "v"]
    assert "Parameter Group 0" in repr(named) and "lr: 0.1" in repr(named)


@pytest.mark.parametrize("name,groups,kw", CASES[::2], ids=[c[0] for c in CASES[::2]])
def test_float32_parameters_stay_float32_and_match_torch(name, groups, kw):
    def run(T, opt_cls, kwargs):
        init, x, y = _data()
        params = [T.tensor(init[k].astype(np.float32), requires_grad=True)
                  for k in ("w1", "b1", "w2", "b2")]
        xt, yt = T.tensor(x.astype(np.float32)), T.tensor(y.astype(np.float32))
        opt = opt_cls([dict(params=params[:2], **groups[0]),
                       dict(params=params[2:], **groups[1])], **kwargs)
        for _ in range(10):
            opt.zero_grad()
            _loss(T, params, xt, yt).backward()
            opt.step()
        return params, opt

    ours, opt = run(tapegrad, getattr(optim, name), kw)
    theirs, _ = run(torch, getattr(torch.optim, name), dict(kw, foreach=False))
    for a, b in zip(ours, theirs):
        assert a.dtype == tapegrad.float32
        np.testing.assert_allclose(a.detach().numpy(), b.detach().numpy(), rtol=2e-5,
                                   atol=2e-6)
    for state in opt.state.values():
        for k, v in state.items():
            assert v.dtype == tapegrad.float32, k


@pytest.mark.parametrize("name", ["SGD", "Adam", "AdamW", "NAdam", "RAdam", "Adagrad", "Adamax",
                                  "RMSprop"])
def test_flat_batching_with_mixed_sizes_and_missing_grads_is_bit_identical(name):
    def run(T, foreach, noise=None):
        rng = np.random.default_rng(1)
        shapes = [(3,), (2, 2), (40, 50), (5,), ()]
        params = [T.tensor(rng.standard_normal(s), requires_grad=True) for s in shapes]
        kw = dict(lr=0.01, foreach=foreach)
        if name in ("SGD", "RMSprop"):
            kw["momentum"] = 0.9
        opt = getattr(T.optim, name)(params, **kw)
        for step in range(6):
            opt.zero_grad()
            used = params if step % 2 == 0 else params[:2] + params[3:4]  # steps diverge
            sum((p * p).sum() * (i + 1.0) for i, p in enumerate(used)).backward()
            _jitter(T, used, noise, grads=True, entrywise=True)
            opt.step()
            _jitter(T, used, noise)
        return [p.detach().numpy().copy() for p in params], opt

    loop, opt_loop = run(tapegrad, False)
    flat, opt_flat = run(tapegrad, None)
    theirs, _ = run(torch, False)
    rtol = _tolerance(lambda noise: run(tapegrad, False, noise)[0])
    for a, b, c in zip(loop, flat, theirs):
        assert np.array_equal(a, b)
        _assert_close(a, c, "parameters", rtol)
    for p_loop, p_flat in zip(opt_loop.param_groups[0]["params"],
                              opt_flat.param_groups[0]["params"]):
        s1, s2 = opt_loop.state[p_loop], opt_flat.state[p_flat]
        assert list(s1) == list(s2)
        for k in s1:
            assert s1[k].shape == s2[k].shape and np.array_equal(s1[k].numpy(), s2[k].numpy())
