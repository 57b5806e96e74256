"""One budget for every loader on a node: host-cache bytes, pinned bytes and disk queue depth, divided among
the loaders running (ranks of one job and separate jobs), as TENSILE schedules the memory of concurrent jobs.

No daemon: the budget is a directory in shared memory (``/dev/shm/directload-budget-<name>``) that every
loader reads and writes under one ``flock``.  It holds the budget's limits (written once, by the first
loader; a later one asking for other limits is refused) and one file per loader, which that loader keeps
``flock``-ed for as long as it lives.  A loader that ends removes its file; one that is killed loses its lock
with its life, and the next loader that looks (each looks every ``poll`` seconds) removes the file and takes
its share back, so a killed job's share returns within ``poll`` seconds of its death, pids never trusted.

Shares are max-min fair: each loader first gets its ``least`` (say, one batch's rows), then what is left is
split evenly among the loaders that want more, none getting more than it ``want`` s.  A loader joining
when the others' minimums leave no room for its own is refused with :class:`BudgetError` before it takes
anything.  The sum of what the loaders hold never exceeds the budget: a loader shrinks to a smaller share at
once, and grows into a larger one only as far as the others have already given back, so a loader that joins
may hold less than its ``least`` until the others next look (within ``poll``); a cache then reads through its
staging rows meanwhile.

Nothing made by others is followed or removed.  The directory is opened with ``O_NOFOLLOW`` and must be a
real directory of this user's; every file in it is opened relative to it, never through a link and never
blocking, and must be a regular file of this user's.  A sweep looks only at such directories that hold
nothing but the budget's own names (``lock``, ``limits.json``, ``member-<pid>-<hex>.json``,
``.<hex>.tmp``), and removes only those names.

Every crash point is recoverable.  Files are written under a ``.<hex>.tmp`` name and renamed into place,
both under the registry lock, so a ``.tmp`` that whoever holds the lock finds (and no process holds) was left
by a loader killed in between, and goes; a member file no process holds goes; a directory left empty or
half-made (a loader killed while making or removing it) is taken in hand by the next sweep like any other.

Stopped loaders.  The registry lock is taken by polling, for at most ``timeout`` seconds; a loader that
holds it longer (stopped with ``SIGSTOP``, say) is named in the one-line :class:`BudgetTimeout`, its pid read
from ``/proc/locks`` (the kernel's own record of who holds the lock: nothing to write beside it, nothing to
go stale).  A stopped loader's share is **not** reclaimed: it still holds its locks, pids are not trusted,
and it may resume.  The others keep the shares they hold: ``join`` and ``refresh`` raise
:class:`BudgetTimeout`, ``leave`` gives its share back all the same and then raises it, and a watcher keeps
its share and looks again every ``poll`` (:attr:`Share.stalled` says why it could not).  Once the stopped
loader is killed its locks go with it, and its share returns at the others' next look.

Examples
--------
>>> import tempfile
>>> with tempfile.TemporaryDirectory() as where:
...     budget = NodeBudget("doc", host_bytes=100, directory=where)
...     a = budget.join(Resources(host_bytes=80))
...     b = budget.join(Resources(host_bytes=80))
...     print(b.current.host_bytes, a.refresh().host_bytes, b.refresh().host_bytes)
...     a.leave()
...     print(b.refresh().host_bytes)
...     b.leave()
20 50 50
80
"""

from __future__ import annotations

import fcntl
import json
import math
import os
import re
import secrets
import stat
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, fields

from directload.errors import DirectloadError

from . import shm
from .flocks import LockTimeout, describe_holders, holders, wait_lock
from .units import check_int

__all__ = ["NodeBudget", "Share", "Resources", "BudgetError", "BudgetTimeout", "PREFIX", "fair_shares", "sweep"]

#: The start of every directory this module makes in shared memory (nothing else there is touched).
PREFIX = shm.PREFIX + "budget-"
_LONGEST = 100  # of a budget's name
_MEMBER = re.compile(r"member-(\d+)-([0-9a-f]{16})\.json")
_TMP = re.compile(r"\.[0-9a-f]{16}\.tmp|limits\.json\.\d+\.tmp")  # the second: the name earlier versions used
_FIXED = ("lock", "limits.json")
_RECORD_BYTES = 1 << 16
_WRONG_KIND = "{mode}, not a {kind}"  # how a budget's refusals say it


class BudgetError(DirectloadError, RuntimeError):
    """A node budget refused a loader: its minimum does not fit, or its limits differ from the budget's.

    Examples
    --------
    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as where:
    ...     NodeBudget("tiny", host_bytes=10, directory=where).join(Resources(64), least=Resources(64))
    Traceback (most recent call last):
    directload.budget.BudgetError: node budget 'tiny' has 10 of host_bytes; this loader needs at least 64 ...
    """


@dataclass(frozen=True)
class Resources:
    """Amounts of each budgeted resource: host-cache bytes, pinned bytes, disk queue depth.

    Examples
    --------
    >>> Resources(host_bytes=10) + Resources(host_bytes=5, io_depth=2)
    Resources(host_bytes=15, pinned_bytes=0, io_depth=2)
    """

    host_bytes: int = 0
    pinned_bytes: int = 0
    io_depth: int = 0

    def __post_init__(self):
        for f in fields(self):
            check_int(f.name, getattr(self, f.name), low=0)

    def __add__(self, other):
        return Resources(*(a + b for a, b in zip(self._values(), other._values())))

    def _values(self):
        return tuple(getattr(self, f.name) for f in fields(self))

    @classmethod
    def _of(cls, values):
        return cls(*(int(v) for v in values))


class BudgetTimeout(BudgetError, TimeoutError):
    """Another process held the budget's registry lock for longer than the budget's ``timeout`` (a loader
    stopped with ``SIGSTOP``, or stuck); the message names its pid.  Shares stay as they are.

    Examples
    --------
    >>> issubclass(BudgetTimeout, BudgetError), issubclass(BudgetTimeout, TimeoutError)
    (True, True)
    """


def fair_shares(budget: int, wants: Sequence[int], leasts: Sequence[int]) -> list[int]:
    """Max-min fair shares of one resource: the highest level ``L`` such that giving each loader its least,
    or ``L``, or its want, whichever is in the middle, fits the budget (water-filling); the units the integer
    level leaves over go one each to the first loaders at the level.

    Examples
    --------
    >>> fair_shares(100, [80, 80, 10], [0, 0, 0])
    [45, 45, 10]
    >>> fair_shares(100, [80, 30], [60, 0])
    [70, 30]
    """
    def fill(level):
        return [max(lo, min(w, level)) for w, lo in zip(wants, leasts)]

    lo, hi = 0, max(wants, default=0)
    while lo < hi:  # the highest level that fits
        mid = (lo + hi + 1) // 2
        if sum(fill(mid)) <= budget:
            lo = mid
        else:
            hi = mid - 1
    share = fill(lo)
    left = budget - sum(share)
    for i, w in enumerate(wants):
        if left <= 0:
            break
        if share[i] == lo and share[i] < w:
            share[i] += 1
            left -= 1
    return share


class NodeBudget:
    """A node's budget, by ``name``: every loader on the node that opens the same name shares it.

    Parameters
    ----------
    name : str
        The budget's name (letters, digits, ``_ . -``).
    host_bytes, pinned_bytes, io_depth : int
        The node's limits.  The first loader to open the name sets them; a loader that opens it with other
        limits while any loader uses it gets :class:`BudgetError`.
    directory : str
        Where the budget lives (default ``/dev/shm``).
    poll : float
        Seconds between a share's looks at the others (a killed loader's share returns within it).
    timeout : float
        Seconds a loader waits for the registry lock before :class:`BudgetTimeout` names its holder.

    Examples
    --------
    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as where:
    ...     budget = NodeBudget("node", host_bytes=2**30, io_depth=64, directory=where)
    ...     with budget.join(Resources(host_bytes=2**31, io_depth=32)) as share:
    ...         print(share.current)
    Resources(host_bytes=1073741824, pinned_bytes=0, io_depth=32)
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

    def join(self, want: Resources, *, least: Resources | None = None,
             on_change: Callable[[Resources], object] | None = None) -> Share:
        """Take a share of the budget: up to ``want`` (:class:`Resources`), at least ``least`` (default
        nothing).  ``on_change(resources)`` is called with the first share before ``join`` returns, then with
        each new one on a watcher thread that looks every ``poll`` seconds (shrinking before the share is
        given up, growing after it is taken); without it, call :meth:`Share.refresh` yourself.  Raises
        :class:`BudgetError` if ``least`` does not fit beside the other loaders' minimums, or the budget's
        directory is not one of ours, and :class:`BudgetTimeout` if another process holds the registry lock
        for more than ``timeout`` seconds.

        Examples
        --------
        >>> import tempfile
        >>> with tempfile.TemporaryDirectory() as where:
        ...     with NodeBudget("j", host_bytes=10, directory=where).join(Resources(4)) as share:
        ...         print(share.current.host_bytes)
        4
        """
        if not isinstance(want, Resources) or not (least is None or isinstance(least, Resources)):
            raise TypeError("want and least are directload.budget.Resources")
        least = least or Resources()
        if any(lo > w for lo, w in zip(least._values(), want._values())):
            raise ValueError(f"least {least} is more than want {want}")
        if on_change is not None and not callable(on_change):
            raise TypeError("on_change is a callable taking the new Resources")
        return Share(self, want, least, on_change)

    def _refuse(self, what):
        """The one-line refusal of a directory or file that is not the budget's own."""
        return BudgetError(f"node budget {self.name!r}: {what}, so not a budget's file of ours (a budget never "
                           "follows a link or touches what it did not make): remove it if it is not another "
                           "program's")

    def _check(self, st, where, kind=stat.S_ISREG):
        """A :class:`BudgetError` where ``st`` is not a regular file (or ``kind``) of this user's."""
        shm.check_ours(st, where, kind=kind, refuse=self._refuse, wrong_kind=_WRONG_KIND)

    def _locked(self, stop=None):
        """The registry, made where missing, held under its lock (a :class:`_Registry`); a holder that keeps
        the lock past ``timeout`` (or ``stop``, a ``threading.Event``, set) is a :class:`BudgetTimeout`."""
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
            raise self._refuse(f"{self.path} is {what}") from exc
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
                raise self._refuse(f"{self.path}/lock cannot be opened ({exc.strerror})") from exc
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
                return _Registry(self, dfd, lfd)
            return _close(dfd, lfd)  # the last loader removed the registry while we waited: the new one
        except BaseException:
            _close(dfd, lfd)
            raise


class _Registry:
    """A budget's directory (``dir``, an open descriptor) held under its lock (``lock``): the limits, the
    members and the tidying, every file opened relative to the directory."""

    def __init__(self, budget, dfd, lfd):
        self.budget, self.dir, self.lock = budget, dfd, lfd

    def close(self):
        _close(self.dir, self.lock)

    def open(self, entry, flags=os.O_RDONLY):
        """``entry`` opened when it is a regular file of ours (never through a link, never blocking, a FIFO
        or a device never opened); None where it is not there; else :class:`BudgetError`."""
        where = f"{self.budget.path}/{entry}"
        try:
            return shm.open_ours(entry, flags, dir_fd=self.dir, where=where, refuse=self.budget._refuse,
                                 wrong_kind=_WRONG_KIND)
        except OSError as exc:
            raise self.budget._refuse(f"{where} cannot be opened ({exc.strerror})") from exc

    def unlink(self, entry, fd):
        """Remove ``entry`` where it is still the file open as ``fd``."""
        shm.unlink_if_same(entry, fd, dir_fd=self.dir)

    def check_limits(self):
        budget = self.budget
        fd = self.open("limits.json")
        if fd is None:
            tmp = f".{secrets.token_hex(8)}.tmp"
            out = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | shm.NOFOLLOW, 0o600, dir_fd=self.dir)
            try:
                os.write(out, json.dumps({"limits": list(budget.limits._values())}).encode())
            finally:
                os.close(out)
            os.replace(tmp, "limits.json", src_dir_fd=self.dir, dst_dir_fd=self.dir)  # whole, or a .tmp swept
            return
        try:
            have = Resources._of(_counts(json.loads(os.pread(fd, _RECORD_BYTES, 0))["limits"]))
        except (ValueError, KeyError, TypeError, RecursionError) as exc:
            raise BudgetError(f"node budget {budget.name!r}: its limits file {budget.path}/limits.json is unreadable "
                              f"({exc})") from exc
        finally:
            os.close(fd)
        if have != budget.limits:
            raise BudgetError(f"node budget {budget.name!r} is in use with limits {have}; this loader asked for "
                              f"{budget.limits} (one name, one budget: use another name or the same limits)")

    def members(self):
        """The live members' records, oldest first.  The files no process holds go (a killed loader's: its
        share returns; a ``.tmp`` of a loader killed before its rename); a held file that is not a member
        record is a :class:`BudgetError` naming it and its holder."""
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

    def remove_if_empty(self):
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
    if (not isinstance(values, list) or len(values) != len(fields(Resources))
            or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in values)):
        raise ValueError(f"not {len(fields(Resources))} counts")
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
            registry = NodeBudget(name, host_bytes=0, directory=directory)._open(only_ours=True)
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


class Share:
    """One loader's share of a :class:`NodeBudget` (from :meth:`NodeBudget.join`).

    Attributes
    ----------
    current : Resources
        What this loader holds now.
    stalled : str or None
        Why the watcher's last look could not be taken (another process held the registry lock past the
        budget's ``timeout``; the share stays as it is and the watcher looks again every ``poll``), or None.

    Examples
    --------
    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as where:
    ...     sizes = []
    ...     with NodeBudget("s", host_bytes=100, directory=where).join(
    ...             Resources(host_bytes=60), on_change=lambda r: sizes.append(r.host_bytes)) as share:
    ...         print(share.current.host_bytes, sizes)
    60 [60]
    """

    def __init__(self, budget: NodeBudget, want: Resources, least: Resources,
                 on_change: Callable[[Resources], object] | None) -> None:
        self.budget, self.want, self.least, self._on_change = budget, want, least, on_change
        self._lock = threading.RLock()
        self._error = None
        self._stop = threading.Event()
        self._fd = self._dir = None
        self._applied = 0
        self.current = Resources()
        self.stalled = None
        token = secrets.token_hex(8)
        sweep(os.path.dirname(budget.path), skip=budget.name)
        registry = budget._locked()
        try:
            registry.check_limits()
            others = registry.members()
            floor = Resources()
            for rec in others:
                floor = floor + Resources._of(rec["least"])
            for name, lim, used, mine in zip([f.name for f in fields(Resources)], budget.limits._values(),
                                              floor._values(), least._values()):
                if used + mine > lim:
                    raise BudgetError(f"node budget {budget.name!r} has {lim} of {name}; this loader needs at least "
                                      f"{mine} and the {len(others)} loader(s) running keep {used} between them")
            self._file = f"member-{os.getpid()}-{token}.json"
            self._entry = tmp = f".{token}.tmp"
            self._dir = os.dup(registry.dir)  # its own file is found through this directory, whatever the path
            self._fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | shm.NOFOLLOW, 0o600, dir_fd=self._dir)
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a new file: nobody else holds it
            self._record = {"pid": os.getpid(), "joined": time.time_ns(), "want": list(want._values()),
                            "least": list(least._values()), "held": [0, 0, 0]}
            self._write()
            os.rename(tmp, self._file, src_dir_fd=self._dir, dst_dir_fd=self._dir)  # published whole, locked
            self._entry = self._file
            applied = self._applied
            self._settle(registry)
            if self._applied == applied:
                self._apply(self.current)  # on_change always hears the first share, even nothing
        except BaseException:
            self._drop_file()
            try:
                registry.remove_if_empty()
            except BudgetError:
                pass  # the refusal at hand is the one to report
            raise
        finally:
            registry.close()
        if on_change is not None:
            self._watcher = threading.Thread(target=self._watch, name=f"directload-budget-{budget.name}",
                                             daemon=True)
            self._watcher.start()

    def _write(self):
        data = json.dumps(self._record).encode()
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, data, 0)

    def _settle(self, registry):
        """Under the registry lock: this loader's fair share now, shrunk to at once, grown into as far as the
        others hold less; applied (``on_change``) before a shrink is published, after a growth is."""
        members = registry.members()
        mine = next((i for i, r in enumerate(members) if r["file"] == self._file), None)
        if mine is None:
            raise BudgetError(f"node budget {self.budget.name!r}: this loader's file {self._file} is gone from "
                              f"{self.budget.path} (removed by hand?); join again")
        target, room = [], []
        for k, lim in enumerate(self.budget.limits._values()):
            shares = fair_shares(lim, [r["want"][k] for r in members], [r["least"][k] for r in members])
            target.append(shares[mine])
            room.append(lim - sum(r["held"][k] for i, r in enumerate(members) if i != mine))
        held = self._record["held"]
        new = [min(t, h) if t <= h else max(h, min(t, r)) for t, h, r in zip(target, held, room)]
        if new == held and Resources._of(new) == self.current:
            return
        shrink = Resources._of([min(a, b) for a, b in zip(new, held)])
        if shrink != Resources._of(held):
            self._apply(shrink)  # give back first ...
            self._record["held"] = list(shrink._values())
            self._write()
        if Resources._of(new) != shrink:
            self._record["held"] = list(new)  # ... take after
            self._write()
            self._apply(Resources._of(new))
        self.current = Resources._of(new)

    def _apply(self, resources):
        self._applied += 1
        if self._on_change is not None:
            self._on_change(resources)
        self.current = resources

    def refresh(self) -> Resources:
        """Look at the others now: take back dead loaders' shares, shrink or grow to this loader's fair
        share.  Returns the share (:class:`Resources`).  Raises :class:`BudgetTimeout` (the share unchanged)
        where another process holds the registry lock past the budget's ``timeout``.

        Examples
        --------
        >>> import tempfile
        >>> with tempfile.TemporaryDirectory() as where:
        ...     with NodeBudget("r", host_bytes=10, directory=where).join(Resources(4)) as share:
        ...         print(share.refresh().host_bytes)
        4
        """
        return self._look()

    def _look(self, stop=None):
        with self._lock:
            if self._error is not None:
                raise BudgetError(f"node budget {self.budget.name!r}: the share's watcher failed: "
                                  f"{self._error}") from self._error
            if self._fd is None:
                raise BudgetError("this share was given back (leave())")
            registry = self.budget._locked(stop)
            try:
                self._settle(registry)
            finally:
                registry.close()
            self.stalled = None
            return self.current

    def _watch(self):
        while not self._stop.wait(self.budget.poll):
            try:
                self._look(self._stop)
            except BudgetTimeout as exc:  # a stopped holder: keep the share, look again at the next poll
                if self._stop.is_set():
                    return
                self.stalled = str(exc)
            except Exception as exc:  # reported at the next refresh() or leave(), never lost
                if self._fd is not None and self._error is None:
                    self._error = exc
                return

    def leave(self) -> None:
        """Give the share back (idempotent); the others grow into it at their next look.  Where another
        process holds the registry lock past the budget's ``timeout``, the share is given back all the same
        (as a killed loader's is) and :class:`BudgetTimeout` then says so.

        Examples
        --------
        >>> import tempfile
        >>> with tempfile.TemporaryDirectory() as where:
        ...     share = NodeBudget("l", host_bytes=10, directory=where).join(Resources(4))
        ...     share.leave(); share.leave()
        ...     print(os.listdir(where))
        []
        """
        self._stop.set()
        watcher = getattr(self, "_watcher", None)
        if watcher is not None and watcher is not threading.current_thread():
            watcher.join(max(5.0, 4 * self.budget.poll))
        with self._lock:
            if self._fd is None:
                return
            try:
                registry = self.budget._locked()
            except BudgetError as exc:
                self._drop_file()
                raise type(exc)(f"{exc}; this loader's share is given back all the same") from exc
            try:
                self._drop_file()
                registry.remove_if_empty()
            finally:
                registry.close()
        if self._error is not None:
            raise BudgetError(f"node budget {self.budget.name!r}: the share's watcher failed: {self._error}") \
                from self._error

    def _drop_file(self):
        if self._fd is not None:
            shm.unlink_if_same(self._entry, self._fd, dir_fd=self._dir)
            os.close(self._fd)
            self._fd = None
        if self._dir is not None:
            os.close(self._dir)
            self._dir = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.leave()

    def __repr__(self):
        return f"Share({self.budget.name!r}, current={self.current}, want={self.want})"

    def as_dict(self) -> dict[str, object]:
        return {"budget": self.budget.name, "current": asdict(self.current), "want": asdict(self.want)}
