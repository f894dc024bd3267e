"""``tapegrad bench compile``'s side-by-side contestants: the JAX and torch.func steps do the
same arithmetic as the module step; missing contestants are reported, not fatal. No timing
is asserted."""
import sys

import numpy as np
import pytest
import torch

import tapegrad
from tapegrad.bench import compile as bench_compile

SIZES, BATCH = (2, 8, 3), 60


def _module_losses(T, dtype="float64", steps=3):
    step, _, data = bench_compile.make_step(T, SIZES, BATCH, dtype=dtype)
    return [step(*data).item() for _ in range(steps)]


@pytest.mark.parametrize("dtype,rtol", [("float64", 1e-12), ("float32", 1e-5)])
def test_functional_torch_step_matches_module_step(dtype, rtol):
    step, state = bench_compile.torch_compiled_step(torch, SIZES, BATCH, dtype, compile=False)
    got = [step() for _ in range(3)]
    np.testing.assert_allclose(got, _module_losses(torch, dtype), rtol=rtol)
    np.testing.assert_allclose(got, _module_losses(tapegrad, dtype), rtol=rtol)
    assert got[2] < got[0]  # the SGD update moved the weights
    assert state[0][0].dtype == getattr(torch, dtype)


@pytest.mark.parametrize("dtype,rtol", [("float64", 1e-12), ("float32", 1e-5)])
def test_jax_step_matches_module_step(dtype, rtol):
    jax = pytest.importorskip("jax")
    jax.config.update("jax_enable_x64", True)
    step, state = bench_compile.jax_step(jax, SIZES, BATCH, dtype)
    got = [step() for _ in range(3)]
    np.testing.assert_allclose(got, _module_losses(torch, dtype), rtol=rtol)
    assert str(state[0][0].dtype) == dtype


def test_missing_contestants_are_reported(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "jax", None)  # import jax raises ImportError
    assert bench_compile.import_jax(threads=1) is None
    assert bench_compile.main(["--no-torch", "--quick", "--hidden", "8", "--batch", "60",
                               "--rounds", "1"]) == 0
    out = capsys.readouterr().out
    rows = {line.split("  ")[0]: line for line in out.splitlines()}
    for label in ("torch.compile", "JAX jit", "PyTorch eager"):
        assert rows[label].rstrip().endswith("not installed"), rows[label]
    assert "torch.compile: not installed" in out and "JAX jit: not installed" in out
    assert "tapegrad compiled" in rows and "vs tapegrad eager" in out
