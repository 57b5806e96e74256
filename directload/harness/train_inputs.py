"""What a training run's loaders read: the feature table in memory (timed, or mapped from its file) and the
disk and tiered stores over the dataset's feature files.  The frameworks' sides (:mod:`directload.harness.train_dgl`,
:mod:`directload.harness.train_pyg`) and :mod:`directload.harness.train` import it; it imports neither.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeAlias

import numpy as np
import torch

if TYPE_CHECKING:
    from directload.datasets import Dataset
    from directload.stores import DiskStore, FeatureStore, StoreSpec

    #: A run's configuration: a :class:`~directload.harness.train.TrainConfig` (or, in the options' check, the
    #: command line's options over its defaults).  train.py is a layer above the modules that read it
    #: (.importlinter, even for imports made only for the type checker), so they name it as this alias.
    RunConfig: TypeAlias = Any

__all__ = ["TimedTable", "DISK_FILE", "PACKED_FILE", "FEATURE_MODES", "feature_store", "store_spec", "spec_of",
           "feature_file", "disk_store", "memmap_features"]

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


def feature_store(dataset: Dataset, cfg: RunConfig) -> FeatureStore | None:
    """The store directload's loader reads features from for ``cfg``, or None (the table in memory): the
    stack :func:`store_spec` describes, opened once per run (kept in ``dataset.stores["run"]`` until it
    closes), or for ``features="disk"`` the dataset's :func:`disk_store`."""
    if not cfg.partitioned and (cfg.features == "memory" or cfg.loader != "directload"):
        return None
    if cfg.features == "disk" and not cfg.partitioned:
        return disk_store(dataset, packed=cfg.packed)
    store = dataset.stores.get("run")
    if store is None or store.closed:
        from directload.stores import open_store

        store = dataset.stores["run"] = open_store(store_spec(dataset, cfg))
    return store


def store_spec(dataset: Dataset, cfg: RunConfig) -> StoreSpec:
    """The store a run of ``cfg`` reads, as a :class:`~directload.stores.StoreSpec`: tiers over the dataset's
    disk store (its packed copy with ``cfg.packed``) with ``cfg``'s cache budgets and policy, the packed
    store's hottest rows once per node (``cfg.shared_hot``, named by the budget and the dataset), a host cache
    that grows into a node budget's share (``cfg.node_budget``), or this rank's share of a partitioned table
    (``cfg.partitioned``: in memory, on disk or through a host cache).  Opens nothing."""
    if cfg.partitioned and cfg.features == "memory":
        source: Any = dataset.feat
    else:
        source = feature_file(dataset, packed=cfg.packed)
    device = torch.device(cfg.device)
    return spec_of(cfg, source, device=device if device.type == "cuda" else None,
                   shared_key=f"{cfg.budget_name}-{dataset.name}",
                   gpu_bytes=0 if cfg.partitioned else cfg.gpu_cache)  # a rank's own rows: host tiers only


def spec_of(o: RunConfig, source: Any, **fields: Any) -> StoreSpec:
    """The :class:`~directload.stores.StoreSpec` of a run's options ``o`` over ``source``, ``fields`` given
    apart: the one map from the options to a spec's fields (the options' check checks it too)."""
    from directload.stores import StoreSpec

    return StoreSpec(**{"source": source, "tiers": o.features == "tiered", "gpu_bytes": o.gpu_cache,
                        "host_bytes": o.host_cache, "staging_bytes": o.staging, "policy": o.policy,
                        "packed": o.packed, "shared_hot_bytes": o.shared_hot, "budget_bytes": o.node_budget,
                        "partitioned": o.partitioned, **fields})


def feature_file(dataset: Dataset, packed: bool = False) -> Path:
    """The dataset's disk store file (``<dataset>/disk/node-feat.npy``, or with ``packed`` its copy renumbered
    by hotness), or a ``FileNotFoundError`` saying which command writes it: ``directload dataset convert
    --to disk`` the first, ``directload dataset pack`` the second."""
    path = dataset.path / (PACKED_FILE if packed else DISK_FILE)
    if not path.exists():
        how = "dataset pack" if packed else "dataset convert --to disk"
        raise FileNotFoundError(f"{path} does not exist: write it with `directload {how} --name {dataset.name}`")
    return path


def disk_store(dataset: Dataset, packed: bool = False) -> DiskStore:
    """The dataset's features as a :class:`~directload.stores.DiskStore` over its :func:`feature_file`,
    opened once per dataset object (kept in ``dataset.stores``)."""
    name = "packed" if packed else "disk"
    store = dataset.stores.get(name)
    if store is None or store.closed:
        from directload.stores import DiskStore

        store = dataset.stores[name] = DiskStore(feature_file(dataset, packed))
    return store


def memmap_features(dataset: Dataset) -> torch.Tensor:
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
