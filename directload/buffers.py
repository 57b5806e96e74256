"""Aligned host buffers: the one home of page-aligned memory that O_DIRECT reads land in and GPUs map.

A disk store's reads and a cache's staged misses both need host memory that starts on a page (O_DIRECT
refuses anything else) and is pinned where CUDA runs (so a GPU reads it zero-copy).  :func:`aligned` gives
one such array; :class:`StagingBuffer` is one that grows with the batches and is reused between them.
"""

from __future__ import annotations

import threading

import numpy as np

from directload import memory

__all__ = ["StagingPool", "PAGE", "aligned", "StagingBuffer"]

#: Bytes of a page: every buffer here starts on one (a multiple of every block size O_DIRECT asks for).
PAGE = 4096


def aligned(nbytes: int, *, pin: str | bool = "auto") -> np.ndarray:
    """A uint8 numpy array of ``nbytes`` starting on a page: pinned where CUDA runs with ``pin="auto"``,
    ordinary memory with ``pin="never"`` (a view that keeps its allocation alive).

    Examples
    --------
    >>> buf = aligned(10_000, pin="never")
    >>> buf.nbytes, buf.ctypes.data % PAGE
    (10000, 0)
    """
    if isinstance(nbytes, bool) or not isinstance(nbytes, (int, np.integer)) or nbytes < 0:
        raise ValueError(f"nbytes must be a non-negative integer, got {nbytes!r}")
    nbytes = int(nbytes)
    raw: np.ndarray | None
    if pin != "never":
        raw = memory.host_array(memory.allocate(nbytes, pin=pin))
        if raw.ctypes.data % PAGE == 0:  # pinned blocks start on a page: no padding needed
            return raw[:nbytes]
        raw = None
        raw = memory.host_array(memory.allocate(nbytes + PAGE, pin=pin))
    else:
        raw = np.empty(nbytes + PAGE, np.uint8)
    start = (-raw.ctypes.data) % PAGE
    return raw[start:start + nbytes]


class StagingBuffer:
    """A page-aligned host buffer reused from batch to batch: :meth:`take` gives at least ``nbytes`` of it,
    growing it (at least twofold, so a run of growing batches reallocates a few times, not at every batch)
    and never shrinking it.  Pinned where CUDA runs.  One user at a time: what ``take`` gave stays valid
    until the next ``take``.

    It is what :meth:`directload.stores.FeatureStore.stage` reads rows into (``into``).

    Parameters
    ----------
    minimum : int
        Bytes allocated at least, on the first take.
    growth_limit : int, optional
        Growth beyond what was asked stops at this many bytes (a disk store's round size); None: no limit.
    pin : str
        As for :func:`aligned`.

    Examples
    --------
    >>> buf = StagingBuffer(minimum=4096, pin="never")
    >>> a = buf.take(100)
    >>> a.nbytes >= 100, a.ctypes.data % PAGE
    (True, 0)
    >>> buf.take(10_000).nbytes >= 10_000, buf.nbytes >= 10_000
    (True, True)
    """

    def __init__(self, *, minimum: int = 1 << 16, growth_limit: int | None = None,
                 pin: str | bool = "auto") -> None:
        self.minimum, self.growth_limit, self.pin = int(minimum), growth_limit, pin
        self._array: np.ndarray | None = None

    @property
    def nbytes(self) -> int:
        """Bytes held now (0 before the first take)."""
        return 0 if self._array is None else self._array.nbytes

    def take(self, nbytes: int) -> np.ndarray:
        """The buffer, at least ``nbytes`` long (grown if it was shorter; what it held is lost then)."""
        if self._array is None or self._array.nbytes < nbytes:
            old = self.nbytes
            grow = 2 * old if self.growth_limit is None else min(2 * old, max(self.growth_limit, nbytes))
            self._array = None  # the old buffer goes before the new one is allocated
            self._array = aligned(max(nbytes, grow, self.minimum), pin=self.pin)
        return self._array

    __call__ = take

    def release(self) -> None:
        """Give the memory back (a later take allocates again)."""
        self._array = None


class StagingPool:
    """:class:`StagingBuffer` s for concurrent users: :meth:`take` lends one (a pooled one, else a new one),
    :meth:`give` returns it; at most ``keep`` are kept for reuse.

    Examples
    --------
    >>> pool = StagingPool(keep=1)
    >>> a = pool.take(); pool.give(a); pool.take() is a
    True
    """

    def __init__(self, keep: int = 4) -> None:
        self.keep = int(keep)
        self._free: list[StagingBuffer] = []
        self._lock = threading.Lock()

    def take(self) -> StagingBuffer:
        with self._lock:
            return self._free.pop() if self._free else StagingBuffer()

    def give(self, buffer: StagingBuffer) -> None:
        """Return ``buffer`` once nothing reads or writes it any more (a GPU's work on it synchronized)."""
        with self._lock:
            if len(self._free) < self.keep:
                self._free.append(buffer)
