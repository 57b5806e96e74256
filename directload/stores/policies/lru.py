"""Least recently used: evict the row touched longest ago."""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

from .base import Policy


class LRU(Policy):
    """Least recently used, row by row.

    Examples
    --------
    >>> policy = LRU(2)
    >>> policy.access([1, 2]).tolist(), policy.access([1, 3]).tolist()  # 3 evicts 2, used longest ago
    ([False, False], [True, False])
    >>> sorted(policy.cached())
    [1, 3]
    """

    name = "lru"
    SLOT_BYTES = 240  # bookkeeping bytes per cached row (Policy.bytes_for)

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity)
        self._rows: OrderedDict[int, None] = OrderedDict()

    def _access(self, ids):
        hit = np.zeros(ids.shape[0], bool)
        rows = self._rows
        for k, r in enumerate(ids.tolist()):
            if r in rows:
                rows.move_to_end(r)
                hit[k] = True
            elif self.capacity:
                if len(rows) >= self.capacity:
                    self._evicted.append(rows.popitem(last=False)[0])
                rows[r] = None
        return hit

    def _members(self):
        return self._rows
