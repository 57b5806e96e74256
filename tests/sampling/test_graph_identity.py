"""A graph's identity: what from_edge_index takes (checked before any work), and the content digest that tells
two graphs apart wherever their parts live."""

import numpy as np
import pytest
import torch

import directload.graph.csc as graph_module
from directload.graph import CSCGraph, GraphError

UNSORTED = torch.tensor([[0, 2, 1, 3], [2, 0, 1, 0]])
SORTED = torch.tensor([[2, 3, 1, 0], [0, 0, 1, 2]])


@pytest.mark.parametrize("edge_index", [UNSORTED, SORTED], ids=["unsorted", "sorted"])
@pytest.mark.parametrize("length", [3, 5, 0])
def test_an_edge_weight_of_another_length_is_refused_sorted_or_not(edge_index, length):
    # unsorted edges used to index the weights by the sort's permutation: a longer list was cut silently
    with pytest.raises(GraphError, match=f"edge_weight has {length} entries for 4 edges"):
        CSCGraph.from_edge_index(edge_index, 4, edge_weight=torch.arange(length, dtype=torch.float32))


@pytest.mark.parametrize("weight,error,match", [
    (torch.ones(4, 1), TypeError, r"edge_weight must be 1-d, one weight per edge, got shape \(4, 1\)"),
    (torch.ones(4, dtype=torch.bool), TypeError, "edge_weight must be real numbers, got torch.bool"),
    (torch.ones(4, dtype=torch.complex64), TypeError, "edge_weight must be real numbers, got torch.complex64"),
    ([1.0, 1.0, 1.0, 1.0], TypeError, "edge_weight must be a 1-d tensor, one weight per edge, got list"),
    (np.array(["a"] * 4), TypeError, "edge_weight has dtype <U1: weights are real numbers"),
])
def test_an_edge_weight_that_is_not_real_numbers_is_refused(weight, error, match):
    with pytest.raises(error, match=match):
        CSCGraph.from_edge_index(UNSORTED, 4, edge_weight=weight)


@pytest.mark.parametrize("weight", [torch.tensor([1, 2, 3, 4]), np.array([1.0, 2.0, 3.0, 4.0], np.float16)])
def test_integer_and_half_weights_become_float32_in_csc_order(weight):
    g = CSCGraph.from_edge_index(UNSORTED, 4, edge_weight=weight)
    assert g.weights.dtype == torch.float32
    assert g.weights.tolist() == [2.0, 4.0, 3.0, 1.0]  # the edges into 0 (positions 1, 3), 1, 2
    assert torch.equal(g.eids, torch.tensor([1, 3, 2, 0]))


@pytest.mark.parametrize("name", ["num_nodes", "num_src_nodes"])
@pytest.mark.parametrize("value,error", [(-1, ValueError), (-5, ValueError), (True, TypeError), (2.0, TypeError),
                                         ("4", TypeError), (torch.tensor(4), TypeError)])
def test_a_node_count_that_is_not_a_count_is_refused_before_torch_sees_it(name, value, error):
    for edge_index in (torch.empty(2, 0, dtype=torch.int64), UNSORTED):  # no edges: torch raised RuntimeError
        kw = {"num_nodes": 4, name: value}
        with pytest.raises(error, match=f"{name} must be a non-negative int"):
            CSCGraph.from_edge_index(edge_index, **kw)


def test_numpy_counts_are_counts():
    g = CSCGraph.from_edge_index(UNSORTED, np.int64(5), num_src_nodes=np.int32(4))
    assert (g.num_nodes, g.num_src_nodes) == (5, 4) and type(g.num_src_nodes) is int


def test_no_edges_and_no_nodes_is_an_empty_graph():
    g = CSCGraph.from_edge_index(torch.empty(2, 0, dtype=torch.int64), 0)
    assert g.num_nodes == 0 and g.num_edges == 0 and g.indptr.tolist() == [0]


def _graph():
    return CSCGraph.from_edge_index(UNSORTED, 4, edge_weight=torch.tensor([0.5, 1.0, 2.0, 4.0]))


def test_the_digest_is_one_for_the_same_graph_wherever_it_lives(tmp_path):
    g = _graph()
    d = g.digest()
    assert isinstance(d, str) and len(d) == 8 and int(d, 16) >= 0
    assert _graph().digest() == d  # content, not identity
    assert g.to_unified("host").digest() == d
    g.save(tmp_path)
    for mmap in (True, False):
        assert CSCGraph.load(tmp_path, mmap=mmap, affinity="host").digest() == d
    parts = [None if a is None else torch.from_numpy(a.copy()) for a in g.numpy()]
    assert CSCGraph(parts[0], parts[1], eids=parts[2], weights=parts[3]).digest() == d


@pytest.mark.parametrize("change", ["one index", "one weight", "no eids", "int64 indices", "more sources",
                                    "a node more"])
def test_the_digest_tells_graphs_apart(change):
    g = _graph()
    indptr, indices, eids, weights = (torch.from_numpy(a.copy()) for a in g.numpy())
    num_src = 4
    if change == "one index":
        indices[0] = 3
    elif change == "one weight":
        weights[2] = weights[2] * 2
    elif change == "no eids":
        eids = None
    elif change == "int64 indices":
        indices = indices.to(torch.int64)  # the same values in another dtype: another graph's bytes
    elif change == "more sources":
        num_src = 5
    else:
        indptr = torch.cat([indptr, indptr[-1:]])
    other = CSCGraph(indptr, indices, eids=eids, weights=weights, num_src_nodes=num_src)
    assert other.digest() != g.digest()


def test_the_digest_is_computed_once(monkeypatch):
    g = _graph()
    calls = []
    real = graph_module._crc
    monkeypatch.setattr(graph_module, "_crc", lambda *a: calls.append(1) or real(*a))
    first = g.digest()
    assert len(calls) == 4  # indptr, indices, eids and weights, one pass each
    assert g.digest() == first and g.to_unified("host").digest() == first and len(calls) == 4


@pytest.mark.gpu
def test_a_graph_in_gpu_memory_has_the_same_digest_read_in_chunks(monkeypatch):
    g = _graph()
    want = g.digest()
    monkeypatch.setattr(graph_module, "_CHUNK", 3)  # chunks that split elements
    on_gpu = g.to("cuda")
    on_gpu._digest = None
    assert on_gpu.device.type == "cuda" and on_gpu.digest() == want
