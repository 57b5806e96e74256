"""``open_store``: the one way to open a stack described by a :class:`~directload.stores.StoreSpec`, and the
:class:`StoreHandle` it returns, which owns the stack and its share of a node budget and closes both."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from directload.codecs import CodecError, EncodedTable, encode

from .base import FeatureStore
from .decoding import DecodingStore
from .wrapper import WrapperStore

if TYPE_CHECKING:
    from directload.budget import Share

    from .reads import Ids
    from .records import Stats
    from .spec import StoreSpec

__all__ = ["open_store", "StoreHandle"]


class StoreHandle(WrapperStore):
    """A stack :func:`open_store` opened from a spec, and what it owns beside it: its share of a node budget.

    The handle is the stack as a :class:`~directload.stores.FeatureStore`: reads, staging, prefetch hints,
    hot ids, held memory, stats and capabilities (:meth:`warm`) are the stack's, unchanged (the handle adds no
    tier), so it goes wherever a store goes.  What only some stacks have (a tiered store's ``tiers``, and
    ``resize``: the sizes are the spec's and the budget share's) is :attr:`store`'s.  :meth:`close` gives the
    share back first (the other jobs grow into it at their next look), then closes what the spec opened (never
    a store given as its source); it is idempotent, and ``with open_store(spec) as store:`` closes both on
    exit.  A forked child's handle owns no share: the parent's stays the parent's, and the child's close
    leaves it alone.

    Parameters
    ----------
    store : FeatureStore
        The stack, open.
    spec : StoreSpec
        The checked spec it was opened from.
    share : directload.budget.Share, optional
        Its share of the node budget (``spec.budget``), given back on close.
    own : bool
        Close ``store`` with the handle (False for a store the spec was given as its source).

    Examples
    --------
    >>> from directload.stores import StoreSpec, open_store
    >>> handle = open_store(StoreSpec(torch.arange(8.0).view(4, 2), host_bytes=16, staging_bytes=0))
    >>> type(handle.store).__name__, handle.share, handle.read([3]).tolist()
    ('TieredStore', None, [[6.0, 7.0]])
    >>> handle.close(); handle.close(); handle.store.closed
    True
    """

    def __init__(self, store: FeatureStore, spec: StoreSpec, share: Share | None = None, *, own: bool = True) -> None:
        super().__init__(store, own=own, name="store")
        self.spec = spec
        self._share = share

    @property
    def store(self) -> FeatureStore:
        """The stack the spec describes, as opened."""
        return self.inner

    @property
    def share(self) -> Share | None:
        """The stack's share of the node budget (None: it joined none, or the handle is closed)."""
        return self._share

    @property
    def capabilities(self) -> frozenset[str]:
        """The stack's (the handle adds none), but ``resize``: the stack's sizes are its spec's and its
        share's, and a stack that resizes does so as :attr:`store`."""
        return self.inner.capabilities - {"resize"}

    def warm(self, ids: Ids | None = None, *, background: bool = False,
             progress: bool = False) -> int | dict[str, int]:
        """The stack's :meth:`~directload.stores.FeatureStore.warm` (``TypeError`` for a stack without a cache)."""
        self.check_capability("warm")
        return self.inner.warm(ids, background=background, progress=progress)

    def stats(self) -> Stats:
        """The stack's stats, as the stack gives them."""
        return self.inner.stats()

    def _close(self):
        share, self._share = self._share, None
        try:
            if share is not None:
                share.leave()  # before the stack closes: the others grow into it at their next look
        finally:
            super()._close()

    def _after_fork(self):
        self._share = None  # the parent's share: the parent gives it back

    def __repr__(self):
        state = ", closed" if self._closed else ""
        budget = f", budget={self._share.budget.name!r}" if self._share is not None else ""
        return f"StoreHandle({self.inner!r}{budget}{state})"


def open_store(spec: StoreSpec) -> StoreHandle:
    """The stack ``spec`` describes, opened (its :meth:`~directload.stores.StoreSpec.check` first), joined to
    its node budget when ``spec.budget.host_bytes`` names one, as a :class:`StoreHandle`: close it when done
    (it gives the share back and closes what it opened, never a store given as the source).  Whatever fails
    while it opens, what was opened by then is closed (the share given back) before the error leaves.

    Examples
    --------
    >>> from directload.stores import StoreSpec
    >>> table = torch.arange(20.0).view(10, 2)
    >>> with open_store(StoreSpec(table, host_bytes=32, staging_bytes=0)) as store:
    ...     type(store.store).__name__, store.read([7]).tolist()
    ('TieredStore', [[14.0, 15.0]])
    """
    spec = spec.check()
    stack = _stack(spec)
    own = stack is not spec.source
    share = None
    try:
        if spec.budget.host_bytes:
            share = _join(spec, stack)
        return StoreHandle(stack, spec, share, own=own)
    except BaseException:
        try:
            if share is not None:
                share.leave()
        finally:
            if own:
                stack.close()
        raise


def _stack(spec: StoreSpec) -> FeatureStore:
    """The stores ``spec`` describes, opened; on a failure, none left open."""
    from .disk import DiskStore
    from .tensor import TensorStore

    if spec.source is None:
        raise ValueError("the spec names no source: give its path, tensor or store (StoreSpec(source=...))")
    given, codec_name = spec.source, _codec_of(spec)
    codes = given if isinstance(given, EncodedTable) else None
    if codec_name is not None and isinstance(given, torch.Tensor):  # encoded as it opens: the tiers carry codes
        codes = encode(given, codec_name, progress=True)
    if codes is not None:
        if not spec.tiers and spec.partition is None:
            return TensorStore(codes if spec.decode else codes.codes)  # decoded inside the gather, or codes
        spec = dataclasses.replace(spec, source=codes.codes)
    if spec.partition is not None:
        store = _partitioned(spec)
    else:
        source = TensorStore(spec.source) if isinstance(spec.source, torch.Tensor) else spec.source
        if source is None or isinstance(source, EncodedTable):  # checked above; codes became a tensor above
            raise ValueError("the spec names no source")
        if not spec.tiers:
            store = source if isinstance(source, FeatureStore) else DiskStore(source, **spec.disk.kwargs())
        else:
            store = _tiers(spec, source, spec.disk.kwargs())  # it owns the disk store a path opens
            if spec.budget.shared_hot_bytes:
                try:
                    store = _hot_rows(spec, store)
                except BaseException:
                    store.close()
                    raise
    if codec_name is None or not spec.decode:
        return store
    try:
        return DecodingStore(store, codec_name, own=store is not given)
    except BaseException:
        if store is not given:
            store.close()
        raise


def _codec_of(spec: StoreSpec) -> str | None:
    """The codec of the rows ``spec``'s source holds or is to carry (None: plain rows), after checking that
    the spec's ``codec`` agrees with the source: a disk store names its own codes' codec."""
    from .disk_format import read_layout

    source, wanted = spec.source, spec.codec
    stored = None
    if isinstance(source, (str, os.PathLike)):
        stored = read_layout(source).codec
    elif isinstance(source, EncodedTable):
        stored = source.codec.name
    elif isinstance(source, FeatureStore) and wanted is None:
        stored = getattr(source, "codec", None) if not isinstance(source, DecodingStore) else None
    if stored is not None and wanted is not None and stored != wanted:
        raise CodecError(f"the source holds {stored} codes, not {wanted}: leave codec= out, or name {stored}")
    if wanted is not None and stored is None and isinstance(source, (str, os.PathLike)):
        raise CodecError(f"{os.fspath(source)} holds plain rows: write it as {wanted} codes first "
                         f"(write_disk_store(..., codec={wanted!r}))")
    return stored if stored is not None else wanted


def _join(spec: StoreSpec, stack: FeatureStore) -> Share:
    """Join the node budget of ``spec.budget`` for ``stack``: its host cache and disk queue follow the share.
    The hot rows held once per node come out of the budget first; the stacks' own caches share the rest."""
    from directload.budget import NodeBudget

    from .budgeted import join_budget

    b = spec.budget
    budget = NodeBudget(b.name, host_bytes=int(b.host_bytes) - int(b.shared_hot_bytes), io_depth=b.io_depth,
                        directory=b.directory)
    return join_budget(stack, budget)


def _tiers(spec: StoreSpec, source: Any, disk_options: Mapping[str, Any]) -> FeatureStore:
    """A :class:`~directload.stores.TieredStore` over ``source`` (a path it opens and owns, or a store)."""
    from .disk_format import read_layout
    from .tiered import TieredStore

    host, room = int(spec.host_bytes), None
    if spec.budget.host_bytes:  # the cache starts empty and grows to the share (up to host_bytes, or the table)
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
    if not isinstance(path, (str, os.PathLike)):  # the spec's check says so first
        raise TypeError(f"shared hot rows map a packed file: the source must be its path, not {type(path).__name__}")
    hot_ids = store.hot_ids()
    if hot_ids is None:
        raise ValueError(f"{os.fspath(path)} knows no hot rows: shared hot rows need a packed disk store "
                         "(directload.stores.renumber)")
    n = min(int(spec.budget.shared_hot_bytes) // max(store.row_nbytes, 1), store.num_rows)
    st = os.stat(path)
    key = f"{spec.budget.hot_key or spec.budget.name}-hot-{st.st_ino}-{st.st_mtime_ns}-{n}"
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
    if source is None or isinstance(source, (FeatureStore, EncodedTable)):  # codes come as their tensor
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
        options = {**spec.disk.kwargs(), **rows}
        local = _tiers(spec, source, options) if spec.tiers else DiskStore(source, **options)
    try:
        remote = RowExchange(local, bounds, timeout=spec.partition.timeout if spec.partition else 60.0)
    except BaseException:
        local.close()
        raise
    return PartitionedStore(local, remote, bounds, part=rank, own=True)
