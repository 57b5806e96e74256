"""The synthetic generator writes OGB's layout; OGB's own loader reads it back; a GNN learns it."""

import gzip

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import frameworks

import directload
from directload.datasets import PRESETS, SynthConfig, load, synthesize
from directload.datasets.ogb_loader import ogb_meta_dict
from directload.harness.train import TrainConfig, train

TINY = PRESETS["synth-tiny"]


@pytest.fixture(scope="module")
def tiny_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("data")
    synthesize(root, "synth-tiny", progress=False)
    return root


def test_layout_is_ogbs(tiny_root):
    path = tiny_root / "synth_tiny"
    assert (path / "RELEASE_v1.txt").exists()  # OGB asks to update a dataset without it
    data = np.load(path / "raw" / "data.npz")
    assert data["edge_index"].shape == (2, int(data["num_edges_list"][0]))
    assert int(data["num_nodes_list"][0]) == TINY.num_nodes
    assert data["edge_index"].dtype == np.int64 and data["edge_index"].max() < TINY.num_nodes
    labels = np.load(path / "raw" / "node-label.npz")["node_label"]
    assert labels.shape == (TINY.num_nodes, 1)
    with gzip.open(path / "split" / "random" / "train.csv.gz", "rt") as f:
        train_ids = [int(line) for line in f]
    assert len(train_ids) == int(TINY.split[0] * TINY.num_nodes)


@pytest.mark.ogb
def test_ogb_loader_reads_it_back_without_prompting(tiny_root, tmp_path, monkeypatch):
    import shutil

    from ogb.nodeproppred import NodePropPredDataset

    monkeypatch.setattr("builtins.input", lambda *a: pytest.fail("OGB prompted"))
    path = tmp_path / "synth_tiny"  # a copy: OGB's dataset class writes its own cache beside the files
    shutil.copytree(tiny_root / "synth_tiny", path)
    (path / "processed").mkdir(exist_ok=True)  # OGB's plain dataset class expects it
    ds = NodePropPredDataset("synth-tiny", root=str(tmp_path), meta_dict=ogb_meta_dict(path, TINY.num_classes))
    graph, labels = ds[0]
    assert graph["num_nodes"] == TINY.num_nodes
    labels = torch.from_numpy(labels)
    assert labels.shape == (TINY.num_nodes, 1) and labels.dtype == torch.int64
    split = {k: torch.from_numpy(v) for k, v in ds.get_idx_split().items()}
    assert sum(len(v) for v in split.values()) == TINY.num_nodes
    assert len(set(split["train"].tolist()) & set(split["test"].tolist())) == 0


@pytest.mark.ogb
def test_inline_features_come_through_ogb(tmp_path):
    cfg = SynthConfig(num_nodes=500, avg_degree=6, num_feats=8, num_classes=3, chunk_nodes=200)
    synthesize(tmp_path, "inline", cfg, inline_features=True, progress=False)
    ds = load(tmp_path, "inline")
    assert not (tmp_path / "inline" / "raw" / "node-feat.npy").exists()
    assert ds.feat.is_unified and ds.feat.shape == (500, 8)
    again = synthesize(tmp_path, "separate", cfg, progress=False)
    sep = load(tmp_path, "separate")
    assert (again / "raw" / "node-feat.npy").exists()
    assert torch.equal(ds.feat.host, sep.feat.host)  # the same chunks, wherever they are written


@pytest.mark.ogb
def test_load_gives_unified_features_and_labels(tiny_root):
    ds = load(tiny_root, "synth-tiny")
    assert directload.is_unified(ds.feat) and ds.feat.dtype == torch.float32
    assert ds.labels.dtype == torch.int64 and ds.labels.shape == (TINY.num_nodes,)
    assert ds.num_classes == TINY.num_classes
    assert ds.edge_index.dtype == torch.int64 and ds.edge_index.shape == (2, ds.num_edges)
    deg = torch.bincount(ds.edge_index[1], minlength=ds.num_nodes).float()
    assert deg.max() > 5 * deg.mean()  # power-law: hubs far above the mean
    src, dst = ds.edge_index
    same = (ds.labels[src] == ds.labels[dst]).float().mean().item()
    assert 0.6 < same < 0.85  # community structure (homophily 0.7 plus chance)


def test_missing_dataset_never_downloads(tmp_path):
    with pytest.raises(FileNotFoundError, match="never downloads"):
        load(tmp_path, "ogbn-products")


def test_regeneration_is_skipped_when_complete(tiny_root):
    path = tiny_root / "synth_tiny"
    stamp = (path / "raw" / "data.npz").stat().st_mtime_ns
    synthesize(tiny_root, "synth-tiny", progress=False)
    assert (path / "raw" / "data.npz").stat().st_mtime_ns == stamp


@pytest.mark.ogb
def test_the_same_dataset_as_dgl_and_pyg_graphs(tiny_root):
    ds = load(tiny_root, "synth-tiny")
    try:
        g = ds.graph
    except ImportError:
        g = None
    if g is not None:
        assert g.ndata["feat"] is ds.feat and torch.equal(g.ndata["label"], ds.labels)
        assert all(torch.equal(a, b) for a, b in zip(g.edges(), ds.edge_index))
    try:
        data = ds.to_pyg()
    except ImportError:
        data = None
    if data is not None:
        assert data.x is ds.feat and torch.equal(data.edge_index, ds.edge_index) and data.num_nodes == ds.num_nodes
    if g is None and data is None:
        pytest.skip("neither DGL nor PyG is installed")


@pytest.mark.ogb
def test_graph_cache_is_plain_arrays_and_reused(tiny_root):
    cache = tiny_root / "synth_tiny" / "processed" / "directload-graph.npz"
    first = load(tiny_root, "synth-tiny")
    assert cache.exists()
    with np.load(cache, allow_pickle=False) as z:  # no pickles: any torch can read it
        assert set(z.files) == {"edge_index", "num_nodes", "labels"}
    again = load(tiny_root, "synth-tiny")
    assert torch.equal(first.edge_index, again.edge_index) and torch.equal(first.labels, again.labels)


def _mlp_accuracy(ds, epochs=60):
    torch.manual_seed(0)
    x, y = ds.feat.host.float(), ds.labels
    tr, te = ds.split["train"], ds.split["test"]
    model = torch.nn.Sequential(torch.nn.Linear(x.shape[1], 64), torch.nn.ReLU(), torch.nn.Linear(64, ds.num_classes))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(epochs):
        loss = F.cross_entropy(model(x[tr]), y[tr])
        opt.zero_grad()
        loss.backward()
        opt.step()
    return (model(x[te]).argmax(1) == y[te]).float().mean().item()


@pytest.mark.parametrize("framework", frameworks() or [pytest.param("none", marks=pytest.mark.skip("no framework"))])
def test_a_gnn_learns_it_and_beats_an_mlp(tiny_root, framework):
    ds = load(tiny_root, "synth-tiny")
    mlp = _mlp_accuracy(ds)
    cfg = TrainConfig(hidden=32, layers=2, fanouts=(10, 10), batch_size=64, epochs=6, lr=1e-2, framework=framework,
                      loader="directload")
    gnn = train(ds, cfg, progress=False).test_acc
    chance = 1 / ds.num_classes
    print(f"MLP {mlp:.3f}, GraphSAGE {gnn:.3f}, chance {chance:.3f}")
    assert mlp > chance + 0.05
    assert gnn > mlp + 0.15
