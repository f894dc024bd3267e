"""tapegrad.save/load in PyTorch's own zip format: files written by torch.save load in tapegrad and
files written by tapegrad.save load in torch.load(weights_only=True); weights_only semantics,
safe globals and whole-object saves."""
import collections
import dataclasses
import os
import pickle
import zipfile

import numpy as np
import pytest
import torch

import tapegrad
from tapegrad import nn, optim, serialization
from tapegrad.nn.parameter import Parameter


def _as_numpy(t):
    if isinstance(t, torch.Tensor):
        return t.detach().float().numpy() if t.dtype == torch.bfloat16 else t.detach().numpy()
    a = np.asarray(t._data)
    return a.astype(np.float32) if t.dtype == tapegrad.bfloat16 else a


def _same_tree(ours, theirs):
    """tapegrad's object vs torch's: tensors by dtype, shape, strides and values."""
    if isinstance(theirs, torch.Tensor):
        assert isinstance(ours, tapegrad.Tensor), type(ours)
        assert ours.dtype.name == str(theirs.dtype).split(".")[1]
        assert ours.shape == tuple(theirs.shape)
        assert ours.requires_grad == theirs.requires_grad
        assert isinstance(ours, Parameter) == isinstance(theirs, torch.nn.Parameter)
        np.testing.assert_array_equal(_as_numpy(ours), _as_numpy(theirs))
    elif isinstance(theirs, torch.dtype):
        assert ours is getattr(tapegrad, str(theirs).split(".")[1])
    elif isinstance(theirs, dict):
        assert type(ours) is type(theirs) and list(ours) == list(theirs)
        for k in theirs:
            _same_tree(ours[k], theirs[k])
    elif isinstance(theirs, (list, tuple)):
        assert type(ours) is type(theirs) and len(ours) == len(theirs)
        for a, b in zip(ours, theirs):
            _same_tree(a, b)
    elif isinstance(theirs, float) and theirs != theirs:
        assert ours != ours
    else:
        assert type(ours) is type(theirs) and ours == theirs


def _every_dtype_torch():
    g = torch.Generator().manual_seed(0)
    base = torch.randn(4, 6, generator=g, dtype=torch.float64)
    return {"f64": base, "f32": base.float(), "f16": base.half(), "bf16": base.bfloat16(),
            "i64": torch.arange(6), "i32": torch.arange(6, dtype=torch.int32),
            "i16": torch.arange(3, dtype=torch.int16), "i8": torch.arange(-2, 2, dtype=torch.int8),
            "u8": torch.arange(5, dtype=torch.uint8), "bool": base > 0,
            "scalar": torch.tensor(2.5), "empty": torch.zeros(0, 3)}


# --- torch -> tapegrad -------------------------------------------------------------------------
def test_torch_checkpoint_loads_in_tapegrad(tmp_path):
    tensors = _every_dtype_torch()
    base = tensors["f64"]
    views = {"T": base.T, "row": base[1], "cols": base[:, 1::2], "window": base[1:3, 2:5],
             "expanded": torch.arange(3.0).expand(4, 3)}
    ckpt = {"epoch": 7, "step": 2**40, "loss": 0.125, "nan": float("nan"), "name": "run-1",
            "flags": [True, False, None], "betas": (0.9, 0.999), "blob": b"\x00\xff",
            "ids": {3, 4}, "z": 1 - 2j, "dtype": torch.bfloat16,
            "meta": collections.OrderedDict([("b", [1, {"deep": (2, [3])}]), ("a", "x")]),
            "tensors": tensors, "views": views, "base": base,
            "param": torch.nn.Parameter(torch.ones(2, 3)),
            "frozen": torch.nn.Parameter(torch.zeros(2), requires_grad=False),
            "grad": torch.ones(2, requires_grad=True)}
    path = tmp_path / "ckpt.pt"
    torch.save(ckpt, path)
    ours = tapegrad.load(path)
    _same_tree(ours, ckpt)
    # views keep sharing one storage, with PyTorch's strides
    assert ours["views"]["cols"]._data.strides == tuple(8 * s for s in views["cols"].stride())
    ours["base"].add_(100.0)
    assert ours["views"]["T"][0, 1].item() == ours["base"][1, 0].item()
    assert ours["views"]["window"][0, 0].item() == ours["base"][1, 2].item()
    assert ours["views"]["row"][3].item() == base[1, 3].item() + 100.0
    # map_location as PyTorch takes it
    for ml in ("cpu", tapegrad.tensor(0).device, {"cpu": "cpu"}, lambda storage, loc: storage,
               lambda storage, loc: None):
        _same_tree(tapegrad.load(path, map_location=ml)["tensors"], tensors)
    with pytest.raises(RuntimeError, match="CPU only"):
        tapegrad.load(path, map_location={"cpu": "cuda:0"})


def test_torch_file_from_a_buffer_and_big_endian_record(tmp_path):
    import io

    buf = io.BytesIO()
    torch.save({"w": torch.arange(4.0, dtype=torch.float64)}, buf)
    buf.seek(0)
    assert tapegrad.load(buf)["w"].tolist() == [0.0, 1.0, 2.0, 3.0]
    # a file whose byteorder record says big-endian stores big-endian bytes
    src = zipfile.ZipFile(io.BytesIO(buf.getvalue()))
    path = tmp_path / "big.pt"
    with zipfile.ZipFile(path, "w") as z:
        for info in src.infolist():
            data = src.read(info)
            if info.filename.endswith("byteorder"):
                data = b"big"
            elif "/data/" in info.filename:
                data = np.frombuffer(data, "<f8").astype(">f8").tobytes()
            z.writestr(info.filename, data)
    assert tapegrad.load(path)["w"].tolist() == [0.0, 1.0, 2.0, 3.0]


# --- tapegrad -> torch -------------------------------------------------------------------------
def test_tapegrad_file_loads_in_torch_weights_only(tmp_path):
    rng = np.random.default_rng(1)
    base = tapegrad.tensor(rng.standard_normal((4, 6)))
    ours = {"f64": base, "f32": base.float(), "f16": base.to(tapegrad.float16),
            "bf16": base.to(tapegrad.bfloat16), "i64": tapegrad.arange(6),
            "i32": tapegrad.arange(6, dtype=tapegrad.int32), "u8": tapegrad.arange(3).to(
                tapegrad.uint8), "bool": base > 0, "scalar": tapegrad.tensor(2.5),
            "empty": tapegrad.zeros(0, 3), "T": base.T, "row": base[1], "cols": base[:, 1::2],
            "param": Parameter(tapegrad.ones(2, 3)), "epoch": 3, "lr": [1e-3, float("inf")],
            "meta": collections.OrderedDict(run=("a", None, b"\x01")), "ids": {1, 2},
            "z": 1j, "big": -(2**70), "dtype": tapegrad.float16}
    path = tmp_path / "ours.pt"
    tapegrad.save(ours, path)
    with zipfile.ZipFile(path) as z:
        names = z.namelist()
        assert names[0] == "archive/data.pkl" and "archive/version" in names
        assert "archive/byteorder" in names and "archive/data/0" in names
        for info in z.infolist():  # storages are 64-byte aligned, as torch writes them
            if "/data/" in info.filename:
                z.fp.seek(info.header_offset + 26)
                name_len, extra_len = np.frombuffer(z.fp.read(4), "<u2")
                assert (info.header_offset + 30 + name_len + extra_len) % 64 == 0
    theirs = torch.load(path, weights_only=True)
    _same_tree(ours, theirs)
    # tensors sharing memory in tapegrad share one storage in torch
    assert theirs["T"].untyped_storage().data_ptr() == theirs["f64"].untyped_storage().data_ptr()
    assert theirs["cols"].stride() == (6, 2) and theirs["cols"].storage_offset() == 1
    theirs["f64"].add_(1.0)
    assert theirs["row"][0].item() == theirs["f64"][1, 0].item()
    assert torch.load(path, weights_only=True, mmap=True)["cols"].stride() == (6, 2)


def _models():
    """(name, torch model, tapegrad model, input shape) of real layer stacks, float64."""
    return [
        ("cnn", lambda m: m.Sequential(m.Conv2d(1, 4, 3, padding=1, bias=False), m.BatchNorm2d(4),
                                       m.ReLU(), m.Conv2d(4, 6, 3, stride=2), m.Flatten(),
                                       m.Linear(6 * 3 * 3, 5)), (2, 1, 8, 8)),
        ("lstm", lambda m: m.LSTM(5, 7, num_layers=2, batch_first=True), (3, 4, 5)),
        ("attention", lambda m: m.MultiheadAttention(8, 2, batch_first=True), (2, 5, 8)),
        ("embed_norm", lambda m: m.Sequential(m.Embedding(10, 6), m.LayerNorm(6),
                                              m.Linear(6, 3)), None),
    ]


def _run(model, x, lib):
    if isinstance(model, (torch.nn.MultiheadAttention, nn.MultiheadAttention)):
        return model(x, x, x)[0]
    out = model(x)
    return out[0] if isinstance(out, tuple) else out


@pytest.mark.parametrize("name,make,shape", _models(), ids=[m[0] for m in _models()])
def test_model_state_dicts_round_trip_both_ways(tmp_path, name, make, shape):
    torch.manual_seed(0)
    theirs = make(torch.nn).double()
    tapegrad.manual_seed(1)
    ours = make(nn).double()
    if shape is None:
        xt = torch.tensor([[1, 4, 9], [0, 2, 2]])
    else:
        xt = torch.randn(*shape, dtype=torch.float64)
    xo = tapegrad.tensor(xt.numpy())
    # torch -> tapegrad
    torch.save(theirs.state_dict(), tmp_path / "torch.pt")
    sd = tapegrad.load(tmp_path / "torch.pt")
    assert list(sd) == list(theirs.state_dict())
    ours.load_state_dict(sd)
    np.testing.assert_allclose(_run(ours, xo, tapegrad).detach().numpy(),
                               _run(theirs, xt, torch).detach().numpy(), rtol=1e-12, atol=1e-12)
    # tapegrad -> torch, after tapegrad changed the weights
    with tapegrad.no_grad():
        for p in ours.parameters():
            p.mul_(0.5)
    tapegrad.save(ours.state_dict(), tmp_path / "ours.pt")
    theirs.load_state_dict(torch.load(tmp_path / "ours.pt", weights_only=True))
    np.testing.assert_allclose(_run(theirs, xt, torch).detach().numpy(),
                               _run(ours, xo, tapegrad).detach().numpy(), rtol=1e-12, atol=1e-12)


def _adam_pair(amsgrad):
    torch.manual_seed(0)
    tm = torch.nn.Linear(4, 3).double()
    om = nn.Linear(4, 3).double()
    om.load_state_dict({k: tapegrad.tensor(v.numpy().copy()) for k, v in tm.state_dict().items()})
    return (tm, torch.optim.Adam(tm.parameters(), lr=0.05, amsgrad=amsgrad),
            om, optim.Adam(om.parameters(), lr=0.05, amsgrad=amsgrad))


def _steps(model, opt, x, n):
    for _ in range(n):
        opt.zero_grad()
        (model(x) ** 2).sum().backward()
        opt.step()


def test_optimizer_state_and_checkpoint_round_trip_both_ways(tmp_path):
    x = np.random.default_rng(3).standard_normal((6, 4))
    xt, xo = torch.tensor(x), tapegrad.tensor(x)
    tm, topt, om, oopt = _adam_pair(amsgrad=True)
    sched = torch.optim.lr_scheduler.StepLR(topt, step_size=2, gamma=0.5)
    _steps(tm, topt, xt, 3)
    sched.step()
    torch.save({"epoch": 3, "model": tm.state_dict(), "optimizer": topt.state_dict(),
                "scheduler": sched.state_dict(), "history": [0.5, 0.25]}, tmp_path / "t.pt")
    ckpt = tapegrad.load(tmp_path / "t.pt")
    assert ckpt["epoch"] == 3 and ckpt["history"] == [0.5, 0.25]
    om.load_state_dict(ckpt["model"])
    oopt.load_state_dict(ckpt["optimizer"])
    _steps(tm, topt, xt, 2)
    _steps(om, oopt, xo, 2)
    for a, b in zip(om.parameters(), tm.parameters()):
        np.testing.assert_allclose(a.detach().numpy(), b.detach().numpy(), rtol=1e-12, atol=1e-14)
    # and back: tapegrad's optimizer state continues in torch
    tapegrad.save({"epoch": 5, "model": om.state_dict(), "optimizer": oopt.state_dict()},
                  tmp_path / "o.pt")
    back = torch.load(tmp_path / "o.pt", weights_only=True)
    assert back["epoch"] == 5 and back["optimizer"]["state"][0]["step"].dtype == torch.float32
    tm2, topt2, _, _ = _adam_pair(amsgrad=True)
    tm2.load_state_dict(back["model"])
    topt2.load_state_dict(back["optimizer"])
    _steps(tm2, topt2, xt, 2)
    _steps(om, oopt, xo, 2)
    for a, b in zip(om.parameters(), tm2.parameters()):
        np.testing.assert_allclose(a.detach().numpy(), b.detach().numpy(), rtol=1e-12, atol=1e-14)


# --- weights_only, safe globals, whole objects -------------------------------------------------
class _Evil:
    def __reduce__(self):
        return (os.system, ("touch pwned",))


class _EvalEvil:
    def __reduce__(self):
        return (eval, ("__import__('os').system('touch pwned2')",))


def test_malicious_pickles_are_refused_and_never_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    torch.save({"w": torch.zeros(2), "x": _Evil()}, tmp_path / "evil.pt")
    tapegrad.save({"x": _EvalEvil()}, tmp_path / "evil2.pt")  # tapegrad pickles it too
    for kwargs in ({}, {"weights_only": True}):
        blocked = r"(?s)evil\.pt.*GLOBAL posix\.system whose module posix is blocked"
        with pytest.raises(pickle.UnpicklingError, match=blocked):
            tapegrad.load(tmp_path / "evil.pt", **kwargs)
        with pytest.raises(pickle.UnpicklingError, match=r"GLOBAL eval was not an allowed"):
            tapegrad.load(tmp_path / "evil2.pt", **kwargs)
    with serialization.safe_globals([os.system]):  # blocked modules stay blocked
        with pytest.raises(pickle.UnpicklingError, match="blocked"):
            tapegrad.load(tmp_path / "evil.pt")
    with pytest.raises(RuntimeError, match="explicit pickle_module"):
        tapegrad.load(tmp_path / "evil.pt", pickle_module=pickle, weights_only=True)
    assert serialization.get_unsafe_globals_in_checkpoint(tmp_path / "evil2.pt") == [
        "builtins.eval"]
    assert not (tmp_path / "pwned").exists() and not (tmp_path / "pwned2").exists()


@dataclasses.dataclass
class RunConfig:
    lr: float
    layers: list


def test_safe_globals_allow_a_user_class(tmp_path):
    path = tmp_path / "cfg.pt"
    tapegrad.save({"config": RunConfig(0.1, [2, 3]), "w": tapegrad.ones(2)}, path)
    assert serialization.get_unsafe_globals_in_checkpoint(path) == [f"{__name__}.RunConfig"]
    with pytest.raises(pickle.UnpicklingError, match=rf"GLOBAL {__name__}\.RunConfig was not"):
        tapegrad.load(path)
    with serialization.safe_globals([RunConfig]):
        assert serialization.get_safe_globals() == [RunConfig]
        assert tapegrad.load(path)["config"] == RunConfig(0.1, [2, 3])
    assert serialization.get_safe_globals() == []
    serialization.add_safe_globals([(RunConfig, f"{__name__}.RunConfig")])
    try:
        assert tapegrad.load(path)["config"].layers == [2, 3]
        assert torch.load(path, weights_only=False)["config"] == RunConfig(0.1, [2, 3])
    finally:
        serialization.clear_safe_globals()
    assert serialization.get_safe_globals() == []


def test_whole_model_and_optimizer_save_and_load(tmp_path):
    tapegrad.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 3, 3), nn.BatchNorm2d(3), nn.ReLU(), nn.Flatten(),
                          nn.Linear(3 * 4 * 4, 2)).double()
    opt = optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x = tapegrad.randn(4, 1, 6, 6, dtype=tapegrad.float64)
    for _ in range(2):
        opt.zero_grad()
        model(x).pow(2).sum().backward()
        opt.step()
    path = tmp_path / "whole.pt"
    tapegrad.save({"model": model, "opt": opt, "epoch": 2}, path)
    with pytest.raises(pickle.UnpicklingError, match="Weights only load failed"):
        tapegrad.load(path)
    back = tapegrad.load(path, weights_only=False)
    model2, opt2 = back["model"], back["opt"]
    assert type(model2) is nn.Sequential and back["epoch"] == 2
    model.eval(), model2.eval()
    np.testing.assert_array_equal(model2(x).detach().numpy(), model(x).detach().numpy())
    assert opt2.param_groups[0]["params"][0] is next(model2.parameters())
    model.train(), model2.train()
    for m, o in ((model, opt), (model2, opt2)):  # training continues identically
        o.zero_grad()
        m(x).pow(2).sum().backward()
        o.step()
    for a, b in zip(model.parameters(), model2.parameters()):
        np.testing.assert_array_equal(a.detach().numpy(), b.detach().numpy())
    # torch reads the tensors of such a file only with tapegrad importable; its weights-only
    # loader refuses the tapegrad classes, as it should
    with pytest.raises(pickle.UnpicklingError, match="tapegrad"):
        torch.load(path, weights_only=True)


def test_pytorch_whole_module_files_explain_themselves(tmp_path):
    torch.save(torch.nn.Linear(2, 2), tmp_path / "module.pt")
    with pytest.raises(pickle.UnpicklingError, match="torch.nn.modules.linear.Linear"):
        tapegrad.load(tmp_path / "module.pt")
    with pytest.raises(RuntimeError, match=r"module\.pt .*save its state_dict\(\) instead"):
        tapegrad.load(tmp_path / "module.pt", weights_only=False)


def test_safetensors_path_and_unsupported_dtypes(tmp_path):
    from safetensors.torch import save_file

    save_file({"w": torch.arange(3.0)}, tmp_path / "w.safetensors")
    assert tapegrad.load(tmp_path / "w.safetensors")["w"].tolist() == [0.0, 1.0, 2.0]
    torch.save({"c": torch.zeros(2, dtype=torch.complex64)}, tmp_path / "complex.pt")
    with pytest.raises(RuntimeError, match=r"complex\.pt .*torch\.complex64.*not support"):
        tapegrad.load(tmp_path / "complex.pt")
