"""tapegrad's random stream: seeding, generators, saveable state, distributions."""
import io
import pickle

import numpy as np
import pytest

import tapegrad


def values(t):
    return t.numpy().copy()


def test_manual_seed_reproduces():
    tapegrad.manual_seed(123)
    a = values(tapegrad.rand(4, 5))
    b = values(tapegrad.randn(3))
    tapegrad.manual_seed(123)
    np.testing.assert_array_equal(values(tapegrad.rand(4, 5)), a)
    np.testing.assert_array_equal(values(tapegrad.randn(3)), b)
    assert tapegrad.initial_seed() == 123
    assert not np.array_equal(values(tapegrad.rand(4, 5)), a)


def test_generator_is_independent_of_global_stream():
    g = tapegrad.Generator().manual_seed(7)
    tapegrad.manual_seed(0)
    a = values(tapegrad.rand(3, generator=g))
    tapegrad.rand(10)  # the default stream moves; g does not
    g2 = tapegrad.Generator().manual_seed(7)
    np.testing.assert_array_equal(values(tapegrad.rand(3, generator=g2)), a)
    assert tapegrad.Generator().manual_seed(1) is not None
    assert g.initial_seed() == 7
    with pytest.raises(TypeError, match="tapegrad.Generator"):
        tapegrad.rand(2, generator=np.random.default_rng(0))


def test_state_roundtrip_resumes_bit_identically():
    tapegrad.manual_seed(5)
    tapegrad.randn(17)
    state = tapegrad.get_rng_state()
    assert state.dtype == tapegrad.uint8 and state.shape == (48,)
    expected = [values(tapegrad.randn(5)), values(tapegrad.rand(2, dtype=tapegrad.float64)),
                values(tapegrad.randint(0, 100, (4,))), values(tapegrad.randperm(6))]
    # through pickle (what tapegrad.save stores) and back
    buf = io.BytesIO()
    pickle.dump(state, buf)
    tapegrad.manual_seed(999)
    tapegrad.set_rng_state(pickle.loads(buf.getvalue()))
    got = [values(tapegrad.randn(5)), values(tapegrad.rand(2, dtype=tapegrad.float64)),
           values(tapegrad.randint(0, 100, (4,))), values(tapegrad.randperm(6))]
    for e, g in zip(expected, got):
        np.testing.assert_array_equal(g, e)
    with pytest.raises(RuntimeError, match="48 bytes"):
        tapegrad.set_rng_state(tapegrad.zeros(3, dtype=tapegrad.uint8))


def test_generator_pickles_with_its_position():
    g = tapegrad.Generator().manual_seed(11)
    tapegrad.rand(5, generator=g)
    g2 = pickle.loads(pickle.dumps(g))
    np.testing.assert_array_equal(values(tapegrad.rand(4, generator=g)),
                                  values(tapegrad.rand(4, generator=g2)))
    g3 = tapegrad.Generator()
    g3.set_state(g.get_state())
    np.testing.assert_array_equal(values(tapegrad.randn(4, generator=g)),
                                  values(tapegrad.randn(4, generator=g3)))


def test_fork_rng_restores():
    tapegrad.manual_seed(3)
    with tapegrad.random.fork_rng():
        tapegrad.rand(100)
    a = values(tapegrad.rand(3))
    tapegrad.manual_seed(3)
    np.testing.assert_array_equal(values(tapegrad.rand(3)), a)


def test_numpy_rng_entry_point_draws_from_the_default_stream():
    tapegrad.manual_seed(21)
    a = tapegrad.random.numpy_rng().random(3)
    tapegrad.manual_seed(21)
    np.testing.assert_array_equal(tapegrad.random.numpy_rng(None).random(3), a)
    g = tapegrad.Generator().manual_seed(2)
    assert tapegrad.random.numpy_rng(g) is g._rng


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64"])
def test_rand_dtypes_and_range(dtype):
    d = getattr(tapegrad, dtype)
    x = tapegrad.rand(2000, dtype=d)
    assert x.dtype == d
    v = x.numpy().astype(np.float64)
    assert v.min() >= 0 and v.max() < 1 and 0.45 < v.mean() < 0.55
    n = tapegrad.randn(4000, dtype=d).numpy().astype(np.float64)
    assert abs(n.mean()) < 0.1 and 0.9 < n.std() < 1.1


def test_factory_arguments():
    assert tapegrad.rand(2, 3).shape == (2, 3) and tapegrad.rand((2, 3)).shape == (2, 3)
    assert tapegrad.randn(2, requires_grad=True).requires_grad
    assert tapegrad.rand(3).dtype == tapegrad.float32
    with pytest.raises(TypeError, match="floating-point"):
        tapegrad.rand(2, dtype=tapegrad.int64)
    with pytest.raises(RuntimeError, match="cpu only"):
        tapegrad.randn(2, device="cuda")
    with pytest.raises(RuntimeError, match="negative dimension"):
        tapegrad.rand(2, -1)


def test_randint_randperm():
    tapegrad.manual_seed(0)
    r = tapegrad.randint(3, 7, (1000,))
    assert r.dtype == tapegrad.int64 and r.numpy().min() == 3 and r.numpy().max() == 6
    r2 = tapegrad.randint(5, (2, 2))
    assert r2.shape == (2, 2) and r2.numpy().max() < 5
    assert tapegrad.randint(0, 2, (3,), dtype=tapegrad.int32).dtype == tapegrad.int32
    with pytest.raises(RuntimeError, match="less than 'to'"):
        tapegrad.randint(5, 2, (3,))
    p = tapegrad.randperm(10)
    assert p.dtype == tapegrad.int64 and sorted(p.tolist()) == list(range(10))
    assert tapegrad.randperm(0).shape == (0,)


def test_like_variants():
    x = tapegrad.zeros(2, 3, dtype=tapegrad.float64)
    assert tapegrad.rand_like(x).dtype == tapegrad.float64
    assert tapegrad.randn_like(x).shape == (2, 3)
    i = tapegrad.randint_like(tapegrad.zeros(4, dtype=tapegrad.int64), 10)
    assert i.dtype == tapegrad.int64 and i.numpy().max() < 10
    with pytest.raises(TypeError, match="floating-point"):
        tapegrad.rand_like(tapegrad.zeros(2, dtype=tapegrad.int64))


def test_normal_variants():
    tapegrad.manual_seed(1)
    m = tapegrad.full((20000,), 3.0, dtype=tapegrad.float64)
    x = tapegrad.normal(m, 2.0).numpy()
    assert abs(x.mean() - 3) < 0.1 and abs(x.std() - 2) < 0.1
    x = tapegrad.normal(0.0, tapegrad.full((3, 20000), 0.5)).numpy()
    assert x.shape == (3, 20000) and abs(x.std() - 0.5) < 0.02
    x = tapegrad.normal(tapegrad.zeros(2, 1), tapegrad.ones(3))
    assert x.shape == (2, 3) and x.dtype == tapegrad.float32
    assert tapegrad.normal(1.0, 2.0, size=(2,)).shape == (2,)
    assert tapegrad.normal(1.0, 2.0, (2,), dtype=tapegrad.float64).dtype == tapegrad.float64
    with pytest.raises(TypeError, match="size"):
        tapegrad.normal(0.0, 1.0)
    with pytest.raises(RuntimeError, match="std >= 0"):
        tapegrad.normal(tapegrad.zeros(2), -1.0)


def test_bernoulli_and_multinomial():
    tapegrad.manual_seed(2)
    p = tapegrad.full((20000,), 0.3, dtype=tapegrad.float64)
    b = tapegrad.bernoulli(p)
    assert b.dtype == tapegrad.float64 and set(np.unique(b.numpy())) <= {0.0, 1.0}
    assert abs(b.numpy().mean() - 0.3) < 0.02
    assert abs(tapegrad.bernoulli(p, 0.8).numpy().mean() - 0.8) < 0.02
    with pytest.raises(RuntimeError, match="0 <= p <= 1"):
        tapegrad.bernoulli(tapegrad.full((2,), 1.5))
    w = tapegrad.tensor([[0.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    assert tapegrad.multinomial(w, 1).tolist() == [[1], [0]]
    s = tapegrad.multinomial(tapegrad.ones(5), 5)
    assert sorted(s.tolist()) == [0, 1, 2, 3, 4]
    with pytest.raises(RuntimeError, match="without replacement"):
        tapegrad.multinomial(tapegrad.ones(2), 3)


def test_inplace_samplers():
    tapegrad.manual_seed(4)
    x = tapegrad.empty(20000, dtype=tapegrad.float64)
    v0 = x._version[0]
    x.uniform_(-2, 3)
    assert x._version[0] == v0 + 1
    assert x.numpy().min() >= -2 and x.numpy().max() < 3 and abs(x.numpy().mean() - 0.5) < 0.05
    x.normal_(1.0, 0.5)
    assert abs(x.numpy().mean() - 1.0) < 0.02 and abs(x.numpy().std() - 0.5) < 0.02
    x.bernoulli_(0.25)
    assert abs(x.numpy().mean() - 0.25) < 0.02
    g = tapegrad.Generator().manual_seed(9)
    a = values(tapegrad.empty(4).normal_(generator=g))
    g.manual_seed(9)
    np.testing.assert_array_equal(values(tapegrad.empty(4).normal_(generator=g)), a)
    with pytest.raises(RuntimeError, match="can't be cast"):
        tapegrad.zeros(2, dtype=tapegrad.int64).normal_()
    with pytest.raises(RuntimeError, match="leaf Variable"):
        tapegrad.zeros(2, requires_grad=True).normal_()
    with tapegrad.no_grad():
        tapegrad.zeros(2, requires_grad=True).uniform_()


def test_state_through_tapegrad_save(tmp_path):
    tapegrad.manual_seed(8)
    tapegrad.rand(3)
    path = tmp_path / "rng.pt"
    tapegrad.save({"rng": tapegrad.get_rng_state()}, path)
    a = values(tapegrad.randn(6))
    tapegrad.manual_seed(0)
    tapegrad.set_rng_state(tapegrad.load(path)["rng"])
    np.testing.assert_array_equal(values(tapegrad.randn(6)), a)
