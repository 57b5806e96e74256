"""Remote tiers: a store over rows that live on other machines, the plug-in point for any remote source.

A remote tier answers one question, :meth:`RemoteStore._fetch`: the rows at these ids, fetched from
wherever they live.  Everything else (id checks, ``out``, devices, counters, closing) is the
:class:`~directload.stores.FeatureStore` contract, so a remote tier plugs in as the ``remote`` of a
:class:`~directload.stores.PartitionedStore` (this machine's rows from its own store, the rest fetched),
under a cache, or anywhere a store goes.  DistDGL's two are here and in
:mod:`directload.loaders.dgl.distributed`: :class:`KVStoreRows` (DGL's KVStore, through any ``DistTensor``)
and ``ServedRows`` (directload's own RPC service, reading each owner's disk store).  A row exchange over
``torch.distributed`` is :class:`~directload.stores.RowExchange`.

Examples
--------
A remote tier of rows kept in a dict, standing for another machine:

>>> import torch
>>> class DictRows(RemoteStore):
...     tier = "dict"
...     def __init__(self, rows):
...         super().__init__(len(rows), (2,), torch.float32)
...         self.rows = rows
...     def _fetch(self, ids):
...         return torch.stack([self.rows[int(i)] for i in ids])
>>> remote = DictRows({i: torch.full((2,), float(i)) for i in range(4)})
>>> remote.read([3, 1]).tolist(), remote.stats()["rows"]
([[3.0, 3.0], [1.0, 1.0]], 2)
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from directload.errors import DirectloadError
from directload.kernels.devices import HOST

from .base import FeatureStore
from .counters import Counters
from .futures import ReadFuture

if TYPE_CHECKING:
    from dgl.distributed import DistTensor

__all__ = ["RemoteStore", "KVStoreRows", "RemoteReadError"]


class RemoteReadError(DirectloadError, RuntimeError):
    """A remote machine did not answer a read of its rows (dead, or past the timeout).

    Examples
    --------
    >>> issubclass(RemoteReadError, RuntimeError)
    True
    """


class RemoteStore(FeatureStore):
    """The whole table of ``num_rows`` rows of ``row_shape`` and ``dtype`` as this machine sees it, rows
    fetched by :meth:`_fetch` on the caller's thread at ``wait()`` (an RPC client such as DGL's is not
    thread-safe, and its sampler uses it on the training thread).  Subclasses implement :meth:`_fetch`.

    Counters (:meth:`stats`): ``reads``, ``rows``, ``bytes`` and ``seconds`` spent fetching.

    Examples
    --------
    >>> class Zeros(RemoteStore):
    ...     def _fetch(self, ids):
    ...         return torch.zeros(len(ids), *self.row_shape)
    >>> Zeros(10, (3,), torch.float32).read([4, 2]).shape
    torch.Size([2, 3])
    """

    tier = "remote"
    memory = HOST

    def __init__(self, num_rows: int, row_shape: Sequence[int], dtype: torch.dtype) -> None:
        super().__init__()
        self._num_rows, self._row_shape, self._dtype = int(num_rows), tuple(row_shape), dtype
        self._counts = Counters({"reads": 0, "rows": 0, "bytes": 0, "seconds": 0.0})

    @property
    def num_rows(self) -> int:
        return self._num_rows

    @property
    def row_shape(self) -> tuple[int, ...]:
        return self._row_shape

    @property
    def dtype(self) -> torch.dtype:
        return self._dtype

    def _fetch(self, ids):
        """The rows at ``ids`` (a 1-D int64 CPU tensor, checked, not empty): ``[len(ids), *row_shape]`` of
        the store's dtype, on the CPU.  Raise :class:`RemoteReadError` naming the machine that failed."""
        raise NotImplementedError

    def _read_async(self, index, out, run_device, out_device):
        ids = index.cpu().to(torch.int64)

        def run():
            t0 = time.perf_counter()
            rows = self._fetch(ids) if len(ids) else torch.empty((0, *self._row_shape), dtype=self._dtype)
            self._counts.add(reads=1, rows=len(ids), bytes=len(ids) * self.row_nbytes,
                             seconds=time.perf_counter() - t0)
            if out is not None:
                out.copy_(rows)
                return out
            return rows.to(out_device)

        return ReadFuture(run=run)


class KVStoreRows(RemoteStore):
    """Rows of a ``DistTensor`` (``g.ndata[name]``) through DGL's KVStore: the C++ ``fast_pull``, which asks
    each owning machine's server for its rows.  Anything indexed as a ``DistTensor`` is (``t[ids]``, ``shape``,
    ``dtype``) will do.

    Examples
    --------
    >>> KVStoreRows(torch.arange(6.0).view(3, 2)).read([2, 0]).tolist()
    [[4.0, 5.0], [0.0, 1.0]]
    """

    tier = "kvstore"

    def __init__(self, dist_tensor: DistTensor | torch.Tensor) -> None:
        super().__init__(dist_tensor.shape[0], dist_tensor.shape[1:], dist_tensor.dtype)
        self._tensor = dist_tensor

    def _fetch(self, ids):
        return self._tensor[ids]
