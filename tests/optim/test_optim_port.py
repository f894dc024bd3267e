"""Optimizers and schedules ported from PyTorch (Adadelta, Rprop, ASGD, LBFGS, SparseAdam,
CyclicLR, swa_utils), against PyTorch 2.13 as the oracle: float64 trajectories, state_dict
layout and round trips, lr sequences, weight averaging and BatchNorm statistics."""
import copy
import warnings

import numpy as np
import pytest
import torch

import tapegrad
from tapegrad import optim
from helpers import state_to_tapegrad as _to_tapegrad, state_to_torch as _to_torch
from rounding_noise import jitter, tolerance
from tapegrad.optim import lr_scheduler, swa_utils

RTOL = 1e-12
STEPS = 50


# the number of ulps of rounding per step that the L-BFGS comparisons allow (rounding_noise)
NOISE_ULPS = 16


def _error(a, b):
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    assert a.shape == b.shape, f"shapes {a.shape} and {b.shape}"
    return np.max(np.abs(a - b) / np.maximum(np.abs(b), 1e-3), initial=0.0)


def _assert_close(a, b, what, rtol=RTOL):
    err = _error(a, b)
    assert err < rtol, f"{what}: relative error {err:.3g} (tolerance {rtol:.3g})"


# --- a small MLP with two parameter groups --------------------------------------------------
def _data(seed=0):
    rng = np.random.default_rng(seed)
    shapes = {"w1": (3, 5), "b1": (5,), "w2": (5, 2), "b2": (2,)}
    init = {k: rng.standard_normal(s) * 0.5 for k, s in shapes.items()}
    return init, rng.standard_normal((8, 3)), rng.standard_normal((8, 2))


def _loss(T, params, x, y):
    w1, b1, w2, b2 = params
    h = T.tanh(T.matmul(x, w1) + b1)
    r = T.matmul(h, w2) + b2 - y
    return (r * r).sum() * (1.0 / 8)


def _setup(T, opt_cls, groups_kw, kw, params=None):
    init, x, y = _data()
    if params is None:
        params = [T.tensor(init[k].copy(), dtype=T.float64, requires_grad=True)
                  for k in ("w1", "b1", "w2", "b2")]
    groups = [dict(params=params[:2], **groups_kw[0]), dict(params=params[2:], **groups_kw[1])]
    return params, opt_cls(groups, **kw), T.tensor(x, dtype=T.float64), T.tensor(y, dtype=T.float64)


def _train(T, params, opt, xt, yt, steps):
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = _loss(T, params, xt, yt)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    return np.array(losses)


def _run(T, opt_cls, groups_kw, kw, steps=STEPS):
    params, opt, xt, yt = _setup(T, opt_cls, groups_kw, kw)
    losses = _train(T, params, opt, xt, yt, steps)
    return losses, [p.detach().numpy().copy() for p in params], opt


CASES = [
    ("Adadelta", [dict(lr=0.5), dict(lr=1.0, weight_decay=0.1, rho=0.8)], {}),
    ("Adadelta", [dict(maximize=True), dict(eps=1e-4)], dict(lr=0.3, capturable=False)),
    ("Rprop", [dict(lr=0.01), dict(lr=0.02, etas=(0.3, 1.5), step_sizes=(1e-4, 0.1))], {}),
    ("Rprop", [dict(maximize=True), dict(step_sizes=(1e-3, 0.05))], dict(lr=0.005)),
    # a small t0 starts the averaging (mu < 1) within the run
    ("ASGD", [dict(lr=0.05, t0=10), dict(lr=0.02, weight_decay=0.1, lambd=1e-2, alpha=0.5)],
     dict(t0=5)),
    ("ASGD", [dict(maximize=True), dict(lambd=0.1)], dict(lr=0.01, t0=20)),
]
IDS = [f"{c[0]}-{i}" for i, c in enumerate(CASES)]


def _torch_kw(kw):
    return dict(kw, foreach=False)


@pytest.mark.parametrize("name,groups,kw", CASES, ids=IDS)
def test_trajectory_matches_torch(name, groups, kw):
    tg_losses, tg_params, ours = _run(tapegrad, getattr(optim, name), groups, kw)
    th_losses, th_params, theirs = _run(torch, getattr(torch.optim, name), groups, _torch_kw(kw))
    _assert_close(tg_losses, th_losses, f"{name} losses")
    for a, b in zip(tg_params, th_params):
        _assert_close(a, b, f"{name} parameters")
    assert abs(tg_losses[-1] - tg_losses[0]) > 1e-3  # the optimizer moved
    # the state too (ASGD's average ``ax``, Rprop's step sizes, Adadelta's accumulators)
    sd, tsd = ours.state_dict(), theirs.state_dict()
    for i in tsd["state"]:
        assert list(sd["state"][i]) == list(tsd["state"][i])
        for k, v in tsd["state"][i].items():
            _assert_close(sd["state"][i][k].numpy(), v.numpy(), f"{name} state {k}")


@pytest.mark.parametrize("name,groups,kw", CASES, ids=IDS)
def test_foreach_flat_batch_is_bit_identical(name, groups, kw):
    loop = _run(tapegrad, getattr(optim, name), groups, dict(kw, foreach=False), steps=12)
    flat = _run(tapegrad, getattr(optim, name), groups, dict(kw, foreach=True), steps=12)
    assert np.array_equal(loop[0], flat[0])
    for a, b in zip(loop[1], flat[1]):
        assert np.array_equal(a, b)


def _same_group_options(sd, tsd):
    for g, tg in zip(sd["param_groups"], tsd["param_groups"]):
        assert sorted(g) == sorted(tg)
        assert g["params"] == tg["params"]
        for k in g:
            if k not in ("foreach", "params"):
                assert g[k] == tg[k], k


@pytest.mark.parametrize("name,groups,kw", CASES[::2], ids=IDS[::2])
def test_state_dict_layout_and_interchange_with_torch(name, groups, kw):
    _, _, ours = _run(tapegrad, getattr(optim, name), groups, kw, steps=7)
    _, _, theirs = _run(torch, getattr(torch.optim, name), groups, _torch_kw(kw), steps=7)
    sd, tsd = ours.state_dict(), theirs.state_dict()
    assert list(sd) == ["state", "param_groups"]
    assert list(sd["state"]) == list(tsd["state"]) == [0, 1, 2, 3]
    for i in sd["state"]:
        for k, v in sd["state"][i].items():
            assert v.dtype.name == str(tsd["state"][i][k].dtype).split(".")[-1], k
            assert tuple(v.shape) == tuple(tsd["state"][i][k].shape), k
    _same_group_options(sd, tsd)
    # torch's state dict drives a tapegrad optimizer and vice versa: both continue alike
    tg_params = [tapegrad.tensor(p.detach().numpy().copy(), requires_grad=True)
                 for g in theirs.param_groups for p in g["params"]]
    th_params = [torch.tensor(p.detach().numpy().copy(), requires_grad=True) for p in tg_params]
    tg_params, fresh, xt, yt = _setup(tapegrad, getattr(optim, name), groups, kw, tg_params)
    fresh.load_state_dict(_to_tapegrad(tsd))
    th_params, fresh_t, xs, ys = _setup(torch, getattr(torch.optim, name), groups,
                                        _torch_kw(kw), th_params)
    fresh_t.load_state_dict(_to_torch(sd))
    _train(tapegrad, tg_params, fresh, xt, yt, 10)
    _train(torch, th_params, fresh_t, xs, ys, 10)
    for a, b in zip(tg_params, th_params):
        _assert_close(a.detach().numpy(), b.detach().numpy(), "continued parameters")


@pytest.mark.parametrize("name,groups,kw", CASES, ids=IDS)
def test_state_dict_round_trip_resumes_bit_identically(name, groups, kw):
    straight = _run(tapegrad, getattr(optim, name), groups, kw, steps=30)
    half = _run(tapegrad, getattr(optim, name), groups, kw, steps=15)
    sd = copy.deepcopy(half[2].state_dict())
    params = [tapegrad.tensor(p, requires_grad=True) for p in half[1]]
    params, opt, xt, yt = _setup(tapegrad, getattr(optim, name), groups, kw, params)
    opt.load_state_dict(sd)
    _train(tapegrad, params, opt, xt, yt, 15)
    for a, b in zip(params, straight[1]):
        assert np.array_equal(a.detach().numpy(), b)


def test_float32_state_dtypes_match_torch():
    for name, groups, kw in CASES[::2]:
        def run(T, opt_cls, kwargs):
            init, x, y = _data()
            params = [T.tensor(init[k].astype(np.float32), requires_grad=True)
                      for k in ("w1", "b1", "w2", "b2")]
            opt = opt_cls([dict(params=params[:2], **groups[0]),
                           dict(params=params[2:], **groups[1])], **kwargs)
            xt, yt = T.tensor(x.astype(np.float32)), T.tensor(y.astype(np.float32))
            _train(T, params, opt, xt, yt, 10)
            return params, opt
        ours, opt = run(tapegrad, getattr(optim, name), kw)
        theirs, topt = run(torch, getattr(torch.optim, name), _torch_kw(kw))
        for a, b in zip(ours, theirs):
            assert a.dtype == tapegrad.float32
            np.testing.assert_allclose(a.detach().numpy(), b.detach().numpy(), rtol=2e-5,
                                       atol=2e-6)
        for i, state in opt.state_dict()["state"].items():
            for k, v in state.items():
                assert v.dtype.name == str(topt.state_dict()["state"][i][k].dtype)[6:], k


def test_hyperparameter_errors_as_torch():
    w = tapegrad.tensor(np.ones(3), requires_grad=True)
    tw = torch.ones(3, requires_grad=True)
    bad = [("Adadelta", dict(rho=1.5), "Invalid rho value: 1.5"),
           ("Adadelta", dict(eps=-1.0), "Invalid epsilon value: -1.0"),
           ("Adadelta", dict(lr=-1.0), "Invalid learning rate: -1.0"),
           ("Rprop", dict(etas=(1.2, 0.5)), "Invalid eta values: 1.2, 0.5"),
           ("ASGD", dict(weight_decay=-1), "Invalid weight_decay value: -1"),
           ("SparseAdam", dict(lr=0.0), "Invalid learning rate: 0.0"),
           ("SparseAdam", dict(betas=(0.9, 1.0)), "Invalid beta parameter at index 1: 1.0"),
           ("LBFGS", dict(lr=-1), "Invalid learning rate: -1")]
    for name, kw, msg in bad:
        for mod, p in ((optim, w), (torch.optim, tw)):
            with pytest.raises(ValueError, match=msg):
                getattr(mod, name)([p], **kw)
    with pytest.raises(NotImplementedError, match="differentiable"):
        optim.Adadelta([w], differentiable=True)


def test_sparse_adam_raises_for_dense_gradients_as_torch():
    w = tapegrad.tensor(np.ones(3), requires_grad=True)
    tw = torch.ones(3, dtype=torch.float64, requires_grad=True)
    opt, topt = optim.SparseAdam([w]), torch.optim.SparseAdam([tw])
    assert opt.state_dict()["param_groups"] == topt.state_dict()["param_groups"]
    assert opt.step() is None and topt.step() is None  # no gradients: nothing to do
    (w * 2).sum().backward()
    (tw * 2).sum().backward()
    with pytest.raises(RuntimeError, match="does not support dense gradients"):
        topt.step()
    with pytest.raises(RuntimeError, match="does not support dense gradients.*no sparse"):
        opt.step()
    assert w.tolist() == [1.0, 1.0, 1.0]


# --- LBFGS ------------------------------------------------------------------------------------
def _rosenbrock(x):
    return ((1 - x[:-1]) ** 2).sum() + 100 * ((x[1:] - x[:-1] ** 2) ** 2).sum()


def _lbfgs_rosenbrock(T, steps, x0, noise=None, **kw):
    x = T.tensor(x0, dtype=T.float64, requires_grad=True)
    opt = T.optim.LBFGS([x], **kw)

    def closure():
        opt.zero_grad()
        loss = _rosenbrock(x)
        loss.backward()
        jitter(T, [x], noise, grads=True)
        return loss

    losses, xs = [], []
    for _ in range(steps):
        losses.append(float(opt.step(closure).detach()))
        jitter(T, [x], noise)
        xs.append(x.detach().numpy().copy())
    return np.array(losses), np.array(xs), opt


def _mlp_lbfgs(T, steps, params=None, opt_state=None, noise=None, **kw):
    rng = np.random.default_rng(3)
    shapes = {"w1": (3, 6), "b1": (6,), "w2": (6, 2), "b2": (2,)}
    init = {k: rng.standard_normal(s) * 0.5 for k, s in shapes.items()}
    x, y = T.tensor(rng.standard_normal((16, 3))), T.tensor(rng.standard_normal((16, 2)))
    if params is None:
        params = [T.tensor(init[k].copy(), dtype=T.float64, requires_grad=True) for k in shapes]
    opt = T.optim.LBFGS(params, **kw)
    if opt_state is not None:
        opt.load_state_dict(opt_state)

    def closure():
        opt.zero_grad()
        h = T.tanh(x @ params[0] + params[1])
        r = h @ params[2] + params[3] - y
        loss = (r * r).mean()
        loss.backward()
        jitter(T, params, noise, grads=True)
        return loss

    losses = []
    for _ in range(steps):
        losses.append(float(opt.step(closure).detach()))
        jitter(T, params, noise)
    losses.append(float(closure().detach()))  # the loss at the final parameters
    return np.array(losses), [p.detach().numpy().copy() for p in params], opt


def _normwise_error(a, b):
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-300)


def _assert_close_normwise(a, b, what, rtol=RTOL):
    """Relative to the vector's largest entry: the history holds differences of gradients,
    whose small entries carry the cancellation's absolute error."""
    err = _normwise_error(a, b)
    assert err < rtol, f"{what}: normwise relative error {err:.3g} (tolerance {rtol:.3g})"


def _lbfgs_history(opt):
    """The state's arrays in ``_compare_lbfgs_state``'s order (for ``_lbfgs_tolerances``)."""
    s = opt.state_dict()["state"][0]
    return [s[k].numpy() for k in ("d", "prev_flat_grad", "H_diag")] + [
        a.numpy() for k in ("old_dirs", "old_stps", "ro", "al") for a in s[k] if a is not None]


def _compare_lbfgs_state(ours, theirs, rtol, history_rtol):
    """The history holds differences of nearly equal gradients and iterates, so its entries
    (and the direction built from them) keep less of the iterates' agreement."""
    s, ts = ours.state_dict()["state"][0], theirs.state_dict()["state"][0]
    assert list(s) == list(ts)
    assert s["func_evals"] == ts["func_evals"] and s["n_iter"] == ts["n_iter"]
    for k in ("d", "prev_flat_grad", "H_diag"):
        _assert_close_normwise(s[k].numpy(), ts[k].numpy(), f"state {k}", history_rtol)
    for k in ("old_dirs", "old_stps", "ro", "al"):
        assert len(s[k]) == len(ts[k]), k
        for a, b in zip(s[k], ts[k]):
            assert (a is None) == (b is None), k
            if a is not None:
                _assert_close_normwise(a.numpy(), b.numpy(), f"state {k}", history_rtol)
    _assert_close(float(s["t"]), float(ts["t"]), "state t", rtol)
    _assert_close(s["prev_loss"], ts["prev_loss"], "state prev_loss", rtol)
    assert isinstance(s["t"], tapegrad.Tensor) == isinstance(ts["t"], torch.Tensor)


def _lbfgs_tolerances(run):
    """Tolerances for the losses and iterates (relative) and the history (normwise) of
    ``run(noise) -> (losses, iterates, opt)``: NOISE_ULPS times how far 1 ulp of noise in
    every gradient and iterate moves them (see rounding_noise and test_optim's analysis; here
    PyTorch's dot products and norms also sum in another order, within a few ulps). Past
    convergence (the strong-Wolfe Rosenbrock runs) the history holds differences of nearly
    equal gradients: up to 1e-7 per ulp of noise there, which its cap allows."""
    def losses_and_iterates(noise):
        losses, iterates, _ = run(noise)
        return [losses, *iterates]

    rtol = tolerance(losses_and_iterates, _error, NOISE_ULPS, 1e-11)
    history_rtol = tolerance(lambda noise: _lbfgs_history(run(noise)[2]), _normwise_error,
                             NOISE_ULPS, 1e-7)
    return rtol, history_rtol


# Run lengths keep each run well conditioned. PyTorch's reductions sum in another order and
# L-BFGS on Rosenbrock's valley (or the MLP) amplifies last-ulp differences from step to step:
# longer runs drift apart (by 1e-10 after ~100 iterations), as any two BLAS builds would.
ROSENBROCK = [
    (np.array([-1.2, 1.0]), 15, dict(lr=0.1, max_iter=5)),
    (np.array([-1.5, 2.0, -0.5, 1.2]), 10, dict(lr=0.1, max_iter=5, history_size=3)),
    (np.array([-1.2, 1.0]), 5, dict(line_search_fn="strong_wolfe")),
    (np.array([-1.2, 1.0]), 3, dict(line_search_fn="strong_wolfe", max_iter=4,
                                    history_size=4)),
    (np.array([-1.5, 2.0, -0.5, 1.2]), 7, dict(line_search_fn="strong_wolfe", max_iter=5,
                                               history_size=3)),
    (np.array([-1.5, 2.0, -0.5, 1.2]), 6, dict(line_search_fn="strong_wolfe", max_iter=3,
                                               history_size=10)),
    (np.array([-1.5, 2.0, -0.5, 1.2]), 1, dict(line_search_fn="strong_wolfe", max_iter=8)),
]


@pytest.mark.parametrize("x0,steps,kw", ROSENBROCK,
                         ids=[f"{len(c[0])}d-{c[2].get('line_search_fn')}-{i}"
                              for i, c in enumerate(ROSENBROCK)])
def test_lbfgs_rosenbrock_matches_torch(x0, steps, kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ours = _lbfgs_rosenbrock(tapegrad, steps, x0, **kw)
        theirs = _lbfgs_rosenbrock(torch, steps, x0, **kw)
        rtol, history_rtol = _lbfgs_tolerances(
            lambda noise: _lbfgs_rosenbrock(tapegrad, steps, x0, noise=noise, **kw))
    _assert_close(ours[0], theirs[0], "losses", rtol)
    _assert_close(ours[1], theirs[1], "iterates", rtol)
    assert float(_rosenbrock(ours[1][-1])) < 0.5 * ours[0][0]
    _compare_lbfgs_state(ours[2], theirs[2], rtol, history_rtol)


MLP = [(4, dict(lr=0.1, max_iter=5)), (3, dict(lr=0.5, max_iter=5, history_size=3)),
       (5, dict(line_search_fn="strong_wolfe", max_iter=4, history_size=4)),
       (1, dict(line_search_fn="strong_wolfe", max_iter=10, history_size=5, max_eval=12))]


@pytest.mark.parametrize("steps,kw", MLP, ids=[f"{c[1].get('line_search_fn')}-{i}"
                                               for i, c in enumerate(MLP)])
def test_lbfgs_mlp_matches_torch(steps, kw):
    ours = _mlp_lbfgs(tapegrad, steps, **kw)
    theirs = _mlp_lbfgs(torch, steps, **kw)
    rtol, history_rtol = _lbfgs_tolerances(
        lambda noise: _mlp_lbfgs(tapegrad, steps, noise=noise, **kw))
    _assert_close(ours[0], theirs[0], "losses", rtol)
    for a, b in zip(ours[1], theirs[1]):
        _assert_close(a, b, "parameters", rtol)
    assert ours[0][-1] < 0.5 * ours[0][0]
    _compare_lbfgs_state(ours[2], theirs[2], rtol, history_rtol)
    _same_group_options(ours[2].state_dict(), theirs[2].state_dict())


@pytest.mark.parametrize("kw", [dict(lr=0.5, max_iter=5, history_size=3),
                                dict(line_search_fn="strong_wolfe", max_iter=4, history_size=4)])
def test_lbfgs_state_dict_round_trip_and_torch_interchange(kw):
    straight = _mlp_lbfgs(tapegrad, 4, **kw)
    half = _mlp_lbfgs(tapegrad, 2, **kw)
    sd = copy.deepcopy(half[2].state_dict())
    params = [tapegrad.tensor(p, requires_grad=True) for p in half[1]]
    resumed = _mlp_lbfgs(tapegrad, 2, params=params, opt_state=sd, **kw)
    for a, b in zip(resumed[1], straight[1]):
        assert np.array_equal(a, b)
    assert resumed[2].state_dict()["state"][0]["n_iter"] == straight[2].state[
        straight[2]._params[0]]["n_iter"]
    # PyTorch's mid-run state continues in tapegrad as it does in PyTorch
    t_half = _mlp_lbfgs(torch, 2, **kw)
    t_rest = _mlp_lbfgs(torch, 2, params=[torch.tensor(p, requires_grad=True) for p in t_half[1]],
                        opt_state=copy.deepcopy(t_half[2].state_dict()), **kw)
    ours = _mlp_lbfgs(tapegrad, 2, params=[tapegrad.tensor(p, requires_grad=True)
                                           for p in t_half[1]],
                      opt_state=_to_tapegrad(t_half[2].state_dict()), **kw)
    # two steps in each library, then two more in tapegrad: bounded by a 4-step run
    rtol, _ = _lbfgs_tolerances(lambda noise: _mlp_lbfgs(tapegrad, 4, noise=noise, **kw))
    _assert_close(ours[0], t_rest[0], "losses after loading PyTorch's state", rtol)
    for a, b in zip(ours[1], t_rest[1]):
        _assert_close(a, b, "parameters after loading PyTorch's state", rtol)


def test_lbfgs_stops_on_tolerances_and_rejects_groups():
    x = tapegrad.tensor(np.array([1.0, 1.0]), requires_grad=True)  # the minimum: grad 0
    opt = optim.LBFGS([x])
    calls = []

    def closure():
        calls.append(1)
        opt.zero_grad()
        loss = _rosenbrock(x)
        loss.backward()
        return loss

    assert float(opt.step(closure)) == 0.0 and len(calls) == 1
    assert opt.state[x] == {"func_evals": 1, "n_iter": 0}
    y = tapegrad.tensor(np.ones(2), requires_grad=True)
    with pytest.raises(ValueError, match="doesn't support per-parameter options"):
        optim.LBFGS([{"params": [x]}, {"params": [y]}])
    opt = optim.LBFGS([y], line_search_fn="backtracking")
    with pytest.raises(RuntimeError, match="only 'strong_wolfe' is supported"):
        opt.step(lambda: ((y * y).sum() * 1.0).backward() or (y * y).sum())
    assert optim.LBFGS([y]).param_groups[0]["max_eval"] == 25  # max_iter * 5 // 4


def test_lbfgs_float32_matches_torch():
    def run(T):
        x = T.tensor(np.array([-1.2, 1.0], dtype=np.float32), requires_grad=True)
        opt = T.optim.LBFGS([x], line_search_fn="strong_wolfe", max_iter=6)

        def closure():
            opt.zero_grad()
            loss = _rosenbrock(x)
            loss.backward()
            return loss
        opt.step(closure)
        return x.detach().numpy(), opt.state_dict()["state"][0]

    (a, s), (b, ts) = run(tapegrad), run(torch)
    assert a.dtype == np.float32
    np.testing.assert_allclose(a, b, rtol=1e-5)
    assert s["d"].dtype == tapegrad.float32 and s["n_iter"] == ts["n_iter"]


# --- schedulers ------------------------------------------------------------------------------
def _sched_pair(opt_name, opt_kw, groups_lr, make):
    """The same scheduler over a tapegrad and a PyTorch optimizer with two groups."""
    out = []
    for T, mod in ((tapegrad, optim), (torch, torch.optim)):
        params = [T.zeros(2, requires_grad=True), T.zeros(3, requires_grad=True)]
        opt = getattr(mod, opt_name)([dict(params=[params[0]], lr=groups_lr[0]),
                                      dict(params=[params[1]], lr=groups_lr[1])], **opt_kw)
        out.append((opt, make(mod, opt)))
    return out


def _group_values(opt):
    vals = []
    for g in opt.param_groups:
        vals.append(g["lr"])
        if "momentum" in g:
            vals.append(g["momentum"])
        if "betas" in g:
            vals.extend(g["betas"])
    return vals


def _step_both(pairs, steps, rtol=1e-15):
    """Step both schedulers, comparing lrs and momenta; returns tapegrad's lr sequence."""
    (opt, sched), (topt, tsched) = pairs
    _assert_close(sched.get_last_lr(), tsched.get_last_lr(), "initial lr", rtol)
    lrs = [sched.get_last_lr()[0]]
    for i in range(steps):
        opt.step()
        topt.step()
        sched.step()
        tsched.step()
        _assert_close(sched.get_last_lr(), tsched.get_last_lr(), f"lr at step {i}", rtol)
        _assert_close(_group_values(opt), _group_values(topt), f"group at step {i}", rtol)
        lrs.append(sched.get_last_lr()[0])
    return lrs


class _ScaleObj:
    def __init__(self):
        self.rate = 0.5

    def __call__(self, x):
        return 1.0 / (1.0 + self.rate * x)


CYCLIC = [
    ("SGD", dict(momentum=0.9), dict(base_lr=0.01, max_lr=0.1, step_size_up=7)),
    ("SGD", dict(momentum=0.5), dict(base_lr=[0.01, 0.02], max_lr=[0.1, 0.3], step_size_up=5,
                                     step_size_down=12, mode="triangular2",
                                     base_momentum=[0.7, 0.6], max_momentum=[0.9, 0.95])),
    ("Adam", {}, dict(base_lr=0.001, max_lr=0.01, step_size_up=10, mode="exp_range",
                      gamma=0.99)),
    ("SGD", {}, dict(base_lr=0.1, max_lr=1.0, step_size_up=4, mode="triangular",
                     cycle_momentum=False)),
    ("RMSprop", dict(momentum=0.5), dict(base_lr=0.01, max_lr=0.05, step_size_up=6,
                                         scale_fn=lambda x: 0.9 ** x,
                                         scale_mode="iterations")),
    ("Adam", {}, dict(base_lr=0.01, max_lr=0.05, step_size_up=6, scale_fn=_ScaleObj())),
]


@pytest.mark.parametrize("opt_name,opt_kw,kw", CYCLIC, ids=[f"{c[0]}-{i}"
                                                           for i, c in enumerate(CYCLIC)])
def test_cyclic_lr_matches_torch(opt_name, opt_kw, kw):
    pairs = _sched_pair(opt_name, opt_kw, (0.5, 0.5),
                        lambda mod, opt: mod.lr_scheduler.CyclicLR(opt, **kw))
    lrs = _step_both(pairs, 130)
    assert max(lrs[:30]) - min(lrs[:30]) > 1e-3  # the lr cycles


def test_cyclic_lr_state_dict_round_trip_and_errors():
    pairs = _sched_pair("SGD", dict(momentum=0.9), (0.1, 0.1),
                        lambda mod, opt: mod.lr_scheduler.CyclicLR(
                            opt, 0.01, 0.1, step_size_up=5, mode="triangular2",
                            scale_fn=_ScaleObj()))
    (opt, sched), (topt, tsched) = pairs
    _step_both(pairs, 23)
    sd, tsd = sched.state_dict(), tsched.state_dict()
    assert "_scale_fn_ref" not in sd and sd["_scale_fn_custom"] == {"rate": 0.5}
    assert set(tsd) - set(sd) <= {"_get_lr_called_within_step", "_is_initial"}
    assert set(sd) - set(tsd) == set()
    # resume: a fresh scheduler loading the state continues exactly
    params = [tapegrad.zeros(2, requires_grad=True), tapegrad.zeros(3, requires_grad=True)]
    opt2 = optim.SGD([dict(params=[params[0]]), dict(params=[params[1]])], lr=0.1,
                     momentum=0.9)
    opt2.load_state_dict(opt.state_dict())
    fn = _ScaleObj()
    fn.rate = 7.0
    sched2 = lr_scheduler.CyclicLR(opt2, 0.01, 0.1, step_size_up=5, mode="triangular2",
                                   scale_fn=fn)
    sched2.load_state_dict(copy.deepcopy(sd))
    assert fn.rate == 0.5
    for _ in range(40):
        for o, s in ((opt, sched), (opt2, sched2)):
            o.step()
            s.step()
        assert sched2.get_last_lr() == sched.get_last_lr()
        assert _group_values(opt2) == _group_values(opt)
    p = tapegrad.zeros(2, requires_grad=True)
    with pytest.raises(ValueError, match="mode is invalid and scale_fn is None"):
        lr_scheduler.CyclicLR(optim.SGD([p], momentum=0.9), 0.1, 1.0, mode="sawtooth")
    with pytest.raises(ValueError, match="must support momentum or beta1"):
        lr_scheduler.CyclicLR(optim.Adagrad([p]), 0.1, 1.0)
    with pytest.raises(ValueError, match="base_lr must have the same length"):
        lr_scheduler.CyclicLR(optim.SGD([p], momentum=0.9), [0.1, 0.2], 1.0)


def test_polynomial_lr_matches_torch():
    for kw in (dict(total_iters=100, power=2.0), dict(total_iters=7, power=0.5), {}):
        pairs = _sched_pair("SGD", {}, (0.1, 0.05),
                            lambda mod, opt: mod.lr_scheduler.PolynomialLR(opt, **kw))
        _step_both(pairs, 110)


SWALR_CASES = [dict(swa_lr=0.05, anneal_epochs=5), dict(swa_lr=[0.05, 0.2], anneal_epochs=13,
                                                        anneal_strategy="linear"),
               dict(swa_lr=0.01, anneal_epochs=0), dict(swa_lr=0.3, anneal_epochs=1,
                                                        anneal_strategy="linear")]


@pytest.mark.parametrize("kw", SWALR_CASES)
def test_swalr_matches_torch(kw):
    pairs = _sched_pair("SGD", dict(momentum=0.9), (0.5, 0.1),
                        lambda mod, opt: mod.swa_utils.SWALR(opt, **kw))
    _step_both(pairs, 120)
    sd, tsd = pairs[0][1].state_dict(), pairs[1][1].state_dict()
    assert "anneal_func" not in sd and sd["_anneal_strategy"] == tsd["_anneal_strategy"]
    assert set(sd) - set(tsd) == set()
    assert pairs[0][0].param_groups[1]["swa_lr"] == pairs[1][0].param_groups[1]["swa_lr"]


def test_swalr_after_cosine_and_errors():
    def make(mod, opt):
        return mod.lr_scheduler.CosineAnnealingLR(opt, T_max=20)
    pairs = _sched_pair("SGD", {}, (0.5, 0.1), make)
    _step_both(pairs, 10)
    (opt, _), (topt, _) = pairs
    swa, tswa = swa_utils.SWALR(opt, swa_lr=0.02), torch.optim.swa_utils.SWALR(topt, swa_lr=0.02)
    _step_both([(opt, swa), (topt, tswa)], 30)
    sd = copy.deepcopy(swa.state_dict())
    swa.load_state_dict(sd)
    assert swa.anneal_func is swa_utils.SWALR._cosine_anneal
    with pytest.raises(ValueError, match="anneal_strategy must be one of"):
        swa_utils.SWALR(opt, 0.1, anneal_strategy="step")
    with pytest.raises(ValueError, match="anneal_epochs must be equal or greater than 0"):
        swa_utils.SWALR(opt, 0.1, anneal_epochs=-1)


# --- AveragedModel and update_bn -----------------------------------------------------------
def _bn_models():
    torch.manual_seed(0)
    tmodel = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4),
                                 torch.nn.ReLU(), torch.nn.Linear(4, 2)).double()
    model = tapegrad.nn.Sequential(tapegrad.nn.Linear(3, 4), tapegrad.nn.BatchNorm1d(4),
                                   tapegrad.nn.ReLU(), tapegrad.nn.Linear(4, 2)).double()
    model.load_state_dict({k: tapegrad.tensor(v.numpy().copy())
                           for k, v in tmodel.state_dict().items()})
    return model, tmodel


def _perturb(model, tmodel, rng):
    """The same new weights in both models, and one training-mode forward (moves BN stats)."""
    new = {k: v.numpy() + (rng.standard_normal(v.shape) * 0.3 if v.dtype.is_floating_point
                           and "running" not in k else 0)
           for k, v in tmodel.state_dict().items()}
    tmodel.load_state_dict({k: torch.tensor(v) for k, v in new.items()})
    model.load_state_dict({k: tapegrad.tensor(np.array(v)) for k, v in new.items()})
    x = rng.standard_normal((6, 3))
    with torch.no_grad():
        tmodel(torch.tensor(x))
    with tapegrad.no_grad():
        model(tapegrad.tensor(x))


AVERAGING = [
    ("swa", dict()),
    ("ema-multi", dict(multi_avg_fn="ema")),
    ("swa-multi", dict(multi_avg_fn="swa")),
    ("ema-avg", dict(avg_fn="ema")),
    ("custom-avg", dict(avg_fn="custom")),
    ("ema-multi-buffers", dict(multi_avg_fn="ema", use_buffers=True)),
    ("swa-buffers", dict(use_buffers=True)),
]


def _avg_kwargs(mod, spec):
    kw = dict(spec)
    if kw.get("multi_avg_fn") == "ema":
        kw["multi_avg_fn"] = mod.get_ema_multi_avg_fn(0.9)
    elif kw.get("multi_avg_fn") == "swa":
        kw["multi_avg_fn"] = mod.get_swa_multi_avg_fn()
    if kw.get("avg_fn") == "ema":
        kw["avg_fn"] = mod.get_ema_avg_fn(0.8)
    elif kw.get("avg_fn") == "custom":
        kw["avg_fn"] = lambda avg, cur, n: 0.25 * avg + 0.75 * cur + 0.01 * n
    return kw


@pytest.mark.parametrize("name,spec", AVERAGING, ids=[a[0] for a in AVERAGING])
def test_averaged_model_matches_torch(name, spec):
    model, tmodel = _bn_models()
    avg = swa_utils.AveragedModel(model, **_avg_kwargs(swa_utils, spec))
    tavg = torch.optim.swa_utils.AveragedModel(tmodel,
                                               **_avg_kwargs(torch.optim.swa_utils, spec))
    rng = np.random.default_rng(5)
    for _ in range(6):
        _perturb(model, tmodel, rng)
        avg.update_parameters(model)
        tavg.update_parameters(tmodel)
    sd, tsd = avg.state_dict(), tavg.state_dict()
    assert list(sd) == list(tsd)
    for k, v in tsd.items():
        assert sd[k].dtype.name == str(v.dtype)[6:], k
        _assert_close(sd[k].numpy(), v.numpy(), k)
    assert int(avg.n_averaged) == 6
    assert not np.allclose(sd["module.0.weight"].numpy(), model[0].weight.detach().numpy())
    x = rng.standard_normal((5, 3))
    avg.eval()
    tavg.eval()
    _assert_close(avg(tapegrad.tensor(x)).detach().numpy(),
                  tavg(torch.tensor(x)).detach().numpy(), "averaged model output")
    assert all(p.grad is None for p in avg.parameters())


def test_averaged_model_errors_and_decay_check():
    model, _ = _bn_models()
    with pytest.raises(AssertionError, match="Only one of avg_fn and multi_avg_fn"):
        swa_utils.AveragedModel(model, avg_fn=swa_utils.get_swa_avg_fn(),
                                multi_avg_fn=swa_utils.get_swa_multi_avg_fn())
    for fn in (swa_utils.get_ema_avg_fn, swa_utils.get_ema_multi_avg_fn):
        with pytest.raises(ValueError, match="Invalid decay value 1.5"):
            fn(1.5)
    avg = swa_utils.AveragedModel(model)
    assert avg.module is not model and avg.n_averaged.dtype == tapegrad.int64


def test_update_bn_matches_torch():
    model, tmodel = _bn_models()
    tmodel[1].momentum = 0.3
    model[1].momentum = 0.3
    rng = np.random.default_rng(2)
    _perturb(model, tmodel, rng)
    batches = [rng.standard_normal((7, 3)) for _ in range(4)]
    loader = [tapegrad.tensor(b) if i % 2 else (tapegrad.tensor(b), None)
              for i, b in enumerate(batches)]
    tloader = [torch.tensor(b) if i % 2 else (torch.tensor(b), None)
               for i, b in enumerate(batches)]
    model.eval()
    tmodel.eval()
    swa_utils.update_bn(loader, model)
    torch.optim.swa_utils.update_bn(tloader, tmodel)
    assert not model.training and model[1].momentum == 0.3
    sd, tsd = model.state_dict(), tmodel.state_dict()
    for k, v in tsd.items():
        _assert_close(sd[k].numpy(), v.numpy(), k)
    assert int(sd["1.num_batches_tracked"]) == 4
    # the running mean is the plain average of the batch means (cumulative, not momentum)
    with tapegrad.no_grad():
        means = [model[0](tapegrad.tensor(b)).numpy().mean(0) for b in batches]
    _assert_close(sd["1.running_mean"].numpy(), np.mean(means, 0), "cumulative mean")
    # a model without batch norms is left alone
    lin = tapegrad.nn.Linear(3, 2)
    swa_utils.update_bn(loader, lin)
    # instance norms are not batch norms (PyTorch's class tree): their statistics just move on
    norms = tapegrad.nn.Sequential(tapegrad.nn.InstanceNorm1d(3, track_running_stats=True),
                                   tapegrad.nn.BatchNorm1d(3, momentum=None)).double()
    tnorms = torch.nn.Sequential(torch.nn.InstanceNorm1d(3, track_running_stats=True),
                                 torch.nn.BatchNorm1d(3, momentum=None)).double()
    batches = [rng.standard_normal((4, 3, 5)) * (i + 1) for i in range(3)]
    for _ in range(2):
        swa_utils.update_bn([tapegrad.tensor(b) for b in batches], norms)
        torch.optim.swa_utils.update_bn([torch.tensor(b) for b in batches], tnorms)
    assert norms[1].momentum is None
    sd, tsd = norms.state_dict(), tnorms.state_dict()
    assert list(sd) == list(tsd)
    for k, v in tsd.items():
        _assert_close(sd[k].numpy(), v.numpy(), k)
    assert int(sd["1.num_batches_tracked"]) == 3
