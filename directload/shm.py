"""Registries in shared memory (``/dev/shm``): our names, our files, and sweeping what dead processes left.

The node budget (:mod:`directload.budget`) and the shared tables (:mod:`directload.shared`) keep files in a
tmpfs that every process of the node sees, and both follow one discipline, which lives here:

* Every name starts with :data:`PREFIX` (each user adds its own word after it) and the rest is letters,
  digits and ``_ . -`` (:func:`valid_name`); :func:`listing` finds them.  Nothing else there is touched.
* A file is ours only when it is a regular file (or, where asked, a directory) of this user's
  (:func:`why_not_ours`, :func:`check_ours`), and, where its owner writes one, it starts with its magic
  (:func:`has_magic`).  It is opened only as such (:func:`open_ours`): looked at with ``lstat``, opened with
  ``O_NOFOLLOW | O_NONBLOCK`` (a link is never followed, a FIFO or a device never blocks the open), checked
  again on the open descriptor, and taken only where it still is the file looked at.
* A member holds a ``flock`` on its file for as long as it lives, and the kernel drops the lock when the
  process dies, so a file no process holds is a dead member's (:func:`lock_if_free`, :func:`drop_unheld`,
  and :func:`sweep` for a whole prefix): pids are not trusted for that.  Where a pid has to be (a writer's
  name carries it, for the instant before it holds its lock), :func:`alive` asks the kernel.
* A name is removed only where it is still the file that was opened and checked (:func:`same_file`,
  :func:`unlink_if_same`): a file put in its place meanwhile is never removed.
"""

from __future__ import annotations

import fcntl
import os
import re
import stat
from collections.abc import Callable

from directload.errors import DirectloadError

__all__ = ["SHM_DIR", "PREFIX", "PID_MAX", "NOFOLLOW", "WRONG_KIND", "NotOursError", "valid_name", "listing",
           "why_not_ours", "check_ours", "open_ours", "has_magic", "same_file", "unlink_if_same", "lock_if_free",
           "drop_unheld", "sweep", "alive"]

#: Where the registries go by default: the tmpfs POSIX shared memory lives in.
SHM_DIR = "/dev/shm"
#: The start of every name directload makes in shared memory (a budget's, a table's: each adds its own word).
PREFIX = "directload-"
#: Linux's largest ``pid_max``: no pid is as large.
PID_MAX = 1 << 22
#: Flags every open of a file in a registry carries: never through a link, never blocking, never inherited.
NOFOLLOW = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
#: How :func:`why_not_ours` says that a file is of the wrong kind (``{mode}``: its ``ls -l`` mode).
WRONG_KIND = "not a {kind} ({mode})"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


class NotOursError(DirectloadError, RuntimeError):
    """A file under one of our names that is not ours to touch: a link, a FIFO, a device, another user's.

    Examples
    --------
    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as where:
    ...     check_ours(os.stat(where), "the directory")
    Traceback (most recent call last):
    directload.shm.NotOursError: the directory is not a regular file (drwx------)
    """


def valid_name(name: object, longest: int = 200) -> bool:
    """Whether ``name`` may follow a prefix: a ``str`` of 1 to ``longest`` letters, digits, ``_``, ``.`` or
    ``-``, starting with a letter or a digit (so never ``.``, ``..`` or a hidden name, never a path).

    Examples
    --------
    >>> valid_name("ogbn-papers100M.v2"), valid_name("../etc"), valid_name(".hidden"), valid_name("a" * 9, 8)
    (True, False, False, False)
    """
    return isinstance(name, str) and len(name) <= longest and _NAME.fullmatch(name) is not None


def listing(directory: os.PathLike[str] | str, prefix: str) -> list[str]:
    """The names in ``directory`` that start with ``prefix``, sorted; none where it cannot be listed.

    Examples
    --------
    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as where:
    ...     _ = [open(os.path.join(where, n), "w").close() for n in ("directload-x-b", "directload-x-a", "other")]
    ...     print(listing(where, "directload-x-"), listing(os.path.join(where, "missing"), "directload-x-"))
    ['directload-x-a', 'directload-x-b'] []
    """
    try:
        return sorted(n for n in os.listdir(directory) if n.startswith(prefix))
    except OSError:
        return []


def why_not_ours(st: os.stat_result, kind: Callable[[int], bool] = stat.S_ISREG, *,
                 wrong_kind: str = WRONG_KIND) -> str | None:
    """Why the file ``st`` (an ``os.stat_result``) describes is not ours: None where it is a regular file
    (``kind=stat.S_ISDIR``: a directory) of this user's; else ``wrong_kind`` filled in (``{kind}`` the kind
    asked for, ``{mode}`` the file's ``ls -l`` mode), or the uid that owns it.

    Examples
    --------
    >>> import tempfile
    >>> with tempfile.NamedTemporaryFile() as f:
    ...     print(why_not_ours(os.stat(f.name)), why_not_ours(os.stat(f.name), stat.S_ISDIR))
    ...     print(why_not_ours(os.stat(f.name), stat.S_ISDIR, wrong_kind="{mode}, not a {kind}"))
    None not a directory (-rw-------)
    -rw-------, not a directory
    """
    if not kind(st.st_mode):
        noun = "directory" if kind is stat.S_ISDIR else "regular file"
        return wrong_kind.format(kind=noun, mode=stat.filemode(st.st_mode))
    if st.st_uid != os.geteuid():
        return f"owned by uid {st.st_uid}, not by this user"
    return None


def check_ours(st: os.stat_result, where: str, *, kind: Callable[[int], bool] = stat.S_ISREG,
               refuse: Callable[[str], BaseException] = NotOursError, wrong_kind: str = WRONG_KIND) -> None:
    """Raise ``refuse(f"{where} is {why}")`` where :func:`why_not_ours` says why ``st`` is not ours.

    Examples
    --------
    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as where:
    ...     check_ours(os.stat(where), where, kind=stat.S_ISDIR)  # ours: nothing happens
    ...     check_ours(os.stat(where), "it", refuse=ValueError)
    Traceback (most recent call last):
    ValueError: it is not a regular file (drwx------)
    """
    why = why_not_ours(st, kind, wrong_kind=wrong_kind)
    if why is not None:
        raise refuse(f"{where} is {why}")


def open_ours(path: str, flags: int = os.O_RDONLY, *, dir_fd: int | None = None, where: str | None = None,
              refuse: Callable[[str], BaseException] = NotOursError, wrong_kind: str = WRONG_KIND) -> int | None:
    """``path`` (relative to the directory open as ``dir_fd``, where given) opened with ``flags``
    (``os.O_RDONLY`` or ``os.O_RDWR``) when it is a regular file of this user's: never through a link and never
    blocking (a FIFO or a device is not even opened).  None where nothing has that name, or where it was
    replaced between the look and the open (the caller looks again).  Anything else there raises as
    :func:`check_ours` does, naming ``where`` (default ``path``); an open that fails otherwise raises its
    ``OSError``.

    Examples
    --------
    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as where:
    ...     os.symlink("/etc/passwd", os.path.join(where, "link"))
    ...     open(os.path.join(where, "file"), "w").close()
    ...     fd = open_ours(os.path.join(where, "file"))
    ...     print(fd is not None, open_ours(os.path.join(where, "gone")))
    ...     os.close(fd)
    ...     try:
    ...         open_ours(os.path.join(where, "link"), where="link")
    ...     except NotOursError as exc:
    ...         print(exc)
    True None
    link is not a regular file (lrwxrwxrwx)
    """
    where = path if where is None else where
    try:
        before = os.stat(path, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None
    check_ours(before, where, refuse=refuse, wrong_kind=wrong_kind)
    try:
        fd = os.open(path, flags | NOFOLLOW, dir_fd=dir_fd)
    except FileNotFoundError:
        return None
    try:
        now = os.fstat(fd)
        check_ours(now, where, refuse=refuse, wrong_kind=wrong_kind)
    except BaseException:
        os.close(fd)
        raise
    if not os.path.samestat(now, before):  # replaced meanwhile
        os.close(fd)
        return None
    return fd


def has_magic(fd: int, magic: bytes) -> bool:
    """Whether the file open as ``fd`` starts with the bytes ``magic``.

    Examples
    --------
    >>> import tempfile
    >>> with tempfile.TemporaryFile() as f:
    ...     _ = f.write(b"DLSHARE1 and the rest"); f.flush()
    ...     has_magic(f.fileno(), b"DLSHARE1"), has_magic(f.fileno(), b"DLBUDGET")
    (True, False)
    """
    return os.pread(fd, len(magic), 0) == magic


def same_file(path: str, fd: int, *, dir_fd: int | None = None) -> bool:
    """Whether ``path`` (relative to ``dir_fd``, where given; a link is not followed) is the file open as
    ``fd``: False where it is gone or another file has its name now.

    Examples
    --------
    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as where:
    ...     path, other = os.path.join(where, "f"), os.path.join(where, "g")
    ...     open(path, "w").close(); open(other, "w").close()
    ...     fd = os.open(path, os.O_RDONLY)
    ...     before = same_file(path, fd)
    ...     os.replace(other, path)  # another file under its name
    ...     print(before, same_file(path, fd))
    ...     os.close(fd)
    True False
    """
    try:
        return os.path.samestat(os.stat(path, dir_fd=dir_fd, follow_symlinks=False), os.fstat(fd))
    except FileNotFoundError:
        return False


def unlink_if_same(path: str, fd: int, *, dir_fd: int | None = None) -> bool:
    """Remove ``path`` (relative to ``dir_fd``, where given) where it is still the file open as ``fd``;
    whether it did.  A file put in its place is never removed.

    Examples
    --------
    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as where:
    ...     path = os.path.join(where, "f")
    ...     open(path, "w").close()
    ...     fd = os.open(path, os.O_RDONLY)
    ...     print(unlink_if_same(path, fd), unlink_if_same(path, fd), os.listdir(where))
    ...     os.close(fd)
    True False []
    """
    if not same_file(path, fd, dir_fd=dir_fd):
        return False
    try:
        os.unlink(path, dir_fd=dir_fd)
    except FileNotFoundError:
        return False
    return True


def lock_if_free(fd: int) -> bool:
    """Take the exclusive ``flock`` on the file open as ``fd`` where no other open file of it holds a lock
    (its members are all dead); whether it did.  Never waits.

    Examples
    --------
    >>> import tempfile
    >>> with tempfile.NamedTemporaryFile() as f:
    ...     member = os.open(f.name, os.O_RDONLY)
    ...     fcntl.flock(member, fcntl.LOCK_SH)  # a live member
    ...     held = lock_if_free(f.fileno())
    ...     os.close(member)  # the member dies: its lock goes with it
    ...     print(held, lock_if_free(f.fileno()))
    False True
    """
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def drop_unheld(path: str, fd: int, *, dir_fd: int | None = None) -> bool:
    """Sweep one dead member: where no process holds a lock on the file open as ``fd``
    (:func:`lock_if_free`), remove ``path`` if it is still that file (:func:`unlink_if_same`).  Whether no
    process held it (it is then this process's, locked).

    Examples
    --------
    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as where:
    ...     path = os.path.join(where, "member")
    ...     with open(path, "w") as member:
    ...         fcntl.flock(member, fcntl.LOCK_SH)  # a live member
    ...         fd = os.open(path, os.O_RDONLY)
    ...         print(drop_unheld(path, fd), os.listdir(where))
    ...     print(drop_unheld(path, fd), os.listdir(where))  # the member is gone, and its lock
    ...     os.close(fd)
    False ['member']
    True []
    """
    if not lock_if_free(fd):
        return False
    unlink_if_same(path, fd, dir_fd=dir_fd)
    return True


def sweep(directory: os.PathLike[str] | str, prefix: str, *, ours: Callable[[int, str], bool] | None = None,
          owner_alive: Callable[[int], bool] | None = None) -> list[str]:
    """Remove the files under ``prefix`` in ``directory`` that dead processes left: regular files of this
    user's (:func:`open_ours`) that ``ours(fd, name)`` accepts (default: all), that no process holds
    (:func:`lock_if_free`) and whose owner, where ``owner_alive(fd)`` asks after the lock is taken, is gone.
    Nothing else is touched: a link is never followed, a FIFO or a device never opened, and a name is removed
    only where it still is the file looked at.  Returns the names removed.

    Examples
    --------
    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as where:
    ...     for name in ("directload-x-dead", "directload-x-held", "other"):
    ...         open(os.path.join(where, name), "w").close()
    ...     member = os.open(os.path.join(where, "directload-x-held"), os.O_RDONLY)
    ...     fcntl.flock(member, fcntl.LOCK_SH)  # a live member holds its file
    ...     print(sweep(where, "directload-x-"), sorted(os.listdir(where)))
    ...     os.close(member)
    ['directload-x-dead'] ['directload-x-held', 'other']
    """
    gone = []
    for name in listing(directory, prefix):
        path = os.path.join(directory, name)
        try:
            fd = open_ours(path)
        except (NotOursError, OSError):
            continue  # not ours: never touched
        if fd is None:
            continue
        try:
            if ours is not None and not ours(fd, name):
                continue
            if not lock_if_free(fd):
                continue  # a live member holds it
            if owner_alive is not None and owner_alive(fd):
                continue
            if unlink_if_same(path, fd):
                gone.append(name)
        except OSError:
            continue
        finally:
            os.close(fd)
    return gone


def alive(pid: int) -> bool:
    """Whether a process ``pid`` runs (this user's or another's); False for a number that is no pid.

    Examples
    --------
    >>> alive(os.getpid()), alive(0), alive(-1), alive(PID_MAX)
    (True, False, False, False)
    """
    if not 0 < pid < PID_MAX:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # alive, another user's
    return True
