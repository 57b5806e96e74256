"""``directload.loaders.DataLoader``: DGL's neighbour-sampling DataLoader, with features gathered by directload."""

import copy
import os

import dgl
import torch

from .features import resolve_features
from .pipeline import Epoch, Pipeline

__all__ = ["DataLoader", "resolve_sampling", "resolve_overlap"]


def resolve_sampling(sample_in_thread, num_workers):
    """Whether stage 1 samples on a background thread.  Pure.

    DGL draws neighbours from a per-thread random stream, so sampling off the
    caller's thread changes which neighbours are drawn.  With worker processes
    (``num_workers > 0``) the draws happen in the workers either way, and a
    background thread only collects them; without, the default keeps sampling
    on the caller's thread so that batches equal DGL's bit for bit.

    Examples
    --------
    >>> resolve_sampling(None, 0), resolve_sampling(None, 4), resolve_sampling(True, 0)
    (False, True, True)
    """
    if sample_in_thread is None:
        return num_workers > 0
    return bool(sample_in_thread)


def resolve_overlap(overlap, device, cpu_count, torch_threads):
    """Whether features are gathered on a background thread.  Pure.

    On a CUDA device the gather is GPU work on its own stream and the host
    thread only launches it, so it always overlaps training.  On the CPU it
    competes with training for cores: overlapping pays only when training
    leaves cores idle (measured on 2 cores with torch on both: training steps
    slowed by 25%, more than the gather saved).

    Examples
    --------
    >>> resolve_overlap(None, "cuda", 2, 2), resolve_overlap(None, "cpu", 2, 2), resolve_overlap(None, "cpu", 16, 8)
    (True, False, True)
    """
    if overlap is not None:
        return bool(overlap)
    return torch.device(device).type == "cuda" or cpu_count > torch_threads


class DataLoader:
    """Drop-in replacement for :class:`dgl.dataloading.DataLoader` (node-wise samplers).

    Same constructor and the same yield, ``(input_nodes, output_nodes,
    blocks)``.  Node fields named in the sampler's ``prefetch_node_feats`` and
    ``prefetch_labels`` are gathered by directload (zero-copy on a GPU from a
    unified or pinned table, the parallel CPU kernel otherwise) and arrive in
    ``blocks[0].srcdata`` and ``blocks[-1].dstdata``, as with DGL.  The
    gather for the next batch overlaps training on the current one.

    Parameters
    ----------
    graph, indices, graph_sampler, device, batch_size, shuffle, drop_last, num_workers, use_ddp, **kwargs
        As for DGL's DataLoader.  With the same seeds it yields the same batches
        as DGL's (same ids, same blocks) and features equal to
        ``graph.ndata[name][input_nodes]``.
    features : dict, optional
        ``{name: table}`` (``{name: {ntype: table}}`` on a heterogeneous graph)
        overriding ``graph.ndata``; a table is a tensor (ideally a
        :func:`directload.to_unified` one) or a store with ``gather(ids, device)``.
    lookahead : int
        Batches sampled ahead of the one being trained on (default 4).  Their
        input ids are visible through the epoch iterator's ``upcoming()`` and
        are passed to every store's ``prefetch(ids)`` hook.
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
    >>> from directload.loaders import DataLoader
    >>> g = dgl.rand_graph(100, 500)
    >>> g.ndata["feat"] = torch.randn(100, 8)
    >>> sampler = dgl.dataloading.NeighborSampler([4, 4], prefetch_node_feats=["feat"])
    >>> loader = DataLoader(g, torch.arange(20), sampler, batch_size=10)
    >>> input_nodes, output_nodes, blocks = next(iter(loader))
    >>> torch.equal(blocks[0].srcdata["feat"], g.ndata["feat"][input_nodes])
    True
    """

    def __init__(self, graph, indices, graph_sampler, device=None, *, features=None, lookahead=4,
                 sample_in_thread=None, overlap=None, **kwargs):
        if lookahead < 1:
            raise ValueError(f"lookahead must be at least 1, got {lookahead}")
        self.graph = graph
        self.device = torch.device(device) if device is not None else graph.device
        self.lookahead = lookahead
        self.sample_in_thread = resolve_sampling(sample_in_thread, kwargs.get("num_workers", 0))
        self.overlap = resolve_overlap(overlap, self.device, os.cpu_count() or 1, torch.get_num_threads())
        node_feats = getattr(graph_sampler, "prefetch_node_feats", None) or []
        labels = getattr(graph_sampler, "prefetch_labels", None) or []
        self.spec = resolve_features(graph, node_feats, labels, features)
        # DGL samples exactly as before but leaves these fields to us.
        sampler = copy.copy(graph_sampler)
        sampler.prefetch_node_feats = []
        sampler.prefetch_labels = []
        inner_device = self.device if kwargs.get("use_uva") else torch.device("cpu")
        self._dgl = dgl.dataloading.DataLoader(graph, indices, sampler, device=inner_device, **kwargs)

    def __len__(self):
        return len(self._dgl)

    def __iter__(self):
        """A new epoch: an :class:`~directload.loaders.pipeline.Epoch` iterator."""
        return Epoch(Pipeline(iter(self._dgl), self.spec, self.device, self.lookahead, self.sample_in_thread,
                              self.overlap))
