"""One options check: ``directload train`` and TrainConfig refuse the same bad options with the same rule
(directload.harness.options.check_options), the command line naming its flags and the config its fields."""

from dataclasses import fields
from types import SimpleNamespace

import pytest

from directload.harness.cli import main
from directload.harness.commands.runs import FLAGS, check_args, train_options
from directload.harness.options import FIELDS, check_options
from directload.harness.parser import build_parser
from directload.harness.train import SIDES, TrainConfig

M = 1 << 20

# (the command line's flags, TrainConfig's fields, what the command line says, what the config says)
SAME_RULE = [
    (["--features", "tiered", "--node-io-depth", "4"], dict(features="tiered", node_io_depth=4),
     "--node-io-depth is shared within a node budget: give --node-budget too",
     "node_io_depth is shared within a node budget: give node_budget too"),
    (["--node-budget", "1M"], dict(node_budget=M),
     "--node-budget shares the host caches and disk queues of directload's tiered stores: it needs --features "
     "tiered and --loader directload (or both)",
     "node_budget shares the host caches and disk queues of directload's tiered stores: it needs "
     "features='tiered' and loader='directload'"),
    (["--packed"], dict(packed=True),
     "--packed reads the packed disk store with directload's loader: it needs --features disk or tiered and "
     "--loader directload (or both)",
     "packed reads the packed disk store with directload's loader: it needs features='disk' or 'tiered' and "
     "loader='directload'"),
    (["--features", "tiered", "--shared-hot", "1M"], dict(features="tiered", shared_hot=M),
     "--shared-hot keeps the packed store's hottest rows once per node: it needs --packed and --features tiered",
     "shared_hot keeps the packed store's hottest rows once per node: it needs packed=True and features='tiered'"),
    (["--features", "tiered", "--packed", "--node-budget", "1M", "--shared-hot", "1M"],
     dict(features="tiered", packed=True, node_budget=M, shared_hot=M),
     "--shared-hot is taken out of --node-budget: it must be smaller",
     "shared_hot is taken out of node_budget: it must be smaller"),
    (["--loader", "directload", "--partition-features"], dict(partitioned=True),
     "--partition-features splits the rows among the ranks of a DDP job: give --nproc N (N >= 2) or start the "
     "ranks with torchrun",
     "partitioned splits the rows among the ranks of a DDP job: give nproc >= 2"),
    (["--loader", "directload", "--nproc", "2", "--packed", "--features", "disk", "--partition-features"],
     dict(nproc=2, packed=True, features="disk", partitioned=True),
     "--partition-features splits the rows among the ranks of directload's loader: it needs --loader directload, "
     "and neither --packed nor --node-budget",
     "partitioned splits the rows among the ranks of directload's loader: it needs loader='directload', and "
     "neither packed nor node_budget"),
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


def _namespace(**options):
    return SimpleNamespace(**{**{f.name: f.default for f in fields(TrainConfig)}, **options})


def test_check_options_is_one_rule_spelled_two_ways():
    for names, says in ((FIELDS, "node_io_depth is shared within a node budget: give node_budget too"),
                        (FLAGS, "--node-io-depth is shared within a node budget: give --node-budget too")):
        with pytest.raises(ValueError, match=f"^{says}$"):
            check_options(_namespace(features="tiered", node_io_depth=4), frameworks=("dgl", "pyg"), names=names)
    # the command line's "both": directload's loader is among those run, and the framework's loader is checked too
    both = dict(frameworks=("dgl", "pyg"), models=("sage", "gat"), loaders=("dgl", "directload"))
    assert check_options(_namespace(features="disk", packed=True, sampler="directload"), **both) == {
        "layers": 3, "fanouts": (15, 10, 5), "sampler": "directload"}
    with pytest.raises(ValueError, match="own loader"):
        check_options(_namespace(), frameworks=("dgl", "pyg"), loaders=("pyg", "directload"))
    assert check_options(_namespace(layers=None, fanouts=[5, 5], loader="dgl", sampler=None),
                         frameworks=("dgl",)) == {"layers": 2, "fanouts": (5, 5), "sampler": "framework"}


def test_the_flags_map_onto_the_config_one_to_one(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    train = build_parser()._subparsers._group_actions[0].choices["train"]
    flags = {s for a in train._actions for s in a.option_strings}
    assert set(FLAGS.flags.values()) <= flags  # every flag a message names is one of train's
    args = build_parser().parse_args(["train"])
    options = train_options(args)
    assert set(options) <= {f.name for f in fields(TrainConfig)}
    assert set(options) | {"model", "loader"} == set(FLAGS.flags)  # each flag of a field maps, and no other
    assert TrainConfig(**options).nproc == 1  # train's defaults are a valid config
    checked = check_args(args, ["sage"], [args.framework, "directload"])
    assert (checked["layers"], checked["fanouts"]) == (3, (15, 10, 5)) and args.framework in SIDES
