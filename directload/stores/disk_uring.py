"""The disk store's io_uring engine: reads submitted through liburing's C functions from compiled code.

:class:`UringEngine` calls liburing's functions (from the ``liburing`` package's library) from a
Numba-compiled loop with the GIL released: up to ``queue_depth`` reads in flight, short reads resubmitted,
``EAGAIN`` / ``EINTR`` retried, other errors retried ``retries`` times.  Where io_uring is missing or
forbidden the store reads through :class:`~directload.stores.disk_pread.PreadEngine` instead
(:func:`uring_available` says which).
"""

from __future__ import annotations

import ctypes
import errno
import os
import threading
from concurrent.futures import ThreadPoolExecutor, wait

import numpy as np
from numba import njit, types

from directload.capabilities import RING_BYTES, io_uring_usable, liburing_functions

from .disk_io import FAULTS, inject, load_i32, timed

__all__ = ["UringEngine", "uring_available"]

_EAGAIN, _EINTR, _EBUSY, _ENODATA = errno.EAGAIN, errno.EINTR, errno.EBUSY, errno.ENODATA


@njit(nogil=True)
def _complete(i, r, block, faults, cur_off, cur_dst, cur_len, left, attempts, retries, res, stack, top):
    """Account one completion; returns ``(finished 0/1, new stack top)``."""
    r = inject(r, block, faults)
    if r < 0:
        if r == -_EAGAIN or r == -_EINTR or attempts[i] < retries:
            attempts[i] += 1
            stack[top] = i
            return 0, top + 1
        res[i] = r
        return 1, top
    if r == 0:  # end of file before the bytes this read needs: the file shrank
        res[i] = -_ENODATA
        return 1, top
    left[i] -= r
    if left[i] <= 0:
        res[i] = 0
        return 1, top
    cur_off[i] += r
    cur_dst[i] += r
    cur_len[i] -= r
    stack[top] = i
    return 0, top + 1


# liburing's functions as external symbols: the compiled read loop names them, and LLVM resolves them in
# the library loaded by _uring(), so the loop is cached on disk like the other kernels (compiled once, not
# in every process: the compile took 0.8 s of each process's first read).
_u64, _u32, _i32 = types.uint64, types.uint32, types.int32
_get_sqe = types.ExternalFunction("io_uring_get_sqe", _u64(_u64))
_prep_read = types.ExternalFunction("io_uring_prep_read", types.void(_u64, _i32, _u64, _u32, _u64))
_set_data = types.ExternalFunction("io_uring_sqe_set_data64", types.void(_u64, _u64))
_submit_and_wait = types.ExternalFunction("io_uring_submit_and_wait", _i32(_u64, _u32))
_peek_batch = types.ExternalFunction("io_uring_peek_batch_cqe", _u32(_u64, _u64, _u32))
_cq_advance = types.ExternalFunction("io_uring_cq_advance", types.void(_u64, _u32))
_get_data = types.ExternalFunction("io_uring_cqe_get_data64", _u64(_u64))

_URING = None
_URING_LOCK = threading.Lock()


def _uring():
    """liburing's functions, its library loaded for the read loop; ``{}`` where the package is missing,
    or where the loop's symbols would resolve to another liburing than the one the rings are set up with
    (one loaded before it): then the disk store reads through ``pread``."""
    global _URING
    with _URING_LOCK:
        if _URING is None:
            f = liburing_functions()
            if f:
                import liburing
                from llvmlite import binding

                try:
                    binding.load_library_permanently(liburing.liburing.__file__)
                    same = all(binding.address_of_symbol(f[k].__name__) == ctypes.cast(f[k], ctypes.c_void_p).value
                               for k in ("get_sqe", "prep_read", "set_data", "submit_and_wait", "peek_batch",
                                         "cq_advance", "get_data"))
                except (OSError, RuntimeError):
                    same = False
                f = f if same else {}
            _URING = f
        return _URING


@njit(nogil=True, cache=True)
def _uring_run(ring, fd, offsets, lengths, dsts, needed, qd, block, retries, faults, res, cqes, submit_batch):
    """The reads through the ring at address ``ring``, ``qd`` in flight; returns 0 or a submit error."""
    n = offsets.shape[0]
    cur_off = offsets.astype(np.int64)
    cur_dst = dsts.copy()
    cur_len = lengths.astype(np.int64)
    left = needed.copy()
    attempts = np.zeros(n, np.int64)
    stack = np.empty(n, np.int64)
    top = 0
    nxt = 0
    inflight = 0
    finished = 0
    status = 0
    stuck = 0
    while finished < n:
        queued = 0
        while inflight < qd and status == 0:
            if top > 0:
                i = stack[top - 1]
            elif nxt < n:
                i = nxt
            else:
                break
            sqe = _get_sqe(ring)
            if sqe == 0:
                break
            if top > 0:
                top -= 1
            else:
                nxt += 1
            _prep_read(sqe, np.int32(fd), np.uint64(cur_dst[i]), np.uint32(cur_len[i]), np.uint64(cur_off[i]))
            _set_data(sqe, np.uint64(i))
            inflight += 1
            queued += 1
            if queued == submit_batch:  # hand these to the kernel now, not at the end of the refill
                queued = 0
                r = _submit_and_wait(ring, np.uint32(0))
                if r < 0 and r != -_EINTR and r != -_EAGAIN and r != -_EBUSY:
                    status = r
        if inflight == 0:
            break  # only after a submit error: nothing is left in flight
        r = _submit_and_wait(ring, np.uint32(1))
        if r < 0 and r != -_EINTR and r != -_EAGAIN and r != -_EBUSY:  # EBUSY: reap first
            status = r  # stop submitting; reap what is in flight so no read lands in freed memory
        got = _peek_batch(ring, np.uint64(cqes.ctypes.data), np.uint32(qd))
        if status != 0:
            stuck = stuck + 1 if got == 0 else 0
            if stuck > 100000:
                break  # the ring refuses to submit what is queued: nothing of it is in flight
        for j in range(got):
            c = cqes[j]
            i = np.int64(_get_data(c))
            done, top = _complete(i, np.int64(load_i32(c + np.uint64(8))), block, faults, cur_off, cur_dst,
                                  cur_len, left, attempts, retries, res, stack, top)
            finished += done
        _cq_advance(ring, np.uint32(got))
        inflight -= got
    return status


def uring_available() -> bool:
    """Whether io_uring can be used here: the kernel lets a ring be set up (the one probe, in
    ``directload.capabilities``) and the read loop's functions are liburing's own (:func:`_uring`).

    Examples
    --------
    >>> uring_available() in (True, False)
    True
    """
    return io_uring_usable() and bool(_uring())


class UringEngine:
    """Reads through ``rings`` io_uring rings, one per submitting thread, ``queue_depth`` deep each.

    Made in the process that reads: a forked child makes its own (the rings
    are marked not to be inherited).

    Examples
    --------
    >>> callable(UringEngine.read) and callable(UringEngine.close)
    True
    """

    name = "io_uring"

    def __init__(self, queue_depth: int = 64, rings: int = 1, retries: int = 3, submit_batch: int = 1) -> None:
        f = _uring()
        if not f:
            raise OSError(errno.ENOSYS, "io_uring is not available (the liburing package does not load)")
        self.queue_depth, self.retries, self.submit_batch = int(queue_depth), int(retries), int(submit_batch)
        self.limit = self.queue_depth  # reads in flight per ring, at most queue_depth (a node budget lowers it)
        self._f = f
        self._rings: list[tuple[ctypes.Array[ctypes.c_char], np.ndarray]] = []
        self._pool: ThreadPoolExecutor | None = None  # set before any ring, so a failed setup closes cleanly
        for _ in range(rings):
            ring = ctypes.create_string_buffer(RING_BYTES)
            rc = f["queue_init"](self.queue_depth, ctypes.addressof(ring), 0)
            if rc < 0:
                self.close()
                raise OSError(-rc, f"io_uring_queue_init: {os.strerror(-rc)}")
            f["dontfork"](ctypes.addressof(ring))
            self._rings.append((ring, np.zeros(self.queue_depth, np.uint64)))
        self._free = list(range(rings))
        self._lock = threading.Condition()
        self._pool = ThreadPoolExecutor(rings, thread_name_prefix="directload-uring") if rings > 1 else None
        self._pool_cpu = 0.0

    def read(self, fd: int, offsets: np.ndarray, lengths: np.ndarray, dsts: np.ndarray, needed: np.ndarray,
             block: int) -> np.ndarray:
        """Run the reads; returns ``res`` (0 per completed read, ``-errno`` per failed or unfinished one)."""
        res = np.full(offsets.shape[0], -errno.EIO, np.int64)
        parts = len(self._rings)
        if parts == 1 or offsets.shape[0] < 2 * self.queue_depth:
            self._read_part(fd, offsets, lengths, dsts, needed, block, res)
            return res
        bounds = np.linspace(0, offsets.shape[0], parts + 1).astype(np.int64)
        # (several rings: __init__ made the pool)
        futures = [self._pool.submit(timed, self._read_part, fd, offsets[a:b], lengths[a:b], dsts[a:b],  # type: ignore[union-attr]
                                     needed[a:b], block, res[a:b]) for a, b in zip(bounds[:-1], bounds[1:])]
        wait(futures)  # every part has stopped writing into the buffers before anything is raised
        self._pool_cpu += sum(fut.result() for fut in futures)
        return res

    def take_cpu_seconds(self) -> float:
        """CPU seconds its own threads spent since the last call (the caller's thread is not counted)."""
        cpu, self._pool_cpu = self._pool_cpu, 0.0
        return cpu

    def _read_part(self, fd, offsets, lengths, dsts, needed, block, res):
        with self._lock:
            while not self._free:
                self._lock.wait()
            k = self._free.pop()
        try:
            ring, cqes = self._rings[k]
            status = _uring_run(ctypes.addressof(ring), fd, offsets, lengths, dsts, needed, self.limit, block,
                          self.retries, FAULTS, res, cqes, self.submit_batch)
            if status < 0:  # entries may be left queued in the ring: start it afresh
                self._f["queue_exit"](ctypes.addressof(ring))
                rc = self._f["queue_init"](self.queue_depth, ctypes.addressof(ring), 0)
                if rc < 0:
                    raise OSError(-rc, f"io_uring_queue_init: {os.strerror(-rc)}")
                self._f["dontfork"](ctypes.addressof(ring))
        finally:
            with self._lock:
                self._free.append(k)
                self._lock.notify()
        if status < 0:
            raise OSError(-status, f"io_uring_submit: {os.strerror(-status)}")

    def close(self) -> None:
        """Stop its threads and tear its rings down."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)
        for ring, _ in self._rings:
            self._f["queue_exit"](ctypes.addressof(ring))
        self._rings = []
