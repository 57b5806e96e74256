"""The disk store's staging: a batch's rows planned as block-aligned reads into staging, then copied out.

Rows that share a block are read once, and reads whose gap is at most ``merge_gap`` bytes are merged (up to
``max_read`` bytes).  The reads land back to back in one staging buffer, a round of them at a time, and
each round's rows are copied into the result before the next (:func:`read_in_rounds`); a batch that fits
one round may instead be gathered straight from staging by the tiered gather (:func:`gather_staged`,
zero-copy from mapped staging on a GPU).  The loops per row or per read run compiled by Numba with the GIL
released; Python sees one call per batch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from types import SimpleNamespace

import numpy as np
import torch
from numba import njit

from directload.kernels.carriers import ELEMENT_SIZES
from directload.kernels.tiered import flat_where, gather_tiered

__all__ = ["plan_reads", "copy_rows_range", "plan_batch", "read_in_rounds", "flat_element", "gather_staged"]


@njit(cache=True, nogil=True)
def plan_reads(rows: np.ndarray, row_nbytes: int, data_offset: int, file_bytes: int, block: int, merge_gap: int,
               max_read: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Block-aligned reads covering ``rows`` (sorted, unique).

    Returns ``(offsets, lengths, needed, row_pos)``: each read's file offset and
    length (multiples of ``block``), the bytes it must get (less than its length
    only where it runs past the end of the file), and where each row starts in
    the staging buffer that receives the reads back to back.

    Examples
    --------
    >>> offsets, lengths, needed, row_pos = plan_reads(np.array([0, 300]), 4, 0, 1 << 20, 512, 0, 1 << 17)
    >>> offsets.tolist(), lengths.tolist(), row_pos.tolist()
    ([0, 1024], [512, 512], [0, 688])
    """
    n = rows.shape[0]
    offsets = np.empty(n, np.uint64)
    lengths = np.empty(n, np.uint32)
    needed = np.empty(n, np.int64)
    row_pos = np.empty(n, np.int64)
    end_of_file = (file_bytes + block - 1) // block * block
    k = -1
    cur_start = 0
    cur_end = 0
    stage = 0
    for i in range(n):
        s = data_offset + rows[i] * row_nbytes
        e = s + row_nbytes
        bs = s // block * block
        be = min((e + block - 1) // block * block, end_of_file)
        if k >= 0 and bs <= cur_end + merge_gap and max(be, cur_end) - cur_start <= max_read:
            if be > cur_end:
                cur_end = be
        else:
            if k >= 0:
                offsets[k] = cur_start
                lengths[k] = cur_end - cur_start
                stage += cur_end - cur_start
            k += 1
            cur_start = bs
            cur_end = be
        row_pos[i] = stage + (s - cur_start)
    if k >= 0:
        offsets[k] = cur_start
        lengths[k] = cur_end - cur_start
    k += 1
    for j in range(k):
        needed[j] = min(np.int64(lengths[j]), file_bytes - np.int64(offsets[j]))
    return offsets[:k], lengths[:k], needed[:k], row_pos


@njit(cache=True, nogil=True)
def copy_rows_range(staging: np.ndarray, row_pos: np.ndarray, inverse: np.ndarray, out: np.ndarray, row_nbytes: int,
                    lo: int, hi: int) -> None:
    """``out[i] = staging[row_pos[inverse[i]] : +row_nbytes]`` (bytes) for the outputs whose unique row is in
    ``[lo, hi)`` (one staging round).

    Examples
    --------
    >>> out = np.zeros(6, np.uint8)
    >>> copy_rows_range(np.arange(8, dtype=np.uint8), np.array([0, 4]), np.array([1, 0, 1]), out, 2, 0, 2)
    >>> out.tolist()
    [4, 5, 0, 1, 4, 5]
    """
    for i in range(inverse.shape[0]):
        u = inverse[i]
        if lo <= u < hi:
            p = row_pos[u]
            o = i * row_nbytes
            out[o:o + row_nbytes] = staging[p:p + row_nbytes]


def plan_batch(ids: np.ndarray, row_nbytes: int, data_offset: int, file_bytes: int, block: int, merge_gap: int,
               max_read: int, staging_bytes: int) -> SimpleNamespace:
    """The reads of a batch: its unique rows, block-aligned merged reads and each row's place in staging.

    Parameters
    ----------
    ids : numpy.ndarray
        The rows asked for (int64, any order, duplicates allowed).
    row_nbytes, data_offset, file_bytes : int
        The file's layout: bytes per row, the offset of row 0, the file's size.
    block : int
        The read granularity (every read's offset and length are multiples of it).
    merge_gap, max_read : int
        As :func:`plan_reads` (``max_read`` is raised to one block at least).
    staging_bytes : int
        Bytes of staging one round may fill (raised to the longest read).

    Returns
    -------
    types.SimpleNamespace
        ``rows``, ``inverse`` (each id's place in ``rows``), :func:`plan_reads`'s ``offsets``, ``lengths``,
        ``needed`` and ``row_pos``, each read's ``starts`` and ``ends`` in one long staging run, its
        ``total`` bytes, the ``chunk`` one round takes, and ``io_seconds``/``cpu_seconds`` at 0.

    Examples
    --------
    >>> p = plan_batch(np.array([9, 2, 9]), 4, 0, 64, 16, 0, 16, 16)
    >>> p.rows.tolist(), p.inverse.tolist(), p.offsets.tolist(), p.total, p.chunk
    ([2, 9], [1, 0, 1], [0, 32], 32, 16)
    """
    rows, inverse = np.unique(ids, return_inverse=True)
    offsets, lengths, needed, row_pos = plan_reads(rows, row_nbytes, data_offset, file_bytes, block, merge_gap,
                                                   max(max_read, block))
    ends = np.cumsum(lengths, dtype=np.int64)  # each read's place in one long staging run
    return SimpleNamespace(rows=rows, inverse=inverse.reshape(-1).astype(np.int64, copy=False), offsets=offsets,
                           lengths=lengths, needed=needed, row_pos=row_pos, starts=ends - lengths, ends=ends,
                           total=int(ends[-1]), chunk=max(staging_bytes, int(lengths.max())),
                           io_seconds=0.0, cpu_seconds=0.0)


def read_in_rounds(p: SimpleNamespace, staging: np.ndarray, out_bytes: np.ndarray, row_nbytes: int,
                   read_round: Callable[[int, int], object]) -> None:
    """Plan ``p`` (:func:`plan_batch`) read in rounds through one reused ``staging`` buffer of ``p.chunk``
    bytes (or one read), each round's rows copied into ``out_bytes`` before the next, so a big batch needs no
    big second copy of itself.

    ``read_round(a, b)`` reads reads ``[a, b)`` of the plan into ``staging``, read ``a`` at its start.

    Examples
    --------
    >>> table = np.arange(64, dtype=np.uint8)  # the file: 16 rows of 4 bytes
    >>> p = plan_batch(np.array([9, 2, 9]), 4, 0, 64, 16, 0, 16, 16)  # two reads, one per round
    >>> staging, out = np.zeros(16, np.uint8), np.zeros(12, np.uint8)
    >>> def read_round(a, b):
    ...     for start, offset, length in zip(p.starts[a:b] - p.starts[a], p.offsets[a:b], p.lengths[a:b]):
    ...         staging[start:start + length] = table[offset:offset + length]
    >>> read_in_rounds(p, staging, out, 4, read_round)
    >>> out.reshape(3, 4).tolist()
    [[36, 37, 38, 39], [8, 9, 10, 11], [36, 37, 38, 39]]
    """
    row_read = np.searchsorted(p.starts, p.row_pos, side="right") - 1
    a = 0
    while a < p.offsets.shape[0]:
        b = max(int(np.searchsorted(p.ends, p.starts[a] + p.chunk, side="right")), a + 1)  # reads that fit
        read_round(a, b)
        # (mypy: with numpy's stubs skipped (mypy.ini), the scalar overload of searchsorted matches a list too, and
        # lo and hi look like the items of a scalar)
        lo, hi = np.searchsorted(row_read, [a, b])  # type: ignore[misc]
        copy_rows_range(staging, p.row_pos - p.starts[a], p.inverse, out_bytes, row_nbytes, lo, hi)  # type: ignore[has-type]
        a = b


def flat_element(dtype: torch.dtype, data_offset: int) -> int | None:
    """The element size of ``dtype`` when rows from ``data_offset`` on can be addressed as a flat tier (an
    element width the tiered gather moves, rows on their element grid in the file), else None: complex128,
    or rows off their grid, go through the copy path (:func:`read_in_rounds`).

    Examples
    --------
    >>> flat_element(torch.float32, 4096), flat_element(torch.complex128, 4096), flat_element(torch.float32, 130)
    (4, None, None)
    """
    elem = torch.empty(0, dtype=dtype).element_size()
    return elem if elem in ELEMENT_SIZES and not data_offset % elem else None


def gather_staged(flat: torch.Tensor, offsets: np.ndarray, row_shape: Sequence[int], out: torch.Tensor | None,
                  device: torch.device) -> torch.Tensor:
    """The rows at element ``offsets`` of ``flat`` (staging viewed as the rows' dtype), gathered into ``out``
    (or a new tensor) on ``device`` by the tiered gather: zero-copy from mapped staging on a GPU, whose
    gather is waited for (the staging buffer is the next read's).

    Examples
    --------
    >>> gather_staged(torch.arange(8.0), np.array([6, 0]), (2,), None, torch.device("cpu")).tolist()
    [[6.0, 7.0], [0.0, 1.0]]
    """
    where = torch.from_numpy(flat_where(offsets))  # checked on the host, sent without a wait
    cache = torch.empty((0, *row_shape), dtype=flat.dtype, device=device)
    result = gather_tiered(cache, flat, where, out=out, device=device)
    if device.type == "cuda":
        torch.cuda.current_stream(device).synchronize()  # the staging buffer is the next read's
    return result
