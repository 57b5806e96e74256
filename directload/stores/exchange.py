"""``RowExchange``: a table split across ``torch.distributed`` ranks, rows fetched from their owners by all-to-all.

Each rank holds one contiguous range of rows (:func:`~directload.stores.partition_bounds`) in its own
store.  A read sends the ids it wants to their owners and gets the rows back, three ``all_to_all_single``
steps on a process group of its own (counts, ids, rows), after a first one that checks every rank holds the
same table.  It is the ``remote`` of a :class:`~directload.stores.PartitionedStore` in a PyG job, as DGL's
KVStore is in a DistDGL one.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import TYPE_CHECKING

import numpy as np
import torch
import torch.distributed as dist

from directload.errors import DirectloadError
from directload.kernels import gather
from directload.kernels.devices import HOST

from .base import FeatureStore
from .counters import Counters
from .exchange_check import describe_table, disagreement
from .futures import ReadFuture
from .partitioned import check_bounds, owners, partition_bounds
from .reads import deliver
from .wrapper import WrapperStore

if TYPE_CHECKING:
    import numpy.typing as npt

# partition_bounds lives in .partitioned; it is importable from here as it was before.
__all__ = ["RowExchange", "ExchangeError", "partition_bounds"]

# in a forked child: the parent's groups, never destroyed here (see RowExchange._after_fork)
_stranded: list[dist.ProcessGroup | None] = []
_COUNTERS = {**dict.fromkeys(("rounds", "rows_asked", "rows_received", "duplicates_saved", "local_rows",
                               "rows_sent", "bytes_sent", "bytes_received"), 0), "seconds": 0.0}


class ExchangeError(DirectloadError, RuntimeError):
    """An exchange of rows between ranks failed: a peer died, stopped reading (a step timed out), left the
    process group, or holds a different table (dtype, row shape or bounds).  Once raised, the
    :class:`RowExchange` refuses every later read with it.

    Examples
    --------
    >>> isinstance(ExchangeError("rank 0 of 2: ..."), RuntimeError)
    True
    """


def _seconds(timeout):
    """``timeout`` (a ``timedelta`` or seconds) as positive seconds, or ``ValueError``."""
    value = timeout.total_seconds() if isinstance(timeout, timedelta) else timeout
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)) or not value > 0:
        raise ValueError(f"timeout must be a positive number of seconds or a timedelta, got {timeout!r}")
    return float(value)


def _first_line(exc):
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


class RowExchange(WrapperStore[FeatureStore]):
    """The whole table, as seen from one rank: its own rows from ``local``, every other row from its owner.

    Reads are collective: every rank of the group must make the same number of reads, in the same order
    (with no ids where it needs none, as :class:`~directload.stores.PartitionedStore` does), because each
    read is one round of all-to-all.  Rounds run on one background thread per store, in the order the
    reads were started, so the caller samples and computes meanwhile (the loaders' look-ahead).  Ids are
    sent once per owner per read (duplicates are expanded on return).  Ids of this rank's own range are
    read from ``local`` without leaving the process.

    Parameters
    ----------
    local : FeatureStore
        This rank's rows, ``bounds[rank]:bounds[rank + 1]``, in id order (memory, disk or tiers).
    bounds : sequence of int
        ``[0, end_0, ..., num_rows]``, one range per rank of the group (:func:`~directload.stores.partition_bounds`).
    group : torch.distributed.ProcessGroup, optional
        The ranks that hold the table, ranked as ``bounds`` is.  Default: a new group over every rank
        (``torch.distributed.new_group``), so its collectives never interleave with those of DDP on the
        default group; it is destroyed by :meth:`close`.
    backend : {"gloo", "nccl"}, optional
        The new group's backend: default ``"nccl"`` where ``local`` holds its rows on a GPU, else
        ``"gloo"``.  Only gloo is tested; the NCCL path moves ids and rows through the current CUDA device.
    timeout : float or datetime.timedelta
        Seconds (default 60) that one step of a round may take before :class:`ExchangeError`.
    own : bool
        Close ``local`` with this store.

    Raises
    ------
    TypeError
        ``local`` is not a directload store.
    RuntimeError
        ``torch.distributed`` is not initialised.
    ValueError
        ``bounds`` do not give one range per rank, or ``local`` is not this rank's range.

    Notes
    -----
    * **Collective construction.**  Without ``group`` every rank must construct its exchange, in the
      same order as any other ``new_group`` call (torch's rule for new groups).
    * **Memory contract.**  The result lives on ``device`` when given, else on the index's device, a new
      tensor (or ``out``); rows move between ranks in host memory (gloo) and are copied to a GPU result.
    * **One table.**  The first read starts with a step that checks every rank holds the same table: the
      same dtype, row shape and bounds.  Where they differ, every rank raises one :class:`ExchangeError`
      naming the ranks and what each holds (and raises it on every later read), never rows of one dtype
      read as another.  Rows of 0 bytes (a 0 in the row shape) are read as ``[len(ids), *row_shape]``
      without an exchange.
    * **Errors.**  Bad ids (type, shape, range) or a wrong ``out`` raise on the caller, before the round
      is queued: the peers then wait for a round that never comes and raise :class:`ExchangeError` after
      ``timeout``.  A dead or silent peer, or a failed read of ``local`` on any rank, makes every rank's
      round raise :class:`ExchangeError` from ``wait()`` within ``timeout`` per step; every later read
      raises it too.  :meth:`close` waits for a round in flight (at most ``timeout`` per step); in a
      forked child (a DataLoader worker) every read raises :class:`ExchangeError`: the group stays with
      the parent.
    * **No cache in front.**  A cache reads only its misses, a different number on each rank: put caches
      under ``local``, never over this store.  It declares no capability (:attr:`capabilities`): a cache
      over it, or over a store over it, is refused with ``TypeError``, and so is :meth:`stage`.

    Examples
    --------
    >>> import tempfile, torch.distributed as dist
    >>> from directload.stores import TensorStore, partition_bounds
    >>> rendezvous = f"file://{tempfile.mkdtemp()}/rendezvous"
    >>> dist.init_process_group("gloo", init_method=rendezvous, rank=0, world_size=1)
    >>> table = torch.arange(12.0).view(6, 2)
    >>> with RowExchange(TensorStore(table), partition_bounds(6, 1), timeout=10) as rows:
    ...     rows.read([5, 1, 5]).tolist(), rows.stats()["exchange"]["duplicates_saved"]
    ([[10.0, 11.0], [2.0, 3.0], [10.0, 11.0]], 1)
    >>> dist.destroy_process_group()
    """

    tier = "exchange"

    def __init__(self, local: FeatureStore, bounds: npt.ArrayLike | torch.Tensor, *,
                 group: dist.ProcessGroup | None = None, backend: str | None = None,
                 timeout: float | timedelta = 60.0, own: bool = False) -> None:
        super().__init__(local, own=own, name="local")
        if not dist.is_available() or not dist.is_initialized():
            raise ExchangeError("torch.distributed is not initialised: call torch.distributed.init_process_group "
                               "on every rank before making a RowExchange")
        seconds = _seconds(timeout)
        bounds = check_bounds(bounds)
        gpu = isinstance(local.memory, torch.device) and local.memory.type == "cuda"
        if backend is not None and backend not in ("gloo", "nccl"):
            raise ValueError(f"backend must be 'gloo' or 'nccl', got {backend!r}")
        if group is not None and backend is not None:
            raise ValueError("pass group or backend, not both: a given group has its backend")
        world = dist.get_world_size(group) if group is not None else dist.get_world_size()
        if bounds.size != world + 1:
            raise ValueError(f"bounds give {bounds.size - 1} partitions, but the group has {world} ranks")
        rank = dist.get_rank(group) if group is not None else dist.get_rank()
        start, end = int(bounds[rank]), int(bounds[rank + 1])
        if local.num_rows != end - start:
            raise ValueError(f"rank {rank} owns {end - start} rows ({start}:{end}), but the local store has "
                             f"{local.num_rows}")
        self._made_group = group is None
        if group is None:
            group = dist.new_group(backend=backend or ("nccl" if gpu else "gloo"), timeout=timedelta(seconds=seconds))
        self._nccl = dist.get_backend(group) == "nccl"
        self._wire = torch.device("cuda", torch.cuda.current_device()) if self._nccl else torch.device("cpu")
        self.bounds, self.group = bounds, group
        self.rank, self.world_size, self.timeout = rank, world, seconds
        self._start, self._end = start, end
        self._worker: ThreadPoolExecutor | None = ThreadPoolExecutor(1, thread_name_prefix="directload-exchange")
        # The tensors of the last steps, held until the group is gone: gloo's threads release a finished step's
        # tensors a moment after wait() returns, and a tensor whose last reference they drop needs the GIL,
        # which close() holds while torch joins those threads (a deadlock seen with torch 2.2).
        self._in_flight: deque[tuple[torch.Tensor, torch.Tensor]] = deque(maxlen=9)
        self._lock = threading.Lock()  # numbers and queues rounds
        self._rounds = 0  # rounds started, numbered in the errors
        self._error: ExchangeError | None = None
        self._agreed = False  # the ranks found to hold the same table (the first round's check step)
        self._counts = Counters(_COUNTERS)

    local = property(lambda self: self.inner, doc="This rank's rows, in id order from ``bounds[rank]``.")

    @property
    def capabilities(self) -> frozenset[str]:
        """None: its reads are collective (every rank reads at every step), so no cache may sit over it."""
        return frozenset()

    @property
    def num_rows(self) -> int:
        return int(self.bounds[-1])

    @property
    def memory(self) -> str | torch.device:
        return self._wire if self._nccl else HOST

    # ----------------------------------------------------------------- reads
    def _check_usable(self):
        if self._error is not None:
            raise ExchangeError(str(self._error)) from self._error

    def _read_async(self, index, out, run_device, out_device):
        self._check_usable()
        ids = index.cpu().numpy().astype(np.int64, copy=False)
        with self._lock:  # numbered and queued together: rounds run in the order reads started
            self.check_open()  # closed since read_async's check (by another thread): ClosedError, never a shut queue
            self._rounds += 1
            future = self._worker.submit(self._round, ids, self._rounds)
        return ReadFuture(lambda: deliver(future.result(), out, out_device), done=future.done)

    def _round(self, ids, number):
        """One round of the exchange (on the store's thread): this rank's rows at ``ids``."""
        self._check_usable()
        t0 = time.perf_counter()
        if not self._agreed:
            self._agree(number)
        rnb, world = self.row_nbytes, self.world_size
        uniq, inverse = np.unique(ids, return_inverse=True)  # sorted, so grouped by owner in rank order
        owner = owners(self.bounds, uniq)
        lo, hi = (int(i) for i in np.searchsorted(owner, [self.rank, self.rank + 1]))
        if not rnb:  # every rank's rows are 0 bytes (the check step said so): nothing to exchange
            self._count(ids, uniq.size, hi - lo, 0, 0, t0)
            return torch.empty((ids.size, *self.row_shape), dtype=self.dtype)
        mine = self.local.read_async(torch.from_numpy(uniq[lo:hi] - self._start)) if hi > lo else None
        want = np.concatenate([uniq[:lo], uniq[hi:]])
        counts = np.bincount(owner, minlength=world).astype(np.int64)
        counts[self.rank] = 0
        try:
            asked_counts = self._step(number, "counts", torch.from_numpy(counts), [1] * world, [1] * world)
            theirs = asked_counts.tolist()
            asked = self._step(number, "ids", torch.from_numpy(want), counts.tolist(), theirs)
            served = self._serve(asked.numpy())
            got = self._step(number, "rows", served.reshape(-1), [c * rnb for c in theirs],
                             [c * rnb for c in counts.tolist()])
        except ExchangeError as exc:
            self._error = self._error or exc
            raise
        except Exception as exc:  # the local store failed while serving: the peers time out
            self._error = self._error or ExchangeError(f"rank {self.rank} of {world}: exchange round {number} "
                                                       f"failed serving rows: {_first_line(exc)}")
            raise self._error from exc
        # the distinct rows: the peers' as received (ids below this rank's range, then above), then this rank's
        rows = got.view(want.size, rnb)
        inverse = inverse.reshape(-1)
        if mine is not None:
            rows = torch.cat([rows, _bytes(mine.wait(), rnb)])
            inverse = np.where(inverse < lo, inverse, np.where(inverse >= hi, inverse - (hi - lo),
                                                               inverse - lo + want.size))
        # torch's advanced indexing of uint8 rows took 20 ms for 20,000 ids of 512 B where this takes 1 ms
        result = gather(rows, torch.from_numpy(inverse)).view(self.dtype).view(ids.size, *self.row_shape)
        self._count(ids, uniq.size, hi - lo, want.size, asked.numel(), t0)
        return result

    def _agree(self, number):
        """The first round's first step: every rank's table
        (:func:`~directload.stores.exchange_check.describe_table`) to every other, the same size from each;
        one :class:`ExchangeError` on every rank where they differ, latched as any other."""
        world = self.world_size
        mine = describe_table(self.dtype, self.row_shape, self.bounds)
        try:
            every = self._step(number, "check", torch.from_numpy(np.tile(mine, world)), [mine.size] * world,
                               [mine.size] * world)
        except ExchangeError as exc:
            self._error = self._error or exc
            raise
        said = disagreement(every.view(world, mine.size).numpy())
        if said is not None:
            self._error = ExchangeError(f"rank {self.rank} of {world}: the ranks' tables differ: {said}")
            raise self._error
        self._agreed = True

    def _count(self, ids, distinct, local, received, sent, t0):
        """One round in the counters: ``ids`` asked, ``distinct`` of them, ``local`` of those this rank's own,
        ``received`` rows from peers and ``sent`` to them (with the counts and ids steps where rows moved)."""
        world, rnb = self.world_size, self.row_nbytes
        steps = 8 * (world - 1) if rnb else 0
        self._counts.add(rounds=1, rows_asked=ids.size - int(((ids >= self._start) & (ids < self._end)).sum()),
                         rows_received=received, duplicates_saved=ids.size - distinct, local_rows=local,
                         rows_sent=sent, bytes_sent=steps + 8 * received + rnb * sent,
                         bytes_received=steps + 8 * sent + rnb * received, seconds=time.perf_counter() - t0)

    def _serve(self, asked):
        """The rows peers asked this rank for (global ids), as bytes ``[len, row_nbytes]``."""
        if not asked.size:
            return torch.empty((0, self.row_nbytes), dtype=torch.uint8)
        return _bytes(self.local.read(torch.from_numpy(asked - self._start)), self.row_nbytes)

    def _step(self, number, step, send, send_splits, recv_splits):
        """One ``all_to_all_single`` of ``send`` (split per rank), waited for at most ``timeout``; the
        received tensor, on the CPU."""
        recv = torch.empty(sum(recv_splits), dtype=send.dtype, device=self._wire)
        send = send.to(self._wire)
        self._in_flight.append((send, recv))
        try:
            work = dist.all_to_all_single(recv, send, recv_splits, send_splits, group=self.group, async_op=True)
            if work.wait(timedelta(seconds=self.timeout)) is False:
                raise TimeoutError(f"not done after {self.timeout:g} s")
        except (RuntimeError, TimeoutError, ValueError) as exc:  # gloo/NCCL errors are RuntimeErrors
            raise ExchangeError(f"rank {self.rank} of {self.world_size}: exchange round {number} failed at its "
                                f"{step} step ({_first_line(exc)}): a peer died, stopped reading or raised "
                                f"before this round (timeout {self.timeout:g} s)") from exc
        return recv.cpu()

    def hot_ids(self) -> None:
        return None  # the local store's hot ids are in its own numbering

    def _prefetch(self, index):
        ids = index.cpu().numpy().astype(np.int64, copy=False)
        mine = ids[(ids >= self._start) & (ids < self._end)]
        if mine.size:
            self.local.prefetch(torch.from_numpy(mine - self._start))

    # ------------------------------------------------------------- counters
    def _counters(self):
        """``"exchange"``: ``rounds``; ``rows_asked`` of other ranks with duplicates, ``rows_received``
        distinct, ``duplicates_saved``, ``local_rows`` of this rank's own range read directly; ``rows_sent``
        to peers; ``bytes_sent``/``bytes_received`` to/from peers, rows, ids and counts; ``seconds`` in
        rounds (the local store's tiers follow in :meth:`stats`)."""
        return {**self._counts.snapshot(), "rank": self.rank, "world_size": self.world_size}

    # -------------------------------------------------------------- lifetime
    def _close(self):
        if self._worker is not None:
            with self._lock:  # a read queueing its round now does so first; later ones see the store closed
                self._worker.shutdown(wait=False)
            self._worker.shutdown(wait=True)  # rounds queued run (or fail fast after an error) first
        if self._made_group and self.group is not None and dist.is_initialized():
            dist.destroy_process_group(self.group)
        self.group = None  # (the last reference to a group made here: torch joins its threads now)
        self._in_flight.clear()
        super()._close()

    def _after_fork(self):
        # the group's connections and the round thread stay with the parent; the child keeps its copy of the
        # group object alive for ever, since destroying it there would join gloo threads that exist only in
        # the parent (std::system_error, abort)
        _stranded.append(self.group)
        self._worker, self._made_group, self._lock = None, False, threading.Lock()
        self._error = self._error or ExchangeError(f"rank {self.rank}: this exchange was made before the process "
                                                   "forked and works only in the parent; make one in this process")

    def __repr__(self):
        state = ", closed" if self._closed else ", failed" if self._error is not None else ""
        return (f"RowExchange(rank {self.rank} of {self.world_size}, rows {self._start}:{self._end} -> "
                f"{self.local!r}{state})")


def _bytes(rows, row_nbytes):
    """``rows`` (``[n, *row_shape]``, any dtype) as a CPU ``[n, row_nbytes]`` uint8 view or copy."""
    rows = rows.cpu().contiguous()
    return rows.view(-1).view(torch.uint8).view(rows.shape[0], row_nbytes)
