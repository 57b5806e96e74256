"""A training run's options, each in one home, and their one check, shared by TrainConfig and ``directload train``.

:class:`RunOptions` declares every option once: its type, its default and, in the field's metadata, the
command line's :class:`~directload.harness.flags.Flag` (name, help, parse).  The store's options are the
fields of the run's :class:`~directload.stores.StoreSpec` (``store``); :data:`STORE_FLAGS` is their command
line.  The parser adds the flags from :data:`OPTIONS`, :func:`options_of` turns parsed flags into options and
:func:`argv_of` options back into flags.  :func:`check_options` holds every rule of a run;
:class:`~directload.harness.train.TrainConfig` checks its fields with it, and the command line its flags
before any work, each message naming the option as its caller spells it (:class:`Names`); the store's own
rules are the spec's (:meth:`~directload.stores.StoreSpec.check`), named the same way.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import MISSING, dataclass, field, fields, replace
from typing import Any

from directload.codecs import CODECS
from directload.stores import PartitionSpec, StoreSpec
from directload.stores.policies import POLICY_NAMES

from .flags import Flag, lookahead_arg, non_negative_int, positive_float, positive_int, size_arg

__all__ = ["RunOptions", "check_options", "Names", "FIELDS", "resolve_depth", "DEFAULT_FANOUTS", "SAMPLERS",
           "FEATURE_MODES", "STORE_FLAGS", "OPTIONS", "options_of", "argv_of", "defaults", "value_at"]

#: Neighbours sampled per layer, outermost first (DGL's ogbn-products examples).
DEFAULT_FANOUTS = (15, 10, 5)
#: ``"directload"``: directload's sampler (:mod:`directload.sampler`; the framework's distribution, not its
#: batches); ``"framework"``: the framework's own, the same batches bit for bit.
SAMPLERS = ("directload", "framework")
#: Where directload's loader reads features: the dataset's table, its disk store, or tiers over the disk.
FEATURE_MODES = ("memory", "disk", "tiered")


def _option(default: Any = MISSING, flag: Flag | None = None, *, factory: Callable[[], Any] | None = None) -> Any:
    """A field of :class:`RunOptions`: its default and the flag that sets it (none: no flag does)."""
    meta = {"flag": flag} if flag is not None else {}
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


#: The command line of the store's options, by their path in the run's :class:`~directload.stores.StoreSpec`:
#: the spec's one mapping onto flags.  The spec's ``tiers`` has none: it follows ``--features tiered``.
STORE_FLAGS: dict[str, Flag] = {
    "gpu_bytes": Flag("--gpu-cache", "bytes of the GPU cache with --features tiered, e.g. 512M (a host buffer where "
                                     "CUDA does not run)", type=size_arg),
    "host_bytes": Flag("--host-cache", "bytes of the host cache with --features tiered, e.g. 1G", type=size_arg),
    "staging_bytes": Flag("--staging", "bytes of the host tier's read-ahead slots with --features tiered (default: a "
                                       "quarter of --host-cache, at least 64M)", type=size_arg),
    "policy": Flag("--policy", "the caches' policy with --features tiered", choices=POLICY_NAMES),
    "packed": Flag("--packed", "with --features disk or tiered: read the dataset's packed disk store (hot rows first, "
                               "written by `directload dataset pack`), and with tiered fill the caches with its hot "
                               "rows before the first epoch, in long sequential reads", switch=True),
    "budget.host_bytes": Flag(
        "--node-budget", "with --features tiered: host memory (host caches and their read-ahead slots) that every "
                         "directload job on this node running with the same --budget-name shares, e.g. 4G; each "
                         "job's cache grows and shrinks to its fair share (up to --host-cache, default the table) as "
                         "jobs come and go", type=size_arg),
    "budget.io_depth": Flag("--node-io-depth", "with --node-budget: disk reads in flight shared by those jobs (0: each "
                                               "job its own)", type=non_negative_int),
    "budget.name": Flag("--budget-name", "the node budget's name: jobs giving the same name share one budget"),
    "budget.shared_hot_bytes": Flag(
        "--shared-hot", "with --packed and --features tiered: bytes of the packed store's hottest rows kept once per "
                        "node in shared memory for every job of the same --budget-name (taken out of --node-budget "
                        "first); each job's own cache then holds only the rest", type=size_arg),
    "codec": Flag("--codec", "directload's loader carries the feature rows compressed through every tier and decodes "
                             "them as it gathers: float16 or bfloat16 (2 bytes a feature) or int8 (a byte a feature "
                             "and 8 per row: 108 B for 100 features against 400); with --features memory the table is "
                             "encoded in memory as the run starts, with disk or tiered the run reads the dataset's "
                             "disk store of codes (written on first use)", choices=tuple(CODECS)),
    "partition": Flag("--partition-features", "with --nproc N (or under torchrun): each rank holds 1/N of the feature "
                                              "rows (in memory, on disk, or tiered) and fetches the others from their "
                                              "owners by all-to-all over torch.distributed, as ranks on different "
                                              "machines would", switch=True,
                      to_option=lambda on: PartitionSpec() if on else None,
                      from_option=lambda part: part is not None),
}


@dataclass
class RunOptions:
    """A training run's options, as given (unchecked): :class:`~directload.harness.train.TrainConfig` is one
    checked when made, and the command line's options over several runs are checked with
    :func:`check_options`.  Each field's metadata holds the flag that sets it, if any (:data:`OPTIONS`).

    ``store`` is the run's :class:`~directload.stores.StoreSpec` without its source (the run reads its
    dataset's features): its caches, policy, packed copy, node budget and partitioning.  Its ``tiers`` follow
    ``features="tiered"`` (the check settles them) and its device is the run's ``device``.
    """

    model: str = "sage"
    loader: str = "directload"
    framework: str = _option("dgl", Flag("--framework", "DGL (blocks, DGL's DataLoader) or PyG (NeighborLoader, PyG's "
                                                        "convolutions); the default is whichever is installed, DGL "
                                                        "first"))
    hidden: int = _option(128, Flag("--hidden", "hidden units per layer (GAT: over 4 heads)", type=positive_int))
    layers: int = _option(3, Flag("--layers", "GNN layers (default 3, or one per --fanouts entry)", type=positive_int,
                                  default=None))
    fanouts: tuple[int, ...] = _option(DEFAULT_FANOUTS, Flag(
        "--fanouts", "neighbours sampled per layer, one per layer (default 15 10 5, as DGL's examples)", type=int,
        nargs="+", default=None, to_option=lambda given: None if given is None else tuple(given)))
    heads: int = 4
    dropout: float = 0.5
    lr: float = _option(3e-3, Flag("--lr", "Adam learning rate", type=positive_float))
    batch_size: int = _option(1024, Flag("--batch-size", "seed nodes per mini-batch", type=positive_int))
    eval_batch_size: int = _option(4096, Flag(
        "--eval-batch-size", "seed nodes per evaluation mini-batch (a small host wants fewer: each batch's input rows "
                             "are gathered at once)", type=positive_int))
    epochs: int = _option(2, Flag("--epochs", "epochs per run; the report leaves the first out when there are more",
                                  type=positive_int, default=3))
    seed: int = 0
    device: str = "cpu"
    num_workers: int = _option(0, Flag("--num-workers", "DGL sampling worker processes", type=non_negative_int))
    lookahead: int | str = _option(4, Flag(  # or "auto"
        "--lookahead", "batches directload's loader samples (and announces to the stores) ahead, or auto: each "
                       "epoch's from the last one's stage times", type=lookahead_arg))
    features: str = _option("memory", Flag(
        "--features", "memory: the memory-mapped feature table; disk: directload's loader reads the dataset's disk "
                      "store (io_uring, O_DIRECT; written on first use) while the framework's loader reads the "
                      "memory-mapped .npy; tiered: directload reads through a GPU cache and a host cache (--gpu-cache, "
                      "--host-cache) in front of that disk store", choices=FEATURE_MODES))
    eval_nodes: int = _option(0, Flag("--eval-nodes", "evaluate on this many nodes of each split, the same for every "
                                                      "run (0: all)", type=non_negative_int))
    store: StoreSpec = _option(factory=StoreSpec)  # the store's options: their flags are STORE_FLAGS
    nproc: int = _option(1, Flag(  # ranks of the DDP job (torchrun's) this process trains in; 1 outside one
        "--nproc", "DDP ranks on this node, one process each, started through torchrun's launcher (gloo on the CPU, "
                   "NCCL with one GPU per rank); each rank trains on its share of the seeds, split as the framework "
                   "does, and rank 0 writes the report with every rank's epochs.  At most what the node can run, "
                   "refused before any work: 4 ranks per usable CPU core (on GPUs one per GPU), 512 MiB of available "
                   "memory per rank, and 256.  Under torchrun leave it out: torchrun's --nproc-per-node starts the "
                   "ranks", type=positive_int))
    # "directload" (ours: the same distribution) or "framework"; None: ours in directload's loader
    sampler: str | None = _option(None, Flag(
        "--sampler", "directload's loader samples with directload's sampler (the framework's distribution, uniform "
                     "without replacement, not its batches; the same on any thread count) or the framework's own (its "
                     "batches, bit for bit); the framework's loader always uses its own", choices=SAMPLERS,
        default="directload"))

    def to_dict(self) -> dict[str, Any]:
        """Every option as JSON's types (the store as its spec's :meth:`~directload.stores.StoreSpec.to_dict`):
        what a run's report records."""
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["store"] = self.store.to_dict()
        out["fanouts"] = list(self.fanouts) if self.fanouts is not None else None
        return out


def _flags() -> dict[str, Flag]:
    """Every option a flag sets, by its path in :class:`RunOptions` (``store.`` and the spec's path for the
    store's), in the order of the fields."""
    out: dict[str, Flag] = {}
    for f in fields(RunOptions):
        if f.name == "store":
            out.update({f"store.{path}": flag for path, flag in STORE_FLAGS.items()})
        elif "flag" in f.metadata:
            out[f.name] = f.metadata["flag"]
    return out


#: Every option the command line sets, by its path in :class:`RunOptions`: its :class:`Flag`.
OPTIONS: dict[str, Flag] = _flags()


def defaults() -> dict[str, Any]:
    """Each field of :class:`RunOptions` at its default (a new store spec)."""
    return dict(vars(RunOptions()))


def value_at(options: Any, path: str) -> Any:
    """The value at ``path`` of ``options`` (a :class:`RunOptions`, or its store spec).

    Examples
    --------
    >>> value_at(RunOptions(), "store.budget.name"), value_at(StoreSpec(), "host_bytes")
    ('directload', 0)
    """
    value = options
    for part in path.split("."):
        value = getattr(value, part)
    return value


def _store_of(values: Mapping[str, Any]) -> StoreSpec:
    """A store spec with ``values`` (by their path in it) over the defaults."""
    nested: dict[str, Any] = {}
    for path, value in values.items():
        *parts, leaf = path.split(".")
        at = nested
        for part in parts:
            at = at.setdefault(part, {})
        at[leaf] = value
    return StoreSpec.from_dict(nested)


def options_of(args: argparse.Namespace) -> dict[str, Any]:
    """The options the parsed flags ``args`` set, as :class:`RunOptions`' keyword arguments (the store's as
    one spec): every flag of :data:`OPTIONS` that ``args`` has (a command without ``--partition-features``
    leaves the store unpartitioned).  The one mapping from flags to options; :func:`argv_of` goes back.

    Examples
    --------
    >>> from argparse import Namespace
    >>> got = options_of(Namespace(host_cache=1024, node_budget=4096, epochs=2))
    >>> got["epochs"], got["store"].host_bytes, got["store"].budget.host_bytes
    (2, 1024, 4096)
    """
    options: dict[str, Any] = {}
    store: dict[str, Any] = {}
    for path, flag in OPTIONS.items():
        if not hasattr(args, flag.dest):
            continue
        value = flag.to_option(getattr(args, flag.dest))
        if path.startswith("store."):
            store[path.removeprefix("store.")] = value
        else:
            options[path] = value
    return {**options, "store": _store_of(store)}


def argv_of(options: RunOptions) -> list[str]:
    """The flags that give ``options`` on the command line: every option a flag sets, at its value (a switch
    only when on; an option of None left to the command line's default).  :func:`options_of` of them parsed
    gives ``options`` back.

    Examples
    --------
    >>> from directload.stores import BudgetSpec
    >>> argv = argv_of(RunOptions(store=StoreSpec(host_bytes=1024, budget=BudgetSpec(host_bytes=4096))))
    >>> argv[argv.index("--host-cache"):][:2], argv[argv.index("--node-budget"):][:2], "--packed" in argv
    (['--host-cache', '1024'], ['--node-budget', '4096'], False)
    """
    return [arg for path, flag in OPTIONS.items() for arg in flag.argv(value_at(options, path))]


def resolve_depth(layers: int | None = None, fanouts: Iterable[int] | None = None) -> tuple[int, tuple[int, ...]]:
    """``(layers, fanouts)`` from what was given: one fanout per layer.  Pure.

    With neither, DGL's 3 layers of 15/10/5; with one, the other follows (extra
    layers repeat the last default fanout); with both, they must agree, since a
    model deeper than its blocks silently drops layers.

    Examples
    --------
    >>> resolve_depth(), resolve_depth(2), resolve_depth(fanouts=[10, 10]), resolve_depth(4)
    ((3, (15, 10, 5)), (2, (15, 10)), (2, (10, 10)), (4, (15, 10, 5, 5)))
    """
    if fanouts is not None:
        fanouts = tuple(int(f) for f in fanouts)
        if not fanouts:
            raise ValueError("fanouts needs one entry per layer, got none")
        if any(f < 1 and f != -1 for f in fanouts):
            raise ValueError(f"each fanout must be >= 1 (or -1 for all neighbours), got {list(fanouts)}")
        if layers is not None and layers != len(fanouts):
            raise ValueError(f"{layers} layers but {len(fanouts)} fanouts ({' '.join(map(str, fanouts))}): "
                             "give one fanout per layer")
        return len(fanouts), fanouts
    if layers is None:
        return len(DEFAULT_FANOUTS), DEFAULT_FANOUTS
    if layers < 1:
        raise ValueError(f"layers must be >= 1, got {layers}")
    return layers, (DEFAULT_FANOUTS + (DEFAULT_FANOUTS[-1],) * layers)[:layers]


class Names:
    """How a message names an option: by its path in :class:`RunOptions` (``store.budget.host_bytes``), or by
    the flag that sets it.

    ``flags`` maps a path to its flag; a path without one is named as it is.  ``ours`` says how to ask
    for directload's loader among those run, ``ranks`` how to ask for a job of several ranks.

    Examples
    --------
    >>> FIELDS.opt("store.budget.host_bytes"), FIELDS.eq("features", "disk", "tiered"), FIELDS.eq("store.packed", True)
    ('store.budget.host_bytes', "features='disk' or 'tiered'", 'store.packed=True')
    >>> cli = Names({"features": "--features", "store.packed": "--packed"})
    >>> cli.opt("store.budget.host_bytes"), cli.eq("features", "disk", "tiered"), cli.eq("store.packed", True)
    ('store.budget.host_bytes', '--features disk or tiered', '--packed')
    """

    def __init__(self, flags: Mapping[str, str] | None = None, *, ours: str = "loader='directload'",
                 ranks: str = "nproc >= 2") -> None:
        self.flags = dict(flags or {})
        self.ours = ours
        self.ranks = ranks

    def opt(self, name: str) -> str:
        """The option ``name`` (its path in RunOptions) in a message."""
        return self.flags.get(name, name)

    def eq(self, name: str, *values: object) -> str:
        """Option ``name`` set to one of ``values``: ``features='disk'``, or ``--features disk`` (a switch's
        ``True``: the flag alone)."""
        if name not in self.flags:
            return f"{name}=" + " or ".join(map(repr, values))
        if values == (True,):
            return self.flags[name]
        return f"{self.flags[name]} " + " or ".join(map(str, values))

    def store(self, spec: StoreSpec) -> Callable[[str], str]:
        """How the store spec's check names its fields for a run: each by its option (a switch as set), and
        ``tiers`` by what makes a run's stack tiered (``features='tiered'`` read by directload's loader)."""
        def spell(path: str) -> str:
            if path == "tiers":
                return f"{self.eq('features', 'tiered')} and {self.ours}"
            value = value_at(spec, path) if path in _SPEC_FIELDS else None
            return self.eq(f"store.{path}", True) if isinstance(value, bool) else self.opt(f"store.{path}")

        return spell


_SPEC_FIELDS = {f.name for f in fields(StoreSpec)}

#: RunOptions' own names: ``store.budget.host_bytes``, ``features='tiered'``.
FIELDS = Names()


def check_options(o: RunOptions, *, frameworks: Sequence[str], models: Sequence[str] | None = None,
                  loaders: Sequence[str] | None = None, names: Names = FIELDS) -> dict[str, Any]:
    """Refuse a training run's bad options before any work: ``ValueError`` naming each as ``names`` spells it.

    ``o`` is the run's :class:`RunOptions` (a :class:`~directload.harness.train.TrainConfig`, or the command
    line's options over the config's defaults); ``models`` and ``loaders`` are the runs they are for (default
    ``o.model`` and ``o.loader`` alone; the command line's ``both`` runs two of each);
    ``frameworks`` the names a framework may have (:data:`~directload.harness.train.SIDES`).  Reads no file
    and changes nothing.  Returns what it settles: ``layers``, ``fanouts`` (:func:`resolve_depth`), the
    ``sampler`` (by default directload's in directload's loader, else the framework's) and the ``store``
    spec, checked (:meth:`~directload.stores.StoreSpec.check`: sizes in bytes, tiered where ``features`` is
    and directload's loader reads it).

    Examples
    --------
    >>> settled = check_options(RunOptions(), frameworks=("dgl", "pyg"))
    >>> settled["layers"], settled["fanouts"], settled["sampler"], settled["store"].tiers
    (3, (15, 10, 5), 'directload', False)
    >>> from directload.stores import BudgetSpec
    >>> check_options(RunOptions(store=StoreSpec(budget=BudgetSpec(io_depth=8))), frameworks=("dgl",))
    Traceback (most recent call last):
    ...
    ValueError: store.budget.host_bytes shares the host caches and disk queues of directload's tiered stores: ...
    """
    from directload.loaders.pipeline import check_lookahead
    from directload.units import check_int

    opt, eq = names.opt, names.eq
    models = tuple(models or (o.model,))
    loaders = tuple(loaders or (o.loader,))
    for model in models:
        if model not in ("sage", "gat"):
            raise ValueError(f"{opt('model')} must be 'sage' or 'gat', got {model!r}")
    if o.framework not in frameworks:
        raise ValueError(f"{opt('framework')} must be one of {tuple(frameworks)}, got {o.framework!r}")
    for loader in loaders:
        if loader in frameworks and loader != o.framework:
            raise ValueError(f"{opt('loader')} {loader} is {loader}'s own loader, but {opt('framework')} is "
                             f"{o.framework}")
        if loader not in (o.framework, "directload"):
            raise ValueError(f"{opt('loader')} must be {o.framework!r} (the framework's own) or 'directload', "
                             f"got {loader!r}")
    layers, fanouts = resolve_depth(o.layers, o.fanouts)
    sampler = o.sampler
    if sampler is None:
        sampler = "directload" if loaders == ("directload",) else "framework"
    if sampler not in SAMPLERS:
        raise ValueError(f"{opt('sampler')} must be one of {SAMPLERS}, got {sampler!r}")
    check_lookahead(o.lookahead)  # the loaders' own check
    for name in ("hidden", "heads", "batch_size", "eval_batch_size", "epochs", "nproc"):
        check_int(opt(name), getattr(o, name))
    check_int(opt("num_workers"), o.num_workers, low=0)
    if o.features not in FEATURE_MODES:
        raise ValueError(f"{opt('features')} must be one of {FEATURE_MODES}, got {o.features!r}")
    if o.eval_nodes < 0:
        raise ValueError(f"{opt('eval_nodes')} must be >= 0 (0: every node of the split), got {o.eval_nodes}")
    if not o.lr > 0:
        raise ValueError(f"{opt('lr')} must be > 0, got {o.lr}")
    if not 0 <= o.dropout < 1:
        raise ValueError(f"{opt('dropout')} must be in [0, 1), got {o.dropout}")
    if "gat" in models and o.hidden < o.heads:
        raise ValueError(f"GAT splits {eq('hidden', o.hidden)} over {o.heads} heads: {opt('hidden')} must be >= "
                         f"{opt('heads')}")
    store = _check_store(o, loaders, names)
    return {"layers": layers, "fanouts": fanouts, "sampler": sampler, "store": store}


def _check_store(o: RunOptions, loaders: tuple[str, ...], names: Names) -> StoreSpec:
    """The run's store: which loader reads it and where (the run's rules), then the spec's own rules
    (:meth:`~directload.stores.StoreSpec.check`), its fields named as the options that set them."""
    opt, eq = names.opt, names.eq
    spec = o.store
    if not isinstance(spec, StoreSpec):
        raise TypeError(f"{opt('store')} must be a directload.stores.StoreSpec, not {type(spec).__name__}")
    if spec.source is not None or spec.device is not None:
        raise ValueError(f"a run's store reads its dataset's features on the run's device: leave "
                         f"{opt('store.source')} and {opt('store.device')} None (give features=... and device=...)")
    if spec.partition is not None and loaders != ("directload",):
        raise ValueError(f"{opt('store.partition')} splits the rows among the ranks of directload's loader: it "
                         f"needs {eq('loader', 'directload')}")
    if spec.partition is not None and o.nproc < 2:
        raise ValueError(f"{opt('store.partition')} splits the rows among the ranks of a DDP job: give {names.ranks}")
    if spec.codec is not None and "directload" not in loaders:
        raise ValueError(f"{opt('store.codec')} compresses the rows directload's loader reads: it needs {names.ours}")
    if spec.packed and (o.features == "memory" or "directload" not in loaders):
        raise ValueError(f"{opt('store.packed')} reads the packed disk store with directload's loader: it needs "
                         f"{eq('features', 'disk', 'tiered')} and {names.ours}")
    tiered = replace(spec, tiers=o.features == "tiered" and "directload" in loaders)
    return tiered.check(names.store(tiered))
