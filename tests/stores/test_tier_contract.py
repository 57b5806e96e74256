"""The tier contract as the caches use it: any store written outside directload (a toy remote store here,
served by a thread as an RPC would be) plugs in under every cache and policy through the public contract alone,
a cached read overlaps the caller's work, and a remote failure keeps its type across the caches' threads.  The
contract itself (``stage``, stats, capabilities) is :mod:`directload.testing`, which every store's tests
subclass (tests/stores/test_store_contract.py)."""

import threading
import time

import pytest
import torch
from conftest import within
from toy_remote import ToyRemote

from directload.stores import POLICY_NAMES, CacheStats, DeviceCache, HostCache, TieredStore

ROWS, ELEMS = 300, 5


@pytest.fixture
def table():
    g = torch.Generator().manual_seed(5)
    return torch.randn(ROWS, ELEMS, generator=g)


@pytest.mark.parametrize("policy", POLICY_NAMES)
@pytest.mark.parametrize("cache_type", [HostCache, DeviceCache])
def test_every_cache_and_policy_sits_on_a_store_written_outside_directload(table, policy, cache_type):
    remote = ToyRemote(table)
    extra = {"device": "cpu"} if cache_type is DeviceCache else {"staging_bytes": 25 * ELEMS * 4}
    cache = cache_type(remote, 30 * ELEMS * 4, policy, **extra)
    g = torch.Generator().manual_seed(1)
    batches = [torch.randint(0, ROWS, (40,), generator=g) for _ in range(12)]
    for b in batches[:4]:
        cache.prefetch(b)
    for k, b in enumerate(batches):
        if k + 4 < len(batches):
            cache.prefetch(batches[k + 4])
        got = cache.read(b)
        assert torch.equal(got, table[b]) and got.dtype == table.dtype and got.device.type == "cpu"
    s = cache.stats()
    assert isinstance(s[cache.tier], CacheStats) and s[cache.tier]["reads"] == 12 and s[cache.tier]["rows"] == 12 * 40
    assert remote.stats()["requests"] > 0 and s["remote"]["requests"] == remote.stats()["requests"]  # the misses
    cache.close()
    remote.close()


def test_a_tiered_store_over_a_remote_store_reads_its_rows(table):
    with ToyRemote(table) as remote, TieredStore(remote, gpu_bytes=10 * ELEMS * 4, host_bytes=60 * ELEMS * 4) as ts:
        ids = torch.tensor([5, 9, 5, 200, 299])
        assert torch.equal(ts.read(ids), table[ids])
        assert [t.tier for t in ts.stats().tiers] == ["device", "host", "remote"]


def test_a_cached_read_returns_at_once_and_overlaps_the_callers_work(table):
    """read_async of a cache starts the read on the cache's reader thread: the caller goes on while the
    remote store is still serving it (PyG's multi_get_tensor and the DGL pipeline's start_batch rely on it)."""
    gate = threading.Event()
    remote = ToyRemote(table, gate=gate)
    cache = HostCache(remote, 10 * ELEMS * 4, "lru")
    futures = within(60, lambda: [cache.read_async(torch.tensor([1, 2, 3])), cache.read_async(torch.tensor([4, 5]))])
    assert not futures[0].done()  # both started, neither served yet
    gate.set()
    assert torch.equal(within(30, futures[0].wait), table[[1, 2, 3]])
    assert torch.equal(within(30, futures[1].wait), table[[4, 5]])
    cache.close()
    remote.close()


def test_an_oserror_stays_an_oserror_across_the_caches_threads(table):
    remote = ToyRemote(table)
    cache = HostCache(remote, 10 * ELEMS * 4, "lru", staging_bytes=10 * ELEMS * 4)
    cache.read([7])  # cached: later reads of it never reach the remote store
    remote.fail = OSError(5, "remote disk failed")
    with pytest.raises(OSError, match="remote disk failed") as demand:
        cache.read([1, 2])  # a demand read, run on the cache's reader thread
    assert type(demand.value) is OSError and demand.value.errno == 5
    cache.prefetch([3, 4])  # the read-ahead thread fails on it
    with pytest.raises(OSError, match="remote disk failed") as ahead:
        within(30, lambda: [cache.read([7]) for _ in range(200) if not time.sleep(0.01)])
    assert "read-ahead thread" in " ".join(ahead.value.__notes__)
    assert ahead.value.__cause__ is not None and ahead.value.__cause__.__traceback__ is not None  # the thread's
    cache.close()
    remote.close()
