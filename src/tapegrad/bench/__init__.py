"""The benchmark suite behind ``python -m tapegrad bench [name]`` (and ``benchmarks/*.py``).

Each benchmark is a module with ``main(argv=None)``; ``harness`` holds what they share
(thread control, interleaved medians, machine facts). The checkpointing benchmark lives in
the repository's ``benchmarks/checkpoint.py`` and is loaded from there by path.
"""
import importlib
import importlib.util
import os

# name -> (module, one-line description); run in this order by ``bench all``
BENCHMARKS = {
    "dispatch": ("tapegrad.bench.dispatch", "per-op dispatch cost vs size, with a PNG plot"),
    "mlp": ("tapegrad.bench.mlp", "spiral MLP training, H in {32, 256, 2048}, batch 512/4096"),
    "blas": ("tapegrad.bench.blas", "BLAS-bound 1024-wide Linear, batch 1024, vs numpy peak"),
    "models": ("tapegrad.bench.models", "digits-CNN and char-GPT training steps (--profile)"),
    "fusion": ("tapegrad.bench.fusion", "fused ops vs their compositions; Adam flat vs per-param"),
    "scale": ("tapegrad.bench.scale", "H=2048 batch 4096 MLP step: user/sys, bandwidth, changes"),
    "checkpoint": ("benchmarks/checkpoint.py", "activation checkpointing: memory vs time"),
}


def _repo_file(relative):
    """A file of the source checkout this package was installed from (editable installs)."""
    here = os.path.dirname(os.path.abspath(__file__))
    return os.path.normpath(os.path.join(here, "..", "..", "..", relative))


def available(name):
    module = BENCHMARKS[name][0]
    if module.endswith(".py"):
        return os.path.isfile(_repo_file(module))
    return True


def load(name):
    """The benchmark module ``name`` (its ``main(argv=None)`` runs it)."""
    if name not in BENCHMARKS:
        raise KeyError(f"tapegrad bench: unknown benchmark {name!r}; "
                       f"choose from {', '.join(BENCHMARKS)}")
    module = BENCHMARKS[name][0]
    if not module.endswith(".py"):
        return importlib.import_module(module)
    path = _repo_file(module)
    if not os.path.isfile(path):
        raise FileNotFoundError(
            f"tapegrad bench {name}: {module} not found at {path} (this benchmark runs from a "
            "source checkout of tapegrad)")
    spec = importlib.util.spec_from_file_location(f"tapegrad_benchmarks_{name}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    if not hasattr(mod, "main"):
        raise AttributeError(f"tapegrad bench {name}: {path} defines no main(argv=None)")
    return mod
