"""The disk store's fallback engine: the same reads through ``pread`` on a few threads, GIL released.

:class:`PreadEngine` reads where io_uring is missing or forbidden
(:func:`~directload.stores.disk_uring.uring_available`), with the same retries, the same handling of short
reads and the same results as :class:`~directload.stores.disk_uring.UringEngine`.
"""

from __future__ import annotations

import ctypes
import errno
from concurrent.futures import ThreadPoolExecutor, wait

import numpy as np
from numba import njit

from .disk_io import FAULTS, inject, load_i32, timed

__all__ = ["PreadEngine"]

_EAGAIN, _EINTR, _ENODATA = errno.EAGAIN, errno.EINTR, errno.ENODATA

_libc = ctypes.CDLL(None, use_errno=True)
_pread = _libc.pread
_pread.restype, _pread.argtypes = ctypes.c_int64, [ctypes.c_int, ctypes.c_uint64, ctypes.c_uint64, ctypes.c_int64]
_errno_location = _libc.__errno_location
_errno_location.restype, _errno_location.argtypes = ctypes.c_uint64, []


@njit(nogil=True)
def _pread_run(fd, offsets, lengths, dsts, needed, block, retries, faults, res):
    """The reads one after another, each until it has its bytes, fails or hits the end of the file."""
    n = offsets.shape[0]
    for i in range(n):
        off, dst, length, left, attempts = np.int64(offsets[i]), np.int64(dsts[i]), np.int64(lengths[i]), \
            needed[i], 0
        while True:
            r = _pread(fd, np.uint64(dst), np.uint64(length), off)
            if r < 0:
                r = -np.int64(load_i32(_errno_location()))
            r = inject(r, block, faults)
            if r < 0:
                if r == -_EAGAIN or r == -_EINTR or attempts < retries:
                    attempts += 1
                    continue
                res[i] = r
                break
            if r == 0:
                res[i] = -_ENODATA
                break
            left -= r
            if left <= 0:
                res[i] = 0
                break
            off += r
            dst += r
            length -= r


class PreadEngine:
    """The fallback: the same reads through ``pread`` on ``threads`` threads (GIL released).

    Examples
    --------
    >>> engine = PreadEngine(threads=2)
    >>> engine.close()
    """

    name = "pread"

    def __init__(self, threads: int = 4, retries: int = 3) -> None:
        self.threads, self.retries = int(threads), int(retries)
        self.limit = self.threads  # reads in flight (threads used; more than threads counts as threads)
        self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="directload-pread") \
            if self.threads > 1 else None
        self._pool_cpu = 0.0

    def read(self, fd: int, offsets: np.ndarray, lengths: np.ndarray, dsts: np.ndarray, needed: np.ndarray,
             block: int) -> np.ndarray:
        """Run the reads; returns ``res`` (0 per completed read, ``-errno`` per failed or unfinished one)."""
        res = np.full(offsets.shape[0], -errno.EIO, np.int64)
        n = offsets.shape[0]
        parts = max(1, min(self.threads, self.limit))
        if self._pool is None or parts == 1 or n < 4 * parts:
            _pread_run(fd, offsets, lengths, dsts, needed, block, self.retries, FAULTS, res)
            return res
        bounds = np.linspace(0, n, parts + 1).astype(np.int64)
        futures = [self._pool.submit(timed, _pread_run, fd, offsets[a:b], lengths[a:b], dsts[a:b], needed[a:b],
                                     block, self.retries, FAULTS, res[a:b]) for a, b in zip(bounds[:-1], bounds[1:])]
        wait(futures)
        self._pool_cpu += sum(fut.result() for fut in futures)
        return res

    def take_cpu_seconds(self) -> float:
        """CPU seconds its own threads spent since the last call (the caller's thread is not counted)."""
        cpu, self._pool_cpu = self._pool_cpu, 0.0
        return cpu

    def close(self) -> None:
        """Stop its threads."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)
