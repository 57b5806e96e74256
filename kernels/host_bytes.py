"""Host bytes as numpy arrays: the views the CPU kernels and the host pool read and write through."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import torch

__all__ = ["host_view", "nbytes_of"]


class _Raw:
    """Exposes ``[ptr, ptr+nbytes)`` as a numpy buffer that keeps ``owner`` alive."""

    def __init__(self, ptr, nbytes, owner, writable):
        self.owner = owner
        self.__array_interface__ = {"data": (ptr, not writable), "shape": (nbytes,), "typestr": "|u1",
                                    "version": 3}


def host_view(ptr: int, nbytes: int, owner: object, writable: bool = True) -> np.ndarray:
    """A uint8 numpy array over ``[ptr, ptr+nbytes)`` that keeps ``owner`` alive while it lives."""
    return np.asarray(_Raw(ptr, nbytes, owner, writable))


def nbytes_of(shape: Iterable[int], dtype: torch.dtype) -> int:
    """Bytes of a C-contiguous tensor of ``shape`` and torch ``dtype``."""
    return math.prod(shape) * dtype.itemsize
