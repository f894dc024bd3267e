"""nn.Module: registration, traversal, state dicts, loading, conversion, hooks, repr, containers.

Module trees are built once by a function of the ``nn`` namespace and instantiated with both
``torch.nn`` and ``tapegrad.nn``, so names, orders and reprs are compared with PyTorch's.
"""
import copy
import pickle
from collections import OrderedDict

import numpy as np
import pytest
import torch

import tapegrad
import tapegrad.nn as tnn
from helpers import assert_close
from test_layers import compare


def tg_state(module):
    """A torch module's state dict as tapegrad tensors (through numpy)."""
    return OrderedDict((k, tapegrad.tensor(v.detach().numpy())) for k, v in
                       module.state_dict().items())


def both(build):
    return build(torch.nn), build(tnn)


# --- model zoo (each a function of the nn namespace) ------------------------------------
def mlp(nn):
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Dropout(0.1), nn.Linear(8, 8),
                         nn.Tanh(), nn.Linear(8, 3, bias=False))


def cnn(nn):
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.BatchNorm2d(8), nn.MaxPool2d(2),
        nn.Conv2d(8, 8, 3, stride=2, groups=2, bias=False), nn.GroupNorm(2, 8),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 10))


def block(nn):
    """A transformer-ish block with named submodules, a ModuleList and a ModuleDict."""

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(11, 8, padding_idx=0)
            self.ln1 = nn.LayerNorm(8)
            self.attn = nn.MultiheadAttention(8, 2, batch_first=True)
            self.ln2 = nn.RMSNorm(8)
            self.mlp = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 8))
            self.heads = nn.ModuleList([nn.Linear(8, 4) for _ in range(3)])
            self.extra = nn.ModuleDict({"proj": nn.Linear(8, 8), "norm": nn.LayerNorm(8)})
            lib = torch if nn is torch.nn else tapegrad
            self.register_buffer("scale", lib.ones(1))
            self.register_buffer("cache", lib.zeros(2), persistent=False)

        def forward(self, idx):
            x = self.embed(idx)
            h = self.ln1(x)
            x = x + self.attn(h, h, h, need_weights=False)[0]
            x = x + self.mlp(self.ln2(x))
            x = self.extra["norm"](self.extra["proj"](x))
            return sum(head(x) for head in self.heads) * self.scale

    return Block()


def recurrent(nn):
    class Seq(nn.Module):
        def __init__(self):
            super().__init__()
            self.lstm = nn.LSTM(3, 5, num_layers=2, bidirectional=True, batch_first=True)
            self.gru = nn.GRU(10, 4)
            self.rnn = nn.RNN(4, 4, nonlinearity="relu", bias=False)

    return Seq()


ZOO = [mlp, cnn, block, recurrent]


@pytest.mark.parametrize("build", ZOO, ids=lambda f: f.__name__)
def test_state_dict_keys_and_order_match_torch(build):
    th, tg = both(build)
    sd_th, sd_tg = th.state_dict(), tg.state_dict()
    assert isinstance(sd_tg, OrderedDict)
    assert list(sd_tg) == list(sd_th)
    for k in sd_th:
        assert tuple(sd_tg[k].shape) == tuple(sd_th[k].shape), k
        assert str(sd_tg[k].dtype).split(".")[-1] == str(sd_th[k].dtype).split(".")[-1], k
    assert [n for n, _ in tg.named_parameters()] == [n for n, _ in th.named_parameters()]
    assert [n for n, _ in tg.named_buffers()] == [n for n, _ in th.named_buffers()]
    assert [n for n, _ in tg.named_modules()] == [n for n, _ in th.named_modules()]
    assert [n for n, _ in tg.named_children()] == [n for n, _ in th.named_children()]


@pytest.mark.parametrize("build", ZOO, ids=lambda f: f.__name__)
def test_repr_matches_torch(build):
    th, tg = both(build)
    assert repr(tg) == repr(th)


def test_repr_nested_extra_repr_and_compressed_lists():
    def build(nn):
        class Custom(nn.Module):
            def __init__(self):
                super().__init__()
                self.inner = nn.Sequential(nn.Linear(2, 2), nn.LeakyReLU(0.2),
                                           nn.Sequential(nn.Softmax(dim=1), nn.LogSoftmax(1)))

            def extra_repr(self):
                return "first line\nsecond line"

        return nn.Sequential(OrderedDict([
            ("custom", Custom()),
            ("layers", nn.ModuleList([nn.Linear(3, 3)] * 2 + [nn.ReLU(), nn.ReLU(),
                                                            nn.Linear(3, 3)])),
            ("empty", nn.ModuleList()),
            ("convt", nn.ConvTranspose2d(2, 3, 3, stride=2, padding=1, output_padding=1)),
            ("c1", nn.Conv1d(2, 3, 3, dilation=2, padding="same")),
            ("bn", nn.BatchNorm1d(3, momentum=None, affine=False)),
            ("pool", nn.AvgPool2d(3, 2, 1)),
            ("un", nn.Unflatten(1, (2, 3))),
            ("gelu", nn.GELU("tanh")),
            ("silu", nn.SiLU()), ("sig", nn.Sigmoid()), ("id", nn.Identity(5, k=1)),
            ("bil", nn.Bilinear(2, 3, 4)), ("relu", nn.ReLU(inplace=True)),
            ("emb", nn.Embedding(5, 2, max_norm=1.0)),
            ("ln", nn.LayerNorm((2, 3), elementwise_affine=False)),
            ("mha", nn.MultiheadAttention(4, 2, kdim=3, vdim=5, bias=False)),
            ("gru", nn.GRU(2, 3, num_layers=3, dropout=0.5, bidirectional=True)),
            ("loss", nn.CrossEntropyLoss(label_smoothing=0.1)),
        ]))

    th, tg = both(build)
    assert repr(tg) == repr(th)


# --- registration and attribute routing -------------------------------------------------
def test_setattr_routes_parameters_modules_buffers():
    m = tnn.Module()
    p = tnn.Parameter(tapegrad.ones(2))
    m.w = p
    m.sub = tnn.Linear(2, 2)
    m.register_buffer("buf", tapegrad.zeros(2))
    m.plain = tapegrad.ones(3)  # a plain tensor is neither parameter nor buffer
    assert m._parameters["w"] is p and "w" not in m.__dict__
    assert m._modules["sub"] is m.sub
    assert list(m._buffers) == ["buf"]
    assert "plain" in m.__dict__ and "plain" not in m._buffers
    m.buf = tapegrad.ones(2)  # assigning a tensor to a buffer name replaces the buffer
    assert m._buffers["buf"]._data.tolist() == [1.0, 1.0]
    m.w = None
    assert m._parameters["w"] is None and m.w is None
    with pytest.raises(TypeError, match="cannot assign .* as parameter 'w'"):
        m.w = tapegrad.ones(2)
    with pytest.raises(TypeError, match="as child module 'sub'"):
        m.sub = 3
    m.sub = None
    assert m.sub is None and list(m.children()) == []
    m.sub = tnn.Parameter(tapegrad.ones(1))  # a parameter replaces the submodule
    assert "sub" in m._parameters and "sub" not in m._modules
    m.buf2 = tnn.Buffer(tapegrad.ones(1), persistent=False)
    assert "buf2" in m._buffers and "buf2" in m._non_persistent_buffers_set
    del m.buf, m.sub, m.plain
    assert "buf" not in m._buffers and "sub" not in m._parameters and "plain" not in m.__dict__
    with pytest.raises(AttributeError, match="'Module' object has no attribute 'nothing'"):
        m.nothing


def test_registration_errors():
    m = tnn.Linear(2, 2)
    with pytest.raises(KeyError, match="contain"):
        m.register_buffer("a.b", tapegrad.zeros(1))
    with pytest.raises(KeyError, match="empty"):
        m.register_parameter("", None)
    with pytest.raises(KeyError, match="already exists"):
        m.register_buffer("in_features", tapegrad.zeros(1))
    with pytest.raises(TypeError, match="buffer 'x'"):
        m.register_buffer("x", np.zeros(2))
    with pytest.raises(TypeError, match="parameter 'x'"):
        m.register_parameter("x", tapegrad.zeros(2))
    w = tapegrad.ones(2, requires_grad=True)
    with pytest.raises(ValueError, match="non-leaf"):
        m.register_parameter("x", _nonleaf_param(w))
    with pytest.raises(TypeError, match="is not a Module subclass"):
        m.add_module("x", 3)
    with pytest.raises(KeyError, match="contain"):
        m.add_module("a.b", tnn.ReLU())
    with pytest.raises(AttributeError, match="before Module.__init__"):
        class Bad(tnn.Module):
            def __init__(self):
                self.w = tnn.Parameter(tapegrad.ones(1))
        Bad()


def _nonleaf_param(w):
    p = tnn.Parameter(tapegrad.ones(2))
    p.grad_fn = (w * 2).grad_fn  # a Parameter that claims a history
    return p


def test_shared_parameters_and_modules_are_deduplicated():
    def build(nn):
        shared = nn.Linear(3, 3)
        net = nn.Sequential(shared, nn.ReLU(), shared, nn.Linear(3, 2))
        net[3].weight = net[0].weight  # tied across different modules
        return net

    th, tg = both(build)
    names = [n for n, _ in tg.named_parameters()]
    assert names == [n for n, _ in th.named_parameters()] == ["0.weight", "0.bias", "3.bias"]
    assert len(list(tg.parameters())) == 3
    assert ([n for n, _ in tg.named_parameters(remove_duplicate=False)]
            == [n for n, _ in th.named_parameters(remove_duplicate=False)])
    assert [n for n, _ in tg.named_modules()] == [n for n, _ in th.named_modules()]
    assert ([n for n, _ in tg.named_modules(remove_duplicate=False)]
            == [n for n, _ in th.named_modules(remove_duplicate=False)])
    # the state dict keeps every name (PyTorch does not dedupe it)
    assert list(tg.state_dict()) == list(th.state_dict())
    assert [n for n, _ in tg.named_parameters(prefix="model")] == [
        "model.0.weight", "model.0.bias", "model.3.bias"]
    assert [n for n, _ in tg.named_parameters(recurse=False)] == []
    assert [n for n, _ in tg[3].named_parameters(recurse=False)] == ["weight", "bias"]


def test_parameters_walk_is_named_parameters_order():
    """``parameters()`` walks the modules itself (no names): the same tensors in the same
    order as ``named_parameters()`` and PyTorch's, through nesting, a module met twice, a
    weight tied across modules, a None parameter and a subclass's own named_parameters."""
    def build(nn):
        shared = nn.Linear(2, 2)
        inner = nn.Sequential(nn.Linear(2, 3), shared, nn.Sequential(nn.Linear(3, 2)))
        net = nn.Sequential(inner, nn.ReLU(), shared, nn.Linear(2, 4, bias=False), inner[0])
        net[0][2][0].register_parameter("extra", None)
        net.add_module("tail", nn.Linear(3, 2))
        net.tail.weight = inner[2][0].weight  # tied across modules
        return net

    th, tg = both(build)
    got = list(tg.parameters())
    assert [id(p) for p in got] == [id(p) for _, p in tg.named_parameters()]
    assert len(got) == len(list(th.parameters())) == 8
    assert [tuple(p.shape) for p in got] == [tuple(p.shape) for p in th.parameters()]
    assert list(tg.parameters(recurse=False)) == []

    class Only(tnn.Module):  # its own named_parameters: parameters() follows it
        def __init__(self):
            super().__init__()
            self.a, self.b = tnn.Linear(1, 1), tnn.Linear(1, 1)

        def named_parameters(self, prefix="", recurse=True, remove_duplicate=True):
            return iter([("b.weight", self.b.weight)])

    o = Only()
    assert [id(p) for p in o.parameters()] == [id(o.b.weight)]


def test_buffers_persistence_and_state_dict():
    th, tg = both(block)
    assert [n for n, _ in tg.named_buffers()] == ["scale", "cache"]
    assert "cache" not in tg.state_dict() and "scale" in tg.state_dict()
    assert list(tg.state_dict()) == list(th.state_dict())


def test_state_dict_values_are_detached_and_share_storage():
    lin = tnn.Linear(3, 2)
    sd = lin.state_dict()
    assert type(sd["weight"]) is tapegrad.Tensor and not sd["weight"].requires_grad
    sd["weight"]._data[0, 0] = 123.0
    assert lin.weight._data[0, 0] == 123.0
    kept = lin.state_dict(keep_vars=True)
    assert kept["weight"] is lin.weight
    assert list(lin.state_dict(prefix="fc.")) == ["fc.weight", "fc.bias"]
    assert hasattr(sd, "_metadata") and sd._metadata[""] == {"version": 1}


def test_state_dict_hooks():
    lin = tnn.Linear(2, 2)
    seen = []
    lin.register_state_dict_pre_hook(lambda m, prefix, keep_vars: seen.append(prefix))

    def drop_bias(m, sd, prefix, meta):
        del sd[prefix + "bias"]

    h = lin.register_state_dict_post_hook(drop_bias)
    assert list(lin.state_dict()) == ["weight"] and seen == [""]
    h.remove()
    assert list(lin.state_dict()) == ["weight", "bias"]


# --- load_state_dict --------------------------------------------------------------------
@pytest.mark.parametrize("build", ZOO, ids=lambda f: f.__name__)
def test_load_torch_state_dict(build):
    th, tg = both(build)
    result = tg.load_state_dict(tg_state(th))
    assert result.missing_keys == [] and result.unexpected_keys == []
    assert repr(result) == "<All keys matched successfully>"
    for k, v in th.state_dict().items():
        assert_close(tg.state_dict()[k], v, rtol=0)


@pytest.mark.parametrize("build,inputs,train", [
    (mlp, [np.random.default_rng(0).standard_normal((5, 4))], False),
    (cnn, [np.random.default_rng(0).standard_normal((2, 3, 8, 8))], True),
    (block, [np.random.default_rng(0).integers(0, 11, (2, 5))], True),
], ids=["mlp", "cnn", "block"])
def test_whole_models_match_torch(build, inputs, train):
    """Loaded torch weights give the same outputs, gradients and (BatchNorm) buffers."""
    compare(build, inputs, train=train)


def test_load_copies_in_place_and_keeps_parameter_objects():
    th, tg = both(mlp)
    w = tg[0].weight
    version = w._version[0]
    sd = tg_state(th)
    tg.load_state_dict(sd)
    assert tg[0].weight is w and w._version[0] > version
    sd["0.weight"]._data[...] = 0  # no aliasing with the source
    assert np.any(w._data != 0)
    assert tg[0].weight.requires_grad


def test_load_strict_error_lists_everything_and_loads_nothing():
    th, tg = both(mlp)
    before = {k: v._data.copy() for k, v in tg.state_dict().items()}
    sd = tg_state(th)
    del sd["0.bias"], sd["5.weight"]
    sd["7.weight"] = tapegrad.zeros(3)
    sd["3.extra"] = tapegrad.zeros(3)
    sd["3.weight"] = tapegrad.zeros(8, 7)
    with pytest.raises(RuntimeError) as e:
        tg.load_state_dict(sd)
    msg = str(e.value)
    assert msg.startswith("Error(s) in loading state_dict for Sequential:")
    assert 'Missing key(s) in state_dict: "0.bias", "5.weight".' in msg
    assert 'Unexpected key(s) in state_dict: ' in msg
    assert '"7.weight"' in msg and '"3.extra"' in msg
    assert ("size mismatch for 3.weight: copying a param with shape (8, 7) from checkpoint, "
            "the shape in current model is (8, 8).") in msg
    for k, v in tg.state_dict().items():  # nothing was loaded
        np.testing.assert_array_equal(v._data, before[k])
    # torch reports the same keys
    with pytest.raises(RuntimeError) as te:
        th.load_state_dict({k: torch.tensor(v._data) for k, v in sd.items()})
    for key in ("0.bias", "5.weight", "7.weight", "3.extra", "3.weight"):
        assert key in str(te.value)


def test_load_non_strict_returns_keys_and_loads_the_rest():
    th, tg = both(mlp)
    sd = tg_state(th)
    del sd["0.bias"]
    sd["9.weight"] = tapegrad.zeros(1)
    result = tg.load_state_dict(sd, strict=False)
    th_result = th.load_state_dict({k: torch.tensor(v._data) for k, v in sd.items()},
                                   strict=False)
    assert result.missing_keys == th_result.missing_keys == ["0.bias"]
    assert result.unexpected_keys == th_result.unexpected_keys == ["9.weight"]
    assert_close(tg[0].weight, th[0].weight, rtol=0)
    missing, unexpected = result  # a named tuple, as PyTorch's
    assert missing == ["0.bias"]


def test_load_shape_mismatch_raises_even_when_not_strict():
    tg = tnn.Linear(3, 2)
    before = tg.weight._data.copy()
    with pytest.raises(RuntimeError, match="size mismatch for bias"):
        tg.load_state_dict({"weight": tapegrad.zeros(2, 3), "bias": tapegrad.zeros(3)},
                           strict=False)
    np.testing.assert_array_equal(tg.weight._data, before)


def test_load_errors_non_tensor_and_non_mapping():
    tg = tnn.Linear(3, 2)
    with pytest.raises(RuntimeError, match='parameter named "weight"'):
        tg.load_state_dict({"weight": np.zeros((2, 3)), "bias": tapegrad.zeros(2)})
    with pytest.raises(TypeError, match="dict-like"):
        tg.load_state_dict([("weight", tapegrad.zeros(2, 3))])


def test_load_casts_dtype_scalar_shape_and_assign():
    tg = tnn.Linear(3, 2)  # float32
    sd = {"weight": tapegrad.tensor(np.arange(6.0).reshape(2, 3)), "bias": tapegrad.zeros(2)}
    tg.load_state_dict(sd)
    assert tg.weight.dtype == tapegrad.float32 and tg.weight._data[1, 2] == 5.0
    bn = tnn.BatchNorm1d(2)
    state = bn.state_dict()
    state["num_batches_tracked"] = tapegrad.tensor([7])  # shape (1,) loads into a 0-d buffer
    bn.load_state_dict(state)
    assert bn.num_batches_tracked.item() == 7
    new_w = tapegrad.tensor(np.ones((2, 3)))
    tg.load_state_dict({"weight": new_w, "bias": tapegrad.zeros(2)}, assign=True)
    assert isinstance(tg.weight, tnn.Parameter) and tg.weight.requires_grad
    assert tg.weight.dtype == tapegrad.float64 and tg.weight._data is new_w._data


def test_batchnorm_loads_state_dicts_without_num_batches_tracked():
    bn = tnn.BatchNorm1d(3)
    bn.num_batches_tracked._data[...] = 4
    old = {"weight": tapegrad.ones(3), "bias": tapegrad.zeros(3),
           "running_mean": tapegrad.ones(3), "running_var": tapegrad.ones(3)}
    assert bn.load_state_dict(old).missing_keys == []  # no metadata: an old-version dict
    assert bn.num_batches_tracked.item() == 4 and bn.running_mean._data.tolist() == [1.0] * 3


def test_load_state_dict_post_hook():
    lin = tnn.Linear(2, 2)
    seen = []
    lin.register_load_state_dict_post_hook(lambda m, keys: seen.append(list(keys.missing_keys)))
    lin.load_state_dict(lin.state_dict())
    assert seen == [[]]


# --- modes, conversion, grads -----------------------------------------------------------
def test_train_eval_apply_and_zero_grad():
    th, tg = both(cnn)
    tg.eval()
    assert all(not m.training for m in tg.modules())
    tg.train()
    assert all(m.training for m in tg.modules())
    with pytest.raises(ValueError, match="boolean"):
        tg.train("yes")
    visited = []
    assert tg.apply(lambda m: visited.append(type(m).__name__)) is tg
    th_visited = []
    th.apply(lambda m: th_visited.append(type(m).__name__))
    assert visited == th_visited
    x = tapegrad.randn(2, 3, 8, 8)
    tg(x).sum().backward()
    assert all(p.grad is not None for p in tg.parameters())
    tg.zero_grad(set_to_none=False)
    assert all(p.grad is not None and not np.any(p.grad._data) for p in tg.parameters())
    tg.zero_grad()
    assert all(p.grad is None for p in tg.parameters())


def test_to_double_float_half_keep_parameter_objects():
    bn = tnn.BatchNorm1d(3)
    w = bn.weight
    bn.weight.grad = tapegrad.ones(3)
    assert bn.double() is bn
    assert bn.weight is w and w.dtype == tapegrad.float64 and w.grad.dtype == tapegrad.float64
    assert bn.running_mean.dtype == tapegrad.float64
    assert bn.num_batches_tracked.dtype == tapegrad.int64  # integer buffers keep their dtype
    bn.float()
    assert w.dtype == tapegrad.float32
    bn.half()
    assert w.dtype == tapegrad.float16 and bn.running_var.dtype == tapegrad.float16
    bn.to(tapegrad.float64)
    assert w.dtype == tapegrad.float64
    bn.to(dtype=tapegrad.float32)
    assert w.dtype == tapegrad.float32
    bn.to(tapegrad.zeros(1, dtype=tapegrad.float64))
    assert w.dtype == tapegrad.float64
    assert bn.to("cpu") is bn and bn.cpu() is bn
    with pytest.raises(TypeError, match="floating point"):
        bn.to(tapegrad.int64)
    with pytest.raises(RuntimeError, match="cpu"):
        bn.to("cuda")
    with pytest.raises(RuntimeError, match="cpu only"):
        bn.cuda()
    assert w.requires_grad
    bn.requires_grad_(False)
    assert not any(p.requires_grad for p in bn.parameters())


def test_submodule_and_parameter_lookup():
    th, tg = both(block)
    assert tg.get_submodule("mlp.0") is tg.mlp[0]
    assert tg.get_parameter("attn.out_proj.weight") is tg.attn.out_proj.weight
    assert tg.get_buffer("scale") is tg.scale
    with pytest.raises(AttributeError, match="has no attribute `nope`"):
        tg.get_submodule("mlp.nope")
    with pytest.raises(AttributeError, match="not an nn.Parameter"):
        tg.get_parameter("scale")


def test_deepcopy_and_pickle_keep_ties():
    net = tnn.Sequential(tnn.Linear(2, 2), tnn.Linear(2, 2))
    net[1].weight = net[0].weight
    for clone in (copy.deepcopy(net), pickle.loads(pickle.dumps(net))):
        assert clone[1].weight is clone[0].weight and clone[0].weight is not net[0].weight
        assert isinstance(clone[0].weight, tnn.Parameter) and clone[0].weight.requires_grad
        np.testing.assert_array_equal(clone[0].weight._data, net[0].weight._data)
        assert len(list(clone.parameters())) == 3


def test_forward_unimplemented():
    with pytest.raises(NotImplementedError, match='missing the required "forward"'):
        tnn.Module()(1)


# --- hooks --------------------------------------------------------------------------------
def test_forward_hooks_modify_inputs_and_outputs_and_remove():
    lin = tnn.Linear(2, 2)
    x = tapegrad.ones(1, 2)
    calls = []
    h1 = lin.register_forward_pre_hook(lambda m, args: (args[0] * 0,))
    h2 = lin.register_forward_hook(lambda m, args, out: calls.append(args[0]) or out + 1)
    out = lin(x)
    assert_close(out, lin.bias.detach().reshape(1, 2) + 1)
    assert np.all(calls[0]._data == 0)  # the hook saw the pre-hook's replacement
    h1.remove()
    h2.remove()
    h2.remove()  # removing twice is harmless
    assert_close(lin(x), x @ lin.weight.T + lin.bias)
    with lin.register_forward_hook(lambda m, a, o: o * 0):
        assert not np.any(lin(x)._data)
    assert np.any(lin(x)._data)


def test_forward_hooks_order_kwargs_and_always_call():
    class Echo(tnn.Module):
        def forward(self, x, scale=1):
            if x == "boom":
                raise ValueError("boom")
            return x * scale

    m = Echo()
    order = []
    m.register_forward_pre_hook(lambda mod, args: order.append("pre1"))
    m.register_forward_pre_hook(lambda mod, args: order.append("pre0"), prepend=True)
    m.register_forward_pre_hook(lambda mod, args, kwargs: ((args[0] + 1,), {"scale": 10}),
                                with_kwargs=True)
    m.register_forward_hook(lambda mod, args, kwargs, out: out + kwargs["scale"],
                            with_kwargs=True)
    assert m(1) == (1 + 1) * 10 + 10
    assert order == ["pre0", "pre1"]
    seen = []
    m2 = Echo()
    m2.register_forward_hook(lambda mod, args, out: seen.append("always"), always_call=True)
    m2.register_forward_hook(lambda mod, args, out: seen.append("normal"))
    with pytest.raises(ValueError, match="boom"):
        m2("boom")
    assert seen == ["always"]


# --- containers ---------------------------------------------------------------------------
def test_sequential_indexing_slicing_and_editing():
    def build(nn):
        return nn.Sequential(nn.Linear(2, 3), nn.ReLU(), nn.Linear(3, 4), nn.Tanh())

    th, tg = both(build)
    assert len(tg) == 4 and isinstance(tg[-1], tnn.Tanh) and tg[0] is tg._modules["0"]
    sliced = tg[1:3]
    assert isinstance(sliced, tnn.Sequential) and list(sliced._modules) == ["1", "2"]
    assert repr(sliced) == repr(th[1:3])
    with pytest.raises(IndexError, match="out of range"):
        tg[4]
    tg.append(tnn.Sigmoid())
    th.append(torch.nn.Sigmoid())
    tg.insert(1, tnn.Identity())
    th.insert(1, torch.nn.Identity())
    del tg[2]
    del th[2]
    tg[0] = tnn.Linear(2, 3, bias=False)
    th[0] = torch.nn.Linear(2, 3, bias=False)
    tg.extend([tnn.ReLU()])
    th.extend([torch.nn.ReLU()])
    assert repr(tg) == repr(th)
    assert repr(tg + tg[:2]) == repr(th + th[:2])
    assert repr(tg[:2] * 2) == repr(th[:2] * 2)
    popped = tg.pop(0)
    assert isinstance(popped, tnn.Linear) and list(tg._modules)[0] == "0"
    named = tnn.Sequential(OrderedDict(a=tnn.Linear(2, 2), b=tnn.ReLU()))
    assert list(named._modules) == ["a", "b"] and named[1] is named.b
    x = tapegrad.randn(3, 2)
    assert_close(named(x), named.b(named.a(x)))


def test_modulelist_and_moduledict():
    th_list = torch.nn.ModuleList([torch.nn.Linear(2, 2), torch.nn.ReLU()])
    tg_list = tnn.ModuleList([tnn.Linear(2, 2), tnn.ReLU()])
    for lst, nn in ((tg_list, tnn), (th_list, torch.nn)):
        lst.append(nn.Tanh())
        lst.extend([nn.ReLU(), nn.ReLU()])
        lst.insert(0, nn.Identity())
        lst += [nn.Sigmoid()]
        del lst[1]
        lst[0] = nn.GELU()
    assert repr(tg_list) == repr(th_list)
    assert len(tg_list) == 6 and isinstance(tg_list[-1], tnn.Sigmoid)
    assert repr(tg_list[1:3]) == repr(th_list[1:3])
    assert [type(m).__name__ for m in tg_list] == [type(m).__name__ for m in th_list]
    with pytest.raises(TypeError, match="iterable"):
        tg_list.extend(3)
    with pytest.raises(IndexError):
        tg_list[6]

    d = tnn.ModuleDict({"a": tnn.Linear(2, 2)})
    d.update([("b", tnn.ReLU())])
    d["c"] = tnn.Tanh()
    assert list(d.keys()) == ["a", "b", "c"] and "b" in d and len(d) == 3
    assert list(d) == ["a", "b", "c"] and isinstance(d.pop("b"), tnn.ReLU)
    assert [k for k, _ in d.items()] == ["a", "c"] and list(d.values())[1] is d["c"]
    assert [n for n, _ in d.named_parameters()] == ["a.weight", "a.bias"]
    with pytest.raises(ValueError, match="length 3"):
        d.update([("x", tnn.ReLU(), 1)])
    d.clear()
    assert len(d) == 0


def test_parameter_list_and_dict():
    def build(nn):
        lib = torch if nn is torch.nn else tapegrad

        class Holder(nn.Module):
            def __init__(self):
                super().__init__()
                self.plist = nn.ParameterList([nn.Parameter(lib.ones(2, 3)), lib.zeros(4)])
                self.plist.append(lib.ones(1))
                self.pdict = nn.ParameterDict({"b": lib.ones(2), "a": nn.Parameter(lib.ones(3))})
                self.pdict["c"] = lib.zeros(1)

        return Holder()

    th, tg = both(build)
    assert list(tg.state_dict()) == list(th.state_dict()) == [
        "plist.0", "plist.1", "plist.2", "pdict.a", "pdict.b", "pdict.c"]
    assert all(isinstance(p, tnn.Parameter) for p in tg.plist)
    assert repr(tg.plist) == repr(th.plist).replace("torch.", "tapegrad.")
    assert "(a): Parameter containing: [tapegrad.float32 of size 3]" in repr(tg.pdict)
    assert len(tg.plist) == 3 and tg.plist[-1].shape == (1,)
    assert [p.shape for p in tg.plist[1:]] == [(4,), (1,)]
    assert list(tg.pdict) == ["a", "b", "c"] and "b" in tg.pdict and len(tg.pdict) == 3
    assert tg.pdict.pop("b").shape == (2,) and list(tg.pdict.keys()) == ["a", "c"]
    assert tg.pdict.get("zz") is None and [k for k, _ in tg.pdict.items()] == ["a", "c"]
    merged = tg.pdict | tnn.ParameterDict({"d": tapegrad.ones(1)})
    assert list(merged) == ["a", "c", "d"]
    with pytest.raises(RuntimeError, match="should not be called"):
        tg.plist(1)
    with pytest.raises(TypeError, match="not a string"):
        tg.pdict[0] = tapegrad.ones(1)
    with pytest.raises(IndexError):
        tg.plist[3]


def test_user_load_from_state_dict_override_with_torch_signature():
    """Backward-compatible loading code written for PyTorch (rename an old key) works."""

    def build(nn):
        class Renamed(nn.Module):
            def __init__(self):
                super().__init__()
                self.proj = nn.Linear(2, 2)

            def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict,
                                      missing_keys, unexpected_keys, error_msgs):
                for name in ("weight", "bias"):
                    old = prefix + "fc." + name
                    if old in state_dict:
                        state_dict[prefix + "proj." + name] = state_dict.pop(old)
                super()._load_from_state_dict(state_dict, prefix, local_metadata, strict,
                                              missing_keys, unexpected_keys, error_msgs)

        return nn.Sequential(Renamed())

    th, tg = both(build)
    sd = {"0.fc.weight": tapegrad.ones(2, 2), "0.fc.bias": tapegrad.zeros(2)}
    result = tg.load_state_dict(dict(sd))
    th_result = th.load_state_dict({k: torch.tensor(v._data) for k, v in sd.items()})
    assert result.missing_keys == th_result.missing_keys
    assert result.unexpected_keys == th_result.unexpected_keys
    assert_close(tg[0].proj.weight, th[0].proj.weight, rtol=0)
    # a mismatch elsewhere still loads nothing
    bad = {"0.fc.weight": tapegrad.ones(2, 2), "0.fc.bias": tapegrad.zeros(3)}
    tg[0].proj.weight._data[...] = 5
    with pytest.raises(RuntimeError, match="size mismatch"):
        tg.load_state_dict(bad)
    assert np.all(tg[0].proj.weight._data == 5)


def _record_backward_hooks(lib, nn, x_requires_grad):
    """A two-input, two-output module with full backward (pre-)hooks that log and rescale."""

    class TwoWay(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(3, 2)

        def forward(self, x, scale, y):
            h = self.lin(x) * scale
            return h + y, (h * y).tanh()

    m = TwoWay().double()
    m.lin.load_state_dict({"weight": lib.tensor(np.arange(6.0).reshape(2, 3) / 10),
                           "bias": lib.tensor(np.array([0.1, -0.2]))})
    log = []

    def to_np(gs):
        return [None if g is None else g.detach().numpy().copy() for g in gs]

    def pre(mod, grad_output):
        log.append(("pre", to_np(grad_output)))
        return tuple(None if g is None else g * (3 - k) for k, g in enumerate(grad_output))

    def full(mod, grad_input, grad_output):
        log.append(("full", to_np(grad_input), to_np(grad_output)))
        return tuple(None if g is None else g * 2 for g in grad_input)

    handles = [m.register_full_backward_pre_hook(pre), m.register_full_backward_hook(full)]
    x = lib.tensor(np.arange(12.0).reshape(4, 3) / 7, requires_grad=x_requires_grad)
    y = lib.tensor(np.linspace(-1, 1, 8).reshape(4, 2), requires_grad=True)
    a, b = m(x, 0.5, y)
    (a * a).sum().backward(retain_graph=True)
    b.sum().backward()
    grads = [None if t.grad is None else t.grad.numpy().copy() for t in (x, y, m.lin.weight)]
    for h in handles:
        h.remove()
    return log, grads


@pytest.mark.parametrize("x_requires_grad", [True, False])
def test_full_backward_hooks_match_torch(x_requires_grad):
    tg_log, tg_grads = _record_backward_hooks(tapegrad, tnn, x_requires_grad)
    th_log, th_grads = _record_backward_hooks(torch, torch.nn, x_requires_grad)
    assert [e[0] for e in tg_log] == [e[0] for e in th_log] == ["pre", "full"] * 2
    for e_tg, e_th in zip(tg_log, th_log):
        for part_tg, part_th in zip(e_tg[1:], e_th[1:]):
            assert len(part_tg) == len(part_th)
            for u, v in zip(part_tg, part_th):
                assert (u is None) == (v is None)
                if u is not None:
                    np.testing.assert_allclose(u, v, rtol=1e-12)
    for u, v in zip(tg_grads, th_grads):
        assert (u is None) == (v is None)
        if u is not None:
            np.testing.assert_allclose(u, v, rtol=1e-12)


def test_full_backward_hook_without_input_grad_and_errors():
    lin = tnn.Linear(3, 2)
    seen = []
    lin.register_full_backward_hook(lambda m, gi, go: seen.append((gi, go[0].shape)))
    with pytest.warns(UserWarning, match="no inputs require gradients"):
        lin(tapegrad.randn(4, 3)).sum().backward()
    assert seen == [((None,), (4, 2))]
    lin2 = tnn.Linear(3, 2)
    lin2.register_full_backward_hook(lambda m, gi, go: (gi[0], gi[0]))
    with pytest.raises(RuntimeError, match="invalid number of grad_input"):
        lin2(tapegrad.randn(4, 3, requires_grad=True)).sum().backward()
    lin3 = tnn.Linear(3, 2)
    handle = lin3.register_full_backward_pre_hook(lambda m, go: (go[0] * 0,))
    x = tapegrad.randn(4, 3, requires_grad=True)
    lin3(x).sum().backward()
    assert not np.any(x.grad._data) and not np.any(lin3.weight.grad._data)
    handle.remove()
    x.grad = None
    lin3(x).sum().backward()
    assert np.any(x.grad._data)
    with tapegrad.no_grad():  # no recording, no hooks
        lin(tapegrad.randn(2, 3))


def test_extra_state_round_trip_and_keys():
    def build(nn):
        class Counter(nn.Module):
            def __init__(self):
                super().__init__()
                self.lin = nn.Linear(2, 2)
                self.count = 0

            def get_extra_state(self):
                return {"count": self.count}

            def set_extra_state(self, state):
                self.count = state["count"]

        return nn.Sequential(Counter(), nn.ReLU())

    th, tg = both(build)
    assert list(tg.state_dict()) == list(th.state_dict()) == [
        "0._extra_state", "0.lin.weight", "0.lin.bias"]
    tg[0].count = 7
    sd = tg.state_dict()
    fresh = build(tnn)
    fresh.load_state_dict(sd)
    assert fresh[0].count == 7
    del sd["0._extra_state"]
    with pytest.raises(RuntimeError, match='Missing key\\(s\\) in state_dict: "0._extra_state"'):
        fresh.load_state_dict(sd)
    plain = tnn.Sequential(tnn.Linear(2, 2), tnn.ReLU())
    with pytest.raises(RuntimeError, match='Unexpected key\\(s\\) in state_dict: "0._extra_state"'):
        plain.load_state_dict({"0.weight": tapegrad.zeros(2, 2), "0.bias": tapegrad.zeros(2),
                               "0._extra_state": 3})
    # a failing load leaves the extra state alone too
    fresh[0].count = 1
    bad = build(tnn)
    bad[0].count = 9
    state = bad.state_dict()
    state["0.lin.bias"] = tapegrad.zeros(5)
    with pytest.raises(RuntimeError, match="size mismatch"):
        fresh.load_state_dict(state)
    assert fresh[0].count == 1


def test_state_dict_positional_arguments_are_deprecated():
    lin = tnn.Linear(2, 2)
    with pytest.warns(FutureWarning, match="Positional args"):
        sd = lin.state_dict(None, "p.", True)
    assert list(sd) == ["p.weight", "p.bias"] and sd["p.weight"] is lin.weight
