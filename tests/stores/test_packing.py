"""Hotness renumbering: the packed file reads the same rows by the same ids, across restarts, reads fewer
bytes for a hot working set, and a damaged id map is refused."""

import pickle

import numpy as np
import pytest
import torch
from conftest import bits, random_table

from directload.files import CorruptFileError
from directload.stores import (
    DiskStore,
    HostCache,
    access_counts,
    hot_order,
    read_layout,
    renumber,
    verify,
    write_disk_store,
)
from directload.stores.generations import id_map_path


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int8, torch.float64])
def test_a_renumbered_store_reads_the_same_rows_by_the_same_ids(tmp_path, rng, dtype):
    table = random_table(rng, 700, 13, dtype)
    src = write_disk_store(table, tmp_path / "a.npy", progress=False)
    counts = rng.integers(0, 6, 700)
    dst = renumber(src, tmp_path / "b.npy", counts, progress=False)
    assert verify(dst, progress=False)["bad_chunks"] == []
    ids = rng.integers(0, 700, 400)
    with DiskStore(dst) as store:
        assert store.dtype == dtype
        assert torch.equal(bits(store.read(ids)), bits(table[torch.from_numpy(ids)]))
        with HostCache(store, 50 * store.row_nbytes, staging_bytes=20 * store.row_nbytes) as cache:
            for _ in range(2):
                assert torch.equal(bits(cache.read(ids)), bits(table[torch.from_numpy(ids)]))
        again = pickle.loads(pickle.dumps(store))  # another process reopens it, map included
        assert torch.equal(bits(again.read(ids[:9])), bits(table[torch.from_numpy(ids[:9])]))
        again.close()
    # the file holds the hot rows first; the map is stored with it and survives a restart
    raw = np.load(dst, mmap_mode="r")
    order = hot_order(counts)
    assert np.array_equal(np.asarray(raw[:5]).view(np.uint8), table[torch.from_numpy(order[:5])].view(torch.uint8)
                          .reshape(5, -1).numpy().view(np.uint8).reshape(np.asarray(raw[:5]).view(np.uint8).shape))
    with DiskStore(dst) as reopened:
        assert np.array_equal(reopened.id_map[order], np.arange(700))


def test_packing_cuts_the_bytes_a_hot_working_set_reads(tmp_path, rng):
    rows = 20_000  # 64-byte rows: eight to a 512-byte block (this disk's), 64 to a 4 KiB one
    table = random_table(rng, rows, 16, torch.float32)
    src = write_disk_store(table, tmp_path / "a.npy", progress=False)
    hot = rng.choice(rows, 1000, replace=False)
    batches = [rng.choice(hot, 300, replace=False) for _ in range(20)]
    dst = renumber(src, tmp_path / "b.npy", access_counts(batches[:10], rows), progress=False)
    amp = {}
    for name, path in (("before", src), ("after", dst)):
        with DiskStore(path) as store:
            for b in batches[10:]:
                assert torch.equal(store.read(b), table[torch.from_numpy(b)])
            amp[name] = store.stats()
    assert amp["after"]["bytes_read"] * 2 < amp["before"]["bytes_read"]
    assert 1 <= amp["after"]["read_amplification"] < amp["before"]["read_amplification"]


def test_a_damaged_or_missing_id_map_is_refused(tmp_path, rng):
    table = random_table(rng, 100, 4, torch.float32)
    src = write_disk_store(table, tmp_path / "a.npy", progress=False)
    dst = renumber(src, tmp_path / "b.npy", rng.integers(0, 3, 100), progress=False)
    map_path = id_map_path(read_layout(dst).path)
    good = map_path.read_bytes()
    bad = bytearray(good)
    bad[-8:] = (7).to_bytes(8, "little")  # a row appears twice; the checksum no longer matches
    map_path.write_bytes(bytes(bad))
    with pytest.raises(CorruptFileError, match="checksum|permutation"):
        DiskStore(dst)
    map_path.write_bytes(good[:-8])
    with pytest.raises(CorruptFileError, match="id map"):
        DiskStore(dst)
    map_path.unlink()
    with pytest.raises(CorruptFileError, match="id map"):
        DiskStore(dst)
    map_path.write_bytes(good)
    with DiskStore(dst) as store:
        assert torch.equal(store.read([5, 0]), table[[5, 0]])


def test_bad_profiles_and_orders_are_refused(tmp_path, rng):
    table = random_table(rng, 50, 2, torch.float32)
    src = write_disk_store(table, tmp_path / "a.npy", progress=False)
    with pytest.raises(ValueError, match="one entry per row"):
        renumber(src, tmp_path / "b.npy", np.ones(49), progress=False)
    with pytest.raises(IndexError):
        access_counts([[0, 50]], 50)
    with pytest.raises(ValueError, match="permutation"):
        write_disk_store(table, tmp_path / "c.npy", order=np.zeros(50, np.int64), progress=False)
    with pytest.raises(ValueError, match="permutation"):
        write_disk_store(table, tmp_path / "c.npy", order=np.arange(49), progress=False)
    assert not any(p.name.startswith(("c.npy", ".c.npy")) for p in tmp_path.iterdir())
    renumber(src, tmp_path / "b.npy", np.ones(50), progress=False)
    with pytest.raises(FileExistsError):
        renumber(src, tmp_path / "b.npy", np.ones(50), progress=False)
    write_disk_store(table, tmp_path / "b.npy", overwrite=True, progress=False)  # a plain store again
    assert read_layout(tmp_path / "b.npy").sidecar.get("id_map") is None
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".dlmap.npy")]


def test_hot_order_puts_the_most_read_first_then_the_tiebreak_then_the_old_order():
    counts = np.array([0, 3, 1, 3, 0, 1])
    assert hot_order(counts).tolist() == [1, 3, 2, 5, 0, 4]
    assert hot_order(counts, tiebreak=np.array([9, 0, 1, 5, 9, 7])).tolist() == [3, 1, 5, 2, 0, 4]
    with pytest.raises(ValueError, match="tiebreak"):
        hot_order(counts, tiebreak=np.ones(5))


@pytest.mark.parametrize("shape", [(40,), (40, 0), (40, 2, 3)])
def test_any_row_shape_can_be_renumbered(tmp_path, rng, shape):
    table = torch.from_numpy(rng.standard_normal(shape).astype(np.float32))
    src = write_disk_store(table, tmp_path / "a.npy", progress=False)
    dst = renumber(src, tmp_path / "b.npy", rng.integers(0, 4, 40), progress=False)
    with DiskStore(dst) as store:
        assert torch.equal(store.read([39, 0, 7]), table[[39, 0, 7]])
