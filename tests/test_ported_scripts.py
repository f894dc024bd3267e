"""PyTorch scripts port by changing only their imports.

Each script in tests/ported/ is plain PyTorch code. It runs once as written, and once with
its import lines rewritten to tapegrad (nothing else is touched), from the same initial
weights (the torch model's state_dict) and the same data; every loss must agree.
"""
import pathlib
import re

import numpy as np
import pytest
import torch

import tapegrad

HERE = pathlib.Path(__file__).parent / "ported"


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
    namespace = {"INIT": init, "DATA": data, "LOSSES": losses, "__name__": "__ported__"}
    exec(compile(source, "<ported>", "exec"), namespace)
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
# Public programs, kept verbatim (tests/ported/<program>/): only their imports are rewritten.
# The test supplies what a user would supply from outside the program: command-line arguments,
# data files in the working directory, a stand-in torchvision whose datasets are synthetic,
# and one source of randomness that both libraries draw from (random tensors, dropout masks
# and shuffling come from one numpy stream, since tapegrad need not reproduce PyTorch's
# random numbers). Each module's initial weights are PyTorch's own: the state torch's module
# has at its first top-level call is loaded into tapegrad's module at the same call. Every
# loss passed to backward() and every value read with .item() by the program is recorded.
# ---------------------------------------------------------------------------------------------
import contextlib
import importlib.abc
import importlib.util
import io
import os
import random
import sys
import types
import warnings

PROGRAMS = HERE


def port_program(source: str) -> str:
    """port(), plus the other import forms public programs use (one pattern per form)."""
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


FAKE_DATA_SIZE = 24


def _fake_torchvision(lib, rng):
    """torchvision's datasets, transforms and utils as the programs use them, on synthetic
    data: images are random uint8 arrays, labels random class indices."""
    tv = types.ModuleType("torchvision")
    datasets, transforms, utils = (types.ModuleType(f"torchvision.{n}")
                                   for n in ("datasets", "transforms", "utils"))

    class _Images:
        def __init__(self, images, labels, transform=None, target_transform=None):
            self.images, self.labels, self.transform = images, labels, transform

        def __len__(self):
            return len(self.images)

        def __getitem__(self, i):
            image = self.images[i]
            return (self.transform(image) if self.transform else image), int(self.labels[i])

    def MNIST(root, train=True, transform=None, target_transform=None, download=False):
        n = 48 if train else 24
        return _Images(rng.integers(0, 256, (n, 28, 28), dtype=np.uint8),
                       rng.integers(0, 10, n), transform)

    def FakeData(size=1000, image_size=(3, 224, 224), num_classes=10, transform=None,
                 target_transform=None, random_offset=0):
        c, h, w = image_size
        size = min(size, FAKE_DATA_SIZE)  # torchvision's default of 1000 images is too slow here
        return _Images(rng.integers(0, 256, (size, h, w, c), dtype=np.uint8),
                       rng.integers(0, num_classes, size), transform)

    class Compose:
        def __init__(self, transforms):
            self.transforms = transforms

        def __call__(self, x):
            for t in self.transforms:
                x = t(x)
            return x

    class ToTensor:
        def __call__(self, image):
            image = np.asarray(image)  # a numpy image or a PIL image
            array = image[None] if image.ndim == 2 else image.transpose(2, 0, 1)
            return lib.tensor(array / 255.0, dtype=lib.get_default_dtype())

    class Normalize:
        def __init__(self, mean, std, inplace=False):
            self.mean, self.std = mean, std

        def __call__(self, x):
            mean = lib.tensor(self.mean, dtype=x.dtype).view(-1, 1, 1)
            std = lib.tensor(self.std, dtype=x.dtype).view(-1, 1, 1)
            return (x - mean) / std

    class _Identity:  # Resize/CenterCrop: the synthetic images already have the size asked
        def __init__(self, *args, **kwargs):
            pass

        def __call__(self, x):
            return x

    # On PIL images (programs that read image files), CenterCrop and Resize do their work:
    # torchvision's crop offsets, PIL's bilinear resize (the smaller edge to an int size).
    class CenterCrop(_Identity):
        def __init__(self, size):
            self.size = (size, size) if isinstance(size, int) else tuple(size)

        def __call__(self, x):
            if isinstance(x, np.ndarray):
                return x
            (th, tw), (w, h) = self.size, x.size
            top, left = int(round((h - th) / 2.0)), int(round((w - tw) / 2.0))
            return x.crop((left, top, left + tw, top + th))

    class Resize(_Identity):
        def __init__(self, size, *args, **kwargs):
            self.size = size

        def __call__(self, x):
            if isinstance(x, np.ndarray):
                return x
            from PIL import Image
            w, h = x.size
            if isinstance(self.size, int):
                short, long = sorted((w, h))
                size = (self.size, int(self.size * long / short))
                size = size if w <= h else size[::-1]
            else:
                size = self.size[::-1]
            return x.resize(size, Image.BILINEAR)

    class Lambda:
        def __init__(self, lambd):
            self.lambd = lambd

        def __call__(self, x):
            return self.lambd(x)

    datasets.MNIST, datasets.FakeData = MNIST, FakeData
    transforms.Compose, transforms.ToTensor, transforms.Normalize = Compose, ToTensor, Normalize
    transforms.Lambda = Lambda
    transforms.Resize, transforms.CenterCrop = Resize, CenterCrop
    utils.save_image = lambda *args, **kwargs: None
    tv.datasets, tv.transforms, tv.utils = datasets, transforms, utils
    return {"torchvision": tv, "torchvision.datasets": datasets,
            "torchvision.transforms": transforms, "torchvision.utils": utils}


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
    files = {}  # module name -> source; a subfolder is a package (minGPT's mingpt/)
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
    filename = f"<ported {lib.__name__}"
    sources = files if lib is torch else {k: port_program(v) for k, v in files.items()}
    recorder = _Recorder(lib, states, filename, weights)
    fake = _fake_torchvision(lib, np.random.default_rng(1))
    fake.update(_stand_ins())
    saved_modules = {k: sys.modules.get(k) for k in [*files, *fake]}
    saved_argv, saved_cwd = sys.argv, os.getcwd()
    saved_env = os.environ.get("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD")
    prev, threads = lib.get_default_dtype(), torch.get_num_threads()
    try:
        torch.set_num_threads(1)  # tiny ops: torch's thread pool only contends on a shared box
        sys.modules.update(fake)
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


def _stand_ins():
    """Packages the programs import but never use here: six.moves.urllib (downloads that do
    not run, since the test writes the files); and `requests`, whose get() serves the file
    the test's set-up left in ./_downloads under the URL's last name (gcn's cora.tgz)."""
    import urllib.request
    six, moves = types.ModuleType("six"), types.ModuleType("six.moves")
    six.moves, moves.urllib = moves, urllib
    requests = types.ModuleType("requests")

    class _Response:
        def __init__(self, url):
            self.raw = open(os.path.join("_downloads", url.rsplit("/", 1)[-1]), "rb")

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.raw.close()

    requests.get = lambda url, stream=False, **kwargs: _Response(url)
    return {"six": six, "six.moves": moves, "requests": requests}


def _word_corpus(workdir):
    rng = np.random.default_rng(2)
    words = [f"w{i}" for i in range(23)]
    for split, lines in (("train", 12), ("valid", 4), ("test", 4)):
        text = "\n".join(" ".join(rng.choice(words, rng.integers(5, 12))) for _ in range(lines))
        (workdir / "corpus").mkdir(exist_ok=True)
        (workdir / "corpus" / f"{split}.txt").write_text(text + "\n")


def _sine_waves(workdir):  # time_sequence_prediction/generate_sine_wave.py, 5 x 24 samples
    rng = np.random.RandomState(2)
    T, L, N = 20, 24, 5
    x = np.empty((N, L), 'int64')
    x[:] = np.array(range(L)) + rng.randint(-4 * T, 4 * T, N).reshape(N, 1)
    torch.save(np.sin(x / 1.0 / T).astype('float64'), open(workdir / 'traindata.pt', 'wb'))


def _bsds300_images(workdir):  # where super_resolution's download would extract BSDS300
    from PIL import Image
    rng = np.random.default_rng(3)
    for split, n in (("train", 12), ("test", 4)):
        folder = workdir / "dataset" / "BSDS300" / "images" / split
        folder.mkdir(parents=True)
        for i in range(n):
            pixels = rng.integers(0, 256, (29, 31, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(folder / f"{100 + i}.png")


def _char_tokens(workdir):  # nanoGPT's data/shakespeare_char/prepare.py output, random
    import pickle
    rng = np.random.default_rng(4)
    folder = workdir / "data" / "shakespeare_char"
    folder.mkdir(parents=True)
    for split, n in (("train", 300), ("val", 60)):
        rng.integers(0, 17, n).astype(np.uint16).tofile(folder / f"{split}.bin")
    with open(folder / "meta.pkl", "wb") as f:
        pickle.dump({"vocab_size": 17}, f)
    configurator = PROGRAMS / "nanogpt" / "configurator.py"  # train.py execs it from the cwd
    (workdir / "configurator.py").write_text(configurator.read_text())


def _names(workdir):  # the tutorial's data/names/<Language>.txt, made-up names
    import matplotlib
    matplotlib.use("Agg")  # the tutorial plots; no display here
    rng = np.random.default_rng(5)
    syllables = {"English": "son ton ley ham ing ford wood", "French": "eau ier ard ette mont lac",
                 "Italian": "ini etti ano ella ucci osa", "Japanese": "ka ta shi mo ro yama moto",
                 "Russian": "ov ev sky in ich enko kov"}
    (workdir / "data" / "names").mkdir(parents=True)
    for language, parts in syllables.items():
        parts = parts.split()
        names = ["".join(rng.choice(parts, rng.integers(2, 4))).capitalize() for _ in range(20)]
        (workdir / "data" / "names" / f"{language}.txt").write_text("\n".join(names) + "\n")


def _cora(workdir):  # cora.tgz as linqs publishes it (cora/cora.content, cora/cora.cites)
    import tarfile
    rng = np.random.default_rng(6)
    papers, words, classes = 1700, 24, ["Neural_Networks", "Theory", "Genetic_Algorithms",
                                        "Case_Based"]
    ids = rng.choice(np.arange(1000, 10 ** 6), papers, replace=False)
    bits = (rng.random((papers, words)) < 0.15).astype(int)
    bits[:5] = 0  # papers without words: the loader's 1/0 -> 0
    content = "".join(f"{i}\t" + "\t".join(map(str, row)) + f"\t{rng.choice(classes)}\n"
                      for i, row in zip(ids, bits))
    pairs = rng.integers(0, papers, (2 * papers, 2))
    cites = "".join(f"{ids[a]}\t{ids[b]}\n" for a, b in pairs)
    (workdir / "_downloads").mkdir()
    with tarfile.open(workdir / "_downloads" / "cora.tgz", "w:gz") as tgz:
        for name, text in (("cora/cora.content", content), ("cora/cora.cites", cites)):
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tgz.addfile(info, io.BytesIO(data))


def _eng_fra(workdir):  # the tutorial's data/eng-fra.txt (English<TAB>French), made up
    import matplotlib
    matplotlib.use("Agg")  # the tutorial plots; no display here
    subjects = [("I'm", "Je suis"), ("He is", "Il est"), ("She is", "Elle est"),
                ("You are", "Tu es"), ("We are", "Nous sommes"), ("They are", "Ils sont")]
    states = [("tired", "fatigué"), ("happy", "heureux"), ("tall", "grand"), ("busy", "occupé"),
              ("ready", "prêt"), ("sorry", "désolé"), ("hungry", "affamé"), ("cold", "froid")]
    lines = ["Go.\tVa !", "Who won?\tQui a gagné ?"]  # no English prefix: filtered out
    lines += [f"{e} {s}.\t{f} {t}." for e, f in subjects for s, t in states]
    lines += ["He is not as tall as his father.\tIl n'est pas aussi grand que son père.",
              "I'm too tired to drive.\tJe suis trop fatigué pour conduire.",
              "I'm sorry if this is a stupid question.\tJe suis désolé si c'est une question "
              "idiote.", "I'm really proud of you.\tJe suis réellement fière de vous.",
              "I am not as tall as my father is, you see.\tJe ne suis pas aussi grand que mon "
              "père, tu vois."]  # too long: filtered out
    (workdir / "data").mkdir()
    (workdir / "data" / "eng-fra.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")


# Per-program options: the default dtype the program runs in ("float32": gcn's loader makes
# float32 features with torch.FloatTensor), and when each module gets PyTorch's initial
# weights ("call": at its first top-level call; "parameters": at the program's first
# parameters() call on it, for layers that train through self.forward and never __call__).
PORTED_OPTIONS = {
    "gcn": dict(dtype="float32"),
    "mnist_forward_forward": dict(weights="parameters"),
}


# program folder -> (main file, command-line arguments, data set-up, minimum values recorded,
# rtol: 1e-12 unless the training dynamics amplify rounding, as regression's SGD on x^4 does)
PORTED_PROGRAMS = {
    "regression": ("main", [], None, 20, 1e-9),
    "mnist": ("main", ["--epochs", "2", "--batch-size", "16", "--test-batch-size", "12",
                       "--log-interval", "1"], None, 10, 1e-12),
    "vae": ("main", ["--epochs", "2", "--batch-size", "12", "--log-interval", "1"], None, 10,
            1e-12),
    **{f"word_language_model-{m}": ("main", [
        "--data", "corpus", "--model", m, "--emsize", "16", "--nhid", "16", "--bptt", "7",
        "--batch_size", "4", "--epochs", "2", "--dropout", "0", "--log-interval", "2"],
        _word_corpus, 10, 1e-12) for m in ("LSTM", "GRU", "Transformer")},
    "time_sequence_prediction": ("train", ["--steps", "1", "--device", "cpu"], _sine_waves, 20,
                                 1e-12),
    "dcgan": ("main", ["--dataset", "fake", "--batchSize", "8", "--imageSize", "64", "--nz", "8",
                       "--ngf", "4", "--ndf", "4", "--niter", "2", "--workers", "0",
                       "--manualSeed", "1"], None, 40, 1e-12),
    "super_resolution": ("main", ["--upscale_factor", "3", "--batchSize", "4",
                                  "--testBatchSize", "4", "--nEpochs", "2", "--threads", "0"],
                         _bsds300_images, 15, 1e-12),
    "nanogpt": ("train", [f"--{k}={v}" for k, v in dict(
        dataset="shakespeare_char", out_dir="out", n_layer=2, n_head=2, n_embd=16, block_size=8,
        batch_size=4, gradient_accumulation_steps=2, dropout=0.1, max_iters=6, eval_interval=3,
        eval_iters=2, log_interval=1, learning_rate=1e-2, warmup_iters=2, lr_decay_iters=5,
        min_lr=1e-3, device="cpu", dtype="float32", compile=False).items()], _char_tokens, 30,
                1e-12),
    "char_rnn_classification": ("tutorial", [], _names, 600, 1e-12),
    "mnist_rnn": ("main", ["--epochs", "2", "--batch-size", "16", "--test-batch-size", "12",
                           "--log-interval", "1"], None, 10, 1e-12),
    # float32 throughout: agreement to float32 rounding, amplified a little by Adam's steps
    "gcn": ("main", ["--epochs", "6", "--val-every", "2"], _cora, 20, 4e-6),
    "mnist_forward_forward": ("main", ["--epochs", "8", "--log-interval", "2"], None, 40,
                              1e-12),
    "mingpt": ("main", [], None, 100, 1e-12),
    "seq2seq_translation": ("tutorial", [], _eng_fra, 40, 1e-12),
}


def _enabled(name):
    main = PORTED_PROGRAMS[name][0]
    return not (PROGRAMS / name.split("-")[0] / f"{main}.py").read_text().startswith("# BLOCKED:")


@pytest.mark.parametrize("name", [n for n in PORTED_PROGRAMS if _enabled(n)])
def test_public_program_ports_by_changing_imports(name, tmp_path):
    main, argv, setup, minimum, rtol = PORTED_PROGRAMS[name]
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
                                    **PORTED_OPTIONS.get(name.split("-")[0], {})))
    ref, got = results
    assert len(got) == len(ref) >= minimum
    np.testing.assert_allclose(got, ref, rtol=rtol, atol=0)


# Gaps the ports revealed, tested against torch --------------------------------------------
@pytest.mark.parametrize("name,shape", [("Dropout1d", (3, 40, 5)), ("Dropout2d", (3, 40, 2, 3)),
                                        ("Dropout2d", (6, 40)), ("Dropout3d", (40, 2, 2, 2))])
def test_channel_dropout_modules(name, shape):  # nn.Dropout2d: mnist_rnn
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


def test_range_as_an_index():  # mnist_forward_forward: x_[range(n), y] = x.max()
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


def test_random_sampler_with_replacement_draws_32_at_a_time():  # minGPT: num_samples=1e10
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
