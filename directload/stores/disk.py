"""``DiskStore``: rows read straight from an SSD with io_uring and O_DIRECT, no root, no page cache."""

import os
import threading
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch

from directload.buffers import StagingBuffer, aligned
from directload.files import CorruptFileError
from directload.kernels.carriers import ELEMENT_SIZES
from directload.kernels.devices import MAPPED, memory_of
from directload.kernels.host_pool import default_pool
from directload.kernels.tiered import flat_where, gather_tiered
from directload.units import check_int

from . import disk_io
from .base import FeatureStore, ReadFuture, deliver
from .disk_format import OPEN_ATTEMPTS, raw_layout, read_layout
from .records import Staged

__all__ = ["DiskStore", "DirectIOWarning", "io_path"]

_MAX_BLOCK = 1 << 16
_POOL_BYTES = 1 << 20
_MAX_READ = 1 << 30  # one read's length is a 32-bit count
_fork_lock = threading.Lock()  # a forked child's first reads start its engine once


def _after_fork_in_child():
    global _fork_lock
    _fork_lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)


class DirectIOWarning(UserWarning):
    """The file system refuses O_DIRECT (tmpfs, ``/dev/shm``): reads go through the page cache.

    Examples
    --------
    >>> issubclass(DirectIOWarning, UserWarning)
    True
    """


def io_path(engine="auto"):
    """The read path a :class:`DiskStore` takes here: ``"io_uring"`` or ``"pread"``."""
    if engine not in ("auto", "io_uring", "pread"):
        raise ValueError(f"engine must be 'auto', 'io_uring' or 'pread', not {engine!r}")
    if engine == "auto":
        return "io_uring" if disk_io.uring_available() else "pread"
    return engine


def _sysfs_block(fd):
    """The logical block size the kernel reports for the file's device, or None."""
    dev = os.fstat(fd).st_dev
    base = f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}"
    for where in (f"{base}/queue/logical_block_size", f"{base}/../queue/logical_block_size"):
        try:
            with open(where) as f:
                return int(f.read())
        except (OSError, ValueError):
            continue
    return None


def _probe_block(fd, hint):
    """The smallest O_DIRECT read granularity that works, measured: ``hint`` (sysfs) first, doubling."""
    buf = aligned(_MAX_BLOCK, pin="never")
    block = hint if hint and hint & (hint - 1) == 0 else 512
    while block <= _MAX_BLOCK:
        try:
            os.preadv(fd, [memoryview(buf[:block])], 0)
            return block
        except OSError as exc:
            if exc.errno != 22:  # EINVAL: misaligned for this device
                raise
            block *= 2
    raise OSError(22, "no O_DIRECT read granularity up to 64 KiB works on this file")


class DiskStore(FeatureStore):
    """Rows of a ``.npy`` file on disk, read on demand with io_uring and O_DIRECT.

    Reads bypass the page cache (``O_DIRECT``), aligned to the device's logical
    block size, measured at open.  Rows that share a block are read once, and
    neighbouring blocks are merged into one read.  Reads land in a staging
    buffer and are copied out into the result (on the CPU; a GPU result is then
    copied over).  Any C-ordered ``.npy`` file can be opened; one written by
    :func:`~directload.stores.write_disk_store` has its rows aligned to 4 KiB
    and a checksummed sidecar that is checked at open.

    Parameters
    ----------
    path : str or os.PathLike
        A ``.npy`` file, or raw row-major bytes with ``dtype`` and ``shape``.
    dtype, shape, offset : optional
        For a raw file: the rows' torch dtype, the table's shape (rows first)
        and the byte offset of row 0.
    queue_depth : int
        Reads in flight per ring (default 64).
    rings : int
        Rings, each driven by its own thread (default 1; a fast NVMe drive may
        want 2-4).
    submit_batch : int
        io_uring reads handed to the kernel per system call (default 1: each
        read is submitted as soon as it is prepared, as fio does).  Measured on
        this project's virtual disk at QD 64 and 512 B reads: 1 and 2 reach
        0.96-0.97x fio's IOPS, 8 reaches 0.93x, and one submit per refill
        (the whole queue at once) 0.84x, because a batch is plugged and
        dispatched to the device together, which doubled the device's latency
        per read.  Larger batches save CPU where a drive does not mind them.
    engine : {"auto", "io_uring", "pread"}
        ``auto`` takes io_uring where the ``liburing`` package loads and the
        kernel allows it, else a pread thread pool.
    direct : {"auto", True, False}
        O_DIRECT.  ``auto`` falls back to the page cache with a
        :class:`DirectIOWarning` where the file system refuses it.
    merge_gap : int, optional
        Merge two reads when at most this many bytes lie between them (default:
        none, only touching blocks).
    max_read : int
        Bytes per merged read at most (default 128 KiB).
    retries : int
        Retries of a read that failed with an I/O error before it is raised.
    staging_bytes : int
        Size of the store's one staging buffer (default 64 MiB): a batch
        whose reads need more is read in rounds, each copied out before the
        next, so memory stays bounded whatever the batch size.  Where CUDA
        runs, the buffer is pinned host memory from directload's pinned pool
        (``directload.memory``), so the GPU can read it; elsewhere it is
        ordinary memory.

    Memory contract
    ---------------
    As :class:`~directload.stores.FeatureStore`.  The file's rows are never
    cached in host memory by the store (or, with O_DIRECT, by the kernel).
    Reads run on a background thread; ``close()`` waits for them.  A forked
    child opens its own file and ring on its first read; a pickled store (for
    ``torch.multiprocessing``) reopens the file in the receiving process.

    Raises
    ------
    CorruptFileError
        At open: a bad header, a truncated file, or a sidecar that disagrees
        with the file.  At read: the file shrank after it was opened.
    OSError
        From ``wait()``: a read that still failed after ``retries`` retries,
        naming the path, offset and length.

    Examples
    --------
    >>> import tempfile, os, numpy as np
    >>> from directload.stores import write_disk_store
    >>> rows = np.arange(12, dtype=np.float32).reshape(6, 2)
    >>> path = write_disk_store(rows, os.path.join(tempfile.mkdtemp(), "f.npy"), progress=False)
    >>> with DiskStore(path) as store:
    ...     store.read([5, 0]).tolist()
    [[10.0, 11.0], [0.0, 1.0]]
    """

    tier = "disk"

    def __init__(self, path, *, dtype=None, shape=None, offset=0, queue_depth=64, rings=1, engine="auto",
                 direct="auto", merge_gap=0, max_read=128 << 10, retries=3, staging_bytes=64 << 20, submit_batch=1,
                 _expect=None):
        super().__init__()
        for name, value, low, high in (("queue_depth", queue_depth, 1, 4096), ("rings", rings, 1, None),
                                       ("merge_gap", merge_gap, 0, None), ("max_read", max_read, 1, _MAX_READ),
                                       ("retries", retries, 0, None), ("staging_bytes", staging_bytes, 4096, None),
                                       ("submit_batch", submit_batch, 1, None)):
            check_int(name, value, low=low, high=high)
        if direct not in ("auto", True, False):
            raise ValueError(f"direct must be 'auto', True or False, not {direct!r}")
        self.path = Path(path)
        if (dtype is None) != (shape is None):
            raise ValueError("a raw file needs both dtype and shape (a .npy file needs neither)")
        self._options = dict(dtype=dtype, shape=shape, offset=offset, queue_depth=queue_depth, rings=rings,
                             engine=engine, direct=direct,
                             merge_gap=merge_gap, max_read=max_read, retries=retries, staging_bytes=staging_bytes,
                             submit_batch=submit_batch)
        self.engine_name = io_path(engine)
        self._lock = threading.Lock()
        self._submit_lock = threading.Lock()  # a read is submitted, or the store closed, never both at once
        self._stats = dict.fromkeys(("rows", "unique_rows", "requested_bytes", "bytes_read", "reads",
                                     "io_seconds", "cpu_seconds", "batches", "zero_copy_batches"), 0)
        self._pid = None
        self._io_limit = queue_depth
        self._staging = StagingBuffer(minimum=1, growth_limit=staging_bytes)
        self._fd = self._open_file(_expect)
        self._start()

    def _open_file(self, expect=None):
        """Read the layout (a store's current generation, its id map checked) and open that very file for
        I/O; a writer publishing a new generation meanwhile makes it read again.  ``expect``: the
        ``(device, inode, token)`` a pickled store had, which the file reopened must have too."""
        for _ in range(OPEN_ATTEMPTS):
            if self._options["dtype"] is None:
                layout = read_layout(self.path, with_id_map=True)
            else:
                layout = raw_layout(self.path, self._options["dtype"], self._options["shape"],
                                    self._options["offset"])
            if expect is not None and (layout.device, layout.inode, layout.token) != tuple(expect):
                raise CorruptFileError(f"{self.path}: the store was rewritten or replaced since this DiskStore "
                                       "was opened in the process that sent it; open it again")
            if layout.row_nbytes > _MAX_READ - 2 * _MAX_BLOCK:
                raise ValueError(f"{self.path}: rows of {layout.row_nbytes} bytes; a disk store reads rows of "
                                 "up to 1 GiB")
            try:
                fd = self._open_direct(layout.path)
            except FileNotFoundError:
                continue  # the generation went: a new one was published since its layout was read
            st = os.fstat(fd)
            if (st.st_dev, st.st_ino, st.st_size) == (layout.device, layout.inode, layout.file_bytes):
                self._layout = layout
                # a renumbered store (hot rows packed together): its id map, applied to every read
                self.id_map = layout.id_map
                return fd
            os.close(fd)
        raise CorruptFileError(f"{self.path}: the file kept changing while it was being opened")

    # ---------------------------------------------------------------- shape
    @property
    def num_rows(self):
        return self._layout.shape[0]

    @property
    def row_shape(self):
        return self._layout.shape[1:]

    @property
    def dtype(self):
        return self._layout.dtype

    # ---------------------------------------------------------- per process
    def _open_direct(self, path):
        """``path`` opened for reads, with O_DIRECT where the file system takes it (``self.block`` set)."""
        flags = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0)
        direct = self._options["direct"]
        fd = None
        if direct is not False:
            try:
                fd = os.open(path, flags | os.O_DIRECT)
                self.block = _probe_block(fd, _sysfs_block(fd))
            except OSError as exc:
                if fd is not None:
                    os.close(fd)
                    fd = None
                if exc.errno != 22 or direct is True:
                    raise
                warnings.warn(f"{self.path}: the file system refuses O_DIRECT; reading through the page cache "
                              "(rows read stay cached by the kernel)", DirectIOWarning, stacklevel=4)
        self.direct = fd is not None
        if fd is None:
            fd = os.open(path, flags)
            self.block = 512  # no alignment needed; 512-byte reads keep the copy small
        return fd

    # ---------------------------------------------------------- per process
    def _start(self):
        """The engine and the read thread of this process (the file stays open across fork)."""
        o = self._options
        if self.engine_name == "io_uring":
            engine = disk_io.UringEngine(o["queue_depth"], o["rings"], o["retries"], o["submit_batch"])
        else:
            engine = disk_io.PreadEngine(max(4, o["rings"] * 4), o["retries"])
        engine.limit = self._io_limit
        self._engine = engine
        self._worker = ThreadPoolExecutor(1, thread_name_prefix="directload-disk")
        self._pid = os.getpid()

    def _after_fork(self):
        # The parent's read thread and rings did not come along, and a lock its threads held at the
        # fork would stay held here: fresh locks now, a fresh engine at the first read.
        self._lock, self._submit_lock = threading.Lock(), threading.Lock()
        self._staging = StagingBuffer(minimum=1, growth_limit=self._options["staging_bytes"])

    def _this_process(self):
        if self._pid != os.getpid():
            # A forked child's first read: its own engine and read thread.  The descriptor came along,
            # and it is the very generation the parent read (the path could name a newer one by now).
            with _fork_lock:
                if self._pid != os.getpid():
                    self._start()

    def __reduce__(self):
        layout = self._layout
        return _reopen, (str(layout.path if self._options["dtype"] is None else self.path), self._options,
                         (layout.device, layout.inode, layout.token))

    # ---------------------------------------------------------------- reads
    def hot_ids(self):
        """A renumbered store's ids in file order, hottest first (None for a file in its own order)."""
        if self.id_map is None:
            return None
        ids = np.empty_like(self.id_map)  # the map's inverse: the id at each row of the file
        ids[self.id_map] = np.arange(self.id_map.shape[0], dtype=self.id_map.dtype)
        return ids

    def _read_async(self, index, out, run_device, out_device):
        self._this_process()
        # A copy: the read runs later, and the caller may reuse its ids (or the array they share) at once.
        ids = np.array(index.cpu().numpy(), dtype=np.int64, copy=True)
        if self.id_map is not None:
            ids = self.id_map[ids]
        pin = out_device.type == "cuda"
        return ReadFuture(future=self._submit(self._read, ids, out, out_device, pin))

    def _submit(self, fn, *args):
        """``fn(*args)`` on the read thread; :class:`ClosedError` once the store is closed, whichever thread
        closed it, never the executor's own "cannot schedule new futures after shutdown"."""
        with self._submit_lock:
            self.check_open()
            return self._worker.submit(fn, *args)

    def _read(self, ids, out, device, pin):
        n, rnb = ids.shape[0], self.row_nbytes
        p = self._plan(ids) if n and rnb else None  # planned once, for either path
        if p is not None and device.type == "cuda" and (out is None or out.is_cuda):
            got = self._read_zero_copy(p, n, out, device)
            if got is not None:
                return got
        if out is not None and out.device.type == "cpu":
            host = out
        elif pin and torch.cuda.is_available():
            host = torch.empty((n, *self.row_shape), dtype=self.dtype, pin_memory=True)
        elif n * rnb >= _POOL_BYTES:  # recycled pages: a fresh large output is faulted in page by page
            host = default_pool().empty((n, *self.row_shape), self.dtype)
        else:
            host = torch.empty((n, *self.row_shape), dtype=self.dtype)
        if p is not None:
            # Reads go in rounds through one reused staging buffer of at most staging_bytes (plus one read),
            # each round's rows copied out before the next, so a big batch needs no big second copy of itself.
            staging = self._staging_buffer(min(p.total, p.chunk))
            out_bytes = host.view(torch.uint8).numpy().reshape(-1)
            row_read = np.searchsorted(p.starts, p.row_pos, side="right") - 1
            a = 0
            while a < p.offsets.shape[0]:
                b = max(int(np.searchsorted(p.ends, p.starts[a] + p.chunk, side="right")), a + 1)  # reads that fit
                self._read_round(p, a, b, staging)
                lo, hi = np.searchsorted(row_read, [a, b])
                disk_io.copy_rows_range(staging, p.row_pos - p.starts[a], p.inverse, out_bytes, rnb, lo, hi)
                a = b
            self._count_reads(p)
        self._count_batch(n)
        return deliver(host, out, device)

    def _read_zero_copy(self, p, n, out, device):
        """The ``n`` rows of plan ``p``, when it fits one staging round, gathered straight from staging
        into ``out`` on ``device`` by the tiered gather (zero-copy from mapped staging on a GPU), or None
        where that does not apply: a batch that needs several rounds, rows not element-aligned in the
        file, staging the GPU cannot map.  On the CPU (``device`` cpu) the same path runs the CPU tiered
        kernel."""
        elem = self._flat_elem()
        if elem is None:
            return None
        if device.type == "cuda":
            torch.cuda.init()  # the result goes there anyway; then pinned staging counts as mapped
        if p.total > p.chunk:
            return None
        staging = self._staging_buffer(p.total)
        if device.type == "cuda" and memory_of(torch.from_numpy(staging)) != MAPPED:
            return None
        flat, offs = self._one_round(p, staging, elem)
        where = torch.from_numpy(flat_where(offs)).to(device)
        cache = torch.empty((0, *self.row_shape), dtype=self.dtype, device=device)
        result = gather_tiered(cache, flat, where, out=out)
        if device.type == "cuda":
            torch.cuda.current_stream(device).synchronize()  # the staging buffer is the next read's
        self._count_batch(n, zero_copy=True)
        return result

    def _stage(self, rows, into, mapped):
        """Read ``rows`` into the caller's buffer (block-aligned reads, one round) and give the rows'
        element offsets there: a cache's fused gather reads them in place.  The copy path where the rows
        are off their element grid or the reads need several rounds."""
        self._this_process()
        elem = self._flat_elem()
        if rows.size and self.row_nbytes and elem is not None:
            physical = rows if self.id_map is None else self.id_map[rows]
            got = self._submit(self._stage_rows, physical, into, elem).result()
            if got is not None:
                return Staged(*got)
        return self._copy_stage(rows, into)

    def _stage_rows(self, rows, into, elem):
        p = self._plan(rows)
        if p.total > p.chunk:
            return None
        got = self._one_round(p, into(p.total), elem)
        self._count_batch(rows.shape[0])
        return got

    def _flat_elem(self):
        """The element size when the rows can be addressed as a flat tier (an element width the tiered
        gather moves, rows on their element grid in the file), else None: complex128, or rows off
        their grid, go through the copy path."""
        elem = torch.empty(0, dtype=self.dtype).element_size()
        return elem if elem in ELEMENT_SIZES and not self._layout.data_offset % elem else None

    def _one_round(self, p, staging, elem):
        """Plan ``p`` read in one round into ``staging``: the flat tier (this store's dtype) and each
        asked-for row's element offset in it, in the order asked (an id map leaves them unsorted)."""
        self._read_round(p, 0, p.offsets.shape[0], staging)
        self._count_reads(p)
        return torch.from_numpy(staging[:p.total]).view(self.dtype), p.row_pos[p.inverse] // elem

    def _plan(self, ids):
        """The reads of a batch: unique rows, block-aligned merged reads and each row's place in staging."""
        rows, inverse = np.unique(ids, return_inverse=True)
        layout = self._layout
        offsets, lengths, needed, row_pos = disk_io.plan_reads(
            rows, self.row_nbytes, layout.data_offset, layout.file_bytes, self.block, self._options["merge_gap"],
            max(self._options["max_read"], self.block))
        if os.fstat(self._fd).st_size != layout.file_bytes:
            raise CorruptFileError(f"{self.path}: the file changed size after it was opened "
                                   f"({layout.file_bytes} -> {os.fstat(self._fd).st_size} bytes)")
        ends = np.cumsum(lengths, dtype=np.int64)  # each read's place in one long staging run
        return SimpleNamespace(rows=rows, inverse=inverse.reshape(-1).astype(np.int64, copy=False), offsets=offsets,
                               lengths=lengths, needed=needed, row_pos=row_pos, starts=ends - lengths, ends=ends,
                               total=int(ends[-1]), chunk=max(self._options["staging_bytes"], int(lengths.max())),
                               io_seconds=0.0, cpu_seconds=0.0)

    def _read_round(self, p, a, b, staging):
        """Reads ``[a, b)`` of plan ``p`` into ``staging`` (read ``a`` at its start); an I/O error raises."""
        dsts = (p.starts[a:b] - p.starts[a]).astype(np.uint64) + np.uint64(staging.ctypes.data)
        t0, c0 = time.perf_counter(), time.thread_time()
        res = self._engine.read(self._fd, p.offsets[a:b], p.lengths[a:b], dsts, p.needed[a:b], self.block)
        p.io_seconds += time.perf_counter() - t0
        p.cpu_seconds += time.thread_time() - c0
        bad = np.flatnonzero(res < 0)
        if bad.size:
            k = a + bad[0]
            self._raise(int(-res[bad[0]]), int(p.offsets[k]), int(p.lengths[k]))

    def _count_reads(self, p):
        with self._lock:
            s = self._stats
            s["unique_rows"] += p.rows.shape[0]
            s["bytes_read"] += p.total
            s["reads"] += p.offsets.shape[0]
            s["io_seconds"] += p.io_seconds
            s["cpu_seconds"] += p.cpu_seconds + self._engine.take_cpu_seconds()

    def _count_batch(self, n, zero_copy=False):
        with self._lock:
            self._stats["rows"] += n
            self._stats["requested_bytes"] += n * self.row_nbytes
            self._stats["batches"] += 1
            self._stats["zero_copy_batches"] += zero_copy

    def _staging_buffer(self, nbytes):
        """The store's staging buffer (page-aligned for O_DIRECT, pinned where CUDA runs), at least ``nbytes``."""
        return self._staging.take(nbytes)

    def _raise(self, code, offset, length):
        where = f"{self.path}: read of {length} bytes at offset {offset}"
        if code == disk_io._ENODATA:
            raise CorruptFileError(f"{where} hit the end of the file: it shrank after it was opened")
        raise OSError(code, f"{where} failed after {self._options['retries']} retries: {os.strerror(code)}",
                      str(self.path))

    # ------------------------------------------------------------- counters
    def set_io_depth(self, depth):
        """Keep at most ``depth`` reads in flight per ring (at most the ``queue_depth`` opened with; the
        pread fallback: threads), from the next batch on, as a node budget's share of the disk's queue asks
        (:mod:`directload.budget`).  Returns the depth now in force.

        Examples
        --------
        >>> import tempfile, numpy as np
        >>> with tempfile.TemporaryDirectory() as d:
        ...     np.save(d + "/t.npy", np.zeros((8, 4), np.float32))
        ...     with DiskStore(d + "/t.npy", queue_depth=32) as store:
        ...         print(store.set_io_depth(8), store.set_io_depth(100), store.stats()["io_depth"])
        8 32 32
        """
        depth = check_int("depth", depth)
        self._io_limit = min(depth, self._options["queue_depth"])
        engine = getattr(self, "_engine", None)
        if engine is not None:
            engine.limit = self._io_limit
        return self._io_limit

    def _counters(self):
        """Counters since open (or :meth:`reset_stats`), as :meth:`stats` reports them.

        ``rows`` and ``requested_bytes`` count the ids asked for;
        ``unique_rows`` the distinct ones; ``bytes_read`` what the disk
        delivered, so ``read_amplification`` is ``bytes_read`` over the
        distinct rows' bytes; ``reads`` the requests issued; ``iops`` and
        ``gb_per_s`` are over the time spent in the engine; ``cpu_us_per_read``
        is the CPU time of the submitting threads per read;
        ``zero_copy_batches`` the batches a GPU gathered straight from the
        pinned staging buffer (the tiered gather), with no host copy.
        """
        with self._lock:
            s = dict(self._stats)
        unique_bytes = s["unique_rows"] * self.row_nbytes
        s.update(
            engine=self.engine_name, direct=self.direct, block=self.block,
            queue_depth=self._options["queue_depth"], io_depth=self._io_limit, rings=self._options["rings"],
            submit_batch=self._options["submit_batch"],
            read_amplification=s["bytes_read"] / unique_bytes if unique_bytes else 0.0,
            iops=s["reads"] / s["io_seconds"] if s["io_seconds"] else 0.0,
            gb_per_s=s["bytes_read"] / s["io_seconds"] / 1e9 if s["io_seconds"] else 0.0,
            cpu_us_per_read=s["cpu_seconds"] / s["reads"] * 1e6 if s["reads"] else 0.0)
        return s

    def _reset_counters(self):
        with self._lock:
            for key in self._stats:
                self._stats[key] = 0

    # ------------------------------------------------------------- lifetime
    def _close(self):
        with self._submit_lock:  # a submit in progress ends first; later ones see the store closed
            pass
        try:
            if self._pid == os.getpid():
                # Reads in flight finish first; a store dropped by its own last read closes on the worker,
                # which cannot wait for itself (it is finishing that read).
                on_worker = threading.current_thread() in getattr(self._worker, "_threads", ())
                self._worker.shutdown(wait=not on_worker)
                self._engine.close()
        finally:
            os.close(self._fd)
            self._staging.release()  # back to the pinned pool (a read still running keeps its own reference)

    def __del__(self):
        if not getattr(self, "_closed", True) and getattr(self, "_pid", None) == os.getpid():
            try:
                self.close()
            except Exception:  # noqa: BLE001 - interpreter shutdown: nothing left to report to
                pass

    def __repr__(self):
        state = ", closed" if self._closed else ""
        return f"DiskStore({str(self.path)!r}, shape={self.shape}, dtype={self.dtype}{state})"


def _reopen(path, options, expect):
    return DiskStore(path, **options, _expect=expect)
