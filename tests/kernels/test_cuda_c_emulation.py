"""gather.cu's kernels, built for the host with g++ and a shim header, against torch indexing."""

import numpy as np
import pytest
import torch
from conftest import ROW_ELEMS, assert_gathers, random_table

from directload.kernels import host_emu
from directload.kernels.pcie_model import thread_map

# One dtype per element size: the kernels copy bits, specialised on size only.
SIZES = (torch.int8, torch.float16, torch.float32, torch.float64)


def _run(src, idx, aligned, grid=3, block=64):
    def run(out):
        host_emu.launch(src.numpy(), idx.numpy(), out.numpy(), aligned=aligned, grid=grid, block=block)
    return run


def _as_bits(t):
    size = t.element_size()
    return t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[size])


@pytest.mark.parametrize("aligned", [True, False], ids=["aligned", "naive"])
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("dtype", SIZES, ids=str)
@pytest.mark.parametrize("row_elems", ROW_ELEMS)
def test_matches_oracle(row_elems, dtype, index_dtype, aligned, rng):
    src = _as_bits(random_table(rng, 90, row_elems, dtype))
    idx = torch.from_numpy(rng.integers(0, 90, 150)).to(index_dtype)
    assert_gathers(_run(src, idx, aligned), src, idx)


@pytest.mark.parametrize("dtype", SIZES, ids=str)
def test_every_row_start_offset(dtype, rng):
    """Tables starting at every 4-byte offset in a line (8-byte for fp64, its alignment)."""
    size = torch.empty((), dtype=dtype).element_size()
    rows, n = 40, 37
    buf = torch.from_numpy(rng.integers(0, 256, 128 + rows * n * size, dtype=np.uint8))
    for offset in range(0, 128, max(4, size)):
        src = _as_bits(buf[offset:offset + rows * n * size].view(dtype).reshape(rows, n))
        assert src.data_ptr() % 128 == (buf.data_ptr() + offset) % 128
        idx = torch.from_numpy(rng.integers(0, rows, 60))
        for aligned in (True, False):
            assert_gathers(_run(src, idx, aligned), src, idx)


def test_empty_index_and_duplicates(rng):
    src = _as_bits(random_table(rng, 10, 11, torch.float32))
    empty = torch.empty(0, dtype=torch.int64)
    assert_gathers(_run(src, empty, True), src, empty)
    dup = torch.tensor([3] * 50, dtype=torch.int32)
    assert_gathers(_run(src, dup, True), src, dup)


@pytest.mark.parametrize("aligned", [True, False], ids=["aligned", "naive"])
@pytest.mark.parametrize("elem", [1, 2, 4, 8])
def test_threads_match_the_model_one_by_one(elem, aligned, rng):
    """Every output element is written by the thread and step the model predicts."""
    dtype = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[elem]
    for n in (1, 11, 37, 602):
        src = rng.integers(0, 100, (70, n)).astype(dtype)
        idx = rng.integers(0, 70, 45)
        out = np.empty((45, n), dtype)
        tid, step = host_emu.launch(src, idx, out, aligned=aligned, grid=2, block=64, trace=True)
        want_tid, want_step = thread_map(idx, n, elem, aligned=aligned, grid=2, block=64,
                                         src_addr=src.ctypes.data)
        np.testing.assert_array_equal(tid, want_tid)
        np.testing.assert_array_equal(step, want_step)


def test_64_bit_offsets_past_2_pow_31_elements():
    row = 96
    rows = (1 << 31) // row + 500
    src = np.empty((rows, row), np.uint8)  # 2.1 GB, lazily allocated
    picks = np.array([rows - 1, 2, (1 << 31) // row + 1], np.int32)
    for i, r in enumerate(picks):
        src[r] = (np.arange(row) + 7 * i).astype(np.uint8)
    for aligned in (True, False):
        out = np.zeros((3, row), np.uint8)
        host_emu.launch(src, picks, out, aligned=aligned, grid=1, block=64)
        np.testing.assert_array_equal(out, src[picks])


def test_launch_rejects_strided_arrays():
    src = np.zeros((4, 4), np.uint32)
    with pytest.raises(ValueError, match="src must be C-contiguous"):
        host_emu.launch(src.T, np.array([0]), np.zeros((1, 4), np.uint32), aligned=True, grid=1)


@pytest.mark.parametrize("units", [1, 2, 8, 25, 33, 129])
def test_uint4_vector_units_match_oracle_and_model(units, rng):
    """The uint4 specialisation (16-byte vector loads): rows of whole 16-byte units."""
    buf = rng.integers(0, 256, 128 + 40 * units * 16, dtype=np.uint8)
    base = (-buf.ctypes.data) % 16
    for offset in range(base, base + 128, 16):
        raw = buf[offset:offset + 40 * units * 16].reshape(40, units * 16)
        src = raw.view(np.complex128)
        idx = rng.integers(0, 40, 50)
        for poison in (0xA5, 0x5A):
            out = np.full((50, units * 16), poison, np.uint8)
            tid, step = host_emu.launch(src, idx, out.view(np.complex128), aligned=True, grid=3, block=64,
                                        trace=True)
            np.testing.assert_array_equal(out, raw[idx])
        want_tid, want_step = thread_map(idx, units, 16, aligned=True, grid=3, block=64, src_addr=src.ctypes.data)
        np.testing.assert_array_equal(tid, want_tid)
        np.testing.assert_array_equal(step, want_step)
