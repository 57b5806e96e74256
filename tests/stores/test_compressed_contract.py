"""Compressed stacks pass the ``FeatureStore`` contract (:mod:`directload.testing`): each reads back exactly the
reference decode of its codes (``expected``), as float32, through every tier that carries them: the tensor store
of an encoded table (decoded inside the gather), a disk store of codes, the host and device caches, a tiered
store, a row exchange and a partitioned store over it, and stacks opened from a ``StoreSpec(codec=...)``."""

import pytest
from test_store_contract import OneRank

from directload.codecs import codec, encode
from directload.stores import (
    DecodingStore,
    DeviceCache,
    DiskStore,
    HostCache,
    PartitionedStore,
    RowExchange,
    StoreSpec,
    TensorStore,
    TieredStore,
    open_store,
    write_disk_store,
)
from directload.testing import ROWS, StoreContract

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


class Compressed(StoreContract):
    """A contract over rows kept as ``codec_name``'s codes: reads give their reference decode."""

    __test__ = False
    codec_name = "int8"

    def expected(self, table):
        chosen = codec(self.codec_name)
        return chosen.decode(chosen.encode(table))

    def codes(self, table):
        return encode(table, self.codec_name).codes

    def written(self, table, directory):
        path = directory / "codes.npy"
        if not path.exists():
            write_disk_store(table, path, codec=self.codec_name, progress=False)
        return path

    def code_row(self, table):
        return codec(self.codec_name).row_bytes(table.shape[1])


class TestEncodedTensorStore(Compressed):
    def make(self, table, directory):
        return TensorStore(encode(table, self.codec_name))


class TestEncodedTensorStoreOfHalves(TestEncodedTensorStore):
    codec_name = "float16"


class TestDecodingDiskStore(Compressed):
    def make(self, table, directory):
        return DecodingStore(DiskStore(self.written(table, directory)), self.codec_name, own=True)


class TestDecodingHostCacheOverDisk(Compressed):
    codec_name = "bfloat16"

    def make(self, table, directory):  # 75 code rows: hits, misses and evictions
        cache = HostCache(DiskStore(self.written(table, directory)), 75 * self.code_row(table), "lru",
                          staging_bytes=40 * self.code_row(table))
        return DecodingStore(cache, self.codec_name, own=True)


class TestDecodingDeviceCache(Compressed):
    def make(self, table, directory):
        cache = DeviceCache(TensorStore(self.codes(table)), capacity_bytes=75 * self.code_row(table), device="cpu")
        return DecodingStore(cache, self.codec_name, own=True)


class TestDecodingTieredStore(Compressed):
    def make(self, table, directory):
        rnb = self.code_row(table)
        return DecodingStore(TieredStore(str(self.written(table, directory)), gpu_bytes=30 * rnb, host_bytes=100 * rnb),
                             self.codec_name, own=True)


class TestASpecOverAnEncodedDiskStore(Compressed):
    def make(self, table, directory):  # the codec comes from the store's sidecar
        rnb = self.code_row(table)
        return open_store(StoreSpec(str(self.written(table, directory)), host_bytes=60 * rnb, staging_bytes=0))


class TestASpecEncodingATensor(Compressed):
    codec_name = "float16"

    def make(self, table, directory):
        return open_store(StoreSpec(table, codec=self.codec_name, host_bytes=60 * self.code_row(table)))


class TestASpecEncodingATensorWithoutTiers(Compressed):
    def make(self, table, directory):  # the stack itself: a handle over one store reports that store's stats
        handle = open_store(StoreSpec(table, codec=self.codec_name, tiers=False))
        self.addCleanup(handle.close)
        assert isinstance(handle.store, TensorStore) and handle.store.encoded is not None
        return handle.store


class TestDecodingPartitionedStoreOverARowExchange(Compressed, OneRank):  # OneRank: a one-rank gloo job
    def make(self, table, directory):  # the exchange and the partition move code rows
        local = TensorStore(self.codes(table))
        parted = PartitionedStore(local, RowExchange(local, [0, ROWS], timeout=10), [0, ROWS], part=0, own=True)
        return DecodingStore(parted, self.codec_name, own=True)
