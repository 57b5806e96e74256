"""Every store passes the ``FeatureStore`` contract (tests/stores/contract.py): the tensor, disk and toy remote
stores, a RemoteStore plug-in and KVStoreRows, both caches, the wrapper, tiered, hot-rows and partitioned stores,
and a stack opened from a StoreSpec."""

import torch
from contract import StoreContract

from directload.stores import (
    DeviceCache,
    DiskStore,
    FeatureStore,
    HostCache,
    HotRowsStore,
    PartitionedStore,
    ReadFuture,
    StoreSpec,
    TensorStore,
    TieredStore,
    WrapperStore,
    open_store,
    write_disk_store,
)
from directload.stores.remote import KVStoreRows, RemoteStore


class TestTensorStore(StoreContract):
    def make(self, table, tmp_path):
        return TensorStore(table)


class TestTensorStoreOfInt8(StoreContract):
    dtype = torch.int8

    def make(self, table, tmp_path):
        return TensorStore(table)


def _written(table, tmp_path):
    path = tmp_path / "rows.npy"
    if not path.exists():
        write_disk_store(table, path, progress=False)
    return path


class TestDiskStore(StoreContract):
    def make(self, table, tmp_path):
        return DiskStore(_written(table, tmp_path))


class TestHostCache(StoreContract):
    def make(self, table, tmp_path):  # a quarter of the rows: hits, misses and evictions
        return HostCache(TensorStore(table), capacity_bytes=table[:75].numel() * table.element_size())


class TestDeviceCache(StoreContract):
    def make(self, table, tmp_path):  # its slots in host memory where CUDA does not run
        return DeviceCache(TensorStore(table), capacity_bytes=table[:75].numel() * table.element_size(),
                           device="cpu")


class TestTieredStore(StoreContract):
    def make(self, table, tmp_path):  # a path: the tiered store opens its disk store and closes it
        return TieredStore(str(_written(table, tmp_path)), host_bytes=table[:100].numel() * table.element_size())


class TestHotRowsStore(StoreContract):
    def make(self, table, tmp_path):
        hot = torch.tensor([0, 5, 17, 299])
        return HotRowsStore(TensorStore(table), hot, table[hot].clone(), own=True)


class TestPartitionedStore(StoreContract):
    def make(self, table, tmp_path):
        bounds = [0, 100, 200, 300]
        return PartitionedStore(TensorStore(table[100:200].clone()), TensorStore(table), bounds, part=1, own=True)


class ToyRemote(FeatureStore):
    """A remote tier as a plug-in writes one: the rows behind a call (here a dict), only ``_read_async``."""

    def __init__(self, rows):
        super().__init__()
        self._rows = {i: rows[i].clone() for i in range(rows.shape[0])}
        self._shape, self._dtype = tuple(rows.shape), rows.dtype

    @property
    def num_rows(self):
        return self._shape[0]

    @property
    def row_shape(self):
        return self._shape[1:]

    @property
    def dtype(self):
        return self._dtype

    def _read_async(self, index, out, run_device, out_device):
        rows = torch.stack([self._rows[int(i)] for i in index.cpu()]) if index.numel() else \
            torch.empty((0, *self._shape[1:]), dtype=self._dtype)
        if out is not None:
            out.copy_(rows)
            rows = out
        return ReadFuture(result=rows.to(out_device))


class TestToyRemote(StoreContract):
    def make(self, table, tmp_path):
        return ToyRemote(table)


class TestHostCacheOverAToyRemote(StoreContract):
    def make(self, table, tmp_path):  # a remote tier plugs in under a cache through the public contract alone
        return HostCache(ToyRemote(table), capacity_bytes=table[:50].numel() * table.element_size())


class DictRemote(RemoteStore):
    """The documented plug-in point for a remote tier: only ``_fetch``."""

    def __init__(self, rows):
        super().__init__(rows.shape[0], rows.shape[1:], rows.dtype)
        self._rows = {i: rows[i].clone() for i in range(rows.shape[0])}

    def _fetch(self, ids):
        return torch.stack([self._rows[int(i)] for i in ids])


class TestRemoteStore(StoreContract):
    def make(self, table, tmp_path):
        return DictRemote(table)


class TestKVStoreRows(StoreContract):
    def make(self, table, tmp_path):  # anything indexed as a DistTensor is
        return KVStoreRows(table.clone())


class TestPartitionedStoreOverARemoteStore(StoreContract):
    def make(self, table, tmp_path):
        return PartitionedStore(TensorStore(table[100:200].clone()), DictRemote(table), [0, 100, 200, 300], part=1,
                                own=True)


class TestWrapperStore(StoreContract):
    def make(self, table, tmp_path):  # the base of every composite, delegating everything
        return WrapperStore(TensorStore(table), own=True)


class TestAStackFromASpec(StoreContract):
    def make(self, table, tmp_path):
        spec = StoreSpec(str(_written(table, tmp_path)), gpu_bytes=table[:30].numel() * table.element_size(),
                         host_bytes=table[:60].numel() * table.element_size(), staging_bytes=0, policy="lru")
        return open_store(spec)
