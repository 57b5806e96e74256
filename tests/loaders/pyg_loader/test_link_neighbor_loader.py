"""directload's LinkNeighborLoader: PyG's batches bit for bit where PyG can sample, directload's sampler where it
cannot or where asked (PyG's graph_sage_unsup idiom without torch-sparse), over Data, HeteroData and a store pair;
every batch's labels, negatives and sampled edges checked against the graph."""

import inspect
import math
import warnings

import pytest
import torch
import torch.nn.functional as F
from pyg_compare import same_batches, without_pyg_sampler
from torch_geometric.data import Data, HeteroData
from torch_geometric.loader import LinkNeighborLoader as PygLinkNeighborLoader
from torch_geometric.nn import GraphSAGE
from torch_geometric.sampler import NegativeSampling

from directload.loaders.pyg import LinkNeighborLoader, NeighborSampler, stores_from

N = 300
WRITES = ("author", "writes", "paper")


@pytest.fixture
def data():
    g = torch.Generator().manual_seed(7)
    return Data(x=torch.randn(N, 11, generator=g), edge_index=torch.randint(0, N, (2, 2400), generator=g),
                w=torch.rand(2400, generator=g), num_nodes=N)


@pytest.fixture
def hetero():
    g = torch.Generator().manual_seed(8)
    h = HeteroData()
    h["paper"].x = torch.randn(120, 6, generator=g)
    h["author"].x = torch.randn(50, 3, generator=g)
    writes = torch.stack([torch.randint(0, 50, (500,), generator=g), torch.randint(0, 120, (500,), generator=g)])
    h[WRITES].edge_index = writes
    h["paper", "cites", "paper"].edge_index = torch.randint(0, 120, (2, 600), generator=g)
    h["paper", "rev_writes", "author"].edge_index = writes.flip(0)
    return h


def _run(cls, data, seed=11, **kw):
    torch.manual_seed(seed)
    return list(cls(data, **kw))


def _check_binary(batch, label_index, labels, ratio):
    """``edge_label_index`` local to the batch: positives are the input edges, then ``ratio`` times as many
    negatives labelled 0; sampled edges are real edges; features are the nodes'."""
    pos = batch.input_id.numel()
    neg = math.ceil(pos * ratio)
    assert batch.edge_label_index.dtype == torch.int64 and batch.edge_label_index.shape == (2, pos + neg)
    assert torch.equal(batch.n_id[batch.edge_label_index[:, :pos]], label_index[:, batch.input_id])
    if labels is None:
        assert "edge_label" not in batch  # PyG's: no labels given, no negatives
    else:
        assert torch.equal(batch.edge_label, torch.cat([labels[batch.input_id], labels.new_zeros(neg)]))
    # Every endpoint, negatives included, is a seed: the first num_sampled_nodes[0] nodes.
    seeds = batch.n_id[:batch.num_sampled_nodes[0]]
    assert torch.equal(seeds.sort().values, batch.n_id[batch.edge_label_index].unique())


def _check_edges(batch, edge_index):
    src, dst = batch.n_id[batch.edge_index]
    assert torch.equal(edge_index[0][batch.e_id], src) and torch.equal(edge_index[1][batch.e_id], dst)
    assert batch.n_id.unique().numel() == batch.n_id.numel()


def test_pygs_graph_sage_unsup_idiom_runs_without_pygs_sampler(data, monkeypatch):
    without_pyg_sampler(monkeypatch)
    """examples/graph_sage_unsup.py with one import changed, on PyG without pyg-lib or torch-sparse."""
    kw = dict(batch_size=64, shuffle=True, neg_sampling_ratio=1.0, num_neighbors=[10, 10])
    with pytest.raises(ImportError, match="requires either 'pyg-lib' or 'torch-sparse'"):
        next(iter(PygLinkNeighborLoader(data, **kw)))  # the gap: PyG alone cannot
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # said once per process: another test may have heard it
        train_loader = LinkNeighborLoader(data, **kw)
    assert train_loader.sampling == "directload"
    torch.manual_seed(0)
    model = GraphSAGE(11, hidden_channels=16, num_layers=2)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    seen = 0
    for batch in train_loader:
        _check_binary(batch, data.edge_index, torch.ones(data.edge_index.shape[1]), 1.0)
        _check_edges(batch, data.edge_index)
        assert torch.equal(batch.x, data.x[batch.n_id]) and batch.x.dtype == torch.float32
        h = model(batch.x, batch.edge_index)
        pred = (h[batch.edge_label_index[0]] * h[batch.edge_label_index[1]]).sum(dim=-1)
        loss = F.binary_cross_entropy_with_logits(pred, batch.edge_label)
        opt.zero_grad()
        loss.backward()
        opt.step()
        assert torch.isfinite(loss)
        seen += batch.input_id.numel()
    assert seen == data.edge_index.shape[1]


@pytest.mark.parametrize("kw", [
    dict(neg_sampling_ratio=1.0),
    dict(neg_sampling_ratio=2.5, replace=True),
    dict(neg_sampling=NegativeSampling("triplet", 2)),
    dict(edge_label_index=slice(0, 500), edge_label=torch.arange(500) % 3),
    dict(edge_label_index=slice(0, 500), edge_label=torch.arange(500) % 3, neg_sampling_ratio=0.5),
    dict(num_neighbors=[-1]),
    dict(drop_last=True, batch_size=70),
], ids=lambda kw: ",".join(kw))
def test_by_default_the_batches_are_pygs_bit_for_bit(data, kw):
    kw = {"num_neighbors": [4, 3], "batch_size": 64, "shuffle": True, **kw}
    if isinstance(kw.get("edge_label_index"), slice):
        kw["edge_label_index"] = data.edge_index[:, kw["edge_label_index"]]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # PyG's own warning about pyg-lib
        want = _run(PygLinkNeighborLoader, data, **kw)
    loader = LinkNeighborLoader(data, **kw)
    assert loader.sampling == "pyg"
    torch.manual_seed(11)
    same_batches(want, list(loader))


def test_by_default_hetero_and_store_pair_batches_are_pygs(data, hetero):
    kw = dict(num_neighbors={et: [3, 2] for et in hetero.edge_types}, edge_label_index=(WRITES, None),
              batch_size=40, shuffle=True, neg_sampling_ratio=1.0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        same_batches(_run(PygLinkNeighborLoader, hetero, **kw), _run(LinkNeighborLoader, hetero, **kw))
        fs, gs = stores_from(data)
        kw = dict(num_neighbors=[3, 2], edge_label_index=(None, data.edge_index[:, :300]), batch_size=50,
                  shuffle=True, neg_sampling_ratio=1.0)  # a store pair names the edge type (None: homogeneous)
        same_batches(_run(PygLinkNeighborLoader, (fs, gs), **kw), _run(LinkNeighborLoader, (fs, gs), **kw))


@pytest.mark.parametrize("mode", ["none", "binary", "triplet", "labels"])
def test_directloads_batches_over_data(data, mode):
    kw = dict(num_neighbors=[5, 3], batch_size=50, shuffle=True, sampler="directload")
    label_index, labels = data.edge_index, torch.ones(data.edge_index.shape[1])
    if mode == "binary":
        kw["neg_sampling_ratio"] = 2.0
    if mode == "triplet":
        kw["neg_sampling"] = NegativeSampling("triplet", 3)
    if mode == "labels":
        label_index, labels = data.edge_index[:, 100:400], torch.arange(300) % 4
        kw.update(edge_label_index=label_index, edge_label=labels, neg_sampling_ratio=1.0)
        labels = labels + 1  # PyG's LinkLoader: with negatives, 0 means negative and given labels shift up
    loader = LinkNeighborLoader(data, **kw)
    assert loader.sampling == "directload"
    batches = list(loader)
    assert sum(b.input_id.numel() for b in batches) == label_index.shape[1]
    for batch in batches:
        assert torch.equal(batch.x, data.x[batch.n_id])
        assert len(batch.num_sampled_edges) == 2 and sum(batch.num_sampled_edges) == batch.e_id.numel()
        _check_edges(batch, data.edge_index)
        if mode == "triplet":
            pos = batch.input_id.numel()
            assert torch.equal(batch.n_id[batch.src_index], label_index[0][batch.input_id])
            assert torch.equal(batch.n_id[batch.dst_pos_index], label_index[1][batch.input_id])
            assert batch.dst_neg_index.shape == (pos, 3) and batch.dst_neg_index.dtype == torch.int64
            assert int(batch.dst_neg_index.max()) < batch.num_sampled_nodes[0]
        else:
            _check_binary(batch, label_index, None if mode == "none" else labels,
                          {"none": 0.0, "binary": 2.0, "labels": 1.0}[mode])


def test_directloads_batches_over_hetero_data(hetero):
    fanouts = {et: [3, 2] for et in hetero.edge_types}
    label_index = hetero[WRITES].edge_index
    loader = LinkNeighborLoader(hetero, fanouts, edge_label_index=(WRITES, None), batch_size=40, shuffle=True,
                                neg_sampling_ratio=1.0, sampler="directload")
    assert loader.sampling == "directload"
    seen = 0
    for batch in loader:
        store = batch[WRITES]
        pos = store.input_id.numel()
        seen += pos
        eli = store.edge_label_index
        assert eli.shape == (2, 2 * pos)
        assert torch.equal(batch["author"].n_id[eli[0, :pos]], label_index[0][store.input_id])
        assert torch.equal(batch["paper"].n_id[eli[1, :pos]], label_index[1][store.input_id])
        assert torch.equal(store.edge_label, torch.cat([torch.ones(pos), torch.zeros(pos)]))
        for t in ("author", "paper"):
            assert torch.equal(batch[t].x, hetero[t].x[batch[t].n_id])
        for et in hetero.edge_types:
            src_t, _, dst_t = et
            s, d = batch[et].edge_index
            ei = hetero[et].edge_index
            assert torch.equal(ei[0][batch[et].e_id], batch[src_t].n_id[s])
            assert torch.equal(ei[1][batch[et].e_id], batch[dst_t].n_id[d])
    assert seen == label_index.shape[1]


def test_directloads_batches_over_a_store_pair(data):
    fs, gs = stores_from(data)
    label_index = data.edge_index[:, :300]
    loader = LinkNeighborLoader((fs, gs), [3, 2], edge_label_index=(None, label_index), batch_size=50,
                                neg_sampling_ratio=1.0, sampler="directload")
    assert loader.sampling == "directload"
    for batch in loader:
        assert torch.equal(batch.x, data.x[batch.n_id])
        _check_binary(batch, label_index, torch.ones(300), 1.0)
        _check_edges(batch, data.edge_index)


def test_torch_manual_seed_fixes_directloads_batches(data):
    def epoch(seed):
        return _run(LinkNeighborLoader, data, seed, num_neighbors=[3, 3], batch_size=100, shuffle=True,
                    neg_sampling_ratio=1.0, sampler="directload")

    a, b, c = epoch(1), epoch(1), epoch(2)
    same_batches(a, b)
    assert not all(torch.equal(x.n_id, y.n_id) for x, y in zip(a, c))


def test_workers_take_directloads_sampler(data):
    kw = dict(num_neighbors=[3, 2], batch_size=200, neg_sampling_ratio=1.0, sampler="directload")
    seen = 0
    for batch in LinkNeighborLoader(data, num_workers=2, **kw):
        _check_binary(batch, data.edge_index, torch.ones(data.edge_index.shape[1]), 1.0)
        assert torch.equal(batch.x, data.x[batch.n_id])
        seen += batch.input_id.numel()
    assert seen == data.edge_index.shape[1]


@pytest.mark.parametrize("option,name", [(dict(subgraph_type="induced"), "subgraph_type"),
                                         (dict(directed=False), "directed")])
@pytest.mark.filterwarnings("ignore:The usage of the 'directed' argument:UserWarning")  # PyG's own deprecation
def test_options_it_lacks_give_pygs_batches_with_a_warning(data, option, name):
    kw = dict(num_neighbors=[3, 2], batch_size=64, shuffle=True, neg_sampling_ratio=1.0, **option)
    with pytest.warns(UserWarning, match=f"^directload's sampler does not implement {name}: PyG's own sampler"):
        loader = LinkNeighborLoader(data, sampler="directload", **kw)
    assert loader.sampling == "pyg"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        want = _run(PygLinkNeighborLoader, data, **kw)
    torch.manual_seed(11)
    same_batches(want, list(loader))


def test_a_users_sampler_is_kept_with_a_warning_naming_it(data):
    calls = []

    class Mine(NeighborSampler):  # a subclass of directload's own: still the user's code
        def sample_from_edges(self, inputs, neg_sampling=None):
            calls.append(inputs.row.numel())
            return super().sample_from_edges(inputs, neg_sampling)

    from torch_geometric.sampler import NeighborSampler as PygSampler

    class Theirs(PygSampler):
        def sample_from_edges(self, inputs, neg_sampling=None):
            calls.append(-inputs.row.numel())
            return super().sample_from_edges(inputs, neg_sampling)

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # directload's own class: nothing to warn about
        loader = LinkNeighborLoader(data, [2], batch_size=600, sampler="directload",
                                    neighbor_sampler=Mine(data, [2]))
    assert loader.sampling == "directload"
    assert len(list(loader)) == 4 and calls == [600] * 4
    calls.clear()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # PyG's own, about pyg-lib
        theirs = Theirs(data, [2])
    with pytest.warns(UserWarning, match=r"^neighbor_sampler=Theirs \(overrides sample_from_edges\) runs instead "
                                         "of directload's sampler$"):
        loader = LinkNeighborLoader(data, [2], batch_size=600, sampler="directload", neighbor_sampler=theirs)
    assert loader.sampling == "user"
    assert len(list(loader)) == 4 and calls == [-600] * 4


@pytest.mark.parametrize("bad", [N, -1])
def test_label_edges_outside_the_graph_are_refused_before_sampling(data, bad):
    label_index = torch.tensor([[0, 1], [2, bad]])
    for sampler in ("pyg", "directload"):
        with pytest.raises(IndexError, match=f"edge_label_index destination node id {bad} is outside the graph's "
                                             f"{N} nodes"):
            LinkNeighborLoader(data, [2], edge_label_index=label_index, sampler=sampler)


def test_edge_label_time_without_time_attr_is_pygs_error(data):
    kw = dict(edge_label_time=torch.zeros(data.edge_index.shape[1]))
    with pytest.raises(ValueError, match="conflicting 'edge_label_time' and 'time_attr'"):
        PygLinkNeighborLoader(data, [2], **kw)
    with pytest.warns(UserWarning, match="does not implement edge_label_time"), \
            pytest.raises(ValueError, match="conflicting 'edge_label_time' and 'time_attr'"):
        LinkNeighborLoader(data, [2], sampler="directload", **kw)


def test_positional_options_are_pygs(data):
    label_index = data.edge_index[:, :10]
    loader = LinkNeighborLoader(data, [2], label_index, torch.arange(10.0), batch_size=5, sampler="directload")
    batch = next(iter(loader))
    assert torch.equal(batch.n_id[batch.edge_label_index], label_index[:, batch.input_id])
    assert torch.equal(batch.edge_label, batch.input_id.float())
    most = len(inspect.signature(PygLinkNeighborLoader.__init__).parameters) - 2  # all but self and **kwargs
    with pytest.raises(TypeError, match=f"LinkNeighborLoader takes at most {most} positional arguments"):
        LinkNeighborLoader(data, [2], *([None] * (most - 1)))
