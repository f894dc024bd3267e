"""tapegrad.onnx (import, is_in_onnx_export, export refused) and load's environment overrides."""
import warnings

import pytest
import torch

import tapegrad
import tapegrad.onnx


def test_onnx_module_imports_and_export_raises():
    assert tapegrad.onnx.is_in_onnx_export() is torch.onnx.is_in_onnx_export() is False
    with pytest.raises(NotImplementedError, match="onnx.export: .*Linear"):
        tapegrad.onnx.export(tapegrad.nn.Linear(2, 2), (tapegrad.zeros(1, 2),), "m.onnx")


@pytest.mark.parametrize("lib", [torch, tapegrad])
def test_load_environment_overrides_as_pytorch(lib, tmp_path, monkeypatch):
    path = tmp_path / "m.pt"
    lib.save(lib.nn.Linear(2, 3), path)
    with pytest.raises(Exception, match="Weights only load failed"):
        lib.load(path)
    monkeypatch.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")
    with pytest.warns(UserWarning, match="TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD detected"):
        assert isinstance(lib.load(path), lib.nn.Linear)
    with pytest.raises(Exception, match="Weights only load failed"):  # explicit argument wins
        lib.load(path, weights_only=True)
    monkeypatch.setenv("TORCH_FORCE_WEIGHTS_ONLY_LOAD", "yes")
    with pytest.raises(RuntimeError, match="Only one of"):
        lib.load(path)
    monkeypatch.delenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD")
    with pytest.raises(Exception, match="Weights only load failed"):  # forced even if False
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            lib.load(path, weights_only=False)
