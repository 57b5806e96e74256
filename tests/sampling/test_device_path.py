"""The device path of directload's samplers, proven on the CPU through the device seam: the same Python code that
samples on a GPU (sampling_gpu's and sampling_gpu_hetero's drivers, the samplers' device branch) runs with
sample.cu's kernels built for the host (directload.emulated_gpu.EmulatedGpu), into poisoned, guarded buffers, and
each batch must equal the CPU twin's for the same key, bit for bit, with its host reads counted."""

import itertools

import pytest
import torch

from directload.batch_device import BatchDevice, DeviceTable, batch_device
from directload.emulated_gpu import EmulatedGpu
from directload.graph import CSCGraph
from directload.sampler import HeteroNeighborSampler, NeighborSampler
from directload.unified import to_unified

NUM = {"author": 40, "paper": 90, "venue": 6}
RELATIONS = [("author", "writes", "paper"), ("paper", "cites", "paper"), ("paper", "in", "venue"),
             ("venue", "has", "paper"), ("paper", "by", "author")]


def _homogeneous(weighted=False, n=150, e=1200):
    g = torch.Generator().manual_seed(1)
    edge_index = torch.randint(0, n, (2, e), generator=g)
    weight = torch.rand(e, generator=g, dtype=torch.float64) if weighted else None
    if weight is not None:
        weight[::4] = 0  # weight 0: never picked
    return CSCGraph.from_edge_index(edge_index, n, edge_weight=weight)


def _hetero(weighted=False):
    g = torch.Generator().manual_seed(2)
    out = {}
    for src, rel, dst in RELATIONS:
        e = 4 * NUM[dst] + 30
        edge_index = torch.stack([torch.randint(0, NUM[src], (e,), generator=g),
                                  torch.randint(0, NUM[dst], (e,), generator=g)])
        weight = torch.rand(e, generator=g) if weighted else None
        out[src, rel, dst] = CSCGraph.from_edge_index(edge_index, NUM[dst], num_src_nodes=NUM[src],
                                                      edge_weight=weight)
    return out


def _same(a, b):
    return a.dtype == b.dtype and a.device == b.device and torch.equal(a, b)


CASES = list(itertools.product(["pyg", "dgl"], [[5, 3], [-1, 2], [0, 4], [2, 2, 2]], [False, True], [False, True]))


@pytest.mark.parametrize("layout,fanouts,replace,weighted", CASES)
def test_a_homogeneous_batch_on_the_device_path_is_the_cpu_twins(layout, fanouts, replace, weighted):
    graph = _homogeneous(weighted)
    gpu = EmulatedGpu()
    on_gpu = NeighborSampler(graph, fanouts, replace=replace, weighted=weighted, layout=layout, device=gpu)
    twin = NeighborSampler(graph, fanouts, replace=replace, weighted=weighted, layout=layout)
    assert on_gpu.backend == "emulated" and on_gpu.batch_device is gpu and twin.backend == "cpu"
    seeds = torch.tensor([3, 17, 3, 140, 0, 99], dtype=torch.int32)  # a repeated seed keeps its place
    for key in (0, 7, 2**62):
        a, b = on_gpu.sample(seeds, key=key), twin.sample(seeds, key=key)
        assert _same(a.nodes, b.nodes) and a.nodes.dtype == torch.int64
        assert a.num_sampled_nodes == b.num_sampled_nodes and a.num_sampled_edges == b.num_sampled_edges
        assert len(a.hops) == len(fanouts)
        for hop_a, hop_b in zip(a.hops, b.hops):
            assert all(_same(x, y) for x, y in zip(hop_a, hop_b))
    gpu.check_guards()
    # One host read per batch, plus one per hop of fanout -1 (its edge count sizes its buffers).
    assert gpu.reads.count == 3 * (1 + fanouts.count(-1))
    assert gpu.uploads == 3  # the seeds, once a batch


@pytest.mark.parametrize("layout,fanouts,replace,weighted", CASES[::3])
def test_a_hetero_batch_on_the_device_path_is_the_cpu_twins(layout, fanouts, replace, weighted):
    graphs = _hetero(weighted)
    per_type = {et: fanouts for et in RELATIONS}
    gpu = EmulatedGpu()
    on_gpu = HeteroNeighborSampler(graphs, NUM, per_type, replace=replace, weighted=weighted, layout=layout,
                                   device=gpu)
    twin = HeteroNeighborSampler(graphs, NUM, per_type, replace=replace, weighted=weighted, layout=layout)
    assert on_gpu.batch_device is gpu and twin.batch_device is None
    for key, seeds in ((1, {"paper": torch.tensor([5, 9, 5, 80])}), (2, {"author": torch.tensor([0, 39]),
                                                                         "venue": torch.tensor([1])})):
        a, b = on_gpu.sample(seeds, key=key), twin.sample(seeds, key=key)
        assert a.num_sampled_nodes == b.num_sampled_nodes and a.num_sampled_edges == b.num_sampled_edges
        assert all(_same(a.nodes[t], b.nodes[t]) for t in NUM)
        for hop_a, hop_b in zip(a.hops, b.hops):
            for et in RELATIONS:
                assert all(_same(x, y) for x, y in zip(hop_a[et], hop_b[et]))
    gpu.check_guards()
    assert gpu.reads.count == 2 * (1 + fanouts.count(-1) * len(RELATIONS))


def test_the_device_path_checks_seeds_before_any_launch():
    gpu = EmulatedGpu()
    sampler = NeighborSampler(_homogeneous(), [2], device=gpu)
    with pytest.raises(IndexError, match="seed 150 is outside the graph's 150 nodes"):
        sampler.sample(torch.tensor([0, 150]))
    with pytest.raises(TypeError, match="1-d int32 or int64"):
        sampler.sample(torch.tensor([0.5]))
    hetero = HeteroNeighborSampler(_hetero(), NUM, {et: [2] for et in RELATIONS}, device=gpu)
    with pytest.raises(IndexError, match="seed 6 is outside the graph's 6 nodes"):
        hetero.sample({"venue": torch.tensor([6])})
    assert gpu.launches == 0 and gpu.reads.count == 0


def test_a_device_that_cannot_read_the_graph_is_refused_when_the_sampler_is_made():
    class Picky(EmulatedGpu):
        def readable(self, values):
            return False

    with pytest.raises(ValueError, match="cannot read this graph where it lives"):
        NeighborSampler(_homogeneous(), [2], device=Picky())


def test_batch_device_resolves_the_cpu_to_the_twin_and_keeps_a_given_device():
    gpu = EmulatedGpu()
    assert batch_device(None) is None and batch_device("cpu") is None and batch_device(gpu) is gpu
    assert isinstance(gpu, BatchDevice) and "emulated" in repr(gpu)
    if not torch.cuda.is_available():
        from directload.capabilities import NoDeviceError

        with pytest.raises(NoDeviceError):
            batch_device("cuda")


def test_a_device_table_reads_rows_through_directloads_gather():
    table = torch.arange(40, dtype=torch.float32).reshape(10, 4)
    gpu = EmulatedGpu()
    view = gpu.table(table)
    assert isinstance(view, DeviceTable) and view.device == gpu.device and view.shape == table.shape
    ids = torch.tensor([9, 0, 9, 3])
    for rows in (torch.index_select(view, 0, ids), view.index_select(0, ids), view[ids]):
        assert type(rows) is torch.Tensor and torch.equal(rows, table[ids])
    assert type(view + 1) is torch.Tensor and torch.equal(view + 1, table + 1)  # the rest: torch's own
    with pytest.raises(IndexError):
        view[torch.tensor([10])]  # checked by the gather, as any unified read
    # Routed through the unified table: once it is closed, a row read says so.
    unified = to_unified(table.clone(), "host", pin="auto")
    closed = DeviceTable.of(unified, unified.host)
    unified.close()
    from directload.unified import ClosedError

    with pytest.raises(ClosedError):
        torch.index_select(closed, 0, ids)
    with pytest.raises(TypeError, match="does not pickle"):
        import pickle

        pickle.dumps(view)
