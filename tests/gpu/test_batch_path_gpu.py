"""The whole batch path on a real GPU: directload's PyG loaders with ``device="cuda"`` sample, relabel and gather on
the device, hand over CUDA tensors, read the host only through the launcher's counted reads, and give the CPU
twin's batches.  Under the kit's hot-path section (``DIRECTLOAD_SYNC_DEBUG=1``) each epoch runs under
``torch.cuda.set_sync_debug_mode("error")``: the documented reads wait on an event for a pinned copy, never for
the device, so any other sync raises.

Skipped without a CUDA device, CuPy or PyG; benchmarks/gpu_suite.py runs them where they exist.  DGL does not run
on the GPU machine's image: its lane's device path is proven on the CPU (tests/loaders/dgl_loader/test_dgl_device.py).
"""

import contextlib

import pytest
import torch

from directload.capabilities import capabilities

pytest.importorskip("torch_geometric", reason="the PyG loaders' GPU path needs PyG")
from torch_geometric.data import Data, HeteroData  # noqa: E402

from directload.batch_device import batch_device  # noqa: E402
from directload.loaders.pyg import LinkNeighborLoader, NeighborLoader  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not (torch.cuda.is_available() and capabilities().cupy),
                                                   reason="needs a CUDA device and CuPy")]


@pytest.fixture
def data():
    g = torch.Generator().manual_seed(0)
    n, e = 5000, 60000
    return Data(x=torch.randn(n, 37, generator=g), y=torch.randint(0, 5, (n,), generator=g),
                edge_index=torch.randint(0, n, (2, e), generator=g), edge_attr=torch.randn(e, 3, generator=g))


def _epoch(loader, sync_debug=contextlib.nullcontext, seed=3):
    """One epoch's batches, under ``sync_debug`` (the device path's) or not (the twin's, whose host path may
    sync), with the twin's tensors brought to the host for comparison."""
    torch.manual_seed(seed)
    with sync_debug():
        batches = list(loader)
    torch.cuda.synchronize()
    return batches


def _host(t):
    return t.cpu()


def test_a_node_epoch_stays_on_the_gpu_with_one_host_read_per_batch(data, sync_debug):
    kw = dict(num_neighbors=[10, 5], batch_size=512, sampler="directload", shuffle=True)
    path = batch_device("cuda")
    reads = path.reads.count
    got = _epoch(NeighborLoader(data, device="cuda", **kw), sync_debug)
    assert (path.reads.count - reads) == len(got) == 10  # one read per batch: at most one per hop
    want = _epoch(NeighborLoader(data, **kw))
    for a, b in zip(got, want):
        for key in ("x", "y", "edge_index", "n_id", "e_id", "edge_attr", "input_id"):
            assert a[key].is_cuda and a[key].dtype == b[key].dtype, key
            assert torch.equal(_host(a[key]), _host(b[key])), key
        assert a.num_sampled_nodes == b.num_sampled_nodes and a.num_sampled_edges == b.num_sampled_edges


def test_a_hetero_epoch_stays_on_the_gpu(sync_debug):
    g = torch.Generator().manual_seed(1)
    h = HeteroData()
    h["paper"].x, h["paper"].y = torch.randn(800, 8, generator=g), torch.randint(0, 3, (800,), generator=g)
    h["author"].x = torch.randn(300, 4, generator=g)
    h["author", "writes", "paper"].edge_index = torch.stack([torch.randint(0, 300, (3000,), generator=g),
                                                             torch.randint(0, 800, (3000,), generator=g)])
    h["paper", "cites", "paper"].edge_index = torch.randint(0, 800, (2, 5000), generator=g)
    kw = dict(num_neighbors=[5, 3], batch_size=128, sampler="directload", input_nodes="paper")
    got, want = _epoch(NeighborLoader(h, device="cuda", **kw), sync_debug), _epoch(NeighborLoader(h, **kw))
    for a, b in zip(got, want):
        for t in ("paper", "author"):
            assert a[t].x.is_cuda and torch.equal(_host(a[t].x), _host(b[t].x))
            assert torch.equal(_host(a[t].n_id), _host(b[t].n_id))
        for et in h.edge_types:
            assert torch.equal(_host(a[et].edge_index), _host(b[et].edge_index))


def test_a_link_epoch_stays_on_the_gpu(data, sync_debug):
    kw = dict(num_neighbors=[5, 3], batch_size=256, sampler="directload", neg_sampling_ratio=1.0)
    got = _epoch(LinkNeighborLoader(data, device="cuda", **kw), sync_debug)
    want = _epoch(LinkNeighborLoader(data, **kw))
    for a, b in zip(got, want):
        for key in ("x", "edge_index", "n_id", "edge_label_index", "edge_label"):
            assert a[key].is_cuda and torch.equal(_host(a[key]), _host(b[key])), key


def test_graphsage_trains_on_gpu_batches(data, sync_debug):
    from directload.harness.train_pyg import SAGE

    torch.manual_seed(0)
    model = SAGE(37, 64, 5, 2, 0.0).cuda()
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    loader = NeighborLoader(data, [10, 5], batch_size=512, sampler="directload", device="cuda", shuffle=True)
    losses = []
    with sync_debug():
        for batch in loader:
            out = model(batch.x, batch.edge_index, batch.num_sampled_nodes, batch.num_sampled_edges)
            loss = torch.nn.functional.cross_entropy(out[:batch.batch_size], batch.y[:batch.batch_size])
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.detach())
    assert torch.isfinite(torch.stack(losses)).all()
