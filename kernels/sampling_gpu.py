"""Neighbour sampling on a CUDA device: kernels/cuda/sample.cu through CuPy, the GPU twin of kernels.sampling.

:func:`sample_hop` and :func:`sample_batch` give what ``kernels.sampling``'s functions of the same names give, on
torch CUDA tensors: the same key, the same picks, bit for bit.  The one exception is documented in sample.cu:
weighted picks without replacement compare keys built with ``log`` (``-log(u) / w``, or its log), and CUDA's
``log`` may differ from the CPU's in the last ulp.

The drivers :func:`run_hop` and :func:`run_batch` hold the whole host side (buffers, scans, the relabelling's
order of launches) over a *launcher*, an object with ``launch(kernel, types, threads, args)`` and
``empty(size, dtype, device)``; :class:`CupyLauncher` runs sample.cu on a GPU, and the host emulation
(``kernels.host_emu_sample``, test machinery) runs the same source and the same drivers on the CPU.

Host reads: one per batch, of the node and edge counts the frameworks need as Python ints, plus one per hop of
fanout ``-1`` (its edge count sizes its buffers).  Every other bound is worked out on the host from the seeds,
the fanouts and the graph's size, and kernels past the device-side counts idle.  :func:`sample_hop` reads its
edge count once.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import numpy as np
import torch

# The launch side (names, the launcher contract, CuPy's launcher) has its own module; its names stay here too.
from .sample_launch import NVRTC_OPTIONS, SOURCE, CupyLauncher, HostReads, SampleLauncher, kernel_names, name_expression

__all__ = ["SOURCE", "NVRTC_OPTIONS", "LAYOUTS", "kernel_names", "name_expression", "SampleLauncher", "HostReads",
           "CupyLauncher", "count_picks", "pick", "place_seeds", "relabel", "edge_bound", "grown", "run_hop",
           "run_batch", "sample_hop", "sample_batch"]

#: ``"pyg"``: each hop samples the nodes new at the hop before; ``"dgl"``: every node reached so far.
LAYOUTS = ("pyg", "dgl")

_INDEX = (torch.int32, torch.int64)
_REAL = (torch.float32, torch.float64)
_NULL = np.uint64(0)
#: One hop of a batch: ``(row, col, eid)``.
Hop = tuple[torch.Tensor, torch.Tensor, torch.Tensor]


def _ptr(t):
    return _NULL if t is None else np.uint64(t.data_ptr())


def _weights_type(weights):
    # Unweighted launches pass a null pointer; the specialisation only needs some real type.
    return torch.float32 if weights is None else weights.dtype


def _eids_type(indices, eids):
    return indices.dtype if eids is None else eids.dtype


def count_picks(launcher: SampleLauncher, indptr: torch.Tensor, weights: torch.Tensor | None, nodes: torch.Tensor,
                lo_at: torch.Tensor, hi_at: torch.Tensor, bound: int, fanout: int, replace: bool) -> torch.Tensor:
    """Per-node pick counts of the frontier ``nodes[*lo_at:*hi_at]`` (at most ``bound``), scanned into offsets."""
    device = nodes.device
    counts = launcher.empty(bound, torch.int64, device)
    launcher.launch("sample_counts", (indptr.dtype, _weights_type(weights)), bound,
                    (_ptr(indptr), _ptr(weights), _ptr(nodes), _ptr(lo_at), _ptr(hi_at), np.int64(bound),
                     np.int64(fanout), np.int32(replace), _ptr(counts)))
    offsets = torch.zeros(bound + 1, dtype=torch.int64, device=device)
    torch.cumsum(counts, 0, out=offsets[1:])
    return offsets


def pick(launcher: SampleLauncher, graph: tuple, nodes: torch.Tensor, lo_at: torch.Tensor, hi_at: torch.Tensor,
         bound: int, edges: int, replace: bool, key: int, hop: int, offsets: torch.Tensor,
         col: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """The frontier's picks into buffers of ``edges`` entries: ``(neighbours, edge ids)``."""
    indptr, indices, eids, weights = graph
    device = nodes.device
    nbr = launcher.empty(edges, indices.dtype, device)
    eid = launcher.empty(edges, torch.int64, device)
    keys = launcher.empty(edges, torch.float64, device) if weights is not None and not replace else None
    types = (indptr.dtype, indices.dtype, _eids_type(indices, eids), _weights_type(weights))
    launcher.launch("sample_picks", types, bound,
                    (_ptr(indptr), _ptr(indices), _ptr(eids), _ptr(weights), _ptr(nodes), _ptr(lo_at),
                     _ptr(hi_at), np.int64(bound), np.int32(replace), np.uint64(key), np.int64(hop), _ptr(offsets),
                     _ptr(nbr), _ptr(eid), _ptr(keys), _ptr(col)))
    return nbr, eid


def run_hop(launcher: SampleLauncher, indptr: torch.Tensor, indices: torch.Tensor, eids: torch.Tensor | None,
            weights: torch.Tensor | None, frontier: torch.Tensor, fanout: int, replace: bool, key: int,
            hop: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`sample_hop` over ``launcher``; reads the hop's edge count once.

    Returns
    -------
    (torch.Tensor, torch.Tensor, torch.Tensor)
        ``(neighbours, edge ids, offsets)`` on ``frontier``'s device: neighbours of ``indices``' dtype, edge
        ids and offsets int64.

    Examples
    --------
    >>> launcher = CupyLauncher(0, torch.cuda.current_stream().cuda_stream)  # doctest: +SKIP
    >>> indptr, indices = torch.tensor([0, 2, 3]).cuda(), torch.tensor([1, 0, 0]).cuda()  # doctest: +SKIP
    >>> nbr, eid, offsets = run_hop(launcher, indptr, indices, None, None, torch.tensor([0, 1]).cuda(), -1, False,
    ...                             7, 0)  # doctest: +SKIP
    >>> nbr.tolist(), eid.tolist(), offsets.tolist()  # doctest: +SKIP
    ([1, 0, 0], [0, 1, 2], [0, 2, 3])
    """
    device = frontier.device
    replace = replace and fanout >= 0  # -1: every edge once, as kernels.sampling.sample_hop
    nodes = frontier.to(torch.int64).contiguous()
    n = nodes.shape[0]
    span = torch.zeros(2, dtype=torch.int64, device=device)
    span[1:].fill_(n)
    offsets = count_picks(launcher, indptr, weights, nodes, span[:1], span[1:], n, fanout, replace)
    (edges,) = launcher.read(offsets[-1:])  # the one host read: sizes the outputs exactly
    nbr, eid = pick(launcher, (indptr, indices, eids, weights), nodes, span[:1], span[1:], n, edges, replace, key,
                    hop, offsets, None)
    return nbr, eid, offsets


def place_seeds(launcher: SampleLauncher, seeds: torch.Tensor, marks: torch.Tensor, nodes: torch.Tensor,
                stages: torch.Tensor) -> None:
    """``kernels.sampling.place_seeds``: the seeds first in ``nodes``, each in its place; ``stages[1]`` their
    count."""
    n = seeds.shape[0]
    stages[1:2].fill_(n)
    args = (_ptr(seeds), _ptr(stages[1:]), np.int64(n), _ptr(marks))
    launcher.launch("relabel_claim", (seeds.dtype,), n, args)
    launcher.launch("place_seeds", (seeds.dtype,), n, (*args, _ptr(nodes)))


def relabel(launcher: SampleLauncher, nbr: torch.Tensor, total_at: torch.Tensor, bound: int, marks: torch.Tensor,
            nodes: torch.Tensor, stages: torch.Tensor, s: int) -> torch.Tensor:
    """Nodes of ``nbr[:*total_at]`` not yet in the batch appended to ``nodes`` from ``stages[s]`` on, in the
    order first seen; ``stages[s + 1]`` set to the new count.  Returns the edges' local ids."""
    device = nbr.device
    types = (nbr.dtype,)
    base = (_ptr(nbr), _ptr(total_at), np.int64(bound))
    # Every buffer is allocated before the first launch: nothing may fail between the claims and the appends,
    # which would leave claims (negative marks) behind.  Once scanned, the flags' buffer takes the rows.
    flags = launcher.empty(bound, torch.int64, device)
    scan = launcher.empty(bound, torch.int64, device)
    launcher.launch("relabel_claim", types, bound, (*base, _ptr(marks)))
    launcher.launch("relabel_flag", types, bound, (*base, _ptr(marks), _ptr(flags)))
    torch.cumsum(flags, 0, out=scan)
    launcher.launch("relabel_append", types, bound,
                    (*base, _ptr(marks), _ptr(scan), _ptr(stages[s:]), _ptr(nodes)))
    if bound:
        torch.add(stages[s:s + 1], scan[-1:], out=stages[s + 1:s + 2])
    else:
        stages[s + 1:s + 2].copy_(stages[s:s + 1])
    launcher.launch("relabel_rows", types, bound, (*base, _ptr(marks), _ptr(flags)))
    return flags


def edge_bound(frontier_bound: int, seeds: int, fanout: int, replace: bool, num_edges: int) -> int:
    """Most edges a hop of fanout >= 0 can give over a frontier of ``frontier_bound`` nodes whose first ``seeds``
    are the seeds: ``fanout`` each, and without replacement each edge at most once over the distinct nodes after
    the seeds (a seed may repeat)."""
    rest = (frontier_bound - seeds) * fanout
    return seeds * fanout + (rest if replace else min(rest, num_edges))


def grown(launcher: SampleLauncher, nodes: torch.Tensor, size: int) -> torch.Tensor:
    """``nodes`` in a buffer of ``size`` entries (after a fanout -1 hop outgrew the plan)."""
    out = launcher.empty(size, nodes.dtype, nodes.device)
    out[:nodes.shape[0]].copy_(nodes)
    return out


def _plan(n_seeds, fanouts, replace, pyg, num_nodes, num_edges):
    """The batch's node buffer size, counting a fanout -1 hop as no edges (the batch grows it).  Every seed has
    its place (a repeated one too); the nodes after them are distinct."""
    new = node = n_seeds
    for hop, fanout in enumerate(fanouts):
        seeded = n_seeds if hop == 0 or not pyg else 0
        edges = edge_bound(new if pyg else node, seeded, max(fanout, 0), replace, num_edges)
        new = min(edges, num_nodes)
        node = min(node + new, n_seeds + num_nodes)
    return node


def run_batch(launcher: SampleLauncher, indptr: torch.Tensor, indices: torch.Tensor, eids: torch.Tensor | None,
              weights: torch.Tensor | None, seeds: torch.Tensor, fanouts: Sequence[int], replace: bool, key: int,
              layout: str, marks: torch.Tensor) -> tuple[torch.Tensor, list[Hop], list[int], list[int]]:
    """:func:`sample_batch` over ``launcher``, with the caller's ``marks`` (all zero, one int64 per node, on
    ``seeds``' device; returned all zero).

    Returns
    -------
    (torch.Tensor, list, list, list)
        As :func:`sample_batch`.

    Examples
    --------
    >>> launcher = CupyLauncher(0, torch.cuda.current_stream().cuda_stream)  # doctest: +SKIP
    >>> indptr, indices = torch.tensor([0, 1, 2, 3]).cuda(), torch.tensor([1, 2, 0]).cuda()  # doctest: +SKIP
    >>> marks = torch.zeros(3, dtype=torch.int64, device="cuda")  # doctest: +SKIP
    >>> nodes, hops, nn, ne = run_batch(launcher, indptr, indices, None, None, torch.tensor([0]).cuda(), [1, 1],
    ...                                 False, 7, "pyg", marks)  # doctest: +SKIP
    >>> nodes.tolist(), [row.tolist() for row, _, _ in hops], nn, ne  # doctest: +SKIP
    ([0, 1, 2], [[1], [2]], [1, 1, 1], [1, 1])
    """
    device = seeds.device
    pyg = layout == "pyg"
    num_nodes, num_edges = marks.shape[0], indices.shape[0]
    graph = (indptr, indices, eids, weights)
    n_seeds = seeds.shape[0]
    # stages[s + 1]: the node count after stage s (the seeds, then each hop); stages[0] = 0.
    stages = torch.zeros(len(fanouts) + 2, dtype=torch.int64, device=device)
    nodes = launcher.empty(_plan(n_seeds, fanouts, replace, pyg, num_nodes, num_edges), torch.int64, device)
    done = 0  # stages[done] is the last count written
    try:
        place_seeds(launcher, seeds.contiguous(), marks, nodes, stages)
        done = 1
        new = node = n_seeds
        hops, totals = [], []
        for hop, fanout in enumerate(fanouts):
            replace_h = replace and fanout >= 0  # -1: every edge once, as kernels.sampling.sample_hop
            bound = new if pyg else node
            lo_at, hi_at = stages[hop:hop + 1] if pyg else stages[:1], stages[hop + 1:hop + 2]
            offsets = count_picks(launcher, indptr, weights, nodes, lo_at, hi_at, bound, fanout, replace_h)
            if fanout < 0:
                (edges,) = launcher.read(offsets[-1:])  # a host read: all edges of the frontier, sized exactly
            else:
                edges = edge_bound(bound, n_seeds if hop == 0 or not pyg else 0, fanout, replace_h, num_edges)
            new = min(edges, num_nodes)
            node = min(node + new, n_seeds + num_nodes)
            if nodes.shape[0] < node:
                nodes = grown(launcher, nodes, node)
            col = launcher.empty(edges, torch.int64, device)
            nbr, eid = pick(launcher, graph, nodes, lo_at, hi_at, bound, edges, replace_h, key, hop, offsets, col)
            rows = relabel(launcher, nbr, offsets[bound:], edges, marks, nodes, stages, hop + 1)
            done = hop + 2
            hops.append((rows, col, eid))
            totals.append(offsets[bound:])
        sizes = launcher.read(torch.cat([stages[1:], *totals]))  # the batch's one host read
    finally:
        launcher.launch("reset_marks", (), nodes.shape[0],
                        (_ptr(marks), _ptr(nodes), _ptr(stages[done:]), np.int64(nodes.shape[0])))
    counts, edge_counts = sizes[:len(fanouts) + 1], sizes[len(fanouts) + 1:]
    num_sampled = [counts[0]] + [b - a for a, b in zip(counts, counts[1:])]
    out_hops = [(rows[:e], col[:e], eid[:e]) for (rows, col, eid), e in zip(hops, edge_counts)]
    return nodes[:counts[-1]], out_hops, num_sampled, edge_counts


def _check_layout(layout):
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")


def _check_graph(device, indptr, indices, eids, weights):
    """The graph's parts: 1-d contiguous tensors of the kernels' dtypes, on ``device`` or in pinned host memory."""
    for name, t, dtypes in (("indptr", indptr, _INDEX), ("indices", indices, _INDEX), ("eids", eids, _INDEX),
                            ("weights", weights, _REAL)):
        if t is None:
            continue
        if not isinstance(t, torch.Tensor) or t.dtype not in dtypes or t.dim() != 1:
            raise TypeError(f"{name} must be a 1-d tensor of {' or '.join(map(str, dtypes))}, got "
                            f"{getattr(t, 'dtype', type(t).__name__)}")
        if not t.is_contiguous():
            raise ValueError(f"{name} must be contiguous")
        if t.is_cuda:
            if t.device != device:
                raise ValueError(f"{name} is on {t.device}; the sampling runs on {device}")
        elif not t.is_pinned():
            raise ValueError(f"{name} is in pageable host memory, which the GPU cannot read; pin and map it "
                             "(directload.to_unified) or move it to the device")
    for name, t in (("eids", eids), ("weights", weights)):
        if t is not None and t.shape[0] != indices.shape[0]:
            raise ValueError(f"{name} has {t.shape[0]} entries for {indices.shape[0]} edges")


def _check_ids(name, t, device):
    if not isinstance(t, torch.Tensor) or t.dtype not in _INDEX or t.dim() != 1:
        raise TypeError(f"{name} must be a 1-d int32 or int64 tensor")
    if t.device != device:
        raise ValueError(f"{name} must be on {device}, got {t.device}")


def _cuda_device(device):
    device = torch.device(device)
    if device.type != "cuda":
        raise ValueError(f"sampling_gpu samples on a CUDA device, got {device}; kernels.sampling is the CPU twin")
    return torch.device("cuda", torch.cuda.current_device() if device.index is None else device.index)


def _launcher(device):
    return CupyLauncher(device.index, torch.cuda.current_stream(device).cuda_stream)


class _Marks(threading.local):
    """One all-zero mark array per thread, device and node count (reset after every batch)."""

    def get(self, device, n):
        cache = self.__dict__.setdefault("arrays", {})
        if (device, n) not in cache:
            cache[device, n] = torch.zeros(n, dtype=torch.int64, device=device)
        return cache[device, n]


_MARKS = _Marks()


def sample_hop(indptr: torch.Tensor, indices: torch.Tensor, eids: torch.Tensor | None, weights: torch.Tensor | None,
               frontier: torch.Tensor, fanout: int, replace: bool, key: int,
               hop: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One hop's picks on the GPU: ``(neighbours, edge ids, offsets)`` of every node in ``frontier``.

    As ``kernels.sampling.sample_hop``, on ``frontier``'s CUDA device and current stream; one host read (the
    hop's edge count, which sizes the outputs).

    Parameters
    ----------
    indptr, indices : torch.Tensor
        The CSC graph: int32 or int64, on ``frontier``'s device or in pinned, mapped host memory.
    eids : torch.Tensor or None
        int32/int64 edge ids (None: an edge's id is its position in ``indices``).
    weights : torch.Tensor or None
        float32/float64 edge weights (None: uniform picks).
    frontier : torch.Tensor
        int32/int64 CUDA node ids to sample.
    fanout : int
        Picks per node, -1 for all.
    replace : bool
        Whether to pick with replacement.
    key, hop : int
        The batch's key (``[0, 2**64)``) and the hop: with the node, they fix its random stream.

    Returns
    -------
    (torch.Tensor, torch.Tensor, torch.Tensor)
        On ``frontier``'s device: neighbours (``indices``' dtype), edge ids and offsets (int64).  Node
        ``frontier[i]``'s picks are ``neighbours[offsets[i]:offsets[i + 1]]``.

    Examples
    --------
    >>> g = torch.tensor([0, 2, 3], device="cuda"), torch.tensor([1, 0, 0], device="cuda")  # doctest: +SKIP
    >>> nbr, eid, offsets = sample_hop(*g, None, None, g[1][:2], 1, False, 7, 0)  # doctest: +SKIP
    >>> offsets.tolist()  # doctest: +SKIP
    [0, 1, 2]
    """
    _check_ids("frontier", frontier, frontier.device)
    device = _cuda_device(frontier.device)
    _check_graph(device, indptr, indices, eids, weights)
    return run_hop(_launcher(device), indptr, indices, eids, weights, frontier, int(fanout), bool(replace), key,
                   int(hop))


def sample_batch(indptr: torch.Tensor, indices: torch.Tensor, eids: torch.Tensor | None, weights: torch.Tensor | None,
                 seeds: torch.Tensor, fanouts: Sequence[int], replace: bool, key: int, layout: str,
                 device: torch.device | str) -> tuple[torch.Tensor, list[Hop], list[int], list[int]]:
    """One batch on the GPU: ``(nodes, hops, num_sampled_nodes, num_sampled_edges)``.

    As ``kernels.sampling.sample_batch``, with the node marks kept on ``device`` per thread instead of passed
    in.  Launches on ``device``'s current stream; host reads: one per batch, plus one per hop of fanout -1.

    Parameters
    ----------
    indptr, indices, eids, weights
        The graph, as for :func:`sample_hop`; node ids lie in ``[0, len(indptr) - 1)``.
    seeds : torch.Tensor
        int32/int64 node ids on ``device`` (a repeated seed keeps its place, as in ``kernels.sampling``).
    fanouts : sequence of int
        Picks per node at each hop, -1 for all.
    replace : bool
        Whether to pick with replacement.
    key : int
        The batch's key: the same key gives the same batch.
    layout : {"pyg", "dgl"}
        Which nodes each hop samples (see ``kernels.sampling.sample_batch``).
    device : torch.device or str
        The CUDA device.

    Returns
    -------
    (torch.Tensor, list, list, list)
        On ``device``: ``nodes`` (int64 global ids, seeds first, then each hop's new nodes in the order first
        seen), ``hops[h] = (row, col, eid)`` (int64), and the per-hop node and edge counts as Python ints.
        The tensors are views into buffers of the batch's upper bounds, safe to keep.

    Examples
    --------
    >>> indptr, indices = torch.tensor([0, 1, 2, 3]).cuda(), torch.tensor([1, 2, 0]).cuda()  # doctest: +SKIP
    >>> nodes, hops, nn, ne = sample_batch(indptr, indices, None, None, torch.tensor([0]).cuda(), [1, 1], False,
    ...                                    7, "pyg", "cuda")  # doctest: +SKIP
    >>> nodes.tolist(), nn, ne  # doctest: +SKIP
    ([0, 1, 2], [1, 1, 1], [1, 1])
    """
    _check_layout(layout)
    device = _cuda_device(device)
    _check_ids("seeds", seeds, device)
    _check_graph(device, indptr, indices, eids, weights)
    fanouts = [int(f) for f in fanouts]
    if any(f < -1 for f in fanouts):
        raise ValueError(f"fanouts must be -1 (all) or >= 0, got {fanouts}")
    marks = _MARKS.get(device, indptr.shape[0] - 1)
    return run_batch(_launcher(device), indptr, indices, eids, weights, seeds, fanouts, bool(replace), key,
                     layout, marks)
