"""A cache's warming: fill its free room with the hottest rows in rounds, before or while training.

G10's eager prefetch "as soon as space allows", with Sentinel's packing: a packed file's hot rows are
contiguous, so each round is a few hundred merged reads at the disk's bandwidth.  :class:`Warming` runs the
rounds, in the foreground or on a thread of its own, with progress; the cache supplies what a round does
(claim slots for its rows, read them in, settle which the policy still keeps).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import numpy as np
from tqdm.auto import tqdm

__all__ = ["Warming", "WARM_BYTES", "distinct_prefix"]

# A round reads this much: it fits a disk store's one-round staging (64 MiB by default).
WARM_BYTES = 32 << 20


def distinct_prefix(ids: np.ndarray, rows: int, absent: Callable[[np.ndarray], int]) -> np.ndarray:
    """The distinct ids of ``ids`` in their order, as far as needed: a prefix holding at least ``rows`` ids
    that ``absent(head)`` counts as in no slot (``np.unique`` over all of a 100M-id list takes seconds).

    Examples
    --------
    >>> import numpy as np
    >>> distinct_prefix(np.array([5, 5, 2, 9, 2]), 2, lambda head: head.size).tolist()
    [5, 2, 9]
    """
    k = min(ids.shape[0], max(2 * rows, 1024))
    while True:
        _, first = np.unique(ids[:k], return_index=True)
        head = ids[:k][np.sort(first)]
        if k == ids.shape[0] or absent(head) >= rows:
            return head
        k = min(ids.shape[0], 4 * k)


class Warming:
    """Rounds of ``rows`` (numpy ids, most wanted first), ``round_rows`` at a time: for each,
    ``claim(rows)`` gives ``(rows, slots)`` to read now (it waits while reads of other threads wait, and
    gives None once the cache closes), ``fill(rows, slots)`` reads them in, ``settle(rows, slots)`` keeps
    those the policy still holds.  ``seconds`` adds up the time spent.

    Examples
    --------
    >>> import numpy as np
    >>> log = []
    >>> w = Warming(np.arange(5), round_rows=2, claim=lambda r: (r, r), fill=lambda r, s: log.append(r.tolist()),
    ...             settle=lambda r, s: None)
    >>> w.run(); log
    [[0, 1], [2, 3], [4]]
    """

    def __init__(self, rows: np.ndarray, *, round_rows: int,
                 claim: Callable[[np.ndarray], tuple[np.ndarray, np.ndarray] | None],
                 fill: Callable[[np.ndarray, np.ndarray], object], settle: Callable[[np.ndarray, np.ndarray], object],
                 row_nbytes: int = 0, name: str = "cache", on_seconds: Callable[[float], object] | None = None) -> None:
        self.rows = rows
        self.round_rows = max(1, int(round_rows))
        self._claim, self._fill, self._settle = claim, fill, settle
        self._row_nbytes, self._name, self._on_seconds = row_nbytes, name, on_seconds
        self.thread: threading.Thread | None = None
        self._running = False

    def run(self, progress: bool = False) -> None:
        """Every round, on this thread."""
        t0 = time.perf_counter()
        n = self.rows.shape[0]
        self._running = True
        try:
            with tqdm(total=n * self._row_nbytes, unit="B", unit_scale=True, desc=f"warming the {self._name} cache",
                      disable=not progress) as bar:
                for a in range(0, n, self.round_rows):
                    got = self._claim(self.rows[a:a + self.round_rows])
                    if got is None:
                        return
                    rows, slots = got
                    if rows.size:
                        self._fill(rows, slots)
                    self._settle(rows, slots)
                    bar.update(min(self.round_rows, n - a) * self._row_nbytes)
        finally:
            self._running = False
            if self._on_seconds is not None:
                self._on_seconds(time.perf_counter() - t0)

    def start(self, *, after: Warming | None = None, closed: Callable[[], bool],
              on_error: Callable[[BaseException], object], on_end: Callable[[], object]) -> None:
        """Run on a thread of its own, once ``after`` (another :class:`Warming`, e.g. the tier below's, whose
        rows are this one's source) has ended or ``closed()`` says the cache closed.  An exception goes to
        ``on_error(exc)``; ``on_end()`` runs last, whatever happened."""
        def body():
            try:
                while after is not None and after.alive():
                    if closed():
                        return
                    after.join(0.05)
                self.run(False)
            except BaseException as exc:  # the cache's next read raises it
                on_error(exc)
            finally:
                on_end()

        self.thread = threading.Thread(target=body, name=f"directload-{self._name}-warm", daemon=True)
        self.thread.start()

    def alive(self) -> bool:
        """Whether its rounds run now (on its own thread, or on the thread that called :meth:`run`), or its
        thread waits to start them."""
        return self._running or (self.thread is not None and self.thread.is_alive())

    def join(self, timeout: float | None = None) -> None:
        if self.thread is not None and self.thread is not threading.current_thread():
            self.thread.join(timeout)
