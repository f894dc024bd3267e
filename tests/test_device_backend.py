"""Devices (the cpu part): per-tensor devices read from the array's type, ``.to()``
round trips, ``tapegrad.cuda`` true to the machine, PyTorch's mixed-device error, and the seam
test: every op row run on a stand-in device (``fake_device``) must stay on it and agree with
the cpu, so an op that reaches numpy directly for device data fails here.
"""
import os
import sys

import numpy as np
import pytest
import torch

import tapegrad
from tapegrad import backend

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "gpu"))
import battery  # noqa: E402
import fake_device  # noqa: E402


@pytest.fixture
def fake():
    b = fake_device.install()
    try:
        yield b
    finally:
        fake_device.uninstall(b)


# --- without a device: PyTorch's CPU build --------------------------------------------------
def test_no_device_answers_as_pytorch_cpu_build():
    assert tapegrad.cuda.is_available() is torch.cuda.is_available() is False
    assert tapegrad.cuda.device_count() == torch.cuda.device_count() == 0
    tapegrad.cuda.manual_seed(1)
    tapegrad.cuda.manual_seed_all(1)
    x = tapegrad.ones(2)
    for f in (lambda: x.to("cuda"), lambda: x.cuda(), tapegrad.cuda.synchronize,
              tapegrad.cuda.current_device, lambda: tapegrad.zeros(2, device="cuda")):
        with pytest.raises(AssertionError, match="Torch not compiled with CUDA enabled"):
            f()
    assert x.device == tapegrad.device("cpu") and x.cpu() is x and x.to("cpu") is x


def test_array_module_is_numpy_for_host_data():
    a = np.ones(3)
    assert backend.array_module(a, 1.0, [1]) is np
    assert backend.array_module() is np
    assert backend.device_of(a) == tapegrad.device("cpu")
    assert backend.to_host(a) is a


# --- with the stand-in device ----------------------------------------------------------------
def test_cuda_queries_follow_the_backend(fake):
    assert tapegrad.cuda.is_available() and tapegrad.cuda.device_count() == 1
    assert tapegrad.cuda.current_device() == 0 and tapegrad.cuda.is_initialized()
    tapegrad.cuda.synchronize()
    tapegrad.cuda.manual_seed(7)
    tapegrad.cuda.manual_seed_all(8)
    assert fake.seeds == [7, 8]


def test_device_is_read_from_the_array(fake):
    x = tapegrad.arange(6.0).reshape(2, 3)
    y = x.to("cuda")
    assert type(y._data) is fake_device.FakeArray
    assert backend.array_module(y._data) is fake.xp
    assert backend.array_module(x._data, y._data) is fake.xp
    assert y.device == tapegrad.device("cuda", 0) and str(y.device) == "cuda:0"
    assert y.is_cuda and not y.is_cpu and y.get_device() == 0
    assert x.device == tapegrad.device("cpu") and x.get_device() == -1
    assert y.type() == "torch.cuda.FloatTensor"
    assert (y * 2).device == y.device and y.sum().device == y.device


def test_to_round_trips(fake):
    x = tapegrad.randn(3, 4, dtype=tapegrad.float64)
    y = x.to("cuda")
    assert y.to("cuda") is y and y.cuda() is y and y.to(tapegrad.device("cuda:0")) is y
    for back in (y.cpu(), y.to("cpu"), y.to(device="cpu")):
        assert type(back._data) is np.ndarray
        np.testing.assert_array_equal(back.numpy(), x.numpy())
    z = x.cuda()
    assert z.device.type == "cuda" and z._data is not x._data
    w = x.to("cuda", tapegrad.float32)
    assert w.device.type == "cuda" and w.dtype is tapegrad.float32
    assert y.to(x).device.type == "cpu" and x.to(y).device.type == "cuda"  # dtype and device
    assert y.to(x.float()).dtype is tapegrad.float32
    with pytest.raises(RuntimeError, match="invalid device ordinal"):
        x.to("cuda:1")


def test_to_is_differentiable_across_devices(fake):
    x = tapegrad.randn(3, 4, dtype=tapegrad.float64, requires_grad=True)
    y = x.to("cuda")
    assert y.requires_grad and y.grad_fn is not None
    (y * y).sum().backward()
    assert x.grad.device.type == "cpu"
    np.testing.assert_allclose(x.grad.numpy(), 2 * x.detach().numpy(), rtol=1e-15)
    leaf = tapegrad.randn(2, dtype=tapegrad.float64).cuda().requires_grad_()
    (leaf.cpu() * 3).sum().backward()
    assert leaf.grad.device.type == "cuda"
    np.testing.assert_array_equal(leaf.grad.cpu().numpy(), [3.0, 3.0])


def test_host_only_conversions_refuse_device_tensors(fake):
    y = tapegrad.ones(2).cuda()
    with pytest.raises(TypeError, match="can't convert cuda:0 device type tensor to numpy"):
        y.numpy()
    with pytest.raises(TypeError, match="Use Tensor.cpu"):
        np.asarray(y)
    assert y.tolist() == [1.0, 1.0] and y.sum().item() == 2.0
    assert "tensor([1., 1.]" in repr(y)


def test_mixed_devices_raise_pytorchs_error(fake):
    a = tapegrad.ones(3)
    b = tapegrad.ones(3).cuda()
    msg = "Expected all tensors to be on the same device, but found at least two devices, "
    with pytest.raises(RuntimeError, match=msg + "cpu and cuda:0!"):
        a + b
    with pytest.raises(RuntimeError, match=msg + "cuda:0 and cpu!"):
        b * a
    with pytest.raises(RuntimeError, match=msg + "cpu and cuda:0!"):
        a.reshape(3, 1) @ b.reshape(1, 3)
    with pytest.raises(RuntimeError, match=msg):
        tapegrad.cat([b, a])


def test_factories_make_tensors_on_the_device(fake):
    tapegrad.manual_seed(0)
    host = tapegrad.randn(2, 3)
    tapegrad.manual_seed(0)
    made = {
        "zeros": tapegrad.zeros(2, 3, device="cuda"),
        "ones": tapegrad.ones(2, device=tapegrad.device("cuda", 0)),
        "full": tapegrad.full((2,), 3.0, device="cuda:0"),
        "arange": tapegrad.arange(4, device="cuda"),
        "linspace": tapegrad.linspace(0, 1, 5, device="cuda"),
        "eye": tapegrad.eye(3, device="cuda"),
        "tensor": tapegrad.tensor([1.0, 2.0], device="cuda", requires_grad=True),
        "as_tensor": tapegrad.as_tensor(np.arange(3), device="cuda"),
        "randn": tapegrad.randn(2, 3, device="cuda"),
        "zeros_like": tapegrad.zeros_like(host, device="cuda"),
    }
    for name, t in made.items():
        assert t.device == tapegrad.device("cuda", 0), name
    assert made["tensor"].is_leaf and made["tensor"].requires_grad
    np.testing.assert_array_equal(made["randn"].cpu().numpy(), host.numpy())  # host stream
    np.testing.assert_array_equal(made["arange"].cpu().numpy(), [0, 1, 2, 3])
    with pytest.raises(RuntimeError, match="zeros: .*invalid device ordinal"):
        tapegrad.zeros(2, device="cuda:3")


def test_optimizer_updates_stay_on_the_device(fake):
    torch.manual_seed(0)
    ref = torch.nn.Linear(4, 3).double()
    lin = tapegrad.nn.Linear(4, 3).double()
    lin.weight.data = tapegrad.tensor(ref.weight.detach().numpy().copy()).cuda()
    lin.bias.data = tapegrad.tensor(ref.bias.detach().numpy().copy()).cuda()
    x = np.random.default_rng(0).standard_normal((5, 4))
    for opt_t, opt in ((torch.optim.SGD, tapegrad.optim.SGD), (torch.optim.Adam,
                                                               tapegrad.optim.Adam)):
        o_ref = opt_t(ref.parameters(), lr=0.1)
        o = opt(lin.parameters(), lr=0.1)
        for _ in range(3):
            o_ref.zero_grad()
            o.zero_grad()
            ref(torch.tensor(x)).pow(2).sum().backward()
            lin(tapegrad.tensor(x).cuda()).pow(2).sum().backward()
            o_ref.step()
            o.step()
        assert lin.weight.device.type == "cuda" and lin.weight.grad.device.type == "cuda"
        np.testing.assert_allclose(lin.weight.cpu().detach().numpy(),
                                   ref.weight.detach().numpy(), rtol=1e-12, atol=1e-14)


def test_layers_made_on_the_device(fake):
    tapegrad.manual_seed(0)
    on_cuda = [tapegrad.nn.Linear(3, 2, device="cuda"), tapegrad.nn.Conv2d(1, 2, 3, device="cuda"),
               tapegrad.nn.Embedding(5, 2, device="cuda"), tapegrad.nn.LayerNorm(4, device="cuda")]
    tapegrad.manual_seed(0)
    on_cpu = [tapegrad.nn.Linear(3, 2), tapegrad.nn.Conv2d(1, 2, 3), tapegrad.nn.Embedding(5, 2),
              tapegrad.nn.LayerNorm(4)]
    for a, b in zip(on_cuda, on_cpu):
        for (k, v), w in zip(a.state_dict().items(), b.state_dict().values()):
            assert v.device.type == "cuda", (type(a).__name__, k)
            np.testing.assert_array_equal(v.cpu().numpy(), w.numpy())  # the same init draws


def test_optimizer_state_follows_the_parameters(fake):
    lin = tapegrad.nn.Linear(3, 2).cuda()
    opt = tapegrad.optim.Adam(lin.parameters())
    lin(tapegrad.randn(4, 3).cuda()).sum().backward()
    opt.step()
    state = opt.state_dict()
    for s in state["state"].values():  # saved from the cpu, as a checkpoint loaded there
        s.update({k: v.cpu() for k, v in s.items() if k != "step"})
    again = tapegrad.optim.Adam(lin.parameters())
    again.load_state_dict(state)
    st = again.state[lin.weight]
    assert st["exp_avg"].device.type == "cuda" and st["step"].device.type == "cpu"  # PyTorch's
    again.step()
    assert lin.weight.device.type == "cuda"


# --- the seam test -----------------------------------------------------------------------------
ROWS = battery.rows()
KNOWN = battery.KNOWN


@pytest.mark.parametrize("name,fn,specs,kw", ROWS, ids=[r[0] for r in ROWS])
def test_ops_stay_on_the_device(fake, name, fn, specs, kw):
    if name in KNOWN:
        with pytest.raises((AssertionError, RuntimeError, TypeError)):
            battery.run(fn, specs, "cuda", kw)
        return
    battery.run(fn, specs, "cuda", kw)


def test_random_like_follows_the_input(fake):
    x = tapegrad.ones(3, 4).cuda()
    tapegrad.manual_seed(0)
    r = tapegrad.randn_like(x, requires_grad=True)
    tapegrad.manual_seed(0)
    ref = tapegrad.randn(3, 4)
    assert r.device.type == "cuda" and r.is_leaf and r.requires_grad
    np.testing.assert_array_equal(r.detach().cpu().numpy(), ref.numpy())  # the host stream
    assert tapegrad.zeros_like(x, device="cuda:0").device.type == "cuda"
    assert tapegrad.zeros_like(x, device="cpu").device.type == "cpu"


def test_the_fake_device_catches_host_arrays(fake):
    """The stand-in fails an op that builds a host array for device data (the seam test's
    premise): numpy's own zeros meeting a device array raises."""
    y = tapegrad.ones(3).cuda()
    with pytest.raises(TypeError, match="host numpy array"):
        y._data + np.zeros(3)
    with pytest.raises(AssertionError, match="left the device"):
        battery.run(lambda T, a: T.tensor(a.detach().cpu().numpy()), [(3,)], "cuda")


def test_module_to_cuda_and_back(fake):
    lin = tapegrad.nn.Linear(3, 2)
    bn = tapegrad.nn.BatchNorm1d(2)
    model = tapegrad.nn.Sequential(lin, bn)
    w = lin.weight
    before = {k: v.clone() for k, v in model.state_dict().items()}
    assert model.cuda() is model and lin.weight is w  # parameters keep their identity
    for k, v in model.state_dict().items():
        assert v.device.type == "cuda", k
        np.testing.assert_array_equal(v.cpu().numpy(), before[k].numpy())
    out = model(tapegrad.randn(4, 3).cuda())
    assert out.device.type == "cuda"
    model.to("cpu", tapegrad.float64)
    assert all(v.device.type == "cpu" for v in model.state_dict().values())
    assert lin.weight.dtype is tapegrad.float64


def test_printing_and_saving_go_through_the_host(fake, tmp_path):
    y = tapegrad.tensor([1.5, 2.0], dtype=tapegrad.float64).cuda()
    ref = torch.tensor([1.5, 2.0], dtype=torch.float64)
    # PyTorch prints a cuda tensor as its cpu copy plus device='cuda:0' before the dtype
    want = repr(ref).replace("torch.", "tapegrad.")
    assert repr(y) == want.replace("2.0000], ", "2.0000], device='cuda:0', ")
    path = tmp_path / "t.pt"
    tapegrad.save({"y": y}, path)
    back = tapegrad.load(path)["y"]
    assert back.device.type == "cpu"
    np.testing.assert_array_equal(back.numpy(), [1.5, 2.0])
