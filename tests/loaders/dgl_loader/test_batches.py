"""loaders/dgl/batches.py: which node fields directload serves, decided with the kernels' one ``can_gather``."""

import importlib
import pkgutil

import pytest
import torch

import directload
import directload.loaders
from directload.kernels import operands
from directload.loaders.dgl import batches

CPU = torch.device("cpu")


def test_there_is_one_can_gather_and_it_is_the_kernels():
    """Whatever module holds a ``can_gather`` holds kernels.operands' (batches had one of its own, which decided
    something else: whether directload serves a DGL field as DGL would)."""
    holders = []
    for info in pkgutil.walk_packages(directload.loaders.__path__, "directload.loaders."):
        if info.name.startswith("directload.loaders.pyg") or info.name.endswith("__main__"):
            continue  # the PyG lane's modules need PyG
        module = importlib.import_module(info.name)
        if hasattr(module, "can_gather"):
            holders.append(info.name)
            assert module.can_gather is operands.can_gather, info.name
    assert "directload.loaders.dgl.batches" in holders
    assert "can_gather" not in batches.__all__


@pytest.mark.parametrize("table, served", [
    (torch.zeros(10, 4), True),
    (torch.zeros(10, dtype=torch.int8), True),
    (torch.zeros(10, 4, dtype=torch.bfloat16), True),
    (torch.zeros(4, 10).t(), False),  # strided: DGL's storage copies, a gather never does
    (torch.zeros(10, 4, requires_grad=True), False),  # DGL's rows keep autograd history, a gather's do not
    (torch.zeros(10, 2, dtype=torch.complex64), False),  # complex: no kernel moves it
    (torch.zeros(()), False),
    (torch.zeros(10, 4, device="meta"), False),
], ids=["float32", "int8", "bf16", "strided", "grad", "complex", "0-d", "meta"])
def test_serves_as_dgl_where_the_kernels_take_the_table(table, served):
    ids = torch.tensor([3, 0, 3])
    assert batches.serves_as_dgl(table, ids, CPU) is served
    assert batches.serves_as_dgl(table, ids, CPU) == (operands.can_gather(table) and not table.requires_grad)


def test_serves_as_dgl_a_unified_table_by_its_host_tensor_and_no_store_or_array():
    table = directload.to_unified(torch.arange(40.0).reshape(10, 4))
    try:
        assert batches.serves_as_dgl(table, torch.tensor([1]), CPU)
    finally:
        table.close()
    assert not batches.serves_as_dgl(torch.zeros(10, 4).numpy(), torch.tensor([1]), CPU)
    assert not batches.serves_as_dgl([[0.0]], torch.tensor([0]), CPU)


def test_a_pageable_table_is_served_for_cpu_ids_bound_for_a_gpu():
    """CPU ids read pageable rows on the CPU, then copy them to the device, as DGL's storage does."""
    assert batches.serves_as_dgl(torch.zeros(10, 4), torch.tensor([1]), torch.device("cuda", 0))
