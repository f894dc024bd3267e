"""The compiler learns what it knows about a pointwise op from the op's record.

An op's scalar form (``Op.lower``: ``ops.registry.Lowering``) is the one place the fusion pass,
the numba kernel writer and numpy's fallback read: an op fuses because its record has one, and
every op marked pointwise has one or says on its record why not (``Op.not_lowered``). Each
scalar form is checked here against its op's eager forward, bit for bit, on values with the
edge cases written in (signed zeros, infinities, NaN, subnormals).
"""
import ast
import inspect
import os

import numpy as np
import pytest

import tapegrad as tg
from helpers import graph_inputs, graph_node
from tapegrad.compiler import codegen, kernels, passes
from tapegrad.compiler.ir import Graph
from tapegrad.ops.registry import REGISTRY, op

COMPILER = os.path.dirname(inspect.getsourcefile(passes))


@pytest.fixture
def _numba(monkeypatch):
    pytest.importorskip("numba")
    monkeypatch.setenv("TAPEGRAD_COMPILE_KERNELS", "numba")
    monkeypatch.delenv("TAPEGRAD_COMPILE_LIBM", raising=False)


def _same_bits(a, w):
    """Equal as IEEE bit patterns (signs of zeros included), NaN where the other is NaN."""
    a, w = np.asarray(a), np.asarray(w)
    assert a.dtype == w.dtype and a.shape == w.shape, (a.dtype, w.dtype, a.shape, w.shape)
    if a.dtype.kind != "f":
        return np.array_equal(a, w)
    nan = np.isnan(w)
    u = f"u{a.dtype.itemsize}"
    return np.array_equal(np.isnan(a), nan) and np.array_equal(a[~nan].view(u),
                                                               w[~nan].view(u))


def _values(shape, dtype, seed):
    """Normal values times 3 and in [-1.5, 1.5] with the edge cases written in."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape) * np.where(rng.random(shape) < 0.5, 3.0, 0.5)
    x = x.astype(dtype)
    tiny = np.finfo(dtype).smallest_subnormal
    edge = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, tiny, -tiny, 1.0, -1.0, 0.5, 2.0,
                     40.0, -40.0, 1e20, -1e20, 1e-20, 100.0, -100.0], dtype)
    flat = x.reshape(-1)
    if flat.size >= 2 * edge.size:
        flat[:edge.size] = edge
        flat[edge.size:2 * edge.size] = edge[::-1]  # (a second operand meets other edges)
    return x


def test_every_pointwise_op_has_a_lowering_or_says_why_not():
    """One list of what does not fuse, on the records: every op marked pointwise has a scalar
    form or a reason, never both; only pointwise ops have scalar forms."""
    missing = [o.name for o in REGISTRY.values() if o.pointwise and
               (o.lowering is None) == (o.unlowered is None)]
    assert missing == []
    assert [o.name for o in REGISTRY.values() if o.lowering and not o.pointwise] == []
    for o in REGISTRY.values():
        if o.unlowered is not None:
            assert isinstance(o.unlowered, str) and len(o.unlowered) > 20, o.name


def _name_tables(path, names):
    """Collection literals (set, list, tuple, dict keys) in a source file holding two or more
    of ``names``, with their line numbers."""
    tree = ast.parse(open(path).read())
    found = []
    for n in ast.walk(tree):
        elts = n.keys if isinstance(n, ast.Dict) else getattr(n, "elts", None)
        if not isinstance(n, (ast.Set, ast.List, ast.Tuple, ast.Dict)) or elts is None:
            continue
        hits = [e.value for e in elts if isinstance(e, ast.Constant) and e.value in names]
        if len(hits) >= 2:
            found.append((n.lineno, hits))
    return found


def test_no_table_of_pointwise_op_names_in_the_compiler():
    """Nothing in compiler/ lists pointwise ops by name: what the compiler knows about them
    is on their records."""
    names = {o.name for o in REGISTRY.values() if o.pointwise}
    bad = []
    for f in sorted(os.listdir(COMPILER)):
        if not f.endswith(".py"):
            continue
        path = os.path.join(COMPILER, f)
        bad += [(f, line, hits) for line, hits in _name_tables(path, names)]
    assert bad == []


@pytest.fixture
def cube():
    """A pointwise op registered only for the test, with a scalar form."""
    @op(flops=2, pointwise=True, name="_test_cube")
    def cube_op(a):
        return a * a * a

    cube_op.lower("(({0} * {0}) * {0})")
    yield cube_op
    del REGISTRY["_test_cube"]


def _chain(dtype, name):
    g = Graph()
    x, b = graph_inputs(g, [((40, 24), dtype), ((24,), dtype)])
    g.outputs = [graph_node(g, "mul", [graph_node(g, name, [graph_node(g, "add", [x, b])]),
                                       2.0])]
    return g


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_a_new_op_fuses_from_its_record_alone(_numba, cube, dtype):
    """A pointwise op the compiler has never heard of joins its chain's numba kernel through
    its record; without a scalar form on its record it is a node of its own."""
    g = _chain(dtype, "_test_cube")
    out = passes.fuse(g)
    assert [n.name for n in out.nodes] == ["fused"]
    assert [m.name for m in out.nodes[0].meta["nodes"]] == ["add", "_test_cube", "mul"]
    arrs = [_values((40, 24), dtype, 0), _values((24,), dtype, 1)]
    src, run = codegen.generate(out)
    assert src.count("@njit(error_model") == 1 and "* x" not in src.split("def k_")[0]
    with np.errstate(all="ignore"):  # (the edge values overflow)
        assert _same_bits(run(arrs, [None], [])[0], passes.evaluate(g, arrs)[0][0])
    cube.not_lowered("the test's op without a scalar form")
    out = passes.fuse(_chain(dtype, "_test_cube"))
    assert [n.name for n in out.nodes] == ["add", "_test_cube", "mul"]


def _arity(o, params=()):
    rule = o.lowering.operands
    if isinstance(rule, tuple):
        return len(rule)
    sig = inspect.signature(o.forward).parameters.values()
    return sum(1 for p in sig if p.default is inspect.Parameter.empty and p.name not in params)


# calls with params or literal operands beside each op's plain call
CASES = {
    "pow": [((None, 2), {}), ((None, 0.5), {}), ((None, -1), {}), ((None, 1.0), {}),
            ((None, 0), {}), ((None, 3.0), {})],
    "clamp": [((None, -0.5, 0.75), {})],
    "clamp_min": [((None, 0.25), {})],
    "clamp_max": [((None, -0.25), {})],
    "softplus": [((None,), {"beta": 2.0, "threshold": 5.0})],
    "logit": [((None,), {"eps": 0.125})],
    "nan_to_num_op": [((None,), {"nan": 1.5, "posinf": 7.0}), ((None,), {"neginf": -2.0})],
    "round": [((None,), {"decimals": 1})],
    "maximum": [((None, 0.0), {}), ((None, -0.0), {})],
    "minimum": [((None, 0.0), {}), ((None, -0.0), {})],
    "fmax": [((None, 0.0), {}), ((None, -0.0), {})],
    "fmin": [((None, 0.0), {}), ((None, -0.0), {})],
    "elu": [((None,), {"alpha": 0.5})],
    "ge": [((None, 0.0), {})],
    "where": [((None, -np.inf, None), {}), ((None, None, np.nan), {})],
    # (ops/nn.py's: used once their records have scalar forms)
    "hardtanh": [((None,), {"min_val": -0.0, "max_val": 0.5}), ((None,), {"min_val": 0.0})],
    "hardtanh_backward": [((None, None), {"min_val": -0.5, "max_val": 0.0})],
    "leaky_relu": [((None,), {"negative_slope": 0.2}), ((None,), {"negative_slope": 1.0}),
                   ((None,), {"negative_slope": 2.5}), ((None,), {"negative_slope": 0.0}),
                   ((None,), {"negative_slope": -0.5})],
    "leaky_relu_backward": [((None, None), {"negative_slope": 0.0}),
                            ((None, None), {"negative_slope": 3.0})],
    "gelu": [((None,), {"approximate": "none"}), ((None,), {"approximate": "tanh"})],
}


def _cases():
    out = []
    for o in REGISTRY.values():
        if o.lowering is None or o.name.startswith("_test"):
            continue
        if o.name == "to_dtype":  # (its dtype: the other float dtype, set by the test)
            out.append((o.name, (None,), {"dtype": None}))
            continue
        out.append((o.name, (None,) * _arity(o), {}))
        out += [(o.name, args, params) for args, params in CASES.get(o.name, [])]
    return out


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("name, args, params", _cases(),
                         ids=lambda v: v if isinstance(v, str) else None)
def test_every_scalar_form_is_the_eager_forward_bit_for_bit(_numba, dtype, name, args,
                                                               params):
    """Each op with a scalar form, its operands the group's inputs and its result read by one
    more node of the group (a ``where`` for a bool result): the compiled group equals eager's
    forward bit for bit. A form with no C-library call always compiles to numba."""
    o = REGISTRY[name]
    low = o.lowering
    rule = low.operands
    shape = (37, 29)
    specs, vals = [], []
    for i, a in enumerate(args):
        if a is not None:
            continue
        r = rule[i] if isinstance(rule, tuple) else rule
        kind = "b" if r == "bool" or low.kinds == "b" else "f"
        specs.append((shape, np.bool_ if kind == "b" else dtype))
    if name == "to_dtype":
        params = {"dtype": tg.float32 if dtype == np.float64 else tg.float64}
    g = Graph()
    ins = graph_inputs(g, specs + [(shape, dtype), (shape, dtype)])
    it = iter(ins)
    operands = [next(it) if a is None else a for a in args]
    x, y = ins[-2:]
    with np.errstate(all="ignore"):  # (graph_node runs the forward on ones: atanh(1))
        r = graph_node(g, name, operands, **params)
    if r.dtype == np.bool_:
        r = graph_node(g, "where", [r, x, y])
    elif r.dtype != dtype:  # to_dtype: read back in the dtype of the group
        r = graph_node(g, "add", [r, 1.0])
    else:
        r = graph_node(g, "add", [r, x])
    g.outputs = [r]
    arrs = [_values(s, dt, 7 + k) if np.dtype(dt).kind == "f" else
            np.random.default_rng(k).random(s) < 0.5 for k, (s, dt) in enumerate(specs)]
    arrs += [_values(shape, dtype, 3), _values(shape, dtype, 4)]
    out = passes.fuse(g)
    node = g.nodes[0]
    # a form that cannot compile here (numba's C-library call is not numpy's, nothing to
    # compute before the kernel) keeps its node out of the group, as does a call it does not take
    here = kernels.compiles(node)
    assert [n.name for n in out.nodes] == (["fused"] if here else [name, g.nodes[1].name]), (
        name, [n.name for n in out.nodes])
    src, run = codegen.generate(out)
    with np.errstate(all="ignore"):
        got = run(arrs, [None], [])[0]
        want = passes.evaluate(g, arrs)[0][0]
    assert _same_bits(got, want), name
    if here and not low.libm and not callable(low.scalar):
        assert src.count("@njit(error_model") == 1, name  # the loop, not numpy's calls


def _cube_like_op(name, traces):
    """A fresh op x**3 whose rule (3 x^2 g) is made of ops; ``traces`` marks it audited."""
    o = op(name=name, pointwise=True)(lambda x: x * x * x)
    o.not_lowered("a test op")

    @o.grad(traces=traces)
    def _(g, out, x):
        return g * x * x * 3.0

    return o


@pytest.mark.parametrize("traces", [True, False])
def test_the_rule_s_record_decides_whether_it_traces_as_ops(traces):
    """``@op.grad(traces=True)`` on the record makes the compiler's tracer record the rule's
    ops; a rule without it is one ``vjp_<op>`` node calling the rule on arrays. Either way
    the compiled gradient equals eager's."""
    from tapegrad.ops.registry import dispatch

    o = _cube_like_op(f"cube_traces_{traces}", traces)
    try:
        x = tg.tensor(np.linspace(-2.0, 2.0, 7), requires_grad=True)

        def step(x):
            y = dispatch(o, (x,), {})
            y.sum().backward()
            return y

        g = tg.compiler.trace(step, x)
        names = [n.name for n in g.nodes]
        assert (f"vjp_{o.name}" in names) is not traces
        x.grad = None
        step(x)
        want = x.grad.numpy().copy()
        f = tg.compile(step)
        for _ in range(2):
            x.grad = None
            f(x)
        assert np.array_equal(x.grad.numpy(), want)
    finally:
        REGISTRY.pop(o.name, None)


def test_the_audited_rules_are_on_their_records():
    """The core families' rules are marked traceable on their records (the tracer keeps no
    list of names)."""
    for name in ("add", "mul", "matmul", "linear", "layer_norm", "softmax", "conv2d",
                 "max_pool2d", "index", "cat", "batch_norm", "group_norm", "embedding"):
        assert REGISTRY[name].rule_traces, name
    assert not REGISTRY["cumsum"].rule_traces  # not audited: a vjp node
