"""Unified tensors in mapped memory from numba.cuda.mapped_array, gathered by the Numba kernels (simulator)."""

import numpy as np
import pytest
import torch
from numba import cuda

import directload
from directload import memory
from directload.kernels import numba_cuda


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32, torch.int8, torch.float64])
@pytest.mark.parametrize("row_elems", [1, 11, 37, 602])
def test_pooled_mapped_tensor_gathers_on_the_device_view(row_elems, dtype, rng):
    rt = memory.NumbaMappedRuntime()
    with memory.use_runtime(rt) as pool:
        x = directload.empty((12, row_elems), dtype=dtype)
        assert x.memory_kind == "pinned-mapped"
        x.host.view(torch.uint8).copy_(torch.from_numpy(rng.integers(0, 256, x.numel() * x.element_size(),
                                                                      dtype=np.uint8)).view(x.shape[0], -1))
        nbytes = x.numel() * x.element_size()
        np_dtype = torch.empty((), dtype=dtype).numpy().dtype
        dev = rt.mapped_view(x.allocation.ptr, nbytes).view(np_dtype).reshape(tuple(x.shape))
        idx = rng.integers(0, 12, 7)
        out = cuda.to_device(np.full((7, row_elems * np_dtype.itemsize), 0x5A, np.uint8).view(np_dtype))
        numba_cuda.gather_rows(dev, cuda.to_device(idx), out, aligned=True, grid=2, block=64)
        want = x.host[torch.from_numpy(idx)]
        assert np.array_equal(out.copy_to_host().view(np.uint8), want.numpy().view(np.uint8))
        # The unified tensor's own CPU gather reads the same mapped bytes.
        assert torch.equal(x[torch.from_numpy(idx)].view(torch.uint8), want.view(torch.uint8))
        x.close()
        assert pool.cached_bytes() > 0  # the block went back to the pool, not to the driver
