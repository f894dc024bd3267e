"""The benchmark suite behind ``python -m tapegrad bench [name]`` (and ``benchmarks/*.py``).

Each benchmark is a module with ``main(argv=None)``; ``harness`` holds what they share
(thread control, interleaved medians, machine facts). ``benchmarks/*.py`` are thin scripts
over these modules.
"""
import importlib

# name -> (module, one-line description); run in this order by ``bench all``
BENCHMARKS = {
    "dispatch": ("tapegrad.bench.dispatch", "per-op dispatch cost vs size, with a PNG plot"),
    "mlp": ("tapegrad.bench.mlp", "spiral MLP training, H in {32, 256, 2048}, batch 512/4096"),
    "blas": ("tapegrad.bench.blas", "BLAS-bound 1024-wide Linear, batch 1024, vs numpy peak"),
    "models": ("tapegrad.bench.models", "digits-CNN and char-GPT training steps (--profile)"),
    "fusion": ("tapegrad.bench.fusion", "fused ops vs their compositions; Adam flat vs per-param"),
    "scale": ("tapegrad.bench.scale", "H=2048 batch 4096 MLP step: user/sys, bandwidth, changes"),
    "checkpoint": ("tapegrad.bench.checkpoint", "activation checkpointing: memory vs time"),
    "compile": ("tapegrad.bench.compile", "spiral step: tapegrad.compile vs eager vs PyTorch"),
    "func": ("tapegrad.bench.func", "vmap(grad) per-sample grads vs loop vs torch.func; jvp, hvp"),
    "suite": ("tapegrad.bench.suite", "17 models the compiler was not tuned on: compiled, eager, "
                                      "PyTorch"),
}


def load(name):
    """The benchmark module ``name`` (its ``main(argv=None)`` runs it)."""
    if name not in BENCHMARKS:
        raise KeyError(f"tapegrad bench: unknown benchmark {name!r}; "
                       f"choose from {', '.join(BENCHMARKS)}")
    return importlib.import_module(BENCHMARKS[name][0])
