"""What a node budget divides (:class:`Resources`), how it divides them (:func:`fair_shares`, max-min fair) and
how it refuses (:class:`BudgetError`, :class:`BudgetTimeout`)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, fields

from directload.errors import DirectloadError
from directload.units import check_int

__all__ = ["Resources", "BudgetError", "BudgetTimeout", "fair_shares"]


class BudgetError(DirectloadError, RuntimeError):
    """A node budget refused a loader: its minimum does not fit, or its limits differ from the budget's.

    Examples
    --------
    >>> import tempfile
    >>> from directload.budget import NodeBudget
    >>> with tempfile.TemporaryDirectory() as where:
    ...     NodeBudget("tiny", host_bytes=10, directory=where).join(Resources(64), least=Resources(64))
    Traceback (most recent call last):
    directload.budget.resources.BudgetError: node budget 'tiny' has 10 of host_bytes; this loader needs at least 64 ...
    """


class BudgetTimeout(BudgetError, TimeoutError):
    """Another process held the budget's registry lock for longer than the budget's ``timeout`` (a loader
    stopped with ``SIGSTOP``, or stuck); the message names its pid.  Shares stay as they are.

    Examples
    --------
    >>> issubclass(BudgetTimeout, BudgetError), issubclass(BudgetTimeout, TimeoutError)
    (True, True)
    """


@dataclass(frozen=True)
class Resources:
    """Amounts of each budgeted resource: host-cache bytes, pinned bytes, disk queue depth.

    Examples
    --------
    >>> Resources(host_bytes=10) + Resources(host_bytes=5, io_depth=2)
    Resources(host_bytes=15, pinned_bytes=0, io_depth=2)
    >>> Resources.from_counts([1, 2, 3]).counts()
    (1, 2, 3)
    """

    host_bytes: int = 0
    pinned_bytes: int = 0
    io_depth: int = 0

    def __post_init__(self):
        for f in fields(self):
            check_int(f.name, getattr(self, f.name), low=0)

    def __add__(self, other: Resources) -> Resources:
        return Resources(*(a + b for a, b in zip(self.counts(), other.counts())))

    def counts(self) -> tuple[int, ...]:
        """The amounts in the fields' order (how a registry's files keep them)."""
        return tuple(getattr(self, f.name) for f in fields(self))

    @classmethod
    def from_counts(cls, values: Iterable[int]) -> Resources:
        """The resources of amounts in the fields' order."""
        return cls(*(int(v) for v in values))

    @classmethod
    def names(cls) -> tuple[str, ...]:
        """The resources' names, in the fields' order."""
        return tuple(f.name for f in fields(cls))


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
