"""directload's PyG FeatureStore and GraphStore: PyG's contract, gathers equal to indexing, clear errors."""

import numpy as np
import pytest
import torch
from conftest import DTYPES, ROW_ELEMS, random_table
from torch_geometric.data import EdgeAttr, TensorAttr

import directload
from directload.loaders.pyg import FeatureStore, GraphStore
from directload.stores import TensorStore


@pytest.fixture
def store(rng):
    fs = FeatureStore()
    fs.put_tensor(random_table(rng, 50, 37, torch.float32), group_name=None, attr_name="x", index=None)
    fs.put_tensor(torch.arange(50), group_name=None, attr_name="y", index=None)
    return fs


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("row", ROW_ELEMS)
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
def test_get_equals_indexing_for_every_dtype_and_width(rng, dtype, row, index_dtype):
    table = random_table(rng, 300, row, dtype)
    fs = FeatureStore()
    fs.put_tensor(directload.to_unified(table.clone()), group_name="paper", attr_name="x", index=None)
    idx = torch.from_numpy(rng.integers(0, 300, 123)).to(index_dtype)
    got = fs.get_tensor(group_name="paper", attr_name="x", index=idx)
    assert type(got) is torch.Tensor and got.dtype == dtype and got.device.type == "cpu"
    assert torch.equal(got.view(torch.uint8), table[idx.long()].view(torch.uint8))


def test_multi_get_is_one_batched_call_with_every_attribute(store):
    idx = torch.tensor([49, 0, 7, 7])
    x, y = store.multi_get_tensor([TensorAttr(None, "x", idx), TensorAttr(None, "y", idx)])
    assert torch.equal(x, store.table(None, "x")[idx]) and torch.equal(y, torch.tensor([49, 0, 7, 7]))
    assert store[None, "y", torch.tensor([3])].tolist() == [3]  # PyG's indexing syntax


def test_pyg_interface(store):
    assert sorted(a.attr_name for a in store.get_all_tensor_attrs()) == ["x", "y"]
    assert store.get_tensor_size(group_name=None, attr_name="x") == (50, 37)
    assert store.get_tensor_size(group_name=None, attr_name="nope") is None
    whole = store.get_tensor(group_name=None, attr_name="y", index=None)
    assert whole is store.table(None, "y")
    store.put_tensor(torch.zeros(2, dtype=torch.int64), group_name=None, attr_name="y", index=torch.tensor([0, 1]))
    assert store.table(None, "y")[:3].tolist() == [0, 0, 2]  # rows written in place
    assert store.remove_tensor(group_name=None, attr_name="y", index=None) and not store.remove_tensor(
        group_name=None, attr_name="y", index=None)
    assert [a.attr_name for a in store.get_all_tensor_attrs()] == ["x"]


def test_missing_group_or_attribute_raises_key_error(store):
    with pytest.raises(KeyError, match="no tensor 'nope' in group None"):
        store.get_tensor(group_name=None, attr_name="nope", index=torch.tensor([0]))
    with pytest.raises(KeyError, match="group 'author'"):
        store.multi_get_tensor([TensorAttr("author", "x", torch.tensor([0]))])
    with pytest.raises(KeyError, match="put the whole table first"):
        store.put_tensor(torch.zeros(1, 3), group_name=None, attr_name="z", index=torch.tensor([0]))


def test_bad_reads_raise_before_any_kernel(store):
    with pytest.raises(IndexError, match=r"row id 50 is out of range for 50 rows \(valid 0..49\)"):
        store.get_tensor(group_name=None, attr_name="x", index=torch.tensor([0, 50]))
    with pytest.raises(TypeError, match="int32 or int64"):
        store.get_tensor(group_name=None, attr_name="x", index=torch.tensor([0.0]))
    with pytest.raises(ValueError, match="not fully specified"):
        store.get_tensor(attr_name="x")  # PyG's own check
    with pytest.raises(ValueError, match="at least one dimension"):
        FeatureStore().put_tensor(torch.tensor(1.0), group_name=None, attr_name="s", index=None)


def test_numpy_tables_become_tensors(rng):
    fs = FeatureStore()
    fs.put_tensor(rng.standard_normal((20, 4)).astype(np.float32), group_name=None, attr_name="x", index=None)
    got = fs.get_tensor(group_name=None, attr_name="x", index=torch.tensor([3, 1]))
    assert isinstance(fs.table(None, "x"), torch.Tensor) and torch.equal(got, fs.table(None, "x")[[3, 1]])


class _Store(TensorStore):
    def __init__(self, table):
        super().__init__(table)
        self.prefetched = []

    def prefetch(self, ids):
        self.prefetched.append(ids)


def test_a_directload_store_behind_an_attribute_gets_reads_and_hints():
    inner = _Store(torch.arange(30.0).reshape(10, 3))
    fs = FeatureStore()
    fs.put_tensor(inner, group_name="a", attr_name="x", index=None)
    assert fs.get_tensor(group_name="a", attr_name="x", index=torch.tensor([9])).tolist() == [[27.0, 28.0, 29.0]]
    fs.prefetch(torch.tensor([1, 2]), "a")
    fs.prefetch(torch.tensor([5]), "b")  # another group: not this store's
    assert [t.tolist() for t in inner.prefetched] == [[1, 2]]


def test_tables_that_need_autograd_are_sliced_by_torch():
    w = torch.nn.Parameter(torch.randn(6, 2))
    fs = FeatureStore()
    fs.put_tensor(w, group_name=None, attr_name="emb", index=None)
    got = fs.get_tensor(group_name=None, attr_name="emb", index=torch.tensor([1, 4]))
    got.sum().backward()
    assert w.grad[[1, 4]].eq(1).all() and w.grad.sum().item() == 4


def test_graph_store_keeps_edges_with_their_sizes():
    gs = GraphStore()
    row, col = torch.tensor([0, 1, 2]), torch.tensor([1, 2, 0])
    assert gs.put_edge_index((row, col), edge_type=None, layout="coo", size=(3, 3))
    attr = gs.get_all_edge_attrs()[0]
    assert attr.size == (3, 3) and attr.layout.value == "coo"
    got = gs.get_edge_index(attr)
    assert torch.equal(got[0], row) and torch.equal(got[1], col)
    colptr_row = gs.csc()  # PyG's conversion, as its samplers call it
    assert colptr_row[1].tolist() == [0, 1, 2, 3]
    assert gs.remove_edge_index(edge_type=None, layout="coo", size=(3, 3))
    with pytest.raises(ValueError, match="give size"):
        gs.put_edge_index((row, col), EdgeAttr(None, "coo"))


def test_tables_are_read_through_a_tensor_store_made_at_each_read(monkeypatch):
    reads = []
    real = TensorStore.read_async
    monkeypatch.setattr(TensorStore, "read_async",
                        lambda self, ids, **kw: reads.append(self.table) or real(self, ids, **kw))
    fs = FeatureStore()
    fs.put_tensor(torch.arange(30.0).reshape(10, 3), group_name=None, attr_name="x", index=None)
    table = fs.table(None, "x")
    got = fs.get_tensor(group_name=None, attr_name="x", index=torch.tensor([9, 0]))
    assert got.tolist() == [[27, 28, 29], [0, 1, 2]]
    table.mul_(2)  # in place: the next read sees it
    assert fs.get_tensor(group_name=None, attr_name="x", index=torch.tensor([9])).tolist() == [[54, 56, 58]]
    assert len(reads) == 2 and all(t is table for t in reads)


def test_an_object_that_is_neither_a_table_nor_a_feature_store_is_refused():
    class Duck:
        shape = (10, 3)

        def gather(self, ids, device):
            return torch.zeros(len(ids), 3)

    with pytest.raises(TypeError, match="directload.stores.FeatureStore"):
        FeatureStore().put_tensor(Duck(), group_name=None, attr_name="x", index=None)
