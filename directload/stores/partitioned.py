"""``PartitionedStore``: a table split across machines (or ranks) by contiguous ranges of row ids.

This process owns one range and reads it from its own store (memory, disk or tiers); every other row comes
from ``remote``, a :class:`FeatureStore` over the whole table that fetches rows from their owners (DGL's
KVStore or RPC in a DistDGL job, an all-to-all over ``torch.distributed`` in a PyG one).  Ranges are what
DGL's partitioner gives (``RangePartitionBook``: ids reshuffled so that each partition's are contiguous)
and what :func:`partition_bounds` makes for PyG.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import torch

from directload.units import check_int

from .base import FeatureStore
from .counters import Counters
from .futures import ReadFuture
from .wrapper import WrapperStore

__all__ = ["PartitionedStore", "partition_bounds", "check_bounds", "owners"]


def partition_bounds(num_rows: int, parts: int) -> np.ndarray:
    """``[0, end_0, ..., num_rows]``: ``num_rows`` ids split into ``parts`` contiguous ranges as evenly as
    possible (the first ``num_rows % parts`` ranges one row longer), an int64 numpy array.

    Parameters
    ----------
    num_rows : int
        Rows of the table, ``>= 0``.
    parts : int
        Partitions (ranks), ``>= 1``.

    Examples
    --------
    >>> partition_bounds(10, 3).tolist()
    [0, 4, 7, 10]
    >>> partition_bounds(10, 0)
    Traceback (most recent call last):
    ...
    ValueError: parts must be a positive integer, got 0
    """
    num_rows = check_int("num_rows", num_rows, low=0)
    parts = check_int("parts", parts)
    sizes = np.full(parts, num_rows // parts, dtype=np.int64)
    sizes[:num_rows % parts] += 1
    return np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)


def check_bounds(bounds: npt.ArrayLike | torch.Tensor, num_rows: int | None = None) -> np.ndarray:
    """``bounds`` (``[0, end_0, end_1, ..., num_rows]``) as an int64 numpy array, or a one-line typed error.

    Examples
    --------
    >>> check_bounds([0, 3, 10]).tolist()
    [0, 3, 10]
    >>> check_bounds([0, 5, 4])
    Traceback (most recent call last):
    ...
    ValueError: partition bounds must start at 0 and never decrease, got [0, 5, 4]
    """
    b = np.asarray(bounds.cpu() if isinstance(bounds, torch.Tensor) else bounds)
    if b.ndim != 1 or b.size < 2 or (b.size and b.dtype.kind not in "iu"):
        raise TypeError(f"partition bounds must be a 1-D sequence of at least 2 integers, got {b.tolist()!r}")
    b = b.astype(np.int64)
    if b[0] != 0 or np.any(np.diff(b) < 0):
        raise ValueError(f"partition bounds must start at 0 and never decrease, got {b.tolist()}")
    if num_rows is not None and b[-1] != num_rows:
        raise ValueError(f"partition bounds end at {int(b[-1])}, but the table has {num_rows} rows")
    return b


def owners(bounds: np.ndarray, ids: npt.ArrayLike) -> np.ndarray:
    """The partition that owns each of ``ids`` (an int64 numpy array), for checked ``bounds``.

    Examples
    --------
    >>> owners(np.array([0, 3, 3, 10]), [0, 2, 3, 9]).tolist()
    [0, 0, 2, 2]
    """
    # (mypy: with numpy's stubs skipped (mypy.ini), the scalar overload of searchsorted matches an array too)
    return np.searchsorted(bounds, np.asarray(ids, dtype=np.int64), side="right") - 1  # type: ignore[return-value]


class PartitionedStore(WrapperStore[FeatureStore]):
    """Rows ``bounds[part]:bounds[part + 1]`` from ``local``, every other row from ``remote``.

    Parameters
    ----------
    local : FeatureStore
        This partition's rows, ``bounds[part + 1] - bounds[part]`` of them, in id order.
    remote : FeatureStore
        The whole table, as seen from here: it is only asked for rows of other partitions.  It is asked on
        every read, with no ids when a batch is all local, because a collective exchange needs every rank
        at every step (over one, the partitioned store is collective too: it declares no ``"stage"``).
    bounds : sequence of int
        ``[0, end_0, ..., num_rows]``: partition ``p`` owns ids ``bounds[p]:bounds[p + 1]``.
    part : int
        This process's partition.
    own : bool
        Close ``local`` and ``remote`` with this store.

    Examples
    --------
    >>> from directload.stores import TensorStore
    >>> table = torch.arange(20.0).view(10, 2)
    >>> store = PartitionedStore(TensorStore(table[4:7].clone()), TensorStore(table), [0, 4, 7, 10], part=1)
    >>> torch.equal(store.read([5, 0, 9, 4]), table[[5, 0, 9, 4]])
    True
    >>> s = store.stats()["partitioned"]; s["local_rows"], s["remote_rows"]
    (2, 2)
    """

    tier = "partitioned"

    def __init__(self, local: FeatureStore, remote: FeatureStore, bounds: npt.ArrayLike | torch.Tensor, *, part: int,
                 own: bool = False) -> None:
        super().__init__(local, own=own, name="local")
        if not isinstance(remote, FeatureStore):
            raise TypeError(f"remote must be a directload FeatureStore, not {type(remote).__name__}")
        remote.check_open()
        bounds = check_bounds(bounds, remote.num_rows)
        if isinstance(part, bool) or not isinstance(part, (int, np.integer)) or not 0 <= part < bounds.size - 1:
            raise ValueError(f"part must be a partition in [0, {bounds.size - 1}), got {part!r}")
        part = int(part)
        start, end = int(bounds[part]), int(bounds[part + 1])
        if local.num_rows != end - start:
            raise ValueError(f"partition {part} owns {end - start} rows ({start}:{end}), but the local store has "
                             f"{local.num_rows}")
        if tuple(local.row_shape) != tuple(remote.row_shape) or local.dtype != remote.dtype:
            raise ValueError(f"the local store's rows ({local.dtype} {tuple(local.row_shape)}) differ from the "
                             f"remote ones ({remote.dtype} {tuple(remote.row_shape)})")
        self.remote = remote
        self.bounds, self.part, self._start, self._end = bounds, part, start, end
        self._counts = Counters(("rows", "local_rows", "remote_rows", "remote_bytes"))

    local = property(lambda self: self.inner, doc="This partition's rows, in id order from ``bounds[part]``.")

    @property
    def num_rows(self) -> int:
        return self.remote.num_rows

    def children(self) -> tuple[FeatureStore, ...]:
        return (self.local, self.remote)

    @property
    def num_parts(self) -> int:
        return int(self.bounds.size - 1)

    def owners(self, ids: npt.ArrayLike | torch.Tensor) -> np.ndarray:
        """The partition that owns each id (an int64 numpy array)."""
        return owners(self.bounds, ids.cpu() if isinstance(ids, torch.Tensor) else ids)

    def _split(self, index):
        ids = index.cpu().numpy().astype(np.int64, copy=False)
        mine = (ids >= self._start) & (ids < self._end)
        return ids, np.flatnonzero(mine), np.flatnonzero(~mine)

    def _read_async(self, index, out, run_device, out_device):
        ids, local_at, remote_at = self._split(index)
        self._counts.add(rows=ids.size, local_rows=local_at.size, remote_rows=remote_at.size,
                         remote_bytes=remote_at.size * self.row_nbytes)
        # the remote read first: a collective exchange starts on its own thread while the local rows are read
        far = self.remote.read_async(torch.from_numpy(ids[remote_at]), device=out_device)
        near = self.local.read_async(torch.from_numpy(ids[local_at] - self._start), device=out_device)
        result = out if out is not None else torch.empty((ids.size, *self.row_shape), dtype=self.dtype,
                                                         device=out_device)

        def finish():
            # wait for both before raising either: a failed local read must not leave the exchange unwaited
            got, error = [], None
            for future in (near, far):
                try:
                    got.append(future.wait())
                except Exception as exc:  # noqa: BLE001 - raised below, the first one
                    error = error or exc
            if error is not None:
                raise error
            result[torch.from_numpy(local_at).to(out_device)] = got[0]
            result[torch.from_numpy(remote_at).to(out_device)] = got[1]
            return result

        return ReadFuture(run=finish)

    def _stage(self, rows, into, mapped):
        return self._copy_stage(rows, into)  # ids are the whole table's, not the local store's

    def hot_ids(self) -> None:
        return None  # the local store's hot ids are in its own numbering

    def _prefetch(self, index):
        ids, local_at, _ = self._split(index)
        if local_at.size:
            self.local.prefetch(torch.from_numpy(ids[local_at] - self._start))

    def _counters(self):
        """``"partitioned"``: rows asked, ``local_rows``, ``remote_rows``, ``remote_bytes`` (the local store's
        tiers follow in :meth:`stats`, then the remote's whose names the local tiers do not use already)."""
        s = self._counts.snapshot()
        return {**s, "part": self.part, "local_rate": s["local_rows"] / max(s["rows"], 1)}

    def __repr__(self):
        state = ", closed" if self._closed else ""
        return (f"PartitionedStore(part {self.part} of {self.num_parts}, rows {self._start}:{self._end} "
                f"-> {self.local!r}, the rest -> {self.remote!r}{state})")
