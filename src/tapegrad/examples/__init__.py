"""Runnable examples: ``python -m tapegrad.examples.NAME`` (spiral, digits_cnn, char_gpt,
mixed_precision; with ``tapegrad.func``: dp_sgd, pinn_poisson, newton). ``ddp_digits`` runs
data-parallel under the launcher: ``python -m tapegrad.distributed.run --nproc-per-node 2 -m
tapegrad.examples.ddp_digits``.

Each model is written once against PyTorch's API and run with ``T = tapegrad``; with
``--reference torch`` the same code also runs with ``T = torch`` from the same initial
weights and the largest loss difference along the run is printed.
"""
