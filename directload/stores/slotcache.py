"""``SlotCache``: which rows a cache holds and which it reads next, as a data structure with no threads,
no I/O and no row memory.

It owns the slot table (:class:`~directload.stores.slots.SlotTable`), the policy, the announced batches
(:class:`~directload.stores.readahead.Announced`) and the one lock around them, and answers every question
a cache's threads ask: a read's :meth:`SlotCache.query`, :meth:`SlotCache.admit` and :meth:`SlotCache.finish`,
the read-ahead's :meth:`~SlotCache.claim_ahead` / :meth:`~SlotCache.settle_ahead`, a warm's
:meth:`~SlotCache.claim_warm` / :meth:`~SlotCache.settle_warm`, and :meth:`~SlotCache.resize`.  The rows
themselves, and every copy into or out of a slot, belong to the store around it
(:class:`~directload.stores.CachedStore`), which is told which slots to fill and when: GraphBolt's split of
``CPUFeatureCache`` (query, replace) from ``CPUCachedFeature`` (the fallback and the copies).  So every
policy is tested with numpy alone.

One fill protocol for the three ways rows come in (a read's kept misses, the read-ahead, a warm): slots are
claimed and marked in flight under the lock (readers of those rows wait), the store fills them outside the
lock (a device cache's copy is GPU work, never done under it), then settles them under the lock again (or
gives them back with :meth:`~SlotCache.free`).  A child forked meanwhile drops the slots in flight, never
sees a row half copied.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from directload.errors import rethrown

from .policies import Policy, make_policy, policy_class
from .readahead import Announced
from .records import Admitted, Query
from .slots import CACHED, INFLIGHT, KEPT, LET_GO, NONE, READING, ROW_BYTES, SLOT_BYTES, STAGED, SlotTable

if TYPE_CHECKING:
    from .policies import PolicySpec

__all__ = ["SlotCache"]

_NO_ROWS = np.zeros(0, np.int64)


class SlotCache:
    """The slots of a cache over ``num_rows`` rows: ``capacity`` cached rows (growable to ``room``) and
    ``staging`` rows read ahead, kept by ``policy`` (a name, a :class:`~directload.stores.policies.Policy`
    or a callable ``capacity -> Policy``; see :func:`~directload.stores.policies.make_policy`).

    ``park(slots)`` and ``unpark(slots)`` are called under the lock with slots a shrunk cache no longer
    uses (their memory may be given back) and slots a grown one uses again; the store's memory answers them.

    Examples
    --------
    >>> c = SlotCache(10, capacity=2, policy="lru")
    >>> memory = np.zeros(2)  # the store's slots
    >>> q = c.query(np.array([3, 5]))
    >>> q.miss_rows.tolist(), q.keep.tolist()
    ([3, 5], [True, True])
    >>> placed = c.admit(q)  # the kept misses' slots, in flight: the store fills them outside the lock
    >>> memory[placed.slots] = np.array([30.0, 50.0])[placed.at]; c.finish(q, placed)
    >>> memory.tolist(), c.query(np.array([5])).cached.tolist()
    ([30.0, 50.0], [True])
    """

    def __init__(self, num_rows: int, capacity: int, *, staging: int = 0, room: int | None = None,
                 policy: PolicySpec = "lookahead", park: Callable[[np.ndarray], object] | None = None,
                 unpark: Callable[[np.ndarray], object] | None = None) -> None:
        self.num_rows = int(num_rows)
        self.capacity_rows = int(capacity)
        self.staging_rows = int(staging)
        self.room_rows = self.capacity_rows if room is None else int(room)
        if self.room_rows < self.capacity_rows:
            raise ValueError(f"room ({self.room_rows} rows) is less than the capacity ({self.capacity_rows})")
        self.policy = make_policy(policy, self.capacity_rows, num_rows=self.num_rows)
        self._policy_spec = policy  # what resize() makes the policy of another capacity from
        self._park, self._unpark = park or (lambda s: None), unpark or (lambda s: None)
        used = self.capacity_rows + self.staging_rows
        self.table = SlotTable(self.num_rows, self.room_rows + self.staging_rows)
        if used < self.table.size:
            self.table.set_limit(used)
            self.table.take_newly_parked()  # never touched: nothing to give back
        self._announced = Announced(self.num_rows)
        self._lock = threading.Condition()
        self._generation = 0  # resizes so far: a read that began before one asks the new policy again
        self._batch = 0  # reads matched to announced batches so far (the policy's clock)
        self._demand = 0  # queries under way: the read-ahead and the warming rounds yield to them
        self._error: BaseException | None = None
        self.closed = False

    # ------------------------------------------------------------- reads
    def query(self, uniq: np.ndarray, on_wait: Callable[[], object] | None = None) -> Query:
        """A read of the distinct rows ``uniq`` (sorted int64) starts: wait for rows in flight (calling
        ``on_wait()`` at each wait), match it to its announced batch, classify its rows and let the policy
        see the access.  The slots it copies out of
        are pinned and its misses marked as being read, until :meth:`admit` or :meth:`abandon`."""
        t = self.table
        with self._lock:
            self.raise_failure()
            self._demand += 1
            try:
                tw = time.perf_counter()
                while True:  # rows the read-ahead (or a warm, or an admit) is filling now: wait for them
                    s = t.slot[uniq]
                    if not ((s >= 0) & (t.kind_of(s) == INFLIGHT)).any():
                        break
                    if on_wait is not None:
                        on_wait()
                    self._lock.wait(0.05)
                    self.raise_failure()
                wait_s = time.perf_counter() - tw
                mine, skipped = self._announced.match(uniq)  # after the wait: rows landing for it must stay
                for entry in skipped:
                    self._release(self._announced.forget(entry))
                s = t.slot[uniq]  # again: a skipped batch's staged rows just freed may be rows of this read
                kind = t.kind_of(s)
                staged = (s >= 0) & (kind == STAGED)
                forwarded = int(np.count_nonzero(t.staged_for[s[staged]] != mine[0])) if mine is not None else 0
                tp = time.perf_counter()
                self.policy.see(self._batch, [uniq, *(rows for _, rows in self._announced)])
                self.policy.access_distinct(uniq)
                keep = self.policy.contains(uniq)
                evicted = np.unique(self.policy.take_evicted())  # a row may go, come back and go again
                evicted = evicted[~self.policy.contains(evicted)]  # ... or go and come back: its slot holds it
                policy_s = time.perf_counter() - tp
                if mine is not None:
                    self._batch += 1
                q = Query(uniq, s, (s >= 0) & (kind == CACHED), staged, s < 0, keep, evicted, mine,
                          self._generation, forwarded, wait_s, policy_s)
                # The store reads without the lock: no one reads its misses twice, and the slots it copies
                # out of are not reused under it.
                t.slot[q.miss_rows] = READING
                t.pin(q.held)
                return q
            finally:
                self._demand -= 1

    def abandon(self, q: Query) -> None:
        """A read that failed before :meth:`admit`: unpin its slots, unmark its misses, release its batch."""
        with self._lock:
            self._done_reading(q)
            if q.batch is not None:
                self._release(q.batch[1])
            self._lock.notify_all()

    def admit(self, q: Query) -> Admitted:
        """After the read's gather: evicted rows go, rows the policy holds now change kind, misses it keeps
        take free slots, and its batch's staged rows are released.  Returns where the kept misses go (an
        :class:`~directload.stores.records.Admitted`): those slots are in flight (readers of their rows
        wait) until the store has filled them from the read's staged misses, outside this lock, and
        settles them with :meth:`finish` (or gives them back with :meth:`free`).  The slots the read copied
        out of stay pinned until :meth:`finish` (a GPU may still be reading them): a slot evicted meanwhile
        is reused only after."""
        t = self.table
        with self._lock:
            evicted, keep = q.evicted, q.keep
            if q.generation != self._generation:  # resized meanwhile: the policy that answered is gone
                evicted = evicted[~self.policy.contains(evicted)]
                keep = self.policy.contains(q.uniq)
            self._evict(evicted)
            promote = keep & q.staged
            if promote.any():
                # Only a row still in the slot it was staged in: another reader may have freed that slot
                # meanwhile, and the row may be in flight in another now, which only its reader may settle.
                rows, was = q.uniq[promote], q.slots[promote]
                cur = t.slot[rows]
                same = cur == was
                same[same] = t.kind[cur[same]] == STAGED
                t.kind[cur[same]] = CACHED
            placed = None
            new = keep & q.miss
            if new.any():
                # among the misses, in their order; not those a concurrent reader gave a slot meanwhile
                miss_rows = q.miss_rows
                picked = np.flatnonzero(new[q.miss] & (t.slot[miss_rows] < 0))  # in none, or being read
                slots = t.claim(picked.shape[0])  # fewer only while rows are in flight (a warm's, a read's)
                picked = picked[:slots.shape[0]]
                placed = Admitted(miss_rows[picked], slots, picked, self._generation)
                t.place(placed.rows, slots, INFLIGHT, KEPT)  # readers wait for them until settled
            if q.batch is not None:
                self._release(q.batch[1])
            self._lock.notify_all()
            return placed if placed is not None else Admitted(_NO_ROWS, _NO_ROWS, _NO_ROWS, self._generation)

    def finish(self, q: Query, placed: Admitted | None = None) -> None:
        """The read is done with its slots (its gather complete) and has filled ``placed`` (what :meth:`admit`
        gave): those rows the policy still keeps are cached, the rest freed; then its slots are unpinned and
        its misses unmarked."""
        with self._lock:
            if placed is not None and placed.slots.size:
                self._settle_cached(placed.rows, placed.slots, placed.generation)
            self._done_reading(q)
            self._lock.notify_all()

    def _done_reading(self, q):
        t = self.table
        rows = q.miss_rows
        mark = t.slot[rows] == READING  # another reader may have slotted one meanwhile
        t.slot[rows[mark]] = NONE
        t.unpin(q.held)

    # --------------------------------------------------------- look-ahead
    def announce(self, rows: np.ndarray) -> np.ndarray:
        """A batch of distinct ``rows`` will be read (after those announced before): the rows no slot holds
        now (what the store's fallback may prefetch)."""
        with self._lock:
            self.raise_failure()
            _, dropped = self._announced.add(rows)
            for entry in dropped:
                self._release(self._announced.forget(entry))
            self._lock.notify_all()
            return rows[self.table.slot[rows] < 0]

    def claim_ahead(self, chunk_rows: int, timeout: float = 0.05) -> tuple[np.ndarray, np.ndarray] | None:
        """The read-ahead's next chunk: up to ``chunk_rows`` rows of the oldest announced batch that no slot
        holds, and free slots for them (marked in flight), as ``(rows, slots)``; None after ``timeout``
        seconds with nothing to do, no free slot, a query under way, or the cache closed."""
        t = self.table
        with self._lock:
            deadline = time.monotonic() + timeout
            while not self.closed:
                room = min(t.free_count, self.staging_rows - t.count(STAGED))
                if self._error is None and not self._demand and room > 0:
                    for j, rows in self._announced:
                        # rows in a slot already are shared, not read again; rows a read is reading are not
                        # read twice
                        want = rows[t.slot[rows] == NONE]
                        if want.size:
                            want = want[:min(want.shape[0], max(1, chunk_rows), room)]
                            slots = t.claim(want.shape[0])
                            t.place(want, slots, INFLIGHT, j)
                            return want, slots
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._lock.wait(left)
            return None

    def settle_ahead(self, rows: np.ndarray, slots: np.ndarray) -> None:
        """The read-ahead filled ``slots``: they hold ``rows``, staged; rows whose batch was read meanwhile go."""
        with self._lock:
            self.table.kind[slots] = STAGED
            self._release(rows)
            self._lock.notify_all()

    def free(self, rows: np.ndarray, slots: np.ndarray) -> None:
        """Give back claimed ``slots`` a fill did not complete."""
        with self._lock:
            self._free_slots(rows, slots)

    # ------------------------------------------------------------ warming
    def plan_warm(self, ids: np.ndarray) -> np.ndarray:
        """The rows of the distinct ``ids`` (most wanted first) a warm reads: those in no slot that fit the
        free capacity, which the policy admits at once, in that order."""
        t = self.table
        with self._lock:
            self.raise_failure()
            want = ids[t.slot[ids] == NONE]
            want = want[:max(0, self.capacity_rows - t.count(CACHED))]
            keep = self.policy.warm(want)
            self._evict(np.unique(self.policy.take_evicted()))  # none while it had room
            return want[keep]

    def absent(self, ids: np.ndarray) -> int:
        """How many of ``ids`` no slot holds."""
        with self._lock:
            return int(np.count_nonzero(self.table.slot[ids] == NONE))

    def claim_warm(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
        """A warming round starts: ``(rows, slots)`` for its rows in no slot that the policy still keeps, in
        flight (after queries under way: demand first); None once the cache closed."""
        t = self.table
        with self._lock:
            while self._demand and not self.closed:
                self._lock.wait(0.05)
            if self.closed:
                return None
            rows = rows[(t.slot[rows] == NONE) & self.policy.contains(rows)]
            slots = t.claim(rows.shape[0])
            rows = rows[:slots.shape[0]]
            t.place(rows, slots, INFLIGHT, KEPT)  # readers wait for them; the read-ahead leaves them alone
            return rows, slots

    def settle_warm(self, rows: np.ndarray, slots: np.ndarray) -> int:
        """A round filled ``slots``: those the policy still keeps are cached, the rest freed.  Returns how
        many were kept."""
        with self._lock:
            kept = self._settle_cached(rows, slots)
            self._lock.notify_all()
            return kept

    def _settle_cached(self, rows, slots, generation=None):
        """Filled in-flight ``slots`` of ``rows``: cached where the policy still keeps the row (a read or a
        resize may have let it go meanwhile), freed where not.  With the ``generation`` they were placed in
        and no resize since, only the rows :meth:`_evict` marked let go are asked about (every row the policy
        let go reaches it); else the policy is asked about all.  How many were kept."""
        t = self.table
        if generation == self._generation:
            kept = t.staged_for[slots] != LET_GO
            if kept.all():  # the policy let none go: all cached, no question asked
                t.kind[slots] = CACHED
                t.staged_for[slots] = -1
                return int(slots.shape[0])
            kept[~kept] = self.policy.contains(rows[~kept])  # let go, and maybe kept again since
        else:
            kept = self.policy.contains(rows)
        t.kind[slots[kept]] = CACHED
        t.staged_for[slots[kept]] = -1
        self._free_slots(rows[~kept], slots[~kept])
        return int(kept.sum())

    # ------------------------------------------------------------- resize
    def resize(self, rows: int) -> int:
        """Hold at most ``rows`` cached rows (at most :attr:`room_rows`): rows past the new limit or no longer
        kept go; the policy starts again at the new capacity with the rows kept.  Returns the capacity."""
        if isinstance(self._policy_spec, Policy):
            raise TypeError("this cache's policy was given as a Policy object, which has one capacity: to resize "
                            "the cache, give the policy by name or as a callable capacity -> Policy")
        rows = min(self.room_rows, int(rows))
        t = self.table
        with self._lock:
            self.raise_failure()
            if rows == self.capacity_rows:
                return rows
            limit = rows + self.staging_rows
            held = np.flatnonzero(t.slot >= 0)
            s = t.slot[held]
            mine = (t.kind[s] == CACHED) & self.policy.contains(held) & (s < limit)
            policy = make_policy(self._policy_spec, rows, num_rows=self.num_rows)
            policy.warm(held[mine][:rows])
            gone = held[(t.kind[s] == CACHED) & ~policy.contains(held)]
            self.policy, self.capacity_rows = policy, rows
            self._generation += 1
            self._evict(gone)
            back = t.set_limit(limit)
            if back.size:
                self._unpark(back)
            self._park(t.take_newly_parked())
            self._lock.notify_all()
        return rows

    # ------------------------------------------------------------- slots
    def _evict(self, rows):
        """Rows the policy evicted: their slots go free, or stay staged for an announced batch."""
        if not rows.size:
            return
        t = self.table
        rows, s = t.slotted(rows)
        kind = t.kind[s]
        filling = s[kind == INFLIGHT]
        if filling.size:  # filled for the policy, which let them go: their fillers free them
            t.staged_for[filling[t.staged_for[filling] == KEPT]] = LET_GO
        ok = kind == CACHED
        rows, s = rows[ok], s[ok]
        still = self._announced.still_wanted(rows)
        # an announced batch reads it: it stays, staged (forwarded, not read twice), while staging has room
        room = max(0, self.staging_rows - t.count(STAGED))
        still &= np.cumsum(still) <= room
        t.kind[s[still]] = STAGED
        t.staged_for[s[still]] = KEPT
        self._free_slots(rows[~still], s[~still])

    def _release(self, rows):
        """Free the slots of staged rows of ``rows`` that no announced batch still needs."""
        if not rows.size:
            return
        t = self.table
        rows, s = t.slotted(rows)
        gone = (t.kind[s] == STAGED) & ~self._announced.still_wanted(rows)
        self._free_slots(rows[gone], s[gone])

    def _free_slots(self, rows, slots):
        if rows.size:
            t = self.table
            t.free_slots(rows, slots)
            if t.limit < t.size:
                self._park(t.take_newly_parked())
            self._lock.notify_all()

    # ------------------------------------------------- state and lifetime
    def counts(self) -> dict[str, int]:
        """``{"cached_rows", "staged_now"}``: slots holding cached rows, and staged or in-flight rows now."""
        with self._lock:
            return {"cached_rows": self.table.count(CACHED),
                    "staged_now": int(np.count_nonzero(self.table.kind == STAGED))}

    def held_rows(self, kind: int | None = None) -> np.ndarray:
        """The rows in a slot now (of ``kind``, e.g. ``slots.CACHED``, when given), sorted."""
        with self._lock:
            rows = np.flatnonzero(self.table.slot >= 0)
            if kind is not None:
                rows = rows[self.table.kind[self.table.slot[rows]] == kind]
            return rows

    def nbytes(self) -> int:
        """Bytes of this bookkeeping: the slot table, the announced batches and the policy's state."""
        with self._lock:
            return self.table.nbytes() + self._announced.nbytes() + self.policy.nbytes()

    @staticmethod
    def bytes_for(num_rows: int, slots: int, capacity: int, policy: PolicySpec = "lookahead", *,
                  batches: int = 0, batch_rows: int = 0) -> int:
        """At most :meth:`nbytes` of a cache of ``slots`` slots (room and read-ahead) keeping up to
        ``capacity`` rows of a table of ``num_rows`` under ``policy``, with ``batches`` announced batches
        of ``batch_rows`` rows unread (before any is made: a memory budget's estimate).

        Examples
        --------
        >>> c = SlotCache(10_000, capacity=1000, staging=200, policy="lru")
        >>> c.nbytes() <= SlotCache.bytes_for(10_000, 1200, 1000, "lru")
        True
        """
        cls = policy_class(policy)
        return (SLOT_BYTES * int(slots) + ROW_BYTES * int(num_rows) + cls.bytes_for(capacity, num_rows)
                + Announced.bytes_for(num_rows, batches, batch_rows))

    def problems(self) -> list[str]:
        """What breaks the slot table's invariants, in words (empty when none); see
        :meth:`~directload.stores.slots.SlotTable.problems`."""
        with self._lock:
            return self.table.problems()

    def fail(self, exc: BaseException) -> None:
        """A thread of the store failed: every later call raises ``exc`` again (a fresh copy, chained)."""
        with self._lock:
            self._error = exc
            self._lock.notify_all()

    def raise_failure(self) -> None:
        if self._error is not None:
            raise rethrown(self._error) from self._error

    def close(self) -> None:
        """No more claims: waiting read-ahead and warming calls return None."""
        with self._lock:
            self.closed = True
            self._lock.notify_all()

    def after_fork(self) -> None:
        """A forked child keeps the cached rows and nothing else: the parent's threads did not come along,
        nor the reads in flight on them, and the announced batches are the parent's loader's."""
        self._lock = threading.Condition()
        self.table.keep_cached_only()
        self._announced.clear()
        self._demand = 0
