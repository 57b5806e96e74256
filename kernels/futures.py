"""A gather in flight, and the worker thread that runs CPU gathers in the background."""

from __future__ import annotations

import atexit
import os
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from .bounds import DeviceBounds

__all__ = ["GatherFuture", "submit"]


class GatherFuture:
    """A gather in flight.  :meth:`wait` gives the output tensor.

    A CPU gather has already run when :func:`gather_async` returns (on the
    caller's thread and its OpenMP team: the CPU has no queue to put it on),
    unless it was started with ``background=True``, in which case a worker
    thread runs it and ``wait()`` blocks until it is done.  A GPU gather is
    launched at once on the caller's current stream; ``wait()`` orders a caller
    now on another stream after it (no host block), so the tensor is safe to
    use in stream order.

    A CUDA gather checks its ids on the GPU (see :mod:`kernels.bounds`): ``wait()``
    and ``done()`` raise ``IndexError`` if the kernel has already reported an id out
    of range, :meth:`check` waits for the kernel and then tells for sure, and the
    next gather on the device raises what no one has seen yet.

    Examples
    --------
    >>> import torch
    >>> from directload.kernels import gather_async
    >>> table = torch.arange(6.0).reshape(3, 2)
    >>> future = gather_async(table, torch.tensor([2, 0]))
    >>> future.done()  # a CPU gather has run by the time gather_async returns
    True
    >>> future.wait()
    tensor([[4., 5.],
            [0., 1.]])
    >>> gather_async(table, torch.tensor([1]), background=True).wait()  # on a worker thread
    tensor([[2., 3.]])
    """

    __slots__ = ("_result", "_out", "_stream", "_bounds", "_stamp")

    def __init__(self, result: Future[torch.Tensor] | None, out: torch.Tensor, stream: torch.cuda.Stream | None = None,
                 bounds: DeviceBounds | None = None, stamp: int = 0) -> None:
        # A GPU gather's future has both ``stream`` and ``bounds``; a CPU gather's neither.
        self._result = result
        self._out = out
        self._stream = stream  # the CUDA stream a GPU gather was launched on
        self._bounds = bounds
        self._stamp = stamp

    def wait(self) -> torch.Tensor:
        """Finish the gather and return its output tensor."""
        if self._stream is not None:
            current = torch.cuda.current_stream(self._out.device)
            if current.cuda_stream != self._stream.cuda_stream:
                # An event recorded now follows the kernel (and what came after it on that stream).
                current.wait_event(self._stream.record_event())
            self._bounds.raise_for(self._stamp)  # type: ignore[union-attr]  # set with _stream
        elif self._result is not None:
            self._result.result()  # re-raises the worker's exception, traceback intact
        return self._out

    def wait_in_order(self) -> torch.Tensor:
        """:meth:`wait` for the thread that started the gather and is still on the stream it was started on:
        a GPU gather is ordered there already, so no stream is compared (what ``gather()`` returns)."""
        if self._stream is not None:
            self._bounds.raise_for(self._stamp)  # type: ignore[union-attr]  # set with _stream
            return self._out
        return self.wait()

    def done(self) -> bool:
        """Whether the gather has finished (never blocks)."""
        if self._stream is not None:
            if not self._stream.query():  # the stream's work so far, this gather included
                return False
            self._bounds.raise_for(self._stamp)  # type: ignore[union-attr]  # set with _stream
            return True
        if self._result is not None:
            return self._result.done()
        return True

    def check(self) -> torch.Tensor:
        """Wait (on the host) for the gather to finish and raise ``IndexError`` if an id was out of range.

        The one way to be sure of a CUDA gather's ids before using its rows; a sync.  Returns the output.
        """
        if self._stream is not None:
            self._stream.record_event().synchronize()
            self._bounds.raise_for(self._stamp)  # type: ignore[union-attr]  # set with _stream
            return self._out
        return self.wait()


_pool = None
_pool_lock = threading.Lock()


def _after_fork_in_child():
    # The parent's worker thread did not come along: a new child builds its own pool.
    global _pool, _pool_lock
    _pool, _pool_lock = None, threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)


def _cpu_pool():
    # One worker: Numba's workqueue threading layer must not be entered from two
    # threads at once, and one worker already overlaps the caller (nogil kernels).
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="directload-cpu-worker")
            atexit.register(_pool.shutdown, wait=True)
        return _pool


def submit(work: Callable[[], torch.Tensor], out: torch.Tensor) -> GatherFuture:
    """A CPU gather run by the worker thread (``background=True``): its future, whose ``wait()`` blocks until
    ``work()`` has written ``out``, and re-raises what it raised."""
    return GatherFuture(_cpu_pool().submit(work), out)
