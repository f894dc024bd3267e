"""tapegrad.testing: verify against PyTorch and first-divergence localisation."""
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
    assert where.module == "attn" and where.kind == "op" and where.op == "softmax"
    assert where.torch_op == "torch.nn.functional.softmax"
    assert where.inputs_agree  # body agreed: the softmax itself is wrong
    assert "'attn'" in str(where) and "self.attn(" in where.line


def test_first_divergence_names_a_1_over_n_convention_difference():
    where = testing.first_divergence(_model(tapegrad, unbiased=True), _model(torch), [_x()])
    assert where.module == "body.2" and where.kind == "op" and where.inputs_agree
    # the op, not only the module: five ops run on that line, the variance is the culprit
    assert where.op == "var" and where.torch_op == "torch.Tensor.var"
    assert where.line.startswith(__file__) and "x.var(dim=1" in where.line


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


def _ported(T, x, w):
    h = T.tanh(x @ w)
    s = (h * h).sum(dim=1, keepdim=True)
    p = T.softmax(h / s, dim=0 if T is tapegrad else 1)  # the port's planted bug
    return T.log(p + 1.0).mean()


def test_first_divergence_names_a_functional_op_and_its_line():
    w = np.random.default_rng(2).standard_normal((5, 3))
    where = testing.first_divergence(_ported, None, [_x(), w])
    assert where.kind == "op" and where.op == "softmax" and where.module == ""
    assert where.torch_op == "torch.softmax" and where.inputs_agree
    assert "T.softmax(h / s" in where.line and "test_verify.py" in where.line
    assert "op 'softmax'" in str(where) and "T.softmax" in str(where)


def test_first_divergence_of_a_function_against_its_torch_twin():
    def ours(x, w):
        h = (x @ w).tanh()
        return (h - h.mean()).pow(2).sum(dim=0) / h.shape[0]  # 1/n where torch.var has 1/(n-1)

    def theirs(x, w):  # the PyTorch original, in its own lines
        h = torch.tanh(x @ w)
        return ((h - h.mean()) ** 2).sum(dim=0) / (h.shape[0] - 1)

    w = np.random.default_rng(3).standard_normal((5, 3))
    where = testing.first_divergence(ours, theirs, [_x(), w])
    # no line is shared: the lines pair in order, their ops call by call; the division is
    # the first op that differs, and its input (the sum) agrees
    assert (where.kind, where.op, where.torch_op) == ("op", "div", "torch.Tensor.div")
    assert where.inputs_agree is True
    assert "/ h.shape[0]" in where.line


def test_first_divergence_checks_ops_of_a_faithful_function():
    w = np.random.default_rng(2).standard_normal((5, 3))

    def faithful(T, x, w):
        return T.softmax(T.tanh(x @ w), dim=1).sum()
    where = testing.first_divergence(faithful, None, [_x(), w])
    assert not where and where.checked >= 4
