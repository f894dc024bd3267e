"""matmul (every rank combination), mm, bmm, einsum, outer, dot against PyTorch."""
import numpy as np
import pytest
import torch

import tapegrad
from tapegrad.ops import linalg
from helpers import check_op, check_torch, make_inputs

CASES = [
    ("matmul_1d_1d", lambda T, a, b: T.matmul(a, b), [(3,), (3,)]),
    ("matmul_1d_2d", lambda T, a, b: a @ b, [(3,), (3, 2)]),
    ("matmul_2d_1d", lambda T, a, b: a @ b, [(2, 3), (3,)]),
    ("matmul_2d_2d", lambda T, a, b: a.matmul(b), [(2, 3), (3, 4)]),
    ("matmul_batched", lambda T, a, b: a @ b, [(2, 2, 3), (2, 3, 2)]),
    ("matmul_broadcast_batch", lambda T, a, b: a @ b, [(2, 1, 2, 3), (3, 3, 2)]),
    ("matmul_broadcast_matrix", lambda T, a, b: a @ b, [(2, 3), (2, 3, 2)]),
    ("matmul_batched_1d", lambda T, a, b: a @ b, [(2, 2, 3), (3,)]),
    ("matmul_1d_batched", lambda T, a, b: a @ b, [(3,), (2, 3, 2)]),
    ("matmul_diamond", lambda T, a: a @ a, [(3, 3)]),
    ("matmul_chain", lambda T, a, b: (a @ b).tanh() @ b.mT, [(2, 3), (3, 3)]),
    ("mm", lambda T, a, b: T.mm(a, b), [(2, 3), (3, 2)]),
    ("mm_method", lambda T, a, b: a.mm(b), [(1, 3), (3, 1)]),
    ("bmm", lambda T, a, b: T.bmm(a, b), [(2, 2, 3), (2, 3, 2)]),
    ("dot", lambda T, a, b: T.dot(a, b), [(4,), (4,)]),
    ("dot_self", lambda T, a: a.dot(a), [(4,)]),
    ("outer", lambda T, a, b: T.outer(a, b), [(3,), (2,)]),
    ("outer_method", lambda T, a, b: a.outer(b) * a.outer(b), [(2,), (3,)]),
    ("einsum_matmul", lambda T, a, b: T.einsum("ij,jk->ik", a, b), [(2, 3), (3, 2)]),
    ("einsum_implicit", lambda T, a, b: T.einsum("ij,jk", a, b), [(2, 3), (3, 2)]),
    ("einsum_implicit_transpose", lambda T, a: T.einsum("ji", a), [(2, 3)]),
    ("einsum_spaces", lambda T, a, b: T.einsum("i j , j -> i", a, b), [(2, 3), (3,)]),
    ("einsum_list", lambda T, a, b: T.einsum("bij,bjk->bik", [a, b]), [(2, 2, 3), (2, 3, 2)]),
    ("einsum_sum", lambda T, a: T.einsum("ij->", a), [(2, 3)]),
    ("einsum_row_sum", lambda T, a: T.einsum("ij->j", a), [(2, 3)]),
    ("einsum_outer", lambda T, a, b: T.einsum("i,j->ij", a, b), [(3,), (2,)]),
    ("einsum_three", lambda T, a, b, c: T.einsum("ij,jk,kl->il", a, b, c),
     [(2, 3), (3, 2), (2, 2)]),
    ("einsum_summed_alone", lambda T, a, b: T.einsum("ij,k->i", a, b), [(2, 3), (2,)]),
    ("einsum_bilinear", lambda T, x, w, y: T.einsum("bi,oij,bj->bo", x, w, y),
     [(2, 2), (2, 2, 3), (2, 3)]),
    ("einsum_ellipsis", lambda T, a, b: T.einsum("...ij,...jk->...ik", a, b),
     [(2, 1, 2, 3), (3, 3, 2)]),
    ("einsum_ellipsis_implicit", lambda T, a, b: T.einsum("...ij,...jk", a, b),
     [(2, 2, 3), (3, 2)]),
    ("einsum_ellipsis_summed", lambda T, a: T.einsum("...ij->j", a), [(2, 2, 3)]),
    ("einsum_ellipsis_middle", lambda T, a: T.einsum("i...j->j...i", a), [(2, 3, 2, 2)]),
    ("einsum_size1_broadcast", lambda T, a, b: T.einsum("ij,ij->ij", a, b), [(1, 3), (2, 3)]),
    ("einsum_size1_contracted", lambda T, a, b: T.einsum("ij,j->i", a, b), [(2, 3), (1,)]),
    ("einsum_diagonal", lambda T, a: T.einsum("ii->i", a), [(3, 3)]),
    ("einsum_trace", lambda T, a: T.einsum("ii", a), [(3, 3)]),
    ("einsum_diag_batched", lambda T, a, b: T.einsum("bii,bi->b", a, b),
     [(2, 3, 3), (2, 3)]),
    ("einsum_sublist", lambda T, a, b: T.einsum(a, [0, 1], b, [1, 2], [0, 2]),
     [(2, 3), (3, 2)]),
    ("einsum_sublist_implicit", lambda T, a, b: T.einsum(a, [..., 0], b, [0]),
     [(2, 3), (3,)]),
    ("einsum_diamond", lambda T, a: T.einsum("ij,ij->", a, a) + T.einsum("ij,kj", a, a).sum(),
     [(2, 3)]),
    ("einsum_uppercase", lambda T, a, b: T.einsum("Ab,bC->AC", a, b), [(2, 3), (3, 2)]),
]


@pytest.mark.parametrize("fn,specs", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_matches_torch(fn, specs):
    check_op(fn, specs)


def test_matmul_int():
    a = np.arange(6).reshape(2, 3)
    check_torch(lambda T, x: x @ x.mT, [a], grad=False)


def test_outer_promotes():
    check_torch(lambda T, a, b: T.outer(a, b), [np.arange(3), make_inputs([(2,)])[0]])


def test_only_needed_gradients_are_computed():
    calls = []
    rule = linalg.matmul.rule

    def spy(g, out, a, b, needs=(True, True)):
        calls.append(tuple(needs))
        return rule(g, out, a, b, needs=needs)

    linalg.matmul.rule = spy
    try:
        w = tapegrad.randn(3, 2, dtype=tapegrad.float64, requires_grad=True)
        x = tapegrad.randn(4, 3, dtype=tapegrad.float64)
        (x @ w).sum().backward()
        assert calls == [(False, True)] and w.grad is not None and x.grad is None
    finally:
        linalg.matmul.rule = rule
    erule = linalg.einsum_op.rule
    seen = []

    def espy(g, out, *ops, equation, needs=None):
        grads = erule(g, out, *ops, equation=equation, needs=needs)
        seen.append([gr is not None for gr in grads])
        return grads

    linalg.einsum_op.rule = espy
    try:
        a = tapegrad.randn(2, 3, dtype=tapegrad.float64)
        b = tapegrad.randn(3, 2, dtype=tapegrad.float64, requires_grad=True)
        tapegrad.einsum("ij,jk->ik", a, b).sum().backward()
        assert seen == [[False, True]]
    finally:
        linalg.einsum_op.rule = erule


def test_matmul_error_message():
    a, b = tapegrad.zeros(4, 3), tapegrad.zeros(5, 2)
    with pytest.raises(RuntimeError) as e:
        a @ b
    assert "matmul: shapes (4, 3) and (5, 2) cannot be multiplied (3 != 5)" in str(e.value)


ERRORS = [
    (lambda T, a: T.matmul(a, a.sum()), RuntimeError, "1D|both arguments"),
    (lambda T, a: T.matmul(a, a[:, 0]), RuntimeError, "cannot be multiplied|size mismatch"),
    (lambda T, a: T.matmul(a, a.t().float() if T is torch else a.t().to(T.float32)),
     RuntimeError, "dtype"),
    (lambda T, a: T.mm(a, a), RuntimeError, "cannot be multiplied"),
    (lambda T, a: T.mm(a[0], a), RuntimeError, "2-D|a matrix"),
    (lambda T, a: T.mm(a, a.t().float() if T is torch else a.t().to(T.float32)), RuntimeError,
     "dtype"),
    (lambda T, a: T.bmm(a, a.t()), RuntimeError, "3D|3-D"),
    (lambda T, a: T.bmm(a[None], T.stack([a.t(), a.t()])), RuntimeError, "Expected size for "
     "first two dimensions of batch2 tensor to be: \\[1, 3\\] but got: \\[2, 3\\]"),
    (lambda T, a: T.bmm(a[None], a[None]), RuntimeError, "Expected size for first two "
     "dimensions of batch2 tensor to be: \\[1, 3\\] but got: \\[1, 2\\]"),
    (lambda T, a: T.dot(a, a[0]), RuntimeError, "1D tensors expected"),
    (lambda T, a: T.dot(a[0], a[0, :2]), RuntimeError, "inconsistent tensor size"),
    (lambda T, a: T.outer(a, a[0]), RuntimeError, "1-D"),
    (lambda T, a: T.einsum("ij,jk->ik", a), RuntimeError, "fewer operands"),
    (lambda T, a: T.einsum("ij,jk->ik", a, a), RuntimeError, "subscript j has size 2 for "
     "operand 1 which does not broadcast with previously seen size 3"),
    (lambda T, a: T.einsum("ijk->ij", a), RuntimeError, "number of subscripts in the equation "
     "\\(3\\) does not match the number of dimensions \\(2\\) for operand 0"),
    (lambda T, a: T.einsum("ij->k", a), RuntimeError, "output subscript k does not appear"),
    (lambda T, a: T.einsum("ij->ii", a), RuntimeError, "appears more than once in the output"),
    (lambda T, a: T.einsum("ii->i", a), RuntimeError, "repeated for operand 0 but the sizes"),
    (lambda T, a: T.einsum("i1->i", a), RuntimeError, "invalid subscript|subscripts"),
    (lambda T, a: T.einsum("ij,jk->ik", a, (a.float() if T is torch else a.to(T.float32)).t()),
     RuntimeError, "expected scalar type|same dtype"),
]


@pytest.mark.parametrize("fn,exc,match", ERRORS)
def test_errors_match_torch(fn, exc, match):
    with pytest.raises(exc, match=match):
        fn(torch, torch.zeros(2, 3, dtype=torch.float64))
    with pytest.raises(exc, match=match):
        fn(tapegrad, tapegrad.zeros(2, 3, dtype=tapegrad.float64))


def test_errors_name_the_op():
    a = tapegrad.zeros(2, 3)
    for fn, name in [(lambda: tapegrad.mm(a, a), "mm"), (lambda: tapegrad.bmm(a, a), "bmm"),
                     (lambda: tapegrad.dot(a, a), "dot"), (lambda: tapegrad.outer(a, a), "outer"),
                     (lambda: tapegrad.einsum("ij->k", a), "einsum")]:
        with pytest.raises(RuntimeError, match=name):
            fn()
