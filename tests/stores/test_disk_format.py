"""The disk store's file: a standard .npy numpy reads, 4 KiB-aligned rows, a checksummed sidecar, safe writes."""

import json

import numpy as np
import pytest
import torch
from conftest import bits, random_table

from directload.files import CorruptFileError
from directload.stores import DiskStore, read_layout, verify, write_disk_store
from directload.stores.disk_format import DATA_ALIGN
from directload.stores.generations import sidecar_path


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int8, torch.bool, torch.float64])
def test_the_file_is_a_standard_npy_with_rows_at_4_kib(tmp_path, rng, dtype):
    table = random_table(rng, 33, 13, dtype)
    path = write_disk_store(table, tmp_path / "f.npy", progress=False)
    layout = read_layout(path)
    assert layout.data_offset == DATA_ALIGN and layout.dtype == dtype and layout.shape == (33, 13)
    loaded = np.load(path, mmap_mode="r")
    # numpy has no bfloat16: the file holds its bits
    want = table.view(torch.int16).numpy().view(np.uint16) if dtype == torch.bfloat16 else table.numpy()
    assert loaded.shape == (33, 13) and np.array_equal(np.asarray(loaded), want)
    assert np.array_equal(np.load(path), want)
    meta = json.loads(sidecar_path(read_layout(path).path).read_text())
    assert meta["dtype"] == str(dtype).removeprefix("torch.") and meta["checksum"] == "crc32c"


def test_sources_npy_file_numpy_tensor_and_dataset(tmp_path, rng):
    table = random_table(rng, 500, 7, torch.float16)
    src = tmp_path / "plain.npy"
    np.save(src, table.numpy())
    for i, source in enumerate((src, table.numpy(), table)):
        with DiskStore(write_disk_store(source, tmp_path / f"s{i}.npy", progress=False, chunk_bytes=1000)) as s:
            assert torch.equal(s.read(torch.arange(500)), table)

    class Dataset:  # what directload.datasets.load returns, as far as the writer looks
        feat = table

    with DiskStore(write_disk_store(Dataset(), tmp_path / "d.npy", progress=False)) as s:
        assert torch.equal(s.read([499]), table[[499]])


def test_any_plain_npy_opens_without_a_sidecar(tmp_path, rng):
    table = random_table(rng, 40, 3, torch.int32)
    path = tmp_path / "plain.npy"
    np.save(path, table.numpy())
    with DiskStore(path) as store:
        assert read_layout(path).sidecar is None and torch.equal(store.read([39, 1]), table[[39, 1]])
    with pytest.raises(CorruptFileError, match="no sidecar"):
        verify(path, progress=False)


def test_verify_finds_the_bad_chunk(tmp_path, rng):
    table = random_table(rng, 1000, 10, torch.float32)  # 40 kB of data in 4 KiB-aligned 10000-byte chunks
    path = write_disk_store(table, tmp_path / "f.npy", progress=False, chunk_bytes=10000)
    report = verify(path, progress=False)
    assert report["chunks"] == 4 and report["bad_chunks"] == [] and report["bytes"] == 40000
    with open(read_layout(path).path, "r+b") as f:
        f.seek(DATA_ALIGN + 25000)
        byte = f.read(1)
        f.seek(DATA_ALIGN + 25000)
        f.write(bytes([byte[0] ^ 0xFF]))
    report = verify(path, progress=False)
    assert report["bad_chunks"] == [(2, DATA_ALIGN + 20000, DATA_ALIGN + 29999)]


def test_broken_files_raise_corrupt_file_error_at_open(tmp_path):
    path = write_disk_store(torch.zeros(100, 4), tmp_path / "f.npy", progress=False)
    data = read_layout(path).path
    side = sidecar_path(data)
    meta = json.loads(side.read_text())

    meta["shape"] = [99, 4]
    side.write_text(json.dumps(meta))
    with pytest.raises(CorruptFileError, match="fails its own checksum"):
        DiskStore(path)
    side.write_text("{not json")
    with pytest.raises(CorruptFileError, match="unreadable sidecar"):
        DiskStore(path)
    side.unlink()
    with pytest.raises(CorruptFileError, match="sidecar .* is missing"):
        DiskStore(path)
    with open(data, "r+b") as f:
        f.truncate(DATA_ALIGN + 100)
    with pytest.raises(CorruptFileError, match="truncated"):
        DiskStore(path)
    bad = tmp_path / "bad.npy"
    bad.write_bytes(b"not a numpy file at all")
    with pytest.raises(CorruptFileError, match="not a valid .npy"):
        DiskStore(bad)
    with pytest.raises(FileNotFoundError):
        DiskStore(tmp_path / "missing.npy")


def test_writes_never_overwrite_what_directload_did_not_write(tmp_path):
    mine = tmp_path / "user.npy"
    mine.write_bytes(b"precious")
    for overwrite in (False, True):
        with pytest.raises(FileExistsError):
            write_disk_store(torch.zeros(2, 2), mine, overwrite=overwrite, progress=False)
    assert mine.read_bytes() == b"precious" and not sidecar_path(mine).exists()
    ours = write_disk_store(torch.zeros(2, 2), tmp_path / "ours.npy", progress=False)
    with pytest.raises(FileExistsError, match="overwrite=True"):
        write_disk_store(torch.ones(3, 2), ours, progress=False)
    write_disk_store(torch.ones(3, 2), ours, overwrite=True, progress=False)
    with DiskStore(ours) as store:
        assert torch.equal(store.read([2]), torch.ones(1, 2))
    with pytest.raises(ValueError, match="onto itself"):
        write_disk_store(ours, ours, overwrite=True, progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ours.npy", "ours.npy.g2", "ours.npy.g2.dlstore.json",
                                                           "user.npy"]


def test_a_failed_write_leaves_nothing_behind(tmp_path):
    with pytest.raises(TypeError):
        write_disk_store(np.array([object()]), tmp_path / "f.npy", progress=False)
    with pytest.raises(TypeError):
        write_disk_store(torch.zeros(2, dtype=torch.complex64), tmp_path / "f.npy", progress=False)
    with pytest.raises(ValueError, match="chunk_bytes"):
        write_disk_store(torch.zeros(2), tmp_path / "f.npy", progress=False, chunk_bytes=0)
    assert list(tmp_path.iterdir()) == []


def test_bfloat16_rows_round_trip_bit_exact(tmp_path, rng):
    table = random_table(rng, 64, 602, torch.bfloat16)
    with DiskStore(write_disk_store(table, tmp_path / "b.npy", progress=False)) as store:
        assert store.dtype == torch.bfloat16
        got = store.read(torch.arange(63, -1, -1))
        assert torch.equal(bits(got), bits(table.flip(0)))


def test_tables_without_rows_round_trip(tmp_path):
    for i, table in enumerate((np.zeros((0, 5), np.float32), np.zeros((0,), np.int64))):
        with DiskStore(write_disk_store(table, tmp_path / f"e{i}.npy", progress=False)) as store:
            assert store.shape == table.shape and store.read([]).shape == (0, *table.shape[1:])
        assert verify(tmp_path / f"e{i}.npy", progress=False)["bad_chunks"] == []


@pytest.mark.parametrize("dtype", [np.complex64, np.uint32, np.dtype(">f4"), np.float128])
def test_rows_the_reader_cannot_take_are_refused_by_the_writer(tmp_path, dtype):
    with pytest.raises(TypeError, match="cannot be written"):
        write_disk_store(np.zeros((3, 2), dtype), tmp_path / "f.npy", progress=False)
    assert list(tmp_path.iterdir()) == []
