"""A cache resized while it is read: never a wrong row, never more rows than its capacity, and the pages of a
shrunk host cache given back to the system."""

import threading

import numpy as np
import psutil
import pytest
import torch
from conftest import random_table

from directload.stores import DeviceCache, FeatureStore, HostCache, ReadFuture, TensorStore
from directload.stores.policies import LRU, POLICY_NAMES
from directload.stores.slots import CACHED


def _consistent(cache):
    """Every row the slot table caches is one the policy holds, and no more than the capacity."""
    cached = cache.slots.held_rows(CACHED)
    assert cached.size <= cache.capacity_rows
    assert cache.policy.contains(cached.astype(np.int64)).all()
    assert cache.policy.capacity == cache.capacity_rows


@pytest.mark.parametrize("policy", POLICY_NAMES)
@pytest.mark.parametrize("kind", [HostCache, DeviceCache])
def test_shrink_and_grow_keep_every_row_right(kind, policy, rng):
    table = random_table(rng, 300, 5, torch.float32)
    extra = {"device": "cpu"} if kind is DeviceCache else {}
    cache = kind(TensorStore(table), 200 * 20, policy, staging_bytes=20 * 20, **extra)
    assert cache.room_rows == 200
    for size in (200, 37, 0, 120, 250, 5):
        got = cache.resize(size * 20)
        assert got == cache.capacity_rows == min(size, 200)
        for _ in range(6):
            ids = torch.from_numpy(rng.choice(300, 60, replace=False))
            cache.prefetch(ids)
            assert torch.equal(cache.read(ids), table[ids])
            _consistent(cache)
    assert cache.stats()[cache.tier]["capacity_rows"] == 5


def test_resizes_while_readers_read(rng):
    table = random_table(rng, 2000, 16, torch.float32)
    cache = HostCache(TensorStore(table), 1000 * 64, "lru", staging_bytes=100 * 64)
    errors, stop = [], threading.Event()

    def reader(seed):
        r = np.random.default_rng(seed)
        try:
            while not stop.is_set():
                ids = torch.from_numpy(r.integers(0, 2000, 300))
                got = cache.read_async(ids).wait()
                if not torch.equal(got, table[ids]):
                    errors.append("a wrong row")
        except Exception as exc:  # reported below, in the test's thread
            errors.append(exc)

    threads = [threading.Thread(target=reader, args=(k,)) for k in range(3)]
    for th in threads:
        th.start()
    try:
        for size in rng.integers(0, 1200, 60):
            cache.resize(int(size) * 64)
    finally:
        stop.set()
        for th in threads:
            th.join(30)
    assert not errors and not any(th.is_alive() for th in threads)
    _consistent(cache)


class _Gated(FeatureStore):
    """Reads wait at the gate until the test opens it."""

    def __init__(self, table, gate, entered):
        super().__init__()
        self.table, self.gate, self.entered = table, gate, entered

    num_rows = property(lambda self: self.table.shape[0])
    row_shape = property(lambda self: tuple(self.table.shape[1:]))
    dtype = property(lambda self: self.table.dtype)

    def _read_async(self, index, out, run_device, out_device):
        self.entered.set()
        assert self.gate.wait(10), "the test never opened the gate"
        rows = self.table[index.long()]
        if out is not None:
            out.copy_(rows)
            return ReadFuture(result=out)
        return ReadFuture(result=rows)


def test_a_read_in_flight_admits_under_the_new_capacity(rng):
    # the read's policy said "keep all ten"; the cache shrank to 2 rows while it read them: it must not
    # slot ten rows the new policy does not hold (they would never be evicted)
    table = random_table(rng, 50, 3, torch.float32)
    gate, entered = threading.Event(), threading.Event()
    cache = HostCache(_Gated(table, gate, entered), 20 * 12, "lru")
    future = cache.read_async(np.arange(10))
    assert entered.wait(10)
    assert cache.resize(2 * 12) == 2
    gate.set()
    assert torch.equal(future.wait(), table[:10])
    _consistent(cache)
    assert torch.equal(cache.read(np.arange(10)), table[:10])
    _consistent(cache)


def _rss():
    return psutil.Process().memory_info().rss


def test_a_shrunk_host_cache_gives_its_pages_back():
    table = torch.arange(20000 * 1024, dtype=torch.float32).view(20000, 1024)  # 4 KiB rows, 80 MiB
    cache = HostCache(TensorStore(table), 16000 * 4096, "lru")  # 62.5 MiB of slots, touched when made
    if cache.memory != "host":
        pytest.skip("pinned memory keeps its pages (a GPU machine)")
    ids = torch.arange(0, 20000, 2)
    assert torch.equal(cache.read(ids), table[ids])
    before = _rss()
    cache.resize(1000 * 4096)
    dropped = before - _rss()
    assert dropped > 50 * 2 ** 20, f"RSS fell by {dropped / 2 ** 20:.1f} MiB only"
    assert torch.equal(cache.read(ids), table[ids])  # the rows still come back right
    cache.resize(16000 * 4096)
    assert _rss() - (before - dropped) > 50 * 2 ** 20  # the slots are touched again
    assert torch.equal(cache.read(ids), table[ids])


def test_a_policy_object_cannot_be_resized(rng):
    cache = HostCache(TensorStore(random_table(rng, 10, 2, torch.float32)), 8 * 5, LRU(5))
    with pytest.raises(TypeError, match="by name or as a callable"):
        cache.resize(8 * 2)
    grow = HostCache(TensorStore(random_table(rng, 10, 2, torch.float32)), 8 * 5, lambda c: LRU(c))
    assert grow.resize(8 * 3) == 3 and grow.resize(8 * 100) == 5  # never past the slots it was made with
    with pytest.raises(ValueError):
        grow.resize(-1)
