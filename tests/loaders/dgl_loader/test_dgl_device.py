"""DGL's loaders with directload's sampler on a device, proven on the CPU through the device seam
(directload.emulated_gpu.EmulatedGpu runs sample.cu's kernels on the host): the blocks of each batch, homogeneous
and hetero, uniform and weighted, must equal the CPU twin's for the same seed, bit for bit.  DGL cannot run on
the GPU machine's image, so this lane's device path is proven here only."""

import dgl
import pytest
import torch

from directload.emulated_gpu import EmulatedGpu
from directload.loaders.dgl import DataLoader, NeighborSampler

pytestmark = pytest.mark.one_lane("dgl")


@pytest.fixture
def graph():
    g = dgl.rand_graph(300, 3000)
    gen = torch.Generator().manual_seed(0)
    g.ndata["feat"] = torch.randn(300, 6, generator=gen)
    g.ndata["label"] = torch.randint(0, 4, (300,), generator=gen)
    g.edata["w"] = torch.rand(3000, generator=gen)
    return g


def _epoch(loader, seed=3):
    torch.manual_seed(seed)  # directload's keys (the seeds are not shuffled)
    return list(loader)


def _same(a, b):
    return a.dtype == b.dtype and a.device == b.device and torch.equal(a, b)


def _same_block(x, y):
    assert x.num_src_nodes() == y.num_src_nodes() and x.num_dst_nodes() == y.num_dst_nodes()
    for et in x.canonical_etypes:
        assert all(_same(u, v) for u, v in zip(x.adj_tensors("csc", et), y.adj_tensors("csc", et)))
        assert _same(x.edges[et].data[dgl.EID], y.edges[et].data[dgl.EID])
    for nt in x.srctypes:
        assert _same(x.srcnodes[nt].data[dgl.NID], y.srcnodes[nt].data[dgl.NID])


@pytest.mark.parametrize("fanouts,prob", [([4, 3], None), ([-1, 2], None), ([4, 3], "w"), ([2, 2, 2], None)])
def test_blocks_made_on_the_device_are_the_twins(graph, fanouts, prob):
    gpu = EmulatedGpu()
    kw = dict(prob=prob, prefetch_node_feats=["feat"], prefetch_labels=["label"])
    on_gpu = NeighborSampler(fanouts, device=gpu, **kw)
    got = _epoch(DataLoader(graph, torch.arange(100), on_gpu, batch_size=32))
    want = _epoch(DataLoader(graph, torch.arange(100), NeighborSampler(fanouts, **kw), batch_size=32))
    assert len(got) == len(want) == 4
    for (ia, oa, ba), (ib, ob, bb) in zip(got, want):
        assert _same(ia, ib) and _same(oa, ob) and len(ba) == len(fanouts)
        for x, y in zip(ba, bb):
            _same_block(x, y)
        assert _same(ba[0].srcdata["feat"], bb[0].srcdata["feat"])
        assert _same(ba[-1].dstdata["label"], bb[-1].dstdata["label"])
        assert bool((ba[-1].in_degrees() <= max(fanouts[-1], 0) if fanouts[-1] >= 0 else True).all())
    gpu.check_guards()
    assert gpu.reads.count == len(got) * (1 + fanouts.count(-1))


def test_hetero_blocks_made_on_the_device_are_the_twins():
    gen = torch.Generator().manual_seed(1)
    hg = dgl.heterograph({
        ("author", "writes", "paper"): (torch.randint(0, 30, (200,), generator=gen),
                                        torch.randint(0, 60, (200,), generator=gen)),
        ("paper", "cites", "paper"): (torch.randint(0, 60, (300,), generator=gen),
                                      torch.randint(0, 60, (300,), generator=gen)),
        ("paper", "by", "author"): (torch.randint(0, 60, (200,), generator=gen),
                                    torch.randint(0, 30, (200,), generator=gen))})
    gpu = EmulatedGpu()
    seeds = {"paper": torch.arange(40)}
    got = _epoch(DataLoader(hg, seeds, NeighborSampler([3, {"writes": 2, "cites": 1, "by": 0}], device=gpu),
                            batch_size=8))
    want = _epoch(DataLoader(hg, seeds, NeighborSampler([3, {"writes": 2, "cites": 1, "by": 0}]), batch_size=8))
    assert len(got) == len(want) == 5
    for (ia, _, ba), (ib, _, bb) in zip(got, want):
        assert all(_same(ia[t], ib[t]) for t in ia)
        for x, y in zip(ba, bb):
            _same_block(x, y)
    gpu.check_guards()
    assert gpu.reads.count == len(got)


def test_a_device_given_as_a_name_is_checked_when_the_sampler_is_made():
    if torch.cuda.is_available():
        pytest.skip("a machine with CUDA has the device")
    from directload.capabilities import NoDeviceError

    with pytest.raises(NoDeviceError):
        NeighborSampler([2], device="cuda")
    with pytest.raises(ValueError, match="not a device"):
        NeighborSampler([2], device="bogus")


def test_a_csc_given_for_the_graph_gives_the_batches_of_dgls_own(graph):
    """directload train --nproc N samples over the dataset's kept CSC (one mapped copy per machine): the
    batches are those of the graph's own CSC, whose edge ids are DGL's."""
    from directload.graph import CSCGraph

    src, dst = graph.edges()
    csc = CSCGraph.from_edge_index(torch.stack([src, dst]), graph.num_nodes())
    gpu = EmulatedGpu()
    kw = dict(prefetch_node_feats=["feat"])
    got = _epoch(DataLoader(graph, torch.arange(64), NeighborSampler([4, 3], device=gpu, csc=csc, **kw),
                            batch_size=32))
    want = _epoch(DataLoader(graph, torch.arange(64), NeighborSampler([4, 3], **kw), batch_size=32))
    for (ia, _, ba), (ib, _, bb) in zip(got, want):
        assert _same(ia, ib)
        for x, y in zip(ba, bb):
            _same_block(x, y)
    with pytest.raises(ValueError, match="csc has 10 nodes"):
        small = CSCGraph.from_edge_index(torch.tensor([[0], [1]]), 10)
        next(iter(DataLoader(graph, torch.arange(4), NeighborSampler([2], csc=small), batch_size=4)))
    with pytest.raises(TypeError, match="csc must be a directload.graph.CSCGraph"):
        NeighborSampler([2], csc="graph")
