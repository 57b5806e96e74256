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

import errno
import fcntl
import json
import os
import re
import secrets
import threading
import time
from dataclasses import asdict, dataclass, fields

from .units import check_int

__all__ = ["NodeBudget", "Share", "Resources", "BudgetError", "PREFIX", "fair_shares", "sweep"]

#: The start of every directory this module makes in shared memory (nothing else there is touched).
PREFIX = "directload-budget-"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}")
_MEMBER = re.compile(r"member-(\d+)-([0-9a-f]{16})\.json")


class BudgetError(RuntimeError):
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


def fair_shares(budget, wants, leasts):
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

    Examples
    --------
    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as where:
    ...     budget = NodeBudget("node", host_bytes=2**30, io_depth=64, directory=where)
    ...     with budget.join(Resources(host_bytes=2**31, io_depth=32)) as share:
    ...         print(share.current)
    Resources(host_bytes=1073741824, pinned_bytes=0, io_depth=32)
    """

    def __init__(self, name, *, host_bytes, pinned_bytes=0, io_depth=0, directory=None, poll=0.5):
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise ValueError(f"a budget's name is letters, digits and _ . - (at most 100), not {name!r}")
        self.name = name
        self.limits = Resources(host_bytes, pinned_bytes, io_depth)
        if isinstance(poll, bool) or not isinstance(poll, (int, float)) or not 0.01 <= poll <= 60:
            raise ValueError(f"poll must be seconds in [0.01, 60], not {poll!r}")
        self.poll = float(poll)
        directory = os.fspath(directory) if directory is not None else "/dev/shm"
        if not os.path.isdir(directory):
            raise ValueError(f"a node budget lives in a directory that exists (a tmpfs such as /dev/shm), not "
                             f"{directory!r}")
        self.path = os.path.join(directory, PREFIX + name)

    def join(self, want, *, least=None, on_change=None):
        """Take a share of the budget: up to ``want`` (:class:`Resources`), at least ``least`` (default
        nothing).  ``on_change(resources)`` is called with the first share before ``join`` returns, then with
        each new one on a watcher thread that looks every ``poll`` seconds (shrinking before the share is
        given up, growing after it is taken); without it, call :meth:`Share.refresh` yourself.  Raises
        :class:`BudgetError` if ``least`` does not fit beside the other loaders' minimums."""
        if not isinstance(want, Resources) or not (least is None or isinstance(least, Resources)):
            raise TypeError("want and least are directload.budget.Resources")
        least = least or Resources()
        if any(lo > w for lo, w in zip(least._values(), want._values())):
            raise ValueError(f"least {least} is more than want {want}")
        if on_change is not None and not callable(on_change):
            raise TypeError("on_change is a callable taking the new Resources")
        return Share(self, want, least, on_change)

    # ------------------------------------------------------------ the registry, under its lock
    def _locked(self):
        """The registry's lock file, held (exclusive).  A registry removed meanwhile is made again."""
        while True:
            os.makedirs(self.path, exist_ok=True)
            try:
                fd = os.open(os.path.join(self.path, "lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            except FileNotFoundError:  # removed between makedirs and open: again
                continue
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                same = os.path.samestat(os.fstat(fd), os.stat(os.path.join(self.path, "lock")))
            except FileNotFoundError:
                same = False
            if same:
                return fd
            os.close(fd)  # the last loader removed the registry while we waited: the new one

    def _check_limits(self):
        path = os.path.join(self.path, "limits.json")
        try:
            with open(path) as f:
                have = Resources._of(json.load(f)["limits"])
        except FileNotFoundError:
            tmp = path + f".{os.getpid()}.tmp"
            with open(tmp, "w") as f:
                json.dump({"limits": list(self.limits._values())}, f)
            os.replace(tmp, path)
            return
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise BudgetError(f"node budget {self.name!r}: its limits file {path} is unreadable ({exc})") from exc
        if have != self.limits:
            raise BudgetError(f"node budget {self.name!r} is in use with limits {have}; this loader asked for "
                              f"{self.limits} (one name, one budget: use another name or the same limits)")

    def _members(self):
        """The live members' records, oldest first; the files of dead ones are removed (their shares return)."""
        live = []
        for entry in os.listdir(self.path):
            m = _MEMBER.fullmatch(entry)
            if not m:
                continue
            path = os.path.join(self.path, entry)
            try:
                fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            except FileNotFoundError:
                continue
            try:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except OSError as exc:
                    if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                        raise
                    with os.fdopen(os.dup(fd)) as f:
                        rec = json.load(f)
                    rec["file"] = entry
                    live.append(rec)
                    continue
                os.unlink(path)  # its owner is gone (the lock went with it): its share returns
            finally:
                os.close(fd)
        return sorted(live, key=lambda r: (r["joined"], r["file"]))

    def _remove_if_empty(self):
        """Under the lock: with no member left, the registry goes (nothing left behind in shared memory)."""
        if self._members():
            return
        for entry in ("limits.json", "lock"):
            try:
                os.unlink(os.path.join(self.path, entry))
            except FileNotFoundError:
                pass
        try:
            os.rmdir(self.path)
        except OSError:
            pass  # something else of ours is there (a loader's member file about to be published)


def sweep(directory=None, *, skip=None):
    """Remove the budgets in ``directory`` (default ``/dev/shm``) whose loaders are all gone (killed ones
    leave their files behind; a budget under a name never used again would stay): every join sweeps.  A
    budget in use, or one being made, is left alone.  Returns the names removed."""
    directory = directory or "/dev/shm"
    gone = []
    try:
        entries = os.listdir(directory)
    except OSError:
        return gone
    for entry in entries:
        name = entry[len(PREFIX):]
        if not entry.startswith(PREFIX) or name == skip or not _NAME.fullmatch(name):
            continue
        other = NodeBudget(name, host_bytes=0, directory=directory)
        lock = os.path.join(other.path, "lock")
        try:
            fd = os.open(lock, os.O_RDWR | os.O_CLOEXEC)
        except OSError:  # being made, or not ours
            continue
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                continue  # a loader is at it now: it is in use
            try:
                same = os.path.samestat(os.fstat(fd), os.stat(lock))
            except FileNotFoundError:
                same = False
            if same:
                other._remove_if_empty()
                if not os.path.exists(other.path):
                    gone.append(name)
        finally:
            os.close(fd)
    return gone


class Share:
    """One loader's share of a :class:`NodeBudget` (from :meth:`NodeBudget.join`).

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

    def __init__(self, budget, want, least, on_change):
        self.budget, self.want, self.least, self._on_change = budget, want, least, on_change
        self._lock = threading.RLock()
        self._error = None
        self._stop = threading.Event()
        self._fd = None
        self._applied = 0
        self.current = Resources()
        token = secrets.token_hex(8)
        sweep(os.path.dirname(budget.path), skip=budget.name)
        fd = budget._locked()
        try:
            budget._check_limits()
            others = budget._members()
            floor = Resources()
            for rec in others:
                floor = floor + Resources._of(rec["least"])
            for name, lim, used, mine in zip([f.name for f in fields(Resources)], budget.limits._values(),
                                              floor._values(), least._values()):
                if used + mine > lim:
                    raise BudgetError(f"node budget {budget.name!r} has {lim} of {name}; this loader needs at least "
                                      f"{mine} and the {len(others)} loader(s) running keep {used} between them")
            self._file = os.path.join(budget.path, f"member-{os.getpid()}-{token}.json")
            tmp = self._path = os.path.join(budget.path, f".{token}.tmp")
            self._fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
            fcntl.flock(self._fd, fcntl.LOCK_EX)
            self._record = {"pid": os.getpid(), "joined": time.time_ns(), "want": list(want._values()),
                            "least": list(least._values()), "held": [0, 0, 0]}
            self._write()
            os.rename(tmp, self._file)  # published whole, already locked
            self._path = self._file
            applied = self._applied
            self._settle()
            if self._applied == applied:
                self._apply(self.current)  # on_change always hears the first share, even nothing
        except BaseException:
            if self._fd is not None:
                self._drop_file()
            budget._remove_if_empty()
            raise
        finally:
            os.close(fd)
        if on_change is not None:
            self._watcher = threading.Thread(target=self._watch, name=f"directload-budget-{budget.name}",
                                             daemon=True)
            self._watcher.start()

    def _write(self):
        data = json.dumps(self._record).encode()
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, data, 0)

    def _settle(self):
        """Under the registry lock: this loader's fair share now, shrunk to at once, grown into as far as the
        others hold less; applied (``on_change``) before a shrink is published, after a growth is."""
        members = self.budget._members()
        mine = next(i for i, r in enumerate(members) if r["file"] == os.path.basename(self._file))
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

    def refresh(self):
        """Look at the others now: take back dead loaders' shares, shrink or grow to this loader's fair
        share.  Returns the share (:class:`Resources`)."""
        with self._lock:
            if self._error is not None:
                raise BudgetError(f"node budget {self.budget.name!r}: the share's watcher failed: "
                                  f"{self._error}") from self._error
            if self._fd is None:
                raise BudgetError("this share was given back (leave())")
            fd = self.budget._locked()
            try:
                self._settle()
            finally:
                os.close(fd)
            return self.current

    def _watch(self):
        while not self._stop.wait(self.budget.poll):
            try:
                self.refresh()
            except Exception as exc:  # reported at the next refresh() or leave(), never lost
                if self._fd is not None and self._error is None:
                    self._error = exc
                return

    def leave(self):
        """Give the share back (idempotent); the others grow into it at their next look."""
        self._stop.set()
        watcher = getattr(self, "_watcher", None)
        if watcher is not None and watcher is not threading.current_thread():
            watcher.join(max(5.0, 4 * self.budget.poll))
        with self._lock:
            if self._fd is None:
                return
            fd = self.budget._locked()
            try:
                self._drop_file()
                self.budget._remove_if_empty()
            finally:
                os.close(fd)
        if self._error is not None:
            raise BudgetError(f"node budget {self.budget.name!r}: the share's watcher failed: {self._error}") \
                from self._error

    def _drop_file(self):
        try:
            os.unlink(self._path)
        except FileNotFoundError:
            pass
        os.close(self._fd)
        self._fd = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.leave()

    def __repr__(self):
        return f"Share({self.budget.name!r}, current={self.current}, want={self.want})"

    def as_dict(self):
        return {"budget": self.budget.name, "current": asdict(self.current), "want": asdict(self.want)}
