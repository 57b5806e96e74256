"""``sampler="directload"`` keeps the user's code: a DGL sampler subclass with methods of its own, or attributes DGL's
lacks, runs as written (with a one-line warning naming them and DGL's batches); what directload's sampler does not
implement (a graph without CSC, a block, an edge direction set anew) is sampled by DGL's own code."""

import dgl
import pytest
import torch
from dgl.utils import set_num_threads

from directload.loaders.dgl import DataLoader, NeighborSampler, resolve_sampler

KEPT = r": DGL's sampler path runs; directload's sampler replaces only DGL's own NeighborSampler$"


@pytest.fixture
def graph():
    g = dgl.rand_graph(300, 2400)
    g.ndata["feat"] = torch.randn(300, 11)
    return g


@pytest.fixture
def one_thread():
    set_num_threads(1)  # DGL's draws are reproducible with one sampling thread only


def _blocks_equal(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert all(torch.equal(p, q) for p, q in zip(x.edges(order="eid"), y.edges(order="eid")))
        assert torch.equal(x.srcdata[dgl.NID], y.srcdata[dgl.NID])
        assert torch.equal(x.dstdata[dgl.NID], y.dstdata[dgl.NID])
        assert torch.equal(x.edata[dgl.EID], y.edata[dgl.EID])


class RecordingSampler(dgl.dataloading.NeighborSampler):
    """A user's NeighborSampler whose sample_blocks records each call."""

    def __init__(self, fanouts, **kw):
        super().__init__(fanouts, **kw)
        self.calls = 0

    def sample_blocks(self, g, seed_nodes, exclude_eids=None):
        self.calls += 1
        return super().sample_blocks(g, seed_nodes, exclude_eids)


class SampleOverride(dgl.dataloading.NeighborSampler):
    def sample(self, g, seed_nodes, exclude_eids=None):
        return super().sample(g, seed_nodes, exclude_eids)


class LazyOverride(dgl.dataloading.MultiLayerFullNeighborSampler):
    def assign_lazy_features(self, result):
        return super().assign_lazy_features(result)


class OwnBlockSampler(dgl.dataloading.BlockSampler):
    def sample_blocks(self, g, seed_nodes, exclude_eids=None):
        frontier = dgl.sampling.sample_neighbors(g, seed_nodes, 2)
        block = dgl.to_block(frontier, seed_nodes)
        return block.srcdata[dgl.NID], seed_nodes, [block]


def _loader(g, graph_sampler, **kw):
    return DataLoader(g, torch.arange(200), graph_sampler, batch_size=64, **kw)


def test_a_subclass_overriding_sample_blocks_runs_as_written_with_dgls_batches(graph, one_thread):
    mine = RecordingSampler([4, 4], prefetch_node_feats=["feat"])
    named = r"^RecordingSampler overrides sample_blocks and sets attribute calls"
    with pytest.warns(UserWarning, match=named + KEPT) as record:
        loader = _loader(graph, mine, sampler="directload")
    assert len(record) == 1 and loader.graph_sampler is mine
    dgl.seed(0)
    got = list(loader)
    assert mine.calls == len(got) == 4  # the user's code ran, once a batch
    dgl.seed(0)
    want = list(dgl.dataloading.DataLoader(graph, torch.arange(200), RecordingSampler([4, 4]), batch_size=64))
    for (inputs, outputs, blocks), (w_inputs, w_outputs, w_blocks) in zip(got, want, strict=True):
        assert torch.equal(inputs, w_inputs) and torch.equal(outputs, w_outputs)
        _blocks_equal(blocks, w_blocks)
        assert torch.equal(blocks[0].srcdata["feat"], graph.ndata["feat"][inputs])


@pytest.mark.parametrize("sampler, names", [
    (SampleOverride([3]), "SampleOverride overrides sample"),
    (LazyOverride(2), "LazyOverride overrides assign_lazy_features"),
    (OwnBlockSampler(), "OwnBlockSampler overrides sample_blocks"),
], ids=["sample", "assign_lazy_features", "BlockSampler"])
def test_each_override_keeps_the_sampler_given_and_is_named(sampler, names):
    with pytest.warns(UserWarning, match="^" + names + KEPT):
        assert resolve_sampler("directload", sampler) is sampler


def test_attributes_dgls_sampler_lacks_keep_it_and_init_alone_is_replaced():
    class Preset(dgl.dataloading.NeighborSampler):  # __init__ only sets DGL's settings: ours takes them
        def __init__(self):
            super().__init__([5, 5], replace=True)
            self.fanouts = [6, 6]

    class Tagged(Preset):
        def __init__(self):
            super().__init__()
            self.hops, self.tag = 2, "x"

    ours = resolve_sampler("directload", Preset())
    assert isinstance(ours, NeighborSampler) and ours.fanouts == [6, 6] and ours.replace
    tagged = Tagged()
    with pytest.warns(UserWarning, match=r"^Tagged sets attributes hops, tag" + KEPT):
        assert resolve_sampler("directload", tagged) is tagged
    plain = dgl.dataloading.NeighborSampler([3])
    plain.sample_blocks = lambda g, seeds, exclude_eids=None: None  # patched on the instance
    with pytest.warns(UserWarning, match=r"^NeighborSampler sets attribute sample_blocks" + KEPT):
        assert resolve_sampler("directload", plain) is plain


def test_a_subclass_of_ours_runs_as_written(graph):
    class Mine(NeighborSampler):
        calls = 0

        def sample_blocks(self, g, seed_nodes, exclude_eids=None):
            type(self).calls += 1
            return super().sample_blocks(g, seed_nodes, exclude_eids)

    mine = Mine([3, 3])
    for kind in ("directload", "framework"):
        loader = _loader(graph, mine, sampler=kind)
        assert loader.graph_sampler is mine
        assert sum(1 for _ in loader) == 4
    assert Mine.calls == 8


@pytest.mark.parametrize("case", ["coo", "block"])
def test_a_graph_without_csc_or_a_block_is_sampled_by_dgl(graph, one_thread, case):
    fanouts = [3, 3]
    if case == "coo":
        g, seeds = graph.formats(["coo"]), torch.arange(0, 300, 3)
        reason = r"graphs whose formats \['coo'\] exclude CSC"
    else:  # DGL samples one layer of a block (a second fails in DGL: its sources are of another type)
        _, _, (g,) = dgl.dataloading.NeighborSampler([5]).sample_blocks(graph, torch.arange(40))
        fanouts, seeds, reason = [3], {"_N": torch.arange(20)}, "blocks as the graph"
    ours, theirs = NeighborSampler(fanouts, fused=False), dgl.dataloading.NeighborSampler(fanouts, fused=False)
    assert ours.unsupported(g) == reason.replace("\\", "")
    with pytest.warns(UserWarning, match=f"^directload's sampler does not implement {reason}: DGL's own sampler "
                                         "runs instead$"):
        dgl.seed(0)
        got = ours.sample_blocks(g, seeds)
    dgl.seed(0)
    want = theirs.sample_blocks(g, seeds)
    _blocks_equal(got[2], want[2])


def test_edge_dir_set_anew_is_dgls_with_it(graph, one_thread):
    ours = NeighborSampler([3, 3])
    seeds = torch.arange(0, 300, 5)
    ours.sample_blocks(graph, seeds)
    ours.edge_dir = "out"
    with pytest.warns(UserWarning, match=r"does not implement edge_dir='out'"):
        dgl.seed(0)
        got = ours.sample_blocks(graph, seeds)
    dgl.seed(0)
    want = dgl.dataloading.NeighborSampler([3, 3], edge_dir="out").sample_blocks(graph, seeds)
    _blocks_equal(got[2], want[2])


def test_from_dgl_carries_every_setting():
    theirs = dgl.dataloading.NeighborSampler([{"a": 2}], edge_dir="out", mask="m", replace=True,
                                              prefetch_node_feats=["x"], prefetch_labels=["y"],
                                              prefetch_edge_feats=["z"], output_device="cpu", fused=False)
    ours = NeighborSampler.from_dgl(theirs)
    for name in ("fanouts", "edge_dir", "prob", "replace", "prefetch_node_feats", "prefetch_labels",
                 "prefetch_edge_feats", "output_device", "fused"):
        assert getattr(ours, name) == getattr(theirs, name), name
    assert set(vars(theirs)) <= set(vars(ours))  # every attribute DGL's code reads when it runs for ours
