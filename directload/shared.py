"""One copy of a table per node: every process on the node maps the same shared memory.

A DDP job runs one process per GPU, and each would otherwise load its own copy of the feature table:
eight ranks, eight times the host memory.  :func:`shared_table` puts the table once into POSIX shared
memory (a file in ``/dev/shm``, a tmpfs) and every process of the node maps it; where CUDA runs, each
process registers the mapping with CUDA itself (in chunks, rolled back on failure), as DGL, GraphBolt,
WholeGraph and quiver do: CUDA IPC handles only cover device memory.

Why POSIX shared memory and not SysV: a file in a tmpfs can be created under a temporary name and published
by one ``link`` (which never replaces a table another process published first), so a process killed while
writing never leaves a torn table that others would map; its users are counted by ``flock`` locks the kernel
drops when a process dies, so a leftover is told from a table in use without trusting pids; and
``posix_fallocate`` reserves the whole size up front, so a ``/dev/shm`` that is too small is an error before
any byte is copied, not a SIGBUS later.
SysV segments (WholeGraph's choice, to avoid ``/dev/shm``'s size limit) have none of these; here the size
limit is met by a clear error naming the sizes, and by ``directory=``, any tmpfs or hugetlbfs mount.

The protocol, per ``key`` (one table of one job on one node):

* The first process to call creates ``<directory>/directload-shared-<key>.partial``, locked, writes the
  table into it and links it as ``directload-shared-<key>``: a name that exists is always whole.
* Every process (the creator too) opens the published file, holds a shared ``flock`` on it while it maps
  the table, and counts itself in the file's header.  Once ``ranks`` processes have counted themselves the
  name is removed: the mappings stay valid, and nothing is left behind in ``/dev/shm`` whatever later kills
  the job.  Without ``ranks`` the last process to let go of the table removes the name.
* A table or a partial file of ours that no process holds (its users were all killed before they were
  counted, or its writer died) is removed by the next call on the node, whatever its key.
* Every wait of a call ends by its ``timeout``: locks are taken by polling (a process stopped with SIGSTOP
  keeps its locks, so a blocking ``flock`` could wait for ever), and a wait that runs out is a
  :class:`SharedTableTimeout` naming the process that holds the lock (read from ``/proc/locks``).
* Only regular files of this user's that carry our magic take part: a name is looked at with ``lstat`` and
  opened with ``O_NOFOLLOW | O_NONBLOCK`` (a link is never followed, a FIFO or a device never opened), and a
  header is checked field by field, its sizes against the file's, before anything maps it.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import math
import mmap
import os
import re
import struct
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from directload.errors import DirectloadError

from . import shm
from .flocks import LockTimeout, describe_holders, holders, wait_lock
from .memory import resolve_pin
from .npy import open_regular, read_header
from .shm import SHM_DIR
from .unified import to_unified
from .units import check_int, format_size

if TYPE_CHECKING:
    from typing import TypeAlias

    from .unified import UnifiedTensor

    #: What a shared table's rows may come from: a CPU tensor or array, or a ``.npy`` file.
    _Rows: TypeAlias = torch.Tensor | np.ndarray | os.PathLike[str] | str

__all__ = ["shared_table", "check_key", "SharedTableError", "SharedTableTimeout", "SHM_DIR", "PREFIX"]

#: The start of every name this module creates in :data:`SHM_DIR` (nothing else there is touched).
PREFIX = shm.PREFIX + "shared-"
_MAGIC = b"DLSHARE1"
_HEADER = 4096  # magic, the count of processes attached, the JSON header's length, the JSON; data after it
_COUNT = struct.Struct("<q")
_TEMP = re.compile(r".*\.partial\.\d+\.[0-9a-f]{8}")
_CHUNK = 64 << 20
_NO_ROOM = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
_COUNTING = threading.Lock()  # lockf's record locks are the process's: threads of one process take turns here


class SharedTableError(DirectloadError, RuntimeError):
    """A shared table could not be made or mapped: shared memory too small, a table of the same key that is
    not the one asked for, a file under its name that is not a table of ours, or no source to write it from.

    Examples
    --------
    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as where:
    ...     try:
    ...         shared_table("never-written", directory=where)
    ...     except SharedTableError as exc:
    ...         print(str(exc)[:62])
    shared table 'never-written' does not exist yet and this proce
    """


class SharedTableTimeout(SharedTableError, TimeoutError):
    """A wait for another process ran past ``timeout``: one still writing the table, or one holding a lock on
    it (a process stopped with ``SIGSTOP`` keeps its locks).  The message names that process's pid where
    ``/proc/locks`` shows it.

    Examples
    --------
    >>> issubclass(SharedTableTimeout, SharedTableError), issubclass(SharedTableTimeout, TimeoutError)
    (True, True)
    """


@dataclass(frozen=True)
class _Wait:
    """One call's deadline (``time.monotonic()``): every wait of the call ends by it."""

    at: float
    seconds: float


@dataclass(frozen=True)
class _Meta:
    """A table's header, every field checked against the others and the file's size."""

    dtype: np.dtype
    shape: tuple
    nbytes: int
    creator: int
    ranks: object  # None or int >= 1


def shared_table(key: str, source: _Rows | Callable[[], _Rows] | None = None, *, ranks: int | None = None,
                 affinity: str = "cuda", pin: str | bool = "auto", timeout: float = 600.0,
                 directory: os.PathLike[str] | str | None = None) -> UnifiedTensor:
    """The table ``source`` as a read-only unified tensor in shared memory, one copy for every process of
    the node that calls this with the same ``key``.

    Parameters
    ----------
    key : str
        The table's name on this node, the same in every process of the job and different from every
        other job's (letters, digits, ``_``, ``.``, ``-``; for instance the dataset and torchrun's
        ``TORCHELASTIC_RUN_ID``).
    source : torch.Tensor, numpy.ndarray, str, os.PathLike or callable
        The rows: a CPU tensor or array, a ``.npy`` file, or a function returning one of these (called only
        in the process that writes the table, so the others never load it).  Only that process needs it;
        the others may pass None.  A tensor, an array or a path (of which only the ``.npy`` header is read)
        is checked against the table already there.  The rows are numbers of a type torch has: structured,
        string and object dtypes are refused.
    ranks : int, optional
        How many processes of this node map the table (torchrun's ``LOCAL_WORLD_SIZE`` where set; else the
        number the writing process was given).  Once that many have mapped it its name is removed, so that
        a killed job leaves nothing behind.
    affinity, pin
        As for :func:`directload.to_unified`: where CUDA runs, each process registers the mapping
        (read-only) in chunks; ``pin="require"`` makes a failed registration an error.
    timeout : float
        Seconds this call waits for other processes in all: one writing the table, or one holding a lock
        on it.
    directory : str, optional
        A tmpfs (or hugetlbfs) mount instead of :data:`SHM_DIR`.

    Returns
    -------
    directload.UnifiedTensor
        Read-only; its memory is the node's one copy.

    Raises
    ------
    SharedTableError
        The shared memory is too small for the table, the key's table has another dtype or shape than
        ``source``, the file there is not one of ours (a link, a FIFO, another user's, a bad header), or
        the process writing it died.
    SharedTableTimeout
        (Also a ``TimeoutError``.)  Another process is still writing the table, or holds a lock on it,
        after ``timeout`` seconds; the message names its pid.
    ValueError, TypeError
        A bad key, ranks or source, before anything is created.

    Examples
    --------
    >>> import tempfile, torch
    >>> with tempfile.TemporaryDirectory() as where:  # /dev/shm by default
    ...     t = shared_table("demo-feat", torch.arange(6.0).view(3, 2), ranks=1, directory=where)
    ...     left = os.listdir(where)  # every rank (one here) mapped it: no name left behind
    >>> t[torch.tensor([2])].tolist(), left
    ([[4.0, 5.0]], [])
    """
    key = check_key(key)
    if ranks is None and os.environ.get("LOCAL_WORLD_SIZE", "").isdigit():
        ranks = int(os.environ["LOCAL_WORLD_SIZE"])
    if ranks is not None:
        ranks = check_int("ranks", ranks)
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout >= 0:
        raise ValueError(f"timeout must be a number of seconds >= 0, got {timeout!r}")
    if source is not None and not (callable(source) or isinstance(source, (torch.Tensor, np.ndarray, str,
                                                                           os.PathLike))):
        raise TypeError(f"source must be a tensor, an array, a .npy path or a function returning one, got "
                        f"{type(source).__name__}")
    declared = _declared(source)
    pin = resolve_pin(pin)
    directory = os.fspath(directory if directory is not None else SHM_DIR)
    if not os.path.isdir(directory):
        raise SharedTableError(f"{directory} is not a directory: shared tables live in a tmpfs such as {SHM_DIR}")
    sweep(directory)
    final = os.path.join(directory, PREFIX + key)
    wait = _Wait(time.monotonic() + timeout, timeout)
    while True:
        fd = _open_published(final, key, wait)
        if fd is None:
            fd = _create(final, key, source, declared, ranks, wait)
        if fd is not None:
            break
        if time.monotonic() > wait.at:
            raise SharedTableTimeout(f"shared table {key!r}: another process has been writing it for more than "
                                     f"{timeout:g} s ({_writer_of(final)}, {final}.partial); raise timeout= or "
                                     "check that process")
        time.sleep(0.02)
    return _attach(fd, final, key, declared, ranks, affinity, pin, wait)


def sweep(directory: os.PathLike[str] | str = SHM_DIR) -> list[str]:
    """Remove the tables and partial files of ours in ``directory`` that no process holds (left by
    processes that were killed); returns their names.  Only regular files of this user's that carry our
    magic are touched (an empty one only under a writer's first name): a link is never followed, a FIFO or
    a device never opened, and nothing else is ever removed."""
    return shm.sweep(directory, PREFIX, ours=_sweepable, owner_alive=_writer_alive)


def check_key(key: str) -> str:
    """``key`` when a shared table may be named by it: a str of 1-200 letters, digits, ``_``, ``.`` or ``-``
    starting with a letter or a digit, not a writer's ``.partial`` name; else TypeError (not a str) or
    ValueError.

    >>> check_key("feat.v2")
    'feat.v2'
    >>> check_key(5)
    Traceback (most recent call last):
    ...
    TypeError: key must be a str, got int 5
    """
    if not isinstance(key, str):
        raise TypeError(f"key must be a str, got {type(key).__name__} {key!r}")
    if not shm.valid_name(key, 200) or key.endswith(".partial") or ".partial." in key:
        raise ValueError(f"key must be 1-200 letters, digits, '_', '.' or '-' (starting with a letter or digit), "
                         f"got {key!r}")
    return key


def _plain(dtype):
    """``dtype`` where a shared table can hold it: numbers of a type torch maps, in this machine's byte
    order.  Else TypeError (a structured dtype's fields would be lost in the header)."""
    dtype = np.dtype(dtype)
    try:
        ok = dtype.kind in "biufc" and dtype.isnative and torch.from_numpy(np.empty(0, dtype)) is not None
    except (TypeError, ValueError):
        ok = False
    if not ok:
        raise TypeError(f"source has dtype {dtype}: a shared table holds numbers of one of torch's types (no "
                        "structured, string, object or byte-swapped dtypes); convert the rows first")
    return dtype


def _declared(source):
    """``(dtype, shape)`` that ``source`` promises, checked before anything is made (of a path, only its
    ``.npy`` header is read); None for no source or a function (known only once it is called)."""
    if source is None or (callable(source) and not isinstance(source, (torch.Tensor, np.ndarray))):
        return None
    if isinstance(source, torch.Tensor):
        if source.device.type != "cpu":
            raise TypeError(f"source is on {source.device}: pass the table in host memory")
        try:
            dtype = torch.empty((), dtype=source.dtype).numpy().dtype
        except TypeError as exc:
            raise TypeError(f"source is {source.dtype}, which NumPy has no type for: a shared table holds numbers "
                            "NumPy and torch share") from exc
        return _plain(dtype), tuple(source.shape)
    if isinstance(source, np.ndarray):
        return _plain(source.dtype), tuple(source.shape)
    path = os.fspath(source)
    if not path.endswith(".npy"):
        raise ValueError(f"source {path!r}: a path must name a .npy file")
    try:
        with open_regular(path) as f:
            head = read_header(f, path)
    except OSError as exc:
        raise ValueError(f"source {path}: cannot read it ({exc.strerror or exc})") from exc
    return _plain(head.dtype), head.shape


def _open_regular(path, write=False):
    """``path`` opened when it is a regular file of this user's (:func:`directload.shm.open_ours`); None where
    nothing (or, after a race, something else) has that name.  SharedTableError for anything else there."""
    return shm.open_ours(path, os.O_RDWR if write else os.O_RDONLY, refuse=_not_ours)


def _not_ours(what):
    return SharedTableError(f"{what}, so not a shared table of ours: remove it if it is not another program's")


def _looks_ours(fd, name):
    """Our magic at its start, or empty under a writer's first name (a writer killed before its first
    write); only names with our prefix get here."""
    if os.fstat(fd).st_size == 0:
        return _TEMP.fullmatch(name) is not None
    return shm.has_magic(fd, _MAGIC)


def _sweepable(fd, name):
    """Whether :func:`sweep` may remove the file ``name`` open as ``fd`` once no process holds it."""
    return _looks_ours(fd, name) and not _temp_of_live_writer(name)


def _temp_of_live_writer(name):
    """A writer's first file (``<key>.partial.<pid>.<hex>``), unlocked for an instant after its creation: left
    alone while that process lives."""
    parts = name.rsplit(".", 3)
    if len(parts) != 4 or parts[1] != "partial" or not parts[2].isdigit():
        return False
    return shm.alive(int(parts[2]))


def _writer_alive(fd):
    """Whether the process that wrote the table (named in its header) still runs.  (Linux turns a flock from
    exclusive to shared by dropping one and taking the other; a sweep must not fall in between.)"""
    try:
        meta = _parse_meta(os.pread(fd, _HEADER, 0), os.fstat(fd).st_size)
    except ValueError:
        return False  # no whole header: its writer died before writing one (its lock is free)
    return shm.alive(meta.creator)


def _writer_of(final):
    """Who holds the partial file, for a message."""
    try:
        fd = _open_regular(final + ".partial")
    except (SharedTableError, OSError):
        fd = None
    if fd is None:
        return "its pid is not known"
    try:
        return describe_holders(holders(fd, kind="FLOCK"))
    finally:
        os.close(fd)


def _lock(fd, key, path, wait, *, exclusive=True, span=None):
    """``wait_lock`` by the call's deadline; a peer holding the lock past it is a one-line SharedTableTimeout."""
    try:
        wait_lock(fd, wait.at, exclusive=exclusive, span=span)
    except LockTimeout as exc:
        raise SharedTableTimeout(f"shared table {key!r}: waited {wait.seconds:g} s for the lock on {path}, held by "
                                 f"{describe_holders(exc.pids)} (a process stopped with SIGSTOP, or stuck, keeps it): "
                                 "resume or kill it, or raise timeout=") from exc


def _open_published(final, key, wait):
    """The published table's fd, held with a shared lock; None where there is none.  A published file is
    always whole, so one removed meanwhile (its ranks all counted, or swept) is still the table."""
    try:
        fd = _open_regular(final, write=True)
    except SharedTableError:
        raise
    except OSError as exc:
        raise SharedTableError(f"{final}: cannot open it ({exc.strerror})") from exc
    if fd is None:
        return None
    try:
        _lock(fd, key, final, wait, exclusive=False)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _create(final, key, source, declared, ranks, wait):
    """Write the table under a partial name and publish it; its fd, held with a shared lock.  None where
    another process is writing it (a live writer: the caller waits for it).  Whatever fails, no file of
    this call is left behind."""
    try:
        return _create_files(final, key, source, declared, ranks, wait)
    except SharedTableError:
        raise
    except OSError as exc:
        if exc.errno not in _NO_ROOM:
            raise
        need = _HEADER + (0 if declared is None else declared[0].itemsize * math.prod(declared[1]))
        raise _no_room(os.path.dirname(final), key, need, at_least=declared is None) from exc


def _create_files(final, key, source, declared, ranks, wait):
    partial = final + ".partial"
    temp = f"{partial}.{os.getpid()}.{os.urandom(4).hex()}"
    fd = os.open(temp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        try:
            _lock(fd, key, temp, wait)  # before it has its partial name: seen unlocked only when its writer died
            os.pwrite(fd, _MAGIC, 0)
            os.link(temp, partial)
        finally:  # this process's own name (its pid, a random part, made here): gone on every path
            with contextlib.suppress(FileNotFoundError):
                os.unlink(temp)
    except FileExistsError:
        os.close(fd)
        return _writer_died(partial)
    except BaseException:
        os.close(fd)
        raise
    try:
        _write(fd, key, source, declared, final, ranks)
        os.link(partial, final)  # published whole, or not at all, and never over a table published meanwhile
    except FileExistsError:
        shm.unlink_if_same(partial, fd)  # another writer published first (we took the partial name after it): use its
        os.close(fd)
        return None
    except BaseException:
        shm.unlink_if_same(partial, fd)
        os.close(fd)
        raise
    shm.unlink_if_same(partial, fd)
    try:
        _lock(fd, key, final, wait, exclusive=False)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _writer_died(partial):
    """After another process's partial file was found: remove it where its writer died (its lock is gone),
    so the next round writes the table; None either way (the caller looks again)."""
    try:
        fd = _open_regular(partial)
    except OSError as exc:
        raise SharedTableError(f"{partial}: cannot open it ({exc.strerror})") from exc
    if fd is None:
        return None
    try:
        if not shm.has_magic(fd, _MAGIC):
            raise SharedTableError(f"{partial} does not start with directload's mark, so not a partial table of "
                                   "ours: remove it if it is not another program's")
        shm.drop_unheld(partial, fd)  # held: alive and writing
    finally:
        os.close(fd)
    return None


def _no_room(directory, key, need, at_least=False):
    try:
        st = os.statvfs(directory)
        has = f"has {format_size(st.f_bavail * st.f_frsize)} free"
    except OSError:
        has = "is full"
    return SharedTableError(f"{directory} {has} and shared table {key!r} needs {'at least ' if at_least else ''}"
                            f"{format_size(need)}: enlarge it (mount -o remount,size=... as root; docker: "
                            "--shm-size) or pass directory= a larger tmpfs")


def _load(source):
    if callable(source) and not isinstance(source, (torch.Tensor, np.ndarray)):
        source = source()
    if not isinstance(source, (torch.Tensor, np.ndarray, str, os.PathLike)):
        raise TypeError(f"source must be a tensor, an array or a .npy path, got {type(source).__name__}")
    _declared(source)  # a function's result is checked as any source is
    if isinstance(source, torch.Tensor):
        return source.detach().contiguous().numpy()
    if isinstance(source, np.ndarray):
        return source
    return np.load(os.fspath(source), mmap_mode="r", allow_pickle=False)


def _write(fd, key, source, declared, final, ranks):
    if source is None:
        raise SharedTableError(f"shared table {key!r} does not exist yet and this process was given no source "
                               "to write it from: pass the table (or a function that loads it) in every process")
    array = _load(source)
    if declared is not None and (array.dtype, tuple(array.shape)) != declared:
        raise SharedTableError(f"shared table {key!r}: its source changed while it was being written (now "
                               f"{array.dtype} {tuple(array.shape)}, was {declared[0]} {declared[1]})")
    meta = json.dumps({"key": key, "dtype": array.dtype.str, "shape": list(array.shape),
                       "nbytes": int(array.nbytes), "creator": os.getpid(), "ranks": ranks}).encode()
    if len(meta) > _HEADER - 24:
        raise ValueError(f"source has {array.ndim} dimensions: too many for a shared table's header")
    size = _HEADER + int(array.nbytes)
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as exc:
        if exc.errno not in _NO_ROOM:
            raise
        raise _no_room(os.path.dirname(final), key, size) from exc
    os.pwrite(fd, _MAGIC + _COUNT.pack(0) + _COUNT.pack(len(meta)) + meta, 0)
    if array.nbytes:
        flat = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
        with mmap.mmap(fd, int(array.nbytes), mmap.MAP_SHARED, mmap.PROT_WRITE | mmap.PROT_READ,
                       offset=_HEADER) as m:
            dst = np.frombuffer(m, np.uint8)
            for start in range(0, flat.shape[0], _CHUNK):
                dst[start:start + _CHUNK] = flat[start:start + _CHUNK]
            del dst


class _Mapping(mmap.mmap):
    """The table's read-only mapping; when the last tensor over it goes, the process lets go of the table."""


def _attach(fd, final, key, declared, ranks, affinity, pin, wait):
    try:  # a file that is not the table asked for is let alone: closed, never removed
        meta = _read_meta(fd, final, key)
        if declared is not None and declared != (meta.dtype, meta.shape):
            raise SharedTableError(f"shared table {key!r} on this node holds {meta.dtype} {meta.shape}, not the "
                                   f"{declared[0]} {declared[1]} given: another job uses this key, or the ranks "
                                   "disagree")
    except BaseException:
        os.close(fd)
        raise
    try:
        _count_in(fd, final, key, ranks if ranks is not None else meta.ranks, wait)
        if meta.nbytes:
            # copy-on-write, as from_file maps a file: every page read is the one shared page, and a stray
            # write through .host changes a private copy in this process instead of faulting
            m = _Mapping(fd, meta.nbytes, mmap.MAP_PRIVATE, mmap.PROT_READ | mmap.PROT_WRITE, offset=_HEADER)
            array = np.frombuffer(m, meta.dtype, count=math.prod(meta.shape)).reshape(meta.shape)
            weakref.finalize(m, _let_go, fd, final, os.getpid())  # the fd and its lock live as long as the mapping
        else:
            array = np.empty(meta.shape, meta.dtype)
            _let_go(fd, final, os.getpid())
    except BaseException:
        _let_go(fd, final, os.getpid())
        raise
    return to_unified(array, affinity, pin=pin, read_only=True)


def _read_meta(fd, final, key):
    try:
        return _parse_meta(os.pread(fd, _HEADER, 0), os.fstat(fd).st_size, key)
    except ValueError as exc:
        raise SharedTableError(f"{final} is not a shared table directload wrote for key {key!r} ({exc}): remove "
                               "it if it is not another program's") from exc


def _is_count(value, low):
    return isinstance(value, int) and not isinstance(value, bool) and value >= low


def _parse_meta(head, size, key=None):
    """The header in ``head`` (the file's first bytes) as :class:`_Meta`, each field checked, the sizes
    against the file's ``size``; ValueError saying what is wrong."""
    if len(head) < 24 or head[:8] != _MAGIC:
        raise ValueError("no magic")
    (length,) = _COUNT.unpack(head[16:24])
    if not 2 <= length <= min(_HEADER, len(head)) - 24:
        raise ValueError(f"a header length of {length}")
    try:
        meta = json.loads(head[24:24 + length])
    except (ValueError, RecursionError) as exc:
        raise ValueError("its header is not JSON") from exc
    if not isinstance(meta, dict) or not {"key", "dtype", "shape", "nbytes", "creator"} <= meta.keys():
        raise ValueError("its header lacks fields")
    if key is not None and meta["key"] != key:
        raise ValueError("it is another key's")
    try:
        dtype = _plain(np.dtype(meta["dtype"])) if isinstance(meta["dtype"], str) else None
    except (TypeError, ValueError, SyntaxError):
        dtype = None
    if dtype is None:
        raise ValueError("its dtype is not one a table holds")
    shape = meta["shape"]
    if not isinstance(shape, list) or len(shape) > 32 or not all(_is_count(n, 0) for n in shape):
        raise ValueError("its shape is not a list of sizes")
    nbytes = meta["nbytes"]
    if not _is_count(nbytes, 0) or nbytes != dtype.itemsize * math.prod(shape) or size != _HEADER + nbytes:
        raise ValueError(f"its sizes do not match the file's {size} bytes")
    ranks = meta.get("ranks")
    if (not _is_count(meta["creator"], 1) or meta["creator"] >= shm.PID_MAX
            or not (ranks is None or _is_count(ranks, 1))):
        raise ValueError("its creator or ranks are not counts")
    return _Meta(dtype, tuple(shape), nbytes, meta["creator"], ranks)


def _count_in(fd, final, key, ranks, wait):
    """Count this process in; the one that completes ``ranks`` removes the name."""
    left = min(max(0.0, wait.at - time.monotonic()), threading.TIMEOUT_MAX)
    if not _COUNTING.acquire(timeout=left):
        raise SharedTableTimeout(f"shared table {key!r}: another thread of this process kept the count for more "
                                 f"than {wait.seconds:g} s")
    try:
        _lock(fd, key, final, wait, span=(8, _COUNT.size))
        try:
            (n,) = _COUNT.unpack(os.pread(fd, _COUNT.size, 8))
            if not 0 <= n < 1 << 40:
                raise SharedTableError(f"{final}: its count of processes ({n}) is corrupt: remove it if it is not "
                                       "another program's")
            os.pwrite(fd, _COUNT.pack(n + 1), 8)
            if ranks is not None and n + 1 >= ranks:
                shm.unlink_if_same(final, fd)
        finally:
            fcntl.lockf(fd, fcntl.LOCK_UN, _COUNT.size, 8)
    finally:
        _COUNTING.release()


def _let_go(fd, final, pid):
    """This process no longer maps the table: the last process to let go removes its name.  A forked child
    shares its parent's lock (one open file description): it only closes its copy of the fd."""
    try:
        if os.getpid() != pid:
            return
        fcntl.flock(fd, fcntl.LOCK_UN)
        shm.drop_unheld(final, fd)  # the last to let go removes it; others hold it while they map it
    except OSError:
        pass
    finally:
        try:
            os.close(fd)
        except OSError:
            pass
