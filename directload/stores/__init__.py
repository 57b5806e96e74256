"""Feature stores: one contract (:class:`FeatureStore`) over every place rows live.

* :class:`TensorStore`: a tensor in memory (plain, pinned, unified or on a GPU).
* :class:`DiskStore`: a ``.npy`` file on an SSD, read with io_uring and O_DIRECT.
* :class:`HostCache`, :class:`DeviceCache`: caches in front of a slower store, with read-ahead.
* :class:`TieredStore`: device cache -> host cache -> disk from one call.

:func:`write_disk_store` writes a table (array, tensor, ``.npy`` file or
dataset) as a disk store with checksums, and :func:`verify` checks them.
"""

from .base import ClosedError, FeatureStore, ReadFuture, check_table, read_devices
from .cache import DeviceCache, HostCache, make_policy
from .disk import DirectIOWarning, DiskStore, io_path
from .disk_format import read_layout, verify
from .disk_write import write_disk_store
from .packing import access_counts, hot_order, renumber
from .tensor import TensorStore
from .tiered import TieredStore

__all__ = ["FeatureStore", "ReadFuture", "TensorStore", "DiskStore", "DirectIOWarning", "ClosedError",
           "write_disk_store", "verify", "read_layout", "read_devices", "check_table", "io_path",
           "HostCache", "DeviceCache", "TieredStore", "make_policy",
           "access_counts", "hot_order", "renumber"]
