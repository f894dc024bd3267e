"""The op battery on a device against the cpu: each row of the op tables
(``tests/ops/test_ops_more.py`` and ``tests/ops/test_ops_more2.py``, the rows ``check_op`` runs against PyTorch) and a list of
central ops and layers, run once on the cpu and once with the same inputs moved to ``device``;
values and gradients must agree (float64, 1e-12 relative) and every output and gradient of the
device run must live on the device.

Used by ``tests/test_device_backend.py`` with the fake device (the seam test) and by
``tests/gpu/run.sh`` on a real GPU.
"""
import os

import numpy as np

import tapegrad
from helpers import make_inputs

RTOL = 1e-12


def _tensors(arrays, dev):
    out = []
    for a in arrays:
        if not isinstance(a, np.ndarray):
            out.append(a)
            continue
        t = tapegrad.tensor(a)
        if dev is not None:
            t = t.to(dev)
        t.requires_grad_(a.dtype.kind == "f")
        out.append(t)
    return out


def _outs(o):
    if isinstance(o, (tuple, list)):
        return [x for x in o if isinstance(x, tapegrad.Tensor)]
    return [o]


def _host(t):
    return tapegrad.backend.to_host(t.detach()._data)


def _close(a, b, what, rtol):
    assert a.shape == b.shape, f"{what}: shape {a.shape} != {b.shape}"
    assert a.dtype == b.dtype, f"{what}: dtype {a.dtype} != {b.dtype}"
    if a.dtype.kind in "biu":
        np.testing.assert_array_equal(a, b, err_msg=what)
        return
    scale = float(np.max(np.abs(np.nan_to_num(b)))) if b.size else 1.0
    np.testing.assert_allclose(a, b, rtol=rtol, atol=rtol * max(scale, 1e-300), err_msg=what)


def run(fn, specs, dev, kw=None, seed=0, rtol=RTOL):
    """``fn(tapegrad, *inputs)`` on the cpu and on ``dev``: the same values and gradients.
    Returns False (nothing compared) for a row whose cpu run raises (a row checking an error)."""
    kw = {k: v for k, v in (kw or {}).items() if k in ("low", "high", "away_from")}
    arrays = make_inputs(specs, seed, **kw)
    results = []
    for d in (None, dev):
        ins = _tensors(arrays, d)
        if d is None:
            try:
                outs = _outs(fn(tapegrad, *ins))
            except Exception:
                return False
        else:
            outs = _outs(fn(tapegrad, *ins))
        grads = []
        floats = [o for o in outs if o.requires_grad]
        if floats:
            rng = np.random.default_rng(seed + 1)
            seeds = [tapegrad.tensor(rng.standard_normal(o.shape).astype(_host(o).dtype))
                     for o in floats]
            if d is not None:
                seeds = [s.to(d) for s in seeds]
            tapegrad.autograd.backward(floats, seeds)
            grads = [t.grad for t in ins if isinstance(t, tapegrad.Tensor) and t.requires_grad]
        if d is not None:
            for i, o in enumerate(outs + [g for g in grads if g is not None]):
                assert str(o.device).startswith(str(tapegrad.device(dev))), \
                    f"result {i} is on {o.device}, not {dev} (an op left the device)"
                assert isinstance(o._data, tapegrad.backend.backend_of(o._data).xp.ndarray)
        results.append(([_host(o) for o in outs],
                        [None if g is None else _host(g) for g in grads]))
    (cpu_o, cpu_g), (dev_o, dev_g) = results
    for i, (a, b) in enumerate(zip(dev_o, cpu_o)):
        _close(a, b, f"output {i}", rtol)
    for i, (a, b) in enumerate(zip(dev_g, cpu_g)):
        assert (a is None) == (b is None), f"gradient {i}: None on one device only"
        if a is not None:
            _close(a, b, f"gradient {i}", rtol)
    return True


def _F():
    return tapegrad.nn.functional


def _idx(*v):
    return np.array(v, dtype=np.int64)


# the central ops: elementwise, reduce, movement, indexing, linalg, nn
CENTRAL = [
    ("add mul div", lambda T, a, b: (a + b) * a / (b * b + 1) - 2.5 * a, [(3, 4), (4,)]),
    ("exp log tanh", lambda T, a: T.exp(a).log() + T.tanh(a) + T.sigmoid(a), [(3, 4)]),
    ("pow sqrt abs", lambda T, a: T.sqrt(T.abs(a) + 1) ** 1.5 + a ** 2, [(3, 4)]),
    ("relu gelu", lambda T, a: T.relu(a) + T.nn.functional.gelu(a), [(3, 4)]),
    ("where maximum", lambda T, a, b: T.where(a > b, a, b) + T.maximum(a, b), [(3, 4), (3, 4)]),
    ("clamp", lambda T, a: T.clamp(a, -0.5, 0.5), [(3, 4)]),
    ("sum mean", lambda T, a: (a.sum(), a.sum(1), a.mean(0, keepdim=True)), [(3, 4)]),
    ("var std", lambda T, a: (a.var(1), a.std()), [(3, 4)]),
    ("max min", lambda T, a: (a.max(), a.max(1)[0], a.min(0).values), [(3, 4)]),
    ("logsumexp", lambda T, a: T.logsumexp(a, 1), [(3, 4)]),
    ("argmax", lambda T, a: (a.argmax(1), a * 1), [(3, 4)]),
    ("reshape permute", lambda T, a: a.reshape(4, 3).permute(1, 0).transpose(0, 1) * 1,
     [(3, 4)]),
    ("view flatten", lambda T, a: a.view(2, 6).flatten() + 0, [(3, 4)]),
    ("expand unsqueeze", lambda T, a: a.unsqueeze(0).expand(2, 3, 4) * 1, [(3, 4)]),
    ("cat stack", lambda T, a, b: (T.cat([a, b]), T.stack([a, b], 1)), [(3, 4), (3, 4)]),
    ("split chunk", lambda T, a: tuple(T.split(a, 2, 1)) + tuple(a.chunk(3, 0)), [(3, 4)]),
    ("basic index", lambda T, a: (a[1], a[:, 1:3], a[..., -1]), [(3, 4)]),
    ("int index", lambda T, a, i: a[i], [(3, 4), _idx(2, 0, 2)]),
    ("mask index", lambda T, a: a[a > 0], [(3, 4)]),
    ("gather", lambda T, a, i: T.gather(a, 1, i), [(3, 4), np.array([[0, 1], [3, 3], [2, 0]])]),
    ("index_select", lambda T, a, i: T.index_select(a, 0, i), [(3, 4), _idx(2, 0)]),
    ("matmul", lambda T, a, b: a @ b, [(3, 4), (4, 5)]),
    ("bmm", lambda T, a, b: T.bmm(a, b), [(2, 3, 4), (2, 4, 5)]),
    ("linear", lambda T, x, w, b: T.nn.functional.linear(x, w, b), [(5, 4), (3, 4), (3,)]),
    ("softmax", lambda T, a: (T.softmax(a, 1), T.log_softmax(a, -1)), [(3, 4)]),
    ("cross_entropy", lambda T, a, y: T.nn.functional.cross_entropy(a, y),
     [(4, 3), _idx(0, 2, 1, 2)]),
    ("layer_norm", lambda T, x, w, b: T.nn.functional.layer_norm(x, (4,), w, b),
     [(3, 4), (4,), (4,)]),
    ("conv2d", lambda T, x, w, b: T.nn.functional.conv2d(x, w, b, padding=1),
     [(2, 2, 5, 5), (3, 2, 3, 3), (3,)]),
    ("mse_loss", lambda T, a, b: T.nn.functional.mse_loss(a, b), [(3, 4), (3, 4)]),
    ("embedding", lambda T, w, i: T.nn.functional.embedding(i, w), [(5, 3), _idx(1, 4, 1, 0)]),
    ("max_pool2d", lambda T, x: T.nn.functional.max_pool2d(x, 2), [(2, 3, 4, 4)]),
    ("avg_pool2d", lambda T, x: T.nn.functional.avg_pool2d(x, 3, 2, 1), [(2, 3, 5, 5)]),
    ("batch_norm", lambda T, x, w, b: T.nn.functional.batch_norm(
        x, None, None, w, b, training=True), [(5, 3), (3,), (3,)]),
    ("sort topk", lambda T, a: (T.sort(a, 1)[0], T.topk(a, 2)[0]), [(3, 4)]),
    ("zeros_like ones_like", lambda T, a: T.zeros_like(a) + T.ones_like(a) * a
     + T.full_like(a, 2.0), [(3, 4)]),
]


# ops still reaching numpy directly (or composites building cpu tensors) for device data:
# listed in docs/differences.md, "Devices"; a row here that starts passing fails the seam test
# (tests/test_device_backend.py), so the list only shrinks
KNOWN = {
    "copysign", "take", "index_add", "index_add method",
    "cumprod zeros", "gradient coordinates", "median", "median dim",
    "nanmedian", "kthvalue", "quantile", "quantile interpolation", "nanquantile", "cov",
    "cov weights", "corrcoef", "put", "scatter_reduce sum", "scatter_reduce mean",
    "scatter_reduce prod", "scatter_reduce prod zeros", "scatter_reduce amax",
    "scatter_reduce amin", "index_reduce", "block_diag", "combinations", "float_power",
    "sgn rsub",
}


def rows():
    """(name, fn, specs, kw) for every battery row: the central ops, then the op tables."""
    import sys

    from helpers import TESTS

    if os.path.join(TESTS, "ops") not in sys.path:  # the op tables' folder
        sys.path.insert(0, os.path.join(TESTS, "ops"))
    import test_ops_more
    import test_ops_more2

    out = [(n, f, s, {}) for n, f, s in CENTRAL]
    for table in (test_ops_more.UNARY, test_ops_more.BINARY, test_ops_more.COMPOSITE,
                  test_ops_more2.OPS):
        out += [(n, f, s, kw) for n, f, s, kw in table]
    return out
