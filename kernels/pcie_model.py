"""Memory-traffic model of a gather: SM-to-L2 requests, the 32-byte sectors read and the pages touched.

Two questions, two counts:

- :func:`count_requests` counts what a kernel's warps *ask* the L2 for: the distinct 128-byte lines of
  each warp-wide load.  That is a property of the kernel's thread mapping (the paper's Figures 4.4-4.5),
  **not** the bytes on the PCIe link: the L2 merges requests for the same sectors, so a kernel that
  issues twice the requests can move the same bytes.
- :func:`footprint` counts what the *host memory* serves: 32-byte sectors (the unit a zero-copy read
  brings over the link) and 4 KiB / 2 MiB pages (what the address translation walks), over windows of
  rows in flight at once.  Every kernel reads exactly each row's bytes, so these do not depend on the
  kernel, only on the ids, their order (sorted or not), the row size and the table's spread: they are
  what predicts a gain from sorting the ids (:func:`sorting_gain`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
from numba import njit

from .indexing import LINE, WARP, aligned_geometry, aligned_span, naive_element, tier_row

if TYPE_CHECKING:
    import numpy.typing as npt

__all__ = ["RequestCount", "count_requests", "count_tiered", "row_min_lines", "paper_shift_element", "thread_map",
           "Footprint", "footprint", "sorting_gain", "SECTOR", "PAGE_4K", "PAGE_2M"]

#: Bytes of an L2 sector: the unit a read of mapped host memory brings over the link.
SECTOR = 32
#: Base and huge page sizes of x86-64 host memory.
PAGE_4K = 4096
PAGE_2M = 2 << 20

# The request model compiles the very functions the kernels call, so a counted request is one the kernel
# really issues.  A "warp-wide load" is one step of one warp: the set of bytes its lanes read together.
# Each distinct line in that set is one SM-to-L2 request (PyTorch-Direct paper, section 4.4.5, counts
# these as PCIe requests; on an L2 that merges sectors they are not link traffic).
_geometry = njit(inline="always")(aligned_geometry)
_span = njit(inline="always")(aligned_span)
_naive = njit(inline="always")(naive_element)


@dataclass(frozen=True)
class RequestCount:
    """Result of :func:`count_requests`.

    Attributes
    ----------
    total : int
        SM-to-L2 requests of the whole gather (distinct 128-byte lines per warp-wide load, summed): what
        the warps ask the L2 for, not the bytes on the link (see :func:`footprint`).
    per_row : numpy.ndarray
        int64 ``[n_index]``: requests for each gathered row's bytes.
    min_lines : numpy.ndarray
        int64 ``[n_index]``: lines each row spans, the least any kernel can issue.

    Examples
    --------
    The paper's toy example (4-lane warps, 16-byte lines, 44-byte rows): the aligned kernel issues the
    minimum for every row.

    >>> counts = count_requests([0, 2, 4], 44, 4, kernel="aligned", warp=4, line=16)
    >>> counts.total, counts.per_row.tolist(), counts.min_lines.tolist()
    (10, [3, 4, 3], [3, 4, 3])
    >>> count_requests([0, 2, 4], 44, 4, kernel="naive", warp=4, line=16).total
    16
    """

    total: int
    per_row: np.ndarray
    min_lines: np.ndarray


@njit(cache=True)
def row_min_lines(row_addr: int, row_bytes: int, line: int) -> int:
    """Lines spanned by ``row_bytes`` bytes that start at ``row_addr``."""
    return (row_addr + row_bytes - 1) // line - row_addr // line + 1


@njit(cache=True)
def paper_shift_element(col: int, row_first_tid: int, row_addr: int, row_elems: int, elem: int, warp: int,
                        line: int) -> int:
    """Element read by column-thread ``col`` under the paper's own circular shift.

    Model only (no kernel uses it): PyTorch-Direct keeps one thread per output
    element and rotates each row by ``shift`` so that a thread's lane matches its
    element's place in the line, wrapping by the row length (PyTorch-Direct paper, Fig. 4.5).
    """
    per_line = line // elem
    lane0 = row_first_tid % warp
    pos0 = (row_addr % line) // elem
    shift = (lane0 - pos0) % per_line
    return (col + shift) % row_elems


@njit(cache=True)
def _count_flat(addrs, row_elems, elem, warp, line, paper, per_row):
    """Naive / paper mapping: warp w reads flat outputs [w*warp, (w+1)*warp)."""
    n = addrs.shape[0]
    total_elems = n * row_elems
    lines = np.empty(warp, np.int64)
    rows = np.empty(warp, np.int64)
    total = 0
    for w0 in range(0, total_elems, warp):
        k = 0
        for tid in range(w0, min(w0 + warp, total_elems)):
            r, c = _naive(tid, row_elems)
            if paper:
                c = paper_shift_element(c, r * row_elems, addrs[r], row_elems, elem, warp, line)
            lines[k] = (addrs[r] + c * elem) // line
            rows[k] = r
            k += 1
        for a in range(k):
            seen = False
            for b in range(a):
                if lines[b] == lines[a] and rows[b] == rows[a]:
                    seen = True
                    break
            if not seen:
                per_row[rows[a]] += 1
                new_line = True
                for b in range(a):
                    if lines[b] == lines[a]:
                        new_line = False
                        break
                if new_line:
                    total += 1
    return total


@njit(cache=True)
def _count_aligned(addrs, row_bytes, elem, warp, line, per_row):
    """Aligned mapping: one warp per row, steps as planned by aligned_geometry."""
    total = 0
    u = 4 if elem < 4 else elem
    cap = warp * ((u + line - 1) // line + 1)
    lines = np.empty(cap, np.int64)
    for r in range(addrs.shape[0]):
        a = addrs[r]
        base, first, last, steps, wrap = _geometry(a, row_bytes, elem, warp, line)
        for step in range(steps):
            k = 0
            for lane in range(warp):
                lo, hi = _span(lane, step, a, row_bytes, elem, warp, base, first, last, steps, wrap)
                if lo < hi:
                    for ln in range((a + lo * elem) // line, (a + hi * elem - 1) // line + 1):
                        lines[k] = ln
                        k += 1
            distinct = 0
            for i in range(k):
                dup = False
                for j in range(i):
                    if lines[j] == lines[i]:
                        dup = True
                        break
                if not dup:
                    distinct += 1
            per_row[r] += distinct
            total += distinct
    return total


def count_requests(index: npt.ArrayLike, row_bytes: int, elem: int, *, kernel: str = "aligned", src_addr: int = 0,
                   warp: int = WARP, line: int = LINE) -> RequestCount:
    """Count the SM-to-L2 read requests of gathering ``index`` rows (not link bytes: see :func:`footprint`).

    Parameters
    ----------
    index : array_like of int
        Rows gathered, in output order.
    row_bytes, elem : int
        Bytes per row and per element (``row_bytes % elem == 0``).
    kernel : {"aligned", "naive", "paper"}
        The kernel's mapping; ``"paper"`` is PyTorch-Direct's own shift, kept to
        reproduce its Figure 4.5.
    src_addr : int
        Address of row 0 (only its remainder modulo ``line`` matters).
    warp, line : int
        Lanes per warp and bytes per cache line.

    Returns
    -------
    RequestCount

    Examples
    --------
    >>> int(count_requests([0, 2, 4], 44, 4, kernel="naive", warp=4, line=16).per_row[1])
    7
    """
    if kernel not in ("aligned", "naive", "paper"):
        raise ValueError(f"kernel must be 'aligned', 'naive' or 'paper', got {kernel!r}")
    if row_bytes <= 0 or elem <= 0 or row_bytes % elem:
        raise ValueError(f"row_bytes ({row_bytes}) must be a positive multiple of elem ({elem})")
    idx = np.asarray(index, dtype=np.int64).reshape(-1)
    addrs = src_addr % line + idx * row_bytes
    per_row = np.zeros(idx.shape[0], np.int64)
    if kernel == "aligned":
        total = _count_aligned(addrs, row_bytes, elem, warp, line, per_row)
    else:
        total = _count_flat(addrs, row_bytes // elem, elem, warp, line, kernel == "paper", per_row)
    mins = np.array([row_min_lines(a, row_bytes, line) for a in addrs], dtype=np.int64)
    return RequestCount(int(total), per_row, mins)


def count_tiered(where: npt.ArrayLike, row_bytes: int, elem: int, *, cache_addr: int = 0, flat_addr: int = 0,
                 warp: int = WARP, line: int = LINE) -> dict[str, RequestCount]:
    """Count the SM-to-L2 read requests of the aligned tiered gather (``kernels.tiered``), per tier.

    One warp per output row, as in the plain aligned gather, so each row's
    requests depend only on its own address: the count is exact per tier.

    Rows are located by ``kernels.indexing.tier_row``, the function the
    kernels use.  Flat-tier rows are read zero-copy from mapped host memory
    (their requests are the L2's requests to the link); cache rows are
    device-memory reads.

    Returns
    -------
    dict
        ``{"cache": RequestCount, "flat": RequestCount}``, each over that
        tier's rows in output order.
    """
    if row_bytes <= 0 or elem <= 0 or row_bytes % elem:
        raise ValueError(f"row_bytes ({row_bytes}) must be a positive multiple of elem ({elem})")
    row_elems = row_bytes // elem
    rows = [tier_row(int(w), row_elems, elem, cache_addr % line, flat_addr % line)
            for w in np.asarray(where, np.int64).reshape(-1)]
    out = {}
    for tier, name in ((0, "cache"), (1, "flat")):
        addrs = np.array([a for t, _, a in rows if t == tier], dtype=np.int64)
        per_row = np.zeros(addrs.shape[0], np.int64)
        total = _count_aligned(addrs, row_bytes, elem, warp, line, per_row)
        mins = np.array([row_min_lines(a, row_bytes, line) for a in addrs], dtype=np.int64)
        out[name] = RequestCount(int(total), per_row, mins)
    return out


@njit(cache=True)
def _thread_map(addrs, row_elems, elem, aligned, grid, block, warp, line, tid_out, step_out):
    stride = grid * block
    if not aligned:
        for i in range(addrs.shape[0] * row_elems):
            tid_out[i] = i % stride
            step_out[i] = i // stride
        return
    row_bytes = row_elems * elem
    warps_per_block = block // warp
    total_warps = grid * warps_per_block
    for r in range(addrs.shape[0]):
        w = r % total_warps
        first_tid = (w // warps_per_block) * block + (w % warps_per_block) * warp
        a = addrs[r]
        base, first, last, steps, wrap = _geometry(a, row_bytes, elem, warp, line)
        for step in range(steps):
            for lane in range(warp):
                lo, hi = _span(lane, step, a, row_bytes, elem, warp, base, first, last, steps, wrap)
                for c in range(lo, hi):
                    tid_out[r * row_elems + c] = first_tid + lane
                    step_out[r * row_elems + c] = step


def thread_map(index: npt.ArrayLike, row_elems: int, elem: int, *, aligned: bool, grid: int, block: int,
               src_addr: int = 0, warp: int = WARP, line: int = LINE) -> tuple[np.ndarray, np.ndarray]:
    """Which flat thread, at which step, copies each output element.

    The model's prediction of a kernel trace: ``kernels.host_emu.launch(...,
    trace=True)`` and ``kernels.numba_cuda.gather_rows(..., trace=True)`` must
    return exactly these arrays for the same launch.

    Returns
    -------
    (numpy.ndarray, numpy.ndarray)
        int64 thread ids and int32 steps, one per output element (row-major).
    """
    idx = np.asarray(index, dtype=np.int64).reshape(-1)
    addrs = src_addr % line + idx * (row_elems * elem)
    tid = np.full(idx.shape[0] * row_elems, -1, np.int64)
    step = np.full(idx.shape[0] * row_elems, -1, np.int32)
    _thread_map(addrs, row_elems, elem, aligned, grid, block, warp, line, tid, step)
    return tid, step


@dataclass(frozen=True)
class Footprint:
    """Result of :func:`footprint`: what a gather reads from host memory.

    Each count is taken per window of ``window`` consecutive rows (in the order the kernel issues them) and
    summed: a unit touched twice within a window counts once (the L2 and the translation caches serve the
    second touch), in two windows twice.  ``window=1`` is every row on its own; a window of all the rows
    gives the distinct units, the floor.

    Attributes
    ----------
    rows : int
        Rows gathered.
    window : int
        Rows counted together (about the rows a GPU has in flight at once).
    sector_bytes : int
        32-byte sectors touched, times 32: the bytes the link carries for the gather.
    pages_4k, pages_2m : int
        4 KiB and 2 MiB pages touched: the address translations the reads need.

    Examples
    --------
    Rows 0, 1, 0 of 48 bytes: row 0 spans sectors 0-1, row 1 sectors 1-2.  Alone each row reads 2
    sectors; all three in flight together read 3.

    >>> footprint([0, 1, 0], 48).sector_bytes, footprint([0, 1, 0], 48, window=3).sector_bytes
    (192, 96)
    """

    rows: int
    window: int
    sector_bytes: int
    pages_4k: int
    pages_2m: int


@njit(cache=True)
def _window_units(addrs, row_bytes, unit, window):
    """Units of ``unit`` bytes touched by rows of ``row_bytes`` at ``addrs``, counted once per window."""
    n = addrs.shape[0]
    total = 0
    for w0 in range(0, n, window):
        # Rows of one length: sorted by start, their last units are sorted too, so one pass merges them.
        starts = np.sort(addrs[w0:min(n, w0 + window)])
        done = -1  # the last unit counted in this window
        for a in starts:
            lo = a // unit
            hi = (a + row_bytes - 1) // unit
            if hi > done:
                total += hi - max(lo, done + 1) + 1
                done = hi
    return total


def footprint(index: npt.ArrayLike, row_bytes: int, *, sort: bool = False, window: int = 1,
              src_addr: int = 0) -> Footprint:
    """Sectors and pages a gather of ``index`` rows touches in host memory.

    Parameters
    ----------
    index : array_like of int
        Rows gathered, in output order.
    row_bytes : int
        Bytes per row (every kernel reads exactly these, whatever its loads).
    sort : bool
        Issue the rows in sorted order, as a sorted variant does (``Variant.sorted``).
    window : int
        Rows in flight at once (see :class:`Footprint`).
    src_addr : int
        Address of row 0 (only its remainder modulo 2 MiB matters).

    Returns
    -------
    Footprint

    Examples
    --------
    Rows 0 and 1 of 1 KiB share a 4 KiB page, rows 8 and 9 share another: in the order 0, 8, 1, 9 two rows in
    flight touch both pages twice, sorted they touch each once.

    >>> footprint([0, 8, 1, 9], 1024, window=2).pages_4k, footprint([0, 8, 1, 9], 1024, window=2, sort=True).pages_4k
    (4, 2)
    """
    if row_bytes <= 0:
        raise ValueError(f"row_bytes must be positive, got {row_bytes}")
    if window < 1:
        raise ValueError(f"window must be at least 1 row, got {window}")
    idx = np.asarray(index, dtype=np.int64).reshape(-1)
    if sort:
        idx = np.sort(idx)
    addrs = src_addr % PAGE_2M + idx * row_bytes
    return Footprint(int(idx.shape[0]), int(window), SECTOR * int(_window_units(addrs, row_bytes, SECTOR, window)),
                     int(_window_units(addrs, row_bytes, PAGE_4K, window)),
                     int(_window_units(addrs, row_bytes, PAGE_2M, window)))


def sorting_gain(index: npt.ArrayLike, row_bytes: int, *, window: int, src_addr: int = 0) -> dict[str, float]:
    """How much sorting ``index`` shrinks each count of :func:`footprint`: unsorted over sorted (>= 1).

    The model's prediction of a sorted variant's gain where the gather is bound by that count (bytes on
    the link, or translations); the GPU benchmarks print it beside the measured gain.

    Examples
    --------
    >>> sorting_gain([0, 8, 1, 9], 1024, window=2)
    {'sector_bytes': 1.0, 'pages_4k': 2.0, 'pages_2m': 1.0}
    """
    unsorted = footprint(index, row_bytes, window=window, src_addr=src_addr)
    ordered = footprint(index, row_bytes, sort=True, window=window, src_addr=src_addr)
    return {k: getattr(unsorted, k) / max(1, getattr(ordered, k)) for k in ("sector_bytes", "pages_4k", "pages_2m")}
