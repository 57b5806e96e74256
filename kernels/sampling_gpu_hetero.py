"""Heterogeneous neighbour sampling on a device: sample.cu's kernels over one CSC per relation, the GPU twin of
``directload.sampler.HeteroNeighborSampler``'s CPU loop, batch for batch.

:func:`run_hetero_batch` drives the same kernels as :func:`kernels.sampling_gpu.run_batch` (it shares its
steps: counts, picks, relabelling), over a launcher (``SampleLauncher``): per node type a buffer of nodes, a
mark array and a list of device-side counts, one per step that appends to the type.  At each hop every relation
``(src, rel, dst)``, in the order given, samples the ``dst`` nodes of its frontier (new at the hop before with
``layout="pyg"``, all so far with ``"dgl"``) and appends the new ``src`` nodes, in the order first seen, as the
CPU loop does.  Host reads: one per batch (every count), plus one per relation and hop of fanout ``-1``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import torch

from .sampling_gpu import Hop, SampleLauncher, count_picks, edge_bound, grown, pick, place_seeds, relabel

__all__ = ["run_hetero_batch"]

EdgeType = tuple[str, str, str]


class _Type:
    """One node type's state: its node buffer, marks, device-side counts (``counts[k]``: after step ``k``; 0 is
    empty, 1 the seeds) and the host's bound of each count."""

    def __init__(self, launcher, marks, steps, device):
        self.marks = marks
        self.counts = torch.zeros(steps, dtype=torch.int64, device=device)
        self.nodes = launcher.empty(1, torch.int64, device)  # grown as the bounds rise
        self.step = 0  # counts[step] is the last written
        self.bounds = [0]  # host bound of counts[k]
        self.added = []  # host bound of counts[k + 1] - counts[k]
        self.seeds = 0

    def frontier_bound(self, lo, end):
        """Most nodes in ``nodes[counts[lo]:counts[end]]``."""
        return min(sum(self.added[lo:end]), self.bounds[end])

    def grow(self, launcher, bound):
        if self.nodes.shape[0] < bound:
            self.nodes = grown(launcher, self.nodes, bound)


def run_hetero_batch(launcher: SampleLauncher, graphs: Mapping[EdgeType, tuple], num_nodes: Mapping[str, int],
                     seeds: Mapping[str, torch.Tensor], fanouts: Mapping[EdgeType, Sequence[int]], replace: bool,
                     keys: Mapping[EdgeType, int], layout: str, marks: Mapping[str, torch.Tensor]
                     ) -> tuple[dict[str, torch.Tensor], list[dict[EdgeType, Hop]], dict[str, list[int]],
                                dict[EdgeType, list[int]]]:
    """One heterogeneous batch over ``launcher``: ``(nodes, hops, num_sampled_nodes, num_sampled_edges)``.

    Parameters
    ----------
    graphs : mapping
        ``{(src, rel, dst): (indptr, indices, eids, weights)}``, in the order the relations sample.
    num_nodes : mapping
        ``{node_type: count}``.
    seeds : mapping
        ``{node_type: int64 ids}`` on the device, checked.
    fanouts : mapping
        ``{edge_type: [fanout per hop]}``, all of one length.
    replace : bool
    keys : mapping
        ``{edge_type: key}``: each relation's random key.
    layout : {"pyg", "dgl"}
    marks : mapping
        ``{node_type: int64 zeros}`` of ``num_nodes[t]`` entries on the device (returned all zero).

    Returns
    -------
    tuple
        As ``HeteroSampledBatch``'s fields: ``nodes[t]`` int64 global ids (seeds first), ``hops[h][et] = (row,
        col, eid)`` int64, and the per-hop counts as Python ints.
    """
    pyg = layout == "pyg"
    hops_n = len(next(iter(fanouts.values()))) if fanouts else 0
    device = next(iter(marks.values())).device
    appends = {t: sum(1 for et in graphs if et[0] == t) * hops_n for t in num_nodes}
    types = {t: _Type(launcher, marks[t], appends[t] + 2, device) for t in num_nodes}
    hops: list[dict[EdgeType, Hop]] = []
    totals: list[torch.Tensor] = []
    try:
        for t, state in types.items():
            ids = seeds.get(t)
            n = 0 if ids is None else int(ids.shape[0])
            state.step, state.bounds, state.added, state.seeds = 1, [0, n], [n], n
            if ids is not None and n:
                state.grow(launcher, n)
                place_seeds(launcher, ids, state.marks, state.nodes, state.counts)
        start = {t: 0 for t in types}
        hop_ends = {t: [1] for t in types}  # per type, the step after the seeds and after each hop
        for hop in range(hops_n):
            end = {t: state.step for t, state in types.items()}
            out = {}
            for et, graph in graphs.items():
                out[et] = _relation_hop(launcher, graph, types[et[2]], types[et[0]], num_nodes[et[0]],
                                        start[et[2]] if pyg else 0, end[et[2]], fanouts[et][hop], replace, keys[et],
                                        hop, pyg, totals)
            for t, state in types.items():
                hop_ends[t].append(state.step)
            hops.append(out)
            start = end
        parts = [types[t].counts[:types[t].step + 1] for t in types]
        sizes = launcher.read(torch.cat([*parts, *totals]))  # the batch's one host read
    finally:
        for state in types.values():
            launcher.launch("reset_marks", (), state.nodes.shape[0],
                            (np.uint64(state.marks.data_ptr()), np.uint64(state.nodes.data_ptr()),
                             np.uint64(state.counts[state.step:].data_ptr()), np.int64(state.nodes.shape[0])))
    return _unpack(types, graphs, hops, hop_ends, sizes)


def _relation_hop(launcher, graph, d, s, src_nodes, lo, end, fanout, replace, key, hop, pyg, totals):
    """One relation's picks at one hop: the frontier ``d.nodes[counts[lo]:counts[end]]`` of the destination type
    ``d``, the new source nodes appended to ``s``.  Returns ``(rows, col, eid)`` in buffers of the edges' bound;
    the edge count (on the device) goes to ``totals``."""
    device = d.nodes.device
    bound = d.frontier_bound(lo, end)
    replace = replace and fanout >= 0  # -1: every edge once, as the CPU twin
    lo_at, hi_at = d.counts[lo:lo + 1], d.counts[end:end + 1]
    offsets = count_picks(launcher, graph[0], graph[3], d.nodes, lo_at, hi_at, bound, fanout, replace)
    if fanout < 0:
        (edges,) = launcher.read(offsets[-1:])  # a host read: all edges of the frontier, sized exactly
    else:
        seeded = d.seeds if hop == 0 or not pyg else 0
        edges = edge_bound(bound, min(seeded, bound), fanout, replace, graph[1].shape[0])
    col = launcher.empty(edges, torch.int64, device)
    nbr, eid = pick(launcher, graph, d.nodes, lo_at, hi_at, bound, edges, replace, key, hop, offsets, col)
    added = min(edges, src_nodes)
    new_bound = min(s.bounds[s.step] + added, s.seeds + src_nodes)
    s.grow(launcher, new_bound)
    rows = relabel(launcher, nbr, offsets[bound:], edges, s.marks, s.nodes, s.counts, s.step)
    s.step += 1
    s.bounds.append(new_bound)
    s.added.append(added)
    totals.append(offsets[bound:])
    return rows, col, eid


def _unpack(types, graphs, hops, hop_ends, sizes):
    """The batch's tensors trimmed to the counts read, and the per-hop node and edge counts."""
    at, num_nodes = 0, {}
    for t, state in types.items():
        counts = sizes[at:at + state.step + 1]
        at += state.step + 1
        ends = [counts[k] for k in hop_ends[t]]
        num_nodes[t] = [ends[0]] + [b - a for a, b in zip(ends, ends[1:])]
    edge_counts = iter(sizes[at:])
    num_edges: dict[EdgeType, list[int]] = {et: [] for et in graphs}
    out_hops = []
    for hop in hops:
        trimmed = {}
        for et, (rows, col, eid) in hop.items():
            n = next(edge_counts)
            trimmed[et] = (rows[:n], col[:n], eid[:n])
            num_edges[et].append(n)
        out_hops.append(trimmed)
    nodes = {t: state.nodes[:sum(num_nodes[t])] for t, state in types.items()}
    return nodes, out_hops, num_nodes, num_edges
