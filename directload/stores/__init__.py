"""Feature stores: one contract (:class:`FeatureStore`) over every place rows live.

* :class:`TensorStore`: a tensor in memory (plain, pinned, unified or on a GPU).
* :class:`DiskStore`: a ``.npy`` file on an SSD, read with io_uring and O_DIRECT.
* :class:`HostCache`, :class:`DeviceCache`: caches in front of a slower store, with read-ahead
  (:class:`CachedStore` over a :class:`~directload.stores.slotcache.SlotCache`).
* :class:`WrapperStore`: the base of every store in front of others; :func:`walk` visits a stack.
* :class:`DecodingStore`: decoded rows over a stack that carries codes (:mod:`directload.codecs`): every tier
  under it moves and holds the compressed rows, and only the last hop decodes.
* :class:`StoreSpec`: a stack described as data, checked once (its parts: :class:`DiskOptions`,
  :class:`BudgetSpec`, :class:`PartitionSpec`); :func:`open_store` opens it as a :class:`StoreHandle`, which owns
  the stack and its share of a node budget.
* :class:`TieredStore`: device cache -> host cache -> disk from one call.
* :class:`PartitionedStore`: a table split among machines or ranks, this one's rows from its own store and the
  rest from their owners (:class:`RowExchange`: all-to-all over ``torch.distributed``).

The tier contract: any store can sit under a cache, because a cache reads its misses through
:meth:`FeatureStore.stage` (rows staged as a :class:`Staged` flat tier), but one whose reads are collective
(a :class:`RowExchange`): each store declares what it can do (:attr:`FeatureStore.capabilities`, of
:data:`CAPABILITIES`: ``stage``, ``warm``, ``resize``).  Every store counts through
:meth:`FeatureStore.stats`, composed one way: its own counters (a :class:`Stats` record; :class:`CacheStats`
for a cache) and, for a store in front of others, its children's, as a :class:`TieredStats` by tier name.
:mod:`directload.testing` is the contract as a suite of tests any store's tests subclass.

:func:`write_disk_store` writes a table (array, tensor, ``.npy`` file or
dataset) as a disk store with checksums, and :func:`verify` checks them.
"""

from .base import CAPABILITIES, ClosedError, FeatureStore, check_table, read_devices
from .budgeted import join_budget
from .cache import Cache, CachedStore, DeviceCache, HostCache, WarmingBusyError
from .decoding import DecodingStore
from .disk import DiskStore
from .disk_format import read_layout, verify
from .disk_open import DirectIOWarning, io_path
from .disk_write import write_disk_store
from .exchange import ExchangeError, RowExchange
from .futures import ForkedReadError, ReadFuture
from .handle import StoreHandle, open_store
from .hot import HotRowsStore
from .packing import access_counts, hot_order, renumber
from .partitioned import PartitionedStore, partition_bounds
from .policies import POLICY_NAMES, make_policy
from .records import CacheStats, Staged, Stats, TieredStats
from .spec import BudgetSpec, DiskOptions, PartitionSpec, StoreSpec
from .tensor import TensorStore
from .tiered import TieredStore
from .wrapper import WrapperStore, walk

__all__ = ["FeatureStore", "CAPABILITIES", "ReadFuture", "TensorStore", "DiskStore", "DirectIOWarning", "ClosedError",
           "write_disk_store", "verify", "read_layout", "read_devices", "check_table", "io_path",
           "CachedStore", "Cache", "WrapperStore", "walk", "HostCache", "DeviceCache", "TieredStore", "make_policy",
           "POLICY_NAMES",
           "Staged", "Stats", "CacheStats", "TieredStats",
           "access_counts", "hot_order", "renumber", "join_budget", "HotRowsStore", "PartitionedStore",
           "RowExchange", "ExchangeError", "partition_bounds", "StoreSpec", "BudgetSpec", "PartitionSpec",
           "DiskOptions", "open_store", "StoreHandle", "ForkedReadError", "WarmingBusyError", "DecodingStore"]
