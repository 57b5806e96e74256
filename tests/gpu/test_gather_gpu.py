"""GPU gathers on a real device: zero-copy from pinned memory and from device memory.

Skipped without a CUDA device; benchmarks/gpu_suite.py runs them where one exists.
"""

import pytest
import torch
from conftest import DTYPES, ROW_ELEMS, assert_gathers, random_table

from directload.capabilities import capabilities
from directload.kernels import gather, gather_async

pytestmark = pytest.mark.gpu

BACKENDS = [b for b in ("cupy", "numba_cuda") if torch.cuda.is_available() and getattr(capabilities(), b)]


@pytest.mark.parametrize("aligned", [True, False], ids=["aligned", "naive"])
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("row_elems", ROW_ELEMS)
@pytest.mark.parametrize("where", ["pinned", "cuda"])
def test_matches_torch_indexing(where, row_elems, dtype, index_dtype, backend, aligned, rng):
    src = random_table(rng, 513, row_elems, dtype)
    src = src.pin_memory() if where == "pinned" else src.cuda()
    idx = torch.from_numpy(rng.integers(0, 513, 700)).to(index_dtype).cuda()

    def run(out):
        poisoned = out.to(idx.device)
        got = gather(src, idx, out=poisoned, backend=backend, aligned=aligned)
        assert got is poisoned and got.device == idx.device  # CUDA index -> CUDA output
        return got

    assert_gathers(run, src.cpu(), idx.cpu())


@pytest.mark.parametrize("backend", BACKENDS)
def test_out_argument_and_async(backend, rng):
    src = random_table(rng, 100, 37, torch.float16).pin_memory()
    idx = torch.from_numpy(rng.integers(0, 100, 64)).cuda()
    out = torch.full((64, 37), float("nan"), dtype=torch.float16, device="cuda")
    fut = gather_async(src, idx, out=out, backend=backend)
    assert fut.wait() is out
    torch.cuda.synchronize()
    assert fut.done()
    assert torch.equal(out.cpu(), src[idx.cpu()])


def test_cpu_index_over_cuda_src_raises():
    with pytest.raises(ValueError, match="pass a CUDA index"):
        gather(torch.zeros(4, 4, device="cuda"), torch.tensor([0]))


def test_cuda_index_over_pageable_src_raises():
    with pytest.raises(ValueError, match="pageable host memory"):
        gather(torch.zeros(4, 4), torch.tensor([0], device="cuda"))


def test_out_of_range_cuda_index_raises_before_launch_when_strict():
    out = torch.full((2, 4), 3.0, device="cuda")
    with pytest.raises(IndexError, match="index 4 is out of range for 4 rows"):
        gather(torch.zeros(4, 4).pin_memory(), torch.tensor([0, 4], device="cuda"), out=out, strict=True)
    assert (out == 3.0).all()


def test_out_of_range_cuda_index_raises_from_the_kernels_check():
    with pytest.raises(IndexError, match=r"index 4 is out of range for 4 rows .*at position 1\)"):
        gather_async(torch.zeros(4, 4).pin_memory(), torch.tensor([0, 4], device="cuda")).check()


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")
def test_index_on_other_device_raises():
    with pytest.raises(ValueError, match="index is on cuda:1 but src is on cuda:0"):
        gather(torch.zeros(4, 4, device="cuda:0"), torch.tensor([0], device="cuda:1"))


def test_64_bit_offsets_on_device():
    row = 64
    rows = (1 << 31) // row + 100
    src = torch.empty(rows, row, dtype=torch.int8).pin_memory()
    picks = torch.tensor([rows - 1, 1, (1 << 31) // row + 7])
    for i, r in enumerate(picks.tolist()):
        src[r] = torch.arange(row, dtype=torch.int8) + i
    for backend in BACKENDS:
        for aligned in (True, False):
            got = gather(src, picks.cuda(), backend=backend, aligned=aligned)
            assert torch.equal(got.cpu(), src[picks])


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("where", ["pinned", "cuda"])
def test_vector_unit_and_fallback_paths(where, backend, rng):
    """16-byte-aligned rows take the vector-unit kernel; an output 4 bytes off takes the scalar one."""
    src = random_table(rng, 300, 100, torch.float32)  # 400-byte rows
    src = src.pin_memory() if where == "pinned" else src.cuda()
    idx = torch.from_numpy(rng.integers(0, 300, 257)).cuda()
    want = src.cpu()[idx.cpu()]
    aligned_out = torch.full((257, 100), float("nan"), device="cuda")
    assert gather(src, idx, out=aligned_out, backend=backend).data_ptr() % 16 == 0
    assert torch.equal(aligned_out.cpu(), want)
    buf = torch.full((257 * 100 + 1,), float("nan"), device="cuda")
    shifted = buf[1:].view(257, 100)  # 4 bytes off a 16-byte boundary
    gather(src, idx, out=shifted, backend=backend)
    assert torch.equal(shifted.cpu(), want) and torch.isnan(buf[0]).item()


def test_disk_store_gathers_gpu_results_zero_copy_from_pinned_staging(tmp_path):
    import numpy as np

    from directload.stores import DiskStore, write_disk_store

    table = torch.randn(5000, 37)
    path = write_disk_store(table, tmp_path / "feat.npy", progress=False)
    with DiskStore(path) as store:
        ids = torch.from_numpy(np.random.default_rng(0).integers(0, 5000, 999))
        got = store.read(ids, device="cuda")
        assert got.is_cuda and torch.equal(got.cpu(), table[ids])
        assert store.stats()["zero_copy_batches"] == 1
