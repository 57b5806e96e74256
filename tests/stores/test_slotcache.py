"""SlotCache, the data structure of a cache: every policy, every call, checked row by row with numpy alone
(no store, no thread, no I/O; the slots' memory is a small tensor whose row k holds the value k)."""

import threading

import numpy as np
import pytest
import torch

from directload.stores.policies import LRU, POLICY_NAMES
from directload.stores.slotcache import SlotCache
from directload.stores.slots import CACHED, INFLIGHT, STAGED

N = 64


def _admit(c, q, memory):
    """The read's admit, and the store's fill of the slots it placed (outside the lock): row r holds r."""
    placed = c.admit(q)
    assert (placed.rows == q.miss_rows[placed.at]).all()
    memory[torch.from_numpy(placed.slots), 0] = torch.from_numpy(placed.rows.astype(np.float64))
    return placed


def _read(c, memory, ids):
    """One read through ``c``: query, the rows from slots or from 'staging', admit, fill, finish; the values
    read."""
    uniq = np.unique(np.asarray(ids, np.int64))
    q = c.query(uniq)
    got = np.where(q.slots >= 0, memory[np.maximum(q.slots, 0), 0].numpy(), -1.0)
    got[q.miss] = q.miss_rows  # what the fallback gives
    c.finish(q, _admit(c, q, memory))
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


def test_a_query_classifies_rows_and_the_admit_places_the_kept_misses():
    c = SlotCache(N, capacity=2, policy="lru")
    memory = torch.full((2, 1), -7.0, dtype=torch.float64)
    q = c.query(np.array([3, 5, 9]))
    assert q.miss.all() and q.keep.sum() == 2 and q.batch is None  # a batch of three, two slots
    c.finish(q, _admit(c, q, memory))
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
    placed = _admit(c, q, memory)
    assert (c.table.pinned[q.held] == 1).all()  # the gather may still read them: pinned until finish
    c.finish(q, placed)
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
    placed = _admit(c, second, memory)
    assert memory[0, 0].item() == 3.0 and c.table.free_count == 0 and not len(placed)  # not reused under the first
    c.finish(first, _admit(c, first, memory))
    c.finish(second, placed)
    assert c.problems() == [] and (c.table.pinned == 0).all()


def test_the_admit_places_kept_misses_in_flight_and_finish_settles_them():
    """One fill protocol: the admit claims the slots under the lock and marks them in flight (a reader of those
    rows waits), the store fills them outside the lock, finish settles them; nothing is copied by the admit."""
    c = SlotCache(N, capacity=4, policy="lru")
    q = c.query(np.array([3, 5]))
    placed = c.admit(q)
    assert placed.rows.tolist() == [3, 5] and (c.table.kind[placed.slots] == INFLIGHT).all()
    assert c.held_rows(CACHED).size == 0  # no one takes them from the slots before they are filled
    waiting, done = threading.Event(), []
    reader = threading.Thread(target=lambda: done.append(c.query(np.array([5]), on_wait=waiting.set)))
    reader.start()
    try:
        assert waiting.wait(60)  # another read of row 5 waits for the fill (a hang guard, not a time budget)
    finally:
        c.finish(q, placed)
        reader.join(60)
    assert done and done[0].cached.tolist() == [True]  # then finds it cached
    assert c.held_rows(CACHED).tolist() == [3, 5] and c.problems() == []


def test_rows_let_go_while_their_slots_fill_are_freed_at_finish():
    c = SlotCache(N, capacity=4, room=4, policy="lru")
    q = c.query(np.array([3, 5]))
    placed = c.admit(q)
    c.resize(0)  # the policy lets every row go while the store fills their slots
    c.finish(q, placed)
    assert c.held_rows().size == 0 and c.capacity_rows == 0 and c.problems() == []


def test_a_fork_while_the_store_fills_admitted_slots_drops_them_in_the_child():
    """The child's table keeps cached rows only: slots a read was filling at the fork (maybe half copied) are
    dropped, never served as cached."""
    c = SlotCache(N, capacity=4, policy="lru")
    _read(c, torch.zeros(4, 1, dtype=torch.float64), [1])  # row 1 cached, filled
    q = c.query(np.array([3, 5]))
    placed = c.admit(q)
    c.after_fork()  # as in a child forked now, with the parent's filling thread gone
    assert c.held_rows().tolist() == [1] and c.problems() == []
    assert len(placed) == 2


def test_a_row_evicted_while_its_slot_fills_is_freed_by_its_filler():
    c = SlotCache(N, capacity=1, policy="lru")
    memory = torch.full((1, 1), -7.0, dtype=torch.float64)
    first = c.query(np.array([3]))
    placed = _admit(c, first, memory)  # row 3 in flight in the only slot
    second = c.query(np.array([9]))  # the policy lets row 3 go for row 9
    assert second.evicted.tolist() == [3]
    c.finish(second, _admit(c, second, memory))  # no slot for row 9 yet; row 3 marked let go
    c.finish(first, placed)
    assert c.held_rows().size == 0 and c.table.free_count == 1 and c.problems() == []
    assert c.policy.contains(np.array([3, 9])).tolist() == [False, True]
