"""PyG's own example idioms with one import changed: every option gives PyG's batches, or PyG's own error."""

import copy

import pytest
import torch
import torch_geometric.transforms as T
from torch_geometric.data import Data, HeteroData
from torch_geometric.loader import NeighborLoader as PygNeighborLoader

from directload.loaders.pyg import NeighborLoader


@pytest.fixture
def data():
    torch.manual_seed(5)
    n = 400
    return Data(x=torch.randn(n, 11), y=torch.randint(0, 4, (n,)), edge_index=torch.randint(0, n, (2, 3000)),
                train_mask=torch.rand(n) < 0.4, num_nodes=n)


def _run(cls, data, **kw):
    """The batches, or the exception, that one loader gives (same seed for both loaders)."""
    torch.manual_seed(11)
    try:
        return list(cls(data, **kw))
    except Exception as exc:  # noqa: BLE001 - the comparison below wants PyG's exact failure
        return exc


def _same(want, got):
    if isinstance(want, Exception):
        assert type(got) is type(want) and str(got) == str(want)
        return
    assert not isinstance(got, Exception), got
    assert len(got) == len(want) > 0
    for a, b in zip(want, got):
        if isinstance(a, HeteroData):
            assert a.node_types == b.node_types and a.edge_types == b.edge_types
            stores = list(zip(a.stores, b.stores))
        else:
            stores = [(a, b)]
        for sa, sb in stores:
            assert sorted(sa.keys()) == sorted(sb.keys())
            for key in sa.keys():
                x, y = sa[key], sb[key]
                if isinstance(x, torch.Tensor):
                    assert type(y) is torch.Tensor and x.dtype == y.dtype and torch.equal(x, y), key
                else:
                    assert x == y, key


@pytest.mark.parametrize("kw", [
    dict(subgraph_type="induced"),
    dict(subgraph_type="bidirectional"),
    dict(disjoint=True),
    dict(replace=True),
    dict(drop_last=True, batch_size=30),
    dict(transform=T.ToUndirected()),
    dict(transform=T.Compose([T.AddSelfLoops(), T.NormalizeFeatures()])),
    dict(num_neighbors=[-1]),
    dict(num_neighbors=[0, 0]),
    dict(directed=False),
    dict(time_attr="t"),
], ids=lambda kw: ",".join(kw))
@pytest.mark.filterwarnings("ignore:The usage of the 'directed' argument:UserWarning")  # PyG's own deprecation
def test_every_option_gives_pygs_batches_or_pygs_error(data, kw):
    kw = {"num_neighbors": [4, 3], "input_nodes": data.train_mask, "batch_size": 40, "shuffle": True, **kw}
    _same(_run(PygNeighborLoader, data, **kw), _run(NeighborLoader, data, **kw))


def test_reddit_example_training_and_layerwise_inference(data):
    """examples/reddit.py: workers for training, then a full-neighbour loader without features."""
    kw = dict(batch_size=64, num_workers=2, persistent_workers=True)
    train = NeighborLoader(data, input_nodes=data.train_mask, num_neighbors=[5, 3], shuffle=True, **kw)
    for _ in range(2):  # persistent workers serve a second epoch
        seen = 0
        for batch in train:
            assert torch.equal(batch.x, data.x[batch.n_id]) and batch.x.dtype == torch.float32
            seen += batch.batch_size
        assert seen == int(data.train_mask.sum())
    subgraph_loader = NeighborLoader(copy.copy(data), input_nodes=None, num_neighbors=[-1], shuffle=False, **kw)
    del subgraph_loader.data.x, subgraph_loader.data.y  # the example's idiom: no features in this loader
    subgraph_loader.data.num_nodes = data.num_nodes
    subgraph_loader.data.n_id = torch.arange(data.num_nodes)
    x_all, out = data.x, torch.empty(data.num_nodes, data.x.size(1))
    for batch in subgraph_loader:
        assert "x" not in batch
        out[batch.n_id[:batch.batch_size]] = x_all[batch.n_id.to(x_all.device)][:batch.batch_size]
    assert torch.equal(out, data.x)
    assert data.x is not None and "x" in data  # the user's data keeps its features


def test_hetero_mag_example_with_dict_fanouts():
    """examples/hetero/to_hetero_mag.py: one fanout list per edge type, seeds of one node type."""
    torch.manual_seed(2)
    data = HeteroData()
    data["paper"].x = torch.randn(300, 6)
    data["paper"].y = torch.randint(0, 3, (300,))
    data["paper"].train_mask = torch.rand(300) < 0.5
    data["author"].x = torch.randn(120, 6)
    data["paper", "cites", "paper"].edge_index = torch.randint(0, 300, (2, 1500))
    data["author", "writes", "paper"].edge_index = torch.stack(
        [torch.randint(0, 120, (900,)), torch.randint(0, 300, (900,))])
    data = T.ToUndirected()(data)
    kw = dict(num_neighbors={key: [6] * 2 for key in data.edge_types}, shuffle=True, batch_size=32,
              input_nodes=("paper", data["paper"].train_mask))
    want, got = _run(PygNeighborLoader, data, **kw), _run(NeighborLoader, data, **kw)
    _same(want, got)
    assert torch.equal(got[0]["author"].x, data["author"].x[got[0]["author"].n_id])
