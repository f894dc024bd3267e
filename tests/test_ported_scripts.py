"""PyTorch scripts port by changing only their imports.

Each script in tests/ported/ is plain PyTorch code. It runs once as written, and once with
its import lines rewritten to tapegrad (nothing else is touched), from the same initial
weights (the torch model's state_dict) and the same data; every loss must agree.
"""
import pathlib
import re

import numpy as np
import pytest
import torch

import tapegrad

HERE = pathlib.Path(__file__).parent / "ported"


def port(source: str) -> str:
    """The only change a user makes: the imports."""
    source = re.sub(r"^import torch\.nn\.functional as F$", "import tapegrad.nn.functional as F",
                    source, flags=re.M)
    source = re.sub(r"^import torch\.nn as nn$", "import tapegrad.nn as nn", source, flags=re.M)
    return re.sub(r"^import torch$", "import tapegrad as torch", source, flags=re.M)


def _data(name, rng):
    if name == "mlp":
        x = rng.standard_normal((32, 4))
        return {"x": x, "y": np.sin(x).sum(1, keepdims=True)}
    if name == "cnn":
        return {"x": rng.standard_normal((12, 1, 8, 8)), "y": rng.integers(0, 3, 12)}
    return {"idx": rng.integers(0, 11, (4, 9))}


def _run(source, init, data):
    losses = []
    namespace = {"INIT": init, "DATA": data, "LOSSES": losses, "__name__": "__ported__"}
    exec(compile(source, "<ported>", "exec"), namespace)
    return np.array(losses)


@pytest.mark.parametrize("name", ["mlp", "cnn", "transformer"])
def test_script_ports_by_changing_imports(name):
    source = (HERE / f"{name}.py").read_text()
    ported = port(source)
    changed = [(a, b) for a, b in zip(source.splitlines(), ported.splitlines()) if a != b]
    assert changed and all(a.startswith("import torch") for a, _ in changed)
    data = _data(name, np.random.default_rng(0))
    torch.manual_seed(0)
    prev = torch.get_default_dtype()
    try:
        init = _initial_state(source, data)  # torch's own initialisation, captured once
        ref = _run(source, init, data)
        got = _run(ported, init, data)
    finally:
        torch.set_default_dtype(prev)
        tapegrad.set_default_dtype(tapegrad.float32)
    assert len(got) == len(ref) > 10
    np.testing.assert_allclose(got, ref, rtol=1e-13, atol=0)


def _initial_state(source, data):
    """Run the script's model construction in torch with load_state_dict made a no-op."""
    original = torch.nn.Module.load_state_dict
    captured = {}

    def capture(self, state, *a, **k):
        captured.update({k: v.detach().numpy().copy() for k, v in self.state_dict().items()})
        raise _Stop

    torch.nn.Module.load_state_dict = capture
    try:
        _run(source, {}, data)
    except _Stop:
        pass
    finally:
        torch.nn.Module.load_state_dict = original
    return captured


class _Stop(Exception):
    pass
