"""A cache's counters: what its reads, read-ahead and warming did, kept under a lock of their own and
reported in a :class:`~directload.stores.records.CacheStats`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from directload.kernels.indexing import LINE

from .counters import Counters

if TYPE_CHECKING:
    from .records import Query

__all__ = ["CacheCounters", "COUNTERS"]

COUNTERS = ("reads", "rows", "hit_rows", "staged_rows", "miss_rows", "passthrough_rows", "prefetched_rows",
            "forwarded_rows", "inflight_waits", "batches_over_capacity", "demand_bytes", "prefetch_bytes", "read_s",
            "wait_s", "fallback_s", "policy_s", "ahead_s", "pcie_lines", "warmed_rows", "warm_s")


class CacheCounters(Counters):
    """The counters of one cache, each from zero.

    Examples
    --------
    >>> c = CacheCounters()
    >>> c.add(hit_rows=3, miss_rows=1)
    >>> s = c.report(capacity_rows=8, staging_rows=0, policy="lru", row_nbytes=16, cached_rows=4, staged_now=0)
    >>> s["hit_rate"], s["fallback_bytes"]
    (0.75, 0)
    """

    def __init__(self) -> None:
        super().__init__(COUNTERS)

    def waited(self) -> None:
        """A read waited for rows in flight once more."""
        self.add(inflight_waits=1)

    def add_read(self, q: Query, rows: int, row_nbytes: int, capacity_rows: int) -> None:
        """A read of ``rows`` ids whose :class:`~directload.stores.slotcache.Query` was ``q``."""
        miss = int(q.miss.sum())
        self.add(reads=1, rows=int(rows), hit_rows=int(q.cached.sum()), staged_rows=int(q.staged.sum()),
                 miss_rows=miss, passthrough_rows=int((q.miss & ~q.keep).sum()), demand_bytes=miss * row_nbytes,
                 batches_over_capacity=int(q.uniq.shape[0] > capacity_rows), forwarded_rows=q.forwarded,
                 wait_s=q.wait_s, policy_s=q.policy_s)

    def report(self, *, capacity_rows: int, staging_rows: int, policy: str, row_nbytes: int, cached_rows: int,
               staged_now: int) -> dict[str, Any]:
        """The counts of a cache of these settings now, with the rates and byte counts that follow from them
        (what :class:`~directload.stores.records.CacheStats` says each means)."""
        s: dict[str, Any] = dict(self.snapshot())
        distinct = s["hit_rows"] + s["staged_rows"] + s["miss_rows"]
        s.update(cached_rows=cached_rows, staged_now=staged_now, capacity_rows=capacity_rows,
                 staging_rows=staging_rows, policy=policy, row_nbytes=row_nbytes,
                 hit_rate=s["hit_rows"] / distinct if distinct else 0.0,
                 slot_rate=(s["hit_rows"] + s["staged_rows"]) / distinct if distinct else 0.0,
                 forwarded_bytes=s["forwarded_rows"] * row_nbytes,
                 fallback_bytes=s["demand_bytes"] + s["prefetch_bytes"],
                 pcie_bytes=s["pcie_lines"] * LINE,
                 passthrough=capacity_rows == 0 or s["batches_over_capacity"] > 0)
        return s
