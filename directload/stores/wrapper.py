"""``WrapperStore``: a store in front of another, that delegates everything it does not change.

Every composite store (the caches, a tiered store, hot rows, a partitioned store, a row exchange) is one,
like zarr's ``WrapperStore``: the shape, dtype and memory of its ``inner`` store, prefetch hints, hot ids,
held memory, stats and closing all pass through by default, and :meth:`WrapperStore.children` lists the
stores it wraps, so a walk over any stack (:func:`walk`: a node budget finding its host cache and disk)
needs no knowledge of which store is which.  Parts talk through the public contract only
(:meth:`~directload.stores.FeatureStore.check_open`, :meth:`~directload.stores.FeatureStore.held_memory`,
:meth:`~directload.stores.FeatureStore.stats`, :attr:`~directload.stores.FeatureStore.capabilities`).
It is generic over its inner store: ``WrapperStore[DiskStore]`` has a ``DiskStore`` as :attr:`inner`.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Generic, TypeVar

from .base import FeatureStore

if TYPE_CHECKING:
    import numpy as np
    import torch

__all__ = ["WrapperStore", "walk"]

S = TypeVar("S", bound=FeatureStore)  # the inner store's type


def walk(store: FeatureStore) -> Iterator[FeatureStore]:
    """``store`` and every store under it, depth first, top first.

    Examples
    --------
    >>> import torch
    >>> from directload.stores import HostCache, TensorStore
    >>> [type(s).__name__ for s in walk(HostCache(TensorStore(torch.zeros(4, 2)), 16))]
    ['HostCache', 'TensorStore']
    """
    yield store
    for child in store.children():
        yield from walk(child)


class WrapperStore(FeatureStore, Generic[S]):
    """A store in front of ``inner`` (its :meth:`children`), delegating to it by default; with ``own`` it
    closes ``inner`` when it closes.  Subclasses override what they change; one whose ids are not ``inner``'s
    (a partition's local store) overrides the reads, staging, prefetch and hot ids.  Its
    :meth:`~directload.stores.FeatureStore.stats` are its own counters (none by default) and its
    children's; it declares ``"stage"`` where every child does.

    Parameters
    ----------
    inner : FeatureStore
        The store wrapped; open.
    own : bool
        Close ``inner`` with this store.
    name : str
        What errors call ``inner`` (the subclass's parameter name, e.g. ``"fallback"``).

    Examples
    --------
    >>> import torch
    >>> from directload.stores import TensorStore
    >>> store = WrapperStore(TensorStore(torch.arange(6.0).view(3, 2)), own=True)
    >>> store.shape, store.read([2]).tolist(), [t.tier for t in store.stats().tiers]
    ((3, 2), [[4.0, 5.0]], ['tensor'])
    >>> store.close(); store.inner.closed
    True
    """

    tier = "wrapper"

    def __init__(self, inner: S, *, own: bool = False, name: str = "inner") -> None:
        super().__init__()
        if not isinstance(inner, FeatureStore):
            raise TypeError(f"{name} must be a directload FeatureStore, not {type(inner).__name__}")
        inner.check_open()
        self.inner: S = inner
        self.owns_inner = bool(own)

    def children(self) -> tuple[FeatureStore, ...]:
        """The stores this one reads through, top first (``(inner,)``)."""
        return (self.inner,)

    @property
    def capabilities(self) -> frozenset[str]:
        """``"stage"`` where every child declares it (a store over a collective one is collective too)."""
        return frozenset({"stage"}) if all("stage" in c.capabilities for c in self.children()) else frozenset()

    # ----------------------------------------------------------------- shape
    @property
    def num_rows(self) -> int:
        return self.inner.num_rows

    @property
    def row_shape(self) -> tuple[int, ...]:
        return self.inner.row_shape

    @property
    def dtype(self) -> torch.dtype:
        return self.inner.dtype

    @property
    def memory(self) -> str | torch.device:
        return self.inner.memory

    # ------------------------------------------------------------ delegation
    def _read_async(self, index, out, run_device, out_device):
        return self.inner.read_async(index, out=out, device=out_device)

    def _stage(self, rows, into, mapped):
        return self.inner.stage(rows, into, mapped=mapped)

    def _prefetch(self, index):
        self.inner.prefetch(index)

    def hot_ids(self) -> np.ndarray | torch.Tensor | None:
        return self.inner.hot_ids()

    def _own_memory(self):
        return tuple(m for child in self.children() for m in child.held_memory())

    def _close(self):
        if self.owns_inner:
            for child in self.children():
                child.close()

    def __repr__(self):
        state = ", closed" if self._closed else ""
        return f"{type(self).__name__}({self.inner!r}{state})"
