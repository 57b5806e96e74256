"""``GraphStore``: PyG's graph-store interface over in-memory edge indices, for ``(FeatureStore, GraphStore)``."""

from __future__ import annotations

from torch_geometric.data import EdgeAttr
from torch_geometric.data import GraphStore as _PygGraphStore

__all__ = ["GraphStore"]


class GraphStore(_PygGraphStore):
    """Edge indices in memory, keyed by edge type, layout and order.

    PyG's samplers read the graph through this interface (``csc()``), so it
    pairs with :class:`~directload.loaders.pyg.FeatureStore` in
    ``NeighborLoader((feature_store, graph_store), ...)``.  Each edge
    attribute must give ``size`` (source and destination node counts): a
    homogeneous sampler takes the node count from it.

    Examples
    --------
    >>> import torch
    >>> from directload.loaders.pyg import GraphStore
    >>> gs = GraphStore()
    >>> gs.put_edge_index((torch.tensor([0, 1]), torch.tensor([1, 2])), edge_type=None, layout="coo", size=(3, 3))
    True
    >>> [a.size for a in gs.get_all_edge_attrs()]
    [(3, 3)]
    """

    def __init__(self) -> None:
        super().__init__()
        self.__dict__["_edges"] = {}

    @staticmethod
    def _key(attr):
        return attr.edge_type, attr.layout.value, attr.is_sorted, attr.size

    def _put_edge_index(self, edge_index, edge_attr):
        if edge_attr.size is None:
            raise ValueError(f"edge type {edge_attr.edge_type!r}: give size=(num_src_nodes, num_dst_nodes); "
                             "PyG's samplers take the node count from it")
        if len(edge_index) != 2:
            raise ValueError("edge_index must be a pair of tensors (row, col), or (rowptr, col) / (row, colptr)")
        self._edges[self._key(edge_attr)] = tuple(edge_index)
        return True

    def _get_edge_index(self, edge_attr):
        return self._edges.get(self._key(edge_attr))

    def _remove_edge_index(self, edge_attr):
        return self._edges.pop(self._key(edge_attr), None) is not None

    def get_all_edge_attrs(self) -> list[EdgeAttr]:
        return [EdgeAttr(*key) for key in self._edges]
