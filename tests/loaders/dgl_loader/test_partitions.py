"""DistDGL partitions published as one set: a re-partition killed at any instant leaves the old set or the new
one, never a mix, and the next run removes what it left; what directload did not write is refused or left
alone; a mixed set is refused before any work; partitions that DGL wrote alone are read as DGL wrote them."""

import contextlib
import fcntl
import io
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from directload import publish
from directload.datasets import load, synthesize
from directload.harness.cli import main
from directload.harness.commands.partition import partition_dir
from directload.stores import DiskStore

dgl = pytest.importorskip("dgl")
from directload.loaders.dgl import distributed as dd  # noqa: E402

CHILD = Path(__file__).with_name("partition_crash.py")
# A user's things beside the partitions that only look like ours: never touched
LOOKALIKES = {"parts.g99/mine.txt": b"mine", ".parts.abcdefgh.build.partial/mine.txt": b"mine",
              "parts.notes": b"mine"}


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    where = tmp_path_factory.mktemp("data")
    synthesize(where, "synth-tiny", progress=False)
    return where


@pytest.fixture(scope="module")
def ds(root):
    return load(root, "synth-tiny")


def _host(feat):
    return feat.host if getattr(feat, "is_unified", False) else feat


def one_set(out, ds, features):
    """Check that ``out`` holds one partitioning, every file of it agreeing with the others and with the
    dataset (DGL's config and parts, the record, the original ids, the stores); its original ids."""
    cfg = json.loads((out / "synth-tiny.json").read_text())
    record = json.loads((out / dd.META).read_text())
    bounds = [0] + [end for _, end in cfg["node_map"]["_N"]]
    assert record["bounds"] == bounds and record["features"] == features
    orig = np.load(out / "orig_nids.npy")
    feat = _host(ds.feat)
    for p in range(2):
        lo, hi = bounds[p], bounds[p + 1]
        held = dgl.data.utils.load_tensors(str(out / cfg[f"part-{p}"]["node_feats"]))
        assert torch.equal(held["_N/label"], ds.labels[torch.from_numpy(orig[lo:hi])]), p  # DGL's parts
        if features == "disk":
            with DiskStore(out / f"part{p}" / "feat.npy") as store:
                assert torch.equal(store.read(torch.arange(hi - lo)), feat[torch.from_numpy(orig[lo:hi])]), p
        else:
            assert torch.equal(held["_N/feat"], feat[torch.from_numpy(orig[lo:hi])]), p
    meta = dd.read_partitions(out / "synth-tiny.json")  # and directload reads it, checked
    assert meta["bounds"] == bounds
    return orig


def _lookalikes(where):
    for name, data in LOOKALIKES.items():
        (where / name).parent.mkdir(parents=True, exist_ok=True)
        (where / name).write_bytes(data)


def _untouched(where):
    return all((where / name).read_bytes() == data for name, data in LOOKALIKES.items())


def _steps(ds, template, tmp_path, features, monkeypatch):
    """The crash points a whole re-partition passes, in order (recorded on a rehearsal)."""
    rehearsal = tmp_path / "rehearsal"
    shutil.copytree(template, rehearsal, symlinks=True)
    seen = []
    with monkeypatch.context() as m:
        m.setattr(publish, "crash_point", seen.append)
        dd.partition(ds, 2, rehearsal / "parts", features=features, method="metis", progress=False)
    return seen


@pytest.mark.slow
@pytest.mark.parametrize("features", ["memory", "disk"])
def test_a_repartition_killed_at_every_step_leaves_the_old_set_or_the_new_one(root, ds, tmp_path, monkeypatch,
                                                                            features):
    template = tmp_path / "template"
    template.mkdir()
    _lookalikes(template)
    dd.partition(ds, 2, template / "parts", features=features, method="random", progress=False)
    old = one_set(template / "parts", ds, features)
    steps = _steps(ds, template, tmp_path, features, monkeypatch)
    work = tmp_path / "work"
    work.mkdir()
    ks = range(1, len(steps) + 1)
    child = subprocess.run([sys.executable, str(CHILD), str(root), str(template), str(work), features, *map(str, ks)],
                           capture_output=True, text=True, timeout=1800)  # a hang guard only
    assert child.returncode == 0, child.stderr[-2000:]
    statuses = json.loads(child.stdout.strip().splitlines()[-1])
    new = None
    for k in ks:
        where, status = work / f"k{k}", statuses[str(k)]
        assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, (k, steps[k - 1], status)
        got = one_set(where / "parts", ds, features)  # killed after step k: one whole set, never a mix
        if new is not None or not np.array_equal(got, old):  # the new set from here on, never the old again
            assert new is None or np.array_equal(got, new), (k, steps[k - 1])
            new = got
            assert k - 1 >= steps.index("partition:published"), (k, steps[k - 1])
        else:
            assert "partition:published" not in steps[:k], (k, steps[k - 1])
        dd.partition(ds, 2, where / "parts", features=features, method="metis", progress=False)  # recovers
        one_set(where / "parts", ds, features)
        link = os.readlink(where / "parts")
        assert sorted(os.listdir(where)) == sorted({"parts", link, *(n.split("/")[0] for n in LOOKALIKES)}), \
            (k, steps[k - 1])  # nothing of the killed run left
        assert _untouched(where)
    assert "partition:dgl" in steps and "partition:record" in steps and steps[-1] == "partition:swept"
    assert new is not None  # the last steps were after the publishing one


def test_a_repartition_publishes_a_new_generation_and_removes_the_old(ds, tmp_path):
    out = tmp_path / "parts"
    config = dd.partition(ds, 2, out, features="disk", method="random", progress=False)
    assert config == out / "synth-tiny.json" and os.readlink(out) == "parts.g1"
    first = dd.read_partitions(config)
    assert first["config"] == (tmp_path / "parts.g1" / "synth-tiny.json") and first["recorded"]
    dd.partition(ds, 2, out, features="disk", method="metis", progress=False)
    second = dd.read_partitions(config)
    assert os.readlink(out) == "parts.g2" and second["token"] != first["token"]
    assert sorted(os.listdir(tmp_path)) == ["parts", "parts.g2"]
    assert sorted(os.listdir(out)) == sorted(["synth-tiny.json", dd.META, "orig_nids.npy", "part0", "part1"])


@pytest.mark.parametrize("what", ["a file in the folder", "a file", "a link elsewhere"])
def test_a_folder_directload_did_not_write_is_refused_and_left_alone(ds, tmp_path, what):
    out = tmp_path / "parts"
    if what == "a file in the folder":
        out.mkdir()
        (out / "thesis.tex").write_text("mine")
    elif what == "a file":
        out.write_text("mine")
    else:
        (tmp_path / "elsewhere").mkdir()
        out.symlink_to("elsewhere")
    before = sorted(os.listdir(tmp_path))
    with pytest.raises(FileExistsError, match="directload did not"):
        dd.partition(ds, 2, out, progress=False)
    assert sorted(os.listdir(tmp_path)) == before  # nothing made beside it, nothing removed
    if what == "a file in the folder":
        assert os.listdir(out) == ["thesis.tex"] and (out / "thesis.tex").read_text() == "mine"


def test_an_empty_folder_becomes_the_partitions(ds, tmp_path):
    (tmp_path / "parts").mkdir()
    dd.partition(ds, 2, tmp_path / "parts", progress=False)
    assert os.readlink(tmp_path / "parts") == "parts.g1" and sorted(os.listdir(tmp_path)) == ["parts", "parts.g1"]


def _old_layout(ds, tmp_path, features="memory", method="random"):
    """A folder as directload wrote partitions before generations: in place, with the old record."""
    dd.partition(ds, 2, tmp_path / "new", features=features, method=method, progress=False)
    out = tmp_path / "parts"
    shutil.copytree(tmp_path / "new.g1", out)
    shutil.rmtree(tmp_path / "new.g1")
    os.unlink(tmp_path / "new")
    record = json.loads((out / dd.META).read_text())
    old = {k: record[k] for k in ("graph", "parts", "features", "bounds", "num_feats", "num_classes", "config")}
    (out / dd.META).write_text(json.dumps(old))
    return out


def test_a_folder_from_before_generations_is_refused_to_readers_and_replaced_by_one_step(ds, tmp_path):
    out = _old_layout(ds, tmp_path, "disk")
    with pytest.raises(dd.PartitionMismatchError, match="written before directload published partitions as one set"):
        dd.read_partitions(out / "synth-tiny.json")
    dd.partition(ds, 2, out, features="disk", method="metis", progress=False)
    assert os.readlink(out) == "parts.g1" and sorted(os.listdir(tmp_path)) == ["parts", "parts.g1"]
    one_set(out, ds, "disk")


def _mixed(ds, tmp_path, out):
    """``out``: partitions whose DGL config comes from another partitioning than the rest (a torn folder)."""
    a = dd.partition(ds, 2, tmp_path / "a", method="random", progress=False)
    b = dd.partition(ds, 2, tmp_path / "b", method="metis", progress=False)
    shutil.copytree(a.resolve().parent, out)
    shutil.copyfile(b, out / "synth-tiny.json")
    return out / "synth-tiny.json"


def test_a_mixed_set_is_refused_in_one_typed_line_before_any_work(ds, tmp_path):
    config = _mixed(ds, tmp_path, tmp_path / "mixed")
    with pytest.raises(dd.PartitionMismatchError, match="come from different partitionings"):
        dd.read_partitions(config)
    with pytest.raises(dd.PartitionMismatchError, match="come from different partitionings"):
        dd.dist_features(None, config)  # refused before it looks at the graph


def test_train_dist_refuses_a_mixed_set_before_any_work(tmp_path, capsys):
    synthesize(tmp_path, "synth-tiny", progress=False)
    out = partition_dir(tmp_path, "synth-tiny", 2, "memory")
    _mixed(load(tmp_path, "synth-tiny"), tmp_path, out)
    capsys.readouterr()
    assert main(["train", "--dist", "2", "--dataset", "synth-tiny", "--root", str(tmp_path), "--no-progress",
                 "--out", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "come from different partitionings" in err, err
    assert not (tmp_path / "out").exists()


def test_a_store_from_another_partitioning_is_refused(ds, tmp_path):
    a = dd.partition(ds, 2, tmp_path / "a", features="disk", method="random", progress=False)
    b = dd.partition(ds, 2, tmp_path / "b", features="disk", method="random", progress=False)
    part = b.resolve().parent / "part1"
    shutil.rmtree(part)
    shutil.copytree(a.resolve().parent / "part1", part, symlinks=True)
    assert dd.store_path(b, 0).is_symlink()
    with pytest.raises(dd.PartitionMismatchError, match="not the store directload's record names for partition 1"):
        dd.store_path(b, 1)


def test_a_second_writer_is_refused_not_queued(ds, tmp_path):
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # another writer at work beside the partitions
        with pytest.raises(BlockingIOError, match="another directload process is writing in"):
            dd.partition(ds, 2, tmp_path / "parts", progress=False)
    finally:
        os.close(fd)
    assert os.listdir(tmp_path) == []


def _dgl_partitions(graph, out, name="g", parts=2):
    with contextlib.redirect_stdout(io.StringIO()):
        dgl.distributed.partition_graph(graph, name, parts, str(out), part_method="random", return_mapping=True)
    return out / f"{name}.json"


def test_partitions_dgl_wrote_alone_are_read_from_dgls_config(tmp_path):
    g = dgl.rand_graph(300, 1500)
    g.ndata["feat"] = torch.randn(300, 4)
    config = _dgl_partitions(g, tmp_path)
    meta = dd.read_partitions(config)
    ranges = json.loads(config.read_text())["node_map"]["_N"]
    assert meta["parts"] == 2 and meta["features"] == "memory" and not meta["recorded"] and meta["graph"] == "g"
    assert meta["bounds"] == [0, ranges[0][1], 300] and meta["node_bounds"] == {"_N": meta["bounds"]}
    assert meta["num_feats"] is None and meta["num_classes"] is None


def test_node_bounds_of_a_graph_with_several_node_types_count_each_types_own_ids(tmp_path):
    hg = dgl.heterograph({("a", "r", "b"): (torch.randint(0, 30, (100,)), torch.randint(0, 20, (100,))),
                          ("b", "s", "a"): (torch.randint(0, 20, (50,)), torch.randint(0, 30, (50,)))},
                         num_nodes_dict={"a": 30, "b": 20})
    meta = dd.read_partitions(_dgl_partitions(hg, tmp_path, "h"))
    assert meta["bounds"] is None and sorted(meta["node_bounds"]) == ["a", "b"]
    assert meta["node_bounds"]["a"][-1] == 30 and meta["node_bounds"]["b"][-1] == 20
    from directload.loaders.dgl.partitions import node_bounds

    with pytest.raises(ValueError, match=r"node types \['a', 'b'\]: name one"):
        node_bounds(json.loads((tmp_path / "h.json").read_text()))
    with pytest.raises(KeyError, match="'c' is not a node type"):
        node_bounds(json.loads((tmp_path / "h.json").read_text()), "c")


def test_a_missing_config_says_how_to_partition(tmp_path):
    with pytest.raises(FileNotFoundError, match="partition with `directload dataset partition`"):
        dd.read_partitions(tmp_path / "g.json")


def test_the_partitions_public_names_import_from_partitions_and_distributed_as_before():
    from directload.loaders.dgl import partitions, partitions_read, partitions_write

    names = ["partition", "read_partitions", "store_path", "node_bounds", "PartitionMismatchError", "META", "FORMAT"]
    assert sorted(partitions.__all__) == sorted(names)
    for name in names:
        home = partitions_write if name == "partition" else partitions_read
        assert getattr(partitions, name) is getattr(home, name) is getattr(dd, name, getattr(home, name)), name
