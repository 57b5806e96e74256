"""The CPU gather kernels, compiled by Numba: the row code, and its two parallel forms (Numba's team, torch's),
and the tiered gather's kernels.

The same row code runs in every form: the aligned mapping (whole rows per worker) and the naive one (one work
item per output element).  Every kernel checks the whole index before it writes, so an index out of range
leaves the output untouched.  The tiered kernels take rows from two tiers by ``kernels.indexing.tier_row``, as
the GPU kernels do (see :mod:`directload.kernels.tiered`); their ``where`` is checked before they run.  Which
form runs, on how many threads, is :mod:`directload.kernels.cpu_launch`'s choice.
"""

from __future__ import annotations

import functools
import struct
from types import FunctionType
from typing import Any

import numpy as np
from numba import carray, cfunc, njit, prange, types

from .carriers import CARRIERS, ELEMENT_SIZES
from .indexing import naive_element, tier_row
from .intrinsics import call_int, call_void, copy_row, pointer, prefetch

__all__ = ["first_invalid", "KERNELS", "team_kernel", "LAUNCH", "FLAGS", "TID", "RESULT", "NP_CARRIER", "NP_INDEX",
           "PREFETCH_ROWS", "PREFETCH_LINES", "MEMCPY_BYTES", "TIERED_KERNELS", "FILL_KERNELS",
           "share_of", "specialise", "prefetch_ahead", "team_check"]

_naive = njit(inline="always")(naive_element)

#: The aligned kernel prefetches the row this many rows ahead of the one it copies...
PREFETCH_ROWS = 8
#: ...up to this many 64-byte cache lines of it (the hardware prefetcher follows longer rows).
PREFETCH_LINES = 16
#: Rows of this many bytes and more are copied by libc's memcpy, shorter ones by a vector loop
#: (each the faster side of the line, measured: +25% loop at 256 B, +6-10% memcpy from 1 KiB).
MEMCPY_BYTES = 1024

#: numpy's carrier type of each element size, and of each index size.
NP_CARRIER = {size: np.dtype(CARRIERS[size].numpy).type for size in ELEMENT_SIZES}
NP_INDEX = {4: np.int32, 8: np.int64}


# ---------------------------------------------------------------- the row code, shared by every form

@njit(nogil=True, cache=True)
def first_invalid(idx: np.ndarray, n_rows: int) -> int:
    """Position of the first index outside ``[0, n_rows)``, or -1 when all are valid."""
    for i in range(idx.shape[0]):
        v = idx[i]
        if v < 0 or v >= n_rows:
            return i
    return -1


@njit(inline="always")
def prefetch_ahead(table: np.ndarray, idx: np.ndarray, i: int, hi: int, lines: int) -> None:
    """Prefetch the first ``lines`` cache lines of ``table[idx[i + PREFETCH_ROWS]]`` when that is before ``hi``:
    what each worker of a row gather does before it reads row ``idx[i]``."""
    ahead = i + PREFETCH_ROWS
    if ahead < hi:
        far = idx[ahead]
        for line in range(lines):
            prefetch(table, far, line * 64)


@njit(inline="always")
def _aligned_rows(src, idx, out, lo, hi):
    # The aligned mapping's partition of work: whole rows per worker, as one warp
    # per row on the GPU.  The circular order inside a row only serves the GPU's
    # 128-byte coalescing; a CPU core copies the row as one contiguous run, which
    # the compiler vectorises (computing the GPU plan per row cost 30% at 256 B).
    # Random rows make the copy latency-bound, so each worker prefetches the row
    # PREFETCH_ROWS ahead (+5-30% at 256 B-4 KiB rows, measured side by side).
    row_elems = src.shape[1]
    row_bytes = row_elems * src.itemsize
    lines = min((row_bytes + 63) // 64, PREFETCH_LINES)
    for i in range(lo, hi):
        prefetch_ahead(src, idx, i, hi, lines)
        row = idx[i]
        if row_bytes >= MEMCPY_BYTES:
            copy_row(out, i, src, row, row_bytes)
        else:
            for c in range(row_elems):
                out[i, c] = src[row, c]


@njit(inline="always")
def _naive_elements(src, idx, out, lo, hi):
    # The naive mapping: one work item per output element (PyTorch's own index kernel).
    row_elems = src.shape[1]
    for i in range(lo, hi):
        r, c = _naive(i, row_elems)
        out[r, c] = src[idx[r], c]


@njit(inline="always")
def share_of(units: int, part: int, parts: int) -> tuple[int, int]:
    """``[lo, hi)`` of ``part`` out of ``parts`` equal shares of ``units``."""
    return units * part // parts, units * (part + 1) // parts


def specialise(body: Any, name: str, **constants: object) -> FunctionType:
    """A copy of ``body`` under its own name, with module constants overridden.

    Numba's on-disk cache is keyed by qualified name, so every variant needs its own.
    """
    fn = FunctionType(body.__code__, dict(body.__globals__, **constants), body.__name__)
    fn.__qualname__ = f"{body.__qualname__}_{name}"
    return fn


# ---------------------------------------------------------------- serial and Numba-team kernels
# ``parts`` equal shares run on Numba's threads (one part: serial), so a worker
# prefetches within its own run of rows, as on the torch team.

def _aligned_kernel(src, idx, out, parts):
    bad = first_invalid(idx, src.shape[0])
    if bad >= 0:
        return bad
    for p in prange(parts):
        lo, hi = share_of(idx.shape[0], p, parts)
        _aligned_rows(src, idx, out, lo, hi)
    return -1


def _naive_kernel(src, idx, out, parts):
    bad = first_invalid(idx, src.shape[0])
    if bad >= 0:
        return bad
    units = idx.shape[0] * src.shape[1]
    for p in prange(parts):
        lo, hi = share_of(units, p, parts)
        _naive_elements(src, idx, out, lo, hi)
    return -1


#: ``(aligned, parallel)`` -> ``kernel(src, idx, out, parts)`` over numpy arrays: -1, or the position of the
#: first index out of range (nothing written).  Parallel ones run on Numba's threading layer.
KERNELS: dict[tuple[bool, bool], Any] = {
    (aligned, parallel): njit(parallel=parallel, nogil=True, cache=True, boundscheck=False)(
        specialise(body, "parallel" if parallel else "serial"))
    for aligned, body in ((True, _aligned_kernel), (False, _naive_kernel))
    for parallel in (True, False)
}


# ---------------------------------------------------------------- torch-team kernels

# Compile-time constants of the team body; team_kernel overrides them per specialisation.
ALIGNED, CARRIER, INDEX = True, np.int32, np.int64
# The argument block of one team launch (int64 slots): the launch, the result, the
# runtime's functions, then a flag per thread.
_SRC, _ROWS, _ROW_ELEMS, _IDX, _N, _OUT, RESULT, TID, _NTHREADS, _BARRIER, FLAGS = range(11)
#: The launch's slots of the block (``_SRC`` .. ``_OUT``), written in one call; then ``RESULT``, and from ``TID``
#: the addresses of ``omp_get_thread_num``, ``omp_get_num_threads`` and ``GOMP_barrier``; from ``FLAGS`` a flag
#: per thread.
LAUNCH = struct.Struct("<6q")


@njit(inline="always")
def team_check(data: int, idx: np.ndarray) -> tuple[int, int, int, int, int]:
    """A team body's first step, over the argument block at ``data``: this part checks its share of ``idx``
    against the block's rows, all parts meet at the barrier, and each then knows the first bad position of the
    whole index (part 0 stores it as the launch's result).  ``(first, part, parts, lo, hi)``: -1 or that position,
    this part's number, the team's size, and this part's share ``[lo, hi)`` of the ids."""
    a = carray(pointer(data), FLAGS, np.int64)
    part = call_int(a[TID])
    parts = call_int(a[_NTHREADS])
    flags = carray(pointer(data + 8 * FLAGS), parts, np.int64)
    lo, hi = share_of(a[_N], part, parts)
    bad = first_invalid(idx[lo:hi], a[_ROWS])
    flags[part] = lo + bad if bad >= 0 else -1
    call_void(a[_BARRIER])  # every part checked before any part writes
    first = -1
    for p in range(parts):  # parts cover the index in order: the first flagged one holds the first bad index
        if flags[p] >= 0:
            first = flags[p]
            break
    if part == 0:
        a[RESULT] = first
    return first, part, parts, lo, hi


def _team_body(data):
    a = carray(pointer(data), FLAGS, np.int64)
    src = carray(pointer(a[_SRC]), (a[_ROWS], a[_ROW_ELEMS]), CARRIER)
    idx = carray(pointer(a[_IDX]), a[_N], INDEX)
    out = carray(pointer(a[_OUT]), (a[_N], a[_ROW_ELEMS]), CARRIER)
    first, part, parts, lo, hi = team_check(data, idx)
    if first >= 0:
        return
    if ALIGNED:
        _aligned_rows(src, idx, out, lo, hi)
    else:
        lo, hi = share_of(a[_N] * a[_ROW_ELEMS], part, parts)
        _naive_elements(src, idx, out, lo, hi)


@functools.cache
def team_kernel(aligned: bool, carrier_size: int, index_size: int) -> int:
    """The compiled team body's address (a C ``void body(int64 block_address)``, started by ``GOMP_parallel``),
    one per mapping, element size and index size; compiled, or loaded from Numba's cache, on first use."""
    name = f"{'aligned' if aligned else 'naive'}_e{carrier_size}_i{index_size}"
    fn = specialise(_team_body, name, ALIGNED=aligned, CARRIER=NP_CARRIER[carrier_size],
                     INDEX=NP_INDEX[index_size])
    return cfunc(types.void(types.intp), nopython=True, nogil=True, cache=True, boundscheck=False)(fn).address


# ---------------------------------------------------------------- tiered kernels

_tier_row = njit(inline="always")(tier_row)


@njit(inline="always")
def _tiered_row(cache, flat, where, out, row_elems, r):
    tier, first, _ = _tier_row(where[r], row_elems, 1, 0, 0)
    if tier == 0:
        out[r, :] = cache[first:first + row_elems]
    else:
        out[r, :] = flat[first:first + row_elems]


@njit(inline="always")
def _fill_row(table, slots, flat, offsets, row_elems, k):
    _, first, _ = _tier_row(-offsets[k] - 1, row_elems, 1, 0, 0)
    table[slots[k], :] = flat[first:first + row_elems]


# Each loop twice: on Numba's threads, and serial for a forked child (whose inherited threading layer
# aborts at its first parallel loop: "fork() called from a process already using GNU OpenMP") or one thread.
@njit(parallel=True, nogil=True, cache=True)
def _tiered_parallel(cache, flat, where, out, row_elems):
    for r in prange(where.shape[0]):
        _tiered_row(cache, flat, where, out, row_elems, r)


@njit(nogil=True, cache=True)
def _tiered_serial(cache, flat, where, out, row_elems):
    for r in range(where.shape[0]):
        _tiered_row(cache, flat, where, out, row_elems, r)


@njit(parallel=True, nogil=True, cache=True)
def _fill_parallel(table, slots, flat, offsets, row_elems):
    for k in prange(slots.shape[0]):
        _fill_row(table, slots, flat, offsets, row_elems, k)


@njit(nogil=True, cache=True)
def _fill_serial(table, slots, flat, offsets, row_elems):
    for k in range(slots.shape[0]):
        _fill_row(table, slots, flat, offsets, row_elems, k)


#: ``parallel`` -> ``kernel(cache, flat, where, out, row_elems)`` over numpy arrays of one bit carrier:
#: ``out[r]`` = cache row ``where[r]``, or the flat tier's row at element ``-where[r] - 1``.
TIERED_KERNELS = {True: _tiered_parallel, False: _tiered_serial}
#: ``parallel`` -> ``kernel(table, slots, flat, offsets, row_elems)``: ``table[slots[k]]`` = the flat tier's row at
#: element ``offsets[k]``.
FILL_KERNELS = {True: _fill_parallel, False: _fill_serial}
