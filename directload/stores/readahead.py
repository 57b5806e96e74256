"""A cache's look-ahead: the batches a loader announced, and the thread that reads their rows ahead.

:class:`Announced` remembers each announced batch's distinct rows in order and, for every row, the last
announced batch that reads it, so a cache knows which staged rows an unread batch still needs (G10: plan
from known future use).  :class:`Worker` is a background loop that takes a task from its owner and runs it,
so reads of other threads go on meanwhile (SSDTrain: overlap I/O with compute); whatever
it raises reaches its owner, never disappears with the thread.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from .held import nbytes_of

__all__ = ["Announced", "Worker", "AHEAD_MAX", "MATCH_SCAN"]

AHEAD_MAX = 256  # announced batches remembered at most (a loader that stops reading cannot grow it)
MATCH_SCAN = 16  # announced batches a read is compared with


class Announced:
    """The batches announced for a table of ``num_rows`` rows and not read yet, oldest first.

    Examples
    --------
    >>> a = Announced(10)
    >>> a.add(np.array([1, 2])), a.add(np.array([2, 5]))
    ((0, []), (1, []))
    >>> a.until[[1, 2, 5, 7]].tolist(), a.next_unread
    ([0, 1, 1, -1], 0)
    >>> entry, skipped = a.match(np.array([2, 5]))   # batch 1 read: batch 0 was skipped
    >>> entry[0], [j for j, _ in skipped], a.next_unread
    (1, [0], 2)
    """

    def __init__(self, num_rows: int, limit: int = AHEAD_MAX) -> None:
        self.until = np.full(int(num_rows), -1, np.int64)  # row -> last announced batch that reads it
        self.limit = limit
        self._ahead: deque[tuple[int, np.ndarray]] = deque()  # (batch number, distinct rows)
        self._count = 0

    def __iter__(self) -> Iterator[tuple[int, np.ndarray]]:
        return iter(self._ahead)

    def __len__(self) -> int:
        return len(self._ahead)

    @property
    def next_unread(self) -> int:
        """The number of the oldest batch announced and not read (the next one's when none is left)."""
        return self._ahead[0][0] if self._ahead else self._count

    def nbytes(self) -> int:
        """Bytes held: the map from row to batch and each announced batch's rows."""
        return nbytes_of(self.until, self._ahead)

    @staticmethod
    def bytes_for(num_rows: int, batches: int, batch_rows: int) -> int:
        """At most :meth:`nbytes` with ``batches`` announced batches of ``batch_rows`` distinct rows unread."""
        return 8 * int(num_rows) + min(batches, AHEAD_MAX) * (8 * int(batch_rows) + 128)

    def add(self, rows: np.ndarray) -> tuple[int, list[tuple[int, np.ndarray]]]:
        """Announce a batch of distinct ``rows``: its number, and the entries dropped to stay within the
        limit (their rows no longer wait for them: :meth:`forget` them)."""
        j = self._count
        self._count += 1
        self._ahead.append((j, rows))
        self.until[rows] = np.maximum(self.until[rows], j)
        dropped = []
        while len(self._ahead) > self.limit:
            dropped.append(self._ahead.popleft())
        return j, dropped

    def match(self, uniq: np.ndarray) -> tuple[tuple[int, np.ndarray] | None, list[tuple[int, np.ndarray]]]:
        """The announced batch a read of the distinct rows ``uniq`` is (most of its rows in common: a cache
        in front reads the rows it lacks, a subset give or take its evictions), taken off the queue with
        the batches skipped before it; ``(None, [])`` for a read no one announced."""
        for k, (_, rows) in enumerate(self._ahead):
            if k == MATCH_SCAN or not uniq.size:
                break
            if 2 * np.isin(uniq, rows, assume_unique=True).sum() > uniq.shape[0]:
                skipped = [self._ahead.popleft() for _ in range(k)]
                return self._ahead.popleft(), skipped
        return None, []

    def forget(self, entry: tuple[int, np.ndarray]) -> np.ndarray:
        """An entry read, skipped or dropped: the rows whose last reader it was (they wait for none now)."""
        j, rows = entry
        mine = rows[self.until[rows] == j]
        self.until[mine] = -1
        return mine

    def still_wanted(self, rows: np.ndarray) -> np.ndarray:
        """Whether an unread announced batch reads each of ``rows``."""
        return self.until[rows] >= self.next_unread

    def clear(self) -> None:
        self._ahead.clear()
        self.until[:] = -1


class Worker:
    """A daemon thread: it asks ``next_task()`` for work (None: nothing now; ``next_task`` waits a little
    itself before it says so), runs ``run(task)``, and goes on until ``stopped()``.  An exception ends it
    and goes to ``on_error(exc)``.

    Examples
    --------
    >>> done = []
    >>> tasks = [1, 2, 3]
    >>> w = Worker("demo", lambda: tasks.pop() if tasks else None, done.append,
    ...            stopped=lambda: not tasks and len(done) == 3, on_error=print)
    >>> w.join(5); sorted(done)
    [1, 2, 3]
    """

    def __init__(self, name: str, next_task: Callable[[], Any], run: Callable[[Any], object], *,
                 stopped: Callable[[], bool], on_error: Callable[[BaseException], object]) -> None:
        self._next_task, self._run = next_task, run
        self._stopped, self._on_error = stopped, on_error
        self.thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self.thread.start()

    def _loop(self):
        try:
            while not self._stopped():
                task = self._next_task()
                if task is not None:
                    self._run(task)
        except BaseException as exc:  # the owner hears of it (its next read raises it)
            self._on_error(exc)

    def alive(self) -> bool:
        return self.thread.is_alive()

    def join(self, timeout: float | None = None) -> None:
        if self.thread is not threading.current_thread():
            self.thread.join(timeout)
