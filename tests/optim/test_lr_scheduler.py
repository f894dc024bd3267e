"""Schedulers against PyTorch: 100-step lr sequences, state_dict round trips, warnings."""
import warnings

import numpy as np
import pytest
import torch

import tapegrad
from tapegrad import optim
from tapegrad.optim import lr_scheduler as tg_sched

STEPS = 100


def _optimizer(T, kind="SGD"):
    w = T.zeros(2, dtype=T.float64, requires_grad=True) if T is torch else \
        tapegrad.tensor(np.zeros(2), requires_grad=True)
    v = T.zeros(3, dtype=T.float64, requires_grad=True) if T is torch else \
        tapegrad.tensor(np.zeros(3), requires_grad=True)
    mod = torch.optim if T is torch else optim
    if kind == "Adam":
        return mod.Adam([{"params": [w]}, {"params": [v], "lr": 0.05}], lr=0.1)
    return mod.SGD([{"params": [w]}, {"params": [v], "lr": 0.05}], lr=0.1, momentum=0.9)


def _lambda(epoch):
    return 0.97**epoch + 0.01 * (epoch % 7)


def _scale(epoch):
    return 0.99 if epoch % 3 else 1.01


def _make(S, opt, name):
    """One scheduler configuration by name, built from module ``S`` (torch's or ours)."""
    configs = {
        "LambdaLR": lambda: S.LambdaLR(opt, [_lambda, lambda e: 1.0 / (1 + e)]),
        "MultiplicativeLR": lambda: S.MultiplicativeLR(opt, _scale),
        "StepLR": lambda: S.StepLR(opt, step_size=7, gamma=0.5),
        "MultiStepLR": lambda: S.MultiStepLR(opt, milestones=[10, 30, 30, 75], gamma=0.3),
        "ExponentialLR": lambda: S.ExponentialLR(opt, gamma=0.97),
        "CosineAnnealingLR": lambda: S.CosineAnnealingLR(opt, T_max=23, eta_min=1e-3),
        "CosineAnnealingWarmRestarts": lambda: S.CosineAnnealingWarmRestarts(
            opt, T_0=7, T_mult=2, eta_min=1e-4),
        "LinearLR": lambda: S.LinearLR(opt, start_factor=0.1, end_factor=0.9, total_iters=37),
        "ConstantLR": lambda: S.ConstantLR(opt, factor=0.3, total_iters=17),
        "PolynomialLR": lambda: S.PolynomialLR(opt, total_iters=60, power=1.7),
        "OneCycleLR": lambda: S.OneCycleLR(opt, max_lr=[0.5, 0.2], total_steps=STEPS + 1),
        "OneCycleLR3": lambda: S.OneCycleLR(opt, max_lr=0.5, epochs=5, steps_per_epoch=21,
                                            three_phase=True, anneal_strategy="linear"),
        "SequentialLR": lambda: S.SequentialLR(
            opt, [S.LinearLR(opt, start_factor=0.2, total_iters=10),
                  S.CosineAnnealingLR(opt, T_max=40), S.ExponentialLR(opt, 0.95)],
            milestones=[10, 50]),
        "ChainedScheduler": lambda: S.ChainedScheduler(
            [S.ConstantLR(opt, factor=0.5, total_iters=9), S.ExponentialLR(opt, 0.98)]),
    }
    return configs[name]()


NAMES = ["LambdaLR", "MultiplicativeLR", "StepLR", "MultiStepLR", "ExponentialLR",
         "CosineAnnealingLR", "CosineAnnealingWarmRestarts", "LinearLR", "ConstantLR",
         "PolynomialLR", "OneCycleLR", "OneCycleLR3", "SequentialLR", "ChainedScheduler"]


def _momentum(group):
    return group["betas"][0] if "betas" in group else group.get("momentum")


def _trace(T, name, kind="SGD", steps=STEPS, resume_at=None):
    S = torch.optim.lr_scheduler if T is torch else tg_sched
    opt = _optimizer(T, kind)
    sched = _make(S, opt, name)
    lrs = [list(sched.get_last_lr())]
    momenta = [[_momentum(g) for g in opt.param_groups]]
    for i in range(steps):
        if i == resume_at:
            sd, osd = sched.state_dict(), opt.state_dict()
            opt = _optimizer(T, kind)
            sched = _make(S, opt, name)
            sched.load_state_dict(sd)
            opt.load_state_dict(osd)
        opt.step()
        sched.step()
        lrs.append(list(sched.get_last_lr()))
        momenta.append([_momentum(g) for g in opt.param_groups])
        assert lrs[-1] == [g["lr"] for g in opt.param_groups]
    return lrs, momenta


@pytest.mark.parametrize("name", NAMES)
def test_lr_sequence_matches_torch(name):
    kind = "Adam" if name == "OneCycleLR3" else "SGD"
    ours, our_momenta = _trace(tapegrad, name, kind)
    theirs, their_momenta = _trace(torch, name, kind)
    np.testing.assert_allclose(ours, theirs, rtol=1e-15, atol=0)
    assert our_momenta == their_momenta
    assert len({tuple(x) for x in ours}) > 1  # the schedule moved


@pytest.mark.parametrize("name", NAMES)
def test_state_dict_round_trip_mid_way(name):
    kind = "Adam" if name == "OneCycleLR3" else "SGD"
    straight = _trace(tapegrad, name, kind)
    resumed = _trace(tapegrad, name, kind, resume_at=50)
    assert straight == resumed
    torch_resumed = _trace(torch, name, kind, resume_at=50)
    np.testing.assert_allclose(resumed[0], torch_resumed[0], rtol=1e-15, atol=0)


def _plateau_trace(T, kwargs, resume_at=None):
    S = torch.optim.lr_scheduler if T is torch else tg_sched
    opt = _optimizer(T)
    sched = S.ReduceLROnPlateau(opt, **kwargs)
    rng = np.random.default_rng(3)
    metrics = np.cumsum(rng.standard_normal(STEPS)) * 0.1 + np.linspace(5, 0, STEPS) ** 2 / 10
    lrs = []
    for i, m in enumerate(metrics):
        if i == resume_at:
            sd = sched.state_dict()
            opt2 = _optimizer(T)
            opt2.load_state_dict(opt.state_dict())
            opt = opt2
            sched = S.ReduceLROnPlateau(opt, **kwargs)
            sched.load_state_dict(sd)
        opt.step()
        sched.step(float(m))
        lrs.append(list(sched.get_last_lr()))
    return lrs


@pytest.mark.parametrize("kwargs", [
    dict(patience=3, factor=0.5),
    dict(mode="max", patience=2, threshold=0.05, threshold_mode="abs", cooldown=3,
         min_lr=[0.01, 0.02]),
    dict(patience=0, factor=0.3, threshold=0.2, cooldown=1, min_lr=1e-3, eps=1e-3),
])
def test_reduce_lr_on_plateau_matches_torch(kwargs):
    ours, theirs = _plateau_trace(tapegrad, kwargs), _plateau_trace(torch, kwargs)
    assert ours == theirs
    assert len({tuple(x) for x in ours}) > 1
    assert _plateau_trace(tapegrad, kwargs, resume_at=40) == ours


def test_scheduler_step_before_optimizer_step_warns():
    opt = _optimizer(tapegrad)
    sched = tg_sched.StepLR(opt, step_size=2)
    with pytest.warns(UserWarning, match="before `optimizer.step\\(\\)`"):
        sched.step()
    opt = _optimizer(tapegrad)
    sched = tg_sched.StepLR(opt, step_size=2)
    opt.step()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sched.step()
        sched.step()


def test_get_lr_outside_step_warns_and_epoch_argument_is_deprecated():
    opt = _optimizer(tapegrad)
    sched = tg_sched.ExponentialLR(opt, 0.9)
    with pytest.warns(UserWarning, match="get_last_lr"):
        sched.get_lr()
    opt.step()
    with pytest.warns(UserWarning, match="epoch parameter"):
        sched.step(5)
    assert sched.get_last_lr() == pytest.approx([0.1 * 0.9**5, 0.05 * 0.9**5], rel=1e-15)


def test_constructor_errors():
    opt = _optimizer(tapegrad)
    with pytest.raises(TypeError, match="is not an Optimizer"):
        tg_sched.StepLR(object(), 3)
    with pytest.raises(KeyError, match="initial_lr"):
        tg_sched.StepLR(opt, 3, last_epoch=5)
    with pytest.raises(ValueError, match="Expected 2 lr_lambdas"):
        tg_sched.LambdaLR(opt, [_lambda])
    with pytest.raises(ValueError, match="between 0 and 1"):
        tg_sched.ConstantLR(opt, factor=2.0)
    with pytest.raises(ValueError, match="T_0"):
        tg_sched.CosineAnnealingWarmRestarts(opt, T_0=0)
    with pytest.raises(ValueError, match="total_steps OR"):
        tg_sched.OneCycleLR(opt, max_lr=0.1)
    with pytest.raises(ValueError, match="one more than the number of milestone"):
        tg_sched.SequentialLR(opt, [tg_sched.StepLR(opt, 3)], milestones=[3])
    with pytest.raises(ValueError, match="Factor should be < 1.0"):
        tg_sched.ReduceLROnPlateau(opt, factor=1.5)
    with pytest.raises(ValueError, match="mode foo is unknown"):
        tg_sched.ReduceLROnPlateau(opt, mode="foo")
    sched = tg_sched.OneCycleLR(opt, max_lr=0.1, total_steps=2)
    opt.step()
    sched.step()
    sched.step()
    with pytest.raises(ValueError, match="Tried to step 3 times"):
        sched.step()


@pytest.mark.parametrize("name", ["StepLR", "MultiStepLR", "ExponentialLR", "CosineAnnealingLR",
                                  "LinearLR", "ConstantLR", "PolynomialLR",
                                  "CosineAnnealingWarmRestarts", "LambdaLR"])
def test_explicit_epochs_use_the_closed_form_as_torch(name):
    def run(T):
        S = torch.optim.lr_scheduler if T is torch else tg_sched
        opt = _optimizer(T)
        sched = _make(S, opt, name)
        out = []
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for epoch in [3, 4, 10, 7, 30, 31, 62, 5]:
                opt.step()
                sched.step(epoch)
                out.append(list(sched.get_last_lr()))
        return out

    np.testing.assert_allclose(run(tapegrad), run(torch), rtol=1e-15, atol=0)


@pytest.mark.parametrize("name", ["StepLR", "CosineAnnealingLR", "LinearLR", "ExponentialLR",
                                  "MultiStepLR"])
def test_constructing_with_last_epoch_resumes_as_torch(name):
    def run(T):
        S = torch.optim.lr_scheduler if T is torch else tg_sched
        opt = _optimizer(T)
        for group in opt.param_groups:
            group["initial_lr"] = group["lr"]
            group["lr"] = group["lr"] * 0.5
        kwargs = {"StepLR": dict(step_size=4), "CosineAnnealingLR": dict(T_max=15),
                  "LinearLR": dict(total_iters=9), "ExponentialLR": dict(gamma=0.9),
                  "MultiStepLR": dict(milestones=[8, 12])}[name]
        sched = getattr(S, name)(opt, last_epoch=6, **kwargs)
        out = [list(sched.get_last_lr())]
        for _ in range(20):
            opt.step()
            sched.step()
            out.append(list(sched.get_last_lr()))
        return out

    np.testing.assert_allclose(run(tapegrad), run(torch), rtol=1e-15, atol=0)
