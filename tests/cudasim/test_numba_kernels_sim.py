"""Numba CUDA kernels on the CUDA simulator, reading src from cuda.mapped_array (zero-copy memory)."""

import numpy as np
import pytest
from numba import cuda

from directload.kernels import numba_cuda
from directload.kernels.pcie_model import thread_map

ROW_ELEMS = (1, 11, 37, 100, 513, 602)
DTYPES = (np.float16, np.int8, np.float32, np.float64)
POISONS = (0xA5, 0x5A)


def _mapped(rng, rows, n, dtype, offset=0):
    """A mapped (pinned, GPU-visible) table whose data starts ``offset`` bytes into a line."""
    size = np.dtype(dtype).itemsize
    buf = cuda.mapped_array(rows * n * size + 256, dtype=np.uint8)
    buf[:] = rng.integers(0, 256, buf.shape[0], dtype=np.uint8)
    start = (-numba_cuda.array_address(buf)) % 128 + offset
    return buf[start:start + rows * n * size].view(dtype).reshape(rows, n)


def _check(src, idx, aligned, grid=2, block=64):
    host_src = np.asarray(src.copy_to_host())
    want = host_src[idx].view(np.uint8)
    d_idx = cuda.to_device(idx)
    for byte in POISONS:
        out = cuda.to_device(np.full(want.shape, byte, np.uint8).view(src.dtype))
        numba_cuda.gather_rows(src, d_idx, out, aligned=aligned, grid=grid, block=block)
        np.testing.assert_array_equal(out.copy_to_host().view(np.uint8), want)


@pytest.mark.parametrize("index_dtype", [np.int32, np.int64])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("row_elems", ROW_ELEMS)
def test_aligned_and_naive_match_numpy(row_elems, dtype, index_dtype, rng):
    src = _mapped(rng, 16, row_elems, dtype)
    idx = rng.integers(0, 16, 5).astype(index_dtype)
    idx[-1] = idx[0]  # a duplicate
    _check(src, idx, aligned=True)
    _check(src, idx, aligned=False, grid=4, block=32 * ((row_elems > 100) + 1))


def test_every_4_byte_row_start_offset(rng):
    for offset in range(0, 128, 4):
        src = _mapped(rng, 6, 37, np.float32, offset)
        assert numba_cuda.array_address(src) % 128 == offset
        _check(src, rng.integers(0, 6, 3).astype(np.int64), aligned=True, grid=1, block=32)


def test_empty_index(rng):
    src = _mapped(rng, 4, 11, np.float32)
    out = cuda.device_array((0, 11), np.float32)
    numba_cuda.gather_rows(src, cuda.to_device(np.zeros(0, np.int64)), out)
    assert out.shape == (0, 11)


@pytest.mark.parametrize("aligned", [True, False], ids=["aligned", "naive"])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_threads_match_the_model_one_by_one(dtype, aligned, rng):
    src = _mapped(rng, 12, 37, dtype, offset=np.dtype(dtype).itemsize * 3)
    idx = rng.integers(0, 12, 5)
    out = cuda.device_array((5, 37), dtype)
    tid, step = numba_cuda.gather_rows(src, cuda.to_device(idx), out, aligned=aligned, grid=2, block=64,
                                       trace=True)
    want_tid, want_step = thread_map(idx, 37, np.dtype(dtype).itemsize, aligned=aligned, grid=2,
                                     block=64, src_addr=numba_cuda.array_address(src))
    np.testing.assert_array_equal(tid.copy_to_host(), want_tid)
    np.testing.assert_array_equal(step.copy_to_host(), want_step)


def test_block_must_be_whole_warps(rng):
    src = _mapped(rng, 4, 11, np.float32)
    with pytest.raises(ValueError, match="multiple of the warp size"):
        numba_cuda.gather_rows(src, cuda.to_device(np.zeros(1, np.int64)), cuda.device_array((1, 11), np.float32),
                               block=48)


@pytest.mark.parametrize("units", [1, 3, 8, 25, 33])
def test_16_byte_units_match_numpy_and_the_model(units, rng):
    """Rows viewed as 16-byte units (the vector path gather() takes for 16-byte-aligned rows)."""
    for offset in range(0, 128, 16):
        src = _mapped(rng, 10, units, np.complex128, offset)
        idx = rng.integers(0, 10, 6)
        _check(src, idx, aligned=True)
        out = cuda.device_array((6, units), np.complex128)
        tid, step = numba_cuda.gather_rows(src, cuda.to_device(idx), out, aligned=True, grid=2, block=64,
                                           trace=True)
        want_tid, want_step = thread_map(idx, units, 16, aligned=True, grid=2, block=64,
                                         src_addr=numba_cuda.array_address(src))
        np.testing.assert_array_equal(tid.copy_to_host(), want_tid)
        np.testing.assert_array_equal(step.copy_to_host(), want_step)
