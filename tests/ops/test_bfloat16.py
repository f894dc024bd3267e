"""bfloat16 outside autocast keeps bfloat16, as in PyTorch; values at bfloat16 rounding.

numpy promotes a bfloat16 array with a Python float (``x * 0.5``, ``where(c, x, 0.0)``) to
float32 or float64, in an op's forward or in its gradient rule; PyTorch computes bfloat16 ops
in float32 and rounds the result once. Every ``nn.functional`` entry point and every op in
``tapegrad.ops.registry.REGISTRY`` that runs on bfloat16 tensors is called on bfloat16 inputs
and its output and gradient dtypes are compared with PyTorch's (or, for an op with no PyTorch
function of that name, checked to stay bfloat16). Also: RNN/LSTM/GRU under
``autocast(bfloat16)`` return the dtypes PyTorch returns.
"""
import inspect
import warnings

import numpy as np
import pytest
import torch

import tapegrad
import tapegrad.nn.functional as TF
import torch.nn.functional as PF
from tapegrad.ops.registry import REGISTRY

pytestmark = pytest.mark.skipif(tapegrad.bfloat16 is None, reason="needs ml_dtypes")

_rng = np.random.default_rng(0)
A = _rng.standard_normal((2, 3, 4, 5)) * 0.8
B = _rng.standard_normal((2, 3, 4, 5)) * 0.8
P = _rng.random((2, 3, 4, 5)) * 0.8 + 0.1
IDX = _rng.integers(0, 3, (2, 4, 5))
SPD = _rng.standard_normal((4, 4))
SPD = SPD @ SPD.T + 4 * np.eye(4)

# random functions: their dtypes are compared, their values are not
RANDOM = {"dropout", "dropout1d", "dropout2d", "dropout3d", "alpha_dropout",
          "feature_alpha_dropout", "rrelu", "gumbel_softmax"}
ULP = 2.0 ** -7  # bfloat16's spacing relative to a value in [1, 2)


def _bf(lib, a):
    return lib.tensor(a, dtype=lib.bfloat16, requires_grad=True)


def _functional_args(lib, k):
    """The k-th argument pattern tried for a functional entry point (first that torch takes)."""
    f = lambda a: _bf(lib, a)  # noqa: E731
    return [lambda: (f(A),), lambda: (f(A), f(B)), lambda: (f(A), f(P)), lambda: (f(P), f(P)),
            lambda: (f(A), lib.tensor(IDX)), lambda: (f(A), f(B), f(P)),
            lambda: (f(A), (4, 5)), lambda: (f(A), f(B[0, 0])), lambda: (f(A), 2),
            lambda: (f(A[0, 0]), f(B[0, 0].T)), lambda: (f(A), 3)][k]()


N_FUNCTIONAL = 11


def _call(fn, args):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = fn(*args)
    out = out[0] if isinstance(out, (tuple, list)) else out
    grads = None
    if out.dtype.is_floating_point and out.requires_grad:
        _weighted_sum(out).backward()
        grads = [a.grad for a in args if isinstance(a, (torch.Tensor, tapegrad.Tensor))
                 and a.requires_grad]
    return out, grads


def _weighted_sum(out):
    """A loss whose gradient is not zero by symmetry (as sum() is after a normalisation)."""
    w = np.random.default_rng(7).standard_normal(tuple(out.shape))
    lib = torch if isinstance(out, torch.Tensor) else tapegrad
    return (out.float() * lib.tensor(w, dtype=lib.float32)).sum()


def _name(dtype):
    return str(dtype).split(".")[-1]


def _close(got, ref, what):
    got = got.detach().float().numpy()
    ref = ref.detach().float().numpy()
    assert got.shape == ref.shape, what
    scale = max(float(np.abs(ref[np.isfinite(ref)]).max(initial=0)), 1e-3)
    # a few bfloat16 roundings apart: each op rounds once; gradients chain several ops
    np.testing.assert_allclose(got, ref, rtol=4 * ULP, atol=4 * ULP * scale, err_msg=what)


FUNCTIONAL = sorted(n for n in dir(PF) if not n.startswith("_") and hasattr(TF, n)
                    and inspect.isfunction(getattr(TF, n)) and callable(getattr(PF, n)))


# group_norm: 3 groups of the 3 channels
PATTERN = {"group_norm": 10}


def _first_pattern(name):
    if name in PATTERN:
        return PATTERN[name]
    for k in range(N_FUNCTIONAL):
        try:
            _call(getattr(PF, name), _functional_args(torch, k))
        except Exception:
            continue
        return k
    return None


def test_every_functional_entry_point_keeps_bfloat16():
    covered, wrong = [], []
    for name in FUNCTIONAL:
        k = _first_pattern(name)
        if k is None:  # PyTorch itself takes none of the patterns (or no bfloat16)
            continue
        ref, ref_grads = _call(getattr(PF, name), _functional_args(torch, k))
        try:
            got, got_grads = _call(getattr(TF, name), _functional_args(tapegrad, k))
        except Exception as e:  # noqa: BLE001 - reported with the op's name
            wrong.append(f"{name}: {type(e).__name__}: {e}")
            continue
        covered.append(name)
        if _name(got.dtype) != _name(ref.dtype):
            wrong.append(f"{name}: output {got.dtype}, torch {ref.dtype}")
            continue
        if (ref_grads is None) != (got_grads is None):
            wrong.append(f"{name}: gradients {got_grads is not None}, torch {ref_grads is not None}")
            continue
        for i, (g, r) in enumerate(zip(got_grads or (), ref_grads or ())):
            if (g is None) != (r is None) or (g is not None and _name(g.dtype) != _name(r.dtype)):
                wrong.append(f"{name}: grad {i} {getattr(g, 'dtype', None)}, torch "
                             f"{getattr(r, 'dtype', None)}")
        if name in RANDOM:
            continue
        _close(got, ref, name)
        for i, (g, r) in enumerate(zip(got_grads or (), ref_grads or ())):
            if g is not None and r is not None:
                _close(g, r, f"{name} grad {i}")
    assert not wrong, "\n".join(wrong)
    for name in ("softplus", "elu", "selu", "celu", "leaky_relu", "hardswish", "hardsigmoid",
                 "hardtanh", "relu6", "mish", "silu", "gelu", "layer_norm", "rms_norm",
                 "group_norm", "instance_norm", "normalize", "huber_loss", "smooth_l1_loss",
                 "kl_div", "binary_cross_entropy", "cross_entropy", "cosine_similarity"):
        assert name in covered, name
    assert len(covered) >= 50


@pytest.mark.parametrize("approximate", ["none", "tanh"])
@pytest.mark.parametrize("name,kwargs", [("softplus", dict(beta=2.0, threshold=1.5)),
                                         ("elu", dict(alpha=0.7)), ("celu", dict(alpha=1.3)),
                                         ("leaky_relu", dict(negative_slope=0.1))])
def test_parameters_given_as_python_floats(name, kwargs, approximate):
    results = []
    for lib, F in ((torch, PF), (tapegrad, TF)):
        x = _bf(lib, A)
        y = getattr(F, name)(x, **kwargs) + F.gelu(x, approximate=approximate)
        y.float().sum().backward()
        results.append((y, x.grad))
    (ref, ref_g), (got, got_g) = results
    assert _name(got.dtype) == _name(got_g.dtype) == "bfloat16"
    _close(got, ref, name)
    _close(got_g, ref_g, name + " grad")


def _torch_counterpart(name):
    for module, n in ((torch, name), (torch.special, name), (torch.nn.functional, name),
                      (torch.linalg, name.replace("linalg_", "")), (torch, name[:-3])):
        fn = getattr(module, n, None)
        if callable(fn):
            return fn
    return None


def _op_args(lib, k):
    f = lambda a: _bf(lib, a)  # noqa: E731
    a2, b2, p2 = A[0, 0, :3], B[0, 0, :3], P[0, 0, :3]
    return [((f(a2),), {}), ((f(a2), f(b2)), {}), ((f(p2),), {}), ((f(p2), f(p2)), {}),
            ((f(a2), 0.5), {}), ((f(a2),), dict(dims=(1,))), ((f(a2),), dict(dim=1)),
            ((f(a2), 1), {}), ((f(a2), f(b2), f(p2)), {}), ((f(SPD),), {})][k]


# registered ops whose arguments differ from PyTorch's function of that name (the op's scale
# defaults to 1; the public F.scaled_dot_product_attention is in the functional sweep)
NOT_THE_PUBLIC_FORM = {"scaled_dot_product_attention"}


def test_every_registered_op_keeps_bfloat16():
    """Each REGISTRY op is called with the first argument pattern it takes; a float output
    and the gradients stay bfloat16 (or match PyTorch's function of the same name)."""
    covered, wrong = [], []
    for name, o in sorted(REGISTRY.items()):
        for k in range(10):
            args, kwargs = _op_args(tapegrad, k)
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    out = o(*args, **kwargs)
            except Exception:
                continue
            out = out[0] if isinstance(out, (tuple, list)) else out
            if not isinstance(out, tapegrad.Tensor):
                break
            fn, ref = _torch_counterpart(name), None
            if name in NOT_THE_PUBLIC_FORM:
                fn = None
            ref_backward = True  # False: PyTorch's backward raises (no bfloat16 kernel ...)
            if fn is not None:
                targs, tkwargs = _op_args(torch, k)
                try:
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")
                        ref = fn(*targs, **tkwargs)
                    ref = ref[0] if isinstance(ref, (tuple, list)) else ref
                    if not isinstance(ref, torch.Tensor) or ref.shape != out.shape:
                        ref = None
                except Exception:
                    ref = None
                    if out.dtype.is_floating_point:
                        break  # PyTorch has no bfloat16 kernel for it (linalg ...)
                if ref is not None and ref.requires_grad:
                    try:
                        _weighted_sum(ref).backward()
                    except Exception:
                        ref_backward = False
            covered.append(name)
            want = _name(ref.dtype) if ref is not None else (
                "bfloat16" if out.dtype.is_floating_point else _name(out.dtype))
            if _name(out.dtype) != want:
                wrong.append(f"{name}{kwargs}: output {out.dtype}, expected {want}")
            if out.requires_grad and ref_backward:
                try:
                    _weighted_sum(out).backward()
                except Exception as e:  # noqa: BLE001
                    # a derivative PyTorch does not implement either, or an argument pattern
                    # that is no real call of an op with no PyTorch namesake: only a dtype
                    # failure counts
                    if fn is not None or any(w in str(e) for w in ("dtype", "inexact", "bfloat")):
                        if "not implemented" not in str(e):
                            wrong.append(f"{name}: backward: {e}")
                    break
                for a in args:
                    if isinstance(a, tapegrad.Tensor) and a.grad is not None and _name(a.grad.dtype) != "bfloat16":
                        wrong.append(f"{name}: gradient {a.grad.dtype}")
            if ref is not None and ref.dtype.is_floating_point:
                _close(out, ref, name)
            break
    assert not wrong, "\n".join(wrong)
    assert len(covered) >= 120, len(covered)


def test_reductions_accumulate_in_float32():
    x = _rng.standard_normal(4000) + 0.3
    for reduce in ("sum", "mean"):
        ref = getattr(torch.tensor(x, dtype=torch.bfloat16), reduce)()
        got = getattr(tapegrad.tensor(x, dtype=tapegrad.bfloat16), reduce)()
        assert _name(got.dtype) == "bfloat16"
        assert got.float().item() == ref.float().item(), reduce


def test_gradient_of_wider_dtype_is_cast_to_a_bfloat16_input():
    class Scale(tapegrad.autograd.Function):  # a rule returning float32 for a bf16 input
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, g):
            return g.float() * 2

    x = _bf(tapegrad, A)
    Scale.apply(x).float().sum().backward()
    assert x.grad.dtype is tapegrad.bfloat16
    np.testing.assert_array_equal(x.grad.float().numpy(), 2.0)


# --- RNN layers under autocast -----------------------------------------------------------------
@pytest.mark.parametrize("name", ["LSTM", "GRU", "RNN"])
@pytest.mark.parametrize("kwargs", [dict(num_layers=2),
                                    dict(bidirectional=True, batch_first=True)])
def test_rnn_layers_under_autocast_match_torch(name, kwargs):
    torch.manual_seed(0)
    theirs = getattr(torch.nn, name)(3, 4, **kwargs)
    ours = getattr(tapegrad.nn, name)(3, 4, **kwargs)
    ours.load_state_dict({k: tapegrad.tensor(v.detach().numpy())
                          for k, v in theirs.state_dict().items()})
    x = _rng.standard_normal((5, 2, 3)).astype(np.float32)
    results = []
    for lib, module in ((torch, theirs), (tapegrad, ours)):
        xt = lib.tensor(x, requires_grad=True)
        with lib.autocast("cpu"):
            out, hidden = module(xt)
        hidden = hidden if isinstance(hidden, tuple) else (hidden,)
        (out.float().sum() + sum(h.float().sum() for h in hidden)).backward()
        results.append((out, hidden, xt.grad,
                        [p.grad for p in module.parameters()]))
    (ro, rh, rg, rp), (go, gh, gg, gp) = results
    # PyTorch: LSTM is mkldnn_rnn_layer (lower precision); RNN's cell is linear + tanh in
    # bfloat16; GRU's last step mixes the float32 hidden state in, so it returns float32
    assert _name(go.dtype) == _name(ro.dtype) == {"GRU": "float32"}.get(name, "bfloat16")
    assert [_name(h.dtype) for h in gh] == [_name(h.dtype) for h in rh]
    assert _name(gg.dtype) == _name(rg.dtype) == "float32"
    assert [_name(p.dtype) for p in gp] == [_name(p.dtype) for p in rp]
    steps = 5
    tol = 4 * ULP * steps  # roundings compound over the time steps
    np.testing.assert_allclose(go.float().detach().numpy(), ro.float().detach().numpy(),
                               atol=tol)
    for g, r in zip([gg, *gp], [rg, *rp]):
        scale = max(float(r.abs().max()), 1.0)
        np.testing.assert_allclose(g.numpy(), r.numpy(), atol=tol * scale)


def test_rnn_layers_outside_autocast_unchanged():
    torch.manual_seed(0)
    theirs, ours = torch.nn.LSTM(3, 4).double(), tapegrad.nn.LSTM(3, 4, dtype=tapegrad.float64)
    ours.load_state_dict({k: tapegrad.tensor(v.detach().numpy())
                          for k, v in theirs.state_dict().items()})
    x = _rng.standard_normal((5, 2, 3))
    with torch.autocast("cpu"), tapegrad.autocast("cpu"):  # float64 is never cast
        ref, got = theirs(torch.tensor(x))[0], ours(tapegrad.tensor(x))[0]
    assert got.dtype is tapegrad.float64
    np.testing.assert_allclose(got.detach().numpy(), ref.detach().numpy(), rtol=1e-12)


@pytest.mark.parametrize("name", ["LSTMCell", "GRUCell", "RNNCell"])
def test_rnn_cells_under_autocast_match_torch(name):
    torch.manual_seed(0)
    theirs, ours = getattr(torch.nn, name)(3, 4), getattr(tapegrad.nn, name)(3, 4)
    ours.load_state_dict({k: tapegrad.tensor(v.detach().numpy())
                          for k, v in theirs.state_dict().items()})
    x = _rng.standard_normal((2, 3)).astype(np.float32)
    results = []
    for lib, module in ((torch, theirs), (tapegrad, ours)):
        xt = lib.tensor(x, requires_grad=True)
        with lib.autocast("cpu"):
            first = module(xt)
            second = module(xt, first)  # a state from the region fed back
        outs = [*(first if isinstance(first, tuple) else (first,)),
                *(second if isinstance(second, tuple) else (second,))]
        sum(o.float().sum() for o in outs).backward()
        results.append((outs, xt.grad, module.weight_hh.grad))
    (ro, rg, rw), (go, gg, gw) = results
    # RNNCell: tanh(linear + linear) in bfloat16; GRU/LSTM cells mix in a float32 state
    assert [_name(o.dtype) for o in go] == [_name(o.dtype) for o in ro]
    assert _name(ro[0].dtype) == ("bfloat16" if name == "RNNCell" else "float32")
    for g, r in zip(go, ro):
        np.testing.assert_allclose(g.float().detach().numpy(), r.float().detach().numpy(),
                                   atol=8 * ULP)
    for g, r in ((gg, rg), (gw, rw)):
        assert _name(g.dtype) == _name(r.dtype) == "float32"
        np.testing.assert_allclose(g.numpy(), r.numpy(), atol=8 * ULP * max(1.0, r.abs().max()))


def test_kl_div_of_a_negative_target_is_nan_as_in_torch():  # found by the sweep above
    a, t = _rng.standard_normal((3, 4)), _rng.standard_normal((3, 4))
    t[0, 0] = 0.0
    results = []
    for lib in (torch, tapegrad):
        x = lib.tensor(a, requires_grad=True)
        loss = lib.nn.functional.kl_div(x, lib.tensor(t), reduction="none")
        loss.sum().backward()
        results.append((loss.detach().numpy(), x.grad.numpy()))
    np.testing.assert_allclose(results[1][0], results[0][0], rtol=1e-15)  # nan where t < 0
    np.testing.assert_allclose(results[1][1], results[0][1], rtol=1e-15)
    assert np.isnan(results[1][0]).sum() == (t < 0).sum() > 0


def test_optimizer_state_loaded_into_bfloat16_parameters_is_cast_as_in_torch():
    # PyTorch casts loaded floating state (not ``step``) to the parameter's dtype: float32
    # moments saved elsewhere come back bfloat16 for a bfloat16 model.
    results = []
    for lib in (tapegrad, torch):
        lib.manual_seed(0)
        m = lib.nn.Linear(3, 2).to(lib.bfloat16)
        opt = lib.optim.Adam(m.parameters())
        m(lib.ones(4, 3, dtype=lib.bfloat16)).sum().backward()
        opt.step()
        sd = opt.state_dict()
        sd["state"] = {k: {n: (t if n == "step" else t.to(lib.float32)) for n, t in v.items()}
                       for k, v in sd["state"].items()}
        again = lib.optim.Adam(m.parameters())
        again.load_state_dict(sd)
        results.append({n: str(t.dtype).split(".")[-1] for n, t in again.state[m.weight].items()})
    assert results[0] == results[1] == {"step": "float32", "exp_avg": "bfloat16",
                                        "exp_avg_sq": "bfloat16"}


def test_anomaly_mode_sees_nan_in_bfloat16():
    x = tapegrad.tensor([1.0, 0.0], dtype=tapegrad.bfloat16, requires_grad=True)
    with pytest.raises(RuntimeError, match="nan"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with tapegrad.autograd.detect_anomaly():
            (x / 0 * 0).sum().backward()
