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

The package: :mod:`.resources` (what is divided, and how), :mod:`.registry` (the shared registry's
protocol), :mod:`.share` (a loader's share and the watcher that keeps it fair) and :mod:`.node`
(:class:`NodeBudget`, the name a loader opens).

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

from .node import NodeBudget
from .registry import PREFIX, sweep
from .resources import BudgetError, BudgetTimeout, Resources, fair_shares
from .share import Share

__all__ = ["NodeBudget", "Share", "Resources", "BudgetError", "BudgetTimeout", "PREFIX", "fair_shares", "sweep"]
