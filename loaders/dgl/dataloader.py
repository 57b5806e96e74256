"""``directload.loaders.DataLoader``: DGL's DataLoader, with node features gathered by directload."""

from __future__ import annotations

import functools
import os
import warnings
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import dgl
import torch
from dgl.dataloading.dataloader import CollateWrapper

from directload.capabilities import NoDeviceError, usable_device
from directload.errors import DirectloadError, SamplerWarning
from directload.units import check_int

from ..pipeline import (
    AutoLookahead,
    Epoch,
    Pipeline,
    check_lookahead,
    resolve_overlap,
    resolve_sampling,
)
from .batches import DGLBatches, FeatureSource
from .sampler import NeighborSampler

if TYPE_CHECKING:
    from directload.stores import FeatureStore

__all__ = ["DataLoader", "check_indices", "resolve_sampler", "SAMPLERS", "UVAUnavailableError", "SeedTypeError"]

#: ``sampler=`` of :class:`DataLoader`: ``"framework"`` (or ``"dgl"``): DGL's batches bit for bit;
#: ``"directload"``: directload's sampler (DGL's distribution, not its batches).
SAMPLERS = ("framework", "dgl", "directload")


class UVAUnavailableError(NoDeviceError, dgl.DGLError):
    """``use_uva=True`` on a machine without a usable CUDA device.  DGL raises ``dgl.DGLError`` for it, so
    this is one (code that catches DGL's errors catches it) and directload's
    :class:`~directload.capabilities.NoDeviceError` too.

    Examples
    --------
    >>> issubclass(UVAUnavailableError, dgl.DGLError) and issubclass(UVAUnavailableError, NoDeviceError)
    True
    """


class SeedTypeError(DirectloadError, TypeError, dgl.DGLError):
    """Seed ids DGL's samplers cannot take: not integers, or not a dict ``{type: ids}`` on a graph with several
    types.  DGL raises ``dgl.DGLError`` for them (when it samples); this is one, and a ``TypeError``.

    Examples
    --------
    >>> issubclass(SeedTypeError, dgl.DGLError) and issubclass(SeedTypeError, TypeError)
    True
    """


def _seed_kind(sampler):
    """``"nodes"`` or ``"edges"`` when the sampler's seeds are graph ids, else None (ClusterGCN's
    partition numbers, SAINT's iteration counters, custom samplers)."""
    if isinstance(sampler, dgl.dataloading.EdgePredictionSampler):
        return "edges"
    if isinstance(sampler, (dgl.dataloading.BlockSampler, dgl.dataloading.ShaDowKHopSampler)):
        return "nodes"
    return None


def check_indices(graph: object, indices: object, sampler: object) -> None:
    """Raise ``IndexError`` for seed ids outside the graph, or :class:`SeedTypeError` for ids that are not
    integers (or not a dict on a graph with several types), before DGL samples.

    DGL's samplers abort the process (``c10::Error``) or crash (SIGSEGV) on an
    id out of range; this checks node ids of node-wise samplers and edge ids
    of edge-wise ones.  Indices that are not tensors (a custom dataset) and
    the seeds of subgraph samplers, which are not graph ids, are left to DGL.
    """
    kind = _seed_kind(sampler)
    if kind is None or not isinstance(graph, dgl.DGLGraph):
        return
    types = graph.ntypes if kind == "nodes" else graph.canonical_etypes
    if isinstance(indices, Mapping):
        items = list(indices.items())
    elif len(types) == 1:
        items = [(types[0], indices)]
    else:
        raise SeedTypeError(f"this graph has several {'node' if kind == 'nodes' else 'edge'} types: pass the seed "
                        "ids as a dict {type: ids}")
    for t, ids in items:
        if not torch.is_tensor(ids):
            try:
                ids = torch.as_tensor(ids)
            except (TypeError, ValueError, RuntimeError):
                continue  # left to DGL, which says what it accepts
        if ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool:
            raise SeedTypeError(f"seed ids must be integers, got {ids.dtype} (a boolean mask? pass mask.nonzero())")
        try:
            n = graph.num_nodes(t) if kind == "nodes" else graph.num_edges(t)
        except dgl.DGLError as exc:
            raise KeyError(f"seed ids given for {t!r}, which is not a {kind[:-1]} type of the graph") from exc
        if ids.numel():
            lo, hi = int(ids.min()), int(ids.max())
            if lo < 0 or hi >= n:
                bad = lo if lo < 0 else hi
                what = f" of type {t!r}" if len(types) > 1 else ""
                raise IndexError(f"seed {kind[:-1]} id {bad}{what} is outside the graph's {n} {kind} "
                                 f"(valid 0..{n - 1})")


#: What a class may define without changing how a DGL NeighborSampler samples: its ``__init__`` only sets
#: attributes, which :func:`_customised` checks one by one.
_BENIGN = frozenset({"__module__", "__qualname__", "__doc__", "__dict__", "__weakref__", "__annotations__",
                     "__firstlineno__", "__static_attributes__", "__init__"})


@functools.cache
def _dgl_attributes():
    """The attributes a DGL ``NeighborSampler`` has (those :meth:`NeighborSampler.from_dgl` carries and DGL's
    caches of the last graph)."""
    return frozenset(vars(dgl.dataloading.NeighborSampler([1])))


def _dgls_own(cls):
    return cls is object or cls.__module__ == "dgl" or cls.__module__.startswith("dgl.")


def _customised(graph_sampler):
    """``"MySampler overrides sample_blocks and sets attribute k"``: what user code changes in a DGL sampler
    (every name its own classes define, but ``__init__``; attributes a DGL ``NeighborSampler`` lacks); None
    for DGL's own classes with DGL's attributes."""
    cls = type(graph_sampler)
    methods = dict.fromkeys(name for c in cls.__mro__ if not _dgls_own(c) for name in vars(c) if name not in _BENIGN)
    attributes = []
    if isinstance(graph_sampler, dgl.dataloading.NeighborSampler):
        attributes = [name for name in vars(graph_sampler) if name not in _dgl_attributes()]
    parts = [f"overrides {', '.join(methods)}"] if methods else []
    if attributes:
        parts.append(f"sets attribute{'s' * (len(attributes) > 1)} {', '.join(attributes)}")
    return f"{cls.__name__} {' and '.join(parts)}" if parts else None


def resolve_sampler(sampler: str | None, graph_sampler: dgl.dataloading.Sampler,
                    use_uva: bool = False) -> dgl.dataloading.Sampler:
    """The graph sampler a :class:`DataLoader` runs, from its ``sampler=`` and ``graph_sampler``.

    ``"framework"``, ``"dgl"`` or None (what Lightning passes when it rebuilds
    a loader): ``graph_sampler`` as given.  ``"directload"``: DGL's own
    ``NeighborSampler`` (or ``MultiLayerFullNeighborSampler``) becomes
    directload's :class:`~directload.loaders.dgl.NeighborSampler` with its
    settings (with ``use_uva=True`` it samples on the GPU, over the pinned
    graph).  The one given runs, said in a one-line ``UserWarning``, for
    another kind of graph sampler, and for user code:
    a subclass that defines any method but ``__init__`` (``sample_blocks``,
    ``sample``, ``assign_lazy_features``, ...), or a sampler with attributes
    DGL's lacks ("MySampler overrides sample_blocks: DGL's sampler path runs;
    directload's sampler replaces only DGL's own NeighborSampler").  A
    directload ``NeighborSampler``, or a subclass of it, is always kept.

    Examples
    --------
    >>> import dgl, warnings
    >>> from directload.loaders.dgl import resolve_sampler
    >>> theirs = dgl.dataloading.NeighborSampler([5, 5])
    >>> type(resolve_sampler("framework", theirs)).__module__, type(resolve_sampler("directload", theirs)).__module__
    ('dgl.dataloading.neighbor_sampler', 'directload.loaders.dgl.sampler')
    >>> type(resolve_sampler("directload", theirs, use_uva=True)).__name__
    'NeighborSampler'
    >>> class Mine(dgl.dataloading.NeighborSampler):
    ...     def sample_blocks(self, g, seed_nodes, exclude_eids=None):
    ...         return super().sample_blocks(g, seed_nodes, exclude_eids)
    >>> mine = Mine([5, 5])
    >>> with warnings.catch_warnings(record=True) as w:
    ...     warnings.simplefilter("always")
    ...     resolve_sampler("directload", mine) is mine, str(w[0].message).split(":")[0]
    (True, 'Mine overrides sample_blocks')
    """
    if sampler is not None and sampler not in SAMPLERS:
        raise ValueError(f"sampler must be 'framework' (or 'dgl') or 'directload', got {sampler!r}")
    if sampler != "directload" or isinstance(graph_sampler, NeighborSampler):
        return graph_sampler
    custom = _customised(graph_sampler)
    if custom is not None:
        warnings.warn(f"{custom}: DGL's sampler path runs; directload's sampler replaces only DGL's own "
                      "NeighborSampler", SamplerWarning, stacklevel=3)
        return graph_sampler
    if not isinstance(graph_sampler, dgl.dataloading.NeighborSampler):
        warnings.warn(f"directload's sampler replaces DGL's NeighborSampler only, not {type(graph_sampler).__name__}"
                      ": the graph sampler given runs", SamplerWarning, stacklevel=3)
        return graph_sampler
    return NeighborSampler.from_dgl(graph_sampler)


class DataLoader(dgl.dataloading.DataLoader):
    """Drop-in replacement for :class:`dgl.dataloading.DataLoader`, for any DGL sampler.

    It *is* a DGL DataLoader (and a ``torch.utils.data.DataLoader``): same
    constructor, attributes (``graph``, ``indices``, ``graph_sampler``,
    ``batch_size``, ``device``, ``use_uva``, ``dataset``, ...), methods
    (``enable_cpu_affinity()``, ``attach_data()``) and batches.  Node
    features, labels and subgraph node data that the sampler marks for
    prefetching (``prefetch_node_feats``, ``prefetch_labels``,
    ``prefetch_ndata``) are gathered by directload: zero-copy on a GPU from a
    unified or pinned table, on the parallel CPU kernel otherwise.  Whatever
    directload does not accelerate (edge features, attached data, tables
    that need autograd, unusual dtypes, DGL's GPU caches) DGL fetches itself,
    so node-wise, edge-wise (``as_edge_prediction_sampler``, with negative
    sampling and ``exclude=``) and subgraph samplers (ClusterGCN, SAINT,
    ShaDow) all give DGL's batches.  Tables are read from the graph at every
    batch, as DGL does, so ``g.ndata["h"] = y`` between layers of layer-wise
    inference is seen.

    With ``sampler="directload"``, DGL's own ``NeighborSampler`` given as
    ``graph_sampler`` is replaced by directload's
    (:class:`~directload.loaders.dgl.NeighborSampler`, same settings): the
    same distribution, not DGL's batches; a subclass with methods of its own
    runs as written (:func:`resolve_sampler`, with a warning);
    ``loader.graph_sampler`` is the one that runs.

    Parameters
    ----------
    graph, indices, graph_sampler, device, use_ddp, ddp_seed, batch_size, drop_last, shuffle, \
use_prefetch_thread, use_alternate_streams, pin_prefetcher, use_uva, **kwargs
        As for DGL's DataLoader.  With the same seeds it yields the same batches.
        Checked before anything runs: ``device`` must exist on this machine,
        ``batch_size`` must be positive, and the seed ids of node- and
        edge-wise samplers must lie in the graph (``IndexError``; DGL itself
        crashes on them).
    sampler : {"framework", "dgl", "directload"}, optional
        Whose neighbour sampler runs: DGL's (the default; None is the same)
        or directload's.
    features : dict, optional
        ``{name: table}`` (``{name: {ntype: table}}`` on a heterogeneous graph)
        overriding the graph's node data for the fields the sampler marks; a
        table is a tensor (ideally a :func:`directload.to_unified` one) or a
        :class:`directload.stores.FeatureStore` (its ``read`` gathers, its
        ``prefetch`` hears of the batches sampled ahead).
    lookahead : int or "auto"
        Batches sampled ahead of the one being trained on (default 4).  Their
        ids are listed by the epoch iterator's ``upcoming()`` from ``iter()``
        on, and every store behind a prefetched node field gets
        ``prefetch(ids)`` with exactly the ids each batch will read from it.
        ``"auto"`` starts at 4 and picks each later epoch's L from the last
        one's stage times (:class:`~directload.loaders.lookahead.AutoLookahead`:
        the fetch of batch i+L must fit in the compute of batches i..i+L-1),
        bounded by the caches' read-ahead slots; ``loader.auto_lookahead.chosen``
        and each epoch's ``stats["lookahead"]`` report it.
    sample_in_thread : bool, optional
        Sample on a background thread.  Default: only with ``num_workers > 0``
        (see :func:`resolve_sampling`).
    overlap : bool, optional
        Gather the next batch's features on a background thread while the
        current one trains.  Default: on CUDA devices, and on the CPU when
        training leaves cores free (see :func:`resolve_overlap`).

    Examples
    --------
    >>> import dgl, torch
    >>> from directload.loaders.dgl import DataLoader
    >>> g = dgl.rand_graph(100, 500)
    >>> g.ndata["feat"] = torch.randn(100, 8)
    >>> sampler = dgl.dataloading.NeighborSampler([4, 4], prefetch_node_feats=["feat"])
    >>> loader = DataLoader(g, torch.arange(20), sampler, batch_size=10)
    >>> input_nodes, output_nodes, blocks = next(iter(loader))
    >>> torch.equal(blocks[0].srcdata["feat"], g.ndata["feat"][input_nodes])
    True
    """

    def __init__(self, graph: dgl.DGLGraph, indices: object, graph_sampler: dgl.dataloading.Sampler,
                 device: torch.device | str | None = None, use_ddp: bool = False, ddp_seed: int = 0,
                 batch_size: int = 1, drop_last: bool = False, shuffle: bool = False,
                 use_prefetch_thread: bool | None = None, use_alternate_streams: bool | None = None,
                 pin_prefetcher: bool | None = None, use_uva: bool = False, *, sampler: str | None = "framework",
                 features: Mapping[str, torch.Tensor | FeatureStore | Mapping[str, torch.Tensor | FeatureStore]]
                 | None = None, lookahead: int | str = 4, sample_in_thread: bool | None = None,
                 overlap: bool | None = None, **kwargs: Any) -> None:
        dgl_args = dict(device=device, use_ddp=use_ddp, ddp_seed=ddp_seed, batch_size=batch_size,
                        drop_last=drop_last, shuffle=shuffle, use_prefetch_thread=use_prefetch_thread,
                        use_alternate_streams=use_alternate_streams, pin_prefetcher=pin_prefetcher, use_uva=use_uva)
        if not isinstance(kwargs.get("collate_fn"), CollateWrapper):  # else: Lightning rebuilding a loader
            if use_uva and not torch.cuda.is_available():  # first: whatever device was asked for
                raise UVAUnavailableError("use_uva=True samples on a GPU, but this machine has no usable CUDA "
                                          "device; leave use_uva off")
            if device is not None:
                usable_device(device)  # DGL would hang or fail later on a device this machine lacks
            check_int("batch_size", batch_size)
            check_lookahead(lookahead)
            check_indices(graph, indices, graph_sampler)
        graph_sampler = resolve_sampler(sampler, graph_sampler, use_uva)
        super().__init__(graph, indices, graph_sampler, **dgl_args, **kwargs)
        self.features = features
        self.lookahead = lookahead
        self.auto_lookahead = AutoLookahead() if lookahead == "auto" else None
        self.sample_in_thread = resolve_sampling(sample_in_thread, self.num_workers)
        self.overlap = resolve_overlap(overlap, self.device, os.cpu_count() or 1, torch.get_num_threads())
        if isinstance(self.graph_sampler, NeighborSampler) and (
                use_uva or self.graph.device.type == "cuda" or self.graph_sampler.asks_for_gpu):
            # directload's GPU sampler: every stage on the caller's thread, in its stream's order (the device
            # overlaps the batches' kernels; no stream waits for another's)
            self.sample_in_thread = self.overlap = False
        self._source = FeatureSource(self, features)

    def __iter__(self) -> Epoch:
        """A new epoch: an :class:`~directload.loaders.pipeline.Epoch` iterator, its look-ahead already sampled."""
        if self.shuffle:
            self.dataset.shuffle()  # what DGL's own __iter__ does first
        # lookahead="auto" always comes with auto_lookahead: an int or an AutoLookahead reaches the pipeline
        pipeline = Pipeline(torch.utils.data.DataLoader.__iter__(self), DGLBatches(self._source), device=self.device,
                            lookahead=self.auto_lookahead or self.lookahead,  # type: ignore[arg-type]
                            sample_in_thread=self.sample_in_thread, overlap=self.overlap)
        epoch = Epoch(pipeline)
        pipeline.prime()
        return epoch
