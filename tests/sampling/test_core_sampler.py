"""directload.sampler and directload.graph: the batch layout each framework needs, same key same batch on any
thread count, and bad input refused before any work."""

import numba
import numpy as np
import pytest
import torch

from directload.graph import CSCGraph, GraphError
from directload.sampler import HeteroNeighborSampler, NeighborSampler

N = 400


@pytest.fixture(scope="module")
def graph():
    g = torch.Generator().manual_seed(5)
    edge_index = torch.randint(0, N, (2, 4000), generator=g)
    edge_index[:, :30] = torch.tensor([7, 9]).repeat(30, 1).T  # parallel edges: a neighbour may repeat, an edge not
    return edge_index, CSCGraph.from_edge_index(edge_index, N)


def _edges(batch):
    return [torch.cat(parts) for parts in zip(*batch.hops)]


@pytest.mark.parametrize("layout", ["pyg", "dgl"])
@pytest.mark.parametrize("fanouts", [[3, 2], [-1], [0, 4], [25, 1]])
def test_every_pick_is_a_distinct_real_in_edge(graph, layout, fanouts):
    edge_index, g = graph
    seeds = torch.tensor([7, 0, 399, 12, 9])
    b = NeighborSampler(g, fanouts, layout=layout).sample(seeds, key=3)
    assert b.nodes.dtype == torch.int64 and b.nodes.device.type == "cpu"
    assert torch.equal(b.nodes[:5], seeds)
    assert b.nodes.unique().numel() == b.nodes.numel()
    assert len(b.num_sampled_nodes) == len(fanouts) + 1 and sum(b.num_sampled_nodes) == b.nodes.numel()
    deg = torch.bincount(edge_index[1], minlength=N)
    start, end = 0, 5
    for hop, (row, col, eid) in enumerate(b.hops):
        assert row.dtype == col.dtype == eid.dtype == torch.int64
        assert row.numel() == b.num_sampled_edges[hop]
        src, dst = b.nodes[row], b.nodes[col]
        assert torch.equal(edge_index[0][eid], src) and torch.equal(edge_index[1][eid], dst)
        frontier = b.nodes[start if layout == "pyg" else 0:end]
        per = torch.bincount(col, minlength=end)[start if layout == "pyg" else 0:end]
        k = fanouts[hop]
        want = deg[frontier] if k < 0 else torch.clamp(deg[frontier], max=k)
        assert torch.equal(per, want)
        for v in col.unique():  # no edge twice for one node
            assert eid[col == v].unique().numel() == int((col == v).sum())
        start, end = end, end + b.num_sampled_nodes[hop + 1]


def test_pyg_layout_sorts_edges_by_destination_hop_by_hop(graph):
    _, g = graph
    b = NeighborSampler(g, [4, 3, 2]).sample(torch.arange(20), key=1)
    _, col, _ = _edges(b)
    assert bool((col[1:] >= col[:-1]).all())


def test_same_key_same_batch_on_any_thread_count(graph):
    _, g = graph
    s = NeighborSampler(g, [5, 5, 5], layout="dgl")
    threads = numba.get_num_threads()
    try:
        numba.set_num_threads(1)
        one = s.sample(torch.arange(50), key=99)
        numba.set_num_threads(numba.config.NUMBA_NUM_THREADS)
        many = s.sample(torch.arange(50), key=99)
    finally:
        numba.set_num_threads(threads)
    assert torch.equal(one.nodes, many.nodes)
    for a, b in zip(one.hops, many.hops):
        assert all(torch.equal(x, y) for x, y in zip(a, b))
    other = s.sample(torch.arange(50), key=100)
    assert not torch.equal(other.nodes, one.nodes)


def test_keys_follow_torch_manual_seed(graph):
    _, g = graph
    s = NeighborSampler(g, [3])
    torch.manual_seed(4)
    a = s.sample(torch.arange(10))
    torch.manual_seed(4)
    b = s.sample(torch.arange(10))
    assert a.key == b.key and torch.equal(a.nodes, b.nodes)
    gen = torch.Generator().manual_seed(4)
    assert NeighborSampler(g, [3], generator=gen).sample(torch.arange(10)).key == a.key


def test_a_repeated_seed_keeps_its_place(graph):
    _, g = graph
    b = NeighborSampler(g, [2]).sample(torch.tensor([3, 3, 5]), key=0)
    assert b.nodes[:3].tolist() == [3, 3, 5]
    row, col, _ = b.hops[0]
    assert torch.equal(row[col == 0], row[col == 1])  # the same node, the same picks


def test_weighted_never_picks_a_zero_weight_edge():
    edge_index = torch.tensor([[1, 2, 3, 4], [0, 0, 0, 0]])
    g = CSCGraph.from_edge_index(edge_index, 5, edge_weight=torch.tensor([0.0, 1.0, 0.0, 2.0]))
    s = NeighborSampler(g, [3], weighted=True)
    for key in range(50):
        b = s.sample(torch.tensor([0]), key=key)
        assert sorted(b.nodes[1:].tolist()) == [2, 4]


def test_hetero_samples_each_relation_into_its_types():
    gen = torch.Generator().manual_seed(0)
    writes = torch.stack([torch.randint(0, 30, (200,), generator=gen), torch.randint(0, 50, (200,), generator=gen)])
    cites = torch.randint(0, 50, (2, 300), generator=gen)
    graphs = {("author", "writes", "paper"): CSCGraph.from_edge_index(writes, 50, num_src_nodes=30),
              ("paper", "cites", "paper"): CSCGraph.from_edge_index(cites, 50)}
    s = HeteroNeighborSampler(graphs, {"author": 30, "paper": 50},
                              {("author", "writes", "paper"): [2, 0], ("paper", "cites", "paper"): [3, 2]})
    b = s.sample({"paper": torch.tensor([1, 2])}, key=8)
    assert b.nodes["paper"][:2].tolist() == [1, 2]
    assert b.num_sampled_nodes["author"][0] == 0 and b.num_sampled_edges[("author", "writes", "paper")][1] == 0
    for et, ei in ((("author", "writes", "paper"), writes), (("paper", "cites", "paper"), cites)):
        src_t, _, dst_t = et
        for hop in b.hops:
            row, col, eid = hop[et]
            assert torch.equal(ei[0][eid], b.nodes[src_t][row]) and torch.equal(ei[1][eid], b.nodes[dst_t][col])


@pytest.mark.parametrize("make,error,match", [
    (lambda g: NeighborSampler(g, [2, -3]), ValueError, r"fanouts\[1\] is -3"),
    (lambda g: NeighborSampler(g, []), ValueError, "fanouts is empty"),
    (lambda g: NeighborSampler(g, [2.5]), TypeError, r"fanouts\[0\] must be an int"),
    (lambda g: NeighborSampler(g, [2], layout="x"), ValueError, "layout must be one of"),
    (lambda g: NeighborSampler(g, [2], weighted=True), ValueError, "needs a graph with weights"),
    (lambda g: NeighborSampler(g, [2]).sample(torch.tensor([N])), IndexError, f"seed {N} is outside"),
    (lambda g: NeighborSampler(g, [2]).sample(torch.tensor([-1])), IndexError, "seed -1 is outside"),
    (lambda g: NeighborSampler(g, [2]).sample(torch.tensor([1.0])), TypeError, "int32 or int64"),
    (lambda g: NeighborSampler(g, [2]).sample(torch.tensor([1]), key=-1), ValueError, "key must be"),
    (lambda g: NeighborSampler("graph", [2]), TypeError, "CSCGraph"),
])
def test_bad_input_is_refused_with_a_typed_error(graph, make, error, match):
    with pytest.raises(error, match=match):
        make(graph[1])


@pytest.mark.parametrize("indptr,indices,match", [
    ([1, 2], [0], "starts at 1"),
    ([0, 2, 1], [0, 1], "decreases at position 1"),
    ([0, 1, 3], [0, 1], "ends at 3 but there are 2"),
    ([0, 1, 2], [0, 2], "index 2 at position 1 is outside"),
    ([0, 1, 2], [0, -1], "index -1 at position 1"),
])
def test_a_bad_csc_is_refused(indptr, indices, match):
    with pytest.raises(GraphError, match=match):
        CSCGraph(torch.tensor(indptr), torch.tensor(indices))


def test_graph_parts_and_round_trip(tmp_path, graph):
    edge_index, g = graph
    assert g.indices.dtype == torch.int32 and g.indptr.dtype == torch.int32 and g.eids.dtype == torch.int64
    assert torch.equal(g.in_degrees(), torch.bincount(edge_index[1], minlength=N))
    g.save(tmp_path / "g")
    for mmap in (True, False):
        h = CSCGraph.load(tmp_path / "g", mmap=mmap, affinity="host")
        assert all(np.array_equal(a, b) for a, b in zip(g.numpy(), h.numpy()) if a is not None)
        a = NeighborSampler(g, [4, 4]).sample(torch.arange(9), key=5)
        b = NeighborSampler(h, [4, 4]).sample(torch.arange(9), key=5)
        assert torch.equal(a.nodes, b.nodes)
    u = g.to_unified(affinity="host")
    assert torch.equal(NeighborSampler(u, [3]).sample(torch.arange(4), key=2).nodes,
                       NeighborSampler(g, [3]).sample(torch.arange(4), key=2).nodes)


def test_load_refuses_a_directory_without_a_graph(tmp_path):
    with pytest.raises(FileNotFoundError, match="graph.json is missing"):
        CSCGraph.load(tmp_path)


def test_a_save_killed_before_its_manifest_leaves_no_graph(tmp_path, graph, monkeypatch):
    _, g = graph
    g.save(tmp_path)
    import directload.graph.files as module

    real = module.write_atomically

    def dies_at_manifest(path, write):
        if path.name == "graph.json":
            raise KeyboardInterrupt
        return real(path, write)

    monkeypatch.setattr(module, "write_atomically", dies_at_manifest)
    with pytest.raises(KeyboardInterrupt):
        CSCGraph.from_edge_index(torch.tensor([[0], [1]]), 2).save(tmp_path)
    with pytest.raises(FileNotFoundError, match="graph.json is missing"):
        CSCGraph.load(tmp_path)


def test_a_shared_graph_is_one_copy_another_process_samples_the_same(shm, graph):
    import subprocess
    import sys

    _, g = graph
    mine = CSCGraph.shared("graph-test", lambda: g, ranks=2, affinity="host", directory=shm)
    want = NeighborSampler(mine, [4, 3]).sample(torch.arange(16), key=11).nodes
    code = ("import sys, torch\n"
            "from directload.graph import CSCGraph\n"
            "from directload.sampler import NeighborSampler\n"
            f"g = CSCGraph.shared('graph-test', ranks=2, affinity='host', directory={shm!r}, timeout=120)\n"
            "print(NeighborSampler(g, [4, 3]).sample(torch.arange(16), key=11).nodes.tolist())\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert eval(out.stdout.strip().splitlines()[-1]) == want.tolist()
    assert mine.eids is not None and torch.equal(mine.indices, g.indices)
    import os

    assert not [f for f in os.listdir(shm) if f.startswith("graph-test")]  # both ranks mapped it: names removed


def test_a_dataset_builds_its_graph_once_and_maps_it_after(tmp_path):
    from directload.datasets import load, synthesize
    from directload.datasets.synthetic import SynthConfig

    synthesize(tmp_path, "synth-tiny", progress=False)
    ds = load(tmp_path, "synth-tiny", affinity="host")
    g = ds.csc(affinity="host")
    assert ds.csc(affinity="host") is g and g.num_edges == ds.num_edges
    assert torch.equal(g.in_degrees(), torch.bincount(ds.edge_index[1], minlength=ds.num_nodes))
    again = load(tmp_path, "synth-tiny", affinity="host").csc(affinity="host")  # read from csc/, memory-mapped
    assert type(again.indices).__name__ == "UnifiedTensor" and np.array_equal(again.numpy()[1], g.numpy()[1])
    synthesize(tmp_path, "synth-tiny", progress=False, overwrite=True,
               config=SynthConfig(num_nodes=3_000, avg_degree=4, num_feats=8, num_classes=5, chunk_nodes=1_000))
    fresh = load(tmp_path, "synth-tiny", affinity="host")
    assert fresh.csc(affinity="host").num_edges == fresh.num_edges != ds.num_edges  # a new dataset: rebuilt


def test_a_sampler_with_its_own_generator_pickles_for_spawned_workers(graph):
    import pickle

    _, g = graph
    s = NeighborSampler(g, [3], generator=torch.Generator().manual_seed(9))
    copy = pickle.loads(pickle.dumps(s))
    assert copy.sample(torch.arange(5)).key == s.sample(torch.arange(5)).key  # the same state, the same next key


def test_all_neighbours_with_replacement_is_every_edge_once():
    # -1 takes every in-edge once whatever replace says (as PyG and DGL); it drew d times with replacement.
    edge_index = torch.tensor([[1, 2, 3], [0, 0, 0]])
    g = CSCGraph.from_edge_index(edge_index, 4)
    for key in range(20):
        row, _, eid = NeighborSampler(g, [-1], replace=True).sample(torch.tensor([0]), key=key).hops[0]
        assert sorted(eid.tolist()) == [0, 1, 2]
    w = CSCGraph.from_edge_index(edge_index, 4, edge_weight=torch.tensor([1.0, 0.0, 2.0]))
    row, _, eid = NeighborSampler(w, [-1], replace=True, weighted=True).sample(torch.tensor([0]), key=1).hops[0]
    assert sorted(eid.tolist()) == [0, 2]


def test_strided_parts_are_taken():
    indices = torch.stack([torch.tensor([1, 0, 0]), torch.zeros(3, dtype=torch.int64)], 1)[:, 0]
    assert not indices.is_contiguous()
    g = CSCGraph(torch.tensor([0, 2, 3]), indices)
    assert g.indices.is_contiguous()
    assert NeighborSampler(g, [-1]).sample(torch.tensor([0]), key=0).num_sampled_edges == [2]


@pytest.mark.parametrize("bad", [float("inf"), float("nan"), -1.0])
def test_weights_must_be_finite_and_non_negative(bad):
    with pytest.raises(GraphError, match="finite and non-negative"):
        CSCGraph.from_edge_index(torch.tensor([[1, 2], [0, 0]]), 3, edge_weight=torch.tensor([1.0, bad]))


def test_in_degrees_of_2_to_the_62_are_refused():
    from directload.kernels.sampling import MAX_DEGREE, check_csc

    # Lemire's draws are exact at every accepted in-degree; 2**62 bounds one node's edge positions (sample.cu's
    # claims).
    assert check_csc(np.array([0, MAX_DEGREE], np.int64), MAX_DEGREE, np.zeros(1, np.int64), 1) == (5, 0)
    assert check_csc(np.array([0, 2**32], np.int64), 2**32, np.zeros(0, np.int64), 1) == (-1, -1)


def test_fanouts_are_bounded(graph):
    with pytest.raises(ValueError, match="over 2147483647"):
        NeighborSampler(graph[1], [2**31])


def test_a_generator_in_worker_processes_gives_each_epoch_its_own_keys(graph):
    _, g = graph
    sampler = NeighborSampler(g, [2], generator=torch.Generator().manual_seed(3))

    class Keys(torch.utils.data.Dataset):
        def __len__(self):
            return 2

        def __getitem__(self, i):
            return sampler.sample(torch.tensor([i])).key

    loader = torch.utils.data.DataLoader(Keys(), batch_size=None, num_workers=2)
    first, second = list(loader), list(loader)
    assert len(set(first)) == 2  # two workers, two streams
    assert not set(first) & set(second)  # a new epoch's workers, new keys


def test_a_damaged_dataset_graph_is_built_again(tmp_path):
    from directload.datasets import load, synthesize

    synthesize(tmp_path, "synth-tiny", progress=False)
    ds = load(tmp_path, "synth-tiny", affinity="host")
    want = ds.csc(affinity="host").numpy()[1].copy()
    part = ds.path / "csc" / "indices.npy"
    part.write_bytes(part.read_bytes()[:200])  # truncated
    with pytest.warns(RuntimeWarning, match="kept graph is refused"):
        got = load(tmp_path, "synth-tiny", affinity="host").csc(affinity="host")
    assert np.array_equal(got.numpy()[1], want)


def _hetero(device):
    writes = CSCGraph.from_edge_index(torch.tensor([[0, 1], [0, 0]]), 1, num_src_nodes=2)
    et = ("author", "writes", "paper")
    return HeteroNeighborSampler({et: writes}, {"author": 2, "paper": 1}, {et: [-1]}, device=device)


def _homo(device):
    return NeighborSampler(CSCGraph.from_edge_index(torch.tensor([[1], [0]]), 2), [1], device=device)


@pytest.mark.parametrize("make", [_homo, _hetero], ids=["homogeneous", "heterogeneous"])
@pytest.mark.parametrize("device,error,match", [
    ("bogus", ValueError, r"device='bogus' is not a device \(use 'cpu', 'cuda' or 'cuda:N'\)"),
    ("cuda:x", ValueError, r"device='cuda:x' is not a device"),
    (3.5, TypeError, "device must be a str or torch.device, got float"),
    (0, TypeError, "device must be a str or torch.device, got int"),
    ("meta", ValueError, "device='meta': a sampler runs on 'cpu' or 'cuda', not meta"),
    (torch.device("meta"), ValueError, "device='meta': a sampler runs on 'cpu' or 'cuda', not meta"),
])
def test_a_device_that_is_not_one_is_refused_naming_the_argument(make, device, error, match):
    with pytest.raises(error, match=match):
        make(device)


@pytest.mark.parametrize("make", [_homo, _hetero], ids=["homogeneous", "heterogeneous"])
@pytest.mark.parametrize("device", ["cuda", "cuda:0", torch.device("cuda", 7)])
def test_cuda_without_a_gpu_is_the_no_device_error_at_construction(make, device, monkeypatch):
    from directload.capabilities import NoDeviceError

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(NoDeviceError, match="no usable CUDA device"):
        make(device)


@pytest.mark.parametrize("make", [_homo, _hetero], ids=["homogeneous", "heterogeneous"])
def test_a_gpu_index_past_the_last_is_the_no_device_error(make, monkeypatch):
    from directload.capabilities import NoDeviceError

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(NoDeviceError, match="cuda:7 was asked for, but this machine has 1 CUDA device"):
        make("cuda:7")


@pytest.mark.parametrize("make", [_homo, _hetero], ids=["homogeneous", "heterogeneous"])
@pytest.mark.parametrize("device", [None, "cpu", torch.device("cpu")])
def test_the_cpu_is_taken_in_every_spelling(make, device):
    s = make(device)
    assert s.device == torch.device("cpu")
    b = s.sample(torch.tensor([0]) if isinstance(s, NeighborSampler) else {"paper": torch.tensor([0])}, key=1)
    nodes = b.nodes if isinstance(b.nodes, torch.Tensor) else b.nodes["author"]
    assert nodes.device.type == "cpu" and nodes.dtype == torch.int64
