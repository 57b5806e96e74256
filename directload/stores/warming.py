"""A cache's warming: fill its free room with the hottest rows in rounds, before or while training.

G10's eager prefetch "as soon as space allows", with Sentinel's packing: a packed file's hot rows are
contiguous, so each round is a few hundred merged reads at the disk's bandwidth.  :class:`Warming` runs the
rounds, in the foreground or on a thread of its own, with progress; the cache supplies what a round does
(claim slots for its rows, read them in, settle which the policy still keeps).
"""

import threading
import time

from tqdm.auto import tqdm

__all__ = ["Warming", "WARM_BYTES"]

# A round reads this much: it fits a disk store's one-round staging (64 MiB by default).
WARM_BYTES = 32 << 20


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

    def __init__(self, rows, *, round_rows, claim, fill, settle, row_nbytes=0, name="cache", on_seconds=None):
        self.rows = rows
        self.round_rows = max(1, int(round_rows))
        self._claim, self._fill, self._settle = claim, fill, settle
        self._row_nbytes, self._name, self._on_seconds = row_nbytes, name, on_seconds
        self.thread = None

    def run(self, progress=False):
        """Every round, on this thread."""
        t0 = time.perf_counter()
        n = self.rows.shape[0]
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
            if self._on_seconds is not None:
                self._on_seconds(time.perf_counter() - t0)

    def start(self, *, after=None, closed, on_error, on_end):
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

    def alive(self):
        return self.thread is not None and self.thread.is_alive()

    def join(self, timeout=None):
        if self.thread is not None and self.thread is not threading.current_thread():
            self.thread.join(timeout)
