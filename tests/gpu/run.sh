#!/usr/bin/env bash
# The GPU checks (tests/gpu/gpu_checks.py): the op battery on CUDA against the cpu,
# the spiral/digits examples trained on the GPU against their cpu trajectories, and the H=2048
# and GPT steps timed against PyTorch CUDA when the installed torch has CUDA.
#
#   tests/gpu/run.sh            # from the repository root; PYTHON=... picks the interpreter
#
# Installs the 'cuda' extra (cupy-cuda12x) when CuPy is missing; exits 0 with a SKIP line on a
# machine without an NVIDIA GPU.
set -uo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || PY=python3

if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
    echo "SKIP: no NVIDIA GPU visible (nvidia-smi)"
    exit 0
fi
nvidia-smi -L

if ! "$PY" -c "import cupy" >/dev/null 2>&1; then
    echo "installing the cuda extra (cupy-cuda12x)"
    "$PY" -m pip install -q -e ".[cuda]" || "$PY" -m pip install -q "cupy-cuda12x>=13" || {
        echo "FAIL: CuPy is not installed and could not be installed (offline?); put a"
        echo "      cupy-cuda12x wheel in ./wheels and rerun: $PY -m pip install wheels/cupy*"
        exit 2
    }
fi
"$PY" -c "import numpy, tapegrad" || {
    echo "FAIL: tapegrad/numpy not importable with $PY"; exit 2; }
exec "$PY" tests/gpu/gpu_checks.py
