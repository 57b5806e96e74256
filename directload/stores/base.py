"""The feature-store contract: rows by id, read now or in the background, from any tier.

Every store (a tensor in memory, a file on an SSD, and later the caches in
front of them) answers the same small set of questions, following PyG's
``FeatureStore`` and GraphBolt's ``Feature``: how many rows, of what shape and
type, and the rows at these ids, now (:meth:`FeatureStore.read`) or later
(:meth:`FeatureStore.read_async`).  The public methods check their input and
then call protected hooks, so a bad id or a wrong ``out`` raises a typed error
before any kernel runs, whatever the store.
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, ClassVar, Self

import numpy as np
import torch

from directload.capabilities import usable_device
from directload.kernels.devices import HOST, read_devices
from directload.kernels.operands import memory_span, out_of_range, overlaps
from directload.unified import ClosedError

from .futures import ReadFuture
from .held import on_host, span_bytes
from .reads import as_index, deliver
from .records import Staged, Stats, TieredStats

if TYPE_CHECKING:
    from .counters import Counters
    from .futures import ReadFuture
    from .reads import Ids

# ReadFuture and deliver live in .futures and .reads; they are importable from here as they were before.
__all__ = ["FeatureStore", "CAPABILITIES", "read_devices", "check_table", "ClosedError", "ReadFuture", "deliver"]

#: What a store may declare it can do beyond reading (:attr:`FeatureStore.capabilities`):
#:
#: * ``"stage"``: it may sit under a cache (:meth:`FeatureStore.stage` serves a cache's misses); every store
#:   but a collective one (a :class:`~directload.stores.RowExchange`, whose reads every rank must make
#:   together, and a store over one) declares it;
#: * ``"warm"``: :meth:`FeatureStore.warm` fills its caches with rows (a cache, a tiered store);
#: * ``"resize"``: it has a ``resize`` method that changes its caches' capacity while reads go on (a cache:
#:   ``resize(capacity_bytes)``; a tiered store: ``resize(host_bytes=, gpu_bytes=)``).
CAPABILITIES = ("stage", "warm", "resize")


def check_table(what: str, table: object) -> None:
    """Raise ``TypeError`` for an object that looks like a store (it has ``gather`` or ``read``) but is not
    a :class:`FeatureStore`: the loaders take tensors (and arrays) or FeatureStores, nothing duck-typed."""
    if isinstance(table, (torch.Tensor, np.ndarray, FeatureStore)):
        return
    if hasattr(table, "gather") or hasattr(table, "read"):
        raise TypeError(f"{what} is a {type(table).__name__}, not a feature table: pass a tensor or a "
                        "directload.stores.FeatureStore (subclass it, or wrap the rows in a TensorStore)")


_live: weakref.WeakSet[FeatureStore] = weakref.WeakSet()  # every store, for the fork handler


def _after_fork_in_child():
    for store in list(_live):
        try:
            if store._counts is not None:
                store._counts.after_fork()  # a parent's thread may have held its lock at the fork
            store._after_fork()
        except Exception:  # noqa: BLE001 - each store on its own: one that fails must not leave the others stale
            # (a store half made when its constructor raised has no fields to reset).  Closed here, the
            # child's use of it raises ClosedError, where a lock its parent's thread held would hang it.
            store._closed = True


os.register_at_fork(after_in_child=_after_fork_in_child)


class FeatureStore:
    """A table of rows, read by id.  Subclasses implement the protected hooks.

    Memory contract
    ---------------
    * **Where the result lives.**  On ``device`` when given, else on the
      index's device: a CPU index gives a CPU tensor and a CUDA index a tensor
      on that GPU, whatever the store holds.  Where the read runs follows from
      that and from the store's :attr:`memory`, by the one rule every gather
      follows (:func:`directload.kernels.devices.read_devices`): rows in GPU
      memory are gathered on that GPU, mapped host rows zero-copy by the GPU
      that wants them, pageable host rows (and a file's staging buffer) by the
      CPU, then copied to a GPU result.
    * **``out``.**  Optional; ``[len(ids), *row_shape]``, the store's dtype,
      contiguous, on the result device.  The read writes into it and returns
      it.  Do not touch it until :meth:`~directload.stores.ReadFuture.wait` has returned; after
      that it is yours again and may be reused for the next read.
    * **A result without ``out``** is a new tensor that nothing else writes.
    * **Closing.**  :meth:`close` lets reads already started finish (their
      futures still give their rows), then frees the store's resources; any
      later read raises :class:`ClosedError`.  ``close`` is idempotent, and
      ``with store:`` closes on exit.
    * **Errors.**  Ids that are not 1-D integers raise ``TypeError`` /
      ``ValueError``, ids outside ``[0, num_rows)`` raise ``IndexError`` and a
      wrong ``out`` raises ``ValueError``, all before any read starts.  I/O
      errors raise from ``wait()``.

    Examples
    --------
    >>> from directload.stores import TensorStore
    >>> store = TensorStore(torch.arange(6.0).view(3, 2))
    >>> isinstance(store, FeatureStore), store.shape, store.read([2]).tolist()
    (True, (3, 2), [[4.0, 5.0]])
    """

    #: What holds the rows, as :func:`directload.kernels.devices.memory_of` says it: ``"host"``
    #: (pageable memory, and files read through a host staging buffer), ``"mapped"`` (pinned,
    #: GPU-mapped host memory) or the ``torch.device`` of the GPU memory that holds them.
    if TYPE_CHECKING:  # read-only to its users; subclasses override it with a property or a class attribute
        @property
        def memory(self) -> str | torch.device: ...
    else:
        memory = HOST

    #: The name :meth:`stats` reports this store's counters under.
    tier = "store"

    #: The record type of this store's own counters in :meth:`stats` (a cache's is a
    #: :class:`~directload.stores.records.CacheStats`).
    record_type: ClassVar[type[Stats]] = Stats

    #: What this store can do beyond reading, declared (never probed): names of :data:`CAPABILITIES`.  A
    #: store of its own rows declares ``"stage"``; a cache ``"stage"``, ``"warm"`` and ``"resize"``; a store
    #: over others what it and they support (a property there).  :meth:`check_capability` asks it.
    if TYPE_CHECKING:  # read-only to its users; subclasses override it with a property or a class attribute
        @property
        def capabilities(self) -> frozenset[str]: ...
    else:
        capabilities = frozenset({"stage"})

    #: This store's counters (a :class:`~directload.stores.counters.Counters`), where it counts anything: the
    #: default :meth:`_counters` reads them, :meth:`reset_stats` zeroes them, a forked child gets them a
    #: fresh lock.
    _counts: Counters | None = None

    def __init__(self) -> None:
        self._closed = False
        _live.add(self)

    # ----------------------------------------------------------------- shape
    @property
    def num_rows(self) -> int:
        raise NotImplementedError

    @property
    def row_shape(self) -> tuple[int, ...]:
        raise NotImplementedError

    @property
    def dtype(self) -> torch.dtype:
        raise NotImplementedError

    @property
    def shape(self) -> tuple[int, ...]:
        """``(num_rows, *row_shape)``."""
        return (self.num_rows, *self.row_shape)

    @property
    def row_nbytes(self) -> int:
        """Bytes per row."""
        return int(np.prod(self.row_shape, dtype=np.int64)) * torch.empty(0, dtype=self.dtype).element_size()

    def __len__(self) -> int:
        return self.num_rows

    # ----------------------------------------------------------------- reads
    def read_async(self, ids: Ids, *, out: torch.Tensor | None = None,
                   device: torch.device | str | None = None) -> ReadFuture:
        """Start reading the rows at ``ids``; returns a :class:`~directload.stores.ReadFuture`.

        Every check runs before this returns (see the class's memory contract).
        """
        self.check_open()
        index = as_index(ids)
        if device is not None:
            device = usable_device(device)  # NoDeviceError for a GPU this machine does not have
        run, out_device = read_devices(index.device, device, self.memory)
        self._check_bounds(index)
        if out is not None:
            self._check_out(out, len(index), out_device)
            _bump_version(out)  # the read writes it in place, as index_select(out=) does
        return self._read_async(index, out, run, out_device)

    def read(self, ids: Ids, *, out: torch.Tensor | None = None,
             device: torch.device | str | None = None) -> torch.Tensor:
        """The rows at ``ids``: exactly ``read_async(ids, out=out, device=device).wait()``."""
        return self.read_async(ids, out=out, device=device).wait()

    def stage(self, ids: Ids, into: Callable[[int], np.ndarray], *, mapped: bool = False) -> Staged:
        """The tier contract: the rows at ``ids`` as a flat tier for the fused gather of a cache in front of
        this store.  Returns a :class:`~directload.stores.records.Staged` (``flat``, ``offsets``).

        ``into`` is a :class:`~directload.buffers.StagingBuffer` (or any callable ``nbytes -> uint8 numpy
        array`` of page-aligned host memory) that the caller owns and leaves untouched until its gather
        is done; a store reads the rows into it, or, where its rows sit in host memory already (a
        tensor), gives its own memory and no copy.  With ``mapped`` the caller's GPU reads ``flat``
        zero-copy, so a store whose rows are not in mapped memory copies them into ``into`` (pinned
        where CUDA runs).  The ids are checked as a read's are, before any work.

        Any store that implements :meth:`_stage` (or only :meth:`_read_async`: the default stages through
        a read) can sit under a :class:`~directload.stores.HostCache` or
        :class:`~directload.stores.DeviceCache`.  A store that does not declare ``"stage"`` in
        :attr:`capabilities` (its reads are collective) raises ``TypeError``, before any work.
        """
        self.check_open()
        self.check_capability("stage")
        index = as_index(ids)
        self._check_bounds(index)
        rows = index.cpu().numpy().astype(np.int64, copy=False)
        return self._stage(rows, into, mapped)

    def _stage(self, rows, into, mapped):
        """Stage checked ``rows`` (int64 numpy, in range) into ``into``: a :class:`Staged`.  The default reads
        them (:meth:`_copy_stage`); stores whose rows already sit in host memory (a tensor) or that land
        them there anyway (a disk's staging) override it to skip the copy, giving their own memory only
        where it is mapped when ``mapped`` asks for that."""
        return self._copy_stage(rows, into)

    def _copy_stage(self, rows, into):
        """``rows`` read into ``into``'s buffer, one after another (through :meth:`_read_into`)."""
        n, rnb = rows.shape[0], self.row_nbytes
        row_elems = int(np.prod(self.row_shape, dtype=np.int64))
        if not n * rnb:
            return Staged(torch.zeros(0, dtype=self.dtype), np.zeros(n, np.int64))
        buf = torch.from_numpy(into(n * rnb)[:n * rnb]).view(self.dtype)
        self._read_into(rows, buf.view(n, *self.row_shape))
        return Staged(buf, np.arange(n, dtype=np.int64) * row_elems)

    def _read_into(self, rows, out):
        """Read checked ``rows`` (int64 numpy, in range) into the host tensor ``out`` and wait: the read
        behind the default staging, without a public read's checks a second time (:meth:`stage` made
        them)."""
        cpu = torch.device("cpu")
        deliver(self._read_async(torch.from_numpy(rows), out, cpu, cpu).wait(), out, cpu)  # a store may not fill out

    def hot_ids(self) -> np.ndarray | torch.Tensor | None:
        """The row ids most worth caching, most wanted first, where the store knows them (a disk store
        renumbered by hotness: its file order), else None.  :meth:`~directload.stores.Cache.warm` fills a
        cache with them."""
        return None

    def warm(self, ids: Ids | None = None, *, background: bool = False,
             progress: bool = False) -> int | dict[str, int]:
        """Fill this store's caches with the rows ``ids`` (most wanted first; None: :meth:`hot_ids`), where it
        declares ``"warm"`` in :attr:`capabilities` (a cache: the rows admitted; a tiered store: per tier).
        Any other store raises ``TypeError``: it has no cache to warm.

        Examples
        --------
        >>> from directload.stores import TensorStore
        >>> TensorStore(torch.zeros(4, 2)).warm([1])
        Traceback (most recent call last):
        ...
        TypeError: TensorStore(shape=(4, 2), dtype=torch.float32) has no cache to warm (it does not declare 'warm')
        """
        self.check_capability("warm")
        raise NotImplementedError(f"{type(self).__name__} declares 'warm' but does not implement warm()")

    def check_capability(self, name: str) -> None:
        """Raise ``TypeError`` where this store does not declare ``name`` (one of :data:`CAPABILITIES`) in
        :attr:`capabilities`; ``ValueError`` for a name that is none of them.

        Examples
        --------
        >>> from directload.stores import HostCache, TensorStore
        >>> store = TensorStore(torch.zeros(4, 2))
        >>> sorted(store.capabilities), sorted(HostCache(store, 16).capabilities)
        (['stage'], ['resize', 'stage', 'warm'])
        >>> store.check_capability("stage")
        >>> store.check_capability("resize")
        Traceback (most recent call last):
        ...
        TypeError: TensorStore(shape=(4, 2), dtype=torch.float32) has no cache to resize (it does not declare 'resize')
        """
        if name not in CAPABILITIES:
            raise ValueError(f"no capability {name!r}: one of {', '.join(CAPABILITIES)}")
        if name not in self.capabilities:
            what = {"stage": "cannot sit under a cache (its reads are collective, every rank reading at every "
                             "step: put the cache under the store it reads its own rows from)",
                    "warm": "has no cache to warm", "resize": "has no cache to resize"}[name]
            raise TypeError(f"{self!r} {what} (it does not declare {name!r})")

    def _warm_ids(self, ids):
        """``ids``, or where None the store's :meth:`hot_ids`; ``ValueError`` where it knows none."""
        if ids is None:
            ids = self.hot_ids()
            if ids is None:
                raise ValueError(f"{self!r} knows no hot rows: pass the ids to warm (e.g. hot_order of "
                                 "access_counts over pre-sampled batches), or renumber the file by hotness "
                                 "(directload.stores.renumber)")
        return ids

    def prefetch(self, ids: Ids) -> None:
        """A hint that ``ids`` will be read soon (the loaders call it with each batch's ids ahead).

        The ids are checked as a read's are (errors before any work); then :meth:`_prefetch` acts on
        them: nothing by default, read-ahead in caching stores.
        """
        self.check_open()
        index = as_index(ids)
        self._check_bounds(index)
        self._prefetch(index)

    def _prefetch(self, index):
        """Act on checked prefetch ids (1-D int32/int64, in range); the default does nothing."""

    # ------------------------------------------------------------- counters
    def stats(self) -> Stats:
        """This store's counters and those of every store under it, since they opened (or
        :meth:`reset_stats`), composed one way for every store:

        * a store of its own rows (no :meth:`children`) gives its own record, a
          :class:`~directload.stores.records.Stats` of :attr:`tier` (an empty one where it counts nothing);
        * a store in front of others gives a :class:`~directload.stores.records.TieredStats`: its own
          record first where it counts anything (a cache's is a
          :class:`~directload.stores.records.CacheStats`), then each child's tiers, top first, each tier
          name once (the nearest the top), as ``{tier name: record}``.

        Examples
        --------
        >>> from directload.stores import HostCache, TensorStore
        >>> cache = HostCache(TensorStore(torch.zeros(4, 2)), 16)
        >>> _ = cache.read([1, 1]); s = cache.stats()
        >>> list(s), s["host"]["rows"], TensorStore(torch.zeros(4, 2)).stats().tier
        (['host', 'tensor'], 2, 'tensor')
        """
        own = self.record_type(self.tier, self._counters())
        children = self.children()
        if not children:
            return own
        below = (t for child in children for t in child.stats().tiers)
        return TieredStats([*([own] if len(own) else []), *below])

    def reset_stats(self) -> None:
        """Start every counter of this store and of every store under it from zero."""
        self._reset_counters()
        for child in self.children():
            child.reset_stats()

    def _counters(self):
        """This store's own counters, a dict: its :class:`~directload.stores.counters.Counters` now (none by
        default); a store adds what follows from them (rates, settings)."""
        return {} if self._counts is None else self._counts.snapshot()

    def _reset_counters(self):
        """Zero this store's own counters."""
        if self._counts is not None:
            self._counts.reset()

    # -------------------------------------------------------------- lifetime
    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Finish reads in flight, then release the store's resources.  Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self):
        state = ", closed" if self._closed else ""
        return f"{type(self).__name__}(shape={self.shape}, dtype={self.dtype}{state})"

    # ----------------------------------------------------------------- hooks
    def _read_async(self, index, out, run_device, out_device):
        """Start the read; ``index`` is checked (1-D int32/int64, in range), ``out`` too."""
        raise NotImplementedError

    def _close(self):
        """Release resources (reads in flight must finish first)."""

    def _after_fork(self):
        """Called in a forked child, before anything else runs there: make the store usable in it.  Threads
        of the parent did not come along, and locks they held stay held; a store that has threads or
        locks replaces them here (the default has none)."""

    # --------------------------------------------------------------- helpers
    def check_open(self) -> None:
        """Raise :class:`ClosedError` if the store is closed (a composite store checks its parts with it)."""
        if self._closed:
            raise ClosedError(f"{self!r} is closed")

    def _check_bounds(self, index):
        if not index.numel() or (index.is_cuda and self._bounds_on_device()):
            return
        lo, hi = (int(v) for v in torch.aminmax(index))  # one pass (and one sync on a GPU)
        if lo < 0 or hi >= self.num_rows:
            bad = lo if lo < 0 else hi
            raise out_of_range(bad, self.num_rows, what="row id")

    def _bounds_on_device(self):
        """A hook: whether this store's GPU read checks a CUDA index's bounds itself, with no host sync (then
        :meth:`read_async` leaves them to it and ``wait()`` raises).  None does by default."""
        return False

    def _check_out(self, out, n, device):
        want = (n, *self.row_shape)
        if not isinstance(out, torch.Tensor):
            raise TypeError(f"out must be a torch.Tensor, not {type(out).__name__}")
        if getattr(out, "is_unified", False):
            raise TypeError("out is a unified tensor: a read writes into a plain tensor (a unified table may be "
                            "read-only, mapped from a file or shared with other processes); read into a plain "
                            "tensor and copy it over with the unified tensor's own indexing")
        if tuple(out.shape) != want or out.dtype != self.dtype or not out.is_contiguous():
            raise ValueError(f"out must be a contiguous {self.dtype} tensor of shape {want}, got "
                             f"{'' if out.is_contiguous() else 'non-contiguous '}{out.dtype} {tuple(out.shape)}")
        if out.device != device:
            raise ValueError(f"out is on {out.device} but this read's result lives on {device}")
        if out.requires_grad:
            raise ValueError("out requires grad: a read writes it outside autograd, which would then compute "
                             "gradients from values it never saw; pass a tensor that does not require grad")
        if out.is_inference() and not torch.is_inference_mode_enabled():
            raise ValueError("out is an inference tensor and cannot be written in place outside inference mode "
                             "(as torch refuses it); read into a normal tensor, or read inside torch.inference_mode()")
        if out.numel():
            span = memory_span(out)
            for mine in self.held_memory():
                if overlaps(span, memory_span(mine, whole=True)):
                    raise ValueError(f"out shares memory with {self!r}'s own rows: a read cannot write where it "
                                     "reads; pass a separate out")

    def children(self) -> tuple[FeatureStore, ...]:
        """The stores this one reads through, top first (none for a store of its own rows; see
        :class:`~directload.stores.wrapper.WrapperStore`)."""
        return ()

    def held_memory(self) -> tuple[torch.Tensor | np.ndarray, ...]:
        """Tensors (or arrays) whose memory the store reads rows from, keeps them in or stages them through,
        which no ``out`` may overlap: a tensor store's table, a cache's slots, the buffers its reads, its
        read-ahead and its warming stage rows in, a disk store's staging, and those of the stores it wraps
        (:meth:`_own_memory`).  Each is named whole, however much of it is in use now.
        """
        return tuple(self._own_memory())

    def _own_memory(self):
        """The hook of :meth:`held_memory`; none by default."""
        return ()

    def held_bytes(self) -> int:
        """Bytes of host memory this store and every store under it hold now: the host memory of
        :meth:`held_memory`, each byte once (a table two stores read counts once), plus each store's
        bookkeeping (:meth:`_bookkeeping_bytes`: a cache's map from row to slot, its policy and the batches
        announced to it, a packed disk store's id map).  The rows a read returns are the caller's, not the
        store's; a GPU's memory is not host memory.

        What a memory cap must leave the stack; a cache's slots count whole from the start (pages of a
        host cache's room past its capacity are touched only when it grows into them).

        Examples
        --------
        >>> from directload.stores import HostCache, TensorStore
        >>> table = torch.zeros(1000, 256)  # 1 MB
        >>> cache = HostCache(TensorStore(table), capacity_bytes=1 << 18, policy="lru")
        >>> TensorStore(table).held_bytes(), cache.held_bytes() >= table.nbytes + (1 << 18)
        (1024000, True)
        """
        stores, seen = [self], {id(self)}
        for store in stores:  # every store under this one, once
            for child in store.children():
                if id(child) not in seen:
                    seen.add(id(child))
                    stores.append(child)
        memory = span_bytes(m for m in self.held_memory() if on_host(m))
        return memory + sum(store._bookkeeping_bytes() for store in stores)

    def _bookkeeping_bytes(self):
        """The hook of :meth:`held_bytes`: bytes this store (not those under it) keeps as bookkeeping outside
        :meth:`held_memory` (:func:`~directload.stores.held.nbytes_of` counts them); none by default."""
        return 0


def _bump_version(t):
    """Tell autograd that ``t`` changes in place, so a graph that saved it refuses to use the old values."""
    bump = getattr(torch.autograd.graph, "increment_version", None)
    if bump is None:
        return
    if not t.is_inference():  # (an inference tensor has no version counter)
        bump(t)
