"""``TieredStore``: device cache -> host cache -> disk, built from one call with byte budgets."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from directload.units import check_bytes

from .base import FeatureStore
from .cache import CachedStore, DeviceCache, HostCache
from .disk import DiskStore
from .wrapper import WrapperStore

if TYPE_CHECKING:
    import numpy as np
    import torch

    from .futures import ReadFuture
    from .policies import PolicySpec
    from .reads import Ids

__all__ = ["TieredStore"]


class TieredStore(WrapperStore[FeatureStore]):
    """A GPU cache in front of a host cache in front of a store (a ``.npy`` file read by a
    :class:`~directload.stores.DiskStore`, or any FeatureStore), each tier present when its budget is.

    Parameters
    ----------
    source : str, os.PathLike or FeatureStore
        A path opens a DiskStore (with ``disk_options``), which the tiered store owns and closes;
        a store is used as it is and left open.
    gpu_bytes : int
        Bytes of the :class:`~directload.stores.DeviceCache` (0: none).  Where CUDA does not run its
        slots live in host memory, so the whole chain works on any machine.
    host_bytes : int
        Bytes of the :class:`~directload.stores.HostCache` (0: none).
    staging_bytes : int, optional
        Bytes of the host tier's read-ahead slots; default a quarter of ``host_bytes`` or of
        ``host_room_bytes`` when larger (at least 64 MiB when there is a host tier).  Rows of
        announced batches are read into them ahead.
    policy : str, Policy or callable
        Each cache's policy (default ``"lookahead"``); a callable ``capacity -> Policy`` is called per
        tier.
    device : torch.device, optional
        The GPU of the device cache.
    host_room_bytes : int, optional
        The most :meth:`resize` may grow the host cache to (default ``host_bytes``); the room past
        ``host_bytes`` is address space until used (pinned memory, where CUDA runs, is pinned whole).

    Notes
    -----
    ``tiers`` lists the stores top first (``caches`` the caches among them); :meth:`stats` gives each tier's
    counters by name (``"device"``, ``"host"``, ``"disk"``).  It declares ``"warm"`` and ``"resize"``.

    Examples
    --------
    >>> import torch
    >>> from directload.stores import TensorStore
    >>> table = torch.arange(20.0).view(10, 2)
    >>> with TieredStore(TensorStore(table), gpu_bytes=16, host_bytes=32) as store:
    ...     [t.tier for t in store.stats().tiers], torch.equal(store.read([9, 1]), table[[9, 1]])
    (['device', 'host', 'tensor'], True)
    """

    tier = "tiered"

    def __init__(self, source: os.PathLike[str] | str | FeatureStore, *, gpu_bytes: int | str = 0,
                 host_bytes: int | str = 0, staging_bytes: int | str | None = None, policy: PolicySpec = "lookahead",
                 device: torch.device | str | None = None, host_room_bytes: int | str | None = None,
                 **disk_options: Any) -> None:
        # Every argument is checked before a disk store is opened: a refused store leaves nothing open.
        gpu_bytes, host_bytes = check_bytes("gpu_bytes", gpu_bytes), check_bytes("host_bytes", host_bytes)
        if staging_bytes is not None:
            staging_bytes = check_bytes("staging_bytes", staging_bytes)
        if host_room_bytes is not None:
            host_room_bytes = check_bytes("host_room_bytes", host_room_bytes)
            if host_room_bytes < host_bytes:
                raise ValueError(f"host_room_bytes ({host_room_bytes}) is less than host_bytes ({host_bytes})")
        if isinstance(source, FeatureStore):
            if disk_options:
                raise TypeError(f"disk options {sorted(disk_options)} apply to a path, not to a given store")
        elif not isinstance(source, (str, os.PathLike)):
            raise TypeError(f"source must be a path or a FeatureStore, not {type(source).__name__}")
        if staging_bytes is None:
            room = max(host_bytes, host_room_bytes or 0)  # a cache that may grow gets the slots of its room
            staging_bytes = max(room // 4, 64 << 20) if room else 0
        owned = None
        chain: list[FeatureStore] = []
        caches: list[CachedStore] = []
        try:
            base = source if isinstance(source, FeatureStore) else DiskStore(source, **disk_options)
            owned = None if base is source else base
            chain.append(base)
            if host_bytes or staging_bytes or host_room_bytes:
                caches.append(HostCache(base, host_bytes, policy, staging_bytes=staging_bytes,
                                        room_bytes=host_room_bytes))
                chain.append(caches[-1])
            if gpu_bytes:
                caches.append(DeviceCache(chain[-1], gpu_bytes, policy, device=device))
                chain.append(caches[-1])
        except BaseException:
            for store in chain[1:][::-1]:
                store.close()
            if owned is not None:
                owned.close()
            raise
        super().__init__(chain[-1])
        self._owned = owned
        self.tiers: list[FeatureStore] = chain[::-1]  # the caches, top first, then the source
        self.caches: list[CachedStore] = caches[::-1]  # the caches, top first

    @property
    def capabilities(self) -> frozenset[str]:
        """``"warm"`` and ``"resize"``, and ``"stage"`` where its source declares it."""
        return super().capabilities | {"warm", "resize"}

    top = property(lambda self: self.inner, doc="The top tier: every read goes through it.")

    def read_async(self, ids: Ids, *, out: torch.Tensor | None = None,
                   device: torch.device | str | None = None) -> ReadFuture:
        """Read through the top tier (its own checks, the same as every store's)."""
        self.check_open()
        return self.top.read_async(ids, out=out, device=device)

    def hot_ids(self) -> np.ndarray | torch.Tensor | None:
        return self.tiers[-1].hot_ids()

    def warm(self, ids: Ids | None = None, *, background: bool = False, progress: bool = False) -> dict[str, int]:
        """Fill each cache tier's free room with ``ids`` (most wanted first; ``None``: the store's own order
        of hotness, :meth:`hot_ids`), host tier first, so the GPU tier's rows come from host memory
        (with ``background``, the GPU tier's thread starts once the host tier's is done).
        Returns ``{tier name: rows admitted}``.  See :meth:`~directload.stores.Cache.warm`."""
        self.check_open()
        ids = self._warm_ids(ids)
        out, below = {}, None
        for cache in self.caches[::-1]:  # the host tier first
            out[cache.tier] = cache.warm(ids, background=background, progress=progress, after=below)
            below = cache.warming
        return out

    def resize(self, *, host_bytes: int | str | None = None, gpu_bytes: int | str | None = None) -> dict[str, int]:
        """Resize the host and/or GPU cache while reads go on (see :meth:`~directload.stores.Cache.resize`);
        a tier the store was made without cannot be added.  Returns ``{tier name: capacity in rows}``.

        Examples
        --------
        >>> import torch
        >>> from directload.stores import TensorStore
        >>> with TieredStore(TensorStore(torch.zeros(100, 2)), host_bytes=40 * 8, staging_bytes=0,
        ...                  host_room_bytes=80 * 8, policy="lru") as store:
        ...     store.resize(host_bytes=64 * 8), store.resize(host_bytes=10 ** 6)
        ({'host': 64}, {'host': 80})
        """
        self.check_open()
        out = {}
        for tier, nbytes in (("host", host_bytes), ("device", gpu_bytes)):
            if nbytes is None:
                continue
            cache = next((c for c in self.caches if c.tier == tier), None)
            if cache is None:
                raise ValueError(f"this TieredStore has no {tier} cache to resize")
            out[tier] = cache.resize(nbytes)
        return out

    def _close(self):
        for store in self.caches:
            store.close()
        if self._owned is not None:
            self._owned.close()

    def __repr__(self):
        state = ", closed" if self._closed else ""
        return f"TieredStore({' -> '.join(type(s).__name__ for s in self.tiers)}{state})"

