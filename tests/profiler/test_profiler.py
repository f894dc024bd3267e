"""Op cost metadata, the op profiler, the roofline."""
import json
import threading

import numpy as np
import pytest

from helpers import TESTS  # noqa: E402
import tapegrad
import tapegrad.cli
import tapegrad.nn.functional as F
from tapegrad.ops.registry import REGISTRY
from tapegrad.profiler import profile, record_function
from tapegrad.profiler import roofline as R

torch = pytest.importorskip("torch")
from torch.utils.flop_counter import FlopCounterMode  # noqa: E402

rng = np.random.default_rng(0)


def _t(*shape, grad=False):
    return tapegrad.tensor(rng.standard_normal(shape), requires_grad=grad)


def _only(prof, name):
    events = [e for e in prof.events() if e.name == name]
    assert len(events) == 1, [e.name for e in prof.events()]
    return events[0]


def _torch_flops(fn, *arrays):
    with FlopCounterMode(display=False) as counter:
        fn(*(torch.tensor(a) for a in arrays))
    return counter.get_total_flops()


# --- FLOPs and bytes against hand counts -------------------------------------------------
def test_matmul_hand_count():
    a, b = _t(4, 3), _t(3, 5)
    with profile(with_flops=True) as prof:
        a @ b
    e = _only(prof, "matmul")
    assert (e.flops, e.bytes_read, e.bytes_written) == (2 * 4 * 5 * 3, (12 + 15) * 8, 20 * 8)


def test_batched_and_vector_matmul():
    cost = REGISTRY["matmul"].cost
    a, b = np.ones((7, 4, 3)), np.ones((3, 5))
    assert cost([a, b], a @ b)[0] == 2 * 7 * 4 * 5 * 3
    v = np.ones(3)
    assert cost([v, v], np.asarray(v @ v))[0] == 2 * 3


def test_conv2d_hand_count():
    x, w = _t(2, 3, 8, 8), _t(4, 3, 3, 3)
    with profile(with_flops=True) as prof:
        F.conv2d(x, w, padding=1)
    e = _only(prof, "conv2d")
    assert e.flops == 2 * (2 * 4 * 8 * 8) * (3 * 3 * 3)
    assert e.bytes_read == (x.numel() + w.numel()) * 8
    assert e.bytes_written == 2 * 4 * 8 * 8 * 8


def test_attention_hand_count():
    q, k, v = _t(2, 4, 6, 8), _t(2, 4, 7, 8), _t(2, 4, 7, 5)
    with profile(with_flops=True) as prof:
        F.scaled_dot_product_attention(q, k, v)
    e = _only(prof, "scaled_dot_product_attention")
    assert e.flops == 2 * (2 * 4) * 6 * 7 * (8 + 5)  # q k^T and p v


def test_broadcast_add_counts_the_small_operand_once():
    a, b = _t(3, 4), _t(4)
    with profile(with_flops=True) as prof:
        a + b
    e = _only(prof, "add")
    assert (e.flops, e.bytes_read, e.bytes_written) == (12, (12 + 4) * 8, 12 * 8)
    # a stride-0 view (what broadcast_to hands an elementwise op) is read once as well
    full = np.broadcast_to(np.ones(4), (3, 4))
    assert REGISTRY["add"].cost([np.ones((3, 4)), full], np.ones((3, 4)))[1] == (12 + 4) * 8


def test_views_cost_nothing():
    a = _t(3, 4, grad=True)
    with profile(with_flops=True) as prof:
        a.reshape(12)
        a.permute(1, 0)
        a.expand(2, 3, 4)
    for e in prof.events():
        assert (e.flops, e.bytes_read, e.bytes_written) == (0, 0, 0), e


def test_reduction_counts_input_elements():
    a = _t(5, 6)
    with profile(with_flops=True) as prof:
        a.sum(dim=0)
        a.mean()
    s, m = (_only(prof, n) for n in ("sum", "mean"))
    assert (s.flops, s.bytes_read, s.bytes_written) == (30, 30 * 8, 6 * 8)
    assert (m.flops, m.bytes_written) == (30, 8)


def test_einsum_counts_pairwise_contractions():
    cost = REGISTRY["einsum"].cost
    a, b, c = np.ones((4, 3)), np.ones((3, 5)), np.ones((5, 2))
    eq = {"equation": "ij,jk->ik"}
    assert cost([[a, b]], a @ b, eq)[0] == 2 * 4 * 3 * 5
    # (ij,jk) contracts j over i,j,k; (ik,kl) contracts k over i,k,l
    assert cost([[a, b, c]], a @ b @ c, {"equation": "ij,jk,kl->il"})[0] == (
        2 * 4 * 3 * 5 + 2 * 4 * 5 * 2)
    assert cost([[a, a]], a * a, {"equation": "ij,ij->ij"})[0] == 12  # no sum: 1 per product


# --- against torch.utils.flop_counter -----------------------------------------------------
@pytest.mark.parametrize("case", ["mm", "bmm", "linear", "conv2d", "conv2d_strided", "einsum"])
def test_flops_agree_with_torch_flop_counter(case):
    fns = {
        "mm": (lambda T, a, b: a @ b, [(6, 5), (5, 7)], "matmul"),
        "bmm": (lambda T, a, b: T.bmm(a, b), [(3, 6, 5), (3, 5, 7)], "matmul"),
        "linear": (lambda T, x, w, b: T.nn.functional.linear(x, w, b), [(9, 4, 5), (3, 5), (3,)],
                   "linear"),
        "conv2d": (lambda T, x, w: T.nn.functional.conv2d(x, w, padding=1),
                   [(2, 3, 6, 6), (4, 3, 3, 3)], "conv2d"),
        "conv2d_strided": (lambda T, x, w: T.nn.functional.conv2d(x, w, stride=2, groups=2),
                           [(2, 4, 9, 9), (6, 2, 3, 2)], "conv2d"),
        "einsum": (lambda T, a, b: T.einsum("bij,bjk->bik", a, b), [(2, 3, 4), (2, 4, 5)],
                   "einsum"),
    }
    fn, shapes, name = fns[case]
    arrays = [rng.standard_normal(s) for s in shapes]
    with profile(with_flops=True) as prof:  # recorded: the profiler reads einsum's equation
        fn(tapegrad, *(tapegrad.tensor(a, requires_grad=True) for a in arrays))
    ours = sum(e.flops for e in prof.events() if e.name == name)
    assert ours == _torch_flops(lambda *t: fn(torch, *t), *arrays) > 0


def test_attention_flops_agree_with_torch_flop_counter():
    arrays = [rng.standard_normal(s) for s in [(2, 3, 6, 8), (2, 3, 7, 8), (2, 3, 7, 8)]]
    with profile(with_flops=True) as prof:
        F.scaled_dot_product_attention(*(tapegrad.tensor(a) for a in arrays))
    # on the CPU, torch runs a fused kernel FlopCounterMode does not see: its formula then
    from torch.utils.flop_counter import sdpa_flop_count
    theirs = sdpa_flop_count(*(a.shape for a in arrays))
    assert _only(prof, "scaled_dot_product_attention").flops == theirs > 0


def test_backward_matmul_flops_agree_with_torch_flop_counter():
    a, b = rng.standard_normal((6, 5)), rng.standard_normal((5, 7))
    x, y = tapegrad.tensor(a, requires_grad=True), tapegrad.tensor(b, requires_grad=True)
    with profile(with_flops=True) as prof:
        (x @ y).sum().backward()
    tx, ty = torch.tensor(a, requires_grad=True), torch.tensor(b, requires_grad=True)
    out = tx @ ty
    with FlopCounterMode(display=False) as counter:
        out.backward(torch.ones_like(out))
    assert _only(prof, "MatmulBackward").flops == counter.get_total_flops() == 2 * 2 * 6 * 5 * 7


# --- the profiler ---------------------------------------------------------------------------
def test_forward_and_backward_events_and_self_times():
    x, w = _t(8, 4, grad=True), _t(3, 4, grad=True)
    with profile(record_shapes=True, with_flops=True, profile_memory=True) as prof:
        with record_function("step"):
            F.linear(x, w).relu().sum().backward()
    names = [e.name for e in prof.events()]
    for n in ("linear", "relu", "sum", "LinearBackward", "ReluBackward", "SumBackward", "step"):
        assert n in names
    step = _only(prof, "step")
    inner = [e for e in prof.events() if e.parent == step.id]
    assert len(inner) == 6
    assert step.self_cpu_time_total == pytest.approx(
        step.cpu_time_total - sum(e.cpu_time_total for e in inner), abs=1e-3)
    linear = _only(prof, "linear")
    assert linear.input_shapes == [[8, 4], [3, 4]]
    # measured by tracemalloc: the output's buffer plus the Tensor and Node objects
    assert 8 * 3 * 8 <= linear.cpu_memory_usage <= 8 * 3 * 8 + 2048
    table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=4)
    assert len(table.splitlines()) == 3 + 4 + 2  # rule, header, rule; 4 rows; rule, total
    by_flops = prof.key_averages().table(sort_by="flops")
    assert by_flops.index("LinearBackward") < by_flops.index("relu")


def test_key_averages_group_by_input_shape():
    a, b = _t(2, 2), _t(3, 3)
    with profile(record_shapes=True) as prof:
        for _ in range(3):
            a + a
        b + b
    plain = {r.key: r.count for r in prof.key_averages()}
    assert plain == {"add": 4}
    grouped = sorted((r.count, str(r.input_shapes))
                     for r in prof.key_averages(group_by_input_shape=True))
    assert grouped == [(1, "[[3, 3], [3, 3]]"), (3, "[[2, 2], [2, 2]]")]
    with pytest.raises(ValueError, match="sort_by"):
        prof.key_averages().table(sort_by="nonsense")


def test_profiler_sees_only_its_own_thread():
    a = _t(4, 4)
    with profile() as prof:
        t = threading.Thread(target=lambda: [a * a for _ in range(5)])
        t.start()
        t.join()
        a + a
    assert [e.name for e in prof.events()] == ["add"]


def test_chrome_trace_is_valid_json_with_forward_and_backward(tmp_path):
    x = _t(5, 3, grad=True)
    with profile(with_stack=True, record_shapes=True) as prof:
        with record_function("forward"):
            y = (x * x).sum()
        y.backward()
    path = prof.export_chrome_trace(str(tmp_path / "trace.json"))
    trace = json.load(open(path))
    events = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    cats = {e["cat"] for e in events}
    assert cats == {"cpu_op", "autograd", "user_annotation"}
    mul = next(e for e in events if e["name"] == "mul")
    assert "test_profiler.py" in mul["args"]["Call stack"]
    assert mul["args"]["Input Dims"] == [[5, 3], [5, 3]]
    for e in events:
        assert e["dur"] >= 0 and e["ts"] >= 0
    fwd = next(e for e in events if e["name"] == "forward")
    assert fwd["ts"] <= mul["ts"] and mul["ts"] + mul["dur"] <= fwd["ts"] + fwd["dur"] + 1e-3


# --- profile_memory: measured per event (tracemalloc) -------------------------------------
_SLACK = 4096  # a Tensor, a Node, a shape tuple: the Python objects an op call keeps


def test_profile_memory_measures_what_each_op_allocates():
    n = 500 * 400
    x = _t(500, 400)
    with profile(profile_memory=True) as prof:
        y = x + 1.0  # noqa: F841 - held: its buffer stays allocated
        z = x.t().reshape(-1)  # noqa: F841 - a view op whose numpy call had to copy
        x.add_(1.0)  # in place: nothing new
        with record_function("temporary"):
            (x * 2.0).sum()  # the product is freed before the range ends
    add, mul = _only(prof, "add"), _only(prof, "mul")
    assert n * 8 <= add.cpu_memory_usage <= n * 8 + _SLACK
    assert n * 8 <= mul.cpu_memory_usage <= n * 8 + _SLACK
    assert abs(_only(prof, "permute").cpu_memory_usage) <= _SLACK
    # reshape is a view op: an output-bytes estimate said 0; tracemalloc sees numpy's copy
    assert n * 8 <= _only(prof, "reshape").cpu_memory_usage <= n * 8 + _SLACK
    assert abs(_only(prof, "add_").cpu_memory_usage) <= _SLACK
    tmp = _only(prof, "temporary")
    assert abs(tmp.cpu_memory_usage) <= _SLACK  # what the range allocated, it freed
    assert tmp.self_cpu_memory_usage <= -n * 8 + _SLACK  # its children's net, given back
    table = prof.key_averages().table(sort_by="cpu_memory_usage")
    assert "CPU Mem" in table and "Self CPU Mem" in table
    assert table.index("add ") < table.index("permute")


def test_profile_memory_in_backward_and_tracemalloc_stopped():
    import tracemalloc

    x = _t(300, 200, grad=True)
    with profile(profile_memory=True) as prof:
        (x * 3.0).sum().backward()
    assert _only(prof, "MulBackward").cpu_memory_usage >= 300 * 200 * 8
    assert not tracemalloc.is_tracing()  # the profiler's tracemalloc session ended with it
    with profile() as prof:  # without profile_memory: nothing measured
        x * 3.0
    assert _only(prof, "mul").cpu_memory_usage == 0


# --- in-place ops and optimizer updates ----------------------------------------------------
def test_inplace_ops_are_events_with_hand_counted_costs():
    n = 1000
    p, q = _t(n), _t(n)
    with profile(with_flops=True, record_shapes=True) as prof:
        p.add_(q, alpha=0.5)
        p -= q
        p.mul_(2.0)
        p.zero_()  # zero_ fills through fill_: one event, the nested call inside it
        p.copy_(q)
    add_ = _only(prof, "add_")
    assert (add_.kind, add_.flops, add_.bytes_read, add_.bytes_written) == (
        "inplace", n, 2 * n * 8, n * 8)
    assert add_.input_shapes == [[n], [n]]  # self and other, as PyTorch lists aten::add_
    sub_ = _only(prof, "sub_")  # p -= q is Tensor.__isub__
    assert (sub_.flops, sub_.bytes_read, sub_.bytes_written) == (n, 2 * n * 8, n * 8)
    mul_ = _only(prof, "mul_")
    assert (mul_.flops, mul_.bytes_read, mul_.bytes_written) == (n, n * 8, n * 8)
    zero_ = _only(prof, "zero_")
    assert (zero_.flops, zero_.bytes_read, zero_.bytes_written) == (0, 0, n * 8)
    assert "fill_" not in [e.name for e in prof.events()]
    copy_ = _only(prof, "copy_")
    assert (copy_.flops, copy_.bytes_read, copy_.bytes_written) == (0, n * 8, n * 8)
    assert np.array_equal(p.numpy(), q.numpy())


def test_inplace_in_grad_mode_is_one_event_and_gradients_are_unchanged():
    x = _t(6, 4, grad=True)
    with profile() as prof:
        y = x * 1.0
        y.add_(2.0)
        y.mul_(x)
        y.sum().backward()
    names = [e.name for e in prof.events() if e.kind != "backward"]
    assert names == ["mul", "add_", "mul_", "sum"]  # the out-of-place ops inside are hidden
    assert np.allclose(x.grad.numpy(), 2 * x.detach().numpy() + 2.0, rtol=0, atol=1e-12)


def test_optimizer_updates_are_events_and_the_hooks_go_away():
    original_add_, original_sgd = tapegrad.Tensor.add_, vars(tapegrad.optim.SGD)["update"]
    model = tapegrad.nn.Linear(4, 3).double()
    opt = tapegrad.optim.SGD(model.parameters(), lr=0.1)
    big = tapegrad.nn.Parameter(_t(300, 300))
    adam = tapegrad.optim.Adam([big], lr=1e-3)
    model(_t(5, 4)).sum().backward()
    (big * big).sum().backward()
    with profile() as prof:
        opt.step()
        adam.step()
    sgd = [e for e in prof.events() if e.name == "SGD.update"]
    assert sgd and all(e.kind == "inplace" for e in sgd)
    n_params = 4 * 3 + 3
    assert sum(e.bytes_written for e in sgd) == n_params * 8  # no state: the parameters
    assert sum(e.bytes_read for e in sgd) == 2 * n_params * 8  # parameters and gradients
    a = _only(prof, "Adam.update")  # parameter, exp_avg, exp_avg_sq written
    assert a.bytes_written == 3 * 300 * 300 * 8 and a.bytes_read == 4 * 300 * 300 * 8
    # closed: the plain methods are back, so unprofiled code pays nothing
    assert tapegrad.Tensor.add_ is original_add_
    assert vars(tapegrad.optim.SGD)["update"] is original_sgd
    assert tapegrad.Tensor.__isub__ is tapegrad.Tensor.sub_


def test_inplace_events_are_only_this_threads():
    p = _t(100)
    seen = []
    with profile() as prof:
        t = threading.Thread(target=lambda: seen.append(p.add_(1.0)))
        t.start()
        t.join()
    assert seen and "add_" not in [e.name for e in prof.events()]


# --- the plot extra ----------------------------------------------------------------------------
def test_plot_extra_is_declared_and_named_by_the_error(monkeypatch, tmp_path):
    import os
    import sys
    import tomllib

    root = os.path.dirname(TESTS)
    extras = tomllib.load(open(os.path.join(root, "pyproject.toml"), "rb"))[
        "project"]["optional-dependencies"]
    assert any(d.startswith("matplotlib") for d in extras["plot"])
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if not installed
    result = R.Roofline([], R.Ceilings({"float64": 10.0}, 5.0, 5.0, 1.0))
    with pytest.raises(ImportError, match=r"tapegrad\[plot\]"):
        result.plot(str(tmp_path / "r.png"))


# --- roofline --------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def ceilings():
    return R.calibrate(quick=True, save=False)


def test_calibration_is_cached_and_rerun(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert R.load_ceilings(calibrate_if_missing=False) is None
    first = R.load_ceilings(quick=True)
    assert R.cache_path().startswith(str(tmp_path))
    saved = json.load(open(R.cache_path()))
    assert saved["matmul_gflops"]["float64"] == first.matmul_gflops["float64"] > 0
    assert R.load_ceilings().copy_gbs == first.copy_gbs  # read back, not re-measured
    saved["machine"]["cpus"] = -1  # another machine's figures: measured again
    json.dump(saved, open(R.cache_path(), "w"))
    assert R.load_ceilings(quick=True).machine["cpus"] != -1
    assert tapegrad.cli.main(["profile", "--calibrate", "--quick"]) == 0


def test_roofline_classes_kernels_of_known_character(ceilings, tmp_path):
    big_a, big_b = _t(512, 512), _t(512, 512)
    long_a, long_b = _t(1 << 21), _t(1 << 21)
    small = _t(8, 8)
    with profile(with_flops=True) as prof:
        big_a @ big_b
        long_a + long_b
        small * small
    result = prof.roofline(ceilings=ceilings, plot=False, show=False)
    assert result.row("matmul").bound == "compute-bound"
    assert result.row("add").bound == "memory-bound"
    assert result.row("mul").bound == "overhead-bound"
    assert result.row("mul").distance > 1 and result.row("add").distance > 0
    table = result.table()
    for word in ("compute-bound", "memory-bound", "overhead-bound", "ridge"):
        assert word in table


def test_roofline_plot(ceilings, tmp_path):
    pytest.importorskip("matplotlib")
    a = _t(64, 64, grad=True)
    with profile() as prof:
        (a @ a).relu().sum().backward()
    path = str(tmp_path / "roofline.png")
    result = prof.roofline(ceilings=ceilings, plot=path, show=False)
    assert result.plot_path == path
    assert open(path, "rb").read(8) == b"\x89PNG\r\n\x1a\n"


def test_cli_profile_example(ceilings, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    import os
    os.makedirs(os.path.dirname(R.cache_path()), exist_ok=True)
    json.dump(ceilings.to_dict(), open(R.cache_path(), "w"))
    script = tmp_path / "work.py"
    script.write_text("import tapegrad\nx = tapegrad.ones(3, 3, requires_grad=True)\n"
                      "(x * x).sum().backward()\n")
    assert tapegrad.cli.main(["profile", str(script)]) == 0
    out = capsys.readouterr().out
    assert "MulBackward" in out and "x roof" in out
    assert tapegrad.cli.main(["profile", "--example", "spiral", "--steps", "1"]) == 0
    out = capsys.readouterr().out
    assert "linear" in out and "LinearBackward" in out and "memory-bound" in out


# --- compiled graphs: kernels on the roofline, before and after fusion -----------------------
def test_graph_run_is_a_real_step_and_kernels_are_events():
    from tapegrad import compiler
    from tapegrad.bench.spiral import MLPTrainer, init_params, spiral_data
    from tapegrad.profiler import graph

    X, y = spiral_data(64)
    a = MLPTrainer(tapegrad, init_params((2, 8, 3), seed=3), X, y)
    b = MLPTrainer(tapegrad, init_params((2, 8, 3), seed=3), X, y)
    g = compiler.trace(a.step)  # tracing runs one step eagerly
    with profile() as prof:
        graph.run(g)
    b.step()
    b.step()
    for p, q in zip(a.params, b.params):
        np.testing.assert_allclose(p.detach().numpy(), q.detach().numpy(), rtol=1e-12,
                                   atol=1e-14)
    events = [e for e in prof.events() if e.kind == "kernel"]
    assert [e.name for e in events] == [n.name for n in g.nodes]
    first = events[0]  # linear(X, W1, b1): hand count
    assert first.name == "linear" and first.flops == 2 * 64 * 8 * 2
    assert first.bytes_read == (64 * 2 + 8 * 2 + 8) * 8 and first.bytes_written == 64 * 8 * 8


def _new_gelu(x):
    import math

    return (0.5 * x * (1.0 + tapegrad.tanh(math.sqrt(2.0 / math.pi)
                                           * (x + 0.044715 * tapegrad.pow(x, 3.0))))).sum()


def test_fusion_moves_a_pointwise_chain_across_the_ridge(monkeypatch):
    from tapegrad import compiler

    # the numpy kernel backend: with numba, whether pow's and tanh's C-library forms join a
    # group depends on a probe of this CPU's libm against numpy (kernels.libm_exact), and the
    # roofline arithmetic below is about one whole chain
    monkeypatch.setenv("TAPEGRAD_COMPILE_KERNELS", "numpy")
    from tapegrad.profiler import graph

    n = 128 * 64
    x = tapegrad.tensor(rng.standard_normal((128, 64)), dtype=tapegrad.float32)
    g = compiler.trace(_new_gelu, x)
    body = [m.name for m in g.nodes if m.name != "sum"]
    flops = sum(REGISTRY[name].flops for name in body) * n
    # ridge 2 FLOP/B for float32: unfused every op is below it, the fused chain above
    ceilings = R.Ceilings({"float32": 20.0, "float64": 10.0}, 10.0, 10.0, 1.0)
    kernels, result = graph.fusion(g, (x,), ceilings=ceilings, repeats=1)
    (k,) = kernels
    assert k.body == body and k.flops == flops
    assert k.fused_bytes == 2 * n * 4  # x in, the result out
    # each op reads its tensor operands and writes its result: 2 binary ops read two
    assert k.unfused_bytes == (2 * len(body) + 2) * n * 4
    assert (k.unfused_bound, k.fused_bound, k.moved) == ("memory-bound", "compute-bound", True)
    assert "<- moved" in graph.fusion_table(kernels)
    assert any(r.name.startswith("fused[") for r in result.rows)
    high = R.Ceilings({"float32": 1000.0, "float64": 500.0}, 10.0, 10.0, 1.0)  # ridge 100
    (k,), _ = graph.fusion(g, (x,), ceilings=high, repeats=1)
    assert (k.unfused_bound, k.fused_bound, k.moved) == ("memory-bound", "memory-bound", False)


def test_tracing_under_a_profiler_still_captures_inplace_ops():
    from tapegrad import compiler

    x = _t(3)

    def f(x):
        y = x * 2.0
        y.add_(1.0)
        return y.sum()
    with profile():
        g = compiler.trace(f, x)
    assert [n.name for n in g.nodes] == ["mul", "add", "sum"]
    (out,), _ = compiler.evaluate(g, [x.numpy()])
    assert out == pytest.approx(float((x.numpy() * 2 + 1).sum()), rel=1e-15)
