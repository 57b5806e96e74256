"""Least recently used: evict the row touched longest ago."""

from collections import OrderedDict

import numpy as np

from .base import Policy


class LRU(Policy):
    name = "lru"

    def __init__(self, capacity):
        super().__init__(capacity)
        self._rows = OrderedDict()

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
