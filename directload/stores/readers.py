"""``ReaderPool``: the threads a store's reads run on, so ``read_async`` returns at once.

A read waited for before any thread took it runs on the waiting thread instead (two thread switches
spared, the same result); :meth:`ReaderPool.close` lets every read in flight, on a pool thread or on a
waiter's, finish first.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

from .futures import ReadFuture

if TYPE_CHECKING:
    import torch

__all__ = ["ReaderPool", "READERS"]

READERS = 4  # threads that run a store's reads (each read is one task; reads of one store may overlap)


class ReaderPool:
    """``threads`` reader threads named after ``name``.

    Examples
    --------
    >>> pool = ReaderPool("demo")
    >>> pool.submit(lambda: 42, check=lambda: None).wait()
    42
    >>> pool.close()
    """

    def __init__(self, name: str, threads: int = READERS) -> None:
        self._threads: set[int] = set()  # the pool's thread idents, each added as it starts
        self._executor = ThreadPoolExecutor(threads, thread_name_prefix=f"directload-{name}-read",
                                            initializer=lambda: self._threads.add(threading.get_ident()))
        self._submit_lock = threading.Lock()
        self._idle = threading.Condition()
        self._stolen = 0  # reads their waiters run: close() waits for them

    def submit(self, work: Callable[[], torch.Tensor], *, check: Callable[[], object],
               ordered: Callable[[], None] | None = None) -> ReadFuture:
        """A :class:`~directload.stores.ReadFuture` of ``work()``; ``check()`` runs first under the submit
        lock (a closed store raises there, never the executor's "cannot schedule"); ``ordered`` runs in each
        waiting thread after its wait (:class:`~directload.stores.held.Fence.order`)."""
        with self._submit_lock:
            check()
            return ReadFuture(future=self._executor.submit(work), steal=functools.partial(self._steal, work),
                              ordered=ordered)

    def _steal(self, work, future):
        with self._idle:
            if not future.cancel():
                return ReadFuture.NOT_STOLEN
            self._stolen += 1
        try:
            return work()
        finally:
            with self._idle:
                self._stolen -= 1
                self._idle.notify_all()

    def on_pool(self) -> bool:
        """Whether the calling thread is one of the pool's."""
        return threading.get_ident() in self._threads

    def close(self) -> None:
        """Wait for the reads in flight (unless called from a pool thread, which cannot wait for itself)."""
        with self._submit_lock:  # a submit in progress ends first; later ones see the store closed
            pass
        self._executor.shutdown(wait=not self.on_pool())
        with self._idle:
            while self._stolen:
                self._idle.wait(0.05)
