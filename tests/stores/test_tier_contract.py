"""The public tier contract, over every store: ``stage(ids, into)`` gives a cache what it needs to sit on top,
``stats()``/``reset_stats()`` give typed records, and any store written outside directload (a toy remote store
here, served by a thread as an RPC would be) plugs in under every cache and policy through them alone."""

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch
from conftest import within

from directload.buffers import StagingBuffer
from directload.stores import (
    POLICY_NAMES,
    CacheStats,
    ClosedError,
    DeviceCache,
    FeatureStore,
    HostCache,
    ReadFuture,
    Staged,
    Stats,
    TensorStore,
    TieredStats,
    TieredStore,
    write_disk_store,
)
from directload.stores.reads import deliver

ROWS, ELEMS = 300, 5


class ToyRemote(FeatureStore):
    """Rows held 'elsewhere': every read is a request served by a thread of its own, as an RPC would be.  It
    implements only the contract's hooks: shape, ``_read_async``, counters, ``_close``."""

    tier = "remote"

    def __init__(self, table, *, gate=None, fail=None):
        super().__init__()
        self._table, self._gate, self.fail = table, gate, fail
        self._server = ThreadPoolExecutor(1, thread_name_prefix="toy-remote")
        self.requests = 0

    num_rows = property(lambda self: self._table.shape[0])
    row_shape = property(lambda self: tuple(self._table.shape[1:]))
    dtype = property(lambda self: self._table.dtype)

    def _read_async(self, index, out, run_device, out_device):
        ids = index.cpu().clone()

        def serve():
            if self._gate is not None:
                self._gate.wait(30)
            if self.fail is not None:
                raise self.fail
            self.requests += 1
            return deliver(self._table[ids], out, out_device)

        return ReadFuture(future=self._server.submit(serve))

    def _counters(self):
        return {"requests": self.requests}

    def _reset_counters(self):
        self.requests = 0

    def _close(self):
        self._server.shutdown()


@pytest.fixture
def table():
    g = torch.Generator().manual_seed(5)
    return torch.randn(ROWS, ELEMS, generator=g)


def _disk(table, tmp_path):
    from directload.stores import DiskStore

    path = tmp_path / "t.npy"
    write_disk_store(table.numpy(), path, progress=False)
    return DiskStore(path)


STORES = {
    "tensor": lambda t, p: TensorStore(t),
    "disk": _disk,
    "host cache": lambda t, p: HostCache(TensorStore(t), 40 * ELEMS * 4, staging_bytes=30 * ELEMS * 4),
    "device cache": lambda t, p: DeviceCache(TensorStore(t), 40 * ELEMS * 4, device="cpu"),
    "tiered": lambda t, p: TieredStore(_disk(t, p), gpu_bytes=20 * ELEMS * 4, host_bytes=50 * ELEMS * 4),
    "toy remote": lambda t, p: ToyRemote(t),
}


@pytest.fixture(params=list(STORES))
def store(request, table, tmp_path):
    s = STORES[request.param](table, tmp_path)
    yield s
    s.close()


def _rows_of(staged, store):
    elems = int(np.prod(store.row_shape))
    return torch.stack([staged.flat[o:o + elems] for o in staged.offsets.tolist()]).view(-1, *store.row_shape)


def test_stage_gives_each_asked_row_at_its_offset(store, table):
    ids = np.array([7, 0, 299, 7, 150], np.int64)
    staged = store.stage(ids, StagingBuffer(pin="never"))
    assert isinstance(staged, Staged)
    assert staged.flat.dim() == 1 and staged.flat.dtype == table.dtype and staged.flat.device.type == "cpu"
    assert staged.offsets.dtype == np.int64 and staged.offsets.shape == (5,)
    assert torch.equal(_rows_of(staged, store), table[ids])
    empty = store.stage(np.zeros(0, np.int64), StagingBuffer(pin="never"))
    assert empty.offsets.shape == (0,)


def test_stage_checks_ids_before_any_work(store):
    into = StagingBuffer(pin="never")
    with pytest.raises(IndexError, match="out of range for 300 rows"):
        store.stage([1, 300], into)
    with pytest.raises(TypeError):
        store.stage(np.array([1.0]), into)
    with pytest.raises(ValueError, match="0-d"):
        store.stage(np.array(3), into)
    assert into.nbytes == 0  # nothing was staged
    store.close()
    with pytest.raises(ClosedError):
        store.stage([1], into)


def test_stats_are_typed_records_and_reset_to_zero(store, table):
    store.read([1, 2, 3])
    s = store.stats()
    assert isinstance(s, Stats) and s.tier == store.tier
    assert all(isinstance(t, Stats) for t in s.tiers) and s.tiers[0].tier == (
        "device" if isinstance(store, TieredStore) else store.tier)
    if isinstance(store, TieredStore):
        assert isinstance(s, TieredStats) and list(s) == ["device", "host", "disk"]
        assert isinstance(s["host"], CacheStats) and s["host"]["rows"] > 0
    store.reset_stats()
    for t in store.stats().tiers:
        for key in ("rows", "reads", "requests", "hit_rows", "miss_rows", "bytes_read"):
            if key in t:
                assert t[key] == 0, (t.tier, key)
    with pytest.raises(TypeError):
        s["new"] = 1  # a record is read-only


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
    assert isinstance(s, CacheStats) and s["reads"] == 12 and s["rows"] == 12 * 40
    assert remote.stats()["requests"] > 0  # misses went through the remote store's own reads
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
