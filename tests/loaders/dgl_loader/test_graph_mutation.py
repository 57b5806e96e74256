"""directload's DGL NeighborSampler after the graph changes in place: DGL gives a mutated graph a new index, the
sampler reads the graph again when the index it read is no longer the graph's, so no block holds an edge the graph
has lost or an edge id it has renumbered (the same node and edge counts included)."""

import dgl
import pytest
import torch

from directload.loaders.dgl import NeighborSampler


def _ring(n=40, k=4, idtype=torch.int64):
    """Node v's in-edges come from v+1 .. v+k (mod n): n*k distinct edges, in-degree k everywhere."""
    v = torch.arange(n).repeat_interleave(k)
    u = (v + torch.arange(1, k + 1).repeat(n)) % n
    return dgl.graph((u, v), num_nodes=n, idtype=idtype)


def _check_edges_exist(g, blocks):
    """Every block edge is an edge of ``g`` now, under the edge id the block gives it, and every destination got
    all its in-edges (fanout -1)."""
    for block in blocks:
        for et in block.canonical_etypes:
            src_t, _, dst_t = et
            u, v = block.edges(etype=et, order="eid")
            src = block.srcnodes[src_t].data[dgl.NID][u.long()]
            dst = block.dstnodes[dst_t].data[dgl.NID][v.long()]
            assert bool(g.has_edges_between(src, dst, etype=et).all())
            eid = block.edges[et].data[dgl.EID]
            assert bool((eid < g.num_edges(et)).all())
            gu, gv = g.find_edges(eid, etype=et)
            assert torch.equal(gu, src) and torch.equal(gv, dst)
            degree = g.in_degrees(block.dstnodes[dst_t].data[dgl.NID], etype=et)
            assert torch.equal(block.in_degrees(etype=et), degree)


@pytest.mark.parametrize("mutate", ["add_nodes", "add_edges", "remove_nodes", "remove_edges"])
@pytest.mark.parametrize("hetero", [False, True], ids=["homogeneous", "hetero"])
def test_dgl_gives_the_graph_a_new_index_at_every_mutation(mutate, hetero):
    # What the sampler relies on (loaders/dgl/sampler.py, _index): no in-place change keeps the index.
    g = _hetero() if hetero else _ring()
    kw = {"etype": "buys"} if hetero else {}
    nkw = {"ntype": "item"} if hetero else {}
    before = g._graph
    if mutate == "add_nodes":
        g.add_nodes(1, **nkw)
    elif mutate == "add_edges":
        g.add_edges(torch.tensor([0]), torch.tensor([1]), **kw)
    elif mutate == "remove_nodes":
        g.remove_nodes(torch.tensor([0]), **nkw)
    else:
        g.remove_edges(torch.tensor([0]), **kw)
    assert g._graph is not before
    with pytest.raises(dgl.DGLError, match="not mutable"):  # nor does the index change itself
        g._graph.add_nodes(0, 1)


@pytest.mark.parametrize("idtype", [torch.int64, torch.int32], ids=["int64", "int32"])
def test_edges_removed_then_as_many_added_are_sampled_from_the_new_graph(idtype):
    g = _ring(idtype=idtype)
    sampler = NeighborSampler([-1, -1])
    seeds = torch.arange(g.num_nodes(), dtype=idtype)
    _check_edges_exist(g, sampler.sample_blocks(g, seeds)[2])  # the plan is built and kept
    counts = g.num_nodes(), g.num_edges()
    g.remove_edges(torch.arange(20, dtype=idtype))  # the in-edges of nodes 0..4
    v = torch.arange(20, dtype=idtype)
    g.add_edges((v + 10) % 40, v)  # 20 others: the counts are back where they were
    assert (g.num_nodes(), g.num_edges()) == counts
    _, _, blocks = sampler.sample_blocks(g, seeds)
    _check_edges_exist(g, blocks)


def test_a_node_removed_then_one_added_with_as_many_edges_is_seen():
    g = _ring()
    sampler = NeighborSampler([-1])
    seeds = torch.arange(0, 40, 3)
    sampler.sample_blocks(g, seeds)
    counts = g.num_nodes(), g.num_edges()
    g.remove_nodes(torch.tensor([3]))  # node 3 and its 8 edges; nodes above it renumbered
    g.add_nodes(1)
    g.add_edges(torch.tensor([39] * 8), torch.tensor([0, 5, 10, 15, 20, 25, 30, 35]))
    assert (g.num_nodes(), g.num_edges()) == counts
    _check_edges_exist(g, sampler.sample_blocks(g, seeds)[2])


def _hetero():
    follows = torch.arange(60)
    buys_dst = torch.arange(120) % 37
    return dgl.heterograph({
        ("user", "follows", "user"): (follows, (follows + 1) % 60),
        ("user", "buys", "item"): (torch.arange(120) % 60, buys_dst),
        ("item", "bought-by", "user"): (buys_dst, torch.arange(120) % 60),
    }, num_nodes_dict={"user": 60, "item": 37})


def test_one_relation_of_a_heterograph_mutated_is_seen():
    g = _hetero()
    sampler = NeighborSampler([-1, -1])
    seeds = {"item": torch.arange(37), "user": torch.arange(0, 60, 7)}
    _check_edges_exist(g, sampler.sample_blocks(g, seeds)[2])
    counts = g.num_edges("buys")
    g.remove_edges(torch.arange(30), etype="buys")
    g.add_edges(torch.arange(30) % 60, (torch.arange(30) + 5) % 37, etype="buys")
    assert g.num_edges("buys") == counts
    _check_edges_exist(g, sampler.sample_blocks(g, seeds)[2])


def test_weights_are_read_again_after_a_mutation_and_when_replaced():
    g = _ring()
    g.edata["w"] = torch.ones(g.num_edges())
    sampler = NeighborSampler([2], prob="w")
    seeds = torch.arange(40)
    sampler.sample_blocks(g, seeds)
    g.remove_edges(torch.tensor([0]))
    g.add_edges(torch.tensor([9]), torch.tensor([0]), data={"w": torch.ones(1)})
    g.edata["w"][g.edge_ids(torch.tensor([9]), torch.tensor([0]))] = 0  # written in place after the mutation
    _, _, (block,) = sampler.sample_blocks(g, seeds)
    _check_weighted(g, block)
    g.edata["w"] = (torch.arange(g.num_edges()) % 2).float()  # replaced by a tensor of the same shape
    _, _, (block,) = sampler.sample_blocks(g, seeds)
    _check_weighted(g, block)


def _check_weighted(g, block):
    eid = block.edata[dgl.EID].long()
    assert block.num_edges() > 0 and bool((g.edata["w"][eid] > 0).all())
    src, dst = block.srcdata[dgl.NID][block.edges()[0].long()], block.dstdata[dgl.NID][block.edges()[1].long()]
    assert torch.equal(torch.stack(g.find_edges(eid)), torch.stack([src, dst]))


def test_fanouts_and_replace_set_anew_are_used():
    g = _ring()
    sampler = NeighborSampler([3])
    seeds = torch.arange(40)
    assert torch.equal(sampler.sample_blocks(g, seeds)[2][0].in_degrees(), torch.full((40,), 3))
    sampler.fanouts[0] = 1  # in place, as DGL's sampler allows
    assert torch.equal(sampler.sample_blocks(g, seeds)[2][0].in_degrees(), torch.ones(40, dtype=torch.int64))
    sampler.fanouts, sampler.replace = [6], True
    assert torch.equal(sampler.sample_blocks(g, seeds)[2][0].in_degrees(), torch.full((40,), 6))
    sampler.fanouts = [-2]
    with pytest.raises(ValueError, match=r"fanouts\[0\] is -2"):
        sampler.sample_blocks(g, seeds)
    once = NeighborSampler(iter([2]))  # an iterator is read once, into a list DGL's code can reverse
    assert once.fanouts == [2]
    assert torch.equal(once.sample_blocks(g, seeds)[2][0].in_degrees(), torch.full((40,), 2))
