"""The loader's pipeline: sample ahead, gather the next batch while the current one trains, shut down cleanly."""

import atexit
import contextlib
import queue
import threading
import time
import weakref
from collections import deque

import torch

from .features import fetch_batch

__all__ = ["Pipeline", "Epoch"]

_DONE = object()
_live = weakref.WeakSet()


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

    Stage 1 (sampling) pulls batches from DGL's iterator up to ``lookahead``
    ahead: on a background thread when ``sample_in_thread``, else on the
    caller's thread inside ``__next__``.  Each sampled batch's input ids are
    announced to the stores' ``prefetch`` hooks and listed by
    :meth:`upcoming`.  Stage 2 gathers a batch's features: with ``overlap``, on
    a background thread (and its own CUDA stream for a CUDA ``device``) while
    the caller trains on the previous batch; without, in ``__next__``.

    Breaking out of the loop, an exception in a stage (re-raised in the caller
    with its traceback) or interpreter exit closes the pipeline: threads stop,
    queues drain, and nothing hangs.
    """

    POLL = 0.1  # seconds between checks of the stop flag while blocked

    def __init__(self, dgl_iter, spec, device, lookahead, sample_in_thread, overlap):
        self._it = dgl_iter
        self._spec = spec
        self._device = torch.device(device)
        self._lookahead = lookahead
        self._stop = threading.Event()
        # Sampling on a thread is held back by a bounded queue; sampling on the caller
        # is bounded in __next__ instead, and its queue must never block the caller.
        self._sampled = queue.Queue(maxsize=lookahead if sample_in_thread else 0)
        self._ready = queue.Queue(maxsize=1)
        self._upcoming = deque()
        self._lock = threading.Lock()
        self._exhausted = False
        self.stats = {"sample_s": 0.0, "gather_s": 0.0, "wait_s": 0.0, "batches": 0}
        self._threads = []
        if sample_in_thread:
            self._spawn(self._sample_loop, "directload-sampler")
        self._sample_in_thread = sample_in_thread
        self._overlap = overlap
        if overlap:
            self._spawn(self._gather_loop, "directload-gather")
        _live.add(self)

    # -- stages -------------------------------------------------------------------
    def _spawn(self, fn, name):
        t = threading.Thread(target=fn, name=name, daemon=True)
        t.start()
        self._threads.append(t)

    def _put(self, q, item):
        while not self._stop.is_set():
            try:
                q.put(item, timeout=self.POLL)
                return True
            except queue.Full:
                continue
        return False

    def _get(self, q):
        while True:
            try:
                return q.get(timeout=self.POLL)
            except queue.Empty:
                if self._stop.is_set():
                    return _DONE

    def _sample_one(self):
        """Sample one batch into stage 2's queue; False when the epoch is over."""
        t0 = time.perf_counter()
        try:
            batch = next(self._it)
        except StopIteration:
            self._exhausted = True
            self._put(self._sampled, _DONE)
            return False
        self.stats["sample_s"] += time.perf_counter() - t0
        with self._lock:
            self._upcoming.append(batch[0])
        for store in self._spec.prefetchers:
            store.prefetch(batch[0])
        return self._put(self._sampled, batch)

    def _sample_loop(self):
        try:
            while not self._stop.is_set() and self._sample_one():
                pass
        except BaseException as exc:  # carried to the caller, traceback intact
            self._put(self._sampled, _Failure(exc, "sampler"))

    def _assemble(self, batch, stream):
        """Move a sampled batch to the device and gather its fields (on ``stream`` for CUDA)."""
        with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
            input_nodes, output_nodes, blocks = batch
            if self._device.type == "cuda":
                blocks = [b.to(self._device, non_blocking=True) for b in blocks]
                input_nodes = _to(input_nodes, self._device)
                output_nodes = _to(output_nodes, self._device)
            batch = (input_nodes, output_nodes, blocks)
            fetch_batch(self._spec, batch, self._device, self.stats)
            return batch, (stream.record_event() if stream is not None else None)

    def _gather_loop(self):
        stream = torch.cuda.Stream(self._device) if self._device.type == "cuda" else None
        try:
            while True:
                batch = self._get(self._sampled)
                if batch is _DONE or isinstance(batch, _Failure):
                    self._put(self._ready, batch)
                    return
                if not self._put(self._ready, self._assemble(batch, stream)):
                    return
        except BaseException as exc:  # carried to the caller, traceback intact
            self._put(self._ready, _Failure(exc, "feature gather"))

    # -- consumer -----------------------------------------------------------------
    def upcoming(self):
        """Input node ids of the batches sampled but not yet handed out, oldest first."""
        with self._lock:
            return list(self._upcoming)

    def __iter__(self):
        return self

    def __next__(self):
        if self._stop.is_set():
            raise StopIteration
        if not self._sample_in_thread:
            # Keep `lookahead` batches sampled ahead, on this thread (DGL's RNG streams
            # are per thread, so this keeps batches identical to DGL's own loader).
            while not self._exhausted and len(self._upcoming) <= self._lookahead:
                try:
                    self._sample_one()
                except Exception as exc:  # raised in order, after the batches before it
                    self._exhausted = True
                    self._put(self._sampled, _Failure(exc, None))
        t0 = time.perf_counter()
        if self._overlap:
            item = self._get(self._ready)
        else:
            item = self._get(self._sampled)
            if item is not _DONE and not isinstance(item, _Failure):
                item = self._assemble(item, None)
        self.stats["wait_s"] += time.perf_counter() - t0
        if item is _DONE:
            self.close()
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
        with self._lock:
            if self._upcoming:
                self._upcoming.popleft()
        self.stats["batches"] += 1
        return batch

    def close(self):
        """Stop both stages and join their threads (idempotent, never blocks for long)."""
        if self._stop.is_set() and not any(t.is_alive() for t in self._threads):
            return
        self._stop.set()
        for q in (self._sampled, self._ready):
            while True:
                try:
                    q.get_nowait()
                except queue.Empty:
                    break
        me = threading.current_thread()
        for t in self._threads:
            if t is not me:
                t.join(timeout=10 * self.POLL + 5)
        _live.discard(self)


class Epoch:
    """The iterator a :class:`~directload.loaders.DataLoader` gives for one epoch.

    Yields ``(input_nodes, output_nodes, blocks)`` like DGL's.  Dropping it
    (``break`` out of the loop) closes its pipeline; ``close()`` does so
    explicitly.  ``stats`` has the seconds spent sampling (``sample_s``),
    gathering (``gather_s``) and waiting in ``__next__`` (``wait_s``).
    """

    def __init__(self, pipeline):
        self._p = pipeline

    def __iter__(self):
        return self

    def __next__(self):
        return next(self._p)

    def upcoming(self):
        """Input node ids of the batches sampled ahead but not yet yielded, oldest first."""
        return self._p.upcoming()

    @property
    def stats(self):
        return self._p.stats

    def close(self):
        """Stop the pipeline's threads (idempotent)."""
        self._p.close()

    def __del__(self):
        self._p.close()


def _record_stream(batch, stream):
    """Tell the caching allocator that tensors made on the side stream are used on ``stream``."""
    input_nodes, output_nodes, blocks = batch
    for ids in (input_nodes, output_nodes):
        for t in ids.values() if isinstance(ids, dict) else (ids,):
            t.record_stream(stream)
    for block in blocks:
        block.record_stream(stream)  # structure and every frame column, gathered fields included


def _to(x, device):
    if isinstance(x, dict):
        return {k: v.to(device, non_blocking=True) for k, v in x.items()}
    return x.to(device, non_blocking=True)

