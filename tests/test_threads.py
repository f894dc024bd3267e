"""Engine state per thread: grad mode, inference mode, op watchers (checkpointing,
the memory tracker) and dispatch modes belong to the thread that set them; anomaly mode is
process-wide, as in PyTorch. Threads training side by side get bit-identical results to the
same runs one after the other."""
import threading

import numpy as np
import pytest
import torch

import tapegrad
import tapegrad.nn as nn
import tapegrad.nn.functional as F
from tapegrad.autograd.engine import DispatchMode, WATCH, watchers
from tapegrad.utils.checkpoint import checkpoint


def _in_thread(fn):
    out, err = [], []

    def run():
        try:
            out.append(fn())
        except BaseException as e:  # noqa: BLE001 - handed back to the test
            err.append(e)

    t = threading.Thread(target=run)
    t.start()
    t.join()
    if err:
        raise err[0]
    return out[0]


@pytest.mark.parametrize("lib", [tapegrad, torch], ids=["tapegrad", "torch"])
def test_grad_mode_set_in_a_thread_stays_there(lib):
    _in_thread(lambda: lib.set_grad_enabled(False))
    assert lib.is_grad_enabled()
    with lib.no_grad():
        assert _in_thread(lib.is_grad_enabled)  # a new thread starts with grad mode on
        assert not lib.is_grad_enabled()
    with lib.inference_mode():
        assert not _in_thread(lib.is_inference_mode_enabled)
    assert lib.is_grad_enabled()


def test_no_grad_blocks_exiting_in_crossed_order_restore_each_thread():
    entered = [threading.Event(), threading.Event()]
    leave = [threading.Event(), threading.Event()]
    seen = {}

    def worker(i):
        with tapegrad.no_grad():
            entered[i].set()
            leave[i].wait()
        seen[i] = tapegrad.is_grad_enabled()

    ts = [threading.Thread(target=worker, args=(i,)) for i in range(2)]
    for t in ts:
        t.start()
    for e in entered:
        e.wait()
    leave[0].set()  # thread 0 entered first and leaves first: crossed with thread 1
    ts[0].join()
    leave[1].set()
    ts[1].join()
    assert seen == {0: True, 1: True}
    assert tapegrad.is_grad_enabled()


def test_other_threads_record_while_one_is_in_no_grad_or_backward():
    x = tapegrad.randn(3, requires_grad=True)
    inside, done = threading.Event(), threading.Event()

    def quiet():
        with tapegrad.no_grad():
            inside.set()
            done.wait()

    t = threading.Thread(target=quiet)
    t.start()
    inside.wait()
    y = (x * 2).sum()  # recorded here although another thread is in no_grad
    done.set()
    t.join()
    assert y.requires_grad and y.grad_fn is not None


def _model(seed):
    rng = np.random.default_rng(seed)
    m = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 3))
    with tapegrad.no_grad():
        for p in m.parameters():
            p.copy_(tapegrad.tensor(rng.standard_normal(p.shape) * 0.3, dtype=p.dtype))
    return m.double()


def _train(seed, steps=40, barrier=None):
    """A training run with no_grad blocks, checkpointing and the memory tracker in it."""
    m = _model(seed)
    rng = np.random.default_rng(100 + seed)
    x = tapegrad.tensor(rng.standard_normal((32, 6)))
    y = tapegrad.tensor(rng.integers(0, 3, 32))
    opt = tapegrad.optim.Adam(m.parameters(), lr=1e-2)
    losses = []
    for step in range(steps):
        if barrier is not None and step % 10 == 0:
            barrier.wait()
        opt.zero_grad()
        if step % 3 == 0:
            h = checkpoint(lambda a: m[2](m[1](m[0](a))), x, use_reentrant=False)
            out = m[4](m[3](h))
        else:
            out = m(x)
        loss = F.cross_entropy(out, y)
        if step % 4 == 0:
            with tapegrad.profiler.memory():
                loss.backward()
        else:
            loss.backward()
        with tapegrad.no_grad():
            losses.append(loss.item())
            assert not m(x).requires_grad
        opt.step()
    return losses, [p.detach().numpy().copy() for p in m.parameters()]


def test_threads_training_side_by_side_match_sequential_runs_bitwise():
    n = 4
    expected = [_train(s) for s in range(n)]
    for _ in range(3):
        barrier = threading.Barrier(n)
        results = [None] * n
        errors = []

        def worker(i):
            try:
                results[i] = _train(i, barrier=barrier)
            except BaseException as e:  # noqa: BLE001
                errors.append(e)
                barrier.abort()

        ts = [threading.Thread(target=worker, args=(i,)) for i in range(n)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        assert not errors, errors
        for (el, ep), (gl, gp) in zip(expected, results):
            assert el == gl
            for a, b in zip(ep, gp):
                np.testing.assert_array_equal(a, b)
    assert not WATCH


def test_checkpoint_in_one_thread_sees_only_its_own_ops():
    w = tapegrad.randn(8, 8, dtype=tapegrad.float64, requires_grad=True)
    x = tapegrad.randn(4, 8, dtype=tapegrad.float64)
    start, ran, stop = threading.Event(), threading.Event(), threading.Event()
    other_grads = []

    def busy():  # records ops while the main thread is inside a checkpointed segment
        v = tapegrad.randn(5, dtype=tapegrad.float64, requires_grad=True)
        start.wait()
        while True:
            (v.exp() * v).sum().backward()
            ran.set()
            if stop.is_set():
                break
        other_grads.append(v.grad)

    t = threading.Thread(target=busy)
    t.start()

    def segment(a):
        start.set()
        h = a
        for i in range(200):
            h = (h @ w).tanh()
            if i == 100:
                assert ran.wait(10)  # the other thread has recorded ops inside the segment
        return h

    out = checkpoint(segment, x, use_reentrant=False)
    stop.set()
    t.join()
    out.sum().backward()
    g_ckpt = w.grad.numpy().copy()
    w.grad = None
    h = x
    for _ in range(200):
        h = (h @ w).tanh()
    h.sum().backward()
    np.testing.assert_array_equal(g_ckpt, w.grad.numpy())
    assert other_grads[0] is not None


def test_memory_tracker_lists_only_its_threads_ops():
    inside, done = threading.Event(), threading.Event()

    def other():
        a = tapegrad.randn(50, 50)
        inside.wait()
        for _ in range(20):
            a = a.sin()
        done.set()

    t = threading.Thread(target=other)
    t.start()
    with tapegrad.profiler.memory() as m:
        x = tapegrad.randn(10, 10)
        inside.set()
        done.wait()
        x.exp()
    t.join()
    assert "exp" in m.ops and "sin" not in m.ops


def test_anomaly_mode_is_process_wide_as_in_pytorch():
    for lib in (torch, tapegrad):
        with lib.autograd.detect_anomaly():
            assert _in_thread(lib.is_anomaly_enabled)
        assert not _in_thread(lib.is_anomaly_enabled)

    def nan_backward():
        y = tapegrad.tensor([-1.0], requires_grad=True)
        y.sqrt().sum().backward()

    _in_thread(nan_backward)  # anomaly mode off: nan passes silently
    with tapegrad.autograd.detect_anomaly():  # on in this thread: seen in the other one too
        with pytest.raises(RuntimeError, match="sqrt"):
            _in_thread(nan_backward)


def test_dispatch_mode_replaces_execution_in_its_thread_only():
    seen = []

    class Log(DispatchMode):
        def interpret(self, op, args, params):
            seen.append((threading.get_ident(), op.name))
            return op(*args, **params)

    x = tapegrad.randn(3, requires_grad=True)
    with Log():
        y = (x * 2).exp().sum()
        _in_thread(lambda: (tapegrad.randn(2) + 1).neg())
    assert [name for _, name in seen] == ["mul", "exp", "sum"]
    assert {t for t, _ in seen} == {threading.get_ident()}
    y.backward()  # the ops ran eagerly under the mode and were recorded
    np.testing.assert_allclose(x.grad.numpy(), 2 * np.exp(2 * x.detach().numpy()))
    assert not WATCH and not watchers()


def test_nested_dispatch_modes_see_ops_innermost_first():
    order = []

    class Tag(DispatchMode):
        def __init__(self, name):
            self.name = name

        def interpret(self, op, args, params):
            order.append(self.name)
            return op(*args, **params)

    x = tapegrad.randn(2)
    with Tag("outer"), Tag("inner"):
        x.exp()
    assert order == ["inner", "outer"]
