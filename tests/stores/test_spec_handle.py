"""open_store's handle: the stack as a store, owning its share of a node budget; it closes both on every path,
an error while opening included, and a forked child's close leaves the parent's share alone."""

import os

import pytest
import torch

from directload.budget import BudgetError
from directload.stores import (
    BudgetSpec,
    DiskStore,
    FeatureStore,
    StoreHandle,
    StoreSpec,
    TensorStore,
    open_store,
    walk,
    write_disk_store,
)
from directload.stores import handle as handle_module

TABLE = torch.arange(400 * 8, dtype=torch.float32).view(400, 8)  # 32 B rows


@pytest.fixture
def disk(tmp_path):
    return write_disk_store(TABLE.numpy(), tmp_path / "feat.npy", progress=False)


@pytest.fixture
def where(tmp_path):
    """A directory for this test's node budgets (never /dev/shm's)."""
    path = tmp_path / "budgets"
    path.mkdir()
    return path


def members(where):
    """The shares this test's budgets hold now."""
    return sorted(p.name for p in where.rglob("member-*.json"))


@pytest.fixture
def opened(monkeypatch):
    """Every stack open_store builds in this test, as built."""
    stacks = []
    build = handle_module._stack

    def record(spec):
        stacks.append(build(spec))
        return stacks[-1]

    monkeypatch.setattr(handle_module, "_stack", record)
    return stacks


def budgeted(disk, where, **budget):
    return StoreSpec(disk, host_bytes=100 * 32, staging_bytes=10 * 32, policy="lru",
                     budget=BudgetSpec(**{"host_bytes": 200 * 32, "name": "handle", "directory": str(where), **budget}))


def test_the_handle_is_the_stack_as_a_store(disk):
    with open_store(StoreSpec(disk, host_bytes=64 * 32, staging_bytes=0)) as store:
        assert isinstance(store, (StoreHandle, FeatureStore)) and store.share is None
        assert (store.shape, store.dtype, store.row_nbytes) == (store.store.shape, torch.float32, 32)
        ids = torch.tensor([399, 3, 3, 0])
        assert torch.equal(store.read(ids), TABLE[ids])
        assert torch.equal(store.read_async(ids, out=torch.empty(4, 8)).wait(), TABLE[ids])
        assert store.stats() == store.store.stats() and list(store.stats()) == ["host", "disk"]  # no tier of its own
        assert store.held_bytes() == store.store.held_bytes()
        store.reset_stats()
        assert store.store.stats()["host"]["rows"] == 0
    assert store.closed and all(s.closed for s in walk(store))


def test_close_gives_the_share_back_first_then_closes_the_stack_and_is_idempotent(disk, where, monkeypatch):
    store = open_store(budgeted(disk, where))
    share = store.share
    assert share is not None and share.current.host_bytes == 110 * 32 and len(members(where)) == 1
    assert store.store.tiers[0].capacity_rows == 100  # the share (its room and slots) sized the cache
    seen = []
    leave = share.leave
    monkeypatch.setattr(share, "leave", lambda: (seen.append(store.store.closed), leave()))
    store.close()
    store.close()
    assert seen == [False]  # once, while the stack was still open
    assert store.share is None and members(where) == [] and all(s.closed for s in walk(store))


def test_a_share_that_fails_to_leave_still_closes_the_stack(disk, where, monkeypatch):
    store = open_store(budgeted(disk, where))

    def fail():
        raise BudgetError("the registry is gone")

    monkeypatch.setattr(store.share, "leave", fail)
    with pytest.raises(BudgetError, match="the registry is gone"):
        store.close()
    assert store.closed and all(s.closed for s in walk(store))


def test_a_budget_that_cannot_take_the_stack_closes_what_was_opened(disk, where, opened):
    # its read-ahead slots (10 rows) are the least the stack needs: a budget of 5 rows cannot give them
    with pytest.raises(BudgetError, match="needs at least 320"):
        open_store(budgeted(disk, where, host_bytes=5 * 32))
    assert len(opened) == 1 and all(s.closed for s in walk(opened[0]))
    assert members(where) == []


def test_an_error_after_the_join_gives_the_share_back_and_closes_the_stack(disk, where, opened, monkeypatch):
    def refuse(*args, **kwargs):
        raise RuntimeError("no handle")

    monkeypatch.setattr(handle_module, "StoreHandle", refuse)
    with pytest.raises(RuntimeError, match="no handle"):
        open_store(budgeted(disk, where))
    assert len(opened) == 1 and all(s.closed for s in walk(opened[0]))
    assert members(where) == []  # the share was taken, and given back


def test_an_error_while_the_stack_opens_leaves_nothing_open(disk, tmp_path):
    # hot rows need a packed store: this one is not, so the tiers under them are closed again
    with pytest.raises(ValueError, match="knows no hot rows"):
        open_store(StoreSpec(disk, packed=True, host_bytes=64 * 32, staging_bytes=0,
                             budget=BudgetSpec(shared_hot_bytes=32, name=f"handle-{os.getpid()}")))
    with pytest.raises(FileNotFoundError):
        open_store(StoreSpec(tmp_path / "missing.npy", tiers=False))


def test_a_store_given_as_the_source_is_never_closed(disk, where):
    given = TensorStore(TABLE)
    with open_store(StoreSpec(given, tiers=False)) as store:
        assert store.store is given
    assert store.closed and not given.closed
    with pytest.raises(BudgetError):
        open_store(StoreSpec(given, host_bytes=64 * 32, staging_bytes=32 * 32,
                             budget=BudgetSpec(host_bytes=32, name="given", directory=str(where))))
    assert not given.closed and given.read([1]).tolist() == TABLE[[1]].tolist()


def test_a_forked_childs_close_leaves_the_parents_share(disk, where):
    store = open_store(budgeted(disk, where))
    before = members(where)
    pid = os.fork()
    if pid == 0:  # the child: its handle owns no share; closing it gives nothing back
        code = 1
        try:
            code = 0 if store.share is None else 2
            store.close()
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert members(where) == before and store.share is not None and not store.closed
    assert torch.equal(store.read([7]), TABLE[[7]])
    store.close()
    assert members(where) == []


def test_a_disk_store_alone_reads_and_counts_as_itself(disk):
    with open_store(StoreSpec(disk, tiers=False)) as store:
        assert type(store.store) is DiskStore
        store.read([1, 2])
        assert store.stats()["reads"] >= 1 and store.stats().tier == "disk"


def test_the_handle_declares_and_warms_as_its_stack_does(tmp_path, disk):
    from directload.stores import renumber

    counts = torch.zeros(400, dtype=torch.int64)
    counts[[7, 300, 42]] = torch.tensor([9, 8, 7])
    packed = renumber(disk, tmp_path / "packed.npy", counts.numpy(), progress=False)
    with open_store(StoreSpec(packed, packed=True, host_bytes=64 * 32, staging_bytes=0)) as store:
        assert store.capabilities == store.store.capabilities - {"resize"} and "warm" in store.capabilities
        assert "resize" in store.store.capabilities  # the stack's own: its sizes are the spec's and the share's
        assert store.warm() == {"host": 64}  # the stack's warm, the packed file's hottest rows first
        assert store.stats()["host"]["warmed_rows"] == 64
    with open_store(StoreSpec(disk, tiers=False)) as store:
        assert "warm" not in store.capabilities
        with pytest.raises(TypeError, match="has no cache to warm"):
            store.warm()
