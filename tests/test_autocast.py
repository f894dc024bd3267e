"""Autocast and GradScaler against PyTorch 2.13's CPU autocast (the oracle).

Each case is written once as ``fn(T, F, r)`` and run with ``T = tapegrad`` and ``T = torch``
inside ``T.autocast("cpu", dtype=...)``; ``r(shape, dtype)`` builds the same random input in
both. Output dtypes must agree; values must agree to the lower precision's rounding.
"""
import copy
import pickle
import threading
import warnings

import numpy as np
import pytest
import torch

import tapegrad
import tapegrad.nn.functional as tF


def _inputs(T):
    rng = np.random.default_rng(0)

    def r(shape, dt="float32", positive=False):
        a = rng.standard_normal(shape)
        if positive:
            a = np.abs(a) + 0.1
        return T.tensor(a).to(getattr(T, dt))

    return r


def _ones(T, n, dt="bfloat16"):
    return T.ones(n, dtype=getattr(T, dt))


def _idx(T, *v):
    return T.tensor(list(v))


# name: (fn(T, F, r), what PyTorch lists it as). Covers every op of PyTorch's CPU lists that
# tapegrad has, with float32 inputs (lower precision ops) or bfloat16 inputs (float32 ops),
# and unlisted ops whose dtype must stay as without autocast.
CASES = {
    # lower_precision_fp
    "matmul": lambda T, F, r: T.matmul(r((3, 4)), r((4, 5))),
    "matmul_op": lambda T, F, r: r((3, 4)) @ r((4, 5), "bfloat16"),
    "matmul_batched": lambda T, F, r: r((2, 3, 4)) @ r((4, 5)),
    "matmul_float64": lambda T, F, r: r((3, 4), "float64") @ r((4, 5), "float64"),
    "mm": lambda T, F, r: T.mm(r((3, 4)), r((4, 5), "bfloat16")),
    "bmm": lambda T, F, r: T.bmm(r((2, 3, 4)), r((2, 4, 5))),
    "linear": lambda T, F, r: F.linear(r((3, 4)), r((5, 4)), r((5,))),
    "linear_nobias": lambda T, F, r: F.linear(r((2, 3, 4)), r((5, 4))),
    "conv1d": lambda T, F, r: F.conv1d(r((1, 2, 8)), r((3, 2, 3)), r((3,)), padding=1),
    "conv2d": lambda T, F, r: F.conv2d(r((1, 2, 5, 5)), r((3, 2, 3, 3)), r((3,)), stride=2),
    "conv_transpose2d": lambda T, F, r: F.conv_transpose2d(r((1, 2, 4, 4)), r((2, 3, 3, 3)),
                                                           r((3,))),
    "sdpa": lambda T, F, r: F.scaled_dot_product_attention(r((1, 2, 3, 4)), r((1, 2, 3, 4)),
                                                           r((1, 2, 3, 4))),
    "einsum_matmul": lambda T, F, r: T.einsum("ij,jk->ik", r((3, 4)), r((4, 5))),
    "einsum_batched": lambda T, F, r: T.einsum("bij,bjk->bik", r((2, 3, 4)), r((2, 4, 5))),
    "einsum_inner": lambda T, F, r: T.einsum("i,i->", r((4,)), r((4,))),
    "einsum_product": lambda T, F, r: T.einsum("i,i->i", r((4,)), r((4,))),
    "einsum_sum": lambda T, F, r: T.einsum("ij->i", r((3, 4))),
    "mha": lambda T, F, r: T.nn.MultiheadAttention(4, 2)(r((3, 1, 4)), r((3, 1, 4)),
                                                          r((3, 1, 4)))[0],
    # fp32
    "prod": lambda T, F, r: T.prod(r((3, 4), "bfloat16")),
    "prod_dim": lambda T, F, r: T.prod(r((3, 4), "bfloat16"), 1),
    "mse_loss": lambda T, F, r: F.mse_loss(r((3, 4), "bfloat16"), r((3, 4), "bfloat16")),
    "l1_loss": lambda T, F, r: F.l1_loss(r((3, 4), "bfloat16"), r((3, 4), "bfloat16")),
    "smooth_l1_loss": lambda T, F, r: F.smooth_l1_loss(r((3, 4), "bfloat16"),
                                                       r((3, 4), "bfloat16")),
    "huber_loss": lambda T, F, r: F.huber_loss(r((3, 4), "bfloat16"), r((3, 4), "bfloat16")),
    "cross_entropy": lambda T, F, r: F.cross_entropy(r((3, 4), "bfloat16"), _idx(T, 0, 1, 2)),
    "cross_entropy_probs": lambda T, F, r: F.cross_entropy(
        r((3, 4), "bfloat16"), F.softmax(r((3, 4), "bfloat16"), -1)),
    "cross_entropy_smooth": lambda T, F, r: F.cross_entropy(
        r((3, 4), "bfloat16"), _idx(T, 0, 1, 2), label_smoothing=0.1),
    "nll_loss": lambda T, F, r: F.nll_loss(r((3, 4), "bfloat16"), _idx(T, 0, 1, 2)),
    "binary_cross_entropy": lambda T, F, r: F.binary_cross_entropy(
        T.sigmoid(r((3, 4), "bfloat16")), T.sigmoid(r((3, 4), "bfloat16"))),
    "bce_with_logits": lambda T, F, r: F.binary_cross_entropy_with_logits(
        r((3, 4), "bfloat16"), T.sigmoid(r((3, 4), "bfloat16"))),
    "kl_div": lambda T, F, r: F.kl_div(r((3, 4), "bfloat16"), r((3, 4), "bfloat16", True),
                                       reduction="batchmean"),
    "margin_ranking_loss": lambda T, F, r: F.margin_ranking_loss(
        r((3,), "bfloat16"), r((3,), "bfloat16"), _ones(T, 3)),
    "hinge_embedding_loss": lambda T, F, r: F.hinge_embedding_loss(r((3,), "bfloat16"),
                                                                   _ones(T, 3)),
    "soft_margin_loss": lambda T, F, r: F.soft_margin_loss(r((3,), "bfloat16"), _ones(T, 3)),
    "cosine_embedding_loss": lambda T, F, r: F.cosine_embedding_loss(
        r((3, 4), "bfloat16"), r((3, 4), "bfloat16"), _ones(T, 3)),
    "triplet_margin_loss": lambda T, F, r: F.triplet_margin_loss(
        r((3, 4), "bfloat16"), r((3, 4), "bfloat16"), r((3, 4), "bfloat16")),
    "poisson_nll_loss": lambda T, F, r: F.poisson_nll_loss(r((3, 4), "bfloat16"),
                                                           r((3, 4), "bfloat16", True)),
    "reflection_pad1d": lambda T, F, r: F.pad(r((1, 2, 5), "bfloat16"), (1, 1), mode="reflect"),
    "reflection_pad2d": lambda T, F, r: F.pad(r((1, 2, 5, 5), "bfloat16"), (1, 1, 1, 1),
                                              mode="reflect"),
    "replication_pad1d": lambda T, F, r: F.pad(r((1, 2, 5), "bfloat16"), (1, 2),
                                               mode="replicate"),
    "replication_pad2d": lambda T, F, r: F.pad(r((1, 2, 5, 5), "bfloat16"), (1, 1, 2, 0),
                                               mode="replicate"),
    # promote
    "cat_mixed": lambda T, F, r: T.cat([r((3,), "bfloat16"), r((3,))]),
    "cat_lower": lambda T, F, r: T.cat([r((3,), "bfloat16"), r((3,), "bfloat16")]),
    "cat_float64": lambda T, F, r: T.cat([r((3,), "float64"), r((3,), "bfloat16")]),
    "stack_mixed": lambda T, F, r: T.stack([r((3,), "bfloat16"), r((3,))]),
    "stack_lower": lambda T, F, r: T.stack([r((3,), "bfloat16"), r((3,), "bfloat16")]),
    # unlisted: run in their inputs' dtypes
    "dot": lambda T, F, r: T.dot(r((4,)), r((4,))),
    "outer": lambda T, F, r: T.outer(r((4,)), r((4,))),
    "unfold": lambda T, F, r: F.unfold(r((1, 2, 4, 4)), 2),
    "reflection_pad3d": lambda T, F, r: F.pad(r((1, 2, 3, 3, 3), "bfloat16"), (1,) * 6,
                                              mode="reflect"),
    "circular_pad": lambda T, F, r: F.pad(r((1, 2, 5), "bfloat16"), (1, 1), mode="circular"),
    "constant_pad": lambda T, F, r: F.pad(r((1, 2, 5), "bfloat16"), (1, 1)),
    "softmax": lambda T, F, r: F.softmax(r((3, 4)), -1),
    "softmax_lower": lambda T, F, r: F.softmax(r((3, 4), "bfloat16"), -1),
    "log_softmax_lower": lambda T, F, r: F.log_softmax(r((3, 4), "bfloat16"), -1),
    "sum_lower": lambda T, F, r: T.sum(r((3, 4), "bfloat16")),
    "cumsum_lower": lambda T, F, r: T.cumsum(r((3, 4), "bfloat16"), 0),
    "exp_lower": lambda T, F, r: T.exp(r((3,), "bfloat16")),
    "gelu_lower": lambda T, F, r: F.gelu(r((3,), "bfloat16")),
    "add_mixed": lambda T, F, r: r((3,), "bfloat16") + r((3,)),
    "where_mixed": lambda T, F, r: T.where(r((3,)) > 0, r((3,), "bfloat16"), r((3,))),
    "max_pool2d": lambda T, F, r: F.max_pool2d(r((1, 1, 4, 4), "bfloat16"), 2),
    "avg_pool2d": lambda T, F, r: F.avg_pool2d(r((1, 1, 4, 4), "bfloat16"), 2),
    "embedding": lambda T, F, r: F.embedding(_idx(T, 0, 2), r((3, 4))),
    "gaussian_nll_loss": lambda T, F, r: F.gaussian_nll_loss(
        r((3, 4), "bfloat16"), r((3, 4), "bfloat16"), r((3, 4), "bfloat16", True)),
    "normalize": lambda T, F, r: F.normalize(r((3, 4), "bfloat16")),
    "logsumexp": lambda T, F, r: T.logsumexp(r((3, 4), "bfloat16"), 1),
}


def _run(T, F, fn, dtype="bfloat16"):
    T.manual_seed(0)
    r = _inputs(T)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with T.autocast("cpu", dtype=getattr(T, dtype)):
            return fn(T, F, r)


@pytest.mark.parametrize("name", sorted(CASES))
def test_output_dtype_as_torch(name):
    fn = CASES[name]
    expected = _run(torch, torch.nn.functional, fn)
    got = _run(tapegrad, tF, fn)
    assert str(got.dtype).split(".")[-1] == str(expected.dtype).split(".")[-1], name
    if name != "mha":  # its weights are random per library
        e = expected.detach().float().numpy()
        g = got.detach().float().numpy()
        np.testing.assert_allclose(g, e, rtol=2 ** -7, atol=2 ** -7 * np.abs(e).max())
