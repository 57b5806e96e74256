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
"""

import errno
import fcntl
import json
import mmap
import os
import re
import struct
import threading
import time
import weakref

import numpy as np
import torch

from .memory import resolve_pin
from .unified import to_unified
from .units import check_int

__all__ = ["shared_table", "SharedTableError", "SHM_DIR", "PREFIX"]

#: Where tables go by default: the tmpfs POSIX shared memory lives in.
SHM_DIR = "/dev/shm"
#: The start of every name this module creates there (nothing else there is touched).
PREFIX = "directload-shared-"
_MAGIC = b"DLSHARE1"
_HEADER = 4096  # magic, the count of processes attached, the JSON header's length, the JSON; data after it
_COUNT = struct.Struct("<q")
_KEY = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,199}")
_CHUNK = 64 << 20
_COUNTING = threading.Lock()  # lockf's record locks are the process's: threads of one process take turns here


class SharedTableError(RuntimeError):
    """A shared table could not be made or mapped: shared memory too small, a table of the same key that is
    not the one asked for, or no source to write it from.

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


def shared_table(key, source=None, *, ranks=None, affinity="cuda", pin="auto", timeout=600.0, directory=None):
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
        the others may pass None.
    ranks : int, optional
        How many processes of this node map the table (torchrun's ``LOCAL_WORLD_SIZE`` where set; else the
        number the writing process was given).  Once that many have mapped it its name is removed, so that
        a killed job leaves nothing behind.
    affinity, pin
        As for :func:`directload.to_unified`: where CUDA runs, each process registers the mapping
        (read-only) in chunks; ``pin="require"`` makes a failed registration an error.
    timeout : float
        Seconds to wait for another process writing the table.
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
        ``source``, the file there is not one of ours, or the process writing it died.
    TimeoutError
        Another process is still writing the table after ``timeout`` seconds.
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
    key = _check_key(key)
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
    pin = resolve_pin(pin)
    directory = os.fspath(directory if directory is not None else SHM_DIR)
    if not os.path.isdir(directory):
        raise SharedTableError(f"{directory} is not a directory: shared tables live in a tmpfs such as {SHM_DIR}")
    sweep(directory)
    final = os.path.join(directory, PREFIX + key)
    deadline = time.monotonic() + timeout
    while True:
        fd = _open_published(final)
        if fd is None:
            fd = _create(final, key, source, ranks)
        if fd is not None:
            break
        if time.monotonic() > deadline:
            raise TimeoutError(f"shared table {key!r}: another process has been writing it for more than "
                               f"{timeout:g} s ({final}.partial); raise timeout= or check that process")
        time.sleep(0.02)
    return _attach(fd, final, key, source, ranks, affinity, pin)


def sweep(directory=SHM_DIR):
    """Remove the tables and partial files of ours in ``directory`` that no process holds (left by
    processes that were killed); returns their names.  Files that are not ours are never touched."""
    gone = []
    try:
        names = [n for n in os.listdir(directory) if n.startswith(PREFIX)]
    except OSError:
        return gone
    for name in names:
        path = os.path.join(directory, name)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            continue
        try:
            if not _is_ours(fd) or _temp_of_live_writer(name):
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue  # in use, or being written
            if _writer_alive(fd):
                continue  # just published: its writer is between its exclusive lock and its shared one
            if _same_file(path, fd):
                os.unlink(path)
                gone.append(name)
        except OSError:
            continue
        finally:
            os.close(fd)
    return gone


def _check_key(key):
    if not isinstance(key, str) or not _KEY.fullmatch(key) or key.endswith(".partial") or ".partial." in key:
        raise ValueError(f"key must be 1-200 letters, digits, '_', '.' or '-' (starting with a letter or digit), "
                         f"got {key!r}")
    return key


def _is_ours(fd):
    """A regular file that starts with our magic, or an empty one (a writer killed before its first write);
    only names with our prefix get here."""
    st = os.fstat(fd)
    if not os.path.stat.S_ISREG(st.st_mode):
        return False
    return st.st_size == 0 or os.pread(fd, len(_MAGIC), 0) == _MAGIC


def _temp_of_live_writer(name):
    """A writer's first file (``<key>.partial.<pid>.<hex>``), unlocked for an instant after its creation: left
    alone while that process lives."""
    parts = name.rsplit(".", 3)
    if len(parts) != 4 or parts[1] != "partial" or not parts[2].isdigit():
        return False
    try:
        os.kill(int(parts[2]), 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, ValueError):
        return True
    return True


def _writer_alive(fd):
    """Whether the process that wrote the table (named in its header) still runs.  (Linux turns a flock from
    exclusive to shared by dropping one and taking the other; a sweep must not fall in between.)"""
    head = os.pread(fd, _HEADER, 0)
    try:
        (length,) = _COUNT.unpack(head[16:24])
        pid = int(json.loads(head[24:24 + length])["creator"])
    except (ValueError, KeyError, TypeError, struct.error):
        return False  # no header yet: its writer died before writing one (its lock is free)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # alive, another user's
    return True


def _same_file(path, fd):
    try:
        a, b = os.stat(path, follow_symlinks=False), os.fstat(fd)
    except FileNotFoundError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def _open_published(final):
    """The published table's fd, held with a shared lock; None where there is none.  A published file is
    always whole, so one removed meanwhile (its ranks all counted, or swept) is still the table."""
    try:
        fd = os.open(final, os.O_RDWR | os.O_NOFOLLOW)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise SharedTableError(f"{final}: cannot open it ({exc.strerror})") from exc
    fcntl.flock(fd, fcntl.LOCK_SH)
    return fd


def _create(final, key, source, ranks):
    """Write the table under a partial name and publish it; its fd, held with a shared lock.  None where
    another process is writing it (a live writer: the caller waits for it)."""
    partial = final + ".partial"
    temp = f"{partial}.{os.getpid()}.{os.urandom(4).hex()}"
    fd = os.open(temp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # before it has its partial name: seen unlocked only when its writer died
        os.pwrite(fd, _MAGIC, 0)
        try:
            os.link(temp, partial)
        except FileExistsError:
            os.close(fd)
            fd = None
            return _writer_died(partial)
        finally:
            os.unlink(temp)
        try:
            _write(fd, key, source, final, ranks)
            os.link(partial, final)  # published whole, or not at all, and never over a table published meanwhile
        except FileExistsError:
            _unlink_if(partial, fd)  # another writer published first (we took the partial name after it): use its
            os.close(fd)
            return None
        except BaseException:
            _unlink_if(partial, fd)
            raise
        _unlink_if(partial, fd)
        fcntl.flock(fd, fcntl.LOCK_SH)
        return fd
    except BaseException:
        if fd is not None:
            os.close(fd)
        raise


def _writer_died(partial):
    """After another process's partial file was found: remove it where its writer died (its lock is gone),
    so the next round writes the table; None either way (the caller looks again)."""
    try:
        fd = os.open(partial, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return None  # alive and writing
    else:
        _unlink_if(partial, fd)
    finally:
        os.close(fd)
    return None


def _unlink_if(path, fd):
    if _same_file(path, fd):
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


def _load(source):
    if callable(source) and not isinstance(source, (torch.Tensor, np.ndarray)):
        source = source()
    if isinstance(source, (str, os.PathLike)):
        path = os.fspath(source)
        if not path.endswith(".npy"):
            raise ValueError(f"source {path!r}: a path must name a .npy file")
        return np.load(path, mmap_mode="r", allow_pickle=False)
    if isinstance(source, torch.Tensor):
        if source.device.type != "cpu":
            raise TypeError(f"source is on {source.device}: pass the table in host memory")
        return source.detach().contiguous().numpy()
    if isinstance(source, np.ndarray):
        if source.dtype.hasobject:
            raise TypeError("source holds Python objects, not numbers")
        return source
    raise TypeError(f"source must be a tensor, an array or a .npy path, got {type(source).__name__}")


def _write(fd, key, source, final, ranks):
    if source is None:
        raise SharedTableError(f"shared table {key!r} does not exist yet and this process was given no source "
                               "to write it from: pass the table (or a function that loads it) in every process")
    array = _load(source)
    meta = json.dumps({"key": key, "dtype": array.dtype.str, "shape": list(array.shape),
                       "nbytes": int(array.nbytes), "creator": os.getpid(), "ranks": ranks}).encode()
    if len(meta) > _HEADER - 24:
        raise ValueError(f"source has {array.ndim} dimensions: too many for a shared table's header")
    size = _HEADER + int(array.nbytes)
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as exc:
        if exc.errno not in (errno.ENOSPC, errno.EFBIG):
            raise
        st = os.statvfs(os.path.dirname(final))
        raise SharedTableError(
            f"{os.path.dirname(final)} has {st.f_bavail * st.f_frsize / 2**30:.2f} GiB free and shared table "
            f"{key!r} needs {size / 2**30:.2f} GiB: enlarge it (mount -o remount,size=... as root; docker: "
            "--shm-size) or pass directory= a larger tmpfs") from exc
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


def _attach(fd, final, key, source, ranks, affinity, pin):
    try:  # a file that is not the table asked for is let alone: closed, never removed
        meta = _read_meta(fd, final, key)
        dtype, shape, nbytes = np.dtype(meta["dtype"]), tuple(meta["shape"]), meta["nbytes"]
        if source is not None and not callable(source) and isinstance(source, (torch.Tensor, np.ndarray)):
            want = (np.dtype(torch.empty((), dtype=source.dtype).numpy().dtype) if isinstance(source, torch.Tensor)
                    else source.dtype, tuple(source.shape))
            if want != (dtype, shape):
                raise SharedTableError(f"shared table {key!r} on this node holds {dtype} {shape}, not the {want[0]} "
                                       f"{want[1]} given: another job uses this key, or the ranks disagree")
    except BaseException:
        os.close(fd)
        raise
    try:
        _count_in(fd, final, ranks if ranks is not None else meta.get("ranks"))
        if nbytes:
            # copy-on-write, as from_file maps a file: every page read is the one shared page, and a stray
            # write through .host changes a private copy in this process instead of faulting
            m = _Mapping(fd, nbytes, mmap.MAP_PRIVATE, mmap.PROT_READ | mmap.PROT_WRITE, offset=_HEADER)
            array = np.frombuffer(m, dtype, count=int(np.prod(shape))).reshape(shape)
            weakref.finalize(m, _let_go, fd, final, os.getpid())  # the fd and its lock live as long as the mapping
        else:
            array = np.empty(shape, dtype)
            _let_go(fd, final, os.getpid())
    except BaseException:
        _let_go(fd, final, os.getpid())
        raise
    return to_unified(array, affinity, pin=pin, read_only=True)


def _read_meta(fd, final, key):
    head = os.pread(fd, _HEADER, 0)
    try:
        if head[:8] != _MAGIC:
            raise ValueError("no magic")
        (length,) = _COUNT.unpack(head[16:24])
        meta = json.loads(head[24:24 + length])
        if (meta["key"] != key or os.fstat(fd).st_size != _HEADER + meta["nbytes"]
                or np.dtype(meta["dtype"]).itemsize * int(np.prod(meta["shape"])) != meta["nbytes"]):
            raise ValueError("inconsistent")
    except (ValueError, KeyError, TypeError, struct.error) as exc:
        raise SharedTableError(f"{final} is not a shared table directload wrote for key {key!r}: remove it if it "
                               "is not another program's") from exc
    return meta


def _count_in(fd, final, ranks):
    """Count this process in; the one that completes ``ranks`` removes the name."""
    with _COUNTING:
        _count_locked(fd, final, ranks)


def _count_locked(fd, final, ranks):
    fcntl.lockf(fd, fcntl.LOCK_EX, _COUNT.size, 8)
    try:
        (n,) = _COUNT.unpack(os.pread(fd, _COUNT.size, 8))
        os.pwrite(fd, _COUNT.pack(n + 1), 8)
        if ranks is not None and n + 1 >= ranks:
            _unlink_if(final, fd)
    finally:
        fcntl.lockf(fd, fcntl.LOCK_UN, _COUNT.size, 8)


def _let_go(fd, final, pid):
    """This process no longer maps the table: the last process to let go removes its name.  A forked child
    shares its parent's lock (one open file description): it only closes its copy of the fd."""
    try:
        if os.getpid() != pid:
            return
        fcntl.flock(fd, fcntl.LOCK_UN)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return  # others hold it
        _unlink_if(final, fd)
    except OSError:
        pass
    finally:
        try:
            os.close(fd)
        except OSError:
            pass
