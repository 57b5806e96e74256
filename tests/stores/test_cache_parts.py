"""The parts a cache is made of, each on its own: the slot table, the announced batches, the read-ahead worker
and the warming rounds."""

import threading

import numpy as np
import pytest
from conftest import within

from directload.stores.readahead import Announced, Worker
from directload.stores.slots import CACHED, FREE, INFLIGHT, NONE, READING, STAGED, SlotTable
from directload.stores.warming import Warming


def test_slot_table_claims_places_and_frees_and_never_gives_a_slot_twice():
    t = SlotTable(num_rows=50, slots=8)
    a = t.claim(5)
    assert a.dtype == np.int64 and sorted(a.tolist()) == [0, 1, 2, 3, 4] and t.free_count == 3
    t.place(np.array([10, 11, 12, 13, 14]), a, CACHED)
    b = t.claim(10)  # only 3 left
    assert b.shape == (3,) and not set(a.tolist()) & set(b.tolist()) and t.free_count == 0
    t.place(np.array([20, 21, 22]), b, STAGED, batch=7)
    assert t.count(CACHED) == 5 and t.count(STAGED) == 3 and t.staged_for[b].tolist() == [7, 7, 7]
    assert t.kind_of(np.array([a[0], -1, b[0]])).tolist() == [CACHED, FREE, STAGED]
    rows, slots = t.slotted(np.array([10, 30, 21]))
    assert rows.tolist() == [10, 21] and slots.tolist() == [a[0], b[1]]
    t.free_slots(np.array([10, 11]), a[:2])
    assert t.free_count == 2 and t.slot[[10, 11]].tolist() == [NONE, NONE] and t.count(CACHED) == 3


def test_a_pinned_slot_is_reused_only_after_its_reader_is_done():
    t = SlotTable(num_rows=10, slots=2)
    s = t.claim(2)
    t.place(np.array([1, 2]), s, CACHED)
    t.pin(s)
    t.free_slots(np.array([1, 2]), s)
    assert t.free_count == 0  # deferred: a reader still copies out of them
    t.pin(s[:1])
    t.unpin(s)
    assert t.free_count == 1  # s[1] is free, s[0] still has a reader
    t.unpin(s[:1])
    assert t.free_count == 2


def test_a_forked_childs_table_keeps_only_the_cached_rows():
    t = SlotTable(num_rows=10, slots=4)
    s = t.claim(3)
    t.place(np.array([1]), s[:1], CACHED)
    t.place(np.array([2]), s[1:2], STAGED, batch=0)
    t.place(np.array([3]), s[2:3], INFLIGHT, batch=0)
    t.slot[4] = READING
    t.pin(s[:1])
    t.keep_cached_only()
    assert t.slot[[1, 2, 3, 4]].tolist() == [s[0], NONE, NONE, NONE]
    assert t.free_count == 3 and t.count(CACHED) == 1 and t.pinned.sum() == 0


def test_announced_batches_match_reads_skip_the_unread_and_stay_bounded():
    a = Announced(100, limit=3)
    for rows in ([1, 2, 3], [3, 4], [5, 6], [7, 8]):
        j, dropped = a.add(np.array(rows))
    assert j == 3 and [e[0] for e in dropped] == [0] and len(a) == 3  # the oldest went
    assert a.until[3] == 1 and a.next_unread == 1
    entry, skipped = a.match(np.array([5, 6]))
    assert entry[0] == 2 and [e[0] for e in skipped] == [1] and a.next_unread == 3
    assert a.forget(skipped[0]).tolist() == [3, 4] and a.until[3] == -1
    assert a.still_wanted(np.array([7, 5])).tolist() == [True, False]
    assert a.match(np.array([50, 51])) == (None, [])  # no one announced it
    a.clear()
    assert len(a) == 0 and (a.until == -1).all()


def test_a_worker_runs_tasks_on_its_thread_and_reports_its_failure():
    seen, errors, stop = [], [], threading.Event()
    tasks = [3, 2, 1]
    main = threading.current_thread()

    def run(task):
        assert threading.current_thread() is not main
        if task == 3:
            raise OSError("task 3 failed")
        seen.append(task)

    w = Worker("t", lambda: tasks.pop(0) if tasks else None, run, stopped=stop.is_set, on_error=errors.append)
    within(10, lambda: w.join(10))
    assert not w.alive() and type(errors[0]) is OSError and seen == []  # the first task failed: it ended


def test_warming_runs_its_rounds_in_order_stops_when_closed_and_counts_its_time():
    log, seconds = [], []
    calls = iter([True, True, False])

    def claim(rows):
        return (rows, rows) if next(calls) else None  # the cache closes before the third round

    w = Warming(np.arange(10), round_rows=4, claim=claim, fill=lambda r, s: log.append(r.tolist()),
                settle=lambda r, s: None, on_seconds=seconds.append)
    w.run()
    assert log == [[0, 1, 2, 3], [4, 5, 6, 7]] and len(seconds) == 1 and seconds[0] >= 0


def test_a_background_warming_waits_for_the_one_below_and_reports_failures():
    gate, order, errors, ended = threading.Event(), [], [], []
    below = Warming(np.arange(2), round_rows=1, claim=lambda r: (r, r),
                    fill=lambda r, s: (gate.wait(10), order.append("below")), settle=lambda r, s: None)
    below.start(closed=lambda: False, on_error=errors.append, on_end=lambda: None)

    def fill(rows, slots):
        order.append("above")
        raise OSError("disk gone")

    above = Warming(np.arange(2), round_rows=2, claim=lambda r: (r, r), fill=fill, settle=lambda r, s: None)
    above.start(after=below, closed=lambda: False, on_error=errors.append, on_end=lambda: ended.append(1))
    assert above.alive() and order == []
    gate.set()
    above.join(10)
    assert order == ["below", "below", "above"] and type(errors[0]) is OSError and ended == [1]


@pytest.mark.parametrize("kind", [CACHED, STAGED])
def test_count_of_staged_slots_includes_those_in_flight(kind):
    t = SlotTable(num_rows=5, slots=3)
    s = t.claim(2)
    t.place(np.array([0]), s[:1], kind)
    t.place(np.array([1]), s[1:], INFLIGHT)
    assert t.count(STAGED) == (2 if kind == STAGED else 1)
