"""Anomaly mode names the op that first made NaN/inf, forward or backward, and the user line."""
import warnings

import numpy as np
import pytest

import tapegrad
from tapegrad.autograd import (detect_anomaly, set_detect_anomaly, is_anomaly_enabled,
                               is_anomaly_check_nan_enabled)
from tapegrad.autograd.engine import WATCH


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        yield
    assert not is_anomaly_enabled() and not WATCH


def _model(x):
    y = x.sqrt()  # MARK-sqrt: its backward divides by 0 at x == 0
    return (y * 0.0).sum()


def test_backward_nan_names_the_op_and_the_forward_line():
    x = tapegrad.tensor([4.0, 0.0], requires_grad=True)
    with pytest.raises(RuntimeError) as err:
        with detect_anomaly():
            _model(x).backward()
    msg = str(err.value)
    assert msg.startswith("Function 'SqrtBackward' returned nan values in its 0th output.")
    assert "test_anomaly.py" in msg and "MARK-sqrt" in msg
    assert "ops/" not in msg and "tensor.py" not in msg  # trimmed to the user's frames


def test_backward_inf_is_reported():
    x = tapegrad.tensor([1.0, 0.0], requires_grad=True)
    with pytest.raises(RuntimeError, match="'SqrtBackward' returned inf values"):
        with detect_anomaly():
            x.sqrt().sum().backward()  # 1 / (2 sqrt(0)) = inf


def test_forward_nan_names_the_first_op_and_earlier_inf():
    x = tapegrad.tensor([1.0, 1000.0], requires_grad=True)
    with pytest.raises(RuntimeError) as err:
        with detect_anomaly():
            big = x.exp()  # MARK-exp: overflows to inf, allowed by itself
            ratio = big / big  # MARK-div: inf / inf = nan, the first nan
            ratio.tanh().sum()
    msg = str(err.value)
    assert "the forward of 'div' produced nan" in msg
    assert "MARK-div" in msg
    assert "first inf appeared earlier, in the forward of 'exp'" in msg and "MARK-exp" in msg


def test_nan_carried_in_from_the_input_is_not_blamed_on_the_op():
    x = tapegrad.tensor([np.nan, 1.0], requires_grad=True)
    with detect_anomaly():
        y = (x * 2).tanh()  # nan in, nan out: no op produced it
    assert np.isnan(y.detach().numpy()[0])


def test_legitimate_inf_in_forward_is_allowed():
    x = tapegrad.tensor([0.5, -1.0], requires_grad=True)
    with detect_anomaly():
        masked = tapegrad.where(x > 0, x, -np.inf)  # a -inf mask, as attention uses
        out = masked.exp().sum()
        out.backward()
    assert x.grad.numpy()[0] == pytest.approx(np.exp(0.5)) and x.grad.numpy()[1] == 0


def test_off_by_default_and_no_tracebacks_recorded():
    x = tapegrad.tensor([4.0, 0.0], requires_grad=True)
    y = x.sqrt()
    assert y.grad_fn.stack is None
    y.sum().backward()  # nan/inf gradients pass silently without anomaly mode
    assert not np.isfinite(x.grad.numpy()).all()


def test_forward_outside_anomaly_mode_says_so():
    x = tapegrad.tensor([4.0, 0.0], requires_grad=True)
    loss = x.sqrt().sum()
    with pytest.raises(RuntimeError, match="forward ran outside anomaly mode"):
        with detect_anomaly():
            loss.backward()


def test_set_detect_anomaly_and_check_nan_flag():
    set_detect_anomaly(True)
    try:
        assert is_anomaly_enabled() and is_anomaly_check_nan_enabled()
        with set_detect_anomaly(False):
            assert not is_anomaly_enabled()
        assert is_anomaly_enabled()
        with detect_anomaly(check_nan=False):
            assert is_anomaly_enabled() and not is_anomaly_check_nan_enabled()
            x = tapegrad.tensor([0.0], requires_grad=True)
            y = x.sqrt()
            y.sum().backward()  # check_nan off: records stacks, raises nothing
            assert y.grad_fn.stack is not None
        assert is_anomaly_check_nan_enabled()
    finally:
        set_detect_anomaly(False)
    assert not is_anomaly_enabled()


def test_decorator_form():
    @detect_anomaly()
    def step(x):
        return x.sqrt().sum().backward()

    with pytest.raises(RuntimeError, match="SqrtBackward"):
        step(tapegrad.tensor([0.0], requires_grad=True))


def test_create_graph_backward_is_checked():
    x = tapegrad.tensor([0.0, 1.0], requires_grad=True)
    with pytest.raises(RuntimeError, match="returned (nan|inf) values"):
        with detect_anomaly():
            (g,) = tapegrad.autograd.grad((x * x * x).sum(), x, create_graph=True)
            (g.sqrt()).sum().backward()  # d sqrt(3x^2) at 0


def test_results_unchanged_under_anomaly_mode():
    rng = np.random.default_rng(0)
    a = rng.standard_normal((3, 4))
    w = rng.standard_normal((4, 2))
    grads = []
    for on in (False, True):
        x = tapegrad.tensor(a, requires_grad=True)
        with set_detect_anomaly(on):
            ((x @ tapegrad.tensor(w)).tanh() * x.sum()).sum().backward()
        grads.append(x.grad.numpy())
    assert np.array_equal(*grads)
