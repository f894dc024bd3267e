"""nn.init: fans, gains and bounds exactly as PyTorch; distributions checked statistically
(Kolmogorov-Smirnov against the intended law, on seeded draws, so the tests are repeatable);
and the default initialisation of every layer."""
import math
import warnings

import numpy as np
import pytest
import torch
from scipy import stats

import tapegrad
import tapegrad.nn as tnn
from tapegrad.nn import init

P_MIN = 1e-3  # seeded draws: a KS p-value below this means the wrong distribution


@pytest.fixture(autouse=True)
def _seed():
    tapegrad.manual_seed(1234)


def values(t):
    return t.detach().numpy().ravel().astype(np.float64)


def assert_uniform(t, low, high):
    """U(low, high): the law (KS) and the bounds themselves (the extremes of n draws come
    within 20/n of the range of each end, except with probability e^-20)."""
    v = values(t)
    tol = 20 / v.size * (high - low)
    assert low <= v.min() < low + tol and high - tol < v.max() <= high
    assert stats.kstest(v, "uniform", args=(low, high - low)).pvalue > P_MIN


def assert_normal(t, mean, std):
    """N(mean, std^2): the law (KS), and mean and std within 6 standard errors."""
    v = values(t)
    assert abs(v.mean() - mean) < 6 * std / math.sqrt(v.size)
    assert abs(v.std() / std - 1) < 6 / math.sqrt(2 * v.size)
    assert stats.kstest(v, "norm", args=(mean, std)).pvalue > P_MIN


@pytest.mark.parametrize("name,param", [
    ("linear", None), ("conv1d", None), ("conv2d", None), ("conv_transpose2d", None),
    ("sigmoid", None), ("tanh", None), ("relu", None), ("leaky_relu", None),
    ("leaky_relu", 0.2), ("leaky_relu", 1), ("leaky_relu", math.sqrt(5)), ("selu", None)])
def test_calculate_gain(name, param):
    assert init.calculate_gain(name, param) == torch.nn.init.calculate_gain(name, param)


def test_calculate_gain_errors():
    with pytest.raises(ValueError, match="Unsupported nonlinearity"):
        init.calculate_gain("swish")
    with pytest.raises(ValueError, match="not a valid number"):
        init.calculate_gain("leaky_relu", True)


@pytest.mark.parametrize("shape", [(3, 4), (5, 3, 2), (4, 2, 3, 3), (2, 3, 1, 2, 2), (0, 3)])
def test_fan_in_and_fan_out(shape):
    expected = torch.nn.init._calculate_fan_in_and_fan_out(torch.empty(shape))
    assert init._calculate_fan_in_and_fan_out(tapegrad.empty(shape)) == expected


def test_fan_errors():
    with pytest.raises(ValueError, match="fewer than 2 dimensions"):
        init._calculate_fan_in_and_fan_out(tapegrad.empty(3))
    with pytest.raises(ValueError, match="Mode fan_avg not supported"):
        init.kaiming_uniform_(tapegrad.empty(3, 4), mode="fan_avg")


def test_uniform_and_normal():
    t = tapegrad.empty(200, 300)
    assert init.uniform_(t, -0.5, 2.0) is t
    assert_uniform(t, -0.5, 2.0)
    init.uniform_(t)
    assert_uniform(t, 0.0, 1.0)
    init.normal_(t, 1.5, 0.3)
    assert_normal(t, 1.5, 0.3)
    init.normal_(t)
    assert_normal(t, 0.0, 1.0)


@pytest.mark.parametrize("shape", [(200, 300), (64, 32, 3, 3)])
@pytest.mark.parametrize("gain", [1.0, 2.5])
def test_xavier(shape, gain):
    fan_in, fan_out = init._calculate_fan_in_and_fan_out(tapegrad.empty(shape))
    std = gain * math.sqrt(2.0 / (fan_in + fan_out))
    t = tapegrad.empty(shape)
    assert_uniform(init.xavier_uniform_(t, gain=gain), -math.sqrt(3) * std, math.sqrt(3) * std)
    assert_normal(init.xavier_normal_(t, gain=gain), 0.0, std)


@pytest.mark.parametrize("mode", ["fan_in", "fan_out", "FAN_IN"])
@pytest.mark.parametrize("nonlinearity,a", [("leaky_relu", 0), ("leaky_relu", math.sqrt(5)),
                                            ("relu", 0), ("tanh", 0), ("linear", 0)])
def test_kaiming(mode, nonlinearity, a):
    shape = (96, 48, 3, 3)
    fan = init._calculate_correct_fan(tapegrad.empty(shape), mode)
    assert fan == torch.nn.init._calculate_correct_fan(torch.empty(shape), mode)
    std = init.calculate_gain(nonlinearity, a) / math.sqrt(fan)
    t = tapegrad.empty(shape)
    init.kaiming_uniform_(t, a=a, mode=mode, nonlinearity=nonlinearity)
    assert_uniform(t, -math.sqrt(3) * std, math.sqrt(3) * std)
    init.kaiming_normal_(t, a=a, mode=mode, nonlinearity=nonlinearity)
    assert_normal(t, 0.0, std)


def test_kaiming_zero_element_tensor_warns():
    with pytest.warns(UserWarning, match="zero-element"):
        init.kaiming_uniform_(tapegrad.empty(0, 3))
    with pytest.warns(UserWarning, match="zero-element"):
        init.kaiming_normal_(tapegrad.empty(3, 0))


@pytest.mark.parametrize("mean,std,a,b", [(0.0, 1.0, -2.0, 2.0), (0.5, 2.0, -1.0, 3.0),
                                          (0.0, 1.0, 2.0, 3.0), (1.0, 0.1, 0.8, 0.85)])
def test_trunc_normal(mean, std, a, b):
    t = init.trunc_normal_(tapegrad.empty(300, 200), mean, std, a, b)
    v = values(t)
    assert v.min() >= a and v.max() <= b
    law = stats.truncnorm((a - mean) / std, (b - mean) / std, loc=mean, scale=std)
    assert stats.kstest(v, law.cdf).pvalue > P_MIN


def test_trunc_normal_warns_when_mean_is_far():
    with pytest.warns(UserWarning, match="more than 2 std"):
        init.trunc_normal_(tapegrad.empty(10), mean=10.0, std=1.0, a=-2.0, b=2.0)


@pytest.mark.parametrize("shape", [(3, 5), (5, 3), (4, 4), (2, 3, 2)])
@pytest.mark.parametrize("gain", [1.0, 0.5])
def test_orthogonal(shape, gain):
    t = init.orthogonal_(tapegrad.empty(shape, dtype=tapegrad.float64), gain=gain)
    flat = t._data.reshape(shape[0], -1)
    rows, cols = flat.shape
    gram = flat @ flat.T if rows <= cols else flat.T @ flat
    np.testing.assert_allclose(gram, gain**2 * np.eye(min(rows, cols)), atol=1e-12)
    with pytest.raises(ValueError, match="2 or more dimensions"):
        init.orthogonal_(tapegrad.empty(3))


def test_orthogonal_is_haar_distributed():
    # the first entry of a Haar-random orthogonal n x n matrix has density prop. (1-x^2)^((n-3)/2)
    n = 4
    firsts = [init.orthogonal_(tapegrad.empty(n, n, dtype=tapegrad.float64))._data[0, 0]
              for _ in range(2000)]
    law = stats.beta((n - 1) / 2, (n - 1) / 2, loc=-1, scale=2)
    assert stats.kstest(firsts, law.cdf).pvalue > P_MIN


def test_deterministic_initialisers_match_torch():
    for fn, args in [(init.constant_, (0.3,)), (init.ones_, ()), (init.zeros_, ()),
                     (init.eye_, ())]:
        t = fn(tapegrad.empty(3, 4), *args)
        ref = getattr(torch.nn.init, fn.__name__)(torch.empty(3, 4), *args)
        np.testing.assert_array_equal(t._data, ref.numpy())
    for shape, groups in [((4, 2, 3), 1), ((4, 2, 3, 3), 2), ((6, 3, 3, 1, 3), 3)]:
        t = init.dirac_(tapegrad.empty(shape), groups)
        np.testing.assert_array_equal(t._data, torch.nn.init.dirac_(torch.empty(shape),
                                                                    groups).numpy())
    with pytest.raises(ValueError, match="2 dimensions"):
        init.eye_(tapegrad.empty(3))
    with pytest.raises(ValueError, match="divisible by groups"):
        init.dirac_(tapegrad.empty(3, 2, 3), groups=2)


def test_in_place_on_parameters_without_recording():
    p = tnn.Parameter(tapegrad.zeros(5, 4))
    version = p._version[0]
    for fn in (init.uniform_, init.normal_, init.xavier_uniform_, init.kaiming_normal_,
               init.trunc_normal_, init.orthogonal_, init.ones_):
        out = fn(p)
        assert out is p and p.grad_fn is None and p.requires_grad and p.is_leaf
        assert p.dtype == tapegrad.float32
    assert p._version[0] > version
    half = init.normal_(tapegrad.empty(3, dtype=tapegrad.float16))
    assert half.dtype == tapegrad.float16


def test_seeding_and_generators_reproduce_draws():
    tapegrad.manual_seed(7)
    a = init.kaiming_uniform_(tapegrad.empty(3, 4), a=math.sqrt(5))._data.copy()
    tapegrad.manual_seed(7)
    b = init.kaiming_uniform_(tapegrad.empty(3, 4), a=math.sqrt(5))._data.copy()
    np.testing.assert_array_equal(a, b)
    g1, g2 = tapegrad.Generator().manual_seed(3), tapegrad.Generator().manual_seed(3)
    c = init.trunc_normal_(tapegrad.empty(50), generator=g1)._data
    d = init.trunc_normal_(tapegrad.empty(50), generator=g2)._data
    np.testing.assert_array_equal(c, d)
    tapegrad.manual_seed(7)
    np.testing.assert_array_equal(tnn.Linear(4, 3).weight._data, a)  # layers draw the same way


# --- default layer initialisation (PyTorch's distributions) -----------------------------
def test_linear_and_conv_defaults():
    lin = tnn.Linear(400, 300)
    bound = 1 / math.sqrt(400)  # kaiming_uniform_(a=sqrt(5)) gives exactly 1/sqrt(fan_in)
    assert_uniform(lin.weight, -bound, bound)
    assert np.abs(values(lin.bias)).max() <= bound
    conv = tnn.Conv2d(16, 64, 3)
    bound = 1 / math.sqrt(16 * 9)
    assert_uniform(conv.weight, -bound, bound)
    assert np.abs(values(conv.bias)).max() <= bound
    convt = tnn.ConvTranspose2d(64, 32, 3, groups=2)  # fan_in from weight.size(1) = 16
    bound = 1 / math.sqrt(16 * 9)
    assert_uniform(convt.weight, -bound, bound)
    conv1 = tnn.Conv1d(8, 400, 5)
    assert_uniform(conv1.weight, -1 / math.sqrt(40), 1 / math.sqrt(40))
    bil = tnn.Bilinear(30, 20, 50)
    assert_uniform(bil.weight, -1 / math.sqrt(30), 1 / math.sqrt(30))
    assert np.abs(values(bil.bias)).max() <= 1 / math.sqrt(30)


def test_embedding_norm_and_attention_defaults():
    emb = tnn.Embedding(300, 100, padding_idx=3)
    assert_normal(tapegrad.tensor(np.delete(emb.weight._data, 3, axis=0)), 0.0, 1.0)
    assert not np.any(emb.weight._data[3])
    for m in (tnn.LayerNorm(5), tnn.GroupNorm(1, 5), tnn.BatchNorm2d(5)):
        assert np.all(m.weight._data == 1) and np.all(m.bias._data == 0)
    bn = tnn.BatchNorm1d(5)
    assert np.all(bn.running_mean._data == 0) and np.all(bn.running_var._data == 1)
    assert bn.num_batches_tracked.item() == 0 and bn.num_batches_tracked.dtype == tapegrad.int64
    assert np.all(tnn.RMSNorm(5).weight._data == 1)
    mha = tnn.MultiheadAttention(64, 4)
    bound = math.sqrt(6 / (64 + 3 * 64))
    assert_uniform(mha.in_proj_weight, -bound, bound)
    assert not np.any(mha.in_proj_bias._data) and not np.any(mha.out_proj.bias._data)
    assert_uniform(mha.out_proj.weight, -1 / 8, 1 / 8)
    sep = tnn.MultiheadAttention(64, 4, kdim=32, vdim=16, add_bias_kv=True)
    assert_uniform(sep.k_proj_weight, -math.sqrt(6 / 96), math.sqrt(6 / 96))
    assert sep.in_proj_weight is None and sep.bias_k.shape == (1, 1, 64)


def test_layer_dtype_and_device_arguments():
    lin = tnn.Linear(3, 2, dtype=tapegrad.float64)
    assert lin.weight.dtype == tapegrad.float64 and lin.bias.dtype == tapegrad.float64
    bn = tnn.BatchNorm1d(3, dtype=tapegrad.float64, device="cpu")
    assert bn.running_mean.dtype == tapegrad.float64
    assert bn.num_batches_tracked.dtype == tapegrad.int64
    with pytest.raises(RuntimeError, match="cpu"):
        tnn.Linear(3, 2, device="cuda")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tnn.LSTM(3, 4, dtype=tapegrad.float64)
