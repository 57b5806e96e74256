"""A cache's slot table: which row lives in which slot, what each slot holds, and which slots are free.

Pure bookkeeping over numpy arrays, no I/O and no lock: the cache that owns it holds its lock around every
call.  A slot is

* ``FREE``: on the free list (or deferred until no reader copies out of it);
* ``CACHED``: a row the policy keeps;
* ``STAGED``: a row read ahead for an announced batch (``staged_for`` says which; ``KEPT``: a cached row the
  policy let go that an announced batch still reads);
* ``INFLIGHT``: being filled (readers wait for it): read ahead for a batch (``staged_for`` says which), or
  filled for the policy (``KEPT``: a read's kept miss, a warm's row; ``LET_GO`` once the policy let it go
  meanwhile, so its filler frees it rather than caching it).

``slot[row]`` is the row's slot, ``NONE`` for no slot, or ``READING`` while a demand read reads it (so no one
reads it twice).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from .held import INT_BYTES, nbytes_of

__all__ = ["SlotTable", "SLOT_BYTES", "ROW_BYTES", "FREE", "CACHED", "STAGED", "INFLIGHT", "NONE", "READING", "KEPT",
           "LET_GO"]

#: Bookkeeping bytes per slot (its kind, batch and readers, 1 + 8 + 4, and its free-list entry, 8 and an int)
#: and per row of the table (its slot, an int32).
SLOT_BYTES, ROW_BYTES = 1 + 8 + 4 + 8 + INT_BYTES, 4

FREE, CACHED, STAGED, INFLIGHT = 0, 1, 2, 3
NONE, READING = -1, -2
KEPT = -2  # staged_for of a cached row kept for an announced batch, or of a row filled for the policy
LET_GO = -3  # staged_for of a row filled for the policy that the policy let go while it was in flight


class SlotTable:
    """Slots for ``slots`` rows of a table of ``num_rows``.

    Examples
    --------
    >>> t = SlotTable(num_rows=10, slots=4)
    >>> s = t.claim(2); t.place(np.array([7, 3]), s, CACHED)
    >>> t.slot[[7, 3, 5]].tolist(), t.count(CACHED), t.free_count
    ([0, 1, -1], 2, 2)
    >>> t.pin(s[:1]); t.free_slots(np.array([7]), s[:1])   # a reader copies out of it: deferred
    >>> t.free_count, int(t.slot[7])
    (2, -1)
    >>> t.unpin(s[:1]); t.free_count
    3
    """

    def __init__(self, num_rows: int, slots: int) -> None:
        self.size = int(slots)
        # row -> slot
        self.slot: npt.NDArray[np.signedinteger[Any]] = np.full(int(num_rows), NONE,
                                                                np.int32 if slots < 2 ** 31 else np.int64)
        self.kind = np.zeros(self.size, np.int8)
        self.staged_for = np.full(self.size, -1, np.int64)  # slot -> batch it was read ahead for
        self.pinned = np.zeros(self.size, np.int32)  # readers copying out of each slot
        self._deferred: list[int] = []  # slots freed while pinned
        self._free = list(range(self.size - 1, -1, -1))
        self.limit = self.size  # slots at or past it are parked when free: a resized cache does not use them
        self._parked: list[int] = []
        self._newly_parked: list[int] = []  # parked since take_newly_parked(): their memory may be given back

    # ------------------------------------------------------------- queries
    @property
    def free_count(self) -> int:
        return len(self._free)

    def count(self, kind: int) -> int:
        """Slots of ``kind`` now (``STAGED`` counts staged and in-flight slots: both hold read-ahead room)."""
        return int(np.count_nonzero(self.kind >= STAGED if kind == STAGED else self.kind == kind))

    def kind_of(self, s: np.ndarray) -> np.ndarray:
        """The kind of each slot in ``s`` (a negative entry, no slot, reads as ``FREE``)."""
        out = np.zeros(s.shape[0], np.int8)
        has = s >= 0
        out[has] = self.kind[s[has]]
        return out

    def slotted(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The rows of ``rows`` that hold a slot, and their slots."""
        s = self.slot[rows]
        ok = s >= 0
        return rows[ok], s[ok]

    def nbytes(self) -> int:
        """Bytes of the table: its arrays and its lists of slots."""
        return nbytes_of(self.slot, self.kind, self.staged_for, self.pinned, self._free, self._deferred,
                         self._parked, self._newly_parked)

    # ------------------------------------------------------------- changes
    def claim(self, n: int) -> np.ndarray:
        """Up to ``n`` free slots (int64), taken off the free list."""
        n = min(int(n), len(self._free))
        got = self._free[len(self._free) - n:] if n else []
        del self._free[len(self._free) - n:]
        return np.asarray(got[::-1], np.int64)

    def place(self, rows: np.ndarray, slots: np.ndarray, kind: int, batch: int = -1) -> None:
        """Map ``rows`` to their claimed ``slots``, of ``kind``."""
        self.slot[rows] = slots
        self.kind[slots] = kind
        self.staged_for[slots] = batch

    def free_slots(self, rows: np.ndarray, slots: np.ndarray) -> None:
        """Unmap ``rows`` and free their ``slots`` (those a reader copies out of once it is done)."""
        if not rows.size:
            return
        self.slot[rows] = NONE
        self.kind[slots] = FREE
        busy = self.pinned[slots] > 0
        self._deferred.extend(slots[busy].tolist())
        self._give(slots[~busy].tolist())

    def _give(self, slots):
        """Free ``slots`` (a list): onto the free list, or parked where they are past the limit."""
        if self.limit >= self.size:
            self._free.extend(slots)
            return
        for s in slots:
            if s < self.limit:
                self._free.append(s)
            else:
                self._parked.append(s)
                self._newly_parked.append(s)

    def set_limit(self, limit: int) -> np.ndarray:
        """Use slots ``[0, limit)`` only from now on: free slots past it are parked (slots past it in use
        are parked when freed), parked slots before it go back on the free list.  Returns the slots
        unparked (free, their memory to be touched again)."""
        self.limit = limit = int(limit)
        free = np.asarray(self._free, np.int64)
        parked = np.asarray(self._parked, np.int64)
        back = parked[parked < limit]
        self._parked = parked[parked >= limit].tolist()
        park = free[free >= limit].tolist()
        self._parked.extend(park)
        self._newly_parked.extend(park)
        self._free = free[free < limit].tolist() + back[::-1].tolist()
        self._newly_parked = [s for s in self._newly_parked if s >= limit]
        return back

    def take_newly_parked(self) -> np.ndarray:
        """The slots parked since the last call (int64, sorted): free and past the limit, so their memory can
        be given back to the system."""
        got, self._newly_parked = np.unique(np.asarray(self._newly_parked, np.int64)), []
        return got

    def pin(self, slots: np.ndarray) -> None:
        """A reader copies out of ``slots`` (distinct): none is reused until it :meth:`unpin` s them."""
        self.pinned[slots] += 1  # distinct slots: a plain increment (np.add.at is ten times slower)

    def unpin(self, slots: np.ndarray) -> None:
        self.pinned[slots] -= 1
        if self._deferred:
            done = [d for d in self._deferred if self.pinned[d] == 0]
            if done:
                self._deferred = [d for d in self._deferred if self.pinned[d] > 0]
                self._give(done)

    def problems(self) -> list[str]:
        """What breaks the table's invariants, in words (empty when none): a slot free twice, free and in
        use, or held by two rows.  A check for tests and debugging; the owner's lock must be held.

        Examples
        --------
        >>> t = SlotTable(num_rows=4, slots=2)
        >>> t.place(np.array([1]), t.claim(1), CACHED); t.problems()
        []
        >>> t.slot[2] = t.slot[1]; t.problems()
        ['a slot held by two rows: [0]']
        """
        found = []
        free = np.asarray(self._free + self._parked + self._deferred, np.int64)
        uniq, counts = np.unique(free, return_counts=True)
        if (counts > 1).any():
            found.append(f"slots free twice: {uniq[counts > 1][:8].tolist()}")
        if free.size and (self.kind[free] != FREE).any():
            found.append(f"free slots in use: {free[self.kind[free] != FREE][:8].tolist()}")
        held = self.slot[self.slot >= 0].astype(np.int64)
        uniq, counts = np.unique(held, return_counts=True)
        if (counts > 1).any():
            found.append(f"a slot held by two rows: {uniq[counts > 1][:8].tolist()}")
        if held.size and (self.kind[held] == FREE).any():
            found.append(f"rows mapped to free slots: {held[self.kind[held] == FREE][:8].tolist()}")
        in_use = np.flatnonzero(self.kind != FREE)
        if np.setdiff1d(in_use, held).size:
            found.append(f"slots in use that no row holds: {np.setdiff1d(in_use, held)[:8].tolist()}")
        return found

    def keep_cached_only(self) -> None:
        """Free every slot that is not ``CACHED`` and forget readers and demand reads (a forked child's
        table: the threads that filled or read them stayed in the parent)."""
        keep = self.kind == CACHED
        mapped = self.slot >= 0
        drop = np.zeros(self.slot.shape[0], np.bool_)
        drop[mapped] = ~keep[self.slot[mapped]]
        self.slot[drop | (self.slot == READING)] = NONE
        self.kind[~keep] = FREE
        self.staged_for[:] = -1
        self.pinned[:] = 0
        self._deferred = []
        self._free, self._parked = [], []
        self._give(np.flatnonzero(~keep)[::-1].tolist())
