"""Gradient checkpointing: exact (bitwise) gradients, memory actually traded, every path."""
import gc

import numpy as np
import pytest
import torch

import tapegrad
from tapegrad.utils.checkpoint import checkpoint, checkpoint_sequential
from helpers import assert_close

F64 = tapegrad.float64


def _weights(n, width=5, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((width, width)) * 0.6 for _ in range(n)]


def _leaves(arrays):
    return [tapegrad.tensor(a, requires_grad=True) for a in arrays]


def _grads(ts):
    return [t.grad.numpy().copy() for t in ts]


def _assert_bitwise(a, b):
    assert len(a) == len(b)
    for i, (x, y) in enumerate(zip(a, b)):
        assert x.dtype == y.dtype and x.shape == y.shape
        assert np.array_equal(x, y), f"gradient {i} differs: max |diff| {np.abs(x - y).max()}"


def _block(h, w1, w2, b):
    # diamond (h used twice), broadcasting (b), saves="out" ops and saves="inputs" ops
    z = (h @ w1).tanh()
    return (z * h + b).sigmoid() @ w2 + z.exp() * 0.1


def _run_block(ckpt, arrays):
    h, w1, w2, b = leaves = _leaves(arrays)
    x = h * 1.5  # the segment's input is a non-leaf
    y = checkpoint(_block, x, w1, w2, b) if ckpt else _block(x, w1, w2, b)
    (y * y).sum().backward()
    return _grads(leaves)


def test_checkpoint_bitwise_equal_float64():
    rng = np.random.default_rng(1)
    arrays = [rng.standard_normal(s) for s in [(4, 5), (5, 5), (5, 5), (5,)]]
    _assert_bitwise(_run_block(False, arrays), _run_block(True, arrays))


def test_checkpoint_matches_torch():
    rng = np.random.default_rng(2)
    arrays = [rng.standard_normal(s) for s in [(4, 5), (5, 5), (5, 5), (5,)]]
    got = _run_block(True, arrays)
    ts = [torch.tensor(a, requires_grad=True) for a in arrays]
    h, w1, w2, b = ts
    x = h * 1.5
    y = torch.utils.checkpoint.checkpoint(_block, x, w1, w2, b, use_reentrant=False)
    (y * y).sum().backward()
    for g, t in zip(got, ts):
        assert_close(g, t.grad)


@pytest.mark.parametrize("segments", [1, 2, 3, 6, None])
def test_checkpoint_sequential_bitwise(segments):
    ws = _weights(6)
    x0 = np.random.default_rng(3).standard_normal((3, 5))

    def run(ckpt):
        weights = _leaves(ws)
        x = tapegrad.tensor(x0, requires_grad=True)
        layers = [lambda h, w=w: (h @ w).relu() for w in weights]
        if ckpt:
            h = checkpoint_sequential(layers, segments, x)
        else:
            h = x
            for f in layers:
                h = f(h)
        (h * h).sum().backward()
        return _grads([x] + weights)

    _assert_bitwise(run(False), run(True))


def test_checkpoint_sequential_argument_forms():
    ws = _leaves(_weights(4))
    layers = [lambda h, w=w: (h @ w).tanh() for w in ws]
    x = tapegrad.tensor(np.ones((2, 5)))
    ref = x
    for f in layers:
        ref = f(ref)
    for out in (checkpoint_sequential(layers, x), checkpoint_sequential(layers, input=x),
                checkpoint_sequential(layers, 2, x)):
        assert np.array_equal(out.detach().numpy(), ref.detach().numpy())
    with pytest.raises(TypeError, match="missing the input"):
        checkpoint_sequential(layers, 2)
    with pytest.raises(ValueError, match="segments"):
        checkpoint_sequential(layers, 0, x)


def test_closure_parameters_and_autograd_grad():
    w = tapegrad.tensor(_weights(1)[0], requires_grad=True)
    x0 = np.random.default_rng(4).standard_normal((3, 5))

    def f(h):
        return (h @ w).sigmoid() * h  # w reaches the segment only through the closure

    grads = []
    for ckpt in (False, True):
        x = tapegrad.tensor(x0, requires_grad=True)
        y = checkpoint(f, x) if ckpt else f(x)
        gx, gw = tapegrad.autograd.grad((y * y).sum(), [x, w])
        grads.append([gx.numpy(), gw.numpy()])
        assert x.grad is None and w.grad is None  # autograd.grad leaves .grad alone
    _assert_bitwise(*grads)


def test_multiple_outputs():
    rng = np.random.default_rng(5)
    arrays = [rng.standard_normal((3, 4)), rng.standard_normal((3, 4))]

    def f(a, b):
        return a * b, (a - b).tanh()

    results = []
    for ckpt in (False, True):
        a, b = _leaves(arrays)
        p, q = checkpoint(f, a, b) if ckpt else f(a, b)
        (p.sum() + (q * p).sum()).backward()
        results.append(_grads([a, b]))
    _assert_bitwise(*results)


def test_create_graph_second_order():
    x0 = np.random.default_rng(6).standard_normal((2, 3))
    w0 = np.random.default_rng(7).standard_normal((3, 3))

    def f(h, w):
        return ((h @ w).tanh() * h).exp()

    def second(lib, ckpt):
        x = lib.tensor(x0, requires_grad=True)
        w = lib.tensor(w0, requires_grad=True)
        if lib is torch:
            y = torch.utils.checkpoint.checkpoint(f, x, w, use_reentrant=False) if ckpt \
                else f(x, w)
        else:
            y = checkpoint(f, x, w) if ckpt else f(x, w)
        gx, gw = lib.autograd.grad(y.sum(), [x, w], create_graph=True)
        ((gx * gx).sum() + (gw * gw).sum()).backward()
        return [x.grad, w.grad]

    plain, ckpt, ref = second(tapegrad, False), second(tapegrad, True), second(torch, False)
    _assert_bitwise([g.numpy() for g in plain], [g.numpy() for g in ckpt])
    for g, t in zip(ckpt, ref):
        assert_close(g, t)


def test_dropout_inside_replays_the_same_mask():
    p = 0.5
    w0 = _weights(1)[0]
    x0 = np.random.default_rng(8).standard_normal((6, 5))

    def f(h, w):
        mask = tapegrad.rand(h.shape, dtype=F64) > p  # drawn from tapegrad's RNG stream
        return ((h * mask) * (1 / (1 - p))) @ w

    results = []
    for ckpt in (False, True):
        tapegrad.manual_seed(123)
        x = tapegrad.tensor(x0, requires_grad=True)
        w = tapegrad.tensor(w0, requires_grad=True)
        y = checkpoint(f, x, w) if ckpt else f(x, w)
        after_forward = tapegrad.get_rng_state()
        (y * y).sum().backward()
        # the recomputation rewinds the stream and then puts it back where it was
        assert np.array_equal(tapegrad.get_rng_state().numpy(), after_forward.numpy())
        results.append(_grads([x, w]) + [y.detach().numpy().copy()])
    _assert_bitwise(*results)
    assert 0 < (results[0][0] == 0).sum() < x0.size  # the mask really dropped some


def test_nn_modules_with_dropout():
    nn = tapegrad.nn
    results = []
    for ckpt in (False, True):
        tapegrad.manual_seed(0)
        model = nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Dropout(0.3), nn.Linear(8, 8),
                              nn.ReLU(), nn.Linear(8, 2)).double()
        x = tapegrad.tensor(np.random.default_rng(9).standard_normal((4, 5)))
        tapegrad.manual_seed(1)
        y = checkpoint_sequential(model, 2, x) if ckpt else model(x)
        (y * y).sum().backward()
        results.append([p.grad.numpy().copy() for p in model.parameters()])
    _assert_bitwise(*results)


def test_nested_checkpoints():
    ws = _weights(3, seed=10)
    x0 = np.random.default_rng(11).standard_normal((2, 5))

    def run(ckpt):
        w1, w2, w3 = weights = _leaves(ws)
        x = tapegrad.tensor(x0, requires_grad=True)

        def inner(h):
            return (h @ w2).tanh()

        def outer(h):
            h = (h @ w1).sigmoid()
            h = checkpoint(inner, h) if ckpt else inner(h)
            return h @ w3

        y = checkpoint(outer, x) if ckpt else outer(x)
        (y * y).sum().backward()
        return _grads([x] + weights)

    _assert_bitwise(run(False), run(True))


def test_backward_twice_and_retain_graph():
    w = tapegrad.tensor(_weights(1)[0], requires_grad=True)
    x = tapegrad.tensor(np.ones((2, 5)), requires_grad=True)
    loss = checkpoint(lambda h: (h @ w).tanh(), x).sum()
    loss.backward(retain_graph=True)
    first = w.grad.numpy().copy()
    loss.backward()
    assert np.array_equal(w.grad.numpy(), 2 * first)
    with pytest.raises(RuntimeError, match="second time"):
        loss.backward()


def test_inplace_change_of_a_checkpointed_input_is_caught():
    w = tapegrad.tensor(_weights(1)[0], requires_grad=True)
    x = tapegrad.tensor(np.ones((2, 5)), requires_grad=True)
    h = x * 2
    loss = checkpoint(lambda t: (t @ w).tanh(), h).sum()
    with tapegrad.no_grad():
        h.mul_(3)  # the segment's stored input changes before backward
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()


def test_nondeterministic_segment_is_reported():
    x = tapegrad.tensor(np.ones(3), requires_grad=True)
    calls = [0]

    def f(h):
        calls[0] += 1
        return h.exp() if calls[0] == 1 else h.tanh().sigmoid()

    y = checkpoint(f, x)
    with pytest.raises(RuntimeError, match="recomputation recorded different ops"):
        y.sum().backward()


def test_under_no_grad_it_just_runs():
    x = tapegrad.tensor(np.ones(3), requires_grad=True)
    with tapegrad.no_grad():
        y = checkpoint(lambda h: h.exp(), x)
    assert y.grad_fn is None and np.allclose(y.numpy(), np.e)


def test_activations_are_freed_and_recomputed():
    depth, width = 16, 64
    ws = [tapegrad.tensor(w) for w in _weights(depth, width)]
    for w in ws:
        w.requires_grad_()
    x = tapegrad.tensor(np.random.default_rng(12).standard_normal((256, width)))
    layers = [lambda h, w=w: (h @ w).relu() for w in ws]
    peaks = {}
    for ckpt in (False, True):
        gc.collect()
        with tapegrad.profiler.memory(per_op=False) as m:
            if ckpt:
                h = checkpoint_sequential(layers, 4, x)
            else:
                h = x
                for f in layers:
                    h = f(h)
            held = m.live_bytes
            h.sum().backward()
        peaks[ckpt] = (held, m.peak_bytes)
    act = 256 * width * 8
    assert peaks[False][0] >= depth * act  # one saved activation per layer
    # checkpointed: 3 stored segment inputs + the last (plain) segment's 4 activations
    assert peaks[True][0] < 9 * act
    assert peaks[True][1] < 0.6 * peaks[False][1]


# --- selective checkpointing: keep matmul outputs, recompute the elementwise ops ---------
def _count_matmuls():
    from tapegrad.ops.registry import REGISTRY

    op = REGISTRY["matmul"]
    forward, calls = op.forward, [0]

    def counting(*a, **k):
        calls[0] += 1
        return forward(*a, **k)

    op.forward = counting
    return calls, lambda: setattr(op, "forward", forward)


def _selective_run(mode, ws, x0):
    from tapegrad.utils.checkpoint import selective, create_selective_checkpoint_contexts
    from tapegrad.utils.checkpoint import CheckpointPolicy
    import functools

    weights = _leaves(ws)
    x = tapegrad.tensor(x0, requires_grad=True)

    def block(h):
        for w in weights:
            z = (h @ w).tanh()
            h = (z * h).sigmoid() * z  # several elementwise ops that save tensors
        return h

    def policy(ctx, op, *arrays, **params):
        return CheckpointPolicy.MUST_SAVE if op.name == "matmul" else \
            CheckpointPolicy.PREFER_RECOMPUTE

    calls, restore = _count_matmuls()
    try:
        if mode == "plain":
            y = block(x)
        elif mode == "full":
            y = checkpoint(block, x)
        elif mode == "list":
            y = checkpoint(block, x, context_fn=selective(["matmul"]))
        else:
            y = checkpoint(block, x, context_fn=functools.partial(
                create_selective_checkpoint_contexts, policy))
        forward_calls = calls[0]
        (y * y).sum().backward()
    finally:
        restore()
    return _grads([x] + weights), forward_calls, calls[0] - forward_calls


def test_selective_policy_exact_and_skips_matmul_recompute():
    ws = _weights(3, seed=13)
    x0 = np.random.default_rng(14).standard_normal((4, 5))
    plain, fwd, bwd_plain = _selective_run("plain", ws, x0)
    full, _, bwd_full = _selective_run("full", ws, x0)
    assert bwd_full == bwd_plain + fwd  # plain checkpointing reruns every matmul
    for mode in ("list", "policy"):
        grads, _, bwd = _selective_run(mode, ws, x0)
        _assert_bitwise(plain, grads)
        assert bwd == bwd_plain  # the matmul outputs were replayed, not recomputed
    _assert_bitwise(plain, full)


def test_selective_policy_memory_between_plain_and_full():
    from tapegrad.utils.checkpoint import selective

    width = 64
    ws = [tapegrad.tensor(w, requires_grad=True) for w in _weights(4, width, seed=15)]
    x = tapegrad.tensor(np.random.default_rng(16).standard_normal((128, width)))

    def block(h):
        for w in ws:
            z = (h @ w).tanh()
            h = (z * h).sigmoid() * z
        return h

    held = {}
    for mode in ("plain", "selective", "full"):
        gc.collect()
        with tapegrad.profiler.memory(per_op=False) as m:
            if mode == "plain":
                y = block(x)
            else:
                y = checkpoint(block, x, context_fn=selective() if mode == "selective"
                               else checkpoint.__kwdefaults__["context_fn"])
            held[mode] = m.live_bytes
            del y
    act = 128 * width * 8
    assert held["full"] < 2.5 * act  # the output (and the stored input is x itself)
    assert 4 * act <= held["selective"] < 6.5 * act  # + one matmul output per layer
    assert held["plain"] > 11.5 * act  # z, the sigmoid and the product, per layer


def test_selective_policy_rejects_unknown_ops():
    from tapegrad.utils.checkpoint import selective

    x = tapegrad.tensor(np.ones(3), requires_grad=True)
    with pytest.raises(ValueError, match="unknown ops"):
        checkpoint(lambda h: h.exp(), x, context_fn=selective(["no_such_op"]))


def test_user_autograd_function_inside_a_segment():
    class Cube(tapegrad.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x * x * x

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            return 3 * g * x * x

    results = []
    for ckpt in (False, True):
        x = tapegrad.tensor(np.linspace(-1, 1, 6).reshape(2, 3), requires_grad=True)
        w = tapegrad.tensor(np.eye(3) * 0.7, requires_grad=True)

        def f(h):
            return Cube.apply((h @ w).tanh()).sigmoid() * h

        y = checkpoint(f, x) if ckpt else f(x)
        (y * y).sum().backward()
        results.append(_grads([x, w]))
    _assert_bitwise(*results)
