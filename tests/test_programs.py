"""PyTorch programs run unchanged with tapegrad once their imports point at it.

tests/programs/ holds this project's own PyTorch programs: three short scripts (mlp, cnn,
transformer) fed their data and initial weights through globals, and programs in folders of
their own, written as people write training programs (argparse, sibling modules, a package,
checkpoints, data files). Each runs once with torch and once with only its import lines
rewritten to tapegrad; every loss and every value the program reads must agree. docs/programs.md
lists the programs and what each exercises.
"""
import contextlib
import importlib.abc
import importlib.util
import io
import os
import pathlib
import random
import re
import sys
import warnings

import numpy as np
import pytest
import torch

import tapegrad

HERE = pathlib.Path(__file__).parent / "programs"


def port(source: str) -> str:
    """The only change a user makes: the imports."""
    source = re.sub(r"^import torch\.nn\.functional as F$", "import tapegrad.nn.functional as F",
                    source, flags=re.M)
    source = re.sub(r"^import torch\.nn as nn$", "import tapegrad.nn as nn", source, flags=re.M)
    return re.sub(r"^import torch$", "import tapegrad as torch", source, flags=re.M)


def _data(name, rng):
    if name == "mlp":
        x = rng.standard_normal((32, 4))
        return {"x": x, "y": np.sin(x).sum(1, keepdims=True)}
    if name == "cnn":
        return {"x": rng.standard_normal((12, 1, 8, 8)), "y": rng.integers(0, 3, 12)}
    return {"idx": rng.integers(0, 11, (4, 9))}


def _run(source, init, data):
    losses = []
    namespace = {"INIT": init, "DATA": data, "LOSSES": losses, "__name__": "__script__"}
    exec(compile(source, "<script>", "exec"), namespace)
    return np.array(losses)


@pytest.mark.parametrize("name", ["mlp", "cnn", "transformer"])
def test_script_ports_by_changing_imports(name):
    source = (HERE / f"{name}.py").read_text()
    ported = port(source)
    changed = [(a, b) for a, b in zip(source.splitlines(), ported.splitlines()) if a != b]
    assert changed and all(a.startswith("import torch") for a, _ in changed)
    data = _data(name, np.random.default_rng(0))
    torch.manual_seed(0)
    prev = torch.get_default_dtype()
    try:
        init = _initial_state(source, data)  # torch's own initialisation, captured once
        ref = _run(source, init, data)
        got = _run(ported, init, data)
    finally:
        torch.set_default_dtype(prev)
        tapegrad.set_default_dtype(tapegrad.float32)
    assert len(got) == len(ref) > 10
    np.testing.assert_allclose(got, ref, rtol=1e-13, atol=0)


def _initial_state(source, data):
    """Run the script's model construction in torch with load_state_dict made a no-op."""
    original = torch.nn.Module.load_state_dict
    captured = {}

    def capture(self, state, *a, **k):
        captured.update({k: v.detach().numpy().copy() for k, v in self.state_dict().items()})
        raise _Stop

    torch.nn.Module.load_state_dict = capture
    try:
        _run(source, {}, data)
    except _Stop:
        pass
    finally:
        torch.nn.Module.load_state_dict = original
    return captured


class _Stop(Exception):
    pass


# ---------------------------------------------------------------------------------------------
# Programs in folders (tests/programs/<program>/): only their imports are rewritten. The test
# supplies what a user would supply from outside the program: command-line arguments, data
# files in the working directory, and one source of randomness that both libraries draw from
# (random tensors, dropout masks and shuffling come from one numpy stream, since tapegrad need
# not reproduce PyTorch's random numbers). Each module's initial weights are PyTorch's own:
# the state torch's module has at its first top-level call is loaded into tapegrad's module
# at the same call. Every loss passed to backward() and every value read with .item() by the
# program is recorded.
# ---------------------------------------------------------------------------------------------
PROGRAMS = HERE


def port_program(source: str) -> str:
    """port(), plus the other import forms programs use (one pattern per form)."""
    source = port(source)
    forms = [
        (r"^import torch\.(\w[\w.]*) as (\w+)$", r"import tapegrad.\1 as \2"),
        (r"^import torch\.(\w[\w.]*)$", r"import tapegrad.\1, tapegrad as torch"),
        (r"^from torch import ", "from tapegrad import "),
        (r"^from torch\.(\w[\w.]*) import ", r"from tapegrad.\1 import "),
    ]
    for pattern, repl in forms:
        source = re.sub(pattern, repl, source, flags=re.M)
    return source


class _SharedRandomness:
    """Random tensors, dropout masks and permutations from one numpy stream, in either library."""

    def __init__(self, lib, seed=0):
        self.lib, self.rng = lib, np.random.default_rng(seed)

    def _tensor(self, array, dtype, requires_grad=False):
        out = self.lib.tensor(array, dtype=dtype)
        return out.requires_grad_() if requires_grad else out

    @staticmethod
    def _size(args, size):
        if size is not None:
            return tuple(size)
        if len(args) == 1 and not isinstance(args[0], int):
            return tuple(args[0])
        return tuple(args)

    def patches(self):
        lib, rng = self.lib, self.rng

        def randn(*args, size=None, dtype=None, requires_grad=False, **_):
            return self._tensor(rng.standard_normal(self._size(args, size)),
                                dtype or lib.get_default_dtype(), requires_grad)

        def rand(*args, size=None, dtype=None, requires_grad=False, **_):
            return self._tensor(rng.random(self._size(args, size)),
                                dtype or lib.get_default_dtype(), requires_grad)

        def randn_like(input, *, dtype=None, requires_grad=False, **_):
            return randn(tuple(input.shape), dtype=dtype or input.dtype,
                         requires_grad=requires_grad)

        def rand_like(input, *, dtype=None, requires_grad=False, **_):
            return rand(tuple(input.shape), dtype=dtype or input.dtype,
                        requires_grad=requires_grad)

        def randint(low=None, high=None, size=None, *, dtype=None, **_):
            if low is None:  # randint(high=n, size=...), as torch's RandomSampler draws
                low = 0
            if size is None and not isinstance(high, int):  # randint(high, size)
                low, high, size = 0, low, high
            low, high = (0, low) if high is None else (low, high)
            return self._tensor(rng.integers(low, high, tuple(size)), dtype or lib.int64)

        def randperm(n, *, dtype=None, **_):
            return self._tensor(rng.permutation(n), dtype or lib.int64)

        def dropout(input, p=0.5, training=True, inplace=False):
            if not training or p == 0:
                return input
            keep = self._tensor(rng.random(tuple(input.shape)) >= p, input.dtype)
            return input.mul_(keep).div_(1 - p) if inplace else input * keep / (1 - p)

        def dropout2d(input, p=0.5, training=True, inplace=False):  # channels: dimension 1
            if not training or p == 0:
                return input
            shape = tuple(input.shape[:2]) + (1,) * (input.dim() - 2)
            keep = self._tensor(rng.random(shape) >= p, input.dtype)
            return input.mul_(keep).div_(1 - p) if inplace else input * keep / (1 - p)

        attention = lib.nn.functional.scaled_dot_product_attention

        def scaled_dot_product_attention(q, k, v, attn_mask=None, dropout_p=0.0,
                                         is_causal=False, scale=None, **kwargs):
            if dropout_p == 0:
                return attention(q, k, v, attn_mask, 0.0, is_causal, scale=scale, **kwargs)
            scores = q @ k.transpose(-2, -1) * (scale or q.size(-1) ** -0.5)
            if is_causal:
                causal = lib.ones(q.size(-2), k.size(-2), dtype=lib.bool).tril()
                scores = scores.masked_fill(~causal, float("-inf"))
            if attn_mask is not None and attn_mask.dtype == lib.bool:
                scores = scores.masked_fill(~attn_mask, float("-inf"))
            elif attn_mask is not None:
                scores = scores + attn_mask
            return dropout(lib.softmax(scores, -1), dropout_p) @ v

        functions = dict(randn=randn, rand=rand, randn_like=randn_like, rand_like=rand_like,
                         randint=randint, randperm=randperm)
        found = [(lib, k, v) for k, v in functions.items()]
        found.append((lib.nn.functional, "dropout", dropout))
        found.append((lib.nn.functional, "dropout2d", dropout2d))
        found.append((lib.nn.functional, "scaled_dot_product_attention",
                      scaled_dot_product_attention))
        data = sys.modules[lib.__name__ + ".utils.data"]
        if hasattr(data, "randperm"):  # tapegrad's samplers hold their own binding
            found.append((data, "randperm", randperm))
        if hasattr(data, "randint"):  # (RandomSampler with replacement)
            found.append((data, "randint", randint))
        return found


class _Recorder:
    """Shares initial weights and records the values the program reads, in one library."""

    def __init__(self, lib, states, filename, weights="call"):
        self.lib, self.states, self.filename, self.weights = lib, states, filename, weights
        self.values, self.seen, self.depth, self.loading = [], {}, 0, lib is not torch
        self.from_file = {}  # modules the program loaded from a checkpoint keep their state

    def _from_program(self):
        return sys._getframe(2).f_code.co_filename.startswith(self.filename)

    def patches(self):
        lib, rec = self.lib, self
        Module, Tensor = lib.nn.Module, lib.Tensor
        call, item, backward, load = Module.__call__, Tensor.item, Tensor.backward, lib.load

        def _load(*args, **kwargs):
            obj = load(*args, **kwargs)
            for module in obj.modules() if isinstance(obj, Module) else ():
                rec.from_file[id(module)] = module
            return obj

        def share(module):  # PyTorch's state of this module, captured or loaded once
            if id(module) not in rec.seen and id(module) not in rec.from_file:
                rec.seen[id(module)] = module  # kept alive so that ids stay unique
                index = len(rec.seen) - 1
                if rec.loading:
                    state = {k: lib.tensor(v) for k, v in rec.states[index].items()}
                    module.load_state_dict(state)
                else:
                    rec.states.append({k: v.detach().numpy().copy()
                                       for k, v in module.state_dict().items()})

        def __call__(module, *args, **kwargs):
            if rec.depth == 0:
                share(module)
            rec.depth += 1
            try:
                return call(module, *args, **kwargs)
            finally:
                rec.depth -= 1

        def _item(self):
            value = item(self)
            if rec._from_program():
                rec.values.append(value)
            return value

        def _backward(self, *args, **kwargs):
            if rec._from_program():
                rec.values.append(item(self.detach()))
            return backward(self, *args, **kwargs)

        found = [(Module, "__call__", __call__), (Tensor, "item", _item),
                 (Tensor, "backward", _backward), (lib, "load", _load)]
        if rec.weights == "parameters":
            parameters = Module.parameters

            def _parameters(module, *args, **kwargs):
                if rec.depth == 0 and rec._from_program():  # the program's own call
                    share(module)
                return parameters(module, *args, **kwargs)

            found.append((Module, "parameters", _parameters))
        return found


def _load_program(name):
    folder = PROGRAMS / name.split("-")[0]  # program-variant: one folder, other arguments
    files = {}  # module name -> source; a subfolder is a package (upscale's superres/)
    for p in sorted(folder.rglob("*.py")):
        parts = p.relative_to(folder).with_suffix("").parts
        files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = p.read_text()
    return files, folder


@contextlib.contextmanager
def _patched(pairs):
    saved = [(owner, attr, owner.__dict__.get(attr, _MISSING)) for owner, attr, _ in pairs]
    try:
        for owner, attr, value in pairs:
            setattr(owner, attr, value)
        yield
    finally:
        for owner, attr, value in reversed(saved):
            if value is _MISSING:
                delattr(owner, attr)
            else:
                setattr(owner, attr, value)


_MISSING = object()


def _run_program(lib, files, main, argv, states, workdir, dtype="float64", weights="call"):
    """Run the program's ``main`` file (and its sibling modules) with ``lib``; its values."""
    filename = f"<program {lib.__name__}"
    sources = files if lib is torch else {k: port_program(v) for k, v in files.items()}
    recorder = _Recorder(lib, states, filename, weights)
    saved_modules = {k: sys.modules.get(k) for k in files}
    saved_argv, saved_cwd = sys.argv, os.getcwd()
    saved_env = os.environ.get("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD")
    prev, threads = lib.get_default_dtype(), torch.get_num_threads()
    try:
        torch.set_num_threads(1)  # tiny ops: torch's thread pool only contends on a shared box
        os.chdir(workdir)
        # the programs torch.load whole models they saved, as before PyTorch 2.6
        os.environ["TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"] = "1"
        sys.argv = [f"{main}.py", *argv]
        random.seed(0)  # Python's random, for programs that draw from it unseeded
        lib.set_default_dtype(getattr(lib, dtype))
        with _patched(_SharedRandomness(lib).patches() + recorder.patches()), \
                contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for stem in files:
                sys.modules.pop(stem, None)
            sys.meta_path.insert(0, _Siblings(sources, main, filename))
            namespace = {"__name__": "__main__", "__file__": f"{main}.py"}
            exec(compile(sources[main], f"{filename} {main}.py>", "exec"), namespace)
    finally:
        sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _Siblings)]
        lib.set_default_dtype(prev)
        torch.set_num_threads(threads)
        sys.argv = saved_argv
        os.chdir(saved_cwd)
        if saved_env is None:
            os.environ.pop("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", None)
        else:
            os.environ["TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"] = saved_env
        for k, v in saved_modules.items():
            if v is None:
                sys.modules.pop(k, None)
            else:
                sys.modules[k] = v
    return np.array(recorder.values, dtype=np.float64)


class _Siblings(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """The program's other files, imported (in whatever order the program imports them) as
    top-level modules, the way Python imports them from the program's folder."""

    def __init__(self, sources, main, filename):
        self.sources, self.main, self.filename = sources, main, filename

    def find_spec(self, name, path=None, target=None):
        if name in self.sources and name != self.main:
            package = any(k.startswith(name + ".") for k in self.sources)
            return importlib.util.spec_from_loader(name, self, is_package=package)
        return None

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        name = module.__name__
        exec(compile(self.sources[name], f"{self.filename} {name}.py>", "exec"), module.__dict__)


# Data the programs read from their working directory, written before each run ---------------
def _phrases(workdir):  # char_lm: lines of a small made-up grammar
    rng = np.random.default_rng(2)
    starts, middles, ends = ["ka", "lo", "mi", "su"], ["ra", "te", "no"], ["n", "s", "x", ""]
    (workdir / "texts").mkdir()
    for split, lines in (("train", 24), ("valid", 6), ("test", 6)):
        words = (rng.choice(starts) + "".join(rng.choice(middles, rng.integers(0, 3)))
                 + rng.choice(ends) for _ in range(lines * 4))
        rows = [" ".join(next(words) for _ in range(4)) for _ in range(lines)]
        (workdir / "texts" / f"{split}.txt").write_text("\n".join(rows) + "\n")


def _waves(workdir):  # wave_forecast: six series of two mixed sines, saved as a numpy array
    rng = np.random.default_rng(3)
    t = np.arange(40) + rng.integers(0, 100, (6, 1))
    waves = np.sin(t / 6.0) + 0.5 * np.sin(t / 2.5 + rng.uniform(0, 3, (6, 1)))
    torch.save(waves, workdir / "waves.pt")

def _pictures(workdir):  # upscale: smooth random colour pictures in pictures/{train,test}
    from PIL import Image
    rng = np.random.default_rng(4)
    y, x = np.mgrid[0:27, 0:29] / 9.0
    for split, count in (("train", 8), ("test", 3)):
        folder = workdir / "pictures" / split
        folder.mkdir(parents=True)
        for i in range(count):
            phase = rng.uniform(0, 6, (3, 1, 1))
            rgb = 127.5 * (1 + np.sin(x * rng.uniform(0.5, 2) + y * rng.uniform(0.5, 2) + phase))
            Image.fromarray(rgb.transpose(1, 2, 0).astype(np.uint8)).save(folder / f"{i}.png")

def _tokens(workdir):  # tiny_gpt: uint16 token files and the vocabulary
    import json
    rng = np.random.default_rng(5)
    (workdir / "data").mkdir()
    for split, count in (("train", 400), ("val", 100)):
        ids = np.cumsum(rng.integers(1, 4, count)) % 19  # rising runs: learnable structure
        ids.astype(np.uint16).tofile(workdir / "data" / f"{split}.bin")
    (workdir / "data" / "vocab.json").write_text(json.dumps([chr(97 + i) for i in range(19)]))

def _communities(workdir):  # graph_nodes: 4 communities, denser inside; words hint at them
    rng = np.random.default_rng(6)
    nodes, words = 240, 20
    community = rng.integers(0, 4, nodes)
    ids = rng.choice(np.arange(100, 10 ** 5), nodes, replace=False)
    favour = rng.random((4, words)) < 0.3
    bits = rng.random((nodes, words)) < np.where(favour[community], 0.4, 0.05)
    bits[:3] = False  # nodes without words
    rows = [f"{i}\t" + "\t".join(map(str, b.astype(int))) + f"\tc{c}"
            for i, b, c in zip(ids, bits, community)]
    a, b = rng.integers(0, nodes, (2, 6 * nodes))
    keep = (a != b) & ((community[a] == community[b]) | (rng.random(6 * nodes) < 0.2))
    (workdir / "graph").mkdir()
    (workdir / "graph" / "nodes.tsv").write_text("\n".join(rows) + "\n")
    (workdir / "graph" / "edges.tsv").write_text(
        "".join(f"{ids[i]}\t{ids[j]}\n" for i, j in zip(a[keep], b[keep])))

def _accented_words(workdir):  # reverse_words: a few dozen words, some with accents
    words = ("café naïve über señor façade déjà élan garçon piñata soirée crème brûlée "
             "cat dog tree rock lamp milk bird fish star moon rain snow wind seed leaf root "
             "bark nest wolf frog").split()
    (workdir / "words.txt").write_text("\n".join(words) + "\n", encoding="utf-8")

def _generated_words(workdir):  # word_origin: words from four syllable generators
    rng = np.random.default_rng(7)
    generators = {"soft": "la le mi no ua ie", "hard": "kr tk gro zak bir", "long": "aa oo ee",
                  "apostrophe": "d' o' ka ri'"}
    (workdir / "words").mkdir()
    for name, parts in generators.items():
        parts = parts.split()
        words = ["".join(rng.choice(parts, rng.integers(2, 5))) for _ in range(30)]
        (workdir / "words" / f"{name}.txt").write_text("\n".join(words) + "\n")


# Per-program options: the default dtype a program runs in ("float32": graph_nodes builds its
# features with torch.FloatTensor), and when each module gets PyTorch's initial weights
# ("call": at its first top-level call; "parameters": at the program's first parameters()
# call on it, for layers that train through self.forward and never go through __call__).
PROGRAM_OPTIONS = {
    "local_layers": dict(weights="parameters"),
    "graph_nodes": dict(dtype="float32"),
}


# program folder -> (main file, command-line arguments, data set-up, minimum values recorded,
# rtol: 1e-12 unless the training dynamics amplify rounding)
PROGRAM_RUNS = {
    **{f"glyphs-{arch}": ("main", ["--arch", arch, "--epochs", "2", "--train-size", "96",
                                   "--batch-size", "16", "--log-every", "1", "--save",
                                   "glyphs.pt"], None, 12, 1e-12)
       for arch in ("cnn", "rows")},
    "cubic_fit": ("fit", [], None, 110, 1e-12),
    "blob_vae": ("main", ["--epochs", "3", "--batch-size", "16", "--count", "64"], None, 12,
                 1e-12),
    **{f"char_lm-{arch}": ("main", [
        "--arch", arch, "--width", "12", "--epochs", "3", "--rows", "4", "--length", "9",
        "--report", "3", *extra], _phrases, 20, 1e-12)
       for arch, extra in (("LSTM", ["--dropout", "0"]), ("GRU", ["--tie", "--dropout", "0.2"]),
                           # plain SGD at lr 2 amplifies the transformer's rounding past
                           # 1e-12 within 3 epochs; at lr 0.5 it stays near 1e-15
                           ("Transformer", ["--dropout", "0.1", "--lr", "0.5"]))},
    "wave_forecast": ("forecast", ["--rounds", "3", "--shown", "24"], _waves, 20, 1e-12),
    "ring_gan": ("gan", ["--count", "24", "--batch", "8", "--width", "4", "--epochs", "2",
                         "--replay"], None, 36, 1e-12),
    "upscale": ("train", ["--crop", "24", "--batch", "4", "--epochs", "3"], _pictures, 12,
                1e-12),
    "tiny_gpt": ("train", [f"--{k}={v}" for k, v in dict(
        batch=4, context=8, layers=2, heads=2, width=16, dropout=0.1, steps=5, accumulate=2,
        peak_lr=1e-2, floor_lr=1e-3, warmup=2, decay_until=4, eval_every=3,
        eval_batches=2).items()], _tokens, 25, 1e-12),
    "rank_digits": ("main", ["--steps", "10", "--batch", "8", "--width", "12", "--pool", "40",
                             "--checks", "2"], None, 10, 1e-12),
    # float32 throughout: agreement to float32 rounding, amplified a little by Adam's steps
    "graph_nodes": ("main", ["--epochs", "12", "--check-every", "3"], _communities, 16, 4e-6),
    "reverse_words": ("main", ["--size", "12", "--batch", "8", "--epochs", "3", "--show",
                               "3"], _accented_words, 20, 1e-12),
    "word_origin": ("classify", [], _generated_words, 800, 1e-12),
    "local_layers": ("main", ["--count", "64", "--epochs", "4", "--batch", "16",
                              "--log-every", "2"], None, 30, 1e-12),
}


@pytest.mark.parametrize("name", list(PROGRAM_RUNS))
def test_program_ports_by_changing_imports(name, tmp_path):
    main, argv, setup, minimum, rtol = PROGRAM_RUNS[name]
    files, _ = _load_program(name)
    for stem, source in files.items():
        ported = port_program(source)
        changed = [(a, b) for a, b in zip(source.splitlines(), ported.splitlines()) if a != b]
        assert len(source.splitlines()) == len(ported.splitlines())
        assert all(re.match(r"(import|from) torch\b", a) for a, _ in changed), changed
        assert not re.search(r"^(import|from) torch\b", ported, flags=re.M), stem
    results, states = [], []
    for lib in (torch, tapegrad):
        workdir = tmp_path / lib.__name__
        workdir.mkdir()
        if setup:
            setup(workdir)
        results.append(_run_program(lib, files, main, argv, states, workdir,
                                    **PROGRAM_OPTIONS.get(name.split("-")[0], {})))
    ref, got = results
    assert len(got) == len(ref) >= minimum
    np.testing.assert_allclose(got, ref, rtol=rtol, atol=0)


# Constructs the programs need, tested against torch directly ----------------------------------
@pytest.mark.parametrize("name,shape", [("Dropout1d", (3, 40, 5)), ("Dropout2d", (3, 40, 2, 3)),
                                        ("Dropout2d", (6, 40)), ("Dropout3d", (40, 2, 2, 2))])
def test_channel_dropout_modules(name, shape):  # nn.Dropout2d: glyphs --arch rows
    ours, theirs = getattr(tapegrad.nn, name)(0.4), getattr(torch.nn, name)(0.4)
    assert repr(ours) == repr(theirs) and isinstance(ours, tapegrad.nn.Dropout)
    assert ours.state_dict().keys() == theirs.state_dict().keys() == set()
    with pytest.raises(ValueError, match="between 0 and 1, but got 1.5"):
        getattr(tapegrad.nn, name)(1.5)
    x = np.random.default_rng(0).standard_normal(shape)
    structure = []
    for lib, module in ((torch, theirs), (tapegrad, ours)):
        xt = lib.tensor(x, requires_grad=True)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            y = module(xt)
        y.sum().backward()
        kept = y.detach().numpy() != 0
        np.testing.assert_allclose(y.detach().numpy()[kept], x[kept] / 0.6, rtol=1e-15)
        np.testing.assert_array_equal(xt.grad.numpy(), kept / 0.6)
        lead = 1 if name == "Dropout3d" and len(shape) == 4 else 2
        per_channel = kept.reshape(shape[:lead] + (-1,))
        structure.append(((per_channel == per_channel[..., :1]).all(), 0 < kept.mean() < 1,
                          len(caught) > 0))
        module.eval()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the 2-D input warning, in eval mode too
            np.testing.assert_array_equal(module(xt).detach().numpy(), x)
    assert structure[0] == structure[1] == (True, True, len(shape) == 2)


def test_range_as_an_index():  # local_layers: x_[range(n), labels] = x.max()
    x = np.random.default_rng(0).standard_normal((4, 6))
    results = []
    for lib in (torch, tapegrad):
        t = lib.tensor(x, requires_grad=True)
        y = t.clone()
        y[range(4), lib.tensor([1, 0, 5, 2])] = t.max()
        y[range(1, 3)] *= 2.0
        picked = t[range(0, 4, 2), 1:3] + t[range(0)].sum()
        (y.sum() + picked.sum()).backward()
        results.append((y.detach().numpy(), picked.detach().numpy(), t.grad.numpy()))
    for got, ref in zip(results[1], results[0]):
        np.testing.assert_allclose(got, ref, rtol=1e-15)


def test_random_sampler_with_replacement_draws_32_at_a_time():  # rank_digits: 1e10 samples
    import tapegrad.utils.data as tdata
    sizes = {}
    for lib, owner in ((torch, torch), (tapegrad, tdata)):
        calls = sizes.setdefault(lib.__name__, [])
        original = owner.randint

        def randint(*args, _original=original, _calls=calls, **kwargs):
            _calls.append(tuple(kwargs["size"] if "size" in kwargs else args[-1]))
            return _original(*args, **kwargs)

        with _patched([(owner, "randint", randint)]):
            drawn = list(lib.utils.data.RandomSampler(range(5), replacement=True,
                                                      num_samples=70))
            assert len(drawn) == 70 and set(drawn) <= set(range(5))
            endless = iter(lib.utils.data.RandomSampler(range(5), replacement=True,
                                                        num_samples=int(1e10)))
            assert len([next(endless) for _ in range(40)]) == 40  # lazily, 32 at a time
    assert sizes["tapegrad"] == sizes["torch"] == [(32,), (32,), (6,), (32,), (32,)]
