"""CLOCK: a ring of slots with a reference bit; the hand clears bits until it finds a row without one."""

from __future__ import annotations

import numpy as np

from .base import Policy


class Clock(Policy):
    """CLOCK: a ring of slots with a reference bit, an approximation of LRU.

    Examples
    --------
    >>> policy = Clock(2)
    >>> policy.access([1, 2]).tolist(), policy.access([1, 3]).tolist()  # 1 was referenced: 2 goes
    ([False, False], [True, False])
    >>> sorted(policy.cached()), policy.take_evicted().tolist()
    ([1, 3], [2])
    """

    name = "clock"
    SLOT_BYTES = 240  # bookkeeping bytes per cached row (Policy.bytes_for)

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity)
        self._slot: dict[int, int] = {}  # row -> slot
        self._rows: list[int | None] = [None] * self.capacity
        self._ref = [False] * self.capacity
        self._hand = 0

    def _access(self, ids):
        hit = np.zeros(ids.shape[0], bool)
        for k, r in enumerate(ids.tolist()):
            s = self._slot.get(r)
            if s is not None:
                self._ref[s] = True
                hit[k] = True
            elif self.capacity:
                while self._rows[self._hand] is not None and self._ref[self._hand]:
                    self._ref[self._hand] = False
                    self._hand = (self._hand + 1) % self.capacity
                old = self._rows[self._hand]
                if old is not None:
                    del self._slot[old]
                    self._evicted.append(old)
                self._rows[self._hand], self._ref[self._hand] = r, False
                self._slot[r] = self._hand
                self._hand = (self._hand + 1) % self.capacity
        return hit

    def _members(self):
        return self._slot
