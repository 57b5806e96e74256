"""SlotCache, the data structure of a cache: every policy, every call, checked row by row with numpy alone
(no store, no thread, no I/O; the slots' memory is a small tensor whose row k holds the value k)."""

import threading

import numpy as np
import pytest
import torch

from directload.stores import Staged
from directload.stores.policies import LRU, POLICY_NAMES
from directload.stores.slotcache import SlotCache
from directload.stores.slots import CACHED, INFLIGHT, STAGED

N = 64


def _staged(rows):
    """The rows' values (row r holds r) as a flat staged tier."""
    return Staged(torch.as_tensor(rows, dtype=torch.float64), np.arange(len(rows), dtype=np.int64))


def _read(c, memory, ids):
    """One read through ``c``: query, the rows from slots or from 'staging', admit; the values read."""
    uniq = np.unique(np.asarray(ids, np.int64))
    q = c.query(uniq)
    got = np.where(q.slots >= 0, memory[np.maximum(q.slots, 0), 0].numpy(), -1.0)
    got[q.miss] = q.miss_rows  # what the fallback gives
    c.admit(q, _staged(q.miss_rows), memory)
    c.finish(q)
    return uniq, got


def _held_values_are_their_rows(c, memory):
    rows = c.held_rows()
    assert (memory[c.table.slot[rows], 0].numpy() == rows).all()


@pytest.mark.parametrize("policy", POLICY_NAMES)
def test_reads_of_every_policy_keep_the_table_sound_and_every_row_right(policy, rng):
    c = SlotCache(N, capacity=16, staging=8, policy=policy)
    memory = torch.full((24, 1), -7.0, dtype=torch.float64)  # poisoned
    for _ in range(60):
        ahead = np.unique(rng.integers(0, N, 10))
        c.announce(ahead)
        uniq, got = _read(c, memory, rng.integers(0, N, 12))
        assert (got == uniq).all()
        assert c.problems() == []
        cached = c.held_rows(CACHED)
        assert cached.size <= c.capacity_rows and c.policy.contains(cached).all()
        assert (memory[c.table.slot[cached], 0].numpy() == cached).all()


def test_a_query_classifies_rows_and_the_admit_copies_the_kept_misses():
    c = SlotCache(N, capacity=2, policy="lru")
    memory = torch.full((2, 1), -7.0, dtype=torch.float64)
    q = c.query(np.array([3, 5, 9]))
    assert q.miss.all() and q.keep.sum() == 2 and q.batch is None  # a batch of three, two slots
    c.admit(q, _staged(q.miss_rows), memory)
    c.finish(q)
    kept = c.held_rows(CACHED)
    assert kept.size == 2 and sorted(memory[:, 0].tolist()) == sorted(kept.tolist())
    q = c.query(kept)
    assert q.cached.all() and not q.miss.any()
    c.abandon(q)
    assert (c.table.pinned == 0).all()  # the abandoned read's pins are gone


def test_read_ahead_claims_free_slots_for_the_oldest_announced_batch_and_forwards_them():
    c = SlotCache(N, capacity=4, staging=4, policy="lru")
    memory = torch.full((8, 1), -7.0, dtype=torch.float64)
    absent = c.announce(np.array([10, 11, 12]))
    assert absent.tolist() == [10, 11, 12]
    rows, slots = c.claim_ahead(2, timeout=0)
    assert rows.tolist() == [10, 11] and (c.table.kind[slots] == INFLIGHT).all()
    memory[torch.from_numpy(slots), 0] = torch.from_numpy(rows.astype(np.float64))
    c.settle_ahead(rows, slots)
    assert (c.table.kind[slots] == STAGED).all()
    q = c.query(np.array([10, 11, 12]))  # the announced batch: two staged, one missing
    assert q.batch is not None and q.staged.tolist() == [True, True, False] and q.forwarded == 0
    c.admit(q, _staged(q.miss_rows), memory)
    assert (c.table.pinned[q.held] == 1).all()  # the gather may still read them: pinned until finish
    c.finish(q)
    assert (c.table.pinned == 0).all()
    _held_values_are_their_rows(c, memory)
    assert c.claim_ahead(2, timeout=0) is None  # nothing announced is left


def test_no_read_ahead_while_a_query_waits_or_once_closed():
    c = SlotCache(N, capacity=4, staging=4, policy="lru")
    c.announce(np.array([1, 2]))
    rows, slots = c.claim_ahead(1, timeout=0)  # row 1 in flight
    done, waiting = [], threading.Event()
    reader = threading.Thread(target=lambda: done.append(c.query(np.array([1, 2]), on_wait=waiting.set)))
    reader.start()
    try:
        assert waiting.wait(60)  # the query waits for row 1 (a hang guard, not a time budget)
        assert c.claim_ahead(1, timeout=0.2) is None  # a query waits: demand first, however long we look
    finally:
        c.settle_ahead(rows, slots)
        reader.join(60)
    assert done and done[0].staged.tolist() == [True, False]
    c.close()
    assert c.claim_ahead(1, timeout=0) is None and c.claim_warm(np.array([5])) is None


@pytest.mark.parametrize("policy", POLICY_NAMES)
def test_warming_admits_what_fits_and_settles_what_the_policy_still_keeps(policy):
    c = SlotCache(N, capacity=8, policy=policy)
    memory = torch.full((8, 1), -7.0, dtype=torch.float64)
    planned = c.plan_warm(np.arange(20))
    assert planned.size == 8 and c.absent(np.arange(20)) == 20
    rows, slots = c.claim_warm(planned)
    memory[torch.from_numpy(slots), 0] = torch.from_numpy(rows.astype(np.float64))
    kept = c.settle_warm(rows, slots)
    assert kept == c.counts()["cached_rows"] == 8
    _held_values_are_their_rows(c, memory)
    assert c.problems() == []


@pytest.mark.parametrize("policy", POLICY_NAMES)
def test_resize_shrinks_and_grows_keeping_rows_right(policy, rng):
    parked = []
    c = SlotCache(N, capacity=16, room=32, policy=policy, park=lambda s: parked.extend(s.tolist()))
    memory = torch.full((32, 1), -7.0, dtype=torch.float64)
    for _ in range(10):
        _read(c, memory, rng.integers(0, N, 12))
    assert c.resize(4) == 4 and c.held_rows(CACHED).size <= 4
    assert all(s >= 4 for s in parked)  # only slots past the new limit are given back
    for _ in range(10):
        uniq, got = _read(c, memory, rng.integers(0, N, 12))
        assert (got == uniq).all()
    assert c.resize(10 ** 6) == 32 and c.problems() == []
    _held_values_are_their_rows(c, memory)


def test_a_policy_object_cannot_be_resized_and_a_failure_is_raised_by_every_later_call():
    c = SlotCache(N, capacity=4, policy=LRU(4))
    with pytest.raises(TypeError, match="by name or as a callable"):
        c.resize(2)
    c.fail(OSError(5, "the disk failed"))
    for call in (lambda: c.query(np.array([1])), lambda: c.announce(np.array([1])), lambda: c.plan_warm(np.array([1]))):
        with pytest.raises(OSError, match="the disk failed"):
            call()


def test_a_room_smaller_than_the_capacity_is_refused():
    with pytest.raises(ValueError, match="less than the capacity"):
        SlotCache(N, capacity=8, room=4)


def test_a_slot_evicted_while_its_reader_still_gathers_is_reused_only_after_finish():
    c = SlotCache(N, capacity=1, policy="lru")
    memory = torch.full((1, 1), -7.0, dtype=torch.float64)
    _read(c, memory, [3])  # row 3 cached in the only slot
    first = c.query(np.array([3]))  # a reader copies out of that slot ...
    second = c.query(np.array([9]))  # ... while another's miss evicts row 3
    c.admit(second, _staged(second.miss_rows), memory)
    assert memory[0, 0].item() == 3.0 and c.table.free_count == 0  # not reused under the first reader
    c.admit(first, _staged(first.miss_rows), memory)
    c.finish(first)
    c.finish(second)
    assert c.problems() == [] and (c.table.pinned == 0).all()
