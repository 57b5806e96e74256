"""The node budget a loader opens by name (:class:`NodeBudget`), and how it joins: a share of the budget's
registry (:mod:`.registry`) that a watcher keeps fair (:mod:`.share`)."""

from __future__ import annotations

from collections.abc import Callable

from .registry import NodeRegistry
from .resources import Resources
from .share import Share

__all__ = ["NodeBudget"]


class NodeBudget(NodeRegistry):
    """A node's budget, by ``name``: every loader on the node that opens the same name shares it.

    Parameters
    ----------
    name : str
        The budget's name (letters, digits, ``_ . -``).
    host_bytes, pinned_bytes, io_depth : int
        The node's limits.  The first loader to open the name sets them; a loader that opens it with other
        limits while any loader uses it gets :class:`~directload.budget.BudgetError`.
    directory : str
        Where the budget lives (default ``/dev/shm``).
    poll : float
        Seconds between a share's looks at the others (a killed loader's share returns within it).
    timeout : float
        Seconds a loader waits for the registry lock before :class:`~directload.budget.BudgetTimeout` names
        its holder.

    Examples
    --------
    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as where:
    ...     budget = NodeBudget("node", host_bytes=2**30, io_depth=64, directory=where)
    ...     with budget.join(Resources(host_bytes=2**31, io_depth=32)) as share:
    ...         print(share.current)
    Resources(host_bytes=1073741824, pinned_bytes=0, io_depth=32)
    """

    def join(self, want: Resources, *, least: Resources | None = None,
             on_change: Callable[[Resources], object] | None = None) -> Share:
        """Take a share of the budget: up to ``want`` (:class:`Resources`), at least ``least`` (default
        nothing).  ``on_change(resources)`` is called with the first share before ``join`` returns, then with
        each new one on a watcher thread that looks every ``poll`` seconds (shrinking before the share is
        given up, growing after it is taken); without it, call :meth:`Share.refresh` yourself.  Raises
        :class:`~directload.budget.BudgetError` if ``least`` does not fit beside the other loaders' minimums,
        or the budget's directory is not one of ours, and :class:`~directload.budget.BudgetTimeout` if
        another process holds the registry lock for more than ``timeout`` seconds.

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
        if any(lo > w for lo, w in zip(least.counts(), want.counts())):
            raise ValueError(f"least {least} is more than want {want}")
        if on_change is not None and not callable(on_change):
            raise TypeError("on_change is a callable taking the new Resources")
        return Share(self, want, least, on_change)
