"""``HotRowsStore``: read-only hot rows held once per node, in front of each process's own store."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt
import torch

from directload.kernels.operands import check_readable, host_of

from .base import FeatureStore
from .counters import Counters
from .futures import ReadFuture
from .held import nbytes_of
from .wrapper import WrapperStore

if TYPE_CHECKING:
    from directload.unified import UnifiedTensor

    from .reads import Ids

__all__ = ["HotRowsStore"]


class HotRowsStore(WrapperStore[FeatureStore]):
    """Reads of the rows in ``hot_ids`` come from ``rows``, every other read from ``fallback``.

    Made for many processes on one node reading one table: the hottest rows (a packed disk store's first
    rows, :meth:`~directload.stores.DiskStore.hot_ids`) go once into shared memory
    (:func:`directload.shared_table`) and every process puts them in front of its own caches, which then
    hold only the rest: the read-only part of the cache lives once per node, only the dynamic part per
    process.  Prefetch hints and warming reach the fallback without the hot rows, so its cache never
    spends room on them.

    Parameters
    ----------
    fallback : FeatureStore
        Every row that is not hot (a :class:`~directload.stores.TieredStore`, a cache, a disk store).
    hot_ids : sequence of int
        The hot rows' ids, distinct, in ``rows``' order.
    rows : torch.Tensor or directload.UnifiedTensor
        ``[len(hot_ids), *row_shape]`` of the fallback's dtype, in host memory.
    own : bool
        Close ``fallback`` with this store.

    Examples
    --------
    >>> from directload.stores import TensorStore
    >>> table = torch.arange(20.0).view(10, 2)
    >>> store = HotRowsStore(TensorStore(table), [7, 2], table[[7, 2]].clone())
    >>> torch.equal(store.read([2, 5, 7]), table[[2, 5, 7]]), store.stats()["hot"]["hit_rows"]
    (True, 2)
    """

    tier = "hot"

    def __init__(self, fallback: FeatureStore, hot_ids: npt.ArrayLike | torch.Tensor,
                 rows: torch.Tensor | UnifiedTensor, *, own: bool = False) -> None:
        super().__init__(fallback, own=own, name="fallback")
        if isinstance(hot_ids, torch.Tensor):
            check_readable(hot_ids, "hot_ids")
        hot = np.asarray(hot_ids.cpu() if isinstance(hot_ids, torch.Tensor) else hot_ids)
        if hot.ndim != 1 or (hot.size and hot.dtype.kind not in "iu"):
            raise TypeError(f"hot_ids must be a 1-D sequence of integer ids, got {hot.dtype} of shape {hot.shape}")
        hot = hot.astype(np.int64, copy=False)
        n = fallback.num_rows
        if hot.size and (hot.min() < 0 or hot.max() >= n):
            raise IndexError(f"hot_ids must be in [0, {n}), got {int(hot.min())}..{int(hot.max())}")
        if np.unique(hot).size != hot.size:
            raise ValueError("hot_ids must be distinct")
        host = host_of(rows)
        if not isinstance(host, torch.Tensor):
            raise TypeError(f"rows must be a tensor or a unified tensor, not {type(rows).__name__}")
        want = (hot.size, *fallback.row_shape)
        if tuple(host.shape) != want or host.dtype != fallback.dtype or host.device.type != "cpu":
            raise ValueError(f"rows must be a host {fallback.dtype} tensor of shape {want}, got {host.dtype} "
                             f"{tuple(host.shape)} on {host.device}")
        self._keep = rows  # the mapping stays alive as long as this store
        self._rows = host
        self._pos = np.full(n, -1, np.int64)
        self._pos[hot] = np.arange(hot.size)
        self._hot = hot
        self._counts = Counters(("rows", "hit_rows", "miss_rows"))

    fallback = property(lambda self: self.inner, doc="The store of every row that is not hot.")

    @property
    def capabilities(self) -> frozenset[str]:
        """``"stage"``, and ``"warm"`` where its fallback declares it (the fallback's caches are warmed)."""
        return super().capabilities | (self.fallback.capabilities & {"warm"})

    @property
    def hot_rows(self) -> int:
        """How many rows are hot."""
        return int(self._hot.size)

    def _own_memory(self):
        return (self._rows, *self.fallback.held_memory())

    def _bookkeeping_bytes(self):
        return nbytes_of(self._pos, self._hot)

    def _read_async(self, index, out, run_device, out_device):
        table = self._rows  # close() lets the shared copy go; a read started before it still has it
        if table is None:
            self.check_open()  # closed since read_async's check (by another thread): ClosedError
        ids = index.cpu().numpy().astype(np.int64, copy=False)
        pos = self._pos[ids]
        hot = pos >= 0
        n_hot = int(hot.sum())
        self._counts.add(rows=ids.size, hit_rows=n_hot, miss_rows=ids.size - n_hot)
        if not n_hot:
            return self.fallback.read_async(index, out=out, device=out_device)
        cold_at = np.flatnonzero(~hot)
        cold = self.fallback.read_async(torch.from_numpy(ids[cold_at]), device=out_device) if cold_at.size else None
        hot_at = np.flatnonzero(hot)
        result = out if out is not None else torch.empty((ids.size, *self.row_shape), dtype=self.dtype,
                                                         device=out_device)

        def finish():
            rows = table.index_select(0, torch.from_numpy(pos[hot_at]))
            result[torch.from_numpy(hot_at).to(out_device)] = rows.to(out_device, non_blocking=False)
            if cold is not None:
                result[torch.from_numpy(cold_at).to(out_device)] = cold.wait()
            return result

        return ReadFuture(run=finish)

    def _stage(self, rows, into, mapped):
        return self._copy_stage(rows, into)  # through this store's reads: the hot rows from the node's copy

    def _cold(self, index):
        ids = index.cpu().numpy().astype(np.int64, copy=False)
        return torch.from_numpy(ids[self._pos[ids] < 0])

    def _prefetch(self, index):
        self.fallback.prefetch(self._cold(index))

    def hot_ids(self) -> torch.Tensor | None:
        """The fallback's hot rows that are not held here (what its caches are worth filling with)."""
        ids = self.fallback.hot_ids()
        if ids is None:
            return None
        return self._cold(torch.as_tensor(ids))

    def warm(self, ids: Ids | None = None, *, background: bool = False, progress: bool = False) -> int | dict[str, int]:
        """Warm the fallback's caches with ``ids`` (default :meth:`hot_ids`), leaving out the hot rows."""
        self.check_open()
        self.fallback.check_capability("warm")
        ids = self._warm_ids(ids)
        return self.fallback.warm(self._cold(torch.as_tensor(ids)), background=background, progress=progress)

    def _counters(self):
        """``"hot"``: rows asked, ``hit_rows`` served here, ``miss_rows`` passed on (the fallback's tiers follow
        in :meth:`stats`)."""
        s = self._counts.snapshot()
        return {**s, "hit_rate": s["hit_rows"] / max(s["rows"], 1), "capacity_rows": self.hot_rows}

    def _close(self):
        self._keep = self._rows = None  # the node's copy is let go of (its last user removes its name)
        super()._close()

    def __repr__(self):
        state = ", closed" if self._closed else ""
        return f"HotRowsStore({self.hot_rows} hot rows -> {self.fallback!r}{state})"
