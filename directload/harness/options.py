"""A training run's options and their one check, shared by TrainConfig and ``directload train``.

:func:`check_options` holds every rule; :class:`~directload.harness.train.TrainConfig` checks its fields with
it, and the command line its flags before any work, each message naming the option as its caller spells it
(:class:`Names`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from .train_inputs import FEATURE_MODES, spec_of

if TYPE_CHECKING:
    from .train_inputs import RunConfig

__all__ = ["check_options", "Names", "FIELDS", "resolve_depth", "DEFAULT_FANOUTS", "SAMPLERS"]

#: Neighbours sampled per layer, outermost first (DGL's ogbn-products examples).
DEFAULT_FANOUTS = (15, 10, 5)
#: ``"directload"``: directload's sampler (:mod:`directload.sampler`; the framework's distribution, not its
#: batches); ``"framework"``: the framework's own, the same batches bit for bit.
SAMPLERS = ("directload", "framework")


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
    """How a message names an option: by its field of TrainConfig, or by the flag that sets it.

    ``flags`` maps a field to its flag; a field without one is named as it is.  ``ours`` says how to ask
    for directload's loader among those run, ``ranks`` how to ask for a job of several ranks.

    Examples
    --------
    >>> FIELDS.opt("node_budget"), FIELDS.eq("features", "disk", "tiered"), FIELDS.eq("packed", True)
    ('node_budget', "features='disk' or 'tiered'", 'packed=True')
    >>> cli = Names({"features": "--features", "packed": "--packed"})
    >>> cli.opt("node_budget"), cli.eq("features", "disk", "tiered"), cli.eq("packed", True)
    ('node_budget', '--features disk or tiered', '--packed')
    """

    def __init__(self, flags: Mapping[str, str] | None = None, *, ours: str = "loader='directload'",
                 ranks: str = "nproc >= 2") -> None:
        self.flags = dict(flags or {})
        self.ours = ours
        self.ranks = ranks

    def opt(self, name: str) -> str:
        """The option ``name`` (a field of TrainConfig) in a message."""
        return self.flags.get(name, name)

    def eq(self, name: str, *values: object) -> str:
        """Option ``name`` set to one of ``values``: ``features='disk'``, or ``--features disk`` (a switch's
        ``True``: the flag alone)."""
        if name not in self.flags:
            return f"{name}=" + " or ".join(map(repr, values))
        if values == (True,):
            return self.flags[name]
        return f"{self.flags[name]} " + " or ".join(map(str, values))


#: TrainConfig's own names: ``node_budget``, ``features='tiered'``.
FIELDS = Names()


def check_options(o: RunConfig, *, frameworks: Sequence[str], models: Sequence[str] | None = None,
                  loaders: Sequence[str] | None = None, names: Names = FIELDS) -> dict[str, Any]:
    """Refuse a training run's bad options before any work: ``ValueError`` naming each as ``names`` spells it.

    ``o`` has :class:`~directload.harness.train.TrainConfig`'s fields (a config, or the command line's
    options over the config's defaults); ``models`` and ``loaders`` are the runs they are for (default
    ``o.model`` and ``o.loader`` alone; the command line's ``both`` runs two of each);
    ``frameworks`` the names a framework may have (:data:`~directload.harness.train.SIDES`).  Reads no file
    and changes nothing.  Returns what it settles: ``layers``, ``fanouts`` (:func:`resolve_depth`) and the
    ``sampler`` (by default directload's in directload's loader, else the framework's).

    Examples
    --------
    >>> from types import SimpleNamespace
    >>> from directload.harness.train import TrainConfig
    >>> check_options(TrainConfig(), frameworks=("dgl", "pyg"))
    {'layers': 3, 'fanouts': (15, 10, 5), 'sampler': 'directload'}
    >>> check_options(SimpleNamespace(**{**vars(TrainConfig()), "node_io_depth": 8}), frameworks=("dgl",))
    Traceback (most recent call last):
    ...
    ValueError: node_budget shares the host caches and disk queues of directload's tiered stores: it needs ...
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
    for name in ("num_workers", "node_budget", "node_io_depth", "shared_hot"):
        check_int(opt(name), getattr(o, name), low=0)
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
    _check_together(o, loaders, names)
    _check_store(o, names)
    return {"layers": layers, "fanouts": fanouts, "sampler": sampler}


def _check_together(o, loaders, names):
    """The rules of options that go together: the partitioned table, the packed store, the node budget."""
    opt, eq = names.opt, names.eq
    if o.partitioned and (loaders != ("directload",) or o.packed or o.node_budget):
        raise ValueError(f"{opt('partitioned')} splits the rows among the ranks of directload's loader: it needs "
                         f"{eq('loader', 'directload')}, and neither {opt('packed')} nor {opt('node_budget')}")
    if o.partitioned and o.nproc < 2:
        raise ValueError(f"{opt('partitioned')} splits the rows among the ranks of a DDP job: give {names.ranks}")
    if o.packed and (o.features == "memory" or "directload" not in loaders):
        raise ValueError(f"{opt('packed')} reads the packed disk store with directload's loader: it needs "
                         f"{eq('features', 'disk', 'tiered')} and {names.ours}")
    if (o.node_budget or o.node_io_depth) and (o.features != "tiered" or "directload" not in loaders):
        raise ValueError(f"{opt('node_budget')} shares the host caches and disk queues of directload's tiered "
                         f"stores: it needs {eq('features', 'tiered')} and {names.ours}")
    if o.node_io_depth and not o.node_budget:
        raise ValueError(f"{opt('node_io_depth')} is shared within a node budget: give {opt('node_budget')} too")
    if o.shared_hot and not (o.packed and o.features == "tiered"):
        raise ValueError(f"{opt('shared_hot')} keeps the packed store's hottest rows once per node: it needs "
                         f"{eq('packed', True)} and {eq('features', 'tiered')}")
    from directload.budget import NodeBudget

    NodeBudget(o.budget_name, host_bytes=0)  # the name's own check


#: The option behind each field of the run's :class:`~directload.stores.StoreSpec`.
STORE_OPTIONS = {"gpu_bytes": "gpu_cache", "host_bytes": "host_cache", "staging_bytes": "staging",
                 "shared_hot_bytes": "shared_hot", "budget_bytes": "node_budget", "source": "dataset"}


def _check_store(o: Any, names: Names) -> None:
    """The store's own rules, by the one check every store spec goes through
    (:meth:`~directload.stores.StoreSpec.check`: sizes, policy, hot rows within the budget), its fields named
    as the options that set them.  The run's spec itself is :func:`~directload.harness.train_inputs.store_spec`
    (it needs the dataset); this one stands in for its source."""
    def spell(field: str) -> str:
        if field == "tiers":
            return names.eq("features", "tiered")
        return names.opt(STORE_OPTIONS.get(field, field))

    spec_of(o, "node-feat.npy").check(spell)
