"""The memory tracker measures (tracemalloc), agrees with tracemalloc on numpy buffers, and
itemises per op; storage_bytes attributes live buffers; the CLI-facing functions run."""
import gc
import os
import tracemalloc

import numpy as np
import pytest

import tapegrad
from helpers import TESTS
from tapegrad.autograd.engine import watchers
from tapegrad.profiler import memory, storage_bytes

N = 512 * 512  # float64: 2 MiB per array, so Python-object overhead is well under 1%
NB = N * 8


def _numpy_bytes():
    snap = tracemalloc.take_snapshot().filter_traces(
        [tracemalloc.DomainFilter(True, np.lib.tracemalloc_domain)])
    return sum(t.size for t in snap.traces)


def _x(requires_grad=True):
    return tapegrad.tensor(np.random.default_rng(0).standard_normal((512, 512)),
                           requires_grad=requires_grad)


def test_live_and_peak_agree_with_tracemalloc_numpy_domain():
    x = _x()
    gc.collect()
    tracemalloc.start()  # the test's own view of numpy's domain, alongside the tracker
    try:
        before = _numpy_bytes()
        with memory() as m:
            a = x * 2.0
            b = a.exp()
            del a
            c = b + 1.0  # a freed: never more than two new arrays at once, besides b
            live_inside = m.live_bytes
            after = _numpy_bytes()
        assert tracemalloc.is_tracing()  # the tracker leaves a tracemalloc it did not start
    finally:
        tracemalloc.stop()
    numpy_delta = after - before
    assert numpy_delta == 2 * NB  # b and c
    assert abs(live_inside - numpy_delta) / numpy_delta < 0.03
    assert abs(m.numpy_live_bytes - numpy_delta) / numpy_delta < 0.01
    assert abs(m.peak_bytes - 2 * NB) / (2 * NB) < 0.03
    del b, c


def test_peak_inside_an_op_matches_a_plain_tracemalloc_run():
    x = _x(requires_grad=False)

    def work():
        return x.sigmoid()  # its forward makes temporaries: the peak is inside the op

    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        y = work()
        expected = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    del y
    gc.collect()
    with memory() as m:
        y = work()
    assert y.shape == (512, 512)  # held to the end, as in the plain run
    assert expected > NB  # really transient memory beyond the output
    assert abs(m.peak_bytes - expected) / expected < 0.03
    assert m.ops["sigmoid"].calls == 1
    assert abs(m.ops["sigmoid"].peak_bytes - expected) / expected < 0.03
    assert abs(m.ops["sigmoid"].net_bytes - NB) / NB < 0.03


def test_per_op_rows_forward_and_backward():
    w = tapegrad.tensor(np.eye(512) * 0.5, requires_grad=True)
    x = _x()
    with memory() as m:
        h = (x @ w).tanh()
        h.sum().backward()
    assert {"matmul", "tanh", "sum", "MatmulBackward", "TanhBackward"} <= set(m.ops)
    assert abs(m.ops["matmul"].net_bytes - NB) / NB < 0.03
    # backward of matmul makes both input gradients
    assert m.ops["MatmulBackward"].peak_bytes >= 2 * NB * 0.97
    # after backward: h and the two .grad buffers remain (the graph's saved values are gone)
    assert abs(m.live_bytes - 3 * NB) / (3 * NB) < 0.03
    text = m.report()
    assert "peak" in text and "MatmulBackward" in text


def test_graph_memory_is_released_after_backward():
    w = tapegrad.tensor(np.eye(512) * 0.5, requires_grad=True)
    x = _x()
    gc.collect()
    gc.disable()
    try:
        with memory(per_op=False) as m:
            h = x
            for _ in range(4):
                h = (h @ w).tanh()
            loss = h.sum()
            held = m.live_bytes
            loss.backward()
            del h, loss
    finally:
        gc.enable()
    assert held >= 4 * NB  # tanh saves its output: one activation per layer
    assert abs(m.live_bytes - 2 * NB) / (2 * NB) < 0.03  # only x.grad and w.grad remain


def test_tracker_detaches_on_error_and_stops_what_it_started():
    assert not tracemalloc.is_tracing()
    with pytest.raises(RuntimeError):
        with memory() as m:
            assert m in watchers()
            _x() @ tapegrad.tensor(np.ones((3, 3)))
    assert m not in watchers()
    assert not tracemalloc.is_tracing()


def test_storage_bytes_by_holder():
    w = tapegrad.tensor(np.ones((64, 64)), requires_grad=True)
    b = tapegrad.tensor(np.ones(64), requires_grad=True)
    x = tapegrad.tensor(np.ones((32, 64)))
    h = (x @ w + b).tanh()
    view = w.reshape(64 * 64)  # a view shares w's buffer: counted once
    s = storage_bytes([w, b, view], outputs=h)
    assert s["parameters"] == w._data.nbytes + b._data.nbytes
    assert s["gradients"] == 0
    # matmul saves x and w (w already counted); tanh saves its output
    assert s["activations"] == x._data.nbytes + h._data.nbytes
    h.sum().backward()
    s = storage_bytes([w, b])
    assert s["gradients"] == w._data.nbytes + b._data.nbytes
    assert s["total"] == 2 * (w._data.nbytes + b._data.nbytes)
    optim = getattr(tapegrad.optim, "SGD", None)
    if optim is not None:
        opt = optim([w, b], lr=0.1, momentum=0.9)
        opt.step()
        assert storage_bytes([w, b], optimizer=opt)["optimizer_state"] == \
            w._data.nbytes + b._data.nbytes


def test_memory_cli_function_prints_a_table(capsys):
    from tapegrad.profiler.workload import main

    assert main(["--depth", "4", "--width", "16", "--batch", "8", "--checkpoint"]) == 0
    out = capsys.readouterr().out
    assert "checkpointed, 2 segments" in out and "MatmulBackward" in out and "peak" in out


def test_checkpoint_benchmark_runs(tmp_path, capsys):
    import importlib.util

    path = os.path.join(TESTS, "..", "benchmarks", "checkpoint.py")
    spec = importlib.util.spec_from_file_location("bench_checkpoint", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    png = tmp_path / "plot.png"
    assert bench.main(["--depths", "4", "9", "--repeats", "1", "--plot", str(png)]) == 0
    out = capsys.readouterr().out
    assert png.stat().st_size > 1000
    rows = [line.split() for line in out.splitlines() if line.split()[:1] in (["4"], ["9"])]
    assert len(rows) == 2
    # depth 9: 3 segments; 9 forward + 6 recomputed + 17 backward matmuls (x needs no grad)
    assert rows[1][1] == "3" and rows[1][8] == "32" and rows[1][7] == "26"
