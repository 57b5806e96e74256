"""The Numba tiered gather on the CUDA simulator: cache rows from device memory, flat-tier rows from
cuda.mapped_array (zero-copy, like a disk store's pinned staging), one kernel, against an oracle."""

import numpy as np
import pytest
import torch
from numba import cuda

from directload.kernels import numba_cuda
from directload.kernels.tiered import flat_where

ROW_ELEMS = (1, 11, 37, 100)
DTYPES = (np.uint8, np.uint16, np.uint32, np.uint64)


def _mapped(rng, elems, dtype, shift):
    size = np.dtype(dtype).itemsize
    buf = cuda.mapped_array(elems * size + 256, dtype=np.uint8)
    buf[:] = rng.integers(0, 256, buf.shape[0], dtype=np.uint8)
    start = (-numba_cuda.array_address(buf)) % 128 + shift * size
    return buf[start:start + elems * size].view(dtype)


@pytest.mark.parametrize("aligned", [True, False], ids=["aligned", "naive"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("row_elems", ROW_ELEMS)
def test_tiered_kernel_reads_every_row_from_its_tier(rng, dtype, row_elems, aligned):
    slots, n = 9, 24
    cache_host = rng.integers(0, np.iinfo(dtype).max, slots * row_elems, dtype=dtype, endpoint=True)
    flat = _mapped(rng, 13 * row_elems + 3, dtype, int(rng.integers(0, 8)))
    from_cache = rng.random(n) < 0.5
    slot = rng.integers(0, slots, n)
    offset = rng.integers(0, flat.shape[0] - row_elems + 1, n)
    where = np.where(from_cache, slot, flat_where(offset)).astype(np.int64)
    flat_host = np.asarray(flat).copy()
    want = np.stack([cache_host[s * row_elems:(s + 1) * row_elems] if c else flat_host[o:o + row_elems]
                     for c, s, o in zip(from_cache, slot, offset)])
    for poison in (0xA5, 0x5A):
        out = cuda.to_device(np.full(want.shape, poison, np.uint8).view(dtype)
                             if dtype is np.uint8 else np.full(want.shape, poison, dtype))
        numba_cuda.gather_tiered_rows(cuda.to_device(cache_host), flat, cuda.to_device(where), out,
                                      aligned=aligned, grid=2, block=64)
        assert (out.copy_to_host() == want).all()


@pytest.mark.parametrize("aligned", [True, False], ids=["aligned", "naive"])
@pytest.mark.parametrize("dtype", [torch.uint8, torch.int16, torch.int32, torch.int64])
def test_the_torch_launchers_pass_their_operands_through_as_the_cpu_backend_reads_them(rng, dtype, aligned):
    # The wrappers a cache's fused gather and a unified gather call (torch tensors in, the kernels' arrays
    # out): against the CPU backend's launches on the same operands, into poisoned outputs.
    from directload.kernels import tiered

    row_elems, slots, n = 37, 9, 24
    info = torch.iinfo(dtype)
    cache = torch.randint(info.min, info.max, (slots * row_elems,), dtype=dtype)
    flat = torch.randint(info.min, info.max, (13 * row_elems + 5,), dtype=dtype)
    from_cache = torch.from_numpy(rng.random(n) < 0.5)
    offset = torch.from_numpy(rng.integers(0, flat.shape[0] - row_elems + 1, n))
    where = torch.where(from_cache, torch.from_numpy(rng.integers(0, slots, n)), -offset - 1)
    want = torch.empty((n, row_elems), dtype=dtype)
    tiered.launch_tiered(cache, flat, where, want)
    src = cache.view(slots, row_elems)
    index = torch.from_numpy(rng.integers(0, slots, n))
    want_rows = src[index]
    for poison in (0x5A, 0x25):
        out = torch.full((n, row_elems), poison, dtype=dtype)
        numba_cuda.launch_tiered(cache, flat, where, out, aligned=aligned)
        assert torch.equal(out, want)
        out = torch.full((n, row_elems), poison, dtype=dtype)
        assert numba_cuda.launch(src, index, out, aligned=aligned) == -1
        assert torch.equal(out, want_rows)
