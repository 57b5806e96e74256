"""``NeighborSampler``: directload's sampler as a PyG ``BaseSampler``, for ``NeighborLoader(neighbor_sampler=...)``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch_geometric.data import Data, HeteroData
from torch_geometric.sampler import BaseSampler, HeteroSamplerOutput, NumNeighbors, SamplerOutput
from torch_geometric.sampler.neighbor_sampler import edge_sample, node_sample

from directload.batch_device import BatchDevice
from directload.graph import CSCGraph
from directload.sampler import HeteroNeighborSampler, check_device
from directload.sampler import NeighborSampler as _Sampler

if TYPE_CHECKING:
    from torch_geometric.data import FeatureStore, GraphStore
    from torch_geometric.sampler import EdgeSamplerInput, NegativeSampling, NodeSamplerInput
    from torch_geometric.sampler.base import SubgraphType

__all__ = ["NeighborSampler", "unsupported_options"]


def unsupported_options(*, subgraph_type: SubgraphType | str = "directional", disjoint: bool = False,
                        temporal_strategy: str = "uniform", time_attr: str | None = None,
                        input_time: torch.Tensor | None = None, edge_label_time: torch.Tensor | None = None,
                        directed: bool = True, sample_direction: str = "forward", **_: Any) -> list[str]:
    """The ``NeighborLoader`` or ``LinkNeighborLoader`` options directload's sampler does not implement, by name
    (empty: none).

    Every other option of PyG's loaders is implemented: ``replace`` and
    ``weight_attr`` by the sampler, ``is_sorted`` needs nothing (a hint:
    directload sorts what needs sorting), and the rest (``transform``,
    ``filter_per_worker``, ``neg_sampling``, ``edge_label``, ...) is PyG's
    own loader code around any sampler.

    Examples
    --------
    >>> from directload.loaders.pyg.sampler import unsupported_options
    >>> unsupported_options(), unsupported_options(disjoint=True, time_attr="t")
    ([], ['disjoint', 'time_attr'])
    """
    out = []
    if str(getattr(subgraph_type, "value", subgraph_type)) != "directional":
        out.append("subgraph_type")
    if not directed:  # PyG's deprecated spelling of subgraph_type="induced"
        out.append("directed")
    if disjoint:
        out.append("disjoint")
    if temporal_strategy != "uniform":
        out.append("temporal_strategy")
    if time_attr is not None:
        out.append("time_attr")
    if input_time is not None:
        out.append("input_time")
    if edge_label_time is not None:
        out.append("edge_label_time")
    if sample_direction != "forward":
        out.append("sample_direction")
    return out


def _weights(store, weight_attr):
    if weight_attr is None:
        return None
    if weight_attr not in store:
        raise ValueError(f"weight_attr {weight_attr!r} is not an edge attribute of the graph")
    return store[weight_attr]


def _graphs_of(data, weight_attr):
    """``(graph or {edge_type: graph}, num_nodes or {type: count})`` of a Data, a HeteroData or a store pair."""
    if isinstance(data, Data):
        return (CSCGraph.from_edge_index(data.edge_index, data.num_nodes, edge_weight=_weights(data, weight_attr)),
                data.num_nodes)
    if isinstance(data, HeteroData):
        num_nodes = {t: data[t].num_nodes for t in data.node_types}
        graphs = {}
        for et in data.edge_types:
            src, _, dst = et
            graphs[et] = CSCGraph.from_edge_index(data[et].edge_index, num_nodes[dst], num_src_nodes=num_nodes[src],
                                                  edge_weight=_weights(data[et], weight_attr))
        return graphs, num_nodes
    if isinstance(data, (tuple, list)) and len(data) == 2:
        if weight_attr is not None:
            raise ValueError("weight_attr needs a Data or HeteroData (a GraphStore holds no edge weights)")
        attrs = data[1].get_all_edge_attrs()
        rows, cols, perms = data[1].coo()  # any stored layout, as COO; perm: positions in the stored edges
        if not isinstance(rows, dict):
            rows, cols, perms = {attrs[0].edge_type: rows}, {attrs[0].edge_type: cols}, {attrs[0].edge_type: perms}
        num_nodes = {}
        for a in attrs:
            if a.size is None:
                raise ValueError(f"the GraphStore's edges {a.edge_type!r} have no size; put them with size=")
            if a.edge_type is None:
                return _coo_graph(rows[None], cols[None], perms[None], max(a.size), max(a.size)), max(a.size)
            src, _, dst = a.edge_type
            num_nodes[src], num_nodes[dst] = a.size
        return {a.edge_type: _coo_graph(rows[a.edge_type], cols[a.edge_type], perms.get(a.edge_type),
                                        num_nodes[a.edge_type[2]], num_nodes[a.edge_type[0]]) for a in attrs}, num_nodes
    raise TypeError(f"data must be a Data, a HeteroData or a (FeatureStore, GraphStore), got {type(data).__name__}")


def _given_graph(graph, data, weight_attr):
    """``(graph, num_nodes)`` of a CSC given for a homogeneous ``data``, checked against it."""
    if not isinstance(graph, CSCGraph):
        raise TypeError(f"graph must be a directload.graph.CSCGraph, got {type(graph).__name__}")
    if not isinstance(data, Data):
        raise TypeError("graph= is for a homogeneous Data; a HeteroData or a store pair builds its own")
    if weight_attr is not None:
        raise ValueError("graph= carries no weights of data's: leave out weight_attr, or graph=")
    if graph.num_nodes != data.num_nodes or graph.num_edges != data.num_edges:
        raise ValueError(f"graph has {graph.num_nodes} nodes and {graph.num_edges} edges; data has "
                         f"{data.num_nodes} and {data.num_edges}")
    return graph, data.num_nodes


def _coo_graph(row, col, perm, num_dst, num_src):
    g = CSCGraph.from_edge_index(torch.stack([row, col]), num_dst, num_src_nodes=num_src)
    if perm is None:
        return g
    eids = perm if g.eids is None else perm[g.eids]  # edge ids in the store's own numbering
    return CSCGraph(g.indptr, g.indices, eids=eids, num_src_nodes=num_src, check=False)


class NeighborSampler(BaseSampler):
    """directload's neighbour sampler behind PyG's ``BaseSampler`` contract.

    Pass it to PyG's own loaders (``NeighborLoader(data, num_neighbors,
    neighbor_sampler=NeighborSampler(data, num_neighbors))``, or
    ``LinkNeighborLoader``); PyG then builds every batch with its own code.
    Batches carry ``n_id``, ``e_id`` (the edges' positions in
    ``edge_index``), ``batch_size`` and the per-hop ``num_sampled_nodes`` and
    ``num_sampled_edges`` that ``trim_to_layer`` reads.

    The distribution is PyG's: at each hop, every node new at the hop before
    gets ``min(fanout, degree)`` distinct in-edges, uniformly at random (as
    pyg-lib; torch-sparse under-samples each list's last neighbour), all of
    them for -1, ``fanout`` draws with ``replace=True``, or picks
    proportional to ``weight_attr``.  The batches are not PyG's: each is a
    pure function of its key, drawn from torch's default generator (or
    ``generator``), so ``torch.manual_seed`` fixes them on any thread count
    and on CPU or GPU.  Temporal, disjoint and induced sampling are not
    implemented (:func:`unsupported_options`); directload's ``NeighborLoader``
    falls back to PyG's sampler for them.

    Parameters
    ----------
    data : Data, HeteroData or (FeatureStore, GraphStore)
    num_neighbors : list of int or dict
        As for PyG's ``NeighborLoader``.
    replace : bool
    weight_attr : str, optional
        An edge attribute of non-negative sampling weights.
    device : str, torch.device or BatchDevice, optional
        ``"cuda"``: sample on the GPU from the graph in pinned, mapped host
        memory (homogeneous and heterogeneous graphs).  The batch is handed
        to PyG on the CPU, where PyG's own loader indexes the data's tables,
        unless ``keep_on_device``.
    keep_on_device : bool
        Hand PyG the batch where it was sampled (directload's loaders, whose
        tables are on the device, ask for this with ``device=``).
    graph : CSCGraph, optional
        The homogeneous graph's CSC when it is built already (a dataset's
        kept CSC, mapped from its files: one copy in memory for every process
        of the machine, as ``directload train --nproc N`` shares it), instead
        of one built from ``data``'s edges.  Its node and edge counts must be
        ``data``'s and its edge ids positions in ``edge_index``.
    generator : torch.Generator, optional

    Examples
    --------
    >>> import torch
    >>> from torch_geometric.data import Data
    >>> from torch_geometric.loader import NeighborLoader
    >>> from directload.loaders.pyg import NeighborSampler
    >>> data = Data(x=torch.randn(4, 2), edge_index=torch.tensor([[1, 2, 3, 0], [0, 0, 0, 1]]))
    >>> loader = NeighborLoader(data, [2], batch_size=1, neighbor_sampler=NeighborSampler(data, [2]))
    >>> batch = next(iter(loader))
    >>> batch.batch_size, batch.num_sampled_nodes, batch.num_sampled_edges
    (1, [1, 2], [2])
    """

    sampler: _Sampler | HeteroNeighborSampler

    def __init__(self, data: Data | HeteroData | tuple[FeatureStore, GraphStore],
                 num_neighbors: NumNeighbors | list[int] | dict[tuple[str, str, str], list[int]], *,
                 replace: bool = False, weight_attr: str | None = None,
                 device: torch.device | str | BatchDevice | None = None, keep_on_device: bool = False,
                 graph: CSCGraph | None = None, generator: torch.Generator | None = None) -> None:
        # Before any work: the graph is built and pinned for a usable device only.
        where = device if isinstance(device, BatchDevice) else check_device(device)
        on_cuda = not isinstance(where, BatchDevice) and where.type == "cuda"
        built, num_nodes = (_given_graph(graph, data, weight_attr) if graph is not None
                            else _graphs_of(data, weight_attr))
        self.keep_on_device = bool(keep_on_device)
        self.num_neighbors = num_neighbors if isinstance(num_neighbors, NumNeighbors) else NumNeighbors(num_neighbors)
        self.num_nodes = num_nodes
        self.is_hetero = isinstance(built, dict)
        weighted = weight_attr is not None
        if isinstance(built, dict):
            fanouts = self.num_neighbors.get_values(list(built))
            if on_cuda:  # pinned and mapped in place: the GPU kernels read them zero-copy
                built = {et: g.to_unified() for et, g in built.items()}
            self.sampler = HeteroNeighborSampler(built, num_nodes, fanouts, replace=replace, weighted=weighted,
                                                 layout="pyg", device=where, generator=generator)
        else:
            if on_cuda:
                built = built.to_unified()  # pinned and mapped in place: the GPU kernels read it zero-copy
            self.sampler = _Sampler(built, self.num_neighbors.get_values(), replace=replace, weighted=weighted,
                                    layout="pyg", device=where, generator=generator)
        self.disjoint, self.node_time = False, None

    def __repr__(self):
        return f"directload.loaders.pyg.NeighborSampler({self.sampler!r})"

    @property
    def edge_permutation(self) -> None:
        return None  # ``edge`` already holds the edges' positions in ``edge_index``

    def sample_from_nodes(self, inputs: NodeSamplerInput) -> SamplerOutput | HeteroSamplerOutput:
        """Sample around a batch of seed nodes (PyG's own ``node_sample``)."""
        if inputs.time is not None:
            raise ValueError("directload's sampler does not sample in time; use PyG's sampler for input_time")
        return node_sample(inputs, self._sample)

    def sample_from_edges(self, inputs: EdgeSamplerInput,
                          neg_sampling: NegativeSampling | None = None) -> SamplerOutput | HeteroSamplerOutput:
        """Sample around a batch of edges' source and destination nodes, negatives included (PyG's own
        ``edge_sample``: binary or triplet negatives, ``edge_label_index`` local to the batch)."""
        if inputs.time is not None:
            raise ValueError("directload's sampler does not sample in time; use PyG's sampler for edge_label_time")
        return edge_sample(inputs, self._sample, self.num_nodes, False, None, neg_sampling)

    def _sample(self, seed, seed_time=None):
        if seed_time is not None:
            raise ValueError("directload's sampler does not sample in time; use PyG's sampler for time_attr")
        out = (lambda t: t) if self.keep_on_device else (lambda t: t.cpu())
        if not self.is_hetero:
            if isinstance(seed, dict):
                (seed,) = seed.values()
            b = self.sampler.sample(seed)
            empty = torch.empty(0, dtype=torch.int64, device=self.sampler.device)
            row, col, edge = (out(torch.cat(parts)) for parts in zip(*b.hops)) if b.hops else (out(empty),) * 3
            return SamplerOutput(node=out(b.nodes), row=row, col=col, edge=edge, batch=None,
                                 num_sampled_nodes=b.num_sampled_nodes, num_sampled_edges=b.num_sampled_edges)
        b = self.sampler.sample(seed)
        row, col, edge = {}, {}, {}
        for et in self.sampler.graphs:
            parts = [hop[et] for hop in b.hops]
            row[et], col[et], edge[et] = (out(torch.cat(p)) for p in zip(*parts))
        return HeteroSamplerOutput(node={t: out(n) for t, n in b.nodes.items()}, row=row, col=col, edge=edge,
                                   batch=None,
                                   num_sampled_nodes=b.num_sampled_nodes, num_sampled_edges=b.num_sampled_edges)
