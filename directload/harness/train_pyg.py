"""PyG's side of :mod:`directload.harness.train`: GraphSAGE and GAT with PyG's convolutions, PyG's NeighborLoader
or directload's."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import nn
from torch_geometric.loader import NeighborLoader as PygNeighborLoader
from torch_geometric.nn import GATConv, SAGEConv

from directload.unified import host_of

from .train_inputs import TimedTable, feature_store, memmap_features, stage_devices

if TYPE_CHECKING:
    from torch_geometric.data import Data

    from directload.datasets import Dataset

    from .train_inputs import RunConfig

__all__ = ["SAGE", "GAT", "build_model", "make_loader", "input_nodes", "epoch", "forward", "seed", "num_neighbors",
           "hop_counts"]


class SAGE(nn.Module):
    """GraphSAGE (mean aggregator) over a sampled subgraph. Where the sampler reports its per-hop counts
    (pyg-lib's does, torch-sparse's does not), layers are trimmed as PyG recommends (``trim_to_layer``), so
    layer ``i`` computes only the nodes the later layers need, as DGL's blocks do."""

    def __init__(self, in_feats: int, hidden: int, n_classes: int, layers: int, dropout: float) -> None:
        super().__init__()
        dims = [in_feats] + [hidden] * (layers - 1) + [n_classes]
        self.layers = nn.ModuleList(SAGEConv(a, b, aggr="mean") for a, b in zip(dims[:-1], dims[1:]))
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor, nodes_per_hop: list[int] | None,
                edges_per_hop: list[int] | None) -> torch.Tensor:
        for i, layer in enumerate(self.layers):
            x = layer(*_layer_input(i, len(self.layers), nodes_per_hop, edges_per_hop, x, edge_index))
            if i != len(self.layers) - 1:
                x = self.dropout(F.relu(x))
        return x


class GAT(nn.Module):
    """GAT: multi-head hidden layers (concatenated), one averaged head at the output; trimmed per layer
    where the sampler reports its per-hop counts."""

    def __init__(self, in_feats: int, hidden: int, n_classes: int, layers: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.layers = nn.ModuleList()
        self.dropout = nn.Dropout(dropout)
        dim = in_feats
        for _ in range(layers - 1):
            self.layers.append(GATConv(dim, hidden, heads))
            dim = hidden * heads
        self.layers.append(GATConv(dim, n_classes, 1, concat=False))

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor, nodes_per_hop: list[int] | None,
                edges_per_hop: list[int] | None) -> torch.Tensor:
        for i, layer in enumerate(self.layers):
            if i != len(self.layers) - 1:
                x = self.dropout(x)  # one mask a node: its messages and its own row agree
                x = F.elu(layer(*_layer_input(i, len(self.layers), nodes_per_hop, edges_per_hop, x, edge_index)))
            else:
                x = layer(*_layer_input(i, len(self.layers), nodes_per_hop, edges_per_hop, x, edge_index))
        return x


def _layer_input(layer, layers, nodes_per_hop, edges_per_hop, x, edge_index):
    """``(x, edge_index)`` for layer ``layer``; where the sampler reports per-hop counts, trimmed as PyG's
    ``trim_to_layer`` does and bipartite, ``((x_src, x_dst), edge_index)``: the layer reads the edges of every
    hop but the ones later layers no longer need and computes only the nodes those edges point to (what the
    next layer and the seeds need, a DGL block's destination nodes), so it neither computes nor drops out the
    outermost hop's rows.  The whole subgraph where the counts are unknown."""
    if nodes_per_hop is None or edges_per_hop is None:
        return x, edge_index
    hops = layers - layer  # hops this layer reads
    src = sum(nodes_per_hop[:hops + 1])
    x = x[:src]
    return (x, x[:sum(nodes_per_hop[:hops])]), edge_index[:, :sum(edges_per_hop[:hops])]


def hop_counts(edge_index: torch.Tensor, batch_size: int,
               num_hops: int) -> tuple[list[int], list[int]] | tuple[None, None]:
    """Per-hop node and edge counts of a sampled subgraph, as pyg-lib's sampler reports them.

    torch-sparse's sampler (PyG's path without pyg-lib) reports none, but it numbers nodes hop by hop (seeds
    first) and appends edges hop by hop, and a node first reached at hop ``k`` is exactly ``k`` sampled edges
    from a seed. So a breadth-first pass over ``edge_index`` (messages flow ``edge_index[0] -> [1]``) recovers
    the counts that ``trim_to_layer`` needs. Returns ``(None, None)`` when the subgraph is not laid out so
    (another sampler), and the model then runs on the whole subgraph."""
    src, dst = edge_index[0], edge_index[1]
    n = int(torch.max(edge_index).item()) + 1 if edge_index.numel() else batch_size
    n = max(n, batch_size)
    hop = torch.full((n,), num_hops + 1, dtype=torch.long, device=edge_index.device)
    hop[:batch_size] = 0
    for k in range(1, num_hops + 1):
        frontier = hop[dst] == k - 1
        reached = src[frontier]
        hop[reached] = torch.minimum(hop[reached], torch.full_like(reached, k))
    edge_hop = hop[dst] + 1
    nodes = torch.bincount(hop, minlength=num_hops + 2).tolist()
    edges = torch.bincount(edge_hop, minlength=num_hops + 2).tolist()
    if nodes[num_hops + 1] or edges[0] or any(edges[num_hops + 1:]):
        return None, None
    # Contiguity: hop numbers never decrease along node ids or edge positions.
    if bool((hop[1:] < hop[:-1]).any()) or bool((edge_hop[1:] < edge_hop[:-1]).any()):
        return None, None
    return nodes[:num_hops + 1], edges[1:num_hops + 1]


def build_model(cfg: RunConfig, in_feats: int, n_classes: int) -> SAGE | GAT:
    if cfg.model == "sage":
        return SAGE(in_feats, cfg.hidden, n_classes, cfg.layers, cfg.dropout)
    return GAT(in_feats, cfg.hidden // cfg.heads, n_classes, cfg.layers, cfg.heads, cfg.dropout)


def seed(value: int) -> None:
    """PyG samples with torch's generator, which the shared loop seeds."""


def own_sampler() -> str:
    """The sampler PyG's loader runs here: PyG's own ("framework") where pyg-lib or torch-sparse loads, else
    directload's (PyG alone could not sample)."""
    import torch_geometric.typing as pyg_typing

    return "framework" if (pyg_typing.WITH_PYG_LIB or pyg_typing.WITH_TORCH_SPARSE) else "directload"


def num_neighbors(fanouts: Sequence[int]) -> list[int]:
    """PyG's per-hop list (first hop from the seeds first) for per-layer ``fanouts`` (DGL's order)."""
    return list(reversed(fanouts))


def make_loader(cfg: RunConfig, dataset: Dataset, ids: torch.Tensor, batch_size: int, shuffle: bool,
                ddp: bool = False) -> PygNeighborLoader:
    """PyG's NeighborLoader over a plain (timed) table, or directload's over the unified one; with ``ddp``
    over this rank's share of ``ids``, split as PyG's examples/multi_gpu do (equal shares, so every rank
    runs as many batches)."""
    from torch_geometric.data import Data

    if ddp:
        import torch.distributed as dist

        ids = ids.split(ids.size(0) // dist.get_world_size())[dist.get_rank()]
    feat: torch.Tensor = dataset.feat  # the unified table, or the baseline's mapped file below
    kw: dict[str, Any] = dict(num_neighbors=num_neighbors(cfg.fanouts), input_nodes=ids, batch_size=batch_size,
                              shuffle=shuffle, num_workers=cfg.num_workers)
    if cfg.loader == "pyg":
        if cfg.features != "memory":  # the baseline out of core: PyG's loader over np.memmap
            feat = memmap_features(dataset)
        plain = host_of(feat).as_subclass(TimedTable)
        data = Data(x=plain, y=dataset.labels, edge_index=dataset.edge_index, num_nodes=dataset.num_nodes)
        if cfg.sampler == "directload":
            from directload.loaders.pyg import NeighborSampler

            kw["neighbor_sampler"] = NeighborSampler(data, kw["num_neighbors"])
        return PygNeighborLoader(data, **kw)
    from directload.loaders.pyg import NeighborLoader, stores_from

    kw["sampler"] = "directload" if cfg.sampler == "directload" else "pyg"

    store = feature_store(dataset, cfg)
    if store is not None:  # the features from the disk store (or tiers over it), the rest from the dataset
        fs, gs = stores_from(dataset.to_pyg())
        fs.put_tensor(store, group_name=None, attr_name="x", index=None)
        return NeighborLoader((fs, gs), lookahead=cfg.lookahead, **kw)
    where = stage_devices(cfg)["sample"]
    if where == "cpu":
        return NeighborLoader(dataset.to_pyg(), lookahead=cfg.lookahead, **kw)
    # directload's sampler on a GPU: the whole batch made there, over the dataset's kept CSC (mapped from its
    # files: with --nproc N, one copy of the graph for every rank of the machine, each sampling on its GPU)
    from directload.loaders.pyg import NeighborSampler

    data = dataset.to_pyg()
    kw["neighbor_sampler"] = NeighborSampler(data, kw["num_neighbors"], device=where, keep_on_device=True,
                                             graph=dataset.csc())
    return NeighborLoader(data, lookahead=cfg.lookahead, device=where, **kw)


def input_nodes(cfg: RunConfig, dataset: Dataset, ids: torch.Tensor, batch_size: int) -> Iterator[torch.Tensor]:
    """The nodes each batch of one epoch of the run's sampler reads (shuffled seeds), features unread."""
    from torch_geometric.data import Data

    data = Data(edge_index=dataset.edge_index, num_nodes=dataset.num_nodes)
    kw = {}
    if cfg.sampler == "directload" or own_sampler() == "directload":
        from directload.loaders.pyg import NeighborSampler

        kw["neighbor_sampler"] = NeighborSampler(data, num_neighbors(cfg.fanouts))
    for batch in PygNeighborLoader(data, num_neighbors=num_neighbors(cfg.fanouts), input_nodes=ids,
                                   batch_size=batch_size, shuffle=True, **kw):
        yield batch.n_id


def epoch(loader: Iterable[Any]) -> Iterator[Any]:
    return iter(loader)


def forward(model: nn.Module, batch: Data, cfg: RunConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """``(logits, labels)`` of the seed nodes of one batch."""
    device = torch.device(cfg.device)
    x = batch.x.to(device, non_blocking=True).float()
    edge_index = batch.edge_index.to(device, non_blocking=True)
    n = batch.batch_size
    nodes_per_hop = getattr(batch, "num_sampled_nodes", None)
    edges_per_hop = getattr(batch, "num_sampled_edges", None)
    if nodes_per_hop is None:
        nodes_per_hop, edges_per_hop = hop_counts(batch.edge_index, n, len(cfg.fanouts))
    out = model(x, edge_index, nodes_per_hop, edges_per_hop)
    return out[:n], batch.y[:n].to(device, non_blocking=True)
