"""``LinkNeighborLoader``: PyG's LinkNeighborLoader with node features gathered by directload, sampled ahead."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch_geometric.data import Data, HeteroData
from torch_geometric.loader import LinkNeighborLoader as _PygLinkNeighborLoader

from directload.batch_device import BatchDevice

from .loader import PipelinedLoader, check_ids

if TYPE_CHECKING:
    from torch_geometric.data import FeatureStore as PygFeatureStore
    from torch_geometric.data import GraphStore as PygGraphStore

__all__ = ["LinkNeighborLoader"]


class LinkNeighborLoader(PipelinedLoader, _PygLinkNeighborLoader):
    """Drop-in replacement for ``torch_geometric.loader.LinkNeighborLoader`` with directload's gathers.

    The same constructor (``edge_label_index``, ``edge_label``,
    ``neg_sampling``, ``neg_sampling_ratio``, ...) and, where PyG can sample
    (pyg-lib or torch-sparse), the same batches, as
    :class:`~directload.loaders.pyg.NeighborLoader` gives PyG's
    ``NeighborLoader``'s: node tables unified, batches sampled
    ``lookahead`` ahead, features gathered by directload.  Where PyG has no
    sampler, or with ``sampler="directload"``,
    :class:`~directload.loaders.pyg.NeighborSampler` samples around each
    batch's source and destination nodes (negatives included) through
    PyG's own edge-sampling code, so ``edge_label_index``, ``edge_label``
    and the triplet indices are PyG's; options it does not implement
    (temporal, disjoint, induced) fall back to PyG's sampler with a warning.

    Parameters
    ----------
    data, num_neighbors, *args, **kwargs
        As for PyG's ``LinkNeighborLoader``.  ``edge_label_index`` ids
        outside the graph raise ``IndexError`` here, before any sampling.
    lookahead, sample_in_thread, overlap, sampler, affinity, device
        As for :class:`~directload.loaders.pyg.NeighborLoader`.

    Examples
    --------
    >>> import torch
    >>> from torch_geometric.data import Data
    >>> from directload.loaders.pyg import LinkNeighborLoader
    >>> data = Data(x=torch.randn(100, 8), edge_index=torch.randint(0, 100, (2, 500)))
    >>> loader = LinkNeighborLoader(data, num_neighbors=[5, 5], batch_size=16, neg_sampling_ratio=1.0)
    >>> batch = next(iter(loader))
    >>> torch.equal(batch.x, data.x[batch.n_id]), batch.edge_label_index.shape, batch.edge_label.sum().item()
    (True, torch.Size([2, 32]), 16.0)
    """

    pyg_loader = _PygLinkNeighborLoader

    def __init__(self, data: Data | HeteroData | tuple[PygFeatureStore, PygGraphStore],
                 num_neighbors: list[int] | dict[tuple[str, str, str], list[int]], *args: Any,
                 lookahead: int | str = 4, sample_in_thread: bool | None = None, overlap: bool | None = None,
                 affinity: str = "cuda", sampler: str | torch.utils.data.Sampler | None = None,
                 device: torch.device | str | BatchDevice | None = None, **kwargs: Any) -> None:
        data = self._prepare(data, num_neighbors, args, kwargs, lookahead=lookahead, affinity=affinity,
                             sampler=sampler, device=device)
        super().__init__(data, num_neighbors, **kwargs)
        _check_edge_seeds(self.input_data, self.link_sampler)
        self._start(lookahead, sample_in_thread, overlap)


def _check_edge_seeds(input_data, sampler):
    """``IndexError`` for an ``edge_label_index`` node outside the graph, before any sampling."""
    input_type = input_data.input_type
    src, dst = (input_type[0], input_type[-1]) if input_type is not None else (None, None)
    num_nodes = getattr(sampler, "num_nodes", None)
    check_ids(input_data.row, num_nodes, src, "edge_label_index source node")
    check_ids(input_data.col, num_nodes, dst, "edge_label_index destination node")
