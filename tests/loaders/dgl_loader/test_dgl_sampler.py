"""directload's NeighborSampler as a DGL BlockSampler: blocks of the graph's edges, dst-first, min(fanout, degree)
picks, weights, heterographs, same key same blocks, DGL's own sampler (said once) for what it does not implement,
typed errors, both loaders, and a model that learns as well as with DGL's sampler."""

import statistics
import warnings

import dgl
import numba
import pytest
import torch
from dgl.utils import set_num_threads

from directload.datasets import load, synthesize
from directload.harness.train import TrainConfig, train
from directload.loaders.dgl import DataLoader, NeighborSampler, resolve_sampler


@pytest.fixture(params=[torch.int64, torch.int32], ids=["int64", "int32"])
def graph(request):
    g = dgl.rand_graph(513, 4096).astype(request.param)  # in-degrees 0 to ~20: fanouts both above and below
    g.ndata["feat"] = torch.randn(513, 11)
    g.ndata["label"] = torch.randint(0, 7, (513,))
    return g


def _gen(seed=0):
    return torch.Generator().manual_seed(seed)


def _hetero():
    return dgl.heterograph({
        ("user", "follows", "user"): (torch.randint(0, 60, (500,)), torch.randint(0, 60, (500,))),
        ("user", "buys", "item"): (torch.randint(0, 60, (400,)), torch.randint(0, 37, (400,))),
        ("item", "bought-by", "user"): (torch.randint(0, 37, (400,)), torch.randint(0, 60, (400,))),
    })


def _check_block(g, block, etype=None):
    """Every edge of ``block`` is an edge of ``g`` with its EID, and the block's destination nodes come first."""
    et = etype or block.canonical_etypes[0]
    src_t, _, dst_t = et
    src_nid, dst_nid = block.srcnodes[src_t].data[dgl.NID], block.dstnodes[dst_t].data[dgl.NID]
    for t in block.dsttypes:
        d, s = block.dstnodes[t].data[dgl.NID], block.srcnodes[t].data[dgl.NID]
        assert torch.equal(s[:d.numel()], d)  # dst-first
        assert s.unique().numel() == s.numel()
        assert d.dtype == s.dtype == g.idtype
    u, v = block.edges(etype=et, order="eid")
    eid = block.edges[et].data[dgl.EID]
    assert eid.dtype == g.idtype
    gu, gv = g.find_edges(eid, etype=et)
    assert torch.equal(gu, src_nid[u.long()]) and torch.equal(gv, dst_nid[v.long()])
    return u, v, eid


def test_blocks_are_edges_of_the_graph_dst_first(graph):
    seeds = torch.tensor([0, 11, 37, 100, 512, 5], dtype=graph.idtype)
    inputs, outputs, blocks = NeighborSampler([4, 3, 2], generator=_gen()).sample_blocks(graph, seeds)
    assert outputs is seeds and len(blocks) == 3
    assert torch.equal(inputs, blocks[0].srcdata[dgl.NID])
    assert torch.equal(blocks[-1].dstdata[dgl.NID], seeds)
    for inner, outer in zip(blocks[:-1], blocks[1:]):
        assert torch.equal(inner.dstdata[dgl.NID], outer.srcdata[dgl.NID])  # a layer's inputs are the next's
    for b in blocks:
        assert b.is_block and b.idtype == graph.idtype and b.device.type == "cpu"
        _check_block(graph, b)


def test_gat_trains_on_its_blocks_as_on_dgls(graph):
    # DGL's CPU kernels through libxsmm (GAT's attention, forward and backward) abort the process on a CSC whose
    # edge ids are implicit ("Check notnull: edges"), which the blocks had: a GAT could not train on them.
    torch.manual_seed(0)
    conv = dgl.nn.GATConv(11, 4, num_heads=2)
    seeds = torch.arange(0, 513, 7, dtype=graph.idtype)
    blocks = NeighborSampler([5], generator=_gen()).sample_blocks(graph, seeds)[2]
    x = graph.ndata["feat"][blocks[0].srcdata[dgl.NID].long()].requires_grad_()
    out = conv(blocks[0], x)
    out.sum().backward()
    assert out.shape == (len(seeds), 2, 4) and torch.isfinite(out).all()
    assert x.grad is not None and torch.isfinite(x.grad).all() and x.grad.abs().sum() > 0
    # the attention over the block's edges is DGL's own over the same edges
    u, v = blocks[0].edges(order="eid")
    same = dgl.create_block((u, v), num_src_nodes=blocks[0].num_src_nodes(), num_dst_nodes=len(seeds))
    torch.testing.assert_close(conv(same, x.detach()), out.detach())


@pytest.mark.parametrize("fanout", [1, 3, 11, -1])
def test_each_destination_gets_min_fanout_degree_distinct_edges(graph, fanout):
    seeds = torch.arange(0, 513, 7, dtype=graph.idtype)
    _, _, blocks = NeighborSampler([fanout, fanout]).sample_blocks(graph, seeds)
    for b in blocks:
        _, v, eid = _check_block(graph, b)
        degree = graph.in_degrees(b.dstdata[dgl.NID])
        want = degree if fanout == -1 else degree.clamp(max=fanout)
        assert torch.equal(b.in_degrees(), want)
        pairs = v.long() * graph.num_edges() + eid.long()
        assert pairs.unique().numel() == pairs.numel()  # without replacement: no edge twice for one node


def test_replace_draws_fanout_edges_where_there_are_any(graph):
    seeds = torch.arange(0, 513, 5, dtype=graph.idtype)
    _, _, (block,) = NeighborSampler([25], replace=True).sample_blocks(graph, seeds)
    _check_block(graph, block)
    degree = graph.in_degrees(seeds)
    assert torch.equal(block.in_degrees(), torch.where(degree > 0, 25, 0).to(block.idtype))
    assert block.num_edges() > block.edata[dgl.EID].unique().numel()  # 25 draws from ~8 edges repeat some


@pytest.mark.parametrize("how", ["prob", "mask"])
def test_zero_weight_edges_are_never_picked(graph, how):
    w = torch.rand(graph.num_edges()) + 0.1
    w[torch.arange(graph.num_edges()) % 3 == 0] = 0
    graph.edata["w"] = w if how == "prob" else w > 0
    sampler = NeighborSampler([2, 2], generator=_gen(), **{how: "w"})
    positive = torch.bincount(graph.edges(order="eid")[1][w > 0].long(), minlength=graph.num_nodes())
    for start in range(0, 513, 64):
        _, _, blocks = sampler.sample_blocks(graph, torch.arange(start, min(start + 64, 513), dtype=graph.idtype))
        for b in blocks:
            _check_block(graph, b)
            assert bool((w[b.edata[dgl.EID].long()] > 0).all())
            degree = positive[b.dstdata[dgl.NID].long()]
            assert torch.equal(b.in_degrees().long(), degree.clamp(max=2))


def test_weights_written_in_place_are_read_again(graph):
    graph.edata["w"] = torch.ones(graph.num_edges())
    sampler = NeighborSampler([3], prob="w")
    seeds = torch.arange(0, 513, 4, dtype=graph.idtype)
    assert bool((sampler.sample_blocks(graph, seeds)[2][0].edata[dgl.EID] % 2 == 0).any())
    graph.edata["w"][::2] = 0
    _, _, (block,) = sampler.sample_blocks(graph, seeds)
    assert block.num_edges() > 0 and bool((block.edata[dgl.EID] % 2 == 1).all())


def test_heterograph_per_etype_fanouts():
    g = _hetero()
    fanouts = [{"follows": 2, "buys": 3, "bought-by": 0}, {"follows": -1, ("user", "buys", "item"): 3, "bought-by": 1}]
    seeds = {"item": torch.tensor([0, 11, 36]), "user": torch.tensor([5])}
    inputs, outputs, blocks = NeighborSampler(fanouts, generator=_gen()).sample_blocks(g, seeds)
    _, _, want = dgl.dataloading.NeighborSampler(fanouts).sample_blocks(g, seeds)  # the same form as DGL's
    assert outputs is seeds and set(inputs) == set(g.ntypes)
    for ours, theirs, layer in zip(blocks, want, fanouts):
        assert ours.srctypes == theirs.srctypes and ours.dsttypes == theirs.dsttypes
        assert ours.canonical_etypes == theirs.canonical_etypes
        for et in g.canonical_etypes:
            _check_block(g, ours, et)
            k = layer[et] if et in layer else layer[et[1]]
            degree = g.in_degrees(ours.dstnodes[et[2]].data[dgl.NID], etype=et)
            assert torch.equal(ours.in_degrees(etype=et), degree if k == -1 else degree.clamp(max=k))
    assert blocks[0].num_edges("bought-by") == 0  # fanout 0: an empty relation
    for t in g.ntypes:
        assert torch.equal(inputs[t], blocks[0].srcnodes[t].data[dgl.NID])
        assert torch.equal(blocks[-1].dstnodes[t].data[dgl.NID], seeds.get(t, torch.tensor([], dtype=torch.int64)))


def _blocks_equal(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.canonical_etypes == y.canonical_etypes
        for et in x.canonical_etypes:
            assert all(torch.equal(p, q) for p, q in zip(x.edges(etype=et), y.edges(etype=et)))
            assert torch.equal(x.edges[et].data[dgl.EID], y.edges[et].data[dgl.EID])
        for t in x.srctypes:
            assert torch.equal(x.srcnodes[t].data[dgl.NID], y.srcnodes[t].data[dgl.NID])


@pytest.mark.parametrize("hetero", [False, True], ids=["homogeneous", "hetero"])
def test_same_key_same_blocks_on_one_and_two_threads(graph, hetero):
    g, seeds = (_hetero(), {"item": torch.arange(20)}) if hetero else (graph, torch.arange(0, 513, 3))
    runs = []
    before = numba.get_num_threads()
    try:
        for threads in (1, 2, 2):
            numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
            runs.append(NeighborSampler([5, 5], generator=_gen(7)).sample_blocks(g, seeds)[2])
    finally:
        numba.set_num_threads(before)
    _blocks_equal(runs[0], runs[1])
    _blocks_equal(runs[1], runs[2])
    other = NeighborSampler([5, 5], generator=_gen(8)).sample_blocks(g, seeds)[2]
    with pytest.raises(AssertionError):  # another key, other blocks
        _blocks_equal(runs[0], other)


@pytest.mark.parametrize("case", ["edge_dir", "exclude_eids"])
def test_what_it_does_not_implement_is_dgls_own_said_once(graph, case):
    set_num_threads(1)  # DGL's draws are reproducible with one sampling thread only
    kw = {"edge_dir": "out"} if case == "edge_dir" else {}
    exclude = torch.arange(0, graph.num_edges(), 2, dtype=graph.idtype) if case == "exclude_eids" else None
    ours, theirs = NeighborSampler([3, 3], **kw), dgl.dataloading.NeighborSampler([3, 3], **kw)
    seeds = torch.arange(0, 200, 2, dtype=graph.idtype)
    with pytest.warns(UserWarning, match=r"^directload's sampler does not implement .*: DGL's own sampler runs "
                                         r"instead$") as record:
        got = []
        for _ in range(2):
            dgl.seed(0)
            got.append(ours.sample_blocks(graph, seeds, exclude_eids=exclude))
    assert sum("does not implement" in str(w.message) for w in record) == 1  # once per sampler and reason
    for batch in got:
        dgl.seed(0)
        want = theirs.sample_blocks(graph, seeds, exclude_eids=exclude)
        assert torch.equal(batch[0], want[0])
        _blocks_equal(batch[2], want[2])


def test_typed_errors_before_sampling(graph):
    with pytest.raises(ValueError, match=r"fanouts\[1\] is -2; a fanout is a count"):
        NeighborSampler([5, -2])
    with pytest.raises(TypeError, match="fanouts must be a list"):
        NeighborSampler(5)
    with pytest.raises(TypeError, match=r"fanouts\[0\] must be an int"):
        NeighborSampler([2.5])
    with pytest.raises(ValueError, match="edge_dir must be 'in' or 'out'"):
        NeighborSampler([5], edge_dir="both")
    with pytest.raises(ValueError, match="mutually exclusive"):
        NeighborSampler([5], prob="w", mask="m")
    with pytest.raises(TypeError, match="generator must be a torch.Generator"):
        NeighborSampler([5], generator=0)
    with pytest.raises(IndexError, match="seed 513 is outside the graph's 513 nodes"):
        NeighborSampler([5]).sample_blocks(graph, torch.tensor([1, 513]))
    with pytest.raises(KeyError, match="prob 'w' is not an edge feature"):
        NeighborSampler([5], prob="w").sample_blocks(graph, torch.tensor([1]))
    g = _hetero()
    with pytest.raises(ValueError, match=r"fanouts\[0\] has no fanout for edge types"):
        NeighborSampler([{"follows": 2, "buys": 1}]).sample_blocks(g, {"item": torch.tensor([0])})
    with pytest.raises(ValueError, match=r"fanouts\[0\] names 'likes', which is not an edge type"):
        NeighborSampler([{"likes": 2}]).sample_blocks(g, {"item": torch.tensor([0])})
    with pytest.raises(ValueError, match=r"fanouts\[\('user', 'follows', 'user'\)\]\[0\] is -3"):
        NeighborSampler([{"follows": -3, "buys": 1, "bought-by": 1}]).sample_blocks(g, {"item": torch.tensor([0])})
    with pytest.raises(TypeError, match="several node types: pass the seeds as a dict"):
        NeighborSampler([2]).sample_blocks(g, torch.tensor([0]))
    with pytest.raises(ValueError, match=r"seed types \['shop'\] are not node types"):
        NeighborSampler([2]).sample_blocks(g, {"shop": torch.tensor([0])})


def test_in_dgls_dataloader_with_prefetched_features_and_labels(graph):
    sampler = NeighborSampler([4, 4], prefetch_node_feats=["feat"], prefetch_labels=["label"])
    loader = dgl.dataloading.DataLoader(graph, torch.arange(300, dtype=graph.idtype), sampler, batch_size=64,
                                        shuffle=True)
    seen = []
    for inputs, outputs, blocks in loader:
        assert torch.equal(blocks[0].srcdata["feat"], graph.ndata["feat"][inputs.long()])
        assert torch.equal(blocks[-1].dstdata["label"], graph.ndata["label"][outputs.long()])
        seen.append(outputs)
    assert torch.equal(torch.cat(seen).sort().values, torch.arange(300, dtype=graph.idtype))


def test_our_dataloader_runs_ours_when_asked(graph):
    theirs = dgl.dataloading.NeighborSampler([4, 4], prefetch_node_feats=["feat"], prefetch_labels=["label"])
    kw = dict(batch_size=64, shuffle=True)
    assert DataLoader(graph, torch.arange(300), theirs, **kw).graph_sampler is theirs  # default: DGL's batches
    loader = DataLoader(graph, torch.arange(300), theirs, sampler="directload", **kw)
    assert isinstance(loader.graph_sampler, NeighborSampler)
    assert loader.graph_sampler.fanouts == [4, 4] and loader.graph_sampler.prefetch_labels == ["label"]
    n = 0
    for inputs, outputs, blocks in loader:
        assert torch.equal(blocks[0].srcdata["feat"], graph.ndata["feat"][inputs.long()])
        assert torch.equal(blocks[-1].dstdata["label"], graph.ndata["label"][outputs.long()])
        assert bool((blocks[-1].in_degrees() <= 4).all())
        n += 1
    assert n == 5
    with pytest.raises(ValueError, match="sampler must be 'framework'"):
        DataLoader(graph, torch.arange(300), theirs, sampler="pyg", **kw)


def test_resolve_sampler_replaces_dgls_with_uva_and_keeps_other_samplers():
    theirs = dgl.dataloading.NeighborSampler([4])
    full = dgl.dataloading.MultiLayerFullNeighborSampler(2)
    assert resolve_sampler("framework", theirs) is theirs and resolve_sampler(None, theirs) is theirs
    assert resolve_sampler("directload", full).fanouts == [-1, -1]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # use_uva=True: directload's GPU sampler runs, nothing falls back
        uva = resolve_sampler("directload", theirs, use_uva=True)
    assert isinstance(uva, NeighborSampler) and uva.fanouts == [4]
    shadow = dgl.dataloading.ShaDowKHopSampler([4])
    with pytest.warns(UserWarning, match="replaces DGL's NeighborSampler only, not ShaDowKHopSampler"):
        assert resolve_sampler("directload", shadow) is shadow
    ours = NeighborSampler([4])
    assert resolve_sampler("directload", ours) is ours and resolve_sampler("framework", ours) is ours


def test_worker_processes_sample_with_ours_after_the_parent_did(graph):
    # Forked workers sample serially: the parent's OpenMP runtime would abort them (directload.kernels.forks).
    sampler = NeighborSampler([3, 3], prefetch_node_feats=["feat"])
    sampler.sample_blocks(graph, torch.arange(8, dtype=graph.idtype))
    loader = dgl.dataloading.DataLoader(graph, torch.arange(256), sampler, batch_size=64, num_workers=2)
    for inputs, _, blocks in loader:
        assert torch.equal(blocks[0].srcdata["feat"], graph.ndata["feat"][inputs.long()])


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("data")
    synthesize(root, "synth-tiny", progress=False)
    return load(root, "synth-tiny", affinity="host")


# On synth-tiny, 30 epochs of 2-layer GraphSAGE reach 0.77-0.79 test accuracy with DGL's sampler, moving by about
# a point from seed to seed (6 seeds: 0.767-0.792).  Three seeds see only part of that spread, so their min-max
# range is widened by TOLERANCE: it guards against failing on the seed-to-seed noise of both samplers (ours is a
# mean of three), not against a real loss.  A sampler bug (a wrong edge, a biased pick, a missing hop) costs
# more than that on this homophilous graph, where neighbours carry most of the signal.
TOLERANCE = 0.02


def test_graphsage_learns_as_well_with_ours_as_with_dgls(tiny):
    set_num_threads(1)
    acc = {}
    for sampler in ("framework", "directload"):
        acc[sampler] = [train(tiny, TrainConfig(loader="dgl", sampler=sampler, layers=2, fanouts=(5, 5), hidden=32,
                                                batch_size=256, epochs=30, lr=1e-2, seed=seed),
                              progress=False).test_acc for seed in range(3)]
    theirs, ours = acc["framework"], statistics.mean(acc["directload"])
    assert min(theirs) > 2 / tiny.num_classes, acc  # the model learns (chance: 1/5), so the comparison means something
    assert min(theirs) - TOLERANCE <= ours <= max(theirs) + TOLERANCE, acc
