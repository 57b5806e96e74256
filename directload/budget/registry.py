"""A node budget's shared registry: a directory in shared memory (``/dev/shm/directload-budget-<name>``) that
every loader reads and writes under one ``flock``, holding the budget's limits and one member file per
loader (its pid, when it joined, what it wants, needs and holds).

The protocol: :meth:`NodeRegistry.locked` opens the registry under its lock (made where missing);
:meth:`Registry.check_limits` writes or checks the limits; :meth:`Registry.members` reads the live members'
records and removes the files no process holds (a killed loader's; a ``.tmp`` of one killed before its
rename); :class:`Member` is one loader's file, written whole and ``flock``-ed for as long as it lives;
:meth:`Registry.remove_if_empty` removes the registry once no member is left; :func:`sweep` removes the
registries whose loaders are all gone.  Nothing made by others is followed or removed (see
:mod:`directload.budget`).
"""

from __future__ import annotations

import fcntl
import json
import math
import os
import re
import secrets
import stat
import time
from typing import TYPE_CHECKING, Any

from directload import shm
from directload.flocks import LockTimeout, describe_holders, holders, wait_lock

from .resources import BudgetError, BudgetTimeout, Resources

if TYPE_CHECKING:
    import threading

__all__ = ["NodeRegistry", "Registry", "Member", "sweep", "PREFIX"]

#: The start of every directory a budget makes in shared memory (nothing else there is touched).
PREFIX = shm.PREFIX + "budget-"
_LONGEST = 100  # of a budget's name
_MEMBER = re.compile(r"member-(\d+)-([0-9a-f]{16})\.json")
_TMP = re.compile(r"\.[0-9a-f]{16}\.tmp|limits\.json\.\d+\.tmp")  # the second: the name earlier versions used
_FIXED = ("lock", "limits.json")
_RECORD_BYTES = 1 << 16
_WRONG_KIND = "{mode}, not a {kind}"  # how a budget's refusals say it


class NodeRegistry:
    """A node budget's registry, by ``name``: where it lives, its limits, how often a share looks at it and
    how long a loader waits for its lock (:class:`~directload.budget.NodeBudget` takes the same parameters
    and adds ``join``).

    Examples
    --------
    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as where:
    ...     registry = NodeRegistry("r", host_bytes=10, directory=where).locked()
    ...     registry.check_limits(); print(registry.members(), registry.remove_if_empty())
    ...     registry.close()
    [] True
    """

    def __init__(self, name: str, *, host_bytes: int, pinned_bytes: int = 0, io_depth: int = 0,
                 directory: os.PathLike[str] | str | None = None, poll: float = 0.5, timeout: float = 30.0) -> None:
        if not shm.valid_name(name, _LONGEST):
            raise ValueError(f"a budget's name is letters, digits and _ . - (at most 100), not {name!r}")
        self.name = name
        self.limits = Resources(host_bytes, pinned_bytes, io_depth)
        if isinstance(poll, bool) or not isinstance(poll, (int, float)) or not 0.01 <= poll <= 60:
            raise ValueError(f"poll must be seconds in [0.01, 60], not {poll!r}")
        self.poll = float(poll)
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout < math.inf:
            raise ValueError(f"timeout must be a number of seconds > 0, not {timeout!r}")
        self.timeout = float(timeout)
        directory = os.fspath(directory) if directory is not None else shm.SHM_DIR
        if not os.path.isdir(directory):
            raise ValueError(f"a node budget lives in a directory that exists (a tmpfs such as /dev/shm), not "
                             f"{directory!r}")
        self.path = os.path.join(directory, PREFIX + name)

    def refuse(self, what: str) -> BudgetError:
        """The one-line refusal of a directory or file that is not the budget's own."""
        return BudgetError(f"node budget {self.name!r}: {what}, so not a budget's file of ours (a budget never "
                           "follows a link or touches what it did not make): remove it if it is not another "
                           "program's")

    def _check(self, st, where, kind=stat.S_ISREG):
        """A :class:`BudgetError` where ``st`` is not a regular file (or ``kind``) of this user's."""
        shm.check_ours(st, where, kind=kind, refuse=self.refuse, wrong_kind=_WRONG_KIND)

    def locked(self, stop: threading.Event | None = None) -> Registry:
        """The registry, made where missing, held under its lock; a holder that keeps the lock past
        ``timeout`` (or ``stop``, set) is a :class:`BudgetTimeout`.  :meth:`Registry.close` releases it."""
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                os.mkdir(self.path, 0o700)
            except FileExistsError:
                pass
            except OSError as exc:
                raise BudgetError(f"node budget {self.name!r}: cannot make {self.path} ({exc.strerror})") from exc
            registry = self._open(wait_until=deadline, stop=stop)
            if registry is not None:
                return registry
            if time.monotonic() > deadline:  # made and removed by others every time it was opened
                raise BudgetTimeout(f"node budget {self.name!r}: {self.path} kept being removed for {self.timeout:g} s")

    def _open(self, *, wait_until=None, stop=None, only_ours=False):
        """The registry held under its lock; None where it is not there (or was removed meanwhile) or, with
        ``wait_until`` None, where the lock is busy.  ``only_ours``: None also where the directory holds
        anything but the budget's own names (a sweep, which creates the lock where it is missing, looks
        only at those)."""
        try:
            dfd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            return None
        except OSError as exc:
            what = "a symbolic link" if os.path.islink(self.path) else "not a directory"
            raise self.refuse(f"{self.path} is {what}") from exc
        lfd = None
        try:
            self._check(os.fstat(dfd), self.path, stat.S_ISDIR)
            if only_ours and not _only_ours(dfd):
                return _close(dfd)
            try:
                lfd = os.open("lock", os.O_RDWR | os.O_CREAT | shm.NOFOLLOW, 0o600, dir_fd=dfd)
            except FileNotFoundError:  # the directory was removed meanwhile
                return _close(dfd)
            except OSError as exc:
                raise self.refuse(f"{self.path}/lock cannot be opened ({exc.strerror})") from exc
            self._check(os.fstat(lfd), f"{self.path}/lock")
            try:
                if wait_until is None:
                    if not shm.lock_if_free(lfd):
                        return _close(dfd, lfd)
                else:
                    wait_lock(lfd, wait_until, stop=stop)
            except LockTimeout as exc:
                raise BudgetTimeout(f"node budget {self.name!r}: {describe_holders(exc.pids)} has held its registry "
                                    f"lock ({self.path}/lock) for more than {self.timeout:g} s (a loader stopped "
                                    "with SIGSTOP, or stuck): shares stay as they are; resume or kill it") from exc
            if shm.same_file("lock", lfd, dir_fd=dfd) and shm.same_file(self.path, dfd):
                return Registry(self, dfd, lfd)
            return _close(dfd, lfd)  # the last loader removed the registry while we waited: the new one
        except BaseException:
            _close(dfd, lfd)
            raise


class Registry:
    """A budget's directory (``dir``, an open descriptor) held under its lock (``lock``): the limits, the
    members and the tidying, every file opened relative to the directory.  From :meth:`NodeRegistry.locked`.

    Examples
    --------
    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as where:
    ...     registry = NodeRegistry("held", host_bytes=10, directory=where).locked()
    ...     print(sorted(os.listdir(registry.dir))); registry.remove_if_empty(); registry.close()
    ['lock']
    True
    """

    def __init__(self, budget: NodeRegistry, dfd: int, lfd: int) -> None:
        self.budget, self.dir, self.lock = budget, dfd, lfd

    def close(self) -> None:
        """Release the lock and the directory."""
        _close(self.dir, self.lock)

    def open(self, entry: str, flags: int = os.O_RDONLY) -> int | None:
        """``entry`` opened when it is a regular file of ours (never through a link, never blocking, a FIFO
        or a device never opened); None where it is not there; else :class:`BudgetError`."""
        where = f"{self.budget.path}/{entry}"
        try:
            return shm.open_ours(entry, flags, dir_fd=self.dir, where=where, refuse=self.budget.refuse,
                                 wrong_kind=_WRONG_KIND)
        except OSError as exc:
            raise self.budget.refuse(f"{where} cannot be opened ({exc.strerror})") from exc

    def unlink(self, entry: str, fd: int) -> None:
        """Remove ``entry`` where it is still the file open as ``fd``."""
        shm.unlink_if_same(entry, fd, dir_fd=self.dir)

    def check_limits(self) -> None:
        """Write the budget's limits where this is the first loader; else :class:`BudgetError` where they
        differ from the limits in use."""
        budget = self.budget
        fd = self.open("limits.json")
        if fd is None:
            tmp = f".{secrets.token_hex(8)}.tmp"
            out = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | shm.NOFOLLOW, 0o600, dir_fd=self.dir)
            try:
                os.write(out, json.dumps({"limits": list(budget.limits.counts())}).encode())
            finally:
                os.close(out)
            os.replace(tmp, "limits.json", src_dir_fd=self.dir, dst_dir_fd=self.dir)  # whole, or a .tmp swept
            return
        try:
            have = Resources.from_counts(_counts(json.loads(os.pread(fd, _RECORD_BYTES, 0))["limits"]))
        except (ValueError, KeyError, TypeError, RecursionError) as exc:
            raise BudgetError(f"node budget {budget.name!r}: its limits file {budget.path}/limits.json is unreadable "
                              f"({exc})") from exc
        finally:
            os.close(fd)
        if have != budget.limits:
            raise BudgetError(f"node budget {budget.name!r} is in use with limits {have}; this loader asked for "
                              f"{budget.limits} (one name, one budget: use another name or the same limits)")

    def members(self) -> list[dict[str, Any]]:
        """The live members' records (``pid``, ``joined``, ``want``, ``least``, ``held``, ``file``), oldest
        first.  The files no process holds go (a killed loader's: its share returns; a ``.tmp`` of a loader
        killed before its rename); a held file that is not a member record is a :class:`BudgetError`
        naming it and its holder."""
        live = []
        for entry in sorted(os.listdir(self.dir)):
            if _MEMBER.fullmatch(entry):
                record = self._member(entry)
                if record is not None:
                    live.append(record)
            elif _TMP.fullmatch(entry):
                try:
                    fd = self.open(entry)
                except BudgetError:
                    continue  # not ours: left alone
                if fd is not None:
                    try:
                        shm.drop_unheld(entry, fd, dir_fd=self.dir)  # under the lock, a .tmp is a killed loader's
                    finally:
                        os.close(fd)
        return sorted(live, key=lambda r: (r["joined"], r["file"]))

    def _member(self, entry):
        fd = self.open(entry)
        if fd is None:
            return None
        try:
            if shm.drop_unheld(entry, fd, dir_fd=self.dir):  # its owner is gone (the lock went with it)
                return None
            try:
                record = _record(os.pread(fd, _RECORD_BYTES, 0))
            except ValueError as exc:
                raise BudgetError(f"node budget {self.budget.name!r}: member file {self.budget.path}/{entry}, held by "
                                  f"{describe_holders(holders(fd, kind='FLOCK'))}, is not a member record ({exc}): "
                                  "stop that process, or remove the file if it is not a loader's") from exc
        finally:
            os.close(fd)
        record["file"] = entry
        return record

    def remove_if_empty(self) -> bool:
        """With no member left, the registry goes: its own files, then the directory (nothing left behind in
        shared memory, nothing of anyone else's removed); whether it went."""
        if self.members():
            return False
        try:
            fd = self.open("limits.json")
        except BudgetError:
            fd = None  # not ours: left, and so is the directory
        if fd is not None:
            self.unlink("limits.json", fd)
            os.close(fd)
        self.unlink("lock", self.lock)
        try:
            if shm.same_file(self.budget.path, self.dir):
                os.rmdir(self.budget.path)
                return True
        except OSError:
            pass  # something else is there (a loader's file about to be published, or not ours)
        return False


class Member:
    """One loader's member file in a registry, ``member-<pid>-<hex>.json``: written whole under a ``.tmp``
    name and renamed into place under the registry lock, and ``flock``-ed by this process for as long as it
    lives (the kernel drops the lock with it, so a killed loader's file is found unheld).

    Examples
    --------
    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as where:
    ...     registry = NodeRegistry("m", host_bytes=10, directory=where).locked()
    ...     me = Member(registry, want=Resources(4), least=Resources())
    ...     print([r["want"] for r in registry.members()])
    ...     me.drop(); registry.remove_if_empty(); registry.close()
    [[4, 0, 0]]
    True
    """

    def __init__(self, registry: Registry, *, want: Resources, least: Resources) -> None:
        token = secrets.token_hex(8)
        self.file = f"member-{os.getpid()}-{token}.json"
        self._entry = tmp = f".{token}.tmp"
        self._fd: int | None = None
        self._dir: int | None = os.dup(registry.dir)  # its own file is found through this directory, whatever the path
        try:
            self._fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | shm.NOFOLLOW, 0o600, dir_fd=self._dir)
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a new file: nobody else holds it
            self.record: dict[str, Any] = {"pid": os.getpid(), "joined": time.time_ns(),
                                           "want": list(want.counts()), "least": list(least.counts()),
                                           "held": [0] * len(want.counts())}
            self.write()
            os.rename(tmp, self.file, src_dir_fd=self._dir, dst_dir_fd=self._dir)  # published whole, locked
            self._entry = self.file
        except BaseException:
            self.drop()
            raise

    @property
    def live(self) -> bool:
        """Whether the file is still this loader's (not dropped)."""
        return self._fd is not None

    def write(self) -> None:
        """Write :attr:`record` over the file (under the registry lock)."""
        if self._fd is None:
            raise BudgetError(f"member file {self.file} was given back")
        data = json.dumps(self.record).encode()
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, data, 0)

    def drop(self) -> None:
        """Remove the file (where it is still this one) and let go of it; idempotent."""
        if self._fd is not None:
            shm.unlink_if_same(self._entry, self._fd, dir_fd=self._dir)
            os.close(self._fd)
            self._fd = None
        if self._dir is not None:
            os.close(self._dir)
            self._dir = None


def _close(*fds):
    for fd in fds:
        if fd is not None:
            os.close(fd)


def _only_ours(dfd):
    """Whether the directory holds nothing but regular files of ours under the budget's own names."""
    for entry in os.listdir(dfd):
        if not (entry in _FIXED or _MEMBER.fullmatch(entry) or _TMP.fullmatch(entry)):
            return False
        try:
            st = os.stat(entry, dir_fd=dfd, follow_symlinks=False)
        except FileNotFoundError:
            continue
        if shm.why_not_ours(st) is not None:
            return False
    return True


def _counts(values):
    """One whole number >= 0 per resource, or ValueError."""
    n = len(Resources.names())
    if (not isinstance(values, list) or len(values) != n
            or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in values)):
        raise ValueError(f"not {n} counts")
    return values


def _record(data):
    """A member file's bytes as its record, every field checked; ValueError saying what is wrong."""
    try:
        record = json.loads(data)
    except (ValueError, RecursionError) as exc:
        raise ValueError("not JSON") from exc
    if not isinstance(record, dict) or not {"pid", "joined", "want", "least", "held"} <= record.keys():
        raise ValueError("fields missing")
    for key in ("pid", "joined"):
        if not isinstance(record[key], int) or isinstance(record[key], bool) or record[key] < 0:
            raise ValueError(f"its {key} is not a count")
    return {"pid": record["pid"], "joined": record["joined"],
            **{key: _counts(record[key]) for key in ("want", "least", "held")}}


def sweep(directory: os.PathLike[str] | str | None = None, *, skip: str | None = None) -> list[str]:
    """Remove the budgets in ``directory`` (default ``/dev/shm``) whose loaders are all gone (killed ones
    leave their files behind; a budget under a name never used again would stay): every join sweeps.  A
    budget in use, or one being made, is left alone, and so is anything that is not a real directory of this
    user's holding only the budget's own names (a link is never followed).  Returns the names removed.

    Examples
    --------
    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as where:
    ...     os.mkdir(os.path.join(where, PREFIX + "half-made"))  # a loader killed while making it
    ...     print(sweep(where), os.listdir(where))
    ['half-made'] []
    """
    directory = directory or shm.SHM_DIR
    gone = []
    for entry in shm.listing(directory, PREFIX):
        name = entry[len(PREFIX):]
        if name == skip or not shm.valid_name(name, _LONGEST):
            continue
        try:
            st = os.lstat(os.path.join(directory, entry))
        except OSError:
            continue
        if shm.why_not_ours(st, stat.S_ISDIR) is not None:
            continue  # a link, a file, another user's: never followed, never touched
        try:
            registry = NodeRegistry(name, host_bytes=0, directory=directory)._open(only_ours=True)
        except (BudgetError, OSError):
            continue
        if registry is None:
            continue  # a loader is at it now, it went meanwhile, or it holds what is not ours
        try:
            if registry.remove_if_empty():
                gone.append(name)
        except (BudgetError, OSError):
            continue  # a held member file that is not a record: its joiners are told
        finally:
            registry.close()
    return gone
