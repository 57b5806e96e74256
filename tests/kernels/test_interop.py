"""The CUDA array interface over mapped host memory: what torch, CuPy and Numba are handed."""

import pytest
import torch

from directload.kernels.interop import CudaArrayView, cuda_array


def test_torch_accepts_the_interface_it_is_given():
    # torch refuses a read-only interface outright (TypeError, on every release since 2.2), so a
    # cuda_view() of a unified tensor failed on every real GPU; found on the first lent H100.
    t = torch.arange(6, dtype=torch.float32)
    view = cuda_array(t)
    assert isinstance(view, CudaArrayView) and view.owner is t
    assert view.__cuda_array_interface__["data"] == (t.data_ptr(), False)
    if torch.cuda.is_available():
        assert torch.equal(torch.as_tensor(view, device="cuda").cpu(), t)
    else:  # the interface was accepted: only the missing driver stops torch now
        with pytest.raises(RuntimeError, match="(?i)driver|cuda"):
            torch.as_tensor(view, device="cuda")
