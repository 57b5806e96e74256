"""What a training run's loaders read: the feature table in memory (timed, or mapped from its file) and the
disk and tiered stores over the dataset's feature files.  The frameworks' sides (:mod:`directload.harness.train_dgl`,
:mod:`directload.harness.train_pyg`) and :mod:`directload.harness.train` import it; it imports neither.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple, TypeAlias, cast

import numpy as np
import torch

from .options import FEATURE_MODES, RunOptions

if TYPE_CHECKING:
    from directload.datasets import Dataset
    from directload.stores import DiskStore, FeatureStore, StoreHandle, StoreSpec

#: A run's configuration: a :class:`~directload.harness.train.TrainConfig`, or, in the options' check, the
#: command line's options over its defaults: :class:`~directload.harness.options.RunOptions` either way.
RunConfig: TypeAlias = RunOptions

__all__ = ["TimedTable", "DISK_FILE", "PACKED_FILE", "disk_file",
           "FEATURE_MODES", "stage_devices", "feature_store", "run_store",
           "store_spec", "feature_file", "disk_store", "memmap_features", "TableShape", "table_shape", "batch_rows",
           "run_memory",
           "check_memory_limit", "GRAPH_EDGE_BYTES", "GRAPH_NODE_BYTES", "LOADER_BATCHES", "RunConfig"]

DISK_FILE = "disk/node-feat.npy"
#: The disk store with its rows renumbered by hotness (``directload dataset pack``), hot rows first.
PACKED_FILE = "disk/node-feat.packed.npy"


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


def stage_devices(cfg: RunConfig) -> dict[str, str]:
    """Where each stage of a run's batches runs: ``{"sample", "gather", "train"}`` to a device name.

    On a GPU, directload's loader with directload's sampler samples there (both frameworks; PyG's over the
    dataset's tables, not a disk store's, whose reads start on the host); directload's loader gathers onto it
    (zero-copy from the unified table, or from its stores' device tiers).  A framework's own loader samples and
    gathers on the CPU, then copies the batch.

    >>> from directload.harness.options import RunOptions
    >>> stage_devices(RunOptions())
    {'sample': 'cpu', 'gather': 'cpu', 'train': 'cpu'}
    """
    gpu = torch.device(cfg.device).type == "cuda"
    ours = cfg.loader == "directload"
    store_path = cfg.framework == "pyg" and cfg.features != "memory"
    sample_gpu = gpu and ours and cfg.sampler == "directload" and not store_path
    return {"sample": cfg.device if sample_gpu else "cpu", "gather": cfg.device if gpu and ours else "cpu",
            "train": cfg.device}


def feature_store(dataset: Dataset, cfg: RunConfig) -> FeatureStore | None:
    """The store directload's loader reads features from for ``cfg``: the stack of :func:`run_store`, or None
    (the table in memory)."""
    handle = run_store(dataset, cfg)
    return None if handle is None else handle.store


def run_store(dataset: Dataset, cfg: RunConfig) -> StoreHandle | None:
    """The run's stack, opened from :func:`store_spec` by :func:`~directload.stores.open_store` (a
    :class:`~directload.stores.StoreHandle`: it owns the stack and its share of a node budget), once per run:
    kept in ``dataset.stores["run"]`` until it closes (the run closes it when it ends).  None where
    directload's loader reads the table in memory, or does not run."""
    if cfg.loader != "directload" and not cfg.store.partitioned:
        return None
    if cfg.features == "memory" and not (cfg.store.partitioned or cfg.store.codec):
        return None
    handle = dataset.stores.get("run")
    if handle is None or handle.closed or handle.store.closed:
        from directload.stores import open_store

        handle = dataset.stores["run"] = open_store(store_spec(dataset, cfg))
    return handle


def store_spec(dataset: Dataset, cfg: RunConfig) -> StoreSpec:
    """The store a run of ``cfg`` reads, as a :class:`~directload.stores.StoreSpec`: ``cfg.store`` over the
    dataset's features (its disk store, the packed copy with ``cfg.store.packed``; the table in memory for a
    partitioned run with ``features="memory"``; with a codec and ``features="memory"``, its disk store of codes
    mapped into memory, so the ranks of a node share one copy in the page cache and no run encodes the table
    again), tiered with ``features="tiered"``, its GPU tier on the run's device; the shared hot rows named by
    the budget and the dataset.  A rank of a partitioned table holds its own rows in host tiers only.  Maps
    the codes' file, opens no store."""
    codec = cfg.store.codec
    source: Any = dataset.feat
    if cfg.features != "memory":
        source = feature_file(dataset, packed=cfg.store.packed, codec=codec)
    elif codec is not None:
        source = _mapped_codes(feature_file(dataset, codec=codec), codec)
    return _over(cfg, source, torch.device(cfg.device), dataset.name)


def _mapped_codes(path: Path, codec: str) -> Any:
    """The disk store of codes at ``path`` mapped into memory, as an :class:`~directload.codecs.EncodedTable`.
    bfloat16 codes are stored as their 16 bits (numpy has no bfloat16, and torch maps no uint16 before 2.3):
    mapped as int16, then viewed as bfloat16."""
    from directload import from_file
    from directload.codecs import EncodedTable
    from directload.codecs import codec as find_codec
    from directload.stores import read_layout

    layout = read_layout(path)
    if layout.dtype is torch.bfloat16:
        bits = from_file(path, dtype=np.int16, shape=layout.shape, offset=layout.data_offset, pin="auto")
        return EncodedTable(bits.view(torch.bfloat16), find_codec(codec))
    return EncodedTable(from_file(path, pin="auto"), find_codec(codec))


def _over(cfg: RunConfig, source: Any, device: torch.device, name: str) -> StoreSpec:
    """``cfg.store`` over ``source``, as a run of ``cfg`` on ``device`` over dataset ``name`` opens it."""
    from dataclasses import replace

    spec = cfg.store
    spec = replace(spec, source=source, tiers=cfg.features == "tiered",
                   device=device if device.type == "cuda" else None,
                   budget=replace(spec.budget, hot_key=f"{spec.budget.name}-{name}"))
    return replace(spec, gpu_bytes=0) if spec.partitioned else spec  # a rank's own rows: host tiers only


def disk_file(codec: str | None = None, packed: bool = False) -> str:
    """The path, under a dataset's directory, of its disk store: :data:`DISK_FILE`, or with ``codec`` its store
    of that codec's code rows (``disk/node-feat.int8.npy``); with ``packed`` that store's copy renumbered by
    hotness (:data:`PACKED_FILE`, ``disk/node-feat.int8.packed.npy``).

    >>> disk_file(), disk_file("int8"), disk_file(packed=True), disk_file("int8", packed=True)
    ('disk/node-feat.npy', 'disk/node-feat.int8.npy', 'disk/node-feat.packed.npy', 'disk/node-feat.int8.packed.npy')
    """
    path = DISK_FILE if codec is None else DISK_FILE.replace(".npy", f".{codec}.npy")
    return path.replace(".npy", ".packed.npy") if packed else path


def feature_file(dataset: Dataset, packed: bool = False, codec: str | None = None) -> Path:
    """The dataset's disk store file (``<dataset>/disk/node-feat.npy``; with ``packed`` its copy renumbered
    by hotness; with ``codec`` its store of codes, :func:`disk_file`), or a ``FileNotFoundError`` saying which
    command writes it: ``directload dataset convert --to disk`` (with ``--codec``), or ``directload dataset
    pack``."""
    path = dataset.path / disk_file(codec, packed)
    if not path.exists():
        how = ("dataset pack" if packed else "dataset convert --to disk") + (f" --codec {codec}" if codec else "")
        raise FileNotFoundError(f"{path} does not exist: write it with `directload {how} --name {dataset.name}`")
    return path


def disk_store(dataset: Dataset, packed: bool = False) -> DiskStore:
    """The dataset's features as a :class:`~directload.stores.DiskStore` over its :func:`feature_file`,
    opened once per dataset object (kept in ``dataset.stores``)."""
    name = "packed" if packed else "disk"
    handle = dataset.stores.get(name)
    if handle is None or handle.closed or handle.store.closed:
        from directload.stores import StoreSpec, open_store

        handle = dataset.stores[name] = open_store(StoreSpec(feature_file(dataset, packed), tiers=False))
    return cast("DiskStore", handle.store)


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


#: Host bytes a run's graph takes at its peak, per edge and per node: the edge list read, the framework's graph
#: and directload's CSC built from it, labels and splits.  Measured as the peak growth of a one-epoch run
#: (resident anonymous memory, sampled every 20 ms) over a 100,000-node, 1.9M-edge graph (216 MiB) and a
#: 1M-node, 9M-edge one (451 MiB); with :data:`directload.harness.memcap.HEADROOM` for the model, the
#: optimizer and the threads, both are covered.
GRAPH_EDGE_BYTES, GRAPH_NODE_BYTES = 40, 16
#: Batches whose features a loader holds at once: the one training, the one ready and the one being gathered.
LOADER_BATCHES = 3


class TableShape(NamedTuple):
    """What a memory estimate needs of a dataset before it is loaded (or even made)."""

    num_nodes: int
    num_edges: int  #: 0 where unknown (a dataset of OGB's: its graph is not counted)
    row_nbytes: int  #: bytes of one node's features


def table_shape(root: os.PathLike[str] | str, name: str) -> TableShape | None:
    """The shape of dataset ``name`` under ``root``, from its files' headers and the generator's metadata
    (reads no array), or from its preset when it is not made yet; None where neither says.

    Examples
    --------
    >>> table_shape("nowhere", "synth-ooc")
    TableShape(num_nodes=1000000, num_edges=10000000, row_nbytes=4096)
    """
    from directload.datasets import FEATURE_FILE, PRESETS, dataset_dir
    from directload.datasets.synthetic import META_FILE

    path = dataset_dir(root, name)
    nodes = edges = row = 0
    try:
        meta = json.loads((path / META_FILE).read_text())
        cfg = meta["config"]
        nodes, edges = int(cfg["num_nodes"]), int(meta["num_edges"])
        row = int(cfg["num_feats"]) * (2 if cfg.get("feat_dtype") == "float16" else 4)
    except (OSError, ValueError, KeyError, TypeError):
        preset = PRESETS.get(name)
        if preset is not None:  # not made yet: the preset's sizes (avg_degree counts both directions)
            nodes, edges = preset.num_nodes, preset.num_nodes * preset.avg_degree
            row = preset.num_feats * (2 if preset.feat_dtype == "float16" else 4)
    feat = path / "raw" / FEATURE_FILE
    if feat.exists():
        from directload.npy import open_regular, read_header

        try:
            with open_regular(feat) as f:
                head = read_header(f, feat)  # the header alone
            nodes = int(head.shape[0])
            row = int(np.prod(head.shape[1:], dtype=np.int64)) * np.dtype(head.dtype).itemsize
        except (OSError, ValueError, IndexError):
            pass  # a bad file: the run's own load says so
    return TableShape(nodes, edges, row) if nodes and row else None


def batch_rows(o: RunConfig, num_nodes: int) -> int:
    """At most how many distinct nodes a batch of run ``o`` (its options, their fanouts settled) reads
    features for: its seeds (the training batch, or an evaluation batch: ``eval_batch_size``, at most
    ``eval_nodes``) times one plus each hop's product of fanouts (the largest first, so it bounds either
    framework's order), at most the table.  Pure.

    Examples
    --------
    >>> o = RunOptions(batch_size=256, eval_batch_size=512, eval_nodes=1000, fanouts=(10, 5))
    >>> batch_rows(o, 10 ** 6)  # 512 seeds * (1 + 10 + 10 * 5)
    31232
    """
    fanouts = tuple(o.fanouts)
    if any(f < 0 for f in fanouts):  # every neighbour: any node may be read
        return num_nodes
    seeds = max(o.batch_size, min(o.eval_batch_size, o.eval_nodes or o.eval_batch_size))
    reach = 1 + sum(math.prod(sorted(fanouts, reverse=True)[:hop]) for hop in range(1, len(fanouts) + 1))
    return min(num_nodes, seeds * reach)


def run_memory(o: RunConfig | Mapping[str, Any], shape: TableShape, *, loaders: tuple[str, ...] = ("directload",),
               cuda: bool = False) -> dict[str, dict[str, int]]:
    """What run ``o`` (its options) will hold in host memory besides the interpreter and the frameworks, over a
    dataset of ``shape``, before any of it is made: ``{"stack": ..., "run": ...}``, each ``{part: bytes}``.

    * ``"stack"``: directload's feature store, :meth:`~directload.stores.StoreSpec.held_estimate` of the run's
      spec for batches of :func:`batch_rows` (none where no loader of ``loaders`` reads one);
    * ``"run"``: the graph (:data:`GRAPH_EDGE_BYTES` per edge, :data:`GRAPH_NODE_BYTES` per node) and the
      features of the :data:`LOADER_BATCHES` batches a loader holds.

    A job of several ranks (``nproc``) holds it once per rank, a partitioned table's stack a rank's share.
    ``cuda``: the GPU tier lives on a GPU.

    Examples
    --------
    >>> from directload.harness.train import TrainConfig
    >>> from directload.stores import StoreSpec
    >>> o = TrainConfig(features="tiered", store=StoreSpec(host_bytes=1 << 30, staging_bytes=256 << 20), layers=2,
    ...                 fanouts=(10, 5))
    >>> held = run_memory(o, TableShape(10 ** 6, 10 ** 7, 4096))
    >>> held["stack"]["host cache"] >> 20, held["run"]["graph"] >> 20
    (1280, 396)
    """
    o = RunOptions(**o) if isinstance(o, Mapping) else o
    ranks = max(1, int(o.nproc))
    rows = batch_rows(o, shape.num_nodes)
    run = {"graph": shape.num_edges * GRAPH_EDGE_BYTES + shape.num_nodes * GRAPH_NODE_BYTES,
           "batches": LOADER_BATCHES * rows * shape.row_nbytes}
    stack: dict[str, int] = {}
    if (o.store.partitioned or o.features != "memory") and "directload" in loaders:
        spec = _over(o, "features.npy", torch.device("cpu"), "")  # as store_spec's
        local = -(-shape.num_nodes // ranks) if o.store.partitioned else shape.num_nodes
        lookahead = o.lookahead if isinstance(o.lookahead, int) else 64  # "auto": up to AutoLookahead's bound
        stack = spec.held_estimate(local, shape.row_nbytes, batch_rows=rows, lookahead=lookahead, cuda=cuda)
    if ranks > 1:
        stack = {k: v if k == "shared hot rows" else v * ranks for k, v in stack.items()}
        run = {k: v * ranks for k, v in run.items()}
    return {"stack": stack, "run": run}


def check_memory_limit(nbytes: int, o: RunConfig | Mapping[str, Any], *, root: os.PathLike[str] | str, dataset: str,
                       loaders: Sequence[str], cuda: bool = False) -> None:
    """Refuse, before any work, a ``--memory-limit`` of ``nbytes`` below what a ``directload train`` run will
    hold: :class:`~directload.harness.memcap.MemoryLimitError`, one line naming the limit, the total and
    each part (:func:`~directload.harness.memcap.check_limit`).

    ``o`` is the run's checked options (as :func:`~directload.harness.commands.runs.check_args` returns them),
    reading ``dataset`` under ``root`` (made or not: its preset's sizes) with ``loaders`` (``cuda``: on a GPU,
    which holds the GPU tier).  The run will hold what this process holds now (it has imported what the run
    imports) and :data:`~directload.harness.memcap.HEADROOM`, plus :func:`run_memory`'s estimate; a dataset
    whose sizes are unknown before it is loaded is checked against the first two alone.
    """
    from . import memcap

    shape = table_shape(root, dataset)
    memcap.check_limit(nbytes, holds=None if shape is None else run_memory(o, shape, loaders=tuple(loaders), cuda=cuda))
