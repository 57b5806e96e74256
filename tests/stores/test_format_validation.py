"""A store's files are trusted in nothing: every malformed, tampered or foreign input is refused at open
with a CorruptFileError naming the file and the field, before any row is read, and nothing hangs."""

import io
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from conftest import within

import directload
from directload.files import CorruptFileError
from directload.npy import header_bytes, make_mark
from directload.stores import DiskStore, TieredStore, read_layout, renumber, verify, write_disk_store
from directload.stores.disk_format import sidecar_crc
from directload.stores.generations import id_map_path, sidecar_path

OPENERS = {
    "DiskStore": lambda p: DiskStore(p).close(),
    "read_layout": lambda p: read_layout(p, with_id_map=True),
    "verify": lambda p: verify(p, progress=False),
    "tiered": lambda p: TieredStore(p, host_bytes=1 << 16).close(),
    "convert": lambda p: write_disk_store(p, os.path.join(os.path.dirname(p), "copy.npy"), progress=False),
}


def refused(path, match, openers=OPENERS):
    """Every way of opening ``path`` raises CorruptFileError matching ``match``, within seconds."""
    for name, opener in openers.items():
        with pytest.raises(CorruptFileError, match=match):
            within(20, lambda opener=opener: opener(str(path)))
        assert not os.path.lexists(os.path.join(os.path.dirname(path), "copy.npy")), name


@pytest.fixture
def store(tmp_path):
    return write_disk_store(torch.arange(400.0).view(100, 4), tmp_path / "f.npy", progress=False)


@pytest.fixture
def packed(tmp_path, store):
    return renumber(store, tmp_path / "p.npy", np.arange(100)[::-1].copy(), progress=False)


def data_of(path):
    return read_layout(path).path


def edit_sidecar(path, change, *, forge=True):
    """Apply ``change`` to the store's sidecar; with ``forge``, fix its own checksum after (a forger's edit)."""
    side = sidecar_path(data_of(path))
    meta = json.loads(side.read_text())
    change(meta)
    if forge and "sidecar_crc32c" in meta:
        meta["sidecar_crc32c"] = sidecar_crc(meta)
    side.write_text(json.dumps(meta))


def raw_npy(path, shape, descr="<f4", data=b"", version=(1, 0), extra=""):
    text = repr({"descr": descr, "fortran_order": False, "shape": shape}) + extra
    text += " " * (-(len(text) + 11) % 64) + "\n"
    if version == (1, 0):
        head = b"\x93NUMPY\x01\x00" + len(text).to_bytes(2, "little")
    else:
        head = b"\x93NUMPY" + bytes(version) + len(text).to_bytes(4, "little")
    path.write_bytes(head + text.encode("latin1") + data)
    return path


@pytest.mark.parametrize("rows", [2 ** 62, 2 ** 62 + 1, 2 ** 63, 2 ** 64 + 100])
def test_a_header_whose_size_wraps_in_64_bits_is_refused(tmp_path, rows):
    # 2**62 rows of 16 bytes are 2**66 bytes: a product in int64 wraps to 0, and row 2**62+5 read row 5
    path = raw_npy(tmp_path / "huge.npy", (rows, 4), data=bytes(160))
    refused(path, "header promises")
    with pytest.raises(CorruptFileError, match="header promises"):
        directload.from_file(path, pin="auto")


@pytest.mark.parametrize("shape", [(2 ** 62, 4), (10, 2 ** 62), (2 ** 61, 2 ** 3)])
def test_a_raw_shape_whose_size_wraps_in_64_bits_is_refused(tmp_path, shape):
    path = tmp_path / "raw.bin"
    path.write_bytes(bytes(160))
    with pytest.raises(CorruptFileError, match="need"):
        DiskStore(path, dtype=torch.float32, shape=shape)
    with pytest.raises(CorruptFileError):
        directload.from_file(path, dtype=torch.float32, shape=shape, pin="auto")


@pytest.mark.parametrize("shape", [(-1, 4), (10, -4), (True, 4), ("10", 4), 10])
def test_bad_raw_shapes_are_value_errors(tmp_path, shape):
    path = tmp_path / "raw.bin"
    path.write_bytes(bytes(160))
    with pytest.raises(ValueError, match="shape"):
        DiskStore(path, dtype=torch.float32, shape=shape)


def test_negative_dimensions_in_a_header_are_refused(tmp_path):
    refused(raw_npy(tmp_path / "neg.npy", (-2, 4), data=bytes(0)), "non-negative")


def test_a_sidecar_saying_bfloat16_over_float32_rows_is_refused(store):
    edit_sidecar(store, lambda m: m.update(dtype="bfloat16"))
    refused(store, "bfloat16")


@pytest.mark.parametrize("dtype", ["int32", "float16", "float64", "uint8", "complex64", 7, None])
def test_a_sidecar_naming_another_dtype_is_refused(store, dtype):
    edit_sidecar(store, lambda m: m.update(dtype=dtype))
    refused(store, "dtype")


def test_a_packed_store_without_its_sidecar_is_refused(packed):
    sidecar_path(data_of(packed)).unlink()
    refused(packed, "sidecar .* is missing")


def test_a_packed_data_file_copied_away_from_its_store_is_refused(tmp_path, packed):
    copy = tmp_path / "copy-of-rows.npy"
    copy.write_bytes(data_of(packed).read_bytes())
    refused(copy, "sidecar .* is missing", {"DiskStore": OPENERS["DiskStore"]})
    with pytest.raises(CorruptFileError, match="packed"):  # np.load reads it, in hot order; directload will not
        directload.from_file(copy, pin="auto")


@pytest.mark.parametrize("forge", [False, True])
def test_a_packed_store_whose_sidecar_lost_its_id_map_entry_is_refused(packed, forge):
    edit_sidecar(packed, lambda m: m.pop("id_map"), forge=forge)
    refused(packed, "own checksum" if not forge else "rows are packed but no id map")


def test_a_plain_store_whose_sidecar_gained_an_id_map_is_refused(tmp_path, packed, store):
    edit_sidecar(store, lambda m: m.update(id_map={"file": data_of(store).name + ".dlmap.npy", "rows": 100,
                                                     "crc32c": 0}))
    refused(store, "id order")


def test_a_packed_store_without_its_id_map_is_refused(packed):
    id_map_path(data_of(packed)).unlink()
    refused(packed, "id map is missing", {k: OPENERS[k] for k in ("DiskStore", "read_layout", "convert")})


@pytest.mark.parametrize("content", [b"", b"\x93NUMPY", b"garbage", "npz", "other-store", "short", "int32",
                                     "duplicate"])
def test_a_damaged_or_foreign_id_map_is_refused(tmp_path, packed, content):
    path = id_map_path(data_of(packed))
    good = np.load(path)
    if content == "npz":
        buf = io.BytesIO()
        np.savez(buf, a=good)
        content = buf.getvalue()
    elif content == "other-store":  # a well-formed map of another write (another token)
        content = header_bytes(np.dtype("<i8"), (100,), mark=make_mark("f" * 32, False)) + good.tobytes()
    elif content == "short":
        content = header_bytes(np.dtype("<i8"), (99,)) + good[:99].tobytes()
    elif content == "int32":
        content = header_bytes(np.dtype("<i4"), (100,)) + good.astype(np.int32).tobytes()
    elif content == "duplicate":
        bad = good.copy()
        bad[0] = bad[1]
        content = header_bytes(np.dtype("<i8"), (100,)) + bad.tobytes()
    path.write_bytes(content)
    refused(packed, "id map", {k: OPENERS[k] for k in ("DiskStore", "read_layout", "convert")})


@pytest.mark.parametrize("cut", [5, 9, 11, 60, 200])
def test_a_truncated_header_is_refused(tmp_path, store, cut):
    path = tmp_path / "cut.npy"
    path.write_bytes(data_of(store).read_bytes()[:cut])
    refused(path, "not a valid .npy")


@pytest.mark.parametrize("tail", ["{'descr': '<f4', 'fortran_order': False, 'shape': (3,", "{'descr': '<f4', ",
                                  "[1, 2, 3]", "{'descr': '<f4', 'fortran_order': False, 'shape': (3,), 'x': 1}",
                                  "{'descr': 'O', 'fortran_order': False, 'shape': (3,)}",
                                  "{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (3,)}",
                                  "'''", "\\x00" * 50])
def test_a_malformed_header_is_refused(tmp_path, tail):
    text = tail + " " * (-(len(tail) + 11) % 64) + "\n"
    path = tmp_path / "bad.npy"
    path.write_bytes(b"\x93NUMPY\x01\x00" + len(text).to_bytes(2, "little") + text.encode("latin1") + bytes(12))
    refused(path, ".")


def test_a_header_longer_than_any_reader_takes_is_refused(tmp_path):
    path = tmp_path / "long.npy"
    path.write_bytes(b"\x93NUMPY\x02\x00" + (1 << 31).to_bytes(4, "little") + b"{")
    refused(path, "not a valid .npy")


@pytest.mark.parametrize("sidecar", ["[" * 100000 + "]" * 100000, '{"a": ' * 50000 + "1" + "}" * 50000, '"string"',
                                     "[1, 2]", "null", "\xff\xfe", "", "{" + '"x": 1, ' * 10 + "}"])
def test_an_unreadable_sidecar_is_refused(store, sidecar):
    sidecar_path(data_of(store)).write_bytes(sidecar.encode("utf-8", "surrogateescape")
                                             if isinstance(sidecar, str) else sidecar)
    refused(store, "sidecar")


@pytest.mark.parametrize("field,value", [("id_map", "a string"), ("id_map", [1, 2]), ("id_map", {"file": 3}),
                                         ("chunk_bytes", 0), ("chunk_bytes", "4M"), ("chunk_bytes", -1),
                                         ("chunk_bytes", 4.0), ("chunk_bytes", True), ("chunks", "abc"),
                                         ("chunks", [1.5]), ("chunks", [-1]), ("chunks", [2 ** 40]),
                                         ("chunks", []), ("shape", "100,4"), ("shape", [100.0, 4]),
                                         ("data_offset", "4096"), ("file_bytes", None), ("checksum", "md5"),
                                         ("version", "2"), ("version", 3), ("format", "other"),
                                         ("token", "0" * 32), ("data", "elsewhere.npy"), ("generation", 9)])
def test_every_sidecar_field_is_checked_even_under_a_forged_checksum(store, field, value):
    edit_sidecar(store, lambda m: m.update({field: value}))
    refused(store, "sidecar|field|token|says|version")


def test_a_sidecar_of_another_write_is_refused(tmp_path):
    a = write_disk_store(torch.zeros(100, 4), tmp_path / "a.npy", progress=False)
    b = write_disk_store(torch.ones(100, 4), tmp_path / "b.npy", progress=False)
    other = json.loads(sidecar_path(data_of(b)).read_text())
    other["data"], other["generation"] = data_of(a).name, 1
    other["sidecar_crc32c"] = sidecar_crc(other)
    sidecar_path(data_of(a)).write_text(json.dumps(other))
    refused(a, "token")


def test_a_version_1_store_whose_sidecar_lost_its_id_map_entry_is_refused(tmp_path):
    # before generations: the files lay side by side; a map beside a sidecar that names none is refused
    path = tmp_path / "old.npy"
    np.save(path, np.zeros((10, 2), np.float32))
    head = np.lib.format.read_array_header_1_0
    with open(path, "rb") as f:
        np.lib.format.read_magic(f)
        head(f)
        offset = f.tell()
    sidecar_path(path).write_text(json.dumps({
        "format": "directload-disk-store", "version": 1, "dtype": "float32", "npy_descr": "<f4", "shape": [10, 2],
        "data_offset": offset, "file_bytes": offset + 80, "chunk_bytes": 4096, "checksum": "crc32c",
        "chunks": [0]}))
    read_layout(path)
    np.save(id_map_path(path), np.arange(10)[::-1].copy())
    refused(path, "id map", {"DiskStore": OPENERS["DiskStore"]})
    sidecar_path(path).unlink()
    refused(path, "id map", {"DiskStore": OPENERS["DiskStore"]})


@pytest.mark.parametrize("kind", ["fifo", "directory", "device"])
def test_files_that_are_not_regular_files_are_refused_at_once(tmp_path, kind):
    path = tmp_path / "thing.npy"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "directory":
        path.mkdir()
    else:
        path = "/dev/zero"
    refused(path, "not a regular file")
    with pytest.raises(CorruptFileError, match="not a regular file"):
        within(20, lambda: directload.from_file(path, pin="auto"))
    with pytest.raises(CorruptFileError, match="not a regular file"):
        within(20, lambda: DiskStore(path, dtype=torch.float32, shape=(1, 1)))


def test_a_fifo_in_place_of_a_sidecar_or_id_map_is_refused_at_once(packed):
    data = data_of(packed)
    id_map_path(data).unlink()
    os.mkfifo(id_map_path(data))
    refused(packed, "not a regular file", {k: OPENERS[k] for k in ("DiskStore", "read_layout")})
    sidecar_path(data).unlink()
    os.mkfifo(sidecar_path(data))
    refused(packed, "not a regular file", {k: OPENERS[k] for k in ("DiskStore", "read_layout")})


@pytest.mark.one_lane("dgl")  # a whole-process run: torch's version does not change it
def test_the_command_line_reports_malformed_stores_in_one_line(tmp_path, store):
    fifo = tmp_path / "pipe.npy"
    os.mkfifo(fifo)
    edit_sidecar(store, lambda m: m.update(chunk_bytes="4M"))
    for args in (["store", "verify", str(fifo)], ["store", "verify", str(store)],
                 ["dataset", "convert", "--to", "disk", "--input", str(fifo), "--no-progress"],
                 ["dataset", "convert", "--to", "disk", "--input", str(store), "--out", str(tmp_path / "o.npy")]):
        run = subprocess.run([sys.executable, "-m", "directload", *args], capture_output=True, encoding="utf-8",
                             timeout=120)
        assert run.returncode == 1, (args, run.stderr)
        lines = run.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("directload: error: "), (args, run.stderr)
        assert "Traceback" not in run.stderr


def test_a_numpy_reader_still_reads_every_store_file(packed, store):
    # the mark hides in the header's padding: numpy (and OGB's readers) see a standard .npy
    for path in (store, packed, id_map_path(data_of(packed))):
        assert np.load(path).shape[0] == 100
        assert np.load(path, mmap_mode="r").shape[0] == 100
