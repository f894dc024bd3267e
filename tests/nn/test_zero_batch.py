"""Zero-size batches: every public nn.functional entry point and every nn layer with batch 0,
against PyTorch in float64.

Each case runs the same call in both libraries and compares: output shapes, dtypes and values
(a loss's mean over nothing is nan in both, and tapegrad computes it without a numpy
RuntimeWarning), ``requires_grad`` of each output, in-place updates (running statistics),
and after a backward every gradient: empty ones for the batch-0 inputs, zeros of the right
shape for weights, None exactly where PyTorch gives None. Where PyTorch raises, tapegrad
must raise the same exception type with a message naming the function and the input's shape.

The case lists are checked against the public names of ``tapegrad.nn.functional`` and the
Module subclasses of ``tapegrad.nn``: a new function or layer needs a case here or an entry,
with its reason, in an exclusion list.
"""
import inspect
import warnings

import numpy as np
import pytest
import torch
import torch._refs.nn.functional as _torch_refs

import tapegrad
import tapegrad.nn as tnn
import tapegrad.nn.functional as TF
from helpers import assert_close, make_inputs

RTOL = 1e-12


# --- inputs ------------------------------------------------------------------------------
class Const:
    """A float input that does not require grad (targets, masks, running statistics)."""

    def __init__(self, array):
        self.array = array


def X(*shape, seed=0):
    """Random float64 normals of ``shape`` (requires grad)."""
    return make_inputs([shape], seed=seed)[0]


def U(*shape, seed=0):
    """Random float64 in (0.05, 0.95): probabilities, variances (requires grad)."""
    return make_inputs([shape], seed=seed, low=0.05, high=0.95)[0]


def C(array):
    return Const(array)


def I(*shape, high=5, seed=0):  # noqa: E743 (integer indices)
    return np.random.default_rng(seed).integers(0, high, shape).astype(np.int64)


def B(*shape, seed=0):
    return np.random.default_rng(seed).random(shape) < 0.7


def _wrap(lib, specs):
    out = []
    for s in specs:
        make = torch.tensor if lib is torch else tapegrad.tensor
        if isinstance(s, Const):
            out.append(make(s.array.copy()))
        elif isinstance(s, np.ndarray):
            out.append(make(s.copy(), requires_grad=s.dtype.kind == "f"))
        else:
            out.append(s)
    return out


def _flat(out):
    if isinstance(out, (tuple, list)):
        return [t for o in out for t in _flat(o)]
    return [] if out is None else [out]


def _shapes(specs):
    return [tuple(s.array.shape if isinstance(s, Const) else s.shape) for s in specs
            if isinstance(s, (Const, np.ndarray))]


def _base_exception(e):
    return next(c for c in type(e).__mro__ if c.__module__ == "builtins")


# --- the comparison ----------------------------------------------------------------------
def _compare(run, th_inputs, tg_inputs, th_params=(), tg_params=(), states=list, raise_names=(),
             shapes=()):
    """``run(lib, inputs)`` in both libraries; compare outputs, states and gradients.

    ``states()``: (name, tapegrad tensor, torch tensor) triples to compare after the forward;
    ``*_params``: named parameters, whose gradients are compared by name."""
    try:
        th_out = _flat(run(torch, th_inputs))
    except Exception as e:  # PyTorch raises: tapegrad must raise the same type, clearly
        expected = _base_exception(e)
        with pytest.raises(Exception) as info:
            run(tapegrad, tg_inputs)
        assert isinstance(info.value, expected), (
            f"torch raised {type(e).__name__}: {e}; tapegrad raised "
            f"{type(info.value).__name__}: {info.value}")
        msg = str(info.value)
        assert any(n in msg for n in raise_names), f"message names no function: {msg}"
        assert any(str(list(s)) in msg or str(tuple(s)) in msg for s in shapes), \
            f"message names none of the input shapes {shapes}: {msg}"
        return
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # nan from an empty mean: quietly
        tg_out = _flat(run(tapegrad, tg_inputs))
    assert len(tg_out) == len(th_out), f"{len(tg_out)} outputs, torch has {len(th_out)}"
    for i, (a, b) in enumerate(zip(tg_out, th_out)):
        assert isinstance(a, tapegrad.Tensor), f"output {i} is a {type(a).__name__}"
        assert str(a.dtype).split(".")[-1] == str(b.dtype).split(".")[-1], \
            f"output {i}: dtype {a.dtype} != {b.dtype}"
        assert_close(a, b, rtol=RTOL, what=f"output {i}")
        assert a.requires_grad == b.requires_grad, f"output {i}: requires_grad"
    for name, a, b in states():  # in-place updates (running statistics)
        assert_close(a, b, rtol=RTOL, what=f"{name} after forward")
    pairs = [(a, b) for a, b in zip(tg_out, th_out) if b.requires_grad]
    if not pairs:
        return
    rng = np.random.default_rng(1)
    seeds = [rng.standard_normal(tuple(b.shape)) for _, b in pairs]
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        tapegrad.autograd.backward([a for a, _ in pairs], [tapegrad.tensor(s) for s in seeds])
    torch.autograd.backward([b for _, b in pairs], [torch.tensor(s) for s in seeds])
    named = [(f"input {i}", a, b) for i, (a, b) in enumerate(zip(tg_inputs, th_inputs))
             if isinstance(b, torch.Tensor) and b.requires_grad]
    tg_named = dict(tg_params)
    assert sorted(tg_named) == sorted(n for n, _ in th_params), "parameter names differ"
    named += [(n, tg_named[n], p) for n, p in th_params]
    for name, a, b in named:
        if b.grad is None:
            assert a.grad is None, f"{name}: torch gives no gradient, tapegrad {a.grad.shape}"
            continue
        assert a.grad is not None, f"{name}: no gradient (torch: {tuple(b.grad.shape)})"
        assert a.grad.dtype == a.dtype, f"{name}: gradient dtype {a.grad.dtype}"
        assert_close(a.grad, b.grad, rtol=RTOL, what=f"gradient of {name}")


# --- nn.functional -----------------------------------------------------------------------
class FCase:
    def __init__(self, name, specs, call=None, torch_call=None, id=None, xfail=None, **kwargs):
        self.name, self.specs, self.kwargs = name, specs, kwargs
        self.call, self.torch_call, self.xfail = call, torch_call, xfail
        self.id = id or name + "".join(f"-{k}={v}" for k, v in kwargs.items())

    def run(self, lib, xs):
        if lib is torch and self.torch_call is not None:
            return self.torch_call(torch.nn.functional, *xs)
        if self.call is not None:
            return self.call(lib.nn.functional, *xs)
        return getattr(lib.nn.functional, self.name)(*xs, **self.kwargs)


def _fcases():
    cases = []

    def f(name, *specs, **kw):
        cases.append(FCase(name, list(specs), **kw))

    # linear and activations
    f("linear", X(0, 3), X(4, 3), X(4))
    f("linear", X(0, 2, 3), X(4, 3), id="linear-3d-nobias")
    f("linear_relu", X(0, 3), X(4, 3), X(4),
      torch_call=lambda F, x, w, b: F.relu(F.linear(x, w, b)))
    for name in ("relu", "leaky_relu", "silu", "tanh", "sigmoid", "softplus", "elu",
                 "logsigmoid", "hardtanh", "relu6", "hardsigmoid", "hardswish", "selu", "celu",
                 "mish", "softsign", "glu"):
        f(name, X(0, 4))
    f("gelu", X(0, 4))
    f("gelu", X(0, 4), approximate="tanh")
    for name in ("softmax", "log_softmax", "softmin"):
        f(name, X(0, 4), dim=1)
        f(name, X(0, 4), dim=0)
    f("dropout", X(0, 4), p=0.5, training=True)
    f("dropout1d", X(0, 3, 5), p=0.5)
    f("dropout2d", X(0, 3, 4, 4), p=0.5)
    f("dropout3d", X(0, 2, 3, 3, 3), p=0.5)
    # losses: every reduction; a mean over nothing is nan
    for red in ("mean", "sum", "none"):
        f("cross_entropy", X(0, 5), I(0), reduction=red)
        f("cross_entropy", X(0, 5, 2), I(0, 2), reduction=red)
        f("cross_entropy", X(0, 5), C(U(0, 5)), reduction=red, id=f"cross_entropy-probs-{red}")
        f("nll_loss", X(0, 5), I(0), reduction=red)
        for name in ("mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss", "soft_margin_loss",
                     "multilabel_soft_margin_loss", "poisson_nll_loss"):
            f(name, X(0, 3), C(X(0, 3, seed=1)), reduction=red)
        f("binary_cross_entropy", U(0, 3), C(U(0, 3, seed=1)), reduction=red)
        f("binary_cross_entropy_with_logits", X(0, 3), C(U(0, 3, seed=1)), reduction=red)
        f("kl_div", X(0, 3), C(U(0, 3, seed=1)), reduction=red)
        f("margin_ranking_loss", X(0), X(0, seed=1), C(np.sign(X(0, seed=2))), reduction=red)
        f("hinge_embedding_loss", X(0, 3), C(np.sign(X(0, 3, seed=1))), reduction=red)
        f("cosine_embedding_loss", X(0, 3), X(0, 3, seed=1), C(np.sign(X(0, seed=2))),
          reduction=red)
        f("triplet_margin_loss", X(0, 3), X(0, 3, seed=1), X(0, 3, seed=2), reduction=red)
        f("gaussian_nll_loss", X(0, 3), C(X(0, 3, seed=1)), U(0, 3, seed=2), reduction=red)
    f("kl_div", X(0, 3), C(U(0, 3, seed=1)), reduction="batchmean")
    f("kl_div", X(0, 3), X(0, 3, seed=1), reduction="batchmean", log_target=True)
    f("cross_entropy", X(0, 5), I(0), C(U(5)), label_smoothing=0.1, id="cross_entropy-weight-ls")
    f("cross_entropy", X(0, 5), I(0), ignore_index=2)
    f("nll_loss", X(0, 5), I(0), C(U(5)), id="nll_loss-weight")
    f("binary_cross_entropy", U(0, 3), C(U(0, 3, seed=1)), C(U(0, 3, seed=2)), id="bce-weight")
    f("binary_cross_entropy_with_logits", X(0, 3), C(U(0, 3, seed=1)), C(U(3, seed=2)),
      C(U(3, seed=3)), id="bce_logits-weight-pos_weight",
      call=lambda F, x, t, w, pw: F.binary_cross_entropy_with_logits(x, t, w, pos_weight=pw))
    f("poisson_nll_loss", U(0, 3), C(U(0, 3, seed=1) * 4), log_input=False, full=True)
    f("gaussian_nll_loss", X(0, 3), C(X(0, 3, seed=1)), U(0, 1, seed=2), full=True)
    f("triplet_margin_loss", X(0, 3), X(0, 3, seed=1), X(0, 3, seed=2), p=1, swap=True)
    # embedding and normalisation
    f("embedding", I(0, high=10), X(10, 3))
    f("embedding", I(0, 4, high=10), X(10, 3), padding_idx=0, scale_grad_by_freq=True)
    f("embedding", I(0, 4, high=10), C(X(10, 3)), max_norm=1.0, id="embedding-max_norm")
    f("layer_norm", X(0, 4), (4,), X(4), X(4, seed=1))
    f("layer_norm", X(0, 2, 3), (2, 3))
    f("rms_norm", X(0, 4), (4,), X(4))
    f("group_norm", X(0, 4, 3), 2, X(4), X(4, seed=1))
    f("group_norm", X(0, 4), 4, id="group_norm-2d")
    for shape in ((0, 3), (0, 3, 5)):
        f("batch_norm", X(*shape), C(X(3)), C(U(3)), X(3), X(3, seed=1), training=True,
          id=f"batch_norm-train-{len(shape)}d")
        f("batch_norm", X(*shape), C(X(3)), C(U(3)), X(3), X(3, seed=1), training=False,
          id=f"batch_norm-eval-{len(shape)}d")
    f("batch_norm", X(0, 3), None, None, training=True, id="batch_norm-train-no-stats")
    # not a batch of 0, but the neighbour PyTorch refuses: one value per channel in training
    f("batch_norm", X(1, 3), C(X(3)), C(U(3)), training=True, id="batch_norm-train-batch-1")
    f("instance_norm", X(0, 3, 1), id="instance_norm-one-spatial-element")
    f("instance_norm", X(0, 3, 5), C(X(3)), C(U(3)), X(3), X(3, seed=1))
    f("instance_norm", X(0, 3, 5), id="instance_norm-no-stats")
    f("normalize", X(0, 3))
    f("normalize", X(0, 3), p=1, dim=0)
    f("cosine_similarity", X(0, 3), X(0, 3, seed=1))
    f("pairwise_distance", X(0, 3), X(0, 3, seed=1))
    f("pairwise_distance", X(0, 3), X(0, 3, seed=1), p=float("inf"), keepdim=True)
    # convolution and pooling
    f("conv1d", X(0, 2, 7), X(4, 2, 3), X(4))
    f("conv1d", X(0, 4, 7), X(4, 2, 3), stride=2, padding=1, groups=2)
    f("conv2d", X(0, 2, 5, 5), X(4, 2, 3, 3), X(4))
    f("conv2d", X(0, 4, 6, 5), X(4, 2, 3, 2), stride=2, padding=1, dilation=(1, 2), groups=2)
    f("conv2d", X(0, 2, 5, 5), X(4, 2, 3, 3), padding="same")
    f("conv_transpose2d", X(0, 4, 3, 3), X(4, 2, 3, 3), X(2))
    f("conv_transpose2d", X(0, 4, 3, 3), X(4, 1, 3, 3), stride=2, padding=1, output_padding=1,
      groups=2)
    f("unfold", X(0, 2, 5, 5), 3)
    f("unfold", X(0, 2, 5, 5), (2, 3), dilation=1, padding=1, stride=2)
    f("fold", X(0, 8, 9), (4, 4), 2)
    f("max_pool2d", X(0, 2, 6, 6), 2)
    f("max_pool2d", X(0, 2, 7, 7), 3, stride=2, padding=1, ceil_mode=True)
    f("max_pool2d", X(0, 2, 6, 6), 2, return_indices=True)
    f("max_pool2d_with_indices", X(0, 2, 6, 6), 2, return_indices=True)
    f("avg_pool2d", X(0, 2, 6, 6), 2)
    f("avg_pool2d", X(0, 2, 7, 7), 3, stride=2, padding=1, ceil_mode=True,
      count_include_pad=False)
    f("adaptive_avg_pool2d", X(0, 2, 6, 5), (3, 2))
    f("adaptive_avg_pool1d", X(0, 2, 7), 3)
    # PyTorch's kernels return an empty input unchanged (pixel_unshuffle's shape, and so
    # pixel_shuffle's backward, are wrong); torch's own reference implementation is the oracle
    f("pixel_shuffle", X(0, 8, 2, 3), 2, torch_call=lambda F, x, r: _torch_refs.pixel_shuffle(x, r))
    f("pixel_unshuffle", X(0, 2, 4, 6), 2,
      torch_call=lambda F, x, r: _torch_refs.pixel_unshuffle(x, r))
    for mode, shape, kw in (("nearest", (0, 2, 4, 4), {}), ("nearest-exact", (0, 2, 4), {}),
                            ("linear", (0, 2, 5), {}), ("bilinear", (0, 2, 4, 4), {}),
                            ("bilinear", (0, 2, 4, 4), {"align_corners": True}),
                            ("trilinear", (0, 1, 3, 3, 3), {}), ("area", (0, 2, 6, 6), {})):
        f("interpolate", X(*shape), scale_factor=2 if mode != "area" else 0.5, mode=mode, **kw)
    f("interpolate", X(0, 2, 4, 4), size=(3, 5), id="interpolate-size")
    for mode in ("constant", "reflect", "replicate", "circular"):
        f("pad", X(0, 3, 4), (1, 2), mode=mode)
    f("pad", X(0, 2, 3, 4), (1, 1, 2, 0), mode="reflect", id="pad-reflect-2d")
    f("pad", X(0, 3), (2, 1), value=1.5, id="pad-constant-value")
    # attention and utilities
    f("scaled_dot_product_attention", X(0, 2, 4, 8), X(0, 2, 5, 8, seed=1), X(0, 2, 5, 6, seed=2))
    f("scaled_dot_product_attention", X(0, 2, 4, 8), X(0, 2, 4, 8, seed=1), X(0, 2, 4, 6, seed=2),
      is_causal=True)
    f("scaled_dot_product_attention", X(0, 4, 8), X(0, 5, 8, seed=1), X(0, 5, 6, seed=2),
      C(X(4, 5, seed=3)), id="scaled_dot_product_attention-float-mask")
    f("scaled_dot_product_attention", X(0, 4, 8), X(0, 5, 8, seed=1), X(0, 5, 6, seed=2),
      B(4, 5), id="scaled_dot_product_attention-bool-mask")
    f("one_hot", I(0), num_classes=5)
    f("one_hot", I(0, 3), id="one_hot-infer")  # PyTorch raises: nothing to infer from
    return cases


# names of tapegrad.nn.functional that need no batch-0 case, each with its reason
F_EXCLUDED = {}

F_CASES = _fcases()


@pytest.mark.parametrize("case", [
    pytest.param(c, marks=pytest.mark.xfail(strict=True, reason=c.xfail)) if c.xfail else c
    for c in F_CASES], ids=[c.id for c in F_CASES])
def test_functional(case):
    th_inputs, tg_inputs = _wrap(torch, case.specs), _wrap(tapegrad, case.specs)

    def states():  # inputs that need no gradient may be updated in place (running stats)
        return [(f"input {i}", a, b) for i, (a, b) in enumerate(zip(tg_inputs, th_inputs))
                if isinstance(b, torch.Tensor) and not b.requires_grad]

    _compare(case.run, th_inputs, tg_inputs, states=states, raise_names=(case.name,),
             shapes=_shapes(case.specs))


def _public_functions():
    names = set(getattr(TF, "__all__", ()))
    names |= {n for n, v in vars(TF).items() if not n.startswith("_") and inspect.isfunction(v)
              and v.__module__ == TF.__name__}
    return names


def test_every_function_has_a_case():
    names = _public_functions()
    covered = {c.name for c in F_CASES}
    missing = sorted(names - covered - set(F_EXCLUDED))
    assert not missing, f"nn.functional names with no batch-0 case and no exclusion: {missing}"
    stale = sorted((covered | set(F_EXCLUDED)) - names)
    assert not stale, f"cases or exclusions for names that are not public: {stale}"


# --- nn layers ---------------------------------------------------------------------------
class LCase:
    def __init__(self, name, make, specs, call=None, train=True, id=None, raise_names=(),
                 torch_call=None):
        self.name, self.make, self.specs, self.call, self.train = name, make, specs, call, train
        self.torch_call = torch_call or call
        self.id = id or name
        self.raise_names = (name,) + tuple(raise_names)


def _lcases():
    cases = []

    def m(name, make, *specs, **kw):
        cases.append(LCase(name, make, list(specs), **kw))

    m("Identity", lambda nn: nn.Identity(), X(0, 3))
    m("Linear", lambda nn: nn.Linear(3, 4), X(0, 3))
    m("Linear", lambda nn: nn.Linear(3, 4, bias=False), X(0, 2, 3), id="Linear-3d-nobias")
    m("Bilinear", lambda nn: nn.Bilinear(3, 4, 5), X(0, 3), X(0, 4, seed=1))
    m("Conv1d", lambda nn: nn.Conv1d(2, 4, 3, padding=1), X(0, 2, 7))
    m("Conv2d", lambda nn: nn.Conv2d(2, 4, 3), X(0, 2, 5, 5))
    m("Conv2d", lambda nn: nn.Conv2d(4, 4, 3, stride=2, padding=1, groups=2,
                                     padding_mode="reflect"), X(0, 4, 5, 5),
      id="Conv2d-groups-reflect")
    m("ConvTranspose2d", lambda nn: nn.ConvTranspose2d(4, 2, 3, stride=2), X(0, 4, 3, 3))
    m("ConvTranspose2d", lambda nn: nn.ConvTranspose2d(4, 2, 3, stride=2, padding=1),
      X(0, 4, 3, 3), call=lambda mod, x: mod(x, output_size=(6, 6)), id="ConvTranspose2d-size")
    m("MaxPool2d", lambda nn: nn.MaxPool2d(2), X(0, 2, 6, 6))
    m("MaxPool2d", lambda nn: nn.MaxPool2d(3, 2, 1, return_indices=True), X(0, 2, 7, 7),
      id="MaxPool2d-indices")
    m("AvgPool2d", lambda nn: nn.AvgPool2d(2), X(0, 2, 6, 6))
    m("AdaptiveAvgPool2d", lambda nn: nn.AdaptiveAvgPool2d((3, 2)), X(0, 2, 6, 5))
    m("Flatten", lambda nn: nn.Flatten(), X(0, 2, 3))
    m("Unflatten", lambda nn: nn.Unflatten(1, (2, 3)), X(0, 6))
    m("Embedding", lambda nn: nn.Embedding(10, 3, padding_idx=1), I(0, 4, high=10))
    m("LayerNorm", lambda nn: nn.LayerNorm(4), X(0, 4))
    m("RMSNorm", lambda nn: nn.RMSNorm(4), X(0, 4))
    m("GroupNorm", lambda nn: nn.GroupNorm(2, 4), X(0, 4, 3))
    for train in (True, False):
        mode = "train" if train else "eval"
        m("BatchNorm1d", lambda nn: nn.BatchNorm1d(3), X(0, 3), train=train,
          id=f"BatchNorm1d-{mode}", raise_names=("batch_norm",))
        m("BatchNorm1d", lambda nn: nn.BatchNorm1d(3), X(0, 3, 5), train=train,
          id=f"BatchNorm1d-3d-{mode}", raise_names=("batch_norm",))
        m("BatchNorm2d", lambda nn: nn.BatchNorm2d(3), X(0, 3, 4, 4), train=train,
          id=f"BatchNorm2d-{mode}", raise_names=("batch_norm",))
    m("BatchNorm1d", lambda nn: nn.BatchNorm1d(3, affine=False, track_running_stats=False),
      X(0, 3), id="BatchNorm1d-no-stats", raise_names=("batch_norm",))
    m("BatchNorm1d", lambda nn: nn.BatchNorm1d(3), X(1, 3), id="BatchNorm1d-batch-1",
      raise_names=("batch_norm",))
    m("Dropout", lambda nn: nn.Dropout(0.5), X(0, 4))
    m("Dropout1d", lambda nn: nn.Dropout1d(0.5), X(0, 3, 5))
    m("Dropout2d", lambda nn: nn.Dropout2d(0.5), X(0, 3, 4, 4))
    m("Dropout3d", lambda nn: nn.Dropout3d(0.5), X(0, 2, 3, 3, 3))
    for name in ("ReLU", "LeakyReLU", "ELU", "GELU", "SiLU", "Softplus", "Tanh", "Sigmoid"):
        m(name, lambda nn, name=name: getattr(nn, name)(), X(0, 4))
    m("Softmax", lambda nn: nn.Softmax(dim=1), X(0, 4))
    m("LogSoftmax", lambda nn: nn.LogSoftmax(dim=1), X(0, 4))
    m("Sequential", lambda nn: nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2)),
      X(0, 3))
    m("DataParallel", lambda nn: nn.DataParallel(nn.Linear(3, 4)), X(0, 3))
    for red in ("mean", "sum", "none"):
        m("CrossEntropyLoss", lambda nn, r=red: nn.CrossEntropyLoss(reduction=r), X(0, 5), I(0),
          id=f"CrossEntropyLoss-{red}", raise_names=("cross_entropy",))
        m("NLLLoss", lambda nn, r=red: nn.NLLLoss(reduction=r), X(0, 5), I(0),
          id=f"NLLLoss-{red}", raise_names=("nll_loss",))
        for name in ("MSELoss", "L1Loss", "SmoothL1Loss"):
            m(name, lambda nn, n=name, r=red: getattr(nn, n)(reduction=r), X(0, 3),
              C(X(0, 3, seed=1)), id=f"{name}-{red}")
        m("BCELoss", lambda nn, r=red: nn.BCELoss(reduction=r), U(0, 3), C(U(0, 3, seed=1)),
          id=f"BCELoss-{red}")
        m("BCEWithLogitsLoss", lambda nn, r=red: nn.BCEWithLogitsLoss(reduction=r), X(0, 3),
          C(U(0, 3, seed=1)), id=f"BCEWithLogitsLoss-{red}")
    m("CrossEntropyLoss", lambda nn: nn.CrossEntropyLoss(weight=nn_tensor(nn, U(5)),
                                                         label_smoothing=0.2),
      X(0, 5), I(0), id="CrossEntropyLoss-weight-ls", raise_names=("cross_entropy",))
    m("BCEWithLogitsLoss", lambda nn: nn.BCEWithLogitsLoss(pos_weight=nn_tensor(nn, U(3))),
      X(0, 3), C(U(0, 3, seed=1)), id="BCEWithLogitsLoss-pos_weight")
    for name in ("RNN", "LSTM", "GRU"):
        m(name, lambda nn, n=name: getattr(nn, n)(3, 4, batch_first=True), X(0, 5, 3),
          id=f"{name}-batch_first")
        m(name, lambda nn, n=name: getattr(nn, n)(3, 4, num_layers=2, bidirectional=True),
          X(5, 0, 3), id=f"{name}-2layers-bidirectional")
    m("RNN", lambda nn: nn.RNN(3, 4), X(5, 0, 3), X(1, 0, 4, seed=1), id="RNN-h0")
    m("LSTM", lambda nn: nn.LSTM(3, 4), X(5, 0, 3), X(1, 0, 4, seed=1), X(1, 0, 4, seed=2),
      call=lambda mod, x, h, c: mod(x, (h, c)), id="LSTM-h0-c0")
    m("MultiheadAttention", lambda nn: nn.MultiheadAttention(8, 2, batch_first=True),
      X(0, 4, 8), X(0, 5, 8, seed=1), X(0, 5, 8, seed=2))
    m("MultiheadAttention", lambda nn: nn.MultiheadAttention(8, 2), X(4, 0, 8),
      X(5, 0, 8, seed=1), X(5, 0, 8, seed=2), B(0, 5),
      call=lambda mod, q, k, v, mask: mod(q, k, v, key_padding_mask=mask,
                                          average_attn_weights=False),
      id="MultiheadAttention-key_padding_mask")
    m("MultiheadAttention", lambda nn: nn.MultiheadAttention(8, 2, batch_first=True, kdim=6,
                                                             vdim=5, add_bias_kv=True),
      X(0, 4, 8), X(0, 5, 6, seed=1), X(0, 5, 5, seed=2), C(X(0, 4, 5, seed=3)),
      call=lambda mod, q, k, v, mask: mod(q, k, v, attn_mask=mask),
      id="MultiheadAttention-3d-attn_mask-kdim-bias_kv")
    m("MultiheadAttention", lambda nn: nn.MultiheadAttention(8, 2, batch_first=True),
      X(0, 4, 8), X(0, 5, 8, seed=1), X(0, 5, 8, seed=2), C(X(0, 4, 5, seed=3)),
      call=lambda mod, q, k, v, mask: mod(q, k, v, attn_mask=mask, need_weights=False),
      id="MultiheadAttention-3d-attn_mask-no-weights")
    m("MultiheadAttention", lambda nn: nn.MultiheadAttention(8, 2, add_zero_attn=True),
      X(4, 0, 8), X(5, 0, 8, seed=1), X(5, 0, 8, seed=2), B(4, 5),
      call=lambda mod, q, k, v, mask: mod(q, k, v, attn_mask=mask, is_causal=False),
      id="MultiheadAttention-2d-bool-mask-zero_attn")
    for name in ("RNNCell", "LSTMCell", "GRUCell"):
        m(name, lambda nn, n=name: getattr(nn, n)(3, 4), X(0, 3))
    m("RNNCell", lambda nn: nn.RNNCell(3, 4, nonlinearity="relu"), X(0, 3), X(0, 4, seed=1),
      id="RNNCell-h0")
    m("LSTMCell", lambda nn: nn.LSTMCell(3, 4), X(0, 3), X(0, 4, seed=1), X(0, 4, seed=2),
      call=lambda mod, x, h, c: mod(x, (h, c)), id="LSTMCell-h0-c0")
    m("GRUCell", lambda nn: nn.GRUCell(3, 4), X(0, 3), X(0, 4, seed=1), id="GRUCell-h0")
    # InstanceNorm: PyTorch repeats weight and bias per sample, and raises on an empty batch
    m("InstanceNorm1d", lambda nn: nn.InstanceNorm1d(3), X(0, 3, 5))
    m("InstanceNorm1d", lambda nn: nn.InstanceNorm1d(3, affine=True), X(0, 3, 5),
      id="InstanceNorm1d-affine", raise_names=("instance_norm",))
    m("InstanceNorm2d", lambda nn: nn.InstanceNorm2d(3, track_running_stats=True),
      X(0, 3, 4, 4), id="InstanceNorm2d-running-stats")
    m("InstanceNorm2d", lambda nn: nn.InstanceNorm2d(3, track_running_stats=True), X(0, 3, 4, 4),
      train=False, id="InstanceNorm2d-eval")
    m("InstanceNorm3d", lambda nn: nn.InstanceNorm3d(2), X(0, 2, 3, 3, 3))
    for dims, shape in ((1, (0, 3, 5)), (2, (0, 2, 4, 5)), (3, (0, 1, 3, 4, 5))):
        pad = (2, 1, 1, 2, 1, 0)[:2 * dims]
        m(f"ConstantPad{dims}d", lambda nn, d=dims, p=pad: getattr(nn, f"ConstantPad{d}d")(p, 1.5),
          X(*shape))
        for kind in ("Zero", "Reflection", "Replication", "Circular"):
            name = f"{kind}Pad{dims}d"
            m(name, lambda nn, n=name, p=pad: getattr(nn, n)(p), X(*shape))
    m("PixelShuffle", lambda nn: nn.PixelShuffle(2), X(0, 8, 2, 3),
      torch_call=lambda mod, x: _torch_refs.pixel_shuffle(x, 2))  # (see pixel_shuffle above)
    m("PixelUnshuffle", lambda nn: nn.PixelUnshuffle(2), X(0, 2, 4, 6),
      torch_call=lambda mod, x: _torch_refs.pixel_unshuffle(x, 2))
    m("Upsample", lambda nn: nn.Upsample(scale_factor=2), X(0, 2, 3, 3))
    m("Upsample", lambda nn: nn.Upsample(size=(5, 4), mode="bilinear"), X(0, 2, 3, 3),
      id="Upsample-bilinear")
    m("UpsamplingNearest2d", lambda nn: nn.UpsamplingNearest2d(scale_factor=2), X(0, 2, 3, 3))
    m("UpsamplingBilinear2d", lambda nn: nn.UpsamplingBilinear2d(scale_factor=2), X(0, 2, 3, 3))
    enc = dict(d_model=8, nhead=2, dim_feedforward=16, dropout=0.0, batch_first=True)
    m("TransformerEncoderLayer", lambda nn: nn.TransformerEncoderLayer(**enc), X(0, 5, 8))
    m("TransformerEncoderLayer", lambda nn: nn.TransformerEncoderLayer(
        **dict(enc, batch_first=False, norm_first=True)), X(5, 0, 8),
      id="TransformerEncoderLayer-norm_first")
    m("TransformerDecoderLayer", lambda nn: nn.TransformerDecoderLayer(**enc), X(0, 4, 8),
      X(0, 5, 8, seed=1))
    m("TransformerEncoder", lambda nn: nn.TransformerEncoder(
        nn.TransformerEncoderLayer(**enc), 2, enable_nested_tensor=False), X(0, 5, 8))
    m("TransformerDecoder", lambda nn: nn.TransformerDecoder(nn.TransformerDecoderLayer(**enc), 2),
      X(0, 4, 8), X(0, 5, 8, seed=1))
    m("Transformer", lambda nn: nn.Transformer(num_encoder_layers=1, num_decoder_layers=1, **enc),
      X(0, 5, 8), X(0, 4, 8, seed=1))
    return cases


def nn_tensor(nn, array):
    """A float64 constant tensor of the library that ``nn`` belongs to."""
    return (torch.tensor if nn is torch.nn else tapegrad.tensor)(array)


# Module subclasses of tapegrad.nn that need no batch-0 case, each with its reason
L_EXCLUDED = {
    "Module": "the base class: no forward of its own",
    "ModuleList": "a container without forward",
    "ModuleDict": "a container without forward",
    "ParameterList": "a container without forward",
    "ParameterDict": "a container without forward",
    "RNNBase": "the base of RNN, LSTM and GRU (covered there); PyTorch's has no forward",
    "RNNCellBase": "the base of RNNCell, LSTMCell and GRUCell (covered there); no forward",
}

L_CASES = _lcases()


@pytest.mark.parametrize("case", L_CASES, ids=[c.id for c in L_CASES])
def test_layer(case):
    th, tg = case.make(torch.nn).double(), case.make(tnn).double()
    tg.load_state_dict({k: tapegrad.tensor(v.detach().numpy()) for k, v in
                        th.state_dict().items()})
    th.train(case.train)
    tg.train(case.train)
    default = (lambda mod, *xs: mod(*xs))
    call, torch_call = case.call or default, case.torch_call or default
    th_inputs, tg_inputs = _wrap(torch, case.specs), _wrap(tapegrad, case.specs)

    def states():
        tg_states, th_states = tg.state_dict(), th.state_dict()
        assert list(tg_states) == list(th_states), "state_dict keys differ"
        return [(k, tg_states[k], th_states[k]) for k in th_states]

    _compare(lambda lib, xs: torch_call(th, *xs) if lib is torch else call(tg, *xs),
             th_inputs, tg_inputs,
             th_params=list(th.named_parameters()), tg_params=list(tg.named_parameters()),
             states=states, raise_names=case.raise_names, shapes=_shapes(case.specs))


def _public_layers():
    return {n for n, v in vars(tnn).items() if not n.startswith("_") and inspect.isclass(v)
            and issubclass(v, tnn.Module)}


def test_every_layer_has_a_case():
    names = _public_layers()
    covered = {c.name for c in L_CASES}
    missing = sorted(names - covered - set(L_EXCLUDED))
    assert not missing, f"nn layers with no batch-0 case and no exclusion: {missing}"
    stale = sorted((covered | set(L_EXCLUDED)) - names)
    assert not stale, f"cases or exclusions for names that are not public layers: {stale}"
