"""``DiskStore``: rows read straight from an SSD with io_uring and O_DIRECT, no root, no page cache."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch

from directload.files import CorruptFileError
from directload.kernels.devices import MAPPED, memory_of
from directload.kernels.host_pool import default_pool
from directload.units import check_int

from . import disk_staging
from .base import FeatureStore
from .disk_counters import DiskCounters
from .disk_io import read_error
from .disk_open import DirectIOWarning, check_options, io_path, make_engine, open_layout
from .futures import ReadFuture
from .held import ReadBuffer, nbytes_of
from .reads import deliver
from .records import Staged

# DirectIOWarning and io_path live in .disk_open; they are importable from here as they were before.
__all__ = ["DiskStore", "DirectIOWarning", "io_path"]

_POOL_BYTES = 1 << 20
_fork_lock = threading.Lock()  # a forked child's first reads start its engine once


def _after_fork_in_child():
    global _fork_lock
    _fork_lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)


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
    _counts: DiskCounters

    def __init__(self, path: os.PathLike[str] | str, *, dtype: torch.dtype | None = None,
                 shape: Sequence[int] | None = None, offset: int = 0, queue_depth: int = 64, rings: int = 1,
                 engine: str = "auto", direct: bool | str = "auto", merge_gap: int = 0, max_read: int = 128 << 10,
                 retries: int = 3, staging_bytes: int = 64 << 20, submit_batch: int = 1,
                 _expect: tuple[int | None, int | None, str | None] | None = None) -> None:
        super().__init__()
        self.path, self._options = check_options(
            path, dtype=dtype, shape=shape, offset=offset, queue_depth=queue_depth, rings=rings, engine=engine,
            direct=direct, merge_gap=merge_gap, max_read=max_read, retries=retries, staging_bytes=staging_bytes,
            submit_batch=submit_batch)
        self.engine_name = io_path(engine)
        self._submit_lock = threading.Lock()  # a read is submitted, or the store closed, never both at once
        self._counts = DiskCounters()
        self._pid: int | None = None
        self._collected = False  # closed by the collector (__del__): its worker is not joined
        self._io_limit = queue_depth
        self._staging = ReadBuffer(limit=staging_bytes)  # grown to what a round needs, at most staging_bytes
        # the layout (a store's current generation) and that very file, opened with O_DIRECT where it can be
        self._layout, self._fd, self.block, self.direct = open_layout(
            self.path, dtype=dtype, shape=shape, offset=offset, direct=direct, expect=_expect, stacklevel=2)
        self.id_map = self._layout.id_map  # a renumbered store (hot rows packed together): applied to every read
        self._start()

    @staticmethod
    def bytes_for(num_rows: int, row_nbytes: int, *, batch_rows: int = 0, staging_bytes: int = 64 << 20,
                  renumbered: bool = False) -> dict[str, int]:
        """At most the host bytes a disk store holds (:meth:`~directload.stores.FeatureStore.held_bytes`) while
        it reads batches of ``batch_rows`` rows, before it is opened: its ``"staging"`` (a round of reads)
        and, for a file ``renumbered`` by hotness, the id map (``"bookkeeping"``).  The rows a read returns
        are the caller's.

        Examples
        --------
        >>> DiskStore.bytes_for(10 ** 6, 4096, batch_rows=15_000)
        {'staging': 67108864, 'bookkeeping': 0}
        """
        batch = min(int(batch_rows), int(num_rows)) * int(row_nbytes)
        staging = ReadBuffer.size_for(min(batch, staging_bytes), staging_bytes) if batch else 0
        return {"staging": staging, "bookkeeping": 8 * int(num_rows) if renumbered else 0}

    # ---------------------------------------------------------------- shape
    @property
    def num_rows(self) -> int:
        return self._layout.shape[0]

    @property
    def row_shape(self) -> tuple[int, ...]:
        return self._layout.shape[1:]

    @property
    def dtype(self) -> torch.dtype:
        return self._layout.dtype

    @property
    def codec(self) -> str | None:
        """The codec whose code rows this store holds (one written with ``write_disk_store(codec=...)``): its
        reads return code rows, which a :class:`~directload.stores.DecodingStore` decodes.  None: plain rows."""
        return self._layout.codec

    # ---------------------------------------------------------- per process
    def _start(self):
        """The engine and the read thread of this process (the file stays open across fork)."""
        o = self._options
        engine = make_engine(self.engine_name, queue_depth=o["queue_depth"], rings=o["rings"], retries=o["retries"],
                             submit_batch=o["submit_batch"])
        engine.limit = self._io_limit
        self._engine = engine
        self._worker = ThreadPoolExecutor(1, thread_name_prefix="directload-disk")
        self._pid = os.getpid()

    def _after_fork(self):
        # The parent's read thread and rings did not come along, and a lock its threads held at the
        # fork would stay held here: fresh locks now, a fresh engine at the first read.
        self._submit_lock = threading.Lock()
        self._staging = ReadBuffer(limit=self._options["staging_bytes"])

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
    def hot_ids(self) -> np.ndarray | None:
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
            # Reads go in rounds through one reused staging buffer of at most staging_bytes (plus one read).
            staging = self._staging_buffer(min(p.total, p.chunk))
            disk_staging.read_in_rounds(p, staging, host.view(torch.uint8).numpy().reshape(-1), rnb,
                                     lambda a, b: self._read_round(p, a, b, staging))
            self._count_reads(p)
        self._count_batch(n)
        return deliver(host, out, device)

    def _read_zero_copy(self, p, n, out, device):
        """The ``n`` rows of plan ``p``, when it fits one staging round, gathered straight from staging
        into ``out`` on ``device`` by the tiered gather (zero-copy from mapped staging on a GPU), or None
        where that does not apply: a batch that needs several rounds, rows not element-aligned in the
        file, staging the GPU cannot map.  On the CPU (``device`` cpu) the same path runs the CPU tiered
        kernel."""
        elem = disk_staging.flat_element(self.dtype, self._layout.data_offset)
        if elem is None:
            return None
        if device.type == "cuda":
            torch.cuda.init()  # the result goes there anyway; then pinned staging counts as mapped
        if p.total > p.chunk:
            return None
        staging = self._staging_buffer(p.total)
        if device.type == "cuda" and memory_of(torch.from_numpy(staging)) != MAPPED:
            return None
        result = disk_staging.gather_staged(*self._one_round(p, staging, elem), self.row_shape, out, device)
        self._count_batch(n, zero_copy=True)
        return result

    def _stage(self, rows, into, mapped):
        """Read ``rows`` into the caller's buffer (block-aligned reads, one round) and give the rows'
        element offsets there: a cache's fused gather reads them in place.  The copy path where the rows
        are off their element grid or the reads need several rounds."""
        self._this_process()
        elem = disk_staging.flat_element(self.dtype, self._layout.data_offset)
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

    def _one_round(self, p, staging, elem):
        """Plan ``p`` read in one round into ``staging``: the flat tier (this store's dtype) and each
        asked-for row's element offset in it, in the order asked (an id map leaves them unsorted)."""
        self._read_round(p, 0, p.offsets.shape[0], staging)
        self._count_reads(p)
        return torch.from_numpy(staging[:p.total]).view(self.dtype), p.row_pos[p.inverse] // elem

    def _plan(self, ids):
        """The reads of a batch: unique rows, block-aligned merged reads and each row's place in staging."""
        layout, o = self._layout, self._options
        p = disk_staging.plan_batch(ids, self.row_nbytes, layout.data_offset, layout.file_bytes, self.block,
                                 o["merge_gap"], o["max_read"], o["staging_bytes"])
        if os.fstat(self._fd).st_size != layout.file_bytes:
            raise CorruptFileError(f"{self.path}: the file changed size after it was opened "
                                   f"({layout.file_bytes} -> {os.fstat(self._fd).st_size} bytes)")
        return p

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
            raise read_error(self.path, int(-res[bad[0]]), int(p.offsets[k]), int(p.lengths[k]),
                             self._options["retries"])

    def _count_reads(self, p):
        self._counts.add(unique_rows=p.rows.shape[0], bytes_read=p.total, reads=p.offsets.shape[0],
                         io_seconds=p.io_seconds, cpu_seconds=p.cpu_seconds + self._engine.take_cpu_seconds())

    def _count_batch(self, n, zero_copy=False):
        self._counts.add(rows=n, requested_bytes=n * self.row_nbytes, batches=1, zero_copy_batches=zero_copy)

    def _own_memory(self):
        staging = self._staging.array
        return () if staging is None else (staging,)

    def _bookkeeping_bytes(self):
        return nbytes_of(self.id_map)

    def _staging_buffer(self, nbytes):
        """The store's staging buffer (page-aligned for O_DIRECT, pinned where CUDA runs), at least ``nbytes``."""
        return self._staging.take(nbytes)

    # ------------------------------------------------------------- counters
    def set_io_depth(self, depth: int) -> int:
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
        """Counters since open (or :meth:`reset_stats`), as :meth:`stats` reports them
        (:meth:`~directload.stores.disk_counters.DiskCounters.report` says what each means)."""
        o = self._options
        return self._counts.report(self.row_nbytes, engine=self.engine_name, direct=self.direct, block=self.block,
                                   queue_depth=o["queue_depth"], io_depth=self._io_limit, rings=o["rings"],
                                   submit_batch=o["submit_batch"])

    # ------------------------------------------------------------- lifetime
    def _close(self):
        with self._submit_lock:  # a submit in progress ends first; later ones see the store closed
            pass
        try:
            if self._pid == os.getpid():
                # Reads in flight finish first; a store dropped by its own last read closes on the worker,
                # which cannot wait for itself (it is finishing that read).
                on_worker = threading.current_thread() in getattr(self._worker, "_threads", ())
                self._worker.shutdown(wait=not (on_worker or self._collected))
                self._engine.close()
        finally:
            os.close(self._fd)
            self._staging.release()  # back to the pinned pool (a read still running keeps its own reference)

    def __del__(self):
        if not getattr(self, "_closed", True) and getattr(self, "_pid", None) == os.getpid():
            # Collected: no read in flight refers to it, so its worker is told to end, not joined.  A collection
            # can run inside threading's own bookkeeping (a thread starting), where a join deadlocks.
            self._collected = True
            try:
                self.close()
            except Exception:  # noqa: BLE001 - interpreter shutdown: nothing left to report to
                pass

    def __repr__(self):
        state = ", closed" if self._closed else ""
        return f"DiskStore({str(self.path)!r}, shape={self.shape}, dtype={self.dtype}{state})"


def _reopen(path, options, expect):
    return DiskStore(path, **options, _expect=expect)
