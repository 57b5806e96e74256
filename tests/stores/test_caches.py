"""Caches and tiers: bit-identical rows under every configuration, counters that add up, read-ahead that
never reads a row twice, no deadlock at any size, and closes that never hang."""

import threading
import time

import numpy as np
import pytest
import torch
from conftest import bits, random_table, within

from directload.stores import (
    ClosedError,
    DeviceCache,
    DiskStore,
    FeatureStore,
    HostCache,
    TensorStore,
    TieredStore,
    WarmingBusyError,
    write_disk_store,
)
from directload.stores.policies import LRU, POLICY_NAMES, degree


def _batches(rng, rows, n, size, a=1.3):
    """Power-law batches (with repeats inside a batch, as sampled input nodes have none, but reads may)."""
    return [(np.minimum(rng.zipf(a, size), rows) - 1 + rng.integers(0, 3, size)) % rows for _ in range(n)]


def _drive(store, batches, lookahead):
    """Read ``batches`` as a loader does: announce ``lookahead`` ahead, then read each in order."""
    got = []
    for b in batches[:lookahead]:
        store.prefetch(b)
    for i, b in enumerate(batches):
        got.append(store.read(b))
        if i + lookahead < len(batches):
            store.prefetch(batches[i + lookahead])
    return got


@pytest.mark.parametrize("policy", POLICY_NAMES)
def test_every_policy_and_size_reads_the_plain_tables_rows_bit_for_bit(rng, policy):
    table = random_table(rng, 300, 5, torch.float32)
    batches = _batches(rng, 300, 25, 80)
    for cap_rows, stage_rows, dev_rows in [(0, 0, 0), (3, 0, 0), (0, 7, 0), (40, 30, 10), (300, 300, 300),
                                          (1000, 0, 5)]:
        host = HostCache(TensorStore(table), cap_rows * 20, policy, staging_bytes=stage_rows * 20)
        top = DeviceCache(host, dev_rows * 20, policy) if dev_rows else host
        for b, got in zip(batches, _drive(top, batches, 3)):
            assert got.dtype == table.dtype and got.device.type == "cpu"
            assert torch.equal(bits(got), bits(table[torch.from_numpy(b)])), (policy, cap_rows, stage_rows)
        s = host.stats()[host.tier]
        assert s["hit_rows"] + s["staged_rows"] + s["miss_rows"] == sum(len(np.unique(b)) for b in batches) \
            or dev_rows  # a device tier in front reads only its misses
        assert s["cached_rows"] <= host.capacity_rows
        top.close()
        host.close()


def test_fuzz_random_tier_configurations_against_the_plain_table(rng):
    for _ in range(12):
        rows, elems = int(rng.integers(1, 200)), int(rng.integers(1, 9))
        dtype = [torch.float32, torch.int64, torch.uint8, torch.float16, torch.bool,
                 torch.complex128][int(rng.integers(0, 6))]
        table = random_table(rng, rows, elems, dtype) if not dtype.is_complex else \
            torch.complex(torch.randn(rows, elems, dtype=torch.float64), torch.randn(rows, elems, dtype=torch.float64))
        rnb = elems * table.element_size()
        policy = POLICY_NAMES[int(rng.integers(0, len(POLICY_NAMES)))]
        store = TieredStore(TensorStore(table), gpu_bytes=int(rng.integers(0, rows + 2)) * rnb,
                       host_bytes=int(rng.integers(0, rows + 2)) * rnb,
                       staging_bytes=int(rng.integers(0, rows + 2)) * rnb, policy=policy)
        batches = [rng.integers(0, rows, int(rng.integers(0, 60))) for _ in range(int(rng.integers(1, 15)))]
        for b, got in zip(batches, _drive(store, batches, int(rng.integers(1, 6)))):
            assert torch.equal(bits(got), bits(table[torch.from_numpy(b).long()]))
        store.close()


def test_lookahead_cache_hits_more_than_lru_on_a_power_law_trace(rng):
    table = random_table(rng, 2000, 4, torch.float32)
    batches = _batches(rng, 2000, 40, 300, a=1.2)
    rates = {}
    for policy in ("lru", "lookahead"):
        with HostCache(TensorStore(table), 200 * 16, policy) as cache:
            _drive(cache, batches, 8)
            rates[policy] = cache.stats()[cache.tier]["hit_rate"]
    assert rates["lookahead"] > rates["lru"] > 0


def test_read_ahead_stages_announced_rows_and_never_reads_a_row_twice(tmp_path, rng):
    table = random_table(rng, 500, 64, torch.float32)
    path = write_disk_store(table.numpy(), tmp_path / "f.npy")
    disk = DiskStore(path)
    batches = [rng.choice(500, 60, replace=False) for _ in range(12)]
    shared = np.intersect1d(batches[0], batches[1])
    with HostCache(disk, 0, "lookahead", staging_bytes=500 * 256) as cache:
        for b in batches:  # the whole epoch fits the staging slots: all of it is read ahead
            cache.prefetch(b)
        deadline = time.monotonic() + 10
        while cache.stats()[cache.tier]["prefetched_rows"] < len(np.unique(np.concatenate(batches))):
            assert time.monotonic() < deadline, cache.stats()[cache.tier]
            time.sleep(0.01)
        for b in batches:
            g = cache.read(b)
            assert torch.equal(bits(g), bits(table[torch.from_numpy(b)]))
        s = cache.stats()[cache.tier]
    # every batch was staged ahead: nothing was read on demand, and rows two batches share were read once
    assert s["miss_rows"] == 0 and s["staged_rows"] == sum(len(b) for b in batches)
    assert s["prefetched_rows"] == len(np.unique(np.concatenate(batches)))
    assert s["forwarded_rows"] >= len(shared) and s["forwarded_bytes"] == s["forwarded_rows"] * 256
    assert disk.stats()["unique_rows"] == s["prefetched_rows"]
    disk.close()


def test_a_cache_smaller_than_one_batch_passes_through_and_says_so(rng):
    table = random_table(rng, 400, 3, torch.int32)
    batch = rng.choice(400, 200, replace=False)
    for cap, stage in [(0, 0), (5, 0), (5, 3)]:
        with HostCache(TensorStore(table), cap * 12, "lookahead", staging_bytes=stage * 12) as cache:
            for _ in range(3):
                cache.prefetch(batch)
            for _ in range(3):
                assert torch.equal(cache.read(batch), table[torch.from_numpy(batch)])
            s = cache.stats()[cache.tier]
            assert s["passthrough"] and s["batches_over_capacity"] == 3
            assert s["passthrough_rows"] >= 3 * (200 - cap - stage) - 2 * cap
            assert s["cached_rows"] <= cap


def _until(condition):
    while not condition():
        time.sleep(0.001)


class _Flaky(FeatureStore):
    """A store whose reads take ``delay`` seconds, and fail after ``ok`` of them (a disk going bad), or
    fail when they read more than ``fail_over`` rows."""

    def __init__(self, table, ok=None, delay=0.0, fail_over=None, gate=None):
        super().__init__()
        self.table, self.ok, self.delay, self.fail_over, self.gate = table, ok, delay, fail_over, gate
        self.calls = 0  # reads started

    num_rows = property(lambda self: self.table.shape[0])
    row_shape = property(lambda self: tuple(self.table.shape[1:]))
    dtype = property(lambda self: self.table.dtype)

    def _read_async(self, index, out, run_device, out_device):
        from directload.stores import ReadFuture

        self.calls += 1
        time.sleep(self.delay)
        if self.gate is not None:
            assert self.gate.wait(10), "the test never opened the gate"
        if self.fail_over is not None and len(index) > self.fail_over:
            raise OSError(5, "simulated I/O error")
        if self.ok is not None:
            self.ok -= 1
            if self.ok < 0:
                raise OSError(5, "simulated I/O error")
        rows = self.table[index.long()]
        if out is not None:
            out.copy_(rows)
            return ReadFuture(result=out)
        return ReadFuture(result=rows)


def test_a_failing_read_ahead_reaches_the_reader_and_nothing_hangs(rng):
    table = random_table(rng, 100, 2, torch.float32)
    # the read-ahead (10 rows at once) fails; the reader's own reads (2 rows) work, so what it sees is
    # the read-ahead's failure, not one of its own
    cache = HostCache(_Flaky(table, fail_over=2), 0, "lru", staging_bytes=50 * 8)
    cache.prefetch(np.arange(10))
    deadline = time.monotonic() + 10
    with pytest.raises(OSError, match="simulated I/O error") as info:  # its own type, across the thread
        while time.monotonic() < deadline:
            cache.read([50, 51])  # not the announced batch: it stays the read-ahead's to do
            time.sleep(0.01)
    assert info.value.errno == 5 and "host cache's read-ahead thread" in " ".join(info.value.__notes__)
    assert isinstance(info.value.__cause__, OSError) and info.value.__cause__.__traceback__ is not None
    with pytest.raises(OSError) as again:  # it stays failed: the same error at every read, one note each
        cache.read([50, 51])
    assert len(again.value.__notes__) == 1
    cache.close()


def test_close_with_reads_ahead_in_flight_returns_promptly_and_reads_then_fail(rng):
    table = random_table(rng, 10000, 2, torch.float32)
    flaky = _Flaky(table, delay=0.2)
    cache = HostCache(flaky, 0, "lookahead", staging_bytes=10000 * 8)
    for k in range(20):
        cache.prefetch(np.arange(k * 500, k * 500 + 500))
    within(60, lambda: _until(lambda: flaky.calls > 0))  # a chunk is in flight now
    started = flaky.calls
    within(60, cache.close)
    assert flaky.calls <= started + 1 < 20  # the chunk in flight landed, no other started (not 20 x 0.2 s)
    with pytest.raises(ClosedError):
        cache.read([1])
    with pytest.raises(ClosedError):
        cache.prefetch([1])


def test_a_demand_read_waits_for_rows_in_flight_instead_of_reading_them_again(rng):
    # No sleeps to race against: the store below holds every read until the test opens its gate, and the
    # gate opens only once the demand read is seen waiting (a 0.3 s delay raced a loaded CI machine).
    table = random_table(rng, 100, 2, torch.float32)
    gate = threading.Event()
    slow = _Flaky(table, gate=gate)
    calls = []
    original = slow._read_async
    slow._read_async = lambda *a: (calls.append(len(a[0])), original(*a))[1]
    with HostCache(slow, 0, "lru", staging_bytes=100 * 8) as cache:
        cache.prefetch(np.arange(20))
        deadline = time.monotonic() + 10
        while not calls:  # until the read-ahead thread is reading rows 0..19 (held at the gate)
            assert time.monotonic() < deadline
            time.sleep(0.005)
        future = cache.read_async(np.arange(20))
        while cache.stats()[cache.tier]["inflight_waits"] < 1:  # the demand read waits for the rows in flight
            assert time.monotonic() < deadline
            time.sleep(0.005)
        gate.set()
        got = future.wait()
        assert torch.equal(got, table[:20])
        assert calls == [20]


class _GatedHigh(_Flaky):
    """Reads of rows 50 and up wait at the gate; the others go through (and say on which thread)."""

    def __init__(self, table, gate):
        super().__init__(table)
        self.high_gate, self.threads, self.held = gate, [], []

    def _read_async(self, index, out, run_device, out_device):
        if int(index.min()) >= 50:
            self.held.append(threading.current_thread())
            assert self.high_gate.wait(10), "the test never opened the gate"
        else:
            self.threads.append(threading.current_thread())
        return super()._read_async(index, out, run_device, out_device)


def test_a_wait_before_any_reader_took_the_read_runs_it_on_the_waiting_thread(rng):
    # every reader thread held at the gate: the next read stays queued, and its wait() runs it here instead
    # of waiting for a reader (the reader hop costs two thread switches per read when nothing overlaps)
    from directload.stores.readers import READERS

    table = random_table(rng, 100, 2, torch.float32)
    gate = threading.Event()
    store = _GatedHigh(table, gate)
    cache = HostCache(store, 0, "lru")
    held = [cache.read_async([50 + k]) for k in range(READERS)]
    got = cache.read_async(np.arange(10)).wait()  # returns although every reader waits at the gate
    assert torch.equal(got, table[:10]) and store.threads == [threading.current_thread()]
    gate.set()
    for k, future in enumerate(held):
        assert torch.equal(future.wait(), table[[50 + k]])
    cache.close()


def test_close_waits_for_a_read_its_waiter_runs(rng):
    from directload.stores.readers import READERS

    table = random_table(rng, 100, 2, torch.float32)
    gate = threading.Event()
    store = _GatedHigh(table, gate)
    cache = HostCache(store, 0, "lru")
    held = [cache.read_async([50 + k]) for k in range(READERS)]
    stolen = cache.read_async([60, 61])
    result = {}
    waiter = threading.Thread(target=lambda: result.setdefault("rows", stolen.wait()))
    waiter.start()  # runs the queued read itself, and waits at the gate in it
    deadline = time.monotonic() + 10
    while waiter not in store.held:
        assert time.monotonic() < deadline
        time.sleep(0.005)
    closer = threading.Thread(target=cache.close)
    closer.start()
    closer.join(0.3)
    assert closer.is_alive()  # close() waits for the read on the waiter's thread, as for the readers'
    gate.set()
    closer.join(10)
    waiter.join(10)
    assert not closer.is_alive() and torch.equal(result["rows"], table[[60, 61]])
    assert all(torch.equal(f.wait(), table[[50 + k]]) for k, f in enumerate(held))


def test_reads_from_many_threads_with_read_ahead_are_all_right(rng):
    table = random_table(rng, 1000, 4, torch.float32)
    errors = []
    with HostCache(TensorStore(table), 100 * 16, "sieve", staging_bytes=100 * 16) as cache:
        def worker(seed):
            r = np.random.default_rng(seed)
            try:
                for _ in range(30):
                    b = r.integers(0, 1000, 50)
                    cache.prefetch(b)
                    if not torch.equal(cache.read(b), table[torch.from_numpy(b)]):
                        errors.append("wrong rows")
            except Exception as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

        threads = [threading.Thread(target=worker, args=(s,)) for s in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    assert not errors


def test_bad_input_is_refused_before_anything_runs(rng):
    table = random_table(rng, 10, 2, torch.float32)
    store = TensorStore(table)
    with pytest.raises(TypeError, match="FeatureStore"):
        HostCache(table, 100)
    for bad in (-1, 1.5, True, "one", ""):
        with pytest.raises(ValueError, match="bytes"):
            HostCache(store, bad)
        with pytest.raises(ValueError, match="bytes"):
            HostCache(store, 8, staging_bytes=bad)
    with pytest.raises(ValueError, match="policy"):
        HostCache(store, 8, "fifo")
    with pytest.raises(TypeError, match="policy"):
        HostCache(store, 8, 3)
    with pytest.raises(ValueError, match="room"):
        HostCache(store, 8, LRU(5))
    with HostCache(store, 40) as cache:
        with pytest.raises(IndexError):
            cache.read([10])
        with pytest.raises(IndexError):
            cache.prefetch([-1])
        for bad in ([0.5], np.array([1.0]), torch.tensor([True]), "3"):
            with pytest.raises(TypeError):
                cache.prefetch(bad)
        with pytest.raises(ValueError):
            cache.prefetch(torch.zeros(2, 2, dtype=torch.int64))
        with pytest.raises(TypeError):
            cache.read([0.5])
        with pytest.raises(ValueError, match="out"):
            cache.read([1, 2], out=torch.empty(3, 2))
        assert cache.stats()[cache.tier]["reads"] == 0
    with pytest.raises(TypeError, match="path or a FeatureStore"):
        TieredStore(3)


def test_static_policies_and_factories_plug_in(rng):
    table = random_table(rng, 50, 2, torch.float32)
    deg = np.zeros(50)
    deg[[3, 7]] = 10
    with HostCache(TensorStore(table), 2 * 8, lambda cap: degree(cap, deg)) as cache:
        cache.read([3, 7, 9])
        cache.read([3, 7, 9])
        s = cache.stats()[cache.tier]
        assert s["hit_rows"] == 2 and s["cached_rows"] == 2 and s["policy"] == "degree"


def test_tiered_store_builds_the_chain_reads_out_and_reports_each_tier(tmp_path, rng):
    table = random_table(rng, 256, 32, torch.float32)
    path = write_disk_store(table.numpy(), tmp_path / "t.npy")
    store = TieredStore(path, gpu_bytes=16 * 128, host_bytes=64 * 128, staging_bytes=64 * 128)
    assert [type(t).__name__ for t in store.tiers] == ["DeviceCache", "HostCache", "DiskStore"]
    batches = [rng.integers(0, 256, 40) for _ in range(10)]
    out = torch.empty(40, 32)
    for b in batches[:2]:
        store.prefetch(b)
    for i, b in enumerate(batches):
        got = store.read(b, out=out)
        assert got.data_ptr() == out.data_ptr() and torch.equal(out, table[torch.from_numpy(b)])
        if i + 2 < len(batches):
            store.prefetch(batches[i + 2])
    s = store.stats()
    assert set(s) == {"device", "host", "disk"}
    assert s["device"]["reads"] == 10 and s["disk"]["bytes_read"] > 0
    disk = store.tiers[-1]
    store.close()
    assert disk.closed and all(t.closed for t in store.tiers)
    given = TensorStore(table)
    with TieredStore(given, host_bytes=1024) as t2:
        assert t2.read([0]).shape == (1, 32)
    assert not given.closed  # a store we were given is the caller's to close


def test_out_devices_follow_the_store_contract(rng, device):
    table = random_table(rng, 64, 8, torch.float32)
    with TieredStore(TensorStore(table), gpu_bytes=8 * 32, host_bytes=16 * 32) as store:
        ids = torch.tensor([5, 1, 5, 63])
        got = store.read(ids, device=device)
        assert got.device.type == torch.device(device).type
        assert torch.equal(got.cpu(), table[ids])


def test_a_device_cache_counts_the_pcie_lines_the_transaction_model_gives(rng):
    from directload.kernels.pcie_model import count_tiered
    from directload.kernels.tiered import flat_where

    table = random_table(rng, 300, 25, torch.float32)  # 100-byte rows: some span two lines, some three
    ids = rng.integers(0, 300, 64)
    with DeviceCache(TensorStore(table), 0) as cache:  # nothing cached: every row comes over "PCIe"
        cache.read(ids)
        got = cache.stats()[cache.tier]
    want = count_tiered(flat_where(ids * 25), 100, 4, flat_addr=table.data_ptr())["flat"].total
    assert got["pcie_lines"] == want > 64 and got["pcie_bytes"] == 128 * want
    with DeviceCache(TensorStore(table), 300 * 100) as cache:  # all cached after the first read
        cache.read(ids)
        first = cache.stats()[cache.tier]["pcie_lines"]
        cache.read(ids)
        assert cache.stats()[cache.tier]["pcie_lines"] == first


@pytest.mark.parametrize("dtype", [torch.complex128, torch.complex64, torch.bool, torch.bfloat16])
@pytest.mark.parametrize("shape", [(120,), (120, 3), (120, 2, 5), (120, 0)])
def test_every_dtype_and_row_shape_goes_through_the_tiers(rng, dtype, shape):
    table = torch.randn(shape, dtype=torch.float64).to(dtype) if dtype != torch.bool else torch.rand(shape) > 0.5
    rnb = max(1, table[0].numel() * table.element_size())
    with TieredStore(TensorStore(table), gpu_bytes=8 * rnb, host_bytes=30 * rnb, staging_bytes=20 * rnb) as store:
        batches = [rng.integers(0, 120, 25) for _ in range(8)]
        for b, got in zip(batches, _drive(store, batches, 2)):  # complex128: 16-byte elements, moved as words
            assert got.dtype == dtype and got.shape == (25, *shape[1:])
            assert torch.equal(bits(got), bits(table[torch.from_numpy(b)]))
        out = torch.empty((3, *shape[1:]), dtype=dtype)
        assert store.read([7, 0, 7], out=out) is out and torch.equal(bits(out), bits(table[[7, 0, 7]]))


# ------------------------------------------------------------------------------------------------- warm
@pytest.mark.parametrize("policy", POLICY_NAMES)
def test_warm_fills_the_free_room_most_wanted_first_and_those_rows_then_hit(rng, policy):
    table = random_table(rng, 200, 6, torch.float32)
    cache = HostCache(TensorStore(table), 50 * 24, policy, staging_bytes=10 * 24)
    wanted = rng.permutation(200)
    assert cache.warm(np.concatenate([wanted[:3], wanted])) == 50  # repeats count once; room for 50
    s = cache.stats()[cache.tier]
    assert s["warmed_rows"] == 50 and s["cached_rows"] == 50 and s["warm_s"] > 0
    assert s["hit_rows"] == s["miss_rows"] == 0  # filling is not reading
    first = wanted[:50]
    got = cache.read(torch.from_numpy(first))
    assert torch.equal(bits(got), bits(table[torch.from_numpy(first)]))
    assert cache.stats()[cache.tier]["hit_rows"] == 50 and cache.stats()[cache.tier]["miss_rows"] == 0
    assert cache.warm(wanted) == 0  # full: nothing is evicted for it
    assert cache.stats()[cache.tier]["cached_rows"] == 50
    cache.close()


def test_warm_skips_rows_already_held_and_leaves_room_it_was_not_given(rng):
    table = random_table(rng, 100, 4, torch.float32)
    cache = HostCache(TensorStore(table), 40 * 16, "lookahead")
    cache.read([1, 2, 3])
    assert cache.warm([3, 2, 50, 51]) == 2
    assert cache.stats()[cache.tier]["cached_rows"] == 5
    got = cache.read([1, 2, 3, 50, 51, 52])
    assert torch.equal(got, table[[1, 2, 3, 50, 51, 52]])
    s = cache.stats()[cache.tier]
    assert s["hit_rows"] == 5 and s["miss_rows"] == 4  # 1, 2, 3 first, then 52
    cache.close()


def test_a_warmed_lookahead_cache_evicts_the_least_wanted_warm_rows_first(rng):
    table = random_table(rng, 100, 2, torch.float32)
    cache = HostCache(TensorStore(table), 10 * 8, "lookahead")
    cache.warm(np.arange(10))  # 0 most wanted, 9 least
    cache.read(np.arange(50, 54))  # four new rows must come in: four warm rows go
    kept = cache.policy.contains(np.arange(10))
    assert kept.tolist() == [True] * 6 + [False] * 4
    assert torch.equal(cache.read(np.arange(10)), table[:10])
    cache.close()


def test_warm_of_a_packed_disk_store_takes_its_hot_rows_in_file_order(tmp_path, rng):
    from directload.stores import renumber

    table = random_table(rng, 300, 16, torch.float32)
    path = write_disk_store(table.numpy(), tmp_path / "t.npy", progress=False)
    counts = np.zeros(300, np.int64)
    hot = rng.choice(300, 40, replace=False)
    counts[hot] = rng.integers(1, 9, 40)
    packed = renumber(path, tmp_path / "p.npy", counts, progress=False)
    with DiskStore(path) as plain:
        assert plain.hot_ids() is None
        with HostCache(plain, 40 * 64) as cache, pytest.raises(ValueError, match="knows no hot rows"):
            cache.warm()
    with DiskStore(packed) as disk:
        order = disk.hot_ids()
        assert sorted(order[:40].tolist()) == sorted(hot.tolist())  # the hot rows lead the file
        assert np.array_equal(disk.id_map[order], np.arange(300))
        with HostCache(disk, 40 * 64, "lru") as cache:
            assert cache.warm() == 40
            assert disk.stats()["reads"] == 1  # 40 rows of 64 B side by side: one merged read
            got = cache.read(torch.from_numpy(hot))
            assert torch.equal(bits(got), bits(table[torch.from_numpy(hot)]))
            assert cache.stats()[cache.tier]["hit_rows"] == 40


def test_a_tiered_store_warms_host_then_device_and_reads_right(tmp_path, rng):
    from directload.stores import renumber

    table = random_table(rng, 256, 8, torch.float32)
    counts = np.arange(256)[::-1].copy()  # row 0 hottest
    packed = renumber(write_disk_store(table.numpy(), tmp_path / "t.npy", progress=False), tmp_path / "p.npy",
                      counts, progress=False)
    with TieredStore(packed, gpu_bytes=8 * 32, host_bytes=32 * 32, staging_bytes=0) as store:
        assert store.warm() == {"host": 32, "device": 8}
        s = store.stats()
        assert s["host"]["cached_rows"] == 32 and s["device"]["cached_rows"] == 8
        assert s["host"]["hit_rows"] == 8  # the device tier's rows came from the host tier
        ids = torch.arange(40)
        assert torch.equal(store.read(ids), table[:40])
        s = store.stats()
        assert s["device"]["hit_rows"] == 8 and s["host"]["hit_rows"] == 8 + 24 and s["host"]["miss_rows"] == 8
    with TieredStore(TensorStore(table), host_bytes=64) as store, pytest.raises(ValueError, match="no hot rows"):
        store.warm()


def test_warm_refuses_bad_ids_before_reading_and_a_failed_read_gives_its_slots_back(rng):
    table = random_table(rng, 100, 2, torch.float32)
    flaky = _Flaky(table, ok=0)
    cache = HostCache(flaky, 30 * 8, "lru")
    with pytest.raises(IndexError):
        cache.warm([1, 100])
    with pytest.raises(TypeError):
        cache.warm(np.array([1.5, 2.0]))
    assert flaky.ok == 0  # nothing was read
    with pytest.raises(OSError, match="simulated"):
        cache.warm(np.arange(10))
    s = cache.stats()[cache.tier]
    assert s["cached_rows"] == 0 and s["warmed_rows"] == 0
    assert cache.slots.table.free_count == 30  # every slot is free again
    flaky.ok = None
    assert torch.equal(cache.read(np.arange(10)), table[:10])  # the policy kept them; the rows come in now
    assert cache.warm(np.arange(20)) == 10
    cache.close()
    with pytest.raises(ClosedError):
        cache.warm([1])


def test_reads_from_another_thread_while_warming_are_right(rng):
    table = random_table(rng, 2000, 16, torch.float32)
    cache = HostCache(_Flaky(table, delay=0.002), 1500 * 64, "lookahead", staging_bytes=100 * 64)
    errors = []

    def reader():
        r = np.random.default_rng(1)
        try:
            for _ in range(40):
                b = r.integers(0, 2000, 50)
                if not torch.equal(cache.read(b), table[torch.from_numpy(b)]):
                    errors.append("wrong rows")
        except Exception as exc:  # noqa: BLE001 - the test reports it
            errors.append(repr(exc))

    t = threading.Thread(target=reader)
    t.start()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("directload.stores.warming.WARM_BYTES", 64 * 64)  # many rounds, so reads interleave
        cache.warm(rng.permutation(2000))
    t.join(30)
    assert not t.is_alive() and not errors
    assert torch.equal(cache.read(np.arange(2000)), table)
    assert cache.stats()[cache.tier]["cached_rows"] <= 1500
    cache.close()


def test_a_background_warm_returns_at_once_and_reads_meanwhile_are_right(rng):
    table = random_table(rng, 3000, 16, torch.float32)
    gate = threading.Event()  # every read of the store below waits for it: warm must return before
    cache = HostCache(_Flaky(table, delay=0.003, gate=gate), 2000 * 64, "lru", staging_bytes=100 * 64)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("directload.stores.warming.WARM_BYTES", 100 * 64)  # 20 rounds of 3 ms at least
        assert cache.warm(np.arange(3000)[::-1], background=True) == 2000
        assert cache.warming is not None  # it returned with its first round held at the gate
        gate.set()
        with pytest.raises(WarmingBusyError, match="warming already"):
            cache.warm([1], background=True)
        for b in [rng.integers(1000, 3000, 64) for _ in range(10)]:  # rows it warms: none is evicted
            assert torch.equal(cache.read(b), table[torch.from_numpy(b)])
        _join_warm(cache, 30)
    s = cache.stats()[cache.tier]
    assert s["cached_rows"] == 2000 and s["warmed_rows"] + s["miss_rows"] >= 2000 - 640
    assert torch.equal(cache.read(np.arange(1000, 3000)), table[1000:])
    assert cache.stats()[cache.tier]["miss_rows"] == s["miss_rows"]  # the warmed rows all hit
    cache.close()


def test_a_failing_background_warm_reaches_the_reader_and_close_never_hangs(rng):
    table = random_table(rng, 500, 2, torch.float32)
    cache = HostCache(_Flaky(table, fail_over=4), 400 * 8, "lru")
    cache.warm(np.arange(400), background=True)  # reads of more than 4 rows fail
    _join_warm(cache, 10)
    with pytest.raises(OSError, match="simulated I/O error") as info:
        cache.read([1, 2])
    assert "host cache's warm thread" in " ".join(info.value.__notes__)
    assert isinstance(info.value.__cause__, OSError)
    assert cache.stats()[cache.tier]["cached_rows"] == 0
    cache.close()
    flaky = _Flaky(table, delay=0.2)
    slow = HostCache(flaky, 400 * 8, "lru")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("directload.stores.warming.WARM_BYTES", 8 * 8)  # 50 rounds of 0.2 s
        slow.warm(np.arange(400), background=True)
        within(60, lambda: _until(lambda: flaky.calls > 0))
        started = flaky.calls
        within(60, slow.close)  # stops between rounds
    assert flaky.calls <= started + 1 < 50 and slow.warming is None


def test_a_tiered_background_warm_fills_the_device_tier_after_the_host_tier(tmp_path, rng):
    from directload.stores import renumber

    table = random_table(rng, 512, 8, torch.float32)
    counts = np.arange(512)[::-1].copy()
    packed = renumber(write_disk_store(table.numpy(), tmp_path / "t.npy", progress=False), tmp_path / "p.npy",
                      counts, progress=False)
    with TieredStore(packed, gpu_bytes=16 * 32, host_bytes=128 * 32, staging_bytes=0) as store:
        assert store.warm(background=True) == {"host": 128, "device": 16}
        device, host = store.tiers[0], store.tiers[1]
        _join_warm(device, 30)
        assert host.warming is None
        assert host.stats()[host.tier]["warmed_rows"] == 128 and device.stats()[device.tier]["warmed_rows"] == 16
        assert store.tiers[-1].stats()["reads"] == 1  # the host tier's 128 side-by-side rows; the device's from it
        assert torch.equal(store.read(torch.arange(128)), table[:128])
        assert device.stats()[device.tier]["hit_rows"] == 16 and host.stats()[host.tier]["miss_rows"] == 0


@pytest.mark.parametrize("policy", ["lookahead", "lru"])
def test_readers_on_many_threads_each_stage_their_misses_in_a_buffer_of_their_own(rng, policy):
    # a fallback that copies rows into the cache's buffer (the default _stage); reader threads overlap their
    # I/O, so one buffer for all of them handed one reader's rows to another (found in review)
    table = random_table(rng, 3000, 16, torch.float32)
    cache = HostCache(_Flaky(table, delay=0.0005), 1000 * 64, policy, staging_bytes=200 * 64)
    wrong, errors = [0], []

    def reader(seed):
        r = np.random.default_rng(seed)
        try:
            for _ in range(60):
                b = np.unique(r.integers(0, 3000, 100))
                if r.random() < 0.5:
                    cache.prefetch(b)
                wrong[0] += int((cache.read(b) != table[torch.from_numpy(b)]).any(1).sum())
        except Exception as exc:  # noqa: BLE001 - the test reports it
            errors.append(repr(exc))

    threads = [threading.Thread(target=reader, args=(s,)) for s in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors and wrong[0] == 0, (wrong[0], errors[:1])
    cache.close()


def test_one_warm_at_a_time_so_two_never_share_a_buffer(rng):
    table = random_table(rng, 2000, 64, torch.float32)
    cache = HostCache(_Flaky(table, delay=0.002), 2000 * 256, "lru")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("directload.stores.warming.WARM_BYTES", 64 * 256)  # 16 rounds of 2 ms at least
        first = threading.Thread(target=cache.warm, args=(np.arange(1000),))
        first.start()
        deadline = time.monotonic() + 5
        while cache.warming is None and time.monotonic() < deadline:
            time.sleep(0.0005)
        with pytest.raises(WarmingBusyError, match="warming already"):
            cache.warm(np.arange(1000, 2000), background=True)
        with pytest.raises(WarmingBusyError, match="warming already"):
            cache.warm(np.arange(1000, 2000))
        first.join(30)
    assert cache.warm(np.arange(1000, 2000), background=True) == 1000  # after it, a warm goes on
    _join_warm(cache, 30)
    rows = np.arange(2000)
    assert cache.stats()[cache.tier]["cached_rows"] == 2000
    assert torch.equal(cache.read(rows), table)
    assert cache.stats()[cache.tier]["miss_rows"] == 0
    cache.close()


def test_closing_a_tiered_store_while_its_tiers_warm_in_the_background_is_prompt(rng):
    table = random_table(rng, 400, 2, torch.float32)
    flaky = _Flaky(table, delay=0.2)
    store = TieredStore(flaky, gpu_bytes=20 * 8, host_bytes=400 * 8, staging_bytes=0)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("directload.stores.warming.WARM_BYTES", 8 * 8)  # the host tier: 50 rounds of 0.2 s
        store.warm(np.arange(400), background=True)
        within(60, lambda: _until(lambda: flaky.calls > 0))
        started = flaky.calls
        within(60, store.close)  # the GPU tier's thread, waiting for the host tier's, stops too
    assert flaky.calls <= started + 1 < 50
    assert all(t.warming is None for t in store.tiers[:2])


def test_a_thread_error_whose_type_cannot_be_rebuilt_arrives_as_runtime_error_naming_it():
    from directload.errors import rethrown as _rethrown

    class Odd(Exception):
        def __init__(self, a, b):
            super().__init__(f"{a}-{b}")

    exc = Odd(1, 2)
    exc.add_note("(raised on the host cache's read-ahead thread)")
    got = _rethrown(exc)
    assert type(got) is RuntimeError and "Odd('1-2')" in str(got) and "read-ahead thread" in str(got)
    key = _rethrown(KeyError("k"))
    assert type(key) is KeyError and key.args == ("k",) and key.__traceback__ is None


def _join_warm(cache, timeout):
    """Wait for a background warm of ``cache`` to end (it may have ended already)."""
    w = cache.warming
    if w is not None:
        w.join(timeout)


def test_a_cache_closed_between_a_reads_check_and_its_first_use_raises_closed_error():
    class ClosedAfterTheCheck(HostCache):
        checks = 0

        def check_open(self):
            super().check_open()
            self.checks += 1
            if self.checks == 1:
                self.close()  # another thread closes it right after the read's check

    cache = ClosedAfterTheCheck(TensorStore(torch.zeros(10, 2)), 4 * 8, "lru")
    with pytest.raises(ClosedError):
        cache.read_async([1, 2])
