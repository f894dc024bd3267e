"""A compiled function is never stale: every piece of Python state its trace read is guarded
(or is a graph input), so a call after that state changed retraces (or runs eagerly) and
returns what eager returns. Each test changes one piece of state between calls and compares
the compiled result with eager's: values bitwise (the graph runs the same numpy arithmetic as
eager, with the pure-numpy kernels) and dtype."""
import threading

import numpy as np
import pytest

import tapegrad as tg
import tapegrad.nn as nn
from tapegrad.compiler import guards


@pytest.fixture(autouse=True)
def _numpy_kernels(monkeypatch):
    """The pure-numpy kernels: bit-identical to eager by construction."""
    monkeypatch.setenv("TAPEGRAD_COMPILE_KERNELS", "numpy")


def _same(got, want):
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    g, w = got.detach().numpy(), want.detach().numpy()
    np.testing.assert_array_equal(g, w)
    np.testing.assert_array_equal(np.signbit(g), np.signbit(w))  # (-0.0 == 0.0 above)


def _twice(c, *args):
    """Call twice: the second call runs the compiled graph (a hit)."""
    c(*args)
    c = getattr(c, "_compiled", c)  # (compile(model): its CompiledFunction)
    hits = c.n_hits
    c(*args)
    assert c.n_hits == hits + 1


# --- containers passed as arguments: guarded by structure and element types ----------------
def test_list_argument_appended_in_place():
    f = tg.compile(lambda xs: sum(xs))
    x = tg.arange(3.0)
    xs = [x, x * 2]
    _twice(f, xs)
    xs.append(x * 10)
    _same(f(xs), sum(xs))


def test_list_of_floats_changed_in_place():
    f = tg.compile(lambda t, fs: t * fs[0] + fs[1])
    t = tg.arange(3.0)
    fs = [1.0, 2.0]
    _twice(f, t, fs)
    fs[0] = 5.0
    _same(f(t, fs), t * 5.0 + 2.0)


def test_tensors_in_a_fresh_list_are_read_from_this_call():
    """Tensors inside a container argument are bound by their place, as top-level ones: a new
    list of new tensors of the same shapes hits the cache and reads the new values."""
    f = tg.compile(lambda xs: xs[0] * xs[1] + xs[2]["b"])
    rng = np.random.default_rng(0)
    for k in range(4):
        xs = [tg.tensor(rng.standard_normal(3)) for _ in range(2)]
        xs.append({"b": tg.tensor(rng.standard_normal(3))})
        _same(f(xs), xs[0] * xs[1] + xs[2]["b"])
    assert len(f.entries) == 1 and f.n_hits == 3


def test_tensors_in_a_keyword_container_are_read_from_this_call():
    f = tg.compile(lambda x, *, extra: x + extra["w"] * extra["b"][0])
    rng = np.random.default_rng(1)
    x = tg.ones(3)
    for k in range(3):
        extra = {"w": tg.tensor(rng.standard_normal(3)), "b": (tg.tensor(rng.standard_normal(3)),)}
        _same(f(x, extra=extra), x + extra["w"] * extra["b"][0])
    assert len(f.entries) == 1 and f.n_hits == 2


def test_one_tensor_twice_inside_a_list_is_part_of_the_key():
    f = tg.compile(lambda xs: xs[0] * 2 + xs[1])
    a, b = tg.arange(3.0), tg.ones(3)
    _twice(f, [a, b])
    _same(f([a, a]), a * 2 + a)
    c = tg.full((3,), 7.0)
    _same(f([c, b]), c * 2 + b)


def test_tuple_of_int_then_equal_float_changes_the_dtype():
    f = tg.compile(lambda i, s: i * s[0])
    i = tg.tensor([1, 2, 3])
    _twice(f, i, (2,))
    _same(f(i, (2.0,)), i * 2.0)  # float32, as eager; (2,) == (2.0,) in Python
    _same(f(i, (2,)), i * 2)


def test_tuple_of_bool_then_equal_int_changes_the_dtype():
    f = tg.compile(lambda b, s: b + s[0])
    b = tg.tensor([True, False])
    _twice(f, b, (True,))
    _same(f(b, (1,)), b + 1)  # int64, as eager; (True,) == (1,) in Python


def test_signed_zero_is_a_different_literal():
    f = tg.compile(lambda t, s: t * s)
    t = tg.tensor([1.0, -1.0])
    _twice(f, t, 0.0)
    _same(f(t, -0.0), t * -0.0)


def test_too_large_a_container_runs_eagerly_with_a_reason():
    f = tg.compile(lambda t, xs: t * len(xs))
    t = tg.ones(2)
    xs = list(range(guards._LIMIT + 1))
    _same(f(t, xs), t * len(xs))
    xs.append(1)
    _same(f(t, xs), t * len(xs))
    assert not f.entries and any("too large" in b.reason for b in f.breaks)


# --- module-level state: globals, functions, classes --------------------------------------
W = tg.full((3,), 2.0)
SCALE = 3.0
HISTORY = [tg.ones(3)]


def helper(x):
    return x + 1


class Config:
    k = 2.0


def _reads_w(x):
    return x * W


def _calls_helper(x):
    return helper(x) * SCALE


def _reads_history(x):
    return x + sum(HISTORY)


def _reads_class_attribute(x):
    return x * Config.k


def _inner_lambda_reads_global(x):
    return (lambda y: y * SCALE)(x)


@pytest.fixture
def _restore_globals():
    saved = dict(W=W, SCALE=SCALE, helper=helper, HISTORY=list(HISTORY), k=Config.k)
    yield
    g = globals()
    g.update(W=saved["W"], SCALE=saved["SCALE"], helper=saved["helper"])
    HISTORY[:] = saved["HISTORY"]
    Config.k = saved["k"]


def test_module_level_tensor_rebound(_restore_globals):
    global W
    f = tg.compile(_reads_w)
    x = tg.arange(3.0)
    _twice(f, x)
    W = tg.full((3,), 5.0)
    _same(f(x), x * 5.0)


def _reads_w_then_reads_a_value(x):
    y = x * W
    if y.sum().item() > 0:  # a value read: the function is compiled as pieces (replayed)
        return y + W
    return y - W


def _step_reads_w_then_item(x):
    y = (x * W).sum()
    return y, y.item()  # a read after the last op: one graph, the Python replayed


@pytest.mark.parametrize("fn", [_reads_w_then_reads_a_value, _step_reads_w_then_item])
def test_rebound_global_in_a_replayed_function(fn, _restore_globals):
    """Functions whose calls rerun their Python (value reads) match each op and its inputs
    against the trace: a rebound global is a different input, so that call runs eagerly."""
    global W
    f = tg.compile(fn)
    x = tg.arange(3.0)
    _twice(f, x)
    assert type(f.entries[0]).__name__ in ("SplitEntry", "TailEntry")
    W = tg.full((3,), -5.0)
    got, want = f(x), fn(x)
    for g, w in zip(got if isinstance(got, tuple) else (got,),
                    want if isinstance(want, tuple) else (want,)):
        if isinstance(w, float):
            assert g == w
        else:
            _same(g, w)


def test_global_function_and_number_rebound(_restore_globals):
    global helper, SCALE
    f = tg.compile(_calls_helper)
    x = tg.arange(3.0)
    _twice(f, x)
    helper = lambda x: x * 7  # noqa: E731
    _same(f(x), x * 7 * 3.0)
    SCALE = 4.0
    _same(f(x), x * 7 * 4.0)


def test_global_read_inside_a_nested_function(_restore_globals):
    global SCALE
    f = tg.compile(_inner_lambda_reads_global)
    x = tg.arange(3.0)
    _twice(f, x)
    SCALE = -1.0
    _same(f(x), x * -1.0)


def test_global_list_appended(_restore_globals):
    f = tg.compile(_reads_history)
    x = tg.arange(3.0)
    _twice(f, x)
    HISTORY.append(tg.full((3,), 5.0))
    _same(f(x), x + sum(HISTORY))


def test_class_attribute_changed(_restore_globals):
    f = tg.compile(_reads_class_attribute)
    x = tg.arange(3.0)
    _twice(f, x)
    Config.k = 4.0
    _same(f(x), x * 4.0)


class _Slotted:
    __slots__ = ("scale",)

    def __init__(self, scale):
        self.scale = scale


def test_slots_field_of_an_object_changed():
    cfg = _Slotted(2.0)
    f = tg.compile(lambda x: x * cfg.scale)
    x = tg.arange(3.0)
    _twice(f, x)
    cfg.scale = -5.0
    _same(f(x), x * -5.0)


def test_closure_cell_rebound():
    scale = tg.full((3,), 2.0)

    def f(x):
        return x * scale

    c = tg.compile(f)
    x = tg.arange(3.0)
    _twice(c, x)
    scale = tg.full((3,), -3.0)  # noqa: F841 - read through the closure cell
    _same(c(x), f(x))


def _scaler(k):
    box = [k]
    return lambda x: x * box[0], box


def test_two_closures_of_one_code_object_are_both_guarded():
    (first, box1), (second, box2) = _scaler(2.0), _scaler(3.0)
    f = tg.compile(lambda x: first(x) + second(x))
    x = tg.arange(3.0)
    _twice(f, x)
    box1[0] = -1.0
    _same(f(x), x * -1.0 + x * 3.0)
    _twice(f, x)
    box2[0] = 5.0
    _same(f(x), x * -1.0 + x * 5.0)


def test_a_library_objects_method_reading_its_fields():
    """``sched.get_last_lr()`` used as a number is a literal of the graph: the fields its
    code reads are guarded, so the next LR retraces (as torch.compile recompiles)."""
    w = tg.ones(3, requires_grad=True)
    opt = tg.optim.SGD([w], lr=1.0)
    sched = tg.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    f = tg.compile(lambda x: x * sched.get_last_lr()[0])
    x = tg.arange(3.0)
    with tg.no_grad():
        _twice(f, x)
        opt.step()
        sched.step()
        _same(f(x), x * 0.5)


def test_a_compiled_training_step_with_a_scheduler_compiles_once():
    """The optimizer's and scheduler's ``step()`` run inside the graph (effect nodes): the
    state they change each call (the LR, step counts) is not guarded."""
    w = tg.ones(3, requires_grad=True)
    opt = tg.optim.Adam([w], lr=0.1)
    sched = tg.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)

    def step(x):
        opt.zero_grad()
        loss = (x * w).sum()
        loss.backward()
        opt.step()
        sched.step()
        return loss

    c = tg.compile(step)
    x = tg.arange(3.0)
    for _ in range(6):
        c(x)
    assert len(c.entries) <= 2 and c.n_hits == 6 - len(c.entries)


def test_mutable_default_argument_changed():
    def f(x, scales=[2.0]):  # noqa: B006 - the mutable default is the point
        return x * scales[0]

    c = tg.compile(f)
    x = tg.arange(3.0)
    _twice(c, x)
    f.__defaults__[0][0] = -1.0
    _same(c(x), x * -1.0)


def test_partial_of_a_function_reading_a_global(_restore_globals):
    import functools

    global SCALE
    c = tg.compile(functools.partial(_calls_helper))
    x = tg.arange(3.0)
    _twice(c, x)
    SCALE = 9.0
    _same(c(x), (x + 1) * 9.0)


@pytest.mark.parametrize("make", [lambda ts: iter(ts), lambda ts: (t for t in ts)],
                         ids=["iterator", "generator"])
def test_a_function_pulling_from_an_iterator_runs_eagerly(make):
    """What ``next()`` returns next is hidden in the iterator's state: no guard can see it,
    so the function is never compiled (each call eager, exact)."""
    ts = [tg.full((2,), float(k)) for k in range(6)]
    it = make(ts)
    f = tg.compile(lambda x: x + next(it))
    x = tg.ones(2)
    for k in range(6):
        _same(f(x), x + float(k))
    assert not f.entries and any("position" in b.reason for b in f.breaks)


def test_a_function_drawing_python_random_numbers_runs_eagerly():
    import random

    rng = random.Random(0)
    f = tg.compile(lambda x: x * rng.random())
    x = tg.ones(2)
    for _ in range(3):
        state = rng.getstate()
        got = f(x)
        rng.setstate(state)
        _same(got, x * rng.random())
    assert not f.entries and any("random numbers" in b.reason for b in f.breaks)


def test_state_the_function_itself_changes_is_never_baked():
    """A compiled graph does not replay Python side effects: a function that moves state it
    reads must see a guard fail each call (a retrace, eager), never a stale answer."""
    box = {"n": 0.0}

    def f(x):
        box["n"] += 1.0
        return x * box["n"]

    c = tg.compile(f)
    x = tg.ones(2)
    for k in range(1, 5):
        _same(c(x), x * float(k))
    assert box["n"] == 4.0


# --- modules: submodules, parameters, tensor attributes, hooks ------------------------------
class _Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 2)
        self.scale = tg.full((2,), 2.0)

    def forward(self, x):
        return self.lin(x) * self.scale


def _nets():
    tg.manual_seed(0)
    return _Net(), tg.arange(6.0).reshape(2, 3)


@pytest.mark.parametrize("how", ["compile(model)", "compiled closure"])
def test_submodule_replaced(how):
    model, x = _nets()
    f = tg.compile(model) if how == "compile(model)" else tg.compile(lambda x: model(x))
    with tg.no_grad():
        _twice(f, x)
        model.lin = nn.Linear(3, 2)
        _same(f(x), model(x))


@pytest.mark.parametrize("how", ["compile(model)", "compiled closure"])
def test_parameter_and_tensor_attribute_replaced(how):
    model, x = _nets()
    f = tg.compile(model) if how == "compile(model)" else tg.compile(lambda x: model(x))
    with tg.no_grad():
        _twice(f, x)
        model.lin.weight = nn.Parameter(tg.ones(2, 3))
        _same(f(x), model(x))
        model.scale = tg.full((2,), -1.0)
        _same(f(x), model(x))


class _Scaled(nn.Module):
    factor = 2.0  # a class attribute the forward reads

    def forward(self, x):
        return x * self.factor


def test_module_class_attribute_changed():
    model, x = _Scaled(), tg.arange(3.0)
    f = tg.compile(model)
    with tg.no_grad():
        _twice(f, x)
        _Scaled.factor = -4.0
        try:
            _same(f(x), x * -4.0)
        finally:
            _Scaled.factor = 2.0


class _Remembers(nn.Module):
    def forward(self, x):
        self.last_shape = tuple(x.shape)  # a plain value set again each call: equal, new
        return x * 2


def test_module_setting_an_equal_plain_value_each_call_compiles():
    model, x = _Remembers(), tg.arange(3.0)
    f = tg.compile(model)
    with tg.no_grad():
        for _ in range(5):
            _same(f(x), x * 2)
    f = f._compiled
    assert len(f.entries) <= 2 and f.n_hits == 5 - len(f.entries)


def test_forward_hook_added_after_compiling():
    model, x = _nets()
    f = tg.compile(lambda x: model(x))
    with tg.no_grad():
        _twice(f, x)
        handle = model.lin.register_forward_hook(lambda m, args, out: out + 100)
        _same(f(x), model(x))
        handle.remove()
        _same(f(x), model(x))


def test_training_step_with_an_unchanged_model_compiles_once():
    model, x = _nets()
    opt = tg.optim.SGD(model.parameters(), lr=0.1)

    def step(x):
        opt.zero_grad()
        loss = model(x).sum()
        loss.backward()
        opt.step()
        return loss

    c = tg.compile(step)
    for _ in range(5):
        c(x)
    assert len(c.entries) <= 2 and c.n_hits == 5 - len(c.entries)


# --- thread-local modes ---------------------------------------------------------------------
def test_traced_in_autocast_called_outside():
    a = tg.arange(16.0).reshape(4, 4) / 7
    f = tg.compile(lambda a: a @ a)
    with tg.autocast("cpu"):
        _twice(f, a)
        want = a @ a
        _same(f(a), want)  # (bfloat16: the trace records autocast's casts)
    _same(f(a), a @ a)  # float32


def test_traced_outside_autocast_called_inside():
    a = tg.arange(16.0).reshape(4, 4) / 7
    f = tg.compile(lambda a: a @ a)
    _twice(f, a)
    with tg.autocast("cpu"):
        got, want = f(a), a @ a
    assert want.dtype == tg.bfloat16
    _same(got, want)


def test_autocast_dtype_is_part_of_the_guard():
    a = tg.arange(16.0).reshape(4, 4) / 7
    f = tg.compile(lambda a: a @ a)
    with tg.autocast("cpu", dtype=tg.bfloat16):
        _twice(f, a)
    with tg.autocast("cpu", dtype=tg.float16):
        got, want = f(a), a @ a
    assert want.dtype == tg.float16
    _same(got, want)


def test_default_dtype_changed():
    f = tg.compile(lambda i: i * 1.5)
    i = tg.tensor([1, 2, 3])
    _twice(f, i)
    prev = tg.get_default_dtype()
    tg.set_default_dtype(tg.float64)
    try:
        got, want = f(i), i * 1.5
    finally:
        tg.set_default_dtype(prev)
    assert want.dtype == tg.float64
    _same(got, want)


def test_grad_and_inference_mode():
    w = tg.ones(3, requires_grad=True)
    f = tg.compile(lambda x: x * w)
    x = tg.arange(3.0)
    _twice(f, x)
    assert f(x).requires_grad
    with tg.no_grad():
        assert not f(x).requires_grad
    with tg.inference_mode():
        got = f(x)
    assert not got.requires_grad
    _same(got, x * w)


# --- threads --------------------------------------------------------------------------------
def _chain(a, b):
    return ((a @ b).tanh() * 2 + a).sum(1)


def test_calls_of_one_compiled_function_never_overlap():
    """The graph's planned buffers are shared by its calls: a run that sleeps (as a long
    matmul releases the GIL) lets four threads overlap unless calls are serialised."""
    import time

    f = tg.compile(_chain)
    a = tg.ones(8, 8)
    _twice(f, a, a)
    entry = f.entries[0]
    run, active, most = entry.run, [0], [0]

    def slow_run(*args):
        active[0] += 1
        most[0] = max(most[0], active[0])
        time.sleep(0.005)
        try:
            return run(*args)
        finally:
            active[0] -= 1

    entry.run = slow_run
    start = threading.Barrier(4)

    def work():
        start.wait()
        for _ in range(5):
            _same(f(a, a), _chain(a, a))

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert most[0] == 1


def test_one_compiled_function_shared_by_four_threads():
    """Each thread calls with its own inputs: a graph reuses its buffers from call to call, so
    calls of one compiled function must not overlap (or run eagerly), never mix results."""
    f = tg.compile(_chain)
    rng = np.random.default_rng(0)
    warm = tg.tensor(rng.standard_normal((128, 128)))
    _twice(f, warm, warm * 2)
    wrong = []
    start = threading.Barrier(4)

    def work(k):
        rng = np.random.default_rng(k + 1)
        start.wait()
        for _ in range(30):
            a = tg.tensor(rng.standard_normal((128, 128)))
            b = tg.tensor(rng.standard_normal((128, 128)))
            got, want = f(a, b), _chain(a, b)
            if got.dtype != want.dtype or not np.array_equal(got.numpy(), want.numpy()):
                wrong.append(k)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not wrong, f"{len(wrong)}/120 wrong results"
    assert f.n_hits >= 60 and len(f.entries) == 1  # (most calls ran the compiled graph)


def test_nested_compiled_call_never_waits_on_another_thread():
    """A thread inside one compiled function that calls a second one held by another thread
    runs the second eagerly rather than wait (two threads can never wait on each other)."""
    inner = tg.compile(lambda x: x * 2)
    held, release = threading.Event(), threading.Event()

    def hold():
        with inner._lock:
            held.set()
            release.wait(10)

    outer = tg.compile(lambda x: inner(x) + 1)
    x = tg.arange(3.0)
    t = threading.Thread(target=hold)
    t.start()
    held.wait(10)
    try:
        _same(outer(x), x * 2 + 1)
        assert inner.n_contended >= 1
    finally:
        release.set()
        t.join()
