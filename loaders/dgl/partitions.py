"""DistDGL partitions published whole, and read as DGL writes them: :mod:`.partitions_write` writes a set and
publishes it as one generation at ``out`` (:mod:`directload.publish`), :mod:`.partitions_read` reads a set and
checks directload's record against DGL's config.  The names live there; this module names them as before.
"""

from .partitions_read import FORMAT, META, PartitionMismatchError, node_bounds, read_partitions, store_path
from .partitions_write import partition

__all__ = ["partition", "read_partitions", "store_path", "node_bounds", "PartitionMismatchError", "META", "FORMAT"]
