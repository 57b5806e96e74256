"""PyG's NeighborLoader over directload on a real GPU: features gathered zero-copy onto the device.

Skipped without a CUDA device or without PyG; benchmarks/gpu_suite.py runs them where both exist.
"""

import pytest
import torch

pytest.importorskip("torch_geometric", reason="the PyG loader's GPU test needs PyG")
import torch_geometric.typing  # noqa: E402
from torch_geometric.data import Data  # noqa: E402

from directload.loaders.pyg import FeatureStore, NeighborLoader, stores_from  # noqa: E402

pytestmark = pytest.mark.gpu


@pytest.fixture
def data():
    torch.manual_seed(0)
    return Data(x=torch.randn(3000, 37), y=torch.randint(0, 5, (3000,)), edge_index=torch.randint(0, 3000, (2, 30000)))


@pytest.mark.skipif(not (torch_geometric.typing.WITH_PYG_LIB or torch_geometric.typing.WITH_TORCH_SPARSE),
                    reason="NeighborLoader needs pyg-lib or torch-sparse (scripts/gpu_lease.sh builds one)")
def test_node_tables_are_gathered_onto_the_gpu(data):
    for batch in NeighborLoader(data, num_neighbors=[5, 5], batch_size=256, shuffle=True):
        assert batch.x.is_cuda and batch.y.is_cuda  # affinity "cuda": zero-copy gathers on the device
        assert torch.equal(batch.x.cpu(), data.x[batch.n_id])


def test_feature_store_with_a_cuda_device(data):
    fs, _ = stores_from(data)
    gpu = FeatureStore(device="cuda")
    gpu.put_tensor(fs.table(None, "x"), group_name=None, attr_name="x", index=None)
    idx = torch.randint(0, 3000, (1000,))
    for index in (idx, idx.cuda()):
        got = gpu.get_tensor(group_name=None, attr_name="x", index=index)
        assert got.is_cuda and torch.equal(got.cpu(), data.x[idx])
