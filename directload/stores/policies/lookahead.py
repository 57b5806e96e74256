"""Look-ahead: Belady over the batches the loader already knows (G10's plan from known future use).

Before each batch the loader shows the policy that batch and the next ones (:meth:`LookAhead.see`).  A
batch's hits are the rows it reads that were cached; then the cache keeps, out of what it held and what the
batch read, the ``capacity`` rows whose next use is nearest.  Rows with no use in the window come last,
most recently used first among them.  Choosing over the whole batch at once, not miss by miss, is what
makes it exact: a greedy per-miss choice keeps a far row admitted early over a nearer one met later.
With the whole epoch as the window this is Belady's optimum for a cache that fills on demand
(:func:`belady`).
"""

from collections import OrderedDict

import numpy as np

from .base import Policy

_NEVER = float("inf")


class LookAhead(Policy):
    name = "lookahead"

    def __init__(self, capacity, window=None):
        super().__init__(capacity)
        self.window = window  # batches ahead it expects (None: it takes whatever see() shows)
        self._rows = OrderedDict()  # row -> None, least recently used first
        self._next = {}
        self._now = 0

    def see(self, batch_index, window):
        nxt = {}
        for j in range(len(window) - 1, 0, -1):  # the nearest future use wins
            for r in np.asarray(window[j], np.int64).tolist():
                nxt[r] = batch_index + j
        self._next, self._now = nxt, batch_index

    def _access(self, ids):
        rows = self._rows
        hit = np.fromiter((r in rows for r in ids.tolist()), bool, ids.shape[0])
        if not self.capacity:
            return hit
        for r in ids.tolist():  # the batch's rows are now the most recently used
            rows.pop(r, None)
            rows[r] = None
        if len(rows) > self.capacity:
            order = list(rows)  # least recently used first
            nxt = self._next
            keys = np.array([nxt.get(r, _NEVER) for r in order])
            # nearest next use first; among equal uses (never seen in the window), most recent first
            keep = np.lexsort((-np.arange(len(order)), keys))[:self.capacity]
            kept = set(np.asarray(order, dtype=np.int64)[keep].tolist())
            self._rows = OrderedDict((r, None) for r in order if r in kept)
        return hit

    def cached(self):
        return set(self._rows)


def belady(capacity):
    """Belady's optimum over the whole epoch: :class:`LookAhead` shown every remaining batch
    (``simulate(..., lookahead=None)``).  For evaluation: no real loader sees that far."""
    p = LookAhead(capacity, window=None)
    p.name = "belady"
    return p
