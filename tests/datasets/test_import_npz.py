"""A real graph imported from one .npz (the heterophilous-graph benchmark's layout) into OGB's: read back exactly
by load() and DGL's and PyG's sides alike, kept when imported again, and every malformed file refused in one typed
line before anything is written."""

import numpy as np
import pytest
import torch

from directload.datasets import import_npz, load
from directload.harness.cli import main
from directload.npy import CorruptFileError


def _graph(n=40, f=5, splits=2, seed=0):
    rng = np.random.default_rng(seed)
    masks = np.zeros((3, splits, n), bool)
    for s in range(splits):
        part = rng.permutation(n)
        masks[0, s, part[:20]], masks[1, s, part[20:30]], masks[2, s, part[30:]] = True, True, True
    return {"node_features": rng.standard_normal((n, f)).astype(np.float32), "node_labels": rng.integers(0, 3, n),
            "edges": rng.integers(0, n, (100, 2)), "train_masks": masks[0], "val_masks": masks[1],
            "test_masks": masks[2]}


def _save(path, arrays):
    np.savez(path, **arrays)
    return path


def test_the_graph_reads_back_exactly_with_edges_both_ways_and_the_split_asked(tmp_path):
    g = _graph()
    src = _save(tmp_path / "g.npz", g)
    path = import_npz(tmp_path / "data", "g", src, split=1)
    ds = load(tmp_path / "data", "g")
    assert ds.num_nodes == 40 and ds.num_classes == int(g["node_labels"].max()) + 1
    feat = ds.feat.host if getattr(ds.feat, "is_unified", False) else ds.feat
    assert feat.dtype == torch.float32 and torch.equal(feat, torch.from_numpy(g["node_features"]))
    assert torch.equal(ds.labels, torch.from_numpy(g["node_labels"]))
    e = g["edges"]
    want = np.concatenate([e, e[:, ::-1]]).T
    assert np.array_equal(ds.edge_index.numpy(), want)  # each undirected edge stored both ways
    for part, key in (("train", "train"), ("valid", "val"), ("test", "test")):
        assert ds.split[part].tolist() == np.flatnonzero(g[f"{key}_masks"][1]).tolist()
    assert import_npz(tmp_path / "data", "g", src, split=1) == path  # the same file and split: kept
    with pytest.raises(FileExistsError, match="another configuration"):
        import_npz(tmp_path / "data", "g", src, split=0)
    import_npz(tmp_path / "data", "g", src, split=0, overwrite=True)
    assert load(tmp_path / "data", "g").split["train"].tolist() == np.flatnonzero(g["train_masks"][0]).tolist()


@pytest.mark.parametrize("change, match", [
    (lambda g: g.pop("edges"), "lacks edges"),
    (lambda g: g["node_features"].__setitem__((3, 1), np.nan), "NaN or infinite"),
    (lambda g: g["node_features"].__setitem__((3, 1), np.inf), "NaN or infinite"),
    (lambda g: g.__setitem__("node_features", g["node_features"].astype(np.int64)), "node_features must be"),
    (lambda g: g.__setitem__("node_labels", g["node_labels"][:-1]), "node_labels must be 40 class numbers"),
    (lambda g: g.__setitem__("node_labels", -g["node_labels"] - 1), "node_labels must be 40 class numbers"),
    (lambda g: g["edges"].__setitem__((0, 1), 40), r"edges must be \[edges, 2\] node ids in \[0, 40\)"),
    (lambda g: g["edges"].__setitem__((0, 1), -1), "edges must be"),
    (lambda g: g.__setitem__("val_masks", g["val_masks"][:1]), "masks must be boolean"),
    (lambda g: g["val_masks"].__setitem__((0, np.flatnonzero(g["train_masks"][0])[0]), True), "two parts of one split"),
])
def test_a_malformed_file_is_refused_before_anything_is_written(tmp_path, change, match):
    g = _graph()
    change(g)
    src = _save(tmp_path / "bad.npz", g)
    with pytest.raises(CorruptFileError, match=match):
        import_npz(tmp_path / "data", "bad", src)
    assert not (tmp_path / "data" / "bad").exists()


def test_a_file_that_is_no_npz_and_a_split_it_lacks_are_refused(tmp_path):
    (tmp_path / "junk.npz").write_bytes(b"not a zip")
    with pytest.raises(CorruptFileError, match="not a readable .npz"):
        import_npz(tmp_path, "junk", tmp_path / "junk.npz")
    src = _save(tmp_path / "g.npz", _graph(splits=2))
    with pytest.raises(IndexError, match="splits 0..1, not 2"):
        import_npz(tmp_path, "g", src, split=2)


def test_the_command_imports_and_names_a_missing_file_in_one_line(tmp_path, capsys):
    src = _save(tmp_path / "my_graph.npz", _graph())
    assert main(["dataset", "import", str(src), "--root", str(tmp_path / "data")]) == 0
    assert "dataset my-graph (split 0 of my_graph.npz)" in capsys.readouterr().out
    assert load(tmp_path / "data", "my-graph").num_nodes == 40
    capsys.readouterr()  # OGB's reader reports progress on stderr
    assert main(["dataset", "import", str(tmp_path / "nowhere.npz"), "--root", str(tmp_path / "data")]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "no file" in err and "nowhere.npz" in err
