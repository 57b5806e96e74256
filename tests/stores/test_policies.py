"""Cache policies: hand-checked traces, invariants, and Belady's optimum bounding every policy."""

import numpy as np
import pytest

from directload.stores.policies import (
    LRU,
    POLICIES,
    S3FIFO,
    Clock,
    LookAhead,
    Sieve,
    belady,
    degree,
    presample,
    simulate,
)


def _zipf_trace(rng, rows=400, batches=40, per_batch=60, a=1.2):
    return [np.unique((np.minimum(rng.zipf(a, per_batch), rows) - 1 + rng.integers(0, 2, per_batch)) % rows)
            for _ in range(batches)]


def _run(policy, batches):
    return [policy.access(np.asarray(b)).tolist() for b in batches]


def test_lru_evicts_the_row_touched_longest_ago():
    p = LRU(2)
    assert _run(p, [[1], [2], [1], [3], [2], [1]]) == [[False], [False], [True], [False], [False], [False]]
    assert p.cached() == {2, 1}


def test_clock_gives_a_referenced_row_a_second_chance():
    p = Clock(2)
    assert _run(p, [[1, 2], [1], [3]]) == [[False, False], [True], [False]]
    assert p.cached() == {1, 3}  # 1 was referenced: the hand cleared it and took 2


def test_sieve_keeps_a_visited_row_and_evicts_the_next_unvisited_one():
    p = Sieve(3)
    _run(p, [[1, 2, 3], [1], [4]])
    assert p.cached() == {1, 3, 4}
    _run(p, [[5]])  # the hand goes on from where it stopped: 3 (unvisited) goes, not 1 (its bit was cleared)
    assert p.cached() == {1, 4, 5}


def test_s3fifo_filters_one_time_rows_that_flush_lru():
    hot = np.arange(5)
    batches = [np.concatenate([hot, 1000 + 6 * i + np.arange(6)]) for i in range(30)]
    s3, lru = simulate(S3FIFO(10), batches), simulate(LRU(10), batches)
    assert lru["hits"] == 0  # 11 rows a batch through 10 slots: each batch's new rows push the hot ones out
    assert s3["hits"] == 5 * 28  # the hot rows come back from the ghost queue into the main one, and stay


@pytest.mark.parametrize("capacity", [0, 7, 40, 120, 400])
def test_belady_bounds_every_policy_and_every_cache_stays_within_capacity(rng, capacity):
    batches = _zipf_trace(rng)
    opt = simulate(belady(capacity), batches, lookahead=None)
    for make in [*POLICIES.values(), lambda c: LookAhead(c)]:
        p = make(capacity)
        got = simulate(p, batches, lookahead=3)
        assert got["hits"] <= opt["hits"], (p.name, got, opt)
        assert len(p.cached()) <= capacity
    unique = len(np.unique(np.concatenate(batches)))
    accesses = sum(len(b) for b in batches)
    if capacity == 0:
        assert opt["hits"] == 0
    if capacity >= unique:  # only the first read of each row misses
        assert opt["misses"] == unique and opt["accesses"] == accesses


def test_lookahead_with_the_whole_epoch_is_belady_and_gains_with_its_window(rng):
    batches = _zipf_trace(rng)
    assert simulate(LookAhead(40), batches, lookahead=None)["hits"] == simulate(belady(40), batches,
                                                                                lookahead=None)["hits"]
    # no window: LRU, except that a row the current batch reads is never evicted for another of its rows
    assert simulate(LookAhead(40), batches, lookahead=0)["hits"] >= simulate(LRU(40), batches)["hits"]
    more = [simulate(LookAhead(40), batches, lookahead=k)["hits"] for k in (0, 2, 8)]
    assert more[0] < more[-1]  # knowing the future pays


def test_static_policies_keep_the_top_scored_rows():
    p = degree(2, [5, 0, 9, 1])
    assert p.cached() == {0, 2} and p.access(np.array([2, 3, 0])).tolist() == [True, False, True]
    q = presample(2, [[1, 2], [2, 3], [2, 1]], num_rows=5)
    assert q.cached() == {1, 2} and q.name == "presample"


@pytest.mark.parametrize("bad, err", [(-1, ValueError), (1.5, ValueError), (True, ValueError)])
def test_bad_capacities_are_refused(bad, err):
    with pytest.raises(err, match="capacity"):
        LRU(bad)


def test_a_batch_must_be_distinct_integer_ids():
    with pytest.raises(ValueError, match="distinct"):
        LRU(3).access(np.array([1, 1]))
    with pytest.raises(TypeError, match="integer"):
        Sieve(3).access(np.array([1.0]))


def test_the_page_baseline_reads_whole_pages_and_prefetches_what_followed_last_time():
    from directload.stores.policies import Correlation

    p = Correlation(100, row_bytes=512, page_bytes=4096, degree=1)  # 100 rows of cache = 12 pages of 8 rows
    got = simulate(p, [np.arange(0, 20)])  # a scan: the first row of each page misses
    assert got["hits"] == 17 and got["fetched_bytes"] == 3 * 4096
    q = Correlation(24, row_bytes=512, page_bytes=4096, degree=1)  # 3 pages
    # faults on page 12 then page 62; later page 12 faults again and brings page 62 with it
    r = simulate(q, [[100], [500], [200], [300], [400], [100], [500]])
    assert r["hits"] == 1 and {496, 500, 503} <= q.cached()
    none = simulate(Correlation(0, row_bytes=400), [[1, 2, 3]])
    assert none["hits"] == 0 and none["fetched_bytes"] == 3 * 400
    with pytest.raises(ValueError, match="row_bytes"):
        Correlation(10, row_bytes=0)


def test_measured_batches_leave_the_warm_up_out():
    batches = [[1, 2], [1, 2], [3]]
    assert simulate(LRU(2), batches, measure_from=1) == {"policy": "lru", "accesses": 3, "hits": 2, "misses": 1,
                                                         "hit_rate": 2 / 3}


def test_lookahead_falls_back_to_frequency_when_asked_and_refuses_other_orders():
    # with no window, rows compete by how often they were read (frequency) or how lately (recency)
    rec, freq = LookAhead(1), LookAhead(1, fallback="frequency")
    simulate(rec, [[1], [1], [1], [2]], lookahead=0)
    simulate(freq, [[1], [1], [1], [2]], lookahead=0)
    assert rec.cached() == {2} and freq.cached() == {1}
    p = LookAhead(2, fallback="frequency")
    for b in [[1], [1], [1], [2], [4]]:
        p.access(np.array(b))
    assert p.cached() == {1, 4}  # 2 (one read) goes before 1 (three), though 1 was read longer ago
    q = LookAhead(2)
    for b in [[1], [1], [1], [2], [4]]:
        q.access(np.array(b))
    assert q.cached() == {2, 4}  # recency keeps the most recent
    with pytest.raises(ValueError, match="fallback"):
        LookAhead(3, fallback="size")


@pytest.mark.parametrize("make", [LRU, Clock, Sieve, S3FIFO, LookAhead])
def test_warm_admits_while_there_is_room_evicts_nothing_and_counts_no_access(make):
    p = make(10)
    p.access(np.array([1, 2, 3]))
    got = p.warm(np.array([3, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29]))
    assert got.tolist() == [True] * 8 + [False] * 3  # 3 already held, then room for 7 of the rest
    assert len(p.take_evicted()) == 0 and len(p.cached()) == 10
    assert p.warm(np.array([40, 41])).tolist() == [False, False]  # full: nothing goes for them
    assert p.access(np.array([1, 20, 26])).all()  # warmed rows hit like any cached row


def test_a_static_policy_warms_only_the_rows_it_keeps():
    p = degree(3, np.array([0, 9, 1, 8, 7]))
    assert p.warm(np.array([0, 1, 3])).tolist() == [False, True, True]
    assert p.cached() == {1, 3, 4}


def test_lookahead_with_slack_frees_room_ahead_so_the_next_misses_need_no_pass():
    p = LookAhead(64, slack=8)
    p.access(np.arange(64))
    assert len(p.take_evicted()) == 0
    p.access(np.arange(100, 102))  # full: one pass keeps 56, the two newest among them
    gone = p.take_evicted()
    assert len(gone) == 10 and len(p.cached()) == 56 and {100, 101} <= p.cached()
    assert set(gone.tolist()) == set(range(10))  # the least recently used first
    p.access(np.arange(200, 208))  # fits in the room the pass left: nothing goes
    assert len(p.take_evicted()) == 0 and len(p.cached()) == 64
    for bad in (-1, 64, 1.5, True):
        with pytest.raises(ValueError):
            LookAhead(64, slack=bad)
    assert LookAhead(0).slack == 0


def test_a_caches_lookahead_policy_keeps_slack_the_simulators_does_not():
    from directload.stores.policies import make_policy

    assert make_policy("lookahead", 3200).slack == 100 and make_policy("lookahead", 20).slack == 0
    assert belady(3200).slack == 0 and LookAhead(3200).slack == 0


def test_lookahead_warm_counts_no_access_and_keeps_the_most_wanted_longest():
    p = LookAhead(4, fallback="frequency")
    assert p.warm(np.array([7, 8, 9])).all()
    assert p._count[[7, 8, 9]].tolist() == [0, 0, 0]  # the frequency fallback saw no read
    p = LookAhead(4)
    p.warm(np.array([7, 8, 9]))
    p.access(np.array([1, 2]))  # one row must go: the least wanted warm row
    assert p.cached() == {1, 2, 7, 8}
