"""Stores that follow a node budget: the host cache and the disk's queue depth track the share, reads stay
right, the room a cache may grow into costs no memory until used, and bad input is refused up front."""

import json
import os

import numpy as np
import psutil
import pytest
import torch
from conftest import random_table

from directload.budget import BudgetError, NodeBudget, Resources
from directload.harness.cli import main
from directload.stores import DiskStore, HostCache, TensorStore, TieredStore, join_budget


@pytest.fixture
def table_file(tmp_path, rng):
    table = random_table(rng, 4000, 16, torch.float32)  # 64 B rows
    path = tmp_path / "t.npy"
    np.save(path, table.numpy())
    return table, path


def test_a_tiered_store_follows_its_share(tmp_path, table_file):
    table, path = table_file
    budget = NodeBudget("follow", host_bytes=3000 * 64, io_depth=48, directory=str(tmp_path))
    stores = [TieredStore(path, host_room_bytes=4000 * 64, staging_bytes=200 * 64, policy="lru", queue_depth=32)
              for _ in range(2)]
    try:
        a = join_budget(stores[0], budget)
        assert a.want == Resources(4200 * 64, 0, 32) and a.least == Resources(200 * 64, 0, 1)
        host_a, disk_a = stores[0].tiers[0], stores[0].tiers[-1]
        assert host_a.capacity_rows == 2800 and disk_a.stats()["io_depth"] == 32
        b = join_budget(stores[1], budget)
        a.refresh(), b.refresh()
        assert a.current == b.current == Resources(1500 * 64, 0, 24)
        assert host_a.capacity_rows == stores[1].tiers[0].capacity_rows == 1300
        assert disk_a.stats()["io_depth"] == 24
        for store in stores:
            for seed in range(5):
                ids = torch.from_numpy(np.random.default_rng(seed).choice(4000, 700, replace=False))
                store.prefetch(ids)
                got = store.read(ids)
                assert got.dtype == torch.float32 and got.device.type == "cpu"
                assert torch.equal(got, table[ids])
            assert store.tiers[0].stats()[store.tiers[0].tier]["rows"] > 0
        b.leave()
        a.refresh()
        assert host_a.capacity_rows == 2800 and disk_a.stats()["io_depth"] == 32
        a.leave()
    finally:
        for store in stores:
            store.close()
    assert not [e for e in os.listdir(tmp_path) if e.startswith("directload-budget-")]


def test_a_budget_below_one_batchs_read_ahead_room_is_refused(tmp_path, table_file):
    _, path = table_file
    budget = NodeBudget("small", host_bytes=100 * 64, directory=str(tmp_path))
    with TieredStore(path, host_bytes=0, host_room_bytes=1000 * 64, staging_bytes=200 * 64) as store:
        with pytest.raises(BudgetError, match="needs at least 12800"):
            join_budget(store, budget)
        assert store.tiers[0].capacity_rows == 0
    assert not [e for e in os.listdir(tmp_path) if e.startswith("directload-budget-")]


def test_a_closed_store_does_not_break_the_share(tmp_path, table_file):
    _, path = table_file
    budget = NodeBudget("closed", host_bytes=3000 * 64, directory=str(tmp_path))
    store = TieredStore(path, host_room_bytes=2000 * 64, staging_bytes=100 * 64)
    share = join_budget(store, budget)
    store.close()
    other = budget.join(Resources(3000 * 64))
    share.refresh()  # the closed store's cache is not resized, and nothing is raised
    share.leave()
    other.leave()


def test_bad_input_is_refused(tmp_path, table_file):
    table, path = table_file
    budget = NodeBudget("bad", host_bytes=100, directory=str(tmp_path))
    with pytest.raises(TypeError):
        join_budget(table, budget)
    with TensorStore(table) as plain:
        with pytest.raises(TypeError):
            join_budget(plain, "bad")
        with pytest.raises(ValueError, match="neither a host cache nor a disk store"):
            join_budget(plain, budget)
    with pytest.raises(ValueError, match="room_bytes"):
        HostCache(TensorStore(table), 640, room_bytes=64)
    with DiskStore(path) as disk:
        for bad in (0, -1, 1.5, True, "8"):
            with pytest.raises((ValueError, TypeError)):
                disk.set_io_depth(bad)
        assert disk.set_io_depth(1) == 1 and disk.stats()["io_depth"] == 1
        assert torch.equal(disk.read([5, 3999, 5]), table[[5, 3999, 5]])  # one read in flight still reads right


def test_room_to_grow_costs_no_memory_until_used(rng):
    """A host cache made with 256 MiB of room and no capacity touches none of it; growing into it does."""
    table = TensorStore(torch.zeros(1 << 16, 1024))  # 4 KiB rows, 256 MiB
    proc = psutil.Process()
    before = proc.memory_info().rss
    cache = HostCache(table, 0, "lru", room_bytes=(1 << 16) * 4096)
    try:
        assert cache.room_rows == 1 << 16 and cache.capacity_rows == 0
        assert proc.memory_info().rss - before < 32 << 20
        cache.resize(128 << 20)
        assert cache.capacity_rows == 1 << 15
        grown = proc.memory_info().rss - before
        assert grown > 100 << 20, f"grew {grown >> 20} MiB"
        ids = torch.from_numpy(rng.choice(1 << 16, 3000, replace=False))
        assert torch.equal(cache.read(ids), torch.zeros(3000, 1024))
    finally:
        cache.close()


@pytest.mark.ogb
def test_train_in_a_node_budget_reports_its_share(tmp_path, capsys):
    args = ["train", "--dataset", "synth-tiny", "--root", str(tmp_path), "--features", "tiered", "--loader",
            "directload", "--staging", "100K", "--node-budget", "300K", "--node-io-depth", "16", "--budget-name",
            f"test-{os.getpid()}", "--epochs", "2", "--fanouts", "4", "4", "--batch-size", "256", "--eval-nodes",
            "300", "--no-progress", "--out", str(tmp_path / "out")]
    assert main(args) == 0
    assert "node budget" in capsys.readouterr().out
    run = json.loads(next((tmp_path / "out").glob("*.json")).read_text())["runs"][0]
    b = run["budget"]
    assert b["limits"] == {"host_bytes": 300 << 10, "pinned_bytes": 0, "io_depth": 16}
    assert b["least"]["host_bytes"] == 800 * 128  # the read-ahead slots: 800 rows of 128 B
    assert len(b["epochs"]) == 2 and all(e["host_bytes"] <= 300 << 10 and e["io_depth"] == 16 for e in b["epochs"])
    host = run["epochs"][-1]["tiers"]["host"]
    assert 0 < host["capacity_rows"] * 128 <= (300 << 10) - b["least"]["host_bytes"]
    assert run["epochs"][-1]["tiers"]["disk"]["io_depth"] == 16
    assert not [e for e in os.listdir("/dev/shm") if e == f"directload-budget-test-{os.getpid()}"]


def test_node_budget_options_are_checked_before_any_work(tmp_path, capsys):
    for bad, says in ((["--node-budget", "1G"], "--features tiered"),
                      (["--features", "tiered", "--node-io-depth", "4"], "--node-budget too"),
                      (["--features", "tiered", "--node-budget", "1G", "--budget-name", "../x"], "name"),
                      (["--features", "tiered", "--node-budget", "1G", "--loader", "dgl", "--framework", "dgl"],
                       "--loader directload")):
        assert main(["train", "--root", str(tmp_path), "--no-progress", *bad]) == 1
        err = capsys.readouterr().err
        assert says in err and len(err.strip().splitlines()) == 1
    assert not list(tmp_path.iterdir())
