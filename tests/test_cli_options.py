"""One home per option, one check: ``directload train`` and TrainConfig refuse the same bad options with the same
rule (directload.harness.options.check_options, and the store's own StoreSpec.check), the command line naming
its flags and the config its fields; every flag is one field (the store's: one field of its StoreSpec) and
back, and a run's options are plain data a report records and a config is made from again."""

import json

import pytest

from directload.harness.cli import main
from directload.harness.commands.runs import FLAGS, check_args, train_options
from directload.harness.options import FIELDS, OPTIONS, STORE_FLAGS, RunOptions, argv_of, check_options, options_of
from directload.harness.parser import build_parser
from directload.harness.train import SIDES, TrainConfig
from directload.stores import BudgetSpec, PartitionSpec, StoreSpec

M = 1 << 20


def store(**fields):
    """A run's store spec: the budget's fields given as ``budget_<field>``."""
    budget = {k.removeprefix("budget_"): fields.pop(k) for k in list(fields) if k.startswith("budget_")}
    return StoreSpec(**fields, budget=BudgetSpec(**budget))


# (the command line's flags, TrainConfig's fields, what the command line says, what the config says)
SAME_RULE = [
    (["--features", "tiered", "--node-io-depth", "4"], dict(features="tiered", store=store(budget_io_depth=4)),
     "--node-io-depth is shared within a node budget: give --node-budget too",
     "store.budget.io_depth is shared within a node budget: give store.budget.host_bytes too"),
    (["--node-budget", "1M"], dict(store=store(budget_host_bytes=M)),
     "--node-budget shares the host caches and disk queues of directload's tiered stores: it needs --features "
     "tiered and --loader directload (or both)",
     "store.budget.host_bytes shares the host caches and disk queues of directload's tiered stores: it needs "
     "features='tiered' and loader='directload'"),
    (["--packed"], dict(store=store(packed=True)),
     "--packed reads the packed disk store with directload's loader: it needs --features disk or tiered and "
     "--loader directload (or both)",
     "store.packed reads the packed disk store with directload's loader: it needs features='disk' or 'tiered' and "
     "loader='directload'"),
    (["--features", "tiered", "--shared-hot", "1M"], dict(features="tiered", store=store(budget_shared_hot_bytes=M)),
     "--shared-hot keeps the packed store's hottest rows once per node: it needs --packed and --features tiered "
     "and --loader directload (or both)",
     "store.budget.shared_hot_bytes keeps the packed store's hottest rows once per node: it needs "
     "store.packed=True and features='tiered' and loader='directload'"),
    (["--features", "tiered", "--packed", "--node-budget", "1M", "--shared-hot", "1M"],
     dict(features="tiered", store=store(packed=True, budget_host_bytes=M, budget_shared_hot_bytes=M)),
     "--shared-hot is taken out of --node-budget: it must be smaller",
     "store.budget.shared_hot_bytes is taken out of store.budget.host_bytes: it must be smaller"),
    (["--loader", "directload", "--partition-features"], dict(store=StoreSpec(partition=PartitionSpec())),
     "--partition-features splits the rows among the ranks of a DDP job: give --nproc N (N >= 2) or start the "
     "ranks with torchrun",
     "store.partition splits the rows among the ranks of a DDP job: give nproc >= 2"),
    (["--nproc", "2", "--partition-features"], dict(nproc=2, loader="dgl", store=StoreSpec(partition=PartitionSpec())),
     "--partition-features splits the rows among the ranks of directload's loader: it needs --loader directload",
     "store.partition splits the rows among the ranks of directload's loader: it needs loader='directload'"),
    (["--loader", "directload", "--nproc", "2", "--packed", "--features", "disk", "--partition-features"],
     dict(nproc=2, features="disk", store=StoreSpec(packed=True, partition=PartitionSpec())),
     "--partition-features splits the rows among the ranks: it takes neither --packed, --node-budget nor "
     "--shared-hot",
     "store.partition splits the rows among the ranks: it takes neither store.packed=True, store.budget.host_bytes "
     "nor store.budget.shared_hot_bytes"),
    (["--features", "tiered", "--budget-name", "a b"], dict(features="tiered", store=store(budget_name="a b")),
     "--budget-name: a budget's name is letters, digits and _ . - (at most 100), not 'a b'",
     "store.budget.name: a budget's name is letters, digits and _ . - (at most 100), not 'a b'"),
    (["--model", "gat", "--hidden", "2"], dict(model="gat", hidden=2),
     "GAT splits --hidden 2 over 4 heads: --hidden must be >= heads",
     "GAT splits hidden=2 over 4 heads: hidden must be >= heads"),
]


@pytest.mark.parametrize("argv, config, says, config_says", SAME_RULE, ids=[" ".join(c[0]) for c in SAME_RULE])
def test_the_command_line_and_the_config_refuse_the_same_options(tmp_path, capsys, monkeypatch, argv, config,
                                                                 says, config_says):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert main(["train", "--root", str(tmp_path / "data"), "--out", str(tmp_path / "out"), "--no-progress",
                 *argv]) == 1
    assert capsys.readouterr().err == f"directload: error: {says}\n"
    assert not list(tmp_path.iterdir())  # refused before any work
    with pytest.raises(ValueError) as exc:
        TrainConfig(**config)
    assert str(exc.value) == config_says


def test_check_options_is_one_rule_spelled_two_ways():
    bad = RunOptions(features="tiered", store=store(budget_io_depth=4))
    for names, says in ((FIELDS, "store.budget.io_depth is shared within a node budget: give store.budget.host_bytes "
                                 "too"),
                        (FLAGS, "--node-io-depth is shared within a node budget: give --node-budget too")):
        with pytest.raises(ValueError, match=f"^{says}$"):
            check_options(bad, frameworks=("dgl", "pyg"), names=names)
    # the command line's "both": directload's loader is among those run, and the framework's loader is checked too
    both = dict(frameworks=("dgl", "pyg"), models=("sage", "gat"), loaders=("dgl", "directload"))
    settled = check_options(RunOptions(features="disk", store=StoreSpec(packed=True), sampler="directload"), **both)
    assert (settled["layers"], settled["fanouts"], settled["sampler"]) == (3, (15, 10, 5), "directload")
    assert settled["store"] == StoreSpec(packed=True, tiers=False, gpu_bytes=0, host_bytes=0)
    with pytest.raises(ValueError, match="own loader"):
        check_options(RunOptions(), frameworks=("dgl", "pyg"), loaders=("pyg", "directload"))
    settled = check_options(RunOptions(layers=None, fanouts=[5, 5], loader="dgl", sampler=None), frameworks=("dgl",))
    assert (settled["layers"], settled["fanouts"], settled["sampler"]) == (2, (5, 5), "framework")


def test_a_config_holds_its_store_checked_and_tiered_as_the_run_reads_it():
    cfg = TrainConfig(features="tiered", store=StoreSpec(host_bytes="1M", budget=BudgetSpec(shared_hot_bytes="0")))
    assert cfg.store.host_bytes == M and cfg.store.tiers and cfg.store.budget.shared_hot_bytes == 0
    assert not TrainConfig(features="disk").store.tiers
    assert not TrainConfig(features="tiered", loader="dgl").store.tiers  # the framework's loader reads no stack
    for given in (StoreSpec("feat.npy"), StoreSpec(device="cuda")):
        with pytest.raises(ValueError, match="leave store.source and store.device None"):
            TrainConfig(store=given)
    with pytest.raises(TypeError, match="store must be a directload.stores.StoreSpec, not int"):
        TrainConfig(store=3)


def test_a_config_round_trips_through_its_report(tmp_path):
    cfg = TrainConfig(features="tiered", layers=2, fanouts=(4, 4), store=StoreSpec(
        gpu_bytes="1K", host_bytes="1M", staging_bytes=0, policy="sieve", packed=True,
        budget=BudgetSpec(host_bytes="8M", io_depth=16, name="node", shared_hot_bytes="1M")))
    data = json.loads(json.dumps(cfg.to_dict()))  # what the run's report records
    assert data["store"]["budget"] == {"host_bytes": 8 * M, "io_depth": 16, "name": "node", "shared_hot_bytes": M,
                                       "hot_key": None, "directory": None}
    assert TrainConfig(**data) == cfg
    framework = cfg.run_of("dgl", seed=3)  # a framework's own loader: no directload store, its own sampler
    assert (framework.loader, framework.seed, framework.sampler, framework.store.packed) == ("dgl", 3, "framework",
                                                                                           False)
    assert cfg.run_of("directload", model="gat").store == cfg.store


def _train_parser():
    return build_parser()._subparsers._group_actions[0].choices["train"]


def test_the_flags_map_onto_the_config_one_to_one(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    flags = {s for a in _train_parser()._actions for s in a.option_strings}
    assert set(FLAGS.flags.values()) <= flags  # every flag a message names is one of train's
    assert len({flag.name for flag in OPTIONS.values()}) == len(OPTIONS)  # one flag per option, no flag twice
    assert {path.removeprefix("store.") for path in OPTIONS if path.startswith("store.")} == set(STORE_FLAGS)
    args = build_parser().parse_args(["train"])
    options = train_options(args)
    assert set(options) <= {f for f in RunOptions.__dataclass_fields__}
    assert options["store"] == StoreSpec()  # the command line's defaults are the spec's own
    assert TrainConfig(**options).nproc == 1  # train's defaults are a valid config
    checked = check_args(args, ["sage"], [args.framework, "directload"])
    assert (checked["layers"], checked["fanouts"]) == (3, (15, 10, 5)) and args.framework in SIDES


# each store flag with a value away from its default, and the one field of the spec it sets
STORE_VALUES = {"--gpu-cache": ("1M", ("gpu_bytes",), M), "--host-cache": ("2M", ("host_bytes",), 2 * M),
                "--staging": ("0", ("staging_bytes",), 0), "--policy": ("sieve", ("policy",), "sieve"),
                "--packed": (None, ("packed",), True), "--node-budget": ("4M", ("budget", "host_bytes"), 4 * M),
                "--node-io-depth": ("8", ("budget", "io_depth"), 8), "--budget-name": ("b", ("budget", "name"), "b"),
                "--shared-hot": ("1M", ("budget", "shared_hot_bytes"), M), "--codec": ("int8", ("codec",), "int8"),
                "--partition-features": (None, ("partition",), PartitionSpec())}


def _at(spec, path):
    for part in path:
        spec = getattr(spec, part)
    return spec


def test_every_store_flag_sets_one_field_of_the_spec_and_maps_back(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert set(STORE_VALUES) == {flag.name for flag in STORE_FLAGS.values()}
    parser = build_parser()
    default = options_of(parser.parse_args(["train"]))
    for flag, (text, field, want) in STORE_VALUES.items():
        argv = ["train", flag] if text is None else ["train", flag, text]
        got = options_of(parser.parse_args(argv))
        assert _at(got["store"], field) == want, flag
        changed = [path for path in STORE_FLAGS if _at(got["store"], path.split(".")) !=
                   _at(default["store"], path.split("."))]
        assert changed == [".".join(field)], flag  # that field and no other
        assert {k: v for k, v in got.items() if k != "store"} == {k: v for k, v in default.items() if k != "store"}
        back = options_of(parser.parse_args(["train", *argv_of(RunOptions(**got))]))
        assert back == got, flag  # and back: the flags of those options give them again


def test_every_option_round_trips_through_its_flags(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    given = RunOptions(framework="dgl", hidden=64, layers=2, fanouts=(4, 3), lr=0.01, batch_size=256,
                       eval_batch_size=512, epochs=5, num_workers=2, lookahead="auto", features="tiered",
                       eval_nodes=100, nproc=2, sampler="framework", store=StoreSpec(
                           gpu_bytes=M, host_bytes=2 * M, staging_bytes=M, policy="clock", packed=True,
                           budget=BudgetSpec(host_bytes=8 * M, io_depth=4, name="n", shared_hot_bytes=M)))
    got = options_of(build_parser().parse_args(["train", *argv_of(given)]))
    assert RunOptions(**{**vars(RunOptions()), **got}) == given


@pytest.mark.parametrize("argv, says", [
    (["--host-cache", "lots"], "argument --host-cache: not a size: 'lots'"),
    (["--node-budget", "-1G"], "argument --node-budget:"),
    (["--node-io-depth", "-1"], "argument --node-io-depth: must be at least 0, got -1"),
    (["--policy", "fifo"], "argument --policy: invalid choice: 'fifo'"),
    (["--staging", "1X"], "argument --staging:"),
])
def test_a_bad_store_value_names_its_flag(capsys, argv, says):
    with pytest.raises(SystemExit) as exc:
        main(["train", *argv])
    assert exc.value.code == 2 and says in capsys.readouterr().err
