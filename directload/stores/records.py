"""The records of the tier contract: what :meth:`~directload.stores.FeatureStore.stage` gives a cache, and
what :meth:`~directload.stores.FeatureStore.stats` reports."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np
import torch

from directload.kernels.devices import MAPPED, memory_of

__all__ = ["Staged", "Stats", "CacheStats", "TieredStats", "Query", "Admitted"]


@dataclass(frozen=True)
class Staged:
    """Rows a store staged for the fused gather of a cache in front of it.

    ``flat`` is a 1-D tensor of the store's dtype in host memory, and ``offsets[i]`` the element offset
    in it of the ``i``-th id asked for (an int64 numpy array, in the order asked).  The memory under
    ``flat`` is the caller's buffer (``into``) or the store's own rows (a table already in host memory):
    either way it stays as it is until the caller's gather is done.

    Examples
    --------
    >>> from directload.stores import TensorStore
    >>> from directload.buffers import StagingBuffer
    >>> got = TensorStore(torch.arange(12.0).view(6, 2)).stage([4, 1], StagingBuffer(pin="never"))
    >>> got.offsets.tolist(), got.flat[got.offsets[0]].item(), got.mapped
    ([8, 2], 8.0, False)
    """

    flat: torch.Tensor
    offsets: np.ndarray

    @property
    def mapped(self) -> bool:
        """Whether a GPU reads ``flat`` zero-copy (pinned, GPU-mapped host memory)."""
        return memory_of(self.flat) == MAPPED


class Stats(Mapping):
    """A store's counters since it opened (or since :meth:`~directload.stores.FeatureStore.reset_stats`): a
    read-only mapping of name -> number, with the ``tier`` that counted them.

    ``tiers`` lists the records of every tier behind it, top first (``(self,)`` for one store), so code
    that sums over the caches of any store reads ``[t for t in stats.tiers if isinstance(t, CacheStats)]``
    and never sniffs keys.

    Examples
    --------
    >>> s = Stats("disk", {"reads": 3, "bytes_read": 12288})
    >>> s["reads"], s.tier, [t.tier for t in s.tiers], dict(s)
    (3, 'disk', ['disk'], {'reads': 3, 'bytes_read': 12288})
    """

    def __init__(self, tier: str, counters: Mapping[str, object]) -> None:
        self._tier = str(tier)
        self._counters = dict(counters)

    @property
    def tier(self) -> str:
        """The name of the tier that counted: ``"tensor"``, ``"disk"``, ``"host"``, ``"device"``, ``"tiered"``
        or a store's own."""
        return self._tier

    @property
    def tiers(self) -> tuple[Stats, ...]:
        """This record's tiers, top first."""
        return (self,)

    def __getitem__(self, key):
        return self._counters[key]

    def __iter__(self):
        return iter(self._counters)

    def __len__(self):
        return len(self._counters)

    def __repr__(self):
        return f"{type(self).__name__}({self._tier!r}, {self._counters!r})"


class CacheStats(Stats):
    """The counters of a cache tier (:class:`~directload.stores.HostCache`,
    :class:`~directload.stores.DeviceCache`).

    ``hit_rows`` were served from cached slots, ``staged_rows`` from rows read ahead, ``miss_rows`` from
    the fallback on demand (``passthrough_rows`` of them not kept, as a cache smaller than a batch must);
    ``hit_rate`` is hits over distinct rows read and ``slot_rate`` counts staged rows too.
    ``prefetched_rows`` were read ahead, and ``ahead_s`` the read-ahead thread's seconds reading them, and
    ``forwarded_rows`` served from a slot that an earlier batch staged or a cached row kept for an
    announced batch, never read twice (``forwarded_bytes``).  ``batches_over_capacity`` counts reads of
    more distinct rows than the cache holds: those pass through in part.  ``pcie_lines`` (a device cache)
    are the 128-byte lines its fused gather reads zero-copy from host memory, as the transaction model
    counts them (``pcie_bytes`` = lines x 128): on a CPU machine, what a GPU would move.

    Examples
    --------
    >>> s = CacheStats("host", {"hit_rows": 3, "miss_rows": 1})
    >>> isinstance(s, Stats), s.tier, s["hit_rows"]
    (True, 'host', 3)
    """


class TieredStats(Stats):
    """The record of a store in front of others (:meth:`~directload.stores.FeatureStore.stats`):
    ``{tier name: that tier's record}``, top first, each tier name once (the first, nearest the top: a
    store reached twice, such as a partition's local store under both a partitioned store and its row
    exchange, counts once).

    Examples
    --------
    >>> s = TieredStats([CacheStats("host", {"hit_rows": 2}), Stats("disk", {"reads": 5}), Stats("disk", {})])
    >>> list(s), s["disk"]["reads"], [t.tier for t in s.tiers]
    (['host', 'disk'], 5, ['host', 'disk'])
    """

    def __init__(self, records: Iterable[Stats]) -> None:
        first: dict[str, Stats] = {}
        for record in records:
            for t in record.tiers:
                first.setdefault(t.tier, t)
        super().__init__("tiered", first)
        self._tiers = tuple(first.values())

    @property
    def tiers(self) -> tuple[Stats, ...]:
        return self._tiers


@dataclass(frozen=True)
class Query:
    """What a read of a cache found, as :meth:`~directload.stores.slotcache.SlotCache.query` left it (under
    its lock, at one instant).

    ``uniq`` are the distinct rows read and ``slots`` each one's slot then (negative: none);
    ``cached``, ``staged`` and ``miss`` classify them; ``keep`` says which the policy holds after this
    access and ``evicted`` which rows it let go.  ``batch`` is the announced batch the read was matched
    to (None: not announced) and ``generation`` the cache's resizes by then.  ``forwarded`` rows came
    from a slot staged for an earlier batch; ``wait_s`` and ``policy_s`` are the seconds the read waited for
    rows in flight and the policy took.

    Examples
    --------
    >>> from directload.stores.slotcache import SlotCache
    >>> q = SlotCache(10, capacity=4, policy="lru").query(np.array([2, 7]))
    >>> q.miss_rows.tolist(), q.held.tolist(), q.batch is None
    ([2, 7], [], True)
    """

    uniq: np.ndarray
    slots: np.ndarray
    cached: np.ndarray
    staged: np.ndarray
    miss: np.ndarray
    keep: np.ndarray
    evicted: np.ndarray
    batch: tuple | None
    generation: int
    forwarded: int = 0
    wait_s: float = 0.0
    policy_s: float = 0.0

    @property
    def miss_rows(self) -> np.ndarray:
        """The rows no slot held: the store stages them from its fallback."""
        return self.uniq[self.miss]

    @property
    def held(self) -> np.ndarray:
        """The slots the read copies out of, pinned until the cache finishes or abandons the read."""
        return self.slots[self.slots >= 0]


@dataclass(frozen=True)
class Admitted:
    """The misses of a read that :meth:`~directload.stores.slotcache.SlotCache.admit` placed in free slots, in
    flight until the store fills them (outside the cache's lock) and settles them.

    ``rows`` are the rows and ``slots`` their slots (int64 numpy arrays); ``at`` is each one's position
    among the read's misses (:attr:`Query.miss_rows`), so its offset in the read's staged misses, and
    ``generation`` the cache's resizes by then.

    Examples
    --------
    >>> from directload.stores.slotcache import SlotCache
    >>> c = SlotCache(10, capacity=4, policy="lru")
    >>> placed = c.admit(c.query(np.array([2, 7])))
    >>> placed.rows.tolist(), placed.at.tolist(), len(placed)
    ([2, 7], [0, 1], 2)
    """

    rows: np.ndarray
    slots: np.ndarray
    at: np.ndarray
    generation: int = 0

    def __len__(self) -> int:
        return int(self.slots.shape[0])
