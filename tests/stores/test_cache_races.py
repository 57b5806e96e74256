"""Caches under concurrency: readers, read-ahead hints, background warming and resizes at once never return
another id's row.  Two races pinned down with gates (each failed before its fix), then a stress test of
every policy, both cache kinds and a tiered store, every row checked against the table."""

import sys
import threading
import time

import numpy as np
import pytest
import torch
from conftest import random_table

from directload.stores import DeviceCache, FeatureStore, HostCache, ReadFuture, TensorStore, TieredStore
from directload.stores.policies import POLICY_NAMES

_GUARD_S = 60  # a gate or a condition that never comes fails the test instead of hanging it


class _GatedRows(FeatureStore):
    """A table whose reads of a gated id wait until the test opens that id's gate."""

    def __init__(self, table):
        super().__init__()
        self.table = table
        self.gates = {}  # id -> threading.Event
        self.waiting = set()  # ids a read waits for now

    num_rows = property(lambda self: self.table.shape[0])
    row_shape = property(lambda self: tuple(self.table.shape[1:]))
    dtype = property(lambda self: self.table.dtype)

    def gate(self, row):
        self.gates[row] = threading.Event()

    def open(self, row):
        self.gates.pop(row).set()

    def _read_async(self, index, out, run_device, out_device):
        for row in index.tolist():
            gate = self.gates.get(row)
            if gate is not None:
                self.waiting.add(row)
                if not gate.wait(_GUARD_S):
                    raise TimeoutError(f"the test never opened the gate of row {row}")
                self.waiting.discard(row)
        rows = self.table[index.long()]
        if out is not None:
            out.copy_(rows)
            return ReadFuture(result=out)
        return ReadFuture(result=rows)


def _until(condition, what):
    deadline = time.monotonic() + _GUARD_S
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting until {what}")
        time.sleep(0.001)


def test_a_row_whose_staged_slot_a_skipped_batch_frees_is_read_again(rng):
    # A read matches batch 2, skipping batch 1, whose staged row r it also reads: skipping frees r's slot.
    # The read must not take r from that slot, which the read-ahead refills with another row while the
    # read waits for its miss.
    table = random_table(rng, 20, 4, torch.float32)
    store = _GatedRows(table)
    cache = HostCache(store, 0, "lru", staging_bytes=8 * 16)
    r, a, b, c, m, x = 1, 2, 3, 4, 5, 6
    cache.prefetch([r])
    _until(lambda: cache.stats()[cache.tier]["prefetched_rows"] == 1, "row r is staged")
    cache.prefetch([a, b, c])
    _until(lambda: cache.stats()[cache.tier]["prefetched_rows"] == 4, "batch 2 is staged")
    store.gate(m)
    future = cache.read_async([r, a, b, c, m])  # batch 2 (3 of 5 rows), plus r and a miss
    _until(lambda: m in store.waiting, "the read waits for its miss")
    cache.prefetch([x])  # the read-ahead takes the slot r was freed from
    _until(lambda: cache.stats()[cache.tier]["prefetched_rows"] == 5, "row x is staged")
    store.open(m)
    assert torch.equal(future.wait(), table[[r, a, b, c, m]])
    cache.close()


def test_a_slot_in_flight_is_not_settled_by_a_reader_that_saw_its_row_staged(rng):
    # Reader A sees r staged, then waits for its miss m.  Meanwhile r's slot is promoted, evicted and freed,
    # and the read-ahead starts reading r into another slot.  A's admission must not mark that slot cached
    # while it is in flight: a reader would take r from it before it is read.
    table = random_table(rng, 20, 4, torch.float32)
    store = _GatedRows(table)
    cache = HostCache(store, 2 * 16, "lru", staging_bytes=8 * 16)
    r, m, p, q = 1, 2, 3, 4
    cache.prefetch([r])
    _until(lambda: cache.stats()[cache.tier]["prefetched_rows"] == 1, "row r is staged")
    store.gate(m)
    reader_a = cache.read_async([r, m])  # not an announced batch: r is staged, m a miss
    _until(lambda: m in store.waiting, "reader A waits for its miss")
    assert torch.equal(cache.read([r]), table[[r]])  # the announced batch: r is promoted to cached
    assert torch.equal(cache.read([p, q]), table[[p, q]])  # the policy evicts r: its slot is freed
    store.gate(r)
    cache.prefetch([r])  # the read-ahead reads r into another slot, and waits at its gate
    _until(lambda: r in store.waiting, "the read-ahead reads r")
    store.open(m)
    assert torch.equal(reader_a.wait(), table[[r, m]])
    waits = cache.stats()[cache.tier]["inflight_waits"]
    reader_d = cache.read_async([r])
    _until(lambda: reader_d.done() or cache.stats()[cache.tier]["inflight_waits"] > waits, "reader D waits or returns")
    store.open(r)
    assert torch.equal(reader_d.wait(), table[[r]])
    cache.close()


# ---------------------------------------------------------------- stress

_ROWS, _ELEMS, _BATCH, _AHEAD = 2000, 6, 120, 4
_RNB = _ELEMS * 4


def _make(kind, table, policy):
    if kind == "tiered":
        store = TieredStore(TensorStore(table), gpu_bytes=150 * _RNB, host_bytes=300 * _RNB, staging_bytes=480 * _RNB,
                            host_room_bytes=600 * _RNB, policy=policy)
        return store, lambda rows: store.resize(host_bytes=rows * _RNB, gpu_bytes=rows // 2 * _RNB)
    if kind == "host":
        cache = HostCache(TensorStore(table), 300 * _RNB, policy, staging_bytes=480 * _RNB)
    else:
        cache = DeviceCache(TensorStore(table), 300 * _RNB, policy, staging_bytes=480 * _RNB, device="cpu")
    return cache, lambda rows: cache.resize(rows * _RNB)


def _stress(kind, policy, seed, batches=60):
    """Three readers share a loader's queue of batches (each announced ``_AHEAD`` batches before it is read,
    and read with a quarter of its rows other than announced: hints are hints), while the test's thread
    warms the cache in the background and resizes it: the wrong reads and the errors seen."""
    rng = np.random.default_rng(seed)
    table = random_table(rng, _ROWS, _ELEMS, torch.float32)
    store, resize = _make(kind, table, policy)
    announced = [rng.choice(_ROWS, _BATCH, replace=False) for _ in range(batches)]
    read = []
    for b in announced:
        b = b.copy()
        b[:_BATCH // 4] = rng.choice(_ROWS, _BATCH // 4, replace=False)
        read.append(torch.from_numpy(np.unique(b)))
    queue, taken = list(range(batches))[::-1], threading.Lock()
    wrong, errors = [], []

    def reader():
        try:
            while True:
                with taken:
                    if not queue:
                        return
                    i = queue.pop()
                    if i + _AHEAD < batches:
                        store.prefetch(announced[i + _AHEAD])
                if not torch.equal(store.read_async(read[i]).wait(), table[read[i]]):
                    wrong.append(i)
        except Exception as exc:  # noqa: BLE001 - reported by the test, in its own thread
            errors.append(exc)

    for b in announced[:_AHEAD]:
        store.prefetch(b)
    threads = [threading.Thread(target=reader, daemon=True) for _ in range(3)]
    for th in threads:
        th.start()
    try:
        while any(th.is_alive() for th in threads):
            try:
                store.warm(torch.from_numpy(rng.permutation(_ROWS)), background=True)
            except RuntimeError as exc:
                if "warming already" not in str(exc):
                    raise
            resize(int(rng.integers(0, 300)))
            for th in threads:
                th.join(0.01)
    finally:
        for th in threads:
            th.join(_GUARD_S)
        caches = store.tiers[:-1] if isinstance(store, TieredStore) else [store]
        for cache in caches:
            errors.extend(f"{cache.tier}: {p}" for p in cache.slots.problems())
        store.close()
    assert not any(th.is_alive() for th in threads), "a reader hung"
    return wrong, errors


@pytest.fixture
def busy_switching():
    """Switch threads every 10 us instead of 5 ms, so that the races' windows open often."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    yield
    sys.setswitchinterval(before)


@pytest.mark.parametrize("kind", ["host", "device", "tiered"])
def test_readers_read_ahead_warm_and_resize_at_once_never_give_a_wrong_row(kind, busy_switching):
    for seed, policy in enumerate(POLICY_NAMES * 2):
        wrong, errors = _stress(kind, policy, seed)
        assert not errors, (policy, errors[:3])
        assert not wrong, f"{policy}: {len(wrong)} wrong reads"
