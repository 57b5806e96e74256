"""One cache fill protocol: a read's kept misses, the read-ahead and a warm all claim slots under the slot cache's
lock, fill them outside it, and settle them under it again.  So a cache's copy into its slots (GPU work for a
device cache) never runs under the lock, and a child forked while a read fills its slots never serves a row
half copied."""

import os
import threading
import time

import numpy as np
import pytest
import torch
from conftest import within

import directload.stores.cache as cache_module
import directload.stores.slotcache as slotcache_module
from directload.stores import DeviceCache, HostCache, TensorStore

ROWS, WIDTH = 400, 16
TABLE = torch.arange(ROWS * WIDTH, dtype=torch.float32).view(ROWS, WIDTH)


@pytest.fixture
def gated_fill(monkeypatch):
    """The copy into slots, stopped at its first call after poisoning the slots it fills (a copy half done)
    until ``gate`` opens; ``entered`` says it got there.  Later calls (and a forked child's) copy at once."""
    real = cache_module.fill_slots
    entered, gate = threading.Event(), threading.Event()

    def fill(into, slots, flat, offsets):
        if not entered.is_set():
            into[torch.from_numpy(np.asarray(slots, np.int64))] = 7  # garbage where the rows go
            entered.set()
            gate.wait(30)
        return real(into, slots, flat, offsets)

    for module in (cache_module, slotcache_module):  # wherever a cache copies into its slots
        monkeypatch.setattr(module, "fill_slots", fill, raising=False)
    yield entered, gate
    gate.set()


@pytest.mark.parametrize("kind", [DeviceCache, HostCache])
def test_a_reads_copy_into_its_slots_runs_outside_the_slot_caches_lock(gated_fill, kind):
    entered, gate = gated_fill
    extra = {"device": "cpu"} if kind is DeviceCache else {}
    cache = kind(TensorStore(TABLE), 100 * WIDTH * 4, "lru", **extra)
    try:
        reader = threading.Thread(target=lambda: cache.read(torch.arange(50)), daemon=True)
        reader.start()
        assert entered.wait(60)  # the read copies its kept misses into their slots now, and stays there
        # the slot cache answers meanwhile: its lock is free (it was held through the copy before)
        assert within(10, cache.slots.counts)["cached_rows"] == 0  # in flight, not cached before they are filled
        assert torch.equal(within(10, lambda: cache.read(torch.arange(60, 70))), TABLE[60:70])
        gate.set()
        reader.join(60)
        assert torch.equal(cache.read(torch.arange(50)), TABLE[:50])
        assert cache.stats()[cache.tier]["hit_rows"] == 50  # settled: cached once filled
    finally:
        gate.set()
        cache.close()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_child_forked_while_a_read_fills_its_slots_reads_right_rows(gated_fill):
    entered, gate = gated_fill
    cache = HostCache(TensorStore(TABLE), 100 * WIDTH * 4, "lru")
    try:
        reader = threading.Thread(target=lambda: cache.read(torch.arange(50)), daemon=True)
        reader.start()
        assert entered.wait(60)  # the slots hold garbage now, the copy half done
        pid = os.fork()
        if pid == 0:  # the child: the parent's filling thread is gone; its slots must not be served
            ok = torch.equal(cache.read(torch.arange(50)), TABLE[:50])
            os._exit(0 if ok else 5)
        deadline = time.monotonic() + 60
        while (done := os.waitpid(pid, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
            time.sleep(0.02)
        if done[0] == 0:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
        assert done[0] == pid and os.waitstatus_to_exitcode(done[1]) == 0, "the child read the half-copied slots"
        gate.set()
        reader.join(60)
        assert torch.equal(cache.read(torch.arange(50)), TABLE[:50])
    finally:
        gate.set()
        cache.close()


def test_a_failed_copy_gives_the_slots_back_and_the_next_read_is_right(monkeypatch):
    calls = []

    def broken(into, slots, flat, offsets):
        calls.append(len(slots))
        raise OSError(5, "injected copy failure")

    cache = HostCache(TensorStore(TABLE), 100 * WIDTH * 4, "lru")
    try:
        monkeypatch.setattr(cache_module, "fill_slots", broken)
        with pytest.raises(OSError, match="injected copy failure"):
            cache.read(torch.arange(20))
        assert calls == [20] and cache.slots.problems() == [] and cache.slots.held_rows().size == 0
        monkeypatch.undo()
        assert torch.equal(cache.read(torch.arange(20)), TABLE[:20])
        assert cache.slots.held_rows().tolist() == list(range(20))
    finally:
        cache.close()
