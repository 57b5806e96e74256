"""CPU ids bound for a GPU gather of a unified table are range-checked on the CPU first (``_check_cpu_ids``):
run here directly (the path through ``x[idx]`` needs a GPU)."""

import pytest
import torch

from directload.unified import _check_cpu_ids


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_ids_in_range_pass(dtype):
    assert _check_cpu_ids(torch.tensor([[0, 4], [2, 1]], dtype=dtype), 5) is None


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("ids,bad,position", [([0, 5, 2], 5, 1), ([[3, 0], [-1, 1]], -1, 2)])
def test_an_id_out_of_range_is_named_with_its_position(dtype, ids, bad, position):
    # torch.aminmax gives a pair of tensors, not one: reading it with .tolist() raised AttributeError
    with pytest.raises(IndexError, match=rf"^index {bad} is out of range for 5 rows \(valid 0..4\) "
                                         rf"\(at position {position}\)$"):
        _check_cpu_ids(torch.tensor(ids, dtype=dtype), 5)
