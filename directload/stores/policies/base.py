"""The policy interface and the offline trace simulator."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from ..held import nbytes_of

__all__ = ["Policy", "simulate"]


class Policy:
    """Which rows a cache of ``capacity`` rows keeps.

    Subclasses implement :meth:`_access`; the public methods check input.

    Examples
    --------
    >>> from directload.stores.policies import LRU
    >>> policy = LRU(2)                   # a cache of two rows
    >>> policy.access([1, 2]).tolist()    # cold: both miss, and are admitted
    [False, False]
    >>> policy.access([2, 3]).tolist()    # 2 hits; 3 evicts 1, the least recently used
    [True, False]
    >>> policy.take_evicted().tolist(), sorted(policy.cached())
    ([1], [2, 3])
    >>> policy.access([4, 4])
    Traceback (most recent call last):
    ...
    ValueError: ids of one batch must be distinct (a batch reads each row once)
    """

    name = "policy"
    #: Bookkeeping bytes per cached row and per row of the table at most (:meth:`bytes_for`): the most
    #: :meth:`nbytes` gave over caches of a thousand to 700,000 rows (a dict's bytes per entry vary with
    #: its fill); the default, for a policy whose is not known, is the largest of the named policies'.
    SLOT_BYTES, ROW_BYTES = 500, 0

    def __init__(self, capacity: int) -> None:
        if isinstance(capacity, bool) or not isinstance(capacity, (int, np.integer)) or capacity < 0:
            raise ValueError(f"capacity must be an integer >= 0 (rows), got {capacity!r}")
        self.capacity = int(capacity)
        self._evicted: list[int | np.ndarray] = []  # rows evicted since take_evicted(): ints, or arrays of them

    def access(self, ids: npt.ArrayLike) -> np.ndarray:
        """One batch's distinct row ids: returns a bool array, True where the row was cached (a hit).

        Misses are admitted (or passed through, as the policy decides); evictions happen here.
        """
        ids = np.asarray(ids)
        if ids.ndim != 1 or ids.dtype.kind not in "iu":
            raise TypeError(f"ids must be a 1-D integer array, got {ids.dtype} with shape {ids.shape}")
        if np.unique(ids).shape[0] != ids.shape[0]:
            raise ValueError("ids of one batch must be distinct (a batch reads each row once)")
        return self._access(ids.astype(np.int64, copy=False))

    def access_distinct(self, ids: np.ndarray) -> np.ndarray:
        """:meth:`access` for ids known to be distinct int64 (a cache's ``np.unique`` made them so):
        the same answer, without checking them again."""
        return self._access(ids)

    def warm(self, ids: npt.ArrayLike) -> np.ndarray:
        """Admit rows ``ids`` (distinct int64, most wanted first) before any batch, while the policy has
        room: nothing is evicted and no access is counted against them (a cache filled ahead of training,
        :meth:`~directload.stores.Cache.warm`).  Returns a bool array: True where the row is cached now.

        The default admits the rows that fit through :meth:`_access`, least wanted first, so a recency
        order drops the most wanted last."""
        ids = np.asarray(ids, np.int64)
        new = np.flatnonzero(~self.contains(ids))[:max(self.capacity - self._size(), 0)]
        if new.size:
            self._access(ids[new][::-1])
        return self.contains(ids)

    def _size(self):
        """How many rows are cached now."""
        return len(self._members())

    def take_evicted(self) -> np.ndarray:
        """The rows evicted since the last call (int64 array): a cache frees their slots.  A row admitted
        and evicted within one batch may be listed; it never held a slot."""
        gone = self._evicted
        self._evicted = []
        if not gone:
            return np.empty(0, np.int64)
        return np.concatenate([np.atleast_1d(np.asarray(g, np.int64)) for g in gone])

    def contains(self, ids: np.ndarray) -> np.ndarray:
        """Whether each row of ``ids`` (int64 array) is cached now."""
        rows = self._members()
        return np.fromiter((r in rows for r in ids.tolist()), bool, len(ids))

    def _members(self):
        """The cached rows as a container that answers ``in`` (the policy's own dict or set).  A policy
        overrides this or :meth:`cached`, which default to each other."""
        return self.cached()

    def see(self, batch_index: int, window: Sequence[npt.ArrayLike]) -> None:
        """A hint: batch ``batch_index`` comes next, then the batches in ``window`` (a list of id arrays,
        starting with that batch).  Only look-ahead policies use it."""

    def nbytes(self) -> int:
        """Bytes of the policy's state: its arrays, and its dicts, lists and sets of row ids (an estimate
        within a few percent, :func:`~directload.stores.held.nbytes_of`).

        Examples
        --------
        >>> from directload.stores.policies import LRU
        >>> policy = LRU(1000)
        >>> _ = policy.access(np.arange(1000, 2000))
        >>> policy.nbytes() > 1000 * 32
        True
        """
        return nbytes_of(*vars(self).values())

    @classmethod
    def bytes_for(cls, capacity: int, num_rows: int) -> int:
        """At most how many bytes :meth:`nbytes` gives for a policy of ``capacity`` rows over a table of
        ``num_rows`` (before any is made: a memory budget's estimate).

        Examples
        --------
        >>> from directload.stores.policies import LookAhead
        >>> LookAhead.bytes_for(1000, 10_000) >= LookAhead(1000, num_rows=10_000).nbytes()
        True
        """
        return cls.SLOT_BYTES * int(capacity) + cls.ROW_BYTES * int(num_rows)

    def cached(self) -> set[int]:
        """The cached row ids, as a set (for tests and the simulator)."""
        return set(self._members())

    def _access(self, ids):
        raise NotImplementedError


def simulate(policy: Policy, batches: Iterable[npt.ArrayLike], *, lookahead: int | None = 0,
             measure_from: int = 0) -> dict[str, Any]:
    """Run ``policy`` over ``batches`` (id arrays; each made distinct), as a loader with ``lookahead``
    batches of look-ahead would feed it (``None``: every remaining batch).  Batches before
    ``measure_from`` warm the cache and are not counted (e.g. a first epoch, for steady-state figures).

    Returns
    -------
    dict
        ``accesses``, ``hits``, ``misses`` (rows read from the slower tier) and ``hit_rate``; a policy that
        fetches more than the rows it misses (:class:`~directload.stores.policies.Correlation`) adds
        ``fetched_bytes``.

    Examples
    --------
    >>> from directload.stores.policies import LRU
    >>> result = simulate(LRU(2), [[1, 2], [2, 3], [1, 2]])
    >>> result["hits"], result["misses"]
    (1, 5)
    """
    distinct = [np.unique(np.asarray(b, np.int64)) for b in batches]
    hits = accesses = 0
    fetched_before = None
    for i, batch in enumerate(distinct):
        if i == measure_from:
            fetched_before = getattr(policy, "fetched_bytes", None)
        policy.see(i, distinct[i:] if lookahead is None else distinct[i:i + 1 + lookahead])
        got = policy.access(batch)
        policy.take_evicted()  # a cache frees slots with them; the simulator has none
        if i >= measure_from:
            hits += int(got.sum())
            accesses += batch.shape[0]
    out = {"policy": policy.name, "accesses": accesses, "hits": hits, "misses": accesses - hits,
           "hit_rate": hits / accesses if accesses else 0.0}
    if fetched_before is not None:  # a page policy counts its own bytes (whole pages, prefetches)
        # (only a page policy has fetched_bytes: getattr above)
        out["fetched_bytes"] = policy.fetched_bytes - fetched_before  # type: ignore[attr-defined]
    return out
