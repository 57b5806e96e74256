"""``NeighborLoader``: PyG's NeighborLoader with node features gathered by directload, sampled ahead."""

from __future__ import annotations

import inspect
import os
import warnings
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import torch
from torch_geometric.data import Data, HeteroData
from torch_geometric.loader import NeighborLoader as _PygNeighborLoader
from torch_geometric.sampler import BaseSampler
from torch_geometric.sampler import NeighborSampler as PygNeighborSampler

import directload
from directload.batch_device import BatchDevice
from directload.errors import SamplerWarning
from directload.kernels.operands import can_gather
from directload.units import check_int

from ..pipeline import (
    AutoLookahead,
    BatchAdapter,
    Epoch,
    Pipeline,
    check_lookahead,
    resolve_overlap,
    resolve_sampling,
)
from .device import device_data, on_device, resolve_device
from .feature_store import FeatureStore
from .graph_store import GraphStore
from .sampler import NeighborSampler, unsupported_options

if TYPE_CHECKING:
    from torch_geometric.data import FeatureStore as PygFeatureStore
    from torch_geometric.data import GraphStore as PygGraphStore

    from directload.stores import FeatureStore as Store

__all__ = ["NeighborLoader", "PipelinedLoader", "PygBatches", "stores_from", "unified_data", "resolve_sampler",
           "sampling_of", "describe_sampler", "check_ids"]


def _unify(value, affinity):
    """``value`` as a unified tensor sharing its memory, when it is a table directload can gather."""
    if can_gather(value) and value.device.type == "cpu":
        return directload.to_unified(value, affinity, pin="auto")
    return value


def unified_data(data: Data | HeteroData, *, affinity: str = "cuda") -> Data | HeteroData:
    """A shallow copy of a ``Data``/``HeteroData`` whose node tables are unified tensors (zero-copy).

    Every node-level tensor that directload can gather (contiguous, CPU,
    1/2/4/8-byte elements, no autograd) becomes :func:`directload.to_unified`
    of itself, sharing its memory; PyG's own ``index_select`` on it then runs
    directload's gather (zero-copy on a GPU with ``affinity="cuda"``).
    Everything else, edges included, is left as it is.
    """
    out = data.__copy__()
    for store, new in zip(data.node_stores, out.node_stores):
        for key, value in store.items():
            if store.is_node_attr(key) and isinstance(value, torch.Tensor):
                new[key] = _unify(value, affinity)
    return out


def stores_from(data: Data | HeteroData, *, affinity: str = "cuda",
                device: torch.device | str | None = None) -> tuple[FeatureStore, GraphStore]:
    """``(FeatureStore, GraphStore)`` holding a ``Data``/``HeteroData``'s node tables and edges.

    Node-level tensors become unified tensors (zero-copy, as in
    :func:`unified_data`); edges are stored in COO with their sizes.  Edge
    features are not carried over: PyG's loaders do not read them from a
    feature store.

    Examples
    --------
    >>> import torch
    >>> from torch_geometric.data import Data
    >>> from directload.loaders.pyg import stores_from
    >>> fs, gs = stores_from(Data(x=torch.randn(4, 2), edge_index=torch.tensor([[0, 1], [1, 2]])))
    >>> [a.attr_name for a in fs.get_all_tensor_attrs()], gs.get_all_edge_attrs()[0].size
    (['x'], (4, 4))
    """
    fs, gs = FeatureStore(device=device), GraphStore()
    if isinstance(data, HeteroData):
        for node_type in data.node_types:
            store = data[node_type]
            for key, value in store.items():
                if store.is_node_attr(key) and isinstance(value, torch.Tensor):
                    fs.put_tensor(_unify(value, affinity), group_name=node_type, attr_name=key, index=None)
        for edge_type in data.edge_types:
            src, _, dst = edge_type
            row, col = data[edge_type].edge_index
            gs.put_edge_index((row, col), edge_type=edge_type, layout="coo",
                              size=(data[src].num_nodes, data[dst].num_nodes))
        return fs, gs
    if not isinstance(data, Data):
        raise TypeError(f"stores_from takes a torch_geometric Data or HeteroData, got {type(data).__name__}")
    for key, value in data.items():
        if data.is_node_attr(key) and isinstance(value, torch.Tensor):
            fs.put_tensor(_unify(value, affinity), group_name=None, attr_name=key, index=None)
    n = data.num_nodes
    row, col = data.edge_index
    gs.put_edge_index((row, col), edge_type=None, layout="coo", size=(n, n))
    return fs, gs


class PipelinedLoader:
    """What directload's PyG loaders add to PyG's: the sampler chosen (:func:`resolve_sampler`), the node tables
    unified, and an epoch sampled ``lookahead`` batches ahead through directload's pipeline.

    A loader class lists it before PyG's loader class (``pyg_loader``), calls ``_prepare`` on its options before
    PyG's ``__init__`` and ``_start`` after it; its ``_get_iterator`` then runs the pipeline.

    Examples
    --------
    >>> from directload.loaders.pyg import NeighborLoader
    >>> issubclass(NeighborLoader, PipelinedLoader), NeighborLoader.pyg_loader.__module__
    (True, 'torch_geometric.loader.neighbor_loader')
    """

    pyg_loader: type

    sampling: str
    data: Any
    filter_fn: Callable[[Any], Any]
    filter_per_worker: bool
    num_workers: int
    persistent_workers: bool

    def _prepare(self, data, num_neighbors, args, kwargs, *, lookahead, affinity, sampler, device=None):
        """Check the options, name the positional ones (into ``kwargs``), choose the sampler (into
        ``kwargs["neighbor_sampler"]``) and return the data to hand to PyG (node tables unified, or seen from
        the device with ``device=``)."""
        params = [p for p in inspect.signature(self.pyg_loader.__init__).parameters if p != "kwargs"][3:]
        if len(args) > len(params):
            raise TypeError(f"{type(self).__name__} takes at most {len(params) + 2} positional arguments")
        kwargs.update(zip(params, args))
        check_lookahead(lookahead)
        check_int("batch_size", kwargs.get("batch_size", 1))
        self.batch_device = resolve_device(device, kwargs.get("num_workers") or 0)
        if sampler is not None and not isinstance(sampler, str):
            kwargs["sampler"] = sampler  # torch's DataLoader option (a Sampler of seed positions), as PyG passes it
            sampler = None
        if resolve_sampler(sampler, kwargs) == "directload" and kwargs.get("neighbor_sampler") is None:
            kwargs["neighbor_sampler"] = NeighborSampler(
                data, num_neighbors, replace=kwargs.get("replace", False), weight_attr=kwargs.get("weight_attr"),
                device=self.batch_device, keep_on_device=self.batch_device is not None)
        if kwargs.get("neighbor_sampler") is None:
            _check_sampler()
        self.sampling = sampling_of(kwargs.get("neighbor_sampler"))
        if kwargs.get("filter_per_worker") is None and not kwargs.get("num_workers"):
            # Without workers, gather features in our pipeline (after sampling ahead) rather than
            # inside the sampling step; with workers, PyG's default gathers them in the workers.
            kwargs["filter_per_worker"] = False
        if not isinstance(data, (Data, HeteroData)):
            return data
        if self.batch_device is not None:
            return device_data(data, self.batch_device)
        return unified_data(data, affinity=affinity)

    def _start(self, lookahead, sample_in_thread, overlap):
        self.lookahead = lookahead
        self.auto_lookahead = AutoLookahead() if lookahead == "auto" else None
        if self.batch_device is not None:
            # The device path runs every stage on the caller's thread, in its stream's order: the device
            # overlaps the batches' kernels, and no stream has to wait for another's.
            self.sample_in_thread, self.overlap = False, False
            return
        self.sample_in_thread = resolve_sampling(sample_in_thread, self.num_workers)
        self.overlap = resolve_overlap(overlap, "cpu", os.cpu_count() or 1, torch.get_num_threads())

    def _get_iterator(self):
        if self.persistent_workers and self.num_workers > 0:
            return super()._get_iterator()  # type: ignore[misc]  # torch keeps and resets this iterator
        fs = self.data[0] if isinstance(self.data, tuple) and isinstance(self.data[0], FeatureStore) else None
        if self.filter_per_worker:
            # The workers sample and gather: the pipeline only looks ahead at finished batches.
            batches, adapter = super()._get_iterator(), PygBatches(fs, None, gathered=True)  # type: ignore[misc]
        else:
            batches = torch.utils.data.DataLoader._get_iterator(self)  # type: ignore[arg-type]  # a DataLoader
            adapter = PygBatches(fs, self.filter_fn,
                                 device=self.batch_device.device if self.batch_device is not None else None)
        pipeline = Pipeline(batches, adapter, device="cpu", lookahead=self.auto_lookahead or self.lookahead,
                            sample_in_thread=self.sample_in_thread, overlap=self.overlap)
        pipeline.prime()
        return Epoch(pipeline)


class NeighborLoader(PipelinedLoader, _PygNeighborLoader):
    """Drop-in replacement for ``torch_geometric.loader.NeighborLoader`` with directload's gathers.

    The same constructor and the same batches.  Over a ``Data`` or
    ``HeteroData``, node tables are registered in place as unified tensors
    (:func:`unified_data`), so PyG's own feature slicing runs directload's
    gather (zero-copy from pinned host memory on a GPU, the parallel CPU
    kernel otherwise); over ``(FeatureStore, GraphStore)`` the feature store
    is asked once per batch.  Batches are sampled ``lookahead`` ahead on the
    caller's thread (the same draws as PyG's), their node ids listed by the
    epoch iterator's ``upcoming()`` and passed to feature stores with a
    ``prefetch`` hook; features are gathered when the batch is taken, or on
    a background thread with ``overlap``.

    Parameters
    ----------
    data, num_neighbors, *args, **kwargs
        As for PyG's ``NeighborLoader``.  Seed nodes outside the graph raise
        ``IndexError`` here, before any sampling.
    lookahead : int or "auto"
        Batches sampled ahead (default 4); ``"auto"`` as for
        :class:`directload.loaders.dgl.DataLoader`.
    sample_in_thread, overlap : bool, optional
        As for :class:`directload.loaders.dgl.DataLoader`.
    sampler : {"pyg", "directload"} or torch.utils.data.Sampler, optional
        Whose neighbour sampler runs (:func:`resolve_sampler`; the attribute
        ``sampling`` says which did: ``"pyg"``, ``"directload"``, or
        ``"user"`` for a ``neighbor_sampler=`` of the caller's, always
        kept).  ``"pyg"`` (the default where PyG can sample): PyG's own
        batches, bit for bit.  ``"directload"`` (the default where PyG has
        no sampler): :class:`~directload.loaders.pyg.NeighborSampler`, PyG's
        distribution (uniform without replacement), not its batches, with
        per-hop counts; an option it does not implement falls back to PyG's
        sampler with a warning.  A ``Sampler`` object is torch's
        ``DataLoader`` option, passed on.
    affinity : {"cuda", "host"}
        Affinity of the unified node tables made from a ``Data``: ``"cuda"``
        gathers straight onto the GPU where one exists.
    device : str, torch.device or BatchDevice, optional
        Where batches are made (directload's option; None: the CPU, as
        PyG's).  ``"cuda"`` with ``sampler="directload"``: the whole batch is
        made on the GPU and never comes back to the host: the seeds go up,
        the picks, relabelling, ``edge_index``, ``n_id``, ``e_id`` and the
        per-hop counts are the GPU sampler's, and every node and edge table
        (``x``, ``y``, ...) is gathered zero-copy from pinned, mapped host
        memory into device memory.  One host read per batch (the counts PyG
        keeps as Python ints), plus one per hop of fanout -1.  With PyG's
        sampler, its batch is made on the CPU and moved.  The device path
        runs its stages on the caller's thread, in stream order, and takes
        no ``num_workers``.

    Examples
    --------
    >>> import torch
    >>> from torch_geometric.data import Data
    >>> from directload.loaders.pyg import NeighborLoader
    >>> data = Data(x=torch.randn(100, 8), edge_index=torch.randint(0, 100, (2, 500)))
    >>> batch = next(iter(NeighborLoader(data, num_neighbors=[5, 5], batch_size=10)))
    >>> torch.equal(batch.x, data.x[batch.n_id])
    True
    """

    pyg_loader = _PygNeighborLoader

    def __init__(self, data: Data | HeteroData | tuple[PygFeatureStore, PygGraphStore],
                 num_neighbors: list[int] | dict[tuple[str, str, str], list[int]], *args: Any,
                 lookahead: int | str = 4, sample_in_thread: bool | None = None, overlap: bool | None = None,
                 affinity: str = "cuda", sampler: str | torch.utils.data.Sampler | None = None,
                 device: torch.device | str | BatchDevice | None = None, **kwargs: Any) -> None:
        data = self._prepare(data, num_neighbors, args, kwargs, lookahead=lookahead, affinity=affinity,
                             sampler=sampler, device=device)
        super().__init__(data, num_neighbors, **kwargs)
        _check_seeds(self.input_data, self.node_sampler)
        self._start(lookahead, sample_in_thread, overlap)


def _pyg_can_sample():
    import torch_geometric.typing as pyg_typing

    return bool(pyg_typing.WITH_PYG_LIB or pyg_typing.WITH_TORCH_SPARSE)


def resolve_sampler(sampler: str | None, options: Mapping[str, Any]) -> str:
    """Whose sampler a loader runs: ``"directload"`` or ``"pyg"``, from ``sampler=`` and its options.

    ``None``: PyG's where PyG can sample (pyg-lib or torch-sparse), else
    directload's, said once.  ``"directload"`` with an option it does not
    implement (:func:`~directload.loaders.pyg.sampler.unsupported_options`)
    falls back to PyG's with a one-line warning.  A ``neighbor_sampler=``
    of the caller's is kept as it is (``"pyg"``: PyG's loader runs it),
    with a one-line warning naming it and what it overrides where
    directload's sampler would have run.

    Examples
    --------
    >>> import warnings
    >>> resolve_sampler("pyg", {}), resolve_sampler("directload", {})
    ('pyg', 'directload')
    >>> with warnings.catch_warnings(record=True) as w:
    ...     warnings.simplefilter("always")
    ...     resolve_sampler("directload", {"disjoint": True}), str(w[0].message)
    ('pyg', "directload's sampler does not implement disjoint: PyG's own sampler runs instead")
    """
    if sampler not in (None, "pyg", "framework", "directload"):
        raise ValueError(f"sampler must be 'pyg' (or 'framework') or 'directload', got {sampler!r}")
    if sampler is None and not _pyg_can_sample():
        sampler = "directload"
        if options.get("neighbor_sampler") is None:
            _note_once("neither pyg-lib nor torch-sparse loads: directload's sampler runs (PyG's distribution, not "
                       "its batches; sampler='directload')")
    if sampler != "directload":
        return "pyg"
    user = options.get("neighbor_sampler")
    if user is not None:
        if not isinstance(user, NeighborSampler):
            warnings.warn(f"{describe_sampler(user)} runs instead of directload's sampler", SamplerWarning,
                          stacklevel=4)
        return "pyg"
    missing = unsupported_options(**options)
    if missing:
        warnings.warn(f"directload's sampler does not implement {', '.join(missing)}: PyG's own sampler runs "
                      "instead", SamplerWarning, stacklevel=4)
        return "pyg"
    return "directload"


def describe_sampler(sampler: object) -> str:
    """``neighbor_sampler=`` named by its class and the sampling methods it overrides, for a warning.

    Examples
    --------
    >>> from torch_geometric.sampler import NeighborSampler as PygSampler
    >>> class Mine(PygSampler):
    ...     def sample_from_nodes(self, inputs):
    ...         return super().sample_from_nodes(inputs)
    >>> describe_sampler(Mine.__new__(Mine))
    'neighbor_sampler=Mine (overrides sample_from_nodes)'
    >>> describe_sampler(PygSampler.__new__(PygSampler))
    "neighbor_sampler=NeighborSampler (PyG's)"
    """
    cls = type(sampler)
    if cls is PygNeighborSampler:
        return "neighbor_sampler=NeighborSampler (PyG's)"
    base = PygNeighborSampler if isinstance(sampler, PygNeighborSampler) else BaseSampler
    methods = [m for m in ("sample_from_nodes", "sample_from_edges") if getattr(cls, m, None) is not getattr(base, m)]
    return f"neighbor_sampler={cls.__name__} (overrides {', '.join(methods) or 'no sampling method'})"


def sampling_of(neighbor_sampler: object) -> str:
    """What ``sampling`` says for a loader built with ``neighbor_sampler`` (None: PyG's own).

    Examples
    --------
    >>> sampling_of(None)
    'pyg'
    """
    if neighbor_sampler is None or type(neighbor_sampler) is PygNeighborSampler:
        return "pyg"
    return "directload" if isinstance(neighbor_sampler, NeighborSampler) else "user"


_NOTED: set[str] = set()


def _note_once(message):
    if message not in _NOTED:
        _NOTED.add(message)
        warnings.warn(message, SamplerWarning, stacklevel=5)


def _check_sampler():
    """``ImportError`` naming the extra when PyG's own sampler is asked for and PyG has none (PyG alone would
    fail mid-epoch)."""
    if not _pyg_can_sample():
        raise ImportError(
            f"PyG's own sampler needs pyg-lib or torch-sparse, and neither loads here (torch {torch.__version__}): "
            "use sampler='directload', or pip install 'directload[pyg-sampler]' with --no-build-isolation to build "
            "torch-sparse against this torch (see the README's install matrix)")


class PygBatches(BatchAdapter):
    """PyG's batches for the pipeline.  Sampler outputs (``gathered=False``) are announced to directload's
    ``feature_store`` (its stores get ``prefetch``) and finished by PyG's own ``filter_fn`` (features
    gathered, the batch built); batches the workers built already (``gathered=True``) pass as they are,
    their ``n_id`` listed as upcoming.

    Examples
    --------
    >>> from torch_geometric.data import Data
    >>> batch = Data(x=torch.zeros(3, 1), n_id=torch.tensor([4, 0, 2]))
    >>> PygBatches(None, None, gathered=True).ids(batch).tolist()
    [4, 0, 2]
    """

    def __init__(self, feature_store: FeatureStore | None, filter_fn: Callable[[Any], Any] | None, *,
                 gathered: bool = False, device: torch.device | None = None) -> None:
        self.feature_store, self.filter_fn, self.gathered = feature_store, filter_fn, gathered
        self.device = device

    def ids(self, batch: Any) -> torch.Tensor | Mapping[str, torch.Tensor]:
        if not self.gathered:
            return batch.node
        if isinstance(batch, HeteroData):
            return {node_type: batch[node_type].n_id for node_type in batch.node_types}
        return batch.n_id

    def announce(self, batch: Any) -> None:
        if self.gathered or self.feature_store is None:
            return
        if isinstance(batch.node, Mapping):
            for node_type, ids in batch.node.items():
                self.feature_store.prefetch(ids, node_type)
        else:
            self.feature_store.prefetch(batch.node)

    def finish(self, started: Any) -> Any:
        if self.gathered:
            return started
        batch = self.filter_fn(started)  # type: ignore[misc]  # given unless gathered
        return on_device(batch, self.device) if self.device is not None else batch

    def stores(self) -> list[Store]:
        return self.feature_store.stores() if self.feature_store is not None else []


def check_ids(ids: torch.Tensor | None, num_nodes: int | Mapping[Any, int] | None, node_type: Any,
              what: str) -> None:
    """``IndexError`` for node ids outside the graph (a sampler would read out of bounds), ``TypeError`` for ids
    that are not integers; ``num_nodes`` None (a sampler of the caller's that does not say) checks nothing.

    Examples
    --------
    >>> check_ids(torch.tensor([0, 3]), 4, None, "seed node")
    >>> check_ids(torch.tensor([0, 4]), {"paper": 4}, "paper", "seed node")
    Traceback (most recent call last):
    ...
    IndexError: seed node id 4 of type 'paper' is outside the graph's 4 nodes (valid 0..3)
    """
    if ids is None or not ids.numel() or num_nodes is None:
        return
    if ids.is_floating_point() or ids.dtype == torch.bool:
        raise TypeError(f"{what}s must be integer ids, got {ids.dtype}")
    n = num_nodes[node_type] if isinstance(num_nodes, Mapping) else num_nodes
    lo, hi = int(ids.min()), int(ids.max())
    if lo < 0 or hi >= n:
        bad = lo if lo < 0 else hi
        of = f" of type {node_type!r}" if node_type is not None else ""
        raise IndexError(f"{what} id {bad}{of} is outside the graph's {n} nodes (valid 0..{n - 1})")


def _check_seeds(input_data, sampler):
    nodes = input_data.node
    if nodes is not None and (nodes.is_floating_point() or nodes.dtype == torch.bool):
        raise TypeError(f"seed nodes must be integer ids or a boolean mask, got {nodes.dtype}")
    check_ids(nodes, getattr(sampler, "num_nodes", None), input_data.input_type, "seed node")
