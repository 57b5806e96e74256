"""directload's sampler in PyG: batches PyG's own code builds (n_id, e_id, batch_size, per-hop counts), trimming
with ``trim_to_layer``, heterogeneous and link loaders, fallbacks that warn, and training to PyG's accuracy."""

import warnings

import pytest
import torch
import torch.nn.functional as F
import torch_geometric.typing as pyg_typing
from torch_geometric.data import Data, HeteroData
from torch_geometric.loader import LinkNeighborLoader
from torch_geometric.loader import NeighborLoader as PygNeighborLoader
from torch_geometric.nn import SAGEConv
from torch_geometric.utils import trim_to_layer

from directload.loaders.pyg import NeighborLoader, NeighborSampler, stores_from


@pytest.fixture
def data():
    g = torch.Generator().manual_seed(3)
    n = 700
    return Data(x=torch.randn(n, 37, generator=g), y=torch.randint(0, 5, (n,), generator=g),
                edge_index=torch.randint(0, n, (2, 6000), generator=g), edge_attr=torch.randn(6000, 2, generator=g),
                w=torch.rand(6000, generator=g), train_mask=torch.rand(n, generator=g) < 0.5, num_nodes=n)


def _check_batch(batch, data, fanouts):
    assert batch.n_id.dtype == batch.e_id.dtype == torch.int64
    assert torch.equal(batch.x, data.x[batch.n_id]) and torch.equal(batch.y, data.y[batch.n_id])
    src, dst = batch.n_id[batch.edge_index]
    assert torch.equal(data.edge_index[0][batch.e_id], src) and torch.equal(data.edge_index[1][batch.e_id], dst)
    assert torch.equal(batch.edge_attr, data.edge_attr[batch.e_id])
    assert batch.num_sampled_nodes[0] == batch.batch_size and len(batch.num_sampled_edges) == len(fanouts)
    assert sum(batch.num_sampled_nodes) == batch.num_nodes
    assert sum(batch.num_sampled_edges) == batch.edge_index.shape[1]
    # Hop h's edges point into the nodes new at hop h - 1 and come from nodes reached by hop h.
    bounds = torch.tensor([0, *batch.num_sampled_nodes]).cumsum(0)
    start = 0
    for h, count in enumerate(batch.num_sampled_edges):
        s, d = batch.edge_index[:, start:start + count]
        assert bool(((d >= bounds[h]) & (d < bounds[h + 1])).all()) and bool((s < bounds[h + 2]).all())
        start += count


@pytest.mark.parametrize("fanouts", [[5, 3], [-1, 2], [4, 0, 2]])
def test_directloads_batches_carry_what_pyg_models_read(data, fanouts):
    loader = NeighborLoader(data, fanouts, input_nodes=data.train_mask, batch_size=64, shuffle=True,
                            sampler="directload")
    assert loader.sampling == "directload"
    batches = list(loader)
    assert len(batches) == -(-int(data.train_mask.sum()) // 64)
    for batch in batches:
        _check_batch(batch, data, fanouts)


def test_pygs_own_loader_takes_it_through_neighbor_sampler(data):
    sampler = NeighborSampler(data, [4, 4], weight_attr="w")
    loader = PygNeighborLoader(data, [4, 4], batch_size=50, neighbor_sampler=sampler)
    for batch in loader:
        _check_batch(batch, data, [4, 4])
    assert repr(sampler).startswith("directload.loaders.pyg.NeighborSampler(NeighborSampler(fanouts=[4, 4]")


def test_torch_manual_seed_fixes_the_batches(data):
    def epoch(seed):
        torch.manual_seed(seed)
        return list(NeighborLoader(data, [3, 3], batch_size=100, shuffle=True, sampler="directload"))

    a, b, c = epoch(1), epoch(1), epoch(2)
    assert all(torch.equal(x.n_id, y.n_id) and torch.equal(x.edge_index, y.edge_index) for x, y in zip(a, b))
    assert not all(torch.equal(x.n_id, y.n_id) for x, y in zip(a, c))


def test_trim_to_layer_runs_on_the_reported_counts(data):
    # PyG's examples/hierarchical_sage.py: trim_to_layer needs num_sampled_nodes, which torch-sparse never reports.
    conv = [SAGEConv(37, 16), SAGEConv(16, 16)]
    batch = next(iter(NeighborLoader(data, [4, 3], batch_size=32, sampler="directload")))
    x, edge_index = batch.x, batch.edge_index
    whole = x
    for i, layer in enumerate(conv):
        x, edge_index, _ = trim_to_layer(i, batch.num_sampled_nodes, batch.num_sampled_edges, x, edge_index)
        x = layer(x, edge_index).relu()
    for layer in conv:
        whole = layer(whole, batch.edge_index).relu()
    torch.testing.assert_close(x[:32], whole[:32], atol=1e-5, rtol=1e-4)


def test_over_feature_and_graph_stores(data):
    fs, gs = stores_from(data)
    loader = NeighborLoader((fs, gs), [3, 2], input_nodes=torch.arange(700), batch_size=100, sampler="directload")
    for batch in loader:
        assert torch.equal(batch.x, data.x[batch.n_id])
        src, dst = batch.n_id[batch.edge_index]
        assert torch.equal(data.edge_index[0][batch.e_id], src) and torch.equal(data.edge_index[1][batch.e_id], dst)


def test_heterogeneous_with_per_edge_type_fanouts():
    g = torch.Generator().manual_seed(0)
    h = HeteroData()
    h["paper"].x = torch.randn(60, 4, generator=g)
    h["author"].x = torch.randn(30, 3, generator=g)
    writes = torch.stack([torch.randint(0, 30, (200,), generator=g), torch.randint(0, 60, (200,), generator=g)])
    h["author", "writes", "paper"].edge_index = writes
    h["paper", "cites", "paper"].edge_index = torch.randint(0, 60, (2, 300), generator=g)
    h["paper", "rev_writes", "author"].edge_index = writes.flip(0)
    fanouts = {("author", "writes", "paper"): [3, 2], ("paper", "cites", "paper"): [2, 2],
               ("paper", "rev_writes", "author"): [0, 4]}
    loader = NeighborLoader(h, fanouts, input_nodes=("paper", torch.arange(20)), batch_size=10,
                            sampler="directload")
    for batch in loader:
        assert batch["paper"].batch_size == 10
        assert torch.equal(batch["paper"].x, h["paper"].x[batch["paper"].n_id])
        assert torch.equal(batch["author"].x, h["author"].x[batch["author"].n_id])
        for et in h.edge_types:
            src_t, _, dst_t = et
            s, d = batch[et].edge_index
            ei = h[et].edge_index
            e_id = batch[et].e_id
            assert torch.equal(ei[0][e_id], batch[src_t].n_id[s]) and torch.equal(ei[1][e_id], batch[dst_t].n_id[d])
        assert batch["paper"].num_sampled_nodes[0] == 10
        assert batch["author", "rev_writes", "paper"] is not None


def test_link_neighbor_loader(data):
    loader = LinkNeighborLoader(data, [3, 2], edge_label_index=data.edge_index[:, :200], batch_size=50,
                                neighbor_sampler=NeighborSampler(data, [3, 2]))
    for batch in loader:
        assert torch.equal(batch.x, data.x[batch.n_id])
        label = batch.n_id[batch.edge_label_index]
        assert label.shape == (2, 50)


@pytest.mark.parametrize("option", [dict(disjoint=True), dict(subgraph_type="induced")])
def test_options_it_lacks_fall_back_to_pygs_batches_with_a_warning(data, option):
    kw = dict(batch_size=64, shuffle=True, **option)
    if option.get("disjoint") and not pyg_typing.WITH_PYG_LIB:
        pytest.skip("disjoint sampling needs pyg-lib, which is not installed")
    with pytest.warns(UserWarning, match="does not implement"):
        loader = NeighborLoader(data, [3, 2], sampler="directload", **kw)
    assert loader.sampling == "pyg"
    torch.manual_seed(0)
    want = list(PygNeighborLoader(data, [3, 2], **kw))
    torch.manual_seed(0)
    got = list(loader)
    assert all(torch.equal(a.n_id, b.n_id) and torch.equal(a.edge_index, b.edge_index) for a, b in zip(want, got))


def test_default_is_pygs_sampler_and_ours_where_pyg_has_none(data, monkeypatch):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert NeighborLoader(data, [2], batch_size=10).sampling == "pyg"
    monkeypatch.setattr(pyg_typing, "WITH_PYG_LIB", False)
    monkeypatch.setattr(pyg_typing, "WITH_TORCH_SPARSE", False)
    monkeypatch.setattr("directload.loaders.pyg.loader._NOTED", set())  # said once a process: another test may have
    with pytest.warns(UserWarning, match="neither pyg-lib nor torch-sparse"):
        loader = NeighborLoader(data, [2], batch_size=10)
    assert loader.sampling == "directload"
    _check_batch(next(iter(loader)), data, [2])
    with pytest.raises(ImportError, match="needs pyg-lib or torch-sparse"):
        NeighborLoader(data, [2], batch_size=10, sampler="pyg")


def test_bad_options_are_refused_before_work(data):
    with pytest.raises(ValueError, match="sampler must be"):
        NeighborLoader(data, [2], sampler="mine")
    with pytest.raises(ValueError, match="weight_attr 'nope'"):
        NeighborLoader(data, [2], sampler="directload", weight_attr="nope")
    with pytest.raises(ValueError, match=r"num_neighbors|fanouts\[0\]"):
        NeighborLoader(data, [-5], sampler="directload")


def _train(data, sampler, seed, epochs=8):
    torch.manual_seed(seed)
    conv1, conv2 = SAGEConv(data.num_features, 32), SAGEConv(32, int(data.y.max()) + 1)
    params = [*conv1.parameters(), *conv2.parameters()]
    opt = torch.optim.Adam(params, lr=0.01)
    train = data.train_mask.nonzero().view(-1)
    test = (~data.train_mask).nonzero().view(-1)
    kw = dict(neighbor_sampler=NeighborSampler(data, [10, 5])) if sampler == "directload" else {}
    for _ in range(epochs):
        for batch in PygNeighborLoader(data, [10, 5], input_nodes=train, batch_size=128, shuffle=True, **kw):
            out = conv2(conv1(batch.x, batch.edge_index).relu(), batch.edge_index)[:batch.batch_size]
            loss = F.cross_entropy(out, batch.y[:batch.batch_size])
            opt.zero_grad()
            loss.backward()
            opt.step()
    correct = 0
    with torch.no_grad():
        for batch in PygNeighborLoader(data, [10, 5], input_nodes=test, batch_size=512, **kw):
            out = conv2(conv1(batch.x, batch.edge_index).relu(), batch.edge_index)[:batch.batch_size]
            correct += int((out.argmax(1) == batch.y[:batch.batch_size]).sum())
    return correct / test.numel()


def test_models_train_to_pygs_accuracy_over_three_seeds():
    # Labels follow a planted partition (a node's label is its community's, and 80% of edges stay inside it), so
    # neighbours carry the signal and a biased or broken sampler would show.
    g = torch.Generator().manual_seed(0)
    n, classes = 2000, 4
    y = torch.randint(0, classes, (n,), generator=g)
    src = torch.randint(0, n, (20000,), generator=g)
    same = torch.rand(20000, generator=g) < 0.8
    by_class = [torch.nonzero(y == c).view(-1) for c in range(classes)]
    dst = src.clone()
    for c in range(classes):
        pick = same & (y[src] == c)
        dst[pick] = by_class[c][torch.randint(0, by_class[c].numel(), (int(pick.sum()),), generator=g)]
    dst[~same] = torch.randint(0, n, (int((~same).sum()),), generator=g)
    x = F.one_hot(y, classes).float() * 0.5 + torch.randn(n, classes, generator=g)
    data = Data(x=x, y=y, edge_index=torch.stack([src, dst]), train_mask=torch.rand(n, generator=g) < 0.5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pyg = [_train(data, "pyg", s) for s in range(3)]
    ours = [_train(data, "directload", s) for s in range(3)]
    # Within PyG's spread widened by 2 points (measured when written: PyG 0.864-0.886, ours 0.867-0.876): three
    # seeds give a narrow spread, and the features alone are weak (a signal of 0.5 against noise of 1), so a
    # sampler that reads the wrong neighbours, or too few, loses more than that.
    assert min(pyg) - 0.02 <= sum(ours) / 3 <= max(pyg) + 0.02, (pyg, ours)
    assert min(ours) > 0.8, ours
