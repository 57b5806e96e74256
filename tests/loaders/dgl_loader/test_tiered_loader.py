"""The DGL loader over a tiered store: every row right, hints reaching the caches, and
``lookahead="auto"`` choosing each epoch's L from the last one's stage times."""

import dgl
import numpy as np
import pytest
import torch

from directload.loaders import DataLoader
from directload.stores import TensorStore, TieredStore


def _seed(seed):
    torch.manual_seed(seed)
    np.random.seed(seed)
    dgl.seed(seed)


def _epoch_batches(loader):
    return [(i.clone(), o.clone(), [b.srcdata["feat"].clone() for b in blocks[:1]]) for i, o, blocks in loader]


@pytest.mark.parametrize("lookahead", [1, 3, "auto"])
def test_a_tiered_store_gives_every_row_right_and_its_caches_see_the_future(lookahead):
    g = dgl.rand_graph(3000, 30000)
    feat = torch.randn(3000, 24)
    g.ndata["feat"] = feat
    sampler = dgl.dataloading.NeighborSampler([5, 5], prefetch_node_feats=["feat"])
    store = TieredStore(TensorStore(feat), gpu_bytes=100 * 96, host_bytes=600 * 96, staging_bytes=800 * 96)
    ids = torch.arange(1200)
    ours = DataLoader(g, ids, sampler, batch_size=100, shuffle=True, features={"feat": store}, lookahead=lookahead)
    for _ in range(3):  # (batch-for-batch parity with DGL's loader is tests/loaders/dgl_loader/test_dgl_parity)
        epoch = _epoch_batches(ours)
        assert len(epoch) == 12
        assert torch.equal(torch.sort(torch.cat([o for _, o, _ in epoch])).values, ids)
        for i, _, f in epoch:
            assert f[0].dtype == feat.dtype and torch.equal(f[0], feat[i])
    s = store.stats()
    assert s["host"]["prefetched_rows"] + s["host"]["staged_rows"] + s["host"]["hit_rows"] > 0
    assert s["device"]["reads"] == 36
    if lookahead == "auto":
        chosen = ours.auto_lookahead.chosen
        assert len(chosen) == 3 and chosen[0] == 4
        assert all(isinstance(x, int) and 1 <= x <= 64 for x in chosen)
    store.close()


def test_bad_lookaheads_are_refused():
    g = dgl.rand_graph(10, 20)
    sampler = dgl.dataloading.NeighborSampler([2])
    for bad in (0, -1, 1.5, True, "fast", None):
        with pytest.raises(ValueError, match="lookahead"):
            DataLoader(g, torch.arange(5), sampler, lookahead=bad)
    assert np.isscalar(DataLoader(g, torch.arange(5), sampler, lookahead="auto").auto_lookahead.start)
