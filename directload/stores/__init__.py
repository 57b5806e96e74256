"""Feature stores: one contract (:class:`FeatureStore`) over every place rows live.

* :class:`TensorStore`: a tensor in memory (plain, pinned, unified or on a GPU).
* :class:`DiskStore`: a ``.npy`` file on an SSD, read with io_uring and O_DIRECT.
* :class:`HostCache`, :class:`DeviceCache`: caches in front of a slower store, with read-ahead.
* :class:`TieredStore`: device cache -> host cache -> disk from one call.
* :class:`PartitionedStore`: a table split among machines or ranks, this one's rows from its own store and the
  rest from their owners (:class:`RowExchange`: all-to-all over ``torch.distributed``).

The tier contract: any store can sit under a cache, because a cache reads its misses through
:meth:`FeatureStore.stage` (rows staged as a :class:`Staged` flat tier), and every store counts through
:meth:`FeatureStore.stats` (a :class:`Stats` record; :class:`CacheStats` for a cache, :class:`TieredStats`
for a tiered store).

:func:`write_disk_store` writes a table (array, tensor, ``.npy`` file or
dataset) as a disk store with checksums, and :func:`verify` checks them.
"""

from .base import ClosedError, FeatureStore, ReadFuture, check_table, read_devices
from .budgeted import join_budget
from .cache import POLICY_NAMES, Cache, DeviceCache, HostCache, make_policy
from .disk import DirectIOWarning, DiskStore, io_path
from .disk_format import read_layout, verify
from .disk_write import write_disk_store
from .exchange import ExchangeError, RowExchange, partition_bounds
from .hot import HotRowsStore
from .packing import access_counts, hot_order, renumber
from .partitioned import PartitionedStore
from .records import CacheStats, Staged, Stats, TieredStats
from .tensor import TensorStore
from .tiered import TieredStore

__all__ = ["FeatureStore", "ReadFuture", "TensorStore", "DiskStore", "DirectIOWarning", "ClosedError",
           "write_disk_store", "verify", "read_layout", "read_devices", "check_table", "io_path",
           "Cache", "HostCache", "DeviceCache", "TieredStore", "make_policy", "POLICY_NAMES",
           "Staged", "Stats", "CacheStats", "TieredStats",
           "access_counts", "hot_order", "renumber", "join_budget", "HotRowsStore", "PartitionedStore",
           "RowExchange", "ExchangeError", "partition_bounds"]
