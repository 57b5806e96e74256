"""``StoreSpec``: a feature store described once, as data, checked by one ``check()`` and opened by
``open_store()``.

GraphBolt builds its feature stacks from declarative specs; so does directload.  A spec names the source
(a ``.npy`` disk store's path, a tensor, or any store), the cache budgets and policy, whether the source is
packed hottest first, the rows held once per node in shared memory, the node budget the stack will join,
and whether the table is partitioned among the ranks of a ``torch.distributed`` job.  :meth:`StoreSpec.check`
holds every rule of how those go together, so a command line and a config that both call it refuse the same
things with the same words (``names`` spells the fields as the caller's options), before anything is opened.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from directload.units import check_bytes

from .base import FeatureStore
from .policies import POLICY_NAMES, Policy

__all__ = ["StoreSpec", "open_store"]


def _field(name: str) -> str:
    """A field as the spec's own errors name it (a flag set as ``packed=True``)."""
    return f"{name}=True" if name in ("tiers", "packed", "partitioned") else name


@dataclass(frozen=True)
class StoreSpec:
    """What a feature store is made of.

    Parameters
    ----------
    source : str, os.PathLike, torch.Tensor or FeatureStore
        A ``.npy`` disk store's path (opened as a :class:`~directload.stores.DiskStore` with
        ``disk_options``), a host tensor (rows in memory), or a store, used as it is and left open.
    tiers : bool
        Caches in front of the source (a :class:`~directload.stores.TieredStore`); False: the source alone.
    gpu_bytes, host_bytes : int or str
        The device and host caches' bytes (``"2G"`` accepted).
    staging_bytes : int, str or None
        The host tier's read-ahead slots (None: the tiered store's default).
    policy : str, Policy or callable
        Each cache's policy.
    device : str or torch.device, optional
        The device cache's GPU (None: the current one where CUDA runs).
    packed : bool
        The source's rows are numbered hottest first (:func:`~directload.stores.renumber`): warming and shared
        hot rows read its first rows.
    shared_hot_bytes : int or str
        The hottest rows of a packed source held once per node in shared memory
        (:class:`~directload.stores.HotRowsStore` over :func:`directload.shared_table`).
    shared_key : str, optional
        The node-wide name of that copy's owner (a budget's or a job's name); the source file's identity and
        the row count are added, so a repacked file never reuses an old copy.
    budget_bytes : int or str
        The host bytes of the node budget (:func:`~directload.stores.join_budget`) the stack will join: its
        host cache then starts empty and grows into its share, up to ``host_bytes`` (or the whole table).
        The shared hot rows come out of it.
    partitioned : bool
        Split the rows among the ranks of the ``torch.distributed`` job: this rank's contiguous range
        (:func:`~directload.stores.partition_bounds`) from its own store, every other row by all-to-all
        (:class:`~directload.stores.RowExchange`).
    disk_options : mapping
        Options of the :class:`~directload.stores.DiskStore` a path opens (``queue_depth``, ``engine``, ...).

    Examples
    --------
    >>> spec = StoreSpec(torch.zeros(100, 4), host_bytes="1K", policy="lru").check()
    >>> spec.host_bytes, spec.tiers
    (1024, True)
    >>> StoreSpec(torch.zeros(100, 4), policy="fifo").check(names=lambda key: "--" + key.replace("_", "-"))
    Traceback (most recent call last):
    ...
    ValueError: --policy must be one of ('lookahead', 'lru', 'clock', 'sieve', 's3fifo'), got 'fifo'
    """

    source: Any
    tiers: bool = True
    gpu_bytes: int | str = 0
    host_bytes: int | str = 0
    staging_bytes: int | str | None = None
    policy: str | Policy | Callable[[int], Policy] = "lookahead"
    device: str | torch.device | None = None
    packed: bool = False
    shared_hot_bytes: int | str = 0
    shared_key: str | None = None
    budget_bytes: int | str = 0
    partitioned: bool = False
    disk_options: Mapping[str, Any] = field(default_factory=dict)

    def check(self, names: Callable[[str], str] = _field) -> StoreSpec:
        """This spec with its sizes in bytes, or a one-line typed error naming the field as ``names(field)``
        spells it (a command line passes its flags).  Opens nothing."""
        source = self.source
        if not isinstance(source, (str, os.PathLike, torch.Tensor, FeatureStore)):
            raise TypeError(f"{names('source')} must be a path, a tensor or a FeatureStore, not "
                            f"{type(source).__name__}")
        if self.disk_options and not isinstance(source, (str, os.PathLike)):
            raise TypeError(f"disk options {sorted(self.disk_options)} apply to a path, not to a given "
                            f"{type(source).__name__}")
        sizes: dict[str, Any] = {key: check_bytes(names(key), getattr(self, key))
                                 for key in ("gpu_bytes", "host_bytes", "shared_hot_bytes", "budget_bytes")}
        staging = None if self.staging_bytes is None else check_bytes(names("staging_bytes"), self.staging_bytes)
        if isinstance(self.policy, str) and self.policy not in POLICY_NAMES:
            raise ValueError(f"{names('policy')} must be one of {POLICY_NAMES}, got {self.policy!r}")
        if self.partitioned and (self.packed or sizes["budget_bytes"] or sizes["shared_hot_bytes"]):
            raise ValueError(f"{names('partitioned')} splits the rows among the ranks: it takes neither "
                             f"{names('packed')}, {names('budget_bytes')} nor {names('shared_hot_bytes')}")
        if self.packed and isinstance(source, torch.Tensor):
            raise ValueError(f"{names('packed')} reads a packed disk store: the source must be its path or store")
        if sizes["shared_hot_bytes"] and not isinstance(source, (str, os.PathLike)):
            raise ValueError(f"{names('shared_hot_bytes')} maps the packed file's first rows: the source must be "
                             "its path")
        if sizes["budget_bytes"] and not self.tiers:
            raise ValueError(f"{names('budget_bytes')} shares the host caches of tiered stores: it needs "
                             f"{names('tiers')}")
        if sizes["shared_hot_bytes"] and not (self.packed and self.tiers):
            raise ValueError(f"{names('shared_hot_bytes')} keeps the packed source's hottest rows once per node: it "
                             f"needs {names('packed')} and {names('tiers')}")
        if sizes["shared_hot_bytes"] and sizes["budget_bytes"] and sizes["shared_hot_bytes"] >= sizes["budget_bytes"]:
            raise ValueError(f"{names('shared_hot_bytes')} is taken out of {names('budget_bytes')}: it must be "
                             "smaller")
        return dataclasses.replace(self, staging_bytes=staging, **sizes)

    def held_estimate(self, num_rows: int, row_nbytes: int, *, batch_rows: int, lookahead: int = 4,
                      cuda: bool | None = None) -> dict[str, int]:
        """At most the host bytes the stack :func:`open_store` makes of this spec holds
        (:meth:`~directload.stores.FeatureStore.held_bytes`) while it reads batches of up to ``batch_rows``
        distinct rows, one at a time, announced ``lookahead`` ahead, over a table of ``num_rows`` rows of
        ``row_nbytes`` (this rank's rows, for a partitioned spec), before anything is opened; by part
        (parts of 0 bytes left out): the ``"host cache"`` (its read-ahead slots too), the ``"GPU cache in
        host memory"`` (where CUDA does not run: ``cuda`` False, default whether it runs here), the
        ``"shared hot rows"``, a tensor source's ``"table"``, the ``"read buffers"`` the tiers stage rows in
        (a packed stack's warming rounds too: it is warmed) and the tiers' ``"bookkeeping"``.  Checks the spec.

        Examples
        --------
        >>> spec = StoreSpec("feat.npy", host_bytes="64M", staging_bytes="16M", policy="lru")
        >>> parts = spec.held_estimate(100_000, 4096, batch_rows=2000, cuda=False)
        >>> sorted(parts), parts["host cache"] >> 20
        (['bookkeeping', 'host cache', 'read buffers'], 80)
        """
        from .cache import CachedStore
        from .disk import DiskStore

        spec = self.check()
        if cuda is None:
            from directload.capabilities import capabilities

            cuda = capabilities().cuda
        n, rnb, batch = int(num_rows), int(row_nbytes), min(int(batch_rows), int(num_rows))
        parts = dict.fromkeys(("host cache", "GPU cache in host memory", "shared hot rows", "table",
                               "read buffers", "bookkeeping"), 0)
        if isinstance(spec.source, torch.Tensor) and spec.source.device.type == "cpu":
            parts["table"] = n * rnb
        elif isinstance(spec.source, (str, os.PathLike)):
            disk = DiskStore.bytes_for(n, rnb, batch_rows=batch, renumbered=spec.packed,
                                       **{k: v for k, v in spec.disk_options.items() if k == "staging_bytes"})
            parts["read buffers"] += disk["staging"]
            parts["bookkeeping"] += disk["bookkeeping"]
        if spec.tiers:
            host, room = int(spec.host_bytes), None
            if spec.budget_bytes:
                room, host = min(host or n * rnb, n * rnb), 0
            top = max(host, room or 0)
            staging = spec.staging_bytes if spec.staging_bytes is not None else (max(top // 4, 64 << 20) if top else 0)
            warm, gpu = spec.packed, int(spec.gpu_bytes)
            common: dict[str, Any] = dict(policy=spec.policy, batch_rows=batch, lookahead=lookahead)
            if host or staging or room:
                # under a GPU tier, a warm round of the GPU tier goes through a read of this tier
                got = CachedStore.bytes_for(n, rnb, host, staging_bytes=int(staging), room_bytes=room, warm=warm,
                                            reads=1 + int(warm and bool(gpu)), **common)
                parts["host cache"] += got["slots"]
                parts["read buffers"] += got["buffers"]
                parts["bookkeeping"] += got["bookkeeping"]
            if gpu:
                on_host = not cuda or (spec.device is not None and torch.device(spec.device).type == "cpu")
                got = CachedStore.bytes_for(n, rnb, gpu, warm=warm, slots_on_host=on_host, **common)
                parts["GPU cache in host memory"] += got["slots"]
                parts["read buffers"] += got["buffers"]
                parts["bookkeeping"] += got["bookkeeping"]
        if spec.shared_hot_bytes:
            hot = min(int(spec.shared_hot_bytes) // max(rnb, 1), n)
            parts["shared hot rows"] += hot * rnb
            parts["bookkeeping"] += 8 * (n + hot)
        if spec.partitioned:
            parts["read buffers"] += 2 * batch * rnb  # a round's rows sent and received
        return {name: nbytes for name, nbytes in parts.items() if nbytes}


def open_store(spec: StoreSpec) -> FeatureStore:
    """The store ``spec`` describes, opened (its :meth:`StoreSpec.check` first): close it when done (it
    closes what it opened, never a store given as the source).

    Examples
    --------
    >>> table = torch.arange(20.0).view(10, 2)
    >>> with open_store(StoreSpec(table, host_bytes=32, staging_bytes=0)) as store:
    ...     type(store).__name__, store.read([7]).tolist()
    ('TieredStore', [[14.0, 15.0]])
    """
    from .disk import DiskStore
    from .tensor import TensorStore

    spec = spec.check()
    if spec.partitioned:
        return _partitioned(spec)
    source = TensorStore(spec.source) if isinstance(spec.source, torch.Tensor) else spec.source
    if not spec.tiers:
        return DiskStore(source, **spec.disk_options) if isinstance(source, (str, os.PathLike)) else source
    store = _tiers(spec, source, spec.disk_options)  # it owns the disk store a path opens
    if spec.shared_hot_bytes:
        try:
            store = _hot_rows(spec, store)
        except BaseException:
            store.close()
            raise
    return store


def _tiers(spec: StoreSpec, source: Any, disk_options: Mapping[str, Any]) -> FeatureStore:
    """A :class:`~directload.stores.TieredStore` over ``source`` (a path it opens and owns, or a store)."""
    from .disk_format import read_layout
    from .tiered import TieredStore

    host, room = int(spec.host_bytes), None
    if spec.budget_bytes:  # the cache starts empty and grows to the share (up to host_bytes, or the table)
        if isinstance(source, FeatureStore):
            table = source.num_rows * source.row_nbytes
        else:
            layout = read_layout(source)
            rows = disk_options.get("shape", layout.shape)[0]
            table = rows * layout.row_nbytes
        room, host = min(host or table, table), 0
    device = torch.device(spec.device) if spec.device is not None else None
    return TieredStore(source, gpu_bytes=spec.gpu_bytes, host_bytes=host, staging_bytes=spec.staging_bytes,
                       policy=spec.policy, device=device if device is not None and device.type == "cuda" else None,
                       host_room_bytes=room, **disk_options)


def _hot_rows(spec: StoreSpec, store: FeatureStore) -> FeatureStore:
    """``store`` behind the packed source's hottest rows, held once per node: the first process to get here
    reads them, every other one maps them."""
    from directload.shared import shared_table

    from .hot import HotRowsStore

    path = spec.source
    hot_ids = store.hot_ids()
    if hot_ids is None:
        raise ValueError(f"{os.fspath(path)} knows no hot rows: shared hot rows need a packed disk store "
                         "(directload.stores.renumber)")
    n = min(int(spec.shared_hot_bytes) // max(store.row_nbytes, 1), store.num_rows)
    st = os.stat(path)
    key = f"{spec.shared_key or 'store'}-hot-{st.st_ino}-{st.st_mtime_ns}-{n}"
    # The packed file's first rows are the hot ones, in hot_ids' order: copied into shared memory from a
    # mapping of the file, a chunk at a time, never through a private copy of them all.
    rows = shared_table(key, lambda: np.load(path, mmap_mode="r", allow_pickle=False)[:n])
    return HotRowsStore(store, torch.as_tensor(hot_ids[:n]), rows, own=True)


def _partitioned(spec: StoreSpec) -> FeatureStore:
    """This rank's share of the rows in its own store, every other row from its owner by all-to-all.  Every
    rank must open it, in the same order."""
    import torch.distributed as dist

    from directload.unified import host_of

    from .disk import DiskStore
    from .disk_format import read_layout
    from .exchange import RowExchange
    from .partitioned import PartitionedStore, partition_bounds
    from .tensor import TensorStore

    rank, world = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)
    source = spec.source
    if isinstance(source, FeatureStore):
        raise TypeError("a partitioned spec takes a path or a tensor (each rank opens its own rows), not a store")
    if isinstance(source, torch.Tensor):
        bounds = partition_bounds(source.shape[0], world)
        lo, hi = int(bounds[rank]), int(bounds[rank + 1])
        local: FeatureStore = TensorStore(host_of(source)[lo:hi])  # a view: only its pages are ever touched
    else:
        layout = read_layout(source)
        bounds = partition_bounds(layout.shape[0], world)
        lo, hi = int(bounds[rank]), int(bounds[rank + 1])
        rows = dict(dtype=layout.dtype, shape=(hi - lo, *layout.shape[1:]),
                    offset=layout.data_offset + lo * layout.row_nbytes)  # this rank's rows of the file, raw
        options = {**spec.disk_options, **rows}
        local = _tiers(spec, source, options) if spec.tiers else DiskStore(source, **options)
    try:
        remote = RowExchange(local, bounds)
    except BaseException:
        local.close()
        raise
    return PartitionedStore(local, remote, bounds, part=rank, own=True)
