"""DGL batches: fill the lazy features that DGL's samplers mark, with directload's gathers where they apply.

A DGL sampler marks the fields a batch needs with ``LazyFeature`` placeholders
(``prefetch_node_feats``, ``prefetch_labels``, ``prefetch_edge_feats``, the
``prefetch_ndata`` of subgraph samplers, an edge sampler's labels) and DGL's
loader fills them from the graph's storages.  This module fills them the same
way, in the same order, with one difference: node fields whose table directload
can gather (a unified, pinned, CUDA or plain contiguous tensor, or a store) go
through directload's kernels.  Everything else (edge fields, data attached with
``attach_data``, tables that need autograd, dtypes the kernels do not take, GPU
caches) is fetched by DGL's own storages, so any sampler gives DGL's batches.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any, TypeAlias

import torch
from dgl import EID, NID, DGLError
from dgl.dataloading.dataloader import restore_parent_storage_columns
from dgl.frame import LazyFeature
from dgl.heterograph import DGLGraph
from dgl.storages import wrap_storage
from dgl.utils import recursive_apply, recursive_apply_pair

from directload.kernels.operands import can_gather, host_of
from directload.stores import FeatureStore, TensorStore, check_table

from ..pipeline import BatchAdapter

if TYPE_CHECKING:
    import dgl
    from dgl.storages import FeatureStorage

    _Table: TypeAlias = torch.Tensor | FeatureStore  # a node field's table: a tensor or a directload store

__all__ = ["FeatureSource", "DGLBatches", "start_batch", "finish_batch", "input_ids", "announce", "serves_as_dgl"]


def serves_as_dgl(table: object, ids: torch.Tensor, device: torch.device) -> bool:
    """Whether directload serves ``table[ids]`` onto ``device`` exactly as DGL would.  Pure.

    Yes where the kernels take the table (:func:`directload.kernels.operands.can_gather`: a contiguous tensor
    of 1/2/4/8-byte elements, a unified tensor by its host tensor) and it needs no autograd (a gather carries
    no history, where DGL's ``index_select`` does), read with CPU ids from host memory, or with CUDA ids (or
    for a CUDA ``device``) from pinned, unified or same-device CUDA memory.

    Examples
    --------
    >>> import torch
    >>> cpu = torch.device("cpu")
    >>> serves_as_dgl(torch.zeros(4, 3), torch.tensor([1]), cpu)
    True
    >>> serves_as_dgl(torch.zeros(4, 3, requires_grad=True), torch.tensor([1]), cpu)  # DGL's rows keep history
    False
    """
    unified = getattr(table, "is_unified", False)
    if not isinstance(table, torch.Tensor) or table.requires_grad or not can_gather(host_of(table)):
        return False
    gpu = ids.is_cuda or device.type == "cuda"
    if table.is_cuda:
        return gpu and table.device == (ids.device if ids.is_cuda else device)
    if ids.is_cuda and not (unified or table.is_pinned()):
        return False  # pageable memory: DGL's own storage raises its usual error
    return True


class _StoreStorage:
    """A directload :class:`~directload.stores.FeatureStore` as a DGL-style storage
    (``fetch(ids, device, pin_memory)``): the read starts now, DGL's code waits with ``wait()``."""

    __slots__ = ("store",)

    def __init__(self, store):
        self.store = store

    def fetch(self, ids, device, pin_memory=False, **kwargs):
        return self.store.read_async(ids, device=device)


class FeatureSource:
    """Where one loader reads each lazy feature, looked up at every batch as DGL does.

    Parameters
    ----------
    loader : dgl.dataloading.DataLoader
        For its graph, device, ``pin_prefetcher`` and ``other_storages``.
    features : dict, optional
        ``{name: table}`` (``{name: {ntype: table}}`` on a heterogeneous graph)
        overriding the graph's node data; a table is a tensor or a
        :class:`directload.stores.FeatureStore`.

    Every node field directload serves reaches the loader as a FeatureStore:
    a tensor (given here or in the graph's node data) is wrapped in a
    :class:`~directload.stores.TensorStore` at every batch, so writes to it in
    place and reassignment (``g.ndata["h"] = y``) are seen by the next batch,
    as DGL sees them.

    Examples
    --------
    >>> import dgl, torch
    >>> from directload.loaders.dgl import DataLoader
    >>> g = dgl.rand_graph(10, 30)
    >>> g.ndata["feat"] = torch.randn(10, 3)
    >>> sampler = dgl.dataloading.NeighborSampler([2], prefetch_node_feats=["feat"])
    >>> source = FeatureSource(DataLoader(g, torch.arange(4), sampler, batch_size=2))
    >>> source.table("feat", "_N") is g.ndata["feat"]
    True
    """

    def __init__(self, loader: dgl.dataloading.DataLoader,
                 features: Mapping[str, _Table | Mapping[str, _Table]] | None = None) -> None:
        if features is not None and not isinstance(features, Mapping):
            raise TypeError(f"features must be a dict of name -> table, got {type(features).__name__}")
        self.loader = loader
        self.graph = loader.graph
        self.features = dict(features or {})
        for name, table in self.given_tables():
            check_table(f"features[{name!r}]", table)

    def given_tables(self) -> Iterator[tuple[str, _Table]]:
        """``(name, table)`` of every table given in ``features=`` (each node type's, on a heterogeneous graph)."""
        for name, given in self.features.items():
            for table in (given.values() if isinstance(given, Mapping) else [given]):
                yield name, table

    def table(self, key: str, ntype: str) -> _Table:
        """The table behind node field ``key`` of ``ntype`` now: ``features=``, else the graph's."""
        given = self.features.get(key)
        if isinstance(given, Mapping):
            given = given.get(ntype)
        if given is not None:
            return given
        try:
            return self.graph.get_node_storage(key, ntype).data
        except KeyError:
            raise KeyError(f"node field {key!r} of type {ntype!r} is neither in features= nor in the graph's "
                           "node data") from None

    def node_storage(self, key: str, ntype: str, ids: torch.Tensor) -> _StoreStorage | FeatureStorage:
        table = self.table(key, ntype)
        if isinstance(table, FeatureStore):
            return _StoreStorage(table)
        if serves_as_dgl(table, ids, self.loader.device):
            return _StoreStorage(TensorStore(table))  # wrapped per batch: the table as it is now
        if key in self.features:
            return wrap_storage(table)
        return self.graph.get_node_storage(key, ntype)  # DGL's own fetch

    def edge_storage(self, key: str, etype: tuple[str, str, str], ids: torch.Tensor) -> FeatureStorage:
        return self.graph.get_edge_storage(key, etype)

    def prefetchers(self, key: str, ntype: str) -> FeatureStore | None:
        """The FeatureStore behind a node field (it takes ``prefetch(ids)`` hints), else None."""
        try:
            table = self.table(key, ntype)
        except KeyError:
            return None
        return table if isinstance(table, FeatureStore) else None


class _Pending:
    """Fetches started for one subgraph: ``{(type id, key): tensor or waitable}`` for nodes and edges.

    Not a Mapping, so DGL's ``recursive_apply`` treats it as one leaf.
    """

    __slots__ = ("node", "edge")

    def __init__(self, node, edge):
        self.node = node
        self.edge = edge


def _lazy_columns(frames, types, id_name):
    """``(type id, type, key, parent key, ids)`` of every LazyFeature in ``frames``, as DGL's loader finds them."""
    for tid, frame in enumerate(frames):
        default_id = frame.get(id_name, None)
        for key in frame.keys():
            column = frame._columns[key]
            if isinstance(column, LazyFeature):
                if column.id_ is None and default_id is None:
                    raise DGLError("Found a LazyFeature with no ID specified, "
                                   "and the graph does not have dgl.NID or dgl.EID columns")
                yield tid, types[tid], key, column.name or key, column.id_ if column.id_ is not None else default_id


def _start_item(item, source, device, pin):
    if isinstance(item, DGLGraph):
        node = {(tid, key): source.node_storage(parent, ntype, ids).fetch(ids, device, pin)
                for tid, ntype, key, parent, ids in _lazy_columns(item._node_frames, item.ntypes, NID)}
        edge = {(tid, key): source.edge_storage(parent, etype, ids).fetch(ids, device, pin)
                for tid, etype, key, parent, ids in _lazy_columns(item._edge_frames, item.canonical_etypes, EID)}
        return _Pending(node, edge)
    if isinstance(item, LazyFeature):
        return source.loader.other_storages[item.name].fetch(item.id_, device, pin)
    return None


def _has_gpu_caches(graph):
    caches = getattr(graph, "_gpu_caches", None) or {}
    return any(caches.get(kind) for kind in ("node", "edge"))


def start_batch(batch: Any, source: FeatureSource) -> tuple[Any, Any]:
    """Start fetching every lazy feature of a sampled batch; returns what :func:`finish_batch` needs."""
    batch = recursive_apply(batch, restore_parent_storage_columns, source.graph)  # batches from workers
    loader = source.loader
    if _has_gpu_caches(source.graph):
        return batch, None  # DGL's GPU caches (gpu_cache=): DGL's own prefetch, in finish_batch
    return batch, recursive_apply(batch, _start_item, source, loader.device, bool(loader.pin_prefetcher))


def _wait(x):
    if isinstance(x, _Pending):
        return _Pending({k: _wait(v) for k, v in x.node.items()}, {k: _wait(v) for k, v in x.edge.items()})
    return x.wait() if hasattr(x, "wait") else x


def _assign(item, feats):
    if isinstance(item, DGLGraph):
        for (tid, key), value in feats.node.items():
            item._node_frames[tid][key] = value
        for (tid, key), value in feats.edge.items():
            item._edge_frames[tid][key] = value
        return item
    if isinstance(item, LazyFeature):
        return feats
    return item


def finish_batch(started: tuple[Any, Any], source: FeatureSource) -> Any:
    """Wait for the fetches, move the batch to the loader's device as DGL does, and put the features in place."""
    batch, pending = started
    device = source.loader.device
    if pending is None:
        from dgl.dataloading.dataloader import _assign_for, _prefetch

        batch, feats, _ = _prefetch(batch, source.loader, None)
        return recursive_apply_pair(batch, feats, _assign_for)
    feats = recursive_apply(pending, _wait)
    batch = recursive_apply(batch, lambda x: x.to(device, non_blocking=True))
    return recursive_apply_pair(batch, feats, _assign)


def input_ids(batch: Any) -> torch.Tensor | Mapping[str, torch.Tensor] | None:
    """The ids a batch reads features for, as ``upcoming()`` lists them: a node- or edge-wise
    batch's ``input_nodes`` (its first item), or a subgraph's ``dgl.NID``."""
    first = batch[0] if isinstance(batch, (tuple, list)) and batch else batch
    if isinstance(first, (torch.Tensor, Mapping)):
        return first
    if isinstance(first, DGLGraph):
        return first.ndata[NID] if NID in first.ndata else None
    return None


def announce(batch: Any, source: FeatureSource) -> None:
    """Tell every store behind a lazy node field which ids this batch will read from it."""
    def visit(item):
        if isinstance(item, DGLGraph):
            for _, ntype, _, parent, ids in _lazy_columns(item._node_frames, item.ntypes, NID):
                store = source.prefetchers(parent, ntype)
                if store is not None:
                    store.prefetch(ids)
        return item

    recursive_apply(batch, visit)


class DGLBatches(BatchAdapter):
    """DGL's batches for the pipeline: their ids, the hints to the stores behind their lazy node fields, and
    their lazy features filled (:func:`start_batch`, :func:`finish_batch`), all read from ``source``.

    Examples
    --------
    >>> import dgl, torch
    >>> from directload.loaders.dgl import DataLoader
    >>> g = dgl.rand_graph(30, 90)
    >>> g.ndata["feat"] = torch.randn(30, 4)
    >>> sampler = dgl.dataloading.NeighborSampler([2], prefetch_node_feats=["feat"])
    >>> batches = DGLBatches(FeatureSource(DataLoader(g, torch.arange(10), sampler, batch_size=5)))
    >>> sampled = next(iter(dgl.dataloading.DataLoader(g, torch.arange(10), sampler, batch_size=5)))
    >>> input_nodes, _, blocks = batches.finish(batches.start(sampled))
    >>> torch.equal(blocks[0].srcdata["feat"], g.ndata["feat"][input_nodes])
    True
    """

    def __init__(self, source: FeatureSource) -> None:
        self.source = source

    def ids(self, batch: Any) -> torch.Tensor | Mapping[str, torch.Tensor] | None:
        return input_ids(batch)

    def announce(self, batch: Any) -> None:
        announce(batch, self.source)

    def start(self, batch: Any) -> tuple[Any, Any]:
        return start_batch(batch, self.source)

    def finish(self, started: tuple[Any, Any]) -> Any:
        return finish_batch(started, self.source)

    def stores(self) -> list[FeatureStore]:
        return [t for _, t in self.source.given_tables() if isinstance(t, FeatureStore)]
