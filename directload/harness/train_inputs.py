"""What a training run's loaders read: the feature table in memory (timed, or mapped from its file) and the
disk and tiered stores over the dataset's feature files.  The frameworks' sides (:mod:`directload.harness.train_dgl`,
:mod:`directload.harness.train_pyg`) and :mod:`directload.harness.train` import it; it imports neither.
"""

import os
import time

import numpy as np
import torch

from directload.unified import host_of

__all__ = ["TimedTable", "DISK_FILE", "PACKED_FILE", "FEATURE_MODES", "feature_store", "disk_store",
           "memmap_features"]

DISK_FILE = "disk/node-feat.npy"
#: The disk store with its rows renumbered by hotness (``directload dataset pack``), hot rows first.
PACKED_FILE = "disk/node-feat.packed.npy"
#: Where directload's loader reads features: the dataset's table, its disk store, or tiers over the disk.
FEATURE_MODES = ("memory", "disk", "tiered")


class TimedTable(torch.Tensor):
    """A plain feature table that times the row gathers a framework's own loader makes on it.

    DGL's prefetcher and PyG's ``filter_data`` slice the table with
    ``index_select``; wrapping it measures that feature-gather time exactly,
    inside the framework's own loader.
    """

    seconds = 0.0
    _TIMED = {torch.Tensor.index_select, torch.index_select, torch.Tensor.__getitem__}

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        t0 = time.perf_counter()
        with torch._C.DisableTorchFunctionSubclass():
            out = func(*args, **(kwargs or {}))
        if func in cls._TIMED:
            TimedTable.seconds += time.perf_counter() - t0
        return out


def feature_store(dataset, cfg):
    """The store directload's loader reads features from for ``cfg``, or None (the table in memory):
    the disk store (``features="disk"``), or a :class:`~directload.stores.TieredStore` over it
    (``features="tiered"``, with ``cfg``'s cache budgets and policy), opened once per run."""
    if cfg.partitioned:
        store = getattr(dataset, "_partitioned_store", None)
        if store is None or store.closed:
            store = dataset._partitioned_store = partitioned_store(dataset, cfg)
        return store
    if cfg.features == "memory" or cfg.loader != "directload":
        return None
    disk = disk_store(dataset, packed=cfg.packed)
    if cfg.features == "disk":
        return disk
    store = getattr(dataset, "_tiered_store", None)
    if store is None or store.closed:
        from directload.stores import TieredStore

        device = torch.device(cfg.device)
        host, room = cfg.host_cache, None
        if cfg.node_budget:  # the cache starts empty and grows to the loader's share (up to --host-cache)
            table = disk.num_rows * disk.row_nbytes
            room, host = min(cfg.host_cache or table, table), 0
        store = TieredStore(disk, gpu_bytes=cfg.gpu_cache, host_bytes=host, staging_bytes=cfg.staging,
                            policy=cfg.policy, device=device if device.type == "cuda" else None,
                            host_room_bytes=room)
        if cfg.shared_hot:
            try:
                store = hot_rows_store(dataset, cfg, disk, store)
            except BaseException:
                store.close()
                raise
        dataset._tiered_store = store
    return store


def partitioned_store(dataset, cfg):
    """This rank's share of the features (1/world of the rows, contiguous: ``partition_bounds``) in its own
    store, in memory (a view of the memory-mapped table: only its pages are ever touched), on disk (a
    :class:`~directload.stores.DiskStore` over its rows of the dataset's disk store) or through a host cache
    (``features="tiered"``), with every other row fetched from its owner by all-to-all
    (:class:`~directload.stores.exchange.RowExchange`).  Every rank must call it, in the same order."""
    import torch.distributed as dist

    from directload.stores import DiskStore, PartitionedStore, TensorStore, TieredStore, read_layout
    from directload.stores.exchange import RowExchange, partition_bounds

    rank, world = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)
    bounds = partition_bounds(dataset.num_nodes, world)
    lo, hi = int(bounds[rank]), int(bounds[rank + 1])
    if cfg.features == "memory":
        local = TensorStore(host_of(dataset.feat)[lo:hi])
    else:
        path = disk_store(dataset).path  # its checks (and its one-line error when missing) first
        layout = read_layout(path)
        rows = dict(dtype=layout.dtype, shape=(hi - lo, *layout.shape[1:]),
                    offset=layout.data_offset + lo * layout.row_nbytes)  # this rank's rows of the file, raw
        local = DiskStore(path, **rows) if cfg.features == "disk" else \
            TieredStore(path, host_bytes=cfg.host_cache, staging_bytes=cfg.staging, policy=cfg.policy, **rows)
    try:
        remote = RowExchange(local, bounds)
    except BaseException:
        local.close()
        raise
    return PartitionedStore(local, remote, bounds, part=rank, own=True)


def hot_rows_store(dataset, cfg, disk, store):
    """``store`` behind the packed disk store's hottest ``cfg.shared_hot`` bytes of rows, held once per node in
    shared memory (:func:`directload.shared_table`): the first job on the node to get here reads them,
    every other one maps them.  The key names the budget, the dataset and the packed file's identity, so a
    repacked file never reuses an old copy."""
    from directload.shared import shared_table
    from directload.stores.hot import HotRowsStore

    n = min(cfg.shared_hot // disk.row_nbytes, disk.num_rows)
    hot = torch.as_tensor(disk.hot_ids()[:n])
    path = dataset.path / PACKED_FILE
    st = os.stat(path)
    key = f"{cfg.budget_name}-{dataset.name}-hot-{st.st_ino}-{st.st_mtime_ns}-{n}"
    # The packed file is a .npy whose first rows are the hot ones, in hot_ids' order: copied into shared
    # memory from a mapping of the file, a chunk at a time, never through a private copy of them all.
    rows = shared_table(key, lambda: np.load(path, mmap_mode="r", allow_pickle=False)[:n])
    return HotRowsStore(store, hot, rows, own=True)


def disk_store(dataset, packed=False):
    """The dataset's features as a :class:`~directload.stores.DiskStore` (``<dataset>/disk/node-feat.npy``,
    or with ``packed`` its copy renumbered by hotness), opened once per dataset object.
    ``directload dataset convert --to disk`` writes the first, ``directload dataset pack`` the second."""
    attr = "_packed_store" if packed else "_disk_store"
    store = getattr(dataset, attr, None)
    if store is None or store.closed:
        from directload.stores import DiskStore

        path = dataset.path / (PACKED_FILE if packed else DISK_FILE)
        if not path.exists():
            how = "dataset pack" if packed else "dataset convert --to disk"
            raise FileNotFoundError(f"{path} does not exist: write it with `directload {how} --name {dataset.name}`")
        store = DiskStore(path)
        setattr(dataset, attr, store)
    return store


def memmap_features(dataset):
    """The dataset's ``raw/node-feat.npy`` as ``np.load(mmap_mode="r")`` gives it, as a tensor: what a
    framework's loader reads out of core without directload (no copy; pages come and go with the page cache).

    The mapping is advised ``MADV_RANDOM``: the kernel's read-around on a page fault reads up to the disk's
    ``read_ahead_kb`` (8 MiB on the machines this was measured on) around each random row, which in a
    capped page cache evicts rows before they are used (measured: 100 GB read in 5 minutes without
    finishing one batch).  Random advice makes the baseline a careful user's, not a strawman.
    """
    import mmap
    import warnings

    from directload.datasets import FEATURE_FILE

    array = np.load(dataset.path / "raw" / FEATURE_FILE, mmap_mode="r")
    raw = getattr(array, "_mmap", None)
    if raw is not None and hasattr(mmap, "MADV_RANDOM"):
        raw.madvise(mmap.MADV_RANDOM)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        return torch.from_numpy(array)
