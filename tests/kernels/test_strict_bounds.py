"""``check_strict_bounds`` (``strict=True`` with CUDA ids) reads the ids' range in one reduction: run here on
CPU ids, which the function takes as well (the path through ``gather`` needs a GPU)."""

import pytest
import torch

from directload.kernels.operands import check_strict_bounds


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_ids_in_range_pass(dtype):
    assert check_strict_bounds(torch.tensor([0, 4, 2], dtype=dtype), 5) is None


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("ids,bad,position", [([0, 5, 2], 5, 1), ([3, 0, -1], -1, 2)])
def test_an_id_out_of_range_is_named_with_its_position(dtype, ids, bad, position):
    # torch.aminmax gives a pair of tensors, not one: reading it with .tolist() raised AttributeError
    with pytest.raises(IndexError, match=rf"^index {bad} is out of range for 5 rows \(valid 0..4\) "
                                         rf"\(at position {position}\)$"):
        check_strict_bounds(torch.tensor(ids, dtype=dtype), 5)


def test_no_ids_read_nothing():
    assert check_strict_bounds(torch.tensor([], dtype=torch.int64), 0) is None
