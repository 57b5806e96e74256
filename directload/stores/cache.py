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
import os
import threading
import time
from collections import deque

import numpy as np
import torch
from tqdm.auto import tqdm

from directload import memory
from directload.kernels.carriers import ELEMENT_SIZES
from directload.kernels.devices import MAPPED, memory_of
from directload.kernels.indexing import LINE
from directload.kernels.pcie_model import row_min_lines
from directload.kernels.tiered import fill_slots, flat_where, gather_tiered
from directload.units import check_bytes

from .base import FeatureStore, ReadFuture, _as_index
from .policies import POLICIES, LookAhead, Policy

__all__ = ["Cache", "HostCache", "DeviceCache", "make_policy", "POLICY_NAMES"]

#: Policy names a cache takes (or pass a Policy, or a callable ``capacity -> Policy``).
POLICY_NAMES = ("lookahead", *POLICIES)

_FREE, _CACHED, _STAGED, _INFLIGHT = 0, 1, 2, 3
_AHEAD_MAX = 256  # announced batches remembered at most (a loader that stops reading cannot grow it)
# The read-ahead reads at most this much between checks for demand.  Measured on synth-ooc's first epoch:
# 4 MiB chunks read 40% fewer rows ahead than 16 MiB (more per-chunk overhead, so demand reads caught up);
# 16 MiB keeps a demand read's wait for the chunk in flight near 50 ms on this disk.
_CHUNK_BYTES = 16 << 20
_MATCH_SCAN = 16  # announced batches a read is compared with
_PAGE = 4096
# warm() reads this much per round: a packed file's hot rows are contiguous, so a round is a few hundred
# merged 128 KiB reads, and it fits a disk store's one-round staging (64 MiB by default).
_WARM_BYTES = 32 << 20


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


def _page_aligned(nbytes):
    """``nbytes`` of host memory starting on a page (O_DIRECT reads land in it): pinned where CUDA runs."""
    raw = memory.host_array(memory.allocate(nbytes + _PAGE, pin="auto"))
    start = (-raw.ctypes.data) % _PAGE
    return raw[start:start + nbytes]


class _Staging:
    """A buffer a fallback reads rows into (a ``take`` for :meth:`FeatureStore._stage`): page-aligned,
    pinned where CUDA runs, grown at least twofold, never shrunk.  One per reader at a time."""

    def __init__(self):
        self.array = None

    def __call__(self, nbytes):
        if self.array is None or self.array.nbytes < nbytes:
            old = 0 if self.array is None else self.array.nbytes
            self.array = None  # the old buffer goes before the new one is allocated
            self.array = _page_aligned(max(nbytes, 2 * old, 1 << 16))
        return self.array


_POOLED = 4  # demand buffers kept for reuse (one per reader in flight; more readers allocate their own)


class Cache(FeatureStore):
    """A cache in front of ``fallback``; see the module's docstring.  Use :class:`HostCache` or
    :class:`DeviceCache`.

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
    """

    tier = "cache"

    def __init__(self, fallback, capacity_bytes, policy="lookahead", *, staging_bytes=0):
        super().__init__()
        if not isinstance(fallback, FeatureStore):
            raise TypeError(f"fallback must be a directload FeatureStore, not {type(fallback).__name__}")
        fallback._check_open()
        capacity_bytes = check_bytes("capacity_bytes", capacity_bytes)
        staging_bytes = check_bytes("staging_bytes", staging_bytes)
        self.fallback = fallback
        rnb, n = fallback.row_nbytes, fallback.num_rows
        self.capacity_rows = min(n, capacity_bytes // rnb) if rnb else 0
        self.staging_rows = min(n, staging_bytes // rnb) if rnb else 0
        self.policy = make_policy(policy, self.capacity_rows)
        self._row_elems = int(np.prod(fallback.row_shape, dtype=np.int64))
        slots = self.capacity_rows + self.staging_rows
        # Slots hold rows in the dtype the kernels move (1, 2, 4 or 8-byte elements); rows of wider
        # elements (complex128) are kept, staged and gathered as their bytes, in 8-byte (or 1-byte) words.
        elem = torch.empty(0, dtype=fallback.dtype).element_size()
        self._carrier = None
        self._ratio = 1
        self._slot_dtype, self._slot_shape = fallback.dtype, tuple(fallback.row_shape)
        if elem not in ELEMENT_SIZES:
            self._carrier = torch.int64 if elem % 8 == 0 else torch.uint8
            self._ratio = elem // torch.empty(0, dtype=self._carrier).element_size()
            self._slot_dtype, self._slot_shape = self._carrier, (rnb // (elem // self._ratio),)
        self._rows = self._allocate(slots)
        self._slot = np.full(n, -1, np.int32 if slots < 2 ** 31 else np.int64)  # row -> slot
        self._until = np.full(n, -1, np.int64)  # row -> last announced batch that reads it
        self._kind = np.zeros(slots, np.int8)
        self._staged_for = np.full(slots, -1, np.int64)  # slot -> the batch it was read ahead for (-2: kept)
        self._pinned = np.zeros(slots, np.int32)  # readers reading each slot while they wait for I/O
        self._deferred = []  # slots freed while pinned: free once no reader holds them
        self._free = list(range(slots - 1, -1, -1))
        self._lock = threading.Condition()
        self._ahead = deque()  # (batch number, distinct ids) announced and not yet read
        self._announced = 0
        self._batch = 0  # reads matched to announced batches so far (the policy's clock)
        self._demand = 0  # demand reads waiting: the prefetch thread yields to them
        self._error = None
        self._warmer = None
        self._warming = False  # one warm at a time
        self._takes = []  # demand buffers not in use: each read with misses takes one while it reads
        self._ahead_take = _Staging()  # the read-ahead thread's own
        self._stats = dict.fromkeys(("reads", "rows", "hit_rows", "staged_rows", "miss_rows", "passthrough_rows",
                                     "prefetched_rows", "forwarded_rows", "inflight_waits", "batches_over_capacity",
                                     "demand_bytes", "prefetch_bytes", "read_s", "wait_s", "fallback_s",
                                     "policy_s", "ahead_s", "pcie_lines", "warmed_rows", "warm_s"), 0)
        self._thread = None
        self._pid = os.getpid()
        self._start_reader()

    def _start_reader(self):
        """The read-ahead thread of this process (none without staging slots)."""
        if self.staging_rows:
            self._thread = threading.Thread(target=self._prefetch_loop, name=f"directload-{self.tier}-prefetch",
                                            daemon=True)
            self._thread.start()

    def _after_fork(self):
        """A forked child keeps the cached rows and nothing else: the parent's read-ahead and warm threads
        did not come along (their slots would wait for ever), nor the reads in flight on its threads,
        and its announced batches are its loader's, not the child's.  Fresh locks; the read-ahead
        thread starts again at the child's first hint or read."""
        self._lock = threading.Condition()
        keep = self._kind == _CACHED
        mapped = self._slot >= 0
        drop = np.zeros(self._slot.shape[0], np.bool_)
        drop[mapped] = ~keep[self._slot[mapped]]
        self._slot[drop | (self._slot == -2)] = -1  # rows of dropped slots, and demand reads in flight
        self._kind[~keep] = _FREE
        self._staged_for[:] = -1
        self._until[:] = -1
        self._pinned[:] = 0
        self._deferred = []
        self._free = np.flatnonzero(~keep)[::-1].tolist()
        self._ahead.clear()
        self._demand = 0
        self._warming, self._warmer, self._thread = False, None, None
        self._takes, self._ahead_take = [], _Staging()
        self._pid = None  # the reader starts at the first use

    def _this_process(self):
        if self._pid != os.getpid():
            with self._lock:
                if self._pid != os.getpid():
                    self._pid = os.getpid()
                    if not self._closed:
                        self._start_reader()

    # ---------------------------------------------------------------- shape
    @property
    def num_rows(self):
        return self.fallback.num_rows

    @property
    def row_shape(self):
        return self.fallback.row_shape

    @property
    def dtype(self):
        return self.fallback.dtype

    @property
    def memory(self):
        return memory_of(self._rows)

    def _allocate(self, slots):
        raise NotImplementedError

    def _own_memory(self):
        return (self._rows, *self.fallback._own_memory())

    # ----------------------------------------------------------- prefetch
    def _prefetch(self, index):
        """The loader's hint: ``index`` is the next batch it will read (after those announced before).

        The policy sees it as the future; the read-ahead thread stages its rows; the fallback gets
        the ids this cache does not hold now."""
        self._this_process()
        rows = np.unique(index.cpu().numpy().astype(np.int64, copy=False))
        with self._lock:
            self._raise_failure()
            j = self._announced
            self._announced += 1
            self._ahead.append((j, rows))
            while len(self._ahead) > _AHEAD_MAX:
                self._drop(self._ahead.popleft())
            self._until[rows] = np.maximum(self._until[rows], j)
            absent = rows[self._slot[rows] < 0]
            self._lock.notify_all()
        self.fallback.prefetch(absent)

    def hot_ids(self):
        return self.fallback.hot_ids()

    def warm(self, ids=None, *, background=False, progress=False, _after=None):
        """Fill the cache's free room with the rows ``ids``, most wanted first, before or while training:
        G10's eager prefetch "as soon as space allows", demand first, with Sentinel's packing.

        ``None`` takes the fallback's own order (:meth:`~directload.stores.FeatureStore.hot_ids`): a disk
        store renumbered by :func:`~directload.stores.renumber` holds its hottest rows first, so they are
        read in long sequential reads, at the disk's bandwidth rather than its random-read rate.  Rows in
        a slot already are skipped and nothing is evicted: the policy admits the rows that fit as cached
        (:meth:`~directload.stores.policies.Policy.warm`) at once, and they are read in rounds of 32 MiB,
        each round's slots claimed as it starts.  Reads of other threads go first (a round waits while
        one waits) and find a row either cached or read on demand, never waiting for more than the round
        in flight.  With ``background`` the rounds run on a thread of their own and this returns at once;
        a failure there reaches the next read, and :meth:`close` stops it between rounds.

        Returns the number of rows admitted (read in, unless a read on demand took them first or
        ``background``: ``stats()["warmed_rows"]`` counts those read in).
        """
        self._check_open()
        index = _as_index(self._warm_ids(ids))
        self._check_bounds(index)
        ids = self._warm_candidates(index.cpu().numpy().astype(np.int64, copy=False))
        with self._lock:
            self._raise_failure()
            if self._warming:
                raise RuntimeError(f"the {self.tier} cache is warming already: one warm at a time")
            want = ids[self._slot[ids] == -1]
            want = want[:max(0, self.capacity_rows - int(np.count_nonzero(self._kind == _CACHED)))]
            keep = self.policy.warm(want)  # at once, so the policy's order among them is the one given
            self._evict(np.unique(self.policy.take_evicted()))  # none while it had room
            rows = want[keep]
            self._warming = True
        if not background:
            try:
                self._warm_rows(rows, progress)
            finally:
                self._warming = False
            return int(rows.shape[0])
        try:  # the thread clears _warming when it ends
            self._warmer = threading.Thread(target=self._warm_thread, args=(rows, _after), daemon=True,
                                            name=f"directload-{self.tier}-warm")
            self._warmer.start()
        except BaseException:
            self._warming = False
            raise
        return int(rows.shape[0])

    def _warm_candidates(self, ids):
        """The distinct ids of ``ids`` in their order, as far as needed: a prefix with at least a cache's
        worth of rows in no slot (``np.unique`` over all of a 100M-id list would take seconds)."""
        k = min(ids.shape[0], max(2 * self.capacity_rows, 1024))
        while True:
            _, first = np.unique(ids[:k], return_index=True)
            head = ids[:k][np.sort(first)]
            if k == ids.shape[0] or np.count_nonzero(self._slot[head] == -1) >= self.capacity_rows:
                return head
            k = min(ids.shape[0], 4 * k)

    def _warm_thread(self, rows, after):
        try:
            while after is not None and after.is_alive():  # a lower tier warming: its rows are this one's source
                if self._closed:
                    return
                after.join(0.05)
            self._warm_rows(rows, False)
        except BaseException as exc:  # the consumer hears of it at its next read
            with self._lock:
                self._fail(exc, "warm thread")
        finally:
            self._warming = False

    def _warm_rows(self, rows, progress):
        """Read the admitted ``rows`` into slots, a round at a time; rows a reader brought in meanwhile, or
        that the policy let go, are skipped."""
        t0 = time.perf_counter()
        step = max(1, _WARM_BYTES // max(self.row_nbytes, 1))
        take = _Staging()  # its own, freed when it returns
        try:
            with tqdm(total=rows.shape[0] * self.row_nbytes, unit="B", unit_scale=True,
                      desc=f"warming the {self.tier} cache", disable=not progress) as bar:
                for a in range(0, rows.shape[0], step):
                    with self._lock:
                        while self._demand and not self._closed:  # demand first
                            self._lock.wait(0.05)
                        if self._closed:
                            return
                        r = rows[a:a + step]
                        r = r[(self._slot[r] == -1) & self.policy.contains(r)]
                        slots = np.asarray(self._claim(min(r.shape[0], len(self._free))), np.int64)
                        r = r[:slots.shape[0]]
                        self._slot[r] = slots
                        self._kind[slots] = _INFLIGHT  # readers wait for them; the read-ahead leaves them alone
                        self._staged_for[slots] = -2
                    if r.size:
                        self._fill(r, slots, take)
                    with self._lock:
                        kept = self.policy.contains(r)  # a reader's batch may have evicted some meanwhile
                        self._kind[slots[kept]] = _CACHED
                        self._free_slots(r[~kept], slots[~kept])
                        self._stats["warmed_rows"] += int(kept.sum())
                        self._lock.notify_all()
                    bar.update(min(step, rows.shape[0] - a) * self.row_nbytes)
        finally:
            with self._lock:
                self._stats["warm_s"] += time.perf_counter() - t0

    def _drop(self, entry):
        """An announced batch that will not be read (skipped): its staged rows need not wait for it."""
        j, rows = entry
        mine = rows[self._until[rows] == j]
        self._until[mine] = -1
        self._release(mine)

    def _slotted(self, rows):
        """The rows of ``rows`` that hold a slot, and their slots."""
        s = self._slot[rows]
        ok = s >= 0
        return rows[ok], s[ok]

    def _release(self, rows):
        """Free the slots of staged rows of ``rows`` that no announced batch still needs."""
        if not rows.size:
            return
        rows, s = self._slotted(rows)
        gone = (self._kind[s] == _STAGED) & (self._until[rows] < self._next_unread())
        self._free_slots(rows[gone], s[gone])

    def _free_slots(self, rows, slots):
        if not rows.size:
            return
        self._slot[rows] = -1
        self._kind[slots] = _FREE
        busy = self._pinned[slots] > 0  # a reader still copies out of it: reuse it after that
        self._deferred.extend(slots[busy].tolist())
        self._free.extend(slots[~busy].tolist())
        self._lock.notify_all()

    def _unpin(self, slots):
        self._pinned[slots] -= 1  # slots of one read are distinct
        if self._deferred:
            done = [d for d in self._deferred if self._pinned[d] == 0]
            if done:
                self._deferred = [d for d in self._deferred if self._pinned[d] > 0]
                self._free.extend(done)

    def _kind_of(self, s):
        """The kind of each slot in ``s`` (-1: no slot, read as free)."""
        out = np.zeros(s.shape[0], np.int8)
        has = s >= 0
        out[has] = self._kind[s[has]]
        return out

    def _next_unread(self):
        return self._ahead[0][0] if self._ahead else self._announced

    # -------------------------------------------------------------- reads
    def _read_async(self, index, out, run_device, out_device):
        self._this_process()
        ids = index.cpu().numpy().astype(np.int64, copy=False)  # read now: np.unique below makes new arrays
        return ReadFuture(result=self._read(ids, out, run_device, out_device))

    def _read(self, ids, out, run_device, out_device):
        t0 = time.perf_counter()
        uniq, inv = np.unique(ids, return_inverse=True)
        inv = inv.reshape(-1)
        with self._lock:
            self._demand += 1
            try:
                self._raise_failure()
                tw = time.perf_counter()
                while True:  # rows the read-ahead thread is reading now: wait for them (forwarding)
                    s = self._slot[uniq]
                    inflight = (s >= 0) & (self._kind_of(s) == _INFLIGHT)
                    if not inflight.any():
                        break
                    self._stats["inflight_waits"] += 1
                    self._lock.wait(0.05)
                    self._raise_failure()
                self._stats["wait_s"] += time.perf_counter() - tw
                mine = self._match(uniq)  # after the wait: rows landing for it must not be released early
                result = self._serve(uniq, inv, s, out, run_device, out_device, mine)
            finally:
                self._demand -= 1
                self._lock.notify_all()
        self._stats["read_s"] += time.perf_counter() - t0
        return result

    def _match(self, uniq):
        """The announced batch this read is (its rows a subset of it), dropping the skipped ones before
        it; None for a read no one announced."""
        for k, (_, rows) in enumerate(self._ahead):
            if k == _MATCH_SCAN:
                break
            if not uniq.size:
                return None
            # a cache in front reads the rows it lacks now, a subset of what it lacked when it announced
            # the batch, give or take the rows it evicted since: most rows in common is the match
            if 2 * np.isin(uniq, rows, assume_unique=True).sum() > uniq.shape[0]:
                for _ in range(k):
                    self._drop(self._ahead.popleft())
                return self._ahead.popleft()
        return None

    def _serve(self, uniq, inv, s, out, run_device, out_device, mine):
        st = self._stats
        kind = self._kind_of(s)
        cached = (s >= 0) & (kind == _CACHED)
        staged = (s >= 0) & (kind == _STAGED)
        miss = s < 0
        if mine is not None:
            st["forwarded_rows"] += int(np.count_nonzero(self._staged_for[s[staged]] != mine[0]))
        tp = time.perf_counter()
        self.policy.see(self._batch, [uniq, *(rows for _, rows in self._ahead)])
        self.policy.access_distinct(uniq)
        keep = self.policy.contains(uniq)
        evicted = np.unique(self.policy.take_evicted())  # a row may go, come back and go again in a batch
        evicted = evicted[~self.policy.contains(evicted)]  # ... or go and come back: its slot still holds it
        st["policy_s"] += time.perf_counter() - tp
        if mine is not None:
            self._batch += 1
        # the fused gather: rows in slots from the slot table, misses from the fallback's staging
        miss_rows = uniq[miss]
        tf = time.perf_counter()
        take = None
        if miss_rows.size:
            # The demand's I/O runs without the lock, so the read-ahead thread goes on with later batches
            # (queued behind it: demand first).  Its misses are marked (-2), so no one reads them twice,
            # and the slots it reads from are pinned, so none is released under it.
            held = s[s >= 0]
            self._slot[miss_rows] = -2
            self._pinned[held] += 1  # distinct slots: a plain increment (np.add.at is ten times slower)
            # a buffer of its own until its gather is done: another reader may stage its misses meanwhile
            take = self._takes.pop() if self._takes else _Staging()
            self._demand -= 1
            self._lock.release()
            try:
                flat, offs = self._stage_misses(miss_rows, run_device, take)
            finally:
                self._lock.acquire()
                self._demand += 1
                mark = self._slot[miss_rows] == -2  # another reader may have given one a slot meanwhile
                self._slot[miss_rows[mark]] = -1
                self._unpin(held)
        else:
            flat, offs = torch.empty(0, dtype=self._slot_dtype), np.empty(0, np.int64)
        st["fallback_s"] += time.perf_counter() - tf
        where_u = np.where(s >= 0, s, 0).astype(np.int64)
        where_u[miss] = flat_where(offs)
        where = torch.from_numpy(where_u[inv]).to(run_device)
        direct = out if out is not None and out.device == run_device else None
        if self._carrier is None:
            result = gather_tiered(self._rows, flat, where, out=direct)
        else:  # the rows' bytes, in words, into the result
            result = direct if direct is not None else torch.empty((inv.shape[0], *self.row_shape),
                                                                    dtype=self.dtype, device=run_device)
            words = result.reshape(inv.shape[0], self._row_elems).view(self._carrier)
            gather_tiered(self._rows, flat, where, out=words)
        if self.tier == "device" and offs.size:
            # the 128-byte lines the aligned kernel reads zero-copy over PCIe: one per line each output
            # row read from the flat tier spans (the transaction model's count, kernels.pcie_model)
            addr = flat.data_ptr() + offs.astype(np.int64) * flat.element_size()
            per_row = row_min_lines(addr, self.row_nbytes, LINE)
            st["pcie_lines"] += int(per_row[_miss_index(miss, inv)].sum())
        # bookkeeping after the gather: a slot read above may be given to another row now
        self._evict(evicted)
        self._admit(uniq, keep, miss, staged, flat, offs)
        if mine is not None:
            self._release(mine[1])
        st["reads"] += 1
        st["rows"] += int(inv.shape[0])
        st["hit_rows"] += int(cached.sum())
        st["staged_rows"] += int(staged.sum())
        st["miss_rows"] += int(miss.sum())
        st["passthrough_rows"] += int((miss & ~keep).sum())
        st["demand_bytes"] += int(miss.sum()) * self.row_nbytes
        st["batches_over_capacity"] += uniq.shape[0] > self.capacity_rows
        if run_device.type == "cuda":
            torch.cuda.current_stream(run_device).synchronize()  # the staging buffer is the next read's
        if take is not None and len(self._takes) < _POOLED:
            self._takes.append(take)
        if out is not None:
            if out.data_ptr() != result.data_ptr():
                out.copy_(result)
            return out
        return result if result.device == out_device else result.to(out_device)

    def _stage_misses(self, rows, run_device, take):
        """The fallback's rows ``rows`` as a flat tier (1-D tensor) and their element offsets in it, read
        into ``take``'s buffer where the fallback copies them."""
        flat, offs = self.fallback._stage(rows, take)
        if run_device.type == "cuda" and memory_of(flat) != MAPPED:  # the GPU reads the flat tier zero-copy
            flat, offs = FeatureStore._stage(self.fallback, rows, take)
        return self._as_slots(flat, offs)

    def _as_slots(self, flat, offs):
        """A fallback's flat tier in the slots' words (see ``_carrier``)."""
        if self._carrier is None:
            return flat, offs
        return flat.view(self._carrier), offs * self._ratio

    def _evict(self, rows):
        """Rows the policy evicted: their slots go free, or stay staged for an announced batch."""
        if not rows.size:
            return
        rows, s = self._slotted(rows)
        ok = self._kind[s] == _CACHED
        rows, s = rows[ok], s[ok]
        still = self._until[rows] >= self._next_unread()
        # an announced batch reads it: it stays, staged (forwarded, not read twice), while staging has room
        room = max(0, self.staging_rows - int(np.count_nonzero(self._kind >= _STAGED)))
        still &= np.cumsum(still) <= room
        self._kind[s[still]] = _STAGED
        self._staged_for[s[still]] = -2
        self._free_slots(rows[~still], s[~still])

    def _admit(self, uniq, keep, miss, staged, flat, offs):
        """Rows the policy holds now that had no cache slot: staged ones change kind, misses are copied in."""
        promote = keep & staged
        if promote.any():
            cur = self._slot[uniq[promote]]
            self._kind[cur[cur >= 0]] = _CACHED  # (-1: a concurrent reader's eviction unmapped it meanwhile)
        new = keep & miss
        if not new.any():
            return
        # among the misses, in flat's order; not those a concurrent reader gave a slot meanwhile
        pos = np.flatnonzero(new[miss] & (self._slot[uniq[miss]] == -1))
        slots = self._claim(pos.shape[0])
        if len(slots) < pos.shape[0]:  # only while a warm's rows are in flight that the policy let go
            pos = pos[:len(slots)]
        rows = uniq[miss][pos]
        if not len(slots):
            return
        slots_np = np.asarray(slots, np.int64)
        fill_slots(self._rows, slots_np, flat, offs[pos])  # one copy, staging -> slots
        self._slot[rows] = slots_np
        self._kind[slots_np] = _CACHED

    def _claim(self, n):
        got = self._free[-n:] if n else []
        del self._free[len(self._free) - len(got):]
        return got[::-1]

    # --------------------------------------------------------- read-ahead
    def _prefetch_loop(self):
        try:
            while True:
                with self._lock:
                    task = None
                    while task is None:
                        if self._closed:
                            return
                        task = self._next_task()
                        if task is None:
                            self._lock.wait(0.05)
                    j, rows, slots = task
                    self._slot[rows] = slots
                    self._kind[slots] = _INFLIGHT
                    self._staged_for[slots] = j
                t0 = time.perf_counter()
                self._fill(rows, slots, self._ahead_take)
                with self._lock:
                    self._kind[slots] = _STAGED
                    self._stats["ahead_s"] += time.perf_counter() - t0
                    self._stats["prefetched_rows"] += rows.shape[0]
                    self._stats["prefetch_bytes"] += rows.shape[0] * self.row_nbytes
                    # rows whose batch was read (or dropped) while they were in flight: free now
                    self._release(rows)
                    self._lock.notify_all()
        except BaseException as exc:  # the consumer hears of it at its next read
            with self._lock:
                self._fail(exc, "read-ahead thread")

    def _fill(self, rows, slots, take):
        """Read the fallback's ``rows`` into ``slots`` (claimed, marked in flight) through the buffer ``take``
        gives, in one copy, staging -> slots; a failure gives the slots back and raises."""
        try:
            flat, offs = self._as_slots(*self.fallback._stage(rows, take))
            fill_slots(self._rows, slots, flat, offs)
            if self._rows.is_cuda:
                torch.cuda.current_stream(self._rows.device).synchronize()
        except BaseException:
            with self._lock:
                self._free_slots(rows, slots)
            raise

    def _next_task(self):
        """The next chunk to read ahead: rows of the oldest announced batch that no slot holds, and free
        slots for them; None when there is nothing to do, no free slot, or a demand read waits."""
        room = min(len(self._free), self.staging_rows - int(np.count_nonzero(self._kind >= _STAGED)))
        if self._demand or room <= 0:
            return None
        budget = max(1, _CHUNK_BYTES // max(self.row_nbytes, 1))
        for j, rows in self._ahead:
            # rows in a slot already (cached, or staged for an earlier batch) are shared, not read again,
            # and rows a demand read is reading now (-2) are not read twice
            want = rows[self._slot[rows] == -1]
            if not want.size:
                continue
            n = min(want.shape[0], budget, room)
            return j, want[:n], np.asarray(self._claim(n), np.int64)
        return None

    def _fail(self, exc, source):
        """Record a background thread's failure (under the lock): every later read raises it."""
        exc.add_note(f"(raised on the {self.tier} cache's {source}; the cache stays failed: close it)")
        self._error = exc
        self._lock.notify_all()

    def _raise_failure(self):
        if self._error is not None:
            raise _rethrown(self._error) from self._error

    # ------------------------------------------------------------ counters
    def stats(self):
        """Counters since open (or :meth:`reset_stats`), for this tier.

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
        with self._lock:
            s = dict(self._stats)
            s["cached_rows"] = int(np.count_nonzero(self._kind == _CACHED))
            s["staged_now"] = int(np.count_nonzero(self._kind == _STAGED))
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

    def reset_stats(self):
        with self._lock:
            for key in self._stats:
                self._stats[key] = 0

    # ------------------------------------------------------------ lifetime
    def _close(self):
        with self._lock:
            self._lock.notify_all()
        for thread in (self._thread, self._warmer):
            if thread is not None and thread is not threading.current_thread():
                thread.join(timeout=30)
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
    """

    tier = "host"

    def _allocate(self, slots):
        nbytes = slots * self.fallback.row_nbytes
        self._alloc = memory.allocate(max(nbytes, 1), pin="auto")
        raw = torch.from_numpy(memory.host_array(self._alloc)[:nbytes])
        # Touch every page now: a first write into a slot would otherwise fault its page in during an
        # epoch (measured: filling fresh slots ran at 0.8 GB/s, a fifth of a gather's speed).
        raw.zero_()
        return raw.view(self._slot_dtype).view(slots, *self._slot_shape)


class DeviceCache(Cache):
    """A cache in GPU memory (``device``, default the current GPU), in front of a :class:`HostCache`
    or any store.  Where CUDA does not run its slots are a separate host buffer, so every policy and
    counter works (and is tested) on a CPU machine.  See :class:`Cache`."""

    tier = "device"

    def __init__(self, fallback, capacity_bytes, policy="lookahead", *, staging_bytes=0, device=None):
        if device is None:
            device = "cuda" if torch.cuda.is_available() else "cpu"
        self._device = torch.device(device)
        if self._device.type == "cuda" and not torch.cuda.is_available():
            from directload.capabilities import usable_device

            usable_device(device)
        super().__init__(fallback, capacity_bytes, policy, staging_bytes=staging_bytes)

    def _allocate(self, slots):
        return torch.empty((slots, *self._slot_shape), dtype=self._slot_dtype, device=self._device)


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
