"""S3-FIFO (Yang et al., SOSP'23): a small FIFO (10%) that filters one-hit rows, a main FIFO (90%) with
lazy promotion, and a ghost FIFO of ids recently dropped from the small one."""

from __future__ import annotations

from collections import OrderedDict, deque

import numpy as np

from .base import Policy


class S3FIFO(Policy):
    """S3-FIFO: a small FIFO (``small`` of the capacity) that filters rows read once, a main FIFO with
    lazy promotion, and a ghost FIFO of ids recently dropped from the small one.

    Examples
    --------
    >>> policy = S3FIFO(10)
    >>> policy.access([1, 2, 3]).tolist(), policy.access([1]).tolist()
    ([False, False, False], [True])
    >>> sorted(policy.cached())
    [1, 2, 3]
    """

    name = "s3fifo"
    SLOT_BYTES = 360  # bookkeeping bytes per cached row (Policy.bytes_for)
    _small: deque[int]
    _main: deque[int]

    def __init__(self, capacity: int, small: float = 0.1) -> None:
        super().__init__(capacity)
        self._small_cap = max(1, int(round(self.capacity * small))) if self.capacity > 1 else 0
        self._main_cap = self.capacity - self._small_cap
        self._small, self._main = deque(), deque()
        self._freq: dict[int, int] = {}  # cached row -> 0..3
        self._ghost: OrderedDict[int, None] = OrderedDict()

    def _insert(self, r):
        while len(self._freq) >= self.capacity:
            self._evict()
        if r in self._ghost or not self._small_cap:
            self._ghost.pop(r, None)
            self._main.append(r)
        else:
            self._small.append(r)
        self._freq[r] = 0

    def _evict(self):
        if self._small and (len(self._small) >= self._small_cap or not self._main):
            r = self._small.popleft()
            if self._freq[r] > 0:  # touched again while small: promote
                self._freq[r] = 0
                self._main.append(r)
                while len(self._main) > self._main_cap:
                    self._evict_main()
                return
            del self._freq[r]
            self._evicted.append(r)
            self._ghost[r] = None
            while len(self._ghost) > max(self._main_cap, 1):
                self._ghost.popitem(last=False)
            return
        self._evict_main()

    def _evict_main(self):
        while True:
            r = self._main.popleft()
            if self._freq[r] > 0:
                self._freq[r] -= 1
                self._main.append(r)
            else:
                del self._freq[r]
                self._evicted.append(r)
                return

    def _access(self, ids):
        hit = np.zeros(ids.shape[0], bool)
        for k, r in enumerate(ids.tolist()):
            f = self._freq.get(r)
            if f is not None:
                self._freq[r] = min(f + 1, 3)
                hit[k] = True
            elif self.capacity:
                self._insert(r)
        return hit

    def _members(self):
        return self._freq
