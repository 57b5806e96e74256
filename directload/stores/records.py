"""The records of the tier contract: what :meth:`~directload.stores.FeatureStore.stage` gives a cache, and
what :meth:`~directload.stores.FeatureStore.stats` reports."""

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import torch

from directload.kernels.devices import MAPPED, memory_of

__all__ = ["Staged", "Stats", "CacheStats", "TieredStats"]


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
    def mapped(self):
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

    def __init__(self, tier, counters):
        self._tier = str(tier)
        self._counters = dict(counters)

    @property
    def tier(self):
        """The name of the tier that counted: ``"tensor"``, ``"disk"``, ``"host"``, ``"device"``, ``"tiered"``
        or a store's own."""
        return self._tier

    @property
    def tiers(self):
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
    :class:`~directload.stores.DeviceCache`); :meth:`~directload.stores.Cache.stats` says what each means.

    Examples
    --------
    >>> s = CacheStats("host", {"hit_rows": 3, "miss_rows": 1})
    >>> isinstance(s, Stats), s.tier, s["hit_rows"]
    (True, 'host', 3)
    """


class TieredStats(Stats):
    """A :class:`~directload.stores.TieredStore`'s record: ``{tier name: that tier's record}``, top first.

    Examples
    --------
    >>> s = TieredStats([CacheStats("host", {"hit_rows": 2}), Stats("disk", {"reads": 5})])
    >>> list(s), s["disk"]["reads"], [t.tier for t in s.tiers]
    (['host', 'disk'], 5, ['host', 'disk'])
    """

    def __init__(self, records):
        records = tuple(records)
        super().__init__("tiered", {r.tier: r for r in records})
        self._tiers = tuple(t for r in records for t in r.tiers)

    @property
    def tiers(self):
        return self._tiers
