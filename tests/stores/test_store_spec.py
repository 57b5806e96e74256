"""StoreSpec and open_store: one check of how a store's parts go together, and the stack it opens."""

import os

import numpy as np
import pytest
import torch
import torch.distributed as dist

from directload.stores import (
    DiskStore,
    HotRowsStore,
    PartitionedStore,
    StoreSpec,
    TensorStore,
    TieredStore,
    open_store,
    renumber,
    walk,
    write_disk_store,
)

TABLE = torch.arange(400 * 8, dtype=torch.float32).view(400, 8)  # 32 B rows


@pytest.fixture
def disk(tmp_path):
    return write_disk_store(TABLE.numpy(), tmp_path / "feat.npy", progress=False)


@pytest.mark.parametrize(("spec", "error", "match"), [
    (dict(source=3), TypeError, "source must be a path, a tensor or a FeatureStore, not int"),
    (dict(host_bytes=-1), ValueError, "host_bytes"),
    (dict(staging_bytes="lots"), ValueError, "staging_bytes"),
    (dict(policy="fifo"), ValueError, r"policy must be one of \('lookahead'"),
    (dict(packed=True), ValueError, "packed=True reads a packed disk store"),
    (dict(tiers=False, budget_bytes=100), ValueError, "budget_bytes shares the host caches of tiered stores"),
    (dict(partitioned=True, budget_bytes=100), ValueError, "partitioned=True splits the rows among the ranks"),
    (dict(disk_options={"queue_depth": 8}), TypeError, r"disk options \['queue_depth'\] apply to a path"),
])
def test_bad_specs_are_refused_in_one_line_naming_the_field(spec, error, match):
    with pytest.raises(error, match=match):
        StoreSpec(**{"source": TABLE, **spec}).check()
    with pytest.raises(error, match=match):
        open_store(StoreSpec(**{"source": TABLE, **spec}))  # nothing opened: the same check first


def test_the_caller_names_the_fields_and_shared_hot_rows_come_out_of_the_budget(disk):
    flags = {"shared_hot_bytes": "--shared-hot", "budget_bytes": "--node-budget"}
    spec = StoreSpec(disk, packed=True, shared_hot_bytes="4K", budget_bytes="4K")
    with pytest.raises(ValueError, match="^--shared-hot is taken out of --node-budget: it must be smaller$"):
        spec.check(names=lambda key: flags.get(key, key))
    with pytest.raises(ValueError, match="shared_hot_bytes keeps the packed source's hottest rows once per node: it "
                                         "needs packed=True and tiers=True"):
        StoreSpec(disk, shared_hot_bytes="4K").check()


def test_a_checked_spec_holds_bytes_and_stays_frozen():
    spec = StoreSpec(TABLE, gpu_bytes="1K", host_bytes="2K", staging_bytes="0").check()
    assert (spec.gpu_bytes, spec.host_bytes, spec.staging_bytes) == (1024, 2048, 0)
    with pytest.raises(AttributeError):
        spec.host_bytes = 0


def test_open_store_builds_the_stack_the_spec_describes(disk):
    with open_store(StoreSpec(disk, tiers=False)) as store:
        assert type(store) is DiskStore and torch.equal(store.read([3, 399]), TABLE[[3, 399]])
    with open_store(StoreSpec(disk, gpu_bytes=64 * 32, host_bytes=128 * 32, staging_bytes=0, policy="lru")) as store:
        assert [type(s).__name__ for s in walk(store)] == ["TieredStore", "DeviceCache", "HostCache", "DiskStore"]
        assert torch.equal(store.read([5, 1, 5]), TABLE[[5, 1, 5]])
        disk_store = store.tiers[-1]
    assert disk_store.closed  # the spec opened it: the stack closes it
    given = TensorStore(TABLE)
    with open_store(StoreSpec(given, host_bytes=64 * 32)) as store:
        assert store.tiers[-1] is given
    assert not given.closed  # a given store is left open


def test_a_budgeted_spec_starts_its_host_cache_empty_with_room_for_its_share(disk):
    with open_store(StoreSpec(disk, host_bytes=100 * 32, staging_bytes=0, budget_bytes="1M")) as store:
        host = store.tiers[0]
        assert host.tier == "host" and (host.capacity_rows, host.room_rows) == (0, 100)
    with open_store(StoreSpec(TABLE, staging_bytes=0, budget_bytes="1M")) as store:
        assert store.tiers[0].room_rows == 400  # no host_bytes: room for the whole table


def test_shared_hot_rows_of_a_packed_source_are_held_once_and_read_right(disk, tmp_path):
    counts = np.zeros(400, np.int64)
    counts[[7, 300, 42]] = [9, 8, 7]
    packed = renumber(disk, tmp_path / "packed.npy", counts, progress=False)
    key = f"spec-test-{os.getpid()}"
    with open_store(StoreSpec(packed, packed=True, host_bytes=64 * 32, staging_bytes=0, shared_hot_bytes=3 * 32,
                              shared_key=key)) as store:
        assert isinstance(store, HotRowsStore) and store.hot_rows == 3
        ids = torch.tensor([300, 7, 1, 42, 399])
        assert torch.equal(store.read(ids), TABLE[ids])
        assert store.stats()["hot"]["hit_rows"] == 3


def test_a_partitioned_spec_reads_this_ranks_rows_from_its_own_store(disk, tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/rendezvous", rank=0, world_size=1)
    try:
        for spec in (StoreSpec(disk, partitioned=True, host_bytes=64 * 32, staging_bytes=0),
                     StoreSpec(disk, partitioned=True, tiers=False), StoreSpec(TABLE, partitioned=True)):
            with open_store(spec) as store:
                assert isinstance(store, PartitionedStore) and store.num_rows == 400
                assert torch.equal(store.read([399, 0]), TABLE[[399, 0]])
                assert isinstance(store.local, (TieredStore, DiskStore, TensorStore))
    finally:
        dist.destroy_process_group()
