"""Helpers of the PyG lane's tests: PyG as a user has it without a sampler of its own, and batches compared field by
field."""

import torch
import torch_geometric.typing as pyg_typing
from torch_geometric.data import HeteroData


def without_pyg_sampler(monkeypatch):
    """PyG as a user has it after ``pip install "directload[pyg]"``: neither pyg-lib nor torch-sparse, and a
    torch-sparse sampler that fails if anything still calls it."""
    monkeypatch.setattr(pyg_typing, "WITH_PYG_LIB", False)
    monkeypatch.setattr(pyg_typing, "WITH_TORCH_SPARSE", False)

    def boom(*args, **kwargs):
        raise AssertionError("torch-sparse's sampler ran")

    monkeypatch.setattr(torch.ops.torch_sparse, "neighbor_sample", boom)
    monkeypatch.setattr(torch.ops.torch_sparse, "hetero_neighbor_sample", boom)


def same_batches(want, got):
    """Two lists of batches equal field by field (tensors in dtype and value)."""
    assert len(got) == len(want) > 0
    for a, b in zip(want, got):
        assert type(a) is type(b)
        if isinstance(a, HeteroData):
            assert a.node_types == b.node_types and a.edge_types == b.edge_types
        for sa, sb in zip(a.stores, b.stores):
            assert sorted(sa.keys()) == sorted(sb.keys())
            for key in sa.keys():
                x, y = sa[key], sb[key]
                if isinstance(x, torch.Tensor):
                    assert type(y) is torch.Tensor and x.dtype == y.dtype and torch.equal(x, y), key
                else:
                    assert x == y, key
