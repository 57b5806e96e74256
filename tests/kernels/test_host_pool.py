"""The recycling pool behind large CPU gather outputs: reuse only after every view is gone."""

import gc

import torch

from directload.kernels.host_pool import HostBufferPool, size_class


def test_size_classes_waste_under_a_quarter():
    assert size_class(1) == 4096
    for n in (4097, 10**6, 38 * 2**20 + 7, 3 * 2**30):
        c = size_class(n)
        assert n <= c < 1.25 * n + 4096


def test_block_is_reused_only_after_all_views_die():
    pool = HostBufferPool()
    a = pool.empty((1000, 300), torch.float32)
    a.fill_(1.0)
    view = a[10:20]
    del a
    gc.collect()
    b = pool.empty((1000, 300), torch.float32)  # the first block is still held by `view`
    assert b.data_ptr() != view.data_ptr() - 10 * 300 * 4
    assert pool.stats == {"fresh": 2, "reused": 0}
    first = view.data_ptr() - 10 * 300 * 4
    del view
    gc.collect()
    c = pool.empty((990, 300), torch.float32)  # same size class
    assert c.data_ptr() == first and pool.stats["reused"] == 1
    assert c.shape == (990, 300) and c.dtype == torch.float32


def test_cache_is_bounded():
    pool = HostBufferPool(max_cached_bytes=1 << 20)
    t = pool.empty((2 << 20,), torch.uint8)
    del t
    gc.collect()
    assert pool.cached_bytes() == 0  # larger than the cache: given back to the OS
