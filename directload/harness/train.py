"""End-to-end GraphSAGE / GAT mini-batch training, the framework's stock loader against directload's.

The loop, its timing and its configuration are shared; the models and loaders
come from :mod:`directload.harness.train_dgl` (DGL) or :mod:`directload.harness.train_pyg`
(PyG), imported only for the framework a run asks for.
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm

from directload.stores import StoreSpec, TieredStats

from . import ddp
from .options import DEFAULT_FANOUTS, FEATURE_MODES, SAMPLERS, RunOptions, check_options, resolve_depth
from .train_inputs import (
    DISK_FILE,
    PACKED_FILE,
    TimedTable,
    disk_store,
    feature_file,
    feature_store,
    memmap_features,
    run_store,
    stage_devices,
)

if TYPE_CHECKING:
    from pathlib import Path
    from types import ModuleType

    from directload.datasets import Dataset

__all__ = ["TrainConfig", "EpochStats", "RunResult", "train", "evaluate", "TimedTable", "resolve_depth",
           "disk_store", "feature_store", "memmap_features", "FEATURE_MODES", "DEFAULT_FANOUTS",
           "DISK_FILE", "PACKED_FILE", "SIDES", "SAMPLERS", "register_framework", "framework_side"]


#: Each framework's side of a run, by name: a module with ``build_model``, ``make_loader``, ``input_nodes``,
#: ``epoch``, ``forward``, ``seed`` and ``own_sampler`` (whose sampler the framework's loader runs).  A side
#: imports :mod:`directload.harness.train_inputs`, never this module, and is imported only when a run asks for
#: its framework.
SIDES = {"dgl": "directload.harness.train_dgl", "pyg": "directload.harness.train_pyg"}


def register_framework(name: str, module: str) -> None:
    """Add (or replace) the side of framework ``name``: a module path as in :data:`SIDES`."""
    SIDES[name] = module


def framework_side(name: str) -> ModuleType:
    """The imported side of framework ``name``; ``ValueError`` for a name :data:`SIDES` does not hold."""
    if name not in SIDES:
        raise ValueError(f"no framework {name!r}: one of {', '.join(SIDES)}")
    return importlib.import_module(SIDES[name])


@dataclass
class TrainConfig(RunOptions):
    """One training run: its :class:`~directload.harness.options.RunOptions`, checked when made.

    The defaults follow DGL's ogbn-products examples (the paper's models):
    GraphSAGE with mean aggregation, 3 layers, fanouts 15/10/5; GAT with 4
    heads.  Hidden sizes are smaller than DGL's so CPU runs stay short.
    ``fanouts[i]`` is the fanout of layer ``i`` (DGL's convention: the last
    layer's is the first hop from the seeds); PyG runs sample the same hops.
    ``features="disk"`` gives directload's loader the dataset's disk store
    while the framework's loader reads the memory-mapped ``.npy`` file;
    ``eval_nodes`` evaluates on that many nodes of each split (the same ones
    for every run; 0 for all).  ``store`` is the run's
    :class:`~directload.stores.StoreSpec` over the dataset's features: its
    caches, policy, packed copy (read, and warmed into the caches), node budget
    and partitioning; made, it holds the spec checked (sizes in bytes, ``tiers``
    as the run reads it).  A config read back from a report (``store`` as a
    dict) is made the same way.
    """

    def __post_init__(self):
        if isinstance(self.store, Mapping):  # a report's config, read back
            self.store = StoreSpec.from_dict(self.store)
        settled = check_options(self, frameworks=tuple(SIDES))  # the rules the command line's flags follow too
        self.layers, self.fanouts, self.sampler = settled["layers"], settled["fanouts"], settled["sampler"]
        self.store = settled["store"]

    def run_of(self, loader: str, **changes: Any) -> TrainConfig:
        """This config for a run of ``loader`` (with ``changes``): directload's loader keeps the store and the
        sampler; a framework's own reads no directload store (its spec at the defaults) and samples with its
        framework's sampler."""
        if loader == "directload":
            return replace(self, loader=loader, **changes)
        return replace(self, loader=loader, store=StoreSpec(), sampler="framework", **changes)


@dataclass
class EpochStats:
    """Seconds spent in one epoch.

    ``sample_s`` and ``gather_s`` are measured where the work runs: on the
    training thread for the framework's loader, in directload's pipeline for
    its own (overlapping ``train_s`` only where that runs on background
    threads).  ``wait_s`` is the time the training loop waited for a batch;
    ``epoch_s = wait_s + train_s`` up to loop overhead.  ``io`` holds the disk
    store's counters for the epoch (``features="disk"``, directload's loader).  For a framework's
    loader ``gather_s`` is its feature-table slicing alone; for directload's
    PyG loader it is PyG's whole filter step (features, labels and the
    subgraph's edges), so it overstates directload's share there.
    """

    epoch: int
    epoch_s: float
    sample_s: float
    gather_s: float
    train_s: float
    wait_s: float
    batches: int
    loss: float
    valid_acc: float = float("nan")
    io: dict[str, float] | None = None
    tiers: dict[str, dict[str, float]] | None = None
    lookahead: int | None = None


@dataclass
class RunResult:
    config: dict[str, Any]
    epochs: list[EpochStats] = field(default_factory=list)
    test_acc: float = float("nan")
    valid_acc: float = float("nan")
    # packed tiered runs: the caches' fill started before the first epoch (rows per tier)
    warm: dict[str, Any] | None = None
    ranks: list[list[dict[str, Any]]] | None = None  # DDP runs: every rank's epochs (rank 0's are ``epochs``)
    # runs in a node budget: its name and limits, and this loader's share at each epoch's end
    budget: dict[str, Any] | None = None
    # where each stage of the batches ran: {"sample", "gather", "train"} to a device
    stages: dict[str, str] = field(default_factory=dict)


def _framework(cfg):
    return framework_side(cfg.framework)


def _seed(fw, seed):
    torch.manual_seed(seed)
    np.random.seed(seed)
    fw.seed(seed)


_IO_KEYS = ("reads", "bytes_read", "read_amplification", "iops", "gb_per_s", "cpu_us_per_read", "io_seconds",
            "io_depth")
_TIER_KEYS = ("local_rows", "remote_rows", "remote_bytes", "rows_sent", "bytes_sent", "bytes_received",
              "duplicates_saved", "seconds", "rows", "hit_rate", "slot_rate", "hit_rows", "staged_rows", "miss_rows",
              "prefetched_rows", "forwarded_bytes", "fallback_bytes", "passthrough", "read_s", "wait_s", "fallback_s",
              "policy_s", "pcie_bytes", "warmed_rows", "capacity_rows")


def _tier_stats(store):
    """Per tier, the epoch's counters that the report keeps."""
    out = {}
    for name, s in store.stats().items():
        keys = _IO_KEYS if name == "disk" else _TIER_KEYS
        out[name] = {k: s[k] for k in keys if k in s}
    return out


def profile_counts(dataset: Dataset, cfg: TrainConfig, epochs: int, *, progress: bool = True) -> np.ndarray:
    """How many of ``epochs`` pre-sampled epochs' batches read each row (GNNLab's presampling), with
    ``cfg``'s framework, sampler, fanouts and batch size over the training split.  No features are read."""
    from directload.stores import access_counts

    fw = _framework(cfg)
    _seed(fw, cfg.seed + 1)  # draws of their own: not the batches the training run will sample
    ids = dataset.split["train"]
    batches = (b for _ in range(epochs) for b in fw.input_nodes(cfg, dataset, ids, cfg.batch_size))
    total = epochs * -(-len(ids) // cfg.batch_size)
    return access_counts(tqdm(batches, total=total, desc="pre-sampling", unit="batch", disable=not progress),
                         dataset.num_nodes)


def pack(dataset: Dataset, cfg: TrainConfig, epochs: int = 3, *, codec: str | None = None,
         progress: bool = True) -> tuple[Path, np.ndarray]:
    """Write the dataset's packed disk store (:data:`PACKED_FILE`; with ``codec`` that of its store of codes,
    :func:`~directload.harness.train_inputs.disk_file`): its disk store with the rows renumbered hottest first
    (:func:`~directload.stores.renumber`), by :func:`profile_counts` over ``epochs`` epochs, rows read equally
    often by in-degree.  Returns ``(path, counts)``."""
    from directload.stores import renumber

    from .train_inputs import disk_file

    counts = profile_counts(dataset, cfg, epochs, progress=progress)
    degree = np.bincount(np.asarray(dataset.edge_index[1]), minlength=dataset.num_nodes)
    src = feature_file(dataset, codec=codec)
    for name in ("run", "packed"):  # the copy is rewritten: close what reads it (the next run opens it afresh)
        store = dataset.stores.get(name)
        if store is not None:
            store.close()
    path = renumber(src, dataset.path / disk_file(codec, packed=True), counts, tiebreak=degree, overwrite=True,
                    progress=progress)
    return path, counts


def _eval_ids(ids, n):
    """The same ``n`` of ``ids`` for every run (all when ``n`` is 0 or covers them)."""
    if not n or n >= len(ids):
        return ids
    pick = torch.randperm(len(ids), generator=torch.Generator().manual_seed(len(ids)))[:n]
    return ids[pick.sort().values]


@torch.no_grad()
def evaluate(model: torch.nn.Module, cfg: TrainConfig, dataset: Dataset, ids: torch.Tensor, *,
             fw: ModuleType | None = None) -> float:
    """Accuracy on ``ids`` (``cfg.eval_nodes`` of them, when set) with the run's loader and fanouts."""
    fw = fw or _framework(cfg)
    ids = _eval_ids(ids, cfg.eval_nodes)
    model.eval()
    correct: torch.Tensor | int = 0  # on the device, read once: a read per batch would wait for it
    total = 0
    for batch in fw.epoch(fw.make_loader(cfg, dataset, ids, cfg.eval_batch_size, False)):
        logits, y = fw.forward(model, batch, cfg)
        correct = correct + (logits.argmax(1) == y).sum()
        total += len(y)
    model.train()
    return int(correct) / max(total, 1)


def train(dataset: Dataset, cfg: TrainConfig, *, progress: bool = True, evaluate_each_epoch: bool = False) -> RunResult:
    """Train ``cfg.model`` on ``dataset`` with ``cfg.loader`` of ``cfg.framework``; returns a :class:`RunResult`.

    The framework's own loader reads a plain host table (a :class:`TimedTable`,
    to time its gathers); directload's reads the unified tensor.
    """
    fw = _framework(cfg)
    if cfg.sampler == "framework" and fw.own_sampler() == "directload":  # PyG with neither pyg-lib nor torch-sparse
        print(f"{cfg.framework} has no sampler here: its loader samples with directload's (its distribution, not "
              "its batches)")
        cfg = replace(cfg, sampler="directload")
    _seed(fw, cfg.seed)
    device = torch.device(cfg.device)
    if cfg.loader == "directload":  # a training run is long: load the CPU gather kernels now, not once they pay
        from directload.kernels import cpu

        cpu.prepare((dataset.feat.element_size(),), (8, 4), background=False)
        if cfg.store.codec is not None:  # and the kernel that decodes its rows as it gathers them
            from directload.kernels.decode import prepare_decode

            prepare_decode((cfg.store.codec,), background=False)
    rank, size = ddp.world()
    if cfg.nproc != size:  # a config saying 2 ranks, trained by one process alone, would report wrong numbers
        raise ValueError(f"nproc={cfg.nproc} but this process is one of {size}: start the ranks with torchrun "
                         "(--nproc-per-node), which sets the world size")
    model = fw.build_model(cfg, dataset.feat.shape[1], dataset.num_classes).to(device)
    trained = model
    if size > 1:  # each rank its share of the seeds (the framework's own split), gradients averaged
        from torch.nn.parallel import DistributedDataParallel

        trained = DistributedDataParallel(model, device_ids=[device] if device.type == "cuda" else None)
    opt = torch.optim.Adam(trained.parameters(), lr=cfg.lr)
    result = RunResult(config=cfg.to_dict(), stages=stage_devices(cfg))
    handle = run_store(dataset, cfg)  # directload's stack and its share of a node budget, if it reads one
    try:
        if handle is not None and handle.share is not None:
            _in_budget(handle, result)
        loader = fw.make_loader(cfg, dataset, dataset.split["train"], cfg.batch_size, True, ddp=size > 1)
        _epochs(dataset, cfg, fw, trained, opt, loader, handle, result, progress and rank == 0, evaluate_each_epoch)
        result.valid_acc = evaluate(model, cfg, dataset, dataset.split["valid"], fw=fw)
        result.test_acc = evaluate(model, cfg, dataset, dataset.split["test"], fw=fw)
        if size > 1:
            import torch.distributed as dist

            everyone: list[Any] = [None] * size
            dist.all_gather_object(everyone, [asdict(e) for e in result.epochs])
            result.ranks = everyone
    finally:
        if handle is not None:  # the share given back, then the stack closed: the next run starts cold, as this
            handle.close()      # one did (a partitioned one with a new exchange)
    return result


#: In a node budget, the most bytes of recycled batch buffers a job keeps (a few batches' worth).
POOL_IN_BUDGET = 128 << 20


def _in_budget(handle, result):
    """A run in a node budget: keep few recycled batch buffers (this job's own memory, outside the budget),
    and record the budget and the share the stack joined with."""
    from directload.kernels.host_pool import default_pool

    pool = default_pool()
    pool.max_cached_bytes = min(pool.max_cached_bytes, POOL_IN_BUDGET)
    share, budget = handle.share, handle.spec.budget
    result.budget = {"name": budget.name, "node_bytes": budget.host_bytes, "shared_hot_bytes": budget.shared_hot_bytes,
                     "limits": asdict(share.budget.limits), "want": asdict(share.want),
                     "least": asdict(share.least), "joined": asdict(share.current), "epochs": []}


def _epochs(dataset, cfg, fw, model, opt, loader, store, result, progress, evaluate_each_epoch):
    share = store.share if store is not None else None
    for epoch in range(cfg.epochs):
        if ddp.world()[1] > 1 and hasattr(loader, "set_epoch"):
            loader.set_epoch(epoch)  # DGL's DDP split reshuffles per epoch only when told the epoch
        TimedTable.seconds = 0.0
        if store is not None:
            store.reset_stats()
        if epoch == 0 and cfg.store.packed and cfg.store.tiers:
            # G10's eager prefetch: the hot rows stream in while the first epoch runs (its reads go first)
            t0 = time.perf_counter()
            rows = store.store.warm(background=True)
            result.warm = {"seconds": time.perf_counter() - t0, "rows": rows,
                           "bytes": sum(rows.values()) * store.row_nbytes}
        train_s = wait_s = 0.0
        losses = []
        t_epoch = time.perf_counter()
        it = fw.epoch(loader)
        bar = tqdm(total=len(loader), desc=f"{cfg.model}/{cfg.loader} epoch {epoch}", unit="batch",
                   disable=not progress, leave=False)
        while True:
            t0 = time.perf_counter()
            try:
                batch = next(it)
            except StopIteration:
                break
            t1 = time.perf_counter()
            logits, y = fw.forward(model, batch, cfg)
            loss = F.cross_entropy(logits, y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.detach())  # read once an epoch: a read per batch would wait for the device
            t2 = time.perf_counter()
            wait_s += t1 - t0
            train_s += t2 - t1
            bar.update()
        bar.close()
        epoch_s = time.perf_counter() - t_epoch
        if cfg.loader == "directload":
            gather_s, sample_s = it.stats["gather_s"], it.stats["sample_s"]
        else:
            gather_s = TimedTable.seconds
            sample_s = wait_s - gather_s  # the rest of next() is sampling (and batch assembly)
        mean_loss = float(torch.stack(losses).float().mean()) if losses else float("nan")
        stats = EpochStats(epoch, epoch_s, sample_s, gather_s, train_s, wait_s, len(losses), mean_loss)
        if cfg.loader == "directload":
            stats.lookahead = it.stats.get("lookahead")  # the L this epoch ran with (lookahead="auto" picks it)
        if store is not None and cfg.features == "disk" and not cfg.store.partitioned:
            io = store.stats()
            io = io["disk"] if isinstance(io, TieredStats) else io  # a store of codes: the disk under its decode
            stats.io = {key: io[key] for key in _IO_KEYS}
        elif store is not None:
            stats.tiers = _tier_stats(store)
            stats.io = stats.tiers.get("disk")  # none for a partitioned table in memory
        if share is not None:
            result.budget["epochs"].append(asdict(share.refresh()))
        if evaluate_each_epoch:
            stats.valid_acc = evaluate(model, cfg, dataset, dataset.split["valid"], fw=fw)
        result.epochs.append(stats)
