"""The loaders' pipeline: sample ahead, gather the next batch while the current one trains, never hang.

Framework-neutral: a loader hands it an iterator of sampled batches and one
:class:`BatchAdapter` (what its framework's batches need: their ids, the hint
to the stores, the start and the end of their feature fetches), so the same
machinery serves any sampler that yields tuples, lists, dicts, tensors or
graph objects with ``to(device)``.
"""

from __future__ import annotations

import atexit
import contextlib
import queue
import threading
import time
import weakref
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch

from directload.errors import DirectloadError

from .lookahead import AutoLookahead, check_lookahead, choose_lookahead, resolve_overlap, resolve_sampling

if TYPE_CHECKING:
    from directload.stores import FeatureStore

__all__ = ["Pipeline", "Epoch", "PipelineError", "BatchAdapter", "resolve_sampling", "resolve_overlap",
           "choose_lookahead", "check_lookahead", "AutoLookahead"]  # the last five: lookahead.py's, as before

_DONE = object()
_live: weakref.WeakSet[Pipeline] = weakref.WeakSet()


class BatchAdapter:
    """What the pipeline needs to know of one framework's batches; a loader passes one.

    The defaults suit batches whose features are already in place: no ids, no hints, nothing to fetch.
    The DGL loader's (:class:`directload.loaders.dgl.batches.DGLBatches`) fills DGL's lazy features,
    the PyG loader's runs PyG's ``filter_fn``.

    Examples
    --------
    >>> class Doubling(BatchAdapter):
    ...     def finish(self, started):
    ...         return started * 2
    >>> epoch = Epoch(Pipeline(iter([1, 2, 3]), Doubling(), device="cpu", lookahead=2,
    ...                        sample_in_thread=False, overlap=False))
    >>> list(epoch)
    [2, 4, 6]
    """

    def ids(self, batch: Any) -> torch.Tensor | Mapping[str, torch.Tensor] | None:
        """The ids the batch reads features for (what :meth:`Epoch.upcoming` lists), or None."""
        return None

    def announce(self, batch: Any) -> None:
        """The batch was sampled: hint its ids to the stores it will read (``FeatureStore.prefetch``)."""

    def start(self, batch: Any) -> Any:
        """Start the batch's feature fetches; returns what :meth:`finish` takes."""
        return batch

    def finish(self, started: Any) -> Any:
        """Wait for the fetches, put the features in place and move the batch to the device."""
        return started

    def stores(self) -> Sequence[FeatureStore]:
        """The :class:`~directload.stores.FeatureStore` s behind the batches (``lookahead="auto"`` reads
        their caches' counters)."""
        return ()


class PipelineError(DirectloadError, RuntimeError):
    """A pipeline thread ended without handing over a batch, an end or an error (never expected).

    Examples
    --------
    >>> issubclass(PipelineError, RuntimeError)
    True
    """


class _Failure:
    """An exception raised in a pipeline thread, carried to the consumer with its traceback."""

    def __init__(self, exc, where):  # where: the thread's role, None for the caller's own thread
        self.exc = exc
        self.where = where


@atexit.register
def _close_all():
    for p in list(_live):
        p.close()


class Pipeline:
    """The machinery of one epoch of batches (the caller sees it through :class:`Epoch`).

    Stage 1 (sampling) pulls batches from ``batches`` up to ``lookahead``
    ahead (an int, or an :class:`AutoLookahead` that picks each epoch's):
    on a background thread when ``sample_in_thread``, else on the caller's
    thread (at :meth:`prime` and inside ``__next__``).  Each sampled batch
    goes to ``adapter.announce`` (stores' ``prefetch`` hooks) and its ids,
    from ``adapter.ids``, are listed by :meth:`upcoming`.  Stage 2 runs
    ``adapter.finish(adapter.start(batch))``, which fetches the batch's
    features and moves it to ``device``: with ``overlap``, on a background
    thread (and its own CUDA stream for a CUDA ``device``) while the caller
    trains on the previous batch; without, in ``__next__``.

    Every thread hands the consumer either batches, the end, or the exception
    that stopped it (raised in the caller with its traceback); a thread that
    dies without doing so is noticed and reported too.  Breaking out of the
    loop, an exception, or interpreter exit closes the pipeline: threads stop,
    queues drain, and nothing hangs.

    Examples
    --------
    >>> p = Pipeline(iter(["a", "b"]), BatchAdapter(), device="cpu", lookahead=1, sample_in_thread=False,
    ...              overlap=False)
    >>> list(p)
    ['a', 'b']
    """

    POLL = 0.1  # seconds between checks of the stop flag while blocked
    _auto: AutoLookahead | None
    _sampler: threading.Thread | None
    _gatherer: threading.Thread | None
    _handed: float | None

    def __init__(self, batches: Iterator[Any], adapter: BatchAdapter, *, device: torch.device | str,
                 lookahead: int | AutoLookahead, sample_in_thread: bool, overlap: bool) -> None:
        if not isinstance(adapter, BatchAdapter):
            raise TypeError(f"adapter must be a BatchAdapter, not {type(adapter).__name__}")
        self._it = batches
        self._adapter = adapter
        self._auto = None
        if isinstance(lookahead, AutoLookahead):
            self._auto, lookahead = lookahead, lookahead.begin(adapter.stores())
        self._device = torch.device(device)
        self._lookahead = lookahead
        self._stop = threading.Event()
        # At most `lookahead` batches are sampled and not yet handed out: the sampler thread
        # takes a slot before each batch and __next__ gives one back; on the caller, __next__
        # keeps the count itself.  So the queue never blocks.
        self._sampled: queue.Queue[Any] = queue.Queue()
        self._slots = threading.Semaphore(lookahead)
        self._ready: queue.Queue[Any] = queue.Queue(maxsize=1)
        self._upcoming: deque[Any] = deque()
        self._changed = threading.Condition()
        self._exhausted = False
        self.stats = {"sample_s": 0.0, "gather_s": 0.0, "wait_s": 0.0, "compute_s": 0.0, "batches": 0,
                      "lookahead": lookahead}
        self._handed = None  # when the last batch was handed out: the caller computes until the next call
        self._sample_in_thread = sample_in_thread
        self._overlap = overlap
        self._sampler = self._gatherer = None
        # One batch handed out at a time: an epoch's iterator shared by threads gives each batch to one of
        # them, every batch to some (its counters and queues are not safe for two callers at once).
        self._next_lock = threading.Lock()
        if sample_in_thread:
            self._sampler = self._spawn(self._sample_loop, "sampler", self._sampled)
        if overlap:
            self._gatherer = self._spawn(self._gather_loop, "feature gather", self._ready)
        _live.add(self)

    # -- threads ------------------------------------------------------------------
    def _spawn(self, body, role, out_queue):
        """Start ``body`` on a thread whose every exception, from its first line on, reaches the consumer."""
        def run():
            try:
                body()
            except BaseException as exc:  # carried to the caller, traceback intact
                self._put(out_queue, _Failure(exc, role))
            finally:
                with self._changed:
                    self._changed.notify_all()

        t = threading.Thread(target=run, name=f"directload-{role.replace(' ', '-')}", daemon=True)
        t.start()
        return t

    def _put(self, q, item):
        while not self._stop.is_set():
            try:
                q.put(item, timeout=self.POLL)
                return True
            except queue.Full:
                continue
        return False

    def _get(self, q, producer):
        """The next item of ``q``; ``_DONE`` once stopped.  Raises :class:`PipelineError` if
        ``producer`` (a thread, or None for the caller) died without a word."""
        while True:
            try:
                return q.get(timeout=self.POLL)
            except queue.Empty:
                if self._stop.is_set():
                    return _DONE
                if producer is not None and not producer.is_alive():
                    try:
                        return q.get_nowait()
                    except queue.Empty:
                        raise PipelineError(f"directload's {producer.name} thread ended without a batch, "
                                            "an end or an error") from None

    # -- stage 1 ------------------------------------------------------------------
    def _sample_one(self):
        """Sample one batch into stage 2's queue; False when the epoch is over."""
        t0 = time.perf_counter()
        try:
            batch = next(self._it)
        except StopIteration:
            self._exhausted = True
            self._put(self._sampled, _DONE)
            with self._changed:
                self._changed.notify_all()
            return False
        self.stats["sample_s"] += time.perf_counter() - t0
        self._adapter.announce(batch)
        with self._changed:
            self._upcoming.append(self._adapter.ids(batch))
            self._changed.notify_all()
        return self._put(self._sampled, batch)

    def _sample_loop(self):
        while not self._stop.is_set():
            if self._slots.acquire(timeout=self.POLL) and not self._sample_one():
                return

    def _sample_on_caller(self, target):
        """Sample on this thread until ``target`` batches are ahead; a failure waits its turn in the queue."""
        while not self._exhausted and len(self._upcoming) < target:
            try:
                self._sample_one()
            except Exception as exc:  # raised in order, after the batches before it
                self._exhausted = True
                self._put(self._sampled, _Failure(exc, None))

    def prime(self) -> None:
        """Sample the first ``lookahead`` batches (or wait until the sampler thread has), so
        :meth:`upcoming` is filled before the first batch is taken."""
        if not self._sample_in_thread:
            self._sample_on_caller(self._lookahead)
            return
        with self._changed:
            while (len(self._upcoming) < self._lookahead and not self._exhausted and not self._stop.is_set()
                   and self._sampler.is_alive()):  # type: ignore[union-attr]  # set: sample_in_thread
                self._changed.wait(self.POLL)

    # -- stage 2 ------------------------------------------------------------------
    def _assemble(self, batch, stream):
        """Fetch a sampled batch's features and move it to the device (on ``stream`` for CUDA)."""
        t0 = time.perf_counter()
        with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
            batch = self._adapter.finish(self._adapter.start(batch))
            event = stream.record_event() if stream is not None else None
        self.stats["gather_s"] += time.perf_counter() - t0
        return batch, event

    def _gather_loop(self):
        stream = torch.cuda.Stream(self._device) if self._device.type == "cuda" else None
        while True:
            batch = self._get(self._sampled, self._sampler)
            if batch is _DONE or isinstance(batch, _Failure):
                self._put(self._ready, batch)
                return
            if not self._put(self._ready, self._assemble(batch, stream)):
                return

    # -- consumer -----------------------------------------------------------------
    def upcoming(self) -> list[Any]:
        """Ids of the batches sampled but not yet handed out, oldest first."""
        with self._changed:
            return list(self._upcoming)

    def __iter__(self) -> Pipeline:
        return self

    def __next__(self) -> Any:
        with self._next_lock:
            return self._next()

    def _next(self):
        if self._handed is not None:
            self.stats["compute_s"] += time.perf_counter() - self._handed
            self._handed = None
        if self._stop.is_set():
            raise StopIteration
        if not self._sample_in_thread:
            # Keep `lookahead` batches sampled ahead, on this thread (DGL's RNG streams
            # are per thread, so this keeps batches identical to DGL's own loader).
            self._sample_on_caller(self._lookahead + 1)
        t0 = time.perf_counter()
        try:
            if self._overlap:
                item = self._get(self._ready, self._gatherer)
            else:
                item = self._get(self._sampled, self._sampler)
                if item is not _DONE and not isinstance(item, _Failure):
                    item = self._assemble(item, None)
        except BaseException:
            self.close()
            raise
        self.stats["wait_s"] += time.perf_counter() - t0
        if item is _DONE:
            self.close()
            if self._auto is not None:  # the epoch ended normally: the next one's L from its stage times
                auto, self._auto = self._auto, None
                auto.end(self._adapter.stores(), self.stats)
            raise StopIteration
        if isinstance(item, _Failure):
            self.close()
            if item.where is not None:
                item.exc.add_note(f"(raised on directload's {item.where} thread)")
            raise item.exc.with_traceback(item.exc.__traceback__)
        batch, event = item
        if event is not None:
            current = torch.cuda.current_stream(self._device)
            current.wait_event(event)
            _record_stream(batch, current)
        with self._changed:
            if self._upcoming:
                self._upcoming.popleft()
        if self._sample_in_thread:
            self._slots.release()
        self.stats["batches"] += 1
        self._handed = time.perf_counter()
        return batch

    def close(self) -> None:
        """Stop both stages and join their threads (idempotent, never blocks for long)."""
        threads = [t for t in (self._sampler, self._gatherer) if t is not None]
        if self._stop.is_set() and not any(t.is_alive() for t in threads):
            return
        self._stop.set()
        for q in (self._sampled, self._ready):
            while True:
                try:
                    q.get_nowait()
                except queue.Empty:
                    break
        me = threading.current_thread()
        for t in threads:
            if t is not me:
                t.join(timeout=10 * self.POLL + 5)
        _live.discard(self)


class Epoch:
    """The iterator a loader gives for one epoch.

    Yields the sampler's batches with their features in place, as the
    framework's own loader does.  :meth:`upcoming` lists the ids of the
    batches sampled ahead, from the moment the iterator exists.  Dropping it
    (``break`` out of the loop) closes its pipeline; ``close()`` does so
    explicitly.  ``stats`` has the seconds spent sampling (``sample_s``),
    gathering (``gather_s``) and waiting in ``__next__`` (``wait_s``).

    Examples
    --------
    >>> epoch = Epoch(Pipeline(iter([1, 2]), BatchAdapter(), device="cpu", lookahead=2, sample_in_thread=False,
    ...                        overlap=False))
    >>> epoch.upcoming(), list(epoch), epoch.stats["batches"]
    ([], [1, 2], 2)
    """

    def __init__(self, pipeline: Pipeline) -> None:
        self._p = pipeline

    def __iter__(self) -> Epoch:
        return self

    def __next__(self) -> Any:
        return next(self._p)

    def upcoming(self) -> list[Any]:
        """Ids of the batches sampled ahead but not yet yielded, oldest first."""
        return self._p.upcoming()

    @property
    def stats(self) -> dict[str, float]:
        return self._p.stats

    def close(self) -> None:
        """Stop the pipeline's threads (idempotent)."""
        self._p.close()

    def __del__(self):
        self._p.close()


def _record_stream(batch, stream):
    """Tell the caching allocator that tensors made on the side stream are used on ``stream``."""
    if isinstance(batch, Mapping):
        for v in batch.values():
            _record_stream(v, stream)
    elif isinstance(batch, (tuple, list)):
        for v in batch:
            _record_stream(v, stream)
    elif hasattr(batch, "record_stream"):
        if not isinstance(batch, torch.Tensor) or batch.is_cuda:
            batch.record_stream(stream)  # a DGL graph records its structure and every frame column
