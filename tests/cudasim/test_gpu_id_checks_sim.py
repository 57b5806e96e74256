"""``kernels.gpu_path``'s GPU launch path with the Numba kernels on the CUDA simulator: rows of 0 bytes still have their
ids checked (``check_clamp`` stamps the error word), and ``x[idx]`` ids below ``-n``, shifted on the device, are
reported as given; both in the CPU path's words."""

from types import SimpleNamespace

import numpy as np
import pytest
import torch

import directload
from directload import unified
from directload.kernels import bounds, gather, gpu_path, numba_cuda
from directload.kernels.variants import Variant


class _Stream:
    cuda_stream = 0


@pytest.fixture
def table_of(monkeypatch):
    """A stand-in for ``gpu_path.GpuTable`` over a CPU tensor, launching the real Numba kernels (simulated)."""
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: _Stream())
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    word = bounds.DeviceBounds(torch.zeros(1, dtype=torch.int64))

    def make(src):
        row_bytes = src.element_size() * int(np.prod(src.shape[1:], dtype=np.int64))
        return SimpleNamespace(n_rows=src.shape[0], row_bytes=row_bytes, row_shape=tuple(src.shape[1:]),
                               ptr=src.data_ptr(), elem=src.element_size(), dtype=src.dtype, bounds=word,
                               device=torch.device("cuda", 0), device_index=0,
                               launch_check_clamp=numba_cuda.launch_check_clamp,
                               launch_variant=numba_cuda.launch_variant)
    return make


def _error(run):
    with pytest.raises(IndexError) as caught:
        run()
    return str(caught.value)


@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64], ids=["int32", "int64"])
def test_zero_byte_rows_check_their_ids(table_of, index_dtype):
    src = torch.empty(10, 0)
    table = table_of(src)
    assert gpu_path.start(table, torch.tensor([9, 0], dtype=index_dtype), torch.empty(2, 0), None).wait().shape == \
        (2, 0)
    ids = torch.tensor([3, 10, -1], dtype=index_dtype)
    on_cpu = _error(lambda: gather(src, ids))
    assert on_cpu == "index 10 is out of range for 10 rows (valid 0..9) (at position 1)"
    assert _error(gpu_path.start(table, ids, torch.empty(3, 0), None).wait) == on_cpu


@pytest.mark.parametrize("variant", [Variant("rowvec", 16, 4), Variant("naive"), Variant("aligned", sorted=True)],
                         ids=lambda v: v.name)
def test_ids_below_minus_n_are_reported_as_given(table_of, variant):
    src = torch.arange(40, dtype=torch.float32).view(10, 4)
    ids = torch.tensor([-1, 2, -13, 12])
    on_cpu = _error(lambda: directload.to_unified(src, copy=True)[ids])
    assert on_cpu == "index -13 is out of range for 10 rows (valid -10..9) (at position 2)"
    out = torch.full((4, 4), float("nan"))
    with bounds.ids_from_end():
        future = gpu_path.start(table_of(src), unified._shift_from_end(ids, 10), out, variant)
    assert _error(future.wait) == on_cpu
    assert torch.equal(out[:2], src[[9, 2]])
