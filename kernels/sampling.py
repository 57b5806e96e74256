"""Neighbour sampling kernels, CPU backend: a counter-based random stream, per-node picks and relabelling, in Numba.

The one definition of directload's sampling streams.  ``kernels/cuda/sample.cu``
implements the same functions line for line, and the tests check that both
give the same picks for the same stream.

Streams
    Every random number is a pure function of ``(key, hop, node, n)``: the
    batch's 64-bit ``key``, the hop, the global id of the node being sampled
    and the draw's number ``n`` within that node.  Nothing is shared between
    nodes, so the picks do not depend on the thread count, the order in which
    nodes are visited, or the device.

    ``node_stream(key, hop, node) = mix(mix(key + (hop + 1) * GOLDEN) ^ node)``
    ``draw(stream, n)              = mix(stream + (n + 1) * GOLDEN)``

    where ``mix`` is splitmix64's finaliser.  A uniform real in ``(0, 1]`` is
    ``((x >> 11) + 1) * 2**-53``.  A uniform integer below ``m`` (``1 <= m <
    2**63``) is Lemire's multiply-high on the whole draw, exact for every
    ``m``: ``x * m`` as 128 bits (``mulhi64``, from 32-bit halves), its high
    64 bits, unless its low 64 bits fall below ``(2**64 - m) % m``; then the
    draw is rejected and redrawn from the same slot, ``x = mix(x + GOLDEN)``,
    until one is kept (a rejection has probability below ``m / 2**64``).

In-degrees
    Below ``MAX_DEGREE = 2**62`` (:func:`check_csc`'s code 5).  The draws are
    exact up to ``2**63``; the bound keeps every position the kernels form
    inside int64 with room, including a fanout ``-1`` hop's edge positions,
    which ``sample.cu`` claims as ``q - 2**62``.

Picks for one node of in-degree ``d`` with fanout ``k`` (``k < 0``: all)
    - uniform, without replacement: all ``d`` edges in order when ``k >= d``;
      for ``d <= SMALL_MAX``, Floyd's algorithm (draw ``t`` below ``j + 1``
      for ``j = d - m .. d - 1``, take ``j`` if ``t`` was taken) into a 64-bit
      set for ``m = min(k, d - k)`` draws, the picks (or the complement of the
      set) in ascending order; above it, Floyd's algorithm for
      ``k <= FLOYD_MAX`` in draw order (the taken check a scan) and Algorithm R
      (a reservoir) beyond;
    - uniform, with replacement: ``k`` draws below ``d`` (none when ``d = 0``);
      ``k < 0`` takes every edge once, with replacement or not;
    - weighted, without replacement: Efraimidis-Spirakis, the ``k`` smallest
      keys ``-log(u) / w`` among edges of positive weight, smallest first
      (successive sampling proportional to the weights, as
      ``torch.multinomial``); where a positive weight of the node lies outside
      ``[RATIO_MIN, RATIO_MAX] = [1e-280, 1e280]``, their logs
      ``log(-log(u)) - log(w)`` instead (the same order; ``-log(u) / w``
      would overflow for subnormal ``w``);
    - weighted, with replacement: ``k`` inverse-CDF draws over the positive
      weights, each times ``2**s``, summed in edge order: ``s`` brings the
      node's largest weight into ``[0.5, 1)`` (``frexp``), applied as
      ``w * 2**min(s, 1023) * 2**(s - min(s, 1023))``, which rounds once, so
      the total stays below ``d`` (no overflow at ``1e308``) and subnormal
      weights keep their ratios.

    Weights are float32 or float64, finite and ``>= 0``, of any magnitude,
    computed in float64.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
from numba import njit, prange

from . import forks
from .intrinsics import prefetch
from .sampling_picks import (
    FLOYD_MAX,
    GOLDEN,
    RATIO_MAX,
    RATIO_MIN,
    SMALL_MAX,
    below,
    draw,
    mix,
    mulhi64,
    node_stream,
    pick,
    pick_count,
    unit,
)

# The streams and the per-node picks live in sampling_picks (this docstring specifies them); their names are
# imported from here, the sampler's one public module.
__all__ = ["GOLDEN", "SMALL_MAX", "FLOYD_MAX", "MAX_DEGREE", "RATIO_MIN", "RATIO_MAX", "mix", "node_stream", "draw",
           "mulhi64", "below", "unit", "pick_count", "pick", "sample_hop", "sample_batch", "place_seeds", "relabel",
           "reset_marks", "check_csc"]

#: Frontier nodes ahead whose list is prefetched (their indptr entry twice as far ahead): the picks wait on two
#: cache misses per node (its indptr entry, then its list), which the prefetch overlaps (1.6-1.7x on one thread,
#: 100k nodes and 1.9M edges, fanouts 5 and 15, measured side by side).
PREFETCH_NODES = 16
#: ...up to this many 64-byte lines of its indices and edge ids.
PREFETCH_LINES = 4
#: In-degrees must stay below this (:func:`check_csc`'s code 5); see the module docstring.
MAX_DEGREE = 2**62


@njit(inline="always", cache=True)
def _count_one(indptr, weights, weighted, frontier, k, replace, counts, i):
    v = frontier[i]
    lo = indptr[v]
    d = indptr[v + 1] - lo
    positive = d
    if weighted:
        positive = 0
        for j in range(d):
            if weights[lo + j] > 0.0:
                positive += 1
    counts[i] = pick_count(d, k, replace, positive)


@njit(inline="always", cache=True)
def _pick_one(indptr, indices, eids, has_eids, weights, weighted, frontier, k, replace, key, hop, offsets, nbr, eid,
              keys, i):
    off = offsets[i]
    count = offsets[i + 1] - off
    if count == 0:
        return
    v = frontier[i]
    lo = indptr[v]
    d = indptr[v + 1] - lo
    pick(node_stream(key, hop, v), weights, weighted, lo, d, k, count, replace, eid, keys, off)
    for q in range(off, off + count):
        e = lo + eid[q]
        nbr[q] = indices[e]
        eid[q] = eids[e] if has_eids else e


# Parallel over frontier nodes on Numba's threads; serial in a forked child, whose inherited OpenMP runtime
# would abort at its first parallel region (see directload.kernels.forks).  Four functions, not two compiled
# twice: Numba's cache keys a function by its name and line, so one body compiled twice shares one cache entry.
@njit(inline="always", cache=True)
def _ahead(indptr, indices, eids, frontier, i):
    n = frontier.shape[0]
    if i + 2 * PREFETCH_NODES < n:
        prefetch(indptr.reshape((indptr.shape[0], 1)), frontier[i + 2 * PREFETCH_NODES], 0)
    if i + PREFETCH_NODES < n:
        v = frontier[i + PREFETCH_NODES]
        _lines(indices, indptr[v], indptr[v + 1])
        _lines(eids, indptr[v], indptr[v + 1])


@njit(inline="always", cache=True)
def _lines(a, lo, hi):
    # The cache lines of a[lo:hi], up to PREFETCH_LINES of them (none of an empty array).
    hi = min(hi, a.shape[0], lo + PREFETCH_LINES * (64 // a.itemsize))
    table = a.reshape((a.shape[0], 1))
    for e in range(lo, hi, 64 // a.itemsize):
        prefetch(table, e, 0)


@njit(parallel=True, cache=True)
def _counts(indptr, weights, weighted, frontier, k, replace, counts):
    for i in prange(frontier.shape[0]):
        if i + PREFETCH_NODES < frontier.shape[0]:
            prefetch(indptr.reshape((indptr.shape[0], 1)), frontier[i + PREFETCH_NODES], 0)
        _count_one(indptr, weights, weighted, frontier, k, replace, counts, i)


@njit(cache=True)
def _counts_serial(indptr, weights, weighted, frontier, k, replace, counts):
    for i in range(frontier.shape[0]):
        _count_one(indptr, weights, weighted, frontier, k, replace, counts, i)


@njit(parallel=True, cache=True)
def _picks(indptr, indices, eids, has_eids, weights, weighted, frontier, k, replace, key, hop, offsets, nbr, eid,
           keys):
    for i in prange(frontier.shape[0]):
        _ahead(indptr, indices, eids, frontier, i)
        _pick_one(indptr, indices, eids, has_eids, weights, weighted, frontier, k, replace, key, hop, offsets, nbr,
                  eid, keys, i)


@njit(cache=True)
def _picks_serial(indptr, indices, eids, has_eids, weights, weighted, frontier, k, replace, key, hop, offsets, nbr,
                  eid, keys):
    for i in range(frontier.shape[0]):
        _ahead(indptr, indices, eids, frontier, i)
        _pick_one(indptr, indices, eids, has_eids, weights, weighted, frontier, k, replace, key, hop, offsets, nbr,
                  eid, keys, i)


def sample_hop(indptr: np.ndarray, indices: np.ndarray, eids: np.ndarray | None, weights: np.ndarray | None,
               frontier: np.ndarray, fanout: int, replace: bool, key: int,
               hop: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One hop's picks: ``(neighbours, edge ids, offsets)`` of every node in ``frontier`` (numpy, CPU).

    Node ``frontier[i]``'s picks are ``neighbours[offsets[i]:offsets[i + 1]]``,
    with their edge ids (``eids[position]``, or the position in ``indices``
    when ``eids`` is None).  Runs on Numba's threads (serially in a forked
    child); the result does not depend on their number.
    """
    weighted = weights is not None
    w = weights if weighted else np.empty(0, np.float64)
    replace = bool(replace) and fanout >= 0  # -1: every edge once, with replacement or not (as PyG and DGL)
    serial = forks.forked()
    counts = np.empty(frontier.shape[0], np.int64)
    (_counts_serial if serial else _counts)(indptr, w, weighted, frontier, fanout, replace, counts)
    offsets = np.zeros(frontier.shape[0] + 1, np.int64)
    np.cumsum(counts, out=offsets[1:])
    total = int(offsets[-1])
    nbr = np.empty(total, indices.dtype)
    eid = np.empty(total, np.int64)
    keys = np.empty(total if weighted and not replace else 0, np.float64)
    has_eids = eids is not None
    e = eids if has_eids else np.empty(0, np.int64)
    (_picks_serial if serial else _picks)(indptr, indices, e, has_eids, w, weighted, frontier, fanout, replace,
                                          np.uint64(key), hop, offsets, nbr, eid, keys)
    return nbr, eid, offsets


@njit(cache=True)
def relabel(nodes: np.ndarray, count: int, marks: np.ndarray, nbr: np.ndarray, local: np.ndarray) -> int:
    """Batch-local ids of ``nbr`` in ``local``; nodes seen first are appended to ``nodes[count:]``.

    ``marks[v]`` holds ``v``'s local id plus one (0: not in the batch yet).
    Returns the new node count.  Serial: first-seen order is the contract.
    """
    ahead = marks.reshape((marks.shape[0], 1))
    for q in range(nbr.shape[0]):
        if q + PREFETCH_NODES < nbr.shape[0]:
            prefetch(ahead, nbr[q + PREFETCH_NODES], 0)
        v = nbr[q]
        m = marks[v]
        if m == 0:
            nodes[count] = v
            count += 1
            m = count
            marks[v] = m
        local[q] = m - 1
    return count


@njit(cache=True)
def place_seeds(nodes: np.ndarray, marks: np.ndarray, seeds: np.ndarray) -> int:
    """Put ``seeds`` first in ``nodes``, every one in its place (a repeated seed too, marked at its first place)."""
    for i in range(seeds.shape[0]):
        v = seeds[i]
        nodes[i] = v
        if marks[v] == 0:
            marks[v] = i + 1
    return seeds.shape[0]


@njit(cache=True)
def reset_marks(marks: np.ndarray, nodes: np.ndarray, count: int) -> None:
    """Clear the marks of ``nodes[:count]`` (only those touched, not the whole array)."""
    for i in range(count):
        marks[nodes[i]] = 0


@njit(cache=True)
def check_csc(indptr: np.ndarray, num_edges: int, indices: np.ndarray, num_src: int) -> tuple[int, int]:
    """``-1`` when ``indptr`` and ``indices`` form a valid CSC, else a code: see :mod:`directload.graph`.

    Codes: 1 ``indptr[0] != 0``; 2 decreasing ``indptr`` (at position ``pos``);
    3 ``indptr[-1] != len(indices)``; 4 an index outside ``[0, num_src)``;
    5 an in-degree of :data:`MAX_DEGREE` (``2**62``) or more.
    Returns ``(code, position)``.
    """
    if indptr[0] != 0:
        return 1, 0
    for i in range(indptr.shape[0] - 1):
        if indptr[i + 1] < indptr[i]:
            return 2, i
        if np.int64(indptr[i + 1]) - np.int64(indptr[i]) >= np.int64(MAX_DEGREE):
            return 5, i
    if indptr[indptr.shape[0] - 1] != num_edges:
        return 3, indptr.shape[0] - 1
    for i in range(indices.shape[0]):
        if indices[i] < 0 or indices[i] >= num_src:
            return 4, i
    return -1, -1


@njit(cache=True)
def _targets(offsets, start, col):
    for i in range(offsets.shape[0] - 1):
        for q in range(offsets[i], offsets[i + 1]):
            col[q] = start + i


def sample_batch(indptr: np.ndarray, indices: np.ndarray, eids: np.ndarray | None, weights: np.ndarray | None,
                 seeds: np.ndarray, fanouts: Iterable[int], replace: bool, key: int, layout: str,
                 marks: np.ndarray) -> tuple[np.ndarray, list[tuple[np.ndarray, np.ndarray, np.ndarray]], list[int],
                                             list[int]]:
    """One batch: ``(nodes, hops, num_sampled_nodes, num_sampled_edges)`` (numpy, CPU).

    ``nodes`` are the batch's global node ids, seeds first, then each hop's
    new nodes in the order first seen.  ``hops[h] = (row, col, eid)``: hop
    ``h``'s edges, ``row`` the batch-local id of the picked neighbour (the
    message's source), ``col`` that of the node sampled from, ``eid`` the edge
    id.  ``layout="pyg"`` samples, at each hop, only the nodes new at the hop
    before (PyG's rule); ``layout="dgl"`` samples every node reached so far
    (``to_block``'s rule: a block's destination nodes are its first source
    nodes).  ``marks`` is an all-zero int64 array of one entry per node,
    returned all zero.  A repeated seed keeps its place (as in PyG), and its
    picks are those of its first place (the same node, the same stream).
    """
    pyg = layout == "pyg"
    nodes = np.empty(seeds.shape[0], np.int64)
    count = place_seeds(nodes, marks, seeds)
    try:
        hops, num_nodes, num_edges = [], [count], []
        start = 0
        for hop, fanout in enumerate(fanouts):
            end = count
            frontier = nodes[start if pyg else 0:end]
            nbr, eid, offsets = sample_hop(indptr, indices, eids, weights, frontier, fanout, replace, key, hop)
            if nodes.shape[0] < count + nbr.shape[0]:
                nodes = np.concatenate([nodes[:count], np.empty(max(nbr.shape[0], count), np.int64)])
            row = np.empty(nbr.shape[0], np.int64)
            count = relabel(nodes, count, marks, nbr, row)
            col = np.empty(nbr.shape[0], np.int64)
            _targets(offsets, start if pyg else 0, col)
            hops.append((row, col, eid))
            num_nodes.append(count - end)
            num_edges.append(nbr.shape[0])
            start = end
        return nodes[:count].copy(), hops, num_nodes, num_edges
    finally:
        reset_marks(marks, nodes, count)
