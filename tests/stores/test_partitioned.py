"""``PartitionedStore``: this partition's rows from the local store, every other from the remote one, in the order
asked, with the remote asked on every read (a collective needs every rank at every step)."""

import numpy as np
import pytest
import torch

from directload.stores import FeatureStore, PartitionedStore, ReadFuture, TensorStore
from directload.stores.partitioned import check_bounds


class Asked(TensorStore):
    """A table that lists the ids it was asked for."""

    def __init__(self, table, fail=None):
        super().__init__(table)
        self.asked, self._fail = [], fail

    def _read_async(self, index, out, run_device, out_device):
        self.asked.append(index.tolist())
        if self._fail is not None:
            fail = self._fail
            return ReadFuture(run=lambda: (_ for _ in ()).throw(fail))
        return super()._read_async(index, out, run_device, out_device)


@pytest.mark.parametrize("dtype, row", [(torch.float32, (11,)), (torch.float16, (1,)), (torch.int8, (3, 4))])
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
def test_reads_equal_the_table_for_any_mix_of_local_and_remote_ids(dtype, row, index_dtype):
    table = (torch.arange(50 * int(np.prod(row))) % 113).to(dtype).view(50, *row)
    bounds = [0, 17, 17, 40, 50]  # an empty partition too
    for part in range(4):
        lo, hi = bounds[part], bounds[part + 1]
        store = PartitionedStore(TensorStore(table[lo:hi].clone()), TensorStore(table), bounds, part=part)
        for ids in ([], [3, 3, 49, 17, 20, 0], list(range(lo, hi)), [49, 49]):
            got = store.read(torch.tensor(ids, dtype=index_dtype))
            assert got.dtype == dtype and got.device.type == "cpu" and torch.equal(got, table[ids])
        out = torch.full((3, *row), 7).to(dtype)
        assert store.read([0, 45, 20], out=out) is out and torch.equal(out, table[[0, 45, 20]])


def test_the_remote_is_asked_on_every_read_and_only_for_other_partitions_rows():
    table = torch.arange(20.0).view(10, 2)
    remote = Asked(table)
    store = PartitionedStore(TensorStore(table[3:6].clone()), remote, [0, 3, 6, 10], part=1)
    store.read([4, 5])
    store.read([1, 4, 9])
    store.read([])
    assert remote.asked == [[], [1, 9], []]
    s = store.stats()["partitioned"]
    assert (s["rows"], s["local_rows"], s["remote_rows"], s["remote_bytes"]) == (5, 3, 2, 16)
    assert s["part"] == 1


def test_a_failed_local_read_still_waits_for_the_remote_one():
    table = torch.arange(20.0).view(10, 2)
    remote = Asked(table)
    local = Asked(table[0:5].clone(), fail=OSError("disk gone"))
    store = PartitionedStore(local, remote, [0, 5, 10], part=0)
    with pytest.raises(OSError, match="disk gone"):
        store.read([1, 7])
    assert remote.asked == [[7]]


def test_prefetch_reaches_the_local_store_with_local_offsets():
    class Hinted(TensorStore):
        hints = []

        def _prefetch(self, index):
            self.hints.append(index.tolist())

    table = torch.arange(20.0).view(10, 2)
    store = PartitionedStore(Hinted(table[5:].clone()), TensorStore(table), [0, 5, 10], part=1)
    store.prefetch([1, 6, 9])
    assert Hinted.hints == [[1, 4]]


@pytest.mark.parametrize("kw, err, match", [
    (dict(bounds=[0, 5, 9], part=0), ValueError, "bounds end at 9, but the table has 10 rows"),
    (dict(bounds=[1, 5, 10], part=0), ValueError, "must start at 0"),
    (dict(bounds=[0, 6, 5, 10], part=0), ValueError, "never decrease"),
    (dict(bounds=[0.0, 10.0], part=0), TypeError, "at least 2 integers"),
    (dict(bounds=[0, 5, 10], part=2), ValueError, "part must be a partition in \\[0, 2\\)"),
    (dict(bounds=[0, 5, 10], part=True), ValueError, "part must be a partition"),
    (dict(bounds=[0, 4, 10], part=0), ValueError, "partition 0 owns 4 rows \\(0:4\\), but the local store has 5"),
])
def test_bad_partitions_are_refused_before_any_read(kw, err, match):
    table = torch.arange(20.0).view(10, 2)
    with pytest.raises(err, match=match):
        PartitionedStore(TensorStore(table[:5].clone()), TensorStore(table), **kw)


def test_stores_of_other_rows_or_not_stores_are_refused():
    table = torch.arange(20.0).view(10, 2)
    with pytest.raises(TypeError, match="remote must be a directload FeatureStore"):
        PartitionedStore(TensorStore(table[:5]), table, [0, 5, 10], part=0)
    with pytest.raises(ValueError, match="differ from the remote ones"):
        PartitionedStore(TensorStore(table[:5].double()), TensorStore(table), [0, 5, 10], part=0)
    store = PartitionedStore(TensorStore(table[:5]), TensorStore(table), [0, 5, 10], part=0)
    with pytest.raises(IndexError):
        store.read([10])
    assert isinstance(store, FeatureStore) and check_bounds(np.array([0, 10], np.uint8)).dtype == np.int64
