"""A store that follows its share of a node budget: its host cache grows and shrinks to the share's
host bytes, its disk keeps at most the share's queue depth in flight (:mod:`directload.budget`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from directload.budget import NodeBudget, Resources

from .base import ClosedError, FeatureStore
from .cache import HostCache
from .disk import DiskStore
from .wrapper import walk

if TYPE_CHECKING:
    from directload.budget import Share

__all__ = ["join_budget"]


def join_budget(store: FeatureStore, budget: NodeBudget, *, host_bytes: int | str | None = None) -> Share:
    """Join ``budget`` (a :class:`~directload.budget.NodeBudget`) for ``store`` and follow the share.

    The store asks for its host cache's room plus its staging slots (or ``host_bytes``) and, where the
    budget has a queue depth and a :class:`DiskStore` is at the bottom, its queue depth; it needs at least
    its staging slots (one batch's read-ahead room) and one read in flight.  Each share resizes the host
    cache to the share's bytes less the staging slots (a pinned cache counts as pinned bytes too, where the
    budget has pinned bytes) and sets the disk's depth.

    Returns the :class:`~directload.budget.Share`: call ``leave()`` (or use it as a context manager) when
    the store is done.  Raises :class:`~directload.budget.BudgetError` when the budget cannot give the store
    its staging slots beside the other loaders' minimums.

    Examples
    --------
    >>> import tempfile, torch
    >>> from directload.stores import TensorStore, TieredStore
    >>> from directload.budget import NodeBudget
    >>> table = torch.zeros(1000, 4)  # 16 B rows
    >>> with tempfile.TemporaryDirectory() as where:
    ...     budget = NodeBudget("doc", host_bytes=600 * 16, directory=where)
    ...     a = TieredStore(TensorStore(table), host_bytes=0, host_room_bytes=800 * 16, staging_bytes=100 * 16)
    ...     b = TieredStore(TensorStore(table), host_bytes=0, host_room_bytes=800 * 16, staging_bytes=100 * 16)
    ...     with join_budget(a, budget) as share_a:
    ...         print(a.stats()["host"]["capacity_rows"])
    ...         with join_budget(b, budget) as share_b:
    ...             _ = share_a.refresh(), share_b.refresh()
    ...             print(a.stats()["host"]["capacity_rows"], b.stats()["host"]["capacity_rows"])
    ...     a.close(); b.close()
    500
    200 200
    """
    if not isinstance(store, FeatureStore):
        raise TypeError(f"store must be a directload FeatureStore, not {type(store).__name__}")
    if not isinstance(budget, NodeBudget):
        raise TypeError(f"budget must be a directload.budget.NodeBudget, not {type(budget).__name__}")
    chain = list(walk(store))  # every store under it, through their public children()
    host = next((s for s in chain if isinstance(s, HostCache)), None)
    disk = next((s for s in chain if isinstance(s, DiskStore)), None)
    if host is None and disk is None:
        raise ValueError(f"{type(store).__name__} has neither a host cache nor a disk store to budget")
    rnb = store.row_nbytes
    staging = host.staging_rows * rnb if host is not None else 0
    room = host.room_rows * rnb + staging if host is not None else 0
    if host_bytes is not None:
        from directload.units import check_bytes

        room = min(room, max(check_bytes("host_bytes", host_bytes), staging))
    io = disk is not None and budget.limits.io_depth > 0  # a budget without a queue depth leaves it alone
    depth = disk.stats()["queue_depth"] if io else 0  # type: ignore[union-attr]  # (io: there is a disk)
    pinned = host is not None and host.pinned and budget.limits.pinned_bytes > 0
    want = Resources(room, room if pinned else 0, depth)
    least = Resources(staging, staging if pinned else 0, 1 if io else 0)

    def follow(share):
        try:
            if host is not None:
                cap = min(share.host_bytes, share.pinned_bytes) if pinned else share.host_bytes
                host.resize(max(cap - staging, 0))
            if io:
                disk.set_io_depth(max(share.io_depth, 1))
        except ClosedError:
            pass  # the store closed before its share was given back: nothing left to resize

    return budget.join(want, least=least, on_change=follow)
