"""A GPU cache's reads on a real device: the gather and the copy into slots are launched and not waited for
(the staging goes back with a fence), yet every row is right, also when a buffer is reused at once and when
the reads' waiters run on other streams.  Under the kit's hot-path section (``DIRECTLOAD_SYNC_DEBUG=1``) the
reads run under ``torch.cuda.set_sync_debug_mode("error")``.

Skipped without a CUDA device; benchmarks/gpu_suite.py runs them where one exists."""

import pytest
import torch

from directload.stores import DeviceCache, HostCache, TensorStore

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


@pytest.mark.parametrize("make", [lambda t: DeviceCache(TensorStore(t), capacity_bytes=64 * 1024, device="cuda"),
                                  lambda t: HostCache(TensorStore(t), capacity_bytes=64 * 1024)])
def test_reads_onto_the_gpu_wait_for_no_gather_and_give_the_right_rows(make, sync_debug):
    g = torch.Generator().manual_seed(0)
    table = torch.randn(5000, 64, generator=g)
    cache = make(table)
    side = torch.cuda.Stream()
    try:
        batches = [torch.randint(0, 5000, (700,), generator=g) for _ in range(12)]
        with sync_debug():
            futures = [cache.read_async(ids, device="cuda") for ids in batches]  # buffers reused at once
            with torch.cuda.stream(side):  # a waiter on another stream is ordered after the reads' work
                rows = [f.wait() for f in futures]
                sums = [r.sum(1) for r in rows]
        torch.cuda.synchronize()
        for ids, r, s in zip(batches, rows, sums):
            assert r.is_cuda and torch.equal(r.cpu(), table[ids])
            assert torch.allclose(s.cpu(), table[ids].sum(1))
    finally:
        cache.close()
