"""Dataset names, atomic generation, concurrent generations, bad configurations and partial datasets."""

import json
import multiprocessing as mp
import os
import shutil

import numpy as np
import pytest
import torch

from directload.datasets import (
    IncompleteDatasetError,
    SplitIndexError,
    SynthConfig,
    check_name,
    convert,
    load,
    synthesize,
)
from directload.datasets.synthetic import META_FILE
from directload.harness.cli import main as cli

SMALL = SynthConfig(num_nodes=400, avg_degree=4, num_feats=4, num_classes=3, chunk_nodes=150)


@pytest.fixture
def victim(tmp_path):
    """A root with a user's own directory and file beside it, and a dataset of theirs inside it."""
    root = tmp_path / "root"
    root.mkdir()
    (tmp_path / "victim").mkdir()
    (tmp_path / "victim" / "thesis.tex").write_text("years of work")
    (root / "mine").mkdir()
    (root / "mine" / "notes.txt").write_text("keep me")
    return root


def _untouched(root):
    assert (root.parent / "victim" / "thesis.tex").read_text() == "years of work"
    assert (root / "mine" / "notes.txt").read_text() == "keep me"


@pytest.mark.parametrize("name", ["../victim", "..", ".", "", "/tmp/x", "a/b", "a\\b", "mine/..", "x\0y",
                                  ".hidden", " padded", "../root"])
def test_names_that_are_not_one_plain_component_are_refused(victim, name):
    for call in (lambda: synthesize(victim, name, SMALL, progress=False), lambda: load(victim, name),
                 lambda: convert(victim, name)):
        with pytest.raises(ValueError, match="one plain path component"):
            call()
    _untouched(victim)


@pytest.mark.parametrize("name", ["../victim", ".", "..", ""])
def test_cli_refuses_them_in_one_line(victim, name, capsys):
    assert cli(["dataset", "synth", "--root", str(victim), "--name", name, "--nodes", "400"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("directload: error: ") and "one plain path component" in err and err.count("\n") == 1
    _untouched(victim)


@pytest.mark.parametrize("name", ["ogbn-papers100M", "synth_small", "a.b-c_1"])
def test_ordinary_names_pass(name):
    check_name(name)


def test_an_existing_directory_that_is_not_ours_is_never_replaced(victim):
    for overwrite in (False, True):
        with pytest.raises(FileExistsError, match="was not made by directload"):
            synthesize(victim, "mine", SMALL, overwrite=overwrite, progress=False)
    _untouched(victim)


def test_generation_writes_aside_and_renames_into_place(tmp_path, monkeypatch):
    import directload.datasets.synthetic as synthetic

    def boom(*args):
        raise KeyboardInterrupt  # as if killed halfway

    monkeypatch.setattr(synthetic, "write_ids_csv_gz", boom)
    with pytest.raises(KeyboardInterrupt):
        synthesize(tmp_path, "half", SMALL, progress=False)
    assert sorted(os.listdir(tmp_path)) == []  # nothing at the final name, no partial left behind


def test_overwrite_replaces_only_our_dataset(tmp_path):
    path = synthesize(tmp_path, "d", SMALL, progress=False)
    (path / "extra").write_text("x")
    synthesize(tmp_path, "d", SMALL, overwrite=True, progress=False)
    assert not (path / "extra").exists() and (path / META_FILE).exists()
    assert sorted(p for p in os.listdir(tmp_path)) == ["d"]


@pytest.mark.ogb
def test_another_configuration_needs_overwrite(tmp_path):
    synthesize(tmp_path, "d", SMALL, progress=False)
    other = SynthConfig(**{**SMALL.__dict__, "num_feats": 6})
    with pytest.raises(FileExistsError, match="another configuration"):
        synthesize(tmp_path, "d", other, progress=False)
    assert load(tmp_path, "d").feat.shape == (400, 4)
    synthesize(tmp_path, "d", other, overwrite=True, progress=False)
    assert load(tmp_path, "d").feat.shape == (400, 6)


def test_stale_partials_of_killed_runs_are_cleaned_but_nothing_else(tmp_path):
    stale = tmp_path / ".d.partial-abc"
    stale.mkdir()
    (stale / ".directload-partial").write_text("")
    lookalike = tmp_path / ".d.partial-user"  # no marker: not ours
    lookalike.mkdir()
    synthesize(tmp_path, "d", SMALL, progress=False)
    assert not stale.exists() and lookalike.exists()


def _generate(root, queue):
    try:
        synthesize(root, "race", SynthConfig(num_nodes=30_000, avg_degree=6, num_feats=16, chunk_nodes=5_000),
                   progress=False)
        queue.put("ok")
    except BaseException as exc:  # reported to the parent
        queue.put(repr(exc))


@pytest.mark.one_lane("dgl")  # a whole-process run: torch's version does not change it
@pytest.mark.ogb
def test_two_concurrent_generations_do_not_corrupt_each_other(tmp_path):
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_generate, args=(tmp_path, queue)) for _ in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(300)
    assert [queue.get(timeout=5) for _ in procs] == ["ok", "ok"]
    assert sorted(os.listdir(tmp_path)) == ["race"]
    ds = load(tmp_path, "race")
    assert ds.feat.shape == (30_000, 16) and ds.num_nodes == 30_000


@pytest.mark.parametrize("field,value", [("num_feats", 0), ("avg_degree", -3), ("num_nodes", 0), ("num_classes", 1),
                                         ("homophily", 1.5), ("power", 0.5), ("split", (0.6, 0.5)),
                                         ("feat_dtype", "int8"), ("seed", -1), ("num_feats", 2.5)])
def test_bad_configurations_are_refused(field, value):
    with pytest.raises(ValueError, match=field):
        SynthConfig(**{field: value})


@pytest.mark.parametrize("args", [["--feats", "0"], ["--degree", "-3"], ["--nodes", "0"], ["--classes", "1"]])
def test_cli_refuses_bad_sizes(tmp_path, args, capsys):
    with pytest.raises(SystemExit) as exc:
        cli(["dataset", "synth", "--root", str(tmp_path), "--name", "x", *args])
    assert exc.value.code == 2 and "must be" in capsys.readouterr().err
    assert os.listdir(tmp_path) == []


@pytest.mark.ogb
def test_partial_dataset_says_it_is_incomplete(tmp_path):
    path = synthesize(tmp_path, "d", SMALL, progress=False)
    (path / "raw" / "node-label.npz").unlink()
    with pytest.raises(IncompleteDatasetError, match=r"incomplete \(missing raw/node-label.npz\).*--overwrite"):
        load(tmp_path, "d")
    # What an interrupted generation of an older version left: OGB's files without our meta file.
    shutil.copytree(path, tmp_path / "older")
    (tmp_path / "older" / META_FILE).unlink()
    with pytest.raises(IncompleteDatasetError, match="interrupted generation"):
        load(tmp_path, "older")
    with pytest.raises(FileExistsError, match="incomplete dataset"):
        synthesize(tmp_path, "d", SMALL, progress=False)
    synthesize(tmp_path, "d", SMALL, overwrite=True, progress=False)
    assert load(tmp_path, "d").num_nodes == 400


@pytest.mark.ogb
def test_split_ids_outside_the_graph_are_refused(tmp_path):
    import gzip

    path = synthesize(tmp_path, "d", SMALL, progress=False)
    with gzip.open(path / "split" / "random" / "valid.csv.gz", "wt") as f:
        f.write("3\n400\n")
    with pytest.raises(SplitIndexError, match="split 'valid' names node 400, outside the graph's 400 nodes") as exc:
        load(tmp_path, "d")
    assert isinstance(exc.value, IndexError)


@pytest.mark.ogb
def test_convert_writes_atomically_and_never_overwrites_another_file(tmp_path):
    path = synthesize(tmp_path, "d", SMALL, inline_features=True, progress=False)
    out = convert(tmp_path, "d")
    assert np.load(out).shape == (400, 4) and convert(tmp_path, "d") == out
    np.save(out, np.zeros((3, 3), np.float32))
    with pytest.raises(FileExistsError, match="another layout"):
        convert(tmp_path, "d")
    assert np.load(out).shape == (3, 3)
    assert [p for p in os.listdir(path / "raw") if p.startswith(".")] == []


@pytest.mark.ogb
def test_meta_is_written_with_the_dataset(tmp_path):
    path = synthesize(tmp_path, "d", SMALL, progress=False)
    meta = json.loads((path / META_FILE).read_text())
    assert meta["config"]["num_feats"] == 4 and meta["name"] == "d"
    assert torch.equal(load(tmp_path, "d").labels, load(tmp_path, "d").labels)


@pytest.mark.ogb
def test_convert_of_a_dataset_whose_features_are_already_a_npy_returns_it(tmp_path):
    path = synthesize(tmp_path, "d", SMALL, progress=False)  # features in raw/node-feat.npy, not in data.npz
    out = convert(tmp_path, "d")
    assert out == path / "raw" / "node-feat.npy" and np.load(out).shape == (400, 4)


@pytest.mark.ogb
def test_a_convert_killed_mid_write_leaves_no_file_and_the_next_one_cleans_up(tmp_path):
    path = synthesize(tmp_path, "d", SMALL, inline_features=True, progress=False)
    user = path / "raw" / ".node-feat.npy.mine.npy"  # a user's file that only looks like ours
    user.write_bytes(b"mine")
    pid = os.fork()
    if pid == 0:  # the child dies (SIGKILL) in the middle of writing the .npy
        try:
            def dying_save(f, array):
                f.write(b"\x93NUMPY half")
                os.kill(os.getpid(), 9)

            np.save = dying_save
            convert(tmp_path, "d")
        finally:
            os._exit(3)
    os.waitpid(pid, 0)
    raw = sorted(os.listdir(path / "raw"))
    assert "node-feat.npy" not in raw and any(p.endswith(".partial") for p in raw)  # no torn file, a partial
    out = convert(tmp_path, "d")
    assert np.load(out).shape == (400, 4)
    assert [p for p in os.listdir(path / "raw") if p.startswith(".")] == [user.name]
