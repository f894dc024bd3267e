"""Elementwise loops on every core for large arrays (numba ``parallel=True``); opt-in.

numpy's ufuncs run on one thread. ``elementwise(numpy_fn, nin)`` turns a scalar function
into a callable that runs as one numba loop split over the cores (numba's ``prange``) when
the arrays are large (``PARALLEL_MIN`` elements or more), and as ``numpy_fn`` otherwise::

    from tapegrad.backend import parallel

    @parallel.elementwise(lambda x: x / (1.0 + np.exp(-x)), nin=1)
    def silu(x):
        return x / (1.0 + math.exp(-x))

    silu(big_array)   # two threads on a 2-core machine; numpy's expression below the bound

Opt-in twice over: no op file calls it, and even a caller's loops run only when
``TAPEGRAD_PARALLEL_ELEMENTWISE=1`` is set (``ENABLED``); otherwise every call is
``numpy_fn``. The loop takes same-shape C-contiguous float32/float64 operands (a caller
broadcasts first); anything else goes to ``numpy_fn`` too. Its results are the scalar
function's, element by element, whatever the thread count (no reduction is split), but
they are numba's arithmetic (LLVM's ``exp``, fused multiply-adds where it contracts), not
numpy's: bitwise equality with numpy's expression is not promised.

Why ``PARALLEL_MIN`` is 2**20 (docs/performance.md, "BLAS threads", and
``python -m tapegrad bench blas --elementwise``): on this 2-core machine a memory-bound op
(``a * b + c``) gains little from a second core (both share the memory bandwidth) and a
compute-bound one (SiLU's ``exp``) up to ~2x, but only from about a million elements, where
the loop lasts milliseconds and the thread hand-off (tens of microseconds on a free core)
is noise; when the other core is busy the hand-off waits for a scheduler time slice and the
loop loses, as OpenBLAS's second thread does.
"""
import os

import numpy as xp

PARALLEL_MIN = int(os.environ.get("TAPEGRAD_PARALLEL_MIN", str(1 << 20)))
ENABLED = os.environ.get("TAPEGRAD_PARALLEL_ELEMENTWISE", "0") == "1"


def available() -> bool:
    """Whether numba (the optional ``compile`` extra) can be imported."""
    try:
        import numba  # noqa: F401
    except ImportError:
        return False
    return True


def _loops(scalar, nin):
    """(parallel loop, serial loop) over flat arrays: ``out[i] = scalar(a[i], ...)``."""
    import numba

    f = numba.njit(inline="always")(scalar)
    args = ", ".join(f"a{i}" for i in range(nin))
    items = ", ".join(f"a{i}[i]" for i in range(nin))
    src = (f"def loop(out, {args}):\n"
           f"    for i in RANGE(out.size):\n"
           f"        out[i] = f({items})\n")
    made = []
    for parallel, rng in ((True, numba.prange), (False, range)):
        scope = {"f": f, "RANGE": rng}
        exec(src, scope)
        made.append(numba.njit(parallel=parallel, cache=False)(scope["loop"]))
    return made


class Elementwise:
    """``scalar`` applied element by element: numba's loop over the cores for large
    operands, ``numpy_fn`` (the same function in numpy) for the rest."""

    def __init__(self, scalar, numpy_fn, nin):
        self.scalar, self.numpy_fn, self.nin = scalar, numpy_fn, nin
        self._loops = None

    def loops(self):
        if self._loops is None:
            self._loops = _loops(self.scalar, self.nin)
        return self._loops

    def runs_parallel(self, *arrays) -> bool:
        """Whether a call on ``arrays`` takes the parallel loop."""
        if not ENABLED or len(arrays) != self.nin:
            return False
        a0 = arrays[0]
        return (a0.size >= PARALLEL_MIN and a0.dtype in (xp.float32, xp.float64)
                and all(a.shape == a0.shape and a.dtype == a0.dtype and a.flags.c_contiguous
                        for a in arrays) and available())

    def parallel(self, *arrays, out=None, threads=True):
        """The numba loop whatever the size (``threads=False``: its one-thread form)."""
        if out is None:
            out = xp.empty_like(arrays[0])
        loop = self.loops()[0 if threads else 1]
        loop(out.reshape(-1), *(a.reshape(-1) for a in arrays))
        return out

    def __call__(self, *arrays, out=None):
        if self.runs_parallel(*arrays) and (out is None or (
                out.shape == arrays[0].shape and out.dtype == arrays[0].dtype
                and out.flags.c_contiguous)):
            return self.parallel(*arrays, out=out)
        result = self.numpy_fn(*arrays)
        if out is None:
            return result
        out[...] = result
        return out


def elementwise(numpy_fn, nin):
    """Decorator: a scalar function (numba-compilable) becomes an ``Elementwise`` whose small
    or opted-out calls run ``numpy_fn``."""
    return lambda scalar: Elementwise(scalar, numpy_fn, nin)
