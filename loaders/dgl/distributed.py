"""directload under DistDGL: partitions with a disk store per part, and the feature source of a ``DistGraph``.

DistDGL's ``DistNodeDataLoader`` only samples: the training loop fetches the features of each batch's input
nodes (``g.ndata["feat"][input_nodes]``).  :func:`dist_features` is that fetch through directload: the rows
of this machine's partition from a directload store (the server's shared memory, or a disk store or tiers
when the partition does not fit in memory), every other row through DGL: by its KVStore
(:class:`~directload.stores.remote.KVStoreRows`, DGL's C++ fast path) or, when the partitions' features live
on disk, by one DGL RPC service that reads the owner's store (:class:`ServedRows`).  Both are remote tiers
(:class:`~directload.stores.remote.RemoteStore`, the plug-in point for any other).  Partitions come from
:func:`partition` (:mod:`.partitions`: DGL's own plus, for out-of-core features, a directload disk store per
partition, published as one set), or from ``dgl.distributed.partition_graph`` alone (features in memory).
"""

from __future__ import annotations

import os
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import torch

from directload.capabilities import require
from directload.codecs import CodecError
from directload.errors import DirectloadError
from directload.stores import DecodingStore, DiskOptions, FeatureStore, PartitionedStore, StoreSpec, open_store
from directload.stores.partitioned import owners
from directload.stores.remote import KVStoreRows, RemoteReadError, RemoteStore

dgl = require("dgl")

from dgl.distributed import rpc  # noqa: E402

from ..pipeline import BatchAdapter, Epoch, Pipeline  # noqa: E402
from .partitions import META, PartitionMismatchError, node_bounds, partition, read_partitions, store_path  # noqa: E402

if TYPE_CHECKING:
    from dgl.distributed import DistGraph

    from directload.stores import ReadFuture

    class _ReadsRows(Protocol):
        """What :class:`DistBatches` reads with: a FeatureStore, or any object whose ``read_async`` gives a future."""

        def read_async(self, ids: torch.Tensor) -> ReadFuture: ...

__all__ = ["partition", "read_partitions", "store_path", "node_bounds", "dist_features", "DistFeatures",
           "DecodedDistFeatures", "dist_ids",
           "dist_epoch", "DistBatches", "KVStoreRows", "ServedRows", "serve_features", "register_service",
           "check_service", "SERVICE_ID", "ServiceIdError", "RemoteReadError", "PartitionMismatchError", "META"]

#: directload's one DGL RPC service: the rows of a partition's disk store.  DGL's own ids are 6657-6662,
#: 22451-22454, 700001-700002, 800001-800002 and 901231-901241 (v2.1), in one flat space with no collision
#: check, so :func:`register_service` checks this one.
SERVICE_ID = 17484


class ServiceIdError(DirectloadError, RuntimeError):
    """directload's RPC service id is taken by another service in DGL's registry.

    Examples
    --------
    >>> issubclass(ServiceIdError, RuntimeError)
    True
    """


# The RPC service.  A server process calls serve_features(path) before dgl.distributed.initialize; the
# request then runs in that server and reads its machine's store.
_served: dict[int, FeatureStore] = {}


class _RowsRequest(rpc.Request):
    def __init__(self, ids=None, part=0):
        self.ids, self.part = ids, part

    def __getstate__(self):
        return self.ids, self.part

    def __setstate__(self, state):
        self.ids, self.part = state

    def process_request(self, server_state):
        store = _served.get(self.part)
        if store is None:  # answered, not raised: a raise here kills DGL's server loop
            return _RowsResponse(None, f"this server does not serve partition {self.part}")
        try:
            return _RowsResponse(store.read(self.ids), None)
        except Exception as exc:  # noqa: BLE001 - sent back to the trainer that asked, as one line
            return _RowsResponse(None, f"{type(exc).__name__}: {exc}")


class _RowsResponse(rpc.Response):
    def __init__(self, rows=None, error=None):
        self.rows, self.error = rows, error

    def __getstate__(self):
        return self.rows, self.error

    def __setstate__(self, state):
        self.rows, self.error = state


def register_service() -> None:
    """Register directload's RPC service with DGL, in servers and trainers alike, before
    ``dgl.distributed.initialize``.  ``ServiceIdError`` when :data:`SERVICE_ID` is another service's."""
    taken = rpc.SERVICE_ID_TO_PROPERTY.get(SERVICE_ID)
    if taken is not None and taken != (_RowsRequest, _RowsResponse):
        raise ServiceIdError(f"DGL RPC service id {SERVICE_ID} is taken by {taken[0].__name__}: directload's "
                             "feature service cannot share it")
    rpc.register_service(SERVICE_ID, _RowsRequest, _RowsResponse)


def check_service() -> None:
    """After ``dgl.distributed.initialize``: ``ServiceIdError`` if DGL registered one of its own services over
    directload's id meanwhile (its KVStore registers some only then)."""
    if rpc.SERVICE_ID_TO_PROPERTY.get(SERVICE_ID) != (_RowsRequest, _RowsResponse):
        raise ServiceIdError(f"DGL RPC service id {SERVICE_ID} was taken over by "
                             f"{rpc.SERVICE_ID_TO_PROPERTY.get(SERVICE_ID, (None,))[0]!r} during initialize")


def serve_features(config: os.PathLike[str] | str, part: int, **disk_options: Any) -> FeatureStore:
    """In a server process: register the service and open partition ``part``'s disk store for it
    (:func:`~directload.stores.open_store`, with ``disk_options``: :class:`~directload.stores.DiskOptions`)."""
    register_service()
    # a store of codes is served as codes: the trainer that asked decodes them, so the network carries codes
    _served[int(part)] = open_store(StoreSpec(store_path(config, part), tiers=False, decode=False,
                                              disk=DiskOptions(**disk_options)))
    return _served[int(part)]


class ServedRows(RemoteStore):
    """Rows of other machines' disk stores, each read by its owner's server through directload's RPC service,
    one request per owning machine, sent together.  ``timeout`` (seconds) bounds the wait:
    :class:`RemoteReadError` names the machine that did not answer.

    Examples
    --------
    >>> rows = ServedRows([0, 5, 10], (4,), torch.float32)  # two machines of 5 rows each
    >>> rows.shape, tuple(rows.read([]).shape)  # a read with no ids asks no machine
    ((10, 4), (0, 4))
    """

    tier = "rpc"

    def __init__(self, bounds: Sequence[int], row_shape: tuple[int, ...], dtype: torch.dtype, *,
                 timeout: float = 120.0) -> None:
        super().__init__(bounds[-1], row_shape, dtype)
        self._bounds = np.asarray(bounds, dtype=np.int64)
        self._timeout_ms = int(timeout * 1000)

    def _fetch(self, ids):
        np_ids = ids.numpy()
        owner = owners(self._bounds, np_ids)
        order = np.argsort(owner, kind="stable")
        machines, starts = np.unique(owner[order], return_index=True)
        groups = np.split(order, starts[1:])
        requests = [(int(m), _RowsRequest(torch.from_numpy(np_ids[at] - self._bounds[m]), int(m)))
                    for m, at in zip(machines, groups)]
        try:
            answers = rpc.remote_call_to_machine(requests, self._timeout_ms)
        except Exception as exc:
            raise RemoteReadError(f"machines {machines.tolist()} did not answer a read of {len(np_ids)} rows "
                                  f"({type(exc).__name__}: {exc})") from exc
        rows = torch.empty((len(np_ids), *self._row_shape), dtype=self._dtype)
        for m, at, answer in zip(machines, groups, answers):
            if answer is None or answer.error is not None:
                why = "no answer" if answer is None else answer.error
                raise RemoteReadError(f"machine {int(m)} could not read its rows: {why}")
            rows[torch.from_numpy(at)] = answer.rows
        return rows


# --------------------------------------------------------------------------- the trainer's feature source
def dist_ids(ids: torch.Tensor | np.ndarray | Sequence[int] | slice | int,
             num_rows: int) -> torch.Tensor | np.ndarray | Sequence[int]:
    """The ids ``DistTensor.__getitem__`` takes (DGL 2.1: a tensor, a list, tuple or range, a numpy array, a
    slice, or one integer, which gives a batch of one row) as what :meth:`FeatureStore.read` takes; a
    one-line ``TypeError`` for anything else (booleans and floats included, which DGL would read as ids 0/1
    and truncate), before any work.  Ids outside the table are the read's ``IndexError``.

    Examples
    --------
    >>> dist_ids(slice(1, None, 2), 6).tolist(), dist_ids(3, 6), dist_ids([4, 0], 6)
    ([1, 3, 5], [3], [4, 0])
    >>> dist_ids(torch.ones(2, 2, dtype=torch.int64), 6)
    Traceback (most recent call last):
    ...
    TypeError: ids must be 1-D (one id per row), got shape (2, 2)
    """
    if isinstance(ids, slice):
        return torch.arange(*ids.indices(num_rows))
    if isinstance(ids, (bool, np.bool_)):
        raise TypeError(f"ids must be integer row ids, not a {type(ids).__name__}")
    if isinstance(ids, (int, np.integer)):
        return [int(ids)]
    if isinstance(ids, (torch.Tensor, np.ndarray)):
        if ids.ndim == 0:  # one id, as an integer is
            return ids.reshape(1)
        if ids.ndim > 1:
            raise TypeError(f"ids must be 1-D (one id per row), got shape {tuple(ids.shape)}")
    return ids


class _IndexedAsDistTensor:
    """``x[ids]``, as DGL's ``DistTensor`` is indexed: ``x.read(dist_ids(ids, len(x)))``."""

    if TYPE_CHECKING:  # what the store it is mixed into has
        num_rows: int
        read: Callable[..., torch.Tensor]

    def __getitem__(self, ids):
        return self.read(dist_ids(ids, self.num_rows))


class DistFeatures(_IndexedAsDistTensor, PartitionedStore):
    """The features of a ``DistGraph`` as :func:`dist_features` gives them: a
    :class:`~directload.stores.PartitionedStore` that is also indexed as DGL's ``DistTensor`` is:
    ``x[ids]`` (ids as :func:`dist_ids` takes them), ``x.shape``, ``x.dtype``, ``len(x)``.

    ``x[ids]`` is ``x.read(dist_ids(ids, len(x)))``: the rows on the ids' device (a list, slice or integer
    gives CPU rows), a new tensor.

    Examples
    --------
    >>> table = torch.arange(12.0).view(6, 2)
    >>> from directload.stores import TensorStore
    >>> x = DistFeatures(TensorStore(table[3:].clone()), TensorStore(table), [0, 3, 6], part=1)
    >>> x[torch.tensor([5, 0])].tolist(), x[1:3].tolist(), x.shape, len(x)
    ([[10.0, 11.0], [0.0, 1.0]], [[2.0, 3.0], [4.0, 5.0]], (6, 2), 6)
    """


class DecodedDistFeatures(_IndexedAsDistTensor, DecodingStore):
    """The features of a ``DistGraph`` whose partitions hold code rows (``partition(codec=...)``), as
    :func:`dist_features` gives them: decoded float32 rows of a :class:`DistFeatures` of codes, indexed as
    DGL's ``DistTensor`` is.  Every machine holds, reads and sends code rows; the trainer decodes last.

    Examples
    --------
    >>> from directload.codecs import encode
    >>> from directload.stores import TensorStore
    >>> codes = encode(torch.arange(12.0).view(6, 2), "int8").codes
    >>> x = DecodedDistFeatures(DistFeatures(TensorStore(codes[3:]), TensorStore(codes), [0, 3, 6], part=1), "int8",
    ...                         own=True)
    >>> x[torch.tensor([5, 0])].tolist(), x.shape, x.dtype
    ([[10.0, 11.0], [0.0, 1.0]], (6, 2), torch.float32)
    """


def dist_features(g: DistGraph, config: os.PathLike[str] | str, *, name: str = "feat",
                  ntype: str | None = None, local: FeatureStore | StoreSpec | None = None,
                  timeout: float = 120.0) -> DistFeatures | DecodedDistFeatures:
    """The features of the ``DistGraph`` ``g`` as one directload store: this machine's rows from ``local``,
    the others through DGL.

    Reads take the ids DistDGL's sampler gives (``input_nodes``, DGL's reshuffled ids), as ``read(ids)`` or
    as ``x[ids]``, which DGL's ``DistTensor`` also takes (:class:`DistFeatures`).  With partitions whose
    features are in memory (``features="memory"`` in :func:`partition`, or partitions that
    ``dgl.distributed.partition_graph`` wrote alone), ``local`` defaults to the machine's partition as the
    server holds it in shared memory (``DistTensor.local_partition``, no copy) and other machines' rows come
    through DGL's KVStore; the bounds are those of DGL's config.  With features on disk, ``local`` defaults
    to this machine's disk store, and other machines' rows come from their servers through directload's RPC
    service (:func:`register_service` before ``initialize``).  ``local`` may describe the stack over this
    machine's rows as a :class:`~directload.stores.StoreSpec` without a source (``StoreSpec(host_bytes="1G")``:
    a host cache in front of them), opened over them by :func:`~directload.stores.open_store`, or be any
    directload store over them (a unified tensor's ``TensorStore``); either way the features close it.

    Partitions of code rows (``partition(codec=...)``) give :class:`DecodedDistFeatures`: this machine's
    tiers hold codes (a host cache of a ``local`` spec holds as many more rows as the codes are smaller), the
    other machines send codes, and the rows are decoded to float32 last, on this trainer.  A ``local`` store
    given must then hold the same codes.

    Parameters
    ----------
    g : dgl.distributed.DistGraph
    config : str or os.PathLike
        DGL's partition config, as given to ``DistGraph``.
    name : str
        The node field.
    ntype : str, optional
        The node type, on a graph with several (``g.nodes[ntype].data[name]``).
    local : FeatureStore or StoreSpec, optional
        This machine's rows: a store over them, or the spec of the stack to open over them (its source
        left None); default ``StoreSpec(tiers=False)``, the rows alone.
    timeout : float
        Seconds a remote read through directload's RPC service may take.

    Returns
    -------
    DistFeatures or DecodedDistFeatures

    Raises
    ------
    PartitionMismatchError
        directload's record and DGL's config are not one partitioning, or ``g`` was loaded from partitions
        with another number of parts, before any work.
    FileNotFoundError
        No partition config at ``config``.

    Examples
    --------
    >>> dist_features  # doctest: +ELLIPSIS
    <function dist_features at ...>
    """
    meta = read_partitions(config)
    gpb = g.get_partition_book()
    if gpb.num_partitions() != meta["parts"]:
        raise PartitionMismatchError(f"the DistGraph has {gpb.num_partitions()} partitions, the partitions at "
                                     f"{config} {meta['parts']}: give the config the graph was loaded from")
    part = int(gpb.partid)
    types = sorted(meta["node_bounds"])
    if ntype is None and len(types) != 1:
        raise ValueError(f"the graph has node types {types}: name one (ntype=...)")
    if ntype is not None and ntype not in meta["node_bounds"]:
        raise KeyError(f"{ntype!r} is not a node type of the partitions (they have {types})")
    bounds = meta["node_bounds"][ntype or types[0]]
    codec = meta["codec"]
    spec = local if isinstance(local, StoreSpec) else StoreSpec(tiers=False)
    if codec is not None:  # every tier of this machine's rows holds codes: decoded on top of the whole
        held = getattr(local, "codec", codec) if isinstance(local, FeatureStore) else codec
        if held != codec:
            raise CodecError(f"the partitions hold {codec} codes, and local holds {held} ones")
        spec = replace(spec, codec=None if meta["features"] == "memory" else codec, decode=False)
    tensor = None
    if meta["features"] == "memory":
        tensor = g.ndata[name] if ntype is None else g.nodes[ntype].data[name]
        source: Any = tensor.local_partition[:bounds[part + 1] - bounds[part]]  # the server's shared memory
    else:
        check_service()
        source = store_path(meta["config"], part)
    rows = local if isinstance(local, FeatureStore) else open_store(replace(spec, source=source))
    try:
        remote: RemoteStore = KVStoreRows(tensor) if tensor is not None else \
            ServedRows(bounds, rows.row_shape, rows.dtype, timeout=timeout)
        features = DistFeatures(rows, remote, bounds, part=part, own=True)
    except BaseException:
        if rows is not local:  # what this opened; a store given is the caller's
            rows.close()
        raise
    if codec is None:
        return features
    try:
        return DecodedDistFeatures(features, codec, own=True)
    except BaseException:
        features.close()
        raise


class DistBatches(BatchAdapter):
    """DistDGL's batches (``input_nodes, seeds, blocks``) with their features read by ``store``: each batch's
    read starts as soon as it is sampled (``lookahead`` batches ahead), so this machine's rows come off its
    disk or tiers while earlier batches train; other machines' rows are read on the training thread when
    the batch is due (DGL's RPC client is not thread-safe).  Batches come out as ``(input_nodes, seeds,
    blocks, x)``.  ``fetch_ms`` lists, per batch, the milliseconds the training thread spent starting and
    waiting for its features.

    Examples
    --------
    >>> from directload.stores import TensorStore
    >>> table = TensorStore(torch.arange(8.0).view(4, 2))
    >>> epoch, adapter = dist_epoch([(torch.tensor([3, 0]), "seeds", "blocks")], table, lookahead=2)
    >>> [(seeds, x.tolist()) for _, seeds, _, x in epoch], len(adapter.fetch_ms)
    ([('seeds', [[6.0, 7.0], [0.0, 1.0]])], 1)
    """

    def __init__(self, store: FeatureStore | _ReadsRows) -> None:
        self._store = store
        self._reads: deque[tuple[ReadFuture, float]] = deque()
        self.fetch_ms: list[float] = []

    def ids(self, batch: Any) -> torch.Tensor:
        return batch[0]

    def announce(self, batch: Any) -> None:
        t0 = time.perf_counter()
        self._reads.append((self._store.read_async(batch[0]), time.perf_counter() - t0))

    def start(self, batch: Any) -> tuple[Any, ReadFuture, float]:
        return batch, *self._reads.popleft()

    def finish(self, started: tuple[Any, ReadFuture, float]) -> tuple[torch.Tensor, Any, Any, torch.Tensor]:
        (input_nodes, seeds, blocks), future, spent = started
        t0 = time.perf_counter()
        x = future.wait()
        self.fetch_ms.append((spent + time.perf_counter() - t0) * 1e3)
        return input_nodes, seeds, blocks, x

    def stores(self) -> tuple[FeatureStore, ...]:
        return (self._store,) if isinstance(self._store, FeatureStore) else ()


def dist_epoch(loader: Iterable[Any], store: FeatureStore | _ReadsRows, *,
               lookahead: int = 4) -> tuple[Epoch, DistBatches]:
    """One epoch of a ``DistNodeDataLoader`` through directload's pipeline: ``(epoch, adapter)``, where
    iterating ``epoch`` gives ``(input_nodes, seeds, blocks, x)`` with ``x`` read by ``store`` (see
    :class:`DistBatches`), sampled ``lookahead`` batches ahead on the caller's thread.

    DistDGL has no feature prefetch of its own: its loader only samples, and the training loop fetches.
    """
    adapter = DistBatches(store)
    return Epoch(Pipeline(iter(loader), adapter, device="cpu", lookahead=lookahead, sample_in_thread=False,
                          overlap=False)), adapter
