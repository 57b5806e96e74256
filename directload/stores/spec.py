"""``StoreSpec``: a feature store described once, as data, checked by one ``check()``, written down and read
back as plain data, and opened by :func:`~directload.stores.open_store`.

GraphBolt builds its feature stacks from declarative specs; so does directload.  A spec names the source
(a ``.npy`` disk store's path, a tensor, or any store), the cache budgets and policy, whether the source is
packed hottest first, and three parts of their own: the options of the disk store a path opens
(:class:`DiskOptions`), what the jobs of one node share (:class:`BudgetSpec`: a node budget and the hottest
rows held once) and whether the table is split among the ranks of a ``torch.distributed`` job
(:class:`PartitionSpec`).  :meth:`StoreSpec.check` holds every rule of how those go together, so a command
line and a config that both call it refuse the same things with the same words (``names`` spells the
fields as the caller's options), before anything is opened.  :meth:`StoreSpec.to_dict` and
:meth:`StoreSpec.from_dict` give it as JSON's types and back (a training run's report records its spec).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any, TypeAlias

import torch

from directload.codecs import CODECS, CodecError, EncodedTable
from directload.errors import DirectloadWarning
from directload.units import check_bytes, check_int, dtype_name

from .base import FeatureStore
from .handle import StoreHandle, open_store  # noqa: F401  (their home is .handle; the old path keeps working)
from .policies import POLICY_NAMES, Policy

__all__ = ["StoreSpec", "DiskOptions", "BudgetSpec", "PartitionSpec", "Source", "DeprecatedKeywordWarning"]

#: What a spec reads: a ``.npy`` disk store's path, a tensor, or a store.
Source: TypeAlias = "str | os.PathLike[str] | torch.Tensor | EncodedTable | FeatureStore"


def _field(path: str) -> str:
    """A field as the spec's own errors name it: its path, a switch as set (``packed=True``)."""
    return f"{path}=True" if path in ("tiers", "packed") else path


def _unknown(cls: type, data: Mapping[str, Any]) -> None:
    """``TypeError`` naming the keys of ``data`` that are no field of ``cls``."""
    extra = sorted(set(data) - {f.name for f in fields(cls)})
    if extra:
        raise TypeError(f"{cls.__name__} has no field {', '.join(map(repr, extra))}")


@dataclass(frozen=True)
class DiskOptions:
    """Options of the :class:`~directload.stores.DiskStore` a spec's path opens: each one the disk store's
    parameter of that name, None leaving it at the disk store's default.  ``dtype``, ``shape`` and ``offset``
    read a raw file (no ``.npy`` header).

    Examples
    --------
    >>> options = DiskOptions(queue_depth=8, dtype=torch.uint8, shape=(10, 4))
    >>> options.kwargs()["queue_depth"], options.to_dict()
    (8, {'queue_depth': 8, 'dtype': 'uint8', 'shape': [10, 4]})
    >>> DiskOptions.from_dict(options.to_dict()) == options
    True
    """

    queue_depth: int | None = None
    rings: int | None = None
    engine: str | None = None
    direct: bool | str | None = None
    merge_gap: int | None = None
    max_read: int | None = None
    retries: int | None = None
    staging_bytes: int | None = None
    submit_batch: int | None = None
    dtype: torch.dtype | None = None
    shape: tuple[int, ...] | None = None
    offset: int | None = None

    def kwargs(self) -> dict[str, Any]:
        """The options given (not None), as :class:`~directload.stores.DiskStore`'s keyword arguments."""
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None}

    def to_dict(self) -> dict[str, Any]:
        """The options given, as JSON's types (a dtype by its name, a shape as a list)."""
        out = self.kwargs()
        if self.dtype is not None:
            out["dtype"] = dtype_name(self.dtype)
        if self.shape is not None:
            out["shape"] = list(self.shape)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> DiskOptions:
        """The options :meth:`to_dict` gave; ``TypeError`` for a key that is no option."""
        _unknown(cls, data)
        values = dict(data)
        if isinstance(values.get("dtype"), str):
            dtype = getattr(torch, values["dtype"], None)
            if not isinstance(dtype, torch.dtype):
                raise TypeError(f"dtype {values['dtype']!r} is no torch dtype")
            values["dtype"] = dtype
        if values.get("shape") is not None:
            values["shape"] = tuple(values["shape"])
        return cls(**values)


@dataclass(frozen=True)
class BudgetSpec:
    """What the jobs of one node share (:mod:`directload.budget`): one budget of host bytes and disk reads
    in flight, by name, and the packed source's hottest rows, held once.

    Parameters
    ----------
    host_bytes : int or str
        The host bytes of the node budget the stack joins (:func:`~directload.stores.join_budget`; 0: none):
        its host cache then starts empty and grows into its share, up to the spec's ``host_bytes`` (or the
        whole table).  The shared hot rows come out of it first.
    io_depth : int
        Disk reads in flight shared within that budget (0: each stack its own).
    name : str
        The budget's name: stacks giving the same name share one budget and one copy of the hot rows.
    shared_hot_bytes : int or str
        The hottest rows of a packed source held once per node in shared memory
        (:class:`~directload.stores.HotRowsStore` over :func:`directload.shared_table`).
    hot_key : str, optional
        The node-wide name of that copy (default: ``name``); the source file's identity and the row count are
        added, so a repacked file never reuses an old copy.
    directory : str, optional
        Where the budget lives (default ``/dev/shm``).

    Examples
    --------
    >>> BudgetSpec(host_bytes="4G", io_depth=64).to_dict()["host_bytes"]
    '4G'
    """

    host_bytes: int | str = 0
    io_depth: int = 0
    name: str = "directload"
    shared_hot_bytes: int | str = 0
    hot_key: str | None = None
    directory: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """Every field, as JSON's types."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> BudgetSpec:
        """The part :meth:`to_dict` gave; ``TypeError`` for a key that is no field."""
        _unknown(cls, data)
        return cls(**data)


@dataclass(frozen=True)
class PartitionSpec:
    """The rows split among the ranks of the ``torch.distributed`` job: this rank's contiguous range
    (:func:`~directload.stores.partition_bounds`) from its own stack, every other row from its owner by
    all-to-all (:class:`~directload.stores.RowExchange`, each round within ``timeout`` seconds).  Every rank
    opens it, in the same order.

    Examples
    --------
    >>> PartitionSpec(timeout=30).to_dict()
    {'timeout': 30}
    """

    timeout: float = 60.0

    def to_dict(self) -> dict[str, Any]:
        """Every field, as JSON's types."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PartitionSpec:
        """The part :meth:`to_dict` gave; ``TypeError`` for a key that is no field."""
        _unknown(cls, data)
        return cls(**data)


#: A spec's parts, by field: each a dataclass of its own with ``to_dict`` and ``from_dict``.
_PARTS: dict[str, Any] = {"budget": BudgetSpec, "partition": PartitionSpec, "disk": DiskOptions}


@dataclass(frozen=True)
class StoreSpec:
    """What a feature store is made of.

    Parameters
    ----------
    source : str, os.PathLike, torch.Tensor, EncodedTable or FeatureStore, optional
        A ``.npy`` disk store's path (opened as a :class:`~directload.stores.DiskStore` with ``disk``), a host
        tensor (rows in memory), a table of codes in memory (:class:`~directload.codecs.EncodedTable`: a
        mapped disk store of codes, a shared table of them), or a store, used as it is and left open.  None:
        given later (a training run reads its dataset's), so :func:`open_store` refuses it.
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
    budget : BudgetSpec
        The node budget the stack joins and the hot rows it holds once per node (none by default).
    partition : PartitionSpec, optional
        Split the rows among the ranks of the ``torch.distributed`` job (None: every row here).
    disk : DiskOptions
        Options of the disk store a path opens (``queue_depth``, ``engine``, ...).
    codec : str, optional
        Carry the rows compressed through every tier (``"float16"``, ``"bfloat16"``, ``"int8"``; see
        :mod:`directload.codecs`): a float tensor source is encoded as the stack opens, and the caches, the
        disk and the exchange move and hold code rows (so their bytes hold more rows); reads return decoded
        float32 rows (a :class:`~directload.stores.DecodingStore` on top).  A disk store written with a codec
        (``write_disk_store(codec=...)``) is decoded whether or not this names it; naming another codec is an
        error.  A source of plain rows on disk is refused: write it again with the codec.
    decode : bool
        With a codec: False opens the stack without the decode on top, so reads return the code rows, for a
        caller that sends them on (a server) or decodes above a store of its own (over a partitioned store).

    Examples
    --------
    >>> spec = StoreSpec(torch.zeros(100, 4), host_bytes="1K", policy="lru").check()
    >>> spec.host_bytes, spec.tiers
    (1024, True)
    >>> StoreSpec(torch.zeros(100, 4), policy="fifo").check(names=lambda key: "--" + key.replace("_", "-"))
    Traceback (most recent call last):
    ...
    ValueError: --policy must be one of ('lookahead', 'lru', 'clock', 'sieve', 's3fifo'), got 'fifo'
    >>> StoreSpec.from_dict(StoreSpec("feat.npy", budget=BudgetSpec(host_bytes="1G")).to_dict()).budget.host_bytes
    '1G'
    """

    source: Source | None = None
    tiers: bool = True
    gpu_bytes: int | str = 0
    host_bytes: int | str = 0
    staging_bytes: int | str | None = None
    policy: str | Policy | Callable[[int], Policy] = "lookahead"
    device: str | torch.device | None = None
    packed: bool = False
    budget: BudgetSpec = field(default_factory=BudgetSpec)
    partition: PartitionSpec | None = None
    disk: DiskOptions = field(default_factory=DiskOptions)
    codec: str | None = None
    decode: bool = True

    @property
    def partitioned(self) -> bool:
        """Whether the rows are split among the ranks (a :attr:`partition` is given)."""
        return self.partition is not None

    def check(self, names: Callable[[str], str] = _field) -> StoreSpec:
        """This spec with its sizes in bytes, or a one-line typed error naming the field by its path
        (``"budget.host_bytes"``) as ``names(path)`` spells it (a command line passes its flags).  A spec
        without a source is checked as far as it goes (the rules of the source's kind wait for it).  Opens
        nothing."""
        source, budget = self.source, self.budget
        for name, part in (("budget", BudgetSpec), ("disk", DiskOptions)):
            if not isinstance(getattr(self, name), part):
                raise TypeError(f"{names(name)} must be a {part.__name__}, not {type(getattr(self, name)).__name__}")
        if not (self.partition is None or isinstance(self.partition, PartitionSpec)):
            raise TypeError(f"{names('partition')} must be a PartitionSpec or None, not "
                            f"{type(self.partition).__name__}")
        if source is not None and not isinstance(source, (str, os.PathLike, torch.Tensor, EncodedTable, FeatureStore)):
            raise TypeError(f"{names('source')} must be a path, a tensor, an EncodedTable or a FeatureStore, not "
                            f"{type(source).__name__}")
        path = isinstance(source, (str, os.PathLike))
        if self.disk.kwargs() and source is not None and not path:
            raise TypeError(f"disk options {sorted(self.disk.kwargs())} apply to a path, not to a given "
                            f"{type(source).__name__}")
        gpu, host = (check_bytes(names(key), getattr(self, key)) for key in ("gpu_bytes", "host_bytes"))
        staging = None if self.staging_bytes is None else check_bytes(names("staging_bytes"), self.staging_bytes)
        budget = self._checked_budget(names)
        if isinstance(self.policy, str) and self.policy not in POLICY_NAMES:
            raise ValueError(f"{names('policy')} must be one of {POLICY_NAMES}, got {self.policy!r}")
        self._check_together(budget, names)
        if self.codec is not None and self.codec not in CODECS:
            raise CodecError(f"{names('codec')} must be one of {', '.join(CODECS)}, got {self.codec!r}")
        if not isinstance(self.decode, bool):
            raise TypeError(f"{names('decode')} must be True or False, not {self.decode!r}")
        return dataclasses.replace(self, gpu_bytes=gpu, host_bytes=host, staging_bytes=staging, budget=budget)

    def _checked_budget(self, names: Callable[[str], str]) -> BudgetSpec:
        """The budget part with its sizes in bytes, its name and directory checked as a node budget's."""
        from directload.budget import NodeBudget

        b = self.budget
        host = check_bytes(names("budget.host_bytes"), b.host_bytes)
        hot = check_bytes(names("budget.shared_hot_bytes"), b.shared_hot_bytes)
        check_int(names("budget.io_depth"), b.io_depth, low=0)
        try:
            NodeBudget(b.name, host_bytes=0)  # the name's own check
        except ValueError as exc:
            raise ValueError(f"{names('budget.name')}: {exc}") from exc
        if b.directory is not None:
            NodeBudget(b.name, host_bytes=0, directory=b.directory)  # the directory's own check
        return dataclasses.replace(b, host_bytes=host, shared_hot_bytes=hot)

    def _check_together(self, budget: BudgetSpec, names: Callable[[str], str]) -> None:
        """The rules of parts that go together: the partitioned table, the packed source, the node budget."""
        source = self.source
        host, hot = int(budget.host_bytes), int(budget.shared_hot_bytes)
        if self.partition is not None and (self.packed or host or hot):
            raise ValueError(f"{names('partition')} splits the rows among the ranks: it takes neither "
                             f"{names('packed')}, {names('budget.host_bytes')} nor {names('budget.shared_hot_bytes')}")
        if self.packed and isinstance(source, (torch.Tensor, EncodedTable)):
            raise ValueError(f"{names('packed')} reads a packed disk store: the source must be its path or store")
        if hot and source is not None and not isinstance(source, (str, os.PathLike)):
            raise ValueError(f"{names('budget.shared_hot_bytes')} maps the packed file's first rows: the source "
                             "must be its path")
        if (host or budget.io_depth) and not self.tiers:
            raise ValueError(f"{names('budget.host_bytes')} shares the host caches and disk queues of directload's "
                             f"tiered stores: it needs {names('tiers')}")
        if budget.io_depth and not host:
            raise ValueError(f"{names('budget.io_depth')} is shared within a node budget: give "
                             f"{names('budget.host_bytes')} too")
        if hot and not (self.packed and self.tiers):
            raise ValueError(f"{names('budget.shared_hot_bytes')} keeps the packed store's hottest rows once per "
                             f"node: it needs {names('packed')} and {names('tiers')}")
        if hot and host and hot >= host:
            raise ValueError(f"{names('budget.shared_hot_bytes')} is taken out of {names('budget.host_bytes')}: it "
                             "must be smaller")

    # ------------------------------------------------------------ plain data
    def to_dict(self) -> dict[str, Any]:
        """This spec as JSON's types: every field, a path source as a string, each part as its own dict
        (:meth:`from_dict` reads it back).  ``TypeError`` for a source or policy that is an object (a tensor,
        a store, a policy instance): those are not data.

        Examples
        --------
        >>> StoreSpec("feat.npy", host_bytes="1G", partition=PartitionSpec()).to_dict()["partition"]
        {'timeout': 60.0}
        """
        source = self.source
        if source is not None and not isinstance(source, (str, os.PathLike)):
            raise TypeError(f"a spec over a {type(source).__name__} is not data: only a path source is written down")
        if not isinstance(self.policy, str):
            raise TypeError(f"a spec with a {type(self.policy).__name__} policy is not data: name the policy")
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in _PARTS:
                value = None if value is None else value.to_dict()
            elif f.name == "source" and value is not None:
                value = os.fspath(value)
            elif f.name == "device" and value is not None:
                value = str(value)
            out[f.name] = value
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> StoreSpec:
        """The spec :meth:`to_dict` wrote (each part as a dict; a part left out keeps its default);
        ``TypeError`` for a key that is no field.  Unchecked: call :meth:`check`.

        Examples
        --------
        >>> StoreSpec.from_dict({"source": "feat.npy", "budget": {"host_bytes": 1024}}).budget
        BudgetSpec(host_bytes=1024, io_depth=0, name='directload', shared_hot_bytes=0, hot_key=None, directory=None)
        """
        if not isinstance(data, Mapping):
            raise TypeError(f"a StoreSpec is read from a mapping, not {type(data).__name__}")
        _unknown(cls, data)
        values = dict(data)
        for name, part in _PARTS.items():
            if isinstance(values.get(name), Mapping):
                values[name] = part.from_dict(values[name])
        return cls(**values)

    # -------------------------------------------------------------- estimate
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
        elif isinstance(spec.source, EncodedTable) and spec.source.codes.device.type == "cpu":
            parts["table"] = spec.source.nbytes
        elif isinstance(spec.source, (str, os.PathLike)):
            disk = DiskStore.bytes_for(n, rnb, batch_rows=batch, renumbered=spec.packed,
                                       **{k: v for k, v in spec.disk.kwargs().items() if k == "staging_bytes"})
            parts["read buffers"] += disk["staging"]
            parts["bookkeeping"] += disk["bookkeeping"]
        if spec.tiers:
            host, room = int(spec.host_bytes), None
            if spec.budget.host_bytes:
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
        hot_bytes = int(spec.budget.shared_hot_bytes)
        if hot_bytes:
            hot = min(hot_bytes // max(rnb, 1), n)
            parts["shared hot rows"] += hot * rnb
            parts["bookkeeping"] += 8 * (n + hot)
        if spec.partition is not None:
            parts["read buffers"] += 2 * batch * rnb  # a round's rows sent and received
        return {name: nbytes for name, nbytes in parts.items() if nbytes}


# ---------------------------------------------------------------- the keywords of the flat spec before
class DeprecatedKeywordWarning(DirectloadWarning, DeprecationWarning):
    """A :class:`StoreSpec` keyword of the flat spec before its parts had their own classes: it still works, and
    the warning names the part that holds it now.

    Examples
    --------
    >>> import warnings
    >>> with warnings.catch_warnings():
    ...     warnings.simplefilter("ignore", DeprecatedKeywordWarning)
    ...     StoreSpec("feat.npy", budget_bytes="1G", disk_options={"queue_depth": 8}).budget.host_bytes
    '1G'
    """


#: The flat spec's keywords -> the part that holds each now, as the warning spells it.
_FLAT = {"budget_bytes": ("budget", "BudgetSpec(host_bytes=...)"),
         "shared_hot_bytes": ("budget", "BudgetSpec(shared_hot_bytes=...)"),
         "shared_key": ("budget", "BudgetSpec(hot_key=...)"), "disk_options": ("disk", "DiskOptions(...)"),
         "partitioned": ("partition", "PartitionSpec()")}


def _from_flat(kw: dict[str, Any], flat: dict[str, Any]) -> dict[str, Any]:
    """``kw`` with the flat spec's keywords ``flat`` moved into the parts that hold them now."""
    import warnings

    both = sorted(old for old in flat if _FLAT[old][0] in kw)
    if both:
        raise TypeError(f"StoreSpec got {', '.join(f'{old}=' for old in both)} (the flat spec's) and "
                        f"{_FLAT[both[0]][0]}=: give {_FLAT[both[0]][0]}= alone")
    budget = {{"budget_bytes": "host_bytes", "shared_key": "hot_key"}.get(k, k): v for k, v in flat.items()
              if _FLAT[k][0] == "budget"}
    if budget:
        kw["budget"] = BudgetSpec(**budget)
    if "disk_options" in flat:
        kw["disk"] = DiskOptions.from_dict(flat["disk_options"])
    if flat.get("partitioned"):
        kw["partition"] = PartitionSpec()
    said = ", ".join(f"{old}= is {_FLAT[old][0]}={_FLAT[old][1]}" for old in flat)
    warnings.warn(f"StoreSpec's flat keywords are parts of their own now: {said}", DeprecatedKeywordWarning,
                  stacklevel=3)
    return kw


_made_init = StoreSpec.__init__


def _init(self: StoreSpec, *args: Any, **kw: Any) -> None:
    flat = {k: kw.pop(k) for k in list(kw) if k in _FLAT}
    _made_init(self, *args, **(_from_flat(kw, flat) if flat else kw))


_init.__doc__, _init.__wrapped__ = _made_init.__doc__, _made_init  # type: ignore[attr-defined]
StoreSpec.__init__ = _init  # type: ignore[method-assign]  # the flat keywords of the spec before, still taken
