"""gradcheck and gradgradcheck must be able to fail: each is fed a deliberately wrong rule."""
import numpy as np
import pytest

import tapegrad
from tapegrad.autograd import GradcheckError, gradcheck, gradgradcheck


class WrongFirstOrder(tapegrad.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * 2.01 * x  # 0.5% off


class DetachedSecondOrder(tapegrad.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * 2 * x.detach()  # right value, but no second derivative


def _x():
    return tapegrad.tensor(np.array([0.7, 1.3, 2.1]), requires_grad=True)


def test_gradcheck_catches_a_wrong_rule_and_names_the_worst_element():
    with pytest.raises(GradcheckError, match=r"worst element \(output 2, input 2\)"):
        gradcheck(WrongFirstOrder.apply, (_x(),))
    assert gradcheck(WrongFirstOrder.apply, (_x(),), raise_exception=False) is False


def test_gradgradcheck_catches_a_missing_second_derivative():
    assert gradcheck(DetachedSecondOrder.apply, (_x(),))
    with pytest.raises(GradcheckError, match="Jacobian mismatch"):
        gradgradcheck(DetachedSecondOrder.apply, (_x(),))


def test_gradcheck_needs_float64():
    x = tapegrad.tensor([1.0, 2.0], requires_grad=True)  # float32
    with pytest.raises(GradcheckError, match="float64"):
        gradcheck(lambda t: t * t, (x,))


def test_correct_rules_pass_both_orders():
    x = _x()
    assert gradcheck(lambda t: (t * t).tanh().sum(), (x,))
    assert gradgradcheck(lambda t: (t * t).tanh(), (x,))
