"""What a store holds besides its rows, counted: the buffers its reads stage rows in and its bookkeeping.

A read of a cache stages its misses in a host buffer, the read-ahead and a warm each have one, and a disk
store reads through its staging; a cache also keeps a map from row to slot, its policy's state and the
batches announced to it.  :class:`ReadBuffer` grows to what a read needs (not to twice its old size) and
shows its memory, :class:`Workspace` lends them to concurrent reads and lists every one, lent or idle, so
:meth:`~directload.stores.FeatureStore.held_memory` names them; :func:`nbytes_of` counts the bookkeeping
and :func:`span_bytes` the bytes under a set of buffers, each byte once.
"""

from __future__ import annotations

import sys
import threading
import weakref
from collections.abc import Iterable
from typing import Any

import numpy as np
import torch

from directload.buffers import PAGE, StagingBuffer
from directload.kernels.host_pool import size_class
from directload.kernels.operands import memory_span

__all__ = ["ReadBuffer", "Workspace", "Fence", "nbytes_of", "span_bytes", "on_host"]

#: Bytes of a Python int above 256 held in a container (28 bytes, in a 32-byte block of CPython's allocator).
INT_BYTES = 32
_EXACT = 1024  # containers up to this long are counted item by item; longer ones from their first item


class ReadBuffer(StagingBuffer):
    """A :class:`~directload.buffers.StagingBuffer` that grows to the size class of what it is asked for
    (:func:`~directload.kernels.host_pool.size_class`: less than a quarter more, and no more than
    ``limit`` beyond the request where given), never to twice its old size, and shows its memory
    (:attr:`array`, None before the first take) to another thread without touching it.

    Examples
    --------
    >>> buf = ReadBuffer(pin="never")
    >>> a = buf.take(60 << 20)
    >>> a.nbytes >> 20, buf.take(61 << 20).nbytes >> 20, buf.array.nbytes >> 20
    (64, 64, 64)
    >>> buf.take(65 << 20).nbytes >> 20   # the next class, not twice 64
    80
    """

    def __init__(self, *, limit: int | None = None, pin: str | bool = "auto") -> None:
        super().__init__(minimum=PAGE, growth_limit=0, pin=pin)  # growth_limit 0: exactly what take asks
        self.limit = limit
        #: The buffer's memory now, or None.
        self.array: np.ndarray | None = None

    @staticmethod
    def size_for(nbytes: int, limit: int | None = None) -> int:
        """The bytes a buffer grown for ``nbytes`` holds (what a memory estimate counts).  Pure.

        Examples
        --------
        >>> ReadBuffer.size_for(60 << 20) >> 20, ReadBuffer.size_for(60 << 20, limit=62 << 20) >> 20
        (64, 62)
        """
        want = max(size_class(max(int(nbytes), 1)), PAGE)
        return want if limit is None else max(min(want, int(limit)), int(nbytes))

    def take(self, nbytes: int) -> np.ndarray:
        """The buffer, at least ``nbytes`` long (grown if it was shorter; what it held is lost then)."""
        have = self.array
        if have is not None and have.nbytes >= nbytes:
            return have
        del have
        self.array = None  # the old buffer goes before the new one is allocated
        self.array = super().take(self.size_for(nbytes, self.limit))
        return self.array

    __call__ = take

    def release(self) -> None:
        self.array = None
        super().release()


class Fence:
    """Where one read's GPU work ends: an event recorded on the current stream of each CUDA device it used.

    A cache's read launches its gather and its copy into slots and returns without waiting for them: its
    staging buffer is given back with the read's fence (the next read to take the buffer waits for it, on the
    host, only if that work is still running), and whoever waits for the read's result orders its own stream
    after the fence (:meth:`order`: no host wait).

    Examples
    --------
    >>> Fence.after(torch.device("cpu")) is None  # work on the CPU is done when the call returns
    True
    """

    def __init__(self, events: list[tuple[torch.device, Any]]) -> None:
        self.events = events

    @classmethod
    def after(cls, *devices: torch.device | None) -> Fence | None:
        """A fence after the work queued so far on the current streams of ``devices`` (None: no CUDA one)."""
        events = []
        for device in dict.fromkeys(d for d in devices if d is not None and d.type == "cuda"):
            event = torch.cuda.Event()
            event.record(torch.cuda.current_stream(device))
            events.append((device, event))
        return cls(events) if events else None

    def wait(self) -> None:
        """Block until the work is done (a staging buffer's reuse: its bytes are about to be written)."""
        for _, event in self.events:
            event.synchronize()

    def order(self) -> None:
        """Make the calling thread's current streams wait for the work, without a host wait."""
        for device, event in self.events:
            torch.cuda.current_stream(device).wait_event(event)


class Workspace:
    """:class:`ReadBuffer` s lent to a store's concurrent reads: :meth:`take` lends one (an idle one, else a
    new one), :meth:`give` returns it (kept while fewer than ``keep`` are idle), and :meth:`arrays` lists the
    memory of every one, lent or idle.  A buffer a failed read never gives back is freed with it.

    Examples
    --------
    >>> work = Workspace(keep=1, pin="never")
    >>> a = work.take(); _ = a.take(1 << 20)
    >>> [x.nbytes for x in work.arrays()]
    [1048576]
    >>> work.give(a); work.take() is a
    True
    """

    def __init__(self, keep: int = 4, *, pin: str | bool = "auto") -> None:
        self.keep, self.pin = int(keep), pin
        self._idle: list[ReadBuffer] = []
        self._lent: weakref.WeakSet[ReadBuffer] = weakref.WeakSet()
        self._fences: weakref.WeakKeyDictionary[ReadBuffer, Fence | None] = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()

    def take(self) -> ReadBuffer:
        """An idle buffer, the longest idle first (its GPU work the likeliest done), once its fence has passed;
        else a new one."""
        with self._lock:
            buf = self._idle.pop(0) if self._idle else ReadBuffer(pin=self.pin)
            self._lent.add(buf)
            fence, self._fences[buf] = self._fences.get(buf), None
        if fence is not None:
            fence.wait()
        return buf

    def give(self, buf: ReadBuffer, fence: Fence | None = None) -> None:
        """Return ``buf``: nothing on the host reads or writes it any more, and the GPU's work on it (if any)
        ends at ``fence``, which the next :meth:`take` of it waits for."""
        with self._lock:
            self._lent.discard(buf)
            if len(self._idle) < self.keep:
                self._idle.append(buf)
                self._fences[buf] = fence

    def arrays(self) -> tuple[np.ndarray, ...]:
        """The memory of every buffer lent or idle now."""
        with self._lock:
            bufs = [*self._lent, *self._idle]
        return tuple(a for a in (b.array for b in bufs) if a is not None)

    def release(self) -> None:
        """Let the idle buffers go, once the GPU's work on them has ended (lent ones go when their reads drop
        them)."""
        with self._lock:
            idle, self._idle = self._idle, []
            fences = [self._fences.pop(buf, None) for buf in idle]
        for fence in fences:
            if fence is not None:
                fence.wait()


def on_host(m: torch.Tensor | np.ndarray) -> bool:
    """Whether ``m`` is host memory (a numpy array, or a CPU tensor: pageable, pinned or mapped)."""
    return isinstance(m, np.ndarray) or m.device.type == "cpu"


def span_bytes(memory: Iterable[torch.Tensor | np.ndarray]) -> int:
    """The bytes under ``memory`` (tensors and arrays, each its whole storage), each byte once: buffers that
    share memory (a view and its base, a table two stores read) count once.

    Examples
    --------
    >>> t = torch.zeros(100, dtype=torch.uint8)
    >>> span_bytes([t, t[10:20], np.zeros(50, np.uint8)])
    150
    """
    spans = sorted(memory_span(m, whole=True) for m in memory)
    total = end = 0
    for a, b in spans:
        if b > end:
            total += b - max(a, end)
            end = b
    return total


def nbytes_of(*objs: Any) -> int:
    """Bytes held by bookkeeping ``objs``: numpy arrays and CPU tensors (their own bytes), and lists, tuples,
    deques, sets and dicts of them or of ints (the container and, per item, an int's :data:`INT_BYTES`).
    Containers longer than 1024 items are counted from their first item; exact for the dense arrays of
    the caches' maps, an estimate within a few percent for a policy's dicts of ints.

    Examples
    --------
    >>> nbytes_of(np.zeros(1000, np.int64)), nbytes_of([np.zeros(10, np.int8)]) > 10
    (8000, True)
    >>> nbytes_of(dict.fromkeys(range(1000, 3000))) >= 2000 * INT_BYTES
    True
    """
    return sum(_nbytes(obj) for obj in objs)


def _nbytes(obj: Any) -> int:
    if isinstance(obj, np.ndarray):
        return int(obj.nbytes)
    if isinstance(obj, torch.Tensor):
        return obj.untyped_storage().nbytes() if obj.device.type == "cpu" else 0
    if isinstance(obj, bool) or obj is None:
        return 0
    if isinstance(obj, (int, np.integer, float)):
        return INT_BYTES if isinstance(obj, float) or not -5 <= int(obj) <= 256 else 0  # small ints are shared
    if isinstance(obj, dict):
        items: Any = obj.items()
    elif isinstance(obj, (list, tuple, set, frozenset)) or hasattr(obj, "maxlen"):  # (a deque has maxlen)
        items = ((item, None) for item in obj)
    else:
        return 0
    size, n = sys.getsizeof(obj), len(obj)
    if n > _EXACT:
        key, value = next(iter(items))
        return size + n * (_nbytes(key) + _nbytes(value))
    return size + sum(_nbytes(key) + _nbytes(value) for key, value in items)
