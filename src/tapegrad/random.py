"""Random number generation: ``manual_seed``, ``Generator``, ``rand``, ``randn`` ...

tapegrad has its own random stream (numpy's PCG64 behind a ``Generator`` object with
PyTorch's methods); it does not reproduce PyTorch's numbers, but it is reproducible:
``manual_seed(s)`` fixes every draw after it, and ``get_rng_state()``/``set_rng_state()``
(or ``Generator.get_state()``/``set_state()``) capture and restore the stream exactly, as a
uint8 Tensor that ``tapegrad.save`` and pickle can store, so training resumes bit-identically.

Internal entry point for other modules (dropout, nn.init, checkpointing, data loaders)::

    from tapegrad.random import numpy_rng
    rng = numpy_rng(generator)        # generator: a tapegrad.Generator or None (the default)
    mask = rng.random(shape) < keep   # draw with numpy's Generator API

``numpy_rng(None)`` is the global default generator's stream (``default_generator``, which
``manual_seed`` seeds). Always draw through it so seeding and state capture cover your draws.
To save/restore around a recomputation (checkpointing) use ``get_rng_state()`` and
``set_rng_state(state)``, or the ``fork_rng()`` context manager.
"""
import contextlib
import os

from tapegrad import dtypes
from tapegrad.backend import xp
from tapegrad.creation import size_args, check_device, float_dtype, finish, NO_SIZE, allocate
from tapegrad.creation import on_input_device
from tapegrad.tensor import Tensor

_STATE_BYTES = 48  # seed (8) + PCG64 state (16) + increment (16) + has_uint32 (4) + uinteger (4)
_DEFAULT_SEED = 67280421310721  # PyTorch's default seed, for a familiar initial_seed()


class Generator:
    """As ``torch.Generator``: an independent random stream.

    >>> g = tapegrad.Generator().manual_seed(0)
    >>> tapegrad.rand(3, generator=g)
    """

    def __init__(self, device="cpu"):
        check_device(device, "Generator")
        self.device = "cpu"
        self.manual_seed(_DEFAULT_SEED)

    def manual_seed(self, seed) -> "Generator":
        """Reseed this stream; returns ``self`` (as PyTorch)."""
        if isinstance(seed, Tensor):
            seed = seed.item()
        try:
            seed = int(seed)
        except (TypeError, ValueError):
            raise TypeError(f"manual_seed: seed must be an int, got {type(seed).__name__}") \
                from None
        self._seed = seed % (1 << 64)
        self._rng = xp.random.Generator(xp.random.PCG64(self._seed))
        return self

    def seed(self) -> int:
        """Reseed from the operating system's entropy; returns the new seed."""
        s = int.from_bytes(os.urandom(8), "little")
        self.manual_seed(s)
        return s

    def initial_seed(self) -> int:
        return self._seed

    def get_state(self) -> Tensor:
        """The full stream state as a uint8 Tensor (restore with ``set_state``)."""
        st = self._rng.bit_generator.state
        raw = (self._seed.to_bytes(8, "little")
               + st["state"]["state"].to_bytes(16, "little")
               + st["state"]["inc"].to_bytes(16, "little")
               + int(st["has_uint32"]).to_bytes(4, "little")
               + int(st["uinteger"]).to_bytes(4, "little"))
        return Tensor._make(xp.frombuffer(raw, dtype=xp.uint8).copy())

    def set_state(self, new_state) -> "Generator":
        """Restore a state from ``get_state`` (a uint8 Tensor or array of 48 bytes)."""
        data = new_state._data if isinstance(new_state, Tensor) else xp.asarray(new_state)
        if data.dtype != xp.uint8 or data.shape != (_STATE_BYTES,):
            raise RuntimeError(
                f"set_state: expected a uint8 tensor of {_STATE_BYTES} bytes from get_state(), "
                f"got dtype {data.dtype} and shape {tuple(data.shape)}")
        raw = data.tobytes()
        seed = int.from_bytes(raw[0:8], "little")
        rng = xp.random.Generator(xp.random.PCG64())
        rng.bit_generator.state = {
            "bit_generator": "PCG64",
            "state": {"state": int.from_bytes(raw[8:24], "little"),
                      "inc": int.from_bytes(raw[24:40], "little")},
            "has_uint32": int.from_bytes(raw[40:44], "little"),
            "uinteger": int.from_bytes(raw[44:48], "little"),
        }
        self._seed, self._rng = seed, rng
        return self

    def __getstate__(self):
        return {"state": self.get_state()._data.copy()}

    def __setstate__(self, d):
        self.device = "cpu"
        self.set_state(d["state"])

    def __repr__(self):
        return f"<tapegrad.Generator seed={self._seed}>"


default_generator = Generator()


def numpy_rng(generator=None):
    """The numpy ``Generator`` to draw from: ``generator``'s stream, or the default one."""
    if generator is None:
        return default_generator._rng
    if not isinstance(generator, Generator):
        raise TypeError(f"generator must be a tapegrad.Generator, got "
                        f"{type(generator).__name__}")
    return generator._rng


def manual_seed(seed) -> Generator:
    """As ``torch.manual_seed(0)``: reseed the default generator; returns it."""
    return default_generator.manual_seed(seed)


def seed() -> int:
    """As ``torch.seed()``: reseed the default generator nondeterministically."""
    return default_generator.seed()


def initial_seed() -> int:
    """As ``torch.initial_seed()``."""
    return default_generator.initial_seed()


def get_rng_state() -> Tensor:
    """As ``torch.get_rng_state()``: the default generator's state (a uint8 Tensor)."""
    return default_generator.get_state()


def set_rng_state(new_state) -> None:
    """As ``torch.set_rng_state(state)``."""
    default_generator.set_state(new_state)


@contextlib.contextmanager
def fork_rng(enabled=True, devices=None, **_ignored):
    """As ``torch.random.fork_rng()``: the default stream is restored on exit."""
    if not enabled:
        yield
        return
    state = get_rng_state()
    try:
        yield
    finally:
        set_rng_state(state)


# --- sampling -----------------------------------------------------------------------------
_LOW_PRECISION_BITS = {"float16": 11, "bfloat16": 8}


def uniform_array(rng, shape, d):
    """Uniform [0, 1) draws of dtype ``d`` (never exactly 1 after rounding)."""
    bits = _LOW_PRECISION_BITS.get(d.name)
    if bits is not None:  # a random multiple of 2**-bits: exact in the narrow type
        return (rng.integers(0, 1 << bits, size=shape) * 2.0 ** -bits).astype(d.np)
    if d.np in (xp.float32, xp.float64):
        return rng.random(shape, dtype=d.np)
    raise TypeError(f"uniform: expected a floating-point dtype, got {d}")


def normal_array(rng, shape, d):
    """Standard normal draws of dtype ``d``."""
    if d.np in (xp.float32, xp.float64):
        return rng.standard_normal(shape, dtype=d.np)
    if dtypes.is_floating(d):
        return rng.standard_normal(shape, dtype=xp.float32).astype(d.np)
    raise TypeError(f"normal: expected a floating-point dtype, got {d}")


def _vmapped(name, shape, draw, inputs=()):
    """Under ``tapegrad.func.vmap``: the draw ``draw(shape)``, batched as the levels'
    ``randomness`` says (or refused); None outside vmap."""
    from tapegrad.autograd.grad_mode import state

    if not state.modes:
        return None
    from tapegrad.func._vmap import random_draw

    return random_draw(name, shape, draw, inputs)


def rand(*args, size=NO_SIZE, generator=None, dtype=None, device=None,
         requires_grad=False) -> Tensor:
    """As ``torch.rand(2, 3)``: uniform on [0, 1)."""
    dev = check_device(device, "rand")
    d = float_dtype(dtype, "rand")
    shape = size_args(args, "rand", size)
    v = _vmapped("rand", shape, lambda s: uniform_array(numpy_rng(generator), s, d))
    if v is not None:
        return v
    return finish(allocate("rand", shape, d, uniform_array, numpy_rng(generator), shape, d),
                  requires_grad, "rand", dev)


def randn(*args, size=NO_SIZE, generator=None, dtype=None, device=None,
          requires_grad=False) -> Tensor:
    """As ``torch.randn(2, 3)``: standard normal."""
    dev = check_device(device, "randn")
    d = float_dtype(dtype, "randn")
    shape = size_args(args, "randn", size)
    v = _vmapped("randn", shape, lambda s: normal_array(numpy_rng(generator), s, d))
    if v is not None:
        return v
    return finish(allocate("randn", shape, d, normal_array, numpy_rng(generator), shape, d),
                  requires_grad, "randn", dev)


def randint(low, high=None, size=None, *, generator=None, dtype=None, device=None,
            requires_grad=False) -> Tensor:
    """As ``torch.randint(10, (3,))`` or ``torch.randint(2, 10, (3,))``: ints in [low, high)."""
    dev = check_device(device, "randint")
    if size is None and isinstance(high, (tuple, list)):
        low, high, size = 0, low, high
    if size is None:
        raise TypeError("randint: missing the required argument 'size' (a tuple of ints)")
    if high is None:
        low, high = 0, low
    low, high = int(low), int(high)
    if low >= high:
        raise RuntimeError(f"randint: expects 'from' to be less than 'to', but got "
                           f"from={low} >= to={high}")
    d = dtypes.int64 if dtype is None else dtypes.to_dtype(dtype)
    shape = size_args((size,), "randint")
    v = _vmapped("randint", shape, lambda s: numpy_rng(generator).integers(
        low, high, size=s).astype(d.np))
    if v is not None:
        return v
    values = allocate("randint", shape, dtypes.int64, numpy_rng(generator).integers, low, high,
                      size=shape)
    return finish(values.astype(d.np), requires_grad, "randint", dev)


def randperm(n, *, generator=None, dtype=None, device=None, requires_grad=False) -> Tensor:
    """As ``torch.randperm(5)``: a random permutation of ``0 .. n-1`` (int64)."""
    dev = check_device(device, "randperm")
    n = int(n)
    if n < 0:
        raise RuntimeError(f"randperm: n must be non-negative, got {n}")
    d = dtypes.int64 if dtype is None else dtypes.to_dtype(dtype)
    values = allocate("randperm", (n,), dtypes.int64, numpy_rng(generator).permutation, n)
    return finish(values.astype(d.np), requires_grad, "randperm", dev)


def _like_check(name, input):
    if not isinstance(input, Tensor):
        raise TypeError(f"{name}: expected a Tensor, got {type(input).__name__}")


def _on_device_of(input, device, requires_grad, make):
    """``make(device, requires_grad)`` for a ``*_like`` factory: on a device input, drawn on the
    host from tapegrad's generator, then copied to the input's device (docs/differences.md)."""
    if not on_input_device(input, device):
        return make(device, requires_grad)
    return make(None, False).to(input.device).requires_grad_(requires_grad)


def rand_like(input, *, generator=None, dtype=None, device=None, requires_grad=False) -> Tensor:
    """As ``torch.rand_like(x)``: uniform [0, 1) of ``x``'s shape and dtype."""
    _like_check("rand_like", input)
    return _on_device_of(input, device, requires_grad, lambda dev, rg: rand(
        input.shape, generator=generator, dtype=dtype or input.dtype, device=dev,
        requires_grad=rg))


def randn_like(input, *, generator=None, dtype=None, device=None, requires_grad=False) -> Tensor:
    """As ``torch.randn_like(x)``."""
    _like_check("randn_like", input)
    return _on_device_of(input, device, requires_grad, lambda dev, rg: randn(
        input.shape, generator=generator, dtype=dtype or input.dtype, device=dev,
        requires_grad=rg))


def randint_like(input, low, high=None, *, generator=None, dtype=None, device=None,
                 requires_grad=False) -> Tensor:
    """As ``torch.randint_like(x, 10)``: ints of ``x``'s shape and dtype."""
    _like_check("randint_like", input)
    return _on_device_of(input, device, requires_grad, lambda dev, rg: randint(
        low, high, input.shape, generator=generator, dtype=dtype or input.dtype, device=dev,
        requires_grad=rg))


def normal(mean=0.0, std=1.0, size=None, *, generator=None, dtype=None, device=None,
           requires_grad=False) -> Tensor:
    """As ``torch.normal``: ``normal(mean_tensor, std_tensor)`` (broadcast), ``normal(mean,
    std_tensor)``, ``normal(mean_tensor, std)`` or ``normal(0., 1., size=(2, 3))``.

    The result carries no graph (PyTorch's normal has zero gradient w.r.t. mean and std).
    """
    dev = check_device(device, "normal")
    rng = numpy_rng(generator)
    tensors = [a for a in (mean, std) if isinstance(a, Tensor)]
    if not tensors:
        if size is None:
            raise TypeError("normal: with float mean and std, pass size=(...) too")
        if std < 0:
            raise RuntimeError(f"normal: expects std >= 0.0, but found std {std}")
        d = float_dtype(dtype, "normal")
        shape = size_args((size,), "normal")
        v = _vmapped("normal", shape, lambda s: (mean + std * normal_array(rng, s, d)).astype(
            d.np, copy=False))
        if v is not None:
            return v
        values = mean + std * allocate("normal", shape, d, normal_array, rng, shape, d)
        return finish(values.astype(d.np, copy=False), requires_grad, "normal", dev)
    m = mean._data if isinstance(mean, Tensor) else mean
    s = std._data if isinstance(std, Tensor) else std
    d = dtypes.result_type(*tensors)
    if not dtypes.is_floating(d):
        raise TypeError(f"normal: expected floating-point mean/std, got {d}")
    if (xp.asarray(s) < 0).any():
        raise RuntimeError("normal: expects all elements of std >= 0.0")
    shape = xp.broadcast_shapes(xp.shape(m), xp.shape(s))
    values = m + s * normal_array(rng, shape, d)
    return finish(xp.asarray(values, dtype=d.np), requires_grad, "normal", dev)


def bernoulli(input, p=None, *, generator=None) -> Tensor:
    """As ``torch.bernoulli(probs)``: 1 with probability ``probs`` (or ``p``), else 0; the
    result has ``input``'s dtype and no graph."""
    _like_check("bernoulli", input)
    v = _vmapped("bernoulli", input.shape,
                 lambda s: numpy_rng(generator).random(s).astype(input._data.dtype), (input,))
    if v is not None:  # under vmap: uniform draws against the (possibly batched) probabilities
        return (v < (input if p is None else p)).to(input.dtype)
    probs = input._data if p is None else p
    if xp.any((xp.asarray(probs) < 0) | (xp.asarray(probs) > 1)) or xp.any(xp.isnan(probs)):
        raise RuntimeError("bernoulli: expects all probabilities p to satisfy 0 <= p <= 1")
    draws = numpy_rng(generator).random(input.shape) < probs
    return Tensor._make(draws.astype(input._data.dtype))


def multinomial(input, num_samples, replacement=False, *, generator=None) -> Tensor:
    """As ``torch.multinomial(weights, n)``: indices drawn by (unnormalised) row weights."""
    _like_check("multinomial", input)
    w = input._data.astype(xp.float64)
    if w.ndim not in (1, 2):
        raise RuntimeError(f"multinomial: prob_dist must be 1 or 2 dim, got {w.ndim}")
    if (w < 0).any() or not xp.isfinite(w).all():
        raise RuntimeError("multinomial: probability tensor contains either inf, nan or "
                           "element < 0")
    rows = w.reshape(-1, w.shape[-1])
    if not replacement and num_samples > rows.shape[1]:
        raise RuntimeError(f"multinomial: cannot sample n_sample={num_samples} > "
                           f"prob_dist.size(-1)={rows.shape[1]} samples without replacement")
    rng = numpy_rng(generator)
    out = xp.empty((rows.shape[0], num_samples), dtype=xp.int64)
    for r, row in enumerate(rows):
        total = row.sum()
        if total <= 0:
            raise RuntimeError("multinomial: invalid multinomial distribution (sum of "
                               "probabilities <= 0)")
        out[r] = rng.choice(row.size, size=num_samples, replace=replacement, p=row / total)
    return Tensor._make(out.reshape(w.shape[:-1] + (num_samples,)))


__all__ = ["Generator", "default_generator", "manual_seed", "seed", "initial_seed",
           "get_rng_state", "set_rng_state", "rand", "randn", "randint", "randperm",
           "rand_like", "randn_like", "randint_like", "normal", "bernoulli", "multinomial"]
