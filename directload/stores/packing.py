"""Hotness renumbering (Sentinel's packing): profile which rows are read, then rewrite the disk file with
the hot rows together, so a block read from the SSD is mostly rows someone wants.

Rows smaller than the disk's block share blocks; in the file's original order a hot row's block-mates are
mostly cold, so reading it reads them too (read amplification).  Sorted by how often the sampler reads
them, hot rows share blocks with other hot rows.  The new file keeps the old ids: an id map (old id -> row
in the file) is stored next to it, with its checksum in the sidecar, and a
:class:`~directload.stores.DiskStore` applies it to every read, so nothing above the store changes.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from directload.kernels.operands import out_of_range

from .disk import DiskStore
from .disk_write import write_disk_store

__all__ = ["access_counts", "hot_order", "renumber"]


def access_counts(batches: Iterable[npt.ArrayLike | torch.Tensor], num_rows: int) -> np.ndarray:
    """How many of ``batches`` (id arrays: K pre-sampled batches, or a first epoch) read each row.

    Examples
    --------
    >>> access_counts([[5, 1, 5], [5, 7]], num_rows=8).tolist()  # a batch counts a row once
    [0, 1, 0, 0, 0, 2, 0, 1]
    """
    counts = np.zeros(int(num_rows), np.int64)
    for b in batches:
        ids = np.unique(np.asarray(torch.as_tensor(b).cpu().numpy() if torch.is_tensor(b) else b, np.int64))
        if ids.size and (ids[0] < 0 or ids[-1] >= num_rows):
            raise out_of_range(int(ids[0] if ids[0] < 0 else ids[-1]), int(num_rows), what="row id")
        counts[ids] += 1
    return counts


def hot_order(counts: npt.ArrayLike, tiebreak: npt.ArrayLike | None = None) -> np.ndarray:
    """The new row order: most read first; among rows read equally often, highest ``tiebreak`` first
    (e.g. in-degree: a profile of a few batches sees most rows once or never, and the degree tells
    which of those the sampler meets more), then the old order (so cold rows keep whatever locality the
    file had).

    Examples
    --------
    >>> hot_order([0, 1, 0, 2]).tolist()
    [3, 1, 0, 2]
    >>> hot_order([0, 1, 0, 2], tiebreak=[1, 0, 5, 0]).tolist()  # rows 0 and 2 tie: the higher degree first
    [3, 1, 2, 0]
    """
    counts = np.asarray(counts)
    if tiebreak is None:
        return np.argsort(-counts, kind="stable")
    tiebreak = np.asarray(tiebreak)
    if tiebreak.shape != counts.shape:
        raise ValueError(f"tiebreak must have one entry per row ({counts.shape[0]}), got shape {tiebreak.shape}")
    return np.lexsort((np.arange(counts.shape[0]), -tiebreak, -counts))


def renumber(src: os.PathLike[str] | str, dst: os.PathLike[str] | str, counts: npt.ArrayLike, *,
             tiebreak: npt.ArrayLike | None = None, overwrite: bool = False, progress: bool = True,
             **disk_options: Any) -> Path:
    """Write ``src`` (a disk store or ``.npy`` file) to ``dst`` with its rows in :func:`hot_order`
    (``counts``, then ``tiebreak``), plus the id map a :class:`~directload.stores.DiskStore` on ``dst``
    applies.  Rows are read through a DiskStore (io_uring), in file order per chunk.  Returns ``dst``.

    ``src`` may itself be renumbered: its rows are read by their ids, so the maps compose.
    """
    with DiskStore(src, **disk_options) as store:
        counts = np.asarray(counts)
        if counts.shape != (store.num_rows,):
            raise ValueError(f"counts must have one entry per row ({store.num_rows}), got shape {counts.shape}")

        def fetch(ids):
            return store.read(torch.from_numpy(ids)).view(torch.uint8).reshape(len(ids), store.row_nbytes).numpy()

        return write_disk_store(src, dst, order=hot_order(counts, tiebreak), fetch=fetch, overwrite=overwrite,
                                progress=progress)
