"""Training with features on disk, and the memory cap an out-of-core run uses."""

import json

import pytest
from conftest import frameworks

from directload.harness.cli import main
from directload.stores import verify
from directload.units import parse_size


@pytest.mark.ogb
@pytest.mark.parametrize("framework", frameworks())
def test_train_with_features_on_disk_against_the_frameworks_loader(tmp_path, framework, capsys):
    args = ["train", "--framework", framework, "--dataset", "synth-tiny", "--root", str(tmp_path), "--features",
            "disk", "--epochs", "2", "--fanouts", "4", "4", "--batch-size", "256", "--eval-nodes", "300",
            "--no-progress", "--out", str(tmp_path / "out")]
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert "disk store per steady epoch" in printed
    report = json.loads(next((tmp_path / "out").glob("*.json")).read_text())
    assert report["meta"]["features"] == "disk" and report["meta"]["feature_file_bytes"] > 0
    runs = {r["loader"]: r for r in report["runs"]}
    assert set(runs) == {framework, "directload"}
    for epoch in runs["directload"]["epochs"]:
        io = epoch["io"]
        assert io["reads"] > 0 and io["bytes_read"] > 0 and io["read_amplification"] >= 1
    assert all(e["io"] is None for e in runs[framework]["epochs"])
    assert abs(runs["directload"]["test_acc"] - runs[framework]["test_acc"]) < 0.08
    store = next(tmp_path.rglob("disk/node-feat.npy"))
    assert verify(store, progress=False)["bad_chunks"] == []


@pytest.mark.ogb
@pytest.mark.parametrize("framework", frameworks())
def test_train_through_tiers_reports_each_tier_and_learns_as_the_frameworks_loader(tmp_path, framework, capsys):
    args = ["train", "--framework", framework, "--dataset", "synth-tiny", "--root", str(tmp_path), "--features",
            "tiered", "--host-cache", "200K", "--gpu-cache", "50K", "--staging", "100K", "--epochs", "2",
            "--fanouts", "4", "4", "--batch-size", "256", "--eval-nodes", "300", "--no-progress",
            "--out", str(tmp_path / "out")]
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert "host tier per steady epoch" in printed and "device tier per steady epoch" in printed
    report = json.loads(next((tmp_path / "out").glob("*.json")).read_text())
    runs = {r["loader"]: r for r in report["runs"]}
    assert report["meta"]["features"] == "tiered"
    assert runs["directload"]["config"]["store"]["host_bytes"] == 200 << 10  # the report records the run's spec
    for epoch in runs["directload"]["epochs"]:
        tiers = epoch["tiers"]
        assert set(tiers) == {"device", "host", "disk"}
        host = tiers["host"]
        assert 0 <= host["hit_rate"] <= host["slot_rate"] <= 1 and host["read_s"] > 0
        assert tiers["device"]["hit_rows"] + tiers["device"]["miss_rows"] > 0
    # the second epoch finds rows the first one cached
    assert runs["directload"]["epochs"][1]["tiers"]["host"]["hit_rows"] > 0
    assert abs(runs["directload"]["test_acc"] - runs[framework]["test_acc"]) < 0.08


@pytest.mark.ogb
@pytest.mark.parametrize("framework", frameworks())
def test_pack_then_train_packed_warms_the_caches_from_the_hot_rows_and_learns(tmp_path, framework, capsys):
    import numpy as np

    from directload.stores import DiskStore

    common = ["--root", str(tmp_path), "--framework", framework, "--fanouts", "4", "4", "--batch-size", "256",
              "--no-progress"]
    assert main(["train", "--dataset", "synth-tiny", "--features", "tiered", "--host-cache", "200K", "--packed",
                 "--loader", "directload", *common]) == 1
    assert "directload dataset pack --name synth-tiny" in capsys.readouterr().err  # not packed yet: say how
    assert main(["dataset", "pack", "--name", "synth-tiny", "--epochs", "2", *common]) == 0
    assert "pre-sampled epochs" in capsys.readouterr().out
    packed = next(tmp_path.rglob("disk/node-feat.packed.npy"))
    plain = packed.with_name("node-feat.npy")
    with DiskStore(packed) as p, DiskStore(plain) as d:
        assert p.id_map is not None and np.array_equal(np.sort(p.hot_ids()), np.arange(p.num_rows))
        ids = np.random.default_rng(0).integers(0, d.num_rows, 500)
        assert (p.read(ids) == d.read(ids)).all()  # the same rows by the same ids
    args = ["train", "--dataset", "synth-tiny", "--features", "tiered", "--host-cache", "200K", "--gpu-cache",
            "50K", "--staging", "100K", "--epochs", "2", "--eval-nodes", "300", "--packed", "--out",
            str(tmp_path / "out"), *common]
    assert main(args) == 0
    report = json.loads(next((tmp_path / "out").glob("*.json")).read_text())
    runs = {r["loader"]: r for r in report["runs"]}
    warm = runs["directload"]["warm"]
    row_bytes, n = p.row_nbytes, p.num_rows
    assert warm["rows"] == {"host": min(n, (200 << 10) // row_bytes), "device": min(n, (50 << 10) // row_bytes)}
    assert warm["bytes"] == sum(warm["rows"].values()) * row_bytes and warm["seconds"] > 0
    assert runs[framework]["warm"] is None and runs[framework]["config"]["store"]["packed"] is False
    tiers = [e["tiers"] for e in runs["directload"]["epochs"]]
    assert sum(t["host"]["warmed_rows"] + t["device"]["warmed_rows"] for t in tiers) > 0  # read in by the fill
    assert tiers[1]["host"]["hit_rows"] + tiers[1]["device"]["hit_rows"] > 0
    assert abs(runs["directload"]["test_acc"] - runs[framework]["test_acc"]) < 0.08


@pytest.mark.ogb
@pytest.mark.parametrize("framework", frameworks())
def test_packing_again_closes_the_stores_over_the_old_copy_and_the_next_ones_read_right(tmp_path, framework):
    import numpy as np
    import torch

    from directload.datasets import load
    from directload.harness.train import TrainConfig, feature_store, pack
    from directload.stores import StoreSpec

    assert main(["dataset", "pack", "--name", "synth-tiny", "--root", str(tmp_path), "--framework", framework,
                 "--fanouts", "4", "4", "--batch-size", "256", "--epochs", "1", "--no-progress"]) == 0
    ds = load(str(tmp_path), "synth-tiny")
    cfg = TrainConfig(framework=framework, loader="directload", features="tiered",
                      store=StoreSpec(host_bytes=100 << 10, packed=True), layers=2, fanouts=[4, 4], batch_size=256)
    before = feature_store(ds, cfg)
    pack(ds, cfg, 1, progress=False)
    assert before.closed  # it read the file just rewritten
    after = feature_store(ds, cfg)
    assert after is not before and not after.closed
    ids = np.random.default_rng(0).integers(0, ds.num_nodes, 300)
    assert torch.equal(after.read(ids), torch.as_tensor(np.asarray(ds.feat[torch.from_numpy(ids)])))
    after.close()


def test_packed_needs_directloads_loader_and_files_and_is_checked_before_any_work(tmp_path, capsys):
    for bad in (["--packed"], ["--packed", "--features", "disk", "--loader", "dgl", "--framework", "dgl"]):
        assert main(["train", "--root", str(tmp_path), "--no-progress", *bad]) == 1
        assert "--packed" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())  # no dataset made, no store written


def test_tiered_options_are_checked_before_any_work(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["train", "--root", str(tmp_path), "--features", "tiered", "--host-cache", "lots", "--no-progress"])
    assert "not a size" in capsys.readouterr().err and not list(tmp_path.iterdir())
    from directload.harness.parser import build_parser
    from directload.harness.train import TrainConfig
    from directload.stores.policies import POLICY_NAMES

    train = build_parser()._subparsers._group_actions[0].choices["train"]
    policy = next(a for a in train._actions if "--policy" in a.option_strings)
    assert tuple(policy.choices) == POLICY_NAMES  # the command line's list (no heavy import) kept in step
    from directload.stores import StoreSpec

    for bad in (dict(store=StoreSpec(host_bytes=-1)), dict(store=StoreSpec(gpu_bytes=1.5)),
                dict(store=StoreSpec(policy="fifo")), dict(store=StoreSpec(staging_bytes=-3)), dict(features="ssd"),
                dict(lookahead=0), dict(lookahead="soon"), dict(store=StoreSpec(staging_bytes=True)),
                dict(store=StoreSpec(packed=True)),
                dict(store=StoreSpec(packed=True), features="tiered", loader="dgl")):
        with pytest.raises(ValueError):
            TrainConfig(**bad)


def test_sizes_parse_and_nonsense_is_refused():
    assert parse_size("2G") == 2 << 30 and parse_size("1.5 GiB") == 3 << 29 and parse_size("10") == 10
    for bad in ("", "G", "-1G", "1.5X", "0"):
        with pytest.raises(ValueError):
            parse_size(bad)
