"""How the kernels see a table's rows: as the bit carriers of its element size, or as words they move.

A gather copies bits, never values: rows of 1, 2, 4 or 8-byte elements are viewed as integers of that size
(:func:`bits`, :func:`flat_bits`), and rows of wider elements (complex128), which no kernel moves, as 8-byte
words or bytes (:func:`row_words`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from .carriers import CARRIERS, ELEMENT_SIZES

__all__ = ["TORCH_CARRIERS", "bits", "flat_bits", "RowWords", "row_words"]

#: The bit-carrier dtype of each element size: a gather copies bits, so every dtype of one size (fp16, bf16,
#: int16) shares one kernel specialisation.  (Every element size's carrier has a torch name: only the 16-byte
#: vector unit has none.)
TORCH_CARRIERS = {size: getattr(torch, CARRIERS[size].torch) for size in ELEMENT_SIZES}  # type: ignore[arg-type]



def bits(t: torch.Tensor, rows: int) -> torch.Tensor:
    """The tensor's bits as a 2-D carrier-dtype view ``[rows, row_elems]`` (also for 0 rows): what the
    kernels read and write.  ``t`` is contiguous, of 1, 2, 4 or 8-byte elements.

    Examples
    --------
    >>> bits(torch.ones(2, 3, dtype=torch.bfloat16), 2)
    tensor([[16256, 16256, 16256],
            [16256, 16256, 16256]], dtype=torch.int16)
    """
    return t.view(TORCH_CARRIERS[t.element_size()]).reshape(rows, math.prod(t.shape[1:]))


def flat_bits(t: torch.Tensor) -> torch.Tensor:
    """The tensor's bits as a 1-D carrier-dtype view (a tier of rows at any element offset).

    Examples
    --------
    >>> flat_bits(torch.ones(2, 2, dtype=torch.float16)).tolist()
    [15360, 15360, 15360, 15360]
    """
    return t.view(TORCH_CARRIERS[t.element_size()]).reshape(-1)


@dataclass(frozen=True)
class RowWords:
    """How rows of a table are held and moved by the kernels: as ``dtype`` elements, ``shape`` per row, each
    element of the table ``ratio`` of them (1: the table's own dtype).

    Examples
    --------
    >>> row_words(torch.complex128, (2,)).same, row_words(torch.float16, (2,)).same
    (False, True)
    """

    dtype: torch.dtype
    shape: tuple[int, ...]
    ratio: int

    @property
    def same(self) -> bool:
        """Whether the rows move in their own dtype (no view needed)."""
        return self.ratio == 1


def row_words(dtype: torch.dtype, row_shape: Sequence[int]) -> RowWords:
    """The words the kernels move rows of ``dtype`` and ``row_shape`` in: the dtype itself for 1, 2, 4 and
    8-byte elements; wider ones (complex128) as their bytes, in 8-byte words (or bytes).

    Examples
    --------
    >>> row_words(torch.float32, (3,))
    RowWords(dtype=torch.float32, shape=(3,), ratio=1)
    >>> row_words(torch.complex128, (3,))
    RowWords(dtype=torch.int64, shape=(6,), ratio=2)
    """
    elem = torch.empty(0, dtype=dtype).element_size()
    if elem in ELEMENT_SIZES:
        return RowWords(dtype, tuple(row_shape), 1)
    carrier = torch.int64 if elem % 8 == 0 else torch.uint8
    ratio = elem // torch.empty(0, dtype=carrier).element_size()
    return RowWords(carrier, (int(np.prod(row_shape, dtype=np.int64)) * ratio,), ratio)
