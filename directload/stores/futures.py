"""``ReadFuture``: a read in flight, the one ladder from async to sync (``read()`` is ``read_async().wait()``)."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import TYPE_CHECKING, cast

from directload.errors import DirectloadError

if TYPE_CHECKING:
    import torch

__all__ = ["ReadFuture", "ForkedReadError"]


class ForkedReadError(DirectloadError, RuntimeError):
    """A read started before the process forked is waited for in the child, where the thread doing it did not
    come along: read the rows again in the child.

    Examples
    --------
    >>> issubclass(ForkedReadError, RuntimeError)
    True
    """


class ReadFuture:
    """A read in flight.  :meth:`wait` gives the rows, or raises what the read raised.

    ``wait`` may be called any number of times and from any thread; it blocks
    until the read is done, then returns the same tensor (or raises the same
    exception) each time.  A failure on a background thread always reaches the
    caller here: nothing is swallowed.

    Examples
    --------
    >>> import torch
    >>> f = ReadFuture(result=torch.ones(2))
    >>> f.done(), f.wait().tolist()
    (True, [1.0, 1.0])
    """

    #: What a ``steal`` callable returns when the work had started on its thread already.
    NOT_STOLEN = object()

    def __init__(self, run: Callable[[], torch.Tensor] | None = None, *,
                 future: Future[torch.Tensor] | None = None, result: torch.Tensor | None = None,
                 done: Callable[[], bool] | None = None,
                 steal: Callable[[Future[torch.Tensor]], object] | None = None,
                 ordered: Callable[[], None] | None = None) -> None:
        # steal: with ``future``, called by wait() with the future: where the work had not started it cancels
        # the future and does the work on the waiting thread (two thread switches spared, the same result),
        # else it returns NOT_STOLEN and wait() waits for the future
        # ordered: called in the waiting thread after every successful wait(): orders the waiter's GPU streams
        # after the read's GPU work (a cache read returns before its kernels end)
        self._run, self._future, self._result, self._done, self._steal = run, future, result, done, steal
        self._ordered = ordered
        self._error: Exception | None = None
        self._lock = threading.Lock()
        self._pid = os.getpid()

    def wait(self) -> torch.Tensor:
        """The rows (``[len(ids), *row_shape]``), once the read is complete.

        A read still in flight when the process forked cannot complete in the child (the thread doing
        it stayed in the parent): waiting for it there raises :class:`ForkedReadError` instead of hanging.
        """
        if self._pid != os.getpid():
            if self._future is not None:
                raise ForkedReadError("this read was started before the process forked and runs in the parent: "
                                   "it cannot complete in this child; read the rows again here")
            self._lock, self._pid = threading.Lock(), os.getpid()  # a parent's thread may have held it
        with self._lock:
            # An Exception is the read's outcome, kept for every later wait(); a KeyboardInterrupt or
            # SystemExit while waiting is not, and leaves the read to be waited for again.
            if self._future is not None:
                got = ReadFuture.NOT_STOLEN
                try:
                    if self._steal is not None:
                        got = self._steal(self._future)
                    # cast: a steal callable returns the rows unless it returns NOT_STOLEN (its contract)
                    self._result = self._future.result() if got is ReadFuture.NOT_STOLEN else cast("torch.Tensor", got)
                except Exception as exc:  # the worker's own exception, traceback intact
                    self._error = exc
                self._future = self._steal = None
            if self._run is not None:
                try:
                    self._result = self._run()
                except Exception as exc:
                    self._error = exc
                self._run = None
            if self._error is not None:
                raise self._error
        if self._ordered is not None:
            self._ordered()
        # cast: set above, or given as result= (a ReadFuture is made with run, future or result)
        return cast("torch.Tensor", self._result)

    def done(self) -> bool:
        """Whether :meth:`wait` would return at once.

        A read that runs on the caller's thread (a CPU gather from memory) runs
        here, so polling ``done()`` always ends.
        """
        if self._run is not None:
            if self._done is not None:
                return self._done()
            try:
                self.wait()
            except Exception:  # noqa: BLE001 - kept, and raised by wait()
                pass
            return True
        future = self._future
        return future is None or future.done()
