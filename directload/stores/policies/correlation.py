"""A DeepUM-style baseline: pages, not rows, with correlation prefetch.

DeepUM (ASPLOS'23) prefetches unified-memory pages by correlation: when a page faults, the pages that
followed it last time are fetched with it.  Here the table is cut into pages of ``page_bytes``, with as
many bytes of pages as the row caches hold rows.  A row read hits when the page of its first byte is cached
(LRU over pages); a miss fetches that whole page and prefetches the ``degree`` pages that followed the
page's previous fault.  It counts every byte it fetches (:attr:`fetched_bytes`): whole pages, and
prefetches never used.  DeepUM's own paper finds that correlation fails on data-dependent gathers; this
measures by how much, next to exact row ids.
"""

from __future__ import annotations

from collections import OrderedDict, deque

import numpy as np

from .base import Policy


class Correlation(Policy):
    """Pages with correlation prefetch (DeepUM-style), a baseline that counts the bytes it fetches.

    ``capacity`` rows of ``row_bytes`` become as many bytes of pages of ``page_bytes``.

    Examples
    --------
    >>> policy = Correlation(4, row_bytes=1024, page_bytes=4096)  # room for one page of four rows
    >>> policy.access([0]).tolist()        # a miss fetches row 0's whole page
    [False]
    >>> policy.access([1, 2, 5]).tolist()  # 1 and 2 share that page; 5 fetches the next one
    [True, True, False]
    >>> policy.fetched_bytes, sorted(policy.cached())
    (8192, [4, 5, 6, 7])
    """

    name = "deepum"

    def __init__(self, capacity: int, row_bytes: int, page_bytes: int = 4096, degree: int = 2) -> None:
        super().__init__(capacity)
        if row_bytes <= 0 or page_bytes <= 0 or degree < 0:
            raise ValueError("row_bytes and page_bytes must be positive and degree >= 0")
        self.row_bytes, self.page_bytes, self.degree = int(row_bytes), int(page_bytes), int(degree)
        self.name = f"deepum ({page_bytes // 1024} KiB pages)" if page_bytes >= 1024 else "deepum"
        self._page_capacity = capacity * self.row_bytes // self.page_bytes  # the same bytes as a row cache
        self._pages: OrderedDict[int, None] = OrderedDict()
        self._next: dict[int, deque[int]] = {}  # page -> pages that faulted right after it, most recent last
        self._last_fault: int | None = None
        self.fetched_bytes = 0

    def _page(self, row):
        return row * self.row_bytes // self.page_bytes

    def _fetch(self, page):
        if not self._page_capacity:
            return
        if page in self._pages:
            self._pages.move_to_end(page)
            return
        if len(self._pages) >= self._page_capacity:
            self._pages.popitem(last=False)
        self._pages[page] = None
        self.fetched_bytes += self.page_bytes

    def _access(self, ids):
        hit = np.zeros(ids.shape[0], bool)
        for k, r in enumerate(ids.tolist()):
            page = self._page(r)
            if page in self._pages:
                self._pages.move_to_end(page)
                hit[k] = True
                continue
            if not self._page_capacity:
                self.fetched_bytes += self.row_bytes  # no cache: the row itself is read
                continue
            self._fetch(page)
            if self._last_fault is not None:
                self._next.setdefault(self._last_fault, deque(maxlen=self.degree or 1)).append(page)
            self._last_fault = page
            for p in list(self._next.get(page, ()))[-self.degree:] if self.degree else ():
                self._fetch(p)
        return hit

    def cached(self) -> set[int]:
        """Rows whose first byte lies in a cached page (the page a read of the row faults on)."""
        rb, pb = self.row_bytes, self.page_bytes
        return {r for p in self._pages for r in range(-(-p * pb // rb), ((p + 1) * pb - 1) // rb + 1)}
