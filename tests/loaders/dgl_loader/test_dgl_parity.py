"""DGL's example patterns with one import changed: same batches as DGL's loader, for every kind of sampler.

Each test runs a pattern from DGL's examples once with ``dgl.dataloading.DataLoader``
and once with ``directload.loaders.DataLoader`` from the same seeds, and compares
the batches item by item: ids, graph structure and every node and edge field.
"""

import os

import dgl
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from dgl.utils import set_num_threads
from torch import nn

import directload
from directload.loaders import DataLoader


@pytest.fixture(autouse=True)
def _one_sampling_thread():
    # DGL's draws are reproducible only with one sampling thread (its own loader differs run to run with 2).
    set_num_threads(1)


def _seed(seed=0):
    torch.manual_seed(seed)
    np.random.seed(seed)
    dgl.seed(seed)


def _assert_same_graph(a, b):
    assert a.ntypes == b.ntypes and a.canonical_etypes == b.canonical_etypes and a.is_block == b.is_block
    assert a.device == b.device
    views = [("src", a.srcnodes, b.srcnodes), ("dst", a.dstnodes, b.dstnodes)] if a.is_block else \
        [("nodes", a.nodes, b.nodes)]
    types = (a.srctypes, a.dsttypes) if a.is_block else (a.ntypes,)
    for (side, va, vb), ntypes in zip(views, types):
        for nt in ntypes:
            da, db = va[nt].data, vb[nt].data
            assert sorted(da.keys()) == sorted(db.keys()), (side, nt)
            for k in da.keys():
                assert da[k].dtype == db[k].dtype and da[k].device == db[k].device, (side, nt, k)
                assert torch.equal(da[k], db[k]), (side, nt, k)
    for et in a.canonical_etypes:
        ea, eb = a.edges(etype=et, order="eid"), b.edges(etype=et, order="eid")
        assert all(torch.equal(x, y) for x, y in zip(ea, eb)), et
        assert sorted(a.edges[et].data.keys()) == sorted(b.edges[et].data.keys())
        for k in a.edges[et].data.keys():
            assert torch.equal(a.edges[et].data[k], b.edges[et].data[k]), (et, k)


def assert_same_batch(a, b):
    assert type(a) is type(b)
    if isinstance(a, dgl.DGLGraph):
        _assert_same_graph(a, b)
    elif isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.device == b.device and torch.equal(a, b)
    elif isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            assert_same_batch(a[k], b[k])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            assert_same_batch(x, y)
    else:
        assert a == b


def both(make_loader, seed=0):
    """Batches of DGL's loader and of ours, each from the same seed."""
    out = []
    for cls in (dgl.dataloading.DataLoader, DataLoader):
        _seed(seed)
        out.append(list(make_loader(cls)))
    assert len(out[0]) == len(out[1]) > 0
    for a, b in zip(*out):
        assert_same_batch(a, b)
    return out


@pytest.fixture
def graph():
    _seed(1)
    g = dgl.rand_graph(600, 5000)
    g.ndata["feat"] = torch.randn(600, 37)
    g.ndata["label"] = torch.randint(0, 7, (600,))
    g.edata["w"] = torch.rand(5000)
    g.edata["elabel"] = torch.randint(0, 2, (5000,))
    return g


# -- node classification with layer-wise inference -------------------------------------------------

class SAGE(nn.Module):
    """DGL's examples/pytorch/graphsage/node_classification.py model, with its prefetching inference."""

    def __init__(self, in_size, hid_size, out_size):
        super().__init__()
        self.layers = nn.ModuleList([dgl.nn.SAGEConv(in_size, hid_size, "mean"),
                                     dgl.nn.SAGEConv(hid_size, hid_size, "mean"),
                                     dgl.nn.SAGEConv(hid_size, out_size, "mean")])
        self.hid_size, self.out_size = hid_size, out_size

    def forward(self, blocks, x):
        h = x
        for i, (layer, block) in enumerate(zip(self.layers, blocks)):
            h = layer(block, h)
            if i != len(self.layers) - 1:
                h = F.relu(h)
        return h

    def inference(self, g, batch_size, loader_cls):
        """Layer-wise inference that reuses one loader and swaps ``g.ndata["feat"]`` after each layer."""
        feat = g.ndata["feat"]
        sampler = dgl.dataloading.MultiLayerFullNeighborSampler(1, prefetch_node_feats=["feat"])
        dataloader = loader_cls(g, torch.arange(g.num_nodes()), sampler, batch_size=batch_size, shuffle=False,
                                drop_last=False, num_workers=0)
        for i, layer in enumerate(self.layers):
            y = torch.empty(g.num_nodes(), self.hid_size if i != len(self.layers) - 1 else self.out_size)
            for _input_nodes, output_nodes, blocks in dataloader:
                x = blocks[0].srcdata["feat"]
                assert x.shape[1] == (feat.shape[1] if i == 0 else self.hid_size)
                h = layer(blocks[0], x)
                if i != len(self.layers) - 1:
                    h = F.relu(h)
                y[output_nodes[0]:output_nodes[-1] + 1] = h
            g.ndata["feat"] = y
        g.ndata["feat"] = feat
        return y


def test_layer_wise_inference_reads_the_table_set_after_each_layer(graph):
    # Before: the loader read g.ndata once, so layers 2 and 3 got layer 0's table (wrong, silently).
    torch.manual_seed(0)
    model = SAGE(37, 16, 7).eval()
    with torch.no_grad():
        want = model.inference(graph, 128, dgl.dataloading.DataLoader)
        got = model.inference(graph, 128, DataLoader)
        full = model([graph, graph, graph], graph.ndata["feat"])
    # DGL's own aggregation is not bit-reproducible across threads (1e-6 between two DGL runs).
    assert torch.allclose(got, want, atol=1e-5)
    assert torch.allclose(got, full, atol=1e-5)


def test_in_place_updates_and_reassignment_mid_epoch_are_seen(graph):
    sampler = dgl.dataloading.NeighborSampler([3], prefetch_node_feats=["feat"])
    loader = DataLoader(graph, torch.arange(300), sampler, batch_size=100, overlap=False)
    it = iter(loader)
    graph.ndata["feat"].mul_(2)  # in place, after the look-ahead was sampled
    first = next(it)
    assert torch.equal(first[2][0].srcdata["feat"], graph.ndata["feat"][first[0]])
    graph.ndata["feat"] = torch.ones(600, 3)  # another table, another width
    second = next(it)
    assert torch.equal(second[2][0].srcdata["feat"], torch.ones(len(second[0]), 3))


# -- link prediction ---------------------------------------------------------------------------------

@pytest.mark.parametrize("negative", [False, True], ids=["positive-only", "negative-sampler"])
@pytest.mark.parametrize("exclude", [None, "self", "reverse_id"])
def test_link_prediction_batches(graph, negative, exclude):
    # DGL's examples/pytorch/link_pred.py: edge-wise batches with pair graphs, edge labels on the pair graph.
    n = graph.num_edges() // 2
    kw = {}
    if exclude == "reverse_id":
        kw["reverse_eids"] = torch.cat([torch.arange(n, 2 * n), torch.arange(0, n)])
    sampler = dgl.dataloading.NeighborSampler([4, 4], prefetch_node_feats=["feat"], prefetch_edge_feats=["w"])
    sampler = dgl.dataloading.as_edge_prediction_sampler(
        sampler, exclude=exclude, negative_sampler=dgl.dataloading.negative_sampler.Uniform(2) if negative else None,
        prefetch_labels=["elabel"], **kw)
    dgl_batches, ours = both(lambda cls: cls(graph, torch.arange(400), sampler, batch_size=64, shuffle=True))
    batch = ours[0]
    assert len(batch) == (4 if negative else 3)
    input_nodes, pair, blocks = batch[0], batch[1], batch[-1]
    assert torch.equal(blocks[0].srcdata["feat"], graph.ndata["feat"][input_nodes])
    assert torch.equal(pair.edata["elabel"], graph.edata["elabel"][pair.edata[dgl.EID]])
    assert torch.equal(blocks[0].edata["w"], graph.edata["w"][blocks[0].edata[dgl.EID]])


def test_link_prediction_trains_like_dgls_example(graph):
    class Score(nn.Module):
        def forward(self, g, h):
            with g.local_scope():
                g.ndata["h"] = h
                g.apply_edges(dgl.function.u_dot_v("h", "h", "s"))
                return g.edata["s"].squeeze(1)

    sampler = dgl.dataloading.as_edge_prediction_sampler(
        dgl.dataloading.NeighborSampler([5, 5], prefetch_node_feats=["feat"]), exclude="self",
        negative_sampler=dgl.dataloading.negative_sampler.Uniform(1))
    losses = {}
    for cls in (dgl.dataloading.DataLoader, DataLoader):
        _seed(0)
        model = nn.ModuleList([dgl.nn.SAGEConv(37, 16, "mean"), dgl.nn.SAGEConv(16, 16, "mean")])
        opt = torch.optim.Adam(model.parameters(), lr=1e-2)
        run = []
        for _ in range(2):
            for _input_nodes, pair, neg, blocks in cls(graph, torch.arange(1000), sampler, batch_size=250,
                                                      shuffle=True):
                h = model[1](blocks[1], F.relu(model[0](blocks[0], blocks[0].srcdata["feat"])))
                pos, negs = Score()(pair, h), Score()(neg, h)
                loss = F.binary_cross_entropy_with_logits(torch.cat([pos, negs]),
                                                          torch.cat([torch.ones_like(pos), torch.zeros_like(negs)]))
                opt.zero_grad()
                loss.backward()
                opt.step()
                run.append(loss.item())
        losses[cls] = run
    assert len(losses[DataLoader]) == len(losses[dgl.dataloading.DataLoader]) == 8
    assert np.allclose(losses[DataLoader], losses[dgl.dataloading.DataLoader], atol=1e-4)


# -- subgraph samplers ---------------------------------------------------------------------------

def test_cluster_gcn(graph, tmp_path):
    sampler = dgl.dataloading.ClusterGCNSampler(graph, 12, cache_path=str(tmp_path / "cluster.pkl"),
                                                prefetch_ndata=["feat", "label"], prefetch_edata=["w"])
    _, ours = both(lambda cls: cls(graph, torch.arange(12), sampler, batch_size=3, shuffle=True))
    sg = ours[0]
    assert isinstance(sg, dgl.DGLGraph)
    assert torch.equal(sg.ndata["feat"], graph.ndata["feat"][sg.ndata[dgl.NID]])
    assert torch.equal(sg.edata["w"], graph.edata["w"][sg.edata[dgl.EID]])


@pytest.mark.parametrize("mode,budget", [("node", 150), ("edge", 300), ("walk", (20, 3))])
def test_saint(graph, mode, budget):
    sampler = dgl.dataloading.SAINTSampler(mode, budget, prefetch_ndata=["feat", "label"])
    # SAINT's seeds are iteration counters, not node ids: more of them than nodes is fine.
    _, ours = both(lambda cls: cls(graph, torch.arange(900), sampler, batch_size=300))
    assert torch.equal(ours[0].ndata["label"], graph.ndata["label"][ours[0].ndata[dgl.NID]])


def test_shadow_khop(graph):
    sampler = dgl.dataloading.ShaDowKHopSampler([4, 3], prefetch_node_feats=["feat"])
    _, ours = both(lambda cls: cls(graph, torch.arange(200), sampler, batch_size=50, shuffle=True))
    input_nodes, output_nodes, sg = ours[0]
    assert torch.equal(sg.ndata["feat"], graph.ndata["feat"][input_nodes])


# -- heterogeneous graphs ------------------------------------------------------------------------

def _hetero():
    _seed(2)
    g = dgl.heterograph({
        ("a", "ab", "b"): (torch.randint(0, 50, (300,)), torch.randint(0, 40, (300,))),
        ("b", "ba", "a"): (torch.randint(0, 40, (300,)), torch.randint(0, 50, (300,))),
        ("b", "bb", "b"): (torch.randint(0, 40, (200,)), torch.randint(0, 40, (200,))),
    })
    for nt, n in (("a", 50), ("b", 40)):
        g.nodes[nt].data["feat"] = torch.randn(n, 6)
        g.nodes[nt].data["label"] = torch.randint(0, 3, (n,))
    return g


def test_labels_on_several_node_types_with_seeds_of_one_type():
    # Before: KeyError for the node type without seeds.
    g = _hetero()
    sampler = dgl.dataloading.NeighborSampler([3, 3], prefetch_node_feats={"a": ["feat"], "b": ["feat"]},
                                              prefetch_labels={"a": ["label"], "b": ["label"]})
    _, ours = both(lambda cls: cls(g, {"b": torch.arange(40)}, sampler, batch_size=16, shuffle=True))
    input_nodes, output_nodes, blocks = ours[0]
    assert torch.equal(blocks[-1].dstnodes["b"].data["label"], g.nodes["b"].data["label"][output_nodes["b"]])
    assert blocks[-1].dstnodes["a"].data["label"].shape == (0,)


def test_hetero_rgcn_pattern_with_unified_tables():
    g = _hetero()
    for nt in ("a", "b"):
        g.nodes[nt].data["feat"] = directload.to_unified(g.nodes[nt].data["feat"], affinity="host")
    # DGL's heterograph samplers take per-type field lists (a plain list fails inside DGL itself).
    sampler = dgl.dataloading.NeighborSampler([4, 4], prefetch_node_feats={"a": ["feat"], "b": ["feat"]},
                                              prefetch_labels={"a": ["label"], "b": ["label"]})
    _, ours = both(lambda cls: cls(g, {"a": torch.arange(50), "b": torch.arange(10)}, sampler, batch_size=20))
    for input_nodes, _, blocks in ours:
        for nt in ("a", "b"):
            assert torch.equal(blocks[0].srcnodes[nt].data["feat"], g.nodes[nt].data["feat"].host[input_nodes[nt]])


# -- what DGL fetches itself ---------------------------------------------------------------------

def test_tables_that_need_autograd_are_left_to_dgl(graph):
    # A gather carries no autograd history, so a table that requires grad is DGL's to fetch;
    # DGL 2.1 refuses it on the CPU (index_select with out=), and so does the drop-in, with DGL's error.
    graph.ndata["emb"] = nn.Parameter(torch.randn(600, 4))
    sampler = dgl.dataloading.NeighborSampler([3], prefetch_node_feats=["emb"])
    errors = []
    for cls in (dgl.dataloading.DataLoader, DataLoader):
        with pytest.raises(RuntimeError, match="don't support automatic differentiation") as info:
            next(iter(cls(graph, torch.arange(50), sampler, batch_size=50)))
        errors.append(str(info.value))
    assert errors[0] == errors[1]


@pytest.mark.parametrize("dtype", [torch.complex128, torch.float64, torch.bfloat16])
def test_unusual_tables_fall_back_or_gather_with_dgls_values(graph, dtype):
    graph.ndata["odd"] = torch.randn(600, 3).to(dtype) if dtype != torch.complex128 else torch.randn(600, 3,
                                                                                                     dtype=dtype)
    graph.ndata["strided"] = torch.randn(3, 600).t()
    sampler = dgl.dataloading.NeighborSampler([3], prefetch_node_feats=["odd", "strided"])
    both(lambda cls: cls(graph, torch.arange(100), sampler, batch_size=30))


def test_attached_data_and_custom_samplers():
    class Sampler(dgl.dataloading.Sampler):
        def sample(self, g, indices):
            sg = g.subgraph(indices)
            dgl.set_node_lazy_features(sg, ["feat"])
            return sg, dgl.dataloading.LazyFeature("extra", indices)

    g = dgl.rand_graph(100, 400)
    g.ndata["feat"] = torch.randn(100, 5)
    extra = torch.arange(100.0)
    batches = []
    for cls in (dgl.dataloading.DataLoader, DataLoader):
        loader = cls(g, torch.arange(100), Sampler(), batch_size=25)
        loader.attach_data("extra", extra)
        batches.append(list(loader))
    for a, b in zip(*batches):
        assert_same_batch(a, b)
    assert torch.equal(batches[1][1][1], extra[25:50])


# -- the attributes and methods other code reads ---------------------------------------------------

def test_it_is_a_dgl_dataloader_with_dgls_members(graph):
    ids = torch.arange(100)
    sampler = dgl.dataloading.NeighborSampler([3])
    loader = DataLoader(graph, ids, sampler, batch_size=10, num_workers=1)
    assert isinstance(loader, dgl.dataloading.DataLoader) and isinstance(loader, torch.utils.data.DataLoader)
    assert loader.indices is ids and loader.graph_sampler is sampler and loader.graph is graph
    assert loader.use_uva is False and loader.device == torch.device("cpu") and len(loader) == 10
    assert loader.dataset is not None and loader.batch_size is None  # DGL batches in its dataset, as here
    assert loader.dataset.batch_size == 10
    if not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2:
        pytest.skip("enable_cpu_affinity needs two cores")
    with loader.enable_cpu_affinity(verbose=False):
        assert len(list(loader)) == 10


# -- Lightning -------------------------------------------------------------------------------------

@pytest.mark.filterwarnings("ignore:Your `IterableDataset` has `__len__` defined")
def test_lightning_datamodule(graph):
    pl = pytest.importorskip("pytorch_lightning")

    class DataModule(pl.LightningDataModule):
        def __init__(self, loader_cls):
            super().__init__()
            self.loader_cls = loader_cls
            self.sampler = dgl.dataloading.NeighborSampler([4, 4], prefetch_node_feats=["feat"],
                                                           prefetch_labels=["label"])

        def train_dataloader(self):
            return self.loader_cls(graph, torch.arange(400), self.sampler, device="cpu", batch_size=100,
                                   shuffle=True, drop_last=False, num_workers=0)

        def val_dataloader(self):
            return self.loader_cls(graph, torch.arange(400, 600), self.sampler, device="cpu", batch_size=100,
                                   shuffle=False, drop_last=False, num_workers=0)

    class Module(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.model = nn.ModuleList([dgl.nn.SAGEConv(37, 16, "mean"), dgl.nn.SAGEConv(16, 7, "mean")])
            self.seen = []

        def training_step(self, batch, batch_idx):
            input_nodes, output_nodes, blocks = batch
            self.seen.append((input_nodes.clone(), blocks[0].srcdata["feat"].clone()))
            h = F.relu(self.model[0](blocks[0], blocks[0].srcdata["feat"]))
            return F.cross_entropy(self.model[1](blocks[1], h), blocks[-1].dstdata["label"])

        def validation_step(self, batch, batch_idx):
            self.log("val_batches", float(batch_idx), batch_size=len(batch[1]))

        def configure_optimizers(self):
            return torch.optim.Adam(self.parameters(), lr=1e-2)

    runs = {}
    for cls in (dgl.dataloading.DataLoader, DataLoader):
        _seed(0)
        pl.seed_everything(0, verbose=False)
        module = Module()
        trainer = pl.Trainer(max_epochs=2, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                             enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0)
        trainer.fit(module, datamodule=DataModule(cls))
        runs[cls] = module.seen
    want, got = runs[dgl.dataloading.DataLoader], runs[DataLoader]
    assert len(got) == len(want) == 8
    for (a_ids, a_x), (b_ids, b_x) in zip(want, got):
        assert torch.equal(a_ids, b_ids) and torch.equal(a_x, b_x)
