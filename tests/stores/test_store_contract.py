"""Every store passes the ``FeatureStore`` contract (:mod:`directload.testing`, the suite a plug-in's tests
subclass too): the tensor and disk stores, both caches, the wrapper, tiered, hot-rows and partitioned stores, a
toy remote store and a RemoteStore plug-in (alone, under a cache, as a partition's remote), KVStoreRows, a row
exchange (alone and as a partitioned store's remote: collective, so neither stages) and a stack opened from a
StoreSpec."""

import gc
import tempfile

import torch
import torch.distributed as dist
from toy_remote import ToyRemote

from directload.stores import (
    DeviceCache,
    DiskStore,
    ExchangeError,
    HostCache,
    HotRowsStore,
    PartitionedStore,
    RowExchange,
    StoreSpec,
    TensorStore,
    TieredStore,
    WrapperStore,
    open_store,
    partition_bounds,
    write_disk_store,
)
from directload.stores.remote import KVStoreRows, RemoteStore
from directload.testing import ROWS, StoreContract


class TestTensorStore(StoreContract):
    def make(self, table, directory):
        return TensorStore(table)


class TestTensorStoreOfInt8(StoreContract):
    dtype = torch.int8

    def make(self, table, directory):
        return TensorStore(table)


def _written(table, directory):
    path = directory / "rows.npy"
    if not path.exists():
        write_disk_store(table, path, progress=False)
    return path


class TestDiskStore(StoreContract):
    def make(self, table, directory):
        return DiskStore(_written(table, directory))


class TestHostCache(StoreContract):
    def make(self, table, directory):  # a quarter of the rows: hits, misses and evictions
        return HostCache(TensorStore(table), capacity_bytes=table[:75].numel() * table.element_size())


class TestHostCacheWithReadAhead(StoreContract):
    def make(self, table, directory):
        rnb = table[0].numel() * table.element_size()
        return HostCache(DiskStore(_written(table, directory)), 75 * rnb, "lru", staging_bytes=60 * rnb)


class TestDeviceCache(StoreContract):
    def make(self, table, directory):  # its slots in host memory where CUDA does not run
        return DeviceCache(TensorStore(table), capacity_bytes=table[:75].numel() * table.element_size(),
                           device="cpu")


class TestTieredStore(StoreContract):
    def make(self, table, directory):  # a path: the tiered store opens its disk store and closes it
        rnb = table[0].numel() * table.element_size()
        return TieredStore(str(_written(table, directory)), gpu_bytes=30 * rnb, host_bytes=100 * rnb)


class TestHotRowsStore(StoreContract):
    def make(self, table, directory):
        hot = torch.tensor([0, 5, 17, 299])
        return HotRowsStore(TensorStore(table), hot, table[hot].clone(), own=True)


class TestHotRowsStoreOverATieredStore(StoreContract):
    def make(self, table, directory):  # it warms the caches behind it: it declares "warm"
        hot = torch.tensor([3, 1, 4])
        rnb = table[0].numel() * table.element_size()
        return HotRowsStore(TieredStore(TensorStore(table), host_bytes=50 * rnb, staging_bytes=0), hot,
                            table[hot].clone(), own=True)


class TestPartitionedStore(StoreContract):
    def make(self, table, directory):
        bounds = [0, 100, 200, 300]
        return PartitionedStore(TensorStore(table[100:200].clone()), TensorStore(table), bounds, part=1, own=True)


class TestToyRemote(StoreContract):
    def make(self, table, directory):
        return ToyRemote(table)


class TestHostCacheOverAToyRemote(StoreContract):
    def make(self, table, directory):  # a remote tier plugs in under a cache through the public contract alone
        return HostCache(ToyRemote(table), capacity_bytes=table[:50].numel() * table.element_size())


class DictRemote(RemoteStore):
    """The documented plug-in point for a remote tier: only ``_fetch``."""

    def __init__(self, rows):
        super().__init__(rows.shape[0], rows.shape[1:], rows.dtype)
        self._rows = {i: rows[i].clone() for i in range(rows.shape[0])}

    def _fetch(self, ids):
        return torch.stack([self._rows[int(i)] for i in ids])


class TestRemoteStore(StoreContract):
    def make(self, table, directory):
        return DictRemote(table)


class TestKVStoreRows(StoreContract):
    def make(self, table, directory):  # anything indexed as a DistTensor is
        return KVStoreRows(table.clone())


class TestPartitionedStoreOverARemoteStore(StoreContract):
    def make(self, table, directory):
        return PartitionedStore(TensorStore(table[100:200].clone()), DictRemote(table), [0, 100, 200, 300], part=1,
                                own=True)


class TestWrapperStore(StoreContract):
    def make(self, table, directory):  # the base of every composite, delegating everything
        return WrapperStore(TensorStore(table), own=True)


class TestAStackFromASpec(StoreContract):
    def make(self, table, directory):
        rnb = table[0].numel() * table.element_size()
        spec = StoreSpec(str(_written(table, directory)), gpu_bytes=30 * rnb, host_bytes=60 * rnb, staging_bytes=0,
                         policy="lru")
        return open_store(spec)


class OneRank(StoreContract):
    """A one-rank gloo job in this process, for the row exchange's tests."""

    __test__ = False
    forked_child_error = ExchangeError  # the group and the round thread stay with the parent

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls._where = tempfile.TemporaryDirectory()
        dist.init_process_group("gloo", init_method=f"file://{cls._where.name}/rendezvous", rank=0, world_size=1)

    @classmethod
    def tearDownClass(cls):
        dist.destroy_process_group()
        gc.collect()  # the groups' C++ objects freed here, never in a child a later test forks
        cls._where.cleanup()
        super().tearDownClass()


class TestRowExchange(OneRank):
    def make(self, table, directory):
        return RowExchange(TensorStore(table), partition_bounds(ROWS, 1), timeout=10, own=True)


class TestPartitionedStoreOverARowExchange(OneRank):
    def make(self, table, directory):  # the one rank owns every row: the exchange is read with no ids
        local = TensorStore(table)
        return PartitionedStore(local, RowExchange(local, [0, ROWS], timeout=10), [0, ROWS], part=0, own=True)
