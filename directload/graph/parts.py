"""A CSC's parts: their names, and the dtypes each may have."""

from __future__ import annotations

import torch

from directload.units import dtype_name

__all__ = ["PARTS", "INDEX", "FLOAT", "PART_DTYPES", "dtype_name"]

#: The parts, in the order every file and shared table lists them (``eids`` and ``weights`` are optional).
PARTS = ("indptr", "indices", "eids", "weights")
INDEX = (torch.int32, torch.int64)
FLOAT = (torch.float32, torch.float64)
#: Each part's dtypes.
PART_DTYPES = {"indptr": INDEX, "indices": INDEX, "eids": INDEX, "weights": FLOAT}



