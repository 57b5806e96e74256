"""The DataLoader's refusals are the errors DGL raises for the same misuse (``dgl.DGLError``), so code that
catches DGL's catches ours, and also directload's own types (``NoDeviceError``, ``TypeError``)."""

import pytest
import torch

from directload.capabilities import NoDeviceError

dgl = pytest.importorskip("dgl")
from directload.loaders.dgl import DataLoader  # noqa: E402


@pytest.fixture
def graph():
    return dgl.rand_graph(100, 500)


@pytest.fixture
def sampler():
    return dgl.dataloading.NeighborSampler([2])


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
@pytest.mark.parametrize("device", [None, "cpu", "cuda"])
def test_uva_without_cuda_is_a_dgl_error_and_a_no_device_error(graph, sampler, device):
    with pytest.raises(dgl.DGLError, match="use_uva=True samples on a GPU") as caught:
        DataLoader(graph, torch.arange(10), sampler, device=device, use_uva=True)
    from directload.loaders.dgl import UVAUnavailableError

    assert isinstance(caught.value, NoDeviceError) and isinstance(caught.value, UVAUnavailableError)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_dgl_itself_raises_dgl_error_for_uva_without_cuda(graph, sampler):
    # what the drop-in matches: DGL's own loader, asked the same on the CPU
    with pytest.raises(dgl.DGLError):
        dgl.dataloading.DataLoader(graph, torch.arange(10), sampler, device="cpu", use_uva=True)


@pytest.mark.parametrize("ids, match", [(torch.tensor([0.0, 1.0]), "must be integers"),
                                        (torch.ones(100, dtype=torch.bool), "boolean mask")])
def test_seed_ids_that_are_not_integers_are_a_dgl_error_and_a_type_error(graph, sampler, ids, match):
    with pytest.raises(dgl.DGLError, match=match) as caught:
        DataLoader(graph, ids, sampler)
    from directload.loaders.dgl import SeedTypeError

    assert isinstance(caught.value, TypeError) and isinstance(caught.value, SeedTypeError)
    with pytest.raises(dgl.DGLError):  # DGL's own loader, when it samples
        next(iter(dgl.dataloading.DataLoader(graph, ids, sampler)))


def test_seeds_of_a_graph_with_several_types_need_a_dict_as_dgl_says(sampler):
    g = dgl.heterograph({("a", "r", "b"): (torch.tensor([0, 1]), torch.tensor([1, 0])),
                         ("b", "s", "a"): (torch.tensor([0, 1]), torch.tensor([1, 0]))})
    with pytest.raises(dgl.DGLError, match="several node types") as caught:
        DataLoader(g, torch.tensor([0]), sampler)
    assert isinstance(caught.value, TypeError)
    with pytest.raises(dgl.DGLError, match="Must specify node type"):
        next(iter(dgl.dataloading.DataLoader(g, torch.tensor([0]), sampler)))
