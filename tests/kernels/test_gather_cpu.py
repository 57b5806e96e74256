"""The public gather on the CPU backend, against torch indexing."""

import numpy as np
import pytest
import torch
from conftest import DTYPES, ROW_ELEMS, assert_gathers, random_table

from directload.kernels import GatherFuture, gather, gather_async


@pytest.mark.parametrize("aligned", [True, False], ids=["aligned", "naive"])
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("row_elems", ROW_ELEMS)
def test_matches_torch_indexing(row_elems, dtype, index_dtype, aligned, rng):
    src = random_table(rng, 257, row_elems, dtype)
    idx = torch.from_numpy(rng.integers(0, 257, 300)).to(index_dtype)  # duplicates likely
    assert_gathers(lambda out: gather(src, idx, out=out, aligned=aligned), src, idx)


def test_returns_new_cpu_tensor_of_src_dtype(rng):
    src = random_table(rng, 50, 7, torch.bfloat16)
    got = gather(src, torch.tensor([4, 4, 0]))
    assert got.device.type == "cpu" and got.dtype == torch.bfloat16 and got.shape == (3, 7)
    assert torch.equal(got, src[[4, 4, 0]])


def test_multidimensional_rows_and_1d_tables(rng):
    src = random_table(rng, 40, 15, torch.float32).reshape(40, 3, 5)
    idx = torch.tensor([39, 0, 7])
    assert torch.equal(gather(src, idx), src[idx])
    flat = random_table(rng, 40, 1, torch.int64).reshape(40)
    assert torch.equal(gather(flat, idx), flat[idx])


def test_empty_index_and_zero_width_rows():
    src = torch.randn(10, 4)
    got = gather(src, torch.empty(0, dtype=torch.int64))
    assert got.shape == (0, 4) and got.dtype == torch.float32
    assert gather(torch.empty(10, 0), torch.tensor([1, 2])).shape == (2, 0)


def test_numpy_index_is_accepted(rng):
    src = random_table(rng, 30, 9, torch.float16)
    idx = rng.integers(0, 30, 20).astype(np.int32)
    assert torch.equal(gather(src, idx), src[torch.from_numpy(idx).long()])


@pytest.mark.parametrize("offset_bytes", range(0, 128, 4))
def test_every_row_start_offset_in_a_line(offset_bytes, rng):
    buf = torch.from_numpy(rng.integers(0, 256, 128 + 64 * 37 * 4, dtype=np.uint8))
    src = buf[offset_bytes:offset_bytes + 64 * 37 * 4].view(torch.float32).reshape(64, 37)
    src = torch.nan_to_num(src)
    idx = torch.from_numpy(rng.integers(0, 64, 100))
    assert_gathers(lambda out: gather(src, idx, out=out), src, idx)


def test_async_ladder(rng):
    src = random_table(rng, 100, 33, torch.float32)
    idx = torch.from_numpy(rng.integers(0, 100, 500))
    out = torch.full((500, 33), float("nan"))
    fut = gather_async(src, idx, out=out)
    assert isinstance(fut, GatherFuture)
    assert fut.done() and torch.equal(out, src[idx])  # a CPU gather has run on this thread when this returns
    got = fut.wait()
    assert got is out and fut.done() and fut.wait() is got
    fut = gather_async(src, idx, background=True)  # on the worker thread, at once
    assert torch.equal(fut.wait(), src[idx]) and fut.done()


def test_gather_is_gather_async_wait(monkeypatch, rng):
    """gather() has no path of its own: it is gather_async(...).wait(), fast path included."""
    from directload.kernels import api

    src = random_table(rng, 100, 33, torch.float32)
    idx = torch.from_numpy(rng.integers(0, 100, 500))
    gather(src, idx)  # the table is now cached: the fast path serves the next calls
    calls = []
    real = api.gather_async
    monkeypatch.setattr(api, "gather_async", lambda *a, **k: calls.append((a, k)) or real(*a, **k))
    out = torch.empty(500, 33)
    assert api.gather(src, idx, out=out, aligned=False) is out and torch.equal(out, src[idx])
    assert len(calls) == 1 and calls[0][1] == {"out": out, "backend": "auto", "aligned": False,
                                                 "variant": None, "strict": False}
    with pytest.raises(IndexError, match="out of range"):  # the fast path's kernel check raises in gather_async
        real(src, torch.tensor([0, 100]))


def test_bad_input_raises_in_gather_async_not_in_wait():
    with pytest.raises(IndexError, match="out of range"):
        gather_async(torch.zeros(3, 2), torch.tensor([3]))


@pytest.mark.parametrize("row", [64, 4096], ids=["loop-copied", "memcpy-copied"])
def test_tables_over_2_pow_31_elements(row):
    """64-bit offsets: rows past element 2**31 of an int8 table come back right."""
    rows = (1 << 31) // row + 1000 * 64 // row + 1  # 2.1 GB, allocated lazily; only touched rows are written
    src = torch.empty(rows, row, dtype=torch.int8)
    picks = torch.tensor([rows - 1, 5, (1 << 31) // row + 3, rows - 2], dtype=torch.int64)
    for i, r in enumerate(picks.tolist()):
        src[r] = torch.arange(row, dtype=torch.int8) + i
    for aligned in (True, False):
        assert_gathers(lambda out, a=aligned: gather(src, picks, out=out, aligned=a), src, picks,
                       expected=torch.stack([src[r] for r in picks.tolist()]))
