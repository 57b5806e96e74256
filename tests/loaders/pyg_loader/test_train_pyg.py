"""The PyG training harness: per-hop counts recovered from torch-sparse's sampler, and trimming that leaves
the seeds' outputs unchanged."""

import pytest
import torch
from torch_geometric.data import Data
from torch_geometric.loader import NeighborLoader

from directload.harness.train_pyg import GAT, SAGE, hop_counts


def _batches(n=1500, e=15000, fanouts=(5, 4, 3), count=4):
    g = torch.Generator().manual_seed(3)
    data = Data(x=torch.randn(n, 12, generator=g), edge_index=torch.randint(0, n, (2, e), generator=g),
                num_nodes=n)
    torch.manual_seed(0)
    loader = NeighborLoader(data, num_neighbors=list(fanouts), batch_size=48, shuffle=True)
    out = []
    for batch in loader:
        out.append(batch)
        if len(out) == count:
            break
    return out


def test_hop_counts_match_the_sampled_layout():
    for batch in _batches():
        nodes, edges = hop_counts(batch.edge_index, batch.batch_size, 3)
        assert nodes[0] == batch.batch_size
        assert sum(nodes) == batch.num_nodes and sum(edges) == batch.edge_index.shape[1]
        # Hop k's edges end at nodes of hop k-1, and start at nodes of hop <= k.
        bounds = torch.tensor([0, *nodes]).cumsum(0)
        start = 0
        for k, count in enumerate(edges, 1):
            src, dst = batch.edge_index[:, start:start + count]
            assert bool(((dst >= bounds[k - 1]) & (dst < bounds[k])).all())
            assert bool((src < bounds[k + 1]).all())
            start += count


@pytest.mark.parametrize("model", [SAGE(12, 16, 4, 3, 0.0), GAT(12, 4, 4, 3, 2, 0.0)], ids=["sage", "gat"])
def test_trimming_leaves_seed_outputs_unchanged(model):
    model.eval()
    for batch in _batches():
        nodes, edges = hop_counts(batch.edge_index, batch.batch_size, 3)
        with torch.no_grad():
            whole = model(batch.x, batch.edge_index, None, None)[:batch.batch_size]
            trimmed = model(batch.x, batch.edge_index, nodes, edges)[:batch.batch_size]
        assert trimmed.shape == (batch.batch_size, 4) and trimmed.dtype == torch.float32
        torch.testing.assert_close(trimmed, whole, atol=1e-5, rtol=1e-4)


def test_unknown_layout_runs_untrimmed():
    # Edges out of hop order (another sampler): no counts, so the model runs on the whole subgraph.
    edge_index = torch.tensor([[5, 1, 2], [1, 0, 0]])
    assert hop_counts(edge_index, 1, 2) == (None, None)
    # A node beyond the hops.
    assert hop_counts(torch.tensor([[1, 2], [0, 5]]), 1, 1) == (None, None)
