"""Devices, legacy constructors, torch.cuda & co, Tensor-API gaps and import paths,
each checked against PyTorch 2.13 (CPU build) as the oracle."""
import importlib
import pickle

import numpy as np
import pytest
import torch

import tapegrad
from tests.helpers import check_op, make_inputs

T = tapegrad


def same_error(fn_tg, fn_torch):
    """Both raise the same exception type (tapegrad's message names the op)."""
    with pytest.raises(Exception) as theirs:
        fn_torch()
    with pytest.raises(type(theirs.value)):
        fn_tg()


# --- devices ------------------------------------------------------------------------------
DEVICE_ARGS = [("cpu",), ("cuda",), ("cuda:1",), ("cuda", 0), ("cpu", 0), ("cpu:0",), ("mps",),
               ("meta",)]


@pytest.mark.parametrize("args", DEVICE_ARGS, ids=str)
def test_device_objects_match_torch(args):
    d, e = T.device(*args), torch.device(*args)
    assert (d.type, d.index, repr(d), str(d)) == (e.type, e.index, repr(e), str(e))
    assert T.device(d) == d and T.device(type=d.type, index=d.index) == d
    assert (d == str(d)) == (e == str(e))  # a device never equals a string in PyTorch 2.13
    assert (d == T.device("cpu")) == (e == torch.device("cpu"))
    assert hash(d) == hash(T.device(*args)) and {d: 1}[T.device(*args)] == 1
    assert pickle.loads(pickle.dumps(d)) == d
    with pytest.raises(AttributeError):
        d.index = 3


@pytest.mark.parametrize("args", [("gpu",), ("cuda:x",), ("cuda", -1), ("cuda:-1",),
                                  ("cpu:0:1",), ("",), ("CUDA",), ("cuda:0", 1), (0,)], ids=str)
def test_bad_devices_raise_as_torch(args):
    same_error(lambda: T.device(*args), lambda: torch.device(*args))


def test_tensor_device_and_to():
    x = T.ones(2, 3)
    assert x.device == T.device("cpu") and repr(x.device) == repr(torch.ones(1).device)
    assert not x.is_cuda and x.is_cpu and x.get_device() == torch.ones(1).get_device() == -1
    assert x.cpu() is x and x.to("cpu") is x and x.to(T.device("cpu")) is x
    assert x.to("cpu:0") is x and T.ones(2, device="cpu:1").device == T.device("cpu")
    y = x.to("cpu", T.float64)
    assert y.dtype is T.float64 and x.to(device=T.device("cpu"), dtype=T.int64).dtype is T.int64
    assert x.to(T.zeros(1, dtype=T.float64)).dtype is T.float64
    assert x.to(T.device("cpu"), copy=True) is not x
    for dev in (T.device("cpu"), "cpu", T.device("cpu", 0), None):
        for make in (lambda: T.zeros(2, device=dev), lambda: T.tensor([1.0], device=dev),
                     lambda: T.arange(3, device=dev), lambda: T.randn(2, device=dev),
                     lambda: T.eye(2, device=dev), lambda: T.full((2,), 1.0, device=dev),
                     lambda: T.zeros_like(x, device=dev)):
            assert make().device == T.device("cpu")


@pytest.mark.parametrize("call", [
    lambda L: L.zeros(2, device="cuda"), lambda L: L.zeros(2, device=L.device("cuda", 0)),
    lambda L: L.tensor([1.0], device="cuda:1"), lambda L: L.randn(2, device="cuda"),
    lambda L: L.ones(2).cuda(), lambda L: L.ones(2).to("cuda"),
    lambda L: L.ones(2).to(L.device("cuda:0")), lambda L: L.nn.Linear(2, 2).cuda(),
    lambda L: L.nn.Linear(2, 2).to("cuda"), lambda L: L.nn.Linear(2, 2, device="cuda"),
    lambda L: L.ones(2).to(0), lambda L: L.zeros(2, device=0),
])
def test_cuda_requests_raise_as_torch_cpu_build(call):
    same_error(lambda: call(T), lambda: call(torch))
    with pytest.raises(Exception, match="Torch not compiled with CUDA|accelerator"):
        call(T)


def test_module_to_device():
    m = T.nn.Linear(3, 2)
    w = m.weight
    assert m.to(T.device("cpu")) is m and m.to("cpu") is m and m.weight is w
    assert m.to(T.device("cpu"), T.float64).weight.dtype is T.float64
    assert T.nn.Linear(2, 2, device=T.device("cpu")).weight.device == T.device("cpu")


# --- torch.cuda, torch.accelerator, torch.backends -----------------------------------------
CUDA_CALLS = ["is_available()", "is_initialized()", "device_count()", "manual_seed(1)",
              "manual_seed_all(1)", "seed()", "seed_all()", "empty_cache()", "memory_allocated()",
              "max_memory_allocated()", "memory_reserved()", "max_memory_reserved()",
              "memory_stats()", "is_bf16_supported()", "get_arch_list()", "get_rng_state_all()",
              "synchronize()", "current_device()", "get_device_name()", "get_device_name(0)",
              "get_device_properties(0)", "get_device_capability()", "initial_seed()",
              "get_rng_state()", "init()", "mem_get_info()", "current_stream()", "Stream()",
              "Event()", "ipc_collect()", "set_rng_state_all([])"]


def _outcome(namespace, call):
    try:
        return "value", eval(f"ns.{call}", {"ns": namespace})
    except Exception as e:  # noqa: BLE001 - the exception type is what is compared
        return "raises", type(e)


def same_outcome(ours, theirs):
    """Equal values, or exceptions of PyTorch's type (tapegrad's may be a subclass)."""
    if ours[0] == theirs[0] == "raises":
        return issubclass(ours[1], theirs[1])
    return ours == theirs


@pytest.mark.parametrize("call", CUDA_CALLS)
def test_cuda_namespace_matches_torch_cpu_build(call):
    assert same_outcome(_outcome(T.cuda, call), _outcome(torch.cuda, call))


def test_cuda_context_managers_and_tensor_types():
    with T.cuda.device(-1), T.cuda.device(None), T.cuda.device_of(T.zeros(1)):
        pass
    for L in (T, torch):
        with pytest.raises(RuntimeError):
            with L.cuda.device(0):
                pass
        with pytest.raises(ValueError):
            L.cuda.device("cpu")
    assert not isinstance(T.zeros(2), T.cuda.FloatTensor)
    assert repr(T.cuda.FloatTensor) == repr(torch.cuda.FloatTensor)
    with pytest.raises(AssertionError):
        T.cuda.FloatTensor(2)


@pytest.mark.parametrize("call", ["is_available()", "device_count()", "current_accelerator()",
                                  "current_accelerator(check_available=True)",
                                  "current_device_index()", "set_device_index(0)",
                                  "synchronize()"])
def test_accelerator_matches_torch(call):
    assert same_outcome(_outcome(T.accelerator, call), _outcome(torch.accelerator, call))


@pytest.mark.parametrize("flag", [
    "cudnn.benchmark", "cudnn.deterministic", "cudnn.enabled", "cudnn.allow_tf32",
    "cudnn.benchmark_limit", "cuda.matmul.allow_tf32",
    "cuda.matmul.allow_fp16_reduced_precision_reduction",
    "cuda.matmul.allow_bf16_reduced_precision_reduction"])
def test_backend_flags_default_as_torch_and_are_settable(flag):
    ours = eval(f"T.backends.{flag}")
    assert ours == eval(f"torch.backends.{flag}")
    owner, name = flag.rsplit(".", 1)
    target = eval(f"T.backends.{owner}")
    setattr(target, name, not ours)
    try:
        assert eval(f"T.backends.{flag}") == (not ours)
    finally:
        setattr(target, name, ours)


@pytest.mark.parametrize("call", ["cudnn.is_available()", "cudnn.version()", "mps.is_available()",
                                  "mps.is_built()", "cuda.is_built()", "cuda.flash_sdp_enabled()",
                                  "cuda.math_sdp_enabled()", "cuda.mem_efficient_sdp_enabled()"])
def test_backend_queries_match_torch(call):
    assert same_outcome(_outcome(T.backends, call), _outcome(torch.backends, call))


def test_cudnn_flags_context_restores():
    with T.backends.cudnn.flags(enabled=False, benchmark=True):
        assert not T.backends.cudnn.enabled and T.backends.cudnn.benchmark
    assert T.backends.cudnn.enabled and not T.backends.cudnn.benchmark


# --- legacy constructors ------------------------------------------------------------------
LEGACY = ["Tensor()", "Tensor(4)", "Tensor(3, 4)", "Tensor([1, 2])", "Tensor([[1, 2], [3, 4]])",
          "Tensor((1, 2))", "Tensor(size=(2, 3))", "Tensor(size=[2])", "Tensor(np.array([1, 2]))",
          "Tensor(np.array([1.5, 2]))", "Tensor([True])", "Tensor(np.int64(3))", "Tensor([])",
          "Tensor(r3)", "Tensor(data=[1])", "Tensor([1], device='cpu')",
          "Tensor(2, 3, device='cpu')", "FloatTensor(2)", "FloatTensor([1, 2])",
          "DoubleTensor([1, 2])", "LongTensor([1.7, 2])", "IntTensor([1, 2])",
          "BoolTensor([1, 0])", "ByteTensor([1, 2])", "HalfTensor([1, 2])",
          "BFloat16Tensor([1, 2])", "LongTensor(2, 3)", "ShortTensor([1])", "CharTensor([1])",
          "FloatTensor(size=(2,))", "FloatTensor()", "FloatTensor(np.array([1.5]))",
          "LongTensor(np.array([1.5]))", "Tensor(tensor([1, 2]))", "Tensor(tensor(3))",
          "Tensor(tensor([1.5], dtype=float64))"]


@pytest.mark.parametrize("expr", LEGACY)
def test_legacy_constructors_match_torch(expr):
    ours = eval(expr, {**vars(T), "np": np, "r3": range(3)})
    theirs = eval(expr, {**vars(torch), "np": np, "r3": range(3)})
    assert type(ours) is T.Tensor
    assert str(ours.dtype) == str(theirs.dtype).replace("torch", "tapegrad")
    assert tuple(ours.shape) == tuple(theirs.shape)
    uninitialised = "size" in expr or "int64(3)" in expr or \
        all(c.isdigit() or c in " ,()" for c in expr.split("(", 1)[1].split("device")[0])
    if not uninitialised:
        np.testing.assert_array_equal(np.asarray(ours.tolist(), dtype=np.float64),
                                      np.asarray(theirs.tolist(), dtype=np.float64))


@pytest.mark.parametrize("expr", ["Tensor(2.5)", "Tensor(True)", "Tensor('a')", "Tensor(-1)",
                                  "Tensor(2, -1)", "Tensor(3, dtype=float64)",
                                  "Tensor([1], requires_grad=True)", "Tensor(2, size=(2,))",
                                  "Tensor(2.0, 3)", "Tensor(2, device='cuda')",
                                  "Tensor(tensor([1]), device='cpu')",
                                  "LongTensor(tensor([1.5]))", "DoubleTensor(tensor([1.]))"])
def test_legacy_constructor_errors_match_torch(expr):
    same_error(lambda: eval(expr, {**vars(T)}), lambda: eval(expr, {**vars(torch)}))


def test_legacy_alias_shares_storage_and_gradient():
    a = T.tensor([1.0, 2.0], requires_grad=True)
    b = T.Tensor(a * 2)
    assert b.requires_grad and not b.is_leaf
    b.sum().backward()
    assert a.grad.tolist() == [2.0, 2.0]
    n = np.array([1.0, 2.0], dtype=np.float32)
    shared = T.Tensor(n)
    n[0] = 5
    assert shared.tolist() == torch.Tensor(np.array([5.0, 2.0], dtype=np.float32)).tolist()
    assert T.zeros(2, dtype=T.int64).new([1, 2]).dtype is T.int64
    assert T.zeros(2).new(2, 3).shape == (2, 3) and T.zeros(2).new().shape == (0,)


def test_tensor_types_isinstance_and_type_strings():
    for name in ("FloatTensor", "DoubleTensor", "LongTensor", "IntTensor", "BoolTensor",
                 "ByteTensor", "HalfTensor", "BFloat16Tensor"):
        ours, theirs = getattr(T, name), getattr(torch, name)
        assert repr(ours) == repr(theirs) and str(ours.dtype) == str(theirs.dtype).replace(
            "torch", "tapegrad")
        for dt in ("float32", "float64", "int64", "bool"):
            a, b = T.zeros(2, dtype=getattr(T, dt)), torch.zeros(2, dtype=getattr(torch, dt))
            assert isinstance(a, ours) == isinstance(b, theirs)
            assert a.type() == b.type()
    assert isinstance(T.FloatTensor(2), T.Tensor)
    assert not issubclass(T.FloatTensor, T.Tensor) and not issubclass(torch.FloatTensor,
                                                                        torch.Tensor)
    x, y = T.zeros(2), torch.zeros(2)
    for arg in ("DoubleTensor", "float64", "int32", "Tensor"):
        assert x.type(getattr(T, arg)).type() == y.type(getattr(torch, arg)).type()
    for name in ("torch.DoubleTensor", "torch.Tensor", "torch.IntTensor"):
        assert x.type(name).type() == y.type(name).type()
    assert x.type(dtype=T.int32).type() == y.type(dtype=torch.int32).type()
    same_error(lambda: x.type("foo"), lambda: y.type("foo"))
    same_error(lambda: x.type("torch.cuda.FloatTensor"), lambda: y.type("torch.cuda.FloatTensor"))
    same_error(lambda: x.type(T.cuda.FloatTensor), lambda: y.type(torch.cuda.FloatTensor))


# --- factories' size= keyword ----------------------------------------------------------------
@pytest.mark.parametrize("expr", ["empty(size=(2, 3))", "zeros(size=(2, 3))", "ones(size=[2])",
                                  "rand(size=(2,))", "randn(size=(2,))",
                                  "full(size=(2,), fill_value=3.)", "zeros(())"])
def test_size_keyword(expr):
    ours, theirs = eval("L." + expr, {"L": T}), eval("L." + expr, {"L": torch})
    assert tuple(ours.shape) == tuple(theirs.shape) and str(ours.dtype)[9:] == str(theirs.dtype)[6:]


@pytest.mark.parametrize("expr", ["empty(2, size=(2,))", "empty()", "zeros()", "rand()",
                                  "zeros(size=2)", "zeros(2, 3, size=None)", "zeros(size=None)"])
def test_size_keyword_errors(expr):
    same_error(lambda: eval("L." + expr, {"L": T}), lambda: eval("L." + expr, {"L": torch}))


# --- diag family, narrow, view_as: values and gradients through check_op -------------------------
OPS = [
    ("diag_1d", lambda L, x: L.diag(x), [(3,)]),
    ("diag_1d_offset", lambda L, x: L.diag(x, 2), [(3,)]),
    ("diag_1d_neg", lambda L, x: L.diag(x, diagonal=-1), [(3,)]),
    ("diag_2d", lambda L, x: L.diag(x), [(3, 4)]),
    ("diag_2d_offset", lambda L, x: x.diag(1), [(3, 4)]),
    ("diag_2d_neg", lambda L, x: L.diag(x, -2), [(4, 3)]),
    ("diag_2d_empty", lambda L, x: L.diag(x, 7), [(3, 4)]),
    ("diagonal", lambda L, x: L.diagonal(x), [(3, 4)]),
    ("diagonal_offset", lambda L, x: x.diagonal(1), [(3, 4)]),
    ("diagonal_dims", lambda L, x: L.diagonal(x, -1, 2, 0), [(3, 2, 4)]),
    ("diagonal_neg_dims", lambda L, x: x.diagonal(offset=1, dim1=-1, dim2=-2), [(2, 3, 4)]),
    ("diagonal_then_mul", lambda L, x: x.diagonal() * x.diagonal(), [(3, 3)]),
    ("diag_embed", lambda L, x: L.diag_embed(x), [(2, 3)]),
    ("diag_embed_offset_dims", lambda L, x: L.diag_embed(x, 1, 0, 2), [(2, 3)]),
    ("diag_embed_neg", lambda L, x: x.diag_embed(-1, 2, 0), [(2, 3)]),
    ("tril", lambda L, x: L.tril(x, -1), [(3, 4)]),
    ("triu", lambda L, x: x.triu(1), [(3, 4)]),
    ("narrow", lambda L, x: x.narrow(0, 1, 2), [(4, 3)]),
    ("narrow_neg_start", lambda L, x: L.narrow(x, -1, -2, 2), [(2, 4)]),
    ("narrow_tensor_start", lambda L, x: x.narrow(1, L.tensor(1), 2), [(2, 4)]),
    ("view_as", lambda L, x, y: x.view_as(y) * y, [(6,), (2, 3)]),
    ("softmax_method", lambda L, x: x.softmax(1), [(2, 3)]),
    ("log_softmax_method", lambda L, x: x.log_softmax(dim=0), [(2, 3)]),
    ("softmax_fn", lambda L, x: L.softmax(x, -1), [(2, 3)]),
    ("log_softmax_fn", lambda L, x: L.log_softmax(x, 1, L.float64), [(2, 3)]),
    ("sort_values", lambda L, x: L.sort(x)[0], [(3, 5)]),
    ("sort_desc_dim0", lambda L, x: x.sort(0, descending=True).values, [(4, 3)]),
    ("sort_0d", lambda L, x: L.sort(x).values, [()]),
    ("topk", lambda L, x: L.topk(x, 2)[0], [(3, 5)]),
    ("topk_smallest_dim0", lambda L, x: x.topk(3, dim=0, largest=False).values, [(4, 3)]),
    ("topk_1d", lambda L, x: x.topk(4).values * 2, [(6,)]),
    ("topk_0d", lambda L, x: x.topk(1).values, [()]),
]


@pytest.mark.parametrize("fn,specs", [c[1:] for c in OPS], ids=[c[0] for c in OPS])
def test_ops_match_torch(fn, specs):
    check_op(fn, specs)


@pytest.mark.parametrize("expr", ["diag(z3)", "diag(z0)", "diagonal(z1)", "diagonal(z3, 0, 1, 1)",
                                  "diagonal(z3, 0, 1, 3)", "diag_embed(z0)",
                                  "diag_embed(z1, 0, 0, 0)", "z1.narrow(0, 8, 3)",
                                  "z1.narrow(0, -11, 1)", "z1.narrow(0, 2, -1)",
                                  "z0.narrow(0, 0, 1)", "z1.narrow(1, 0, 1)",
                                  "z1.narrow(0, tensor(1.), 2)", "topk(z1, 11)", "topk(z1, -1)",
                                  "topk(z3, 2, dim=3)", "topk(tensor([True, False]), 1)",
                                  "sort(z1, dim=1)"])
def test_errors_match_torch(expr):
    def run(L):
        env = {**vars(L), "z0": L.zeros(()), "z1": L.arange(10.0), "z3": L.zeros(2, 3, 4)}
        return eval(expr, env)

    same_error(lambda: run(T), lambda: run(torch))


def test_diagonal_is_a_writable_view():
    for L in (T, torch):
        x = L.zeros(3, 4)
        x.diagonal(1).add_(1)
        x.diagonal().fill_(2)
        if L is T:
            ours = x.tolist()
        else:
            assert ours == x.tolist()
    a = T.zeros(3, 3, requires_grad=True)
    b = a * 1
    b.diagonal().mul_(3)  # in place on a view of a non-leaf: the base's history is rebuilt
    b.sum().backward()
    a2 = torch.zeros(3, 3, requires_grad=True)
    b2 = a2 * 1
    b2.diagonal().mul_(3)
    b2.sum().backward()
    assert a.grad.tolist() == a2.grad.tolist()


def _sort_cases():
    rng = np.random.default_rng(3)
    ties = rng.integers(0, 3, (4, 40)).astype(np.float64)
    ties[1, 5] = ties[2, 7] = ties[2, 9] = np.nan
    return [ties, rng.integers(-5, 5, (3, 30)), np.array([True, False, True, True]),
            np.array([1.0, -0.0, 0.0, np.inf, -np.inf, np.nan, 1.0])]


@pytest.mark.parametrize("k", range(4))
@pytest.mark.parametrize("descending", [False, True])
def test_stable_sort_and_argsort_match_torch_with_ties_and_nan(k, descending):
    a = _sort_cases()[k]
    ours = T.sort(T.tensor(a), descending=descending, stable=True)
    theirs = torch.sort(torch.tensor(a), descending=descending, stable=True)
    assert ours.indices.tolist() == theirs.indices.tolist()
    np.testing.assert_array_equal(ours.values.numpy(), theirs.values.numpy())
    assert type(ours).__name__ == "sort" and ours._fields == ("values", "indices")
    assert T.argsort(T.tensor(a), descending=descending, stable=True).tolist() == \
        torch.argsort(torch.tensor(a), descending=descending, stable=True).tolist()
    assert T.tensor(a).argsort(-1, descending).dtype is T.int64


@pytest.mark.parametrize("largest", [True, False])
def test_topk_values_indices_and_gradient_match_torch(largest):
    x = make_inputs([(4, 7)], seed=5)[0]
    a, b = T.tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
    for dim in (0, 1, -1):
        ours, theirs = a.topk(3, dim, largest), b.topk(3, dim, largest)
        assert ours.indices.tolist() == theirs.indices.tolist()
        np.testing.assert_array_equal(ours.values.detach().numpy(), theirs.values.detach().numpy())
    ours, theirs = a.topk(3, largest=largest, sorted=False), b.topk(3, largest=largest,
                                                                    sorted=False)
    assert sorted(ours.values.tolist()[0]) == sorted(theirs.values.tolist()[0])
    assert type(ours).__name__ == "topk"
    nan = np.array([1.0, np.nan, 3.0, 2.0])
    assert T.topk(T.tensor(nan), 2).indices.tolist() == torch.topk(torch.tensor(nan),
                                                                   2).indices.tolist()
    assert T.topk(T.tensor(nan), 2, largest=False).indices.tolist() == \
        torch.topk(torch.tensor(nan), 2, largest=False).indices.tolist()
    assert T.topk(T.tensor(nan), 0).values.shape == (0,)


# --- __format__, anomaly queries ------------------------------------------------------------------
@pytest.mark.parametrize("expr", ["f'{x:.3f}'", "f'{x}'", "f'{x:>8}'", "format(x)",
                                  "f'{x:.2e}'", "f'{i:d}'", "f'{i:.2f}'", "f'{b}'", "f'{g:.2f}'",
                                  "f'{v}'", "format(v)"])
def test_format_matches_torch(expr):
    def env(L):
        return {"x": L.tensor(1.23456), "i": L.tensor(3), "b": L.tensor(True),
                "g": L.tensor(1.5, requires_grad=True) * 2, "v": L.tensor([1.0, 2.0])}

    ours, theirs = eval(expr, env(T)), eval(expr, env(torch))
    assert ours == theirs.replace("torch", "tapegrad")


@pytest.mark.parametrize("expr", ["f'{v:.3f}'", "f'{w:.3f}'", "f'{v:>5}'"])
def test_format_of_non_scalars_raises_as_torch(expr):
    def env(L):
        return {"v": L.tensor([1.0, 2.0]), "w": L.tensor([1.5])}

    same_error(lambda: eval(expr, env(T)), lambda: eval(expr, env(torch)))


def test_anomaly_queries_match_torch():
    assert T.is_anomaly_enabled() == torch.is_anomaly_enabled()
    assert T.is_anomaly_check_nan_enabled() == torch.is_anomaly_check_nan_enabled()
    with T.autograd.detect_anomaly(check_nan=False), \
            torch.autograd.detect_anomaly(check_nan=False):
        assert T.is_anomaly_enabled() == torch.is_anomaly_enabled() is True
        assert T.is_anomaly_check_nan_enabled() == torch.is_anomaly_check_nan_enabled()
    assert T.is_anomaly_check_nan_enabled() == torch.is_anomaly_check_nan_enabled() is True


# --- import paths ------------------------------------------------------------------------------
NN_SUBMODULES = ["module", "activation", "batchnorm", "instancenorm", "normalization",
                 "container", "conv", "dropout", "flatten", "linear", "loss", "padding",
                 "pixelshuffle", "pooling", "rnn", "sparse", "transformer", "upsampling"]


@pytest.mark.parametrize("sub", NN_SUBMODULES)
def test_nn_modules_paths_hold_tapegrads_classes(sub):
    ours = importlib.import_module(f"tapegrad.nn.modules.{sub}")
    theirs = importlib.import_module(f"torch.nn.modules.{sub}")
    names = [n for n in getattr(theirs, "__all__", dir(theirs))
             if isinstance(getattr(theirs, n, None), type) and hasattr(tapegrad.nn, n)]
    for n in names:
        assert getattr(ours, n) is getattr(tapegrad.nn, n), n
    assert getattr(tapegrad.nn.modules, sub) is ours


def test_nn_modules_private_helpers_and_base_classes():
    from tapegrad.nn.modules.utils import _pair, _single, _triple
    from tapegrad.nn.modules.loss import _Loss, _WeightedLoss
    from tapegrad.nn.modules.conv import _ConvNd
    from tapegrad.nn.modules.batchnorm import _BatchNorm
    from tapegrad.nn.modules.module import Module
    from torch.nn.modules.utils import _pair as tp, _single as ts, _triple as tt

    assert (_pair(3), _single(2), _triple((1, 2, 3))) == (tp(3), ts(2), tt((1, 2, 3)))
    assert issubclass(tapegrad.nn.MSELoss, _Loss) and issubclass(tapegrad.nn.NLLLoss,
                                                                  _WeightedLoss)
    assert issubclass(tapegrad.nn.Conv2d, _ConvNd) and issubclass(tapegrad.nn.BatchNorm1d,
                                                                   _BatchNorm)
    assert Module is tapegrad.nn.Module and tapegrad.nn.modules.Linear is tapegrad.nn.Linear


def test_utils_data_paths():
    from tapegrad.utils.data.dataloader import DataLoader, default_collate
    from tapegrad.utils.data.dataset import Dataset, TensorDataset
    from tapegrad.utils.data.sampler import RandomSampler
    import tapegrad.utils.data.dataloader as dl

    data = tapegrad.utils.data
    assert (DataLoader, default_collate, Dataset, TensorDataset, RandomSampler) == (
        data.DataLoader, data.default_collate, data.Dataset, data.TensorDataset,
        data.RandomSampler)
    assert dl is data.dataloader
    batches = list(DataLoader(TensorDataset(tapegrad.arange(6.0)), batch_size=4))
    assert [b[0].tolist() for b in batches] == [[0.0, 1.0, 2.0, 3.0], [4.0, 5.0]]


def test_serialization_path():
    import tapegrad.serialization as s

    assert s.save is tapegrad.save and s.load is tapegrad.load


def test_distributed_and_parallel_without_a_process_group():
    import importlib.util
    import tapegrad.distributed as dist
    from tapegrad.nn.parallel import DistributedDataParallel, DataParallel

    assert dist.is_available() is (importlib.util.find_spec("mpi4py") is not None)
    assert dist.is_initialized() is False
    with pytest.raises(ValueError, match="Default process group has not been initialized"):
        dist.get_rank()
    with pytest.raises(ValueError, match="Default process group has not been initialized"):
        DistributedDataParallel(tapegrad.nn.Linear(2, 2))
    assert tapegrad.nn.DataParallel is DataParallel


def test_data_parallel_without_gpus_matches_torch():
    torch.manual_seed(0)
    lin = torch.nn.Linear(3, 2).double()
    ours = tapegrad.nn.Linear(3, 2).double()
    ours.load_state_dict({k: tapegrad.tensor(v.detach().numpy()) for k, v in
                          lin.state_dict().items()})
    a, b = tapegrad.nn.DataParallel(ours), torch.nn.DataParallel(lin)
    assert list(a.state_dict()) == list(b.state_dict())
    x = np.arange(6.0).reshape(2, 3)
    np.testing.assert_allclose(a(tapegrad.tensor(x)).detach().numpy(),
                               b(torch.tensor(x)).detach().numpy(), rtol=1e-12)
    assert a.device_ids == b.device_ids == []


def test_a_ported_script_runs_with_only_its_imports_changed():
    src = '''
import torch
import torch.nn as nn
from torch.nn.modules.loss import _Loss
from torch.utils.data.dataloader import DataLoader
from torch.utils.data import TensorDataset
torch.manual_seed(0)
torch.cuda.manual_seed_all(0)
torch.backends.cudnn.benchmark = False
torch.backends.cudnn.deterministic = True
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3)).to(device)
x = torch.Tensor(16, 4).uniform_(-1, 1)
y = torch.LongTensor(16).random_(0, 3) if hasattr(torch.Tensor, "random_") else \\
    torch.randint(0, 3, (16,))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
lines = []
for xb, yb in DataLoader(TensorDataset(x, y), batch_size=8):
    xb, yb = xb.to(device), yb.to(device)
    loss = nn.functional.cross_entropy(model(xb), yb)
    opt.zero_grad(); loss.backward(); opt.step()
    top = model(xb).softmax(-1).topk(2, dim=1).indices
    lines.append(f"{loss:.4f} {loss.item():.4f} {top.shape[1]} {loss.device} {x.type()}")
'''
    env = {}
    for old, new in (("import torch.nn as nn", "import tapegrad.nn as nn"),
                     ("import torch\n", "import tapegrad as torch\n"),
                     ("from torch.", "from tapegrad.")):  # the only change a port needs
        src = src.replace(old, new)
    exec(src, env)
    assert env["torch"] is tapegrad and env["nn"] is tapegrad.nn
    assert len(env["lines"]) == 2
    for line in env["lines"]:
        a, b, k, dev, typ = line.split()
        assert a == b and k == "2" and dev == "cpu" and typ == "torch.FloatTensor"
    assert isinstance(env["x"], env["torch"].FloatTensor)


def test_namedtuple_results_unpack():
    values, indices = T.topk(T.tensor([1.0, 3.0, 2.0]), 2)
    assert values.tolist() == [3.0, 2.0] and indices.tolist() == [1, 2]
    result = T.sort(T.tensor([2.0, 1.0]))
    assert isinstance(result, tuple) and result[1] is result.indices
