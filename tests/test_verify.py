"""tapegrad.testing: verify against PyTorch and first-divergence localisation (issue 12)."""
import numpy as np
import pytest

import tapegrad
from tapegrad import testing

torch = pytest.importorskip("torch")


def _model(T, softmax_dim=1, unbiased=False):
    nn = T.nn

    class Standardize(nn.Module):  # as LayerNorm without affine: 1/n variance
        def forward(self, x):
            m = x.mean(dim=1, keepdim=True)
            return (x - m) / (x.var(dim=1, keepdim=True, unbiased=unbiased) + 1e-5).sqrt()

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = nn.Sequential(nn.Linear(5, 6), nn.Tanh(), Standardize(), nn.Linear(6, 4))
            self.attn = nn.Softmax(dim=softmax_dim)
            self.head = nn.Linear(4, 3)

        def forward(self, x):
            return self.head(self.attn(self.body(x)))

    return Net().double()


def _x():
    return np.random.default_rng(1).standard_normal((7, 5))


def test_verify_agrees_on_a_faithful_port():
    report = testing.verify(_model(tapegrad), [_x()], torch_model=_model(torch), steps=4)
    assert report.ok, str(report)
    names = [r.name for r in report.rows]
    assert "output" in names and "grad body.0.weight" in names and "grad input 0" in names
    assert "trajectory: loss over 4 steps" in names
    assert report["grad head.weight"].abs_error < 1e-12


def test_verify_reports_a_wrong_port():
    report = testing.verify(_model(tapegrad, softmax_dim=0), [_x()], torch_model=_model(torch),
                            steps=2)
    assert not report.ok
    assert not report["output"].ok and "DISAGREE" in str(report)


def test_verify_a_function_written_against_the_namespace():
    def f(T, x, w):
        return (x @ w).tanh().logsumexp(dim=1)
    w = np.random.default_rng(2).standard_normal((5, 3))
    report = testing.verify(f, [_x(), w], steps=3)
    assert report.ok, str(report)
    assert report["grad input 1"].abs_error < 1e-12


def test_first_divergence_names_the_softmax_on_the_wrong_dim():
    where = testing.first_divergence(_model(tapegrad, softmax_dim=0), _model(torch), [_x()])
    assert where.module == "attn" and where.kind == "output"
    assert where.inputs_agree  # body agreed: the softmax itself is wrong
    assert "'attn'" in str(where)


def test_first_divergence_names_a_1_over_n_convention_difference():
    where = testing.first_divergence(_model(tapegrad, unbiased=True), _model(torch), [_x()])
    assert where.module == "body.2" and where.kind == "output" and where.inputs_agree


def test_first_divergence_finds_a_wrong_gradient():
    class BadGrad(tapegrad.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, g):
            return g * 3  # the port's rule is wrong; its forward is right

    class Double(tapegrad.nn.Module):
        def forward(self, x):
            return BadGrad.apply(x)

    class TDouble(torch.nn.Module):
        def forward(self, x):
            return x * 2

    ours = tapegrad.nn.Sequential(tapegrad.nn.Linear(5, 4), Double(), tapegrad.nn.Linear(4, 2))
    theirs = torch.nn.Sequential(torch.nn.Linear(5, 4), TDouble(), torch.nn.Linear(4, 2))
    where = testing.first_divergence(ours.double(), theirs.double(), [_x()])
    assert (where.module, where.kind, where.inputs_agree) == ("1", "gradient", True)


def test_no_divergence():
    where = testing.first_divergence(_model(tapegrad), _model(torch), [_x()])
    assert not where and where.checked > 10
