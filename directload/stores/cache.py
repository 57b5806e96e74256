"""Caches: stores in front of a slower store, that keep the rows a policy chooses and stage the rows the
next batches will read.

A cache holds a table of row *slots*, in GPU memory (:class:`DeviceCache`) or pinned host memory
(:class:`HostCache`), and one id -> slot map.  A slot holds either a *cached* row, which the policy
(:mod:`directload.stores.policies`) chose to keep, or a *staged* one, read ahead for a batch the loader
announced (:meth:`FeatureStore.prefetch`) and kept until that batch has been read.  A read is one fused
gather (:func:`directload.kernels.tiered.gather_tiered`): rows in slots come from the slot table, the rest
from the slower store's host staging memory, zero-copy on a GPU, straight into the result.

Look-ahead I/O (G10, SSDTrain).  A background thread reads each announced batch's rows that no slot
holds into free slots, as soon as slots allow; the number of free slots bounds how far ahead it runs.  A
demand read always goes first: the thread stops between chunks while one waits.  A row already in a slot
(staged for an earlier batch, or just evicted but needed again soon) or being read (in flight) is served
from there, never read twice: ``forwarded_bytes`` counts what that saved.

No deadlock at any size: a batch larger than the free slots is staged in part and the rest read on
demand; a cache of no slots passes every read through, and its stats say so.
"""

import copy
import functools
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import numpy as np
import torch

from directload import memory
from directload.buffers import StagingBuffer
from directload.kernels.devices import memory_of
from directload.kernels.indexing import LINE
from directload.kernels.operands import row_words
from directload.kernels.pcie_model import row_min_lines
from directload.kernels.tiered import fill_slots, flat_where, gather_tiered
from directload.units import check_bytes

from . import warming as _warming_rounds
from .base import FeatureStore, ReadFuture, _as_index, deliver
from .policies import POLICIES, LookAhead, Policy
from .readahead import Announced, Worker
from .records import CacheStats, Staged
from .slots import CACHED, INFLIGHT, KEPT, NONE, READING, STAGED, SlotTable
from .warming import Warming

__all__ = ["Cache", "HostCache", "DeviceCache", "make_policy", "POLICY_NAMES"]

#: Policy names a cache takes (or pass a Policy, or a callable ``capacity -> Policy``).
POLICY_NAMES = ("lookahead", *POLICIES)

# The read-ahead reads at most this much between checks for demand.  Measured on synth-ooc's first epoch:
# 4 MiB chunks read 40% fewer rows ahead than 16 MiB (more per-chunk overhead, so demand reads caught up);
# 16 MiB keeps a demand read's wait for the chunk in flight near 50 ms on this disk.
_CHUNK_BYTES = 16 << 20
_POOLED = 4  # demand buffers kept for reuse (one per reader in flight; more readers allocate their own)
_READERS = 4  # threads that run a cache's reads (each read is one task; readers of one cache may overlap)
_COUNTERS = ("reads", "rows", "hit_rows", "staged_rows", "miss_rows", "passthrough_rows", "prefetched_rows",
             "forwarded_rows", "inflight_waits", "batches_over_capacity", "demand_bytes", "prefetch_bytes", "read_s",
             "wait_s", "fallback_s", "policy_s", "ahead_s", "pcie_lines", "warmed_rows", "warm_s")


def make_policy(policy, capacity):
    """A :class:`~directload.stores.policies.Policy` of ``capacity`` rows from a name, a policy or a
    callable ``capacity -> Policy``."""
    if isinstance(policy, str):
        if policy == "lookahead":  # evicting 1/32 more at a pass: passes over the held rows come a few batches apart
            return LookAhead(capacity, slack=capacity // 32)
        if policy not in POLICIES:
            raise ValueError(f"policy must be one of {POLICY_NAMES}, a Policy or a callable, not {policy!r}")
        return POLICIES[policy](capacity)
    if isinstance(policy, Policy):
        got = policy
    elif callable(policy):
        got = policy(capacity)
        if not isinstance(got, Policy):
            raise TypeError(f"the policy factory returned a {type(got).__name__}, not a Policy")
    else:
        raise TypeError(f"policy must be a name, a Policy or a callable, not {type(policy).__name__}")
    if got.capacity > capacity:
        raise ValueError(f"the policy keeps {got.capacity} rows but the cache has room for {capacity}")
    return got


def _miss_index(miss, inv):
    """For each output row read from the flat tier, its position among the misses (flat's order)."""
    rank = np.cumsum(miss) - 1
    out_miss = miss[inv]
    return rank[inv[out_miss]]


class Cache(FeatureStore):
    """A cache in front of ``fallback``; see the module's docstring.  Use :class:`HostCache` or
    :class:`DeviceCache`.

    A read is four steps, each a method: :meth:`_query` (under the lock: which rows are in slots, what the
    policy keeps and evicts), :meth:`_stage_misses` (without the lock: the fallback stages the rest,
    through the public tier contract, :meth:`FeatureStore.stage`), :meth:`_gather` (one fused gather from
    slots and staging into the result) and :meth:`_admit` (under the lock: the kept misses move into
    slots).  The slots are a :class:`~directload.stores.slots.SlotTable`, the announced batches an
    :class:`~directload.stores.readahead.Announced` queue read ahead by a
    :class:`~directload.stores.readahead.Worker`, and :meth:`warm` runs
    :class:`~directload.stores.warming.Warming` rounds.  Reads run on the cache's reader threads, so
    ``read_async`` returns at once and a caller overlaps them with its own work.

    Parameters
    ----------
    fallback : FeatureStore
        The slower store.  Its rows must not change while the cache is open.
    capacity_bytes : int
        Bytes of cached rows (``capacity_bytes // row_nbytes`` rows, at most the table).
    policy : str, Policy or callable
        ``"lookahead"`` (default), ``"lru"``, ``"clock"``, ``"sieve"``, ``"s3fifo"``, a
        :class:`~directload.stores.policies.Policy` or a callable ``capacity -> Policy``.
    staging_bytes : int
        Bytes of slots for rows read ahead (0: no read-ahead; the hints still reach the policy and
        the fallback).
    room_bytes : int, optional
        The most :meth:`resize` may grow the cached rows to (default ``capacity_bytes``).  The slots past
        the capacity are address space only: a host cache touches their pages when it grows into them.

    Examples
    --------
    >>> from directload.stores import TensorStore
    >>> cache = HostCache(TensorStore(torch.arange(8.0).view(4, 2)), capacity_bytes=16)
    >>> isinstance(cache, Cache), cache.capacity_rows, cache.read([1]).tolist()
    (True, 2, [[2.0, 3.0]])
    """

    tier = "cache"

    def __init__(self, fallback, capacity_bytes, policy="lookahead", *, staging_bytes=0, room_bytes=None):
        super().__init__()
        if not isinstance(fallback, FeatureStore):
            raise TypeError(f"fallback must be a directload FeatureStore, not {type(fallback).__name__}")
        fallback.check_open()
        capacity_bytes = check_bytes("capacity_bytes", capacity_bytes)
        staging_bytes = check_bytes("staging_bytes", staging_bytes)
        room_bytes = capacity_bytes if room_bytes is None else check_bytes("room_bytes", room_bytes)
        if room_bytes < capacity_bytes:
            raise ValueError(f"room_bytes ({room_bytes}) is less than capacity_bytes ({capacity_bytes})")
        self.fallback = fallback
        # The fallback's shape, read once: its rows must not change while the cache is open.
        self._num_rows, self._row_shape, self._dtype = fallback.num_rows, tuple(fallback.row_shape), fallback.dtype
        self._row_nbytes = rnb = fallback.row_nbytes
        n = self._num_rows
        self.capacity_rows = min(n, capacity_bytes // rnb) if rnb else 0
        self.staging_rows = min(n, staging_bytes // rnb) if rnb else 0
        self.policy = make_policy(policy, self.capacity_rows)
        self._policy_spec = policy  # what resize() makes the policy of another capacity from
        self.room_rows = min(n, room_bytes // rnb) if rnb else 0  # the most rows resize() can grow to
        self._generation = 0  # resizes so far: a read that began before one asks the new policy again
        # Slots hold rows in the words the kernels move (complex128 rows as their bytes, in 8-byte words).
        self._words = row_words(fallback.dtype, fallback.row_shape)
        self._row_elems = int(np.prod(fallback.row_shape, dtype=np.int64))
        used = self.capacity_rows + self.staging_rows
        slots = self.room_rows + self.staging_rows
        self._rows = self._allocate(slots, used)
        self._table = SlotTable(n, slots)
        if used < slots:
            self._table.set_limit(used)
            self._table.take_newly_parked()  # never touched: nothing to give back
        self._announced = Announced(n)
        self._lock = threading.Condition()
        self._batch = 0  # reads matched to announced batches so far (the policy's clock)
        self._demand = 0  # demand reads waiting: the read-ahead and the warming rounds yield to them
        self._stolen = 0  # reads their waiters run (see _steal): close() waits for them
        self._error = None
        self._warming = None  # the Warming running, one at a time
        self._takes = []  # demand buffers not in use: each read with misses takes one while it reads
        self._ahead_take = StagingBuffer()  # the read-ahead thread's own
        self._stats = dict.fromkeys(_COUNTERS, 0)
        self._reader = self._ahead = None
        self._submit_lock = threading.Lock()
        self._pid = os.getpid()
        self._start_threads()

    def _start_threads(self):
        """This process's read-ahead thread (none without staging slots); reader threads start with reads."""
        self._reader = ThreadPoolExecutor(_READERS, thread_name_prefix=f"directload-{self.tier}-read")
        if self.staging_rows:
            self._ahead = Worker(f"directload-{self.tier}-prefetch", self._lock, self._next_task, self._read_ahead,
                                 stopped=lambda: self._closed,
                                 on_error=lambda exc: self._fail(exc, "read-ahead thread"))

    def _after_fork(self):
        """A forked child keeps the cached rows and nothing else: the parent's threads did not come along
        (their slots would wait for ever), nor the reads in flight on them, and its announced batches are
        its loader's, not the child's.  Fresh locks; the threads start again at the child's first use."""
        self._lock = threading.Condition()
        self._submit_lock = threading.Lock()
        self._table.keep_cached_only()
        self._announced.clear()
        self._demand = self._stolen = 0
        self._warming, self._reader, self._ahead = None, None, None
        self._takes, self._ahead_take = [], StagingBuffer()
        self._pid = None  # the threads start at the first use

    def _this_process(self):
        if self._pid != os.getpid():
            with self._lock:
                if self._pid != os.getpid():
                    self._pid = os.getpid()
                    if not self._closed:
                        self._start_threads()

    # ---------------------------------------------------------------- shape
    @property
    def num_rows(self):
        return self._num_rows

    @property
    def row_shape(self):
        return self._row_shape

    @property
    def dtype(self):
        return self._dtype

    @property
    def row_nbytes(self):
        return self._row_nbytes

    @property
    def memory(self):
        return memory_of(self._rows)

    def _allocate(self, slots, used):
        """The slots' memory: ``slots`` rows, of which the first ``used`` are used from the start."""
        raise NotImplementedError

    def _release_slots(self, slots):
        """A hook: free ``slots`` (sorted) are past a shrunk cache's limit; a host cache gives their pages back."""

    def _reuse_slots(self, slots):
        """A hook: free ``slots`` are back in use after a cache grew; a host cache touches their pages again."""

    # ---------------------------------------------------------------- resize
    def resize(self, capacity_bytes):
        """Hold at most ``capacity_bytes`` of cached rows from now on, between 0 and the capacity the cache
        was made with (:attr:`room_rows` rows), while reads go on.

        Shrinking evicts the rows that no longer fit (a row in a slot past the new limit goes, even one
        the policy kept) and, in a :class:`HostCache` of ordinary memory, gives the pages of the slots no
        longer used back to the system; growing lets the cache fill again.  The policy starts again at the
        new capacity, holding the rows kept.  Reads never return a wrong row: a read that began before the
        resize admits its misses under the new policy.  A node's budget (:mod:`directload.budget`) calls
        this as jobs come and go.  Returns the new capacity in rows.

        Examples
        --------
        >>> from directload.stores import TensorStore
        >>> cache = HostCache(TensorStore(torch.arange(20.0).view(10, 2)), capacity_bytes=8 * 8, policy="lru")
        >>> _ = cache.read(list(range(8)))
        >>> cache.resize(3 * 8), len(cache.policy.cached()), cache.read([7, 0]).tolist()
        (3, 3, [[14.0, 15.0], [0.0, 1.0]])
        >>> cache.resize(8 * 8), cache.capacity_rows
        (8, 8)
        """
        capacity_bytes = check_bytes("capacity_bytes", capacity_bytes)
        self.check_open()
        if isinstance(self._policy_spec, Policy):
            raise TypeError("this cache's policy was given as a Policy object, which has one capacity: to resize "
                            "the cache, give the policy by name or as a callable capacity -> Policy")
        rows = min(self.room_rows, capacity_bytes // self.row_nbytes) if self.row_nbytes else 0
        self._this_process()
        with self._lock:
            self._raise_failure()
            if rows == self.capacity_rows:
                return rows
            t = self._table
            limit = rows + self.staging_rows
            held = np.flatnonzero(t.slot >= 0)
            s = t.slot[held]
            mine = (t.kind[s] == CACHED) & self.policy.contains(held) & (s < limit)
            keep = held[mine][:rows]
            policy = make_policy(self._policy_spec, rows)
            policy.warm(keep)
            gone = held[(t.kind[s] == CACHED) & ~policy.contains(held)]
            self.policy, self.capacity_rows = policy, rows
            self._generation += 1
            self._evict(gone)
            back = t.set_limit(limit)
            if back.size:
                self._reuse_slots(back)
            self._release_slots(t.take_newly_parked())
            self._lock.notify_all()
        return rows

    def _own_memory(self):
        return (self._rows, *self.fallback.held_memory())

    # ----------------------------------------------------------- prefetch
    def _prefetch(self, index):
        """The loader's hint: ``index`` is the next batch it will read (after those announced before).

        The policy sees it as the future; the read-ahead thread stages its rows; the fallback gets
        the ids this cache does not hold now."""
        self._this_process()
        rows = np.unique(index.cpu().numpy().astype(np.int64, copy=False))
        with self._lock:
            self._raise_failure()
            _, dropped = self._announced.add(rows)
            for entry in dropped:
                self._release(self._announced.forget(entry))
            absent = rows[self._table.slot[rows] < 0]
            self._lock.notify_all()
        self.fallback.prefetch(absent)

    def hot_ids(self):
        return self.fallback.hot_ids()

    @property
    def warming(self):
        """The :class:`~directload.stores.warming.Warming` running (a background :meth:`warm`), or None."""
        w = self._warming
        return w if w is not None and w.alive() else None

    def warm(self, ids=None, *, background=False, progress=False, after=None):
        """Fill the cache's free room with the rows ``ids``, most wanted first, before or while training:
        G10's eager prefetch "as soon as space allows", demand first, with Sentinel's packing.

        ``None`` takes the fallback's own order (:meth:`~directload.stores.FeatureStore.hot_ids`): a disk
        store renumbered by :func:`~directload.stores.renumber` holds its hottest rows first, so they are
        read in long sequential reads, at the disk's bandwidth rather than its random-read rate.  Rows in
        a slot already are skipped and nothing is evicted: the policy admits the rows that fit as cached
        (:meth:`~directload.stores.policies.Policy.warm`) at once, and they are read in rounds of 32 MiB,
        each round's slots claimed as it starts.  Reads of other threads go first (a round waits while
        one waits) and find a row either cached or read on demand, never waiting for more than the round
        in flight.  With ``background`` the rounds run on a thread of their own and this returns at once
        (after ``after``, another cache's :attr:`warming`, has ended, when given); a failure there reaches
        the next read, and :meth:`close` stops it between rounds.

        Returns the number of rows admitted (read in, unless a read on demand took them first or
        ``background``: ``stats()["warmed_rows"]`` counts those read in).
        """
        self.check_open()
        index = _as_index(self._warm_ids(ids))
        self._check_bounds(index)
        ids = self._warm_candidates(index.cpu().numpy().astype(np.int64, copy=False))
        t = self._table
        with self._lock:
            self._raise_failure()
            if self._warming is not None:
                raise RuntimeError(f"the {self.tier} cache is warming already: one warm at a time")
            want = ids[t.slot[ids] == NONE]
            want = want[:max(0, self.capacity_rows - t.count(CACHED))]
            keep = self.policy.warm(want)  # at once, so the policy's order among them is the one given
            self._evict(np.unique(self.policy.take_evicted()))  # none while it had room
            rows = want[keep]
            take = StagingBuffer()  # its own, freed when it ends
            self._warming = Warming(rows, round_rows=_warming_rounds.WARM_BYTES // max(self.row_nbytes, 1),
                                    claim=self._warm_claim, fill=lambda r, s: self._fill(r, s, take),
                                    settle=self._warm_settle, row_nbytes=self.row_nbytes, name=self.tier,
                                    on_seconds=self._count_warm_seconds)
        if not background:
            try:
                self._warming.run(progress)
            finally:
                self._warming = None
            return int(rows.shape[0])

        def ended():
            self._warming = None

        try:
            self._warming.start(after=after, closed=lambda: self._closed, on_end=ended,
                                on_error=lambda exc: self._fail_locked(exc, "warm thread"))
        except BaseException:
            self._warming = None
            raise
        return int(rows.shape[0])

    def _warm_candidates(self, ids):
        """The distinct ids of ``ids`` in their order, as far as needed: a prefix with at least a cache's
        worth of rows in no slot (``np.unique`` over all of a 100M-id list would take seconds)."""
        k = min(ids.shape[0], max(2 * self.capacity_rows, 1024))
        while True:
            _, first = np.unique(ids[:k], return_index=True)
            head = ids[:k][np.sort(first)]
            if k == ids.shape[0] or np.count_nonzero(self._table.slot[head] == NONE) >= self.capacity_rows:
                return head
            k = min(ids.shape[0], 4 * k)

    def _warm_claim(self, rows):
        """A warming round starts: slots for its rows still in none that the policy keeps (after reads that
        wait: demand first); None once the cache closed."""
        t = self._table
        with self._lock:
            while self._demand and not self._closed:
                self._lock.wait(0.05)
            if self._closed:
                return None
            rows = rows[(t.slot[rows] == NONE) & self.policy.contains(rows)]
            slots = t.claim(rows.shape[0])
            rows = rows[:slots.shape[0]]
            t.place(rows, slots, INFLIGHT, KEPT)  # readers wait for them; the read-ahead leaves them alone
            return rows, slots

    def _warm_settle(self, rows, slots):
        with self._lock:
            kept = self.policy.contains(rows)  # a reader's batch may have evicted some meanwhile
            self._table.kind[slots[kept]] = CACHED
            self._free_slots(rows[~kept], slots[~kept])
            self._stats["warmed_rows"] += int(kept.sum())
            self._lock.notify_all()

    def _count_warm_seconds(self, seconds):
        with self._lock:
            self._stats["warm_s"] += seconds

    # -------------------------------------------------------------- reads
    def _read_async(self, index, out, run_device, out_device):
        self._this_process()
        ids = index.cpu().numpy().astype(np.int64, copy=True)  # the caller may reuse its ids at once
        with self._submit_lock:  # ClosedError once closed, never the executor's "cannot schedule"
            self.check_open()
            work = functools.partial(self._read, ids, out, run_device, out_device)
            return ReadFuture(future=self._reader.submit(work), steal=functools.partial(self._steal, work))

    def _steal(self, work, future):
        """A wait() before a reader thread took the read: the read runs on the waiting thread (and close()
        waits for it as for the readers); ``ReadFuture.NOT_STOLEN`` where a reader has it."""
        with self._lock:
            if not future.cancel():
                return ReadFuture.NOT_STOLEN
            self._stolen += 1
        try:
            return work()
        finally:
            with self._lock:
                self._stolen -= 1
                self._lock.notify_all()

    def _read(self, ids, out, run_device, out_device):
        """query -> stage misses -> fused gather -> admit."""
        t0 = time.perf_counter()
        uniq, inv = np.unique(ids, return_inverse=True)
        inv = inv.reshape(-1)
        with self._lock:
            self._demand += 1
            try:
                q = self._query(uniq)
                take = None
                if q.miss_rows.size:
                    # The demand's I/O runs without the lock, so the read-ahead thread goes on with later
                    # batches (queued behind it: demand first).  Its misses are marked READING, so no one
                    # reads them twice, and the slots it reads from are pinned, so none is freed under it.
                    self._table.slot[q.miss_rows] = READING
                    self._table.pin(q.held)
                    take = self._takes.pop() if self._takes else StagingBuffer()
                    self._demand -= 1
                    self._lock.release()
                    try:
                        staged = self._stage_misses(q.miss_rows, run_device, take)
                    finally:
                        self._lock.acquire()
                        self._demand += 1
                        mark = self._table.slot[q.miss_rows] == READING  # another reader may have slotted one
                        self._table.slot[q.miss_rows[mark]] = NONE
                        self._table.unpin(q.held)
                else:
                    staged = Staged(torch.empty(0, dtype=self._words.dtype), np.empty(0, np.int64))
                self._stats["fallback_s"] += time.perf_counter() - q.t_fallback
                result = self._gather(q, inv, staged, out, run_device)
                self._after_gather(q, inv, staged)
                self._admit(q, staged)
                self._count(q, inv)
                if run_device.type == "cuda":
                    torch.cuda.current_stream(run_device).synchronize()  # the staging buffer is the next read's
                if take is not None and len(self._takes) < _POOLED:
                    self._takes.append(take)
            finally:
                self._demand -= 1
                self._stats["read_s"] += time.perf_counter() - t0  # under the lock: reads run on many threads
                self._lock.notify_all()
        return deliver(result, out, out_device)

    def _query(self, uniq):
        """Under the lock: wait for rows in flight, match the read to its announced batch, classify the
        rows (cached, staged, missing) and let the policy see the access."""
        st, t = self._stats, self._table
        self._raise_failure()
        tw = time.perf_counter()
        while True:  # rows the read-ahead thread is reading now: wait for them (forwarding)
            s = t.slot[uniq]
            if not ((s >= 0) & (t.kind_of(s) == INFLIGHT)).any():
                break
            st["inflight_waits"] += 1
            self._lock.wait(0.05)
            self._raise_failure()
        st["wait_s"] += time.perf_counter() - tw
        mine, skipped = self._announced.match(uniq)  # after the wait: rows landing for it must stay
        for entry in skipped:
            self._release(self._announced.forget(entry))
        s = t.slot[uniq]  # again: a skipped batch's staged rows just freed may be rows of this read
        kind = t.kind_of(s)
        q = SimpleNamespace(uniq=uniq, s=s, mine=mine, cached=(s >= 0) & (kind == CACHED),
                            staged=(s >= 0) & (kind == STAGED), miss=s < 0)
        if mine is not None:
            st["forwarded_rows"] += int(np.count_nonzero(t.staged_for[s[q.staged]] != mine[0]))
        tp = time.perf_counter()
        self.policy.see(self._batch, [uniq, *(rows for _, rows in self._announced)])
        self.policy.access_distinct(uniq)
        q.keep = self.policy.contains(uniq)
        evicted = np.unique(self.policy.take_evicted())  # a row may go, come back and go again in a batch
        q.evicted = evicted[~self.policy.contains(evicted)]  # ... or go and come back: its slot still holds it
        st["policy_s"] += time.perf_counter() - tp
        if mine is not None:
            self._batch += 1
        q.miss_rows, q.held = uniq[q.miss], s[s >= 0]
        q.generation = self._generation
        q.t_fallback = time.perf_counter()
        return q

    def _stage_misses(self, rows, run_device, take):
        """Without the lock: the fallback's ``rows`` staged through the tier contract (mapped for a GPU
        gather), in the slots' words."""
        staged = self.fallback.stage(rows, take, mapped=run_device.type == "cuda")
        if self._words.same:
            return staged
        return Staged(staged.flat.view(self._words.dtype), staged.offsets * self._words.ratio)

    def _gather(self, q, inv, staged, out, run_device):
        """The fused gather: rows in slots from the slot table, misses from the fallback's staging, into
        ``out`` where it lives on ``run_device``, else a new tensor there."""
        where_u = np.where(q.s >= 0, q.s, 0).astype(np.int64)
        where_u[q.miss] = flat_where(staged.offsets)
        where = torch.from_numpy(where_u[inv])  # checked on the CPU, then sent to run_device without a sync
        direct = out if out is not None and out.device == run_device else None
        if self._words.same:
            return gather_tiered(self._rows, staged.flat, where, out=direct, device=run_device)
        result = direct if direct is not None else torch.empty((inv.shape[0], *self.row_shape), dtype=self.dtype,
                                                                device=run_device)
        words = result.reshape(inv.shape[0], self._row_elems).view(self._words.dtype)
        gather_tiered(self._rows, staged.flat, where, out=words, device=run_device)  # the rows' bytes, in words
        return result

    def _after_gather(self, q, inv, staged):
        """A hook after each fused gather (under the lock): a device cache counts what crossed PCIe."""

    def _admit(self, q, staged):
        """After the gather (a slot read above may be given to another row now): evicted rows go, rows the
        policy holds now change kind or are copied in, and the batch's staged rows are released."""
        if q.generation != self._generation:  # resized meanwhile: the policy that answered is gone
            q.evicted = q.evicted[~self.policy.contains(q.evicted)]
            q.keep = self.policy.contains(q.uniq)
        self._evict(q.evicted)
        t = self._table
        promote = q.keep & q.staged
        if promote.any():
            # Only a row still in the slot it was staged in: another reader may have freed that slot
            # meanwhile, and the row may be in flight in another now (read ahead or warmed), which only
            # its reader may settle.  The query's slots stay pinned until the gather, so a slot that
            # still holds the row is the one the query saw.
            rows, was = q.uniq[promote], q.s[promote]
            cur = t.slot[rows]
            same = cur == was
            same[same] = t.kind[cur[same]] == STAGED
            t.kind[cur[same]] = CACHED
        new = q.keep & q.miss
        if new.any():
            # among the misses, in flat's order; not those a concurrent reader gave a slot meanwhile
            pos = np.flatnonzero(new[q.miss] & (t.slot[q.miss_rows] == NONE))
            slots = t.claim(pos.shape[0])  # fewer only while a warm's rows are in flight that the policy let go
            pos = pos[:slots.shape[0]]
            if slots.size:
                fill_slots(self._rows, slots, staged.flat, staged.offsets[pos])  # one copy, staging -> slots
                t.place(q.miss_rows[pos], slots, CACHED)
        if q.mine is not None:
            self._release(q.mine[1])

    def _count(self, q, inv):
        st = self._stats
        st["reads"] += 1
        st["rows"] += int(inv.shape[0])
        st["hit_rows"] += int(q.cached.sum())
        st["staged_rows"] += int(q.staged.sum())
        st["miss_rows"] += int(q.miss.sum())
        st["passthrough_rows"] += int((q.miss & ~q.keep).sum())
        st["demand_bytes"] += int(q.miss.sum()) * self.row_nbytes
        st["batches_over_capacity"] += q.uniq.shape[0] > self.capacity_rows

    def _read_into(self, rows, out):
        """Staging for a cache above this one (the default :meth:`_stage`): hits from slots, misses through
        this cache's own fallback, read on the caller's thread (it waits for them anyway)."""
        self._this_process()
        cpu = torch.device("cpu")
        self._read(rows, out, cpu, cpu)

    # ------------------------------------------------------------ slots
    def _evict(self, rows):
        """Rows the policy evicted: their slots go free, or stay staged for an announced batch."""
        if not rows.size:
            return
        t = self._table
        rows, s = t.slotted(rows)
        ok = t.kind[s] == CACHED
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
        t = self._table
        rows, s = t.slotted(rows)
        gone = (t.kind[s] == STAGED) & ~self._announced.still_wanted(rows)
        self._free_slots(rows[gone], s[gone])

    def _free_slots(self, rows, slots):
        if rows.size:
            t = self._table
            t.free_slots(rows, slots)
            if t.limit < t.size:
                self._release_slots(t.take_newly_parked())
            self._lock.notify_all()

    # --------------------------------------------------------- read-ahead
    def _next_task(self):
        """Under the lock, for the read-ahead thread: the next chunk, rows of the oldest announced batch that
        no slot holds and free slots for them (marked in flight); None when there is nothing to do, no
        free slot, or a demand read waits."""
        t = self._table
        room = min(t.free_count, self.staging_rows - t.count(STAGED))
        if self._demand or room <= 0:
            return None
        budget = max(1, _CHUNK_BYTES // max(self.row_nbytes, 1))
        for j, rows in self._announced:
            # rows in a slot already (cached, or staged for an earlier batch) are shared, not read again,
            # and rows a demand read is reading now (READING) are not read twice
            want = rows[t.slot[rows] == NONE]
            if not want.size:
                continue
            want = want[:min(want.shape[0], budget, room)]
            slots = t.claim(want.shape[0])
            t.place(want, slots, INFLIGHT, j)
            return want, slots
        return None

    def _read_ahead(self, task):
        """The read-ahead thread's chunk, without the lock: read it in, then mark it staged."""
        rows, slots = task
        t0 = time.perf_counter()
        self._fill(rows, slots, self._ahead_take)
        with self._lock:
            self._table.kind[slots] = STAGED
            self._stats["ahead_s"] += time.perf_counter() - t0
            self._stats["prefetched_rows"] += rows.shape[0]
            self._stats["prefetch_bytes"] += rows.shape[0] * self.row_nbytes
            self._release(rows)  # rows whose batch was read (or dropped) while they were in flight: free now
            self._lock.notify_all()

    def _fill(self, rows, slots, take):
        """Read the fallback's ``rows`` into ``slots`` (claimed, marked in flight) through the buffer ``take``
        gives, in one copy, staging -> slots; a failure gives the slots back and raises."""
        try:
            staged = self._stage_misses(rows, self._rows.device, take)  # mapped for a GPU's slots
            fill_slots(self._rows, slots, staged.flat, staged.offsets)
            if self._rows.is_cuda:
                torch.cuda.current_stream(self._rows.device).synchronize()
        except BaseException:
            with self._lock:
                self._free_slots(rows, slots)
            raise

    def _fail(self, exc, source):
        """Record a background thread's failure (under the lock): every later read raises it."""
        exc.add_note(f"(raised on the {self.tier} cache's {source}; the cache stays failed: close it)")
        self._error = exc
        self._lock.notify_all()

    def _fail_locked(self, exc, source):
        with self._lock:
            self._fail(exc, source)

    def _raise_failure(self):
        if self._error is not None:
            raise _rethrown(self._error) from self._error

    # ------------------------------------------------------------ counters
    def stats(self):
        """Counters since open (or :meth:`reset_stats`), for this tier: a
        :class:`~directload.stores.records.CacheStats`.

        ``hit_rows`` were served from cached slots, ``staged_rows`` from rows read ahead,
        ``miss_rows`` from the fallback on demand (``passthrough_rows`` of them not kept, as a cache
        smaller than a batch must); ``hit_rate`` is hits over distinct rows read and
        ``slot_rate`` counts staged rows too.  ``prefetched_rows`` were read ahead, and
        ``ahead_s`` the read-ahead thread's seconds reading them, and
        ``forwarded_rows`` served from a slot that an earlier batch staged or a cached row kept for an
        announced batch, never read twice (``forwarded_bytes``).  ``batches_over_capacity``
        counts reads of more distinct rows than the cache holds: those pass through in part.
        ``pcie_lines`` (a device cache) are the 128-byte lines its fused gather reads zero-copy from host
        memory, as the transaction model counts them (``pcie_bytes`` = lines x 128): on a CPU machine,
        what a GPU would move.
        """
        return CacheStats(self.tier, self._counters())

    def _counters(self):
        with self._lock:
            s = dict(self._stats)
            s["cached_rows"] = self._table.count(CACHED)
            s["staged_now"] = int(np.count_nonzero(self._table.kind == STAGED))
        distinct = s["hit_rows"] + s["staged_rows"] + s["miss_rows"]
        s.update(tier=self.tier, capacity_rows=self.capacity_rows, staging_rows=self.staging_rows,
                 policy=self.policy.name, row_nbytes=self.row_nbytes,
                 hit_rate=s["hit_rows"] / distinct if distinct else 0.0,
                 slot_rate=(s["hit_rows"] + s["staged_rows"]) / distinct if distinct else 0.0,
                 forwarded_bytes=s["forwarded_rows"] * self.row_nbytes,
                 fallback_bytes=s["demand_bytes"] + s["prefetch_bytes"],
                 pcie_bytes=s["pcie_lines"] * LINE,
                 passthrough=self.capacity_rows == 0 or s["batches_over_capacity"] > 0)
        return s

    def _reset_counters(self):
        with self._lock:
            for key in self._stats:
                self._stats[key] = 0

    # ------------------------------------------------------------ lifetime
    def _close(self):
        with self._submit_lock:  # a submit in progress ends first; later ones see the cache closed
            pass
        with self._lock:
            self._lock.notify_all()
        if self._reader is not None and self._pid == os.getpid():
            on_reader = threading.current_thread() in getattr(self._reader, "_threads", ())
            self._reader.shutdown(wait=not on_reader)  # reads in flight finish first
            with self._lock:
                while self._stolen:  # ... and reads their waiters took off the queue
                    self._lock.wait(0.05)
        for worker in (self._ahead, self._warming):
            if worker is not None:
                worker.join(timeout=30)
        self._takes, self._ahead_take = [], None

    def __repr__(self):
        state = ", closed" if self._closed else ""
        return (f"{type(self).__name__}({self.fallback!r}, capacity_rows={self.capacity_rows}, "
                f"staging_rows={self.staging_rows}, policy={self.policy.name!r}{state})")


class HostCache(Cache):
    """A cache in pinned host memory (plain memory where CUDA does not run), in front of a
    :class:`~directload.stores.DiskStore` or any store; see :class:`Cache`.

    Examples
    --------
    >>> from directload.stores import TensorStore
    >>> table = torch.arange(40.0).view(20, 2)
    >>> cache = HostCache(TensorStore(table), capacity_bytes=5 * 8, policy="lru")
    >>> torch.equal(cache.read([3, 7, 3]), table[[3, 7, 3]])
    True
    >>> cache.stats()["miss_rows"], cache.read([3]).tolist(), cache.stats()["hit_rows"]
    (2, [[6.0, 7.0]], 1)
    """

    tier = "host"

    @property
    def pinned(self):
        """Whether the slots are pinned (page-locked) memory, which a node budget counts as pinned bytes too."""
        return self._alloc.kind != "host"

    def _allocate(self, slots, used):
        nbytes = slots * self.fallback.row_nbytes
        self._alloc = memory.allocate(max(nbytes, 1), pin="auto")
        raw = torch.from_numpy(memory.host_array(self._alloc)[:nbytes])
        # Touch every page used now: a first write into a slot would otherwise fault its page in during an
        # epoch (measured: filling fresh slots ran at 0.8 GB/s, a fifth of a gather's speed).
        raw[:used * self.fallback.row_nbytes].zero_()
        return raw.view(self._words.dtype).view(slots, *self._words.shape)

    def _release_slots(self, slots):
        """Give back the pages of each run of consecutive parked slots (ordinary memory only)."""
        if not slots.size:
            return
        rnb = self.row_nbytes
        cuts = np.flatnonzero(np.diff(slots) != 1) + 1
        for run in np.split(slots, cuts):
            memory.release_pages(self._alloc, int(run[0]) * rnb, (int(run[-1]) + 1) * rnb)

    def _reuse_slots(self, slots):
        self._rows[torch.from_numpy(slots)] = 0  # fault the pages in now, not during an epoch


class DeviceCache(Cache):
    """A cache in GPU memory (``device``, default the current GPU), in front of a :class:`HostCache`
    or any store.  Where CUDA does not run its slots are a separate host buffer, so every policy and
    counter works (and is tested) on a CPU machine.  See :class:`Cache`.

    Examples
    --------
    >>> from directload.stores import TensorStore
    >>> table = torch.arange(40.0).view(20, 2)
    >>> cache = DeviceCache(TensorStore(table), capacity_bytes=4 * 8, device="cpu")
    >>> torch.equal(cache.read([5, 1]), table[[5, 1]]), cache.stats()["pcie_lines"] > 0
    (True, True)
    """

    tier = "device"

    def __init__(self, fallback, capacity_bytes, policy="lookahead", *, staging_bytes=0, device=None):
        if device is None:
            device = "cuda" if torch.cuda.is_available() else "cpu"
        self._device = torch.device(device)
        if self._device.type == "cuda" and not torch.cuda.is_available():
            from directload.capabilities import usable_device

            usable_device(device)
        super().__init__(fallback, capacity_bytes, policy, staging_bytes=staging_bytes)

    def _allocate(self, slots, used):
        return torch.empty((slots, *self._words.shape), dtype=self._words.dtype, device=self._device)

    def _after_gather(self, q, inv, staged):
        """Count the 128-byte lines the aligned kernel reads zero-copy over PCIe: one per line each output row
        read from the flat tier spans (the transaction model's count, kernels.pcie_model)."""
        if not staged.offsets.size:
            return
        addr = staged.flat.data_ptr() + staged.offsets.astype(np.int64) * staged.flat.element_size()
        per_row = row_min_lines(addr, self.row_nbytes, LINE)
        self._stats["pcie_lines"] += int(per_row[_miss_index(q.miss, inv)].sum())


def _rethrown(exc):
    """A fresh exception of ``exc``'s own type, arguments and notes (an ``OSError`` stays an ``OSError``), for
    a reader to raise from ``exc``, whose traceback is the thread's; a ``RuntimeError`` naming it where its
    type cannot be built again from its arguments."""
    try:
        clone = copy.copy(exc)
    except Exception:  # noqa: BLE001 - an exception type whose constructor takes other arguments
        notes = " ".join(getattr(exc, "__notes__", ()))
        return RuntimeError(f"{exc!r} {notes}".strip())
    clone.__traceback__ = clone.__cause__ = clone.__context__ = None
    return clone
