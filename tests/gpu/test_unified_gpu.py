"""Unified tensors on a real GPU: pinned mapped memory, zero-copy views and the placement rules.

Skipped without a CUDA device; benchmarks/gpu_suite.py runs them where one exists.
"""

import gc
import weakref

import numpy as np
import pytest
import torch

import directload

pytestmark = pytest.mark.gpu


def test_new_tables_are_pinned_mapped_and_pooled():
    x = directload.zeros((1000, 100))
    assert x.memory_kind == "pinned-mapped"
    v = x.cuda_view()
    assert v.is_cuda and v.data_ptr() == x.data_ptr()  # UVA: same address, zero-copy
    x.host[3] = 2.0
    assert v[3].sum().item() == 200.0
    x.close()
    del v  # the view keeps the block alive (it would be reused under the view otherwise)
    gc.collect()
    before = directload.memory.pool().stats["reused"]
    y = directload.zeros((1000, 100))
    assert y.memory_kind == "pinned-mapped"
    assert directload.memory.pool().stats["reused"] == before + 1


def test_existing_memory_is_registered_in_place(tmp_path):
    t = torch.arange(40.0).reshape(10, 4)
    x = directload.to_unified(t)
    assert x.memory_kind == "registered" and x.data_ptr() == t.data_ptr()
    assert torch.equal(x[torch.tensor([9, 1], device="cuda")].cpu(), t[[9, 1]])
    ref = weakref.ref(x.allocation)
    x.close()
    gc.collect()
    assert ref() is None  # unregistered
    np.save(tmp_path / "f.npy", np.ones((8, 3), np.float32))
    f = directload.from_file(tmp_path / "f.npy")  # read-only registration of a file mapping
    assert f.memory_kind == "registered" and f[torch.tensor([7], device="cuda")].sum().item() == 3


@pytest.mark.parametrize("affinity", ["cuda", "host"])
def test_indexing_rules_on_gpu(affinity, rng):
    data = torch.from_numpy(rng.standard_normal((500, 37)).astype(np.float32))
    x = directload.to_unified(data.clone(), affinity, copy=True)
    cpu_idx = torch.from_numpy(rng.integers(0, 500, 100))
    got = x[cpu_idx]
    assert got.device.type == ("cuda" if affinity == "cuda" else "cpu")  # rules 1 and 2
    assert torch.equal(got.cpu(), data[cpu_idx])
    got = x[cpu_idx.cuda()]
    assert got.is_cuda and torch.equal(got.cpu(), data[cpu_idx])        # CUDA index: rule 1
    emb = torch.nn.functional.embedding(cpu_idx.cuda().view(10, 10), x)
    assert emb.is_cuda and torch.equal(emb.cpu(), data[cpu_idx].view(10, 10, 37))


def test_other_ops_follow_affinity_and_cuda_operands():
    x = directload.ones((4, 3), affinity="cuda")
    assert (x + 1).is_cuda                                      # rule 4
    assert not (x.with_affinity("host") + 1).is_cuda            # rule 5
    assert (x.with_affinity("host") + torch.ones(3, device="cuda")).is_cuda  # rule 3
    assert not (x + torch.ones(3)).is_cuda                      # non-scalar CPU operand
    assert (x * torch.tensor(2.0)).is_cuda                      # CPU scalar does not count


def test_writes_from_cuda_values():
    x = directload.zeros((6, 2))
    x[torch.tensor([4], device="cuda")] = torch.full((1, 2), 5.0, device="cuda")
    torch.cuda.synchronize()
    assert x.host[4].tolist() == [5.0, 5.0]
    x.copy_(torch.ones(6, 2, device="cuda"))
    torch.cuda.synchronize()
    assert x.host.sum().item() == 12
    with pytest.raises(IndexError, match="out of range"):
        x[torch.tensor([6], device="cuda")] = torch.zeros(1, 2, device="cuda")
