"""SIEVE (Zhang et al., NSDI'24): a FIFO queue with a visited bit; the hand moves from the oldest row
towards the newest, clearing bits, and evicts the first unvisited row; hits do not move rows."""

from __future__ import annotations

import numpy as np

from .base import Policy


class Sieve(Policy):
    """SIEVE: a FIFO with a visited bit; the hand clears bits from the oldest row on and evicts the first unvisited.

    Examples
    --------
    >>> policy = Sieve(2)
    >>> policy.access([1, 2]).tolist(), policy.access([1, 3]).tolist()  # 1 was visited: 2 goes
    ([False, False], [True, False])
    >>> sorted(policy.cached())
    [1, 3]
    """

    name = "sieve"
    SLOT_BYTES = 500  # bookkeeping bytes per cached row (Policy.bytes_for)

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity)
        self._visited: dict[int, bool] = {}  # row -> bit
        self._newer: dict[int, int | None] = {}  # row -> the row admitted right after it (towards the head)
        self._older: dict[int, int | None] = {}
        self._head = self._tail = self._hand = None  # head: newest, tail: oldest

    def _evict(self):
        r = self._hand if self._hand is not None else self._tail
        while self._visited[r]:
            self._visited[r] = False
            r = self._newer[r] if self._newer[r] is not None else self._tail
        self._hand = self._newer[r]  # the next candidate, towards the head (None: start at the tail again)
        newer, older = self._newer.pop(r), self._older.pop(r)
        del self._visited[r]
        self._evicted.append(r)
        if older is not None:
            self._newer[older] = newer
        else:
            self._tail = newer
        if newer is not None:
            self._older[newer] = older
        else:
            self._head = older

    def _access(self, ids):
        hit = np.zeros(ids.shape[0], bool)
        for k, r in enumerate(ids.tolist()):
            if r in self._visited:
                self._visited[r] = True
                hit[k] = True
            elif self.capacity:
                if len(self._visited) >= self.capacity:
                    self._evict()
                self._visited[r] = False
                self._older[r], self._newer[r] = self._head, None
                if self._head is not None:
                    self._newer[self._head] = r
                self._head = r
                if self._tail is None:
                    self._tail = r
        return hit

    def _members(self):
        return self._visited
