"""PyG's NeighborLoader over directload: the same batches as PyG's own, over a Data or (FeatureStore, GraphStore)."""

import pytest
import torch
import torch.nn.functional as F
from conftest import drain_from_threads, within
from torch_geometric.data import Data, HeteroData
from torch_geometric.loader import NeighborLoader as PygNeighborLoader
from torch_geometric.nn import SAGEConv

import directload
from directload.loaders.pyg import FeatureStore, NeighborLoader, stores_from
from directload.stores import TensorStore


@pytest.fixture
def data():
    torch.manual_seed(3)
    n = 700
    return Data(x=torch.randn(n, 37), y=torch.randint(0, 5, (n,)), edge_index=torch.randint(0, n, (2, 6000)),
                edge_attr=torch.randn(6000, 2), train_mask=torch.rand(n) < 0.5, num_nodes=n)


def _batches(loader, seed=0):
    torch.manual_seed(seed)
    return list(loader)


def _assert_same(a, b, keys=None):
    keys = keys or sorted(set(a.keys()) | set(b.keys()))
    for key in keys:
        x, y = a[key], b[key]
        if isinstance(x, torch.Tensor):
            assert type(y) is torch.Tensor and x.dtype == y.dtype and torch.equal(x, y), key
        else:
            assert x == y, key


@pytest.mark.parametrize("shuffle", [False, True])
def test_over_data_the_batches_equal_pygs(data, shuffle):
    kw = dict(num_neighbors=[5, 3], input_nodes=data.train_mask, batch_size=64, shuffle=shuffle)
    want = _batches(PygNeighborLoader(data, **kw))
    got = _batches(NeighborLoader(data, **kw))
    assert len(got) == len(want) > 1
    for a, b in zip(want, got):
        assert sorted(a.keys()) == sorted(b.keys())  # edge_attr, masks and every bookkeeping field
        _assert_same(a, b)
        assert torch.equal(b.x, data.x[b.n_id])


def test_over_feature_and_graph_stores_the_batches_equal_pygs_over_data(data):
    fs, gs = stores_from(data)
    kw = dict(num_neighbors=[4, 4], input_nodes=torch.arange(300), batch_size=50, shuffle=True)
    want = _batches(PygNeighborLoader(data, **kw))
    for loader_cls in (PygNeighborLoader, NeighborLoader):
        got = _batches(loader_cls((fs, gs), **kw))
        assert len(got) == len(want) == 6
        for a, b in zip(want, got):
            _assert_same(a, b, ["x", "y", "edge_index", "n_id", "batch_size", "input_id", "train_mask"])


def test_the_tables_are_unified_and_the_user_data_untouched(data):
    x = data.x
    loader = NeighborLoader(data, num_neighbors=[2], batch_size=10)
    assert directload.is_unified(loader.data.x) and loader.data.x.host.data_ptr() == x.data_ptr()  # zero-copy
    assert data.x is x and not directload.is_unified(data.x)


def test_heterogeneous_graphs_get_one_table_per_node_type():
    torch.manual_seed(0)
    h = HeteroData()
    h["paper"].x, h["paper"].y = torch.randn(80, 6), torch.randint(0, 3, (80,))
    h["author"].x = torch.randn(40, 4)
    h["author", "writes", "paper"].edge_index = torch.stack([torch.randint(0, 40, (300,)),
                                                              torch.randint(0, 80, (300,))])
    h["paper", "rev_writes", "author"].edge_index = h["author", "writes", "paper"].edge_index.flip(0)
    kw = dict(num_neighbors=[3, 3], input_nodes=("paper", torch.arange(80)), batch_size=20, shuffle=True)
    want = _batches(PygNeighborLoader(h, **kw))
    got = _batches(NeighborLoader(h, **kw))
    fs, gs = stores_from(h)
    assert sorted((a.group_name, a.attr_name) for a in fs.get_all_tensor_attrs()) == [
        ("author", "x"), ("paper", "x"), ("paper", "y")]
    via_stores = _batches(NeighborLoader((fs, gs), **kw))
    assert len(want) == len(got) == len(via_stores) == 4
    for a, b, c in zip(want, got, via_stores):
        for nt in ("paper", "author"):
            _assert_same(a[nt], b[nt])
            assert torch.equal(c[nt].x, a[nt].x) and torch.equal(c[nt].n_id, a[nt].n_id)


def test_look_ahead_prefetch_hints_and_upcoming(data):
    class Store(TensorStore):
        def __init__(self, table):
            super().__init__(table)
            self.hints = []

        def prefetch(self, ids):
            self.hints.append(ids.clone())

    fs, gs = stores_from(data)
    inner = Store(data.x)
    fs.put_tensor(inner, group_name=None, attr_name="x", index=None)
    loader = NeighborLoader((fs, gs), num_neighbors=[3], input_nodes=torch.arange(400), batch_size=50, lookahead=3)
    it = iter(loader)
    ahead = it.upcoming()
    assert len(ahead) == 3 and len(inner.hints) == 3  # filled at iter(), before the first batch
    first = next(it)
    assert torch.equal(first.n_id, ahead[0]) and torch.equal(inner.hints[0], first.n_id)
    assert torch.equal(first.x, data.x[first.n_id])
    rest = list(it)
    assert len(rest) == 7 and len(inner.hints) == 8


@pytest.mark.parametrize("bad", [700, -1, 2**40])
def test_seeds_outside_the_graph_raise_index_error(data, bad):
    with pytest.raises(IndexError, match=f"seed node id {bad} is outside the graph's 700 nodes"):
        NeighborLoader(data, num_neighbors=[2], input_nodes=torch.tensor([0, bad]), batch_size=2)


@pytest.mark.parametrize("kw,match", [({"batch_size": 0}, "batch_size"), ({"lookahead": 0}, "lookahead")])
def test_bad_sizes_are_refused(data, kw, match):
    with pytest.raises(ValueError, match=match):
        NeighborLoader(data, num_neighbors=[2], **{"batch_size": 4, **kw})


def test_no_sampler_names_the_extra_before_any_work(data, monkeypatch):
    # Without pyg-lib and torch-sparse the default is directload's sampler (tests/loaders/pyg_loader/
    # test_pyg_sampler.py); asking for PyG's own names the extra that installs it.
    import torch_geometric.typing as pyg_typing

    monkeypatch.setattr(pyg_typing, "WITH_PYG_LIB", False)
    monkeypatch.setattr(pyg_typing, "WITH_TORCH_SPARSE", False)
    with pytest.raises(ImportError, match=r"pyg-lib or torch-sparse.*directload\[pyg-sampler\]"):
        NeighborLoader(data, num_neighbors=[2], batch_size=4, sampler="pyg")
    assert type(data.x) is torch.Tensor  # nothing was registered


def test_a_failing_feature_read_reaches_the_loop_and_nothing_hangs(data):
    class Broken(FeatureStore):
        def _multi_get_tensor(self, attrs):
            raise OSError("disk gone")

    _, gs = stores_from(data)
    fs = Broken()
    fs.put_tensor(data.x, group_name=None, attr_name="x", index=None)
    loader = NeighborLoader((fs, gs), num_neighbors=[2], input_nodes=torch.arange(100), batch_size=10,
                            sample_in_thread=True, overlap=True)
    with pytest.raises(OSError, match="disk gone"):
        within(30, lambda: list(loader))


def test_it_trains_exactly_like_pygs_loader(data):
    losses = {}
    for cls in (PygNeighborLoader, NeighborLoader):
        torch.manual_seed(0)
        model = torch.nn.ModuleList([SAGEConv(37, 16), SAGEConv(16, 5)])
        opt = torch.optim.Adam(model.parameters(), lr=1e-2)
        run = []
        for _ in range(3):
            for batch in cls(data, num_neighbors=[5, 5], input_nodes=data.train_mask, batch_size=64, shuffle=True):
                h = F.relu(model[0](batch.x, batch.edge_index))
                out = model[1](h, batch.edge_index)[:batch.batch_size]
                loss = F.cross_entropy(out, batch.y[:batch.batch_size])
                opt.zero_grad()
                loss.backward()
                opt.step()
                run.append(loss.item())
        losses[cls] = run
    assert losses[NeighborLoader] == losses[PygNeighborLoader]
    assert losses[NeighborLoader][-1] < losses[NeighborLoader][0]


def test_one_epoch_shared_by_two_threads_delivers_every_batch_once(data):
    loader = NeighborLoader(data, num_neighbors=[3, 2], batch_size=20, shuffle=True)
    for _ in range(3):
        got = drain_from_threads(iter(loader))
        seeds = torch.cat([b.n_id[:b.batch_size] for b in got])
        assert len(got) == len(loader) and torch.equal(seeds.sort().values, torch.arange(700))
