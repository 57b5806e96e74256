"""One loader's share of a node budget, and the watcher that keeps it fair: a thread that looks at the
registry every ``poll`` seconds, takes back dead loaders' shares and resizes the loader's caches through
``on_change``, shrinking before it gives a share up and growing only into what the others gave back.

The share is a member of the budget's registry (:mod:`.registry`); where another process holds the registry
lock past the budget's ``timeout`` (a loader stopped with ``SIGSTOP``), the watcher keeps the share it holds
and says why in :attr:`Share.stalled`, and any other failure is kept for the next :meth:`Share.refresh` or
:meth:`Share.leave`, never lost.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from dataclasses import asdict

from .registry import Member, NodeRegistry, Registry, sweep
from .resources import BudgetError, BudgetTimeout, Resources, fair_shares

__all__ = ["Share"]


class Share:
    """One loader's share of a :class:`~directload.budget.NodeBudget` (from
    :meth:`~directload.budget.NodeBudget.join`).

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
    >>> from directload.budget import NodeBudget
    >>> with tempfile.TemporaryDirectory() as where:
    ...     sizes = []
    ...     with NodeBudget("s", host_bytes=100, directory=where).join(
    ...             Resources(host_bytes=60), on_change=lambda r: sizes.append(r.host_bytes)) as share:
    ...         print(share.current.host_bytes, sizes)
    60 [60]
    """

    def __init__(self, budget: NodeRegistry, want: Resources, least: Resources,
                 on_change: Callable[[Resources], object] | None) -> None:
        self.budget, self.want, self.least, self._on_change = budget, want, least, on_change
        self._lock = threading.RLock()
        self._error: Exception | None = None
        self._stop = threading.Event()
        self._member: Member | None = None
        self._watcher: threading.Thread | None = None
        self._applied = 0
        self.current = Resources()
        self.stalled: str | None = None
        sweep(os.path.dirname(budget.path), skip=budget.name)
        registry = budget.locked()
        try:
            registry.check_limits()
            self._check_floor(registry.members())
            self._member = Member(registry, want=want, least=least)
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

    def _check_floor(self, others):
        """:class:`BudgetError` where this loader's least does not fit beside the others' minimums."""
        floor = Resources()
        for rec in others:
            floor = floor + Resources.from_counts(rec["least"])
        for name, lim, used, mine in zip(Resources.names(), self.budget.limits.counts(), floor.counts(),
                                          self.least.counts()):
            if used + mine > lim:
                raise BudgetError(f"node budget {self.budget.name!r} has {lim} of {name}; this loader needs at least "
                                  f"{mine} and the {len(others)} loader(s) running keep {used} between them")

    def _settle(self, registry: Registry) -> None:
        """Under the registry lock: this loader's fair share now, shrunk to at once, grown into as far as the
        others hold less; applied (``on_change``) before a shrink is published, after a growth is."""
        member = self._member
        if member is None:
            raise BudgetError("this share was given back (leave())")
        members = registry.members()
        mine = next((i for i, r in enumerate(members) if r["file"] == member.file), None)
        if mine is None:
            raise BudgetError(f"node budget {self.budget.name!r}: this loader's file {member.file} is gone from "
                              f"{self.budget.path} (removed by hand?); join again")
        target, room = [], []
        for k, lim in enumerate(self.budget.limits.counts()):
            shares = fair_shares(lim, [r["want"][k] for r in members], [r["least"][k] for r in members])
            target.append(shares[mine])
            room.append(lim - sum(r["held"][k] for i, r in enumerate(members) if i != mine))
        held = member.record["held"]
        new = [min(t, h) if t <= h else max(h, min(t, r)) for t, h, r in zip(target, held, room)]
        if new == held and Resources.from_counts(new) == self.current:
            return
        shrink = Resources.from_counts([min(a, b) for a, b in zip(new, held)])
        if shrink != Resources.from_counts(held):
            self._apply(shrink)  # give back first ...
            member.record["held"] = list(shrink.counts())
            member.write()
        if Resources.from_counts(new) != shrink:
            member.record["held"] = list(new)  # ... take after
            member.write()
            self._apply(Resources.from_counts(new))
        self.current = Resources.from_counts(new)

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
        >>> from directload.budget import NodeBudget
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
            if self._member is None:
                raise BudgetError("this share was given back (leave())")
            registry = self.budget.locked(stop)
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
                if self._member is not None and self._error is None:
                    self._error = exc
                return

    def leave(self) -> None:
        """Give the share back (idempotent); the others grow into it at their next look.  Where another
        process holds the registry lock past the budget's ``timeout``, the share is given back all the same
        (as a killed loader's is) and :class:`BudgetTimeout` then says so.

        Examples
        --------
        >>> import os, tempfile
        >>> from directload.budget import NodeBudget
        >>> with tempfile.TemporaryDirectory() as where:
        ...     share = NodeBudget("l", host_bytes=10, directory=where).join(Resources(4))
        ...     share.leave(); share.leave()
        ...     print(os.listdir(where))
        []
        """
        self._stop.set()
        watcher = self._watcher
        if watcher is not None and watcher is not threading.current_thread():
            watcher.join(max(5.0, 4 * self.budget.poll))
        with self._lock:
            if self._member is None:
                return
            try:
                registry = self.budget.locked()
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
        if self._member is not None:
            self._member.drop()
            self._member = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.leave()

    def __repr__(self):
        return f"Share({self.budget.name!r}, current={self.current}, want={self.want})"

    def as_dict(self) -> dict[str, object]:
        """The share as plain values: the budget's name, what it holds and what it wants.

        Examples
        --------
        >>> import tempfile
        >>> from directload.budget import NodeBudget
        >>> with tempfile.TemporaryDirectory() as where:
        ...     with NodeBudget("d", host_bytes=10, directory=where).join(Resources(4)) as share:
        ...         print(share.as_dict()["current"])
        {'host_bytes': 4, 'pinned_bytes': 0, 'io_depth': 0}
        """
        return {"budget": self.budget.name, "current": asdict(self.current), "want": asdict(self.want)}
