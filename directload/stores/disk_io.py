"""Block reads for the disk store: the read planner, io_uring and pread engines, and the copy-out.

Everything per row or per read runs in Numba-compiled loops with the GIL
released; Python sees one call per batch.

* :func:`plan_reads` turns sorted, unique row ids into block-aligned reads:
  rows that share a block are read once, and reads whose gap is at most
  ``merge_gap`` bytes are merged (up to ``max_read`` bytes).
* :class:`UringEngine` submits them through io_uring, calling liburing's C
  functions (from the ``liburing`` package's library) from compiled code:
  up to ``queue_depth`` reads in flight, short reads resubmitted, ``EAGAIN``
  / ``EINTR`` retried, other errors retried ``retries`` times.
* :class:`PreadEngine` is the fallback where io_uring is missing or
  forbidden: the same reads through ``pread`` on a few threads.
* :func:`copy_rows_range` copies each requested row of a staging round from the
  staging buffer into the output.

A read's result is the bytes it got, or ``-errno``; ``-ENODATA`` means the
file ended early (it shrank after it was opened).
"""

import ctypes
import errno
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor, wait

import numpy as np
from numba import njit, types
from numba.extending import intrinsic

from directload.capabilities import RING_BYTES, io_uring_usable, liburing_functions

__all__ = ["plan_reads", "copy_rows_range", "UringEngine", "PreadEngine", "uring_available", "FAULTS"]

#: Fault injection for tests: ``[errno to inject, completions to fail, completions to cut short]``.  The
#: engines read it at each call (a hook in the reader, as the reliability tests need); all zero in use.
FAULTS = np.zeros(3, np.int64)

_EAGAIN, _EINTR, _EBUSY, _ENODATA = errno.EAGAIN, errno.EINTR, errno.EBUSY, errno.ENODATA


@intrinsic
def _load_i32(typingctx, addr):
    """The int32 at an address (a completion's ``res``)."""
    def codegen(context, builder, signature, args):
        import llvmlite.ir as ir

        return builder.load(builder.inttoptr(args[0], ir.IntType(32).as_pointer()))
    return types.int32(types.uint64), codegen


@njit(cache=True, nogil=True)
def plan_reads(rows, row_nbytes, data_offset, file_bytes, block, merge_gap, max_read):
    """Block-aligned reads covering ``rows`` (sorted, unique).

    Returns ``(offsets, lengths, needed, row_pos)``: each read's file offset and
    length (multiples of ``block``), the bytes it must get (less than its length
    only where it runs past the end of the file), and where each row starts in
    the staging buffer that receives the reads back to back.
    """
    n = rows.shape[0]
    offsets = np.empty(n, np.uint64)
    lengths = np.empty(n, np.uint32)
    needed = np.empty(n, np.int64)
    row_pos = np.empty(n, np.int64)
    end_of_file = (file_bytes + block - 1) // block * block
    k = -1
    cur_start = 0
    cur_end = 0
    stage = 0
    for i in range(n):
        s = data_offset + rows[i] * row_nbytes
        e = s + row_nbytes
        bs = s // block * block
        be = min((e + block - 1) // block * block, end_of_file)
        if k >= 0 and bs <= cur_end + merge_gap and max(be, cur_end) - cur_start <= max_read:
            if be > cur_end:
                cur_end = be
        else:
            if k >= 0:
                offsets[k] = cur_start
                lengths[k] = cur_end - cur_start
                stage += cur_end - cur_start
            k += 1
            cur_start = bs
            cur_end = be
        row_pos[i] = stage + (s - cur_start)
    if k >= 0:
        offsets[k] = cur_start
        lengths[k] = cur_end - cur_start
    k += 1
    for j in range(k):
        needed[j] = min(np.int64(lengths[j]), file_bytes - np.int64(offsets[j]))
    return offsets[:k], lengths[:k], needed[:k], row_pos


@njit(cache=True, nogil=True)
def copy_rows_range(staging, row_pos, inverse, out, row_nbytes, lo, hi):
    """``out[i] = staging[row_pos[inverse[i]] : +row_nbytes]`` (bytes) for the outputs whose unique row is in
    ``[lo, hi)`` (one staging round)."""
    for i in range(inverse.shape[0]):
        u = inverse[i]
        if lo <= u < hi:
            p = row_pos[u]
            o = i * row_nbytes
            out[o:o + row_nbytes] = staging[p:p + row_nbytes]


@njit(nogil=True)
def _inject(r, block, faults):
    """``r`` after the test hook :data:`FAULTS`: an error instead of a result, or a result cut short."""
    if r > 0 and faults[1] > 0:
        faults[1] -= 1
        return -faults[0]
    if r > block and faults[2] > 0:
        faults[2] -= 1
        return (r // 2) // block * block
    return r


@njit(nogil=True)
def _complete(i, r, block, faults, cur_off, cur_dst, cur_len, left, attempts, retries, res, stack, top):
    """Account one completion; returns ``(finished 0/1, new stack top)``."""
    r = _inject(r, block, faults)
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
            done, top = _complete(i, np.int64(_load_i32(c + np.uint64(8))), block, faults, cur_off, cur_dst,
                                  cur_len, left, attempts, retries, res, stack, top)
            finished += done
        _cq_advance(ring, np.uint32(got))
        inflight -= got
    return status


def uring_available():
    """Whether io_uring can be used here: the kernel lets a ring be set up (the one probe, in
    ``directload.capabilities``) and the read loop's functions are liburing's own (:func:`_uring`)."""
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

    def __init__(self, queue_depth=64, rings=1, retries=3, submit_batch=1):
        f = _uring()
        if not f:
            raise OSError(errno.ENOSYS, "io_uring is not available (the liburing package does not load)")
        self.queue_depth, self.retries, self.submit_batch = int(queue_depth), int(retries), int(submit_batch)
        self.limit = self.queue_depth  # reads in flight per ring, at most queue_depth (a node budget lowers it)
        self._f = f
        self._rings = []
        self._pool = None  # set before any ring, so a failed setup closes cleanly
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

    def read(self, fd, offsets, lengths, dsts, needed, block):
        """Run the reads; returns ``res`` (0 per completed read, ``-errno`` per failed or unfinished one)."""
        res = np.full(offsets.shape[0], -errno.EIO, np.int64)
        parts = len(self._rings)
        if parts == 1 or offsets.shape[0] < 2 * self.queue_depth:
            self._read_part(fd, offsets, lengths, dsts, needed, block, res)
            return res
        bounds = np.linspace(0, offsets.shape[0], parts + 1).astype(np.int64)
        futures = [self._pool.submit(_timed, self._read_part, fd, offsets[a:b], lengths[a:b], dsts[a:b],
                                     needed[a:b], block, res[a:b]) for a, b in zip(bounds[:-1], bounds[1:])]
        wait(futures)  # every part has stopped writing into the buffers before anything is raised
        self._pool_cpu += sum(fut.result() for fut in futures)
        return res

    def take_cpu_seconds(self):
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

    def close(self):
        if self._pool is not None:
            self._pool.shutdown(wait=True)
        for ring, _ in self._rings:
            self._f["queue_exit"](ctypes.addressof(ring))
        self._rings = []


def _timed(fn, *args):
    """Run ``fn(*args)``; the CPU seconds this thread spent."""
    c0 = time.thread_time()
    fn(*args)
    return time.thread_time() - c0


_libc = ctypes.CDLL(None, use_errno=True)
_pread = _libc.pread
_pread.restype, _pread.argtypes = ctypes.c_int64, [ctypes.c_int, ctypes.c_uint64, ctypes.c_uint64, ctypes.c_int64]
_errno_location = _libc.__errno_location
_errno_location.restype, _errno_location.argtypes = ctypes.c_uint64, []


@njit(nogil=True)
def _pread_run(fd, offsets, lengths, dsts, needed, block, retries, faults, res):
    n = offsets.shape[0]
    for i in range(n):
        off, dst, length, left, attempts = np.int64(offsets[i]), np.int64(dsts[i]), np.int64(lengths[i]), \
            needed[i], 0
        while True:
            r = _pread(fd, np.uint64(dst), np.uint64(length), off)
            if r < 0:
                r = -np.int64(_load_i32(_errno_location()))
            r = _inject(r, block, faults)
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

    def __init__(self, threads=4, retries=3):
        self.threads, self.retries = int(threads), int(retries)
        self.limit = self.threads  # reads in flight (threads used; more than threads counts as threads)
        self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="directload-pread") \
            if self.threads > 1 else None
        self._pool_cpu = 0.0

    def read(self, fd, offsets, lengths, dsts, needed, block):
        res = np.full(offsets.shape[0], -errno.EIO, np.int64)
        n = offsets.shape[0]
        parts = max(1, min(self.threads, self.limit))
        if self._pool is None or parts == 1 or n < 4 * parts:
            _pread_run(fd, offsets, lengths, dsts, needed, block, self.retries, FAULTS, res)
            return res
        bounds = np.linspace(0, n, parts + 1).astype(np.int64)
        futures = [self._pool.submit(_timed, _pread_run, fd, offsets[a:b], lengths[a:b], dsts[a:b], needed[a:b],
                                     block, self.retries, FAULTS, res[a:b]) for a, b in zip(bounds[:-1], bounds[1:])]
        wait(futures)
        self._pool_cpu += sum(fut.result() for fut in futures)
        return res

    def take_cpu_seconds(self):
        """CPU seconds its own threads spent since the last call (the caller's thread is not counted)."""
        cpu, self._pool_cpu = self._pool_cpu, 0.0
        return cpu

    def close(self):
        if self._pool is not None:
            self._pool.shutdown(wait=True)
