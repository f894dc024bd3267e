"""tapegrad.empty_cache / backend.release_memory: freed memory kept for reuse, handed back on
request; TAPEGRAD_KEEP_FREED_MEMORY=0 leaves glibc's allocator alone. Each case runs in a
fresh interpreter, since the allocator is tuned once, at import."""
import json
import os
import platform
import subprocess
import sys

import pytest

import tapegrad
from tapegrad import backend

MIB = 1 << 20
BLOCKS, BLOCK = 16, 32 * MIB

glibc = pytest.mark.skipif(platform.libc_ver()[0] != "glibc" or
                           not os.path.exists("/proc/self/statm"),
                           reason="glibc's malloc and /proc/self/statm only")

SCRIPT = f"""
import json, os
import numpy as np
import tapegrad
from tapegrad import backend

def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

base = rss()
arrays = [np.ones({BLOCK} // 8) for _ in range({BLOCKS})]
held = rss()
del arrays
freed = rss()
result = tapegrad.empty_cache()
trimmed = rss()
print(json.dumps(dict(base=base, held=held, freed=freed, trimmed=trimmed,
                      keeps=backend.keeps_freed_memory(), result=repr(result))))
"""


def _run(env_value):
    env = dict(os.environ)
    env.pop("TAPEGRAD_KEEP_FREED_MEMORY", None)
    if env_value is not None:
        env["TAPEGRAD_KEEP_FREED_MEMORY"] = env_value
    r = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


@glibc
def test_freed_memory_kept_then_released_by_empty_cache():
    m = _run(None)
    total = BLOCKS * BLOCK
    assert m["keeps"] is True
    assert m["result"] == "None"  # as torch.cuda.empty_cache
    assert m["held"] - m["base"] >= 0.9 * total  # the arrays were really touched
    assert m["freed"] - m["base"] >= 0.75 * total  # kept in the heap for reuse
    assert m["freed"] - m["trimmed"] >= 0.75 * total  # and handed back by empty_cache()
    assert m["trimmed"] - m["base"] < 0.2 * total


@glibc
def test_env_var_opt_out_returns_memory_at_free():
    m = _run("0")
    total = BLOCKS * BLOCK
    assert m["keeps"] is False
    assert m["held"] - m["base"] >= 0.9 * total
    assert m["freed"] - m["base"] < 0.2 * total  # glibc unmapped each block on free


def test_release_memory_returns_cleanly():
    assert isinstance(backend.release_memory(), bool)
    assert tapegrad.empty_cache() is None
    assert isinstance(backend.keeps_freed_memory(), bool)


def test_release_memory_without_libc(monkeypatch):
    from tapegrad.backend import numpy_backend

    monkeypatch.setattr(numpy_backend, "_LIBC", None)  # as where no C library can be opened
    assert numpy_backend.release_memory() is False
    assert tapegrad.empty_cache() is None
