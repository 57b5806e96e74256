"""One node budget shared by every loader on the node: max-min fair shares, never more held than the budget,
a killed loader's share reclaimed within the poll, refusals before anything is taken, nothing left behind."""

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest
import torch
from conftest import random_table

from directload.budget import PREFIX, BudgetError, NodeBudget, Resources, fair_shares
from directload.stores import HostCache, TensorStore


@pytest.fixture
def where(tmp_path):
    return str(tmp_path)


def _left(where):
    return [e for e in os.listdir(where) if e.startswith(PREFIX)]


@pytest.mark.parametrize("budget,wants,leasts,expect", [
    (100, [80, 80], [0, 0], [50, 50]),
    (100, [80, 30], [0, 0], [70, 30]),
    (100, [80, 80, 10], [0, 0, 0], [45, 45, 10]),
    (100, [80, 30], [60, 0], [70, 30]),
    (101, [80, 80], [0, 0], [51, 50]),
    (10, [80, 80, 80], [3, 3, 3], [4, 3, 3]),
    (0, [5, 5], [0, 0], [0, 0]),
    (100, [], [], []),
])
def test_fair_shares(budget, wants, leasts, expect):
    got = fair_shares(budget, wants, leasts)
    assert got == expect
    assert sum(got) <= budget


def test_two_loaders_split_then_one_takes_all_back(where):
    budget = NodeBudget("t2", host_bytes=1000, pinned_bytes=100, io_depth=64, directory=where)
    a = budget.join(Resources(800, 80, 64))
    assert a.current == Resources(800, 80, 64)
    b = budget.join(Resources(800, 80, 64))
    # b grows only into what a does not hold yet; a shrinks at its next look, then b grows
    assert b.current == Resources(200, 20, 0)
    assert a.refresh() == Resources(500, 50, 32)
    assert b.refresh() == Resources(500, 50, 32)
    a.leave()
    assert b.refresh() == Resources(800, 80, 64)
    b.leave()
    assert _left(where) == []


def test_leave_is_idempotent_and_a_left_share_refuses_refresh(where):
    budget = NodeBudget("idem", host_bytes=10, directory=where)
    with budget.join(Resources(5)) as share:
        assert share.current.host_bytes == 5
    share.leave()
    with pytest.raises(BudgetError, match="given back"):
        share.refresh()
    assert _left(where) == []


def test_held_never_exceeds_the_budget_as_loaders_come_and_go(where, rng):
    budget = NodeBudget("churn", host_bytes=997, io_depth=31, directory=where)
    shares = []
    for _ in range(60):
        if shares and (len(shares) >= 5 or rng.random() < 0.4):
            shares.pop(int(rng.integers(len(shares)))).leave()
        else:
            want = Resources(int(rng.integers(1, 900)), 0, int(rng.integers(0, 40)))
            least = Resources(min(want.host_bytes, int(rng.integers(0, 50))))
            shares.append(budget.join(want, least=least))
        for _ in range(2):  # one look each shrinks everyone to their share, a second grows them into it
            for s in rng.permutation(len(shares)):
                shares[s].refresh()
                held = sum((x.current for x in shares), Resources())
                assert held.host_bytes <= 997 and held.io_depth <= 31
        expect = fair_shares(997, [s.want.host_bytes for s in shares], [s.least.host_bytes for s in shares])
        assert [s.current.host_bytes for s in shares] == expect
        for s in shares:
            assert s.least.host_bytes <= s.current.host_bytes <= s.want.host_bytes
    for s in shares:
        s.leave()
    assert _left(where) == []


def test_a_least_that_does_not_fit_is_refused_before_anything_is_taken(where):
    budget = NodeBudget("full", host_bytes=100, directory=where)
    a = budget.join(Resources(100), least=Resources(70))
    with pytest.raises(BudgetError, match="has 100 of host_bytes; this loader needs at least 40 .* keep 70"):
        budget.join(Resources(50), least=Resources(40))
    assert sorted(os.listdir(budget.path)) == ["limits.json", "lock", next(
        e for e in os.listdir(budget.path) if e.startswith("member-"))]
    a.leave()
    with pytest.raises(BudgetError, match="needs at least 101"):
        budget.join(Resources(101), least=Resources(101))
    assert _left(where) == []


def test_other_limits_under_the_same_name_are_refused(where):
    a = NodeBudget("same", host_bytes=100, directory=where).join(Resources(10))
    with pytest.raises(BudgetError, match="in use with limits"):
        NodeBudget("same", host_bytes=200, directory=where).join(Resources(10))
    a.leave()
    b = NodeBudget("same", host_bytes=200, directory=where).join(Resources(150))  # free again: new limits
    assert b.current.host_bytes == 150
    b.leave()
    assert _left(where) == []


@pytest.mark.parametrize("kwargs,error", [
    ({"name": "../up"}, ValueError), ({"name": ""}, ValueError), ({"name": 3}, ValueError),
    ({"host_bytes": -1}, ValueError), ({"host_bytes": 1.5}, ValueError), ({"io_depth": True}, ValueError),
    ({"poll": 0}, ValueError), ({"poll": "1"}, ValueError), ({"poll": True}, ValueError),
    ({"directory": "/nonexistent/directload"}, ValueError),
])
def test_bad_budgets_are_refused(where, kwargs, error):
    args = {"name": "ok", "host_bytes": 10, "directory": where} | kwargs
    with pytest.raises(error):
        NodeBudget(**args)
    assert _left(where) == []


def test_bad_joins_are_refused_before_anything_is_made(where):
    budget = NodeBudget("bad", host_bytes=10, directory=where)
    with pytest.raises(TypeError):
        budget.join(10)
    with pytest.raises(TypeError):
        budget.join(Resources(5), least=5)
    with pytest.raises(ValueError, match="more than want"):
        budget.join(Resources(5), least=Resources(6))
    with pytest.raises(TypeError, match="on_change"):
        budget.join(Resources(5), on_change=3)
    with pytest.raises(ValueError):
        Resources(host_bytes=-1)
    assert _left(where) == []


_MEMBER = textwrap.dedent("""
    import sys, time
    from directload.budget import NodeBudget, Resources
    share = NodeBudget("kill", host_bytes=1000, directory=sys.argv[1], poll=0.05).join(Resources(900))
    print(share.current.host_bytes, flush=True)
    time.sleep(600)
""")


def test_a_killed_loaders_share_returns_within_the_poll(where):
    child = subprocess.Popen([sys.executable, "-c", _MEMBER, where], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "900"
        seen = []
        share = NodeBudget("kill", host_bytes=1000, directory=where, poll=0.05).join(
            Resources(900), on_change=lambda r: seen.append(r.host_bytes))
        time.sleep(0.3)  # the child never looks again, so it keeps its 900: we get only what is left
        assert share.current.host_bytes == 100
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    killed = time.monotonic()
    while share.current.host_bytes != 900 and time.monotonic() - killed < 60:  # a hang guard, not a budget
        time.sleep(0.01)
    assert share.current.host_bytes == 900  # the next poll took it back
    assert seen[-1] == 900
    share.leave()
    assert _left(where) == []


def test_a_failing_on_change_is_reported_not_lost(where):
    budget = NodeBudget("boom", host_bytes=100, directory=where, poll=0.02)
    calls = []

    def on_change(r):
        calls.append(r)
        if len(calls) > 1:
            raise OSError("cannot resize")

    a = budget.join(Resources(100), on_change=on_change)
    b = budget.join(Resources(100))  # a must shrink to 50 at its next look: its on_change fails
    deadline = time.monotonic() + 5
    while a._error is None and time.monotonic() < deadline:
        time.sleep(0.01)
    with pytest.raises(BudgetError, match="cannot resize"):
        a.refresh()
    with pytest.raises(BudgetError, match="cannot resize"):
        a.leave()
    b.leave()
    assert _left(where) == []


def test_shares_drive_host_caches_without_a_wrong_row(where, rng):
    """Two caches on one budget: as the second joins and the first leaves, each cache is resized to its share
    by the watcher while a reader reads; every row stays right and the capacities always fit the budget."""
    table = random_table(rng, 4000, 8, torch.float32)  # 32 B rows
    row = 32
    budget = NodeBudget("caches", host_bytes=3000 * row, directory=where, poll=0.02)
    caches = [HostCache(TensorStore(table), 3000 * row, "lru", staging_bytes=64 * row) for _ in range(2)]
    errors, stop = [], threading.Event()

    def reader(cache, seed):
        r = torch.Generator().manual_seed(seed)
        try:
            while not stop.is_set():
                ids = torch.randint(0, 4000, (256,), generator=r)
                if not torch.equal(cache.read_async(ids).wait(), table[ids]):
                    errors.append("a wrong row")
        except Exception as exc:
            errors.append(exc)

    threads = [threading.Thread(target=reader, args=(c, i)) for i, c in enumerate(caches)]
    for t in threads:
        t.start()
    try:
        a = budget.join(Resources(3000 * row), on_change=lambda r: caches[0].resize(r.host_bytes))
        assert caches[0].capacity_rows == 3000
        b = budget.join(Resources(3000 * row), on_change=lambda r: caches[1].resize(r.host_bytes))
        deadline = time.monotonic() + 10
        while (caches[0].capacity_rows, caches[1].capacity_rows) != (1500, 1500) and time.monotonic() < deadline:
            assert caches[0].capacity_rows + caches[1].capacity_rows <= 3000
            time.sleep(0.005)
        assert (caches[0].capacity_rows, caches[1].capacity_rows) == (1500, 1500)
        a.leave()
        while caches[1].capacity_rows != 3000 and time.monotonic() < deadline:
            time.sleep(0.005)
        assert caches[1].capacity_rows == 3000
        b.leave()
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert errors == []
    assert _left(where) == []


def test_a_budget_whose_loaders_were_all_killed_is_swept_by_the_next_join(where):
    script = _MEMBER.replace('"kill"', '"orphan"')
    child = subprocess.Popen([sys.executable, "-c", script, where], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "900"
        live = NodeBudget("other", host_bytes=10, directory=where).join(Resources(5))
        assert sorted(_left(where)) == [PREFIX + "orphan", PREFIX + "other"]  # its loader lives: kept
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    assert PREFIX + "orphan" in _left(where)  # nobody looked since
    again = NodeBudget("third", host_bytes=10, directory=where).join(Resources(5))
    assert sorted(_left(where)) == [PREFIX + "other", PREFIX + "third"]  # the orphan went, the live one stayed
    live.leave()
    again.leave()
    assert _left(where) == []


def test_the_budgets_public_names_import_from_directload_budget_as_before():
    import directload.budget as budget
    from directload.budget import node, registry, resources, share

    assert sorted(budget.__all__) == sorted(["NodeBudget", "Share", "Resources", "BudgetError", "BudgetTimeout",
                                             "PREFIX", "fair_shares", "sweep"])
    homes = {"NodeBudget": node, "Share": share, "Resources": resources, "BudgetError": resources,
             "BudgetTimeout": resources, "PREFIX": registry, "fair_shares": resources, "sweep": registry}
    assert all(getattr(budget, name) is getattr(home, name) for name, home in homes.items())
    assert issubclass(budget.NodeBudget, registry.NodeRegistry)
