"""The unified tensor on a CPU machine: creation, views, affinity, lifetime and bad input."""

import gc
import weakref

import numpy as np
import pytest
import torch

import directload
from directload import ClosedError, UnifiedTensor


def test_to_unified_registers_in_place_without_copy():
    src = torch.arange(12.0).reshape(4, 3)
    x = directload.to_unified(src)
    assert isinstance(x, UnifiedTensor) and x.is_unified and directload.is_unified(x)
    assert not directload.is_unified(src)
    assert x.data_ptr() == src.data_ptr()  # registered in place
    assert x.host.data_ptr() == src.data_ptr()
    assert x.shape == (4, 3) and x.dtype == torch.float32 and x.device.type == "cpu"
    assert x.memory_kind == ("host" if not torch.cuda.is_available() else "registered")


def test_to_unified_from_numpy_and_copy():
    a = np.arange(10, dtype=np.int16).reshape(5, 2)
    x = directload.to_unified(a)
    assert x.dtype == torch.int16 and torch.equal(x.host, torch.from_numpy(a))
    y = directload.to_unified(a, copy=True, affinity="host")
    assert y.data_ptr() != a.ctypes.data and torch.equal(y.host, torch.from_numpy(a))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int8, torch.float64])
def test_factories(dtype):
    z = directload.zeros((3, 5), dtype=dtype)
    o = directload.ones((3, 5), dtype=dtype, affinity="host")
    e = directload.empty(7, dtype=dtype)
    assert z.is_unified and o.is_unified and e.is_unified
    assert z.dtype == o.dtype == e.dtype == dtype
    assert torch.equal(z.host, torch.zeros(3, 5, dtype=dtype))
    assert torch.equal(o.host, torch.ones(3, 5, dtype=dtype))
    assert e.shape == (7,) and o.affinity == "host" and z.affinity == "cuda"


def test_with_affinity_is_a_view():
    x = directload.zeros((4, 2))
    h = x.with_affinity("host")
    assert h.affinity == "host" and x.affinity == "cuda"
    assert h.data_ptr() == x.data_ptr()
    h[torch.tensor([1])] = torch.ones(1, 2)
    assert x.host[1].tolist() == [1.0, 1.0]


def test_bad_arguments():
    with pytest.raises(ValueError, match="affinity must be one of"):
        directload.zeros(3, affinity="gpu")
    with pytest.raises(TypeError, match="torch.Tensor or numpy.ndarray"):
        directload.to_unified([1, 2, 3])
    with pytest.raises(ValueError, match="must be contiguous"):
        directload.to_unified(torch.zeros(3, 4).t())
    x = directload.zeros(2)
    with pytest.raises(ValueError, match="affinity must be one of"):
        x.with_affinity("device")


def test_cuda_view_needs_cuda():
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(RuntimeError, match="needs a CUDA device"):
        directload.zeros(3).cuda_view()


def test_write_checks(rng):
    x = directload.zeros((6, 4))
    with pytest.raises(TypeError, match="cannot write torch.float64 values into a torch.float32"):
        x[torch.tensor([0])] = torch.zeros(1, 4, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"shape \(2, 4\) into a region of shape \(1, 4\)"):
        x[torch.tensor([0])] = torch.zeros(2, 4)
    with pytest.raises(ValueError, match=r"shape \(5,\) into a region of shape \(6, 4\)"):
        x.copy_(torch.zeros(5))
    with pytest.raises(IndexError, match="index 6 is out of range for 6 rows"):
        x[torch.tensor([1, 6])] = torch.zeros(2, 4)
    assert torch.equal(x.host, torch.zeros(6, 4))  # nothing was written
    vals = torch.from_numpy(rng.standard_normal((2, 4)).astype(np.float32))
    x[torch.tensor([5, 2])] = vals
    x[0] = 3.0  # scalar broadcast
    assert torch.equal(x.host[[5, 2]], vals) and (x.host[0] == 3).all()


def test_gather_out_of_range_raises():
    x = directload.zeros((6, 4))
    with pytest.raises(IndexError, match="index 7 is out of range for 6 rows"):
        x[torch.tensor([7])]
    with pytest.raises(IndexError, match=r"index -1 is out of range for 6 rows \(valid 0..5\)"):
        x.index_select(0, torch.tensor([-1]))


def test_close_frees_exactly_once_and_blocks_use():
    x = directload.to_unified(torch.zeros(8, 8), copy=True)
    ref = weakref.ref(x.allocation)
    x.close()
    x.close()  # idempotent
    gc.collect()
    assert ref() is None  # no views: released now
    assert "closed" in repr(x)
    for use in (lambda: x.sum(), lambda: x[torch.tensor([0])], lambda: x.host, lambda: x + 1,
                lambda: x.with_affinity("host")):
        with pytest.raises(ClosedError, match="was closed"):
            use()


def test_views_keep_memory_alive():
    x = directload.ones((16, 4), dtype=torch.int32)
    alloc = weakref.ref(x.allocation)
    view = x.host[3:5]
    other = x.with_affinity("host")
    x.close()
    gc.collect()
    assert alloc() is not None and not alloc().released
    assert view.sum().item() == 8 and other.sum().item() == 64
    del view, other
    gc.collect()
    assert alloc() is None


def test_context_manager():
    with directload.zeros(4) as x:
        ref = weakref.ref(x.allocation)
        assert x.sum().item() == 0
    gc.collect()
    assert ref() is None
    with pytest.raises(ClosedError):
        x.sum()


def test_pickling_needs_shared_memory_or_a_file():
    import pickle

    with pytest.raises(TypeError, match="shared=True"):
        pickle.dumps(directload.zeros(3))


def test_getitem_counts_negative_indices_from_the_end_like_torch(rng):
    plain = torch.from_numpy(rng.standard_normal((6, 4)).astype(np.float32))
    x = directload.to_unified(plain, copy=True)
    for idx in (torch.tensor([-1, 0, -6, 5]), torch.tensor([-2, -2], dtype=torch.int32)):
        got = x[idx]
        assert torch.equal(got, plain[idx]) and type(got) is torch.Tensor
    with pytest.raises(IndexError, match=r"index -7 is out of range for 6 rows \(valid -6..5\)"):
        x[torch.tensor([0, -7])]
    with pytest.raises(IndexError, match=r"index -1 is out of range for 6 rows \(valid 0..5\)"):  # as torch's
        torch.index_select(x, 0, torch.tensor([-1]))
