"""Sharing unified tensors with worker processes, and tables memory-mapped from files."""

import os

import numpy as np
import pytest
import torch
import torch.multiprocessing as mp

import directload
from directload import CorruptFileError


def _worker_write(x, row, value, q):
    q.put((directload.is_unified(x), x.memory_kind, int(x.shape[0])))
    x[torch.tensor([row])] = torch.full((1, x.shape[1]), value, dtype=x.dtype)


def _run_worker(*args):
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=_worker_write, args=(*args, q))
    p.start()
    info = q.get(timeout=120)
    p.join(timeout=120)
    assert p.exitcode == 0
    return info


def test_shared_tensor_reaches_a_spawned_worker_without_a_copy():
    x = directload.zeros((64, 8), shared=True, affinity="host")
    is_u, kind, rows = _run_worker(x, 5, 7.0)
    assert is_u and rows == 64
    assert (x.host[5] == 7.0).all()  # the worker wrote into our pages: no second copy
    assert x.host.sum().item() == 7.0 * 8


def test_shared_memory_tensor_registered_in_place():
    base = torch.zeros(32, 4).share_memory_()
    x = directload.to_unified(base)
    _run_worker(x, 2, 3.0)
    assert (base[2] == 3.0).all()


def test_file_backed_tensor_is_reopened_by_workers(tmp_path):
    path = tmp_path / "feat.npy"
    np.save(path, np.zeros((16, 4), np.float32))
    x = directload.from_file(path, mode="r+")
    _run_worker(x, 9, 2.5)
    assert (x.host[9] == 2.5).all()
    assert np.load(path)[9].tolist() == [2.5] * 4  # the file itself changed


def test_from_file_npy_and_raw(tmp_path, rng):
    data = rng.standard_normal((100, 37)).astype(np.float16)
    np.save(tmp_path / "a.npy", data)
    data.tofile(tmp_path / "a.bin")
    x = directload.from_file(tmp_path / "a.npy")
    y = directload.from_file(tmp_path / "a.bin", dtype=np.float16, shape=(-1, 37))
    z = directload.from_file(tmp_path / "a.bin", dtype=torch.float16, shape=(100, 37), affinity="host")
    idx = torch.from_numpy(rng.integers(0, 100, 50))
    for t in (x, y, z):
        assert t.is_unified and t.dtype == torch.float16 and t.shape == (100, 37)
        assert torch.equal(t[idx].cpu(), torch.from_numpy(data)[idx])


def test_read_only_files_refuse_writes(tmp_path):
    np.save(tmp_path / "a.npy", np.zeros((4, 2), np.float32))
    x = directload.from_file(tmp_path / "a.npy")
    with pytest.raises(PermissionError, match="read-only"):
        x[torch.tensor([0])] = torch.ones(1, 2)


def test_truncated_and_corrupt_files(tmp_path):
    np.save(tmp_path / "a.npy", np.zeros((10, 8), np.float32))
    raw = (tmp_path / "a.npy").read_bytes()
    (tmp_path / "short.npy").write_bytes(raw[:-4])
    with pytest.raises(CorruptFileError, match="truncated: header promises 448 bytes, file has 444"):
        directload.from_file(tmp_path / "short.npy")
    (tmp_path / "junk.npy").write_bytes(b"not numpy at all")
    with pytest.raises(CorruptFileError, match="not a valid .npy file"):
        directload.from_file(tmp_path / "junk.npy")
    (tmp_path / "r.bin").write_bytes(b"\0" * 30)
    with pytest.raises(CorruptFileError, match="30 bytes is not a whole number of 8-byte rows"):
        directload.from_file(tmp_path / "r.bin", dtype=np.float32, shape=(-1, 2))
    with pytest.raises(CorruptFileError, match=r"truncated: shape \(4, 2\) of float32 needs 32 bytes, file has 30"):
        directload.from_file(tmp_path / "r.bin", dtype=np.float32, shape=(4, 2))
    with pytest.raises(ValueError, match="needs dtype and shape"):
        directload.from_file(tmp_path / "r.bin")
    with pytest.raises(FileNotFoundError):
        directload.from_file(tmp_path / "missing.npy")
    assert isinstance(CorruptFileError("x"), ValueError)


def test_file_mapping_is_zero_copy(tmp_path):
    arr = np.lib.format.open_memmap(tmp_path / "big.npy", mode="w+", dtype=np.float32, shape=(1 << 18, 64))
    arr[-1] = 5.0
    arr.flush()
    del arr
    import psutil

    rss = psutil.Process(os.getpid()).memory_info().rss
    x = directload.from_file(tmp_path / "big.npy")  # 64 MiB table
    got = x[torch.tensor([(1 << 18) - 1])]
    assert (got == 5.0).all()
    assert psutil.Process(os.getpid()).memory_info().rss - rss < 16 << 20  # not read into memory


def test_stray_host_writes_to_a_read_only_file_do_not_crash_or_change_it(tmp_path):
    np.save(tmp_path / "a.npy", np.zeros((4, 2), np.float32))
    x = directload.from_file(tmp_path / "a.npy")
    x.host[1] = 9.0  # copy-on-write mapping: private pages change, the file does not
    assert x.host[1].tolist() == [9.0, 9.0]
    assert np.load(tmp_path / "a.npy")[1].tolist() == [0.0, 0.0]
