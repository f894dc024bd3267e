"""tapegrad.save/load (PyTorch's format, the older tapegrad format, atomic writes, corruption
errors), safetensors interop, and bit-exact training resume through a checkpoint."""
import collections
import io
import os
import pickle
import subprocess
import sys
import zipfile

import numpy as np
import pytest
import torch

import tapegrad
from tapegrad import io as tio
from tapegrad import optim
from tapegrad.nn.parameter import Parameter
from tapegrad.optim import lr_scheduler

try:
    import ml_dtypes
except ImportError:  # pragma: no cover
    ml_dtypes = None


def _tensors():
    rng = np.random.default_rng(0)
    out = {
        "f64": tapegrad.tensor(rng.standard_normal((2, 3))),
        "f32": tapegrad.tensor(rng.standard_normal(4).astype(np.float32)),
        "f16": tapegrad.tensor(rng.standard_normal(3).astype(np.float16)),
        "i64": tapegrad.tensor(np.arange(5)),
        "i32": tapegrad.tensor(np.arange(3, dtype=np.int32)),
        "u8": tapegrad.tensor(np.arange(4, dtype=np.uint8)),
        "bool": tapegrad.tensor(np.array([True, False])),
        "scalar": tapegrad.tensor(np.float64(3.5)),
        "strided": tapegrad.tensor(np.arange(12.0).reshape(3, 4)).T,
    }
    if ml_dtypes is not None:
        out["bf16"] = tapegrad.tensor(rng.standard_normal(5)).to(tapegrad.bfloat16)
    return out


def _same(a, b):
    assert type(a) is type(b), (type(a), type(b))
    if isinstance(a, tapegrad.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape and a.requires_grad == b.requires_grad
        np.testing.assert_array_equal(np.asarray(a._data), np.asarray(b._data))
    elif isinstance(a, np.ndarray):
        assert a.dtype == b.dtype
        np.testing.assert_array_equal(a, b)
    elif isinstance(a, dict):
        assert list(a) == list(b)
        for k in a:
            _same(a[k], b[k])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            _same(x, y)
    elif isinstance(a, float) and a != a:
        assert b != b
    else:
        assert a == b


def test_round_trip_of_nested_state(tmp_path):
    shared = tapegrad.tensor(np.ones(3), requires_grad=True)
    obj = {
        "tensors": _tensors(),
        "param": Parameter(tapegrad.tensor(np.arange(3.0))),
        "frozen": Parameter(tapegrad.tensor(np.arange(2.0)), requires_grad=False),
        "shared": [shared, shared],
        0: {"step": 3, "lr": 1e-3, "betas": (0.9, 0.999), "flags": [True, None]},
        "numbers": [float("inf"), -float("inf"), float("nan"), 2**80, -7, 1 + 2j],
        "text": ("héllo", b"\x00\xffbytes"),
        "ordered": collections.OrderedDict([("b", 1), ("a", 2)]),
        "counter": collections.Counter([10, 30, 30]),
        "array": np.arange(6, dtype=np.int16).reshape(2, 3),
        "np_scalar": np.float32(1.25),
        "dtype": tapegrad.float16,
        "rng": tapegrad.get_rng_state(),
        (1, 2): "tuple key",
    }
    path = tmp_path / "state.pt"
    tapegrad.save(obj, path)
    with pytest.raises(pickle.UnpicklingError, match="numpy"):  # numpy objects: not weights
        tapegrad.load(path)
    back = tapegrad.load(path, weights_only=False)
    _same(obj, back)
    legacy = tmp_path / "state.tg"  # tapegrad's older JSON + .npy format still loads
    tio._save_legacy(obj, legacy)
    legacy_back = tapegrad.load(legacy)
    _same(obj, legacy_back)
    assert legacy_back["shared"][0] is legacy_back["shared"][1]
    assert isinstance(back["param"], Parameter) and back["param"].requires_grad
    assert isinstance(back["frozen"], Parameter) and not back["frozen"].requires_grad
    assert back["shared"][0] is back["shared"][1]
    assert isinstance(back["ordered"], collections.OrderedDict)
    assert isinstance(back["counter"], collections.Counter) and back["counter"][30] == 2
    # a binary file object works too (no atomicity there: the caller owns the file)
    buf = io.BytesIO()
    tapegrad.save(obj, buf)
    buf.seek(0)
    _same(obj, tapegrad.load(buf, weights_only=False))


def test_unsupported_objects_raise_before_touching_the_file(tmp_path):
    path = tmp_path / "x.pt"
    with pytest.raises(TypeError, match="cannot pickle 'generator'"):
        tapegrad.save({"a": [1, (i for i in [])]}, path)
    with pytest.raises(pickle.PicklingError, match="lambda"):
        tapegrad.save({"f": lambda: 0}, path)
    with pytest.raises(RuntimeError, match="legacy pre-1.6 format"):
        tapegrad.save({"w": 1}, path, _use_new_zipfile_serialization=False)
    assert not path.exists() and os.listdir(tmp_path) == []


def test_failed_write_keeps_the_previous_file(tmp_path, monkeypatch):
    path = tmp_path / "ckpt.tg"
    tapegrad.save({"w": tapegrad.tensor(np.zeros(3))}, path)
    before = path.read_bytes()

    def failing(f, data, disable_byteorder_record=False):
        f.write(b"PK\x03\x04 half a checkpoint")
        raise OSError("disk full (simulated)")

    monkeypatch.setattr(tapegrad.serialization, "_write_zip", failing)
    with pytest.raises(OSError, match="simulated"):
        tapegrad.save({"w": tapegrad.tensor(np.ones(3)), "v": tapegrad.tensor(np.ones(2))}, path)
    assert path.read_bytes() == before
    assert os.listdir(tmp_path) == ["ckpt.tg"]  # the temporary file was removed
    assert tapegrad.load(path)["w"].tolist() == [0.0, 0.0, 0.0]


def test_crash_mid_write_keeps_the_previous_file(tmp_path):
    path = tmp_path / "ckpt.tg"
    tapegrad.save({"w": tapegrad.tensor(np.zeros(3))}, path)
    before = path.read_bytes()
    script = (
        "import os, numpy as np, tapegrad\n"
        "from tapegrad import serialization\n"
        "def crash(f, data, disable_byteorder_record=False):\n"
        "    f.write(b'PK\\x03\\x04 half a checkpoint')\n"
        "    os._exit(3)  # the process dies mid-write: no cleanup, no exception handling\n"
        "serialization._write_zip = crash\n"
        f"tapegrad.save({{'w': tapegrad.tensor(np.ones(300000))}}, {str(path)!r})\n")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True)
    assert proc.returncode == 3, proc.stderr.decode()
    assert path.read_bytes() == before
    leftovers = [n for n in os.listdir(tmp_path) if n != "ckpt.tg"]
    assert all(n.startswith(".ckpt.tg.") and n.endswith(".tmp") for n in leftovers)


def test_corrupt_truncated_and_foreign_files_raise_naming_the_path(tmp_path):
    path = tmp_path / "ckpt.tg"
    tapegrad.save({"w": tapegrad.tensor(np.arange(1000.0))}, path)
    data = path.read_bytes()
    truncated = tmp_path / "truncated.tg"
    truncated.write_bytes(data[: len(data) // 2])
    with pytest.raises(RuntimeError, match=r"truncated\.tg is not a valid checkpoint"):
        tapegrad.load(truncated)
    corrupt = tmp_path / "corrupt.tg"
    flipped = bytearray(data)
    flipped[len(data) // 2] ^= 0xFF  # inside the array's bytes: only the CRC can tell
    corrupt.write_bytes(bytes(flipped))
    with pytest.raises(RuntimeError, match=r"corrupt\.tg .*Bad CRC-32"):
        tapegrad.load(corrupt)
    garbage = tmp_path / "garbage.tg"
    garbage.write_bytes(b"not a checkpoint at all")
    with pytest.raises(RuntimeError, match="garbage.tg"):
        tapegrad.load(garbage)
    torch_file = tmp_path / "torch.pt"  # PyTorch's own files are read now
    torch.save({"w": torch.arange(2.0)}, torch_file)
    assert tapegrad.load(torch_file)["w"].tolist() == [0.0, 1.0]
    with pytest.raises(FileNotFoundError):
        tapegrad.load(tmp_path / "missing.tg")


class _Evil:
    def __reduce__(self):
        return (os.system, ("touch pwned",))


def test_loading_never_runs_code_from_the_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "evil.tg"
    with zipfile.ZipFile(path, "w") as z:  # a hand-made file with a pickled object array
        z.writestr("tapegrad/format", b"tapegrad-checkpoint 1")
        z.writestr("tapegrad/object.json", '{"$ndarray": 0, "dtype": null}')
        buf = io.BytesIO()
        np.save(buf, np.array([_Evil()], dtype=object), allow_pickle=True)
        z.writestr("tapegrad/arrays/0.npy", buf.getvalue())
    with pytest.raises(RuntimeError, match="evil.tg is not a valid"):
        tapegrad.load(path)
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("tapegrad/format", b"tapegrad-checkpoint 1")
        z.writestr("tapegrad/object.json", '{"$pickle": "%s"}' % pickle.dumps(_Evil()).hex())
    with pytest.raises(RuntimeError, match="unknown tag"):
        tapegrad.load(path)
    assert not (tmp_path / "pwned").exists()


def test_optimizer_and_scheduler_state_round_trip(tmp_path):
    p = tapegrad.tensor(np.ones(3), requires_grad=True)
    opt = optim.Adam([p], lr=0.1, amsgrad=True)
    sched = lr_scheduler.MultiStepLR(opt, milestones=[2, 4, 4])
    for _ in range(3):
        (p * p).sum().backward()
        opt.step()
        sched.step()
    tapegrad.save({"opt": opt.state_dict(), "sched": sched.state_dict()}, tmp_path / "s.tg")
    back = tapegrad.load(tmp_path / "s.tg")
    _same(opt.state_dict(), back["opt"])
    _same(sched.state_dict(), back["sched"])
    assert back["opt"]["state"][0]["step"].dtype == tapegrad.float32


# --- safetensors -------------------------------------------------------------------------------
def test_safetensors_written_by_tapegrad_read_by_torch(tmp_path):
    from safetensors import safe_open
    from safetensors.torch import load_file as torch_load_file

    tensors = _tensors()
    path = tmp_path / "model.safetensors"
    tapegrad.safetensors.save_file(tensors, path, metadata={"format": "pt", "who": "tapegrad"})
    theirs = torch_load_file(path)
    assert set(theirs) == set(tensors)
    for k, t in tensors.items():
        got = theirs[k]
        assert str(got.dtype) == f"torch.{t.dtype.name}", k
        want = np.asarray(t._data)
        if t.dtype.name == "bfloat16":
            np.testing.assert_array_equal(got.float().numpy(), want.astype(np.float32))
        else:
            np.testing.assert_array_equal(got.numpy(), want)
    with safe_open(path, framework="pt") as f:
        assert f.metadata() == {"format": "pt", "who": "tapegrad"}


def test_safetensors_written_by_torch_read_by_tapegrad(tmp_path):
    from safetensors.torch import save_file as torch_save_file

    g = torch.Generator().manual_seed(0)
    theirs = {"w": torch.randn(3, 4, generator=g, dtype=torch.float64),
              "h": torch.randn(5, generator=g).half(), "i": torch.arange(4),
              "b": torch.tensor([True, False]), "s": torch.tensor(2.5)}
    if ml_dtypes is not None:
        theirs["bf"] = torch.randn(6, generator=g).bfloat16()
    path = tmp_path / "torch.safetensors"
    torch_save_file(theirs, path)
    ours = tio.load_file(path)
    assert set(ours) == set(theirs)
    for k, t in theirs.items():
        assert ours[k].dtype.name == str(t.dtype).split(".")[-1], k
        assert ours[k].shape == tuple(t.shape)
        if t.dtype == torch.bfloat16:
            np.testing.assert_array_equal(ours[k]._data.astype(np.float32), t.float().numpy())
        else:
            np.testing.assert_array_equal(ours[k].numpy(), t.numpy())
    ours["w"].add_(1.0)  # loaded tensors own writable memory


def test_safetensors_errors(tmp_path):
    with pytest.raises(TypeError, match="'w' is a list"):
        tio.save_file({"w": [1.0]}, tmp_path / "a.safetensors")
    with pytest.raises(TypeError, match="keys must be str"):
        tio.save_file({1: tapegrad.tensor([1.0])}, tmp_path / "a.safetensors")
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json}")
    with pytest.raises(RuntimeError, match="bad.safetensors is not a valid safetensors file"):
        tio.load_file(bad)
    assert not (tmp_path / "a.safetensors").exists()


# --- resume ------------------------------------------------------------------------------------
def _train(steps, resume_from=None, save_to=None, save_at=None):
    """Adam + cosine schedule on a tiny regression with random minibatches and noise."""
    rng = np.random.default_rng(5)
    x_all = tapegrad.tensor(rng.standard_normal((64, 3)))
    y_all = tapegrad.tensor(rng.standard_normal((64, 1)))
    tapegrad.manual_seed(11)
    w = tapegrad.randn(3, 4, dtype=tapegrad.float64).requires_grad_()
    v = tapegrad.randn(4, 1, dtype=tapegrad.float64).requires_grad_()
    noise = tapegrad.Generator().manual_seed(2)
    opt = optim.Adam([{"params": [w]}, {"params": [v], "lr": 0.02}], lr=0.05, amsgrad=True)
    sched = lr_scheduler.CosineAnnealingLR(opt, T_max=30, eta_min=1e-3)
    start = 0
    if resume_from is not None:
        ckpt = tapegrad.load(resume_from)
        w = ckpt["params"][0].requires_grad_()
        v = ckpt["params"][1].requires_grad_()
        opt = optim.Adam([{"params": [w]}, {"params": [v], "lr": 0.02}], lr=0.05, amsgrad=True)
        sched = lr_scheduler.CosineAnnealingLR(opt, T_max=30, eta_min=1e-3)
        sched.load_state_dict(ckpt["sched"])
        opt.load_state_dict(ckpt["opt"])
        tapegrad.set_rng_state(ckpt["rng"])
        noise.set_state(ckpt["noise"])
        start = ckpt["step"]
    losses = []
    for step in range(start, steps):
        if step == save_at:
            tapegrad.save({"params": [w.detach(), v.detach()], "opt": opt.state_dict(),
                           "sched": sched.state_dict(), "rng": tapegrad.get_rng_state(),
                           "noise": noise.get_state(), "step": step}, save_to)
        idx = tapegrad.randperm(64)[:16]
        x = x_all[idx] + tapegrad.randn(16, 3, generator=noise, dtype=tapegrad.float64) * 0.01
        r = tapegrad.tanh(x @ w) @ v - y_all[idx]
        loss = (r * r).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        losses.append(loss.item())
    return losses, [w.detach().numpy().copy(), v.detach().numpy().copy()]


def test_resume_through_a_checkpoint_is_bit_identical(tmp_path):
    path = tmp_path / "resume.tg"
    straight, params = _train(80, save_to=path, save_at=40)
    resumed, resumed_params = _train(80, resume_from=path)
    assert resumed == straight[40:]  # exact equality, not closeness
    for a, b in zip(params, resumed_params):
        assert np.array_equal(a, b)
    assert straight[-1] < straight[0]
