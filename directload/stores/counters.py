"""``Counters``: a store's named counters, kept under a lock of their own (a cache's and a disk store's)."""

from __future__ import annotations

import threading
from collections.abc import Iterable

__all__ = ["Counters"]


class Counters:
    """The counters ``names``, each from zero, added to from any thread.

    Examples
    --------
    >>> c = Counters(("reads", "rows"))
    >>> c.add(reads=1, rows=5); c.add(rows=2); c.snapshot()
    {'reads': 1, 'rows': 7}
    >>> c.reset(); c.snapshot()
    {'reads': 0, 'rows': 0}
    """

    def __init__(self, names: Iterable[str]) -> None:
        self._lock = threading.Lock()
        self._counts: dict[str, float] = dict.fromkeys(names, 0)

    def add(self, **counts: float) -> None:
        """Add to the named counters."""
        with self._lock:
            for key, value in counts.items():
                self._counts[key] += value

    def snapshot(self) -> dict[str, float]:
        """The counts now, a copy."""
        with self._lock:
            return dict(self._counts)

    def reset(self) -> None:
        """Every counter back to zero."""
        with self._lock:
            for key in self._counts:
                self._counts[key] = 0

    def after_fork(self) -> None:
        """In a forked child: a fresh lock (a parent's thread may have held it at the fork), the counts kept."""
        self._lock = threading.Lock()
