"""Bounded waits for file locks, and which processes hold a file's locks (read from ``/proc/locks``).

A blocking ``flock`` waits for ever on a process stopped (``SIGSTOP``) while it holds the lock: the kernel
drops a lock when its holder dies, not when it stops.  Every wait here polls a non-blocking attempt until a
deadline instead, and a wait that runs out says which process holds the lock: ``/proc/locks`` lists every
lock with its holder's pid (as this process's pid namespace sees it), so nothing has to be written beside
the lock and nothing goes stale when a holder dies.
"""

from __future__ import annotations

import errno
import fcntl
import os
import time
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from directload.errors import DirectloadError

if TYPE_CHECKING:
    import threading

__all__ = ["LockTimeout", "wait_lock", "holders", "describe_holders"]

_BUSY = (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK)


class LockTimeout(DirectloadError, TimeoutError):
    """A lock stayed held by another process until the deadline (or ``stop`` was set).  ``pids``: its
    holders as :func:`holders` found them (empty where none is visible).

    Examples
    --------
    >>> str(LockTimeout([42]))
    'the lock is held by pid 42'
    """

    def __init__(self, pids: Iterable[int], stopped: bool = False) -> None:
        self.pids = list(pids)
        self.stopped = stopped
        super().__init__(f"the lock is held by {describe_holders(self.pids)}")


def wait_lock(fd: int, deadline: float, *, exclusive: bool = True, span: tuple[int, int] | None = None,
              stop: threading.Event | None = None) -> None:
    """Take the ``flock`` on ``fd`` (or, with ``span=(start, length)``, the ``lockf`` record lock on that
    range), polling until ``time.monotonic()`` passes ``deadline``; raises :class:`LockTimeout` then, or as
    soon as the ``threading.Event`` ``stop`` is set.

    Examples
    --------
    >>> import tempfile, time
    >>> with tempfile.TemporaryFile() as f, tempfile.TemporaryFile() as g:
    ...     wait_lock(f.fileno(), time.monotonic() + 1)
    ...     other = os.open(f"/proc/self/fd/{f.fileno()}", os.O_RDONLY)  # a second open file: a second owner
    ...     try:
    ...         wait_lock(other, time.monotonic() + 0.05)
    ...     except LockTimeout as exc:
    ...         print(exc.pids == [os.getpid()])
    ...     os.close(other)
    True
    """
    op = fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH
    pause = 0.001
    while True:
        try:
            if span is None:
                fcntl.flock(fd, op | fcntl.LOCK_NB)
            else:
                fcntl.lockf(fd, op | fcntl.LOCK_NB, span[1], span[0])
            return
        except OSError as exc:
            if exc.errno not in _BUSY:
                raise
        stopped = stop is not None and stop.is_set()
        left = deadline - time.monotonic()
        if stopped or left <= 0:
            blockers = holders(fd, kind="FLOCK" if span is None else "POSIX", writers_only=not exclusive)
            raise LockTimeout(blockers, stopped=stopped)
        time.sleep(min(pause, left))
        pause = min(2 * pause, 0.05)


def holders(fd: int, *, kind: str | None = None, writers_only: bool = False) -> list[int]:
    """The pids holding a lock on the file open as ``fd``, from ``/proc/locks``, without duplicates: every
    kind of lock, or only ``kind`` (``"FLOCK"``, ``"POSIX"``), and only exclusive ones with
    ``writers_only``.  Empty where ``/proc/locks`` is unreadable or the holders are not visible from here.

    Examples
    --------
    >>> import tempfile
    >>> with tempfile.TemporaryFile() as f:
    ...     fcntl.flock(f.fileno(), fcntl.LOCK_EX)
    ...     holders(f.fileno()) == [os.getpid()]
    True
    """
    st = os.fstat(fd)
    where = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    try:
        with open("/proc/locks") as f:
            lines = f.read().splitlines()
    except OSError:
        return []
    pids = []
    for line in lines:
        # "1: FLOCK  ADVISORY  WRITE 1234 00:2d:5678 0 EOF"; a waiter's line has "->" after the number
        parts = line.split()
        if len(parts) < 6 or parts[1] == "->" or parts[5] != where:
            continue
        if (kind is not None and parts[1] != kind) or (writers_only and parts[3] != "WRITE"):
            continue
        try:
            pid = int(parts[4])
        except ValueError:
            continue
        if pid > 0 and pid not in pids:
            pids.append(pid)
    return pids


def describe_holders(pids: Sequence[int]) -> str:
    """``pids`` for a one-line message.

    Examples
    --------
    >>> describe_holders([7]), describe_holders([7, 9]), describe_holders([])
    ('pid 7', 'pids 7, 9', 'a process whose pid is not visible here')
    """
    if not pids:
        return "a process whose pid is not visible here"
    return ("pid " if len(pids) == 1 else "pids ") + ", ".join(str(p) for p in pids)
