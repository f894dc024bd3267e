"""Type promotion of add/mul/div (and a few more) against PyTorch, exhaustively over pairs.

Operands: tensors with dims and 0-dim tensors of bool, uint8, int32, int64, float16, float32,
float64, and Python bool/int/float scalars. PyTorch's rule: tensors with dims outrank 0-dim
tensors outrank Python scalars, and a lower-priority operand only matters when its category
(bool < integer < float) is higher.
"""
import itertools
import operator

import numpy as np
import pytest
import torch

import tapegrad

DTYPES = ["bool", "uint8", "int32", "int64", "float16", "float32", "float64"]
SCALARS = {"py-bool": True, "py-int": 3, "py-float": 1.5}


def _operand(lib, kind):
    """Build one operand for ``lib`` from a kind like 'int32[2]', 'float16[]' or 'py-int'."""
    if kind in SCALARS:
        return SCALARS[kind]
    name, shape = kind.split("[")
    values = np.array([1, 2]) if shape == "2]" else np.array(1)
    if name == "bool":
        values = values.astype(bool)
    return lib.tensor(values.astype(name), dtype=getattr(lib, name))


KINDS = [f"{d}[2]" for d in DTYPES] + [f"{d}[]" for d in DTYPES] + list(SCALARS)
PAIRS = [(a, b) for a, b in itertools.product(KINDS, KINDS)
         if not (a in SCALARS and b in SCALARS)]


def _name(dtype):
    return str(dtype).split(".")[-1]


@pytest.mark.parametrize("a, b", PAIRS, ids=[f"{a}-{b}" for a, b in PAIRS])
def test_result_dtype_matches_torch(a, b):
    ta, tb = _operand(torch, a), _operand(torch, b)
    ga, gb = _operand(tapegrad, a), _operand(tapegrad, b)
    expected = torch.result_type(ta, tb) if isinstance(ta, torch.Tensor) else \
        torch.result_type(tb, ta)
    assert _name(tapegrad.dtypes.result_type(*[x for x in (ga, gb)])) == _name(expected)
    for op in ("add", "mul", "div"):
        th = getattr(torch, op)(ta, tb)
        tg = getattr(tapegrad, op)(ga, gb)
        assert _name(tg.dtype) == _name(th.dtype), f"{op}: {tg.dtype} != {th.dtype}"
        assert tg.shape == tuple(th.shape)
        np.testing.assert_allclose(tg.numpy().astype(np.float64),
                                   th.numpy().astype(np.float64), rtol=1e-3)


OPERATORS = {"+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv,
             "%": operator.mod, "//": operator.floordiv, "**": operator.pow, "==": operator.eq,
             "<": operator.lt}
NUMERIC = [k for k in KINDS if not k.startswith("bool")]


@pytest.mark.parametrize("op", OPERATORS)
def test_operator_dtypes_match_torch(op):
    # every numeric pair through each operator (bool operands are covered above: PyTorch
    # rejects bool - bool and friends)
    for a, b in itertools.product(NUMERIC, NUMERIC):
        if a in SCALARS and b in SCALARS:
            continue
        ta, tb = _operand(torch, a), _operand(torch, b)
        ga, gb = _operand(tapegrad, a), _operand(tapegrad, b)
        if op == "-" and "py-bool" in (a, b):
            continue  # PyTorch rejects subtracting bools; tapegrad (documented) computes it
        fn = OPERATORS[op]
        try:
            th = fn(ta, tb)
        except RuntimeError:
            with pytest.raises(RuntimeError):
                fn(ga, gb)
            continue
        tg = fn(ga, gb)
        assert _name(tg.dtype) == _name(th.dtype), f"{a} {op} {b}: {tg.dtype} != {th.dtype}"


@pytest.mark.parametrize("kind", [k for k in KINDS if k not in SCALARS])
def test_unary_float_ops_promote_integers_to_the_default_dtype(kind):
    for name in ("exp", "sqrt", "sigmoid", "erf", "reciprocal", "log1p"):
        th = getattr(torch, name)(_operand(torch, kind))
        tg = getattr(tapegrad, name)(_operand(tapegrad, kind))
        assert _name(tg.dtype) == _name(th.dtype), f"{name}({kind})"
    for name in ("abs", "floor", "sign", "neg") if not kind.startswith("bool") else ("sign",):
        th = getattr(torch, name)(_operand(torch, kind))
        tg = getattr(tapegrad, name)(_operand(tapegrad, kind))
        assert _name(tg.dtype) == _name(th.dtype), f"{name}({kind})"


@pytest.mark.parametrize("kind", [k for k in KINDS if k not in SCALARS])
def test_reduction_dtypes_match_torch(kind):
    for name in ("sum", "prod", "amax", "cumsum", "all", "any", "argmax"):
        args = (0,) if name == "cumsum" else ()
        if name == "argmax" and kind.startswith("bool"):
            with pytest.raises(RuntimeError, match="bool"):
                tapegrad.argmax(_operand(tapegrad, kind))
            continue
        th = getattr(torch, name)(_operand(torch, kind), *args)
        tg = getattr(tapegrad, name)(_operand(tapegrad, kind), *args)
        assert _name(tg.dtype) == _name(th.dtype), f"{name}({kind})"
