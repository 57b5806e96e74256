"""Caches: stores in front of a slower store, that keep the rows a policy chooses and stage the rows the
next batches will read.

Three parts: a :class:`~directload.stores.slotcache.SlotCache` says which row is in which *slot* (*cached*,
kept by the policy, or *staged*, read ahead for an announced batch); a
:class:`~directload.stores.slot_memory.SlotMemory` holds the slots (GPU memory: :class:`DeviceCache`; pinned
host memory: :class:`HostCache`); :class:`CachedStore` reads, in one fused gather from slots and staging.

Look-ahead I/O (G10, SSDTrain): a thread reads each announced batch's rows into free slots, as far ahead as
they allow; demand reads go first, and a row in a slot or in flight is never read twice (``forwarded_bytes``).
A batch larger than the free slots is staged in part; a cache of no slots passes every read through.
"""

from __future__ import annotations

import os
import threading
import time
from typing import TYPE_CHECKING

import numpy as np
import torch

from directload.errors import DirectloadError
from directload.kernels.devices import memory_of
from directload.kernels.operands import row_words
from directload.kernels.tiered import fill_slots, flat_where, gather_tiered
from directload.units import check_bytes

from . import warming as _warming_rounds
from .base import FeatureStore
from .cache_counters import CacheCounters
from .held import Fence, ReadBuffer, Workspace
from .policies import POLICY_NAMES, make_policy
from .readahead import Worker
from .readers import ReaderPool
from .reads import as_index, deliver
from .records import CacheStats, Staged
from .slot_memory import DeviceSlots, HostSlots, SlotMemory
from .slotcache import SlotCache
from .warming import WARM_BYTES, Warming, distinct_prefix
from .wrapper import WrapperStore

if TYPE_CHECKING:
    from .policies import PolicySpec
    from .reads import Ids

__all__ = ["CachedStore", "HostCache", "DeviceCache", "WarmingBusyError",
           "Cache", "make_policy", "POLICY_NAMES"]  # the last 3: old names

# The read-ahead reads at most this much between checks for demand.  Measured on synth-ooc's first epoch:
# 4 MiB chunks read 40% fewer rows ahead than 16 MiB (more per-chunk overhead, so demand reads caught up);
# 16 MiB keeps a demand read's wait for the chunk in flight near 50 ms on this disk.
_CHUNK_BYTES = 16 << 20
_POOLED = 4  # demand buffers kept for reuse (one per reader in flight; more readers allocate their own)




class _Done:
    """Where a cache read's GPU work ends, set by the read and ordered after by its waiters."""

    fence: Fence | None = None

    def order(self) -> None:
        fence = self.fence
        if fence is not None:
            fence.order()

class WarmingBusyError(DirectloadError, RuntimeError):
    """:meth:`CachedStore.warm` was called while the cache is still warming from an earlier call: one warm at
    a time (``wait()`` on the earlier one first).

    Examples
    --------
    >>> issubclass(WarmingBusyError, RuntimeError)
    True
    """

class CachedStore(WrapperStore[FeatureStore]):
    """A cache in front of ``fallback``, its slots in ``slot_memory``; see the module's docstring.  Use
    :class:`HostCache` or :class:`DeviceCache`.

    A read is a query of the slots, the misses staged by the fallback (:meth:`FeatureStore.stage`), one
    fused gather, and the kept misses admitted into slots; it runs on a reader thread, so ``read_async``
    returns at once.

    Parameters
    ----------
    fallback : FeatureStore
        The slower store, one that declares ``"stage"`` (any but a collective one: ``TypeError``).  Its rows
        must not change while the cache is open.
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
    slot_memory : SlotMemory
        Where the slots live.

    Examples
    --------
    >>> from directload.stores import TensorStore
    >>> cache = HostCache(TensorStore(torch.arange(8.0).view(4, 2)), capacity_bytes=16)
    >>> isinstance(cache, CachedStore), cache.capacity_rows, cache.read([1]).tolist()
    (True, 2, [[2.0, 3.0]])
    """

    tier = "cache"
    record_type = CacheStats
    capabilities = frozenset({"stage", "warm", "resize"})  # of directload.stores.base.CAPABILITIES
    _counts: CacheCounters

    def __init__(self, fallback: FeatureStore, capacity_bytes: int | str, policy: PolicySpec = "lookahead", *,
                 staging_bytes: int | str = 0, room_bytes: int | str | None = None,
                 slot_memory: SlotMemory | None = None) -> None:
        super().__init__(fallback, name="fallback")
        fallback.check_capability("stage")  # a collective store under a cache: each rank would read its own misses
        capacity_bytes = check_bytes("capacity_bytes", capacity_bytes)
        staging_bytes = check_bytes("staging_bytes", staging_bytes)
        room_bytes = capacity_bytes if room_bytes is None else check_bytes("room_bytes", room_bytes)
        if room_bytes < capacity_bytes:
            raise ValueError(f"room_bytes ({room_bytes}) is less than capacity_bytes ({capacity_bytes})")
        if not isinstance(slot_memory, SlotMemory):
            raise TypeError(f"slot_memory must be a SlotMemory, not {type(slot_memory).__name__}")
        self.slot_memory, self.tier = slot_memory, slot_memory.tier
        self._row_nbytes = rnb = fallback.row_nbytes  # the fallback's rows must not change while the cache is open
        n = fallback.num_rows
        rows_of = (lambda nbytes: min(n, nbytes // rnb)) if rnb else (lambda nbytes: 0)
        capacity, staging, room = rows_of(capacity_bytes), rows_of(staging_bytes), rows_of(room_bytes)
        # Slots hold rows in the words the kernels move (complex128 rows as their bytes, in 8-byte words).
        self._words = row_words(fallback.dtype, fallback.row_shape)
        self._row_elems = int(np.prod(fallback.row_shape, dtype=np.int64))
        self.slots = SlotCache(n, capacity, staging=staging, room=room, policy=policy,
                               park=lambda s: slot_memory.park(self._rows, s),
                               unpark=lambda s: slot_memory.unpark(self._rows, s))
        self._rows = slot_memory.allocate(self._words, room + staging, capacity + staging)
        self._counts = CacheCounters()
        self._no_threads()

    @staticmethod
    def bytes_for(num_rows: int, row_nbytes: int, capacity_bytes: int, *, staging_bytes: int = 0,
                  room_bytes: int | None = None, policy: PolicySpec = "lookahead", batch_rows: int = 0,
                  reads: int = 1, lookahead: int = 4, warm: bool = False,
                  slots_on_host: bool = True) -> dict[str, int]:
        """At most the host bytes a cache of these sizes holds (:meth:`~directload.stores.FeatureStore.held_bytes`,
        its own, not the fallback's), before it is made: ``"slots"`` (where they are host memory), the
        ``"buffers"`` its reads stage rows in (``reads`` demand reads in flight of ``batch_rows`` rows, the
        read-ahead's chunk, a warm's round) and its ``"bookkeeping"`` (``lookahead`` batches announced).

        Examples
        --------
        >>> parts = CachedStore.bytes_for(1000, 4096, 1 << 20, staging_bytes=1 << 20, policy="lru", batch_rows=100)
        >>> parts["slots"] >> 20, parts["buffers"] >= 100 * 4096
        (2, True)
        """
        rows_of = (lambda nbytes: min(num_rows, nbytes // row_nbytes)) if row_nbytes else (lambda nbytes: 0)
        room = capacity_bytes if room_bytes is None else room_bytes
        staging, slots = rows_of(staging_bytes), rows_of(room) + rows_of(staging_bytes)
        batch = min(int(batch_rows), num_rows) * row_nbytes
        buffers = reads * ReadBuffer.size_for(batch) if batch else 0
        if staging:
            buffers += ReadBuffer.size_for(min(max(1, _CHUNK_BYTES // max(row_nbytes, 1)), staging) * row_nbytes)
        if warm:
            buffers += ReadBuffer.size_for(min(WARM_BYTES, rows_of(room) * row_nbytes))
        bookkeeping = SlotCache.bytes_for(num_rows, slots, rows_of(room), policy, batches=lookahead,
                                          batch_rows=min(int(batch_rows), num_rows))
        return {"slots": slots * row_nbytes if slots_on_host else 0, "buffers": buffers, "bookkeeping": bookkeeping}

    fallback = property(lambda self: self.inner, doc="The slower store.")
    capacity_rows = property(lambda self: self.slots.capacity_rows, doc="Rows the cache keeps now.")
    staging_rows = property(lambda self: self.slots.staging_rows, doc="Slots for rows read ahead.")
    room_rows = property(lambda self: self.slots.room_rows, doc="The most rows :meth:`resize` can grow to.")
    policy = property(lambda self: self.slots.policy, doc="The policy now (a new one after each resize).")
    row_nbytes = property(lambda self: self._row_nbytes)

    @property
    def memory(self) -> str | torch.device:
        return memory_of(self._rows)

    pinned = property(lambda self: self.slot_memory.pinned, doc="Whether the slots are pinned (a budget counts it).")

    def _threads(self):
        """This process's reader pool and read-ahead thread, started at the first use in each process."""
        if self._pid != os.getpid():
            with self._start_lock:
                self.check_open()  # closed since the caller's check: ClosedError, never a read with no readers
                if self._pid != os.getpid():
                    self._readers = ReaderPool(self.tier)
                    if self.staging_rows:
                        chunk = max(1, _CHUNK_BYTES // max(self.row_nbytes, 1))
                        self._ahead = Worker(f"directload-{self.tier}-prefetch", lambda: self.slots.claim_ahead(chunk),
                                             self._read_ahead, stopped=lambda: self._closed,
                                             on_error=lambda exc: self._fail(exc, "read-ahead thread"))
                    self._pid = os.getpid()

    def _no_threads(self):
        """No threads yet, nor buffers: they start at the first use in each process."""
        self._start_lock = threading.Lock()
        self._warming = self._readers = self._ahead = self._pid = None  # the Warming running, one at a time
        # The host buffers rows pass through: a demand read's staged misses (one per read in flight), the
        # read-ahead's chunk and a warm's round; held_memory lists them.
        self._takes, self._ahead_take, self._warm_take = Workspace(_POOLED), ReadBuffer(), None

    def _after_fork(self):
        """A forked child keeps the cached rows and nothing else; its threads start at its first use."""
        self.slots.after_fork()
        self._no_threads()

    def resize(self, capacity_bytes: int | str) -> int:
        """Hold at most ``capacity_bytes`` of cached rows from now on, between 0 and the capacity the cache
        was made with (:attr:`room_rows` rows), while reads go on.

        Shrinking evicts the rows that no longer fit and (a :class:`HostCache` of ordinary memory) gives
        their pages back; growing lets the cache fill again, under a policy holding the rows kept.  A node's
        budget (:mod:`directload.budget`) calls this as jobs come and go.  Returns the capacity in rows.

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
        return self.slots.resize(capacity_bytes // self.row_nbytes if self.row_nbytes else 0)

    def _own_memory(self):
        work = (self._ahead_take, self._warm_take)
        return (self._rows, *self._takes.arrays(), *(b.array for b in work if b is not None and b.array is not None),
                *self.fallback.held_memory())

    def _bookkeeping_bytes(self):
        return self.slots.nbytes()

    def _prefetch(self, index):
        """The loader's hint: ``index`` is the next batch it will read.  The policy sees it as the future,
        the read-ahead thread stages its rows, the fallback gets the ids this cache does not hold now."""
        self._threads()
        absent = self.slots.announce(np.unique(index.cpu().numpy().astype(np.int64, copy=False)))
        self.fallback.prefetch(absent)

    @property
    def warming(self) -> Warming | None:
        """The :class:`~directload.stores.warming.Warming` running (a :meth:`warm` in the background or on
        another thread), or None."""
        w = self._warming
        return w if w is not None and w.alive() else None

    def warm(self, ids: Ids | None = None, *, background: bool = False, progress: bool = False,
             after: Warming | None = None) -> int:
        """Fill the cache's free room with the rows ``ids``, most wanted first, before or while training:
        G10's eager prefetch "as soon as space allows", demand first, with Sentinel's packing.

        ``None`` takes the fallback's order (:meth:`~directload.stores.FeatureStore.hot_ids`: a packed disk
        store's hottest rows first, read sequentially).  Rows in a slot are skipped and nothing is evicted;
        rounds of 32 MiB yield to reads.  With ``background`` the rounds run on a thread of their own (after
        ``after``, another cache's :attr:`warming`, ends); a failure there reaches the next read, and
        :meth:`close` stops it between rounds.

        Returns the number of rows admitted (``stats()["warmed_rows"]`` counts those read in).
        """
        self.check_open()
        index = as_index(self._warm_ids(ids))
        self._check_bounds(index)
        ids = distinct_prefix(index.cpu().numpy().astype(np.int64, copy=False), self.capacity_rows, self.slots.absent)
        with self._start_lock:
            if self._warming is not None:
                raise WarmingBusyError(f"the {self.tier} cache is warming already: one warm at a time; wait for "
                                       "it first")
            rows = self.slots.plan_warm(ids)
            self._warm_take = take = ReadBuffer()  # its own, freed when it ends
            self._warming = Warming(rows, round_rows=_warming_rounds.WARM_BYTES // max(self.row_nbytes, 1),
                                    claim=self.slots.claim_warm, fill=lambda r, s: self._fill(r, s, take),
                                    settle=lambda r, s: self._counts.add(warmed_rows=self.slots.settle_warm(r, s)),
                                    row_nbytes=self.row_nbytes, name=self.tier,
                                    on_seconds=lambda seconds: self._counts.add(warm_s=seconds))
        if not background:
            try:
                self._warming.run(progress)
            finally:
                self._warm_ended()
            return int(rows.shape[0])
        try:
            self._warming.start(after=after, closed=lambda: self._closed, on_end=self._warm_ended,
                                on_error=lambda exc: self._fail(exc, "warm thread"))
        except BaseException:
            self._warm_ended()
            raise
        return int(rows.shape[0])

    def _warm_ended(self):
        self._warming = self._warm_take = None

    def _read_async(self, index, out, run_device, out_device):
        self._threads()
        ids = index.cpu().numpy().astype(np.int64, copy=True)  # the caller may reuse its ids at once
        done = _Done()
        return self._readers.submit(lambda: self._read(ids, out, run_device, out_device, done),
                                    check=self.check_open, ordered=done.order)

    def _read(self, ids, out, run_device, out_device, done=None):
        """query -> stage misses -> fused gather -> admit -> fill the admitted slots -> finish."""
        t0 = time.perf_counter()
        uniq, inv = np.unique(ids, return_inverse=True)
        inv = inv.reshape(-1)
        q = self.slots.query(uniq, on_wait=self._counts.waited)  # its slots are pinned: the gather runs unlocked
        take = self._takes.take()
        try:
            tf = time.perf_counter()
            staged = self._stage_misses(q.miss_rows, run_device, take)
            fallback_s = time.perf_counter() - tf
            result = self._gather(q, inv, staged, out, run_device)
        except BaseException:
            self.slots.abandon(q)
            raise
        placed = None
        try:
            placed = self.slots.admit(q)  # bookkeeping only: the copy into the slots runs unlocked
            self._fill_slots(placed.slots, staged, placed.at, run_device, wait=False)
        except BaseException:
            if placed is not None:
                self.slots.free(placed.rows, placed.slots)
            self.slots.finish(q)
            raise
        # The gather and the copy are launched: slots settled, unpinned.  On a GPU they may still run; a later
        # copy into these slots (a reader's, the read-ahead's, a warm's) runs after them in stream order.
        self.slots.finish(q, placed)
        rows = deliver(result, out, out_device)
        fence = Fence.after(run_device, self._rows.device)  # where this read's GPU work ends
        self._takes.give(take, fence)  # its next user waits for the fence before staging into it
        if done is not None:
            done.fence = fence
        self._counts.add_read(q, inv.shape[0], self.row_nbytes, self.capacity_rows)
        self._counts.add(fallback_s=fallback_s, pcie_lines=self.slot_memory.pcie_lines(staged, q.miss, inv),
                           read_s=time.perf_counter() - t0)
        return rows

    def _fill_slots(self, slots, staged, at, run_device=None, wait=True):
        """The one copy into slots, outside the slot cache's lock: staged rows ``at`` (positions in ``staged``)
        into ``slots``; with ``wait``, then one sync of the slots' GPU and ``run_device`` (a read's gather),
        after which the staging is free for reuse (the read-ahead's and a warm's single buffers; a read
        gives its buffer back with a :class:`Fence` instead)."""
        if slots.size:
            fill_slots(self._rows, slots, staged.flat, staged.offsets[at])
        if not wait:
            return
        slots_on = self._rows.device
        if slots_on.type == "cuda":
            torch.cuda.current_stream(slots_on).synchronize()
        if run_device is not None and run_device.type == "cuda" and run_device != slots_on:
            torch.cuda.current_stream(run_device).synchronize()

    def _stage_misses(self, rows, run_device, take):
        """The fallback's ``rows`` staged by the tier contract (mapped for a GPU gather), in the slots' words."""
        if not rows.size:
            return Staged(torch.empty(0, dtype=self._words.dtype), np.empty(0, np.int64))
        staged = self.fallback.stage(rows, take, mapped=run_device.type == "cuda")
        if self._words.same:
            return staged
        return Staged(staged.flat.view(self._words.dtype), staged.offsets * self._words.ratio)

    def _gather(self, q, inv, staged, out, run_device):
        """The fused gather from slots and staging, into ``out`` where it is on ``run_device``, else a new tensor."""
        where_u = np.where(q.slots >= 0, q.slots, 0).astype(np.int64)
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

    def _stage(self, rows, into, mapped):
        """Staging for a cache above this one: hits from slots, misses through this cache's own fallback,
        read into ``into`` on the caller's thread (it waits for them anyway)."""
        n, cpu = rows.shape[0], torch.device("cpu")
        flat = torch.from_numpy(into(max(n * self.row_nbytes, 1))[:n * self.row_nbytes]).view(self.dtype)
        self._read(rows, flat.view(n, *self.row_shape), cpu, cpu)
        return Staged(flat, np.arange(n, dtype=np.int64) * self._row_elems)

    def _read_ahead(self, task):
        """The read-ahead thread's chunk: read it in, then mark it staged."""
        rows, slots = task
        t0 = time.perf_counter()
        self._fill(rows, slots, self._ahead_take)
        self.slots.settle_ahead(rows, slots)
        self._counts.add(ahead_s=time.perf_counter() - t0, prefetched_rows=rows.shape[0],
                           prefetch_bytes=rows.shape[0] * self.row_nbytes)

    def _fill(self, rows, slots, take):
        """Read the fallback's ``rows`` into the claimed ``slots`` through the buffer ``take`` gives, in one
        copy, staging -> slots (:meth:`_fill_slots`); a failure gives the slots back and raises."""
        try:
            staged = self._stage_misses(rows, self._rows.device, take)  # mapped for a GPU's slots
            self._fill_slots(slots, staged, np.arange(rows.shape[0]))
        except BaseException:
            self.slots.free(rows, slots)
            raise

    def _fail(self, exc, source):
        """A background thread's failure: every later read raises it."""
        exc.add_note(f"(raised on the {self.tier} cache's {source}; the cache stays failed: close it)")
        self.slots.fail(exc)

    def _counters(self):
        """This tier's counters, the record of :meth:`stats` (a :class:`~directload.stores.records.CacheStats`,
        which says what each means)."""
        return {**self._counts.report(capacity_rows=self.capacity_rows, staging_rows=self.staging_rows,
                                      policy=self.policy.name, row_nbytes=self.row_nbytes, **self.slots.counts()),
                "tier": self.tier}

    def _close(self):
        self.slots.close()
        if self._readers is not None and self._pid == os.getpid():
            self._readers.close()  # reads in flight finish first
        for worker in (self._ahead, self._warming):
            if worker is not None:
                worker.join(timeout=30)
        self._takes.release()
        self._ahead_take.release()

    def __repr__(self):
        state = ", closed" if self._closed else ""
        return (f"{type(self).__name__}({self.fallback!r}, capacity_rows={self.capacity_rows}, "
                f"staging_rows={self.staging_rows}, policy={self.policy.name!r}{state})")


class HostCache(CachedStore):
    """A cache in pinned host memory (plain memory where CUDA does not run), in front of a
    :class:`~directload.stores.DiskStore` or any store; see :class:`CachedStore`.

    Examples
    --------
    >>> from directload.stores import TensorStore
    >>> table = torch.arange(40.0).view(20, 2)
    >>> cache = HostCache(TensorStore(table), capacity_bytes=5 * 8, policy="lru")
    >>> torch.equal(cache.read([3, 7, 3]), table[[3, 7, 3]])
    True
    >>> cache.stats()["host"]["miss_rows"], cache.read([3]).tolist(), cache.stats()["host"]["hit_rows"]
    (2, [[6.0, 7.0]], 1)
    """

    tier = "host"

    def __init__(self, fallback: FeatureStore, capacity_bytes: int | str, policy: PolicySpec = "lookahead", *,
                 staging_bytes: int | str = 0, room_bytes: int | str | None = None) -> None:
        super().__init__(fallback, capacity_bytes, policy, staging_bytes=staging_bytes, room_bytes=room_bytes,
                         slot_memory=HostSlots())


class DeviceCache(CachedStore):
    """A cache in GPU memory (``device``, default the current GPU), in front of a :class:`HostCache`
    or any store.  Where CUDA does not run its slots are a separate host buffer, so every policy and
    counter works (and is tested) on a CPU machine.  See :class:`CachedStore`.

    Examples
    --------
    >>> from directload.stores import TensorStore
    >>> table = torch.arange(40.0).view(20, 2)
    >>> cache = DeviceCache(TensorStore(table), capacity_bytes=4 * 8, device="cpu")
    >>> torch.equal(cache.read([5, 1]), table[[5, 1]]), cache.stats()["device"]["pcie_lines"] > 0
    (True, True)
    """

    tier = "device"

    def __init__(self, fallback: FeatureStore, capacity_bytes: int | str, policy: PolicySpec = "lookahead", *,
                 staging_bytes: int | str = 0, device: torch.device | str | None = None) -> None:
        super().__init__(fallback, capacity_bytes, policy, staging_bytes=staging_bytes,
                         slot_memory=DeviceSlots(device))


Cache = CachedStore  # the former name
