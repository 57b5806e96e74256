"""Look-ahead: Belady over the batches the loader already knows (G10's plan from known future use).

Before each batch the loader shows the policy that batch and the next ones (:meth:`LookAhead.see`).  A miss
is admitted by evicting, among the cached rows the current batch does not read, the one whose next use is
farthest away; rows with no use in the window go first, least recently used first.  When the new row's own
next use is farther than every candidate's, it passes through instead (it would only displace a row needed
sooner).  With the whole epoch as the window this is Belady's optimum (:func:`belady`).
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
        hit = np.zeros(ids.shape[0], bool)
        rows, nxt = self._rows, self._next
        current = set(ids.tolist())
        victims = None
        for k, r in enumerate(ids.tolist()):
            if r in rows:
                rows.move_to_end(r)
                hit[k] = True
                continue
            if not self.capacity:
                continue
            if len(rows) < self.capacity:
                rows[r] = None
                continue
            if victims is None:  # this batch's eviction order: farthest next use first, never-used first of all
                cands = [(nxt.get(v, _NEVER), -i, v) for i, v in enumerate(rows) if v not in current]
                cands.sort(reverse=True)
                victims = [(use, v) for use, _, v in cands]
                pos = 0
            while pos < len(victims) and victims[pos][1] not in rows:
                pos += 1
            if pos == len(victims):
                continue  # every cached row is read by this batch: pass through
            use, v = victims[pos]
            if nxt.get(r, _NEVER) > use:
                continue  # needed later than any candidate: pass through
            pos += 1
            del rows[v]
            rows[r] = None
        return hit

    def cached(self):
        return set(self._rows)


def belady(capacity):
    """Belady's optimum over the whole epoch: :class:`LookAhead` shown every remaining batch
    (``simulate(..., lookahead=None)``).  For evaluation: no real loader sees that far."""
    p = LookAhead(capacity, window=None)
    p.name = "belady"
    return p
