"""StoreSpec and open_store: one check of how a store's parts go together, the spec as plain data, and the
stack it opens (the handle that owns it: tests/stores/test_spec_handle.py)."""

import os

import numpy as np
import pytest
import torch
import torch.distributed as dist

from directload.stores import (
    BudgetSpec,
    DiskOptions,
    DiskStore,
    HotRowsStore,
    PartitionedStore,
    PartitionSpec,
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
    (dict(source=3), TypeError, "source must be a path, a tensor, an EncodedTable or a FeatureStore, not int"),
    (dict(host_bytes=-1), ValueError, "host_bytes"),
    (dict(staging_bytes="lots"), ValueError, "staging_bytes"),
    (dict(policy="fifo"), ValueError, r"policy must be one of \('lookahead'"),
    (dict(packed=True), ValueError, "packed=True reads a packed disk store"),
    (dict(tiers=False, budget=BudgetSpec(host_bytes=100)), ValueError,
     "budget.host_bytes shares the host caches and disk queues of directload's tiered stores: it needs tiers=True"),
    (dict(budget=BudgetSpec(io_depth=8)), ValueError,
     "^budget.io_depth is shared within a node budget: give budget.host_bytes too$"),
    (dict(budget=BudgetSpec(io_depth=-1)), ValueError, "budget.io_depth must be an integer >= 0"),
    (dict(budget=BudgetSpec(name="a b")), ValueError, "^budget.name: a budget's name is letters"),
    (dict(partition=PartitionSpec(), budget=BudgetSpec(host_bytes=100)), ValueError,
     "^partition splits the rows among the ranks: it takes neither packed=True, budget.host_bytes nor "
     "budget.shared_hot_bytes$"),
    (dict(disk=DiskOptions(queue_depth=8)), TypeError, r"disk options \['queue_depth'\] apply to a path"),
    (dict(budget={"host_bytes": 1}), TypeError, "^budget must be a BudgetSpec, not dict$"),
])
def test_bad_specs_are_refused_in_one_line_naming_the_field(spec, error, match):
    with pytest.raises(error, match=match):
        StoreSpec(**{"source": TABLE, **spec}).check()
    with pytest.raises(error, match=match):
        open_store(StoreSpec(**{"source": TABLE, **spec}))  # nothing opened: the same check first


def test_the_caller_names_the_fields_and_shared_hot_rows_come_out_of_the_budget(disk):
    flags = {"budget.shared_hot_bytes": "--shared-hot", "budget.host_bytes": "--node-budget"}
    spec = StoreSpec(disk, packed=True, budget=BudgetSpec(shared_hot_bytes="4K", host_bytes="4K"))
    with pytest.raises(ValueError, match="^--shared-hot is taken out of --node-budget: it must be smaller$"):
        spec.check(names=lambda key: flags.get(key, key))
    with pytest.raises(ValueError, match="budget.shared_hot_bytes keeps the packed store's hottest rows once per "
                                         "node: it needs packed=True and tiers=True"):
        StoreSpec(disk, budget=BudgetSpec(shared_hot_bytes="4K")).check()


def test_a_spec_without_a_source_is_checked_as_far_as_it_goes_and_not_opened():
    spec = StoreSpec(host_bytes="1K", packed=True, budget=BudgetSpec(shared_hot_bytes="1K")).check()
    assert spec.source is None and spec.host_bytes == 1024 and spec.budget.shared_hot_bytes == 1024
    with pytest.raises(ValueError, match="^the spec names no source"):
        open_store(spec)


def test_a_checked_spec_holds_bytes_and_stays_frozen():
    spec = StoreSpec("feat.npy", gpu_bytes="1K", host_bytes="2K", staging_bytes="0", packed=True,
                     budget=BudgetSpec(host_bytes="1M", shared_hot_bytes="4K")).check()
    assert (spec.gpu_bytes, spec.host_bytes, spec.staging_bytes) == (1024, 2048, 0)
    assert (spec.budget.host_bytes, spec.budget.shared_hot_bytes) == (1 << 20, 4096)
    with pytest.raises(AttributeError):
        spec.host_bytes = 0
    with pytest.raises(AttributeError):
        spec.budget.host_bytes = 0


SPECS = [
    StoreSpec(),
    StoreSpec("feat.npy", tiers=False, disk=DiskOptions(queue_depth=8, engine="pread", direct=False)),
    StoreSpec("raw.bin", tiers=False, disk=DiskOptions(dtype=torch.uint8, shape=(10, 4), offset=128)),
    StoreSpec("feat.npy", gpu_bytes="1G", host_bytes=4096, staging_bytes=None, policy="s3fifo", device="cuda:1",
              packed=True, budget=BudgetSpec(host_bytes="8G", io_depth=64, name="node", shared_hot_bytes="1G",
                                             hot_key="node-ds", directory="/somewhere")),
    StoreSpec("feat.npy", partition=PartitionSpec(timeout=12.5), staging_bytes=0),
    StoreSpec("feat.int8.npy", codec="int8", host_bytes="1G"),
]


@pytest.mark.parametrize("spec", SPECS, ids=range(len(SPECS)))
def test_a_spec_round_trips_through_json(spec):
    import json

    data = json.loads(json.dumps(spec.to_dict()))  # JSON's types only
    assert StoreSpec.from_dict(data) == spec
    assert set(data) == {"source", "tiers", "gpu_bytes", "host_bytes", "staging_bytes", "policy", "device", "packed",
                         "budget", "partition", "disk", "codec", "decode"}


def test_what_is_not_data_is_refused_when_written_and_unknown_keys_when_read(disk):
    from directload.stores.policies import make_policy

    for spec, what in ((StoreSpec(TABLE), "Tensor"), (StoreSpec(TensorStore(TABLE)), "TensorStore"),
                       (StoreSpec(disk, policy=make_policy("lru", 4)), "policy")):
        with pytest.raises(TypeError, match=what):
            spec.to_dict()
    for data, bad in (({"host_cache": 1}, "'host_cache'"),
                      ({"budget": {"bytes": 1}}, "BudgetSpec has no field 'bytes'"),
                      ({"disk": {"dtype": "float99"}}, "no torch dtype")):
        with pytest.raises(TypeError, match=bad):
            StoreSpec.from_dict(data)
    assert StoreSpec.from_dict({"budget": {"name": "x"}}).budget == BudgetSpec(name="x")  # the rest at the defaults


def test_open_store_builds_the_stack_the_spec_describes(disk):
    with open_store(StoreSpec(disk, tiers=False, disk=DiskOptions(queue_depth=8))) as store:
        assert type(store.store) is DiskStore and torch.equal(store.read([3, 399]), TABLE[[3, 399]])
        assert store.stats()["queue_depth"] == 8  # the disk options reach the disk store
    with open_store(StoreSpec(disk, gpu_bytes=64 * 32, host_bytes=128 * 32, staging_bytes=0, policy="lru")) as store:
        assert [type(s).__name__ for s in walk(store)] == ["StoreHandle", "TieredStore", "DeviceCache", "HostCache",
                                                           "DiskStore"]
        assert torch.equal(store.read([5, 1, 5]), TABLE[[5, 1, 5]])
        disk_store = store.store.tiers[-1]
    assert disk_store.closed  # the spec opened it: the stack closes it
    given = TensorStore(TABLE)
    with open_store(StoreSpec(given, host_bytes=64 * 32)) as store:
        assert store.store.tiers[-1] is given
    assert not given.closed  # a given store is left open
    with open_store(StoreSpec(given, tiers=False)) as store:
        assert store.store is given
    assert not given.closed


def test_a_budgeted_spec_joins_its_budget_with_a_host_cache_grown_into_its_share(disk, tmp_path):
    budget = BudgetSpec(host_bytes="1M", name="spec-test", directory=str(tmp_path))
    with open_store(StoreSpec(disk, host_bytes=100 * 32, staging_bytes=0, budget=budget)) as store:
        host = store.store.tiers[0]
        assert host.tier == "host" and host.room_rows == 100 and store.share is not None
        assert host.capacity_rows == 100  # alone in the budget: its whole room
    with open_store(StoreSpec(TABLE, staging_bytes=0, budget=budget)) as store:
        assert store.store.tiers[0].room_rows == 400  # no host_bytes: room for the whole table


def test_shared_hot_rows_of_a_packed_source_are_held_once_and_read_right(disk, tmp_path):
    counts = np.zeros(400, np.int64)
    counts[[7, 300, 42]] = [9, 8, 7]
    packed = renumber(disk, tmp_path / "packed.npy", counts, progress=False)
    key = f"spec-test-{os.getpid()}"
    with open_store(StoreSpec(packed, packed=True, host_bytes=64 * 32, staging_bytes=0,
                              budget=BudgetSpec(shared_hot_bytes=3 * 32, name=key))) as store:
        assert isinstance(store.store, HotRowsStore) and store.store.hot_rows == 3
        ids = torch.tensor([300, 7, 1, 42, 399])
        assert torch.equal(store.read(ids), TABLE[ids])
        assert store.stats()["hot"]["hit_rows"] == 3


def test_a_partitioned_spec_reads_this_ranks_rows_from_its_own_store(disk, tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/rendezvous", rank=0, world_size=1)
    try:
        part = PartitionSpec(timeout=5)
        for spec in (StoreSpec(disk, partition=part, host_bytes=64 * 32, staging_bytes=0),
                     StoreSpec(disk, partition=part, tiers=False), StoreSpec(TABLE, partition=part)):
            with open_store(spec) as store:
                assert isinstance(store.store, PartitionedStore) and store.num_rows == 400
                assert torch.equal(store.read([399, 0]), TABLE[[399, 0]])
                assert isinstance(store.store.local, (TieredStore, DiskStore, TensorStore))
    finally:
        dist.destroy_process_group()


def test_the_flat_specs_keywords_still_make_the_same_spec_with_a_warning_naming_the_part():
    # The flat StoreSpec of the release before (budget_bytes=, shared_hot_bytes=, shared_key=, partitioned=,
    # disk_options=) keeps working: a user's code written for it makes the spec the parts make now.
    from directload.stores.spec import DeprecatedKeywordWarning

    with pytest.warns(DeprecatedKeywordWarning, match=r"budget_bytes= is budget=BudgetSpec\(host_bytes=...\)"):
        old = StoreSpec("feat.npy", host_bytes="1G", budget_bytes="2G", shared_hot_bytes="64M", shared_key="job",
                        partitioned=True, disk_options={"queue_depth": 16, "engine": "pread"})
    new = StoreSpec("feat.npy", host_bytes="1G", budget=BudgetSpec(host_bytes="2G", shared_hot_bytes="64M",
                                                                    hot_key="job"),
                    partition=PartitionSpec(), disk=DiskOptions(queue_depth=16, engine="pread"))
    assert old == new and old.to_dict() == new.to_dict()
    with pytest.warns(DeprecatedKeywordWarning):
        assert StoreSpec("feat.npy", partitioned=False) == StoreSpec("feat.npy")


def test_a_flat_keyword_beside_its_part_is_refused_naming_both():
    with pytest.raises(TypeError, match=r"^StoreSpec got budget_bytes= \(the flat spec's\) and budget=: give budget= "):
        StoreSpec("feat.npy", budget_bytes=5, budget=BudgetSpec())
    with pytest.raises(TypeError, match="DiskOptions has no field 'depth'"):
        StoreSpec("feat.npy", disk_options={"depth": 8})
