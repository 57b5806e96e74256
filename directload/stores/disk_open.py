"""How a disk store opens: its options, its read path (io_uring or pread), its file (O_DIRECT, block measured).

:func:`check_options` checks what a :class:`~directload.stores.DiskStore` is opened with;
:func:`open_layout` reads the file's layout and opens that very file (a store's current generation, even
while a writer publishes a new one); :func:`open_direct` opens it with O_DIRECT where the file system takes
it, measuring the smallest read granularity that works, else through the page cache with a
:class:`DirectIOWarning`; :func:`make_engine` starts the engine :func:`io_path` names.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from directload.buffers import aligned
from directload.errors import DirectloadWarning
from directload.files import CorruptFileError
from directload.units import check_int

from . import disk_pread, disk_uring
from .disk_format import OPEN_ATTEMPTS, raw_layout, read_layout

if TYPE_CHECKING:
    import torch

    from .disk_format import Layout
    from .disk_pread import PreadEngine
    from .disk_uring import UringEngine

__all__ = ["DirectIOWarning", "check_options", "io_path", "make_engine", "open_layout", "open_direct", "MAX_BLOCK",
           "MAX_READ"]

MAX_BLOCK = 1 << 16  #: The largest O_DIRECT read granularity probed (64 KiB).
MAX_READ = 1 << 30  #: The most bytes one read may ask for (its length is a 32-bit count).


class DirectIOWarning(DirectloadWarning):
    """The file system refuses O_DIRECT (tmpfs, ``/dev/shm``): reads go through the page cache.

    Examples
    --------
    >>> issubclass(DirectIOWarning, UserWarning)
    True
    """


def check_options(path: os.PathLike[str] | str, *, dtype: torch.dtype | None, shape: Sequence[int] | None, offset: int,
                  queue_depth: int, rings: int, engine: str, direct: bool | str, merge_gap: int, max_read: int,
                  retries: int, staging_bytes: int, submit_batch: int) -> tuple[Path, dict[str, Any]]:
    """``(Path(path), options)``: a :class:`~directload.stores.DiskStore`'s path and options (its parameters,
    as a dict), each checked, or the first error.

    Examples
    --------
    >>> path, options = check_options("f.npy", dtype=None, shape=None, offset=0, queue_depth=64, rings=1,
    ...                               engine="auto", direct="auto", merge_gap=0, max_read=1 << 17, retries=3,
    ...                               staging_bytes=1 << 26, submit_batch=1)
    >>> path.name, options["queue_depth"]
    ('f.npy', 64)
    """
    for name, value, low, high in (("queue_depth", queue_depth, 1, 4096), ("rings", rings, 1, None),
                                   ("merge_gap", merge_gap, 0, None), ("max_read", max_read, 1, MAX_READ),
                                   ("retries", retries, 0, None), ("staging_bytes", staging_bytes, 4096, None),
                                   ("submit_batch", submit_batch, 1, None)):
        check_int(name, value, low=low, high=high)
    if direct not in ("auto", True, False):
        raise ValueError(f"direct must be 'auto', True or False, not {direct!r}")
    path = Path(path)
    if (dtype is None) != (shape is None):
        raise ValueError("a raw file needs both dtype and shape (a .npy file needs neither)")
    return path, dict(dtype=dtype, shape=shape, offset=offset, queue_depth=queue_depth, rings=rings, engine=engine,
                      direct=direct, merge_gap=merge_gap, max_read=max_read, retries=retries,
                      staging_bytes=staging_bytes, submit_batch=submit_batch)


def io_path(engine: str = "auto") -> str:
    """The read path a :class:`~directload.stores.DiskStore` takes here: ``"io_uring"`` or ``"pread"``.

    Parameters
    ----------
    engine : {"auto", "io_uring", "pread"}
        ``auto`` takes io_uring where it is usable
        (:func:`~directload.stores.disk_uring.uring_available`), else pread.

    Examples
    --------
    >>> io_path("pread"), io_path() in ("io_uring", "pread")
    ('pread', True)
    """
    if engine not in ("auto", "io_uring", "pread"):
        raise ValueError(f"engine must be 'auto', 'io_uring' or 'pread', not {engine!r}")
    if engine == "auto":
        return "io_uring" if disk_uring.uring_available() else "pread"
    return engine


def make_engine(name: str, *, queue_depth: int, rings: int, retries: int,
                submit_batch: int) -> UringEngine | PreadEngine:
    """A new engine of read path ``name`` (:func:`io_path`) in this process: io_uring with ``rings`` rings
    ``queue_depth`` deep, or pread on four threads per ring (four at least).

    Examples
    --------
    >>> engine = make_engine("pread", queue_depth=64, rings=2, retries=3, submit_batch=1)
    >>> engine.name, engine.threads
    ('pread', 8)
    >>> engine.close()
    """
    if name == "io_uring":
        return disk_uring.UringEngine(queue_depth, rings, retries, submit_batch)
    return disk_pread.PreadEngine(max(4, rings * 4), retries)


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
    buf = aligned(MAX_BLOCK, pin="never")
    block = hint if hint and hint & (hint - 1) == 0 else 512
    while block <= MAX_BLOCK:
        try:
            os.preadv(fd, [memoryview(buf[:block])], 0)
            return block
        except OSError as exc:
            if exc.errno != 22:  # EINVAL: misaligned for this device
                raise
            block *= 2
    raise OSError(22, "no O_DIRECT read granularity up to 64 KiB works on this file")


def open_direct(path: os.PathLike[str] | str, *, direct: bool | str = "auto",
                shown: os.PathLike[str] | str | None = None, stacklevel: int = 1) -> tuple[int, int, bool]:
    """``path`` opened for reads, with O_DIRECT where the file system takes it.

    Parameters
    ----------
    path : str or os.PathLike
        The file.
    direct : {"auto", True, False}
        O_DIRECT: ``auto`` falls back to the page cache with a :class:`DirectIOWarning` where the file system
        refuses it, ``True`` raises there.
    shown : str or os.PathLike, optional
        The path the warning names (default ``path``).
    stacklevel : int
        The frame the warning names, counted as :func:`warnings.warn` would count it in the caller (1: the
        line that called this function).

    Returns
    -------
    tuple
        ``(fd, block, direct)``: the descriptor, the read granularity (measured with O_DIRECT, else 512) and
        whether O_DIRECT is on.

    Examples
    --------
    >>> import tempfile
    >>> with tempfile.NamedTemporaryFile() as f:
    ...     fd, block, direct = open_direct(f.name, direct=False)
    ...     os.close(fd)
    >>> block, direct
    (512, False)
    """
    flags = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0)
    fd: int | None = None
    block = 512  # no alignment needed; 512-byte reads keep the copy small
    if direct is not False:
        try:
            fd = os.open(path, flags | os.O_DIRECT)
            block = _probe_block(fd, _sysfs_block(fd))
        except OSError as exc:
            if fd is not None:
                os.close(fd)
                fd = None
            if exc.errno != 22 or direct is True:
                raise
            warnings.warn(f"{path if shown is None else shown}: the file system refuses O_DIRECT; reading through "
                          "the page cache (rows read stay cached by the kernel)", DirectIOWarning,
                          stacklevel=stacklevel + 1)
    if fd is None:
        return os.open(path, flags), 512, False
    return fd, block, True


def open_layout(path: os.PathLike[str] | str, *, dtype: torch.dtype | None = None, shape: Sequence[int] | None = None,
                offset: int = 0, direct: bool | str = "auto",
                expect: tuple[int | None, int | None, str | None] | None = None,
                stacklevel: int = 1) -> tuple[Layout, int, int, bool]:
    """Read the layout of the store at ``path`` (its current generation, its id map checked) and open that
    very file for reads (:func:`open_direct`); a writer publishing a new generation meanwhile makes it read
    again.

    Parameters
    ----------
    path : str or os.PathLike
        A ``.npy`` file (:func:`~directload.stores.read_layout`), or raw bytes with ``dtype`` and ``shape``.
    dtype, shape, offset : optional
        A raw file's rows' torch dtype, the table's shape and the byte offset of row 0.
    direct : {"auto", True, False}
        As :func:`open_direct`.
    expect : tuple, optional
        The ``(device, inode, token)`` the file must have (a pickled store's, reopened).
    stacklevel : int
        As :func:`open_direct`.

    Returns
    -------
    tuple
        ``(layout, fd, block, direct)``.

    Raises
    ------
    CorruptFileError
        The layout is bad, the file is not the one ``expect`` names, or it kept changing while it was opened.
    ValueError
        Rows of more than 1 GiB.

    Examples
    --------
    >>> import tempfile, numpy as np
    >>> with tempfile.TemporaryDirectory() as d:
    ...     np.save(d + "/t.npy", np.zeros((8, 4), np.float32))
    ...     layout, fd, block, direct = open_layout(d + "/t.npy", direct=False)
    ...     os.close(fd)
    >>> layout.shape, layout.row_nbytes, block
    ((8, 4), 16, 512)
    """
    path = Path(path)
    for _ in range(OPEN_ATTEMPTS):
        if dtype is None:
            layout = read_layout(path, with_id_map=True)
        else:
            layout = raw_layout(path, dtype, shape, offset)  # type: ignore[arg-type]  # shape comes with dtype
        if expect is not None and (layout.device, layout.inode, layout.token) != tuple(expect):
            raise CorruptFileError(f"{path}: the store was rewritten or replaced since this DiskStore "
                                   "was opened in the process that sent it; open it again")
        if layout.row_nbytes > MAX_READ - 2 * MAX_BLOCK:
            raise ValueError(f"{path}: rows of {layout.row_nbytes} bytes; a disk store reads rows of "
                             "up to 1 GiB")
        try:
            fd, block, is_direct = open_direct(layout.path, direct=direct, shown=path, stacklevel=stacklevel + 1)
        except FileNotFoundError:
            continue  # the generation went: a new one was published since its layout was read
        st = os.fstat(fd)
        if (st.st_dev, st.st_ino, st.st_size) == (layout.device, layout.inode, layout.file_bytes):
            return layout, fd, block, is_direct
        os.close(fd)
    raise CorruptFileError(f"{path}: the file kept changing while it was being opened")
