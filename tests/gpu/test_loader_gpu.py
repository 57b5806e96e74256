"""The loader on a real GPU: zero-copy gathers from a unified table, blocks and features on the device.

Skipped without a CUDA device; benchmarks/gpu_suite.py runs them where one exists.
"""

import pytest
import torch

dgl = pytest.importorskip("dgl", reason="the DGL loader's GPU test needs DGL (the DGL lane)")

import directload  # noqa: E402
from directload.loaders import DataLoader  # noqa: E402

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("where", ["unified", "plain"])
def test_batches_arrive_on_the_gpu(where):
    g = dgl.rand_graph(2000, 20000)
    feat = torch.randn(2000, 37)
    g.ndata["feat"] = directload.to_unified(feat.clone()) if where == "unified" else feat
    g.ndata["label"] = torch.randint(0, 5, (2000,))
    sampler = dgl.dataloading.NeighborSampler([5, 5], prefetch_node_feats=["feat"], prefetch_labels=["label"])
    loader = DataLoader(g, torch.arange(1000), sampler, device="cuda", batch_size=128, shuffle=True)
    assert loader.overlap  # the gather runs on its own stream while the previous batch trains
    n = 0
    for input_nodes, output_nodes, blocks in loader:
        x = blocks[0].srcdata["feat"]
        assert x.is_cuda and blocks[0].device.type == "cuda" and input_nodes.is_cuda
        assert torch.equal(x.cpu(), feat[input_nodes.cpu()])
        assert torch.equal(blocks[-1].dstdata["label"].cpu(), g.ndata["label"][output_nodes.cpu()])
        n += 1
    assert n == 8
