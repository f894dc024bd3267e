"""tapegrad.load and get_unsafe_globals_in_checkpoint on hostile files, each written here
opcode by opcode: the scanner sees every way a pickle can name an object, no message builds an
unbounded repr, ambiguous or corrupt archives raise one clear error each, and the weights-only
allow-list follows PyTorch's. Each test says what PyTorch 2.13 does with the same file."""
import collections
import contextlib
import copyreg
import io
import os
import pickle
import signal
import struct
import threading
import warnings
import zipfile

import numpy as np
import pytest
import torch

import tapegrad
from tapegrad import io as tio
from tapegrad import serialization
from tapegrad.io import CheckpointError

PROTO = b"\x80\x02"


def _str(text):
    """BINUNICODE: a str constant."""
    data = text.encode()
    return b"X" + struct.pack("<I", len(data)) + data


def _int(n):
    """BININT1 for a small int, else LONG1 (any size, two's complement)."""
    if 0 <= n < 256:
        return b"K" + bytes([n])
    data = n.to_bytes((n.bit_length() + 8) // 8, "little", signed=True)
    return b"\x8a" + bytes([len(data)]) + data


def _ints(values):
    return b"(" + b"".join(_int(v) for v in values) + b"t"


def _tensor(size=(3,), stride=(1,), hooks=b"ccollections\nOrderedDict\n)R",
            storage=b"ctorch\nFloatStorage\n", numel=3, key="0", after=b""):
    """_rebuild_tensor_v2 over storage ``key``, as torch.save writes it; each part can be
    replaced by raw opcodes."""
    size = size if isinstance(size, bytes) else _ints(size)
    stride = stride if isinstance(stride, bytes) else _ints(stride)
    pid = b"(" + _str("storage") + storage + _str(key) + _str("cpu") + _int(numel) + b"tQ"
    return (b"ctorch._utils\n_rebuild_tensor_v2\n(" + pid + _int(0) + size + stride +
            b"\x89" + hooks + b"tR" + after)


def _archive(path, pkl, storages=None, members=()):
    """A torch.save-style zip: data.pkl, the storages' records, then ``members`` as given
    (name, bytes) pairs, duplicates included."""
    storages = {"0": np.arange(3, dtype=np.float32).tobytes()} if storages is None else storages
    with warnings.catch_warnings(), zipfile.ZipFile(path, "w") as z:
        warnings.simplefilter("ignore")  # zipfile warns on a duplicate name, which we want
        z.writestr("archive/data.pkl", pkl)
        z.writestr("archive/byteorder", b"little")
        for key, data in storages.items():
            z.writestr(f"archive/data/{key}", data)
        for name, data in members:
            z.writestr(name, data)
        z.writestr("archive/version", b"3\n")
    return path


def _refused_by_torch_scan(path, opcode):
    # PyTorch's scanner knows a dozen opcodes and refuses the rest, these included
    with pytest.raises(pickle.UnpicklingError, match=f"Unsupported operand {opcode}"):
        torch.serialization.get_unsafe_globals_in_checkpoint(path)


# --- the scanner -------------------------------------------------------------------------------
def test_scanner_sees_every_opcode_that_names_a_global(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    run = _str("touch pwned")
    inst = PROTO + b"(" + run + b"ios\nsystem\n."
    # the names are memoized, then fetched back for STACK_GLOBAL after two decoy strings
    # (which stay on the stack: an unpickler returns the top and ignores the rest)
    stack_global = (PROTO + _str("os") + b"q\x00" + _str("system") + b"q\x01" +
                    _str("collections") + _str("OrderedDict") + b"\x86" +
                    b"h\x00h\x01\x93" + run + b"\x85R.")
    ext = PROTO + b"\x82\xf0" + run + b"\x85R."
    copyreg.add_extension("os", "system", 0xF0)
    try:
        for name, pkl, opcode in (("inst", inst, ord("i")), ("stack", stack_global, 0x93),
                                  ("ext", ext, 0x82)):
            path = _archive(tmp_path / f"{name}.pt", pkl)
            assert serialization.get_unsafe_globals_in_checkpoint(path) == ["os.system"], name
            _refused_by_torch_scan(path, opcode)
            for load in (torch.load, tapegrad.load):  # weights-only loads refuse it
                with pytest.raises(pickle.UnpicklingError, match="Weights only load failed"):
                    load(path, weights_only=True)
    finally:
        copyreg.remove_extension("os", "system", 0xF0)
    # once unregistered, the extension code names nothing this process knows: refused
    with pytest.raises(pickle.UnpicklingError, match="extension code 240.*not registered"):
        serialization.get_unsafe_globals_in_checkpoint(tmp_path / "ext.pt")
    assert not (tmp_path / "pwned").exists()


def test_scanner_follows_real_pickles_and_refuses_what_it_cannot_resolve(tmp_path):
    # protocol 4 names globals with STACK_GLOBAL from memoized strings
    for obj, unsafe in ((collections.OrderedDict(a={1, 2}), []),
                        ({"f": os.system, "g": [collections.Counter()]}, [f"{os.name}.system"]),
                        ({"f": print}, ["builtins.print"])):
        path = _archive(tmp_path / "p4.pt", pickle.dumps(obj, protocol=4))
        assert serialization.get_unsafe_globals_in_checkpoint(path) == unsafe, obj
        _refused_by_torch_scan(path, 0x95)  # FRAME
    # STACK_GLOBAL whose module name is computed (str("os")): reporting only builtins.str
    # would hide os.system, so the scan refuses
    computed = (PROTO + b"cbuiltins\nstr\n" + _str("os") + b"\x85R" + _str("system") + b"\x93" +
                _str("true") + b"\x85R.")
    path = _archive(tmp_path / "computed.pt", computed)
    with pytest.raises(pickle.UnpicklingError, match=r"STACK_GLOBAL \(at byte \d+\) from values "
                                                     "that are not string constants"):
        serialization.get_unsafe_globals_in_checkpoint(path)
    _refused_by_torch_scan(path, 0x93)
    # an opcode pickle does not have is a malformed file
    path = _archive(tmp_path / "unknown.pt", PROTO + b"\xff.")
    with pytest.raises(CheckpointError, match="unknown.pt is not a valid checkpoint.*unknown"):
        serialization.get_unsafe_globals_in_checkpoint(path)
    _refused_by_torch_scan(path, 255)


# --- bounded messages and work -----------------------------------------------------------------
def _doubling_list(levels):
    """A list holding the list below it twice, ``levels`` deep through the memo: a few bytes
    per level, a repr of 2**levels brackets."""
    out = b"]q\x00"
    for i in range(1, levels + 1):  # [level i-1 built inline, then the memo's copy of it]
        out = b"](" + out + b"h" + bytes([i - 1]) + b"eq" + bytes([i])
    return out


@contextlib.contextmanager
def _unless_hung(seconds=120):
    """Fail instead of hanging: the unbounded versions of these loads run for hours and take
    gigabytes, the bounded ones microseconds. A watchdog, not a speed claim."""
    def hung(signum, frame):
        raise AssertionError(f"still running after {seconds} s: the work is unbounded")

    previous = signal.signal(signal.SIGALRM, hung)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def _raises_quickly(path, match, **kwargs):
    with _unless_hung(), pytest.raises(CheckpointError, match=match):
        tapegrad.load(path, **kwargs)


def test_exponential_objects_in_messages_raise_quickly(tmp_path):
    deep = _doubling_list(25)
    pid = PROTO + deep + b"Q."
    path = _archive(tmp_path / "pid.pt", pid)
    assert path.stat().st_size < 1000
    _raises_quickly(path, r"unknown persistent id \[\[\[\[", weights_only=False)
    storage_id = PROTO + b"(" + _str("storage") + deep + _str("0") + _str("cpu") + b"K\x03tQ."
    path = _archive(tmp_path / "sid.pt", storage_id)
    for weights_only in (True, False):
        _raises_quickly(path, r"malformed storage id \('storage', \[\[\[",
                        weights_only=weights_only)
    # PyTorch refuses a list as a tensor's size with a TypeError, in about a second
    path = _archive(tmp_path / "size.pt", PROTO + _tensor(size=deep) + b".")
    with pytest.raises(TypeError):
        torch.load(path, weights_only=True)
    for weights_only in (True, False):
        _raises_quickly(path, r"tensor size \[\[\[\[.*\.\.\. is not a tuple of ints",
                        weights_only=weights_only)
    device = PROTO + b"ctorch\ndevice\n(" + _str("cpu") + deep + b"tR."
    path = _archive(tmp_path / "device.pt", device, storages={})
    _raises_quickly(path, "argument 'index' must be int, not list")
    build = PROTO + _tensor(after=deep + b"b") + b"."
    path = _archive(tmp_path / "build.pt", build)
    _raises_quickly(path, r"a tensor carries Python attributes \[\[\[")
    _raises_quickly(path, "state is not a dictionary", weights_only=False)  # Python's message


def test_bounded_repr():
    nested = []
    for _ in range(200):
        nested = [nested, nested]
    cyclic = [1]
    cyclic.append(cyclic)
    for obj in (nested, cyclic, {"k": (1,) * 10**6}, "x" * 10**6, 7**10**5, object()):
        assert len(tio._bounded_repr(obj)) <= 83
    assert tio._bounded_repr((1,)) == "(1,)"

    class Loud(list):  # an allowlisted class's overrides do not run while a message is made
        def __iter__(self):
            raise AssertionError("ran")

        __len__ = __repr__ = __iter__

    assert tio._bounded_repr({"k": Loud([1, 2])}) == "{'k': Loud([1, 2])}"
    assert tio._bounded_repr(collections.OrderedDict(a=[1, b"\x00"])) == \
        "OrderedDict({'a': [1, b'\\x00']})"


def test_keys_that_share_tuples_exponentially_are_refused(tmp_path):
    # t0 = (); t[i] = (t[i-1], t[i-1]): hashing t[n] takes 2**n steps (tuples cache no hash).
    # PyTorch's weights-only unpickler hashes it as a dict key: 0.4 s at 24 levels, doubling
    # with each level, hours at 40.
    levels = 40
    key = b")q\x00"
    for i in range(1, levels + 1):
        key += b"h" + bytes([i - 1]) + b"\x86q" + bytes([i])
    path = _archive(tmp_path / "key.pt", PROTO + b"}" + key + b"K\x01s.", storages={})
    with _unless_hung(), pytest.raises(CheckpointError, match="hashing them would take more than"):
        tapegrad.load(path)
    # ordinary tuple keys cost a few steps each
    path = tmp_path / "ok.pt"
    tapegrad.save({(i, "w", (i, i)): i for i in range(2000)}, path)
    assert tapegrad.load(path)[(5, "w", (5, 5))] == 5


# --- ambiguous and corrupt archives ------------------------------------------------------------
def test_duplicate_member_names_are_refused(tmp_path):
    one, two = PROTO + b"K\x01.", PROTO + b"K\x02."
    path = _archive(tmp_path / "dup.pt", one, storages={}, members=[("archive/data.pkl", two)])
    # PyTorch reads one of the two without a word (the second, for this file)
    assert torch.load(path, weights_only=True) == 2
    with pytest.raises(CheckpointError, match="two members named archive/data.pkl"):
        tapegrad.load(path)
    with pytest.raises(CheckpointError, match="two members named"):
        serialization.get_unsafe_globals_in_checkpoint(path)
    path = _archive(tmp_path / "two.pt", one, storages={}, members=[("other/data.pkl", two)])
    with pytest.raises(CheckpointError, match=r"2 data.pkl records \(archive/data.pkl, "
                                              r"other/data.pkl\); refused as ambiguous"):
        tapegrad.load(path)


def _central_header(data, name):
    at = data.rindex(name.encode()) - 46
    assert data[at:at + 4] == b"PK\x01\x02"
    return at


def test_corrupt_zip_members_raise_checkpoint_error(tmp_path):
    good = tmp_path / "good.pt"
    tapegrad.save({"w": tapegrad.arange(100.0)}, good)
    with zipfile.ZipFile(good) as z:
        members = [(i.filename, z.read(i)) for i in z.infolist()]
    deflated = tmp_path / "deflated.pt"
    with zipfile.ZipFile(deflated, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in members:
            z.writestr(name, data)
    np.testing.assert_array_equal(tapegrad.load(deflated)["w"], np.arange(100.0, dtype="f4"))
    raw = bytearray(deflated.read_bytes())
    with zipfile.ZipFile(deflated) as z:
        info = z.getinfo("archive/data.pkl")
    start = info.header_offset + 30 + len(info.filename) + len(info.extra)
    raw[start:start + info.compress_size] = b"\xff" * info.compress_size  # invalid block type
    bad = tmp_path / "bad_deflate.pt"
    bad.write_bytes(bytes(raw))
    with pytest.raises(CheckpointError, match="member archive/data.pkl is corrupt: its deflate "
                                              "data does not inflate"):
        tapegrad.load(bad)
    raw = bytearray(good.read_bytes())
    at = _central_header(raw, "archive/data.pkl")
    raw[at + 6:at + 8] = (99).to_bytes(2, "little")  # "version needed to extract": 9.9
    (tmp_path / "version.pt").write_bytes(bytes(raw))
    with pytest.raises(CheckpointError, match=r"a member needs zip file version 9.9 to "
                                              r"extract; this reader supports up to 6.3"):
        tapegrad.load(tmp_path / "version.pt")
    raw = bytearray(good.read_bytes())
    at = _central_header(raw, "archive/data/0")
    raw[at + 8] |= 1  # the "encrypted" flag
    (tmp_path / "encrypted.pt").write_bytes(bytes(raw))
    with pytest.raises(CheckpointError, match="member archive/data/0 is encrypted"):
        tapegrad.load(tmp_path / "encrypted.pt")


def test_sizes_and_strides_beyond_int64(tmp_path):
    # PyTorch raises TypeError ("Overflow when unpacking long long") for each
    cases = {"stride": (_tensor(size=(1,), stride=(2**64,)), r"stride \(18446744073709551616,\) "
                        r"holds 18446744073709551616, outside int64"),
             "size": (_tensor(size=(0, 2**64), stride=(1, 1)), "outside int64"),
             "negative": (_tensor(size=(-2**70,)), "outside int64")}
    for name, (pkl, match) in cases.items():
        path = _archive(tmp_path / f"{name}.pt", PROTO + pkl + b".")
        for weights_only in (True, False):
            with pytest.raises(CheckpointError, match=match):
                tapegrad.load(path, weights_only=weights_only)
    # a size-1 dim's stride addresses nothing: one within int64 but too large in bytes for
    # numpy loads, as in PyTorch
    path = _archive(tmp_path / "one.pt", PROTO + _tensor(size=(1, 2), stride=(2**62, 1)) + b".")
    assert tapegrad.load(path).tolist() == torch.load(path, weights_only=True).tolist() == [
        [0.0, 1.0]]


def test_more_dims_than_numpy_holds(tmp_path):
    # refused before the sizes are multiplied out: a file may repeat a size 10**6 times, and
    # the product of a million ints takes quadratic time (PyTorch builds such a tensor)
    pkl = PROTO + _tensor(size=(1,) * 65, stride=(1,) * 65) + b"."
    with pytest.raises(CheckpointError, match=r"size \(1, 1, 1, 1, 1.*\(at most 64 dims\)"):
        tapegrad.load(_archive(tmp_path / "dims.pt", pkl))


def test_non_seekable_stream_is_buffered(tmp_path):
    path = tmp_path / "w.pt"
    tapegrad.save({"w": tapegrad.arange(5.0)}, path)
    data = path.read_bytes()
    for call in (tapegrad.load, serialization.get_unsafe_globals_in_checkpoint):
        read_fd, write_fd = os.pipe()

        def feed():
            with os.fdopen(write_fd, "wb") as w:
                w.write(data)

        writer = threading.Thread(target=feed)
        writer.start()
        with os.fdopen(read_fd, "rb") as pipe:
            assert not pipe.seekable()
            result = call(pipe)
        writer.join()
        # (PyTorch refuses a non-seekable file and asks for an io.BytesIO)
        assert result == [] if call is not tapegrad.load else result["w"].tolist() == list(
            range(5))


def test_map_location_errors_are_the_callers_not_the_files(tmp_path):
    path = tmp_path / "w.pt"
    torch.save({"w": torch.arange(3.0)}, path)

    def broken(storage, location):
        raise KeyError("caller's bug")

    for weights_only in (True, False):
        with pytest.raises(TypeError, match=r"map_location returned int for a storage at 'cpu'; "
                                            "it must return the storage it was given") as info:
            tapegrad.load(path, map_location=lambda storage, location: 5,
                          weights_only=weights_only)
        assert not isinstance(info.value, CheckpointError)
        with pytest.raises(KeyError, match="caller's bug"):
            tapegrad.load(path, map_location=broken, weights_only=weights_only)


# --- the weights-only allow-list ---------------------------------------------------------------
def test_weights_only_allow_list_follows_pytorch(tmp_path):
    size = PROTO + b"ctorch\nSize\n" + b"(" + _ints((2, 3)) + b"tR."
    path = _archive(tmp_path / "size.pt", size, storages={})
    assert torch.load(path, weights_only=True) == torch.Size([2, 3])
    assert tapegrad.load(path) == (2, 3)
    bad_size = PROTO + b"ctorch\nSize\n" + b"(" + b"(" + _str("a") + b"ttR."
    path = _archive(tmp_path / "bad_size.pt", bad_size, storages={})
    with pytest.raises(TypeError, match="iterable of 'int'"):
        torch.load(path, weights_only=True)
    with pytest.raises(CheckpointError, match=r"torch.Size takes int64 items, but item 0 of "
                                              r"\('a',\) is 'a'"):
        tapegrad.load(path)
    # PyTorch refuses UntypedStorage by the name torch.UntypedStorage, and reads it by its
    # module's name, as it pickles it
    for name, ok in ((b"torch\nUntypedStorage", False), (b"torch.storage\nUntypedStorage", True)):
        pkl = PROTO + _tensor(size=(3,), storage=b"c" + name + b"\n", numel=12) + b"."
        path = _archive(tmp_path / "untyped.pt", pkl)
        if ok:
            torch.load(path, weights_only=True)
            assert tapegrad.load(path).tolist() == [0, 0, 0]  # uint8 elements, as in PyTorch
        else:
            for load in (torch.load, tapegrad.load):
                with pytest.raises(pickle.UnpicklingError, match="Unsupported global: GLOBAL "
                                                                 "torch.UntypedStorage"):
                    load(path, weights_only=True)
    # a bytearray is rebuilt from its contents, never from a count of bytes to allocate
    # (PyTorch calls bytearray(2**40) and runs out of memory)
    path = _archive(tmp_path / "bytes.pt", PROTO + b"cbuiltins\nbytearray\n(" + _int(2**40) +
                    b"tR.", storages={})
    with pytest.raises(CheckpointError, match="bytearray is rebuilt from 1099511627776, not "
                                              "bytes"):
        tapegrad.load(path)
    path = tmp_path / "ba.pt"
    tapegrad.save({"b": bytearray(b"\x00\xff")}, path)
    expected = {"b": bytearray(b"\x00\xff")}
    assert tapegrad.load(path) == torch.load(path, weights_only=True) == expected


def test_backward_hooks_in_a_file_are_refused(tmp_path):
    # torch.save never writes hooks; PyTorch still attaches whatever the file carries (here
    # collections.Counter, called with the gradient at backward), tapegrad refuses
    hooks = b"ccollections\nOrderedDict\n)R" + _int(0) + b"ccollections\nCounter\ns"
    path = _archive(tmp_path / "hooks.pt", PROTO + _tensor(hooks=hooks) + b".")
    assert list(torch.load(path, weights_only=True)._backward_hooks.values()) == [
        collections.Counter]
    for weights_only in (True, False):
        with pytest.raises((pickle.UnpicklingError, CheckpointError),
                           match=r"a tensor is rebuilt with backward hooks OrderedDict\(\{0: "
                                 r"<class 'collections.Counter'>\}\); tapegrad does not load "
                                 "hooks"):
            tapegrad.load(path, weights_only=weights_only)
    param = (PROTO + b"ctorch._utils\n_rebuild_parameter\n(" + _tensor() + b"\x88" + hooks +
             b"tR.")
    with pytest.raises(pickle.UnpicklingError, match="a Parameter is rebuilt with backward"):
        tapegrad.load(_archive(tmp_path / "param.pt", param))


# --- tapegrad's older JSON format --------------------------------------------------------------
def _legacy(path, tree, arrays):
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("tapegrad/format", b"tapegrad-checkpoint 1")
        z.writestr("tapegrad/object.json", __import__("json").dumps(tree))
        for i, arr in enumerate(arrays):
            buf = io.BytesIO()
            np.save(buf, arr)
            z.writestr(f"tapegrad/arrays/{i}.npy", buf.getvalue())
    return path


def test_legacy_format_refuses_dtypes_tapegrad_lacks_at_load(tmp_path):
    u16 = np.arange(3, dtype=np.uint16)
    cases = [({"$tensor": 0, "dtype": None}, u16, r"array 0 has dtype None, which tapegrad does "
                                                    r"not support \(supported: bool, uint8"),
             ({"$tensor": 0, "dtype": "uint16"}, u16, "array 0 has dtype 'uint16'"),
             ({"$tensor": 0, "dtype": "complex64"}, u16.astype("c8"), "dtype 'complex64'"),
             ({"$tensor": 0, "dtype": "float32"}, np.array(["a", "b"]),
              "array 0 holds numpy dtype <U1, but the object says float32"),
             ({"$ndarray": 0, "dtype": None}, np.array(["2020-01-01"], dtype="M8[D]"),
              r"array 0 has numpy dtype datetime64\[D\], which tapegrad does not load"),
             ({"$ndarray": 0, "dtype": None}, np.zeros(2, dtype="f4,i4"), "numpy dtype"),
             ({"$dtype": "uint16"}, None, "a dtype entry has dtype 'uint16'"),
             ({"$float": "1" * 10**5}, None, r"\$float of '1111.*\.\.\., not nan or inf"),
             ({"$ref": [[1] * 10**5]}, None, r"unknown tensor \[\[1, 1, 1.*\.\.\.$")]
    for i, (tree, arr, match) in enumerate(cases):
        path = _legacy(tmp_path / f"{i}.tg", tree, [] if arr is None else [arr])
        with pytest.raises(CheckpointError, match=match):
            tapegrad.load(path)
    # what the older save wrote still loads: a plain numpy array of any numeric dtype, and
    # bfloat16 stored as uint16
    path = tmp_path / "ok.tg"
    tio._save_legacy({"u16": u16, "c": u16.astype("c16"), "w": tapegrad.ones(2).to(
        tapegrad.bfloat16), "d": tapegrad.float16}, path)
    back = tapegrad.load(path)
    assert serialization.get_unsafe_globals_in_checkpoint(path) == []  # JSON names none
    assert back["u16"].dtype == np.uint16 and back["c"].dtype == np.complex128
    assert back["w"].dtype == tapegrad.bfloat16 and back["w"].tolist() == [1.0, 1.0]
    assert back["d"] is tapegrad.float16


def test_tensors_come_only_from_storages(tmp_path):
    # the legacy constructor torch.Tensor(n) allocates n elements: PyTorch calls it for a
    # file (4 TiB here, which fails; a size that fits is allocated), tapegrad refuses
    for opcode in (b"R", b"\x81"):  # REDUCE, NEWOBJ
        pkl = PROTO + b"ctorch\nTensor\n(" + _int(2**40) + b"t" + opcode + b"."
        path = _archive(tmp_path / "alloc.pt", pkl, storages={})
        with pytest.raises(pickle.UnpicklingError, match=r"the file calls torch.Tensor"
                                                         r"\(1099511627776,\); tapegrad rebuilds"):
            tapegrad.load(path)
    with pytest.raises(RuntimeError, match="allocate"):
        torch.load(path, weights_only=True)
    # a Parameter called with a count is refused too; one wrapping a tensor loads
    pkl = PROTO + b"ctorch.nn.parameter\nParameter\n(" + _int(7) + b"tR."
    with pytest.raises(CheckpointError, match="a Parameter is rebuilt from int"):
        tapegrad.load(_archive(tmp_path / "p.pt", pkl, storages={}))
    pkl = PROTO + b"ctorch.nn.parameter\nParameter\n(" + _tensor() + b"\x89tR."
    param = tapegrad.load(_archive(tmp_path / "q.pt", pkl))
    assert isinstance(param, tapegrad.nn.Parameter) and param.tolist() == [0.0, 1.0, 2.0]
    assert not param.requires_grad
