"""gather.cu's kernels, built for the host with g++ and a shim header, against torch indexing."""

import numpy as np
import pytest
import torch
from conftest import ROW_ELEMS, assert_gathers, random_table

from directload.kernels import host_emu
from directload.kernels.pcie_model import thread_map

# One dtype per element size: the kernels copy bits, specialised on size only.
SIZES = (torch.int8, torch.float16, torch.float32, torch.float64)


CLEAN = host_emu.AccessCounts(0, 0, 0)


def _run(src, idx, aligned, grid=3, block=64):
    """A launch for ``assert_gathers`` that also asserts every access was aligned and inside its table or output."""
    def run(out):
        host_emu.reset_counters()
        host_emu.launch(src.numpy(), idx.numpy(), out.numpy(), aligned=aligned, grid=grid, block=block)
        assert host_emu.counters() == CLEAN
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
            host_emu.reset_counters()
            tid, step = host_emu.launch(src, idx, out.view(np.complex128), aligned=True, grid=3, block=64,
                                        trace=True)
            assert host_emu.counters() == CLEAN  # every 16-byte load and store on a 16-byte boundary
            np.testing.assert_array_equal(out, raw[idx])
        want_tid, want_step = thread_map(idx, units, 16, aligned=True, grid=3, block=64, src_addr=src.ctypes.data)
        np.testing.assert_array_equal(tid, want_tid)
        np.testing.assert_array_equal(step, want_step)


@pytest.mark.parametrize("aligned", [True, False], ids=["aligned", "naive"])
@pytest.mark.parametrize("index_dtype", [np.int32, np.int64])
@pytest.mark.parametrize("elem", [1, 2, 4, 8])
def test_bad_ids_flag_the_stamp_and_are_clamped(elem, index_dtype, aligned, rng):
    """The bounds contract: an id out of range stores the stamp and reads a clamped row, never past the table."""
    dtype = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[elem]
    src = rng.integers(0, 200, (9, 37)).astype(dtype)
    top = np.iinfo(index_dtype)
    idx = np.array([3, -1, 9, top.max, top.min, 8, 0], index_dtype)
    err = np.array([1], np.uint64)
    out = np.zeros((idx.shape[0], 37), dtype)
    host_emu.reset_counters()
    host_emu.launch(src, idx, out, aligned=aligned, grid=2, block=64, err=err, stamp=2**63 + 5)
    assert host_emu.counters() == CLEAN
    assert int(err[0]) == 2**63 + 5
    np.testing.assert_array_equal(out, src[np.clip(idx.astype(np.int64), 0, 8)])
    good = np.array([8, 0, 4], index_dtype)
    err[0] = 1
    host_emu.launch(src, good, out[:3], aligned=aligned, grid=2, block=64, err=err, stamp=6)
    assert int(err[0]) == 1
    np.testing.assert_array_equal(out[:3], src[good])


@pytest.mark.parametrize("aligned", [True, False], ids=["aligned", "naive"])
@pytest.mark.parametrize("row_elems", [1, 11, 37, 602])
def test_sorted_ids_write_through_the_permutation(row_elems, aligned, rng):
    """With ``pos`` (torch.sort's permutation), work item i writes output row pos[i]: the unsorted order."""
    src = _as_bits(random_table(rng, 50, row_elems, torch.float32))
    idx = torch.from_numpy(rng.integers(0, 50, 80))
    ids, pos = torch.sort(idx)

    def run(out):
        host_emu.reset_counters()
        host_emu.launch(src.numpy(), ids.numpy(), out.numpy(), aligned=aligned, grid=2, block=64, pos=pos.numpy())
        assert host_emu.counters() == CLEAN
    assert_gathers(run, src, idx)


def test_naive_rows_and_columns_advance_without_division(rng):
    """The naive kernel steps (row, column) by the stride's quotient and remainder: strides shorter and longer
    than a row, and a row longer than the whole grid."""
    for row_elems, grid, block in ((3, 5, 64), (700, 1, 32), (64, 2, 32), (1, 1, 32), (129, 3, 64)):
        src = rng.integers(0, 2**31, (20, row_elems)).astype(np.uint32)
        idx = rng.integers(0, 20, 33)
        out = np.zeros((33, row_elems), np.uint32)
        tid, step = host_emu.launch(src, idx, out, aligned=False, grid=grid, block=block, trace=True)
        np.testing.assert_array_equal(out, src[idx])
        flat = np.arange(out.size)
        np.testing.assert_array_equal(tid, flat % (grid * block))
        np.testing.assert_array_equal(step, flat // (grid * block))


def test_launch_refuses_a_grid_of_2_pow_32_threads():
    src = np.zeros((2, 2), np.uint32)
    with pytest.raises(ValueError, match="under 2"):
        host_emu.launch(src, np.array([0]), np.zeros((1, 2), np.uint32), aligned=False, grid=2**24, block=256)
