"""``Counters``: a store's named counters, kept under a lock of their own; every store counts through one."""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping

__all__ = ["Counters"]


class Counters:
    """The counters ``names``, each from zero, added to from any thread.

    ``names`` is an iterable of names (each counts from ``0``) or a mapping of name -> its zero (``0.0`` for
    a counter of seconds, so that it reads as a float before anything is added and after a reset).

    Examples
    --------
    >>> c = Counters(("reads", "rows"))
    >>> c.add(reads=1, rows=5); c.add(rows=2); c.snapshot()
    {'reads': 1, 'rows': 7}
    >>> c.reset(); c.snapshot()
    {'reads': 0, 'rows': 0}
    >>> Counters({"reads": 0, "seconds": 0.0}).snapshot()
    {'reads': 0, 'seconds': 0.0}
    """

    def __init__(self, names: Iterable[str] | Mapping[str, float]) -> None:
        self._lock = threading.Lock()
        zeros = dict(names) if isinstance(names, Mapping) else dict.fromkeys(names, 0)
        self._zeros: dict[str, float] = zeros
        self._counts: dict[str, float] = dict(zeros)

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
            self._counts = dict(self._zeros)

    def after_fork(self) -> None:
        """In a forked child: a fresh lock (a parent's thread may have held it at the fork), the counts kept."""
        self._lock = threading.Lock()
