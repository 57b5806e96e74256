"""DGL's side of :mod:`directload.harness.train`: GraphSAGE and GAT over blocks, DGL's loader or directload's."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch.nn.functional as F
from torch import nn

from directload.capabilities import require
from directload.unified import host_of

from .train_inputs import TimedTable, feature_store, memmap_features, stage_devices

dgl = require("dgl")  # with DGL's PyTorch backend, the environment left as it was

import dgl.nn as dglnn  # noqa: E402

if TYPE_CHECKING:
    import torch
    from dgl import DGLGraph
    from dgl.dataloading import BlockSampler
    from dgl.dataloading import DataLoader as DGLDataLoader

    from directload.datasets import Dataset

    from .train_inputs import RunConfig

__all__ = ["SAGE", "GAT", "build_model", "graph_sampler", "make_loader", "input_nodes", "epoch", "forward", "seed"]


class SAGE(nn.Module):
    """GraphSAGE (mean aggregator) over DGL blocks."""

    def __init__(self, in_feats: int, hidden: int, n_classes: int, layers: int, dropout: float) -> None:
        super().__init__()
        dims = [in_feats] + [hidden] * (layers - 1) + [n_classes]
        self.layers = nn.ModuleList(dglnn.SAGEConv(a, b, "mean") for a, b in zip(dims[:-1], dims[1:]))
        self.dropout = nn.Dropout(dropout)

    def forward(self, blocks: list[DGLGraph], x: torch.Tensor) -> torch.Tensor:
        h = x
        for i, (layer, block) in enumerate(zip(self.layers, blocks)):
            h = layer(block, h)
            if i != len(self.layers) - 1:
                h = self.dropout(F.relu(h))
        return h


class GAT(nn.Module):
    """GAT over DGL blocks: multi-head hidden layers (concatenated), one head averaged at the output."""

    def __init__(self, in_feats: int, hidden: int, n_classes: int, layers: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.layers = nn.ModuleList()
        dim = in_feats
        for _ in range(layers - 1):
            self.layers.append(dglnn.GATConv(dim, hidden, heads, feat_drop=dropout, allow_zero_in_degree=True))
            dim = hidden * heads
        self.layers.append(dglnn.GATConv(dim, n_classes, 1, allow_zero_in_degree=True))

    def forward(self, blocks: list[DGLGraph], x: torch.Tensor) -> torch.Tensor:
        h = x
        for i, (layer, block) in enumerate(zip(self.layers, blocks)):
            h = layer(block, h)
            h = h.flatten(1) if i != len(self.layers) - 1 else h.mean(1)
            if i != len(self.layers) - 1:
                h = F.elu(h)
        return h


def build_model(cfg: RunConfig, in_feats: int, n_classes: int) -> SAGE | GAT:
    if cfg.model == "sage":
        return SAGE(in_feats, cfg.hidden, n_classes, cfg.layers, cfg.dropout)
    return GAT(in_feats, cfg.hidden // cfg.heads, n_classes, cfg.layers, cfg.heads, cfg.dropout)


def seed(value: int) -> None:
    dgl.seed(value)


def own_sampler() -> str:
    """The sampler DGL's loader runs here: always DGL's own ("framework")."""
    return "framework"


def graph_sampler(cfg: RunConfig, dataset: Dataset | None = None, **prefetch: Any) -> BlockSampler:
    """The run's neighbour sampler over ``cfg.fanouts``: directload's (``cfg.sampler == "directload"``), a DGL
    ``BlockSampler`` that DGL's loader runs as well as ours, or DGL's own.

    Examples
    --------
    >>> from directload.harness.train import TrainConfig
    >>> from directload.harness.train_dgl import graph_sampler
    >>> type(graph_sampler(TrainConfig(loader="dgl"))).__module__
    'dgl.dataloading.neighbor_sampler'
    >>> graph_sampler(TrainConfig(loader="dgl", sampler="directload"), prefetch_labels=["label"])
    NeighborSampler(fanouts=[15, 10, 5], edge_dir='in', prob=None, replace=False)
    """
    if cfg.sampler == "directload":
        from directload.loaders.dgl import NeighborSampler

        where = stage_devices(cfg)["sample"]
        if where == "cpu" or dataset is None:
            return NeighborSampler(list(cfg.fanouts), **prefetch)
        # directload's loader on a GPU: the batch sampled there, over the dataset's kept CSC (mapped from its
        # files: with --nproc N, one copy of the graph for every rank of the machine, each sampling on its GPU)
        return NeighborSampler(list(cfg.fanouts), device=where, csc=dataset.csc(), **prefetch)
    return dgl.dataloading.NeighborSampler(list(cfg.fanouts), **prefetch)


def make_loader(cfg: RunConfig, dataset: Dataset, ids: torch.Tensor, batch_size: int, shuffle: bool,
                ddp: bool = False) -> DGLDataLoader:
    """DGL's loader over a plain (timed) table, or directload's over the unified one, each with the run's
    sampler (:func:`graph_sampler`); with ``ddp`` this rank's share of ``ids``, split by DGL (``use_ddp=True``)."""
    feat: torch.Tensor  # the unified table, or the baseline's mapped file below
    graph, feat = dataset.graph, dataset.feat
    sampler = graph_sampler(cfg, dataset, prefetch_node_feats=["feat"], prefetch_labels=["label"])
    kw: dict[str, Any] = dict(device=cfg.device, batch_size=batch_size, shuffle=shuffle, drop_last=False,
                              num_workers=cfg.num_workers, use_ddp=ddp)
    if cfg.loader == "dgl":
        if cfg.features != "memory":  # the baseline out of core: DGL's loader over np.memmap
            feat = memmap_features(dataset)
        graph.ndata["feat"] = host_of(feat).as_subclass(TimedTable)
        return dgl.dataloading.DataLoader(graph, ids, sampler, **kw)
    from directload.loaders.dgl import DataLoader

    graph.ndata["feat"] = feat
    store = feature_store(dataset, cfg)
    features = {"feat": store} if store is not None else None
    return DataLoader(graph, ids, sampler, lookahead=cfg.lookahead, features=features, **kw)


def input_nodes(cfg: RunConfig, dataset: Dataset, ids: torch.Tensor, batch_size: int) -> Iterator[torch.Tensor]:
    """The input nodes of each batch of one epoch of the run's sampler (shuffled seeds), features unread."""
    sampler = graph_sampler(cfg)
    loader = dgl.dataloading.DataLoader(dataset.graph, ids, sampler, batch_size=batch_size, shuffle=True)
    for nodes, _, _ in epoch(loader):
        yield nodes


def epoch(loader: DGLDataLoader) -> Iterator[Any]:
    """``iter(loader)``, without DGL's advice to enable CPU affinity, which its loader repeats every
    epoch of a CPU run: the comparison runs both loaders without it, on purpose."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Dataloader CPU affinity opt is not enabled")
        return iter(loader)


def forward(model: nn.Module, batch: tuple[Any, Any, list[DGLGraph]],
            cfg: RunConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """``(logits, labels)`` of one batch."""
    _, _, blocks = batch
    return model(blocks, blocks[0].srcdata["feat"].float()), blocks[-1].dstdata["label"]
