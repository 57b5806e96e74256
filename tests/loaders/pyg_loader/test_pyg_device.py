"""PyG's loaders with ``device=``: the whole batch made on the device, proven on the CPU through the device seam
(directload.emulated_gpu.EmulatedGpu runs sample.cu's kernels on the host).  Each batch must equal the CPU twin's
(``sampler="directload"`` without a device) for the same seed, bit for bit, homogeneous and hetero, node- and
link-wise, with at most one host read per hop."""

import pytest
import torch
from torch_geometric.data import Data, HeteroData
from torch_geometric.loader import NeighborLoader as PygNeighborLoader

from directload.batch_device import DeviceTable
from directload.emulated_gpu import EmulatedGpu
from directload.loaders.pyg import LinkNeighborLoader, NeighborLoader, NeighborSampler

pytestmark = pytest.mark.one_lane("pyg")


@pytest.fixture
def data():
    g = torch.Generator().manual_seed(0)
    n, e = 300, 2400
    return Data(x=torch.randn(n, 8, generator=g), y=torch.randint(0, 5, (n,), generator=g),
                edge_index=torch.randint(0, n, (2, e), generator=g), edge_attr=torch.randn(e, 3, generator=g),
                weight=torch.rand(n, generator=g))


@pytest.fixture
def hetero():
    g = torch.Generator().manual_seed(1)
    h = HeteroData()
    h["paper"].x = torch.randn(80, 4, generator=g)
    h["paper"].y = torch.arange(80)
    h["author"].x = torch.randn(30, 2, generator=g)
    h["author", "writes", "paper"].edge_index = torch.stack([torch.randint(0, 30, (200,), generator=g),
                                                             torch.randint(0, 80, (200,), generator=g)])
    h["paper", "cites", "paper"].edge_index = torch.randint(0, 80, (2, 300), generator=g)
    h["paper", "by", "author"].edge_index = torch.stack([torch.randint(0, 80, (200,), generator=g),
                                                         torch.randint(0, 30, (200,), generator=g)])
    return h


def _epoch(loader, seed=5):
    torch.manual_seed(seed)
    return list(loader)


def _same(a, b):
    return type(a) is torch.Tensor and a.dtype == b.dtype and a.device == b.device and torch.equal(a, b)


@pytest.mark.parametrize("fanouts", [[4, 3], [-1, 2], [3, 3, 3]])
def test_a_node_batch_made_on_the_device_is_the_twins(data, fanouts):
    gpu = EmulatedGpu()
    kw = dict(num_neighbors=fanouts, batch_size=32, sampler="directload", shuffle=True)
    on_gpu = NeighborLoader(data, device=gpu, **kw)
    assert on_gpu.batch_device is gpu and on_gpu.sampling == "directload"
    assert isinstance(on_gpu.data.x, DeviceTable) and isinstance(on_gpu.data.edge_attr, DeviceTable)
    assert not isinstance(data.x, DeviceTable)  # the caller's data is not changed
    got, want = _epoch(on_gpu), _epoch(NeighborLoader(data, **kw))
    assert len(got) == len(want) == 10
    for a, b in zip(got, want):
        for key in ("x", "y", "edge_index", "n_id", "e_id", "edge_attr", "input_id", "weight"):
            assert _same(a[key], b[key]), key
        assert a.batch_size == b.batch_size and a.num_sampled_nodes == b.num_sampled_nodes
        assert a.num_sampled_edges == b.num_sampled_edges and len(a.num_sampled_edges) == len(fanouts)
        assert torch.equal(a.x, data.x[a.n_id]) and torch.equal(a.edge_attr, data.edge_attr[a.e_id])
    gpu.check_guards()
    reads_per_batch = gpu.reads.count / len(got)
    assert reads_per_batch == 1 + fanouts.count(-1) <= len(fanouts)  # at most one host read per hop


def test_a_hetero_batch_made_on_the_device_is_the_twins(hetero):
    gpu = EmulatedGpu()
    kw = dict(num_neighbors=[3, 2], batch_size=8, sampler="directload", input_nodes="paper", shuffle=True)
    got, want = _epoch(NeighborLoader(hetero, device=gpu, **kw)), _epoch(NeighborLoader(hetero, **kw))
    assert len(got) == len(want) == 10
    for a, b in zip(got, want):
        for t in ("paper", "author"):
            assert _same(a[t].x, b[t].x) and _same(a[t].n_id, b[t].n_id)
            assert a[t].num_sampled_nodes == b[t].num_sampled_nodes
        assert _same(a["paper"].y, b["paper"].y)
        for et in hetero.edge_types:
            assert _same(a[et].edge_index, b[et].edge_index) and _same(a[et].e_id, b[et].e_id)
    gpu.check_guards()
    assert gpu.reads.count == len(got)


def test_a_link_batch_made_on_the_device_is_the_twins(data):
    gpu = EmulatedGpu()
    kw = dict(num_neighbors=[3, 2], batch_size=64, sampler="directload", neg_sampling_ratio=1.0, shuffle=True)
    got = _epoch(LinkNeighborLoader(data, device=gpu, **kw))
    want = _epoch(LinkNeighborLoader(data, **kw))
    assert len(got) == len(want) == 38
    for a, b in zip(got, want):
        for key in ("x", "edge_index", "n_id", "e_id", "edge_label_index", "edge_label", "input_id"):
            assert _same(a[key], b[key]), key
    assert gpu.reads.count == len(got)


def test_pygs_own_sampler_with_a_device_gives_pygs_batches_there(data):
    gpu = EmulatedGpu()
    kw = dict(num_neighbors=[4, 3], batch_size=32, shuffle=True)
    got, want = _epoch(NeighborLoader(data, device=gpu, sampler="pyg", **kw)), _epoch(PygNeighborLoader(data, **kw))
    for a, b in zip(got, want):
        for key in ("x", "y", "edge_index", "n_id", "e_id", "edge_attr"):
            assert _same(a[key], b[key]), key
    assert gpu.reads.count == 0 and gpu.launches == 0  # PyG sampled on the host; nothing ran on the device


def test_the_device_path_takes_no_workers_and_says_so_before_any_work(data):
    with pytest.raises(ValueError, match="num_workers=2 would fork workers"):
        NeighborLoader(data, num_neighbors=[2], batch_size=4, sampler="directload", device=EmulatedGpu(),
                       num_workers=2)


def test_the_standalone_sampler_on_a_device_hands_pyg_host_tensors(data):
    gpu = EmulatedGpu()
    sampler = NeighborSampler(data, [3, 2], device=gpu)
    assert sampler.sampler.batch_device is gpu and not sampler.keep_on_device
    loader = PygNeighborLoader(data, [3, 2], batch_size=16, neighbor_sampler=sampler)
    for batch in loader:
        assert batch.n_id.device.type == "cpu" and torch.equal(batch.x, data.x[batch.n_id])
    assert gpu.reads.count == len(loader)
