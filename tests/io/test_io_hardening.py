"""tapegrad.load distrusts the file: zip bombs, lying sizes, absurd headers, deep nesting and
truncation raise one error type (CheckpointError) naming the file; interrupted saves leave no
temporary files behind, or leave ones that the next save removes."""
import io
import json
import os
import signal
import subprocess
import sys
import zipfile

import numpy as np
import pytest
import torch

import tapegrad
from tapegrad import io as tio
from tapegrad import serialization
from tapegrad.io import CheckpointError


def _zip(path, members, compress=None):
    """Write ``{name: bytes}`` (or ``{name: callable(writer)}``) as a zip archive."""
    with zipfile.ZipFile(path, "w") as z:
        for name, data in members.items():
            info = zipfile.ZipInfo(name)
            info.compress_type = compress.get(name, zipfile.ZIP_STORED) if compress else 0
            with z.open(info, "w", force_zip64=True) as w:
                data(w) if callable(data) else w.write(data)
    return path


def _legacy(path, tree, arrays, compress=None):
    members = {"tapegrad/format": b"tapegrad-checkpoint 1",
               "tapegrad/object.json": json.dumps(tree).encode()}
    members.update({f"tapegrad/arrays/{i}.npy": a for i, a in enumerate(arrays)})
    return _zip(path, members, compress)


def _npy(arr):
    buf = io.BytesIO()
    np.save(buf, arr)
    return buf.getvalue()


def _rezip(src, dst, change):
    """Copy a zip archive, passing each member's bytes through ``change(name, data)``."""
    with zipfile.ZipFile(src) as z:
        members = {i.filename: change(i.filename, z.read(i)) for i in z.infolist()}
    return _zip(dst, members)


def _load_fails(path, match, **kwargs):
    with pytest.raises(CheckpointError, match=match) as info:
        tapegrad.load(path, **kwargs)
    assert str(path) in str(info.value) and isinstance(info.value, RuntimeError)
    return info.value


# --- sizes -------------------------------------------------------------------------------------
def _zeros(n_mib):
    def write(w):
        chunk = bytes(1 << 20)
        for _ in range(n_mib):
            w.write(chunk)
    return write


def test_zip_bomb_members_are_refused_before_inflating(tmp_path):
    deflate = {"tapegrad/arrays/0.npy": zipfile.ZIP_DEFLATED,
               "archive/data/0": zipfile.ZIP_DEFLATED}
    header = _npy(np.zeros(0))
    bomb = _legacy(tmp_path / "bomb.tg", {"$ndarray": 0, "dtype": "float64"},
                   [lambda w: (w.write(header), _zeros(64)(w))], deflate)
    assert bomb.stat().st_size < 1 << 20  # 64 MiB inflate from a few hundred KiB
    _load_fails(bomb, r"would inflate \d+ bytes to \d+ \(more than 100x\): refused as a zip bomb")
    torch_bomb = _zip(tmp_path / "bomb.pt", {"archive/data.pkl": b"\x80\x02N.",
                                             "archive/data/0": _zeros(64)}, deflate)
    _load_fails(torch_bomb, "zip bomb")
    # a deflated member within the ratio still loads
    arr = np.random.default_rng(0).standard_normal(1000)
    ok = _legacy(tmp_path / "ok.tg", {"$ndarray": 0, "dtype": "float64"}, [_npy(arr)], deflate)
    np.testing.assert_array_equal(tapegrad.load(ok), arr)


def _patch_central_size(data, name, compressed=None, uncompressed=None):
    """Rewrite the sizes a zip's central directory declares for member ``name``."""
    data = bytearray(data)
    at = data.rindex(name.encode()) - 46
    assert data[at:at + 4] == b"PK\x01\x02"
    if compressed is not None:
        data[at + 20:at + 24] = compressed.to_bytes(4, "little")
    if uncompressed is not None:
        data[at + 24:at + 28] = uncompressed.to_bytes(4, "little")
    return bytes(data)


def test_declared_sizes_are_never_trusted(tmp_path):
    good = tmp_path / "good.pt"
    tapegrad.save({"w": tapegrad.arange(1000.0, dtype=tapegrad.float64)}, good)
    raw = good.read_bytes()
    lie = tmp_path / "lie.pt"
    lie.write_bytes(_patch_central_size(raw, "archive/data/0", uncompressed=2**31))
    _load_fails(lie, r"member archive/data/0 declares 2147483648 bytes but stores 8000")
    past_end = tmp_path / "past_end.pt"
    past_end.write_bytes(_patch_central_size(raw, "archive/data/0", compressed=2**31,
                                             uncompressed=2**31))
    _load_fails(past_end, "extends past the end of the file")
    # the storage record must hold exactly what the pickle declares
    short = _rezip(good, tmp_path / "short.pt",
                   lambda n, d: d[:800] if n.endswith("data/0") else d)
    _load_fails(short, r"storage 0 declares 1000 elements of float64 \(8000 bytes\) but its "
                       r"record holds 800 bytes")


def test_tensor_geometry_is_checked_against_its_storage(tmp_path):
    src = tmp_path / "src.pt"
    torch.save({"w": torch.arange(4.0)}, src)
    assert b"K\x04\x85" in zipfile.ZipFile(src).read("src/data.pkl")
    big = _rezip(src, tmp_path / "big.pt", lambda n, d: d.replace(b"K\x04\x85", b"K\x40\x85", 1)
                 if n.endswith("data.pkl") else d)
    _load_fails(big, r"a tensor of size \(64,\), stride \(1,\) at offset 0 reaches element 63 "
                     r"of a storage of 4")


# --- headers and nesting -----------------------------------------------------------------------
def test_absurd_npy_headers(tmp_path):
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"shape": (10**12,), "fortran_order": False,
                                                  "descr": "<f8"})
    absurd = header.getvalue() + np.arange(4.0).tobytes()
    path = _legacy(tmp_path / "absurd.tg", {"$ndarray": 0, "dtype": "float64"}, [absurd])
    _load_fails(path, r"array 0: its \.npy header declares shape \(1000000000000,\) of float64 "
                      r"\(8000000000000 bytes\) but 32 bytes follow")
    huge_header = b"\x93NUMPY\x02\x00" + (10**6).to_bytes(4, "little") + b" " * 100
    path = _legacy(tmp_path / "header.tg", {"$ndarray": 0, "dtype": "float64"}, [huge_header])
    _load_fails(path, r"array 0 has a malformed \.npy header")
    objects = io.BytesIO()
    np.save(objects, np.array([1, None], dtype=object), allow_pickle=True)
    path = _legacy(tmp_path / "objects.tg", {"$ndarray": 0, "dtype": None}, [objects.getvalue()])
    _load_fails(path, "holds Python objects")


def test_deep_nesting(tmp_path):
    deep_json = tmp_path / "deep.tg"
    with zipfile.ZipFile(deep_json, "w") as z:
        z.writestr("tapegrad/format", b"tapegrad-checkpoint 1")
        z.writestr("tapegrad/object.json", "[" * 100000 + "]" * 100000)
    _load_fails(deep_json, "nested too deeply")
    # the pickle unpicklers are iterative: a deep list loads (no RecursionError)
    depth = 100000
    pkl = b"\x80\x02" + b"]" * depth + b"a" * (depth - 1) + b"."
    deep_pickle = _zip(tmp_path / "deep.pt", {"archive/data.pkl": pkl})
    for weights_only in (True, False):
        obj, n = tapegrad.load(deep_pickle, weights_only=weights_only), 0
        while obj:
            obj, n = obj[0], n + 1
        assert n == depth - 1


# --- truncation and garbage --------------------------------------------------------------------
def test_truncated_and_garbage_files(tmp_path):
    good = tmp_path / "good.pt"
    tapegrad.save({"w": tapegrad.arange(300.0), "meta": {"epoch": 3}}, good)
    raw = good.read_bytes()
    for i, cut in enumerate(range(1, len(raw), len(raw) // 9)):
        path = tmp_path / f"cut{i}.pt"
        path.write_bytes(raw[:cut])
        _load_fails(path, "is not a valid checkpoint or is corrupt")
    pkl = zipfile.ZipFile(good).read("archive/data.pkl")
    for cut in (3, len(pkl) // 2, len(pkl) - 1):
        path = _rezip(good, tmp_path / "pkl.pt",
                      lambda n, d: d[:cut] if n.endswith("data.pkl") else d)
        for weights_only in (True, False):
            _load_fails(path, "truncated|ran out of input|pickle data was truncated",
                        weights_only=weights_only)
    cases = {"empty.pt": b"", "text.pt": b"hello", "legacy.pt": tio._TORCH_LEGACY_MAGIC + b"x",
             "nozip.pt": b"PK\x03\x04" + bytes(100)}
    for name, data in cases.items():
        (tmp_path / name).write_bytes(data)
        _load_fails(tmp_path / name, "not a valid checkpoint")
    _load_fails(tmp_path / "legacy.pt", r"legacy \(pre-1.6\) format")
    unrelated = _zip(tmp_path / "other.zip", {"readme.txt": b"hi"})
    _load_fails(unrelated, "neither a PyTorch checkpoint")
    with pytest.raises(CheckpointError, match="other.zip"):
        serialization.get_unsafe_globals_in_checkpoint(unrelated)


def test_malformed_pickles(tmp_path):
    cases = {b"\x80\x02h\x05.": "memo entry 5",  # BINGET of nothing
             b"\x80\x02K\x01t.": "pops a MARK it never set",
             b"\x80\x02\x85.": "TUPLE on a short stack",
             b"\x80\x02\x8a\x02\x01": "truncated",  # LONG1 cut short
             b"\x80\x02K\x01K\x02.": "unbalanced stack",
             b"\x80\x02X\xff\xff\xff\x7fab.": "truncated"}  # a 2 GiB string that is not there
    for i, (pkl, match) in enumerate(cases.items()):
        path = _zip(tmp_path / f"m{i}.pt", {"archive/data.pkl": pkl})
        _load_fails(path, match)


# --- interrupted saves -------------------------------------------------------------------------
def test_exceptions_and_keyboard_interrupt_leave_no_temporaries(tmp_path, monkeypatch):
    path = tmp_path / "ckpt.pt"
    tapegrad.save({"w": tapegrad.zeros(3)}, path)
    before = path.read_bytes()
    for error in (OSError("disk full"), KeyboardInterrupt()):
        def failing(f, data, disable_byteorder_record=False, error=error):
            f.write(b"PK\x03\x04 partial")
            raise error

        monkeypatch.setattr(serialization, "_write_zip", failing)
        with pytest.raises(type(error)):
            tapegrad.save({"w": tapegrad.ones(3)}, path)
        assert os.listdir(tmp_path) == ["ckpt.pt"] and path.read_bytes() == before


def test_a_killed_save_leaves_a_temporary_that_the_next_save_removes(tmp_path):
    path = tmp_path / "ckpt.pt"
    tapegrad.save({"w": tapegrad.zeros(3)}, path)
    before = path.read_bytes()
    script = (
        "import os, signal, tapegrad\n"
        "from tapegrad import serialization\n"
        "real = serialization._write_zip\n"
        "def killed(f, data, disable_byteorder_record=False):\n"
        "    f.write(b'PK\\x03\\x04 half a checkpoint')\n"
        "    f.flush()\n"
        "    os.kill(os.getpid(), signal.SIGKILL)\n"
        "serialization._write_zip = killed\n"
        f"tapegrad.save({{'w': tapegrad.ones(300000)}}, {str(path)!r})\n")
    proc = subprocess.Popen([sys.executable, "-c", script], stderr=subprocess.PIPE)
    assert proc.wait() == -signal.SIGKILL, proc.stderr.read().decode()
    assert path.read_bytes() == before
    stale = [n for n in os.listdir(tmp_path) if n != "ckpt.pt"]
    assert len(stale) == 1 and stale[0].startswith(f".ckpt.pt.{proc.pid}.")
    # a live process's temporary and another host's are not touched
    live = tmp_path / f".ckpt.pt.{os.getppid()}.{tio._host_tag()}.abcd1234.tmp"
    other_host = tmp_path / f".ckpt.pt.{proc.pid}.00000000.abcd1234.tmp"
    live.write_bytes(b"in progress")
    other_host.write_bytes(b"elsewhere")
    tapegrad.save({"w": tapegrad.full((3,), 2.0)}, path)
    assert sorted(os.listdir(tmp_path)) == sorted(["ckpt.pt", live.name, other_host.name])
    assert tapegrad.load(path)["w"].tolist() == [2.0, 2.0, 2.0]
