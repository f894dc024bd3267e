"""autograd.Function: the same user Function written for tapegrad and torch agrees."""
import numpy as np
import pytest
import torch

import tapegrad
from helpers import assert_close, check_torch


def make_functions(T):
    """The same custom Functions, subclassing T.autograd.Function."""

    class Exp(T.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            y = x.exp()
            ctx.save_for_backward(y)  # saves its own output
            return y

        @staticmethod
        def backward(ctx, g):
            (y,) = ctx.saved_tensors
            return g * y

    class ScaledMul(T.autograd.Function):
        """Non-tensor argument, broadcasting inputs, needs_input_grad."""

        @staticmethod
        def forward(ctx, a, b, scale):
            ctx.save_for_backward(a, b)
            ctx.scale = scale
            return a * b * scale

        @staticmethod
        def backward(ctx, g):
            a, b = ctx.saved_tensors
            ga = gb = None
            if ctx.needs_input_grad[0]:
                ga = (g * b * ctx.scale)
            if ctx.needs_input_grad[1]:
                gb = (g * a * ctx.scale).sum(0)
            return ga, gb, None

    class SinCos(T.autograd.Function):
        """Two outputs."""

        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x.sin(), x.cos()

        @staticmethod
        def backward(ctx, gs, gc):
            (x,) = ctx.saved_tensors
            return gs * x.cos() - gc * x.sin()

    class Argmax(T.autograd.Function):
        """A non-differentiable second output."""

        @staticmethod
        def forward(ctx, x):
            idx = x.argmax(-1)
            ctx.mark_non_differentiable(idx)
            ctx.save_for_backward(x)
            return x * 2, idx

        @staticmethod
        def backward(ctx, g, g_idx):
            return g * 2

    class Cube(T.autograd.Function):
        """setup_context style, differentiable backward (create_graph)."""

        @staticmethod
        def forward(x):
            return x * x * x

        @staticmethod
        def setup_context(ctx, inputs, output):
            ctx.save_for_backward(inputs[0])

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            return 3 * g * x * x

    return Exp, ScaledMul, SinCos, Argmax, Cube


FN = {tapegrad: make_functions(tapegrad), torch: make_functions(torch)}


def fns(T):
    return dict(zip(["Exp", "ScaledMul", "SinCos", "Argmax", "Cube"], FN[T]))


@pytest.mark.parametrize("case", [
    ("exp", lambda T, x, b: fns(T)["Exp"].apply(x) * x, [(2, 3), (3,)]),
    ("scaled_mul", lambda T, x, b: fns(T)["ScaledMul"].apply(x, b, 1.5), [(2, 3), (3,)]),
    ("sincos", lambda T, x, b: (lambda s, c: s * c + s * 2)(*fns(T)["SinCos"].apply(x)),
     [(2, 3), (3,)]),
    ("sincos_one_used", lambda T, x, b: fns(T)["SinCos"].apply(x)[1] * b, [(2, 3), (3,)]),
    ("argmax", lambda T, x, b: fns(T)["Argmax"].apply(x)[0] + b, [(2, 3), (3,)]),
    ("cube", lambda T, x, b: fns(T)["Cube"].apply(x * b), [(2, 3), (3,)]),
], ids=lambda c: c[0])
def test_values_and_gradients_match_torch(case):
    _, fn, shapes = case
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal(s) for s in shapes]
    check_torch(fn, arrays)
    check_torch(fn, arrays, dtype=np.float32, rtol=2e-5)


def test_gradcheck_and_gradgradcheck():
    Exp, ScaledMul, SinCos, _, Cube = FN[tapegrad]
    rng = np.random.default_rng(1)
    x = tapegrad.tensor(rng.standard_normal((2, 3)), requires_grad=True)
    b = tapegrad.tensor(rng.standard_normal(3), requires_grad=True)
    assert tapegrad.autograd.gradcheck(lambda x, b: ScaledMul.apply(x, b, 0.7), (x, b))
    assert tapegrad.autograd.gradcheck(lambda x: SinCos.apply(x), (x,))
    for f in (lambda x: Exp.apply(x), lambda x: Cube.apply(x), lambda x: SinCos.apply(x)):
        assert tapegrad.autograd.gradcheck(f, (x,))
        assert tapegrad.autograd.gradgradcheck(f, (x,))


def test_create_graph_second_derivative_matches_torch():
    out = []
    for T in (tapegrad, torch):
        x = T.tensor([0.5, -1.0, 2.0], dtype=T.float64, requires_grad=True)
        y = FN[T][4].apply(x).sum() + FN[T][0].apply(x).sum()
        (g,) = T.autograd.grad(y, x, create_graph=True)
        (h,) = T.autograd.grad(g.sum(), x)
        out.append((g, h))
    assert_close(out[0][0], out[1][0])
    assert_close(out[0][1], out[1][1])


def test_grad_fn_and_flags():
    Exp, ScaledMul, SinCos, Argmax, _ = FN[tapegrad]
    x = tapegrad.tensor([1.0, 2.0], requires_grad=True)
    y = Exp.apply(x)
    assert y.grad_fn.name() == "ExpBackward" and y.requires_grad and not y.is_leaf
    s, c = SinCos.apply(x)
    assert s.grad_fn.name() == c.grad_fn.name() == "SinCosBackward"
    v, idx = Argmax.apply(x.reshape(1, 2))
    assert v.requires_grad and not idx.requires_grad and idx.dtype == tapegrad.int64
    with tapegrad.no_grad():
        assert not Exp.apply(x).requires_grad
    assert not Exp.apply(tapegrad.ones(2)).requires_grad
    seen = []

    class Probe(tapegrad.autograd.Function):
        @staticmethod
        def forward(ctx, a, b, k):
            seen.append((ctx.needs_input_grad, tapegrad.is_grad_enabled()))
            return a + b

        @staticmethod
        def backward(ctx, g):
            return g, g, None

    Probe.apply(x, tapegrad.ones(2), 3)
    assert seen == [((True, False, False), False)]  # forward runs without recording


def test_saved_tensor_modified_in_place_raises():
    Exp, ScaledMul, *_ = FN[tapegrad]
    for T, (E, M) in ((tapegrad, (Exp, ScaledMul)), (torch, FN[torch][:2])):
        x = T.tensor([1.0, 2.0], requires_grad=True)
        y = E.apply(x)
        y.add_(1)  # Exp saved its output
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            y.sum().backward()
        a = x * 1
        z = M.apply(a, T.ones(2), 2.0)
        a.mul_(3)  # ScaledMul saved its input
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            z.sum().backward()


def test_second_backward_raises_unless_retained():
    Exp = FN[tapegrad][0]
    x = tapegrad.tensor([1.0, 2.0], dtype=tapegrad.float64, requires_grad=True)
    y = Exp.apply(x).sum()
    y.backward(retain_graph=True)
    y.backward()
    assert_close(x.grad, 2 * np.exp([1.0, 2.0]))
    with pytest.raises(RuntimeError, match="second time"):
        y.backward()


def test_backward_result_validation():
    class WrongCount(tapegrad.autograd.Function):
        @staticmethod
        def forward(ctx, x, y):
            return x + y

        @staticmethod
        def backward(ctx, g):
            return g

    class WrongShape(tapegrad.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, g):
            return tapegrad.ones(5)

    class Broadcast(tapegrad.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, g):
            return tapegrad.ones(4, 3, dtype=tapegrad.float64)  # summed down, cast

    x = tapegrad.tensor([1.0, 2.0, 3.0], requires_grad=True)
    with pytest.raises(RuntimeError, match="incorrect number of gradients"):
        WrongCount.apply(x, x).sum().backward()
    with pytest.raises(RuntimeError, match="invalid gradient at index 0"):
        WrongShape.apply(x).sum().backward()
    Broadcast.apply(x).sum().backward()
    assert x.grad.tolist() == [4.0, 4.0, 4.0] and x.grad.dtype == tapegrad.float32
    with pytest.raises(RuntimeError, match="MyFunction.apply"):
        WrongCount()


def test_materialize_grads():
    seen = []

    class Pair(tapegrad.autograd.Function):
        @staticmethod
        def forward(ctx, x, materialize):
            ctx.set_materialize_grads(materialize)
            return x * 1, x * 2

        @staticmethod
        def backward(ctx, ga, gb):
            seen.append(gb is None)
            return ga if gb is None else ga + 2 * gb, None

    x = tapegrad.tensor([1.0], requires_grad=True)
    Pair.apply(x, True)[0].sum().backward()
    Pair.apply(x, False)[0].sum().backward()
    assert seen == [False, True] and x.grad.tolist() == [2.0]


def test_function_in_a_training_loop_matches_torch():
    rng = np.random.default_rng(3)
    w0, xs = rng.standard_normal((3, 2)), rng.standard_normal((4, 3))
    results = []
    for T in (tapegrad, torch):
        Exp, ScaledMul, *_ = FN[T]
        w = T.tensor(w0, requires_grad=True)
        x = T.tensor(xs)
        for _ in range(3):
            loss = Exp.apply(ScaledMul.apply(x @ w, T.ones(2, dtype=T.float64), 0.1)).sum()
            loss.backward()
            with T.no_grad():
                w.sub_(w.grad, alpha=0.1)
                w.grad.zero_()
        results.append(w.detach())
    assert_close(results[0], results[1])


def test_non_tensor_outputs_get_none_gradients():
    for T in (tapegrad, torch):
        seen = []

        class WithCount(T.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                return x * 2, 3

            @staticmethod
            def backward(ctx, g, g_count):
                seen.append(g_count)
                return g * 2

        x = T.ones(2, requires_grad=True)
        y, k = WithCount.apply(x)
        y.sum().backward()
        assert k == 3 and seen == [None] and x.grad.tolist() == [2.0, 2.0]


def test_once_differentiable():
    for T, decorator in ((tapegrad, tapegrad.autograd.function.once_differentiable),
                         (torch, torch.autograd.function.once_differentiable)):
        grad_modes = []

        class Square(T.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                ctx.save_for_backward(x)
                return x * x

            @staticmethod
            @decorator
            def backward(ctx, g):
                grad_modes.append(T.is_grad_enabled())
                (x,) = ctx.saved_tensors
                return 2 * g * x

        x = T.tensor([1.5, -2.0], dtype=T.float64, requires_grad=True)
        Square.apply(x).sum().backward()
        assert x.grad.tolist() == [3.0, -4.0]
        # the upstream gradient (x) requires grad, so the result must carry a graph
        (g,) = T.autograd.grad((Square.apply(x) * x).sum(), x, create_graph=True)
        assert g.tolist() == [3 * 1.5 ** 2, 3 * 2.0 ** 2] and grad_modes == [False, False]
        assert g.requires_grad
        with pytest.raises(RuntimeError, match="once_differentiable"):
            g.sum().backward()
