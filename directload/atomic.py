"""Files written whole or not at all: write a partial beside the file, sync it, rename it over the file, sync
the directory.  A killed write leaves only its partial, which the next write of the same file removes.

(Several files or a folder published together, a disk store or DistDGL's partitions, have their own
protocol on these pieces: :mod:`directload.publish`.)
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

__all__ = [
    "write_atomically", "fsync_dir", "umask", "remove_partials", "new_partial", "partial_pattern", "PARTIAL_SUFFIX",
]

PARTIAL_SUFFIX = ".partial"


def umask() -> int:
    """This process's umask, read without changing it (``os.umask`` would, for every thread at once)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    return 0o022


def fsync_dir(directory: os.PathLike[str] | str) -> None:
    """Make the directory's entries (a rename, a new file) durable."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def partial_pattern(name: str) -> re.Pattern[str]:
    """The names of the partials of ``name`` (``.name.<8 random characters>[.role].partial``)."""
    return re.compile(r"\." + re.escape(name) + r"\.[A-Za-z0-9_]{8}(\.[a-z]+)?" + re.escape(PARTIAL_SUFFIX))


def remove_partials(directory: os.PathLike[str] | str, name: str) -> None:
    """Remove what killed writes of ``name`` left in ``directory`` (their partials, recognised by name).  A
    partial whose writer lives (it holds a ``flock`` on it, as :func:`write_atomically` does) is left alone:
    two processes writing one file at once both finish."""
    pattern = partial_pattern(name)
    for entry in list(os.scandir(directory)):
        if not pattern.fullmatch(entry.name):
            continue
        if entry.is_symlink():
            with contextlib.suppress(FileNotFoundError):
                os.unlink(entry.path)
            continue
        if not entry.is_file(follow_symlinks=False):
            continue
        try:
            fd = os.open(entry.path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
        except OSError:
            continue
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                continue  # its writer is at work
            with contextlib.suppress(FileNotFoundError):
                if os.path.samestat(os.fstat(fd), os.stat(entry.path, follow_symlinks=False)):
                    os.unlink(entry.path)
        finally:
            os.close(fd)


def new_partial(directory: os.PathLike[str] | str, name: str, role: str = "") -> tuple[int, Path]:
    """``(fd, path)`` of a new partial of ``name``, open for writing, with the umask's permissions (a
    temporary file would be private)."""
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{name}.", suffix=(f".{role}" if role else "") + PARTIAL_SUFFIX)
    os.fchmod(fd, 0o666 & ~umask())
    return fd, Path(tmp)


def write_atomically(path: os.PathLike[str] | str, write: Callable[[BinaryIO], object]) -> None:
    """Write ``path`` whole or not at all: ``write(f)`` fills a binary file object, then it replaces ``path``.

    Examples
    --------
    >>> import tempfile, os
    >>> path = os.path.join(tempfile.mkdtemp(), "a.bin")
    >>> write_atomically(path, lambda f: f.write(b"whole"))
    >>> open(path, "rb").read()
    b'whole'
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_partials(path.parent, path.name)
    fd, tmp = new_partial(path.parent, path.name)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # held until it is renamed: another writer's sweep leaves it alone
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
            os.replace(tmp, path)
        fsync_dir(path.parent)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
