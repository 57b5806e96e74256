"""Look-ahead: Belady over the batches the loader already knows (G10's plan from known future use).

Before each batch the loader shows the policy that batch and the next ones (:meth:`LookAhead.see`).  A
batch's hits are the rows it reads that were cached; then the cache keeps, out of what it held and what the
batch read, the ``capacity`` rows whose next use is nearest.  Rows with no use in the window come last,
most recently used first among them (so with no window at all it is LRU at batch granularity).  Choosing
over the whole batch at once, not miss by miss, is what makes it exact: a greedy per-miss choice keeps a
far row admitted early over a nearer one met later.  With the whole epoch as the window this is Belady's
optimum for a cache that fills on demand (:func:`belady`).

The bookkeeping is dense arrays indexed by row id (grown to the largest id seen), so one batch costs a few
vectorised passes over the batch, the window and the cached rows: a cache can run it at every batch.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from .base import Policy

_UNKNOWN = np.int64(1) << 62  # keys of rows with no known next use start here


def _grown(a, n, fill, limit=None):
    """``a`` grown to at least ``n`` entries (twice its length, so a stream of growing ids reallocates a few
    times; never past ``limit``, the table's rows, where known), new entries ``fill``."""
    if a.shape[0] >= n:
        return a
    grow = 2 * a.shape[0] if limit is None else min(2 * a.shape[0], limit)
    b = np.full(max(n, grow), fill, a.dtype)
    b[:a.shape[0]] = a
    return b


class LookAhead(Policy):
    """Belady over the batches the loader already knows: keep the rows whose next use is nearest.

    Parameters
    ----------
    capacity : int
        Rows the cache holds.
    window : int, optional
        Batches ahead it expects (None: whatever :meth:`see` shows).
    fallback : {"recency", "frequency"}
        How rows with no known next use are ordered: most recently used first, or most often read.
    slack : int
        Rows a full cache leaves free at each batch, so the next batches' misses fit without a pass over
        every held row.
    num_rows : int, optional
        The rows of the table (a cache's), where known: the arrays indexed by row id never grow past it
        (unknown, they grow to twice the largest id seen).

    Examples
    --------
    A one-row cache, with the batches ahead in view: it keeps row 1, read again two batches later, where
    LRU keeps row 2.

    >>> from directload.stores.policies import LRU, simulate
    >>> batches = [[1], [2], [1]]
    >>> simulate(LookAhead(1), batches, lookahead=2)["hits"], simulate(LRU(1), batches)["hits"]
    (1, 0)
    """

    name = "lookahead"

    #: Bookkeeping bytes per row of the table (four arrays indexed by row id: 1 + 8 + 8 + 8 bytes) and per cached
    #: row (its id, and the candidates' at a choice).
    ROW_BYTES, SLOT_BYTES = 25, 16

    def __init__(self, capacity: int, window: int | None = None, fallback: str = "recency",
                 slack: int = 0, num_rows: int | None = None) -> None:
        super().__init__(capacity)
        if fallback not in ("recency", "frequency"):
            raise ValueError(f"fallback must be 'recency' or 'frequency', got {fallback!r}")
        if isinstance(slack, bool) or not isinstance(slack, (int, np.integer)) or not 0 <= slack < max(capacity, 1):
            raise ValueError(f"slack must be an integer in [0, capacity), got {slack!r}")
        # When full, a batch's choice keeps ``slack`` rows fewer than it could, so the next batches' misses
        # fit without another pass over every held row (a cache's: measured 8 ms a batch at 250k rows).
        self.slack = int(slack)
        self.window = window  # batches ahead it expects (None: it takes whatever see() shows)
        self.fallback = fallback
        self.num_rows = num_rows
        self._count = np.zeros(0, np.int64)  # row -> batches that read it (the frequency fallback)
        self._held = np.empty(0, np.int64)  # the cached rows
        self._in = np.zeros(0, bool)  # row -> cached
        self._next = np.zeros(0, np.int64)  # row -> index of its next known use (valid when > now)
        self._last = np.zeros(0, np.int64)  # row -> when it was last used (batch tick << 32 | position)
        self._now = -1
        self._tick = 0

    def _grow(self, n):
        self._in = _grown(self._in, n, False, self.num_rows)
        self._next = _grown(self._next, n, -1, self.num_rows)
        self._last = _grown(self._last, n, 0, self.num_rows)
        self._count = _grown(self._count, n, 0, self.num_rows)

    def see(self, batch_index: int, window: Sequence[npt.ArrayLike]) -> None:
        if batch_index < self._now:  # a new sequence of batches (indices start again): forget old plans
            self._next[:] = -1
        self._now = batch_index
        later = [np.asarray(w, np.int64) for w in window[1:]]
        top = max((int(w.max()) for w in later if w.size), default=-1)
        self._grow(top + 1)
        for j in range(len(later), 0, -1):  # nearest use written last, so it wins
            self._next[later[j - 1]] = batch_index + j

    def _access(self, ids):
        if ids.size:
            self._grow(int(ids.max()) + 1)
        hit = self._in[ids]
        if not self.capacity:
            return hit
        self._last[ids] = (np.int64(self._tick) << 32) + np.arange(ids.shape[0], dtype=np.int64)
        self._tick += 1
        self._count[ids] += 1
        miss = ids[~hit]
        cand = np.concatenate([self._held, miss])
        if cand.shape[0] > self.capacity:
            nxt = self._next[cand]
            # nearest next use first; rows with none after it, most recently used first
            if self.fallback == "recency":
                unknown = self._last[cand] >> 1
            else:  # read most often first, then most recently (by batch)
                unknown = (self._count[cand] << 31) + (self._last[cand] >> 32)
            key = np.where(nxt > self._now, nxt, _UNKNOWN - unknown)
            n = self.capacity - self.slack
            keep = np.zeros(cand.shape[0], bool)
            keep[np.argpartition(key, n - 1)[:n]] = True
            held = self._held.shape[0]
            gone = self._held[~keep[:held]]
            self._in[gone] = False
            self._evicted.append(gone)
            miss = miss[keep[held:]]
            cand = cand[keep]
        self._in[miss] = True
        self._held = cand
        return hit

    def warm(self, ids: npt.ArrayLike) -> np.ndarray:
        # no access counted (the frequency fallback sees none); the most wanted last used, so kept longest
        ids = np.asarray(ids, np.int64)
        if ids.size:
            self._grow(int(ids.max()) + 1)
        new = ids[~self._in[ids]][:max(self.capacity - self._held.shape[0], 0)]
        if new.size:
            # even positions: the recency key halves them, and warm rows must not tie
            self._last[new] = (np.int64(self._tick) << 32) + np.arange(2 * new.shape[0], 0, -2, dtype=np.int64)
            self._tick += 1
            self._in[new] = True
            self._held = np.concatenate([self._held, new])
        return self._in[ids]

    def contains(self, ids: np.ndarray) -> np.ndarray:
        ids = np.asarray(ids, np.int64)
        ok = ids < self._in.shape[0]
        out = np.zeros(ids.shape[0], bool)
        out[ok] = self._in[ids[ok]]
        return out

    def cached(self) -> set[int]:
        return set(self._held.tolist())

    def _size(self):
        return self._held.shape[0]


def belady(capacity: int) -> LookAhead:
    """Belady's optimum over the whole epoch: :class:`LookAhead` shown every remaining batch
    (``simulate(..., lookahead=None)``).  For evaluation: no real loader sees that far.

    Examples
    --------
    >>> from directload.stores.policies import simulate
    >>> simulate(belady(1), [[1], [2], [1]], lookahead=None)["hits"]
    1
    """
    p = LookAhead(capacity, window=None)
    p.name = "belady"
    return p
