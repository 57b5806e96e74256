"""The loader never hangs and never crashes the process: bad devices, bad seeds, bad sizes, dying threads."""

import dgl
import pytest
import torch
from conftest import drain_from_threads, within

from directload.capabilities import NoDeviceError
from directload.loaders import DataLoader


@pytest.fixture
def graph():
    g = dgl.rand_graph(300, 2000)
    g.ndata["feat"] = torch.randn(300, 8)
    g.ndata["label"] = torch.randint(0, 3, (300,))
    return g


@pytest.fixture
def sampler():
    return dgl.dataloading.NeighborSampler([3, 3], prefetch_node_feats=["feat"], prefetch_labels=["label"])


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
@pytest.mark.parametrize("device", ["cuda", "cuda:0", torch.device("cuda")])
def test_cuda_device_without_cuda_is_refused_at_once(graph, sampler, device):
    # Before: the README's snippet hung forever here (the gather thread died before its try).
    with pytest.raises(NoDeviceError, match="no usable CUDA device"):
        within(10, lambda: DataLoader(graph, torch.arange(10), sampler, device=device))


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_uva_sampling_without_cuda_is_refused_at_once(graph, sampler):
    with pytest.raises(NoDeviceError, match="use_uva=True"):
        within(10, lambda: DataLoader(graph, torch.arange(10), sampler, use_uva=True))


@pytest.mark.parametrize("device", ["tpu", "meta", "banana", 3.5])
def test_devices_that_are_not_cpu_or_cuda_are_refused(graph, sampler, device):
    with pytest.raises(ValueError, match="device"):
        DataLoader(graph, torch.arange(10), sampler, device=device)


@pytest.mark.parametrize("bad", [300, -1, 2**40, -(2**40)])
def test_seed_nodes_outside_the_graph_raise_index_error(graph, sampler, bad):
    # Before: N or -1 aborted the process with c10::Error, 2**40 crashed it (SIGSEGV), while sampling.
    with pytest.raises(IndexError, match=f"seed node id {bad} is outside the graph's 300 nodes"):
        DataLoader(graph, torch.tensor([0, bad, 5]), sampler)


def test_seed_ids_are_checked_per_type_and_for_edges():
    g = dgl.heterograph({("a", "ab", "b"): (torch.tensor([0, 1]), torch.tensor([1, 2]))})
    s = dgl.dataloading.NeighborSampler([2])
    with pytest.raises(IndexError, match="seed node id 3 of type 'b' is outside the graph's 3 nodes"):
        DataLoader(g, {"a": torch.tensor([0]), "b": torch.tensor([3])}, s)
    with pytest.raises(KeyError, match="not a node type"):
        DataLoader(g, {"c": torch.tensor([0])}, s)
    with pytest.raises(TypeError, match="several node types"):
        DataLoader(g, torch.tensor([0]), s)
    plain = dgl.rand_graph(50, 100)
    edge_sampler = dgl.dataloading.as_edge_prediction_sampler(s)
    with pytest.raises(IndexError, match="seed edge id 100 is outside the graph's 100 edges"):
        DataLoader(plain, torch.tensor([99, 100]), edge_sampler)
    DataLoader(plain, torch.arange(100), edge_sampler)  # every edge is fine


@pytest.mark.parametrize("ids,match", [(torch.tensor([0.0, 1.0]), "integers"),
                                       (torch.ones(300, dtype=torch.bool), "boolean mask")])
def test_seed_ids_must_be_integers(graph, sampler, ids, match):
    with pytest.raises(TypeError, match=match):
        DataLoader(graph, ids, sampler)


def test_seeds_that_are_not_node_ids_are_left_alone(graph):
    # SAINT's seeds count iterations; there may be more of them than nodes.
    saint = dgl.dataloading.SAINTSampler("node", 50, prefetch_ndata=["feat"])
    assert len(list(DataLoader(graph, torch.arange(600), saint, batch_size=200))) == 3


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, None, "8"])
def test_batch_size_must_be_a_positive_integer(graph, sampler, bad):
    # Before: 0 or a negative size yielded empty batches forever.
    with pytest.raises(ValueError, match="batch_size must be a positive integer"):
        DataLoader(graph, torch.arange(10), sampler, batch_size=bad)


@pytest.mark.parametrize("in_thread", [False, True])
@pytest.mark.parametrize("n_ids,lookahead,want", [(300, 3, 3), (40, 4, 2)])
def test_upcoming_is_filled_at_iter(graph, sampler, in_thread, n_ids, lookahead, want):
    # Before: upcoming() was empty until the first next().
    loader = DataLoader(graph, torch.arange(n_ids), sampler, batch_size=20, lookahead=lookahead,
                        sample_in_thread=in_thread)
    it = within(30, lambda: iter(loader))
    ahead = it.upcoming()
    assert len(ahead) == want
    first = next(it)
    assert torch.equal(first[0], ahead[0])
    it.close()


def test_one_epoch_shared_by_two_threads_delivers_every_batch_once(graph, sampler):
    loader = DataLoader(graph, torch.arange(300), sampler, batch_size=10, shuffle=True)
    for _ in range(3):
        got = drain_from_threads(iter(loader))
        seeds = torch.cat([b[1] for b in got])
        assert len(got) == len(loader) == 30 and torch.equal(seeds.sort().values, torch.arange(300))


@pytest.mark.parametrize("module", ["directload.loaders.dgl", "directload.harness.train_dgl"])
def test_importing_the_dgl_side_leaves_the_environment_and_home_as_they_were(tmp_path, module):
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "DGLBACKEND"}
    env["HOME"] = str(tmp_path)  # where DGL would write .dgl/config.json
    code = (f"import os, {module}, dgl; print(dgl.backend.backend_name, os.environ.get('DGLBACKEND'))")
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, encoding="utf-8",
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["pytorch", "None"]
    assert "backend not selected" not in proc.stderr and not (tmp_path / ".dgl").exists()
